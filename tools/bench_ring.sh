#!/usr/bin/env bash
# bench_ring.sh: chapter 04's speed comparison, the lab's pipelined ring against Open MPI's
# MPI_Allreduce from 1 MiB to 256 MiB, on 2 and on 4 ranks (see 04_ring_allreduce/README.md).
#
#   tools/bench_ring.sh [NP...]          default: 2 4
#
# Env: ITERS (5), WARMUP (2), REPEATS (3), SEGMENT_KIB (256), MIN (1M), MAX (256M), FACTOR (2).
# Prints each run's full table; the summary at its end holds the ratio columns.
# The machine is shared: run it when it is quiet, and more than once.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x 04_ring_allreduce/run ] || make 04_ring_allreduce
nps=("$@")
[ ${#nps[@]} -eq 0 ] && nps=(2 4)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
for np in "${nps[@]}"; do
    echo "== $np ranks, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    # yield_when_idle: with more ranks than cores, a waiting rank gives its core to one with work
    mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1 -np "$np" \
        ./04_ring_allreduce/run --min-bytes "${MIN:-1M}" --max-bytes "${MAX:-256M}" \
        --step-factor "${FACTOR:-2}" --warmup-iters "${WARMUP:-2}" --iters "${ITERS:-5}" \
        --repeats "${REPEATS:-3}" --segment-kib "${SEGMENT_KIB:-256}"
done
