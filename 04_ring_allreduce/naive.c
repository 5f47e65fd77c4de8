// naive.c: all-reduce through one root, the way a single master does it (chapter 02):
// reduce to the root, then broadcast from it. Built from dist_send / dist_recv so the counters
// show what really moves: every rank sends and receives S, the root (N-1) * S each way, and the
// root's link carries it all one message after another. That is the bottleneck the ring removes.
#include "check.h"
#include "ring.h"

enum { TAG_NAIVE_UP = 404, TAG_NAIVE_DOWN = 405 };

void naive_all_reduce(float *buf, size_t count, float *tmp, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    LAB_CHECK(root >= 0 && root < N, "naive_all_reduce: root %d is not a rank of group %s (size %d)", root,
              g->name, N);
    if (r != root) {
        dist_send(buf, count, DIST_F32, root, TAG_NAIVE_UP, g);
        dist_recv(buf, count, DIST_F32, root, TAG_NAIVE_DOWN, g);
        return;
    }
    // reduce: the others' buffers, one after the other, into ours
    for (int j = 0; j < N; j++) {
        if (j == root) continue;
        dist_recv(tmp, count, DIST_F32, j, TAG_NAIVE_UP, g);
        for (size_t i = 0; i < count; i++) buf[i] += tmp[i];
    }
    // broadcast: the sum back to everyone
    for (int j = 0; j < N; j++)
        if (j != root) dist_send(buf, count, DIST_F32, j, TAG_NAIVE_DOWN, g);
}
