// dist_stage.c: device buffers with the MPI backend, staged through host memory (so several
// ranks can share one GPU, like gloo): the op's buffers are copied to host memory, the host
// copy goes to dist_mpi_backend, and what the op wrote is copied back to the device at the end
// (blocking: before returning; non-blocking: at dist_wait / a dist_test that says 1).
//
// The in-place forms carry over: when send and recv overlap (send == recv, send inside recv or
// recv inside send) they are staged as one host region, so the host pointers keep the same
// relation and dist_mpi.c sees the same form.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist_backend.h"
#include "mem.h"

// The bytes an op reads from send, the extent of recv it uses, and how much of recv (from its
// start) it writes on this rank.
static void extents(const DistCall *c, const DistGroup *g, size_t *s_bytes, size_t *r_bytes, size_t *out_bytes) {
    size_t es = dist_dtype_size(c->dt);
    int N = g->size, r = g->rank, root = c->peer == r;
    size_t n = c->count, mine = 0, total = 0, s = 0, rb = 0, out = 0;
    if (c->kind == OP_REDUCE_SCATTER || c->kind == OP_ALL_GATHER || c->kind == OP_GATHER) {
        mine = call_block_len(c, N, r);
        total = call_total(c, N);
    }
    switch (c->kind) {
    case OP_ALL_REDUCE: s = rb = out = n; break;
    case OP_BROADCAST: rb = n; out = root ? 0 : n; break;
    case OP_REDUCE:  // a non-root's input is in recv when in place
        s = n;
        rb = (root || c->send == NULL || c->send == c->recv) ? n : 0;
        out = root ? n : 0;
        break;
    case OP_REDUCE_SCATTER:
        s = total;
        rb = (c->send == NULL || c->send == c->recv) ? total : mine;
        out = mine;
        break;
    case OP_ALL_GATHER: s = mine; rb = out = total; break;
    case OP_GATHER: s = mine; rb = out = root ? total : 0; break;
    case OP_SCATTER: s = root ? n * (size_t)N : 0; rb = out = c->recv ? n : 0; break;
    case OP_SEND: s = n; rb = out = c->recv ? c->recvcount : 0; break;
    case OP_RECV: rb = out = n; break;
    default: break;
    }
    *s_bytes = c->send ? s * es : 0;
    *r_bytes = c->recv ? rb * es : 0;
    *out_bytes = c->recv ? out * es : 0;
}

typedef struct StageAux {
    DistWork inner;      // the MPI op on the host copy
    void *host1, *host2;  // staging buffers to free
    void *dst;           // device recv
    const void *src;     // its host copy
    size_t bytes;        // to copy back
} StageAux;

static void *host_copy(const void *dev, size_t bytes) {
    void *h = lab_xmalloc(bytes ? bytes : 1);
    if (bytes) mem_copy(h, dev, bytes);
    return h;
}

static void stage_run(const DistCall *c, DistGroup *g, DistWork *w) {
    size_t sb, rb, ob;
    extents(c, g, &sb, &rb, &ob);
    DistCall h = *c;
    void *h1 = NULL, *h2 = NULL;
    const char *s = c->send;
    char *r = c->recv;
    if (s && r && (s == r || dist_overlaps(s, sb, r, rb))) {
        // one region covering both, so the in-place form stays what it was
        const char *lo = s < r ? s : r;
        const char *hi = (s + sb > r + rb) ? s + sb : r + rb;
        h1 = host_copy(lo, (size_t)(hi - lo));
        h.send = (char *)h1 + (s - lo);
        h.recv = (char *)h1 + (r - lo);
    } else {
        if (s) h.send = h1 = host_copy(s, sb);
        if (r) h.recv = h2 = host_copy(r, rb);
    }
    if (!w) {
        dist_mpi_backend.run(&h, g, NULL);
        if (ob) mem_copy(c->recv, h.recv, ob);
        free(h1);
        free(h2);
        return;
    }
    StageAux *a = lab_xcalloc(1, sizeof(StageAux));
    a->inner = *w;
    // the MPI backend finishes (AVG) on the host copy of w->buf
    if (w->buf == c->recv) a->inner.buf = h.recv;
    else if (w->buf == c->send) a->inner.buf = (void *)h.send;
    dist_mpi_backend.run(&h, g, &a->inner);
    a->host1 = h1;
    a->host2 = h2;
    a->dst = c->recv;
    a->src = h.recv;
    a->bytes = ob;
    w->aux = a;
    w->backend = &dist_stage_backend;
}

static void stage_finish(DistWork *w) {
    StageAux *a = w->aux;
    if (a->bytes) mem_copy(a->dst, a->src, a->bytes);
    free(a->host1);
    free(a->host2);
    free(a);
    w->aux = NULL;
    w->active = 0;
}

static void stage_wait(DistWork *w) {
    StageAux *a = w->aux;
    dist_mpi_backend.wait(&a->inner);
    stage_finish(w);
}

static int stage_test(DistWork *w) {
    StageAux *a = w->aux;
    if (!dist_mpi_backend.test(&a->inner)) return 0;
    stage_finish(w);
    return 1;
}

const DistBackendOps dist_stage_backend = {"mpi (staged through host memory)", stage_run, stage_wait, stage_test};
