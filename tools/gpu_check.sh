#!/usr/bin/env bash
# gpu_check.sh: checks the CUDA path on a machine with one GPU, in a few minutes:
#   1. builds with CUDA=1 (into $BUILD, default build-cuda)
#   2. tools/gpu_check: every CUDA kernel against the CPU kernel, then a tiny GPT-2 trained
#      for 10 steps on both devices (gradients, losses, weights compared)
#   3. a chapter's training run (03_ddp on one rank, 20 steps) with --device cpu and
#      --device cuda: same losses and final weights (gpu_check --compare-dumps)
# A step whose program is not in the tree is skipped with a message.
# Exit status: 0 when every step that ran passed.
#
#   bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build-cuda}
CHAPTER=${CHAPTER:-03_ddp}
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
step() { printf '\n== %s\n' "$*"; }

step "1/4 build: make BUILD=$BUILD CUDA=1"
if ! command -v nvcc >/dev/null 2>&1; then
    echo "nvcc not found: put the CUDA toolkit's bin directory on PATH (e.g. /usr/local/cuda/bin)"
    exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo "(nvidia-smi not found)"; fi
if [ ! -f tools/gpu_check.c ]; then
    echo "skipped: tools/gpu_check.c is not in this tree"
    exit 1
fi
make -j"$(nproc)" BUILD="$BUILD" CUDA=1 "$BUILD/tools/gpu_check" || exit 1

step "2/4 CUDA kernels vs CPU kernels, and a tiny GPT-2 on both ($BUILD/tools/gpu_check)"
timeout 240 "$BUILD/tools/gpu_check" || failed=1

step "3/4 $CHAPTER trained on one rank with --device cpu and --device cuda"
if [ ! -f "$CHAPTER/main.c" ]; then
    echo "skipped: $CHAPTER is not in this tree"
elif ! make -j"$(nproc)" BUILD="$BUILD" CUDA=1 "$CHAPTER"; then
    echo "FAIL: $CHAPTER does not build with CUDA=1"
    failed=1
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    launch=()
    if command -v mpirun >/dev/null 2>&1; then
        # shellcheck disable=SC2054  # "self,vader" is one argument
        launch=(mpirun --oversubscribe --bind-to none --mca btl self,vader -np 1)
    fi
    ran=1
    for dev in cpu cuda; do
        echo "\$ ${launch[*]} ./$CHAPTER/run --steps 20 --device $dev --quiet --dump $tmp/$dev.bin"
        if ! timeout 120 "${launch[@]}" "./$CHAPTER/run" --steps 20 --device "$dev" --quiet \
            --dump "$tmp/$dev.bin"; then
            echo "FAIL: the $dev run of $CHAPTER failed"
            failed=1
            ran=0
        fi
    done
    if [ "$ran" = 1 ]; then
        "$BUILD/tools/gpu_check" --compare-dumps "$tmp/cpu.bin" "$tmp/cuda.bin" || failed=1
    fi
fi

step "4/4 NCCL backend: every dist op on device buffers ($BUILD/tools/nccl_check)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
make -j"$(nproc)" BUILD="$BUILD" CUDA=1 "$BUILD/tools/nccl_check" &&
    timeout 120 mpirun --oversubscribe --bind-to none --mca btl self,vader -np "$ngpu" "$BUILD/tools/nccl_check" || failed=1

if [ "$failed" = 0 ]; then step "gpu_check.sh: OK"; else step "gpu_check.sh: FAILED (see above)"; fi
exit "$failed"
