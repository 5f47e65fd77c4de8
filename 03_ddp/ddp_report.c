// ddp_report.c: what 03's training loop measures, and the report it prints (see ddp_report.h).
#include "ddp_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "mem.h"
#include "results.h"
#include "train.h"

// What each rank reports at the end, gathered to rank 0 as doubles (then the overlap's).
enum { R_COMPUTE, R_WAIT, R_STEP, R_SENT, R_RECV, R_GRAD_SENT, R_PARAMS, R_GRADS, R_OPT,
       R_COMM, R_TOTAL, R_OVERLAP, R_NFIELDS = R_OVERLAP + OVERLAP_NFIELDS };

// The fastest of n timings: interference from other processes only ever adds time, so the
// minimum is the best estimate of what the work itself costs.
static double fastest(const double *v, int n) {
    double m = n > 0 ? v[0] : 0.0;
    for (int i = 1; i < n; i++) m = fmin(m, v[i]);
    return m;
}

// Do all ranks hold the same gradients right now? A fingerprint of the gradient buffer per
// rank, gathered everywhere and compared with rank 0's.
static int grads_agree_across_ranks(GPT2 *m, DistGroup *g) {
    size_t n = m->num_params;
    float *h = lab_xmalloc(n * sizeof(float));
    train_grads_to_host(m, h);  // bf16: widened
    double fp[2] = {0.0, 0.0};
    for (size_t i = 0; i < n; i++) {
        fp[0] += (double)h[i];
        fp[1] += (double)h[i] * (double)(i % 13 + 1);
    }
    free(h);
    double *all = lab_xcalloc((size_t)g->size * 2, sizeof(double));
    dist_all_gather(fp, all, 2, DIST_F64, g);
    int agree = 1;
    for (int r = 1; r < g->size; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) agree = 0;
    free(all);
    return agree;
}

// Largest |p_r - p_0| over every rank r and weight the optimizer updates (the master; in fp32
// the parameters themselves): 0 when the replicas are identical.
static double replica_max_diff(const GPT2 *m, const float *master, DistGroup *g) {
    size_t n = m->num_params;
    float *mine = lab_xmalloc(n * sizeof(float)), *ref = lab_xmalloc(n * sizeof(float));
    mem_copy(mine, master, n * sizeof(float));
    memcpy(ref, mine, n * sizeof(float));
    dist_broadcast(ref, n, DIST_F32, 0, g);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)mine[i] - (double)ref[i]);
        if (!(d <= worst)) worst = d;  // NaN counts as the worst
    }
    dist_all_reduce(&worst, &worst, 1, DIST_F64, DIST_MAX, g);
    free(mine);
    free(ref);
    return worst;
}

void ddp_check_no_sync(DdpFigures *c, GPT2 *m, DistGroup *g, int inside_no_sync) {
    uint64_t s0 = dist_bytes_sent(), r0 = dist_bytes_recv();
    int agree = grads_agree_across_ranks(m, g);
    if (inside_no_sync) { c->nosync_checks++; c->nosync_differ += !agree; }
    else { c->sync_checks++; c->sync_agree += agree; }
    c->check_sent += (double)(dist_bytes_sent() - s0);
    c->check_recv += (double)(dist_bytes_recv() - r0);
}

void ddp_figures_start(DdpFigures *fig, const Session *s) {
    fig->t_train = lab_xcalloc((size_t)(s->end > s->start ? s->end - s->start : 1), sizeof(double));
    dist_counters_reset();
    dist_comm_thread_times(s->world, &fig->ct_busy0, &fig->ct_cpu0);  // 0 without a thread
}

void ddp_figures_end(DdpFigures *fig, Session *s) {
    const int nrun = session_steps_run(s);
    dist_comm_thread_times(s->world, &fig->ct_busy, &fig->ct_cpu);
    fig->sent = nrun ? ((double)dist_bytes_sent() - fig->check_sent) / nrun : 0;
    fig->recv = nrun ? ((double)dist_bytes_recv() - fig->check_recv) / nrun : 0;
    fig->replica_diff = s->args->dump ? replica_max_diff(&s->model, s->master, s->world) : 0.0;
}

void ddp_print_header(const Session *s, const DdpFlags *f, const Ddp *ddp, int Bl, int Bm) {
    char buf[32], model[128];
    const int K = f->grad_accum;
    printf("DDP on %d rank%s: %s (%s %s gradients), device %s\n", s->N, s->N > 1 ? "s" : "",
           session_model_line(s, model, sizeof model), mem_format(buf, sizeof buf,
           (double)(s->n * s->e)), s->bf16 ? "bf16" : "fp32", s->model.k->name);
    printf("global batch %d x %d: rank r takes rows [r*%d, (r+1)*%d)", s->args->batch, s->T, Bl,
           Bl);
    if (K > 1) printf(" as %d micro-batches of %d (no_sync on the first %d)", K, Bm, K - 1);
    printf("\nweights: rank r initialized from seed %d + r, then rank 0's broadcast to all "
           "(%s%s)\n", s->args->seed, mem_format(buf, sizeof buf, (double)s->n * 4),
           s->bf16 ? " of fp32 master weights" : "");
    if (!f->no_overlap) {
        printf("gradient buckets (cap %g MiB, first %g MiB), launched %s, %s, run by %s:\n",
               (double)f->bucket_mb, (double)f->first_bucket_mb,
               f->launch_late ? "after the whole backward" : "as soon as complete",
               f->pack_buckets ? "packed into their own buffers" : "all-reduced in place",
               s->world->thread ? "a communication thread"
                                : "non-blocking MPI polled between backward pieces");
        ddp_print_buckets(ddp, stdout);
    } else {
        printf("--no-overlap: one all-reduce of all %s of gradients after the whole backward\n",
               mem_format(buf, sizeof buf, (double)(s->n * s->e)));
    }
}

static void print_tables(const Session *s, const DdpFlags *f, const DdpFigures *c,
                         const double *all, const double *mine) {
    const int N = s->N, overlap = !f->no_overlap;
    session_print_throughput(s, 1);
    static const SessionColumn cols[] = {
        {"compute", R_COMPUTE, COL_MS}, {"wait (comm)", R_WAIT, COL_MS},
        {"step", R_STEP, COL_MS}, {"sent", R_SENT, COL_BYTES}, {"recv", R_RECV, COL_BYTES},
        {"params", R_PARAMS, COL_BYTES}, {"grads", R_GRADS, COL_BYTES},
        {"adam m+v", R_OPT, COL_BYTES}, {"buckets", R_COMM, COL_BYTES},
        {"peak mem", R_TOTAL, COL_BYTES}};
    session_print_rank_table("Per rank (per step; every rank does the same work: no master)",
                             cols, (int)(sizeof cols / sizeof cols[0]), all, N, R_NFIELDS, NULL);
    printf("  sent per step = 2(N-1)/N x %zu gradient bytes (+ the loss) = %.0f B on every "
           "rank: no rank is special\n", s->n * s->e, mine[R_SENT]);
    if (f->check_no_sync)
        printf("\nno_sync check: inside no_sync gradients differed across ranks in %d of %d "
               "micro-steps; after the sync they agreed in %d of %d steps\n",
               c->nosync_differ, c->nosync_checks, c->sync_agree, c->sync_checks);
    overlap_print(all + R_OVERLAP, N, R_NFIELDS, overlap, s->world->thread != NULL,
                  N > 1 ? f->overlap_steps : 0);
    // (an all-reduce in flight may be waiting for a core, and compute slows down too)
    session_print_cores_note(s, "the per-rank times, the communication hidden behind backward "
                                "and the communication thread's times");
    char b1[32];
    printf("\nEvery rank holds the full model state: %s = 16 B x %zu = %s per rank%s\n",
           s->bf16 ? "bf16 params + grads (2 + 2 B) + fp32 master (4 B) + Adam m, v (4 + 4 B)"
                   : "params + grads + Adam m, v", s->n,
           mem_format(b1, sizeof b1, 16.0 * (double)s->n),
           overlap && f->pack_buckets ? (s->bf16 ? ", plus the bucket buffers (2 B/param)"
                                                 : ", plus the bucket buffers (4 B/param)")
                                      : "");
}

static void write_dump(const Session *s, const Ddp *ddp, const DdpFigures *c, const double *mine,
                       int overlap, double overlap_pct) {
    RunResults out;
    session_dump_open(s, &out);
    results_set(&out, "world_size", s->N);
    results_set(&out, "bytes_sent_per_step", mine[R_SENT]);
    results_set(&out, "bytes_recv_per_step", mine[R_RECV]);
    results_set(&out, "grad_bytes_sent_per_step", mine[R_GRAD_SENT]);
    results_set(&out, "bytes_sent_broadcast", c->bcast_sent);
    results_set(&out, "bytes_recv_broadcast", c->bcast_recv);
    results_set(&out, "buckets", overlap ? ddp->nbuckets : 0);
    for (int b = 0; overlap && b < ddp->nbuckets && b < 16; b++) {
        results_setf(&out, (double)(ddp->buckets[b].numel * s->e), "bucket_bytes_%d", b);
    }
    results_set(&out, "replica_max_diff", c->replica_diff);
    results_set(&out, "nosync_checks", c->nosync_checks);
    results_set(&out, "nosync_differ", c->nosync_differ);
    results_set(&out, "sync_checks", c->sync_checks);
    results_set(&out, "sync_agree", c->sync_agree);
    if (overlap_pct >= 0) results_set(&out, "overlap_pct", overlap_pct);  // else unmeasured
    session_dump_close(s, &out);
}

// --links: DP's link time per step against chapter 00's calculator and the planner
// (session_print_links): 03's layout is DP over every rank, --grad-accum micro-batches (only the
// last communicates), the gradients in the buckets' all-reduces: one per bucket packed, one per
// tensor in place (the default), one in all with --no-overlap.
static void print_links(const Session *s, const DdpFlags *f, const Ddp *ddp) {
    CalcSetup cs = calc_setup_lab(s->N, 1, 1, 1, f->grad_accum, s->args->batch, s->T, 0,
                                  s->bf16 ? CALC_BF16 : CALC_FP32);
    cs.dp_buckets = f->no_overlap ? 1 : ddp->views ? ddp->nparams : ddp->nbuckets;
    session_print_links(s, &cs, 0, s->rank);
}

void ddp_report(Session *s, const DdpFlags *f, Ddp *ddp, DdpFigures *fig, int row0, int Bm) {
    const int N = s->N, nrun = session_steps_run(s), overlap = !f->no_overlap;
    // What communication and compute cost alone: a few more steps (overlap.c).
    int ncal = N > 1 ? f->overlap_steps : 0;
    OverlapCalibration cal = overlap_calibrate(&s->model, &s->data, s->args->batch, row0, Bm,
                                               f->grad_accum, overlap ? ddp : NULL, s->world, ncal);
    double mine[R_NFIELDS] = {0};  // per step, without the --check-no-sync comparisons
    mine[R_SENT] = fig->sent;
    mine[R_RECV] = fig->recv;
    mine[R_GRAD_SENT] = nrun ? fig->grad_sent / nrun : 0;
    mine[R_COMPUTE] = nrun ? fig->t_compute / nrun : 0;
    mine[R_WAIT] = nrun ? fig->t_wait / nrun : 0;
    mine[R_STEP] = nrun ? session_elapsed(s) / nrun : 0;
    overlap_pack(&fig->meter, nrun, fastest(fig->t_train, nrun), fig->ct_busy - fig->ct_busy0,
                 fig->ct_cpu - fig->ct_cpu0, &cal, mine + R_OVERLAP);
    mine[R_PARAMS] = (double)mem_peak(MEM_PARAMS);
    mine[R_GRADS] = (double)mem_peak(MEM_GRADS);
    mine[R_OPT] = (double)(mem_peak(MEM_OPT_M) + mem_peak(MEM_OPT_V));
    mine[R_COMM] = (double)mem_peak(MEM_COMM);
    mine[R_TOTAL] = (double)mem_total_peak();
    double *all = session_gather_report(s, mine, R_NFIELDS);
    if (s->rank == 0) {
        double overlap_pct = overlap_percent(all + R_OVERLAP, N, R_NFIELDS);
        if (!s->args->quiet && nrun > 0) print_tables(s, f, fig, all, mine);
        if (s->args->dump) write_dump(s, ddp, fig, mine, overlap, overlap_pct);
    }
    print_links(s, f, ddp);  // --links only (collective)
    free(all);
    free(fig->t_train);
    fig->t_train = NULL;
}
