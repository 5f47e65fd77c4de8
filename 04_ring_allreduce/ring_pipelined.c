// ring_pipelined.c: the ring of ring.c, made faster without changing what it sends.
//
// Three changes, each visible in the benchmark (bench.c):
//   1. no allocation per call: ring_all_reduce gets a fresh tmp every call, and a fresh large
//      buffer costs a page fault per 4 KiB page the first time it is written. The two segment
//      buffers here are made once (ring_workspace_init) and reused.
//   2. segments: a chunk travels as segments of seg_elems floats. Each segment lands in a small
//      buffer that is still in cache when we add it, instead of a chunk-sized tmp that has left
//      the cache by the time the add reads it back: one trip to memory less per element.
//   3. overlap: segment k+1 is already posted (dist_isend / dist_irecv) while segment k is
//      being added, so the neighbours can move it meanwhile.
//   4. the add asks for the lines it is about to write one block ahead (ring_add below).
// The all-gather phase has nothing to add: ring_all_gather receives straight into place, which
// is already the least copying there is.
#include "ring.h"

#include "check.h"
#include "mem.h"

enum { TAG_PIPELINED = 403 };

void ring_workspace_init(RingWorkspace *ws, size_t seg_bytes) {
    LAB_CHECK(seg_bytes >= sizeof(float), "ring_workspace_init: segment of %zu bytes, need at least %zu",
              seg_bytes, sizeof(float));
    ws->seg_elems = seg_bytes / sizeof(float);
    // one allocation, two halves: seg[0] followed by seg[1], so seg[0] can also take 2 segments
    ws->seg[0] = mem_alloc(2 * ws->seg_elems * sizeof(float), MEM_COMM, DEV_CPU);
    ws->seg[1] = ws->seg[0] + ws->seg_elems;
}

void ring_workspace_free(RingWorkspace *ws) {
    mem_free(ws->seg[0]);
    ws->seg[0] = ws->seg[1] = NULL;
    ws->seg_elems = 0;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// acc[i] += in[i] for i < n, the add of the scatter-reduce. `in` is a segment buffer the receive
// has just written, so it is in our cache. acc is our copy of the chunk, and its cache lines are
// often in a neighbour's cache too: it read them when we last sent this part of the buffer (in
// the benchmark, in the all-gather of the call before). Writing such a line means first taking
// it back (the other core's copy is invalidated): a round trip between cores per 64-byte line.
// The hardware prefetcher fetches lines only for reading, so without help the stores keep only a
// few of those round trips going at once (measured: the add of a 512 KiB chunk took 60-80 us
// right after the exchange, 15 us when repeated at once). Here the add goes in blocks of 4 KiB, and before adding
// a block it asks for the next block's lines for writing (__builtin_prefetch(p, 1): rw = 1,
// prefetchw on x86), so those round trips overlap the add of this block. This gains most when
// the chunk fits in the caches (around 1 MiB messages), where those round trips are the cost.
void ring_add(float *restrict acc, const float *restrict in, size_t n) {
    enum { BLOCK = 1024, LINE = 16 };  // in floats: 4 KiB, one 64-byte cache line
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t end = min_size(b + BLOCK, n), next_end = min_size(end + BLOCK, n);
        for (size_t p = end; p < next_end; p += LINE) __builtin_prefetch(acc + p, 1);
        for (size_t i = b; i < end; i++) acc[i] += in[i];
    }
}

void ring_scatter_reduce_pipelined(float *buf, size_t count, RingWorkspace *ws, DistGroup *g) {
    int r = g->rank, N = g->size;
    int right = (r + 1) % N, left = (r - 1 + N) % N;
    // A chunk of at most two segments goes as one message (into both halves of the workspace):
    // too short to gain from the overlap, and every message costs a handshake.
    size_t SEG = ws->seg_elems;
    if (ring_chunk_len(count, N, 0) <= 2 * SEG) SEG = 2 * SEG;
    for (int step = 0; step < N - 1; step++) {
        // EXERCISE 04.3 Pipelined scatter-reduce -> 04_ring_allreduce/README.md#exercise-043-pipelined-scatter-reduce
        int send_c = (r - step + N) % N, recv_c = (r - step - 1 + N) % N;
        const float *out = buf + ring_chunk_start(count, N, send_c);  // (out_len,) goes right
        float *acc = buf + ring_chunk_start(count, N, recv_c);        // (in_len,) comes from the left
        size_t out_len = ring_chunk_len(count, N, send_c), in_len = ring_chunk_len(count, N, recv_c);
        // Chunks differ by at most one element, so their segment counts may differ by one.
        size_t n_out = (out_len + SEG - 1) / SEG, n_in = (in_len + SEG - 1) / SEG;
        size_t nseg = n_out > n_in ? n_out : n_in;
        DistWork sends[2], recvs[2];  // segment k uses slot k % 2
        for (size_t k = 0; k < nseg + 1; k++) {
            // post segment k (while segment k-1, posted last round, is still in flight)...
            if (k < n_in)
                recvs[k % 2] = dist_irecv(ws->seg[k % 2], min_size(SEG, in_len - k * SEG), DIST_F32, left,
                                          TAG_PIPELINED, g);
            if (k < n_out)
                sends[k % 2] = dist_isend(out + k * SEG, min_size(SEG, out_len - k * SEG), DIST_F32, right,
                                          TAG_PIPELINED, g);
            // ...then finish segment k-1: wait for it and add it into our copy of the chunk.
            if (k == 0) continue;
            size_t j = k - 1;
            if (j < n_in) {
                dist_wait(&recvs[j % 2]);
                ring_add(acc + j * SEG, ws->seg[j % 2], min_size(SEG, in_len - j * SEG));
            }
            if (j < n_out) dist_wait(&sends[j % 2]);
        }
        // END EXERCISE 04.3
    }
}

void ring_all_reduce_pipelined(float *buf, size_t count, RingWorkspace *ws, DistGroup *g) {
    ring_scatter_reduce_pipelined(buf, count, ws, g);
    ring_all_gather(buf, count, g, NULL);
}
