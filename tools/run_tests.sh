#!/usr/bin/env bash
# run_tests.sh <builddir> <test binaries...>: run every Criterion test binary, keep going after
# failures, print a table per binary and finish with exactly one line "N passed, N failed".
#
# Each binary runs one test at a time (-j1: the multi-rank tests launch mpirun themselves and
# would fight over the cores), and LAB_TEST_JOBS binaries (default 2) run side by side: most of a
# test is mpirun's start-up and ranks waiting on each other, so two overlap on two cores. Each
# binary's output is printed whole, in the order given, when it ends. Criterion prints only
# failures (with their assertion messages) and its "Synthesis" line; passing tests stay quiet.
# LAB_BUILD tells the tests where the MPI programs they launch are (tests/harness.h).
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: tools/run_tests.sh <builddir> <test binaries...>" >&2
  exit 2
fi
build=$1
shift
export LAB_BUILD=$build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
per_binary_timeout=${LAB_TEST_TIMEOUT:-900}

jobs=${LAB_TEST_JOBS:-2}
dir=$(mktemp -d /tmp/lab-tests-XXXXXX)
trap 'rm -rf "$dir"' EXIT

# One binary: its output into $dir/K.out, its table row into $dir/K.row, "passed failed" into
# $dir/K.count.
run_one() {
  local k=$1 bin=$2 name t0 t1 secs rc synth tested passing failing crashing bad
  name=$(basename "$bin")
  local out=$dir/$k.out
  echo "── $name" >"$out"
  if [ ! -x "$bin" ]; then
    echo "   missing: $bin (was it built?)" >>"$out"
    printf '%-22s %7s %7s %7s %8s %8s\n' "$name" - 0 1 0 "-" >"$dir/$k.row"
    echo "0 1" >"$dir/$k.count"
    return
  fi
  t0=$(date +%s.%N)
  timeout -k 10 "$per_binary_timeout" "$bin" -j1 >>"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  # [====] Synthesis: Tested: X | Passing: Y | Failing: Z | Crashing: W
  synth=$(sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E 'Synthesis: Tested: [0-9]+' | tail -n 1)
  if [ -z "$synth" ]; then
    # the binary itself died (or timed out) before Criterion could sum up: one failure
    echo "   $name ended without a Criterion summary (exit $rc)" >>"$out"
    printf '%-22s %7s %7s %7s %8s %8s\n' "$name" "?" 0 1 0 "$secs" >"$dir/$k.row"
    echo "0 1" >"$dir/$k.count"
    return
  fi
  tested=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<<"$synth")
  passing=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$synth")
  failing=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$synth")
  crashing=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$synth")
  printf '%-22s %7s %7s %7s %8s %8s\n' "$name" "$tested" "$passing" "$failing" "$crashing" "$secs" >"$dir/$k.row"
  # Criterion counts a crashing test among the failing ones too: count it once.
  bad=$failing
  [ "$crashing" -gt "$failing" ] && bad=$crashing
  echo "$passing $bad" >"$dir/$k.count"
}

t_start=$(date +%s)
n=$#
k=0
shown=0
# show every finished binary's output in order, as soon as those before it have finished
show_ready() {
  while [ "$shown" -lt "$n" ] && [ -f "$dir/$shown.count" ]; do
    cat "$dir/$shown.out"
    shown=$((shown + 1))
  done
}
for bin in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n
    show_ready
  done
  run_one "$k" "$bin" &
  k=$((k + 1))
done
wait
show_ready

total_pass=0
total_fail=0
echo
printf '%-22s %7s %7s %7s %8s %8s\n' "test binary" tested passed failed crashed "time s"
for ((k = 0; k < n; k++)); do
  cat "$dir/$k.row"
  read -r p f <"$dir/$k.count"
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
done
echo
echo "($n binaries, $jobs at a time: $(( $(date +%s) - t_start )) s)"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
