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
#   6-8. the model-parallel chapters, MPI backend, the ranks sharing the GPU, 10 steps of the
#      default tiny model, each in fp32 and bf16: --device cuda against --device cpu (step 3's
#      bounds), and against chapter 00 on the GPU (fp32: 1e-5 / 2e-4 as step 4; bf16: step 3's
#      bf16 bounds, the same two causes: another summation order, a weight one bf16 step away)
#   6. 07_tensor_parallel --tp 2 on 2 ranks, without and with --sequence-parallel
#   7. 08_pipeline on 2 stages, --schedule 1f1b and zb (4 micro-batches; bf16 messages in bf16)
#   8. 09_3d: 1 x 2 x 2 on 4 ranks (1F1B; ZB-H1 with sequence parallelism) and 2 x 2 x 2 on 8
#      ranks (interleaved, 2 chunks, --zero 1)
#   9. speed: tokens/s and MFU of GPT-2 124M (T=1024) training in bf16 (tools/bench_gpu)
# Exit status: 0 when every step passed.
#
#   bash tools/gpu_check.sh
#   GPU_CHECK_STEPS="6 7 8" bash tools/gpu_check.sh     only those steps (4 runs 4 and 4b; no 1:
#                                                      the binaries in $BUILD must be built)
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_STEPS="6 7 8" BUILD=build bash tools/gpu_check.sh
#                        the plumbing of steps 3-8 without a GPU: "cuda" runs are --device cpu
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build-cuda}
DEV=${GPU_CHECK_DEVICE:-cuda}
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; failed=1; }
# want N: step N is asked for (GPU_CHECK_STEPS unset: every step)
want() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]; }
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

# versus A B LABEL [LOSS_RTOL PARAM_ATOL]: the dumps of runs A and B within the tolerances
versus() {
    local a=$1 b=$2 label=$3; shift 3
    echo "-- $label"
    $COMPARE "$tmp/$a.bin" "$tmp/$b.bin" "$@" || fail "$label"
}

# model_parallel NAME NP PROGRAM FLAGS...: steps 6-8. In fp32 and bf16: the run on --device cpu
# and on $DEV (cpu vs $DEV within step 3's bounds), and the $DEV run against chapter 00 on $DEV
# (oracle_<dtype>, the same default model and 10 steps) within the bounds in the header.
model_parallel() {
    local name=$1 np=$2 prog=$3 dt ok; shift 3
    for dt in fp32 bf16; do
        ok=1
        run "${name}_${dt}_cpu" "$np" "$prog" "$@" --steps 10 --dtype "$dt" --device cpu || ok=0
        run "${name}_${dt}_dev" "$np" "$prog" "$@" --steps 10 --dtype "$dt" --device "$DEV" || ok=0
        [ "$ok" = 1 ] || continue
        local tdev=(1e-4 1e-3) t00=(1e-5 2e-4)
        [ "$dt" = bf16 ] && tdev=(2e-3 1.6e-2) t00=(2e-3 1.6e-2)
        versus "${name}_${dt}_cpu" "${name}_${dt}_dev" "$name $dt: cpu vs $DEV" "${tdev[@]}"
        [ -f "$tmp/oracle_$dt.bin" ] &&
            versus "oracle_$dt" "${name}_${dt}_dev" "$name $dt on $DEV vs chapter 00 on $DEV" "${t00[@]}"
    done
}

if want 1; then
step "1/9 build: make BUILD=$BUILD CUDA=1"
command -v nvcc >/dev/null 2>&1 ||
    { echo "nvcc not found: put the CUDA toolkit's bin directory on PATH (e.g. /usr/local/cuda/bin)"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo "(nvidia-smi not found)"; fi
make -j"$(nproc)" BUILD="$BUILD" CUDA=1 all "$BUILD/tools/gpu_check" "$BUILD/tools/gpu_check_tp" "$BUILD/tools/nccl_check" \
    "$BUILD/tools/bench_gpu" >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; exit 1; }
echo "built"
fi

if want 2; then
step "2/9 CUDA kernels vs CPU kernels, and a tiny GPT-2 on both ($BUILD/tools/gpu_check)"
timeout 240 "$BUILD/tools/gpu_check" || fail "gpu_check"
timeout 120 "$BUILD/tools/gpu_check_tp" || fail "gpu_check_tp (tensor-parallel kernels and pieces)"
fi

if want 3; then
step "3/9 chapter 00: single-device training, --device cpu vs --device $DEV, fp32 and bf16"
for dt in fp32 bf16; do
    ok=1
    for dev in cpu "$DEV"; do
        run "00_${dt}_$dev" 1 ./00_memory_budget/run --train --steps 20 --dtype "$dt" --device "$dev" || ok=0
    done
    tol=(1e-4 1e-3); [ "$dt" = bf16 ] && tol=(2e-3 1.6e-2)
    [ "$ok" = 1 ] && versus "00_${dt}_cpu" "00_${dt}_$DEV" "00 $dt cpu vs $DEV" "${tol[@]}"
done
fi

if want 4; then
step "4/9 03_ddp, MPI backend: 1, 2 and 4 ranks sharing the GPU"
ok=1
run ddp_cpu 1 ./03_ddp/run --steps 10 --device cpu || ok=0
for np in 1 2 4; do run "ddp_cuda_np$np" "$np" ./03_ddp/run --steps 10 --device "$DEV" || ok=0; done
if [ "$ok" = 1 ]; then
    versus ddp_cpu ddp_cuda_np1 "03 1 rank: cpu vs $DEV"
    versus ddp_cuda_np1 ddp_cuda_np2 "03 $DEV: 2 ranks vs 1" 1e-5 2e-4
    versus ddp_cuda_np1 ddp_cuda_np4 "03 $DEV: 4 ranks vs 1" 1e-5 2e-4
fi

step "4b/9 06_fsdp, MPI backend: 1 and 2 ranks, and HSDP 2 x 2 on 4, sharing the GPU"
ok=1
run fsdp_cpu 1 ./06_fsdp/run --steps 10 --device cpu || ok=0
for np in 1 2; do run "fsdp_cuda_np$np" "$np" ./06_fsdp/run --steps 10 --device "$DEV" || ok=0; done
run fsdp_cuda_hsdp 4 ./06_fsdp/run --steps 10 --device "$DEV" --shard-group 2 || ok=0
if [ "$ok" = 1 ]; then
    versus fsdp_cpu fsdp_cuda_np1 "06 1 rank: cpu vs $DEV"
    versus fsdp_cuda_np1 fsdp_cuda_np2 "06 $DEV: 2 ranks vs 1" 1e-5 2e-4
    versus fsdp_cuda_np1 fsdp_cuda_hsdp "06 $DEV: HSDP 2 x 2 vs 1" 1e-5 2e-4
fi
fi

if want 5; then
step "5/9 NCCL backend"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
timeout 120 "${MPIRUN[@]}" -np "$ngpu" "$BUILD/tools/nccl_check" || fail "nccl_check"
if run ddp_nccl 1 ./03_ddp/run --steps 10 --device cuda --backend nccl && [ -f "$tmp/ddp_cuda_np1.bin" ]; then
    versus ddp_cuda_np1 ddp_nccl "03 1 rank: nccl vs mpi" 1e-6 1e-6
fi

for z in 1 2 3; do
    ok=1
    zb=""; [ "$z" = 2 ] && zb="--bucket-kb 64"  # 05 refuses --bucket-kb at other stages
    run "zero${z}_cpu" 2 ./05_zero/run --zero "$z" --steps 10 $zb --device cpu || ok=0
    run "zero${z}_cuda" 2 ./05_zero/run --zero "$z" --steps 10 $zb --device cuda || ok=0
    [ "$ok" = 1 ] && versus "zero${z}_cpu" "zero${z}_cuda" "05 --zero $z x 2: cpu vs cuda" 1e-4 1e-3
    if [ "$ngpu" -ge 2 ] && [ "$ok" = 1 ] &&
        run "zero${z}_nccl" 2 ./05_zero/run --zero "$z" --steps 10 $zb --device cuda --backend nccl; then
        versus "zero${z}_cuda" "zero${z}_nccl" "05 --zero $z x 2: nccl vs mpi" 1e-5 2e-4
    fi
done
fi

# the oracle of steps 6-8: chapter 00 on the GPU, 10 steps of the default model, each precision
if want 6 || want 7 || want 8; then
    for dt in fp32 bf16; do run "oracle_$dt" 1 ./00_memory_budget/run --train --steps 10 --dtype "$dt" --device "$DEV"; done
fi

if want 6; then
step "6/9 07_tensor_parallel, MPI backend: --tp 2 on 2 ranks sharing the GPU, without and with SP"
model_parallel tp2 2 ./07_tensor_parallel/run --tp 2
model_parallel tp2_sp 2 ./07_tensor_parallel/run --tp 2 --sequence-parallel
fi

if want 7; then
step "7/9 08_pipeline, MPI backend: 2 stages sharing the GPU, 1F1B and ZB-H1"
for sched in 1f1b zb; do
    model_parallel "pipe_$sched" 2 ./08_pipeline/run --schedule "$sched" --micro-batches 4
done
fi

if want 8; then
step "8/9 09_3d, MPI backend: 1 x 2 x 2 and 2 x 2 x 1 (ZeRO-3) on 4 ranks, 2 x 2 x 2 (interleaved ZeRO-1; FSDP + SP) on 8, sharing the GPU"
model_parallel 3d_122 4 ./09_3d/run --tp 2 --pp 2
model_parallel 3d_122_zb_sp 4 ./09_3d/run --tp 2 --pp 2 --schedule zb --sequence-parallel --micro-batches 4
model_parallel 3d_222 8 ./09_3d/run --tp 2 --pp 2 --schedule interleaved --chunks 2 --zero 1
model_parallel 3d_221_z3 4 ./09_3d/run --tp 2 --zero 3
model_parallel 3d_222_fsdp_sp 8 ./09_3d/run --tp 2 --pp 2 --fsdp --sequence-parallel
fi

if want 9; then
step "9/9 speed: GPT-2 124M (V=50257 T=1024 L=12 C=768 NH=12), bf16, one GPU"
timeout 240 "$BUILD/tools/bench_gpu" --model 124m --dtype bf16 --batch 8 --steps 10 --warmup 2 ||
    fail "bench_gpu 124M"
fi

if [ "$failed" = 0 ]; then step "gpu_check.sh: OK"; else step "gpu_check.sh: FAILED (see above)"; fi
exit "$failed"
