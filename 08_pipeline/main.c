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
#include "optim.h"
#include "pipe_exec.h"
#include "results.h"
#include "schedule.h"
#include "session.h"
#include "trace.h"
#include "train.h"

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
    const char *mutate;  // break one mechanism on purpose (the tests' negative checks)
    int max_w;      // --schedule zb: at most this many W stores pending per stage (0: no cap)
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
// the four schedules side by side (simulated)

static const SchedTimes UNIT_TIMES = {1.0, 1.0, 1.0, 0.0, 0.0, 0.0};  // tf = tb = tw

static void print_schedule(const Schedule *s, const SchedTimes *t, int cols, int picture) {
    SimResult r;
    char err[256];
    if (sched_check(s, err, sizeof err) != 0) lab_fail("schedule %s: %s", s->name, err);
    if (sched_simulate(s, t, &r) != 0) lab_fail("schedule %s: %s", s->name, r.err);
    if (picture) sched_print(stdout, s, r.start, r.end, t->tf / s->v / 2.0, cols);
    double worst = 0;
    int peak = 0;
    for (int k = 0; k < s->p; k++) worst = fmax(worst, r.bubble[k]), peak = peak > r.peak_inflight[k] ? peak : r.peak_inflight[k];
    printf("  %-12s v=%d  makespan %6.2f  bubble %6.2f %%  theory %6.2f %%  peak sets (stage 0) %d, "
           "most on any stage %d", s->name, s->v, r.makespan, 100 * worst,
           100 * sched_theory_bubble(s, t), r.peak_inflight[0], peak);
    int wpeak = 0;
    for (int k = 0; k < s->p; k++) wpeak = wpeak > sched_peak_wstores(s, k) ? wpeak : sched_peak_wstores(s, k);
    if (s->split) printf("; W stores: most on any stage %d", wpeak);
    printf("\n");
    sim_free(&r);
}

static void compare(const PipeFlags *f) {
    const char *names[4] = {"gpipe", "1f1b", "interleaved", "zb"};
    printf("the four schedules, p = %d stages, m = %d micro-batches, simulated with tf = tb = tw "
           "(1F1B's B = tb + tw), free communication:\n", f->stages, f->m);
    for (int i = 0; i < 4; i++) {
        Schedule s;
        int v = i == 2 ? (f->v > 1 ? f->v : 2) : 1;
        if (i == 2 && f->m % f->stages != 0) {
            printf("  %-12s (skipped: m = %d is not a multiple of p = %d)\n", names[i], f->m, f->stages);
            continue;
        }
        if (i == 3 && f->max_w > 0) sched_zb_h1_capped(&s, f->stages, f->m, f->max_w);
        else sched_make(&s, names[i], f->stages, v, f->m);
        printf("\n");
        print_schedule(&s, &UNIT_TIMES, f->picture_cols, 1);
        sched_free(&s);
    }
}

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
    int mutate_keep_set;     // --mutate zb-keeps-set
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
    } else if (!w->mutate_keep_set) {  // (--mutate zb-keeps-set: the whole set waits for W)
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

static void adamw_all(const AdamW *h, Chunk *ch, int v, int step, float scale) {
    for (int c = 0; c < v; c++) {
        GPT2 *m = &ch[c].model;
        if (m->dtype == GPT2_FP32)
            adamw_step(h, m->k, step, ch[c].master, m->grads, ch[c].opt_m, ch[c].opt_v, 0,
                       m->num_params, m->plist, m->nplist, scale);
        else
            adamw_step_bf16(h, m->k, step, ch[c].master, m->params_bf16, m->grads_bf16,
                            ch[c].opt_m, ch[c].opt_v, 0, m->num_params, m->plist, m->nplist,
                            scale, m->work_grads, m->work_size);
    }
}

// ---------------------------------------------------------------------------------------------
// figures

// Bytes of one activation set of chunk m, from the size formulas of gpt2.h. fp32: the
// activations and their gradients, plus W's saved gradients when split. bf16: the blocks'
// per-layer activations (ln1 .. residual3) stored in bf16, 2 bytes each; in fp32 one layer of
// them (the scratch a block computes in) with the embedding's and the head's, block_in (a
// block's input widened, BTC), the gradients, and W's saved gradients when split.
static double set_bytes_formula(const GPT2 *m, int Bm, int T, int split) {
    size_t a[GPT2_NUM_ACTS], d[GPT2_NUM_ACTS];
    const int nb = m->l1 - m->l0, bf16 = m->dtype == GPT2_BF16;
    const double BTC = (double)Bm * T * m->cfg.C;
    gpt2_act_sizes_range(&m->cfg, bf16 ? 1 : nb, m->has_head, Bm, T, a);
    gpt2_dact_sizes_range(&m->cfg, nb, m->has_head, Bm, T, d);
    double floats = 0, layer = 0;
    for (int i = 0; i < GPT2_NUM_ACTS; i++) floats += (double)a[i] + (double)d[i];
    for (int i = 1; i <= 16; i++) layer += (double)a[i];  // ln1 .. residual3: one layer
    if (split) floats += 10.0 * nb * BTC;
    return bf16 ? 4.0 * (floats + BTC) + 2.0 * nb * layer : 4.0 * floats;
}

// ZB-H1: the bytes a deferred W keeps from B to W, per chunk, by hand from what W reads: per
// block and position, the inputs of its matmuls and LayerNorms (ln1, atty, ln2: C each;
// fch_gelu: 4C; the block's input, residual2: C each), the two LayerNorms' mean and rstd (4),
// the gradient of the block's output (C), and wsave (10C: see gpt2.h). fp32: 20C + 4 floats.
// bf16 (gpt2.c's keep_for_w_bf16): the 8C + 4 of them stored per block stay bf16 (with each
// block's output, C, but the last's: the next block's input), and in fp32 one layer of them
// (8C + 4) and the set's input (C: the scratch W widens into), block_in (C), the gradients of
// the blocks' outputs (C per block) and wsave (10C per block).
static double w_bytes_formula(const GPT2 *m, int Bm, int T) {
    const double C = m->cfg.C, nb = m->l1 - m->l0, BT = (double)Bm * T;
    if (m->dtype == GPT2_BF16)
        return 2.0 * BT * (nb * (8.0 * C + 4.0) + (nb - 1.0) * C) +
               4.0 * BT * ((9.0 * C + 4.0) + C + nb * 11.0 * C);
    return 4.0 * nb * BT * (20.0 * C + 4.0);
}

// The peak bytes of activations alive at once when the table runs, from the formulas: the walk
// of sched_peak_inflight (a set from F to B) and sched_peak_wstores (ZB-H1: a W store from B to
// W), weighted by each chunk's sizes. keep_set: the whole set waits for W (--mutate).
static double peak_bytes_formula(const Schedule *s, int rank, const Chunk *ch, int Bm, int T) {
    double live = 0, peak = 0;
    for (int j = 0; j < s->nops[rank]; j++) {
        PipeOp o = s->ops[rank][j];
        const GPT2 *md = &ch[o.chunk].model;
        double b = set_bytes_formula(md, Bm, T, s->split), w = w_bytes_formula(md, Bm, T);
        if (o.kind == PIPE_F) live += b;
        else if (o.kind == PIPE_B) live += s->split ? w - b : -b;
        else live -= w;
        peak = fmax(peak, live);
    }
    return peak;
}

// Bytes this rank sends per step by the formula: one (Bm, T, C) message per micro-batch for
// every boundary a chunk has with a chunk on another rank (forward: to the next virtual stage,
// backward: to the previous one), of `elem` bytes an element (fp32 4, bf16 2).
static double sent_formula(int rank, int p, int v, int m, size_t BTC, int elem) {
    const int S = p * v;
    double msgs = 0;
    for (int c = 0; c < v; c++) {
        int vs = c * p + rank;
        if (vs < S - 1 && p > 1) msgs += m;
        if (vs > 0 && p > 1) msgs += m;
    }
    return msgs * (double)BTC * elem;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of x[0 .. n) (x is left as it is): a step disturbed by another process on the
// machine moves the mean of the steps' times, hardly their median.
static double median(const double *x, int n) {
    if (n == 0) return 0;
    double *y = lab_xmalloc((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    qsort(y, (size_t)n, sizeof *y, cmp_double);
    double med = n % 2 ? y[n / 2] : 0.5 * (y[n / 2 - 1] + y[n / 2]);
    free(y);
    return med;
}

// This stage's measured time in each step after the first (the first warms caches and
// allocators; a run of one step keeps it): seconds in its F, B and W ops, the waits for
// messages left out (B: the whole backward when the schedule does not split it), and the span
// of the step, from the earliest stage's first op to the latest stage's end (all ranks read one
// monotonic clock, on one machine).
typedef struct StepTimes {
    int n;
    double *op[3], *busy, *span;  // [n]; op[PIPE_F], op[PIPE_B], op[PIPE_W]
} StepTimes;

enum { F_BUBBLE, F_TF, F_TB, F_TW, F_BUSY, F_PEAK_SETS, F_PEAK_SETS_SCHED, F_PEAK_BYTES,
       F_PEAK_BYTES_FORMULA, F_SENT, F_SENT_FORMULA, F_L0, F_L1, F_PEAK_W, F_PEAK_W_SCHED,
       F_NFIELDS };

// The bubble, measured and simulated, on rank 0. Per stage: its median op times per step, its
// idle share (median over the steps of 1 - busy / span), and the simulator's prediction from
// those op times (free links: what the table alone makes of them). Then the split of
// schedule.h (sched_bubble_split): the busiest stage's idle share, the schedule's bubble that
// (p-1)/(m+p-1) predicts, and the load imbalance between stages, each step's own, median over
// the steps. all: the F_* fields of every stage; busy: [r * n + k] stage r's busy time in step k.
typedef struct TimeReport {
    double sim_bubble[SCHED_MAX_STAGES];
    BubbleSplit meas, sim;
    double step, sim_step;  // median span; simulated makespan (s)
} TimeReport;

static TimeReport time_report(const Schedule *s, const double *all, const double *busy,
                              const double *span, int n) {
    const int p = s->p;
    TimeReport rep = {.step = median(span, n)};
    SchedTimes t[SCHED_MAX_STAGES];
    for (int r = 0; r < p; r++) {  // op times per micro-batch of the whole stage
        const double *a = all + (size_t)r * F_NFIELDS;
        t[r] = (SchedTimes){.tf = a[F_TF] / s->m, .tb = a[F_TB] / s->m, .tw = a[F_TW] / s->m};
    }
    SimResult sim;
    if (sched_simulate_stages(s, t, &sim) == 0) {
        for (int r = 0; r < p; r++) rep.sim_bubble[r] = sim.bubble[r];
        rep.sim = sim.split;
        rep.sim_step = sim.makespan;
    }
    sim_free(&sim);
    double *bub = lab_xcalloc((size_t)n + 1, sizeof(double)), *imb = lab_xcalloc((size_t)n + 1, sizeof(double));
    double bk[SCHED_MAX_STAGES], med[SCHED_MAX_STAGES];
    for (int k = 0; k < n; k++) {
        for (int r = 0; r < p; r++) bk[r] = busy[(size_t)r * n + k];
        BubbleSplit b = sched_bubble_split(bk, p, span[k]);
        bub[k] = b.bubble, imb[k] = b.imbalance;
    }
    for (int r = 0; r < p; r++) med[r] = all[(size_t)r * F_NFIELDS + F_BUSY];
    rep.meas.bottleneck = sched_bubble_split(med, p, rep.step).bottleneck;
    rep.meas.bubble = median(bub, n), rep.meas.imbalance = median(imb, n);
    free(bub), free(imb);
    return rep;
}

static void print_time_report(const Schedule *s, const double *all, const TimeReport *rep,
                              double theory) {
    printf("\n  time per step, ms (medians over the steps after the first):\n");
    printf("  %-6s %-8s %8s %8s %8s %8s %9s %9s %9s\n", "stage", "blocks", "F", "B", "W",
           "busy", "idle", "simulated", "theory");
    for (int r = 0; r < s->p; r++) {
        const double *a = all + (size_t)r * F_NFIELDS;
        char blk[16], w[16] = "-";
        snprintf(blk, sizeof blk, "[%d,%d)", (int)a[F_L0], (int)a[F_L1]);
        if (s->split) snprintf(w, sizeof w, "%.2f", 1e3 * a[F_TW]);
        printf("  %-6d %-8s %8.2f %8.2f %8s %8.2f %8.1f%% %8.1f%% %8.1f%%\n", r,
               s->v > 1 ? "chunks" : blk, 1e3 * a[F_TF], 1e3 * a[F_TB], w, 1e3 * a[F_BUSY],
               100 * a[F_BUBBLE], 100 * rep->sim_bubble[r], 100 * theory);
    }
    printf("  step %.2f ms (simulated from the op times above, free links: %.2f ms)\n",
           1e3 * rep->step, 1e3 * rep->sim_step);
    printf("  bottleneck stage %d: bubble %.2f %% (simulated %.2f %%, theory %.2f %%), "
           "imbalance %.2f %% (simulated %.2f %%)\n", rep->meas.bottleneck,
           100 * rep->meas.bubble, 100 * rep->sim.bubble, 100 * theory,
           100 * rep->meas.imbalance, 100 * rep->sim.imbalance);
    printf("  idle = 1 - busy / step, per stage. The step lasts as long as the busiest stage (the\n"
           "  bottleneck) works, plus its own idle time, the schedule's bubble: that is what the\n"
           "  theory predicts for equal stages. Any other stage r idles 1 - (busy_r / busy_max)\n"
           "  (1 - bubble): more, from the load imbalance (1 - busy_r / busy_max, at most 1 -\n"
           "  busy_min / busy_max), which a balanced split of the work would remove. simulated:\n"
           "  the table run on each stage's measured op times, messages free; theory: %s\n",
           s->split ? "ZB-H1's formula, tf = tb = tw" : "(p-1)/(v m + p-1)");
}

// ---------------------------------------------------------------------------------------------
// the whole model in llm.c's order (the --dump weights, the checkpoints)

enum { WHOLE_PARAMS, WHOLE_MASTER, WHOLE_ADAM_M, WHOLE_ADAM_V };

static float *chunk_buffer(Chunk *k, int which) {
    return which == WHOLE_MASTER ? k->master : which == WHOLE_ADAM_M ? k->opt_m : k->opt_v;
}

// full (n floats, llm.c's order) on rank 0: each element from the one rank holding it. which:
// the weights the forward reads (widened in bf16), or the fp32 master, Adam's m or v (each
// chunk's own buffer, in its memory order: the plist maps it to the file's).
static void gather_whole(Chunk *ch, int v, int which, float *full, size_t n, DistGroup *g) {
    memset(full, 0, n * sizeof(float));
    for (int c = 0; c < v; c++) {
        GPT2 *md = &ch[c].model;
        float *h = lab_xmalloc(md->num_params * sizeof(float));
        int file_order = 0;
        if (which == WHOLE_PARAMS) {
            train_params_to_host(md, h);  // the full model's in llm.c's order, a stage's in its own
            file_order = md->l0 == 0 && md->l1 == md->cfg.L;
        } else {
            mem_copy(h, chunk_buffer(&ch[c], which), md->num_params * sizeof(float));
        }
        if (file_order) memcpy(full, h, n * sizeof(float));
        else for (int i = 0; i < md->nplist; i++) {
            const GPT2Param *q = &md->plist[i];
            if (!q->tied_copy) memcpy(full + q->llmc_offset, h + q->offset, q->size * sizeof(float));
        }
        free(h);
    }
    dist_reduce(full, full, n, DIST_F32, DIST_SUM, 0, g);  // zeros elsewhere: exact
}

// The inverse, on every rank: each chunk's part of full (llm.c's order; the head's copy of wte
// from wte) into its master, m or v.
static void scatter_whole(Chunk *ch, int v, int which, const float *full) {
    for (int c = 0; c < v; c++) {
        GPT2 *md = &ch[c].model;
        float *h = lab_xmalloc(md->num_params * sizeof(float));
        for (int i = 0; i < md->nplist; i++) {
            const GPT2Param *q = &md->plist[i];
            memcpy(h + q->offset, full + q->llmc_offset, q->size * sizeof(float));
        }
        mem_copy(chunk_buffer(&ch[c], which), h, md->num_params * sizeof(float));
        free(h);
    }
}

// --save: the training state after `step` steps, the whole model gathered to rank 0, in the
// lab's format (the file 00 writes: 00 resumes it, and 08 resumes 00's, on any p and v).
static void save_whole(const LabArgs *args, const GPT2Config *cfg, Chunk *ch, int v, int step,
                       DistGroup *g) {
    const size_t n = gpt2_param_count(cfg);
    TrainState st = {.cfg = *cfg, .step = step, .seed = (uint64_t)args->seed,
                     .data_seed = (uint64_t)args->data_seed, .n = n};
    st.params = lab_xmalloc(n * sizeof(float));
    st.m = lab_xmalloc(n * sizeof(float));
    st.v = lab_xmalloc(n * sizeof(float));
    gather_whole(ch, v, WHOLE_MASTER, st.params, n, g);
    gather_whole(ch, v, WHOLE_ADAM_M, st.m, n, g);
    gather_whole(ch, v, WHOLE_ADAM_V, st.v, n, g);
    if (g->rank == 0) ckpt_save_state(args->save, &st);
    free(st.params), free(st.m), free(st.v);
}

// The starting weights: --resume (weights, Adam state, step: every rank reads the file),
// --load-weights, or fresh from the seed (every stage its slice of the full model's init, the
// copy of wte too). Returns the first step.
static int load_or_init(const LabArgs *args, const GPT2Config *cfg, Chunk *ch, int v) {
    const size_t n = gpt2_param_count(cfg);
    int start = 0;
    if (args->resume || args->load_weights) {
        TrainState st = {.params = lab_xmalloc(n * sizeof(float)),
                         .m = lab_xmalloc(n * sizeof(float)), .v = lab_xmalloc(n * sizeof(float))};
        if (args->resume) {
            ckpt_load_state(args->resume, cfg, &st);
            scatter_whole(ch, v, WHOLE_ADAM_M, st.m);
            scatter_whole(ch, v, WHOLE_ADAM_V, st.v);
            start = st.step;
        } else {
            ckpt_load_weights(args->load_weights, cfg, st.params);
        }
        scatter_whole(ch, v, WHOLE_MASTER, st.params);
        free(st.params), free(st.m), free(st.v);
    } else {
        for (int c = 0; c < v; c++) train_master_init(&ch[c].model, ch[c].master, (uint64_t)args->seed);
    }
    for (int c = 0; c < v; c++) train_master_to_model(&ch[c].model, ch[c].master);
    return start;
}

// ---------------------------------------------------------------------------------------------
// training

static void train(const LabArgs *args, const PipeFlags *f) {
    DistGroup *g = dist_world();
    const int rank = g->rank, p = g->size, v = f->v, m = f->m, S = p * v;
    const GPT2Config cfg = lab_args_config(args);
    const int L = cfg.L, B = args->batch, T = cfg.T;
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
    const int Bm = B / m;
    Schedule s;
    if (f->max_w > 0 && strcmp(f->schedule, "zb") != 0)
        lab_fail_collective("--max-w-stores %d: only --schedule zb defers W's; use it with "
                            "--schedule zb, or leave it out", f->max_w);
    sched_make(&s, f->schedule, p, v, m);  // checks the name and --chunks for every schedule
    if (f->max_w > 0) sched_free(&s), sched_zb_h1_capped(&s, p, m, f->max_w);
    char err[256];
    if (sched_check(&s, err, sizeof err) != 0) lab_fail_collective("schedule %s: %s", s.name, err);
    SimResult sim;
    if (sched_simulate(&s, &UNIT_TIMES, &sim) != 0)
        lab_fail_collective("schedule %s: %s", s.name, sim.err);

    trace_init(args->trace);
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);
    const Device dev = lab_args_device(args);
    const GPT2Dtype dtype = strcmp(args->dtype, "bf16") == 0 ? GPT2_BF16 : GPT2_FP32;
    const int per = L / S;
    Chunk *ch = lab_xcalloc((size_t)v, sizeof(Chunk));
    for (int c = 0; c < v; c++) {
        Chunk *k = &ch[c];
        k->vs = c * p + rank;
        gpt2_build_stage(&k->model, cfg, dev, dtype, k->vs * per, (k->vs + 1) * per);
        gpt2_alloc_grads(&k->model);
        k->master = train_master_alloc(&k->model);
        k->opt_m = mem_alloc(k->model.num_params * sizeof(float), MEM_OPT_M, dev);
        k->opt_v = mem_alloc(k->model.num_params * sizeof(float), MEM_OPT_V, dev);
        k->acts = lab_xcalloc((size_t)m, sizeof(GPT2Acts *));
    }
    const AdamW opt = lab_args_adamw(args);
    DataSource data;
    lab_args_data(args, &data);
    int *inputs = mem_alloc((size_t)Bm * T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)Bm * T * sizeof(int), MEM_OTHER, DEV_CPU);

    Stage work = {.ch = ch, .data = &data, .B = B, .Bm = Bm, .T = T, .m = m,
                  .inputs = inputs, .targets = targets,
                  .dloss = 1.0f / ((float)Bm * (float)T * (float)m), .split = s.split,
                  .mutate_keep_set = strcmp(f->mutate, "zb-keeps-set") == 0};
    PipeExec x;
    pipe_exec_init(&x, &s,
                   (PipeWork){&work, stage_f_begin, stage_forward, stage_b_begin, stage_backward,
                              stage_weights},
                   g, rank, (size_t)Bm * T * cfg.C,
                   dtype == GPT2_BF16 && strcmp(f->mutate, "bf16-msgs-fp32") != 0, ch[0].model.k, dev);

    if (!args->quiet && rank == 0) {
        printf("pipeline: %d stage%s x %d chunk%s = %d virtual stages of %d block%s; GPT-2 V=%d "
               "T=%d L=%d C=%d NH=%d, %s, device %s\n", p, p > 1 ? "s" : "", v, v > 1 ? "s" : "",
               S, per, per > 1 ? "s" : "", cfg.V, T, L, cfg.C, cfg.NH, args->dtype,
               ch[0].model.k->name);
        printf("schedule %s, %d micro-batches of %d x %d (batch %d); each micro-batch's loss "
               "counts 1/%d\n", s.name, m, Bm, T, B, m);
        printf("\nthe table, simulated with tf = tb = tw (unit: half a chunk's forward):\n");
        sched_print(stdout, &s, sim.start, sim.end, UNIT_TIMES.tf / v / 2.0, f->picture_cols);
    }

    const int start = load_or_init(args, &cfg, ch, v);
    if (!args->quiet && rank == 0 && args->resume)
        printf("resumed from %s at step %d\n", args->resume, start);
    float *losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    for (int i = 0; i < args->steps; i++) losses[i] = NAN;  // (the steps not run here)
    const int end = lab_args_end_step(args);
    // the fault hook (--kill-rank, --kill-step) is the Session's; it reads only these fields
    Session hooks = {.args = args, .rank = rank, .start = start};
    double sent_sum = 0, t_steps = 0;  // t_steps: the steps after the first, for tokens/s
    StepTimes tm = {0};
    for (int k = 0; k < 3; k++) tm.op[k] = lab_xcalloc((size_t)end + 1, sizeof(double));
    tm.busy = lab_xcalloc((size_t)end + 1, sizeof(double));
    tm.span = lab_xcalloc((size_t)end + 1, sizeof(double));
    double *pic_start = NULL, *pic_end = NULL;  // the last step's measured timeline (rank 0)
    dist_counters_reset();
    for (int step = start; step < end; step++) {
        session_step_begin(&hooks, step);
        for (int c = 0; c < v; c++) gpt2_zero_grad(&ch[c].model);
        dist_barrier(g);  // the stages start the step together: the timeline's zero
        double t0 = lab_now();
        uint64_t sent0 = dist_counters()->sent[OP_SEND];
        work.step = step;
        double loss_sum = pipe_exec_step(&x);
        sent_sum += (double)(dist_counters()->sent[OP_SEND] - sent0);
        // this step's times: the ops' (waits left out), and the span from the first stage's
        // start to the last stage's end (all ranks share one monotonic clock on one machine)
        double opsum[3] = {0, 0, 0}, tend = x.op_end[s.nops[rank] - 1];
        for (int j = 0; j < s.nops[rank]; j++) opsum[s.ops[rank][j].kind] += x.op_end[j] - x.op_start[j];
        double span[2] = {-t0, tend};  // the max of -t0 is -(the earliest start)
        dist_all_reduce(span, span, 2, DIST_F64, DIST_MAX, g);
        double tmin = -span[0], tmax = span[1];
        if (step > start || end - start == 1) {  // the first step warms caches and allocators
            for (int k = 0; k < 3; k++) tm.op[k][tm.n] = opsum[k];
            tm.busy[tm.n] = opsum[0] + opsum[1] + opsum[2];
            tm.span[tm.n++] = tmax - tmin;
        }
        if (step == end - 1) {
            pic_start = lab_xcalloc((size_t)s.nops[rank] + 1, sizeof(double));
            pic_end = lab_xcalloc((size_t)s.nops[rank] + 1, sizeof(double));
            for (int j = 0; j < s.nops[rank]; j++)
                pic_start[j] = x.op_start[j] - tmin, pic_end[j] = x.op_end[j] - tmin;
        }

        // the tied wte, then the global norm (NaN check) and every stage's AdamW step
        sync_tied_wte(ch, v, rank, p, g);
        if (step == args->inject_nan_step && rank == p - 1) train_inject_nan(&ch[v - 1].model);
        double norm_sq = local_norm_sq(ch, v);
        dist_all_reduce(&norm_sq, &norm_sq, 1, DIST_F64, DIST_SUM, g);
        float scale = adamw_clip_scale(&opt, norm_sq, step);
        adamw_all(&opt, ch, v, step, scale);
        for (int c = 0; c < v; c++) train_master_to_model(&ch[c].model, ch[c].master);

        float loss = (float)(loss_sum / m);
        dist_broadcast(&loss, 1, DIST_F32, p - 1, g);
        losses[step] = loss;
        if (step > start) t_steps += lab_now() - t0;
        if (!args->quiet && rank == 0 && args->log_every > 0 &&
            (step % args->log_every == 0 || step == end - 1))
            printf("step %5d/%d  loss %.4f  lr %.2e  %.1f ms\n", step + 1, args->steps, loss,
                   adamw_lr(&opt, step), 1e3 * (lab_now() - t0));
        if (args->save && args->save_every > 0 && (step + 1) % args->save_every == 0 &&
            step != end - 1)
            save_whole(args, &cfg, ch, v, step + 1, g);
    }
    if (args->save) {
        save_whole(args, &cfg, ch, v, end, g);
        if (!args->quiet && rank == 0) printf("saved training state (step %d) to %s\n", end, args->save);
    }

    // the final weights, in llm.c's order, on rank 0
    const size_t n = gpt2_param_count(&cfg);
    float *full = lab_xmalloc(n * sizeof(float));
    gather_whole(ch, v, WHOLE_PARAMS, full, n, g);
    if (rank == 0 && args->save_weights) ckpt_save_weights(args->save_weights, &cfg, full);

    // the figures of every rank, to rank 0
    double mine[F_NFIELDS] = {0};
    double *idle = lab_xcalloc((size_t)tm.n + 1, sizeof(double));
    for (int k = 0; k < tm.n; k++) idle[k] = 1.0 - tm.busy[k] / tm.span[k];
    mine[F_BUBBLE] = median(idle, tm.n);
    free(idle);
    mine[F_TF] = median(tm.op[PIPE_F], tm.n);
    mine[F_TB] = median(tm.op[PIPE_B], tm.n);
    mine[F_TW] = median(tm.op[PIPE_W], tm.n);
    mine[F_BUSY] = median(tm.busy, tm.n);
    mine[F_PEAK_SETS] = x.live_peak;
    mine[F_PEAK_SETS_SCHED] = sched_peak_inflight(&s, rank);
    mine[F_PEAK_BYTES] = (double)x.acts_peak;
    mine[F_PEAK_BYTES_FORMULA] = peak_bytes_formula(&s, rank, ch, Bm, T);
    mine[F_SENT] = end > start ? sent_sum / (end - start) : 0;
    mine[F_SENT_FORMULA] = sent_formula(rank, p, v, m, x.msg, dtype == GPT2_BF16 ? 2 : 4);
    mine[F_L0] = ch[0].model.l0;
    mine[F_L1] = ch[v - 1].model.l1;
    mine[F_PEAK_W] = x.wlive_peak;
    mine[F_PEAK_W_SCHED] = sched_peak_wstores(&s, rank);
    double *all = rank == 0 ? lab_xcalloc((size_t)p * F_NFIELDS, sizeof(double)) : NULL;
    dist_gather(mine, all, F_NFIELDS, DIST_F64, 0, g);
    // the measured timeline of the last step, for the picture
    int maxops = 0;
    for (int r = 0; r < p; r++) maxops = s.nops[r] > maxops ? s.nops[r] : maxops;
    double *tl = lab_xcalloc((size_t)2 * maxops, sizeof(double)), *tl_all = NULL;
    if (pic_start) {  // (no step run here: resumed at the end)
        memcpy(tl, pic_start, (size_t)s.nops[rank] * sizeof(double));
        memcpy(tl + maxops, pic_end, (size_t)s.nops[rank] * sizeof(double));
    }
    if (rank == 0) tl_all = lab_xcalloc((size_t)p * 2 * maxops, sizeof(double));
    dist_gather(tl, tl_all, (size_t)2 * maxops, DIST_F64, 0, g);
    // every stage's busy time in each measured step (every rank ran the same steps), for the
    // bottleneck's bubble and the imbalance of each step
    double *busy_all = rank == 0 ? lab_xcalloc((size_t)p * tm.n + 1, sizeof(double)) : NULL;
    dist_gather(tm.busy, busy_all, (size_t)tm.n, DIST_F64, 0, g);
    trace_finish();

    if (rank == 0) {
        const double theory = sched_theory_bubble(&s, &UNIT_TIMES);
        const TimeReport tr = time_report(&s, all, busy_all, tm.span, tm.n);
        if (!args->quiet && end - start > 1)
            printf("%d steps after the first in %.3f s: %.0f tokens/s\n", end - start - 1,
                   t_steps, (double)B * T * (end - start - 1) / t_steps);
        if (!args->quiet && end > start) {
            double *st[SCHED_MAX_STAGES], *en[SCHED_MAX_STAGES], fsum = 0;
            int fn = 0;
            for (int r = 0; r < p; r++) {
                st[r] = tl_all + (size_t)r * 2 * maxops;
                en[r] = st[r] + maxops;
                for (int j = 0; j < s.nops[r]; j++)
                    if (s.ops[r][j].kind == PIPE_F) fsum += en[r][j] - st[r][j], fn++;
            }
            printf("\nthe last step as it ran (unit: half the mean forward, %.2f ms):\n",
                   1e3 * fsum / fn / 2);
            sched_print(stdout, &s, st, en, fsum / fn / 2, f->picture_cols);
            print_time_report(&s, all, &tr, theory);
            printf("\n  memory and messages:\n");
            printf("  %-6s %-8s %11s %11s %12s %12s %12s %12s\n", "stage", "blocks",
                   "sets sched", "W st sched", "acts peak", "formula", "sent/step", "formula");
            for (int r = 0; r < p; r++) {
                const double *a = all + (size_t)r * F_NFIELDS;
                char b1[32], b2[32], b3[32], b4[32], blk[16], wst[24] = "-";
                snprintf(blk, sizeof blk, "[%d,%d)", (int)a[F_L0], (int)a[F_L1]);
                if (s.split)
                    snprintf(wst, sizeof wst, "%d/%d", (int)a[F_PEAK_W], (int)a[F_PEAK_W_SCHED]);
                printf("  %-6d %-8s %5d/%-5d %11s %12s %12s %12s %12s\n", r,
                       v > 1 ? "chunks" : blk, (int)a[F_PEAK_SETS], (int)a[F_PEAK_SETS_SCHED], wst,
                       mem_format(b1, sizeof b1, a[F_PEAK_BYTES]),
                       a[F_PEAK_BYTES_FORMULA] >= 0 ? mem_format(b2, sizeof b2, a[F_PEAK_BYTES_FORMULA]) : "-",
                       mem_format(b3, sizeof b3, a[F_SENT]), mem_format(b4, sizeof b4, a[F_SENT_FORMULA]));
            }
            printf("  sets: activation sets alive at once (F .. B), measured / from the table; W st: "
                   "ZB-H1's W stores (what W reads, B .. W);\n"
                   "  acts peak: MEM_ACTS above the step's start, at op boundaries\n");
        }
        if (args->dump) {
            RunResults out;
            results_init(&out, end, n);
            memcpy(out.losses, losses, (size_t)end * sizeof(float));
            memcpy(out.params, full, n * sizeof(float));
            results_set(&out, "stages", p);
            results_set(&out, "chunks", v);
            results_set(&out, "micro_batches", m);
            results_set(&out, "bubble_theory", theory);
            results_set(&out, "bottleneck", tr.meas.bottleneck);
            results_set(&out, "bubble_bottleneck", tr.meas.bubble);
            results_set(&out, "imbalance", tr.meas.imbalance);
            results_set(&out, "bubble_bottleneck_sim", tr.sim.bubble);
            results_set(&out, "imbalance_sim", tr.sim.imbalance);
            // (the op times per stage stay out: results.c holds 64 figures, 4 stages' worth)
            static const char *keys[F_NFIELDS] = {"bubble", NULL, NULL, NULL, NULL,
                "peak_sets", "peak_sets_sched", "peak_act_bytes", "peak_act_bytes_formula",
                "sent_per_step", "sent_per_step_formula", "l0", "l1", "peak_wstores",
                "peak_wstores_sched"};
            for (int r = 0; r < p && r < 4; r++) {
                char key[48];
                for (int k = 0; k < F_NFIELDS; k++) {
                    if (!keys[k]) continue;
                    snprintf(key, sizeof key, "%s_r%d", keys[k], r);
                    results_set(&out, key, all[(size_t)r * F_NFIELDS + k]);
                }
                snprintf(key, sizeof key, "bubble_sim_r%d", r);
                results_set(&out, key, tr.sim_bubble[r]);
            }
            results_write(args->dump, &out);
            results_free(&out);
        }
    }
    for (int k = 0; k < 3; k++) free(tm.op[k]);
    free(tm.busy), free(tm.span), free(busy_all);
    free(all), free(tl), free(tl_all), free(pic_start), free(pic_end), free(full), free(losses);
    pipe_exec_free(&x);
    mem_free(inputs), mem_free(targets);
    data_free(&data);
    for (int c = 0; c < v; c++) {
        train_master_free(&ch[c].model, ch[c].master);
        mem_free(ch[c].opt_m), mem_free(ch[c].opt_v);
        free(ch[c].acts);
        gpt2_free(&ch[c].model);
    }
    free(ch);
    sim_free(&sim);
    sched_free(&s);
}

int main(int argc, char **argv) {
    // Activation sets are allocated at every F and freed at B (or W): keep freed memory in the
    // heap (no mmap/munmap per set), so an F does not page-fault its set in afresh.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    PipeFlags f = {.schedule = "1f1b", .m = 4, .v = 1, .compare = 0, .stages = 4, .picture_cols = 160,
                   .mutate = "none", .max_w = 0};
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
         "width of the schedule pictures in columns"},
        {"--mutate", FLAG_CHOICE, &f.mutate, 0, 0, "none|zb-keeps-set|bf16-msgs-fp32",
         "break one mechanism on purpose (what the tests must catch): ZB-H1 keeps the whole "
         "activation set until W instead of what W reads; bf16 runs send fp32 messages"},
    };
    lab_parse_args_for(LAB_FLAGS_MODEL | LAB_FLAGS_TRAINING | LAB_FLAGS_HARDWARE | LAB_FLAGS_OUTPUT |
                           LAB_FLAGS_RELIABILITY | LAB_FLAGS_KILL,
                       argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]),
                       "08_pipeline/run", USAGE);
    if (f.compare) {
        if (dist_rank() == 0) compare(&f);
    } else {
        train(&args, &f);
    }
    dist_finalize();
    return 0;
}
