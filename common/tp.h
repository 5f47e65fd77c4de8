// tp.h: Megatron tensor parallelism (Shoeybi et al. 2019) on the one model. A rank's TP slice r
// of t of blocks [l0, l1) IS a GPT2 (gpt2_build_tp: its heads, hidden units and vocabulary rows,
// gpt2_layout.h), fp32 or bf16, on the host or a GPU; its activation sets are GPT2Acts; these
// pieces run it, communicating only through a TpComm (so a test can count every all-reduce and
// forget one on purpose). A block is
//   x ─ ln1 ─ f ─ [qkv → attention → proj] ─ g ─ + attprojb + x = r2
//   r2 ─ ln2 ─ f ─ [fc → GELU → fcproj]    ─ g ─ + fcprojb + r2 = out
// where g is an all-reduce (SUM) in forward and the identity in backward, and f is the identity
// in forward and an all-reduce of the input gradient in backward (each rank's half sees only
// its own heads / units, so its gradient w.r.t. the LayerNorm output is partial). The biases of
// the row-parallel layers are added once, after the reduce. The halves in brackets (tp_attn_*,
// tp_mlp_*) do no communication.
//
// The vocabulary: the embedding masks the tokens another rank owns and all-reduces; the loss
// never gathers the logits: three all-reduces of B·T floats (the max, the sum of exp, the
// target logit); the padded rows are masked out of the softmax and never get a gradient.
//
// Sequence parallelism (Korthikanti et al. 2022, the model's sp): between the halves the
// residual stream lives on this rank's T/t positions of every sequence ((B, T/t) rows); the
// LayerNorms, the row-parallel biases and the residual adds run on those rows only; g becomes a
// reduce-scatter (the partial sums arrive as this rank's positions) and f an all-gather (the
// heads and units need every row); backward swaps them. An all-reduce IS a reduce-scatter and
// an all-gather, so the bytes on the wire are the same. The replicated tensors whose gradients
// then come from N/t rows (ln1, ln2, lnf, attprojb, fcprojb) get partial gradients: the group
// sums them once per step (tp_sp_grads_all_reduce). Our layout is (B, T, C): one sequence's
// positions are contiguous, so the collectives make one call per sequence (Megatron keeps
// (T, B, C) and makes one); T must be divisible by t.
//
// t = 1 without sequence parallelism: the slice is the whole tensors, and every piece below is
// gpt2.c's own (gpt2_*_w on gpt2_acts_alloc's sets): one rank computes exactly chapter 00's
// step (a pipeline stage, chapter 08's), bit for bit.
//
// Precision and device: the model's (gpt2.h). bf16 pieces are widened and rounded by gpt2.c's
// machinery (GPT2Piece: the model's work and work_grads buffers; the stored activations: every
// block computes in ONE fp32 layer the model's sets share, tp_layer, stored rounded into the
// set's acts_bf16, the next piece reading the stored output widened). The pieces compute in
// fp32 and reduce fp32 buffers (Megatron reduces bf16 activations); the embedding's output, the
// head's activations and every gradient of an activation stay fp32.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "gpt2.h"
#include "kernels.h"

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
    // sequence parallelism: the collectives that appear only there
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

// ---- the slice ------------------------------------------------------------------------------------

// Where a rank's slice sits and what it runs: blocks [l0, l1) (the embedding when l0 = 0, the
// head when l1 = L), TP slice r of tp, sequence parallelism or not, micro-batches of (B, T).
typedef struct TpShape {
    int l0, l1;
    int tp, r;
    int sp;
    int B, T;
    GPT2Recompute recompute;  // activation recomputation (0: none), below
} TpShape;

// The slice (gpt2_build_tp), its gradients, its weights initialized from seed (each element the
// full model's: gpt2_init_params), and the buffers the pieces of all its micro-batches share
// (t > 1 or sp; MEM_ACTS): one block's backward scratch, and in bf16 the fp32 layer a block
// computes in and the widened input of the running piece. sp: T % tp == 0 (fails naming a
// valid --seq).
//
// Recomputation (s.recompute, Korthikanti et al. 2022; t = 1 without SP: gpt2_set_recompute's
// own): a set keeps of each block all but the attention scores and softmax, preatt and att of
// this rank's heads (selective), or only the block's output, the next block's input (full);
// what it drops lives in ONE layer of scratch the slice owns (GPT2.rc_scratch, MEM_ACTS, shared
// by every set: tp_shared_bytes counts it). tp_block_backward first recomputes into it:
// selective the attention core from the kept qkv (no communication), full the block's whole
// forward, tp_block_forward again, from its kept input, with its f and g collectives (SP: the
// all-gathers and reduce-scatters) run again, so a full step moves 6 instead of 4 of a block's
// (B·T, C) tensors per rank (calc_rank_comm). The same kernels on the same inputs, and a
// collective gives the same sum of the same buffers: the forward's bits. bf16: a block
// computes in fp32 from its stored (rounded) input, so recomputing from it gives the forward's
// fp32 values, which are rounded as the store rounds a kept tensor; selective first reruns ln1
// and qkv (the forward's softmax read qkv unrounded; under SP with f's all-gather of ln1 once
// more). The kept tensors' fp32 layer and the recompute layer make one block's set: the same
// shared bytes as without. Not with the split backward (a W runs after its B, long after the
// scratch was reused).
void tp_build(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype, TpShape s, uint64_t seed);
// One micro-batch's activation set (the shape's B, T): t = 1 without SP gpt2_acts_alloc's; else
// the slice's (gpt2.h's GPT2Acts.slice): every block's saved tensors (block-major; bf16 stored
// in 2 bytes), the stream's input and the gradient flowing through it, the head's (lnf, the
// logits on this rank's vocabulary rows and their gradient, the loss and its 3 statistics).
// On the host it reads the batch in place (gpt2_acts_set_batch); gpt2_acts_free frees it.
void tp_acts_alloc(GPT2Acts *a, const GPT2 *m);
// Bytes of MEM_ACTS one set of a slice allocates, and that its model shares (tp_build), from
// the shape alone (mem_predict.h predicts with them before anything is allocated). Not for
// t = 1 without SP (gpt2's sets: calc_activation_bytes_lab, calc_pipe_set_bytes).
// (s.recompute: a set's blocks keep less; the shared bytes add the recompute scratch layer.)
size_t tp_acts_bytes(const GPT2Config *cfg, TpShape s, GPT2Dtype dtype);
size_t tp_shared_bytes(const GPT2Config *cfg, TpShape s, GPT2Dtype dtype);
// The recompute scratch layer alone (0 for none), in bytes.
size_t tp_recompute_bytes(const GPT2Config *cfg, TpShape s);
// Model FLOPs one block's recomputation runs on a slice of tp (counted in GPT2.rc_flops as it
// runs): gpt2_recompute_flops_dtype's / tp, this rank's share of the model FLOPs: a slice's
// matmuls are 1/tp of the block's (1/tp of every weight matrix), its attention core NH/tp heads;
// the LayerNorms and biases a slice may run whole are counted by their share too (model FLOPs).
double tp_recompute_flops(const GPT2Config *cfg, GPT2Recompute r, GPT2Dtype dtype, int B, int T, int tp);

// ---- the pieces ------------------------------------------------------------------------------------
//
// Each on the micro-batch's set a (its batch set with gpt2_acts_set_batch), its weights the
// model's own (block_w, dblock_w NULL) or a caller's block unit in the model's dtype (a gathered
// one; gradients accumulated into it, +=), as gpt2's _w functions. The stream: a.encoded is the
// set's input (the embedding's output, or what a stage l0 > 0 receives: gpt2_acts_input); the
// gradient flows through da.encoded in place (gpt2_acts_doutput before the backward, the
// gradient of the input after: gpt2_acts_dinput); the stage's output: gpt2_acts_output.

// The vocab-parallel embedding: each rank looks up the tokens it owns (wpe on rank 0 only), the
// group sums them: one all-reduce of (B·T, C) (SP: a reduce-scatter onto this rank's rows).
void tp_embed_forward(GPT2 *m, GPT2Acts *a, TpComm *c);
// Block l: ln -> f -> half -> g -> bias + residual, twice. Two all-reduces of B·T·C (the g's).
void tp_block_forward(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w);
// lnf, the logits on this rank's vocabulary rows (the tied wte, column-parallel), the loss from
// three all-reduces of B·T floats; returns the mean loss (the same on every rank).
float tp_head_forward(GPT2 *m, GPT2Acts *a, TpComm *c);
// From the loss (dloss: d objective / d loss at each position); f at the head's input
// all-reduces the gradient of lnf (each rank saw its vocabulary columns only).
void tp_head_backward(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss);
// Block l backward: two all-reduces of B·T·C (the f's). The sliced tensors' gradients are this
// rank's slices; the replicated ones come out the same on every rank (SP: partial).
void tp_block_backward(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w, void *dblock_w);
// dwte += the rows of this rank's tokens; dwpe += Σ_b d x (whole on every rank; SP: after an
// all-gather of d x).
void tp_embed_backward(GPT2 *m, GPT2Acts *a, TpComm *c);
// SP: the replicated tensors' partial gradients (every block's ln1w ln1b attprojb ln2w ln2b
// fcprojb, and lnfw lnfb) summed over the group: one all-reduce of L·6C + 2C floats (fp32 on
// the wire; bf16 widens, sums, rounds once more). Once per step, after the backward.
void tp_sp_grads_all_reduce(GPT2 *m, TpComm *c);
// A stage's whole forward / backward of one micro-batch: the embedding where it has it, its
// blocks, the head where it has it (the loss: 0 on a stage without the head).
float tp_forward(GPT2 *m, GPT2Acts *a, TpComm *c);
void tp_backward(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss);

// The same three pieces on a caller's weights (a unit gathered from its DP pieces: 09's ZeRO-3
// and FSDP), in the model's dtype: embed_w the EMBED unit (wte's rows, then wpe), wte the (Vl, C)
// output-layer rows and head_w the HEAD unit (lnfw, lnfb); NULL: the model's own. The gradients
// go to the model's own buffer, as above.
void tp_embed_forward_w(GPT2 *m, GPT2Acts *a, TpComm *c, const void *embed_w);
float tp_head_forward_w(GPT2 *m, GPT2Acts *a, TpComm *c, const void *wte, const void *head_w);
void tp_head_backward_w(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss, const void *wte,
                        const void *head_w);
// The split backward (zero bubble's B and W, chapter 08's ZB-H1 on a TP stage). A split set
// (tp_acts_alloc_split after tp_acts_alloc) keeps per block what W reads from B (wsave, MEM_ACTS:
// tp_wsave_bytes). B (tp_backward_input, tp_block_backward_input): the gradient of the input
// through every op, with all of f's and g's collectives (the input gradient needs them); the
// head and the embedding whole, as 08's B does. W (tp_backward_weights,
// tp_block_backward_weights), any time later: the blocks' weight gradients from the kept
// gradients and the set's activations, local (no communication). B then W gives the bits of
// tp_backward. tp_acts_keep_for_w after B: t = 1 without SP gpt2_acts_keep_for_w (the set
// shrinks to what W reads, as in 08); a slice's set stays whole until W frees it. With t = 1
// without SP every one of these is gpt2.c's own.
void tp_acts_alloc_split(GPT2Acts *a, const GPT2 *m);
void tp_acts_keep_for_w(GPT2Acts *a, const GPT2 *m);
size_t tp_wsave_bytes(const GPT2Config *cfg, TpShape s);  // a slice's wsave (not t = 1 without SP)
// (block_w, dblock_w: a caller's unit, or NULL for the model's own, as tp_block_backward's;
// W reads no weights.)
void tp_block_backward_input(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w);
void tp_block_backward_weights(GPT2 *m, GPT2Acts *a, int l, void *dblock_w);
void tp_backward_input(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss);
void tp_backward_weights(GPT2 *m, GPT2Acts *a);

// ---- the clipping norm -----------------------------------------------------------------------------

// Σ g² over elements [lo, hi) of m's flat buffer, read from g (hi - lo elements of the model's
// dtype, from lo): sq[0] the tensors sliced over the TP group (sum it over the group), sq[1] the
// replicated ones (count them once); the tied copy of wte left out (the first stage counts it).
// t = 1 without SP: nothing is sliced; the range (but the tied copy) is one sum in sq[0], as one
// device (00, 08) takes it. No communication.
void tp_norm_parts(const GPT2 *m, size_t lo, size_t hi, const void *g, double sq[2]);

// ---- a block's halves (no communication) -------------------------------------------------------

// The gradients inside one block: live only during its backward, so one set serves every block
// (views into the model's tp_scratch). SP: full (N,C) an all-gathered tensor, dlnl (N/t,C) a
// reduce-scattered gradient, partial (N,C) the row-parallel layers' partial sums (forward).
typedef struct TpScratch {
    float *dln;               // (N,C): d LayerNorm output; partial until f's all-reduce
    float *dresidual2;        // (rows,C)
    float *dqkv, *datty;      // (N,3Cl), (N,Cl)
    float *dpreatt, *datt;    // (B,NHl,T,T)
    float *dfch, *dfch_gelu;  // (N,Hl)
    float *full, *dlnl, *partial;  // sequence parallelism only, else NULL
} TpScratch;

// One block's work on this rank: its widths (this rank's NH/t heads, C/t attention channels,
// 4C/t hidden units), weights and weight gradients (fp32 views of one unit), what it saves, the
// scratch. N = B·T positions.
typedef struct TpBlockRun {
    const Kernels *k;
    int B, T, N;
    GPT2BlockDims d;
    GPT2BlockWeights w, dw;
    GPT2LayerActs x;
    TpScratch s;
} TpBlockRun;
// Block l of m on set a with the model's own weights and gradients in fp32 (a test's view of
// the halves; the pieces above make theirs from any unit, bf16 widened).
void tp_block_run(TpBlockRun *b, GPT2 *m, GPT2Acts *a, int l);

// Attention half: inp (N,C) = ln1's output -> x.qkv, x.atty, x.attproj = this rank's PARTIAL
// projection (N,C), no bias.
void tp_attn_forward(TpBlockRun *b, const float *inp);
// dout (N,C): gradient of the (reduced) projection output. dw +=; dinp (N,C) = this rank's
// PARTIAL gradient of inp (f's all-reduce makes it whole). Uses s.dqkv, datty, dpreatt, datt.
void tp_attn_backward(TpBlockRun *b, const float *inp, const float *dout, float *dinp);
// MLP half: inp (N,C) = ln2's output -> x.fch, x.fch_gelu, x.fcproj = the PARTIAL fcproj.
void tp_mlp_forward(TpBlockRun *b, const float *inp);
void tp_mlp_backward(TpBlockRun *b, const float *inp, const float *dout, float *dinp);

// ---- the vocabulary's loss -------------------------------------------------------------------------

// The per-position statistics the loss reduces (device buffers, N floats each).
typedef struct TpLossStats { float *maxes, *sums, *tlogits; } TpLossStats;
// logits (N,Vl) local -> losses (N) = log Σ_v exp(logit_v) - logit_target over the V real
// entries of the whole vocabulary, every rank the same. Exactly three all-reduces of N floats.
void tp_crossentropy_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *losses,
                             TpLossStats *st, const float *logits, const int *targets, int N);
// dlogits (N,Vl) = (softmax - onehot(target)) · dloss on the local slice; 0 on padded columns.
// No communication (the statistics are already global).
void tp_crossentropy_backward(const Kernels *k, const TpVocab *tv, float *dlogits,
                              const TpLossStats *st, const float *logits, const int *targets,
                              float dloss, int N);

// ---- sequence parallelism's collectives ------------------------------------------------------------

void tp_check_sequence_parallel(int T, int tp);  // fails naming the valid T when t ∤ T
// full (B,T,C) partial sums on every rank -> local (B,T/t,C) = rank's positions, summed.
void tp_seq_reduce_scatter(TpComm *c, const float *full, float *local, int B, int T, int C, TpSite site);
// local (B,T/t,C) on every rank -> full (B,T,C) = every rank's positions at their places.
void tp_seq_all_gather(TpComm *c, const float *local, float *full, int B, int T, int C, TpSite site);
