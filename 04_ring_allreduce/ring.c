// ring.c: the ring all-reduce of the notes, from dist_sendrecv (see ring.h).
//
// Every step is one dist_sendrecv: send a chunk to the right neighbour and receive one from the
// left at the same time. Because every rank sends and receives in the same call, no rank waits
// on a rank that waits on it, whatever N is.
#include "ring.h"

#include "check.h"
#include "mem.h"

enum { TAG_SCATTER_REDUCE = 401, TAG_ALL_GATHER = 402 };

void ring_scatter_reduce(float *buf, size_t count, float *tmp, DistGroup *g, RingPicture *pic) {
    int r = g->rank, N = g->size;
    int right = (r + 1) % N, left = (r - 1 + N) % N;
    for (int step = 0; step < N - 1; step++) {
        // EXERCISE 04.1 Scatter-reduce phase -> 04_ring_allreduce/README.md#exercise-041-scatter-reduce-phase
        // Send the chunk we added to in the last step (our own chunk r at step 0); receive the
        // chunk our left neighbour just added to, and add our values of it.
        int send_c = (r - step + N) % N;
        int recv_c = (r - step - 1 + N) % N;
        size_t recv_len = ring_chunk_len(count, N, recv_c);
        dist_sendrecv(buf + ring_chunk_start(count, N, send_c), ring_chunk_len(count, N, send_c), right,
                      tmp, recv_len, left, DIST_F32, TAG_SCATTER_REDUCE, g);
        float *acc = buf + ring_chunk_start(count, N, recv_c);  // (recv_len,)
        for (size_t i = 0; i < recv_len; i++) acc[i] += tmp[i];
        // END EXERCISE 04.1
        if (pic) ring_picture_step(pic, "scatter-reduce", step, buf, count, g);
    }
}

void ring_all_gather(float *buf, size_t count, DistGroup *g, RingPicture *pic) {
    int r = g->rank, N = g->size;
    int right = (r + 1) % N, left = (r - 1 + N) % N;
    for (int step = 0; step < N - 1; step++) {
        // EXERCISE 04.2 All-gather phase -> 04_ring_allreduce/README.md#exercise-042-all-gather-phase
        // Pass on the finished chunk we hold newest (our own, (r+1) mod N, at step 0); the one
        // from the left lands straight in its place: nothing to add, so no tmp.
        int send_c = (r + 1 - step + N) % N;
        int recv_c = (r - step + N) % N;
        dist_sendrecv(buf + ring_chunk_start(count, N, send_c), ring_chunk_len(count, N, send_c), right,
                      buf + ring_chunk_start(count, N, recv_c), ring_chunk_len(count, N, recv_c), left,
                      DIST_F32, TAG_ALL_GATHER, g);
        // END EXERCISE 04.2
        if (pic) ring_picture_step(pic, "all-gather", step, buf, count, g);
    }
}

void ring_all_reduce(float *buf, size_t count, DistGroup *g) {
    // chunk 0 is the longest chunk
    float *tmp = mem_alloc(ring_chunk_len(count, g->size, 0) * sizeof(float), MEM_COMM, DEV_CPU);
    ring_scatter_reduce(buf, count, tmp, g, NULL);
    ring_all_gather(buf, count, g, NULL);
    mem_free(tmp);
}
