#!/usr/bin/env bash
# bench_ddp.sh: the speed goals of chapters 02 and 03, as ratios of runs made together.
#
#   tools/bench_ddp.sh [--steps N] [--np N]
#
# Machines here are shared and noisy: every figure below is a ratio of two runs made one after
# the other in this script, never an absolute time compared with a constant.
#   1. scaling   03_ddp tokens/s on 2 ranks / on 1 rank, same per-rank batch, tiny config.
#                Goal >= 1.8x (PyTorch DDP with gloo reaches about 1.46x on the same model).
#                Also the ceiling: two independent 1-rank runs at once (what the machine gives
#                two processes now; on a shared machine it can be far below 2x) and the share
#                of that ceiling DDP reaches.
#   2. overlap   step time with --no-overlap / with overlap (> 1: the default is faster), and the
#                share of communication hidden each run reports (from its timeline: 0 with
#                --no-overlap), on the tiny config and on a wide model with little
#                compute per parameter, where communication is a visible share of the step.
#                Overlap is 03_ddp's default (communication thread, buckets all-reduced in
#                place). On the wide model also: the same buckets all started after backward
#                (--launch-after-backward: the ratio to it is what overlap itself buys), the
#                older way (--progress poll --pack-buckets), and what the communication
#                thread's all-reduces cost: wall time and CPU time.
#   3. master    02_data_parallel vs 03_ddp tokens/s on --np ranks (default 4): the single
#                master's price.
# Env: BUILD, MPIRUN_EXTRA (tools/bench_lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_init bench_ddp 3,24
steps=20; np=4
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        -h|--help) bench_help ;;
        *) bench_bad_option "$1" ;;
    esac
done
bench_build 02_data_parallel 03_ddp
. "$(dirname "$0")/openblas_core.sh"
lab_openblas_core ./03_ddp/run

# run NP PROG FLAGS...: prints "tokens/s step_ms overlap%" of one run (overlap "-" if absent);
# the communication thread's line of rank 0, if any, goes to $ctfile
ctfile="${TMPDIR:-/tmp}/bench_ddp_ct.$$"
run() {
    local np=$1 prog=$2 out; shift 2
    : >"$ctfile"
    out=$("${MPIRUN[@]}" -np "$np" "$prog" --log-every 0 "$@" 2>&1) || {
        echo "bench_ddp: mpirun -np $np $prog $* failed:" >&2; printf '%s\n' "$out" | tail -5 >&2
        echo "0 0 -"; return; }
    printf '%s\n' "$out" | grep '^  rank 0 communication thread' >"$ctfile"
    printf '%s\n' "$out" | awk '
        /tokens\/s \(all ranks\)/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "tokens/s") tok = $i;
                                                              if ($(i+1) == "ms") ms = $i } }
        /^  communication hidden behind backward = / {
            for (i = 1; i <= NF; i++) if ($i ~ /%$/) { ov = $i; sub(/%/, "", ov); break } }
        END { printf "%s %s %s\n", tok ? tok : 0, ms ? ms : 0, ov != "" ? ov : "-" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }

echo "bench_ddp: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $steps steps per run"
echo
echo "1. Scaling (tiny config, 16 sequences per rank)"
read -r tok1 ms1 _ < <(run 1 ./03_ddp/run --steps "$steps" --batch 16)
read -r tok2 ms2 ov2 < <(run 2 ./03_ddp/run --steps "$steps" --batch 32)
# What this machine can give two processes right now: two independent 1-rank runs at once.
run 1 ./03_ddp/run --steps "$steps" --batch 16 >"${TMPDIR:-/tmp}/bench_ddp.$$" &
read -r tokc _ _ < <(run 1 ./03_ddp/run --steps "$steps" --batch 16)
wait
read -r tokc2 _ _ <"${TMPDIR:-/tmp}/bench_ddp.$$"; rm -f "${TMPDIR:-/tmp}/bench_ddp.$$"
ceiling=$(awk -v a="$tokc" -v b="$tokc2" 'BEGIN { printf "%.0f", a + b }')
printf '   %-32s %10s tokens/s %9s ms/step\n' "1 rank" "$tok1" "$ms1"
printf '   %-32s %10s tokens/s %9s ms/step   overlap %s%%\n' "2 ranks (DDP)" "$tok2" "$ms2" "$ov2"
printf '   %-32s %10s tokens/s\n' "2 independent 1-rank runs at once" "$ceiling"
printf '   speedup 2 ranks / 1 rank: %sx   (goal >= 1.8x; PyTorch DDP + gloo ~1.46x)\n' \
    "$(ratio "$tok2" "$tok1")"
printf '   machine ceiling now (2 independent runs / 1 run): %sx; DDP reaches %s of it\n' \
    "$(ratio "$ceiling" "$tok1")" "$(awk -v a="$tok2" -v b="$ceiling" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else printf "n/a" }')"

echo
echo "2. Overlap vs --no-overlap (2 ranks; best of 2 alternations each; ratio = baseline / overlap)"
# Two alternations of (overlap, baseline); each keeps its faster run (interference from
# other processes only adds time). OVERLAP_FLAGS: how the overlapped run overlaps; BASE_FLAGS:
# the baseline (default --no-overlap).
overlap_pair() {
    local label=$1 ms ov msA=0 ovA=- msB=0 ovB=-; shift
    # --no-overlap has no buckets, and refuses --bucket-mb: the baseline runs without it
    local base=() i=1
    while [ $i -le $# ]; do
        if [ "${!i}" = --bucket-mb ] && [[ "${BASE_FLAGS:---no-overlap}" == *--no-overlap* ]]; then
            i=$((i + 2)); continue; fi
        base+=("${!i}"); i=$((i + 1))
    done
    for _ in 1 2; do
        # shellcheck disable=SC2086  # OVERLAP_FLAGS splits into words
        read -r _ ms ov < <(run 2 ./03_ddp/run ${OVERLAP_FLAGS:-} "$@")
        if awk -v a="$ms" -v b="$msA" 'BEGIN { exit !(b == 0 || (a > 0 && a < b)) }'; then
            msA=$ms; ovA=$ov; cp "$ctfile" "$ctfile.best"; fi
        # shellcheck disable=SC2086  # BASE_FLAGS splits into words
        read -r _ ms ov < <(run 2 ./03_ddp/run ${BASE_FLAGS:---no-overlap} "${base[@]}")
        if awk -v a="$ms" -v b="$msB" 'BEGIN { exit !(b == 0 || (a > 0 && a < b)) }'; then msB=$ms; ovB=$ov; fi
    done
    printf '   %-26s overlap %7s ms/step (%4s%% hidden)   %-10s %7s ms/step (%4s%%)   ratio %sx\n' \
        "$label" "$msA" "$ovA" "${BASE_NAME:-no-overlap}" "$msB" "$ovB" "$(ratio "$msB" "$msA")"
}
wide=(--steps $(( steps / 2 > 4 ? steps / 2 : 4 )) --layers 4 --channels 512 --heads 8 --seq 16
      --batch 4 --bucket-mb 8)
overlap_pair "tiny (3.2 MiB grads)" --steps "$steps" --batch 32 --bucket-mb 0.5
overlap_pair "wide (48.6 MiB grads)" "${wide[@]}"
ct=$(cat "$ctfile.best" 2>/dev/null)
BASE_FLAGS="--launch-after-backward" BASE_NAME="late start" \
    overlap_pair "wide, vs buckets late" "${wide[@]}"
OVERLAP_FLAGS="--progress poll --pack-buckets" overlap_pair "wide, poll + pack" "${wide[@]}"
rm -f "$ctfile" "$ctfile.best"
if [ -n "$ct" ]; then
    echo "   wide, the overlapped run's communication thread (rank 0; per step, during training and alone):"
    printf '%s\n' "$ct" | sed 's/^  rank 0 communication thread: /     /'
fi

echo
echo "3. Single master vs peers ($np ranks, tiny config, 8 sequences per rank)"
read -r tokdp msdp _ < <(run "$np" ./02_data_parallel/run --steps "$steps" --batch $((8 * np)))
read -r tokddp msddp _ < <(run "$np" ./03_ddp/run --steps "$steps" --batch $((8 * np)))
printf '   %-28s %10s tokens/s %9s ms/step\n' "02_data_parallel (master)" "$tokdp" "$msdp"
printf '   %-28s %10s tokens/s %9s ms/step\n' "03_ddp (peers)" "$tokddp" "$msddp"
printf '   DDP / DataParallel: %sx\n' "$(ratio "$tokddp" "$tokdp")"
