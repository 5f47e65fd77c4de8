#!/usr/bin/env bash
# Runs tools/gpu_check on the CPU, with common/*.cu executed by the emulator in
# tests/cuda_emu/include (see cuda_runtime.h there): checks the CUDA kernels' logic against the
# CPU kernels on a machine without a GPU. Slow (every GPU thread is a coroutine); a few minutes.
#
#   bash tests/cuda_emu/run.sh [gpu_check arguments, e.g. --kernels-only]
#   EMU_TOOL=gpu_check_tp bash tests/cuda_emu/run.sh   the tensor-parallel kernels (common/tp.h)
#   EMU_TOOL=bench_gpu bash tests/cuda_emu/run.sh --model tiny --batch 1 --steps 1 --peak-tflops 1
#                       another tools/*.c program instead of gpu_check (here: a bf16 training
#                       step of tiny GPT-2 through the CUDA path, TF32 matmuls included)
#
# Builds into $EMU_BUILD (default build-cuda-emu). Exit status: gpu_check's.
# shellcheck disable=SC2086  # the *FLAGS and *LIBS strings are lists of words on purpose
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${EMU_BUILD:-build-cuda-emu}
mkdir -p "$OUT/obj"

CC=${CC:-gcc}
CXX=${CXX:-g++}
MPI_CFLAGS=$(mpicc -showme:compile)
MPI_LIBS=$(mpicc -showme:link)
BLAS_CFLAGS=$(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
BLAS_LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
# UBSan on everything (ASan does not get along with the emulator's coroutine stacks).
SAN="-fsanitize=undefined -fno-sanitize-recover=undefined"
# LAB_CUDA_EMU: the C files see no real CUDA headers, so dist_nccl.c builds its stubs (no NCCL here).
CFLAGS="-std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -O2 -g -Wall -Wextra -Werror $SAN
        -Icommon $MPI_CFLAGS $BLAS_CFLAGS -DLAB_CUDA=1 -DLAB_CUDA_EMU=1"
CXXFLAGS="-std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-function $SAN
          -Itests/cuda_emu/include -Icommon $MPI_CFLAGS -DLAB_CUDA=1"

objs=()
for f in common/*.cu; do
    name=$(basename "$f" .cu)
    # kernel<<<grid, block>>>(args)  ->  emu_launch(kernel, emu_cfg(grid, block))(args)
    { echo "#line 1 \"$f\""; perl -0pe 's/(\w+)<<<(.*?)>>>/emu_launch($1, emu_cfg($2))/gs' "$f"; } \
        > "$OUT/obj/$name.emu.cpp"
    $CXX $CXXFLAGS -c "$OUT/obj/$name.emu.cpp" -o "$OUT/obj/$name.cu.o"
    objs+=("$OUT/obj/$name.cu.o")
done
for f in common/*.c; do
    name=$(basename "$f" .c)
    $CC $CFLAGS -c "$f" -o "$OUT/obj/$name.o"
    objs+=("$OUT/obj/$name.o")
done
# EMU_CHAPTER=NN_name [EMU_NP=N]: that chapter's program instead, run on N ranks (default 1) with
# the arguments given, e.g. EMU_CHAPTER=06_fsdp EMU_NP=2 bash tests/cuda_emu/run.sh --device cuda
if [ -n "${EMU_CHAPTER:-}" ]; then
    [ -f "$EMU_CHAPTER/main.c" ] || { echo "EMU_CHAPTER=$EMU_CHAPTER: no $EMU_CHAPTER/main.c" >&2; exit 2; }
    prog="$OUT/$(basename "$EMU_CHAPTER")"
    $CC $CFLAGS -I"$EMU_CHAPTER" "$EMU_CHAPTER"/*.c "${objs[@]}" $BLAS_LIBS $MPI_LIBS -lstdc++ -lm \
        -lpthread $SAN -o "$prog"
    echo "built $prog (CUDA kernels emulated on the CPU)"
    OPENBLAS_NUM_THREADS=1 exec mpirun --allow-run-as-root --oversubscribe --mca btl self,vader \
        -x OPENBLAS_NUM_THREADS -np "${EMU_NP:-1}" "$prog" "$@"
fi
TOOL=${EMU_TOOL:-gpu_check}
[ -f "tools/$TOOL.c" ] || { echo "EMU_TOOL=$TOOL: tools/$TOOL.c does not exist" >&2; exit 2; }
$CC $CFLAGS "tools/$TOOL.c" "${objs[@]}" $BLAS_LIBS $MPI_LIBS -lstdc++ -lm -lpthread $SAN \
    -o "$OUT/$TOOL"
echo "built $OUT/$TOOL (CUDA kernels emulated on the CPU)"
OPENBLAS_NUM_THREADS=1 "$OUT/$TOOL" "$@"
