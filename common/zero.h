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

// The layout of model m (full model) over N parts, as seen by part r.
// zero_layout_init: by unit (piece r of every unit); zero_layout_init_flat: the flat buffer in N
// shards, my pieces the units' intersections with mine.
void zero_layout_init(ZeroLayout *z, const GPT2 *m, int N, int r);
void zero_layout_init_flat(ZeroLayout *z, const GPT2 *m, int N, int r);
void zero_layout_free(ZeroLayout *z);
// Rank q's piece of unit u for every q (N counts: the blocks of the unit's v-collectives).
void zero_unit_counts(const ZeroLayout *z, int u, size_t *counts);
// Flat layout only: rank q's part of the range [lo, hi) of the flat buffer for every q (the
// blocks of a bucket's v-collective); returns where my part starts in my shard buffers and, in
// *at, where it starts inside the range.
size_t zero_range_counts(const ZeroLayout *z, size_t lo, size_t hi, size_t *counts, size_t *at);
// Elements part q owns (any q in [0, N)): the formula side of the memory tables.
size_t zero_shard_elems(const ZeroLayout *z, int q);

// Σ g² of this rank's gradient pieces, in double. `g` holds dtype elements; full: g is the whole
// flat buffer (the pieces are read at their global offsets), else g is the shard buffer.
// Pieces adjacent in memory are summed as one run (so one part = one sum over everything, op for
// op the single-device clipping norm).
double zero_local_sum_squares(const ZeroLayout *z, const GPT2 *m, const void *g, int full);

// One AdamW step on this rank's pieces. master/opt_m/opt_v: shard buffers (fp32). param: the
// model-dtype weights the step rounds into (bf16) — params_full ? the full flat buffer : the
// shard buffer; grad likewise (grads_full). fp32: master is the fp32 parameters themselves
// (then param is ignored; master may point into the full buffer: master_full).
void zero_adamw_step(const ZeroLayout *z, const AdamW *h, GPT2 *m, int step, float *master,
                     int master_full, void *param, int params_full, const void *grad,
                     int grads_full, float *opt_m, float *opt_v, const GPT2Param *plist,
                     int nplist, float scale);

// ZeRO-1's step after backward, on the model's full gradient and parameter buffers (its dtype):
// reduce-scatter every unit's gradient (average) so that my piece of it lands in place (flat:
// the whole buffer is one range, one reduce-scatter), clip
// from the pieces (Σ g² over mine, summed over g), AdamW on my pieces only, then all-gather
// every unit's parameters in place: every rank holds the whole updated model again.
void zero1_step(const ZeroLayout *z, GPT2 *m, const AdamW *h, int step, float *master,
                int master_full, float *opt_m, float *opt_v, const GPT2Param *plist, int nplist,
                DistGroup *g);

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

// Whole-model fp32 arrays <-> this rank's shard buffer (host or device, memory order).
// gather: every rank passes its shard; rank 0's full (n floats) receives all pieces.
void zero_gather_full(const ZeroLayout *z, const float *shard, float *full, DistGroup *g);
// scatter: every rank holds the same full array (after a broadcast) and copies its pieces.
void zero_take_pieces(const ZeroLayout *z, const float *full, float *shard);

// The sharded training state (master pieces, Adam m and v pieces: z->shard_n fp32 each, host or
// device) <-> the lab's one checkpoint format (the whole model, common/ckpt.h), so that any
// layout resumes any other's (05 and 06 on N ranks, 03 on M). Shared by 05_zero and 06_fsdp.
// save: collective over g (the ranks of ONE copy of the pieces, e.g. HSDP's first shard
//   group); g's rank 0 writes path.
void zero_save_training(const ZeroLayout *z, const char *path, const GPT2Config *cfg, int step,
                        uint64_t seed, uint64_t data_seed, const float *master,
                        const float *opt_m, const float *opt_v, DistGroup *g);
// load: collective over world: world rank 0 reads --resume (weights, Adam state, step) or
//   --load-weights (weights only; m, v untouched), broadcasts, every rank takes its pieces.
//   Returns the step to continue from (0 for --load-weights).
int zero_load_training(const ZeroLayout *z, const GPT2Config *cfg, const char *resume,
                       const char *load_weights, float *master, float *opt_m, float *opt_v,
                       DistGroup *world);
// Fresh: each rank initializes only its own pieces (gpt2_init_slice: a piece is exactly that
// slice of the full model's initialization), into master (z->shard_n fp32, host or device).
void zero_init_pieces(const ZeroLayout *z, const GPT2Config *cfg, uint64_t seed, float *master);
