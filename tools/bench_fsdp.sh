#!/usr/bin/env bash
# bench_fsdp.sh: chapter 06's speed goals, as ratios of runs made together.
#
#   tools/bench_fsdp.sh [--rounds K] [--steps N] [--np N]
#
# On --np ranks (default 2), on the tiny config and on a wide model with little compute per
# parameter: DDP (03_ddp), ZeRO-3 (05_zero --zero 3), FSDP without prefetch and FSDP with
# prefetch 1 and 2 (06_fsdp). The runs alternate, K rounds (default 3); each keeps its best round
# (highest tokens/s): on a shared machine a slow round is another process, not the code. Prints
# tokens/s, each run's ratio to ZeRO-3 and to DDP, prefetch-on / prefetch-off, and the peak
# memory of rank 0 (mem.h) beside each: prefetch's price is the units it holds ahead. Goals
# (issue 14): FSDP with prefetch >= 1.0x ZeRO-3 and >= 0.8x DDP.
# Run it under flock /tmp/lab-bench.lock on a shared machine.
# Env: BUILD, MPIRUN_EXTRA (tools/bench_lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_init bench_fsdp 3,14
rounds=3; steps=10; np=2
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        -h|--help) bench_help ;;
        *) bench_bad_option "$1" ;;
    esac
done
bench_build 03_ddp 05_zero 06_fsdp

# run PROGRAM FLAGS...: prints "tokens/s peak-of-rank-0" of one run. Each chapter prints rank
# 0's peak where its own table has it: 03 the last column of "Per rank", 05 of "Memory per
# rank", 06 the line "peak memory of rank 0".
run() {
    local prog=$1 out; shift
    out=$("${MPIRUN[@]}" -np "$np" "$prog" --log-every 0 "$@" 2>&1) || {
        echo "bench_fsdp: $prog $* failed:" >&2; printf '%s\n' "$out" | tail -5 >&2
        echo "0 -"; return; }
    printf '%s\n' "$out" | awk '
        /tokens\/s \(all ranks\)/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tokens/s") tok = $i }
        /^Per rank/ || /^Memory per rank/ { mem = 1; next }
        mem && $1 == "0" { peak = $(NF-1) " " $NF; mem = 0 }
        /peak memory of rank 0/ { peak = $(NF-1) " " $NF }
        END { printf "%s %s\n", tok ? tok : 0, peak != "" ? peak : "-" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }

names=(ddp z3 pf0 pf1 pf2)
declare -A prog=(
    [ddp]="./03_ddp/run --overlap-steps 0" [z3]="./05_zero/run --zero 3"
    [pf0]="./06_fsdp/run --prefetch 0" [pf1]="./06_fsdp/run --prefetch 1"
    [pf2]="./06_fsdp/run --prefetch 2"
)
declare -A label=([ddp]="DDP (03)" [z3]="ZeRO-3 (05)" [pf0]="FSDP (06) prefetch 0"
                  [pf1]="FSDP (06) prefetch 1" [pf2]="FSDP (06) prefetch 2")
configs=("tiny|--batch $((8 * np))" "wide|--layers 2 --channels 512 --heads 8 --seq 16 --batch $((4 * np))")
declare -A best peak

echo "bench_fsdp: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $np ranks, $steps steps" \
     "per run, best of $rounds alternating rounds"
for ((k = 1; k <= rounds; k++)); do
    for cfg in "${configs[@]}"; do
        name=${cfg%%|*}; flags=${cfg#*|}
        line="  round $k $name:"
        for n in "${names[@]}"; do
            # shellcheck disable=SC2086  # prog and flags are lists of words
            read -r tok m1 m2 < <(run ${prog[$n]} --steps "$steps" $flags)
            line="$line $n $tok"
            if awk -v a="$tok" -v b="${best[$name.$n]:-0}" 'BEGIN { exit !(a > b) }'; then
                best[$name.$n]=$tok; peak[$name.$n]="$m1 $m2"
            fi
        done
        echo "$line"
    done
done

for cfg in "${configs[@]}"; do
    name=${cfg%%|*}; flags=${cfg#*|}
    ddp=${best[$name.ddp]:-0}; z3=${best[$name.z3]:-0}; pf0=${best[$name.pf0]:-0}
    echo
    echo "$name config ($flags), best of $rounds"
    printf '   %-22s %10s %8s %8s %8s %16s\n' run tokens/s "x ZeRO3" "x DDP" "x pf 0" "peak mem rank 0"
    for n in "${names[@]}"; do
        tok=${best[$name.$n]:-0}; xpf=-
        case $n in pf*) xpf=$(ratio "$tok" "$pf0") ;; esac
        printf '   %-22s %10s %8s %8s %8s %16s\n' "${label[$n]}" "$tok" "$(ratio "$tok" "$z3")" \
            "$(ratio "$tok" "$ddp")" "$xpf" "${peak[$name.$n]:--}"
    done
    echo "   goals: FSDP with prefetch >= 1.00 x ZeRO-3 and >= 0.80 x DDP"
done
