// tp.h: the pieces of Megatron tensor parallelism (Shoeybi et al. 2019), fp32, on the kernels of
// kernels.h: a block whose attention is split by heads and whose MLP is split by hidden units,
// the vocab-parallel embedding and the vocab-parallel softmax cross-entropy.
//
// A TP group of tp ranks; rank r of it holds, of every block (C channels, NH heads, Cl = C/tp,
// Hl = 4C/tp, NHl = NH/tp):
//   qkvw (3Cl, C), qkvb (3Cl)  rows [Q_r; K_r; V_r]: heads [r·NHl, (r+1)·NHl) of Q, of K and of V
//                              (column-parallel: each rank computes its heads' q, k, v)
//   attprojw (C, Cl)           columns [r·Cl, (r+1)·Cl) (row-parallel: a partial sum of the output)
//   fcw (Hl, C), fcb (Hl)      hidden units [r·Hl, (r+1)·Hl) (column-parallel)
//   fcprojw (C, Hl)            the same units' columns (row-parallel)
//   ln1w ln1b attprojb ln2w ln2b fcprojb   replicated: every rank holds all C
// A block is
//   x ─ ln1 ─ f ─ [qkv → attention → proj] ─ g ─ + attprojb + x = r2
//   r2 ─ ln2 ─ f ─ [fc → GELU → fcproj]    ─ g ─ + fcprojb + r2 = out
// where g is an all-reduce (SUM) in forward and the identity in backward, and f is the identity
// in forward and an all-reduce of the input gradient in backward (each rank's half sees only
// its own heads / units, so its gradient w.r.t. the LayerNorm output is partial). The biases of
// the row-parallel layers are added once, after the reduce. The halves in brackets
// (tp_attn_*, tp_mlp_*) do no communication: the block functions do it through a TpComm.
//
// The vocabulary: V rows of the tied wte, padded to Vp = tp·ceil(V/tp); rank r holds rows
// [r·Vl, (r+1)·Vl), Vl = Vp/tp; the padded rows (index >= V) are zero, masked out of the
// softmax and never get a gradient. The embedding masks the tokens another rank owns and
// all-reduces; the loss never gathers the logits: three all-reduces of B·T floats (the max, the
// sum of exp, the target logit).
//
// A shard of a block is a gpt2 block unit (gpt2_block_layout: the 12 tensors above in llm.c's
// tensor order, contiguous) at the shard's widths (tp_block_dims): with tp = 1 a "shard" IS a
// block unit of the model, so tp_block_views(&v, m->params + gpt2_block_unit(m, l)->offset, C, 1)
// reads block l in place (also in a pipeline stage). Shard / unshard / init work on host memory
// (a GPU run shards on the host and uploads). The pieces compute in fp32; bf16 storage is
// tp_model.h's (it widens a piece's bf16 weights and stored activations into fp32 buffers
// before the piece runs, as gpt2's work buffer does). Sequence parallelism composes the halves below with its own reduce-scatter /
// all-gather in place of tp_block_forward's all-reduces.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "gpt2.h"
#include "kernels.h"
#include "mem.h"

// ---- communication ------------------------------------------------------------------------------

typedef enum { TP_SUM = 0, TP_MAX } TpOp;
// Where an all-reduce is made (for counting, and so a test can break exactly one of them).
typedef enum {
    TP_SITE_EMBED = 0,   // the vocab-parallel embedding's sum          (B·T·C floats)
    TP_SITE_ATTN_G,      // g after the attention's row-parallel proj   (B·T·C)
    TP_SITE_MLP_G,       // g after the MLP's row-parallel fcproj       (B·T·C)
    TP_SITE_ATTN_F,      // f's backward at the attention half's input  (B·T·C)
    TP_SITE_MLP_F,       // f's backward at the MLP half's input        (B·T·C)
    TP_SITE_CE_MAX,      // the loss: global max of the logits          (B·T, MAX)
    TP_SITE_CE_SUMEXP,   // the loss: Σ exp(logit - max)                (B·T)
    TP_SITE_CE_TARGET,   // the loss: the target's logit                (B·T)
    TP_SITE_HEAD_F,      // f's backward at the head's input (lnf)      (B·T·C)
    TP_SITE_OTHER,       // the caller's own
    // sequence parallelism (--sequence-parallel): the collectives that appear only there
    TP_SITE_ATTN_F_FWD,  // f's forward: all-gather of ln1's output     (B·T·C, gathered)
    TP_SITE_MLP_F_FWD,   // f's forward: all-gather of ln2's output     (B·T·C)
    TP_SITE_ATTN_G_BWD,  // g's backward: all-gather of the gradient    (B·T·C)
    TP_SITE_MLP_G_BWD,   // g's backward: all-gather of the gradient    (B·T·C)
    TP_SITE_HEAD_F_FWD,  // f's forward at the head: all-gather of lnf  (B·T·C)
    TP_SITE_EMBED_BWD,   // the embedding's backward: all-gather of d x (B·T·C)
    TP_SITE_SP_GRADS,    // the replicated tensors' partial gradients   (L·6C + 2C, all-reduce)
    TP_NSITES
} TpSite;
const char *tp_site_name(TpSite s);  // "embed", "attn g", ...

// The TP group as the pieces see it: its size, this rank's place, and one all-reduce (in place,
// on buffers of the kernels' device). tp_all_reduce counts every call per site, then calls it.
typedef struct TpComm {
    int tp, rank;
    void (*all_reduce)(struct TpComm *c, float *buf, size_t n, TpOp op, TpSite site);
    // Sequence parallelism's collectives, on contiguous blocks (tp_seq_* below call them once
    // per sequence): reduce_scatter sums the group's (tp·n) send buffers and leaves block
    // `rank` (n floats) in recv; all_gather puts every rank's n floats at its place in recv.
    void (*reduce_scatter)(struct TpComm *c, const float *send, float *recv, size_t n, TpSite site);
    void (*all_gather)(struct TpComm *c, const float *send, float *recv, size_t n, TpSite site);
    void *ctx;                    // the callback's (tp_comm_group: the DistGroup)
    uint64_t calls[TP_NSITES];    // all-reduces made, per site
    uint64_t floats[TP_NSITES];   // floats all-reduced, per site (reduce-scatter / all-gather:
                                  // the whole (B·T·C) tensor, as an all-reduce of it)
} TpComm;

// dist_all_reduce on g (host or device buffers, per dist's backend).
TpComm tp_comm_group(DistGroup *g);
// One rank alone (tp = 1): every all-reduce is the identity. Usable without MPI.
TpComm tp_comm_single(void);
void tp_all_reduce(TpComm *c, float *buf, size_t n, TpOp op, TpSite site);

// Checks that a (C, NH, V) model splits over tp ranks: NH % tp == 0 (whole heads per rank; so
// C % tp == 0 too). Fails the job naming what would be valid (lab_fail_collective: every rank
// sees the same arguments).
void tp_check_config(const GPT2Config *cfg, int tp);

// ---- a block's shard ------------------------------------------------------------------------------

#define TP_BLOCK_TENSORS GPT2_BLOCK_TENSORS
// A shard's tensors by name: gpt2.h's block views, at the shard's widths (tp_block_dims):
//   ln1w ln1b (C), qkvw (3Cl, C), qkvb (3Cl), attprojw (C, Cl), attprojb (C), ln2w ln2b (C),
//   fcw (Hl, C), fcb (Hl), fcprojw (C, Hl), fcprojb (C)
typedef GPT2BlockWeights TpBlock;
// The widths of rank r's block: {C, NH/tp, C/tp, 4C/tp} (the same for every rank).
GPT2BlockDims tp_block_dims(int C, int NH, int tp);
// Element counts of the 12 tensors of one rank's shard, in TpBlock order, and their sum.
void tp_block_sizes(int C, int tp, size_t sizes[TP_BLOCK_TENSORS]);
size_t tp_block_count(int C, int tp);
// Points v's 12 tensors into base (tp_block_count(C, tp) floats, on any device).
void tp_block_views(TpBlock *v, float *base, int C, int tp);
// Block l of the FULL model as a tp = 1 view, from gpt2_params' offsets: params is the full
// model's flat buffer (or its gradients; on any device).
void tp_block_of_model(TpBlock *v, const GPT2Config *cfg, float *params, int l);

// Host memory. shard := rank r's slices of full (a tp = 1 view), replicated tensors copied.
void tp_block_shard(TpBlock *shard, const TpBlock *full, int C, int tp, int r);
// The reverse, to gather gradients back: writes shard's slices into rank r's places of full;
// the replicated tensors only when with_replicated (so zeroed fulls from every rank, one of them
// with_replicated, sum to the whole gradient).
void tp_block_unshard(TpBlock *full, const TpBlock *shard, int C, int tp, int r, int with_replicated);
// Rank r's shard of block l of gpt2_init_params(seed)'s model, initialized alone (element by
// element from the full model's indices: == tp_block_shard of the full init, bit for bit).
void tp_block_init(TpBlock *shard, const GPT2Config *cfg, uint64_t seed, int l, int tp, int r);

// ---- a block's activations --------------------------------------------------------------------------

// What one rank's block saves for backward ((B,T) positions, N = B·T).
typedef struct TpBlockActs {
    int B, T, C, NH, tp;
    float *ln1, *ln1_mean, *ln1_rstd;   // (N,C), (N), (N)
    float *qkv;                          // (N,3Cl)
    float *atty;                         // (N,Cl)
    float *preatt, *att;                 // (B,NHl,T,T)
    float *attproj;                      // (N,C): this rank's partial, then (after g) the sum
    float *residual2;                    // (N,C)
    float *ln2, *ln2_mean, *ln2_rstd;   // (N,C), (N), (N)
    float *fch, *fch_gelu;               // (N,Hl)
    float *fcproj;                       // (N,C): partial, then the sum
    float *out;                          // (N,C) the block's output
    float *mem;                          // the one allocation (MEM_ACTS)
} TpBlockActs;
// Gradients of the activations inside a block: live only during one block's backward, so one
// set serves every block (as gpt2_dact_sizes does for the full model).
typedef struct TpScratch {
    float *dln;        // (N,C): d LayerNorm output; partial until f's all-reduce
    float *dresidual2; // (N,C)
    float *dqkv;       // (N,3Cl)
    float *datty;      // (N,Cl)
    float *dpreatt, *datt;  // (B,NHl,T,T)
    float *dfch, *dfch_gelu;  // (N,Hl)
    float *full, *dlnl, *partial;  // sequence parallelism only (tp_sp_scratch_alloc), else NULL
    float *mem;
} TpScratch;
void tp_block_acts_alloc(TpBlockActs *a, int B, int T, int C, int NH, int tp, Device dev);
void tp_block_acts_free(TpBlockActs *a);
void tp_scratch_alloc(TpScratch *s, int B, int T, int C, int NH, int tp, Device dev);
void tp_scratch_free(TpScratch *s);

// ---- the halves (no communication) ------------------------------------------------------------------

// Attention half: inp (N,C) = ln1's output (replicated) -> a->qkv, a->atty, a->attproj = this
// rank's PARTIAL projection (N,C), no bias.
void tp_attn_forward(const Kernels *k, const TpBlock *w, TpBlockActs *a, const float *inp);
// dout (N,C): gradient of the (reduced) projection output. dw +=; dinp (N,C) = this rank's
// PARTIAL gradient of inp (f's all-reduce makes it whole). Uses s->dqkv, datty, dpreatt, datt.
void tp_attn_backward(const Kernels *k, const TpBlock *w, TpBlock *dw, const TpBlockActs *a,
                      TpScratch *s, const float *inp, const float *dout, float *dinp);
// MLP half: inp (N,C) = ln2's output -> a->fch, a->fch_gelu, a->fcproj = the PARTIAL fcproj.
void tp_mlp_forward(const Kernels *k, const TpBlock *w, TpBlockActs *a, const float *inp);
void tp_mlp_backward(const Kernels *k, const TpBlock *w, TpBlock *dw, const TpBlockActs *a,
                     TpScratch *s, const float *inp, const float *dout, float *dinp);

// ---- the block ---------------------------------------------------------------------------------------

// inp (N,C) replicated -> a->out (N,C) replicated. Two all-reduces of N·C (the g's).
void tp_block_forward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlockActs *a, const float *inp);
// dout (N,C): gradient of a->out (replicated). dinp (N,C) = gradient of inp (may alias dout);
// dw += (the sharded tensors' gradients are this rank's slices; the replicated ones come out
// the same on every rank). Two all-reduces of N·C (the f's).
void tp_block_backward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlock *dw,
                       const TpBlockActs *a, TpScratch *s, const float *inp, const float *dout,
                       float *dinp);

// ---- the vocabulary -------------------------------------------------------------------------------------

// This rank's rows: [v0, v0 + Vl) of the padded vocabulary, of which the first nvalid are real.
typedef struct TpVocab { int V, Vp, Vl, v0, nvalid; } TpVocab;
TpVocab tp_vocab(int V, int tp, int r);
// Host memory. wte_local (Vl,C) := rows [v0, v0+Vl) of wte (V,C), padded rows zero.
void tp_wte_shard(float *wte_local, const float *wte, const TpVocab *tv, int C);
// wte (V,C) rows [v0, v0+nvalid) := wte_local's (the padding is dropped).
void tp_wte_unshard(float *wte, const float *wte_local, const TpVocab *tv, int C);
// wte_local of gpt2_init_params(seed)'s model, initialized alone (padded rows zero).
void tp_wte_init(float *wte_local, const GPT2Config *cfg, uint64_t seed, const TpVocab *tv);

// out (B,T,C) = wte[inp] + wpe[t] from the local rows: masked lookup (rank 0 adds wpe), then
// one all-reduce of B·T·C. Tokens must lie in [0, V).
void tp_embed_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *out, const int *inp,
                      const float *wte_local, const float *wpe, int B, int T, int C);
// dwte_local += the rows of this rank's tokens; dwpe += Σ_b dout (dout is replicated, so every
// rank computes the whole dwpe). No communication.
void tp_embed_backward(const Kernels *k, const TpVocab *tv, float *dwte_local, float *dwpe,
                       const float *dout, const int *inp, int B, int T, int C);

// The per-position statistics the loss reduces (device buffers, N floats each).
typedef struct TpLossStats { float *maxes, *sums, *tlogits, *mem; } TpLossStats;
void tp_loss_stats_alloc(TpLossStats *st, int N, Device dev);
void tp_loss_stats_free(TpLossStats *st);
// logits (N,Vl) local -> losses (N) = log Σ_v exp(logit_v) - logit_target over the V real
// entries of the whole vocabulary, every rank the same. Exactly three all-reduces of N floats.
void tp_crossentropy_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *losses,
                             TpLossStats *st, const float *logits, const int *targets, int N);
// dlogits (N,Vl) = (softmax - onehot(target)) · dloss on the local slice; 0 on padded columns.
// No communication (the statistics are already global).
void tp_crossentropy_backward(const Kernels *k, const TpVocab *tv, float *dlogits,
                              const TpLossStats *st, const float *logits, const int *targets,
                              float dloss, int N);

// ---- the head: final LayerNorm, logits on the local wte rows (tied), the loss -------------------

typedef struct TpHeadActs {
    int N, C;
    float *lnf, *lnf_mean, *lnf_rstd;  // (N,C), (N), (N)
    float *logits, *dlogits;           // (N,Vl): this rank's vocabulary columns
    float *losses;                     // (N) per position, the same on every rank
    float *dlnf;                       // (N,C) scratch of the backward
    int B, T, tp;                      // sequence parallelism (tp_sp_head_acts_alloc), else 0
    float *lnfl;                       // SP: (N/t,C) this rank's positions of lnf / of d lnf
    TpLossStats st;
    float *mem;
} TpHeadActs;
void tp_head_acts_alloc(TpHeadActs *h, int N, int C, const TpVocab *tv, Device dev);
void tp_head_acts_free(TpHeadActs *h);
// x (N,C): the last block's output (replicated) -> h->losses. f sits at the head's input (the
// identity forward); the loss makes its three all-reduces.
void tp_head_forward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                     const float *lnfw, const float *lnfb, const float *wte_local, const int *targets);
// dloss: d objective / d loss at each position (1/N for the mean). dx (N,C) = the gradient of x,
// whole after f's all-reduce (one of N·C); dlnfw, dlnfb, dwte_local +=.
void tp_head_backward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                      const float *lnfw, const float *wte_local, float *dlnfw, float *dlnfb,
                      float *dwte_local, const int *targets, float dloss, float *dx);

// ---- sequence parallelism (Korthikanti et al. 2022, --sequence-parallel) -------------------------
//
// Outside the two halves the residual stream is split along the sequence: rank r of the group
// holds positions [r·T/t, (r+1)·T/t) of every sequence, (B, T/t) rows, N/t = B·T/t of the N.
// The LayerNorms, the row-parallel biases and the residual adds run on those rows only.
// g becomes a reduce-scatter (the partial (N,C) sums arrive as this rank's positions) and f an
// all-gather (every rank needs all N rows of the LayerNorm output for its heads / units);
// backward swaps them (g: all-gather of the gradient, f: reduce-scatter). An all-reduce IS a
// reduce-scatter and an all-gather, so the bytes on the wire are the same. The replicated
// tensors whose gradients now come from N/t rows (ln1, ln2, lnf, attprojb, fcprojb) get
// partial gradients: the group sums them (tpm_stage_backward, site "sp grads").
//
// The layout is (B, T, C), so one sequence's positions are contiguous and its T/t-blocks are
// the ranks' parts: the collectives below make one call per sequence (Megatron keeps (T, B, C)
// and makes one call). T must be divisible by t.
void tp_check_sequence_parallel(int T, int tp);  // fails naming the valid T when t ∤ T
// full (B,T,C) partial sums on every rank -> local (B,T/t,C) = rank's positions, summed.
void tp_seq_reduce_scatter(TpComm *c, const float *full, float *local, int B, int T, int C, TpSite site);
// local (B,T/t,C) on every rank -> full (B,T,C) = every rank's positions at their places.
void tp_seq_all_gather(TpComm *c, const float *local, float *full, int B, int T, int C, TpSite site);

// A block's saved activations under SP (the same struct, other sizes; B, T are the whole
// batch's): ln1, ln2 (N,C) the GATHERED LayerNorm outputs (the column-parallel matmuls' inputs,
// kept so backward needs no second all-gather), ln*_mean/rstd (N/t), qkv, atty, preatt, att,
// fch, fch_gelu as without SP, residual2 and out (N/t,C) this rank's positions; attproj and
// fcproj (the partial sums before the reduce-scatter, not needed by backward) point into the
// scratch's `partial` (N,C), shared by every block.
void tp_sp_block_acts_alloc(TpBlockActs *a, int B, int T, int C, int NH, int tp, float *partial, Device dev);
// The scratch under SP: dln (N,C), dresidual2 (N/t,C), dqkv .. dfch_gelu as without SP, and
// full (N,C) (an all-gathered gradient), dlnl (N/t,C) (a reduce-scattered one), partial (N,C).
void tp_sp_scratch_alloc(TpScratch *s, int B, int T, int C, int NH, int tp, Device dev);
// inp (N/t,C): this rank's positions of the stream -> a->out (N/t,C). Two all-gathers (f) and
// two reduce-scatters (g) of N·C.
void tp_sp_block_forward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlockActs *a, TpScratch *s,
                         const float *inp);
// dout (N/t,C) -> dinp (N/t,C) (may alias dout). dw += : the sharded tensors' slices whole; ln1,
// ln2, attprojb, fcprojb PARTIAL (this rank's positions): the caller sums them over the group.
void tp_sp_block_backward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlock *dw,
                          const TpBlockActs *a, TpScratch *s, const float *inp, const float *dout,
                          float *dinp);
// The embedding under SP: the masked lookup into full (N,C) (scratch), then a reduce-scatter
// into out (N/t,C): this rank's positions of wte[inp] + wpe[t], bit for bit.
void tp_sp_embed_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *out, float *full,
                         const int *inp, const float *wte_local, const float *wpe, int B, int T, int C);
// The head under SP: lnf on this rank's positions, f = all-gather into h->lnf (N,C), logits
// and loss as without SP (every position: the three all-reduces of N). h->lnfl (N/t,C) is the
// local part; lnf_mean/rstd are (N/t). Backward: dx (N/t,C); dlnfw, dlnfb PARTIAL.
void tp_sp_head_acts_alloc(TpHeadActs *h, int B, int T, int C, int tp, const TpVocab *tv, Device dev);
void tp_sp_head_forward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                        const float *lnfw, const float *lnfb, const float *wte_local, const int *targets);
void tp_sp_head_backward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                         const float *lnfw, const float *wte_local, float *dlnfw, float *dlnfb,
                         float *dwte_local, const int *targets, float dloss, float *dx);
