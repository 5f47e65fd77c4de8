#!/usr/bin/env bash
# run_tests.sh <builddir> <test binaries...>: run every Criterion test binary, keep going after
# failures, print a table per binary and finish with exactly one line "N passed, N failed".
#
# Each binary runs one test at a time (-j1: the multi-rank tests launch mpirun themselves and
# would fight over the cores). Criterion prints only failures (with their assertion messages)
# and its "Synthesis" line; passing tests stay quiet. LAB_BUILD tells the tests where the MPI
# programs they launch are (tests/harness.h).
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

log=$(mktemp /tmp/lab-tests-XXXXXX)
trap 'rm -f "$log"' EXIT

rows=()
total_pass=0
total_fail=0
for bin in "$@"; do
  name=$(basename "$bin")
  echo "── $name"
  if [ ! -x "$bin" ]; then
    echo "   missing: $bin (was it built?)"
    rows+=("$(printf '%-22s %7s %7s %7s %8s %8s' "$name" - 0 1 0 "-")")
    total_fail=$((total_fail + 1))
    continue
  fi
  t0=$(date +%s.%N)
  timeout -k 10 "$per_binary_timeout" "$bin" -j1 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  # [====] Synthesis: Tested: X | Passing: Y | Failing: Z | Crashing: W
  synth=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E 'Synthesis: Tested: [0-9]+' | tail -n 1)
  if [ -z "$synth" ]; then
    # the binary itself died (or timed out) before Criterion could sum up: one failure
    echo "   $name ended without a Criterion summary (exit $rc)"
    rows+=("$(printf '%-22s %7s %7s %7s %8s %8s' "$name" "?" 0 1 0 "$secs")")
    total_fail=$((total_fail + 1))
    continue
  fi
  tested=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<<"$synth")
  passing=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$synth")
  failing=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$synth")
  crashing=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$synth")
  rows+=("$(printf '%-22s %7s %7s %7s %8s %8s' "$name" "$tested" "$passing" "$failing" "$crashing" "$secs")")
  total_pass=$((total_pass + passing))
  # Criterion counts a crashing test among the failing ones too: count it once.
  bad=$failing
  [ "$crashing" -gt "$failing" ] && bad=$crashing
  total_fail=$((total_fail + bad))
done

echo
printf '%-22s %7s %7s %7s %8s %8s\n' "test binary" tested passed failed crashed "time s"
printf '%s\n' "${rows[@]}"
echo
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
