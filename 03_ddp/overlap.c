// overlap.c: the share of communication hidden behind backward, from the timeline, and the
// calibration steps that show what communication and compute cost alone (see overlap.h).
#include "overlap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "train.h"

static int by_start(const void *a, const void *b) {
    const double *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

void overlap_add_step(OverlapMeter *m, double b0, double b1, double (*iv)[2], int n) {
    qsort(iv, (size_t)n, sizeof iv[0], by_start);
    // Walk the union of the intervals, one merged run [lo, hi) at a time.
    for (int i = 0; i < n;) {
        double lo = iv[i][0], hi = iv[i][1];
        for (i++; i < n && iv[i][0] <= hi; i++) hi = fmax(hi, iv[i][1]);
        if (!(hi > lo)) continue;
        m->inflight_s += hi - lo;
        double in = fmin(hi, b1) - fmax(lo, b0);  // the part inside backward
        if (in > 0) m->hidden_s += in;
    }
}

void overlap_add_ddp_step(OverlapMeter *m, double b0, double b1, const Ddp *d) {
    double (*iv)[2] = lab_xcalloc((size_t)(d->nbuckets > 0 ? d->nbuckets : 1), sizeof *iv);
    for (int b = 0; b < d->nbuckets; b++) {
        iv[b][0] = d->buckets[b].t_launch;
        iv[b][1] = d->buckets[b].t_done;
    }
    overlap_add_step(m, b0, b1, iv, d->nbuckets);
    free(iv);
}

OverlapCalibration overlap_calibrate(GPT2 *m, const DataSource *data, int B, int row0, int Bm,
                                     int K, Ddp *d, DistGroup *g, int nsteps) {
    OverlapCalibration c = {0, 0, 0, 0};
    const int T = m->cfg.T;
    int *inputs = lab_xmalloc((size_t)Bm * T * sizeof(int));
    int *targets = lab_xmalloc((size_t)Bm * T * sizeof(int));
    const DistDtype dt = train_dtype(m);
    void *grads = train_grads(m);
    for (int i = 0; i < nsteps; i++) {
        double t0 = lab_now();
        gpt2_zero_grad(m);
        for (int micro = 0; micro < K; micro++) {
            data_batch(data, 0, B, T, row0 + micro * Bm, Bm, inputs, targets);
            gpt2_forward(m, inputs, targets);
            gpt2_backward(m, 1.0f / ((float)Bm * (float)T * (float)K));
        }
        double comp = lab_now() - t0;
        dist_barrier(g);  // start together: time the transfer, not the other ranks' compute
        double b0, c0, b1, c1;
        dist_comm_thread_times(g, &b0, &c0);
        t0 = lab_now();
        if (d) ddp_all_buckets_now(d);
        else dist_all_reduce(grads, grads, m->num_params, dt, DIST_AVG, g);
        double comm = lab_now() - t0;
        dist_comm_thread_times(g, &b1, &c1);
        if (i == 0 || comp < c.compute_s) c.compute_s = comp;
        if (i == 0 || comm < c.comm_s) c.comm_s = comm;
        if (i == 0 || b1 - b0 < c.ct_busy_s) { c.ct_busy_s = b1 - b0; c.ct_cpu_s = c1 - c0; }
    }
    free(inputs);
    free(targets);
    return c;
}

void overlap_pack(const OverlapMeter *m, int nrun, double fastest_step, double ct_busy_s,
                  double ct_cpu_s, const OverlapCalibration *c, double *out) {
    double per = nrun > 0 ? 1.0 / nrun : 0.0;
    out[OV_HIDDEN] = m->hidden_s * per;
    out[OV_INFLIGHT] = m->inflight_s * per;
    out[OV_STEP] = fastest_step;
    out[OV_CT_BUSY] = ct_busy_s * per;
    out[OV_CT_CPU] = ct_cpu_s * per;
    out[OV_CAL_COMP] = c->compute_s;
    out[OV_CAL_COMM] = c->comm_s;
    out[OV_CAL_BUSY] = c->ct_busy_s;
    out[OV_CAL_CPU] = c->ct_cpu_s;
}

double overlap_percent(const double *f, int nranks, int stride) {
    if (nranks < 2) return -1.0;  // an all-reduce over one rank moves nothing
    double hidden = 0, inflight = 0;
    for (int r = 0; r < nranks; r++) {
        hidden += f[(size_t)r * (size_t)stride + OV_HIDDEN];
        inflight += f[(size_t)r * (size_t)stride + OV_INFLIGHT];
    }
    return inflight > 0 ? 100.0 * hidden / inflight : -1.0;
}

void overlap_print(const double *f, int nranks, int stride, int overlap_on, int thread_on,
                   int ncal) {
    printf("\nOverlap (from the timeline of every training step, all ranks):\n");
    double pct = overlap_percent(f, nranks, stride);
    if (pct < 0) {
        printf("  communication hidden behind backward: cannot be measured on this run: %s\n",
               nranks == 1 ? "one rank communicates nothing" : "no step communicated");
        return;
    }
    double hidden = 0, inflight = 0;
    for (int r = 0; r < nranks; r++) {
        hidden += f[(size_t)r * (size_t)stride + OV_HIDDEN] / nranks;
        inflight += f[(size_t)r * (size_t)stride + OV_INFLIGHT] / nranks;
    }
    printf("  communication hidden behind backward = %.0f%% (all-reduces in flight %.1f ms per "
           "step, %.1f ms of it while backward computes)%s\n", pct, 1e3 * inflight, 1e3 * hidden,
           overlap_on ? "" : " (--no-overlap: 0 by construction)");
    if (ncal > 0) {
        double step = 0, comp = 0, comm = 0;  // the slowest rank's: a step ends with the last
        for (int r = 0; r < nranks; r++) {
            const double *v = f + (size_t)r * (size_t)stride;
            step = fmax(step, v[OV_STEP]);
            comp = fmax(comp, v[OV_CAL_COMP]);
            comm = fmax(comm, v[OV_CAL_COMM]);
        }
        printf("  fastest step of the run and of %d extra steps each (the slowest rank):\n", ncal);
        printf("    step (fwd+bwd+exposed comm) %8.1f ms\n", 1e3 * step);
        printf("    compute only (fwd+bwd)      %8.1f ms\n", 1e3 * comp);
        printf("    communication only          %8.1f ms\n", 1e3 * comm);
        for (int r = 0; overlap_on && thread_on && r < nranks; r++) {
            const double *v = f + (size_t)r * (size_t)stride;
            printf("  rank %d communication thread: %.1f ms per step in all-reduces, of which "
                   "%.1f ms on a core (the rest waiting for the peer or a core); alone: %.1f ms, "
                   "%.1f ms on a core\n", r, 1e3 * v[OV_CT_BUSY], 1e3 * v[OV_CT_CPU],
                   1e3 * v[OV_CAL_BUSY], 1e3 * v[OV_CAL_CPU]);
        }
    }
}
