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
// the loop skeleton every training chapter shares is common/session.c; the report, ddp_report.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "ddp_buckets.h"
#include "ddp_report.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "mem_predict.h"
#include "overlap.h"
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

static void train(const LabArgs *args, const DdpFlags *f);

// A flag that would do nothing is refused, not ignored: the buckets' flags without buckets
// (--no-overlap), the no_sync check without no_sync micro-steps (--grad-accum 1).
static void refuse_flags_that_do_nothing(int argc, char **argv, const DdpFlags *f) {
    static const char *const bucket_flags[] = {"--bucket-mb", "--first-bucket-mb", "--pack-buckets",
                                               "--progress", "--launch-after-backward"};
    for (size_t i = 0; f->no_overlap && i < sizeof bucket_flags / sizeof bucket_flags[0]; i++)
        if (lab_flag_given(argc, argv, bucket_flags[i]))
            lab_fail_collective("%s is about the gradient buckets (their size, their buffers, "
                                "how and when their all-reduces run), and --no-overlap has none "
                                "(one all-reduce after the whole backward): drop %s or "
                                "--no-overlap",
                                bucket_flags[i], bucket_flags[i]);
    if (f->check_no_sync && f->grad_accum < 2)
        lab_fail_collective("--check-no-sync compares the gradients inside no_sync, and --grad-accum "
                            "%d has no micro-step inside it: add --grad-accum 2 or more (and a "
                            "--batch that splits into ranks x micro-batches), or drop "
                            "--check-no-sync", f->grad_accum);
}

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
         "no buckets: one all-reduce of all gradients after the whole backward (the bucket flags "
         "are refused with it)"},
        {"--check-no-sync", FLAG_BOOL, &f.check_no_sync, 0, 1, NULL,
         "compare gradients across ranks after each micro-step (differ, then agree); needs "
         "--grad-accum 2 or more"},
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
    refuse_flags_that_do_nothing(argc, argv, &f);
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
// setup (the figures and the report: ddp_report.c; the training loop: train() below)

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

// The memory each rank will allocate for a global batch of `batch` (mem_predict.h): a whole
// replica with its optimizer for one micro-batch of rows, and --pack-buckets' bucket buffers
// (a copy of the gradients).
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const DdpFlags *f = ctx;
    const int N = dist_size(), K = f->grad_accum, bf16 = strcmp(args->dtype, "bf16") == 0;
    (void)rank;
    GPT2Config cfg = lab_args_config(args);
    MemPrediction p = mem_predict_replica(&cfg, (batch + N * K - 1) / (N * K), bf16, 1);
    if (f->pack_buckets && !f->no_overlap) p.buffers += (double)gpt2_param_count(&cfg) * (bf16 ? 2 : 4);
    return p;
}

// The run before its first step: this rank's rows, the replica (1.), rank 0's weights, the
// buckets (2.), the header. *row0, *Bm: this rank's first row and micro-batch rows.
static void setup(Session *s, Ddp *ddp, DdpFigures *fig, const LabArgs *args, const DdpFlags *f,
                  int *row0, int *Bm) {
    const int rank = dist_rank(), N = dist_size(), B = args->batch, K = f->grad_accum;
    // DistributedSampler: this rank's rows [row0, row0 + Bl) of the global batch, processed
    // as K micro-batches of Bm rows.
    int Bl;
    data_slice(B, rank, N, row0, &Bl);
    if (Bl % K != 0)
        lab_fail_collective("--grad-accum %d: each rank's %d sequences (--batch %d over %d ranks) "
                            "do not split into %d equal micro-batches; use a --batch that is a "
                            "multiple of %d (ranks x micro-batches)", K, Bl, B, N, K, N * K);
    *Bm = Bl / K;
    mem_refuse_if_it_cannot_fit(args, predict_memory, f, N * K);  // before the first allocation
    // every rank its own replica (model, a full optimizer state: DDP's redundancy), then rank
    // 0's weights
    session_init(s, args, *Bm, 1);
    broadcast_replica(s);
    memset(fig, 0, sizeof *fig);
    fig->bcast_sent = (double)dist_bytes_sent(), fig->bcast_recv = (double)dist_bytes_recv();
    memset(ddp, 0, sizeof *ddp);
    if (!f->no_overlap) make_buckets(ddp, s, f);  // (none with --no-overlap)
    session_watch_links(s, NULL, s->world, NULL);   // --links: DP's link time (ddp_report.c)
    if (!args->quiet && rank == 0) ddp_print_header(s, f, ddp, Bl, *Bm);
}

// ---------------------------------------------------------------------------------------------
// training

static void train(const LabArgs *args, const DdpFlags *f) {
    Session s;
    Ddp ddp;
    DdpFigures fig;  // what the loop measures (ddp_report.c)
    int row0, Bm;
    setup(&s, &ddp, &fig, args, f, &row0, &Bm);  // 1. the replicas, 2. the buckets
    GPT2 *model = &s.model;
    const int B = args->batch, T = s.T, K = f->grad_accum, overlap = !f->no_overlap;
    ddp_figures_start(&fig, &s);
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (fault injection: --kill-rank, --kill-step)
        double t0 = lab_now(), t_sync = 0;
        gpt2_zero_grad(model);
        session_inject_nan(&s, step, s.N - 1);  // a NaN in one rank's gradient
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
                if (overlap) overlap_add_ddp_step(&fig.meter, b0, b1, &ddp);  // every bucket's
                else overlap_add_step(&fig.meter, b0, b1, (double[1][2]){{tw, tw1}}, 1);  // one
            }
            fig.grad_sent += (double)(dist_bytes_sent() - sent0);  // launched in backward or here
            if (f->check_no_sync) ddp_check_no_sync(&fig, model, s.world, micro < K - 1);
        }
        double t_train = fig.t_train[step - s.start] = lab_now() - t0;  // fwd + bwd + exposed comm
        fig.t_wait += t_sync;
        // the loss of the step: the mean over every rank's micro-batches
        dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, s.world);

        // 6. the same update on every rank, unless the loss spiked (--on-spike): clip (the norm
        //    of the averaged gradient) + AdamW
        double t_opt = lab_now();
        if (session_may_update(&s, step, loss)) {
            int tok = trace_begin("optimizer", TRACE_COMPUTE);
            double norm_sq = train_adamw_step(&s.opt, model, step, s.master, s.opt_m, s.opt_v,
                                              s.plist, s.nplist);
            trace_end(tok);
            session_grad_norm_sq(&s, norm_sq);  // the health line's (the averaged gradient's)
        }
        double t_end = lab_now();
        fig.t_compute += (t_train - t_sync) + (t_end - t_opt);
        session_phase(&s, "compute", t_train - t_sync);  // fwd + bwd, --log's phases
        session_phase(&s, "wait", t_sync);               // for the all-reduces
        session_phase(&s, "optimizer", t_end - t_opt);
        session_step_end(&s, step, loss);  // health line, --log, periodic --save (rank 0)
    }
    ddp_figures_end(&fig, &s);  // the byte counters, before the collectives below
    session_finish(&s);  // final --save, --save-weights (rank 0; every rank holds the same)
    // 7. What communication and compute cost alone (a few more steps), the report, --dump.
    ddp_report(&s, f, &ddp, &fig, row0, Bm);

    if (overlap) ddp_free(&ddp);
    dist_comm_thread_stop(s.world);
    session_free(&s);
}
