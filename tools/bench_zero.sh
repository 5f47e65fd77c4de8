#!/usr/bin/env bash
# bench_zero.sh: chapter 05's speed goals, as ratios of runs made together.
#
#   tools/bench_zero.sh [--steps N] [--np N] [--rounds K] [--bucket-kb KB]
#
# 05_zero's tokens/s at --zero 1, 2, 3 divided by --zero 0 (DDP, the same program) on --np
# ranks (default 2), on the tiny config and on a wide model with little compute per parameter.
# Each config runs K rounds (default 3) of the four stages one after the other (alternating, so a
# burst of load from elsewhere hits every stage alike) and keeps each stage's best tokens/s.
# Goals: ZeRO-1 and ZeRO-2 >= 0.9x DDP (the same bytes on the wire), ZeRO-3 >= 0.75x (1.5x the
# bytes). Beside each, the peak memory of rank 0 (mem.h). The machines here are shared and
# noisy: only the ratios of runs made one after the other in this script mean anything.
# Run it under flock /tmp/lab-bench.lock on a shared machine.
# Env: BUILD, MPIRUN_EXTRA (tools/bench_lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_init bench_zero 3,14
steps=10; np=2; rounds=3; bucket_kb=256
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --bucket-kb) bucket_kb=$2; shift 2 ;;
        -h|--help) bench_help ;;
        *) bench_bad_option "$1" ;;
    esac
done
bench_build 05_zero

# run STAGE FLAGS...: prints "tokens/s peak_total_of_rank_0" of one run
run() {
    local stage=$1 out; shift
    out=$("${MPIRUN[@]}" -np "$np" ./05_zero/run --zero "$stage" --log-every 0 "$@" 2>&1) || {
        echo "bench_zero: --zero $stage $* failed:" >&2; printf '%s\n' "$out" | tail -5 >&2
        echo "0 -"; return; }
    printf '%s\n' "$out" | awk '
        /tokens\/s \(all ranks\)/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tokens/s") tok = $i }
        /^Memory per rank/ { mem = 1; next }
        mem && $1 == "0" { peak = $(NF-1) " " $NF; mem = 0 }
        END { printf "%s %s\n", tok ? tok : 0, peak != "" ? peak : "-" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }

echo "bench_zero: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $np ranks, $steps steps per run, best of $rounds alternating rounds, ZeRO-2 --bucket-kb $bucket_kb"
for cfg in "tiny|--batch $((8 * np))" "wide|--layers 2 --channels 512 --heads 8 --seq 16 --batch $((4 * np))"; do
    name=${cfg%%|*}; flags=${cfg#*|}
    echo
    echo "$name config ($flags)"
    best=(0 0 0 0); peaks=(- - - -)
    for ((k = 0; k < rounds; k++)); do
        for stage in 0 1 2 3; do
            bk=""; [ "$stage" = 2 ] && bk="--bucket-kb $bucket_kb"  # refused at other stages
            # shellcheck disable=SC2086  # flags, bk: lists of words
            read -r tok peak < <(run "$stage" --steps "$steps" $bk $flags)
            if awk -v a="$tok" -v b="${best[$stage]}" 'BEGIN { exit !(a > b) }'; then best[$stage]=$tok; fi
            peaks[$stage]=$peak
        done
    done
    printf '   %-14s %12s %8s %8s %16s\n' stage tokens/s "x DDP" goal "peak mem rank 0"
    for stage in 0 1 2 3; do
        goal=-; [ "$stage" = 1 ] || [ "$stage" = 2 ] && goal=">= 0.90"; [ "$stage" = 3 ] && goal=">= 0.75"
        printf '   %-14s %12s %8s %8s %16s\n' "ZeRO-$stage" "${best[$stage]}" "$(ratio "${best[$stage]}" "${best[0]}")" "$goal" "${peaks[$stage]}"
    done
done
