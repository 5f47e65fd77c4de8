// tp_model.h: one rank's share of a tensor-parallel GPT-2, composed of common/tp.h's pieces.
//
// Rank r of a TP group of t ranks holds ONE flat buffer of weights (and one of gradients, and
// Adam's m and v of the same length), in this order:
//   wte_local (Vl, C)        rows [r·Vl, (r+1)·Vl) of the tied wte, padded rows zero   sharded
//   wpe (T, C)                                                                          replicated
//   block 0 .. L-1 shards    tp_block_count(C, t) each: heads [r·NH/t, ...) of qkv and
//                            attproj, hidden units [r·4C/t, ...) of fc and fcproj,
//                            LayerNorms and the row-parallel biases replicated         mixed
//   lnfw (C), lnfb (C)                                                                  replicated
// so AdamW (elementwise) runs on the flat buffer as it does on the full model's, and the
// gradient-norm clip sums the sharded tensors over the group and the replicated ones once.
// The forward and backward go through tp.h (embedding, blocks, head, loss); they communicate
// only through the TpComm, so a test can count every all-reduce and forget one on purpose.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "gpt2.h"
#include "kernels.h"
#include "optim.h"
#include "tp.h"

#define TPM_MAX_PARAMS (4 + 12 * 64)

typedef struct TpModel {
    GPT2Config cfg;
    int tp, r;               // group size, this rank's place
    TpVocab tv;
    int B, T;                // the batch this rank runs (its data-parallel rows, all T)
    size_t n;                // elements of the flat buffers
    GPT2Param plist[TPM_MAX_PARAMS];  // the tensors of the flat buffer: offsets, decay
    int sharded[TPM_MAX_PARAMS];      // 1: this rank holds a slice (the norm sums the group)
    int nplist;
    float *params, *grads, *opt_m, *opt_v;   // (n) each
    // views into params / grads
    float *wte, *wpe, *lnfw, *lnfb, *dwte, *dwpe, *dlnfw, *dlnfb;
    TpBlock *w, *dw;         // (L)
    TpBlockActs *a;          // (L)
    TpScratch s;
    TpHeadActs h;
    float *enc, *dx;         // (B·T, C): the embedding's output, the gradient flowing down
                             // (sequence parallel: (B·T/t, C), this rank's positions)
    int sp;                  // 1: sequence parallelism (tpm_build_sp; tp.h's SP section)
} TpModel;

// Builds rank r's share (weights of gpt2_init_params(seed)'s model, each shard initialized
// alone) and its activations for (B, T). tp_check_config must have passed.
void tpm_build(TpModel *m, GPT2Config cfg, int tp, int r, int B, int T, uint64_t seed);
// The same, with sequence parallelism when sp (T % tp == 0, tp_check_sequence_parallel): the
// activations of tp.h's SP section; tpm_forward / tpm_backward then run the SP block, and
// tpm_backward ends with one all-reduce of the replicated tensors' partial gradients (site
// "sp grads": every block's ln1w ln1b attprojb ln2w ln2b fcprojb, and lnfw lnfb; wpe's is whole:
// the embedding's backward all-gathers d x first). Weights, gradients, Adam: as without SP.
void tpm_build_sp(TpModel *m, GPT2Config cfg, int tp, int r, int B, int T, uint64_t seed, int sp);
void tpm_free(TpModel *m);

// Forward and backward of one batch: returns the mean loss (the same on every rank of the
// group). dloss: d objective / d loss per position. Gradients are accumulated (zero them first).
float tpm_forward(TpModel *m, TpComm *c, const int *inputs, const int *targets);
void tpm_backward(TpModel *m, TpComm *c, const int *inputs, const int *targets, float dloss);
void tpm_zero_grad(TpModel *m);

// Clip (the global norm: the sharded tensors' squares summed over g, the replicated ones
// counted once) and AdamW on the flat buffer. Fails the run naming the step on NaN/Inf.
void tpm_adamw_step(TpModel *m, const AdamW *h, int step, DistGroup *g);

// The full model's weights in llm.c's order (the order of --dump and weights files), on the
// group's rank 0 (full: gpt2_param_count floats there; NULL elsewhere): every rank writes its
// slices into a zeroed full buffer (the replicated tensors from rank 0), the group sums them
// (x + 0 == x: exact). Collective over g.
void tpm_gather_full(const TpModel *m, DistGroup *g, float *full);

// The same for any flat buffer of m's layout (params, opt_m, opt_v), in the full model's
// MEMORY order (gpt2.h, what ckpt_save_training takes): on the group's rank 0. Collective over g.
void tpm_gather_flat(const TpModel *m, DistGroup *g, const float *flat, float *full_mem);
// The inverse, no communication: this rank's slices of full_mem (the full model in memory
// order, on this rank) into flat (m's layout); the padded vocabulary rows are zero.
// tpm_take_flat(tpm_gather_flat(x)) == x, bit for bit (checkpoints move between any tp).
void tpm_take_flat(const TpModel *m, const float *full_mem, float *flat);

// Largest |w - w on group rank 0| over the replicated tensors (LayerNorms, wpe, the row-parallel
// biases): 0 when every rank applied the same updates to them. Collective over g.
double tpm_replicated_max_diff(const TpModel *m, DistGroup *g);

// Bytes of one block's saved activations on this rank (what tp_block_acts_alloc allocates),
// and of the whole model's weights (the flat buffer: sharded part + replicated part).
size_t tpm_block_act_floats(const TpModel *m);  // (m->sp: the SP block's)
void tpm_weight_split(const TpModel *m, size_t *sharded, size_t *replicated);

// ---- one pipeline stage of a TP model (chapter 09: TP inside each stage of a pipeline) ---------
//
// A stage holds blocks [l0, l1) of the full model, the embedding when l0 == 0 and the head when
// l1 == L, each tensor as a TP rank's share (the slices above); its flat buffer is, in order:
//   wte_local (Vl, C)   when the stage has the embedding or the head (one buffer when both; a
//                       last stage that is not the first holds a COPY of the tied wte: its
//                       gradient is summed with the first stage's before the step)
//   wpe (T, C)          the first stage
//   block shards        l0 .. l1-1
//   lnfw, lnfb (C)      the last stage
// Activations are per micro-batch (TpStageActs), so a pipeline schedule can keep several alive.
typedef struct TpStage {
    GPT2Config cfg;
    int tp, r;               // TP group size, this rank's place
    TpVocab tv;
    int l0, l1, has_embed, has_head;
    int B, T;                // one micro-batch
    size_t n;                // elements of the flat buffers
    GPT2Param plist[TPM_MAX_PARAMS];
    int sharded[TPM_MAX_PARAMS];    // 1: a slice over the TP group
    int tied_copy[TPM_MAX_PARAMS];  // 1: the last stage's copy of wte (counted on the first stage)
    int nplist;
    float *params, *grads, *opt_m, *opt_v;
    // views (NULL where the stage has none)
    float *wte, *wpe, *lnfw, *lnfb, *dwte, *dwpe, *dlnfw, *dlnfb;
    TpBlock *w, *dw;         // (l1 - l0)
    TpScratch s;             // the blocks' backward scratch (one micro-batch at a time)
} TpStage;

// What one micro-batch leaves on a stage between its forward and its backward.
typedef struct TpStageActs {
    TpBlockActs *a;          // (l1 - l0)
    TpHeadActs h;            // the last stage
    float *in;               // (B·T, C): the stage's input (embedding output, or received)
    float *dx;               // (B·T, C): before backward the gradient of the output (received,
                             // unless the stage has the head); after it, the gradient of `in`
} TpStageActs;

void tpm_stage_build(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B, int T,
                     uint64_t seed);
void tpm_stage_free(TpStage *st);
void tpm_stage_acts_alloc(TpStageActs *x, const TpStage *st);  // MEM_ACTS
void tpm_stage_acts_free(TpStageActs *x, const TpStage *st);
// Bytes of one micro-batch's TpStageActs (what tpm_stage_acts_alloc allocates), from the shapes.
size_t tpm_stage_act_bytes(const TpStage *st);
// Forward of one micro-batch: the first stage embeds `inputs`, others read x->in; returns the
// micro-batch's mean loss on the last stage (targets), 0 elsewhere.
float tpm_stage_forward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets);
// The stage's output (B·T, C) after tpm_stage_forward: what goes to the next stage.
const float *tpm_stage_output(const TpStage *st, const TpStageActs *x);
// Backward of one micro-batch (gradients accumulated): the last stage starts from the loss
// (dloss per position), others from x->dx; leaves d in in x->dx (the first stage: used up by
// the embedding's backward).
void tpm_stage_backward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets, float dloss);
// Σ g² of this rank's gradients: sq[0] of the sliced tensors, sq[1] of the TP-replicated ones;
// the last stage's copy of wte is left out (the first stage counts it). No communication.
void tpm_stage_norm_parts(const TpStage *st, double sq[2]);
// The same over elements [lo, hi) of the flat buffer only, read from g (hi - lo floats: this
// rank's ZeRO shard of the gradient).
void tpm_stage_norm_parts_range(const TpStage *st, size_t lo, size_t hi, const float *g, double sq[2]);
// Writes this rank's tensors into full_mem (the FULL model's flat buffer, memory order, zeroed
// by the caller): the slices always, the replicated tensors only when with_replicated, the
// tied copy never. Summing such buffers over a TP x PP grid (one with_replicated per TP group)
// gives the whole model exactly (x + 0 == x).
void tpm_stage_unshard(const TpStage *st, float *full_mem, int with_replicated);
// The same for any buffer laid out as the stage's flat buffer (its gradients, Adam's m or v).
void tpm_stage_unshard_buf(const TpStage *st, const float *buf, float *full_mem, int with_replicated);
// The reverse: buf (st->n floats, the stage's layout) := this rank's slices of full_mem (the full
// model's memory order), the tied copy included (a checkpoint of any layout resumes here).
void tpm_stage_shard_buf(const TpStage *st, const float *full_mem, float *buf);
