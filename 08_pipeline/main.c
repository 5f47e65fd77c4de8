// 08_pipeline: pipeline parallelism. The model is cut by layers; each rank holds one stage
// (or v chunks of layers, --chunks v), micro-batches flow forward through the stages and their
// gradients flow back, point to point.
//
//   make 08_pipeline && mpirun -np 4 ./08_pipeline/run --schedule 1f1b --micro-batches 8
//
// One step:
//   - the schedule is a TABLE (schedule.c): for this rank, the ordered list of F(micro-batch,
//     chunk), B and W ops. The executor (common/pipe_exec.h) runs it over this stage's work
//     (Stage, below): F receives the stage's input (or embeds
//     the tokens), runs its blocks, sends its output on; B receives the gradient of the output
//     (or starts from the loss), runs backward, sends the gradient of its input back; W (the
//     zero-bubble schedule only) computes the weight gradients later, in what would be idle time.
//     Each micro-batch in flight has its own activation set (GPT2Acts), freed after its B (W);
//   - every micro-batch's loss counts 1/m: the gradient is that of the mean over the batch;
//   - the tied wte: the first stage's embedding and the last stage's output layer each hold a
//     copy; their gradients are summed between the two before the step, so both copies stay equal;
//   - clipping uses the GLOBAL gradient norm (the squares summed over stages, wte counted once),
//     and a NaN anywhere stops every rank; then each stage steps its own weights with AdamW.
// On one rank with one micro-batch this is chapter 00's single-device step, op for op.
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "kernels.h"
#include "mem.h"
#include "mem_predict.h"
#include "optim.h"
#include "pipe_exec.h"
#include "pipe_report.h"
#include "schedule.h"
#include "session.h"
#include "train.h"
#include "whole.h"

static const char *USAGE =
    "08_pipeline: pipeline parallelism. Each rank holds a stage of consecutive blocks; the batch\n"
    "is cut into micro-batches that flow through the stages; a schedule (a table of forward,\n"
    "backward and weight-gradient ops per stage) decides who computes what when.\n"
    "\n"
    "  mpirun -np 4 ./08_pipeline/run --schedule gpipe --micro-batches 8   all forwards, then all\n"
    "                                                     backwards: m activation sets alive\n"
    "  mpirun -np 4 ./08_pipeline/run --schedule 1f1b --micro-batches 8    one forward, one\n"
    "                                                     backward: at most p-r sets on stage r\n"
    "  mpirun -np 2 ./08_pipeline/run --schedule interleaved --chunks 2 --micro-batches 4\n"
    "                                                     v chunks of layers per rank: a smaller bubble\n"
    "  mpirun -np 4 ./08_pipeline/run --schedule zb --micro-batches 8      ZB-H1: backward split\n"
    "                                                     into B and W, W fills the bubbles\n"
    "  mpirun -np 4 ./08_pipeline/run --schedule zb --micro-batches 8 --max-w-stores 2\n"
    "                                                     ... at most 2 deferred W's (W stores)\n"
    "                                                     waiting per stage: fewer bytes, more bubble\n"
    "  ./08_pipeline/run --compare --stages 4 --micro-batches 8   the four schedules side by side\n"
    "                                                     (simulated; no training, one process)\n"
    "The picture: one row per stage, time to the right; F3 = forward of micro-batch 3, B3 its\n"
    "backward, W3 its weight gradients (lower case: chunk 1 of interleaved), '.' = idle (bubble).\n"
    "Needs: --layers divisible by ranks x chunks, --batch divisible by --micro-batches.\n"
    "After training: per stage its time in F, B, W and its idle share, measured and simulated\n"
    "from those times; then the busiest stage's idle share (the schedule's bubble, what the\n"
    "theory predicts) apart from the load imbalance between the stages (1 - busy_min/busy_max).\n"
    "\n"
    "  mpirun -np 2 ./08_pipeline/run --stop-at 3 --save pp.ckpt   a checkpoint: the whole model\n"
    "                                                     (weights, Adam m, v) gathered to rank 0\n"
    "  ./00_memory_budget/run --train --resume pp.ckpt    ... in the lab's format: 00 resumes it,\n"
    "                                                     08 resumes 00's (any ranks, chunks)\n"
    "bf16 runs (--dtype bf16) send the stage boundary messages as bf16: half the bytes.\n";

typedef struct PipeFlags {
    const char *schedule;
    int m;          // micro-batches per step
    int v;          // chunks per rank
    int compare;    // print the four schedules simulated, then exit
    int stages;     // --compare: p
    int picture_cols;
    int max_w;      // --schedule zb: at most this many W stores pending per stage (0: no cap)
    GPT2Recompute recompute;  // --recompute (a shared flag): each chunk's sets keep less
} PipeFlags;

// One chunk of layers on this rank: a partial model (gpt2_build_stage), its optimizer state,
// and the activation sets of the micro-batches in flight.
typedef struct Chunk {
    GPT2 model;
    int vs;               // virtual stage: chunk * p + rank
    float *master, *opt_m, *opt_v;
    GPT2Acts **acts;      // (m) NULL when micro-batch i is not in flight on this chunk
} Chunk;

// ---------------------------------------------------------------------------------------------
// the stage's work: what F, B and W compute on a chunk; the executor (common/pipe_exec.h) runs
// the table over them, with the sends and receives

typedef struct Stage {
    Chunk *ch;
    const DataSource *data;
    int step, B, Bm, T, m;
    int *inputs, *targets;
    float dloss;             // every micro-batch's loss counts 1/m: 1 / (Bm·T·m)
    int split;               // ZB-H1: B is the input gradient only, W later
} Stage;

// F: a fresh activation set; micro-batch mb is rows [mb·Bm, (mb+1)·Bm) of the step's batch.
static float *stage_f_begin(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    Chunk *c = &w->ch[chunk];
    GPT2Acts *a = lab_xcalloc(1, sizeof(GPT2Acts));
    gpt2_acts_alloc(a, &c->model, w->Bm, w->T);
    if (w->split) gpt2_acts_alloc_split(a, &c->model);
    c->acts[mb] = a;
    data_batch(w->data, (uint64_t)w->step, w->B, w->T, mb * w->Bm, w->Bm, w->inputs, w->targets);
    return gpt2_acts_input(a);
}

static float stage_forward(void *ctx, int chunk, int mb, float *out) {
    Stage *w = ctx;
    GPT2 *md = &w->ch[chunk].model;
    GPT2Acts *a = w->ch[chunk].acts[mb];
    float loss = gpt2_forward_acts(md, a, w->inputs, md->has_head ? w->targets : NULL);
    if (out) gpt2_acts_output(md, a, out);
    return md->has_head ? loss : 0.0f;
}

static float *stage_b_begin(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    return gpt2_acts_doutput(w->ch[chunk].acts[mb]);
}

static void stage_backward(void *ctx, int chunk, int mb, float *din) {
    Stage *w = ctx;
    GPT2 *md = &w->ch[chunk].model;
    GPT2Acts *a = w->ch[chunk].acts[mb];
    if (!w->split) {
        gpt2_backward_acts(md, a, w->dloss);
    } else {  // B: the input gradient only; the blocks' weight gradients wait for W
        if (md->has_head) gpt2_head_backward_w(md, a, w->dloss, NULL, NULL, NULL, NULL);
        for (int l = md->l1 - 1; l >= md->l0; l--) gpt2_block_backward_input(md, a, l, NULL);
        if (md->has_embed) gpt2_embed_backward_w(md, a, NULL);
    }
    if (din) mem_copy(din, gpt2_acts_dinput(a), (size_t)w->Bm * w->T * md->cfg.C * sizeof(float));
    if (!w->split) {
        gpt2_acts_free(a);
        free(a);
        w->ch[chunk].acts[mb] = NULL;
    } else {
        gpt2_acts_keep_for_w(a, md);  // the set shrinks to what W reads: the head's logits,
    }                                 // attention's T x T... are freed now
}

static void stage_weights(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    GPT2 *md = &w->ch[chunk].model;
    GPT2Acts *a = w->ch[chunk].acts[mb];
    for (int l = md->l1 - 1; l >= md->l0; l--) gpt2_block_backward_weights(md, a, l, NULL);
    gpt2_acts_free(a);
    free(a);
    w->ch[chunk].acts[mb] = NULL;
}

// ---------------------------------------------------------------------------------------------
// gradients across stages

// Element offset of the wte the chunk holds (embedding: 0; the head's copy: wte_offset); -1 if none.
static long wte_of(const GPT2 *m, int want_head) {
    if (want_head) return m->has_head ? (long)m->wte_offset : -1;
    return m->has_embed ? 0 : -1;
}

// The tied embedding: the first chunk's wte gradient (embedding lookups) and the last chunk's
// (output layer) are summed; both holders end with the sum (common/pipe_exec's pipe_sum_tied).
static void sync_tied_wte(Chunk *ch, int v, int rank, int p, DistGroup *g) {
    Chunk *first = rank == 0 ? &ch[0] : NULL, *last = rank == p - 1 ? &ch[v - 1] : NULL;
    if (first && last && first == last) return;  // one model holds both uses: one buffer
    const GPT2 *any = first ? &first->model : last ? &last->model : NULL;
    if (!any) return;
    const size_t n = (size_t)any->cfg.V * any->cfg.C, e = any->dtype == GPT2_BF16 ? 2 : 4;
    char *mine = (char *)train_grads(&(first ? first : last)->model) +
                 (size_t)wte_of(&(first ? first : last)->model, first == NULL) * e;
    char *local = first && last ? (char *)train_grads(&last->model) + (size_t)wte_of(&last->model, 1) * e
                                : NULL;
    pipe_sum_tied(mine, local, first ? p - 1 : 0, n, train_dtype(any), g);
}

// Σ g² over this rank's gradients, the head's copy of wte left out (the first stage counts wte).
static double local_norm_sq(Chunk *ch, int v) {
    double sum = 0;
    for (int c = 0; c < v; c++) {
        GPT2 *m = &ch[c].model;
        size_t n = m->has_head && !m->has_embed ? m->wte_offset : m->num_params;
        if (m->dtype == GPT2_FP32) sum += m->k->sum_squares(m->grads, n);
        else sum += bf16_sum_squares(m->k, m->grads_bf16, n, m->work_grads, m->work_size);
    }
    return sum;
}

// Every chunk's AdamW step on its whole buffer (bf16: the master, then the weights rounded).
static void adamw_all(const AdamW *h, Chunk *ch, int v, int step, float scale) {
    for (int c = 0; c < v; c++) {
        GPT2 *m = &ch[c].model;
        AdamWRange r = train_adamw_whole(m, ch[c].master, ch[c].opt_m, ch[c].opt_v);
        adamw_update(h, m->k, step, &r, m->plist, m->nplist, scale);
        train_master_to_model(m, ch[c].master);
    }
}

// ---------------------------------------------------------------------------------------------
// the chapter's state, as the loop sees it (SessionState): the whole model for the checkpoints
// and the final weights (common/whole.h, the lab's one whole <-> slice path, as 07 and 09):
// this rank's slices are its v chunks (the head's copy of wte left out of the whole and filled
// from wte); the world sums them onto rank 0, which reads a --resume and broadcasts it.

static const GPT2 *pipe_slice(void *ctx, int c) {
    return &((Chunk *)ctx)[c].model;
}

// The weights the forward reads (widened in bf16), or the fp32 master, Adam's m or v.
static const float *pipe_part(void *ctx, int c, WholeBuf which, float *scratch) {
    Chunk *k = &((Chunk *)ctx)[c];
    GPT2 *md = &k->model;
    if (which != WHOLE_WEIGHTS)
        return which == WHOLE_MASTER ? k->master : which == WHOLE_ADAM_M ? k->opt_m : k->opt_v;
    if (md->l0 == 0 && md->l1 == md->cfg.L) {  // the full model's come in llm.c's order
        float *llmc = lab_xmalloc(md->num_params * sizeof(float));
        train_params_to_host(md, llmc);
        gpt2_from_llmc(&md->cfg, llmc, scratch);
        free(llmc);
    } else {
        train_params_to_host(md, scratch);  // a stage's: in its own memory order
    }
    return scratch;
}

// A chunk's units of the whole state (gpt2_shard, the head's copy of wte from wte).
static void pipe_take(void *ctx, int c, const float *p, const float *m, const float *v) {
    Chunk *k = &((Chunk *)ctx)[c];
    gpt2_shard(&k->model, p, k->master);
    if (m) gpt2_shard(&k->model, m, k->opt_m), gpt2_shard(&k->model, v, k->opt_v);
    train_master_to_model(&k->model, k->master);
}

// The starting weights: --resume (weights, Adam state, step) or --load-weights (whole_load: a
// bad file is one message); or fresh from the seed (every stage its slice of the full model's
// init, the copy of wte too). Returns the first step.
static int load_or_init(WholeView *w, const LabArgs *args) {
    if (args->resume || args->load_weights) return whole_load(w, args);
    Chunk *ch = w->ctx;
    for (int c = 0; c < w->nslices; c++) {
        train_master_init(&ch[c].model, ch[c].master, (uint64_t)args->seed);
        train_master_to_model(&ch[c].model, ch[c].master);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// training

// The table for p ranks, refusing what cannot run: v chunks of equal blocks, m equal
// micro-batches, --max-w-stores only with zb (pipe_exec_init checks the table itself).
static void make_schedule(Schedule *s, const PipeFlags *f, int p, int L, int B) {
    const int v = f->v, m = f->m, S = p * v;
    if (S > L)
        lab_fail_collective("pipeline: %d ranks x %d chunks = %d stages, but the model has only "
                            "%d layers; use at most %d ranks x chunks (or more --layers)", p, v, S,
                            L, L);
    if (L % S != 0)
        lab_fail_collective("pipeline: --layers %d is not divisible by %d ranks x %d chunks = %d "
                            "stages; every stage must hold the same number of blocks: use --layers "
                            "%d, %d, ...", L, p, v, S, S, 2 * S);
    if (B % m != 0)
        lab_fail_collective("--micro-batches %d does not divide --batch %d; micro-batches must be "
                            "equal: use a --batch that is a multiple of %d", m, B, m);
    if (f->max_w > 0 && strcmp(f->schedule, "zb") != 0)
        lab_fail_collective("--max-w-stores %d: only --schedule zb defers W's; use it with "
                            "--schedule zb, or leave it out", f->max_w);
    if (f->recompute != GPT2_RECOMPUTE_NONE && strcmp(f->schedule, "zb") == 0)
        lab_fail_collective("--recompute %s with --schedule zb: a zero-bubble W runs after its B "
                            "and would read what B recomputed, long gone; recomputation is offered "
                            "with --schedule gpipe, 1f1b and interleaved", gpt2_recompute_name(f->recompute));
    sched_make(s, f->schedule, p, v, m);  // checks the name and --chunks for every schedule
    if (f->max_w > 0) sched_free(s), sched_zb_h1_capped(s, p, m, f->max_w);
}

// This rank's v chunks: chunk c is virtual stage c·p + rank, blocks [vs·per, (vs+1)·per).
static Chunk *chunks_build(const GPT2Config *cfg, int rank, int p, int v, int m, Device dev,
                           GPT2Dtype dtype, GPT2Recompute rc, int Bm) {
    const int per = cfg->L / (p * v);
    Chunk *ch = lab_xcalloc((size_t)v, sizeof(Chunk));
    for (int c = 0; c < v; c++) {
        Chunk *k = &ch[c];
        k->vs = c * p + rank;
        gpt2_build_stage(&k->model, *cfg, dev, dtype, k->vs * per, (k->vs + 1) * per);
        gpt2_alloc_grads(&k->model);
        gpt2_set_recompute(&k->model, rc, Bm, cfg->T);  // (none: nothing)
        k->master = train_master_alloc(&k->model);
        k->opt_m = mem_alloc(k->model.num_params * sizeof(float), MEM_OPT_M, dev);
        k->opt_v = mem_alloc(k->model.num_params * sizeof(float), MEM_OPT_V, dev);
        k->acts = lab_xcalloc((size_t)m, sizeof(GPT2Acts *));
    }
    return ch;
}

static void chunks_free(Chunk *ch, int v) {
    for (int c = 0; c < v; c++) {
        train_master_free(&ch[c].model, ch[c].master);
        mem_free(ch[c].opt_m), mem_free(ch[c].opt_v);
        free(ch[c].acts);
        gpt2_free(&ch[c].model);
    }
    free(ch);
}

// The memory rank `rank` will need (mem_predict.h): its chunks, the sets its table keeps, the
// executor's buffers (mem_predict_pipeline_recompute). ctx: the table, whose micro-batches are
// batch / m.
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const Schedule *sc = ctx;
    GPT2Config cfg = lab_args_config(args);
    return mem_predict_pipeline_recompute(&cfg, sc, rank, batch / sc->m,
                                          strcmp(args->dtype, "bf16") == 0, lab_args_recompute(args));
}

// One step is the table run by the executor, then the tied wte, the global norm and every
// chunk's AdamW; the loop around it (progress line, fault hooks, checkpoints, the final
// weights) is the Session's (common/session.h).
static void train(const LabArgs *args, const PipeFlags *f) {
    const GPT2Config cfg = lab_args_config(args);
    const int p = dist_world()->size, v = f->v, m = f->m, B = args->batch, Bm = B / m, T = cfg.T;
    Schedule sc;
    make_schedule(&sc, f, p, cfg.L, B);  // refuses what cannot run, before anything is built
    mem_refuse_if_it_cannot_fit(args, predict_memory, &sc, m);  // before the first allocation
    Session s;
    session_open(&s, args, Bm);  // this rank's batch buffers: one micro-batch
    const int rank = s.rank;
    const GPT2Dtype dtype = s.bf16 ? GPT2_BF16 : GPT2_FP32;
    Chunk *ch = chunks_build(&cfg, rank, p, v, m, s.dev, dtype, f->recompute, Bm);
    // What this rank holds of the whole model: its v chunks, every unit of each (no TP); the
    // world sums them.
    WholeView whole = {.ctx = ch, .nslices = v, .slice = pipe_slice, .part = pipe_part,
                       .take = pipe_take, .group = s.world, .with_replicated = 1,
                       .readers = s.world, .args = args};
    Stage work = {.ch = ch, .data = &s.data, .B = B, .Bm = Bm, .T = T, .m = m,
                  .inputs = s.inputs, .targets = s.targets,
                  .dloss = 1.0f / ((float)Bm * (float)T * (float)m), .split = sc.split};
    PipeExec x;  // (refuses a table that would not run)
    pipe_exec_init(&x, &sc,
                   (PipeWork){&work, stage_f_begin, stage_forward, stage_b_begin, stage_backward,
                              stage_weights},
                   s.world, rank, (size_t)Bm * T * cfg.C, dtype == GPT2_BF16, ch[0].model.k, s.dev);
    if (!args->quiet && rank == 0)
        pipe8_print_setup(&sc, &cfg, B, Bm, args->dtype, ch[0].model.k->name, f->picture_cols);
    s.state = (SessionState){&whole, whole_save, whole_weights_to_host, whole_load};
    session_start_at(&s, load_or_init(&whole, args));
    PipeClock clk;
    pipe8_clock_init(&clk, &sc, s.world, s.start, s.end);
    session_watch_links(&s, NULL, NULL, s.world);  // --links: the pipeline's link time (report.c)
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);
        for (int c = 0; c < v; c++) gpt2_zero_grad(&ch[c].model);
        pipe8_clock_begin(&clk);  // the stages start the step together
        work.step = step;
        double loss_sum = pipe_exec_step(&x);  // the table: F, B (and W) with the messages
        pipe8_clock_end(&clk, &x, step);       // this step's op times, its span, bytes sent

        // the step's loss: the last stage computed it
        float loss = (float)(loss_sum / m);
        dist_broadcast(&loss, 1, DIST_F32, p - 1, s.world);

        // the tied wte, then, unless the loss spiked (--on-spike), the global norm (NaN check)
        // and every stage's AdamW step
        sync_tied_wte(ch, v, rank, p, s.world);
        if (session_nan_due(&s, step, p - 1)) session_poison(train_grads(&ch[v - 1].model), s.bf16);
        if (session_may_update(&s, step, loss)) {
            double norm_sq = local_norm_sq(ch, v);
            dist_all_reduce(&norm_sq, &norm_sq, 1, DIST_F64, DIST_SUM, s.world);
            session_grad_norm_sq(&s, norm_sq);  // the health line's grad norm (before clipping)
            adamw_all(&s.opt, ch, v, step, adamw_clip_scale(&s.opt, norm_sq, step));
        }
        pipe8_clock_step_time(&clk, step);
        session_step_end(&s, step, loss);  // the progress line, the --save-every checkpoint
    }
    session_finish(&s);  // the final checkpoint, the final weights on rank 0, --save-weights

    // the report (every rank's figures), the --dump
    PipeRun run = {.s = &sc, .x = &x, .ses = &s, .dtype = dtype, .recompute = f->recompute, .B = B, .Bm = Bm, .T = T,
                   .l0 = ch[0].model.l0, .l1 = ch[v - 1].model.l1, .cols = f->picture_cols};
    pipe8_report(&run, &clk);
    if (!args->quiet && rank == 0 && f->recompute && session_steps_run(&s) > 0) {
        const GPT2 *ms[64];  // stage 0's chunks (--chunks <= 64): counted against the formula
        for (int c = 0; c < v; c++) ms[c] = &ch[c].model;
        gpt2_print_recompute_cost(ms, v, session_steps_run(&s), B, T);
    }

    pipe8_clock_free(&clk);
    pipe_exec_free(&x);
    chunks_free(ch, v);
    sched_free(&sc);
    session_free(&s);
}

int main(int argc, char **argv) {
    // Activation sets are allocated at every F and freed at B (or W): keep freed memory in the
    // heap (no mmap/munmap per set), so an F does not page-fault its set in afresh.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    PipeFlags f = {.schedule = "1f1b", .m = 4, .v = 1, .compare = 0, .stages = 4, .picture_cols = 160,
                   .max_w = 0};
    FlagSpec extra[] = {
        {"--schedule", FLAG_CHOICE, &f.schedule, 0, 0, "gpipe|1f1b|interleaved|zb",
         "the pipeline schedule (the table of ops per stage)"},
        {"--micro-batches", FLAG_INT, &f.m, 1, 10000, NULL,
         "m: micro-batches per step (must divide --batch)"},
        {"--chunks", FLAG_INT, &f.v, 1, 64, NULL,
         "v: chunks of layers per rank (--schedule interleaved)"},
        {"--max-w-stores", FLAG_INT, &f.max_w, 0, 10000, NULL,
         "K: --schedule zb keeps at most K deferred W's (W stores) per stage; a stage with K "
         "pending runs the oldest before anything else (0: no cap)"},
        {"--compare", FLAG_BOOL, &f.compare, 0, 1, NULL,
         "print the four schedules simulated for --stages and --micro-batches, and exit"},
        {"--stages", FLAG_INT, &f.stages, 1, SCHED_MAX_STAGES, NULL, "p for --compare"},
        {"--picture-cols", FLAG_INT, &f.picture_cols, 10, 100000, NULL,
         "width of the schedule pictures in columns (a wider picture is cut, and says so)"},
    };
    lab_parse_args_for(LAB_FLAGS_MODEL | LAB_FLAGS_TRAINING | LAB_FLAGS_HARDWARE | LAB_FLAGS_OUTPUT |
                           LAB_FLAGS_RELIABILITY | LAB_FLAGS_KILL | LAB_FLAGS_RECOMPUTE,
                       argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]),
                       "08_pipeline/run", USAGE);
    f.recompute = lab_args_recompute(&args);
    if (!f.compare && lab_flag_given(argc, argv, "--stages"))
        lab_fail_collective("--stages %d is p for --compare (the schedules simulated, no "
                            "training); a training run has one stage per rank (mpirun -np p): "
                            "add --compare, or leave --stages out", f.stages);
    if (f.compare) {
        if (dist_rank() == 0) pipe8_compare(f.stages, f.m, f.v, f.max_w, f.picture_cols);
    } else {
        train(&args, &f);
    }
    dist_finalize();
    return 0;
}
