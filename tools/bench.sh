#!/usr/bin/env bash
# make bench: single-rank training speed of the tiny GPT-2 on one core, as a fraction of that
# core's SGEMM peak measured in the same run (tools/bench.c). Extra arguments go to the program.
set -euo pipefail
BUILD=${BUILD:-build}
BENCH="$BUILD/tools/bench"
[ -x "$BENCH" ] || { echo "error: $BENCH is missing: run 'make bench' (or make BUILD=$BUILD tests)" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1

. "$(dirname "$0")/openblas_core.sh"
lab_openblas_core "$BENCH"

echo "Target: PyTorch reaches ~64% of the SGEMM peak on this model (fp32, one core); we aim for 75%."
echo
"$BENCH" "$@"
