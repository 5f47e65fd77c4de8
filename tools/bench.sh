#!/usr/bin/env bash
# make bench: single-rank training speed of the tiny GPT-2 on one core, as a fraction of that
# core's SGEMM peak measured in the same run (tools/bench.c). Extra arguments go to the program.
set -euo pipefail
BUILD=${BUILD:-build}
BENCH="$BUILD/tools/bench"
[ -x "$BENCH" ] || { echo "error: $BENCH is missing: run 'make bench' (or make BUILD=$BUILD tests)" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1

# OpenBLAS picks its kernels from the CPU model. An old OpenBLAS on a newer CPU (or under a
# hypervisor) may not recognize it and fall back to its generic SSE3 "Prescott" kernels, 5-10x
# slower than the AVX-512/AVX2 ones the CPU can run. Then choose the right ones ourselves.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$(OPENBLAS_VERBOSE=2 "$BENCH" --help 2>&1 >/dev/null | sed -n 's/^Core: *//p' | head -n 1)
  if [ "$core" = "Prescott" ]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
    fi
    [ -n "${OPENBLAS_CORETYPE:-}" ] &&
      echo "note: OpenBLAS did not recognize this CPU (generic Prescott kernels); using OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
  fi
fi

echo "Target: PyTorch reaches ~64% of the SGEMM peak on this model (fp32, one core); we aim for 75%."
echo
"$BENCH" "$@"
