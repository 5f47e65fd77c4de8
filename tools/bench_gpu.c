// bench_gpu.c: tokens/s and MFU of GPT-2 training on one GPU (the speed figure of the GPU path).
//
//   bench_gpu [--model 124m|tiny] [--dtype bf16|fp32] [--batch B] [--steps N] [--warmup N]
//             [--peak-tflops X]
//
// A training step is what the chapters run: forward, backward, clipping and AdamW (bf16: on the
// fp32 master weights; common/train.h). Every step ends with a device synchronization, so the
// wall-clock time of a step is the GPU's time for it.
//
//   MFU = model FLOPs per step / step time / the GPU's peak
//
// Model FLOPs are gpt2_flops_per_step (6 per parameter per token + attention, the PaLM
// convention used by llm.c and Megatron). The peak is the dense bf16 tensor-core rate of the
// GPU's datasheet (H100 and H200 SXM 989 TFLOP/s, A100 312), the denominator everyone quotes
// MFU against; --peak-tflops gives it for another GPU. Reference: llm.c reports about 50 % on
// an H100 for GPT-2 124M in bf16 with fused kernels.
#include <stdio.h>

#ifndef LAB_CUDA
int main(void) {
    printf("bench_gpu: built without CUDA (rebuild with `make CUDA=1` on a machine with nvcc)\n");
    return 0;
}
#else

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_util.h"
#include "data.h"
#include "gpt2.h"
#include "mem.h"
#include "optim.h"
#include "train.h"

// Dense bf16 tensor-core peak of the GPU, from its name (TFLOP/s), or 0 when unknown.
static double datasheet_peak(const char *name) {
    if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "GH200")) return 989.4;
    if (strstr(name, "A100")) return 312.0;
    if (strstr(name, "L40S")) return 362.1;
    if (strstr(name, "A10")) return 125.0;
    return 0.0;
}

static int int_arg(const char *flag, const char *s, int lo, int hi) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        lab_fail("%s %s: expected an integer in [%d, %d]", flag, s, lo, hi);
    return (int)v;
}

int main(int argc, char **argv) {
    const char *model = "124m", *dtype = "bf16";
    int B = 8, steps = 10, warmup = 2;
    double peak = 0.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--model 124m|tiny] [--dtype bf16|fp32] [--batch B (8)] "
                   "[--steps N (10)] [--warmup N (2)] [--peak-tflops X]\n", argv[0]);
            return 0;
        }
        if (i + 1 >= argc) lab_fail("%s needs a value (see --help)", argv[i]);
        const char *flag = argv[i], *v = argv[++i];
        if (!strcmp(flag, "--model")) model = v;
        else if (!strcmp(flag, "--dtype")) dtype = v;
        else if (!strcmp(flag, "--batch")) B = int_arg(flag, v, 1, 4096);
        else if (!strcmp(flag, "--steps")) steps = int_arg(flag, v, 1, 100000);
        else if (!strcmp(flag, "--warmup")) warmup = int_arg(flag, v, 0, 100000);
        else if (!strcmp(flag, "--peak-tflops")) {
            peak = atof(v);
            if (!(peak > 0)) lab_fail("--peak-tflops %s: expected a positive number", v);
        } else {
            lab_fail("unknown flag %s: valid flags are --model, --dtype, --batch, --steps, "
                     "--warmup, --peak-tflops", flag);
        }
    }
    GPT2Config cfg;
    if (!strcmp(model, "124m")) cfg = (GPT2Config){.V = 50257, .T = 1024, .L = 12, .C = 768, .NH = 12};
    else if (!strcmp(model, "tiny")) cfg = gpt2_config_tiny();
    else lab_fail("--model %s: valid models are 124m (GPT-2 small, T=1024) and tiny", model);
    if (strcmp(dtype, "bf16") && strcmp(dtype, "fp32"))
        lab_fail("--dtype %s: valid types are bf16 and fp32", dtype);
    if (lab_cuda_device_count() == 0) lab_fail("bench_gpu: no CUDA GPU is visible");
    lab_cuda_set_device(0);
    const char *gpu = lab_cuda_device_name();
    if (peak == 0.0) peak = datasheet_peak(gpu);
    if (peak == 0.0)
        lab_fail("bench_gpu: no datasheet peak known for \"%s\": give it with --peak-tflops", gpu);

    const int T = cfg.T;
    GPT2 m;
    gpt2_build_dtype(&m, cfg, DEV_CUDA, strcmp(dtype, "bf16") ? GPT2_FP32 : GPT2_BF16);
    gpt2_alloc_grads(&m);
    gpt2_alloc_acts(&m, B, T);
    const size_t n = m.num_params;
    float *master = train_master_alloc(&m);
    train_master_init(&m, master, 1337);
    float *opt_m = mem_alloc(n * sizeof(float), MEM_OPT_M, DEV_CUDA);
    float *opt_v = mem_alloc(n * sizeof(float), MEM_OPT_V, DEV_CUDA);
    int nplist = gpt2_params(&cfg, NULL);
    GPT2Param *plist = lab_xcalloc((size_t)nplist, sizeof(GPT2Param));
    gpt2_params(&cfg, plist);
    AdamW opt = adamw_defaults();
    DataSource data;
    data_init_synthetic(&data, cfg.V, 1);
    int *inputs = lab_xmalloc((size_t)B * T * sizeof(int));
    int *targets = lab_xmalloc((size_t)B * T * sizeof(int));
    const double flops = gpt2_flops_per_step(&cfg, B, T);

    char buf[32];
    printf("GPT-2 %s (V=%d T=%d L=%d C=%d NH=%d, %zu parameters), B=%d, %s, on %s\n", model,
           cfg.V, T, cfg.L, cfg.C, cfg.NH, n, B, dtype, gpu);
    printf("device memory in use: %s (peak, all categories)\n",
           mem_format(buf, sizeof buf, (double)mem_total_peak()));
    double best = 1e30, sum = 0.0;
    float first = 0.0f, loss = 0.0f;
    for (int s = 0; s < warmup + steps; s++) {
        data_batch(&data, (uint64_t)s, B, T, 0, B, inputs, targets);
        lab_cuda_synchronize();
        double t0 = lab_now();
        gpt2_zero_grad(&m);
        loss = gpt2_forward(&m, inputs, targets);
        gpt2_backward(&m, 1.0f / ((float)B * (float)T));
        train_adamw_step(&opt, &m, s, master, opt_m, opt_v, plist, nplist);
        lab_cuda_synchronize();
        double dt = lab_now() - t0;
        if (s == 0) first = loss;
        if (s < warmup) continue;
        sum += dt;
        best = dt < best ? dt : best;
    }
    double mean = sum / steps;
    printf("%d warm-up + %d timed steps (forward + backward + clip + AdamW); loss %.3f -> %.3f\n\n",
           warmup, steps, first, loss);
    printf("  %-28s %12s %12s  %s\n", "measure", "mean", "best", "unit");
    printf("  %-28s %12.2f %12.2f  %s\n", "step time", 1e3 * mean, 1e3 * best, "ms");
    printf("  %-28s %12.0f %12.0f  %s\n", "throughput", B * T / mean, B * T / best, "tokens/s");
    printf("  %-28s %12.1f %12s  %s\n", "model FLOPs per step", flops / 1e12 * 1e3, "", "GFLOP");
    printf("  %-28s %12.1f %12.1f  %s\n", "model FLOP rate", flops / mean / 1e12,
           flops / best / 1e12, "TFLOP/s");
    printf("  %-28s %12.1f %12.1f  %s  (peak %.1f TFLOP/s dense bf16)\n", "MFU",
           100.0 * flops / mean / 1e12 / peak, 100.0 * flops / best / 1e12 / peak, "%", peak);

    free(plist);
    free(inputs);
    free(targets);
    data_free(&data);
    train_master_free(&m, master);
    mem_free(opt_m);
    mem_free(opt_v);
    gpt2_free(&m);
    return 0;
}
#endif  // LAB_CUDA
