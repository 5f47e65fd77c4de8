#!/usr/bin/env bash
# The notes' layouts, re-derived (notes 002_..., 10.4 "3D 并行", and its exercise "70B on 8 H100s"):
#
#   7B    DP 8               70B   DP 64 x TP 8          405B  DP 256 x TP 8 x PP 8
#   70B on 8 H100s           (the planner's answer: none fits on 8; the fewest GPUs that do)
#
# For each one, at full size, chapter 00's planner (its own output, quoted): the best setup of
# that layout (ZeRO stage, micro-batch, micro-batches, recomputation; SP with TP), the memory per
# GPU and the step's time split per dimension. Then a run of the same shape at the lab's size:
# chapter 09 on the virtual cluster (--links, docs/CLUSTER.md) with the same ZeRO stage,
# micro-batches of one sequence, SP and schedule, tiny blocks, and at most 8 ranks (this machine
# has a few cores; 405B's 16,384 ranks cannot run): the layout scaled down by the rule below,
# said in the output. For that run it prints the memory every rank measured against chapter 00's
# calculator for the same scaled layout (bytes, exact), and the link time dist held each
# dimension for against the calculator's model and the planner's estimate of it.
#
#   bash tools/notes_layouts.sh                  (needs ./00_memory_budget/run and ./09_3d/run:
#                                                 make notes-layouts builds them and runs this)
#   NOTES_LAYOUTS="7b 405b" bash tools/notes_layouts.sh   only these (7b 70b 405b 70b-on-8)
#   STEPS=3 bash tools/notes_layouts.sh          steps of each scaled run (default 1; the figures
#                                                 are per step)
set -euo pipefail
cd "$(dirname "$0")/.."
PLANNER=./00_memory_budget/run
RUN=./09_3d/run
for b in "$PLANNER" "$RUN"; do
    [ -x "$b" ] || { echo "error: $b is missing: run 'make 00_memory_budget/run 09_3d/run'" >&2; exit 1; }
done
ROWS=${NOTES_LAYOUTS:-7b 70b 405b 70b-on-8}
for r in $ROWS; do
    case $r in 7b|70b|405b|70b-on-8) ;;
    *) echo "error: NOTES_LAYOUTS: unknown layout '$r' (valid: 7b 70b 405b 70b-on-8)" >&2; exit 2 ;;
    esac
done

# Full size: the notes' precision and GPUs, chapter 00's defaults (H100: NVLink 450 GB/s and
# InfiniBand 50 GB/s per GPU, 5 us a hop, nodes of 8). The notes give no batch: every replica
# takes 8 sequences per step (as docs/QUESTIONS.md's layouts do), and the planner picks how to cut
# them (micro-batch size and count), the ZeRO stage and the recomputation.
FULL="--dtype bf16 --gpu h100 --gpus-per-node 8"
SEQS_PER_REPLICA=8
# The lab's size: tiny blocks (V=256), and the virtual links: the H100's bandwidths 1000x lower
# (the tiny blocks' messages are ~10^5 x smaller than 70B's), its 5 us a hop. One latency for
# both links, so that chapter 00's planner (one --latency-us) times the same links as 09.
HEADS=8 CHANNELS=32 SEQ=16
BW_INTRA=0.45 BW_INTER=0.05 LAT_US=5
MAX_RANKS=8
STEPS=${STEPS:-1}
export OPENBLAS_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# ---- the one place where the scaled runs' recomputation is decided ------------------------------
# 09 recomputes (--recompute selective|full) at any --tp, in fp32 and bf16: each scaled run
# recomputes as the planner's full-size setup does, in bf16 as the notes train.
# Prints "RECOMPUTE DTYPE" for a run of TP degree $1 whose full-size setup recomputes $2.
scaled_recompute() {
    local rc=$2
    echo "$rc bf16"
}

# ---- the scaling rule ----------------------------------------------------------------------------
# TP and PP as the notes have them when TP x PP <= 8 ranks, DP then as large as 8 ranks allow;
# otherwise PP and TP halved (the larger first, PP on a tie) until TP x PP <= 8 / min(DP, 2), and
# DP 2 (DP 1 if it was 1): every dimension the notes use stays, at degree 2 at least.
scale() {  # scale DP TP PP -> "DP' TP' PP'"
    local dp=$1 tp=$2 pp=$3
    if [ $((tp * pp)) -le $MAX_RANKS ]; then
        local fit=$((MAX_RANKS / (tp * pp)))
        echo "$((dp < fit ? dp : fit)) $tp $pp"
        return
    fi
    local d2=$((dp < 2 ? dp : 2))
    while [ $((tp * pp)) -gt $((MAX_RANKS / d2)) ]; do
        if [ "$pp" -ge "$tp" ]; then pp=$((pp / 2)); else tp=$((tp / 2)); fi
    done
    echo "$d2 $tp $pp"
}
# Which of TP, PP, DP cross nodes of G ranks (ranks numbered TP fastest, then DP, then PP, as 09's
# grid and the planner number them): "TP PP DP", each inside|between|none (degree 1).
links_of() {  # links_of DP TP PP G
    awk -v dp="$1" -v tp="$2" -v pp="$3" -v g="$4" 'BEGIN {
        n["TP"] = tp; n["PP"] = pp; n["DP"] = dp
        split("TP PP DP", dims, " ")
        for (i = 1; i <= 3; i++) {
            dim = dims[i]; cross = 0
            for (p = 0; p < pp && !cross; p++) for (d = 0; d < dp && !cross; d++)
                for (t = 0; t < tp && !cross; t++) {
                    r = t + tp * (d + dp * p)   # and the first member of its group of dim:
                    f = dim == "TP" ? tp * (d + dp * p) : dim == "DP" ? t + tp * dp * p : t + tp * d
                    if (int(r / g) != int(f / g)) cross = 1
                }
            printf "%s%s", (i > 1 ? " " : ""), (n[dim] == 1 ? "none" : cross ? "between" : "inside")
        }
        printf "\n"
    }'
}
# The scaled run's nodes: the largest G (8, 4, 2, 1) under which every dimension that both the
# full-size and the scaled layout have crosses nodes exactly when it does at full size.
scaled_nodes() {  # scaled_nodes "FULL LINKS" DP' TP' PP'
    local full mine g ok i
    read -r -a full <<< "$1"
    for g in 8 4 2 1; do
        local world=$(($2 * $3 * $4))
        [ "$world" -le "$g" ] || [ $((world % g)) -eq 0 ] || continue
        read -r -a mine <<< "$(links_of "$2" "$3" "$4" "$g")"
        ok=1
        for i in 0 1 2; do
            [ "${mine[$i]}" = none ] || [ "${full[$i]}" = none ] || [ "${mine[$i]}" = "${full[$i]}" ] || ok=0
        done
        [ $ok -eq 1 ] && { echo "$g"; return; }
    done
    echo 1
}

# ---- chapter 00's planner at full size --------------------------------------------------------
# The row of layout DP x TP x PP in a --plan table: its fields, from "rank" on.
plan_row() {  # plan_row FILE DP TP PP
    awk -v dp="$2" -v tp="$3" -v pp="$4" '$2 == dp && $3 == "x" && $4 == tp && $5 == "x" &&
        $6 == pp && $7 ~ /^[0-3]$/ { print; exit }' "$1"
}
# Notes' layout NAME -> $out/NAME.full "MODEL DP TP PP GPUS", $out/NAME.cmd the planner's command
# and $out/NAME.plan its output. The planner's answer for "70B on 8 H100s" (none fits on 8: the
# fewest GPUs that do, and the best layout there) is read from its output.
full_size() {  # full_size NAME
    local name=$1 model dp tp pp g cmd
    case $name in
    7b) model=7b dp=8 tp=1 pp=1 ;;
    70b) model=70b dp=64 tp=8 pp=1 ;;
    405b) model=405b dp=256 tp=8 pp=8 ;;
    70b-on-8) model=70b ;;
    esac
    if [ "$name" = 70b-on-8 ]; then
        cmd="$PLANNER --model 70b $FULL --plan --gpus 8"
    else
        g=$((dp * tp * pp))
        cmd="$PLANNER --model $model $FULL --plan --gpus $g --global-batch $((dp * SEQS_PER_REPLICA)) --top 1000"
    fi
    echo "$cmd" > "$out/$name.cmd"
    $cmd > "$out/$name.plan" 2>&1 || { cat "$out/$name.plan" >&2; echo "error: $cmd failed" >&2; return 1; }
    if [ "$name" = 70b-on-8 ]; then
        # "... that fits: 16; the best there is DP 1 x TP 4 x PP 4, ZeRO-0, ..."
        local ans
        ans=$(grep -m1 "The fewest GPUs" "$out/$name.plan") ||
            { echo "error: the planner found no layout for 70B (no 'The fewest GPUs' line):" >&2
              cat "$out/$name.plan" >&2; return 1; }
        read -r g dp tp pp < <(echo "$ans" | sed -E 's/.*fits: ([0-9]+); the best there is DP ([0-9]+) x TP ([0-9]+) x PP ([0-9]+),.*/\1 \2 \3 \4/')
    fi
    echo "$model $dp $tp $pp $g" > "$out/$name.full"
}

# ---- chapter 09's scaled run and chapter 00's prediction for it ---------------------------------
# 09's "link time per step" line of a dimension: held, model, planner (ms)
link_field() {  # link_field FILE DIM held|model|planner
    awk -v dim="$2" -v what="$3" '$1 == dim && $3 ~ /^rank/ && / held / {
        for (i = 1; i <= NF; i++) if ($i == what) print $(i + 1) }' "$1"
}
# 00 --layout's "compute a s + TP b s + PP c s + DP d s = step": a dimension's seconds, as ms
layout_ms() {  # layout_ms FILE DIM
    awk -v dim="$2" '/^  compute .* = step / {
        for (i = 1; i <= NF; i++) if ($i == dim) printf "%.3f\n", 1e3 * $(i + 1) }' "$1"
}
# The measured figures of 09's --dump, one line per rank: "rank t d p params master m acts"
dump_ranks() {  # dump_ranks DUMP WORLD
    python3 - "$1" "$2" <<'PY'
import sys
sys.path.insert(0, "tools")
from dump_compare import read_dump
kv = read_dump(sys.argv[1])[4]
for r in range(int(sys.argv[2])):
    c = int(kv["coord_r%d" % r])
    print(r, c % 100, (c // 100) % 100, c // 10000,
          *(int(kv["%s_r%d" % (k, r)]) for k in ("mem_params", "mem_master", "mem_opt_m", "acts_peak")))
PY
}
# 00 --layout's memory row of stage p: "params master m acts"
stage_mem() {  # stage_mem FILE STAGE
    awk -v p="$2" '/^Memory per GPU \(bytes/ { on = 1; next } on && /^$/ { on = 0 }
        on && $1 == p && $2 ~ /^[0-9]+$/ { print $4, $6, $7, $9; exit }' "$1"
}

summary=()
echo "The notes' layouts (002_... 10.4, and its exercise '70B on 8 H100s'), re-derived"
echo "  full size: chapter 00's planner, bf16 mixed precision, Adam, H100 80GB, nodes of 8 GPUs, NVLink"
echo "    450 GB/s and InfiniBand 50 GB/s per GPU, 5 us a hop; $SEQS_PER_REPLICA sequences per replica and step; the"
echo "    planner picks the ZeRO stage, micro-batches and recomputation of each layout (SP with TP)"
echo "  scaled: chapter 09 on the virtual cluster, the same ZeRO stage, micro-batches (of 1 sequence), SP and 1F1B,"
echo "    tiny blocks (V=256 C=$CHANNELS NH=$HEADS T=$SEQ, 2 blocks or one per stage), at most $MAX_RANKS ranks: TP and PP as the"
echo "    notes when TP x PP <= $MAX_RANKS (DP as large as $MAX_RANKS ranks allow), else halved (the larger first) down to TP x PP x 2 <= $MAX_RANKS"
echo "    with DP 2; nodes sized so that each dimension crosses nodes as at full size; links $BW_INTRA GB/s inside a"
echo "    node and $BW_INTER GB/s between (the H100's bandwidths / 1000), $LAT_US us a hop; $STEPS step"

# Chapter 00's answers first, all at once (each is mostly start-up): the full-size plans, then
# the predictions for the scaled runs; the scaled runs after them, one at a time.
pids=()
for name in $ROWS; do full_size "$name" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || exit 1; done
pids=()
for name in $ROWS; do
    read -r model dp tp pp gpus < "$out/$name.full"
    row=$(plan_row "$out/$name.plan" "$dp" "$tp" "$pp")
    [ -n "$row" ] || { echo "error: the planner has no fitting row for $dp x $tp x $pp ($(cat "$out/$name.cmd")):" >&2
                       cat "$out/$name.plan" >&2; exit 1; }
    read -r _ _ _ _ _ _ zero mb m rc _ <<< "$row"
    full_links=$(links_of "$dp" "$tp" "$pp" 8)
    # the scaled run's layout, nodes, recomputation, batch and model
    read -r sdp stp spp < <(scale "$dp" "$tp" "$pp")
    G=$(scaled_nodes "$full_links" "$sdp" "$stp" "$spp")
    read -r src sdt < <(scaled_recompute "$stp" "$rc")
    world=$((sdp * stp * spp))
    batch=$((sdp * m * mb))
    model_flags="--layers $((spp > 2 ? spp : 2)) --channels $CHANNELS --heads $HEADS --seq $SEQ"
    spflag=$([ "$stp" -gt 1 ] && echo "--sequence-parallel" || true)
    links="$G:$BW_INTRA,$LAT_US:$BW_INTER,$LAT_US"
    run_flags="$model_flags --batch $batch --micro-batches $m --tp $stp --pp $spp --zero $zero $spflag --dtype $sdt --recompute $src --links $links --steps $STEPS"
    pred_cmd="$PLANNER $model_flags --batch $batch --layout ${sdp}x${stp}x${spp} --zero $zero --micro-batches $m ${spflag:+--seq-parallel} --dtype $sdt --recompute $src --gpus-per-node $G --bw-intra $BW_INTRA --bw-inter $BW_INTER --latency-us $LAT_US"
    declare -p row full_links sdp stp spp G src sdt world run_flags pred_cmd > "$out/$name.cfg"
    $pred_cmd > "$out/$name.pred" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do
    wait "$p" || { cat "$out"/*.pred >&2; echo "error: a prediction of chapter 00 failed" >&2; exit 1; }
done

for name in $ROWS; do
    read -r model dp tp pp gpus < "$out/$name.full"
    # shellcheck source=/dev/null
    source "$out/$name.cfg"
    read -r _ _ _ _ _ _ zero mb m rc memgb ofgpu _ _ _ tcomp ttp tpp tdp tstep mfu <<< "$row"
    sp=$([ "$tp" -gt 1 ] && echo on || echo off)
    case $name in
    7b) title="7B: DP 8 (the notes' table)" ;;
    70b) title="70B: DP 64 x TP 8 (the notes' table)" ;;
    405b) title="405B: DP 256 x TP 8 x PP 8 (the notes' table)" ;;
    70b-on-8) title="70B on 8 H100s (the notes' exercise): the planner's answer, DP $dp x TP $tp x PP $pp on $gpus GPUs" ;;
    esac
    echo
    echo "== $title =="
    echo "full size, chapter 00's planner: $(cat "$out/$name.cmd")"
    if [ "$name" = 70b-on-8 ]; then
        echo "  $(grep -m1 "No layout fits" "$out/$name.plan" | sed 's/^ *//')"
        echo "  $(grep -m1 "The fewest GPUs" "$out/$name.plan" | sed 's/^ *//')"
    fi
    echo "  its row: $row"
    read -r l_tp l_pp l_dp <<< "$full_links"
    echo "  DP $dp x TP $tp x PP $pp on $gpus GPUs: ZeRO-$zero, micro-batch $mb, $m micro-batches, recompute $rc, SP $sp;"
    echo "  $memgb GB per GPU ($ofgpu of the H100); step $tstep s = compute $tcomp + TP $ttp + PP $tpp + DP $tdp s; MFU $mfu"
    echo "  links: TP $l_tp, PP $l_pp, DP $l_dp"

    read -r s_tp s_pp s_dp <<< "$(links_of "$sdp" "$stp" "$spp" "$G")"
    echo "scaled: DP $dp -> $sdp, TP $tp -> $stp, PP $pp -> $spp ($world ranks), nodes of 8 -> $G (TP $s_tp, PP $s_pp, DP $s_dp);"
    echo "  ZeRO-$zero, $m micro-batches of $mb, SP $sp, $sdt, recompute $src"
    echo "  run:       mpirun -np $world $RUN $run_flags"
    echo "  predicted: $pred_cmd"
    mpirun --oversubscribe --allow-run-as-root -np "$world" $RUN $run_flags --log-every 0 \
        --dump "$out/$name.dump" > "$out/$name.run" 2>&1 ||
        { cat "$out/$name.run" >&2; echo "error: the $name run failed" >&2; exit 1; }

    echo "  memory per rank, bytes: measured by 09 / predicted by 00 (its stage's row)"
    printf "    %-4s %-8s %19s %19s %19s %19s\n" rank "(t,d,p)" params master "Adam m" activations
    exact=1
    while read -r r t d p a b c e; do
        read -r pa pb pc pe <<< "$(stage_mem "$out/$name.pred" "$p")"
        ok=$([ "$a" = "$pa" ] && [ "$b" = "$pb" ] && [ "$c" = "$pc" ] && [ "$e" = "$pe" ] && echo exact || echo DIFFERS)
        [ "$ok" = exact ] || exact=0
        printf "    %-4s %-8s %19s %19s %19s %19s  %s\n" "$r" "($t,$d,$p)" "$a/$pa" "$b/$pb" "$c/$pc" "$e/$pe" "$ok"
    done < <(dump_ranks "$out/$name.dump" "$world")
    echo "  link time per step, ms: held (what dist held the busiest rank for), model (the calculator's"
    echo "  bytes and hops on its link), planner (09's and 00's: TP and PP once per 1F1B slot)"
    printf "    %-4s %-8s %10s %10s %12s %12s\n" dim link held model "planner 09" "planner 00"
    worst=0
    for dim in TP PP DP; do
        h=$(link_field "$out/$name.run" $dim held); mo=$(link_field "$out/$name.run" $dim model)
        p9=$(link_field "$out/$name.run" $dim planner); p0=$(layout_ms "$out/$name.pred" $dim)
        case $dim in TP) lk=$s_tp ;; PP) lk=$s_pp ;; DP) lk=$s_dp ;; esac
        printf "    %-4s %-8s %10s %10s %12s %12s\n" "$dim" "$lk" "$h" "$mo" "$p9" "$p0"
        worst=$(awk -v h="$h" -v m="$mo" -v w="$worst" 'BEGIN { d = m > 0 ? (h - m) / m : h - m;
            if (d < 0) d = -d; print (d > w ? d : w) }')
    done
    stepms=$(awk '$1 == "step" && $3 == "ms" && $4 == "measured" { print $2 }' "$out/$name.run")
    held=$(awk '$1 ~ /^(TP|PP|DP)$/ && $3 ~ /^rank/ && / held / { for (i = 1; i <= NF; i++)
        if ($i == "held") s += $(i + 1) } END { printf "%.3f", s }' "$out/$name.run")
    echo "    step $stepms ms measured (wall clock), $held ms of it held on the links"
    summary+=("$(printf "  %-9s %-13s %5s %4s %4s %-9s %7s %7s %7s %7s %7s   %-9s %2s %-9s %s" "$name" \
        "$dp x $tp x $pp" "$gpus" "$zero" "$m" "$rc" "$memgb" "$ttp" "$tpp" "$tdp" "$tstep" \
        "${sdp}x${stp}x${spp}" "$G" "$src" \
        "$([ $exact -eq 1 ] && echo "exact" || echo "DIFFERS"), held = model$(awk -v w="$worst" 'BEGIN { printf w < 0.0005 ? "" : " within %.1f %%", 100 * w }')")")
done

echo
echo "Summary: the planner at full size; the scaled run (its layout, nodes of G ranks, its recomputation): its memory against"
echo "00's calculator, its held link time against the model"
printf "  %-9s %-13s %5s %4s %4s %-9s %7s %7s %7s %7s %7s   %-9s %2s %-9s %s\n" layout "DP x TP x PP" GPUs \
    ZeRO m recompute "GB/GPU" "TP s" "PP s" "DP s" "step s" scaled G rc "memory, links"
printf "%s\n" "${summary[@]}"
