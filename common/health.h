// health.h: the figures that say whether a run is healthy (the notes' 10.8: monitor loss,
// grad norm, tokens/s, MFU): running z-scores, the peak MFU is measured against, and the
// --log file's JSON lines. The loop skeleton (session.c) prints and writes them.
#pragma once
#include <stdio.h>

#include "mem.h"

#define HEALTH_WINDOW 20     // steps a z-score looks back over
#define HEALTH_WINDOW_MAX 256
#define HEALTH_Z_MIN 5       // a z-score is shown once the window holds this many steps

// The last `cap` values of a series (a ring).
typedef struct HealthWindow {
    int cap, n, head;
    double x[HEALTH_WINDOW_MAX];
} HealthWindow;

void health_window_init(HealthWindow *w, int cap);
// z-score of x against the window's values (not including x): (x - mean) / sd, sd the
// population standard deviation, floored at 1e-9 * max(1, |mean|) so a constant window gives
// 0 for its own value and a huge z for anything else. NaN while the window holds fewer than
// HEALTH_Z_MIN values, or when x is not finite.
double health_z(const HealthWindow *w, double x);
void health_window_push(HealthWindow *w, double x);  // non-finite values are left out
// The window's mean and population standard deviation (n >= 1).
void health_window_stats(const HealthWindow *w, double *mean, double *sd);

// The FLOP/s one device of this kind can do, for MFU. CPU: this core's SGEMM rate, measured
// once per process (the best of two 1024^3 cblas_sgemm after a warm-up, ~70 ms of CPU, the
// SGEMM `make bench` measures, tools/bench.c); CUDA: a table of known GPUs' dense peaks (bf16 tensor core or fp32). 0 when
// unknown (MFU is then not shown).
double health_peak_flops(Device dev, int bf16);
// One 1024^3 SGEMM on this core, timed in CPU time: its GFLOP/s (tools/bench.c's reference).
double health_sgemm_gflops(void);
// Model FLOP utilization: flops done in seconds on ndev devices of peak FLOP/s each.
double health_mfu(double flops, double seconds, double peak, int ndev);

// Do this job's ranks share this machine's cores? Its ranks here (mem_ranks_on_this_machine)
// times the BLAS threads each runs (`threads`: --threads), against the cores the machine has
// online (fewer when a cgroup's CPU quota says so; $LAB_CORES overrides both). 1 when there
// are more, with *ranks and *cores filled: the ranks then take turns on the cores, and every
// time they measure says as much about the turns as about the algorithm.
int health_cores_shared(int threads, int *ranks, int *cores);
// The note said next to timing figures when the ranks share cores, naming the figures it makes
// meaningless (`figures`, e.g. "idle, bubble and imbalance"), into buf; "" when they do not.
const char *health_cores_note(char *buf, size_t n, int threads, const char *figures);

// One step's record, the --log line.
#define HEALTH_MAX_PHASES 8
typedef struct HealthRecord {
    int step;              // 1-based, as the progress line
    double loss, grad_norm;  // grad_norm: before clipping; NaN when the chapter gave none
    int clipped;           // the update was scaled down (grad_norm > the clip)
    double lr, tokens_per_s, mfu, peak_flops, flops;
    double z_loss, z_grad_norm;  // NaN: not yet
    const char *skipped;   // NULL: the step updated; else why not: "nan", "spike", "rollback"
    int nan_skips, spike_skips, rollback_skips, rollbacks;  // the run's so far (rollback_skips:
                                                             // the steps a rollback skipped)
    int has_val;           // --val-every: this step's validation loss (common/text.h) is val_loss
    double val_loss;
    int nphases;
    const char *phase_name[HEALTH_MAX_PHASES];  // "step" first
    double phase_s[HEALTH_MAX_PHASES];
    double sent;           // bytes this rank sent in the step (every group): "sent_bytes"'s "all"
} HealthRecord;

// One JSON object on one line, then flushed (NaN/Inf written as null; "skipped" is null or
// the reason, "nan_skips", "spike_skips", "rollback_skips", "rollbacks" the run's counts so far;
// "val_loss" only on a step that measured it: --val-every).
void health_log_line(FILE *f, const HealthRecord *r);
