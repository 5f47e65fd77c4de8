// tp_model.h: one rank's share of a tensor-parallel GPT-2 (TpStage), composed of common/tp.h's
// pieces: blocks [l0, l1) of TP slice r of t. Chapter 07 builds every block (l0 = 0, l1 = L),
// chapter 09 one pipeline stage (or chunk) each; t = 1 holds whole tensors.
//
// Rank r of a TP group of t ranks holds ONE flat buffer of weights (and one of gradients of the
// same length; the caller's optimizer state, TpOpt, has the same layout), in this order:
//   wte_local (Vl, C)        rows [r·Vl, (r+1)·Vl) of the tied wte, padded rows zero   sharded
//                            (when the stage has the embedding or the head; a last stage that
//                            is not the first holds a COPY of the tied wte: its gradient is
//                            summed with the first stage's before the step)
//   wpe (T, C)               the first stage                                            replicated
//   block l0 .. l1-1 shards  tp_block_count(C, t) each: heads [r·NH/t, ...) of qkv and
//                            attproj, hidden units [r·4C/t, ...) of fc and fcproj,
//                            LayerNorms and the row-parallel biases replicated         mixed
//   lnfw (C), lnfb (C)       the last stage                                             replicated
// so AdamW (elementwise) runs on the flat buffer as it does on the full model's, and the
// gradient-norm clip sums the sharded tensors over the group and the replicated ones once.
// The forward and backward go through tp.h (embedding, blocks, head, loss); they communicate
// only through the TpComm, so a test can count every all-reduce and forget one on purpose.
//
// Activations are per micro-batch (TpStageActs), so a pipeline schedule can keep several alive.
//
// Device and precision (TpOpts; zero-initialized: the host, fp32, no SP). The buffers live on
// opts.dev and the pieces run on kernels_get(dev) (bf16 on CUDA: kernels_get_tf32, as gpt2).
// Mixed precision (GPT2_BF16) is gpt2.c's, piece by piece, so the numbers mean the same thing:
//   weights    params_bf16 (MEM_PARAMS, 2 bytes) is what the pieces read; the caller's TpOpt
//              holds the fp32 master (MEM_MASTER) AdamW updates, rounded into params_bf16 after
//              each step; params is NULL;
//   gradients  grads_bf16 (MEM_GRADS, 2 bytes); grads is NULL;
//   pieces     the embedding (wte_local, wpe), each block shard (one span), the head (wte_local;
//              lnfw, lnfb): before a piece runs its bf16 spans are widened into ONE fp32 `work`
//              buffer (the largest piece's size), its gradients into `work_grads`, the backward
//              accumulates there in fp32, and they are rounded back once after its backward;
//   activations  every block computes in ONE fp32 working set (TpBlockActs) and its saved set
//              (the working set's contiguous `mem`) is stored rounded, 2 bytes per element
//              (MEM_ACTS); the next block and the head read the stored output widened, forward
//              and again in backward; a block's backward widens its stored set back into the
//              working set. The embedding's output, the head's activations and every gradient
//              of an activation stay fp32;
//   the wire   the pieces compute in fp32 and reduce their fp32 buffers: the same bytes as fp32
//              (Megatron would reduce bf16 activations). The SP "sp grads" all-reduce widens the
//              partial bf16 gradients, sums them in fp32, rounds once more.
// Inputs and targets are host arrays; on CUDA they are copied into device buffers first.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "gpt2.h"
#include "kernels.h"
#include "optim.h"
#include "tp.h"

#define TPM_MAX_PARAMS (4 + 12 * 64)

// Where and in which precision a TP model (or stage) lives. {0}: DEV_CPU, GPT2_FP32, no SP.
typedef struct TpOpts {
    Device dev;
    GPT2Dtype dtype;
    int sp;                  // sequence parallelism (the whole model only: chapter 07)
} TpOpts;

// What a bf16 or a device run needs besides the flat buffers (tp_model.c's; NULL where not needed: fp32 has no work buffers, the host
// reads the batch in place).
typedef struct TpMixed {
    float *work, *work_grads;   // bf16: (work_size) fp32, the running piece's weights / gradients
    size_t work_size;           //       (MEM_OTHER, as gpt2's)
    float *block_in;            // bf16: the widened stored output the running piece reads (MEM_ACTS)
    int *inputs, *targets;      // a device: (B·T) copies of the batch (MEM_OTHER)
    float *host_losses;         // a device: (B·T) the per-position losses read back
} TpMixed;

typedef struct TpStage {
    GPT2Config cfg;
    int tp, r;               // TP group size, this rank's place
    TpVocab tv;
    int l0, l1, has_embed, has_head;
    int sp;                  // 1: sequence parallelism (tp.h's SP section; every block only)
    int B, T;                // one micro-batch
    size_t n;                // elements of the flat buffers
    GPT2Param plist[TPM_MAX_PARAMS];
    int sharded[TPM_MAX_PARAMS];    // 1: a slice over the TP group
    int tied_copy[TPM_MAX_PARAMS];  // 1: the last stage's copy of wte (counted on the first stage)
    int nplist;
    Device dev;
    GPT2Dtype dtype;
    const Kernels *k;
    GPT2 g;                  // the weights and gradients: TP slice r of t of blocks [l0, l1)
                             // (gpt2_build_tp); the fields below are views of it
    // The weights and gradients in the storage precision, n each (the master and Adam's m, v
    // are the caller's: TpOpt, as Session keeps them for a GPT2)
    float *params, *grads;                   // fp32, else NULL
    uint16_t *params_bf16, *grads_bf16;      // bf16, else NULL
    // Where the tensors start in the flat buffer (valid for every buffer of its layout)
    size_t off_wte, off_wpe, off_lnf;   // (where the stage has them)
    size_t *off_block;                  // (l1 - l0)
    TpScratch s;             // the blocks' backward scratch (one micro-batch at a time)
    TpBlockActs wa;          // bf16: the ONE fp32 working set of the blocks (else unused)
    float *out;              // bf16, a stage without the head: (B·T, C) tpm_stage_output's copy
    TpMixed x;
} TpStage;

// What one micro-batch leaves on a stage between its forward and its backward.
typedef struct TpStageActs {
    TpBlockActs *a;          // (l1 - l0) fp32; bf16: NULL (the stored sets below)
    uint16_t *a_bf16;        // bf16: (l1 - l0) · tp_block_acts' elements, rounded (MEM_ACTS)
    TpHeadActs h;            // the last stage
    float *in;               // (rows, C): the stage's input (embedding output, or received)
    float *dx;               // (rows, C): before backward the gradient of the output (received,
                             // unless the stage has the head); after it, the gradient of `in`
                             // (rows: B·T; under SP B·T/t, this rank's positions)
} TpStageActs;

void tpm_stage_build(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B, int T,
                     uint64_t seed);
// The same on opts.dev in opts.dtype (the storage of tp_model.h's top). opts.sp: sequence
// parallelism (T % tp == 0; every block, l0 = 0 and l1 = L): the activations of tp.h's SP
// section, and tpm_stage_backward ends with one all-reduce of the replicated tensors' partial
// gradients (site "sp grads": every block's ln1w ln1b attprojb ln2w ln2b fcprojb, and lnfw lnfb;
// wpe's is whole: the embedding's backward all-gathers d x first). Weights, gradients, Adam: as
// without SP. tpm_stage_build == tpm_stage_build_opts(..., (TpOpts){0}).
void tpm_stage_build_opts(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B,
                          int T, uint64_t seed, TpOpts opts);
void tpm_stage_free(TpStage *st);
void tpm_stage_acts_alloc(TpStageActs *x, const TpStage *st);  // MEM_ACTS
void tpm_stage_acts_free(TpStageActs *x, const TpStage *st);
// Bytes of one micro-batch's TpStageActs (what tpm_stage_acts_alloc allocates), from the shapes
// (bf16: the blocks' sets at 2 bytes per element; the head, in and dx stay fp32).
size_t tpm_stage_act_bytes(const TpStage *st);
// Bytes the stage itself allocates for activations besides its scratch s (MEM_ACTS): bf16 the
// fp32 working set wa (one block's set of floats) and the (rows, C) fp32 widened input
// block_in, and `out` on a stage without the head; fp32 0.
size_t tpm_stage_work_act_bytes(const TpStage *st);
// Forward of one micro-batch: the first stage embeds `inputs`, others read x->in; returns the
// micro-batch's mean loss on the last stage (targets), 0 elsewhere.
float tpm_stage_forward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets);
// The stage's output (B·T, C) after tpm_stage_forward: what goes to the next stage (on st->dev).
// bf16: the last block's stored output widened into st->out (valid until the next call on st):
// already bf16-rounded values, so sending them as bf16 (pipe_exec's bf16 messages) is exact.
const float *tpm_stage_output(const TpStage *st, const TpStageActs *x);
// Backward of one micro-batch (gradients accumulated): the last stage starts from the loss
// (dloss per position), others from x->dx; leaves d in in x->dx (the first stage: used up by
// the embedding's backward). SP: ends with the "sp grads" all-reduce (tpm_stage_build_opts).
void tpm_stage_backward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets, float dloss);
// Σ g² of this rank's gradients: sq[0] of the sliced tensors, sq[1] of the TP-replicated ones;
// the last stage's copy of wte is left out (the first stage counts it). No communication.
void tpm_stage_norm_parts(const TpStage *st, double sq[2]);
// The same over elements [lo, hi) of the flat buffer only, read from g (hi - lo elements of the
// stage's storage precision, tpm_stage_dist_dtype: this rank's ZeRO shard of the gradient).
void tpm_stage_norm_parts_range(const TpStage *st, size_t lo, size_t hi, const void *g, double sq[2]);
// Elements of one block's saved activations on this rank (what tp_block_acts_alloc, or under SP
// tp_sp_block_acts_alloc, allocates), and the bytes one block's stored set takes (4 per element
// in fp32, 2 in bf16); the weights' split (sharded part + replicated part of the flat buffer, in
// elements, the tied copy left out).
size_t tpm_block_act_floats(const TpStage *st);
size_t tpm_block_act_bytes(const TpStage *st);
void tpm_weight_split(const TpStage *st, size_t *sharded, size_t *replicated);
// The gradient storage (grads, or grads_bf16: n elements of tpm_stage_dist_dtype): what DP
// all-reduces or reduce-scatters. The tied wte's gradient span in it (Vl·C elements; NULL when
// the stage has no wte): what the first and last stage sum.
void *tpm_stage_grad_buf(const TpStage *st);
void *tpm_stage_wte_grad(const TpStage *st);
DistDtype tpm_stage_dist_dtype(const TpStage *st);
void tpm_stage_zero_grad(TpStage *st);
void tpm_stage_poison_grad(TpStage *st);  // the first gradient element := NaN (--inject-nan-step)
// The optimizer's state of elements [lo, hi) of a stage's flat buffer: the caller's (chapter 07:
// the whole buffer; 09 under ZeRO-1: its replica's piece), as Session keeps it for a GPT2.
typedef struct TpOpt {
    size_t lo, hi;
    float *master;           // (hi - lo) from element lo: bf16 the fp32 master (MEM_MASTER);
                             // fp32 st->params + lo, the weights themselves
    float *m, *v;            // (hi - lo) Adam's moments (MEM_OPT_M, MEM_OPT_V), zeroed
} TpOpt;
// Allocates o for [lo, hi) on st->dev; a bf16 master starts at the initial fp32 weights of
// tpm_stage_build's seed (the weights are those rounded).
void tpm_opt_alloc(TpOpt *o, TpStage *st, uint64_t seed, size_t lo, size_t hi);
void tpm_opt_free(TpOpt *o, const TpStage *st);
// After the master changed outside tpm_stage_adamw (a checkpoint): bf16 rounds it into
// params_bf16[lo, hi); fp32 does nothing (the master is the weights).
void tpm_stage_set_weights(TpStage *st, const TpOpt *o);
// AdamW on elements [o->lo, o->hi) of the stage (grad_shard: hi - lo elements of the storage
// precision on st->dev, from element lo; scale: adamw_clip_scale's): common/optim.h's
// adamw_step, or in bf16 adamw_step_bf16 (the master updated, then rounded into params_bf16).
// Not ZeRO: o covers [0, n) and grad_shard is tpm_stage_grad_buf(st).
void tpm_stage_adamw(TpStage *st, const AdamW *h, int step, const TpOpt *o, const void *grad_shard,
                     float scale);
// Clip (the global norm: the sharded tensors' squares summed over g, the replicated ones counted
// once) and AdamW on the whole flat buffer (o: [0, n)): chapter 07's step. Fails the run naming
// the step on NaN/Inf. Returns the global squared norm clipping was given (the health line's).
double tpm_stage_adamw_step(TpStage *st, const AdamW *h, int step, const TpOpt *o, DistGroup *g);
// Largest |w - w on group rank 0| over the replicated tensors (LayerNorms, wpe, the row-parallel
// biases) of the master (o: [0, n)): 0 when every rank applied the same updates to them.
// Collective over g.
double tpm_replicated_max_diff(const TpStage *st, const TpOpt *o, DistGroup *g);
// n elements of a buffer in `type` (DIST_F32 or DIST_BF16; host or device) -> fp32 on the host.
void tpm_to_host_f32(float *host, const void *buf, size_t n, DistDtype type);
// ---- whole <-> slice: every save, load and dump of a layout goes through these two -----------
//
// Writes this rank's tensors into full_mem (the FULL model's flat buffer, memory order, zeroed
// by the caller, on the host): the slices always, the replicated tensors only when
// with_replicated, the tied copy never. Summing such buffers over a TP x PP grid (one
// with_replicated per TP group) gives the whole model exactly (x + 0 == x). The weights the
// forward reads: fp32 params; bf16 params_bf16 widened (a --dump's; a checkpoint saves the
// master: tpm_unshard(st, o.master, ...)).
void tpm_unshard_weights(const TpStage *st, float *full_mem, int with_replicated);
// The same for any fp32 buffer laid out as the stage's flat buffer (its master, Adam's m or v,
// fp32 gradients; host or device; bf16 gradients: tpm_to_host_f32 first).
// tpm_shard(tpm_unshard(x)) == x bit for bit: checkpoints move between any layouts.
void tpm_unshard(const TpStage *st, const float *buf, float *full_mem, int with_replicated);
// The reverse: buf (st->n floats, the stage's layout, host or device) := this rank's slices of
// full_mem (the full model's memory order, host), the tied copy included (a checkpoint of any
// layout resumes here). Into a master: tpm_stage_set_weights after.
void tpm_shard(const TpStage *st, const float *full_mem, float *buf);
