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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "ddp_buckets.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "optim.h"
#include "results.h"
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
         "extra steps timed compute-only and comm-only to measure overlap (0 = skip)"},
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

// What each rank reports at the end, gathered to rank 0 as doubles.
enum { R_COMPUTE, R_WAIT, R_STEP, R_SENT, R_RECV, R_PARAMS, R_GRADS, R_OPT, R_COMM, R_TOTAL,
       R_T_TRAIN, R_T_COMP, R_T_COMM, R_CT_BUSY, R_CT_CPU, R_CAL_BUSY, R_CAL_CPU, R_NFIELDS };

static void print_rank_table(const double *all, int N) {
    char s[7][32];
    printf("\nPer rank (per step; every rank does the same work: no master)\n");
    printf("  %4s %10s %12s %10s %11s %11s %10s %10s %10s %10s %10s\n", "rank", "compute",
           "wait (comm)", "step", "sent", "recv", "params", "grads", "adam m+v", "buckets",
           "peak mem");
    for (int r = 0; r < N; r++) {
        const double *v = all + (size_t)r * R_NFIELDS;
        printf("  %4d %7.1f ms %9.1f ms %7.1f ms %11s %11s %10s %10s %10s %10s %10s\n", r,
               1e3 * v[R_COMPUTE], 1e3 * v[R_WAIT], 1e3 * v[R_STEP],
               mem_format(s[0], 32, v[R_SENT]), mem_format(s[1], 32, v[R_RECV]),
               mem_format(s[2], 32, v[R_PARAMS]), mem_format(s[3], 32, v[R_GRADS]),
               mem_format(s[4], 32, v[R_OPT]), mem_format(s[5], 32, v[R_COMM]),
               mem_format(s[6], 32, v[R_TOTAL]));
    }
}

// ---------------------------------------------------------------------------------------------
// training

static void train(const LabArgs *args, const DdpFlags *f) {
    GPT2Config cfg = lab_args_config(args);
    Device dev = lab_args_device(args);
    const int bf16 = strcmp(args->dtype, "bf16") == 0;  // mixed precision (see common/train.h)
    // NCCL (GPU buffers; flags.c checks --device cuda) picks this rank's GPU: before allocating
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);
    DistGroup *world = dist_world();
    const int rank = world->rank, N = world->size;
    const int B = args->batch, T = cfg.T, K = f->grad_accum;
    const int overlap = !f->no_overlap;

    // DistributedSampler: this rank's rows [row0, row0 + Bl) of the global batch, processed
    // as K micro-batches of Bm rows.
    int row0, Bl;
    data_slice(B, rank, N, &row0, &Bl);
    if (Bl % K != 0)
        lab_fail_collective("--grad-accum %d: each rank's %d sequences (--batch %d over %d ranks) "
                            "do not split into %d equal micro-batches; use a --batch that is a "
                            "multiple of %d (ranks x micro-batches)", K, Bl, B, N, K, N * K);
    const int Bm = Bl / K;
    trace_init(args->trace);

    // 1. Every rank builds its own replica, from ITS OWN seed (seed + rank)...
    GPT2 model;
    gpt2_build_dtype(&model, cfg, dev, bf16 ? GPT2_BF16 : GPT2_FP32);
    gpt2_alloc_grads(&model);
    gpt2_alloc_acts(&model, Bm, T);
    const Kernels *k = model.k;
    const size_t n = model.num_params;
    const DistDtype dt = train_dtype(&model);  // the gradients' type: DIST_F32 or DIST_BF16
    const size_t e = dist_dtype_size(dt);      // bytes per gradient: 4, or 2 in bf16
    // The weights AdamW updates. fp32: the parameters themselves. bf16: an fp32 master copy (4
    // more bytes per parameter); the forward pass reads them rounded to bf16.
    float *master = train_master_alloc(&model);
    train_master_init(&model, master, (uint64_t)args->seed + (uint64_t)rank);
    GPT2Param *plist = lab_xcalloc((size_t)gpt2_params(&cfg, NULL), sizeof(GPT2Param));
    int nplist = gpt2_params(&cfg, plist);

    // The optimizer state: every rank keeps a full copy (DDP's memory redundancy).
    float *opt_m = mem_alloc(n * sizeof(float), MEM_OPT_M, dev);
    float *opt_v = mem_alloc(n * sizeof(float), MEM_OPT_V, dev);
    AdamW opt = lab_args_adamw(args);

    // ...then rank 0's weights (fresh, loaded or resumed) overwrite everyone's.
    int start = 0;
    if (rank == 0 && args->resume) {
        start = ckpt_resume_training(args->resume, &cfg, master, opt_m, opt_v, n);
        if (!args->quiet) printf("resumed from %s at step %d\n", args->resume, start);
    } else if (rank == 0 && args->load_weights) {
        ckpt_load_weights_into(args->load_weights, &cfg, master, n);
    }
    // (bf16: the fp32 master travels, so that every rank's optimizer starts from rank 0's)
    int tok = trace_begin("broadcast weights", TRACE_COMM);
    dist_broadcast(master, n, DIST_F32, 0, world);
    train_master_to_model(&model, master);
    if (args->resume) {  // the optimizer state and the step travel too
        dist_broadcast(opt_m, n, DIST_F32, 0, world);
        dist_broadcast(opt_v, n, DIST_F32, 0, world);
        dist_broadcast(&start, 1, DIST_I32, 0, world);
    }
    trace_end(tok);
    double bcast_sent = (double)dist_bytes_sent(), bcast_recv = (double)dist_bytes_recv();

    // 2. The gradient buckets, in reverse module order (none with --no-overlap).
    Ddp ddp;
    memset(&ddp, 0, sizeof ddp);
    if (overlap) {
        GPT2Param *order = lab_xcalloc((size_t)nplist, sizeof(GPT2Param));
        ddp_module_order(&cfg, order);
        for (int i = 0, j = nplist - 1; i < j; i++, j--) {  // reverse: roughly backward's order
            GPT2Param t = order[i]; order[i] = order[j]; order[j] = t;
        }
        size_t *bytes = lab_xcalloc((size_t)nplist, sizeof(size_t));
        for (int i = 0; i < nplist; i++) bytes[i] = order[i].size * e;
        int *bucket_of = lab_xcalloc((size_t)nplist, sizeof(int));
        ddp_assign_buckets(bytes, nplist, (size_t)((double)f->first_bucket_mb * 1048576.0),
                           (size_t)((double)f->bucket_mb * 1048576.0), bucket_of);
        ddp_init(&ddp, &model, order, nplist, bucket_of, world);
        free(order); free(bytes); free(bucket_of);
        if (strcmp(f->progress, "thread") == 0) dist_comm_thread_start(world);
        if (!f->pack_buckets) ddp_use_views(&ddp);
    }

    DataSource data;
    lab_args_data(args, &data);
    int *inputs = mem_alloc((size_t)Bm * T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)Bm * T * sizeof(int), MEM_OTHER, DEV_CPU);

    if (!args->quiet && rank == 0) {
        char buf[32];
        printf("DDP on %d rank%s: GPT-2 V=%d T=%d L=%d C=%d NH=%d, %zu parameters (%s %s "
               "gradients), device %s\n", N, N > 1 ? "s" : "", cfg.V, cfg.T, cfg.L, cfg.C, cfg.NH,
               n, mem_format(buf, sizeof buf, (double)(n * e)), bf16 ? "bf16" : "fp32", k->name);
        printf("global batch %d x %d: rank r takes rows [r*%d, (r+1)*%d)", B, T, Bl, Bl);
        if (K > 1) printf(" as %d micro-batches of %d (no_sync on the first %d)", K, Bm, K - 1);
        printf("\nweights: rank r initialized from seed %d + r, then rank 0's broadcast to all "
               "(%s%s)\n", args->seed, mem_format(buf, sizeof buf, (double)n * 4),
               bf16 ? " of fp32 master weights" : "");
        if (overlap) {
            printf("gradient buckets (cap %g MiB, first %g MiB), launched %s, "
                   "%s, run by %s:\n", (double)f->bucket_mb, (double)f->first_bucket_mb,
                   f->launch_late ? "after the whole backward" : "as soon as complete",
                   f->pack_buckets ? "packed into their own buffers" : "all-reduced in place",
                   world->thread ? "a communication thread" : "non-blocking MPI polled between "
                   "backward pieces");
            ddp_print_buckets(&ddp, stdout);
        } else {
            printf("--no-overlap: one all-reduce of all %s of gradients after the whole "
                   "backward\n", mem_format(buf, sizeof buf, (double)(n * e)));
        }
    }

    const int end = lab_args_end_step(args);
    float *losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    for (int s = 0; s < args->steps; s++) losses[s] = NAN;
    double *t_train = lab_xcalloc((size_t)(end > start ? end - start : 1), sizeof(double));
    double t_compute = 0, t_wait = 0;
    double grad_sent = 0, check_sent = 0, check_recv = 0;
    int nosync_checks = 0, nosync_differ = 0, sync_checks = 0, sync_agree = 0;
    dist_counters_reset();
    double ct_busy0, ct_cpu0;  // the communication thread's times so far (0 without one)
    dist_comm_thread_times(world, &ct_busy0, &ct_cpu0);

    double t_start = lab_now(), t_last = t_start;
    for (int step = start; step < end; step++) {
        if (step == args->kill_step && rank == args->kill_rank) {  // fault injection
            fprintf(stderr, "[rank %d] --kill-rank: exiting abruptly at step %d\n", rank, step);
            fflush(stderr);
            _exit(1);
        }
        double t0 = lab_now(), t_sync = 0;
        gpt2_zero_grad(&model);
        if (step == args->inject_nan_step && rank == N - 1)  // a NaN in one rank's gradient
            train_inject_nan(&model);
        float loss = 0.0f;
        for (int micro = 0; micro < K; micro++) {
            // 3. this rank's micro-batch, forward
            data_batch(&data, (uint64_t)step, B, T, row0 + micro * Bm, Bm, inputs, targets);
            tok = trace_begin("forward", TRACE_COMPUTE);
            loss += gpt2_forward(&model, inputs, targets) / (float)K;
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
            backward(&model, dloss, sync && overlap && !f->launch_late ? &ddp : NULL);
            if (sync && overlap && f->launch_late)  // every bucket now, in order: no overlap
                for (int b = 0; b < ddp.nbuckets; b++) ddp_launch(&ddp, b);

            // 5. wait for the gradients of every rank: the averaged gradient, everywhere
            if (sync) {
                double tw = lab_now();
                tok = trace_begin("wait for all-reduce", TRACE_COMPUTE);
                if (overlap) ddp_wait(&ddp);
                else dist_all_reduce(train_grads(&model), train_grads(&model), n, dt, DIST_AVG,
                                     world);
                trace_end(tok);
                t_sync += lab_now() - tw;
            }
            grad_sent += (double)(dist_bytes_sent() - sent0);  // launched in backward or here
            if (f->check_no_sync) {  // debug: gradients differ inside no_sync, agree after
                uint64_t s0 = dist_bytes_sent(), r0 = dist_bytes_recv();
                int agree = grads_agree_across_ranks(&model, world);
                if (micro < K - 1) { nosync_checks++; nosync_differ += !agree; }
                else { sync_checks++; sync_agree += agree; }
                check_sent += (double)(dist_bytes_sent() - s0);
                check_recv += (double)(dist_bytes_recv() - r0);
            }
        }
        t_train[step - start] = lab_now() - t0;  // forward + backward + exposed communication
        t_wait += t_sync;
        // the loss of the step: the mean over every rank's micro-batches
        dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, world);

        // 6. the same update on every rank: clip (the norm of the averaged gradient) + AdamW
        double t_opt = lab_now();
        tok = trace_begin("optimizer", TRACE_COMPUTE);
        train_adamw_step(&opt, &model, step, master, opt_m, opt_v, plist, nplist);
        trace_end(tok);
        double now = lab_now();
        t_compute += (t_train[step - start] - t_sync) + (now - t_opt);
        losses[step] = loss;

        int last = step == end - 1;
        if (!args->quiet && rank == 0 && args->log_every > 0 && (step % args->log_every == 0 || last)) {
            double per_step = (now - t_start) / (step - start + 1);
            printf("step %5d/%d  loss %.4f  lr %.2e  %8.0f tok/s  ETA %5.1f s\n", step + 1,
                   args->steps, loss, adamw_lr(&opt, step), (double)B * T / (now - t_last),
                   per_step * (args->steps - step - 1));
            fflush(stdout);
        }
        t_last = now;
        if (rank == 0 && args->save && args->save_every > 0 && (step + 1) % args->save_every == 0 &&
            !last)
            ckpt_save_training(args->save, &cfg, step + 1, (uint64_t)args->seed,
                               (uint64_t)args->data_seed, master, opt_m, opt_v, n);
    }
    double elapsed = lab_now() - t_start;
    const int nrun = end > start ? end - start : 0;
    double ct_busy, ct_cpu;
    dist_comm_thread_times(world, &ct_busy, &ct_cpu);

    // Communication per step, without the --check-no-sync comparisons.
    double sent_step = nrun ? ((double)dist_bytes_sent() - check_sent) / nrun : 0;
    double recv_step = nrun ? ((double)dist_bytes_recv() - check_recv) / nrun : 0;
    double grad_sent_step = nrun ? grad_sent / nrun : 0;

    // Checkpoint (every rank holds the same state: rank 0 writes it) and final weights.
    if (rank == 0 && args->save) {
        ckpt_save_training(args->save, &cfg, end, (uint64_t)args->seed,
                           (uint64_t)args->data_seed, master, opt_m, opt_v, n);
        if (!args->quiet) printf("saved training state (step %d) to %s\n", end, args->save);
    }
    // the weights the forward pass reads (bf16: widened; the training state keeps the master)
    float *host_params = lab_xmalloc(n * sizeof(float));
    train_params_to_host(&model, host_params);
    if (rank == 0 && args->save_weights) ckpt_save_weights(args->save_weights, &cfg, host_params);
    double replica_diff = args->dump ? replica_max_diff(&model, master, world) : 0.0;
    trace_finish();

    // 7. How much communication did backward hide? A few more steps, timed twice more in the
    //    same run: compute only (no all-reduce) and communication only (the same all-reduces,
    //    no compute). overlap % = 100 (1 - (t_step - t_compute_only) / t_comm_only).
    int ncal = N > 1 ? f->overlap_steps : 0;
    double *t_comp_only = lab_xcalloc((size_t)(ncal ? ncal : 1), sizeof(double));
    double *t_comm_only = lab_xcalloc((size_t)(ncal ? ncal : 1), sizeof(double));
    double cal_busy = 0, cal_cpu = 0;  // the thread's times in the communication-only runs
    for (int i = 0; i < ncal; i++) {
        double t0 = lab_now();
        gpt2_zero_grad(&model);
        for (int micro = 0; micro < K; micro++) {
            data_batch(&data, 0, B, T, row0 + micro * Bm, Bm, inputs, targets);
            gpt2_forward(&model, inputs, targets);
            backward(&model, 1.0f / ((float)Bm * (float)T * (float)K), NULL);
        }
        t_comp_only[i] = lab_now() - t0;
        dist_barrier(world);  // start together: time the transfer, not the other ranks' compute
        t0 = lab_now();
        double b0, c0, b1, c1;
        dist_comm_thread_times(world, &b0, &c0);
        if (overlap) ddp_all_buckets_now(&ddp);
        else dist_all_reduce(train_grads(&model), train_grads(&model), n, dt, DIST_AVG, world);
        t_comm_only[i] = lab_now() - t0;
        dist_comm_thread_times(world, &b1, &c1);
        if (i == 0 || b1 - b0 < cal_busy) { cal_busy = b1 - b0; cal_cpu = c1 - c0; }
    }

    // Per-rank report, gathered to rank 0.
    double mine[R_NFIELDS] = {0};
    mine[R_COMPUTE] = nrun ? t_compute / nrun : 0;
    mine[R_WAIT] = nrun ? t_wait / nrun : 0;
    mine[R_STEP] = nrun ? elapsed / nrun : 0;
    mine[R_SENT] = sent_step;
    mine[R_RECV] = recv_step;
    mine[R_PARAMS] = (double)mem_peak(MEM_PARAMS);
    mine[R_GRADS] = (double)mem_peak(MEM_GRADS);
    mine[R_OPT] = (double)(mem_peak(MEM_OPT_M) + mem_peak(MEM_OPT_V));
    mine[R_COMM] = (double)mem_peak(MEM_COMM);
    mine[R_TOTAL] = (double)mem_total_peak();
    mine[R_T_TRAIN] = fastest(t_train, nrun);
    mine[R_T_COMP] = fastest(t_comp_only, ncal);
    mine[R_T_COMM] = fastest(t_comm_only, ncal);
    mine[R_CT_BUSY] = nrun ? (ct_busy - ct_busy0) / nrun : 0;
    mine[R_CT_CPU] = nrun ? (ct_cpu - ct_cpu0) / nrun : 0;
    mine[R_CAL_BUSY] = cal_busy;
    mine[R_CAL_CPU] = cal_cpu;
    double *all = rank == 0 ? lab_xcalloc((size_t)N * R_NFIELDS, sizeof(double)) : NULL;
    dist_gather(mine, all, R_NFIELDS, DIST_F64, 0, world);

    double overlap_pct = 0.0, step_max = 0, comp_max = 0, comm_max = 0;
    if (rank == 0) {
        // A step ends when the slowest rank's gradients arrive: take each time's max over ranks.
        for (int r = 0; r < N; r++) {
            const double *v = all + (size_t)r * R_NFIELDS;
            step_max = fmax(step_max, v[R_T_TRAIN]);
            comp_max = fmax(comp_max, v[R_T_COMP]);
            comm_max = fmax(comm_max, v[R_T_COMM]);
        }
        if (ncal > 0 && comm_max > 0) overlap_pct = 100.0 * (1.0 - (step_max - comp_max) / comm_max);
        if (!args->quiet && nrun > 0) {
            printf("%d steps in %.2f s: %.0f tokens/s (all ranks), %.1f ms per step\n", nrun,
                   elapsed, (double)B * T * nrun / elapsed, 1e3 * elapsed / nrun);
            print_rank_table(all, N);
            printf("  sent per step = 2(N-1)/N x %zu gradient bytes (+ the loss) = %.0f B on "
                   "every rank: no rank is special\n", n * e, sent_step);
            if (f->check_no_sync)
                printf("\nno_sync check: inside no_sync gradients differed across ranks in %d of "
                       "%d micro-steps; after the sync they agreed in %d of %d steps\n",
                       nosync_differ, nosync_checks, sync_agree, sync_checks);
            if (ncal > 0) {
                printf("\nOverlap (fastest step of the run and of %d extra steps each; the slowest "
                       "rank):\n", ncal);
                printf("  step (fwd+bwd+exposed comm) %8.1f ms\n", 1e3 * step_max);
                printf("  compute only (fwd+bwd)      %8.1f ms\n", 1e3 * comp_max);
                printf("  communication only          %8.1f ms\n", 1e3 * comm_max);
                printf("  overlap = 1 - (step - compute) / comm = %.0f%% of the communication "
                       "hidden behind backward%s\n", overlap_pct,
                       overlap ? "" : " (--no-overlap: expect ~0%)");
                for (int r = 0; overlap && world->thread && r < N; r++) {
                    const double *v = all + (size_t)r * R_NFIELDS;
                    printf("  rank %d communication thread: %.1f ms per step in all-reduces, of "
                           "which %.1f ms on a core (the rest waiting for the peer or a core); "
                           "alone: %.1f ms, %.1f ms on a core\n",
                           r, 1e3 * v[R_CT_BUSY], 1e3 * v[R_CT_CPU], 1e3 * v[R_CAL_BUSY],
                           1e3 * v[R_CAL_CPU]);
                }
                long cores = sysconf(_SC_NPROCESSORS_ONLN);
                if (cores > 0 && N > cores)
                    printf("  (%d ranks share %ld cores: each rank's times include waiting for a "
                           "core, so this figure means little; use at most one rank per core)\n",
                           N, cores);
                else if (overlap_pct < -10 || overlap_pct > 110)
                    printf("  (outside 0..100%%: the timing noise of this machine is larger than "
                           "the communication; try more --overlap-steps, more --steps, or a wider "
                           "model)\n");
            }
            char b1[32];
            if (bf16)
                printf("\nEvery rank holds the full model state: bf16 params + grads (2 + 2 B) + "
                       "fp32 master (4 B) + Adam m, v (4 + 4 B) = 16 B x %zu = %s per rank", n,
                       mem_format(b1, sizeof b1, 16.0 * (double)n));
            else
                printf("\nEvery rank holds the full model state: params + grads + Adam m, v = "
                       "16 B x %zu = %s per rank", n, mem_format(b1, sizeof b1, 16.0 * (double)n));
            printf("%s\n", overlap && f->pack_buckets
                               ? (bf16 ? ", plus the bucket buffers (2 B/param)"
                                       : ", plus the bucket buffers (4 B/param)")
                               : "");
        }
    }

    if (rank == 0 && args->dump) {
        RunResults out;
        results_init(&out, end, n);
        memcpy(out.losses, losses, (size_t)end * sizeof(float));
        memcpy(out.params, host_params, n * sizeof(float));
        results_set(&out, "world_size", N);
        results_set(&out, "bytes_sent_per_step", sent_step);
        results_set(&out, "bytes_recv_per_step", recv_step);
        results_set(&out, "grad_bytes_sent_per_step", grad_sent_step);
        results_set(&out, "bytes_sent_broadcast", bcast_sent);
        results_set(&out, "bytes_recv_broadcast", bcast_recv);
        results_set(&out, "buckets", overlap ? ddp.nbuckets : 0);
        for (int b = 0; overlap && b < ddp.nbuckets && b < 16; b++) {
            char key[48];
            snprintf(key, sizeof key, "bucket_bytes_%d", b);
            results_set(&out, key, (double)(ddp.buckets[b].numel * e));
        }
        results_set(&out, "replica_max_diff", replica_diff);
        results_set(&out, "nosync_checks", nosync_checks);
        results_set(&out, "nosync_differ", nosync_differ);
        results_set(&out, "sync_checks", sync_checks);
        results_set(&out, "sync_agree", sync_agree);
        results_set(&out, "overlap_pct", overlap_pct);
        results_set_memory(&out);
        results_write(args->dump, &out);
        results_free(&out);
    }

    free(all);
    free(t_comp_only);
    free(t_comm_only);
    free(t_train);
    free(host_params);
    free(losses);
    free(plist);
    if (overlap) ddp_free(&ddp);
    dist_comm_thread_stop(world);
    data_free(&data);
    train_master_free(&model, master);  // (before gpt2_free: in fp32 it is the parameters)
    gpt2_free(&model);
    mem_free(opt_m);
    mem_free(opt_v);
    mem_free(inputs);
    mem_free(targets);
}
