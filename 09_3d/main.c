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
//     blocks' backward (the f all-reduces) and sends the gradient of its input to p-1; with
//     --schedule zb (ZB-H1) B is the input gradient only (every f and g collective in it) and
//     W, later, the blocks' weight gradients, locally (tp.h's split backward);
//   - --sequence-parallel: chapter 07's SP inside every TP stage: the stream between blocks (and
//     the PP messages) is this rank's T/t positions; the replicated tensors' partial gradients
//     are summed over TP once per step;
//   - every micro-batch's loss counts 1/m, each replica's 1/dp: the gradient of the mean;
//   - DP (dp.h): the gradients of every stage are averaged over its DP group (ranks with the
//     same t, p); --zero 1 reduce-scatters them (ZeRO-1), --zero 2 after every micro-batch;
//   - the tied wte: the first stage's slice and the last stage's copy sum their gradients over
//     the PP group, so both copies stay equal;
//   - clipping: the global norm over all three dimensions (grid_clip_norm_sq): the slices summed
//     over TP, the replicated tensors counted once, the stages summed over PP, nothing over DP;
//   - AdamW on every rank's flat buffer (--zero 1, 2: on its piece, then all-gathered; --zero 3
//     and --fsdp: the weights stay in pieces, each unit gathered around its use: dp.h).
// With dp = tp = pp = 1 and one micro-batch this is chapter 00's single-device step.
// Every chunk is a GPT2 (the one model: gpt2_build_tp's TP slice t of its blocks) run by
// common/tp.c's pieces; with tp = 1 they are gpt2's own, and 09 is chapter 08 bit for bit. The
// same step runs on --device cuda and in --dtype bf16 (bf16 weights, gradients and stored
// activations around an fp32 master; DP averages and PP send bf16; README "On CUDA and in bf16").
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "dp.h"
#include "flags.h"
#include "gpt2.h"
#include "grid3d.h"
#include "mem.h"
#include "mem_predict.h"
#include "optim.h"
#include "pipe_exec.h"
#include "report3d.h"
#include "schedule.h"
#include "session.h"
#include "tp.h"
#include "trace.h"
#include "train.h"
#include "whole.h"

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
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --zero 2    ZeRO-2: the gradients reduce-scattered\n"
    "                                                     after every micro-batch as well\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --zero 3    ZeRO-3: the weights sharded too, each unit\n"
    "                                                     gathered around its forward and backward\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --fsdp [--prefetch N] [--reshard-after-forward 0|1]\n"
    "                                                     FSDP (chapter 06): every unit in dp pieces\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --schedule zb --micro-batches 4\n"
    "                                                     ZB-H1 (chapter 08): each TP stage's backward\n"
    "                                                     split, B the input gradient (f, g collectives),\n"
    "                                                     W the weight gradients later (local)\n"
    "                                                     (--max-w-stores N: at most N W's pending)\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --sequence-parallel\n"
    "                                                     SP in every TP stage (chapter 07): norms and\n"
    "                                                     residuals on T/tp positions; PP sends them\n"
    "  mpirun -np 4 ./09_3d/run --tp 2 --pp 2 --recompute full\n"
    "                                                     activation recomputation (also bf16): a stage keeps\n"
    "                                                     each block's input; backward reruns the block's\n"
    "                                                     forward, its TP collectives too (selective:\n"
    "                                                     the attention scores only, no communication)\n"
    "  mpirun -np 8 ./09_3d/run --tp 8 --pp 1 --heads 8   TP alone (chapter 07)\n"
    "  mpirun -np 1 ./09_3d/run                           one rank: chapter 00's training\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --dtype bf16\n"
    "                                                     mixed precision: bf16 weights, gradients and\n"
    "                                                     stored activations, fp32 master and Adam\n"
    "  mpirun -np 4 ./09_3d/run --tp 2 --pp 2 --device cuda\n"
    "                                                     on a GPU (the MPI backend stages device\n"
    "                                                     buffers: ranks may share one GPU; --backend\n"
    "                                                     nccl: one GPU per rank)\n"
    "  mpirun -np 8 ./09_3d/run --tp 4 --pp 2 --links h100:4 [--grid-order pp-first]\n"
    "                                                     2 virtual nodes of 4 (docs/CLUSTER.md):\n"
    "                                                     TP inside each node, or across them\n"
    "  mpirun -np 8 ./09_3d/run --tp 2 --pp 2 --stop-at 10 --save s.bin, then\n"
    "  mpirun -np 4 ./09_3d/run --tp 4 --resume s.bin     a checkpoint of any layout resumes\n"
    "                                                     under any other, in either precision\n"
    "                                                     (the lab's state format: the fp32 master)\n"
    "\n"
    "It prints the grid (which rank is which coordinate and in which groups), the schedule, and\n"
    "after training each dimension's bytes per step against its formula and the memory per rank.\n"
    "Needs: dp x tp x pp = ranks, tp dividing --heads, pp x chunks dividing --layers, --batch\n"
    "divisible by dp x micro-batches; --chunks > 1 with --schedule interleaved only;\n"
    "--sequence-parallel with --tp > 1 dividing --seq. Every schedule composes with SP and --zero.\n";

typedef struct Flags3d {
    int tp, pp, dp;        // dp 0: world / (tp·pp)
    const char *schedule;
    int m, v;              // micro-batches per step (per replica), chunks per rank
    DplOpts dpo;           // over DP (dp.h): --zero 0 DDP's average, 1, 2, 3; --fsdp
    GPT2Recompute recompute;  // --recompute (a shared flag): gpt2's sets at --tp 1, tp.c's slices above
    const char *order;     // "tp-first" (Megatron's grid) | "pp-first" (question 5's other layout)
    int sp;                // --sequence-parallel: chapter 07's SP inside every TP stage
    int max_w;             // --schedule zb: at most this many W stores pending per stage (0: no cap)
} Flags3d;

// One chunk of layers on this rank: its TP slice of the chunk's blocks (a GPT2) and the
// micro-batches in flight on it (the optimizer's state of it is the DP layer's: dp.h).
typedef struct Chunk {
    GPT2 m;
    int vs;                // virtual stage chunk·pp + p
    GPT2Acts **acts;       // (m) NULL when micro-batch i is not in flight on this chunk
} Chunk;

// ---------------------------------------------------------------------------------------------
// the stage's work: what F and B compute on a TP chunk; the executor (common/pipe_exec.h, 08's)
// runs this rank's table over them, with the sends along the PP group

typedef struct Stage {
    Chunk *ch;
    DpLayer *dp;
    TpComm *comm;
    const DataSource *data;
    int step, B, Bm, T, row0;
    int *inputs, *targets;
    float dloss;           // every micro-batch's loss counts 1/m: 1 / (Bm·T·m) (ZeRO-2: / dp)
    size_t BTC;            // one micro-batch's stream: Bm·T·C floats (SP: this rank's Bm·T/t·C)
    int split;             // ZB-H1: B is the input gradient only, W (the weight gradients) later
} Stage;

// micro-batch mb: rows [row0 + mb·Bm, +Bm) of the step's global batch (this replica's)
static void stage_batch(Stage *w, int mb) {
    data_batch(w->data, (uint64_t)w->step, w->B, w->T, w->row0 + mb * w->Bm, w->Bm, w->inputs,
               w->targets);
}

static float *stage_f_begin(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    Chunk *c = &w->ch[chunk];
    GPT2Acts *a = lab_xcalloc(1, sizeof(GPT2Acts));
    tp_acts_alloc(a, &c->m);
    if (w->split) tp_acts_alloc_split(a, &c->m);
    c->acts[mb] = a;
    stage_batch(w, mb);
    gpt2_acts_set_batch(&c->m, a, w->inputs, c->m.has_head ? w->targets : NULL);
    return gpt2_acts_input(a);
}

static float stage_forward(void *ctx, int chunk, int mb, float *out) {
    Stage *w = ctx;
    GPT2 *m = &w->ch[chunk].m;
    GPT2Acts *a = w->ch[chunk].acts[mb];
    float loss = dpl_forward(w->dp, chunk, a, w->comm);  // (sharded: unit by unit, gathered)
    if (out) gpt2_acts_output(m, a, out);
    return loss;
}

static float *stage_b_begin(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    stage_batch(w, mb);  // (a set on the host reads the batch in place: mb's again)
    return gpt2_acts_doutput(w->ch[chunk].acts[mb]);
}

static void stage_backward(void *ctx, int chunk, int mb, float *din) {
    Stage *w = ctx;
    GPT2 *m = &w->ch[chunk].m;
    GPT2Acts *a = w->ch[chunk].acts[mb];
    if (!w->split) dpl_backward(w->dp, chunk, a, w->comm, w->dloss);  // (sharded: unit by unit)
    else tp_backward_input(m, a, w->comm, w->dloss);  // B: the input gradient; the blocks' W later
    if (din) mem_copy(din, gpt2_acts_dinput(a), w->BTC * sizeof(float));
    if (w->split) {
        tp_acts_keep_for_w(a, m);  // (tp 1: the set shrinks to what W reads, as in 08)
        return;
    }
    dpl_after_backward(w->dp, chunk);  // ZeRO-2, 3, FSDP: this micro-batch's gradient reduce-scattered
    gpt2_acts_free(a);
    free(a);
    w->ch[chunk].acts[mb] = NULL;
}

// W: the blocks' weight gradients of micro-batch mb (no communication in TP), then ZeRO-2's
// reduce-scatter of what the chunk's buffer holds.
static void stage_weights(void *ctx, int chunk, int mb) {
    Stage *w = ctx;
    GPT2Acts *a = w->ch[chunk].acts[mb];
    tp_backward_weights(&w->ch[chunk].m, a);
    dpl_after_backward(w->dp, chunk);
    gpt2_acts_free(a);
    free(a);
    w->ch[chunk].acts[mb] = NULL;
}

// The tied wte: the first chunk's slice (embedding lookups) and the last chunk's copy (output
// layer) sum their gradients over the PP group (the same TP slice t on both ends), in the
// gradients' storage precision (bf16: half the bytes, like 08): common/pipe_exec's
// pipe_sum_tied.
static void *wte_grad(GPT2 *m) {
    return (char *)train_grads(m) + m->wte_offset * dist_dtype_size(train_dtype(m));
}
static void sync_tied_wte(Chunk *ch, int v, int p, int pp, DistGroup *ppg) {
    GPT2 *first = p == 0 ? &ch[0].m : NULL, *last = p == pp - 1 ? &ch[v - 1].m : NULL;
    if (first && first == last) return;  // one stage holds both uses: one buffer
    if (!first && !last) return;
    const GPT2 *any = first ? first : last;
    pipe_sum_tied(wte_grad(first ? first : last), first && last ? wte_grad(last) : NULL,
                  first ? pp - 1 : 0, gpt2_wte_elems(any), train_dtype(any), ppg);
}

// ---------------------------------------------------------------------------------------------
// layouts are views of one model: the state gathered whole, and a whole state sliced

// This rank's part of the run (the SessionState's context): its chunks, its grid coordinates
// and groups, the pipeline's table and executor over them.
typedef struct Run3d {
    Chunk *ch;
    GPT2 **models;         // (v) the chunks' slices, as the DP layer reads them
    DpLayer dpl;           // over DP: the optimizer state, the average or ZeRO (dp.h)
    WholeView whole;       // what this rank's state is of the whole model (save, load, gather)
    int v, dp;
    Grid grid;
    Schedule sched;
    PipeExec x;
    TpComm comm;
    Stage work;
    const Session *s;
} Run3d;

// The state as the whole model (common/whole.h: one gather, save and load for every layout), the
// same file whatever the layout (bf16 saves the fp32 master, as 00 and 03 do), so a state
// resumes across layouts and precisions: this rank's slices are its chunks; replica 0's ranks
// add theirs (the replicated tensors from TP rank 0), the world sums them onto rank 0. --zero
// 1, 2: m and v (and bf16's master) exist for this replica's piece only: they are first
// all-gathered over DP into the stage's layout (dp.h's dpl_whole_state), and --save-sharded
// writes each rank's pieces. Every rank reads a --resume whole and keeps its slices (--zero 1,
// 2: its piece; dp.h's dpl_take_state, bf16 then rounding the weights the forward reads).
static const GPT2 *r3d_slice(void *ctx, int c) {
    return ((Run3d *)ctx)->models[c];
}

// The weights the forward reads (the --dump), or the fp32 weights AdamW updates (fp32 params,
// bf16 the master: the DP layer's), Adam m or v. Collective over DP.
static const float *r3d_part(void *ctx, int c, WholeBuf which, float *scratch) {
    Run3d *r = ctx;
    const int mine = r->grid.c.d == 0;  // replica 0's ranks add theirs
    if (which == WHOLE_WEIGHTS) {
        if (!mine && !r->dpl.sharded) return NULL;  // (sharded: every replica's pieces)
        dpl_weights_to_host(&r->dpl, c, scratch);
        return mine ? scratch : NULL;
    }
    float *whole;
    const float *buf = dpl_whole_state(&r->dpl, c, (DplState)(which - WHOLE_MASTER), &whole);
    if (!whole) return mine ? buf : NULL;  // (no ZeRO: the chunk's own buffer)
    if (mine) mem_copy(scratch, buf, r->models[c]->num_params * sizeof(float));
    mem_free(whole);
    return mine ? scratch : NULL;
}

static void r3d_take(void *ctx, int c, const float *p, const float *m, const float *v) {
    dpl_take_state(&((Run3d *)ctx)->dpl, c, p, m, v);
}

static void r3d_pieces(void *ctx, int c, float *p, float *m, float *v, float *held) {
    dpl_my_pieces(&((Run3d *)ctx)->dpl, c, p, m, v, held);
}

// ---------------------------------------------------------------------------------------------
// training

// The grid (one clear refusal of an impossible layout, on every rank), the schedule, this
// rank's chunks and their optimizer state, loaded or fresh, the executor; the loop's state
// (s->state) and first step; the figures and counters start from here.
static void setup(Run3d *r, Session *s, const LabArgs *args, const Flags3d *f) {
    const int world = dist_size();
    const GPT2Config cfg = lab_args_config(args);
    const int L = cfg.L, T = cfg.T, B = args->batch, v = f->v, m = f->m, tp = f->tp, pp = f->pp;
    int dp = f->dp;
    grid_check(world, &dp, tp, pp, v, cfg.NH, L);
    if (strcmp(f->schedule, "interleaved") != 0 && v != 1)
        lab_fail_collective("--chunks %d needs --schedule interleaved (the other schedules run one "
                            "chunk per rank)", v);
    if (f->sp && tp == 1)
        lab_fail_collective("--sequence-parallel splits each sequence over the ranks of a TP group, "
                            "and --tp 1 has one rank: nothing to split. Use --tp 2 or more (a "
                            "divisor of the %d heads whose TP groups fit the %d ranks), or leave "
                            "--sequence-parallel out", cfg.NH, world);
    if (f->sp) tp_check_sequence_parallel(T, tp);
    if (B % (dp * m) != 0)
        lab_fail_collective("--batch %d does not split into %d replicas x %d micro-batches; use a "
                            "multiple of %d", B, dp, m, dp * m);
    memset(r, 0, sizeof *r);
    if (f->max_w > 0 && strcmp(f->schedule, "zb") != 0)
        lab_fail_collective("--max-w-stores %d: only --schedule zb defers W's; use it with "
                            "--schedule zb, or leave it out", f->max_w);
    sched_make(&r->sched, f->schedule, pp, v, m);
    if (f->max_w > 0) sched_free(&r->sched), sched_zb_h1_capped(&r->sched, pp, m, f->max_w);
    char err[256];
    if (sched_check(&r->sched, err, sizeof err) != 0)
        lab_fail_collective("schedule %s: %s", r->sched.name, err);
    dpl_check(&f->dpo, r->sched.split);
    if (f->recompute != GPT2_RECOMPUTE_NONE && r->sched.split)
        lab_fail_collective("--recompute %s with --schedule zb: a zero-bubble W runs after its B and "
                            "would read what B recomputed, long gone; recomputation is offered with "
                            "--schedule gpipe, 1f1b and interleaved", gpt2_recompute_name(f->recompute));
    // every rank's peak predicted before anything big is allocated (mem_predict.h): one refusal
    const DplOpts *o = &f->dpo;
    const R3dLayout lay = {dp, tp, pp, v, m, &r->sched, o->fsdp ? 3 : o->zero, o->fsdp,
                           o->fsdp && o->prefetch >= 0 ? o->prefetch : 1, o->fsdp && o->reshard == 0,
                           f->recompute, f->sp};
    mem_refuse_if_it_cannot_fit(args, r3d_predict_memory, &lay, dp * m);
    // Where and in which precision the chunks live (tp.h's top: bf16 stores the weights,
    // gradients and the blocks' saved activations in bf16, the master and Adam in fp32, and
    // computes every piece in fp32). The MPI backend takes device buffers (staged through the
    // host, so several ranks can share one GPU); NCCL moves every op 09 issues on device
    // buffers (one GPU per rank). The batch stays on the host (copied into a set on a device).
    const int Bm = B / dp / m;
    session_open(s, args, Bm);  // this rank's batch buffers: one micro-batch
    const GPT2Dtype dtype = s->bf16 ? GPT2_BF16 : GPT2_FP32;
    r->s = s, r->v = v, r->dp = dp;
    grid_init_ordered(&r->grid, tp, dp, pp, strcmp(f->order, "pp-first") == 0);
    const int p = r->grid.c.p, per = L / (pp * v);
    int row0, Bl;  // this replica's rows of the global batch
    data_slice(B, r->grid.c.d, dp, &row0, &Bl);
    // This rank's chunks: TP slice t of virtual stages chunk·pp + p. The DP layer (dp.h) holds
    // the optimizer's state of each: the whole flat buffer, or under --zero 1, 2 this replica's
    // piece of it (shard_range over DP): Adam's m and v (and bf16's fp32 master: 05's bf16
    // ZeRO-1) exist for the piece only.
    Chunk *ch = r->ch = lab_xcalloc((size_t)v, sizeof(Chunk));
    for (int c = 0; c < v; c++) {
        ch[c].vs = c * pp + p;
        const TpShape shape = {.l0 = ch[c].vs * per, .l1 = (ch[c].vs + 1) * per, .tp = tp,
                               .r = r->grid.c.t, .sp = f->sp, .B = Bm, .T = T, .recompute = f->recompute};
        tp_build(&ch[c].m, cfg, s->dev, dtype, shape, (uint64_t)args->seed);  // (recompute: tp.h)
        ch[c].acts = lab_xcalloc((size_t)m, sizeof(GPT2Acts *));
    }
    r->models = lab_xcalloc((size_t)v, sizeof(GPT2 *));
    for (int c = 0; c < v; c++) r->models[c] = &ch[c].m;
    dpl_init(&r->dpl, &f->dpo, r->models, v, &r->grid, (uint64_t)args->seed);
    // What this rank holds of the whole model: its v chunks of TP slice t (--zero 1, 2: its DP
    // pieces of their state); replica 0's slices sum to the whole, TP rank 0's replicated tensors.
    r->whole = (WholeView){.ctx = r, .nslices = v, .slice = r3d_slice, .part = r3d_part,
                           .take = r3d_take, .pieces = r->dpl.zero ? r3d_pieces : NULL,
                           .group = dist_world(), .with_replicated = r->grid.c.t == 0,
                           .readers = NULL, .args = args};
    s->state = (SessionState){&r->whole, whole_save, whole_weights_to_host, whole_load};
    session_start_at(s, whole_load(&r->whole, args));
    mem_reset_peaks();  // the figures: from here on
    r->comm = tp_comm_group(r->grid.tpg);
    r->work = (Stage){.ch = ch, .dp = &r->dpl, .comm = &r->comm, .data = &s->data, .B = B, .Bm = Bm, .T = T,
                      .row0 = row0, .inputs = s->inputs, .targets = s->targets,
                      .dloss = 1.0f / ((float)Bm * (float)T * (float)m * (float)dpl_loss_divisor(&r->dpl)),
                      .BTC = (size_t)Bm * (T / (f->sp ? tp : 1)) * cfg.C, .split = r->sched.split};
    // bf16: the stage boundary messages travel as bf16 (08's executor): the activation is a
    // stored bf16 layer already (no loss), the gradient is rounded once per boundary. Under
    // SP a stage's stream is this rank's T/t positions: each TP rank sends its part only.
    pipe_exec_init(&r->x, &r->sched,
                   (PipeWork){&r->work, stage_f_begin, stage_forward, stage_b_begin, stage_backward,
                              stage_weights},
                   r->grid.ppg, p, r->work.BTC, dtype == GPT2_BF16, ch[0].m.k, s->dev);
    if (!args->quiet) grid_print(stdout, &r->grid);
    if (!args->quiet && s->rank == 0) r3d_print_setup(&cfg, &r->sched, B, dp, tp, Bm);
    dist_counters_reset();
    dist_group_counters_reset(r->grid.tpg);
    dist_group_counters_reset(r->grid.dpg);
    dist_group_counters_reset(r->grid.ppg);
    dist_link_held_reset(r->grid.tpg);
    dist_link_held_reset(r->grid.dpg);
    dist_link_held_reset(r->grid.ppg);
    session_watch_links(s, r->grid.tpg, r->grid.dpg, r->grid.ppg);  // --links: the loop's table
}

static void free_state(Run3d *r) {
    pipe_exec_free(&r->x);
    dpl_free(&r->dpl);
    free(r->models);
    for (int c = 0; c < r->v; c++) gpt2_free(&r->ch[c].m), free(r->ch[c].acts);
    free(r->ch);
    grid_free(&r->grid);
    sched_free(&r->sched);
}

// One step is the pipeline table (TP inside every stage), the tied wte, DP, the global norm and
// AdamW; the loop around it (progress line, fault hooks, checkpoints, the final weights) is the
// Session's (common/session.h).
static void train(const LabArgs *args, const Flags3d *f) {
    Session s;
    Run3d r;
    setup(&r, &s, args, f);
    Chunk *ch = r.ch;
    const Grid *grid = &r.grid;
    const int v = r.v, pp = f->pp, m = f->m;
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (--kill-rank, --kill-step)
        for (int c = 0; c < v; c++) gpt2_zero_grad(&ch[c].m);
        // 1. The pipeline table: forwards and backwards of the m micro-batches (TP inside).
        r.work.step = step;
        double loss_sum = pipe_exec_step(&r.x);
        if (session_nan_due(&s, step, s.N - 1)) session_poison(dpl_grad_first(&r.dpl), s.bf16);
        // 1b. SP: the replicated tensors' partial gradients (LayerNorms, row-parallel biases: each
        //     TP rank saw its positions only) summed over the TP group, once per step.
        for (int c = 0; f->sp && c < v; c++) tp_sp_grads_all_reduce(&ch[c].m, &r.comm);
        // 2. The tied wte's two copies: their gradients summed across the pipeline.
        sync_tied_wte(ch, v, grid->c.p, pp, grid->ppg);
        // 3. The step's loss: the last stage's mean over micro-batches, over replicas, to rank 0.
        float loss = (float)(loss_sum / m);
        dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, grid->dpg);
        dist_broadcast(&loss, 1, DIST_F32, pp - 1, grid->ppg);
        // 4. Unless the loss spiked (--on-spike), DP (dp.h): average the gradients over the
        //    replicas holding the same slice, or reduce-scatter them (--zero 1; --zero 2 did so
        //    after every micro-batch), the global norm over TP x PP (replicated tensors once),
        //    AdamW on what this rank updates, the updated pieces all-gathered.
        if (session_may_update(&s, step, loss))
            session_grad_norm_sq(&s, dpl_step(&r.dpl, &s.opt, step));  // (the health line's)
        session_step_end(&s, step, loss);  // the progress line, the --save-every checkpoint
    }
    // 5. The report (report.c): each dimension's bytes per step (this rank's groups, read
    //    before the final checkpoint and weights move anything), memory per rank; the --dump.
    double mine[R3D_NFIELDS];
    const DpLayer *d = &r.dpl;
    const R3dView view = {grid, r.dp, f->tp, pp, v, m, d->sharded ? 3 : d->zero, d->fsdp,
                          d->sharded && !d->reshard, ch[0].m.l0, ch[v - 1].m.l1, r.x.acts_peak, f->sp,
                          f->recompute};
    r3d_figures(&s, &view, mine);
    const int run = session_steps_run(&s);
    r3d_print_links(&s, &view, strcmp(f->order, "pp-first") == 0);  // --links only
    double *all = session_gather_report(&s, mine, R3D_NFIELDS);
    session_finish(&s);  // the final checkpoint, the final weights on rank 0, --save-weights
    if (s.rank == 0 && !args->quiet) r3d_print_table(all, s.N, v, s.bf16);
    if (s.rank == 0 && !args->quiet && f->recompute && run > 0) {  // rank 0's chunks: counted
        const GPT2 **ms = lab_xcalloc((size_t)v, sizeof *ms);       // against the formula
        for (int c = 0; c < v; c++) ms[c] = &ch[c].m;
        gpt2_print_recompute_cost(ms, v, run, r.work.Bm * m, s.T);
        free(ms);
    }
    if (s.rank == 0 && args->dump) r3d_write_dump(&s, all);
    free(all);
    free_state(&r);
    session_free(&s);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    Flags3d f = {.tp = 1, .pp = 1, .dp = 0, .schedule = "1f1b", .m = 2, .v = 1, .order = "tp-first",
                 .dpo = {.zero = 0, .fsdp = 0, .prefetch = -1, .reshard = -1}};
    FlagSpec extra[] = {
        {"--tp", FLAG_INT, &f.tp, 1, 1 << 20, NULL,
         "tensor-parallel degree: ranks per TP group (consecutive ranks); must divide --heads"},
        {"--pp", FLAG_INT, &f.pp, 1, SCHED_MAX_STAGES, NULL,
         "pipeline stages; pp x chunks must divide --layers"},
        {"--dp", FLAG_INT, &f.dp, 0, 1 << 20, NULL,
         "data-parallel replicas (0: ranks / (tp x pp)); dp x tp x pp must equal the ranks"},
        {"--schedule", FLAG_CHOICE, &f.schedule, 0, 0, "gpipe|1f1b|interleaved|zb",
         "the pipeline schedule (08's tables; zb: ZB-H1, the backward split: B the input gradient, W the weight gradients)"},
        {"--micro-batches", FLAG_INT, &f.m, 1, 10000, NULL,
         "m: micro-batches per step per replica (dp x m must divide --batch)"},
        {"--chunks", FLAG_INT, &f.v, 1, 64, NULL, "v: chunks of layers per stage (interleaved)"},
        {"--zero", FLAG_INT, &f.dpo.zero, 0, 3, NULL,
         "over DP: 0 DDP's all-reduce; 1 ZeRO-1 (reduce-scatter the gradients, AdamW on this "
         "replica's piece with m, v for it only, all-gather the weights); 2 ZeRO-2 (the same, the "
         "gradients reduce-scattered after every micro-batch, only the piece accumulating); 3 "
         "ZeRO-3 (the weights sharded too: each unit gathered before its forward and again before "
         "its backward, freed after)"},
        {"--fsdp", FLAG_BOOL, &f.dpo.fsdp, 0, 1, NULL,
         "over DP: FSDP (chapter 06): every unit of every chunk sharded over the replicas, "
         "gathered around its use (--prefetch, --reshard-after-forward)"},
        {"--prefetch", FLAG_INT, &f.dpo.prefetch, 0, 8, NULL,
         "with --fsdp: units whose all-gather starts ahead of the one running (default 1)"},
        {"--reshard-after-forward", FLAG_INT, &f.dpo.reshard, 0, 1, NULL,
         "with --fsdp: 1 free each unit after its forward (gathered again for its backward); 0 "
         "keep the units gathered until the step's update (default 1)"},
        {"--grid-order", FLAG_CHOICE, &f.order, 0, 0, "tp-first|pp-first",
         "where the ranks sit: tp-first (rank = t + tp(d + dp p): a TP group is consecutive ranks, "
         "one node) or pp-first (rank = p + pp(d + dp t): a PP group is consecutive ranks, TP "
         "spread over nodes; with --links, question 5's experiment, tools/why_tp_in_node.sh)"},
        {"--sequence-parallel", FLAG_BOOL, &f.sp, 0, 1, NULL,
         "sequence parallelism in every TP stage (chapter 07): LayerNorms and residuals on T/tp "
         "positions per rank, g a reduce-scatter and f an all-gather; needs --tp > 1 dividing --seq"},
        {"--max-w-stores", FLAG_INT, &f.max_w, 0, 10000, NULL,
         "--schedule zb: at most this many W stores pending per stage (0: ZB-H1's own table; "
         "chapter 08)"},
    };
    lab_parse_args_for(LAB_FLAGS_MODEL | LAB_FLAGS_TRAINING | LAB_FLAGS_HARDWARE | LAB_FLAGS_OUTPUT |
                           LAB_FLAGS_RELIABILITY | LAB_FLAGS_KILL | LAB_FLAGS_RECOMPUTE,
                       argc, argv, &args,
                       extra, (int)(sizeof extra / sizeof extra[0]), "09_3d/run", USAGE);
    f.recompute = lab_args_recompute(&args);
    train(&args, &f);
    dist_finalize();
    return 0;
}
