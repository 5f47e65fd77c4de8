#!/usr/bin/env bash
# gpu_check.sh: checks the CUDA path on a machine with one GPU, in a few minutes (issue #7):
#   1. builds with CUDA=1 (into $BUILD, default build-cuda)
#   2. tools/gpu_check: every CUDA kernel against the CPU kernel on the same random inputs
#      (tools/gpu_check_tp: those of tensor parallelism, and common/tp.h's block on both),
#      then a tiny GPT-2 trained for 10 steps on both devices in fp32 and in bf16 (gradients,
#      losses, weights; bf16 with TF32 matmuls on the GPU)
#   3. chapter 00's single-device training, 20 steps, --device cpu vs --device cuda:
#        fp32  losses within 1e-4 relative, final weights within 1e-3 (= lr)
#        bf16  losses within 2e-3 relative, final weights within 1.6e-2 (two bf16 steps at 1.0):
#              the devices sum in different orders and a weight may round to the next bf16 value
#   4. 03_ddp with the MPI backend on 1, 2 and 4 ranks sharing the GPU (device buffers staged
#      through host memory): 2 and 4 ranks against 1 within 1e-5 / 2e-4 (chapter 03's test
#      bounds, loss bound x10 for the GPU's algorithm choice per shape); 1 rank cuda vs cpu
#   4b. 06_fsdp the same way: 1 rank cuda vs cpu, 2 ranks and HSDP 2 x 2 against 1 rank
#   5. NCCL backend: every dist op on device buffers, world size = number of GPUs (nccl_check),
#      and 03_ddp --backend nccl on one rank against the MPI backend
#      05_zero --zero 1, 2, 3 on 2 ranks: --device cuda (MPI backend, staged) against --device
#      cpu (fp32 bounds of step 3), and with 2 GPUs --backend nccl against the staged run
#   6. speed: tokens/s and MFU of GPT-2 124M (T=1024) training in bf16 (tools/bench_gpu)
# Exit status: 0 when every step passed.
#
#   bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build-cuda}
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; failed=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2054  # "self,vader" is one argument
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
COMPARE="$BUILD/tools/gpu_check --compare-dumps"

# run NAME NP PROGRAM FLAGS...: one training run writing $tmp/NAME.bin; 0 on success
run() {
    local name=$1 np=$2 prog=$3; shift 3
    echo "\$ mpirun -np $np $prog $* --quiet --dump $tmp/$name.bin"
    timeout 150 "${MPIRUN[@]}" -np "$np" "$prog" "$@" --quiet --dump "$tmp/$name.bin" ||
        { fail "$name: $prog exited with an error"; return 1; }
}

step "1/6 build: make BUILD=$BUILD CUDA=1"
command -v nvcc >/dev/null 2>&1 ||
    { echo "nvcc not found: put the CUDA toolkit's bin directory on PATH (e.g. /usr/local/cuda/bin)"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo "(nvidia-smi not found)"; fi
make -j"$(nproc)" BUILD="$BUILD" CUDA=1 all "$BUILD/tools/gpu_check" "$BUILD/tools/gpu_check_tp" "$BUILD/tools/nccl_check" \
    "$BUILD/tools/bench_gpu" >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; exit 1; }
echo "built"

step "2/6 CUDA kernels vs CPU kernels, and a tiny GPT-2 on both ($BUILD/tools/gpu_check)"
timeout 240 "$BUILD/tools/gpu_check" || fail "gpu_check"
timeout 120 "$BUILD/tools/gpu_check_tp" || fail "gpu_check_tp (tensor-parallel kernels and pieces)"

step "3/6 chapter 00: single-device training, --device cpu vs --device cuda, fp32 and bf16"
for dt in fp32 bf16; do
    ok=1
    for dev in cpu cuda; do
        run "00_${dt}_$dev" 1 ./00_memory_budget/run --train --steps 20 --dtype "$dt" --device "$dev" || ok=0
    done
    tol=(1e-4 1e-3); [ "$dt" = bf16 ] && tol=(2e-3 1.6e-2)
    [ "$ok" = 1 ] && { $COMPARE "$tmp/00_${dt}_cpu.bin" "$tmp/00_${dt}_cuda.bin" "${tol[@]}" || fail "00 $dt cpu vs cuda"; }
done

step "4/6 03_ddp, MPI backend: 1, 2 and 4 ranks sharing the GPU"
ok=1
run ddp_cpu 1 ./03_ddp/run --steps 10 --device cpu || ok=0
for np in 1 2 4; do run "ddp_cuda_np$np" "$np" ./03_ddp/run --steps 10 --device cuda || ok=0; done
if [ "$ok" = 1 ]; then
    echo "-- 1 rank: cpu vs cuda";  $COMPARE "$tmp/ddp_cpu.bin" "$tmp/ddp_cuda_np1.bin" || fail "03 cpu vs cuda"
    echo "-- cuda: 2 ranks vs 1";   $COMPARE "$tmp/ddp_cuda_np1.bin" "$tmp/ddp_cuda_np2.bin" 1e-5 2e-4 || fail "03 2 ranks"
    echo "-- cuda: 4 ranks vs 1";   $COMPARE "$tmp/ddp_cuda_np1.bin" "$tmp/ddp_cuda_np4.bin" 1e-5 2e-4 || fail "03 4 ranks"
fi

step "4b/6 06_fsdp, MPI backend: 1 and 2 ranks, and HSDP 2 x 2 on 4, sharing the GPU"
ok=1
run fsdp_cpu 1 ./06_fsdp/run --steps 10 --device cpu || ok=0
for np in 1 2; do run "fsdp_cuda_np$np" "$np" ./06_fsdp/run --steps 10 --device cuda || ok=0; done
run fsdp_cuda_hsdp 4 ./06_fsdp/run --steps 10 --device cuda --shard-group 2 || ok=0
if [ "$ok" = 1 ]; then
    echo "-- 1 rank: cpu vs cuda";  $COMPARE "$tmp/fsdp_cpu.bin" "$tmp/fsdp_cuda_np1.bin" || fail "06 cpu vs cuda"
    echo "-- cuda: 2 ranks vs 1";   $COMPARE "$tmp/fsdp_cuda_np1.bin" "$tmp/fsdp_cuda_np2.bin" 1e-5 2e-4 || fail "06 2 ranks"
    echo "-- cuda: HSDP 2 x 2 vs 1"; $COMPARE "$tmp/fsdp_cuda_np1.bin" "$tmp/fsdp_cuda_hsdp.bin" 1e-5 2e-4 || fail "06 HSDP"
fi

step "5/6 NCCL backend"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
timeout 120 "${MPIRUN[@]}" -np "$ngpu" "$BUILD/tools/nccl_check" || fail "nccl_check"
if run ddp_nccl 1 ./03_ddp/run --steps 10 --device cuda --backend nccl && [ -f "$tmp/ddp_cuda_np1.bin" ]; then
    echo "-- 1 rank: nccl vs mpi"; $COMPARE "$tmp/ddp_cuda_np1.bin" "$tmp/ddp_nccl.bin" 1e-6 1e-6 || fail "03 nccl vs mpi"
fi

for z in 1 2 3; do
    ok=1
    run "zero${z}_cpu" 2 ./05_zero/run --zero "$z" --steps 10 --bucket-kb 64 --device cpu || ok=0
    run "zero${z}_cuda" 2 ./05_zero/run --zero "$z" --steps 10 --bucket-kb 64 --device cuda || ok=0
    [ "$ok" = 1 ] && { echo "-- 05 --zero $z x 2: cpu vs cuda"
        $COMPARE "$tmp/zero${z}_cpu.bin" "$tmp/zero${z}_cuda.bin" 1e-4 1e-3 || fail "05 --zero $z cpu vs cuda"; }
    if [ "$ngpu" -ge 2 ] && [ "$ok" = 1 ] &&
        run "zero${z}_nccl" 2 ./05_zero/run --zero "$z" --steps 10 --bucket-kb 64 --device cuda --backend nccl; then
        echo "-- 05 --zero $z x 2: nccl vs mpi"
        $COMPARE "$tmp/zero${z}_cuda.bin" "$tmp/zero${z}_nccl.bin" 1e-5 2e-4 || fail "05 --zero $z nccl vs mpi"
    fi
done

step "6/6 speed: GPT-2 124M (V=50257 T=1024 L=12 C=768 NH=12), bf16, one GPU"
timeout 240 "$BUILD/tools/bench_gpu" --model 124m --dtype bf16 --batch 8 --steps 10 --warmup 2 ||
    fail "bench_gpu 124M"

if [ "$failed" = 0 ]; then step "gpu_check.sh: OK"; else step "gpu_check.sh: FAILED (see above)"; fi
exit "$failed"
