// 03_ddp: DistributedDataParallel, the way PyTorch's DDP trains.
//
//   make 03_ddp && mpirun -np 4 ./03_ddp/run [--bucket-mb 25] [--grad-accum 4] [--no-overlap]
//
// One process per device, all peers (no master):
//   - every rank builds its own replica (from a DIFFERENT seed, so a missing broadcast shows),
//     then rank 0's weights are broadcast to all: every replica starts identical;
//   - every rank takes its own slice of the global batch (DistributedSampler semantics);
//   - backward runs piece by piece from the head down; after each piece the gradient buckets
//     whose gradients are all final start their all-reduce (average), non-blocking, while the
//     next pieces compute (ddp_buckets.c): communication overlaps backward. A communication
//     thread runs them (common/dist.h), as NCCL's stream does on a GPU;
//   - every rank waits for its buckets, then runs the SAME clipping and AdamW step on the SAME
//     averaged gradients: the replicas stay identical without ever sending weights again.
// With --grad-accum K each rank runs K micro-batches and only the last one communicates
// (PyTorch's no_sync). With --dtype bf16 the weights and gradients are bf16 and the gradients
// travel in bf16; every rank keeps fp32 master weights for AdamW (common/train.h). On one rank
// this program is single-device training (chapter 00's loop).
// The report says how much of the communication backward hid, from the timeline (overlap.c);
// the setup and reporting every training chapter shares are in common/session.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "ddp_buckets.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "optim.h"
#include "overlap.h"
#include "results.h"
#include "session.h"
#include "trace.h"
#include "train.h"

static const char *USAGE =
    "03_ddp: DistributedDataParallel. Every rank holds a full replica, takes its slice of the\n"
    "global batch, and averages gradients with all-reduces that overlap backward.\n"
    "\n"
    "  mpirun -np 4 ./03_ddp/run                          DDP on 4 ranks, 25 MiB buckets\n"
    "  mpirun -np 4 ./03_ddp/run --bucket-mb 0.25         smaller buckets: more, earlier all-reduces\n"
    "  mpirun -np 4 ./03_ddp/run --no-overlap             one all-reduce after the whole backward\n"
    "  mpirun -np 4 ./03_ddp/run --progress poll --pack-buckets\n"
    "                                                     overlap without the communication thread\n"
    "                                                     and with packed buckets (slower on a CPU)\n"
    "  mpirun -np 2 ./03_ddp/run --grad-accum 4 --check-no-sync\n"
    "                                                     no_sync: only the last micro-step communicates\n"
    "  mpirun -np 4 ./03_ddp/run --trace ddp.json         timeline: open it at ui.perfetto.dev\n"
    "  mpirun -np 4 ./03_ddp/run --dtype bf16             mixed precision: bf16 weights and\n"
    "                                                     gradients (all-reduced in bf16: half the\n"
    "                                                     bytes), fp32 master weights and Adam\n";

// The chapter's own flags.
typedef struct DdpFlags {
    float bucket_mb;        // bucket cap (MiB), PyTorch's bucket_cap_mb
    float first_bucket_mb;  // cap of the first bucket (MiB): it launches early
    int grad_accum;         // micro-batches per optimizer step (no_sync on all but the last)
    int no_overlap;         // one all-reduce of all gradients after the whole backward
    int check_no_sync;      // compare gradients across ranks after every micro-step
    int overlap_steps;      // extra steps timed compute-only and comm-only (overlap %)
    const char *progress;   // who moves the bucket all-reduces: "thread" or "poll"
    int pack_buckets;       // copy each bucket into its own buffer (else: in place, views)
    int launch_late;        // buckets as usual, but all started after the whole backward
} DdpFlags;

static void train(const LabArgs *args, const DdpFlags *f);

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    DdpFlags f = {.bucket_mb = 25.0f, .first_bucket_mb = 1.0f, .grad_accum = 1, .no_overlap = 0,
                  .check_no_sync = 0, .overlap_steps = 3, .progress = "thread", .pack_buckets = 0,
                  .launch_late = 0};
    FlagSpec extra[] = {
        {"--bucket-mb", FLAG_FLOAT, &f.bucket_mb, 0, 1e6, NULL,
         "gradient bucket cap in MiB (0 = one bucket per parameter)"},
        {"--first-bucket-mb", FLAG_FLOAT, &f.first_bucket_mb, 0, 1e6, NULL,
         "cap of the first bucket in MiB (small, so communication starts early)"},
        {"--grad-accum", FLAG_INT, &f.grad_accum, 1, 1e6, NULL,
         "micro-batches per step; all but the last run inside no_sync"},
        {"--no-overlap", FLAG_BOOL, &f.no_overlap, 0, 1, NULL,
         "no buckets: one all-reduce of all gradients after the whole backward"},
        {"--check-no-sync", FLAG_BOOL, &f.check_no_sync, 0, 1, NULL,
         "compare gradients across ranks after each micro-step (differ, then agree)"},
        {"--overlap-steps", FLAG_INT, &f.overlap_steps, 0, 1000, NULL,
         "extra steps timed compute-only and comm-only: what each costs alone (0 = skip)"},
        {"--progress", FLAG_CHOICE, &f.progress, 0, 0, "thread|poll",
         "bucket all-reduces run on a communication thread, or non-blocking MPI polled between "
         "backward pieces"},
        {"--pack-buckets", FLAG_BOOL, &f.pack_buckets, 0, 1, NULL,
         "copy each bucket's gradients into its own buffer and back (default: all-reduce them "
         "in place, PyTorch's gradient_as_bucket_view)"},
        {"--launch-after-backward", FLAG_BOOL, &f.launch_late, 0, 1, NULL,
         "the same buckets and all-reduces, all started after the whole backward: no overlap "
         "(what overlap itself buys = this step time / the default's)"},
    };
    lab_parse_args(argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]), "03_ddp/run",
                   USAGE);
    train(&args, &f);
    dist_finalize();
    return 0;
}

// ---------------------------------------------------------------------------------------------
// backward with hooks

// Backward from the head down, piece by piece. With ddp (not NULL: overlap on, not inside
// no_sync) every piece is followed by the hook that starts the all-reduce of each bucket it
// completed, so those all-reduces run while the next pieces compute.
static void backward(GPT2 *m, float dloss, Ddp *ddp) {
    const int L = m->cfg.L;
    int tok = trace_begin("backward head", TRACE_COMPUTE);
    gpt2_head_backward(m, dloss);
    trace_end(tok);
    if (ddp) ddp_piece_done(ddp, 0);
    for (int l = L - 1; l >= 0; l--) {
        char name[32];
        snprintf(name, sizeof name, "backward block %d", l);
        tok = trace_begin(name, TRACE_COMPUTE);
        gpt2_block_backward(m, l);
        trace_end(tok);
        if (ddp) ddp_piece_done(ddp, L - l);
    }
    tok = trace_begin("backward embedding", TRACE_COMPUTE);
    gpt2_embed_backward(m);
    trace_end(tok);
    if (ddp) ddp_piece_done(ddp, L + 1);
}

// ---------------------------------------------------------------------------------------------
// small helpers (checks and reports; the training loop is in train() below)

// The fastest of n timings: interference from other processes only ever adds time, so the
// minimum is the best estimate of what the work itself costs.
static double fastest(const double *v, int n) {
    double m = n > 0 ? v[0] : 0.0;
    for (int i = 1; i < n; i++) m = fmin(m, v[i]);
    return m;
}

// --check-no-sync: do all ranks hold the same gradients right now? A fingerprint of the
// gradient buffer per rank, gathered everywhere and compared with rank 0's.
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

// --check-no-sync's tally: inside no_sync gradients must differ across ranks, after it agree.
typedef struct NoSyncCheck {
    int nosync_checks, nosync_differ, sync_checks, sync_agree;
    double sent, recv;  // the bytes the comparisons moved (left out of the per-step figures)
} NoSyncCheck;

static void check_no_sync(NoSyncCheck *c, GPT2 *m, DistGroup *g, int inside_no_sync) {
    uint64_t s0 = dist_bytes_sent(), r0 = dist_bytes_recv();
    int agree = grads_agree_across_ranks(m, g);
    if (inside_no_sync) { c->nosync_checks++; c->nosync_differ += !agree; }
    else { c->sync_checks++; c->sync_agree += agree; }
    c->sent += (double)(dist_bytes_sent() - s0);
    c->recv += (double)(dist_bytes_recv() - r0);
}

// 2. The gradient buckets, in reverse module order, started by a communication thread unless
// --progress poll, all-reduced in place unless --pack-buckets.
static void make_buckets(Ddp *ddp, Session *s, const DdpFlags *f) {
    GPT2Param *order = lab_xcalloc((size_t)s->nplist, sizeof(GPT2Param));
    ddp_module_order(&s->cfg, order);
    for (int i = 0, j = s->nplist - 1; i < j; i++, j--) {  // reverse: roughly backward's order
        GPT2Param t = order[i]; order[i] = order[j]; order[j] = t;
    }
    size_t *bytes = lab_xcalloc((size_t)s->nplist, sizeof(size_t));
    for (int i = 0; i < s->nplist; i++) bytes[i] = order[i].size * s->e;
    int *bucket_of = lab_xcalloc((size_t)s->nplist, sizeof(int));
    ddp_assign_buckets(bytes, s->nplist, (size_t)((double)f->first_bucket_mb * 1048576.0),
                       (size_t)((double)f->bucket_mb * 1048576.0), bucket_of);
    ddp_init(ddp, &s->model, order, s->nplist, bucket_of, s->world);
    free(order); free(bytes); free(bucket_of);
    if (strcmp(f->progress, "thread") == 0) dist_comm_thread_start(s->world);
    if (!f->pack_buckets) ddp_use_views(ddp);
}

static void print_header(const Session *s, const DdpFlags *f, const Ddp *ddp, int Bl, int Bm) {
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

// 1. Every rank has built its own replica from ITS OWN seed (seed + rank), and rank 0 resumes
// or loads; then rank 0's weights overwrite everyone's (bf16: the fp32 master travels, so that
// every rank's optimizer starts from rank 0's). Returns the first step, on every rank.
static int broadcast_replica(Session *s) {
    const LabArgs *args = s->args;
    int start = 0;
    if (s->rank == 0) start = session_load_or_init(s, (uint64_t)args->seed);
    else train_master_init(&s->model, s->master, (uint64_t)args->seed + (uint64_t)s->rank);
    int tok = trace_begin("broadcast weights", TRACE_COMM);
    dist_broadcast(s->master, s->n, DIST_F32, 0, s->world);
    train_master_to_model(&s->model, s->master);
    if (args->resume) {  // the optimizer state and the step travel too
        dist_broadcast(s->opt_m, s->n, DIST_F32, 0, s->world);
        dist_broadcast(s->opt_v, s->n, DIST_F32, 0, s->world);
        dist_broadcast(&start, 1, DIST_I32, 0, s->world);
    }
    trace_end(tok);
    session_start_at(s, start);
    return start;
}

// What each rank reports at the end, gathered to rank 0 as doubles (then the overlap's).
enum { R_COMPUTE, R_WAIT, R_STEP, R_SENT, R_RECV, R_GRAD_SENT, R_PARAMS, R_GRADS, R_OPT,
       R_COMM, R_TOTAL, R_OVERLAP, R_NFIELDS = R_OVERLAP + OVERLAP_NFIELDS };

// The run's figures (rank 0): the per-rank table (every rank the same: no master), the no_sync
// check, the overlap, the --dump file. mine: this rank's fields (the memory ones filled here).
static void report(Session *s, const DdpFlags *f, const Ddp *ddp, const NoSyncCheck *c,
                   double *mine, double bcast_sent, double bcast_recv, double replica_diff) {
    const int N = s->N, nrun = session_steps_run(s), overlap = !f->no_overlap;
    mine[R_PARAMS] = (double)mem_peak(MEM_PARAMS);
    mine[R_GRADS] = (double)mem_peak(MEM_GRADS);
    mine[R_OPT] = (double)(mem_peak(MEM_OPT_M) + mem_peak(MEM_OPT_V));
    mine[R_COMM] = (double)mem_peak(MEM_COMM);
    mine[R_TOTAL] = (double)mem_total_peak();
    double *all = session_gather_report(s, mine, R_NFIELDS);
    if (s->rank != 0) return;
    double overlap_pct = overlap_percent(all + R_OVERLAP, N, R_NFIELDS);

    if (!s->args->quiet && nrun > 0) {
        double elapsed = session_elapsed(s);
        printf("%d steps in %.2f s: %.0f tokens/s (all ranks), %.1f ms per step\n", nrun,
               elapsed, (double)s->args->batch * s->T * nrun / elapsed, 1e3 * elapsed / nrun);
        static const SessionColumn cols[] = {
            {"compute", R_COMPUTE, COL_MS}, {"wait (comm)", R_WAIT, COL_MS},
            {"step", R_STEP, COL_MS}, {"sent", R_SENT, COL_BYTES}, {"recv", R_RECV, COL_BYTES},
            {"params", R_PARAMS, COL_BYTES}, {"grads", R_GRADS, COL_BYTES},
            {"adam m+v", R_OPT, COL_BYTES}, {"buckets", R_COMM, COL_BYTES},
            {"peak mem", R_TOTAL, COL_BYTES}};
        session_print_rank_table("Per rank (per step; every rank does the same work: no master)",
                                 cols, (int)(sizeof cols / sizeof cols[0]), all, N, R_NFIELDS,
                                 NULL);
        printf("  sent per step = 2(N-1)/N x %zu gradient bytes (+ the loss) = %.0f B on every "
               "rank: no rank is special\n", s->n * s->e, mine[R_SENT]);
        if (f->check_no_sync)
            printf("\nno_sync check: inside no_sync gradients differed across ranks in %d of %d "
                   "micro-steps; after the sync they agreed in %d of %d steps\n",
                   c->nosync_differ, c->nosync_checks, c->sync_agree, c->sync_checks);
        overlap_print(all + R_OVERLAP, N, R_NFIELDS, overlap, s->world->thread != NULL,
                      N > 1 ? f->overlap_steps : 0);
        char b1[32];
        printf("\nEvery rank holds the full model state: %s = 16 B x %zu = %s per rank%s\n",
               s->bf16 ? "bf16 params + grads (2 + 2 B) + fp32 master (4 B) + Adam m, v (4 + 4 B)"
                       : "params + grads + Adam m, v", s->n,
               mem_format(b1, sizeof b1, 16.0 * (double)s->n),
               overlap && f->pack_buckets ? (s->bf16 ? ", plus the bucket buffers (2 B/param)"
                                                     : ", plus the bucket buffers (4 B/param)")
                                          : "");
    }
    if (s->args->dump) {
        RunResults out;
        session_dump_open(s, &out);
        results_set(&out, "world_size", N);
        results_set(&out, "bytes_sent_per_step", mine[R_SENT]);
        results_set(&out, "bytes_recv_per_step", mine[R_RECV]);
        results_set(&out, "grad_bytes_sent_per_step", mine[R_GRAD_SENT]);
        results_set(&out, "bytes_sent_broadcast", bcast_sent);
        results_set(&out, "bytes_recv_broadcast", bcast_recv);
        results_set(&out, "buckets", overlap ? ddp->nbuckets : 0);
        for (int b = 0; overlap && b < ddp->nbuckets && b < 16; b++) {
            char key[48];
            snprintf(key, sizeof key, "bucket_bytes_%d", b);
            results_set(&out, key, (double)(ddp->buckets[b].numel * s->e));
        }
        results_set(&out, "replica_max_diff", replica_diff);
        results_set(&out, "nosync_checks", c->nosync_checks);
        results_set(&out, "nosync_differ", c->nosync_differ);
        results_set(&out, "sync_checks", c->sync_checks);
        results_set(&out, "sync_agree", c->sync_agree);
        if (overlap_pct >= 0) results_set(&out, "overlap_pct", overlap_pct);  // else unmeasured
        session_dump_close(s, &out);
    }
    free(all);
}

// ---------------------------------------------------------------------------------------------
// training

static void train(const LabArgs *args, const DdpFlags *f) {
    const int rank = dist_rank(), N = dist_size();
    const int B = args->batch, K = f->grad_accum, overlap = !f->no_overlap;
    // DistributedSampler: this rank's rows [row0, row0 + Bl) of the global batch, processed
    // as K micro-batches of Bm rows.
    int row0, Bl;
    data_slice(B, rank, N, &row0, &Bl);
    if (Bl % K != 0)
        lab_fail_collective("--grad-accum %d: each rank's %d sequences (--batch %d over %d ranks) "
                            "do not split into %d equal micro-batches; use a --batch that is a "
                            "multiple of %d (ranks x micro-batches)", K, Bl, B, N, K, N * K);
    const int Bm = Bl / K;

    // 1. Every rank builds its own replica (model, a full optimizer state: DDP's redundancy),
    //    then takes rank 0's weights.
    Session s;
    session_init(&s, args, Bm, 1);
    GPT2 *model = &s.model;
    const int T = s.T, start = broadcast_replica(&s);
    double bcast_sent = (double)dist_bytes_sent(), bcast_recv = (double)dist_bytes_recv();
    // 2. The gradient buckets (none with --no-overlap).
    Ddp ddp;
    memset(&ddp, 0, sizeof ddp);
    if (overlap) make_buckets(&ddp, &s, f);
    if (!args->quiet && rank == 0) print_header(&s, f, &ddp, Bl, Bm);

    double *t_train = lab_xcalloc((size_t)(s.end > start ? s.end - start : 1), sizeof(double));
    double t_compute = 0, t_wait = 0, grad_sent = 0;
    NoSyncCheck nosync = {0, 0, 0, 0, 0, 0};
    OverlapMeter meter = {0, 0};
    dist_counters_reset();
    double ct_busy0, ct_cpu0;  // the communication thread's times so far (0 without one)
    dist_comm_thread_times(s.world, &ct_busy0, &ct_cpu0);
    for (int step = start; step < s.end; step++) {
        session_step_begin(&s, step);  // (fault injection: --kill-rank, --kill-step)
        double t0 = lab_now(), t_sync = 0;
        gpt2_zero_grad(model);
        session_inject_nan(&s, step, N - 1);  // a NaN in one rank's gradient
        float loss = 0.0f;
        for (int micro = 0; micro < K; micro++) {
            // 3. this rank's micro-batch, forward
            data_batch(&s.data, (uint64_t)step, B, T, row0 + micro * Bm, Bm, s.inputs, s.targets);
            int tok = trace_begin("forward", TRACE_COMPUTE);
            loss += gpt2_forward(model, s.inputs, s.targets) / (float)K;
            trace_end(tok);

            // 4. backward; the last micro-step's all-reduces start inside it, bucket by bucket
            int sync = 1;       // does this micro-step communicate?
            float dloss = 0.0f; // d(objective)/d(loss at each of this micro-batch's positions)
            // EXERCISE 03.3 no_sync gradient accumulation -> 03_ddp/README.md#exercise-033-no_sync-gradient-accumulation
            sync = micro == K - 1;  // the first K-1 micro-steps run inside no_sync
            // The objective is the mean over this rank's K*Bm rows (all-reduce then averages
            // the ranks): each micro-batch's mean counts 1/K.
            dloss = 1.0f / ((float)Bm * (float)T * (float)K);
            // END EXERCISE 03.3
            uint64_t sent0 = dist_bytes_sent();
            double b0 = lab_now();
            backward(model, dloss, sync && overlap && !f->launch_late ? &ddp : NULL);
            double b1 = lab_now();
            if (sync && overlap && f->launch_late)  // every bucket now, in order: no overlap
                for (int b = 0; b < ddp.nbuckets; b++) ddp_launch(&ddp, b);

            // 5. wait for the gradients of every rank: the averaged gradient, everywhere
            if (sync) {
                double tw = lab_now();
                int tok = trace_begin("wait for all-reduce", TRACE_COMPUTE);
                if (overlap) ddp_wait(&ddp);
                else dist_all_reduce(train_grads(model), train_grads(model), s.n, s.dt, DIST_AVG,
                                     s.world);
                trace_end(tok);
                double tw1 = lab_now();
                t_sync += tw1 - tw;
                // the timeline of this step, for the share of communication hidden (overlap.c)
                if (overlap) overlap_add_ddp_step(&meter, b0, b1, &ddp);  // every bucket's
                else overlap_add_step(&meter, b0, b1, (double[1][2]){{tw, tw1}}, 1);  // the one
            }
            grad_sent += (double)(dist_bytes_sent() - sent0);  // launched in backward or here
            if (f->check_no_sync) check_no_sync(&nosync, model, s.world, micro < K - 1);
        }
        t_train[step - start] = lab_now() - t0;  // forward + backward + exposed communication
        t_wait += t_sync;
        // the loss of the step: the mean over every rank's micro-batches
        dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, s.world);

        // 6. the same update on every rank: clip (the norm of the averaged gradient) + AdamW
        double t_opt = lab_now();
        int tok = trace_begin("optimizer", TRACE_COMPUTE);
        train_adamw_step(&s.opt, model, step, s.master, s.opt_m, s.opt_v, s.plist, s.nplist);
        trace_end(tok);
        t_compute += (t_train[step - start] - t_sync) + (lab_now() - t_opt);
        session_step_end(&s, step, loss);  // progress line, periodic --save (rank 0)
    }
    const int nrun = session_steps_run(&s);
    double ct_busy, ct_cpu;
    dist_comm_thread_times(s.world, &ct_busy, &ct_cpu);
    double mine[R_NFIELDS] = {0};  // per step, without the --check-no-sync comparisons
    mine[R_SENT] = nrun ? ((double)dist_bytes_sent() - nosync.sent) / nrun : 0;
    mine[R_RECV] = nrun ? ((double)dist_bytes_recv() - nosync.recv) / nrun : 0;
    mine[R_GRAD_SENT] = nrun ? grad_sent / nrun : 0;
    double replica_diff = args->dump ? replica_max_diff(model, s.master, s.world) : 0.0;
    session_finish(&s);  // final --save, --save-weights (rank 0; every rank holds the same)

    // 7. What communication and compute cost alone: a few more steps (overlap.c).
    int ncal = N > 1 ? f->overlap_steps : 0;
    OverlapCalibration cal = overlap_calibrate(model, &s.data, B, row0, Bm, K,
                                               overlap ? &ddp : NULL, s.world, ncal);
    mine[R_COMPUTE] = nrun ? t_compute / nrun : 0;
    mine[R_WAIT] = nrun ? t_wait / nrun : 0;
    mine[R_STEP] = nrun ? session_elapsed(&s) / nrun : 0;
    overlap_pack(&meter, nrun, fastest(t_train, nrun), ct_busy - ct_busy0, ct_cpu - ct_cpu0, &cal,
                 mine + R_OVERLAP);
    report(&s, f, &ddp, &nosync, mine, bcast_sent, bcast_recv, replica_diff);

    free(t_train);
    if (overlap) ddp_free(&ddp);
    dist_comm_thread_stop(s.world);
    session_free(&s);
}
