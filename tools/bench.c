// bench.c: single-rank training speed of the tiny GPT-2 on one CPU core, as a fraction of that
// core's SGEMM peak measured in the same run.
//
//   SGEMM peak: cblas_sgemm on 1024×1024×1024 (large enough to run at the core's best speed).
//   Training:   tiny config (V=256 T=64 L=4 C=128 NH=4), B=16, fp32, synthetic data; warm-up
//               steps, then timed steps of forward + backward + gradient clipping + AdamW.
//   Model FLOP rate = gpt2_flops_per_step / step time (the MFU convention, see gpt2.h), and its
//   fraction of the SGEMM peak: how much of the core's matmul speed the training achieves.
//
// A shared machine is noisy, so the baseline is measured right next to what it is compared
// with: before every timed step one reference SGEMM runs, and each step's fraction is taken
// against the SGEMM just before it; the table reports the median of those fractions (and, as
// "best", the best step against the best SGEMM). Times are CPU time
// of this process, not wall-clock time: time spent waiting for the core while other jobs run
// does not count, on either side. On an idle machine the two are the same.
//
// Usage: bench [--steps N] [--warmup N] [--batch B]
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "data.h"
#include "gpt2.h"
#include "health.h"
#include "mem.h"
#include "optim.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_int(const char *flag, const char *s, int lo, int hi) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        lab_fail("%s %s: expected an integer in [%d, %d]", flag, s, lo, hi);
    return (int)v;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}
// Median of x[0..n) (sorts x).
static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}
static double minimum(const double *x, int n) {
    double m = x[0];
    for (int i = 1; i < n; i++) m = x[i] < m ? x[i] : m;
    return m;
}
static double maximum(const double *x, int n) {
    double m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

int main(int argc, char **argv) {
    int steps = 30, warmup = 3, B = 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--steps N (30)] [--warmup N (3)] [--batch B (16)]\n", argv[0]);
            return 0;
        }
        if (i + 1 >= argc) lab_fail("%s needs a value (see --help)", argv[i]);
        if (!strcmp(argv[i], "--steps")) steps = parse_int("--steps", argv[++i], 1, 100000);
        else if (!strcmp(argv[i], "--warmup")) warmup = parse_int("--warmup", argv[++i], 0, 100000);
        else if (!strcmp(argv[i], "--batch")) B = parse_int("--batch", argv[++i], 1, 4096);
        else lab_fail("unknown flag %s: valid flags are --steps, --warmup, --batch", argv[i]);
    }
    openblas_set_num_threads(1);  // one core: the peak and the training use the same one

    GPT2Config cfg = gpt2_config_tiny();
    int T = cfg.T;
    GPT2 m;
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 1337);
    gpt2_alloc_grads(&m);
    gpt2_alloc_acts(&m, B, T);
    size_t n = m.num_params;
    float *adam_m = mem_alloc(n * sizeof(float), MEM_OPT_M, DEV_CPU);
    float *adam_v = mem_alloc(n * sizeof(float), MEM_OPT_V, DEV_CPU);
    int nparams = gpt2_params(&cfg, NULL);
    GPT2Param *params = lab_xmalloc((size_t)nparams * sizeof(GPT2Param));
    gpt2_params(&cfg, params);
    AdamW opt = adamw_defaults();
    DataSource data;
    data_init_synthetic(&data, cfg.V, 1);
    int *inputs = mem_alloc((size_t)B * T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)B * T * sizeof(int), MEM_OTHER, DEV_CPU);
    double flops = gpt2_flops_per_step(&cfg, B, T);

    // per timed step: reference SGEMM rate, step time and its parts, fraction of the peak
    double *peak = lab_xcalloc((size_t)steps, sizeof(double));
    double *t_step = lab_xcalloc((size_t)steps, sizeof(double));
    double *t_fwd = lab_xcalloc((size_t)steps, sizeof(double));
    double *t_bwd = lab_xcalloc((size_t)steps, sizeof(double));
    double *t_upd = lab_xcalloc((size_t)steps, sizeof(double));
    double *frac = lab_xcalloc((size_t)steps, sizeof(double));
    float first_loss = 0.0f, loss = 0.0f;
    health_sgemm_gflops();  // warm-up of the reference too (common/health.c: the one SGEMM)
    for (int s = 0; s < warmup + steps; s++) {
        double gemm_rate = health_sgemm_gflops();
        data_batch(&data, (uint64_t)s, B, T, 0, B, inputs, targets);
        double t0 = cpu_now();
        gpt2_zero_grad(&m);
        loss = gpt2_forward(&m, inputs, targets);
        double t1 = cpu_now();
        gpt2_backward(&m, 1.0f / (float)(B * T));
        double t2 = cpu_now();
        double norm_sq = m.k->sum_squares(m.grads, n);
        float clip = adamw_clip_scale(&opt, norm_sq, s);
        adamw_step(&opt, m.k, s, m.params, m.grads, adam_m, adam_v, 0, n, params, nparams, clip);
        double t3 = cpu_now();
        if (s == 0) first_loss = loss;
        if (s >= warmup) {
            int i = s - warmup;
            peak[i] = gemm_rate;
            t_step[i] = t3 - t0;
            t_fwd[i] = t1 - t0;
            t_bwd[i] = t2 - t1;
            t_upd[i] = t3 - t2;
            frac[i] = flops / t_step[i] / 1e9 / gemm_rate;
        }
    }

    double best_step = minimum(t_step, steps), best_peak = maximum(peak, steps);
    double best_frac = flops / best_step / 1e9 / best_peak;  // best step against best SGEMM
    double step_s = median(t_step, steps);
    printf("GPT-2 tiny (V=%d T=%d L=%d C=%d NH=%d, %zu parameters), B=%d, fp32, 1 core (OpenBLAS %s)\n",
           cfg.V, T, cfg.L, cfg.C, cfg.NH, n, B, openblas_get_corename());
    printf("%d warm-up + %d timed steps of forward + backward + clip + AdamW; loss %.3f -> %.3f\n",
           warmup, steps, first_loss, loss);
    printf("CPU time of this process; a reference SGEMM (1024^3) runs before every step\n\n");
    printf("  %-36s %10s %10s  %s\n", "measure", "median", "best", "unit");
    printf("  %-36s %10.1f %10.1f  %s\n", "SGEMM peak (1024^3)", median(peak, steps), best_peak, "GFLOP/s");
    printf("  %-36s %10.2f %10.2f  %s\n", "step time", step_s * 1e3, best_step * 1e3, "ms");
    printf("  %-36s %10.2f %10s  %s\n", "  forward", median(t_fwd, steps) * 1e3, "", "ms");
    printf("  %-36s %10.2f %10s  %s\n", "  backward", median(t_bwd, steps) * 1e3, "", "ms");
    printf("  %-36s %10.2f %10s  %s\n", "  clip + AdamW", median(t_upd, steps) * 1e3, "", "ms");
    printf("  %-36s %10.0f %10.0f  %s\n", "throughput", (double)B * T / step_s, (double)B * T / best_step,
           "tokens/s");
    printf("  %-36s %10.3f %10s  %s\n", "model FLOPs per step", flops / 1e9, "", "GFLOP");
    printf("  %-36s %10.1f %10.1f  %s\n", "model FLOP rate", flops / step_s / 1e9, flops / best_step / 1e9,
           "GFLOP/s");
    printf("  %-36s %10.1f %10.1f  %s\n", "fraction of SGEMM peak", 100.0 * median(frac, steps),
           100.0 * best_frac, "%");

    free(peak);
    free(t_step);
    free(t_fwd);
    free(t_bwd);
    free(t_upd);
    free(frac);
    free(params);
    data_free(&data);
    mem_free(inputs);
    mem_free(targets);
    mem_free(adam_m);
    mem_free(adam_v);
    gpt2_free(&m);
    return 0;
}
