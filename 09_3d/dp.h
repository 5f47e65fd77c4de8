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
//   3  ZeRO-3 (chapter 05): as 2, and the WEIGHTS sharded too: each chunk's buffer cut into dp
//      pieces as 05 cuts its flat buffer (zero_layout_init_flat on the chunk's units), a rank
//      keeping only its piece (and AdamW updating it there: nothing is all-gathered after the
//      step). Before a unit's forward, and again before its backward, the whole unit is
//      all-gathered from the pieces (common/zero.h's ZeroUnit; one unit ahead), and freed after.
//   --fsdp (chapter 06): the same life of a unit on FSDP's layout (zero_layout_init: piece d of
//      EVERY unit), --prefetch N units gathered ahead, and --reshard-after-forward 0 keeping the
//      units gathered from their first forward to the step's update (no second gather).
// A chunk's units are its blocks, the embedding where it holds it, the head (and the tied copy
// of wte) where it holds it. With sharded weights the gradient is reduce-scattered per unit
// after every micro-batch (as ZeRO-2, into the whole gradient buffer); the unit holding a tied
// end of wte (the embedding's, or the copy) waits for the ends' sum and is reduced once per step.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "grid3d.h"
#include "gpt2.h"
#include "optim.h"
#include "tp.h"
#include "zero.h"

typedef struct DpLayer {
    int zero;          // 0, 1, 2, 3
    int fsdp;          // 1: FSDP's by-unit layout (zero is 0)
    int sharded;       // the weights sharded (zero 3, fsdp): units gathered around their pieces
    int prefetch;      // units gathered ahead (ZeRO-3: 1; FSDP: --prefetch)
    int reshard;       // free a unit after its forward (ZeRO-3: 1; FSDP: --reshard-after-forward)
    ZeroUnit **U;      // (v, nunits) sharded: the units gathered now, and their state in st
    unsigned char **st;  // 0 my piece only, 1 its all-gather in flight, 2 whole
    int *defer;        // (v) sharded: the unit holding a tied end of wte (reduced once per
                       //  step, after the ends' sum), or -1
    int v;             // chunks
    GPT2 **m;          // (v) this rank's chunks (the caller's)
    ZeroLayout *z;     // (v) each chunk's flat buffer over the replicas (--zero 0: one part)
    ZeroShard *b;      // (v) their optimizer state: my piece (--zero 0: the whole buffer)
    size_t *tied_lo, *tied_hi;  // (v) ZeRO-2: the tied wte's span of the chunk (the first
                                //  chunk's wte, the last's copy at its end), reduced once per
                                //  step; [0, 0) where the chunk holds no end of it
    const Grid *grid;
} DpLayer;

// What the DP layer is asked for: --zero, --fsdp and its two knobs (-1: not given).
typedef struct DplOpts {
    int zero, fsdp, prefetch, reshard;
} DplOpts;
// --zero 0 .. 3, or --fsdp (with --zero 0), --prefetch and --reshard-after-forward with --fsdp
// only, sharded weights not with a split (zb) schedule: anything else is refused on every rank
// with one message naming the valid choices.
void dpl_check(const DplOpts *o, int split_schedule);
// The layer over this rank's v chunks st[0 .. v): the pieces, and the optimizer state of mine
// (a bf16 master starts at the initial weights of `seed`). Sharded (zero 3, fsdp): the chunks'
// whole weights are freed, this rank keeps its pieces of them.
void dpl_init(DpLayer *d, const DplOpts *o, GPT2 **m, int v, const Grid *g, uint64_t seed);
// Chunk c's forward / backward of one micro-batch (tp.h's tp_forward / tp_backward); sharded:
// unit by unit, each unit gathered whole around its piece (prefetch ahead), freed after.
float dpl_forward(DpLayer *d, int c, GPT2Acts *a, TpComm *comm);
void dpl_backward(DpLayer *d, int c, GPT2Acts *a, TpComm *comm, float dloss);
// Chunk c's weights the forward reads, whole, as fp32 on the host (gpt2_weights_to_host; sharded:
// every replica's pieces all-gathered, collective over DP).
void dpl_weights_to_host(DpLayer *d, int c, float *host);
void dpl_free(DpLayer *d);
// What the loss's gradient is divided by besides the micro-batches and positions: 1 where the
// reduce averages over the replicas (--zero 0, 1), dp where it sums (2).
int dpl_loss_divisor(const DpLayer *d);
// After chunk c's backward of one micro-batch: ZeRO-2's (3's, FSDP's) reduce-scatter of it.
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
