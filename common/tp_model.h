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
