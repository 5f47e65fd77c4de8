// health.c: running z-scores, the peak FLOP/s, the --log JSON lines (health.h).
#include "health.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#ifdef LAB_CUDA
#include "cuda_util.h"
#endif

void health_window_init(HealthWindow *w, int cap) {
    memset(w, 0, sizeof *w);
    LAB_CHECK(cap >= 1 && cap <= HEALTH_WINDOW_MAX, "health window of %d steps", cap);
    w->cap = cap;
}

void health_window_stats(const HealthWindow *w, double *mean, double *sd) {
    double m = 0, var = 0;
    for (int i = 0; i < w->n; i++) m += w->x[i];
    m /= w->n;
    for (int i = 0; i < w->n; i++) var += (w->x[i] - m) * (w->x[i] - m);
    *mean = m;
    *sd = sqrt(var / w->n);
}

double health_z(const HealthWindow *w, double x) {
    if (w->n < HEALTH_Z_MIN || !isfinite(x)) return NAN;
    double mean, sd;
    health_window_stats(w, &mean, &sd);
    double floor = 1e-9 * fmax(1.0, fabs(mean));
    return (x - mean) / (sd > floor ? sd : floor);
}

void health_window_push(HealthWindow *w, double x) {
    if (!isfinite(x)) return;
    w->x[w->head] = x;
    w->head = (w->head + 1) % w->cap;
    if (w->n < w->cap) w->n++;
}

// The cores this machine gives the job: $LAB_CORES when set (what the user knows better, e.g.
// the cores a batch system reserved; the tests set it), else its online CPUs, or a cgroup (v2)
// CPU quota's share of them when that is smaller (a container limited to 2 CPUs on a 64-core
// host has 2).
static int machine_cores(void) {
    const char *env = getenv("LAB_CORES");
    if (env && atoi(env) > 0) return atoi(env);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = online > 0 ? (int)online : 1;
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        double quota = 0, period = 0;
        if (fscanf(f, "%lf %lf", &quota, &period) == 2 && quota > 0 && period > 0 &&
            ceil(quota / period) < cores)
            cores = (int)ceil(quota / period);
        fclose(f);  // ("max 100000": no quota; fscanf reads no number)
    }
    return cores;
}

int health_cores_shared(int threads, int *ranks, int *cores) {
    *ranks = mem_ranks_on_this_machine();
    *cores = machine_cores();
    return (long)*ranks * (threads > 0 ? threads : 1) > (long)*cores;
}

const char *health_cores_note(char *buf, size_t n, int threads, const char *figures) {
    int ranks, cores;
    buf[0] = '\0';
    if (!health_cores_shared(threads, &ranks, &cores)) return buf;
    char each[48] = "";
    if (threads > 1) snprintf(each, sizeof each, " x %d threads", threads);
    snprintf(buf, n, "note: %d rank%s%s share %d core%s here and take turns on %s, so %s "
             "measure the turns as much as the algorithm (the bytes, memory and results are "
             "exact); timings need ranks x threads <= %d", ranks, ranks == 1 ? "" : "s", each,
             cores, cores == 1 ? "" : "s", cores == 1 ? "it" : "them", figures, cores);
    return buf;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double health_sgemm_gflops(void) {
    enum { n = 1024 };
    static float *a, *b, *c;  // kept: bench calls it before every step
    if (!a) {
        a = mem_alloc((size_t)n * n * sizeof(float), MEM_OTHER, DEV_CPU);
        b = mem_alloc((size_t)n * n * sizeof(float), MEM_OTHER, DEV_CPU);
        c = mem_alloc((size_t)n * n * sizeof(float), MEM_OTHER, DEV_CPU);
        for (size_t i = 0; i < (size_t)n * n; i++) {
            a[i] = (float)(i % 17) * 0.01f;
            b[i] = (float)(i % 13) * 0.01f;
        }
    }
    double t0 = cpu_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return 2.0 * n * (double)n * n / (cpu_now() - t0) / 1e9;
}

#ifdef LAB_CUDA
// Dense peaks (no sparsity): bf16 tensor core, and plain fp32 (CUDA cores).
static const struct { const char *match; double bf16, fp32; } gpu_peaks[] = {
    {"H200", 989e12, 67e12}, {"H100", 989e12, 67e12}, {"A100", 312e12, 19.5e12},
    {"L40S", 362e12, 91.6e12}, {"A10", 125e12, 31.2e12}, {"V100", 0, 15.7e12},
    {"T4", 65e12, 8.1e12},
};
#endif

double health_peak_flops(Device dev, int bf16) {
    if (dev == DEV_CPU) {
        static double peak;  // once per process: a warm-up and 2 runs, the best (~70 ms)
        if (peak == 0) {
            health_sgemm_gflops();  // warm-up (pages, caches)
            for (int i = 0; i < 2; i++) peak = fmax(peak, health_sgemm_gflops() * 1e9);
        }
        return peak;
    }
#ifdef LAB_CUDA
    const char *name = lab_cuda_device_name();
    for (size_t i = 0; i < sizeof gpu_peaks / sizeof gpu_peaks[0]; i++)
        if (strstr(name, gpu_peaks[i].match)) return bf16 ? gpu_peaks[i].bf16 : gpu_peaks[i].fp32;
#else
    (void)bf16;
#endif
    return 0;
}

double health_mfu(double flops, double seconds, double peak, int ndev) {
    return peak > 0 && seconds > 0 ? flops / seconds / (peak * ndev) : NAN;
}

static void num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

void health_log_line(FILE *f, const HealthRecord *r) {
    fprintf(f, "{\"step\":%d,\"clipped\":%s", r->step, r->clipped ? "true" : "false");
    const struct { const char *key; double value; } fields[] = {
        {"loss", r->loss}, {"grad_norm", r->grad_norm}, {"lr", r->lr},
        {"tokens_per_s", r->tokens_per_s}, {"mfu", r->mfu}, {"flops", r->flops},
        {"peak_flops", r->peak_flops}, {"z_loss", r->z_loss}, {"z_grad_norm", r->z_grad_norm},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        fprintf(f, ",\"%s\":", fields[i].key);
        num(f, fields[i].value);
    }
    if (r->skipped) fprintf(f, ",\"skipped\":\"%s\"", r->skipped);
    else fputs(",\"skipped\":null", f);
    fprintf(f, ",\"nan_skips\":%d,\"spike_skips\":%d,\"rollback_skips\":%d,\"rollbacks\":%d",
            r->nan_skips, r->spike_skips, r->rollback_skips, r->rollbacks);
    if (r->has_val) {
        fputs(",\"val_loss\":", f);
        num(f, r->val_loss);
    }
    fputs(",\"time_s\":{", f);
    for (int i = 0; i < r->nphases; i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", r->phase_name[i]);
        num(f, r->phase_s[i]);
    }
    fputs("},\"sent_bytes\":{\"all\":", f);
    num(f, r->sent);
    fputs("}}\n", f);
    fflush(f);
}
