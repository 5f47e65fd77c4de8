// dist.c: the public API of dist.h: lifecycle, groups, argument checks shared by every backend,
// byte counting (per process and per group), and the choice of backend for each op.
//
// Every op that communicates goes the same way (submit): refuse it while the communication
// thread has unfinished ops (dist.h: MPI is SERIALIZED), count its bytes by dist.h's model,
// describe it as one DistCall, then either queue it on the communication thread
// (dist_thread.c) or hand it to one backend (dist_backend.h):
//   host buffers                       dist_mpi_backend    (dist_mpi.c)
//   device buffers, backend MPI        dist_stage_backend  (dist_stage.c: through host memory)
//   device buffers, backend NCCL       dist_nccl_backend   (dist_nccl.c: one GPU per rank)
// A non-blocking op's DistWork remembers its backend, which finishes it at dist_wait.
//
// In place. `send == recv` or `send == NULL` means the data is already in `recv`:
//   all_reduce, reduce    the input is in recv and the result replaces it.
//   reduce_scatter(_n)    recv holds the whole input; block r of the result lands at the start
//                         of recv. NCCL's form is accepted too: recv == send + (start of block
//                         r) puts the result where block r was.
//   all_gather(_n)        send == NULL or send == recv + (start of block r) (NCCL's form): this
//                         rank's block is already in place. send == recv: it is at the start.
//   scatter (root)        recv == NULL or recv == send + root * count: root keeps its block
//                         in place; recv == send: root's block is moved to the start.
//   gather(_n) (root)     send == NULL or send == recv + (start of block root): already in
//                         place; send == recv: root's block is at the start of recv.
// Any other overlap of send and recv is a bug in the caller and fails with file:line.
// (The start of block r is r * count for the even ops, counts[0] + ... + counts[r-1] for the v-ops,
// shard_begin(n, N, r) for the _n ones, which are the v-ops with shard_range counts.)
#include "dist.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist_backend.h"
#include "dist_nccl.h"
#include "mem.h"
#include "shard.h"
#include "watchdog.h"

static DistGroup world;
static int world_ready = 0;
static DistBackend backend = DIST_BACKEND_MPI;
static DistCounters counters;

static void need_init(void) {
    if (!world_ready) lab_fail_at(__FILE__, __LINE__, "dist_init() must be called before any dist_* call");
}

// While the communication thread has unfinished ops, this thread makes no MPI call.
static void need_no_queued_ops(const char *what) {
    int q = dist_thread_pending();
    if (q > 0)
        lab_fail("dist %s: %d op%s queued on the communication thread %s not finished: "
                 "dist_wait for %s first (MPI runs at thread level SERIALIZED, one thread at a time)",
                 what, q, q > 1 ? "s" : "", q > 1 ? "are" : "is", q > 1 ? "them" : "it");
}

// ---------------------------------------------------------------------------------------------
// lifecycle and groups

// What the watchdog knows a group by (watchdog.h): its sequence numbers from 0, and an identity
// every rank of the group computes alike (FNV-1a of its name and its world ranks).
static void number_group(DistGroup *g) {
    g->seq = 0;
    g->p2p_seq = lab_xcalloc(2 * (size_t)g->size, sizeof(uint64_t));
    uint64_t h = 1469598103934665603ULL;
    for (const char *c = g->name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ULL;
    for (int p = 0; p < g->size; p++) h = (h ^ (uint32_t)g->world_ranks[p]) * 1099511628211ULL;
    g->gid = h;
    watchdog_group_add(g);
}

static void unnumber_group(DistGroup *g) {
    watchdog_group_remove(g);
    free(g->p2p_seq);
    free(g->world_ranks);
    g->p2p_seq = NULL;
    g->world_ranks = NULL;
}

void dist_init(int *argc, char ***argv) {
    dist_mpi_init(argc, argv, &world);
    world.name = "world";
    world.nccl = NULL;
    world.thread = NULL;
    number_group(&world);
    world_ready = 1;
    lab_log_rank = world.rank;
    lab_log_world = world.size;
    dist_counters_reset();
    dist_group_counters_reset(&world);
}

void dist_finalize(void) {
    if (!world_ready) return;
    need_no_queued_ops("finalize");
    dist_comm_thread_stop(&world);  // (other groups detach in dist_group_free)
    dist_thread_stop_all();
    watchdog_stop();       // no op is left to wait in
    dist_nccl_finalize();  // the NCCL communicators, if any
    unnumber_group(&world);
    world_ready = 0;
    dist_mpi_finalize();
}

int dist_rank(void) { need_init(); return world.rank; }
int dist_size(void) { need_init(); return world.size; }
DistGroup *dist_world(void) { need_init(); return &world; }

DistGroup *dist_split(DistGroup *parent, int color, int key, const char *name) {
    need_init();
    LAB_CHECK(color >= 0, "dist_split(%s): color must be >= 0, got %d", name, color);
    need_no_queued_ops("split");
    DistGroup *g = lab_xcalloc(1, sizeof(DistGroup));
    dist_mpi_split(parent, color, key, g);
    size_t n = strlen(name ? name : "group") + 1;
    char *copy = lab_xmalloc(n);
    memcpy(copy, name ? name : "group", n);
    g->name = copy;
    number_group(g);
    if (backend == DIST_BACKEND_NCCL) dist_nccl_group_init(g);  // collective over g, like the split
    return g;
}

void dist_group_free(DistGroup *g) {
    if (!g) return;
    need_no_queued_ops("group_free");
    dist_comm_thread_stop(g);
    if (g == &world) return;
    dist_nccl_group_free(g);
    unnumber_group(g);
    dist_mpi_group_free(g);
    free((void *)g->name);
    free(g);
}

void dist_set_backend(DistBackend b) {
    if (b == DIST_BACKEND_NCCL) {
        need_init();
        // This rank's GPU, the comm stream, the world's communicator (in a build without CUDA:
        // fails, saying how to rebuild).
        dist_nccl_start(&world);
    }
    backend = b;
}

size_t dist_dtype_size(DistDtype dt) {
    switch (dt) {
    case DIST_F32: return 4;
    case DIST_BF16: return 2;
    case DIST_F64: return 8;
    case DIST_I32: return 4;
    case DIST_U8: return 1;
    default: lab_fail_at(__FILE__, __LINE__, "bad DistDtype %d", (int)dt);
    }
}

const char *dist_op_kind_name(DistOpKind k) {
    static const char *names[OP_NKINDS] = {
        "broadcast", "all_reduce", "reduce", "reduce_scatter", "all_gather",
        "scatter",   "gather",     "send",   "recv",   "barrier",
    };
    if ((int)k < 0 || k >= OP_NKINDS) return "?";
    return names[k];
}

// ---------------------------------------------------------------------------------------------
// counting (dist.h's model)

static void count_bytes(DistGroup *g, DistOpKind k, uint64_t sent, uint64_t recv) {
    counters.calls[k] += 1;
    counters.sent[k] += sent;
    counters.recv[k] += recv;
    g->counters.calls[k] += 1;
    g->counters.sent[k] += sent;
    g->counters.recv[k] += recv;
}

static void count_call(const DistCall *c, DistGroup *g) {
    uint64_t e = dist_dtype_size(c->dt), N = (uint64_t)g->size, S = (uint64_t)c->count * e;
    int r = g->rank, n = g->size, root = c->peer == r;
    switch (c->kind) {
    case OP_ALL_REDUCE: count_bytes(g, c->kind, 2 * (N - 1) * S / N, 2 * (N - 1) * S / N); break;
    case OP_BROADCAST: count_bytes(g, c->kind, root ? (N > 1 ? S : 0) : 0, root ? 0 : S); break;  // a group of one moves nothing
    case OP_REDUCE: count_bytes(g, c->kind, root ? 0 : S, root ? (N - 1) * S : 0); break;
    case OP_REDUCE_SCATTER: {
        // ring: every block but its own goes out, every block but the left neighbour's comes in
        uint64_t total = call_total(c, n);
        count_bytes(g, c->kind, (total - call_block_len(c, n, r)) * e,
                    (total - call_block_len(c, n, (r - 1 + n) % n)) * e);
    } break;
    case OP_ALL_GATHER: {
        // ring: every block but the right neighbour's goes out, every block but its own comes in
        uint64_t total = call_total(c, n);
        count_bytes(g, c->kind, (total - call_block_len(c, n, (r + 1) % n)) * e,
                    (total - call_block_len(c, n, r)) * e);
    } break;
    case OP_GATHER: {
        uint64_t total = call_total(c, n);
        if (root) count_bytes(g, c->kind, 0, (total - call_block_len(c, n, r)) * e);
        else count_bytes(g, c->kind, call_block_len(c, n, r) * e, 0);
    } break;
    case OP_SCATTER: count_bytes(g, c->kind, root ? (N - 1) * S : 0, root ? 0 : S); break;
    case OP_SEND:
        count_bytes(g, OP_SEND, S, 0);
        if (c->recv) count_bytes(g, OP_RECV, 0, (uint64_t)c->recvcount * e);  // dist_sendrecv
        break;
    case OP_RECV: count_bytes(g, c->kind, 0, S); break;
    case OP_BARRIER: count_bytes(g, c->kind, 0, 0); break;
    default: break;
    }
}

const DistCounters *dist_counters(void) { return &counters; }
void dist_counters_reset(void) { memset(&counters, 0, sizeof counters); }
const DistCounters *dist_group_counters(const DistGroup *g) { return &g->counters; }
void dist_group_counters_reset(DistGroup *g) { memset(&g->counters, 0, sizeof g->counters); }

static uint64_t sum(const uint64_t *x) {
    uint64_t s = 0;
    for (int k = 0; k < OP_NKINDS; k++) s += x[k];
    return s;
}

uint64_t dist_bytes_sent(void) { return sum(counters.sent); }
uint64_t dist_bytes_recv(void) { return sum(counters.recv); }
uint64_t dist_group_bytes_sent(const DistGroup *g) { return sum(g->counters.sent); }

void dist_counters_add_since(DistCounters *into, const DistCounters *before) {
    for (int k = 0; k < OP_NKINDS; k++) {
        into->calls[k] += counters.calls[k] - before->calls[k];
        into->sent[k] += counters.sent[k] - before->sent[k];
        into->recv[k] += counters.recv[k] - before->recv[k];
    }
}

DistPerStep dist_counters_per_step(const DistCounters *minus, double steps) {
    DistPerStep p = {0};
    for (int k = 0; k < OP_NKINDS; k++) {
        p.calls[k] = ((double)counters.calls[k] - (double)minus->calls[k]) / steps;
        p.sent[k] = ((double)counters.sent[k] - (double)minus->sent[k]) / steps;
        p.recv[k] = ((double)counters.recv[k] - (double)minus->recv[k]) / steps;
        p.sent_all += p.sent[k];
        p.recv_all += p.recv[k];
    }
    return p;
}

// ---------------------------------------------------------------------------------------------
// one path for every op

static int on_device(const void *p) { return p != NULL && mem_device_of(p) == DEV_CUDA; }

static const DistBackendOps *backend_for(const DistCall *c) {
    if (!on_device(c->send) && !on_device(c->recv)) return &dist_mpi_backend;  // host buffers: MPI, whatever the backend
    return backend == DIST_BACKEND_NCCL ? &dist_nccl_backend : &dist_stage_backend;
}

// The DistWork of a non-blocking op: what the finish needs for AVG (the result block).
static DistWork work_new(const DistCall *c, DistGroup *g) {
    DistWork w;
    memset(&w, 0, sizeof w);
    w.req = MPI_REQUEST_NULL;
    w.buf = c->kind == OP_SEND ? (void *)c->send : c->recv;
    w.count = c->count;
    if (c->kind == OP_REDUCE_SCATTER) w.count = call_block_len(c, g->size, g->rank);
    if (c->kind == OP_ALL_GATHER) w.count = call_total(c, g->size);
    w.dtype = c->dt;
    w.op = c->op;
    w.group_size = g->size;
    w.active = 1;
    return w;
}

static void need_peer(int peer, const DistCall *c, const DistGroup *g) {
    if (peer < 0 || peer >= g->size)
        lab_fail_at(__FILE__, __LINE__, "dist %s on group %s: peer %d is not a rank of the group (0 .. %d)",
                    dist_op_kind_name(c->kind), g->name, peer, g->size - 1);
}

// The op's sequence number(s) (dist.h, DistGroup.seq), and its record in the flight recorder
// when the watchdog is on (the ticket; 0: off).
static uint64_t number_call(const DistCall *c, DistGroup *g, int nonblocking) {
    int kind = c->kind, peer = -1, peer2 = -1;
    uint64_t seq, seq2 = 0;
    if (c->kind == OP_SEND || c->kind == OP_RECV) {
        need_peer(peer = c->peer, c, g);
        seq = ++g->p2p_seq[2 * (size_t)peer + (c->kind == OP_RECV)];
        if (c->kind == OP_SEND && c->recv) {  // dist_sendrecv: a send to peer, a receive from src
            need_peer(peer2 = c->src, c, g);
            seq2 = ++g->p2p_seq[2 * (size_t)peer2 + 1];
            kind = WD_SENDRECV;
        }
    } else {
        seq = ++g->seq;
    }
    if (!watchdog_on) return 0;
    return watchdog_op_begin(g, kind, peer, seq, peer2, seq2, (uint64_t)c->count * dist_dtype_size(c->dt),
                             nonblocking);
}

// Runs c on g: blocking (nonblocking = 0) or started (the returned DistWork).
static DistWork submit(DistCall c, DistGroup *g, int nonblocking) {
    need_init();
    LAB_CHECK((int)c.dt >= 0 && c.dt < DIST_NDTYPES, "dist %s: bad DistDtype %d", dist_op_kind_name(c.kind), (int)c.dt);
    LAB_CHECK(c.op == DIST_SUM || c.op == DIST_AVG || c.op == DIST_MAX, "dist %s: bad DistOp %d",
              dist_op_kind_name(c.kind), (int)c.op);
    // Non-blocking collectives on host buffers of an attached group go to the thread.
    int queue = nonblocking && g->thread && c.kind != OP_SEND && c.kind != OP_RECV && backend_for(&c) == &dist_mpi_backend;
    if (!queue) need_no_queued_ops(dist_op_kind_name(c.kind));
    count_call(&c, g);
    c.wd = number_call(&c, g, nonblocking);
    if (!nonblocking) {
        dist_link_hold_before(&c, g);   // virtual links (dist_link.c): nothing when off
        backend_for(&c)->run(&c, g, NULL);
        dist_link_hold_after(&c, g);
        if (c.wd) watchdog_op_end(c.wd, WD_CALLER);
        return (DistWork){.req = MPI_REQUEST_NULL};
    }
    DistWork w = work_new(&c, g);
    w.wd = c.wd;
    if (queue) {
        // what MPI would refuse, refused here (on the caller's thread, with the caller's names)
        dist_mpi_count(c.kind == OP_ALL_REDUCE || c.kind == OP_BROADCAST ? c.count : call_total(&c, g->size),
                       dist_op_kind_name(c.kind));
        if (c.wd) watchdog_op_queued(c.wd);
        dist_thread_queue(&c, g, &w);
        return w;
    }
    dist_link_hold_before(&c, g);
    w.link_s = dist_link_call_seconds(&c, g);   // held when it finishes (dist_wait, dist_test)
    backend_for(&c)->run(&c, g, &w);
    return w;
}

static DistCall call(DistOpKind k, const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int peer,
                     int tag) {
    return (DistCall){.kind = k, .send = send, .recv = recv, .count = count, .dt = dt, .op = op, .peer = peer,
                      .tag = tag};
}

// ---------------------------------------------------------------------------------------------
// the ops

void dist_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g) {
    submit(call(OP_BROADCAST, NULL, buf, count, dt, DIST_SUM, root, 0), g, 0);
}
void dist_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g) {
    submit(call(OP_ALL_REDUCE, send, recv, count, dt, op, 0, 0), g, 0);
}
void dist_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int root, DistGroup *g) {
    submit(call(OP_REDUCE, send, recv, count, dt, op, root, 0), g, 0);
}
void dist_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op, DistGroup *g) {
    submit(call(OP_REDUCE_SCATTER, send, recv, recvcount, dt, op, 0, 0), g, 0);
}
void dist_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g) {
    submit(call(OP_ALL_GATHER, send, recv, sendcount, dt, DIST_SUM, 0, 0), g, 0);
}
void dist_scatter(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    submit(call(OP_SCATTER, send, recv, count, dt, DIST_SUM, root, 0), g, 0);
}
void dist_gather(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    submit(call(OP_GATHER, send, recv, count, dt, DIST_SUM, root, 0), g, 0);
}
void dist_send(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    submit(call(OP_SEND, buf, NULL, count, dt, DIST_SUM, peer, tag), g, 0);
}
void dist_recv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    submit(call(OP_RECV, NULL, buf, count, dt, DIST_SUM, peer, tag), g, 0);
}
void dist_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount, int src,
                   DistDtype dt, int tag, DistGroup *g) {
    size_t es = dist_dtype_size(dt);
    LAB_CHECK(!dist_overlaps(sendbuf, sendcount * es, recvbuf, recvcount * es), "dist_sendrecv: buffers overlap");
    LAB_CHECK(recvbuf != NULL || recvcount == 0, "dist_sendrecv: recvbuf is NULL");
    DistCall c = call(OP_SEND, sendbuf, recvbuf, sendcount, dt, DIST_SUM, dst, tag);
    c.recvcount = recvcount;
    c.src = src;
    static char nothing;  // an empty receive still needs a non-NULL recv: that is what marks a sendrecv
    if (c.recv == NULL) c.recv = &nothing;
    submit(c, g, 0);
}
void dist_barrier(DistGroup *g) { submit(call(OP_BARRIER, NULL, NULL, 0, DIST_U8, DIST_SUM, 0, 0), g, 0); }

// The v-ops: block p has counts[p] elements, contiguous in rank order (c.count = their sum).
static DistWork submit_v(DistOpKind k, const void *send, void *recv, const size_t *counts, DistDtype dt,
                         DistOp op, int root, DistGroup *g, int nonblocking) {
    need_init();
    LAB_CHECK(counts != NULL, "dist %s_v: counts is NULL (one count per rank of group %s)", dist_op_kind_name(k),
              g->name);
    size_t n = 0;
    for (int p = 0; p < g->size; p++) n += counts[p];
    DistCall c = call(k, send, recv, n, dt, op, root, 0);
    c.counts = counts;
    return submit(c, g, nonblocking);
}

// The _n ops ARE the v-ops, with counts[p] = shard_count(n, N, p).
static DistWork submit_n(DistOpKind k, const void *send, void *recv, size_t n, DistDtype dt, DistOp op, int root,
                         DistGroup *g, int nonblocking) {
    need_init();
    size_t *counts = lab_xmalloc((size_t)g->size * sizeof(size_t));
    for (int p = 0; p < g->size; p++) counts[p] = shard_count(n, g->size, p);
    DistWork w = submit_v(k, send, recv, counts, dt, op, root, g, nonblocking);
    free(counts);  // read while the op started (dist_backend.h)
    return w;
}

void dist_reduce_scatter_n(const void *send, void *recv, size_t n, DistDtype dt, DistOp op, DistGroup *g) {
    submit_n(OP_REDUCE_SCATTER, send, recv, n, dt, op, 0, g, 0);
}
void dist_all_gather_n(const void *send, void *recv, size_t n, DistDtype dt, DistGroup *g) {
    submit_n(OP_ALL_GATHER, send, recv, n, dt, DIST_SUM, 0, g, 0);
}
void dist_gather_n(const void *send, void *recv, size_t n, DistDtype dt, int root, DistGroup *g) {
    submit_n(OP_GATHER, send, recv, n, dt, DIST_SUM, root, g, 0);
}
void dist_reduce_scatter_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistOp op,
                           DistGroup *g) {
    submit_v(OP_REDUCE_SCATTER, send, recv, counts, dt, op, 0, g, 0);
}
void dist_all_gather_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistGroup *g) {
    submit_v(OP_ALL_GATHER, send, recv, counts, dt, DIST_SUM, 0, g, 0);
}

DistWork dist_iall_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g) {
    return submit(call(OP_ALL_REDUCE, send, recv, count, dt, op, 0, 0), g, 1);
}
DistWork dist_ibroadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g) {
    return submit(call(OP_BROADCAST, NULL, buf, count, dt, DIST_SUM, root, 0), g, 1);
}
DistWork dist_ireduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op,
                              DistGroup *g) {
    return submit(call(OP_REDUCE_SCATTER, send, recv, recvcount, dt, op, 0, 0), g, 1);
}
DistWork dist_iall_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g) {
    return submit(call(OP_ALL_GATHER, send, recv, sendcount, dt, DIST_SUM, 0, 0), g, 1);
}
DistWork dist_ireduce_scatter_n(const void *send, void *recv, size_t n, DistDtype dt, DistOp op, DistGroup *g) {
    return submit_n(OP_REDUCE_SCATTER, send, recv, n, dt, op, 0, g, 1);
}
DistWork dist_iall_gather_n(const void *send, void *recv, size_t n, DistDtype dt, DistGroup *g) {
    return submit_n(OP_ALL_GATHER, send, recv, n, dt, DIST_SUM, 0, g, 1);
}
DistWork dist_ireduce_scatter_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistOp op,
                                DistGroup *g) {
    return submit_v(OP_REDUCE_SCATTER, send, recv, counts, dt, op, 0, g, 1);
}
DistWork dist_iall_gather_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistGroup *g) {
    return submit_v(OP_ALL_GATHER, send, recv, counts, dt, DIST_SUM, 0, g, 1);
}
DistWork dist_isend(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    return submit(call(OP_SEND, buf, NULL, count, dt, DIST_SUM, peer, tag), g, 1);
}
DistWork dist_irecv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    return submit(call(OP_RECV, NULL, buf, count, dt, DIST_SUM, peer, tag), g, 1);
}

// ---------------------------------------------------------------------------------------------
// completion

// The caller's thread waits in a non-blocking op from dist_wait's start to its end: the time
// the watchdog looks at (a started op nobody waits for yet is not late: MPI may progress it
// only inside the wait).
void dist_wait(DistWork *w) {
    if (!w->active) return;
    if (w->wd) watchdog_wait_begin(w->wd, WD_CALLER);
    if (w->task) {  // queued on the communication thread: sleep until it has run it
        dist_thread_finish(w, 1);  // (whoever ran it recorded its end)
        if (w->wd) watchdog_wait_end(WD_CALLER);
        w->wd = 0;
        return;
    }
    need_no_queued_ops("wait");
    LAB_CHECK(w->backend != NULL, "dist_wait: an active DistWork that no op started");
    ((const DistBackendOps *)w->backend)->wait(w);
    dist_link_sleep(w->link_s);
    w->link_s = 0;
    if (w->wd) watchdog_op_end(w->wd, WD_CALLER);
    w->wd = 0;
}

int dist_test(DistWork *w) {
    if (!w->active) return 1;
    if (w->task) return dist_thread_finish(w, 0);
    need_no_queued_ops("test");
    LAB_CHECK(w->backend != NULL, "dist_test: an active DistWork that no op started");
    int done = ((const DistBackendOps *)w->backend)->test(w);
    if (done) dist_link_sleep(w->link_s), w->link_s = 0;
    if (done && w->wd) watchdog_op_end(w->wd, -1);
    if (done) w->wd = 0;
    return done;
}

void dist_wait_all(DistWork *w, int n) {
    for (int i = 0; i < n; i++) dist_wait(&w[i]);
}
