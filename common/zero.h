// zero.h: the ZeRO partition of the model state and the pieces of a sharded step.
//
// The flat buffer is block-major: units [embed] [block 0] ... [block L-1] [head], each one
// contiguous range (common/gpt2.h). Two partitions of it; in both, every rank's piece of a unit
// is one contiguous range (maybe empty) and the pieces of a unit follow each other in rank
// order, so that the pieces of a unit are the blocks of one v-collective:
//   flat (zero_layout_init_flat: chapter 05, the way DeepSpeed partitions its flat buffer):
//     the WHOLE buffer is cut into N shards, shard_range(Ψ, N, r) (common/shard.h); rank r's
//     piece of unit u is the intersection of u with shard r (often empty: a unit lies in one
//     or two shards). A rank's shard is exactly Ψ/N (± 1).
//   by unit (zero_layout_init: FSDP's layout, chapter 06): each unit is cut into N pieces by
//     shard_range(size_u, N, r); rank r owns piece r of EVERY unit.
// A rank stores its pieces one after the other in its shard buffers (master weights, Adam m
// and v; the gradients from ZeRO-2; the parameters from ZeRO-3). Every per-unit collective is
// then ONE v-op on ONE contiguous unit, rank q's block its piece (zero_unit_counts):
//   reduce-scatter of unit u's gradient: dist_ireduce_scatter_v(grad_u, my piece, counts_u)
//   all-gather of unit u's parameters:   dist_iall_gather_v(my piece, params_u, counts_u)
// and in the flat layout any range of the buffer (a bucket: zero_range_counts) is one too.
// A layout with N = 1 owns everything: stage 0 (DDP) is that layout with an all-reduce.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "gpt2.h"
#include "optim.h"

typedef struct ZeroPiece {
    size_t unit_offset;   // the unit in the full flat buffer (memory order)
    size_t unit_size;     // elements of the unit
    size_t begin, count;  // this rank's piece inside the unit (by unit: shard_range(unit_size, N,
                          // r); flat: unit ∩ my shard; begin = the pieces of ranks < r before it)
    size_t local;         // where the piece starts in this rank's shard buffers
} ZeroPiece;

typedef struct ZeroLayout {
    int N, r;             // parts, and the part this rank owns
    int nunits;           // the model's units (L + 2), in memory order
    ZeroPiece *p;         // (nunits)
    size_t shard_n;       // elements this rank owns: the sum of its pieces' counts
    size_t n;             // elements of the whole model
    int flat;             // 1: zero_layout_init_flat's partition
    size_t shard_begin;   // flat: where my shard starts in the flat buffer (shard_range(n, N, r))
    size_t *counts;       // (nunits * N): counts[u * N + q] = rank q's piece of unit u, or NULL
                          // (a layout built by hand: computed from N, n, flat and the units)
} ZeroLayout;

// The layout of model m (the full model, or any part of it: its units, its offsets; 09's chunks)
// over N parts, as seen by part r.
// zero_layout_init: by unit (piece r of every unit); zero_layout_init_flat: the flat buffer in N
// shards, my pieces the units' intersections with mine.
void zero_layout_init(ZeroLayout *z, const GPT2 *m, int N, int r);
void zero_layout_init_flat(ZeroLayout *z, const GPT2 *m, int N, int r);
// The flat layout of any buffer of n elements as one unit (a pipeline stage's flat buffer, a
// TP slice's: what has no GPT-2 units to cut by), over N parts as seen by part r.
void zero_layout_init_buffer(ZeroLayout *z, size_t n, int N, int r);
void zero_layout_free(ZeroLayout *z);
// Rank q's piece of unit u for every q (N counts: the blocks of the unit's v-collectives).
void zero_unit_counts(const ZeroLayout *z, int u, size_t *counts);
// Flat layout only: rank q's part of the range [lo, hi) of the flat buffer for every q (the
// blocks of a bucket's v-collective); returns where my part starts in my shard buffers and, in
// *at, where it starts inside the range.
size_t zero_range_counts(const ZeroLayout *z, size_t lo, size_t hi, size_t *counts, size_t *at);
// Flat layout only: the range [lo, hi) of buf (the whole flat buffer, dt elements) reduced over
// g (op), each rank's part of the range (zero_range_counts) landing in place in buf: one v-op
// (09's ZeRO-2: a micro-batch's gradient outside the tied span, then the tied span).
void zero_range_reduce_scatter(const ZeroLayout *z, size_t lo, size_t hi, void *buf, DistDtype dt,
                               DistOp op, DistGroup *g);

// One rank's buffers for the sharded step, over ANY flat buffer the layout cuts (a whole GPT-2,
// a pipeline stage's chunk, a TP slice): the step needs no model, only these and the parameter
// list whose numbering the layout cuts (weight decay is looked up in it).
typedef struct ZeroShard {
    const Kernels *k;
    DistDtype dt;             // the type of params and grads (DIST_F32, or DIST_BF16: mixed precision)
    void *params;             // the weights the forward reads: the whole buffer (params_full) or
    int params_full;          //   my pieces (ZeRO-3)
    void *grads;              // the gradient: the whole buffer, reduce-scattered by the step
    int grads_full;           //   (grads_full), or my averaged pieces (ZeRO-2, -3: done in backward)
    float *master;            // the fp32 weights AdamW updates: the whole buffer (master_full) or
    int master_full;          //   my pieces; fp32: the params themselves
    float *opt_m, *opt_v;     // Adam's m, v: my pieces
    float *scratch;           // bf16: fp32 scratch the gradients are widened in, chunk floats
    size_t chunk;
    const GPT2Param *plist;
    int nplist;
} ZeroShard;

// The ZeroShard fields a GPT-2 gives (k, dt, scratch, chunk); the buffers are the caller's.
ZeroShard zero_shard_of(const GPT2 *m, const GPT2Param *plist, int nplist);

// One rank's optimizer state of its pieces (z) of model m's flat buffer, the weights and the
// gradients whole (params_full, grads_full): Adam's m, v of my pieces (MEM_OPT_M, MEM_OPT_V,
// zeroed) and the master: fp32 the weights themselves (master_full), bf16 an fp32 copy of my
// pieces (MEM_MASTER) starting at m's initial weights of seed, unrounded (the weights are those
// rounded: gpt2_init_params). A layout of one part is the whole buffer's state: 07's TP slice;
// 09's chunks over DP (zero_layout_init_buffer); zero_adamw steps it.
void zero_shard_alloc(ZeroShard *b, const ZeroLayout *z, GPT2 *m, uint64_t seed);
void zero_shard_free(ZeroShard *b);
// After the master changed outside a step (a checkpoint read into it): bf16 rounds my pieces of
// it into the weights the forward reads; fp32 nothing (the master is the weights).
void zero_shard_master_to_params(const ZeroLayout *z, const ZeroShard *b);

// Σ g² of this rank's gradient pieces (b->grads, whole or pieces), in double. Pieces adjacent
// in memory are summed as one run (so one part = one sum over everything, op for op the
// single-device clipping norm).
double zero_sum_squares(const ZeroLayout *z, const ZeroShard *b);
// One AdamW step (optim.h's adamw_update) on each of this rank's pieces; bf16 rounds the master
// into b->params.
void zero_adamw(const ZeroLayout *z, const ZeroShard *b, const AdamW *h, int step, float scale);
// Every rank's pieces of the parameters to every rank, in place in the whole buffer
// (params_full; nothing to do on one part).
void zero_gather_params(const ZeroLayout *z, const ZeroShard *b, DistGroup *g);

// ZeRO's step after backward (05's every stage; a pipeline stage's flat buffer in 09):
//   1. grads_full (ZeRO-1): reduce-scatter the whole gradient (average over g), my pieces
//      landing in place (flat: the whole buffer is one reduce-scatter; by unit, one per unit)
//   2. clip from the pieces: Σ g² over mine, summed over g (each element counted once)
//   3. AdamW on my pieces only
//   4. params_full (ZeRO-1, -2): all-gather the updated parameters in place
// On a layout of one part (stage 0: DDP, its gradient already all-reduced) nothing moves.
// Returns the global squared norm of the gradient, before clipping (the health line's).
double zero_step(const ZeroLayout *z, const ZeroShard *b, const AdamW *h, int step, DistGroup *g);

// Unit u's v-collectives (blocks: the ranks' pieces of u), blocking or started (nonblocking: wait
// the returned DistWork). reduce-scatter: unit_grad (the whole unit) -> my piece (AVG divides by
// N); all-gather: my piece -> unit (the whole unit). The in-place forms of dist.h apply.
DistWork zero_unit_reduce_scatter(const ZeroLayout *z, int u, const void *unit_grad, void *piece,
                                  DistDtype dt, DistOp op, int nonblocking, DistGroup *g);
DistWork zero_unit_all_gather(const ZeroLayout *z, int u, const void *piece, void *unit,
                              DistDtype dt, int nonblocking, DistGroup *g);

// ZeRO-3: start the all-gather of unit u's parameters from my piece (shard: my pieces, in the
// model's dtype dt) into out (the whole unit). Non-blocking: dist_wait the result before use.
DistWork zero_gather_unit(const ZeroLayout *z, int u, const void *shard, void *out, DistDtype dt,
                          DistGroup *g);

// ZeRO-3 and FSDP share the life of a unit: its whole weights gathered from the pieces for the
// ops that read them, then freed (my piece stays); its whole gradient, written by backward,
// reduce-scattered back into the pieces. The order (when to gather, prefetch, free) is the
// chapter's: 05 gathers just in time with one unit ahead, 06 walks a plan (06_fsdp/fsdp.h).
typedef struct ZeroUnit {
    void *w;          // the whole unit's weights (MEM_COMM): from zero_unit_gather to _free
    DistWork ag;
    double ag_t0;     // when its all-gather started (--trace)
    void *g;          // the whole unit's gradient (zero_unit_grad) until zero_unit_grad_free
    DistWork rs;
    double rs_t0;     // when its reduce-scatter started (--trace)
} ZeroUnit;

// Start the all-gather of unit u from my pieces (shard, dtype dt) into a fresh buffer U->w
// (MEM_COMM on dev); zero_unit_wait before reading it; zero_unit_free after the last read.
void zero_unit_gather(const ZeroLayout *z, int u, ZeroUnit *U, const void *shard, DistDtype dt,
                      Device dev, DistGroup *g);
// The same on the all-gather primitive (zero_unit_all_gather) instead of exercise 05.3's
// zero_gather_unit: FSDP's (06) exercises then stand on their own in the student tree.
void zero_unit_gather_direct(const ZeroLayout *z, int u, ZeroUnit *U, const void *shard,
                             DistDtype dt, Device dev, DistGroup *g);
void zero_unit_wait(ZeroUnit *U, int u);
void zero_unit_free(ZeroUnit *U);
// Unit u's gradient buffer (e bytes an element, zeroed at first use, counted under cat).
void *zero_unit_grad(const ZeroLayout *z, int u, ZeroUnit *U, size_t e, MemCategory cat,
                     Device dev);
// Start the reduce-scatter of U->g (average over g) into my piece: `piece` is where it lands
// (in my shard, or in place inside U->g). zero_unit_grad_wait, then zero_unit_grad_free.
void zero_unit_grad_scatter(const ZeroLayout *z, int u, ZeroUnit *U, void *piece, DistDtype dt,
                            DistGroup *g);
void zero_unit_grad_wait(ZeroUnit *U, int u);
void zero_unit_grad_free(ZeroUnit *U);

// Whole-model fp32 arrays <-> this rank's shard buffer (host or device, memory order).
// gather: every rank passes its shard; rank 0's full (n floats) receives all pieces.
void zero_gather_full(const ZeroLayout *z, const float *shard, float *full, DistGroup *g);
// scatter: every rank holds the same full array (after a broadcast) and copies its pieces
// (dst_full: into a whole-model buffer, each piece at its global offset; else my shard buffer).
void zero_take_pieces(const ZeroLayout *z, const float *full, float *dst, int dst_full);
// A bf16 model's fp32 master for my pieces (MEM_MASTER, on the model's device): the initial
// weights of `seed` (gpt2_init_local), unrounded, cut to my pieces of z.
float *zero_master_pieces(const ZeroLayout *z, const GPT2 *m, uint64_t seed);

// The sharded training state (master pieces, Adam m and v pieces: z->shard_n fp32 each, host or
// device) <-> the lab's one checkpoint format (the whole model, common/ckpt.h), so that any
// layout resumes any other's (05 and 06 on N ranks, 03 on M). Shared by 05_zero and 06_fsdp.
// master_full: the master is a whole-model buffer every rank holds in full (05's fp32 stages 0-2,
// where the master IS the model's parameters); else my shard buffer, like m and v.
// save: collective over g (the ranks of ONE copy of the pieces, e.g. HSDP's first shard
//   group); g's rank 0 writes path. --save-sharded: no gather, each rank of g writes its own
//   pieces (ckpt_shard_write; the loop's ckpt_settle writes the manifest).
void zero_save_training(const ZeroLayout *z, const char *path, const GPT2Config *cfg, int step,
                        uint64_t seed, uint64_t data_seed, const float *master, int master_full,
                        const float *opt_m, const float *opt_v, DistGroup *g);
// load: collective over world: world rank 0 reads --resume (weights, Adam state, step) or
//   --load-weights (weights only; m, v untouched), broadcasts, every rank takes its pieces.
//   Returns the step to continue from (0 for --load-weights).
int zero_load_training(const ZeroLayout *z, const GPT2Config *cfg, const char *resume,
                       const char *load_weights, float *master, int master_full, float *opt_m,
                       float *opt_v, DistGroup *world);
// Fresh: each rank initializes only its own pieces (gpt2_init_slice: a piece is exactly that
// slice of the full model's initialization), into master (z->shard_n fp32, host or device; or
// master_full: a whole-model buffer, each piece at its global offset).
void zero_init_pieces(const ZeroLayout *z, const GPT2Config *cfg, uint64_t seed, float *master,
                      int master_full);
