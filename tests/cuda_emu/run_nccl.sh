#!/usr/bin/env bash
# Runs tools/nccl_check on the CPU: common/dist_nccl.c built against the NCCL emulator in
# tests/cuda_emu/nccl (NCCL over MPI, "device" memory in host memory; see its cuda_runtime.h),
# on 1 to 4 ranks. Checks the NCCL backend's arguments, in-place forms and byte counters, not
# its stream ordering (that needs a GPU: tools/nccl_check there). Then, on the same build,
# tests/mpi_uneven.c --device [--nccl] (uneven ops on device buffers, staged and over NCCL)
# and tests/mpi_dist.c --device cuda (every op staged through host memory by the MPI backend).
#
#   bash tests/cuda_emu/run_nccl.sh [rank counts, default "1 2 3 4"]
#
# Builds into $EMU_BUILD (default build-nccl-emu). Exit status: 0 when every run passed.
# shellcheck disable=SC2086  # the *FLAGS and *LIBS strings are lists of words on purpose
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${EMU_BUILD:-build-nccl-emu}
mkdir -p "$OUT/obj"

CC=${CC:-gcc}
MPI_CFLAGS=$(mpicc -showme:compile)
MPI_LIBS=$(mpicc -showme:link)
BLAS_CFLAGS=$(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
BLAS_LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CFLAGS="-std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -O1 -g -Wall -Wextra -Werror $SAN
        -Itests/cuda_emu/nccl -Icommon $MPI_CFLAGS $BLAS_CFLAGS -DLAB_CUDA=1"

objs=()
for f in common/*.c tests/cuda_emu/nccl/cuda_util_emu.c; do
    name=$(basename "$f" .c)
    $CC $CFLAGS -c "$f" -o "$OUT/obj/$name.o"
    objs+=("$OUT/obj/$name.o")
done
$CC $CFLAGS tools/nccl_check.c "${objs[@]}" $BLAS_LIBS $MPI_LIBS -lm -lpthread $SAN -o "$OUT/nccl_check"
# tests/mpi_uneven.c --device [--nccl]: the uneven ops on device buffers, staged and over NCCL;
# tests/mpi_dist.c --device cuda: every op on device buffers staged through host memory
$CC $CFLAGS -Itests tests/mpi_uneven.c tests/mpitest.c "${objs[@]}" $BLAS_LIBS $MPI_LIBS -lm -lpthread $SAN \
    -o "$OUT/mpi_uneven"
$CC $CFLAGS -Itests tests/mpi_dist.c tests/mpitest.c "${objs[@]}" $BLAS_LIBS $MPI_LIBS -lm -lpthread $SAN -o "$OUT/mpi_dist"
echo "built $OUT/nccl_check, $OUT/mpi_uneven and $OUT/mpi_dist (NCCL emulated over MPI)"

failed=0
for np in ${*:-1 2 3 4}; do
    echo "== $np rank(s)"
    mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -x OPENBLAS_NUM_THREADS=1 \
        -x ASAN_OPTIONS=detect_leaks=0 -np "$np" "$OUT/nccl_check" || failed=1
    for mode in "--device" "--device --nccl"; do
        mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -x OPENBLAS_NUM_THREADS=1 \
            -x ASAN_OPTIONS=detect_leaks=0 -np "$np" "$OUT/mpi_uneven" $mode rs ag gather || failed=1
    done
    mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -x OPENBLAS_NUM_THREADS=1 \
        -x ASAN_OPTIONS=detect_leaks=0 -np "$np" "$OUT/mpi_dist" --device cuda || failed=1
done
exit "$failed"
