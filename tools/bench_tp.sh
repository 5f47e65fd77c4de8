#!/usr/bin/env bash
# bench_tp.sh: chapter 07's speed goal, as ratios of runs made together.
#
#   tools/bench_tp.sh [--steps N]
#
# 07_tensor_parallel's tokens/s at --tp 2 on 2 ranks (with and without --sequence-parallel)
# divided by --tp 1 on 1 rank (the same program, the same global batch), on a wide model
# (C = 512: the matmuls dominate) and on the tiny config (C = 64: they do not). Goal on the wide
# model: tp 2 >= 1.6x one rank (each rank does half of every block's matmuls; the all-reduces,
# 4 of B·T·C per block, are small beside them). Beside each: the bytes one rank sends per step
# in the TP group and the activations of rank 0. One thread per rank (OPENBLAS_NUM_THREADS=1):
# 2 ranks use 2 cores, 1 rank one. The machines here are shared and noisy: only the ratios of
# runs made one after the other in this script mean anything.
# Run it under flock /tmp/lab-bench.lock on a shared machine.
# Env: BUILD, MPIRUN_EXTRA (tools/bench_lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_init bench_tp 3,15
steps=6
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        -h|--help) bench_help ;;
        *) bench_bad_option "$1" ;;
    esac
done
bench_build 07_tensor_parallel

# run NP FLAGS...: prints "tokens/s sent_per_step acts_of_rank_0" of one run (the first step
# is left out of the rate: --log-every 0 and the report's own figure over all steps)
run() {
    local np=$1 out; shift
    out=$("${MPIRUN[@]}" -np "$np" ./07_tensor_parallel/run --log-every 0 "$@" 2>&1) || {
        echo "bench_tp: -np $np $* failed:" >&2; printf '%s\n' "$out" | tail -5 >&2
        echo "0 - -"; return; }
    printf '%s\n' "$out" | awk '
        /tokens\/s \(all ranks\)/ { for (i = 1; i <= NF; i++) if ($(i+1) == "tokens/s") tok = $i }
        /whole step, TP group: sent/ { for (i = 1; i <= NF; i++) if ($i == "sent") sent = $(i+1) $(i+2) }
        /^  activations/ { acts = $2 $3 }
        END { printf "%s %s %s\n", tok ? tok : 0, sent != "" ? sent : "-", acts != "" ? acts : "-" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }

echo "bench_tp: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $steps steps per run"
for cfg in "wide|--layers 2 --channels 512 --heads 8 --seq 64 --batch 8|>= 1.60" \
           "tiny|--layers 2 --channels 64 --heads 4 --seq 64 --batch 8|-"; do
    name=${cfg%%|*}; rest=${cfg#*|}; flags=${rest%%|*}; goal=${rest#*|}
    echo
    echo "$name config ($flags)"
    printf '   %-24s %12s %9s %8s %14s %14s\n' run tokens/s "x 1 rank" goal "sent/step" "acts rank 0"
    base=0
    for v in "1|--tp 1|1 rank (--tp 1)|-" "2|--tp 2|tp 2|$goal" "2|--tp 2 --sequence-parallel|tp 2 + SP|-"; do
        IFS='|' read -r np tpf label g <<< "$v"
        # shellcheck disable=SC2086  # flags are lists of words
        read -r tok sent acts < <(run "$np" $tpf --steps "$steps" $flags)
        [ "$np" = 1 ] && base=$tok
        printf '   %-24s %12s %9s %8s %14s %14s\n' "$label" "$tok" "$(ratio "$tok" "$base")" "$g" "$sent" "$acts"
    done
done
