// collectives.c: the collectives of collectives.h from dist_send / dist_recv / dist_sendrecv.
//
// Each one is the simplest algorithm that does the job, so that the bytes it moves are easy to
// count (collectives.h lists them). Chapter 04 replaces the all-reduce by the ring, which moves
// the same bytes per rank but only ever talks to its two neighbours.
#include "collectives.h"

#include <string.h>

#include "check.h"
#include "mem.h"

// One tag per collective: every rank calls the collectives in the same order and MPI keeps the
// order of messages between two ranks, so the tags only make a mix-up easier to spot.
enum { TAG_BCAST = 101, TAG_REDUCE, TAG_SCATTER, TAG_GATHER, TAG_RS, TAG_AG };

void prim_broadcast(float *buf, size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    LAB_CHECK(root >= 0 && root < N, "prim_broadcast: root %d is not a rank of group %s (size %d)", root, g->name, N);
    // EXERCISE 01.1 Broadcast from send and recv -> 01_primitives/README.md#exercise-011-broadcast-from-send-and-recv
    if (r == root) {
        for (int j = 0; j < N; j++)
            if (j != root) dist_send(buf, count, DIST_F32, j, TAG_BCAST, g);
    } else {
        dist_recv(buf, count, DIST_F32, root, TAG_BCAST, g);
    }
    // END EXERCISE 01.1
}

void prim_reduce(const float *send, float *recv, size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    LAB_CHECK(root >= 0 && root < N, "prim_reduce: root %d is not a rank of group %s (size %d)", root, g->name, N);
    // EXERCISE 01.2 Reduce from send and recv -> 01_primitives/README.md#exercise-012-reduce-from-send-and-recv
    if (r != root) {
        dist_send(send, count, DIST_F32, root, TAG_REDUCE, g);
    } else {
        // The root starts from its own values and adds the others' one rank at a time.
        if (recv != send) memcpy(recv, send, count * sizeof(float));
        float *tmp = mem_alloc(count * sizeof(float), MEM_COMM, DEV_CPU);  // (count,)
        for (int j = 0; j < N; j++) {
            if (j == root) continue;
            dist_recv(tmp, count, DIST_F32, j, TAG_REDUCE, g);
            for (size_t i = 0; i < count; i++) recv[i] += tmp[i];
        }
        mem_free(tmp);
    }
    // END EXERCISE 01.2
}

void prim_scatter(const float *send, float *recv, size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    LAB_CHECK(root >= 0 && root < N, "prim_scatter: root %d is not a rank of group %s (size %d)", root, g->name, N);
    if (r == root) {
        for (int j = 0; j < N; j++)
            if (j != root) dist_send(send + (size_t)j * count, count, DIST_F32, j, TAG_SCATTER, g);
        // the root's own block does not travel
        memmove(recv, send + (size_t)root * count, count * sizeof(float));
    } else {
        dist_recv(recv, count, DIST_F32, root, TAG_SCATTER, g);
    }
}

void prim_gather(const float *send, float *recv, size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    LAB_CHECK(root >= 0 && root < N, "prim_gather: root %d is not a rank of group %s (size %d)", root, g->name, N);
    if (r == root) {
        memmove(recv + (size_t)root * count, send, count * sizeof(float));
        for (int j = 0; j < N; j++)
            if (j != root) dist_recv(recv + (size_t)j * count, count, DIST_F32, j, TAG_GATHER, g);
    } else {
        dist_send(send, count, DIST_F32, root, TAG_GATHER, g);
    }
}

// Pairwise exchange: in round k (1..N-1) rank r sends to r+k and receives from r-k, so every
// pair of ranks meets exactly once and no rank ever waits on a rank that waits on it.
void prim_reduce_scatter(float *buf, size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *mine = buf + prim_block_start(count, N, r);    // (len_r,) the block this rank owns
    size_t len_r = prim_block_len(count, N, r);
    float *tmp = mem_alloc(len_r * sizeof(float), MEM_COMM, DEV_CPU);  // (len_r,)
    // EXERCISE 01.3 Reduce-scatter from sendrecv -> 01_primitives/README.md#exercise-013-reduce-scatter-from-sendrecv
    for (int k = 1; k < N; k++) {
        int dst = (r + k) % N, src = (r - k + N) % N;
        // dst owns block dst: send it our values of that block; src sends us its block r
        dist_sendrecv(buf + prim_block_start(count, N, dst), prim_block_len(count, N, dst), dst,
                      tmp, len_r, src, DIST_F32, TAG_RS, g);
        for (size_t i = 0; i < len_r; i++) mine[i] += tmp[i];
    }
    // END EXERCISE 01.3
    mem_free(tmp);
}

void prim_all_gather(float *buf, size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    const float *mine = buf + prim_block_start(count, N, r);  // (len_r,)
    size_t len_r = prim_block_len(count, N, r);
    // EXERCISE 01.4 All-gather from sendrecv -> 01_primitives/README.md#exercise-014-all-gather-from-sendrecv
    for (int k = 1; k < N; k++) {
        int dst = (r + k) % N, src = (r - k + N) % N;
        // our block to dst; src's block lands where it belongs in buf
        dist_sendrecv(mine, len_r, dst, buf + prim_block_start(count, N, src), prim_block_len(count, N, src),
                      src, DIST_F32, TAG_AG, g);
    }
    // END EXERCISE 01.4
}

void prim_all_reduce(float *buf, size_t count, DistGroup *g) {
    prim_reduce_scatter(buf, count, g);  // rank r: block r = sum over ranks
    prim_all_gather(buf, count, g);      // every rank: every block
}
