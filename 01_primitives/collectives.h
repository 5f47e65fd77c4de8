// collectives.h: every collective of the notes, built from point-to-point send/recv only.
//
// The library (dist_broadcast, dist_all_reduce, ... over MPI) does the same jobs; these versions
// show how, and the tests check them against the library on 1..8 ranks. All work on fp32 and
// reduce with SUM, over any group. Bytes per rank (S = count * 4 bytes, N = group size, the
// dist counters OP_SEND/OP_RECV count them for real):
//
//   prim_broadcast       root sends S to each other rank:        root sent (N-1)*S, others recv S
//   prim_reduce          each other rank sends S to the root:    others sent S, root recv (N-1)*S
//   prim_scatter         root sends block r to rank r:           root sent (N-1)*B, others recv B
//   prim_gather          rank r sends its block to the root:     others sent B, root recv (N-1)*B
//   prim_reduce_scatter  rank r sends block j to rank j, j != r: sent S - |block r|,
//                                                                recv (N-1) * |block r|
//   prim_all_gather      rank r sends its block to every rank:   sent (N-1) * |block r|,
//                                                                recv S - |block r|
//   prim_all_reduce      reduce-scatter, then all-gather:        sent = recv = 2(N-1)/N * S
//                                                                (when N divides count)
// (B = count * 4 bytes, the per-rank block of scatter/gather.)
#pragma once
#include <stddef.h>

#include "dist.h"
#include "shard.h"

// A count-element buffer split into N blocks as evenly as possible: the first count % N blocks
// have one element more. Block i is [prim_block_start(count, N, i), + prim_block_len(...)): the
// lab's shards (common/shard.h), under the names the chapter uses.
static inline size_t prim_block_start(size_t count, int N, int i) { return shard_begin(count, N, i); }
static inline size_t prim_block_len(size_t count, int N, int i) { return shard_count(count, N, i); }

// buf: (count,) on every rank; on return every rank holds root's values.
void prim_broadcast(float *buf, size_t count, int root, DistGroup *g);
// send: (count,) on every rank; recv: (count,) on the root only (others may pass NULL).
// The root's recv gets the element-wise sum of every rank's send.
void prim_reduce(const float *send, float *recv, size_t count, int root, DistGroup *g);
// send: (N*count,) on the root only; recv: (count,) everywhere; rank r gets block r.
void prim_scatter(const float *send, float *recv, size_t count, int root, DistGroup *g);
// send: (count,) everywhere; recv: (N*count,) on the root only; block r comes from rank r.
void prim_gather(const float *send, float *recv, size_t count, int root, DistGroup *g);

// In place on the whole buffer, blocks as prim_block_start/len (any count, even 0 or < N).
// buf: (count,). On return block r (r = this rank) holds the sum over ranks of block r; the
// other blocks are left as they were.
void prim_reduce_scatter(float *buf, size_t count, DistGroup *g);
// buf: (count,). On entry block r holds this rank's piece; on return every block is filled
// with the piece of the rank that owns it.
void prim_all_gather(float *buf, size_t count, DistGroup *g);
// buf: (count,). All-Reduce = Reduce-Scatter + All-Gather, literally.
void prim_all_reduce(float *buf, size_t count, DistGroup *g);
