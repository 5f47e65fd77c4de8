// ring.h: ring all-reduce built from send/recv, as the notes draw it.
//
// N ranks stand in a ring; rank r only ever sends to its right neighbour r+1 and receives from
// its left neighbour r-1 (mod N). The buffer (count floats) is cut into N chunks.
//   phase 1, scatter-reduce  N-1 steps: send one chunk right, receive one from the left and add
//                            it to our own copy of that chunk. Afterwards rank r holds the full
//                            sum of chunk (r+1) mod N.
//   phase 2, all-gather      N-1 steps: pass the finished chunks on around the ring, copying
//                            instead of adding. Afterwards every rank holds every summed chunk.
// Bytes per rank (S = count * 4): each phase sends and receives (N-1)/N * S, the whole
// all-reduce 2(N-1)/N * S, whatever N is: no rank is a bottleneck (compare naive.c).
#pragma once
#include <stddef.h>

#include "dist.h"
#include "shard.h"

// Chunk c of a count-element buffer: the first count % N chunks are one element longer, so any
// count works (even 0, or fewer than N: some chunks are then empty). These are the lab's shards
// (common/shard.h), under the names the chapter uses.
static inline size_t ring_chunk_start(size_t count, int N, int c) { return shard_begin(count, N, c); }
static inline size_t ring_chunk_len(size_t count, int N, int c) { return shard_count(count, N, c); }

// Draws the ring step by step (show.c); NULL everywhere except in --show.
typedef struct RingPicture RingPicture;

// Phase 1. buf: (count,) this rank's values; tmp: (ring_chunk_len(count, N, 0),) scratch.
// On return chunk (r+1) mod N of buf holds the sum of that chunk over all ranks (r = g->rank).
void ring_scatter_reduce(float *buf, size_t count, float *tmp, DistGroup *g, RingPicture *pic);
// Phase 2. On entry chunk (r+1) mod N of buf holds the summed chunk (the end of phase 1); on
// return every chunk does.
void ring_all_gather(float *buf, size_t count, DistGroup *g, RingPicture *pic);
// In place: buf (count,) becomes the element-wise sum over the ranks of g. Allocates its tmp.
void ring_all_reduce(float *buf, size_t count, DistGroup *g);

// --- the faster ring (ring_pipelined.c) -----------------------------------------------------
// Same algorithm and bytes; each chunk travels in segments so that the transfer of segment k+1
// is under way while segment k is added, the segments stay in cache, and nothing is allocated
// per call: the two segment buffers live in a workspace made once.
typedef struct RingWorkspace {
    float *seg[2];     // (seg_elems,) each: receive buffers, used in turn; adjacent (seg[1] =
                       // seg[0] + seg_elems), so seg[0] can take one message of 2 segments
    size_t seg_elems;  // floats per segment
} RingWorkspace;

void ring_workspace_init(RingWorkspace *ws, size_t seg_bytes);  // seg_bytes >= 4
void ring_workspace_free(RingWorkspace *ws);
// acc[i] += in[i] for i < n (acc and in must not overlap), asking for acc's cache lines ahead,
// for writing: the add of the pipelined scatter-reduce (see ring_pipelined.c for why).
void ring_add(float *restrict acc, const float *restrict in, size_t n);
// Phase 1, pipelined: same contract as ring_scatter_reduce.
void ring_scatter_reduce_pipelined(float *buf, size_t count, RingWorkspace *ws, DistGroup *g);
// Pipelined phase 1 + phase 2 (the all-gather has nothing to add, so it is ring_all_gather).
void ring_all_reduce_pipelined(float *buf, size_t count, RingWorkspace *ws, DistGroup *g);

// --- the naive all-reduce of chapter 02's master (naive.c) ----------------------------------
// Every rank sends its whole buffer to the root, which adds them up and sends the sum back to
// each rank. tmp: (count,) scratch, used on the root only. The root moves (N-1) * S each way.
void naive_all_reduce(float *buf, size_t count, float *tmp, int root, DistGroup *g);

// --- the picture (show.c) -------------------------------------------------------------------
// buf must hold, in every element of chunk c on rank r, the value 2^r (ring_picture_fill):
// a sum of such values says which ranks contributed, so the picture reads the real buffers.
void ring_picture_fill(float *buf, size_t count, DistGroup *g);
RingPicture *ring_picture_begin(const float *buf, size_t count, DistGroup *g);  // draws the start
// Collective: draws every rank's chunks after `step` (0-based) of `phase`.
void ring_picture_step(RingPicture *pic, const char *phase, int step, const float *buf, size_t count, DistGroup *g);
void ring_picture_end(RingPicture *pic);
