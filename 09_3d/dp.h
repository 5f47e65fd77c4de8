// dp.h: chapter 09's data-parallel layer: what a rank does over its DP group (the replicas that
// hold the same TP slice of the same stage, grid3d.h) with its chunks' gradients and optimizer
// state. --zero picks how much of that state each replica keeps (chapter 05's stages, on each
// chunk's flat buffer cut into dp pieces: zero_layout_init_buffer, shard_range's rule):
//   0  DDP (chapter 03): every chunk's gradient averaged over the replicas once per step (one
//      all-reduce), AdamW on the whole chunk
//   1  ZeRO-1: the gradient reduce-scattered once per step (my piece of the average lands at
//      its place in the chunk's gradient buffer), the clip norm from the pieces, AdamW on my
//      piece only (Adam m, v and bf16's fp32 master exist for it only), then every replica's
//      updated piece all-gathered into the whole weights
//   2  ZeRO-2: the gradient reduce-scattered after EVERY micro-batch's backward
//      (dpl_after_backward), summed into my piece, the rest of the buffer zeroed for the next
//      micro-batch: only my piece accumulates the step's gradient. The tied wte's span of a
//      chunk holding one end of it is reduced once per step instead, after the two ends summed
//      their gradients (main.c's sync_tied_wte). Then as ZeRO-1.
// The reduce of ZeRO-2 sums (the accumulated piece is in it once); the 1/dp of the average is
// in the loss's gradient instead (dpl_loss_divisor). The chunk's backward writes its whole
// gradient, so ZeRO-2 here holds the whole buffer as ZeRO-1 does (calc.h's grads_whole): what
// it changes is WHEN the gradient moves (per micro-batch, as DeepSpeed's stage 2), not the
// memory; a backward into buckets (05's) would drop the buffer. The optimizer state of a chunk
// is the lab's one: a ZeroShard of its pieces (common/zero.h), stepped by zero_adamw.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "grid3d.h"
#include "gpt2.h"
#include "optim.h"
#include "zero.h"

typedef struct DpLayer {
    int zero;          // 0, 1, 2
    int v;             // chunks
    GPT2 **m;          // (v) this rank's chunks (the caller's)
    ZeroLayout *z;     // (v) each chunk's flat buffer over the replicas (--zero 0: one part)
    ZeroShard *b;      // (v) their optimizer state: my piece (--zero 0: the whole buffer)
    size_t *tied_lo, *tied_hi;  // (v) ZeRO-2: the tied wte's span of the chunk (the first
                                //  chunk's wte, the last's copy at its end), reduced once per
                                //  step; [0, 0) where the chunk holds no end of it
    const Grid *grid;
} DpLayer;

// --zero: 0, 1 or 2; anything else is refused on every rank with one message naming them.
void dpl_check(int zero);
// The layer over this rank's v chunks st[0 .. v): the pieces, and the optimizer state of mine
// (a bf16 master starts at the initial weights of `seed`).
void dpl_init(DpLayer *d, int zero, GPT2 **m, int v, const Grid *g, uint64_t seed);
void dpl_free(DpLayer *d);
// What the loss's gradient is divided by besides the micro-batches and positions: 1 where the
// reduce averages over the replicas (--zero 0, 1), dp where it sums (2).
int dpl_loss_divisor(const DpLayer *d);
// After chunk c's backward of one micro-batch: ZeRO-2's reduce-scatter of it (else nothing).
void dpl_after_backward(DpLayer *d, int c);
// After the table and the tied wte's sum: average (or reduce-scatter) the gradients, clip with
// the global norm (grid_clip_norm_sq), AdamW on what this rank updates, all-gather what must be
// whole. Returns the squared global norm before clipping.
double dpl_step(DpLayer *d, const AdamW *h, int step);
// Where --inject-nan-step puts its NaN: the first gradient element this rank's clip norm still
// reads after the table (chunk 0's first; ZeRO-2: the first of its piece, the rest is zeroed).
void *dpl_grad_first(const DpLayer *d);

// Checkpoints: the layouts are views of one model.
typedef enum { DPL_MASTER, DPL_ADAM_M, DPL_ADAM_V } DplState;
// Chunk c's whole fp32 master (fp32: the weights), Adam m or v in the chunk's layout (n floats,
// on its device): the ZeroShard's own buffer, or under ZeRO every replica's piece all-gathered into
// a fresh buffer (*owned, mem_free it after; NULL when nothing was allocated). Collective over
// DP when the state is sharded.
const float *dpl_whole_state(const DpLayer *d, int c, DplState which, float **owned);
// --save-sharded under --zero 1, 2: chunk c's pieces this replica holds (the fp32 master, Adam m
// and v) at their places in host arrays of the chunk's size (p, m, v, zeroed by the caller), and
// 1 in held there. Not collective.
void dpl_my_pieces(const DpLayer *d, int c, float *p, float *m, float *v, float *held);
// Chunk c takes its slices of a whole model's arrays (memory order, host): the weights `w` into
// its master (bf16: rounded into the weights, every replica's piece all-gathered), Adam's fm and
// fv (NULL: --load-weights, left as they are) into its piece. Collective over DP (bf16 ZeRO).
void dpl_take_state(DpLayer *d, int c, const float *w, const float *fm, const float *fv);
