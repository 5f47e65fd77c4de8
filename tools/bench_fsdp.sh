#!/usr/bin/env bash
# bench_fsdp.sh: chapter 06's speed goals, as ratios of runs made together.
#
#   tools/bench_fsdp.sh [--steps N] [--np N]
#
# On --np ranks (default 2), on the tiny config and on a wide model with little compute per
# parameter, one after the other: DDP (03_ddp), ZeRO-3 (05_zero --zero 3), FSDP without
# prefetch and FSDP with prefetch 1 and 2 (06_fsdp). Prints tokens/s, each run's ratio to
# ZeRO-3 and to DDP, prefetch-on / prefetch-off, and the peak memory of rank 0 (mem.h) beside
# each: prefetch's price is the units it holds ahead. Goals (issue 14): FSDP with prefetch
# >= 1.0x ZeRO-3 and >= 0.8x DDP. The machines here are shared and noisy: only the ratios of
# runs made one after the other in this script mean anything.
# Run it under flock /tmp/lab-bench.lock on a shared machine.
# Env: BUILD (build dir for make, default build), MPIRUN_EXTRA (more mpirun flags).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here/.." || exit 2
steps=10; np=2
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        -h|--help) sed -n '3,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench_fsdp: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
make --no-print-directory BUILD="${BUILD:-build}" 03_ddp 05_zero 06_fsdp >/dev/null || {
    echo "bench_fsdp: build failed (run make 03_ddp 05_zero 06_fsdp to see why)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# shellcheck disable=SC2206,SC2054  # MPIRUN_EXTRA splits into words; "self,vader" is one
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1
        ${MPIRUN_EXTRA:-})

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

echo "bench_fsdp: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $np ranks, $steps steps per run"
for cfg in "tiny|--batch $((8 * np))" "wide|--layers 2 --channels 512 --heads 8 --seq 16 --batch $((4 * np))"; do
    name=${cfg%%|*}; flags=${cfg#*|}
    echo
    echo "$name config ($flags)"
    printf '   %-22s %10s %8s %8s %8s %16s\n' run tokens/s "x ZeRO3" "x DDP" "x pf 0" "peak mem rank 0"
    # shellcheck disable=SC2086  # flags is a list of words
    read -r ddp ddp_m1 ddp_m2 < <(run ./03_ddp/run --overlap-steps 0 --steps "$steps" $flags)
    # shellcheck disable=SC2086
    read -r z3 z3_m1 z3_m2 < <(run ./05_zero/run --zero 3 --steps "$steps" $flags)
    printf '   %-22s %10s %8s %8s %8s %16s\n' "DDP (03)" "$ddp" "$(ratio "$ddp" "$z3")" 1.00 - "$ddp_m1 $ddp_m2"
    printf '   %-22s %10s %8s %8s %8s %16s\n' "ZeRO-3 (05)" "$z3" 1.00 "$(ratio "$z3" "$ddp")" - "$z3_m1 $z3_m2"
    pf0=0
    for pf in 0 1 2; do
        # shellcheck disable=SC2086
        read -r tok m1 m2 < <(run ./06_fsdp/run --prefetch "$pf" --steps "$steps" $flags)
        [ "$pf" = 0 ] && pf0=$tok
        printf '   %-22s %10s %8s %8s %8s %16s\n' "FSDP (06) prefetch $pf" "$tok" "$(ratio "$tok" "$z3")" \
            "$(ratio "$tok" "$ddp")" "$(ratio "$tok" "$pf0")" "$m1 $m2"
    done
    echo "   goals: FSDP with prefetch >= 1.00 x ZeRO-3 and >= 0.80 x DDP"
done
