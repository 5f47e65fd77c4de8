#!/usr/bin/env bash
# bench_ab.sh: a refactor's speed proof. The same runs of every training chapter from two built
# trees (before and after), alternating A B A B ... so that a burst of load from elsewhere hits
# both alike, and for each run the ratio of wall times, pair by pair.
#
#   bash tools/bench_ab.sh OLD_TREE NEW_TREE [--rounds K] [--filter REGEX]
#
# Both trees must be built (make all). Each row prints the median over K pairs (default 5) of
# t_old / t_new (above 1: the new tree is faster) and the spread (min .. max) of those ratios,
# then the median seconds of each side. The machines here are shared and noisy: read the
# median and the spread, never one pair. A row whose run fails in either tree says so.
set -uo pipefail
usage() { sed -n 2,11p "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
[ $# -ge 2 ] || usage 2
old=$(cd "$1" && pwd) || exit 2
new=$(cd "$2" && pwd) || exit 2
shift 2
rounds=5 filter=.
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "bench_ab: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1)

# name | ranks | program (relative to a tree) | flags
RUNS=(
  "bench|0|build/tools/bench|"
  "00_train|0|00_memory_budget/run|--train --steps 20 --quiet"
  "03_ddp_np2|2|03_ddp/run|--steps 20 --quiet"
  "05_z1_np2|2|05_zero/run|--zero 1 --steps 20 --quiet"
  "05_z2_np2|2|05_zero/run|--zero 2 --steps 20 --quiet"
  "05_z3_np2|2|05_zero/run|--zero 3 --steps 20 --quiet"
  "06_fsdp_np2|2|06_fsdp/run|--steps 20 --quiet"
  "07_tp2_wide|2|07_tensor_parallel/run|--tp 2 --layers 2 --channels 512 --heads 8 --batch 8 --steps 6 --quiet"
  "08_1f1b_np2|2|08_pipeline/run|--schedule 1f1b --micro-batches 8 --steps 10 --quiet"
  "09_2x2x2|8|09_3d/run|--tp 2 --pp 2 --steps 6 --quiet"
)

# one TREE RANKS PROGRAM FLAGS...: the run's wall seconds, or "fail"
one() {
  local tree=$1 np=$2 prog=$3 t0 t1; shift 3
  t0=$(date +%s.%N)
  if [ "$np" = 0 ]; then
    (cd "$tree" && "./$prog" "$@" >/dev/null 2>&1) || { echo fail; return; }
  else
    (cd "$tree" && "${MPIRUN[@]}" -np "$np" "./$prog" "$@" >/dev/null 2>&1) || { echo fail; return; }
  fi
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}

echo "bench_ab: old $old, new $new; $rounds alternating pairs per row; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-14s %8s %16s %10s %10s\n' run "old/new" "spread" "old s" "new s"
worst=""
for row in "${RUNS[@]}"; do
  IFS='|' read -r name np prog flags <<<"$row"
  [[ "$name" =~ $filter ]] || continue
  ratios=() olds=() news=() failed=""
  # shellcheck disable=SC2086  # flags are lists of words
  for ((k = 0; k < rounds; k++)); do
    a=$(one "$old" "$np" "$prog" $flags)
    b=$(one "$new" "$np" "$prog" $flags)
    if [ "$a" = fail ] || [ "$b" = fail ]; then failed="old $a, new $b"; break; fi
    olds+=("$a") news+=("$b")
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", a / b }')")
  done
  if [ -n "$failed" ]; then printf '%-14s failed (%s)\n' "$name" "$failed"; continue; fi
  med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
  lo=$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)
  hi=$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)
  printf '%-14s %8s %16s %10s %10s\n' "$name" "$(med "${ratios[@]}")" "$lo .. $hi" "$(med "${olds[@]}")" "$(med "${news[@]}")"
done
echo "old/new: the old tree's wall time over the new's, per pair (1.00: the same speed; above 1: the new is faster)"
