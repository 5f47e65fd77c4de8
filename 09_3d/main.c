// 09_3d: DP x TP x PP together (Megatron-LM's 3D parallelism; Narayanan et al. 2021).
//
//   make 09_3d && mpirun -np 8 ./09_3d/run --tp 2 --pp 2          (dp = 8 / (2·2) = 2)
//
// The world is a grid (grid3d.h): TP fastest, then DP, then PP. Rank (t, d, p) holds the TP
// slice t (chapter 07's heads, hidden units, vocabulary rows) of pipeline stage p (chapter 08's
// consecutive blocks; with --chunks v, v chunks of them) and trains replica d's rows of the
// batch (chapter 03's DP). One step:
//   - the pipeline table of 08 (common/schedule.h) for stage p runs over the PP group: F of a
//     micro-batch receives the stage's input from p-1 (or embeds the tokens), runs its TP
//     blocks (each with its g all-reduces in the TP group) and sends the output to p+1; B
//     receives the gradient of the output (or starts from the vocab-parallel loss), runs the
//     blocks' backward (the f all-reduces) and sends the gradient of its input to p-1;
//   - every micro-batch's loss counts 1/m, each replica's 1/dp: the gradient of the mean;
//   - DP: the gradients of every stage are averaged over its DP group (ranks with the same t, p);
//   - the tied wte: the first stage's slice and the last stage's copy sum their gradients over
//     the PP group, so both copies stay equal;
//   - clipping: the global norm over all three dimensions (grid_clip_norm_sq): the slices summed
//     over TP, the replicated tensors counted once, the stages summed over PP, nothing over DP;
//   - AdamW on every rank's flat buffer.
// With dp = tp = pp = 1 and one micro-batch this is chapter 00's single-device step.
// The same step runs on --device cuda and in --dtype bf16: the loop reaches the stages' buffers
// only through common/tp_model.h (bf16: bf16 weights, gradients and stored activations around
// an fp32 master; DP averages and PP sends bf16; see README "On CUDA and in bf16").
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "grid3d.h"
#include "mem.h"
#include "optim.h"
#include "pipe_exec.h"
#include "results.h"
#include "schedule.h"
#include "session.h"
#include "shard.h"
#include "tp.h"
#include "tp_model.h"
#include "trace.h"

static const char *USAGE =
    "09_3d: DP x TP x PP. The ranks form a grid, TP fastest (inside a node), then DP, then PP;\n"
    "each rank holds one TP slice of one pipeline stage of one data-parallel replica.\n"
    "\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2            2 x 2 x 2: every dimension at once\n"
    "                                                     (dp inferred: 8 / (2·2))\n"
    "  mpirun -np 8 ./09_3d/run --tp 1 --pp 4            DP 2 x PP 4: 1F1B across 4 stages\n"
    "  mpirun -np 8 ./09_3d/run --tp 4 --pp 2 --schedule interleaved --chunks 2 --micro-batches 2\n"
    "                                                     TP 4 inside each of 2 stages, 2 chunks\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --zero 1    ZeRO-1 over DP: Adam's m, v sharded\n"
    "                                                     over the 2 replicas (chapter 05)\n"
    "  mpirun -np 8 ./09_3d/run --tp 8 --pp 1 --heads 8   TP alone (chapter 07)\n"
    "  mpirun -np 1 ./09_3d/run                           one rank: chapter 00's training\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --dtype bf16\n"
    "                                                     mixed precision: bf16 weights, gradients and\n"
    "                                                     stored activations, fp32 master and Adam\n"
    "  mpirun -np 4 ./09_3d/run --tp 2 --pp 2 --device cuda\n"
    "                                                     on a GPU (the MPI backend stages device\n"
    "                                                     buffers: ranks may share one GPU; --backend\n"
    "                                                     nccl: one GPU per rank)\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --stop-at 10 --save s.bin, then\n"
    "  mpirun -np 4 ./09_3d/run --tp 4 --resume s.bin     a checkpoint of any layout resumes\n"
    "                                                     under any other, in either precision\n"
    "                                                     (the lab's state format: the fp32 master)\n"
    "\n"
    "It prints the grid (which rank is which coordinate and in which groups), the schedule, and\n"
    "after training each dimension's bytes per step against its formula and the memory per rank.\n"
    "Needs: dp x tp x pp = ranks, tp dividing --heads, pp x chunks dividing --layers, --batch\n"
    "divisible by dp x micro-batches.\n";

typedef struct Flags3d {
    int tp, pp, dp;        // dp 0: world / (tp·pp)
    const char *schedule;
    int m, v;              // micro-batches per step (per replica), chunks per rank
    int zero;              // 1: ZeRO-1 over DP (optimizer state sharded over the replicas)
} Flags3d;

// One chunk of layers on this rank: its TP stage, the optimizer's state of it and the
// micro-batches in flight on it.
typedef struct Chunk {
    TpStage st;
    TpOpt o;               // [0, n), or under --zero 1 this replica's piece [lo, hi)
    void *zgrad;           // --zero 1: (hi - lo) the piece's averaged gradient, in the stage's
                           // storage precision (tpm_stage_dist_dtype), on its device
    int vs;                // virtual stage chunk·pp + p
    TpStageActs **acts;    // (m) NULL when micro-batch i is not in flight on this chunk
} Chunk;

// ---------------------------------------------------------------------------------------------
// the stage's work: what F and B compute on a TP chunk; the executor (common/pipe_exec.h, 08's)
// runs this rank's table over them, with the sends along the PP group

typedef struct Stage {
    Chunk *ch;
    TpComm *comm;
    const DataSource *data;
    int step, B, Bm, T, row0;
    int *inputs, *targets;
    float dloss;           // every micro-batch's loss counts 1/m: 1 / (Bm·T·m)
    size_t BTC;
} Stage;

// micro-batch mb: rows [row0 + mb·Bm, +Bm) of the step's global batch (this replica's)
static void stage_batch(Stage *w, int mb) {
    data_batch(w->data, (uint64_t)w->step, w->B, w->T, w->row0 + mb * w->Bm, w->Bm, w->inputs,
               w->targets);
}

static float *stage_f_begin(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    Chunk *c = &w->ch[chunk];
    stage_batch(w, mb);
    TpStageActs *a = lab_xcalloc(1, sizeof(TpStageActs));
    tpm_stage_acts_alloc(a, &c->st);
    c->acts[mb] = a;
    return a->in;
}

static float stage_forward(void *ctx, int chunk, int mb, float *out) {
    Stage *w = ctx;
    TpStage *st = &w->ch[chunk].st;
    TpStageActs *a = w->ch[chunk].acts[mb];
    float loss = tpm_stage_forward(st, w->comm, a, w->inputs, w->targets);
    if (out) mem_copy(out, tpm_stage_output(st, a), w->BTC * sizeof(float));
    return st->has_head ? loss : 0.0f;
}

static float *stage_b_begin(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    stage_batch(w, mb);
    return w->ch[chunk].acts[mb]->dx;
}

static void stage_backward(void *ctx, int chunk, int mb, float *din) {
    Stage *w = ctx;
    TpStage *st = &w->ch[chunk].st;
    TpStageActs *a = w->ch[chunk].acts[mb];
    tpm_stage_backward(st, w->comm, a, w->inputs, w->targets, w->dloss);
    if (din) mem_copy(din, a->dx, w->BTC * sizeof(float));
    tpm_stage_acts_free(a, st);
    free(a);
    w->ch[chunk].acts[mb] = NULL;
}

// The tied wte: the first chunk's slice (embedding lookups) and the last chunk's copy (output
// layer) sum their gradients over the PP group (the same TP slice t on both ends), in the
// gradients' storage precision (bf16: half the bytes, like 08): common/pipe_exec's
// pipe_sum_tied.
static void sync_tied_wte(Chunk *ch, int v, int p, int pp, DistGroup *ppg) {
    TpStage *first = p == 0 ? &ch[0].st : NULL, *last = p == pp - 1 ? &ch[v - 1].st : NULL;
    if (first && first == last) return;  // one stage holds both uses: one buffer
    if (!first && !last) return;
    const TpStage *any = first ? first : last;
    const size_t n = (size_t)any->tv.Vl * any->cfg.C;
    pipe_sum_tied(tpm_stage_wte_grad(first ? first : last), first && last ? tpm_stage_wte_grad(last) : NULL,
                  first ? pp - 1 : 0, n, tpm_stage_dist_dtype(any), ppg);
}

// ---------------------------------------------------------------------------------------------
// layouts are views of one model: the state gathered whole, and a whole state sliced

enum { WHOLE_WEIGHTS, WHOLE_MASTER, WHOLE_ADAM_M, WHOLE_ADAM_V };

// The whole model's WHOLE_WEIGHTS (what the forward reads: fp32 params, bf16 params_bf16
// widened: the --dump), WHOLE_MASTER (the fp32 weights AdamW updates: fp32 params, bf16 the
// master: TpOpt's), Adam m or v, memory order, summed onto world rank 0's `full` (NULL elsewhere):
// replica 0's ranks write their slices (the replicated tensors from TP rank 0) into zeroed
// buffers (x + 0 == x: exact). --zero 1: m and v (and bf16's master) exist for this replica's
// piece only: they are first all-gathered over DP into the stage's layout. Collective.
static void gather_full(Chunk *ch, int v, const Grid *g, int zero, int which, float *full) {
    const size_t n = gpt2_param_count(&ch[0].st.cfg);
    float *mine = lab_xcalloc(n, sizeof(float));
    for (int c = 0; c < v; c++) {
        TpStage *st = &ch[c].st;
        if (which == WHOLE_WEIGHTS) {
            if (g->c.d == 0) tpm_unshard_weights(st, mine, g->c.t == 0);
            continue;
        }
        const TpOpt *o = &ch[c].o;
        const float *buf = which == WHOLE_MASTER ? o->master : which == WHOLE_ADAM_M ? o->m : o->v;
        float *whole = NULL;
        if (zero && (which != WHOLE_MASTER || st->dtype == GPT2_BF16)) {  // (fp32: the weights, whole)
            whole = mem_alloc(st->n * sizeof(float), MEM_OTHER, st->dev);
            dist_all_gather_n(buf, whole, st->n, DIST_F32, g->dpg);
            buf = whole;
        }
        if (g->c.d == 0) tpm_unshard(st, buf, mine, g->c.t == 0);
        mem_free(whole);
    }
    dist_reduce(mine, full, n, DIST_F32, DIST_SUM, 0, dist_world());
    free(mine);
}

// --save: the training state in the lab's format (common/ckpt.h: what 00, 03 and 05 write), the
// same file whatever the layout; bf16 saves the fp32 master (as 00 and 03 do), so a state
// resumes across layouts and precisions. Collective.
static void save_state(const LabArgs *a, Chunk *ch, int v, const Grid *g, int zero, int step) {
    const GPT2Config cfg = ch[0].st.cfg;
    const size_t n = gpt2_param_count(&cfg);
    float *full[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (g->rank == 0) full[i] = lab_xcalloc(n, sizeof(float));
        gather_full(ch, v, g, zero, WHOLE_MASTER + i, full[i]);
    }
    if (g->rank == 0)
        ckpt_save_training(a->save, &cfg, step, (uint64_t)a->seed, (uint64_t)a->data_seed, full[0],
                           full[1], full[2], n);
    for (int i = 0; i < 3; i++) free(full[i]);
}

// --resume (the state of any layout, or of chapter 00) / --load-weights: every rank reads the
// whole file and keeps its slices (--zero 1: of m, v and bf16's master, its piece): into the
// master, then bf16 rounds it into the weights the forward reads (--zero 1: each replica its
// piece, all-gathered over DP). Returns the step to start at. Collective over DP.
static int load_state(const LabArgs *a, Chunk *ch, int v, int zero, DistGroup *dpg) {
    const GPT2Config cfg = ch[0].st.cfg;
    const size_t n = gpt2_param_count(&cfg);
    float *fp = lab_xcalloc(n, sizeof(float)), *fm = lab_xcalloc(n, sizeof(float)),
          *fv = lab_xcalloc(n, sizeof(float));
    int start = 0;
    if (a->resume) start = ckpt_resume_training(a->resume, &cfg, fp, fm, fv, n);
    else ckpt_load_weights_into(a->load_weights, &cfg, fp, n);
    for (int c = 0; c < v; c++) {
        TpStage *st = &ch[c].st;
        const TpOpt *o = &ch[c].o;
        float *whole = lab_xmalloc(st->n * sizeof(float));
        const size_t lo = o->lo, count = o->hi - o->lo;
        // the master: fp32 the whole weights; bf16 the optimizer's range (--zero 1: the piece)
        tpm_shard(st, fp, whole);
        if (st->dtype == GPT2_BF16) {  // (fp32: the master is what the forward reads)
            mem_copy(o->master, whole + lo, count * sizeof(float));
            tpm_stage_set_weights(st, o);
            if (zero) dist_all_gather_n(st->params_bf16 + lo, st->params_bf16, st->n, DIST_BF16, dpg);
        } else {
            mem_copy(st->params, whole, st->n * sizeof(float));
        }
        if (!a->resume) {
            free(whole);
            continue;
        }
        tpm_shard(st, fm, whole);
        mem_copy(o->m, whole + lo, count * sizeof(float));
        tpm_shard(st, fv, whole);
        mem_copy(o->v, whole + lo, count * sizeof(float));
        free(whole);
    }
    free(fp), free(fm), free(fv);
    return start;
}

// ---------------------------------------------------------------------------------------------
// training

static void train(const LabArgs *args, const Flags3d *f) {
    const int world = dist_size(), rank = dist_rank();
    const GPT2Config cfg = lab_args_config(args);
    const int L = cfg.L, T = cfg.T, B = args->batch, v = f->v, m = f->m;
    const int tp = f->tp, pp = f->pp;
    int dp = f->dp;
    // Where and in which precision the TP stages live (common/tp_model.h's top: bf16 stores the
    // weights, gradients and the blocks' saved activations in bf16, the master and Adam in fp32,
    // and computes every piece in fp32). The MPI backend takes device buffers (staged through
    // the host, so several ranks can share one GPU); NCCL moves every op 09 issues on device
    // buffers (one GPU per rank).
    const Device dev = lab_args_device(args);
    const GPT2Dtype dtype = strcmp(args->dtype, "bf16") == 0 ? GPT2_BF16 : GPT2_FP32;
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);  // (flags.c: cuda only)
    // 1. The grid: one clear refusal of an impossible layout, on every rank.
    grid_check(world, &dp, tp, pp, v, cfg.NH, L);
    if (strcmp(f->schedule, "interleaved") != 0 && v != 1)
        lab_fail_collective("--chunks %d needs --schedule interleaved (the other schedules run one "
                            "chunk per rank)", v);
    if (B % (dp * m) != 0)
        lab_fail_collective("--batch %d does not split into %d replicas x %d micro-batches; use a "
                            "multiple of %d", B, dp, m, dp * m);
    Schedule s;
    sched_make(&s, f->schedule, pp, v, m);
    char err[256];
    if (sched_check(&s, err, sizeof err) != 0) lab_fail_collective("schedule %s: %s", s.name, err);
    LAB_CHECK(!s.split, "09_3d: the zb schedule (split backward) is not wired to TP stages");

    Grid grid;
    grid_init(&grid, tp, dp, pp);
    const int p = grid.c.p, S = pp * v, per = L / S;
    int row0, Bl;  // this replica's rows of the global batch
    data_slice(B, grid.c.d, dp, &row0, &Bl);
    const int Bm = Bl / m;

    // 2. This rank's chunks: TP slice t of virtual stages chunk·pp + p.
    Chunk *ch = lab_xcalloc((size_t)v, sizeof(Chunk));
    for (int c = 0; c < v; c++) {
        ch[c].vs = c * pp + p;
        tpm_stage_build_opts(&ch[c].st, cfg, tp, grid.c.t, ch[c].vs * per, (ch[c].vs + 1) * per,
                             Bm, T, (uint64_t)args->seed, (TpOpts){.dev = dev, .dtype = dtype});
        ch[c].acts = lab_xcalloc((size_t)m, sizeof(TpStageActs *));
    }
    // The optimizer's state of each chunk: the whole flat buffer, or under --zero 1 this replica's
    // piece of it (shard_range over DP): Adam's m and v (and bf16's fp32 master: 05's bf16
    // ZeRO-1) exist for the piece only, and the piece's averaged gradient has a buffer of its
    // own, in the gradients' precision.
    for (int c = 0; c < v; c++) {
        TpStage *st = &ch[c].st;
        size_t lo = 0, count = st->n;
        if (f->zero) {
            shard_range(st->n, dp, grid.c.d, &lo, &count);
            ch[c].zgrad = mem_alloc(count * dist_dtype_size(tpm_stage_dist_dtype(st)), MEM_GRADS, dev);
        }
        tpm_opt_alloc(&ch[c].o, st, (uint64_t)args->seed, lo, lo + count);
    }
    const int start = args->resume || args->load_weights ? load_state(args, ch, v, f->zero, grid.dpg) : 0;
    if (!args->quiet && rank == 0 && args->resume) printf("resumed from %s at step %d\n", args->resume, start);
    mem_reset_peaks();  // the figures: from here on
    TpComm comm = tp_comm_group(grid.tpg);
    const AdamW opt = lab_args_adamw(args);
    DataSource data;
    lab_args_data(args, &data);
    // the batch stays on the host on every device (tp_model copies it in on CUDA)
    int *inputs = mem_alloc((size_t)Bm * T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)Bm * T * sizeof(int), MEM_OTHER, DEV_CPU);
    Stage work = {.ch = ch, .comm = &comm, .data = &data, .B = B, .Bm = Bm, .T = T, .row0 = row0,
                  .inputs = inputs, .targets = targets,
                  .dloss = 1.0f / ((float)Bm * (float)T * (float)m), .BTC = (size_t)Bm * T * cfg.C};
    // bf16: the stage boundary messages travel as bf16 (08's executor): the activation is a
    // stored bf16 layer already (no loss), the gradient is rounded once per boundary
    PipeExec x;
    pipe_exec_init(&x, &s,
                   (PipeWork){&work, stage_f_begin, stage_forward, stage_b_begin, stage_backward, NULL},
                   grid.ppg, p, work.BTC, dtype == GPT2_BF16, ch[0].st.k, dev);

    if (!args->quiet) grid_print(stdout, &grid);
    if (!args->quiet && rank == 0) {
        printf("\nGPT-2 V=%d T=%d L=%d C=%d NH=%d; %d stage%s x %d chunk%s of %d block%s; TP %d "
               "(%d heads per rank); batch %d = %d replica%s x %d micro-batch%s x %d\n", cfg.V, T,
               L, cfg.C, cfg.NH, pp, pp > 1 ? "s" : "", v, v > 1 ? "s" : "", per, per > 1 ? "s" : "",
               tp, cfg.NH / tp, B, dp, dp > 1 ? "s" : "", m, m > 1 ? "es" : "", Bm);
        SimResult sim;
        static const SchedTimes unit = {1.0, 1.0, 1.0, 0.0, 0.0, 0.0};
        if (sched_simulate(&s, &unit, &sim) == 0) {
            printf("schedule %s over the stages (simulated, tf = tb):\n", s.name);
            sched_print(stdout, &s, sim.start, sim.end, unit.tf / v / 2.0, 120);
        }
        sim_free(&sim);
        printf("\n");
    }

    float *losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    const int end = lab_args_end_step(args);
    trace_init(args->trace);
    dist_counters_reset();
    dist_group_counters_reset(grid.tpg);
    dist_group_counters_reset(grid.dpg);
    dist_group_counters_reset(grid.ppg);
    double t0 = lab_now(), t_last = t0;
    // the fault hook (--kill-rank, --kill-step) is the Session's, as in 08; it reads only these
    Session hooks = {.args = args, .rank = rank, .start = start};
    for (int step = start; step < end; step++) {
        session_step_begin(&hooks, step);
        for (int c = 0; c < v; c++) tpm_stage_zero_grad(&ch[c].st);
        // 3. The pipeline table: forwards and backwards of the m micro-batches (TP inside).
        work.step = step;
        double loss_sum = pipe_exec_step(&x);
        if (step == args->inject_nan_step && rank == world - 1) tpm_stage_poison_grad(&ch[0].st);
        // 4. The tied wte's two copies: their gradients summed across the pipeline.
        sync_tied_wte(ch, v, p, pp, grid.ppg);
        // 5. DP: average every stage's gradients over the replicas holding the same slice
        //    (--zero 1: reduce-scatter, each replica keeps the average of its piece only).
        int tok = trace_begin(f->zero ? "dp reduce-scatter" : "dp all-reduce", TRACE_COMM);
        for (int c = 0; c < v; c++) {
            TpStage *st = &ch[c].st;
            void *g = tpm_stage_grad_buf(st);
            const DistDtype dt = tpm_stage_dist_dtype(st);  // bf16: half the bytes, as 03
            if (f->zero) dist_reduce_scatter_n(g, ch[c].zgrad, st->n, dt, DIST_AVG, grid.dpg);
            else if (dp > 1) dist_all_reduce(g, g, st->n, dt, DIST_AVG, grid.dpg);
        }
        trace_end(tok);
        // 6. The global norm over TP x PP (replicated tensors once; --zero 1: over the pieces,
        //    summed over DP too), then AdamW on what this rank updates.
        double sq[2] = {0, 0};
        for (int c = 0; c < v; c++) {
            double part[2];
            if (f->zero) tpm_stage_norm_parts_range(&ch[c].st, ch[c].o.lo, ch[c].o.hi, ch[c].zgrad, part);
            else tpm_stage_norm_parts(&ch[c].st, part);
            sq[0] += part[0], sq[1] += part[1];
        }
        if (f->zero) dist_all_reduce(sq, sq, 2, DIST_F64, DIST_SUM, grid.dpg);  // disjoint pieces
        float scale = adamw_clip_scale(&opt, grid_clip_norm_sq(&grid, sq), step);
        for (int c = 0; c < v; c++) {
            TpStage *st = &ch[c].st;
            if (!f->zero) {
                tpm_stage_adamw(st, &opt, step, &ch[c].o, tpm_stage_grad_buf(st), scale);
                continue;
            }
            // ZeRO-1: AdamW on my piece (m, v exist for it only), then every replica's updated
            // piece all-gathered into the whole stage's weights, in place: fp32 the weights
            // themselves, bf16 the bf16 weights the forward reads (half the bytes; the master
            // exists for the piece only)
            const size_t lo = ch[c].o.lo;
            tpm_stage_adamw(st, &opt, step, &ch[c].o, ch[c].zgrad, scale);
            tok = trace_begin("dp all-gather", TRACE_COMM);
            if (st->dtype == GPT2_BF16)
                dist_all_gather_n(st->params_bf16 + lo, st->params_bf16, st->n, DIST_BF16, grid.dpg);
            else
                dist_all_gather_n(st->params + lo, st->params, st->n, DIST_F32, grid.dpg);
            trace_end(tok);
        }
        // 7. The step's loss: the last stage's mean over micro-batches, over replicas, to rank 0.
        float loss = (float)(loss_sum / m);
        dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, grid.dpg);
        dist_broadcast(&loss, 1, DIST_F32, pp - 1, grid.ppg);
        losses[step] = loss;
        double now = lab_now();
        if (!args->quiet && rank == 0 && args->log_every > 0 &&
            (step % args->log_every == 0 || step == end - 1))
            printf("step %5d/%d  loss %.4f  lr %.2e  %8.0f tok/s\n", step + 1, args->steps, loss,
                   adamw_lr(&opt, step), (double)B * T / (now - t_last));
        t_last = now;
        if (args->save && args->save_every > 0 && (step + 1) % args->save_every == 0 && step < end - 1)
            save_state(args, ch, v, &grid, f->zero, step + 1);
    }
    if (args->save) {
        save_state(args, ch, v, &grid, f->zero, end);
        if (!args->quiet && rank == 0) printf("saved training state (step %d) to %s\n", end, args->save);
    }
    trace_finish();

    // 8. The report: each dimension's bytes per step (this rank's groups), memory per rank.
    const double nsteps = end > start ? end - start : 1;
    double formula[3];
    // the formula: chapter 00's calculator for this layout (calc_rank_comm, 00_memory_budget/
    // comm.c), from the shapes alone: TP 4 all-reduces of (Bm·T, C) per block per micro-batch,
    // 1 for the embedding, 1 + 3 of (Bm·T) for the head and loss, 1 double for the norm; DP
    // every chunk's gradients and the loss (--zero 1: the ring reduce-scatter and all-gather,
    // the norm's parts); PP an activation forward and a gradient back per micro-batch and
    // boundary, the tied wte's gradient, the norm, the loss
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    const CalcSetup cs = calc_setup_lab(dp, tp, pp, v, m, B, T, f->zero,
                                        dtype == GPT2_BF16 ? CALC_BF16 : CALC_FP32);
    const CalcComm k = calc_rank_comm(&cm, &cs, grid.c.p, grid.c.d);
    formula[0] = k.tp.step_bytes, formula[1] = k.dp.step_bytes, formula[2] = k.pp.step_bytes;
    double mine[12] = {(double)dist_group_bytes_sent(grid.tpg) / nsteps,
                      (double)dist_group_bytes_sent(grid.dpg) / nsteps,
                      (double)dist_group_bytes_sent(grid.ppg) / nsteps,
                      (double)mem_peak(MEM_PARAMS), (double)x.acts_peak, (double)mem_peak(MEM_OPT_M),
                      (double)grid.c.t + 100.0 * grid.c.d + 10000.0 * grid.c.p,
                      (double)(ch[0].st.l0 + 100 * ch[v - 1].st.l1), formula[0], formula[1],
                      formula[2], (double)mem_peak(MEM_MASTER)};
    double *all = rank == 0 ? lab_xcalloc((size_t)world * 12, sizeof(double)) : NULL;
    dist_gather(mine, all, 12, DIST_F64, 0, dist_world());
    if (!args->quiet && rank == 0) {
        printf("\n  %-5s %-9s %-8s %21s %21s %21s %11s %11s %11s\n", "rank", "(t,d,p)", "blocks",
               "TP sent/step (formula)", "DP sent/step (formula)", "PP sent/step (formula)",
               "weights", "master", "acts peak");
        for (int r = 0; r < world; r++) {
            const double *a = all + (size_t)r * 12;
            char b[8][32], co[24], blk[16], col[3][48];
            for (int i = 0; i < 3; i++)
                snprintf(col[i], sizeof col[i], "%s (%s%s)", mem_format(b[i], 32, a[i]),
                         a[i] == a[8 + i] ? "=" : "", mem_format(b[5 + i], 32, a[8 + i]));
            int c = (int)a[6];
            snprintf(co, sizeof co, "(%d,%d,%d)", c % 100, (c / 100) % 100, c / 10000);
            snprintf(blk, sizeof blk, "[%d,%d)", (int)a[7] % 100, (int)a[7] / 100);
            char mb[32];
            printf("  %-5d %-9s %-8s %21s %21s %21s %11s %11s %11s\n", r, co, v > 1 ? "chunks" : blk,
                   col[0], col[1], col[2], mem_format(b[3], 32, a[3]),
                   a[11] > 0 ? mem_format(mb, sizeof mb, a[11]) : "-", mem_format(b[4], 32, a[4]));
        }
        printf("  sent/step: bytes this rank sent in its TP, DP and PP group per step (dist's "
               "counters); '=' when equal to the formula to the byte\n");
        if (dtype == GPT2_BF16)
            printf("  bf16: weights 2 B and master 4 B per element, the blocks' saved activations "
                   "2 B; TP reduces fp32, DP and PP carry bf16\n  gradients and activations (the "
                   "loss and norms stay fp32): the formula is chapter 00's with dtype bf16, tp_fp32\n");
    }

    // 9. --dump: the full model's weights in llm.c's order on world rank 0: replica 0's ranks
    //    write their slices (the replicated tensors from TP rank 0) into zeroed buffers, summed.
    if (args->dump || args->save_weights) {
        const size_t n = gpt2_param_count(&cfg);
        float *sum = rank == 0 ? lab_xcalloc(n, sizeof(float)) : NULL;
        gather_full(ch, v, &grid, f->zero, WHOLE_WEIGHTS, sum);
        if (rank == 0 && args->save_weights) {
            float *llmc = lab_xmalloc(n * sizeof(float));
            gpt2_to_llmc(&cfg, sum, llmc);
            ckpt_save_weights(args->save_weights, &cfg, llmc);
            free(llmc);
        }
        if (rank == 0 && args->dump) {
            RunResults out;
            results_init(&out, end, n);
            memcpy(out.losses, losses, (size_t)end * sizeof(float));
            gpt2_to_llmc(&cfg, sum, out.params);
            for (int r = 0; r < world && r < 8; r++) {
                const double *a = all + (size_t)r * 12;
                static const char *keys[12] = {"tp_sent", "dp_sent", "pp_sent", "mem_params",
                                               "acts_peak", "mem_opt_m", "coord", "blocks", NULL,
                                               NULL, NULL, "mem_master"};
                for (int k = 0; k < 12; k++) {
                    if (!keys[k] || k == 7) continue;  // (results hold 64 figures: 8 per rank)
                    char key[32];
                    snprintf(key, sizeof key, "%s_r%d", keys[k], r);
                    results_set(&out, key, a[k]);
                }
            }
            results_write(args->dump, &out);
            results_free(&out);
        }
        free(sum);
    }
    free(all), free(losses);
    pipe_exec_free(&x);
    mem_free(inputs), mem_free(targets);
    data_free(&data);
    for (int c = 0; c < v; c++) {
        tpm_opt_free(&ch[c].o, &ch[c].st);
        tpm_stage_free(&ch[c].st), free(ch[c].acts), mem_free(ch[c].zgrad);
    }
    free(ch);
    grid_free(&grid);
    sched_free(&s);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    Flags3d f = {.tp = 1, .pp = 1, .dp = 0, .schedule = "1f1b", .m = 2, .v = 1};
    FlagSpec extra[] = {
        {"--tp", FLAG_INT, &f.tp, 1, 1 << 20, NULL,
         "tensor-parallel degree: ranks per TP group (consecutive ranks); must divide --heads"},
        {"--pp", FLAG_INT, &f.pp, 1, SCHED_MAX_STAGES, NULL,
         "pipeline stages; pp x chunks must divide --layers"},
        {"--dp", FLAG_INT, &f.dp, 0, 1 << 20, NULL,
         "data-parallel replicas (0: ranks / (tp x pp)); dp x tp x pp must equal the ranks"},
        {"--schedule", FLAG_CHOICE, &f.schedule, 0, 0, "gpipe|1f1b|interleaved",
         "the pipeline schedule (08's tables)"},
        {"--micro-batches", FLAG_INT, &f.m, 1, 10000, NULL,
         "m: micro-batches per step per replica (dp x m must divide --batch)"},
        {"--chunks", FLAG_INT, &f.v, 1, 64, NULL, "v: chunks of layers per stage (interleaved)"},
        {"--zero", FLAG_INT, &f.zero, 0, 1, NULL,
         "1: ZeRO-1 over DP (reduce-scatter the gradients, AdamW on this replica's piece with m, v "
         "for it only, all-gather the weights); 0: DDP's all-reduce"},
    };
    lab_parse_args_for(LAB_FLAGS_MODEL | LAB_FLAGS_TRAINING | LAB_FLAGS_HARDWARE | LAB_FLAGS_OUTPUT |
                           LAB_FLAGS_RELIABILITY | LAB_FLAGS_KILL,
                       argc, argv, &args,
                       extra, (int)(sizeof extra / sizeof extra[0]), "09_3d/run", USAGE);
    train(&args, &f);
    dist_finalize();
    return 0;
}
