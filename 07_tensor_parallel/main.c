// 07_tensor_parallel: Megatron-LM tensor parallelism (Shoeybi et al. 2019).
//
//   make 07_tensor_parallel && mpirun -np 4 ./07_tensor_parallel/run --tp 4
//
// The world is split into TP groups of --tp consecutive ranks (and, when --tp < world, the
// groups are data-parallel replicas of each other). Inside a group every rank holds:
//   - its heads of every block's attention: the q, k, v rows of those heads (column-parallel)
//     and the attention projection's matching columns (row-parallel);
//   - its hidden units of every block's MLP: fc's rows (column-parallel), fcproj's columns
//     (row-parallel);
//   - its rows of the tied wte (the vocabulary split: V/tp rows, padded when tp does not
//     divide V);
//   - all of the rest (LayerNorms, wpe, the row-parallel layers' biases): replicated.
// One step: the embedding all-reduces the rows each rank looked up; per block, each half
// (attention, MLP) computes on its own shard and g all-reduces the partial outputs; the loss is
// computed from the local logits with three all-reduces of B·T floats (max, sum of exp, target
// logit) and never gathers the logits; backward mirrors it: f at each half's input all-reduces
// the gradient. Every rank then updates its own slice of the weights with AdamW (the norm for
// clipping summed over the group). --sequence-parallel (Korthikanti et al. 2022): between the
// halves the stream lives on T/tp positions of each sequence per rank; each all-reduce of B·T·C
// becomes a reduce-scatter (g) or an all-gather (f), and the LayerNorms' partial gradients are
// all-reduced. --save / --resume move the FULL model (any --tp, or chapter 00, resumes it).
// --dtype bf16: gpt2's mixed precision piece by piece (bf16 weights, gradients and stored
// activations, an fp32 master; every piece computes in fp32 and the all-reduces carry fp32);
// --device cuda runs the same pieces on the GPU's kernels, --backend nccl their collectives. This
// rank's slice is a GPT2 (gpt2_build_tp: the one model, cut by heads, hidden units and
// vocabulary rows) and the pieces are common/tp.c's: the step below runs embedding -> every
// block -> loss and back through them; with --tp 1 they are gpt2's own, and this is chapter 00's
// training bit for bit. This file is the training loop and the checkpoints; the report is
// report.c's.
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
#include "mem.h"
#include "mem_predict.h"
#include "optim.h"
#include "report.h"
#include "results.h"
#include "session.h"
#include "tp.h"
#include "trace.h"
#include "train.h"
#include "whole.h"
#include "zero.h"

static const char *USAGE =
    "07_tensor_parallel: Megatron tensor parallelism. Every block's attention is split by heads\n"
    "and its MLP by hidden units over the --tp ranks of a group; the partial results meet in\n"
    "all-reduces (4 per block per step); the loss never gathers the logits.\n"
    "\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 4           4-way TP: 1 head of 4 per rank\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --vocab 251\n"
    "                                                          a vocabulary tp does not divide:\n"
    "                                                          padded to 252 rows, 126 per rank\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 2           2 TP groups of 2, data-parallel\n"
    "  mpirun -np 1 ./07_tensor_parallel/run --tp 1           one rank: chapter 00's training\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 4 --sequence-parallel\n"
    "                                                          sequence parallelism: the same bytes\n"
    "                                                          on the wire (reduce-scatter +\n"
    "                                                          all-gather), fewer activations\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --dtype bf16\n"
    "                                                          mixed precision: bf16 weights,\n"
    "                                                          gradients and stored activations,\n"
    "                                                          fp32 master; fp32 compute and wire\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --device cuda --backend nccl\n"
    "                                                          on GPUs (one per rank), NCCL\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --recompute full\n"
    "                                                          activation recomputation: each block\n"
    "                                                          keeps its input; backward reruns its\n"
    "                                                          forward, f and g included (6 instead\n"
    "                                                          of 4 tensors per block on the wire)\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 4 --save s.ckpt --stop-at 4\n"
    "  ./00_memory_budget/run --train --resume s.ckpt           the checkpoint holds the full model,\n"
    "                                                          not the slices: chapter 00 (or any\n"
    "                                                          --tp) resumes it\n"
    "\n"
    "--tp must divide the number of heads (whole heads per rank) and the number of ranks.\n"
    "It prints which rank holds which heads, hidden units and vocabulary rows, the all-reduces\n"
    "of one step with their sizes against the formula, and the memory of each rank.\n";

typedef struct TpFlags {
    int tp;               // ranks per TP group (0: all ranks)
    int sp;               // --sequence-parallel
    GPT2Recompute recompute;  // --recompute (a shared flag): the slice's sets keep less (tp.h)
} TpFlags;

// This rank's part of the run: its TP slice of the model (a GPT2), one batch's activations, the
// optimizer's state of the slice (a ZeroShard of one part: the whole slice), its groups (the
// SessionState's context).
typedef struct Tp7 {
    GPT2 m;
    GPT2Acts a;
    ZeroLayout z;
    ZeroShard opt;
    DistGroup *tpg, *dpg;  // TP = consecutive ranks (inside a node), DP = the same place in each
    DistGroup *ckg;        // a copy of tpg for the checkpoints: their traffic stays out of the
                           // step's counters
    WholeView whole;       // what this rank's state is of the whole model (save, load, gather)
    int dp;
    const Session *s;
} Tp7;

// The state as the whole model (common/whole.h: one gather, save and load for every layout):
// this rank holds one slice, TP slice r of every block; TP group 0 (DP rank 0) gathers it over
// ckg (a copy of the TP group: the checkpoints' traffic, --val-every's included, stays out of the
// step's counters), TP rank 0 adding the replicated tensors; world rank 0 reads a --resume and
// broadcasts it, every rank takes its slices (gpt2_shard: the exact inverse of the gather).
static const GPT2 *tp7_slice(void *ctx, int c) {
    (void)c;
    return &((Tp7 *)ctx)->m;
}

// The weights the forward reads (bf16: widened), or the optimizer's master, Adam m or v.
static const float *tp7_part(void *ctx, int c, WholeBuf which, float *scratch) {
    Tp7 *t = ctx;
    (void)c;
    if (which == WHOLE_WEIGHTS) {
        gpt2_weights_to_host(&t->m, scratch);
        return scratch;
    }
    return which == WHOLE_MASTER ? t->opt.master : which == WHOLE_ADAM_M ? t->opt.opt_m : t->opt.opt_v;
}

static void tp7_take(void *ctx, int c, const float *p, const float *m, const float *v) {
    Tp7 *t = ctx;
    (void)c;
    gpt2_shard(&t->m, p, t->opt.master);
    if (m) gpt2_shard(&t->m, m, t->opt.opt_m), gpt2_shard(&t->m, v, t->opt.opt_v);
    zero_shard_master_to_params(&t->z, &t->opt);  // bf16: the weights the forward reads
}

// The layout (refusing what cannot run), the groups, this rank's slice, its state loaded or
// fresh, the loop's state (s->state) and first step; the counters start at zero. Returns Bl.
// The memory rank `rank` will need (mem_predict.h): its TP slice, one batch of its group's rows.
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const TpFlags *f = ctx;
    const int tp = f->tp ? f->tp : dist_size(), dp = dist_size() / tp;
    GPT2Config cfg = lab_args_config(args);
    return mem_predict_tp_recompute(&cfg, tp, rank % tp, f->sp, batch / dp,
                                    strcmp(args->dtype, "bf16") == 0, f->recompute);
}

// The layout (refusing what cannot run), the groups, this rank's slice, its state loaded or
// fresh, the loop's state (s->state) and first step; the counters start at zero. Returns Bl.
static int setup(Tp7 *t, Session *s, const LabArgs *args, const TpFlags *f, int *row0) {
    const int rank = dist_rank(), world = dist_size();
    const GPT2Config cfg = lab_args_config(args);
    const int tp = f->tp ? f->tp : world;
    if (tp > world)
        lab_fail_collective("--tp %d: larger than the %d rank%s of the job; valid: a divisor of "
                            "%d (and of the %d heads)", tp, world, world > 1 ? "s" : "", world,
                            cfg.NH);
    if (world % tp != 0)
        lab_fail_collective("--tp %d does not divide the %d ranks into whole TP groups; valid: "
                            "a divisor of %d (and of the %d heads)", tp, world, world, cfg.NH);
    tp_check_config(&cfg, tp);  // whole heads per rank
    if (f->sp && tp == 1)
        lab_fail_collective("--sequence-parallel splits each sequence over the ranks of a TP group, "
                            "and --tp 1 has one rank: nothing to split. Use --tp 2 or more (a "
                            "divisor of the %d heads and of the %d ranks), or leave "
                            "--sequence-parallel out", cfg.NH, world);
    if (f->sp) tp_check_sequence_parallel(cfg.T, tp);
    const int dp = world / tp;
    if (args->batch % dp != 0)
        lab_fail_collective("--batch %d does not split over %d data-parallel groups; use a "
                            "multiple of %d", args->batch, dp, dp);
    int Bl;  // this group's rows of the global batch (every rank of a group: the same)
    data_slice(args->batch, rank / tp, dp, row0, &Bl);
    mem_refuse_if_it_cannot_fit(args, predict_memory, f, dp);  // before the first allocation
    session_open(s, args, Bl);  // (--backend nccl picks this rank's GPU first)
    memset(t, 0, sizeof *t);
    t->s = s, t->dp = dp;
    t->tpg = dist_split(s->world, rank / tp, rank % tp, "tp");
    t->dpg = dist_split(s->world, rank % tp, rank / tp, "dp");
    // This rank's share of the model, initialized slice by slice from --seed, on --device in
    // --dtype (bf16: the fp32 master beside bf16 weights and gradients): every block (l0 = 0,
    // l1 = L), one batch's activations, the optimizer's state of the whole slice.
    const TpShape shape = {.l0 = 0, .l1 = cfg.L, .tp = tp, .r = t->tpg->rank, .sp = f->sp, .B = Bl, .T = cfg.T,
                           .recompute = f->recompute};
    tp_build(&t->m, cfg, s->dev, s->bf16 ? GPT2_BF16 : GPT2_FP32, shape, (uint64_t)args->seed);
    tp_acts_alloc(&t->a, &t->m);
    zero_layout_init_buffer(&t->z, t->m.num_params, 1, 0);  // one part: the whole slice
    zero_shard_alloc(&t->opt, &t->z, &t->m, (uint64_t)args->seed);
    t->ckg = dist_split(s->world, rank / tp, rank % tp, "tp-ckpt");
    // What this rank holds of the whole model: one TP slice; TP group 0 sums its slices (over
    // the checkpoints' copy of the group), TP rank 0 with the replicated tensors.
    t->whole = (WholeView){.ctx = t, .nslices = 1, .slice = tp7_slice, .part = tp7_part,
                           .take = tp7_take, .group = t->dpg->rank == 0 ? t->ckg : NULL,
                           .with_replicated = t->tpg->rank == 0, .readers = dist_world(),
                           .args = args};
    s->state = (SessionState){&t->whole, whole_save, whole_weights_to_host, whole_load};
    session_start_at(s, whole_load(&t->whole, args));
    if (!args->quiet && rank == 0) tp7_print_layout(&t->m, world, dp);
    dist_counters_reset();
    dist_group_counters_reset(t->tpg);
    dist_group_counters_reset(t->dpg);
    session_watch_links(s, t->tpg, t->dpg, NULL);  // --links: the loop's table (report.c)
    return Bl;
}

static void free_state(Tp7 *t) {
    zero_shard_free(&t->opt);
    zero_layout_free(&t->z);
    gpt2_acts_free(&t->a);
    gpt2_free(&t->m);
    dist_group_free(t->ckg);
    dist_group_free(t->dpg);
    dist_group_free(t->tpg);
}

// The loop around the step (progress line, fault hooks, checkpoints, the final weights) is the
// Session's (common/session.h); the step is TP's: common/tp.c's pieces, one hop away.
static void train(const LabArgs *args, const TpFlags *f) {
    Session s;
    Tp7 t;
    int row0;
    const int Bl = setup(&t, &s, args, f, &row0);
    GPT2 *m = &t.m;
    GPT2Acts *a = &t.a;
    TpComm comm = tp_comm_group(t.tpg);
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (--kill-rank, --kill-step)
        // 1. The group's batch: every rank of the group reads the same rows.
        data_batch(&s.data, (uint64_t)step, args->batch, s.T, row0, Bl, s.inputs, s.targets);
        gpt2_acts_set_batch(m, a, s.inputs, s.targets);
        // 2. Forward: embedding (1 all-reduce), L blocks (g: 2 each), loss (3 of B·T).
        //    Sequence parallel: the stream on this rank's T/tp positions of each sequence;
        //    each all-reduce of B·T·C a reduce-scatter (g) or an all-gather (f).
        int tok = trace_begin("forward", TRACE_COMPUTE);
        tp_embed_forward(m, a, &comm);
        for (int l = 0; l < m->cfg.L; l++) tp_block_forward(m, a, &comm, l, NULL);  // (NULL: own weights)
        float loss = tp_head_forward(m, a, &comm);
        trace_end(tok);
        // 3. Backward, the mirror: head (f: 1), L blocks (f: 2 each), the embedding; the mean
        //    over this group's rows. Sequence parallel: then one all-reduce of the LayerNorms'
        //    and the row-parallel biases' gradients (each rank saw its positions only).
        gpt2_zero_grad(m);
        tok = trace_begin("backward", TRACE_COMPUTE);
        tp_head_backward(m, a, &comm, 1.0f / ((float)Bl * (float)s.T));
        for (int l = m->cfg.L - 1; l >= 0; l--) tp_block_backward(m, a, &comm, l, NULL, NULL);
        tp_embed_backward(m, a, &comm);
        if (m->sp) tp_sp_grads_all_reduce(m, &comm);
        trace_end(tok);
        if (session_nan_due(&s, step, 0)) session_poison(train_grads(m), s.bf16);
        // 4. Data parallel across groups (--tp < world): average the slices rank r of every
        //    group holds (the same slices; in their storage precision, bf16 like 03), and the loss.
        if (t.dp > 1) {
            dist_all_reduce(train_grads(m), train_grads(m), m->num_params, train_dtype(m), DIST_AVG, t.dpg);
            dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, t.dpg);
        }
        // 5. Clip with the norm of the whole model: each slice lives on one rank (sum over the
        //    group), each replicated tensor on all of them with the same value (count it once).
        //    Then every rank updates its own slice; the replicated tensors get the same update
        //    everywhere (same gradients, same clip scale).
        tok = trace_begin("optimizer", TRACE_COMPUTE);
        if (session_may_update(&s, step, loss)) {  // (a loss spike: --on-spike)
            double sq[2];  // sliced, replicated
            tp_norm_parts(m, 0, m->num_params, train_grads(m), sq);
            dist_all_reduce(&sq[0], &sq[0], 1, DIST_F64, DIST_SUM, t.tpg);
            const double norm_sq = sq[0] + sq[1];
            zero_adamw(&t.z, &t.opt, &s.opt, step, adamw_clip_scale(&s.opt, norm_sq, step));
            session_grad_norm_sq(&s, norm_sq);
        }
        trace_end(tok);
        session_step_end(&s, step, loss);  // the progress line, the --save-every checkpoint
    }
    // 6. The report: communication per step against the formula (measured before the final
    //    checkpoint and weights move anything), memory per rank; the --dump (report.c).
    Tp7Figures fig;
    tp7_measure(&fig, m, &comm, t.tpg, session_steps_run(&s), session_elapsed(&s), args->batch);
    tp7_print_links(&s, f->tp ? f->tp : s.N, f->sp, f->recompute);  // --links only
    double replicated_diff = args->dump ? tp7_replicated_max_diff(m, t.opt.master, t.tpg) : 0.0;
    session_finish(&s);  // the final checkpoint, the final weights on rank 0, --save-weights
    if (!args->quiet) tp7_print_report(&fig, m, t.tpg, s.N);
    if (!args->quiet && s.rank == 0 && m->recompute && session_steps_run(&s) > 0) {
        const GPT2 *ms[1] = {m};  // this slice's blocks: counted against the formula
        gpt2_print_recompute_cost(ms, 1, session_steps_run(&s), Bl, s.T);
    }
    if (args->dump && s.rank == 0) tp7_write_dump(&s, &fig, t.dp, replicated_diff);
    free_state(&t);
    session_free(&s);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    TpFlags f = {.tp = 0, .sp = 0};
    FlagSpec extra[] = {
        {"--tp", FLAG_INT, &f.tp, 0, 1 << 20, NULL,
         "ranks per tensor-parallel group (0: all ranks); must divide the heads and the ranks"},
        {"--sequence-parallel", FLAG_BOOL, &f.sp, 0, 1, NULL,
         "sequence parallelism: LayerNorms and residuals on T/tp positions per rank, g a "
         "reduce-scatter, f an all-gather (--seq must be a multiple of --tp)"},
    };
    lab_parse_args_for(LAB_FLAGS_MODEL | LAB_FLAGS_TRAINING | LAB_FLAGS_HARDWARE | LAB_FLAGS_OUTPUT |
                           LAB_FLAGS_RELIABILITY | LAB_FLAGS_KILL | LAB_FLAGS_RECOMPUTE, argc, argv, &args,
                       extra, (int)(sizeof extra / sizeof extra[0]), "07_tensor_parallel/run",
                       USAGE);
    f.recompute = lab_args_recompute(&args);
    train(&args, &f);
    dist_finalize();
    return 0;
}
