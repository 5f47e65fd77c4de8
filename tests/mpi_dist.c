// mpi_dist.c: checks every dist.h operation against a plain local reference.
//
// Launched by tests/test_dist.c as `mpirun -np N build/tests/mpi_dist`. Each rank's input is a
// pure function of (world rank, index, salt), so every rank can compute what any op must
// return without communicating. Inputs are small integers (-8..8): sums of up to a few dozen of
// them are exact in fp32 and bf16 whatever the reduction order, so results are compared
// bit for bit. Every op runs on the world and on a split group (ranks by parity, in reverse
// order), for counts 0, 1, N-1, 7N+3 and 1<<20, and the byte counters are compared with the
// formulas of dist.h after every call.
//
// Extra modes (for the failure tests): --fail-rank R (rank R fails while the others wait in a
// barrier: the job must end, not hang), --fail-collective and --exercise-todo (every rank
// fails the same way: one message), --overflow (a count over INT_MAX must be refused),
// --trace FILE (two spans per rank, merged into one Chrome trace), --results K --dump FILE
// (a results file like a chapter's, for the harness tests), --device cuda (every op on device
// buffers: the CUDA build's staging through host memory).
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dist.h"
#include "mem.h"
#include "mpitest.h"
#include "results.h"
#include "trace.h"

static int nchecks = 0, nfailed = 0;
static int wrank = 0;
static int salt = 0;  // changes every call, so a stale buffer never passes for a result

static void check(int ok, const char *fmt, ...) LAB_PRINTF(2, 3);
static void check(int ok, const char *fmt, ...) {
    nchecks++;
    if (ok) return;
    nfailed++;
    if (nfailed > 30) return;  // enough to see the pattern
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d] FAIL: %s\n", wrank, msg);
}

// ---------------------------------------------------------------------------------------------
// values

static const char *dt_name[] = {"f32", "bf16", "f64", "i32", "u8"};
static const char *op_name[] = {"sum", "avg", "max"};

// bf16 written here independently of the library: round to nearest, ties to even.
static uint16_t ref_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double input(int world_rank, size_t i, int s) {
    return (double)((int)(((size_t)world_rank * 37 + i * 11 + (size_t)s * 5) % 17) - 8);
}

static size_t esize(DistDtype dt) {
    static const size_t sz[] = {4, 2, 8, 4, 1};
    return sz[dt];
}

// Stores v (an exact small integer, or any value for f32/f64) as element i of buf.
static void put(void *buf, DistDtype dt, size_t i, double v) {
    switch (dt) {
    case DIST_F32: ((float *)buf)[i] = (float)v; break;
    case DIST_BF16: ((uint16_t *)buf)[i] = ref_bf16((float)v); break;
    case DIST_F64: ((double *)buf)[i] = v; break;
    case DIST_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DIST_U8: ((uint8_t *)buf)[i] = (uint8_t)(v + 8); break;
    default: break;
    }
}

// Element i of the input of world rank r.
static void fill(void *buf, DistDtype dt, size_t n, int r, size_t offset) {
    for (size_t i = 0; i < n; i++) put(buf, dt, i, input(r, offset + i, salt));
}

// The reduced element: op over the inputs of the group's members at index i, stored as dt.
static void put_reduced(void *ref, size_t at, DistDtype dt, DistOp op, const int *members, int N, size_t i) {
    double acc = input(members[0], i, salt);
    for (int m = 1; m < N; m++) {
        double v = input(members[m], i, salt);
        acc = op == DIST_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op != DIST_AVG) {
        put(ref, dt, at, acc);
        return;
    }
    // AVG = the sum, divided in the dtype's own arithmetic (dist.h: sum then divide)
    switch (dt) {
    case DIST_F32: ((float *)ref)[at] = (float)acc / (float)N; break;
    case DIST_BF16: ((uint16_t *)ref)[at] = ref_bf16((float)acc / (float)N); break;
    case DIST_F64: ((double *)ref)[at] = acc / N; break;
    case DIST_I32: ((int32_t *)ref)[at] = (int32_t)acc / N; break;
    default: break;
    }
}

static void *xbuf(size_t bytes) {
    void *p = lab_xmalloc(bytes + 16);
    memset(p, 0x5a, bytes + 16);  // garbage that is no valid result
    return p;
}

// --device: the ops run on device twins of the buffers (mpi_mirror, mpitest.h).

// Element-wise bit comparison; reports the first mismatch.
static void compare(const void *got, const void *want, DistDtype dt, size_t n, const char *label) {
    size_t es = esize(dt);
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
            double g = 0, w = 0;
            if (dt == DIST_F32) { g = ((const float *)got)[i]; w = ((const float *)want)[i]; }
            if (dt == DIST_F64) { g = ((const double *)got)[i]; w = ((const double *)want)[i]; }
            if (dt == DIST_I32) { g = ((const int32_t *)got)[i]; w = ((const int32_t *)want)[i]; }
            if (dt == DIST_BF16) { g = bf16_value(((const uint16_t *)got)[i]); w = bf16_value(((const uint16_t *)want)[i]); }
            if (dt == DIST_U8) { g = ((const uint8_t *)got)[i]; w = ((const uint8_t *)want)[i]; }
            check(0, "%s: element %zu of %zu is %g, expected %g", label, i, n, g, w);
            return;
        }
    }
    check(1, "%s", label);
}

// After one op: exactly one call of kind k, and exactly these bytes, nothing else counted.
static void check_counters(DistOpKind k, uint64_t sent, uint64_t recv, const char *label) {
    const DistCounters *c = dist_counters();
    int others = 0;
    for (int j = 0; j < OP_NKINDS; j++)
        if (j != (int)k && c->calls[j] != 0) others++;
    check(c->calls[k] == 1 && others == 0, "%s: counters: %llu %s calls and %d other kinds, expected 1 and 0",
          label, (unsigned long long)c->calls[k], dist_op_kind_name(k), others);
    check(c->sent[k] == sent && dist_bytes_sent() == sent, "%s: counted %llu bytes sent (total %llu), expected %llu",
          label, (unsigned long long)c->sent[k], (unsigned long long)dist_bytes_sent(), (unsigned long long)sent);
    check(c->recv[k] == recv && dist_bytes_recv() == recv,
          "%s: counted %llu bytes received (total %llu), expected %llu", label, (unsigned long long)c->recv[k],
          (unsigned long long)dist_bytes_recv(), (unsigned long long)recv);
}

// ---------------------------------------------------------------------------------------------
// the cases

typedef struct Group {
    DistGroup *g;
    const int *members;  // world rank of each group rank
    int N, r;
} Group;

#define LARGE (1u << 20)
#define NCOUNTS 5

// 0, 1, N-1 (fewer than the group), 7N+3 (not divisible), large. `block`: for ops whose buffer
// is N blocks, the large case is split so the whole buffer stays about LARGE.
static void counts_for(int N, int block, size_t out[NCOUNTS]) {
    out[0] = 0;
    out[1] = 1;
    out[2] = (size_t)N - 1;
    out[3] = 7 * (size_t)N + 3;
    out[4] = block ? LARGE / (size_t)N + 1 : LARGE;
}

// The large count runs only in the plain form, for f32 and bf16, and on the world (MPI's
// protocol for large messages depends neither on the group nor on the type), to keep the
// test quick on two cores.
static int on_world = 1;
static int skip_large(int ci, int mode, DistOp op, DistDtype dt) {
    return ci == NCOUNTS - 1 && (mode != 0 || op != DIST_SUM || !on_world || (dt != DIST_F32 && dt != DIST_BF16));
}

static const DistDtype reduce_dts[] = {DIST_F32, DIST_BF16, DIST_F64, DIST_I32};
static const DistDtype all_dts[] = {DIST_F32, DIST_BF16, DIST_F64, DIST_I32, DIST_U8};

static void test_all_reduce(const Group *G, int nonblocking) {
    static const char *modes[] = {"separate", "send==recv", "send==NULL"};
    uint64_t N = (uint64_t)G->N;
    size_t counts[NCOUNTS];
    counts_for(G->N, 0, counts);
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < 3; op++)
            for (int mode = 0; mode < 3; mode++)
                for (int ci = 0; ci < NCOUNTS; ci++) {
                    DistDtype dt = reduce_dts[d];
                    if (skip_large(ci, mode, (DistOp)op, dt)) continue;
                    size_t n = counts[ci], es = esize(dt);
                    salt++;
                    char label[200];
                    snprintf(label, sizeof label, "%sall_reduce %s %s %s n=%zu group=%s", nonblocking ? "i" : "",
                             dt_name[dt], op_name[op], modes[mode], n, G->g->name);
                    void *send = xbuf(n * es), *recv = xbuf(n * es), *ref = xbuf(n * es);
                    fill(send, dt, n, wrank, 0);
                    for (size_t i = 0; i < n; i++) put_reduced(ref, i, dt, (DistOp)op, G->members, G->N, i);
                    const void *s = send;
                    if (mode > 0) {
                        memcpy(recv, send, n * es);
                        s = mode == 1 ? recv : NULL;
                    }
                    mpi_mirror(send, n * es + 16);
                    mpi_mirror(recv, n * es + 16);
                    dist_counters_reset();
                    if (nonblocking) {
                        DistWork w = dist_iall_reduce(mpi_dev(s), mpi_dev(recv), n, dt, (DistOp)op, G->g);
                        dist_wait(&w);
                    } else {
                        dist_all_reduce(mpi_dev(s), mpi_dev(recv), n, dt, (DistOp)op, G->g);
                    }
                    mpi_unmirror();
                    compare(recv, ref, dt, n, label);
                    uint64_t S = n * es;
                    check_counters(OP_ALL_REDUCE, 2 * (N - 1) * S / N, 2 * (N - 1) * S / N, label);
                    free(send);
                    free(recv);
                    free(ref);
                }
}

static void test_broadcast(const Group *G, int nonblocking) {
    size_t counts[NCOUNTS];
    counts_for(G->N, 0, counts);
    int roots[2] = {0, G->N - 1};
    for (int ri = 0; ri < 2; ri++)
        for (int d = 0; d < 5; d++)
            for (int ci = 0; ci < NCOUNTS; ci++) {
                int root = roots[ri];
                DistDtype dt = all_dts[d];
                size_t n = counts[ci], es = esize(dt);
                if (skip_large(ci, 0, DIST_SUM, dt) || (ci == NCOUNTS - 1 && ri == 1)) continue;
                salt++;
                char label[200];
                snprintf(label, sizeof label, "%sbroadcast %s root=%d n=%zu group=%s", nonblocking ? "i" : "",
                         dt_name[dt], root, n, G->g->name);
                void *buf = xbuf(n * es), *ref = xbuf(n * es);
                fill(ref, dt, n, G->members[root], 0);
                if (G->r == root) fill(buf, dt, n, wrank, 0);
                mpi_mirror(buf, n * es + 16);
                dist_counters_reset();
                if (nonblocking) {
                    DistWork w = dist_ibroadcast(mpi_dev(buf), n, dt, root, G->g);
                    dist_wait(&w);
                } else {
                    dist_broadcast(mpi_dev(buf), n, dt, root, G->g);
                }
                mpi_unmirror();
                compare(buf, ref, dt, n, label);
                uint64_t S = n * es;
                // the root sends S (nothing in a group of one), every other rank receives S
                if (G->r == root) check_counters(OP_BROADCAST, G->N > 1 ? S : 0, 0, label);
                else check_counters(OP_BROADCAST, 0, S, label);
                free(buf);
                free(ref);
            }
}

static void test_reduce(const Group *G) {
    static const char *modes[] = {"separate", "send==recv", "send==NULL"};
    size_t counts[NCOUNTS];
    counts_for(G->N, 0, counts);
    int roots[2] = {0, G->N - 1};
    for (int ri = 0; ri < 2; ri++)
        for (int d = 0; d < 4; d++)
            for (int op = 0; op < 3; op++)
                for (int mode = 0; mode < 3; mode++)
                    for (int ci = 0; ci < NCOUNTS; ci++) {
                        int root = roots[ri];
                        DistDtype dt = reduce_dts[d];
                        if (skip_large(ci, mode, (DistOp)op, dt) || (ci == NCOUNTS - 1 && ri == 1)) continue;
                        size_t n = counts[ci], es = esize(dt);
                        salt++;
                        char label[200];
                        snprintf(label, sizeof label, "reduce %s %s %s root=%d n=%zu group=%s", dt_name[dt],
                                 op_name[op], modes[mode], root, n, G->g->name);
                        void *send = xbuf(n * es), *recv = xbuf(n * es), *ref = xbuf(n * es);
                        fill(send, dt, n, wrank, 0);
                        for (size_t i = 0; i < n; i++) put_reduced(ref, i, dt, (DistOp)op, G->members, G->N, i);
                        const void *s = send;
                        void *r = recv;
                        if (mode > 0) {
                            memcpy(recv, send, n * es);
                            s = mode == 1 ? recv : NULL;
                        } else if (G->r != root) {
                            r = NULL;  // non-roots need no receive buffer
                        }
                        mpi_mirror(send, n * es + 16);
                        mpi_mirror(recv, n * es + 16);
                        dist_counters_reset();
                        dist_reduce(mpi_dev(s), mpi_dev(r), n, dt, (DistOp)op, root, G->g);
                        mpi_unmirror();
                        uint64_t S = n * es;
                        if (G->r == root) {
                            compare(recv, ref, dt, n, label);
                            check_counters(OP_REDUCE, 0, (uint64_t)(G->N - 1) * S, label);
                        } else {
                            check_counters(OP_REDUCE, S, 0, label);
                        }
                        free(send);
                        free(recv);
                        free(ref);
                    }
}

static void test_reduce_scatter(const Group *G, int nonblocking) {
    static const char *modes[] = {"separate", "send==recv", "send==NULL", "recv==send+r*n"};
    uint64_t N = (uint64_t)G->N;
    size_t counts[NCOUNTS];
    counts_for(G->N, 1, counts);
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < 3; op++)
            for (int mode = 0; mode < 4; mode++)
                for (int ci = 0; ci < NCOUNTS; ci++) {
                    DistDtype dt = reduce_dts[d];
                    if (skip_large(ci, mode, (DistOp)op, dt)) continue;
                    size_t n = counts[ci], es = esize(dt), whole = n * (size_t)G->N;
                    salt++;
                    char label[200];
                    snprintf(label, sizeof label, "%sreduce_scatter %s %s %s n=%zu group=%s",
                             nonblocking ? "i" : "", dt_name[dt], op_name[op], modes[mode], n, G->g->name);
                    void *send = xbuf(whole * es), *recv = xbuf(n * es), *ref = xbuf(n * es);
                    fill(send, dt, whole, wrank, 0);
                    for (size_t i = 0; i < n; i++)
                        put_reduced(ref, i, dt, (DistOp)op, G->members, G->N, (size_t)G->r * n + i);
                    const void *s = send;
                    void *r = recv, *result = recv;
                    if (mode == 1) { s = send; r = send; result = send; }
                    if (mode == 2) { s = NULL; r = send; result = send; }
                    if (mode == 3) { r = (char *)send + (size_t)G->r * n * es; result = r; }
                    mpi_mirror(send, whole * es + 16);
                    mpi_mirror(recv, n * es + 16);
                    dist_counters_reset();
                    if (nonblocking) {
                        DistWork w = dist_ireduce_scatter(mpi_dev(s), mpi_dev(r), n, dt, (DistOp)op, G->g);
                        dist_wait(&w);
                    } else {
                        dist_reduce_scatter(mpi_dev(s), mpi_dev(r), n, dt, (DistOp)op, G->g);
                    }
                    mpi_unmirror();
                    compare(result, ref, dt, n, label);
                    uint64_t S = whole * es;
                    check_counters(OP_REDUCE_SCATTER, (N - 1) * S / N, (N - 1) * S / N, label);
                    free(send);
                    free(recv);
                    free(ref);
                }
}

static void test_all_gather(const Group *G, int nonblocking) {
    static const char *modes[] = {"separate", "send==NULL", "send==recv+r*n", "send==recv"};
    uint64_t N = (uint64_t)G->N;
    size_t counts[NCOUNTS];
    counts_for(G->N, 1, counts);
    for (int d = 0; d < 5; d++)
        for (int mode = 0; mode < 4; mode++)
            for (int ci = 0; ci < NCOUNTS; ci++) {
                DistDtype dt = all_dts[d];
                if (skip_large(ci, mode, DIST_SUM, dt)) continue;
                size_t n = counts[ci], es = esize(dt), whole = n * (size_t)G->N;
                salt++;
                char label[200];
                snprintf(label, sizeof label, "%sall_gather %s %s n=%zu group=%s", nonblocking ? "i" : "",
                         dt_name[dt], modes[mode], n, G->g->name);
                void *send = xbuf(n * es), *recv = xbuf(whole * es), *ref = xbuf(whole * es);
                fill(send, dt, n, wrank, 0);
                for (int m = 0; m < G->N; m++) fill((char *)ref + (size_t)m * n * es, dt, n, G->members[m], 0);
                char *mine = (char *)recv + (size_t)G->r * n * es;
                const void *s = send;
                if (mode == 1) { memcpy(mine, send, n * es); s = NULL; }
                if (mode == 2) { memcpy(mine, send, n * es); s = mine; }
                if (mode == 3) { memcpy(recv, send, n * es); s = recv; }
                mpi_mirror(send, n * es + 16);
                mpi_mirror(recv, whole * es + 16);
                dist_counters_reset();
                if (nonblocking) {
                    DistWork w = dist_iall_gather(mpi_dev(s), mpi_dev(recv), n, dt, G->g);
                    dist_wait(&w);
                } else {
                    dist_all_gather(mpi_dev(s), mpi_dev(recv), n, dt, G->g);
                }
                mpi_unmirror();
                compare(recv, ref, dt, whole, label);
                uint64_t S = whole * es;
                check_counters(OP_ALL_GATHER, (N - 1) * S / N, (N - 1) * S / N, label);
                free(send);
                free(recv);
                free(ref);
            }
}

static void test_scatter(const Group *G) {
    static const char *modes[] = {"separate", "recv==NULL", "recv==send+root*n", "recv==send"};
    size_t counts[NCOUNTS];
    counts_for(G->N, 1, counts);
    int roots[2] = {0, G->N - 1};
    for (int ri = 0; ri < 2; ri++)
        for (int d = 0; d < 5; d++)
            for (int mode = 0; mode < 4; mode++)
                for (int ci = 0; ci < NCOUNTS; ci++) {
                    int root = roots[ri];
                    DistDtype dt = all_dts[d];
                    if (skip_large(ci, mode, DIST_SUM, dt) || (ci == NCOUNTS - 1 && ri == 1)) continue;
                    size_t n = counts[ci], es = esize(dt), whole = n * (size_t)G->N;
                    salt++;
                    char label[200];
                    snprintf(label, sizeof label, "scatter %s %s root=%d n=%zu group=%s", dt_name[dt], modes[mode],
                             root, n, G->g->name);
                    void *send = xbuf(whole * es), *recv = xbuf(n * es), *ref = xbuf(n * es);
                    fill(ref, dt, n, G->members[root], (size_t)G->r * n);
                    int is_root = G->r == root;
                    if (is_root) fill(send, dt, whole, wrank, 0);
                    void *r = recv, *result = recv;
                    if (is_root && mode == 1) { r = NULL; result = (char *)send + (size_t)root * n * es; }
                    if (is_root && mode == 2) { r = (char *)send + (size_t)root * n * es; result = r; }
                    if (is_root && mode == 3) { r = send; result = send; }
                    mpi_mirror(send, whole * es + 16);
                    mpi_mirror(recv, n * es + 16);
                    dist_counters_reset();
                    dist_scatter(is_root ? mpi_dev(send) : NULL, mpi_dev(r), n, dt, root, G->g);
                    mpi_unmirror();
                    compare(result, ref, dt, n, label);
                    uint64_t block = n * es;
                    if (is_root) check_counters(OP_SCATTER, (uint64_t)(G->N - 1) * block, 0, label);
                    else check_counters(OP_SCATTER, 0, block, label);
                    free(send);
                    free(recv);
                    free(ref);
                }
}

static void test_gather(const Group *G) {
    static const char *modes[] = {"separate", "send==NULL", "send==recv+root*n", "send==recv"};
    size_t counts[NCOUNTS];
    counts_for(G->N, 1, counts);
    int roots[2] = {0, G->N - 1};
    for (int ri = 0; ri < 2; ri++)
        for (int d = 0; d < 5; d++)
            for (int mode = 0; mode < 4; mode++)
                for (int ci = 0; ci < NCOUNTS; ci++) {
                    int root = roots[ri];
                    DistDtype dt = all_dts[d];
                    if (skip_large(ci, mode, DIST_SUM, dt) || (ci == NCOUNTS - 1 && ri == 1)) continue;
                    size_t n = counts[ci], es = esize(dt), whole = n * (size_t)G->N;
                    salt++;
                    char label[200];
                    snprintf(label, sizeof label, "gather %s %s root=%d n=%zu group=%s", dt_name[dt], modes[mode],
                             root, n, G->g->name);
                    void *send = xbuf(n * es), *recv = xbuf(whole * es), *ref = xbuf(whole * es);
                    fill(send, dt, n, wrank, 0);
                    for (int m = 0; m < G->N; m++) fill((char *)ref + (size_t)m * n * es, dt, n, G->members[m], 0);
                    int is_root = G->r == root;
                    char *mine = (char *)recv + (size_t)root * n * es;
                    const void *s = send;
                    if (is_root && mode == 1) { memcpy(mine, send, n * es); s = NULL; }
                    if (is_root && mode == 2) { memcpy(mine, send, n * es); s = mine; }
                    if (is_root && mode == 3) { memcpy(recv, send, n * es); s = recv; }
                    mpi_mirror(send, n * es + 16);
                    mpi_mirror(recv, whole * es + 16);
                    dist_counters_reset();
                    dist_gather(mpi_dev(s), is_root ? mpi_dev(recv) : NULL, n, dt, root, G->g);
                    mpi_unmirror();
                    uint64_t block = n * es;
                    if (is_root) {
                        compare(recv, ref, dt, whole, label);
                        check_counters(OP_GATHER, 0, (uint64_t)(G->N - 1) * block, label);
                    } else {
                        check_counters(OP_GATHER, block, 0, label);
                    }
                    free(send);
                    free(recv);
                    free(ref);
                }
}

// Checks the two counters of a send + a receive.
static void check_sendrecv_counters(uint64_t sent, uint64_t recv, const char *label) {
    const DistCounters *c = dist_counters();
    check(c->calls[OP_SEND] == 1 && c->calls[OP_RECV] == 1, "%s: counted %llu sends and %llu recvs, expected 1 and 1",
          label, (unsigned long long)c->calls[OP_SEND], (unsigned long long)c->calls[OP_RECV]);
    check(c->sent[OP_SEND] == sent && c->recv[OP_RECV] == recv && dist_bytes_sent() == sent &&
              dist_bytes_recv() == recv,
          "%s: counted %llu bytes sent and %llu received, expected %llu and %llu", label,
          (unsigned long long)dist_bytes_sent(), (unsigned long long)dist_bytes_recv(), (unsigned long long)sent,
          (unsigned long long)recv);
}

// Point to point: pairs (r, r^1) with blocking send/recv, a ring with dist_sendrecv and a ring
// with isend/irecv. Message from group rank a carries the input of a's world rank.
static void test_point_to_point(const Group *G) {
    static const char *kinds[] = {"send/recv pairs", "sendrecv ring", "isend/irecv ring"};
    size_t counts[NCOUNTS];
    counts_for(G->N, 0, counts);
    for (int kind = 0; kind < 3; kind++)
        for (int d = 0; d < 5; d++)
            for (int ci = 0; ci < NCOUNTS; ci++) {
                DistDtype dt = all_dts[d];
                size_t n = counts[ci], es = esize(dt);
                salt++;
                char label[200];
                snprintf(label, sizeof label, "%s %s n=%zu group=%s", kinds[kind], dt_name[dt], n, G->g->name);
                int dst = (G->r + 1) % G->N, src = (G->r + G->N - 1) % G->N;
                if (kind == 0) dst = src = G->r ^ 1;
                if (kind == 0 && dst >= G->N) continue;  // the odd one out has no partner
                if (skip_large(ci, 0, DIST_SUM, dt)) continue;
                void *send = xbuf(n * es), *recv = xbuf(n * es), *ref = xbuf(n * es);
                fill(send, dt, n, wrank, 0);
                fill(ref, dt, n, G->members[src], 0);
                mpi_mirror(send, n * es + 16);
                mpi_mirror(recv, n * es + 16);
                dist_counters_reset();
                if (kind == 0) {
                    // even ranks send first, odd ranks receive first: no deadlock at any size
                    if (G->r % 2 == 0) {
                        dist_send(mpi_dev(send), n, dt, dst, 7, G->g);
                        dist_recv(mpi_dev(recv), n, dt, src, 7, G->g);
                    } else {
                        dist_recv(mpi_dev(recv), n, dt, src, 7, G->g);
                        dist_send(mpi_dev(send), n, dt, dst, 7, G->g);
                    }
                } else if (kind == 1) {
                    dist_sendrecv(mpi_dev(send), n, dst, mpi_dev(recv), n, src, dt, 8, G->g);
                } else {
                    DistWork w[2];
                    w[0] = dist_irecv(mpi_dev(recv), n, dt, src, 9, G->g);
                    w[1] = dist_isend(mpi_dev(send), n, dt, dst, 9, G->g);
                    dist_wait_all(w, 2);
                    check(!w[0].active && !w[1].active, "%s: work still active after dist_wait_all", label);
                }
                mpi_unmirror();
                compare(recv, ref, dt, n, label);
                check_sendrecv_counters(n * es, n * es, label);
                free(send);
                free(recv);
                free(ref);
            }
}

// Several non-blocking ops in flight at once, finished out of order, one by dist_test.
static void test_overlapping(const Group *G) {
    size_t n = 7 * (size_t)G->N + 3;
    salt++;
    char label[200];
    snprintf(label, sizeof label, "overlapping non-blocking ops group=%s", G->g->name);
    // a: bf16 all_reduce AVG; b: f32 reduce_scatter SUM in NCCL's in-place form;
    // c: i32 all_gather in place; d: f64 all_reduce MAX, finished with dist_test.
    uint16_t *a = xbuf(n * 2), *aref = xbuf(n * 2);
    float *b = xbuf(n * (size_t)G->N * 4), *bref = xbuf(n * 4);
    int32_t *c = xbuf(n * (size_t)G->N * 4), *cref = xbuf(n * (size_t)G->N * 4);
    double *dd = xbuf(n * 8), *dref = xbuf(n * 8);
    fill(a, DIST_BF16, n, wrank, 0);
    fill(b, DIST_F32, n * (size_t)G->N, wrank, 0);
    fill(c + (size_t)G->r * n, DIST_I32, n, wrank, 0);
    fill(dd, DIST_F64, n, wrank, 0);
    for (size_t i = 0; i < n; i++) {
        put_reduced(aref, i, DIST_BF16, DIST_AVG, G->members, G->N, i);
        put_reduced(bref, i, DIST_F32, DIST_SUM, G->members, G->N, (size_t)G->r * n + i);
        put_reduced(dref, i, DIST_F64, DIST_MAX, G->members, G->N, i);
    }
    for (int m = 0; m < G->N; m++) fill(cref + (size_t)m * n, DIST_I32, n, G->members[m], 0);
    mpi_mirror(a, n * 2 + 16);
    mpi_mirror(b, n * (size_t)G->N * 4 + 16);
    mpi_mirror(c, n * (size_t)G->N * 4 + 16);
    mpi_mirror(dd, n * 8 + 16);
    DistWork w[3];
    w[0] = dist_iall_reduce(mpi_dev(a), mpi_dev(a), n, DIST_BF16, DIST_AVG, G->g);
    w[1] = dist_ireduce_scatter(mpi_dev(b), mpi_dev(b + (size_t)G->r * n), n, DIST_F32, DIST_SUM, G->g);
    w[2] = dist_iall_gather(NULL, mpi_dev(c), n, DIST_I32, G->g);
    DistWork wd = dist_iall_reduce(mpi_dev(dd), mpi_dev(dd), n, DIST_F64, DIST_MAX, G->g);
    dist_wait(&w[2]);
    DistWork rest[2] = {w[1], w[0]};
    dist_wait_all(rest, 2);
    long spins = 0;
    while (!dist_test(&wd)) spins++;
    check(dist_test(&wd) == 1, "%s: dist_test on a finished work must say 1", label);
    mpi_unmirror();
    compare(a, aref, DIST_BF16, n, label);
    compare(b + (size_t)G->r * n, bref, DIST_F32, n, label);
    compare(c, cref, DIST_I32, n * (size_t)G->N, label);
    compare(dd, dref, DIST_F64, n, label);
    free(a); free(aref); free(b); free(bref); free(c); free(cref); free(dd); free(dref);
}

static void test_barrier(const Group *G) {
    char label[100];
    snprintf(label, sizeof label, "barrier group=%s", G->g->name);
    dist_counters_reset();
    dist_barrier(G->g);
    check_counters(OP_BARRIER, 0, 0, label);
}

// MPI_DIST_TIMES=1: rank 0 prints how long each group of cases took.
#define TIMED(x)                                                                   \
    do {                                                                           \
        double t_ = lab_now();                                                     \
        x;                                                                         \
        if (getenv("MPI_DIST_TIMES") && wrank == 0)                                \
            printf("%-40s %.2f s\n", #x, lab_now() - t_);                          \
    } while (0)
static void run_all(const Group *G) {
    TIMED(test_all_reduce(G, 0));
    TIMED(test_all_reduce(G, 1));
    TIMED(test_broadcast(G, 0));
    TIMED(test_broadcast(G, 1));
    TIMED(test_reduce(G));
    TIMED(test_reduce_scatter(G, 0));
    TIMED(test_reduce_scatter(G, 1));
    TIMED(test_all_gather(G, 0));
    TIMED(test_all_gather(G, 1));
    TIMED(test_scatter(G));
    TIMED(test_gather(G));
    TIMED(test_point_to_point(G));
    TIMED(test_overlapping(G));
    TIMED(test_barrier(G));
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    wrank = dist_rank();
    int W = dist_size();

    if (argc >= 3 && strcmp(argv[1], "--device") == 0) {
        LAB_CHECK(strcmp(argv[2], "cuda") == 0 || strcmp(argv[2], "cpu") == 0, "--device cpu|cuda");
        mpi_use_device = strcmp(argv[2], "cuda") == 0;
        if (wrank == 0) printf("mpi_dist: buffers on %s\n", argv[2]);
    }
    if (argc >= 3 && strcmp(argv[1], "--fail-rank") == 0) {
        // One rank fails while the others wait in a collective: the job must end, not hang.
        if (wrank == atoi(argv[2])) lab_fail("injected failure on rank %d", wrank);
        dist_barrier(dist_world());
        printf("rank %d passed the barrier: the failing rank did not end the job\n", wrank);
        dist_finalize();
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--fail-collective") == 0) {
        // Every rank finds the same error: the student must see it once.
        lab_fail_collective("the same error on every rank (world %d)", W);
    }
    if (argc >= 2 && strcmp(argv[1], "--exercise-todo") == 0) {
        lab_exercise_todo("04.1", "Scatter-reduce phase", "04_ring_allreduce/README.md#exercise-041-scatter-reduce-phase");
    }
    if (argc >= 3 && strcmp(argv[1], "--trace") == 0) {
        // Two spans per rank, one of them with a name that JSON must escape.
        trace_init(argv[2]);
        int t = trace_begin("compute step", TRACE_COMPUTE);
        usleep(20000);
        trace_end(t);
        double t0 = lab_now();
        dist_barrier(dist_world());
        trace_span("say \"hi\"", TRACE_COMM, t0, lab_now());
        trace_finish();
        dist_finalize();
        return 0;
    }
    if (argc >= 5 && strcmp(argv[1], "--results") == 0 && strcmp(argv[3], "--dump") == 0) {
        // A stand-in for a chapter's --dump (for the harness tests): 3 losses, 10 params.
        float k = (float)atof(argv[2]);
        if (wrank == 0) {
            RunResults r;
            results_init(&r, 3, 10);
            for (int s = 0; s < 3; s++) r.losses[s] = k * (float)(s + 1);
            for (int i = 0; i < 10; i++) r.params[i] = k * 0.5f * (float)i;
            results_set(&r, "world", (double)W);
            results_write(argv[4], &r);
            results_free(&r);
        }
        dist_finalize();
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--overflow") == 0) {
        dist_all_reduce(NULL, NULL, (size_t)INT_MAX + 1, DIST_F32, DIST_SUM, dist_world());
        printf("rank %d: a count over INT_MAX was accepted\n", wrank);
        dist_finalize();
        return 0;
    }

    check(dist_dtype_size(DIST_F32) == 4 && dist_dtype_size(DIST_BF16) == 2 && dist_dtype_size(DIST_F64) == 8 &&
              dist_dtype_size(DIST_I32) == 4 && dist_dtype_size(DIST_U8) == 1,
          "dist_dtype_size");
    check(strcmp(dist_op_kind_name(OP_ALL_REDUCE), "all_reduce") == 0, "dist_op_kind_name");

    // the world
    int *world_members = lab_xmalloc((size_t)W * sizeof(int));
    for (int r = 0; r < W; r++) world_members[r] = r;
    Group world = {dist_world(), world_members, W, wrank};
    check(world.g->size == W && world.g->rank == wrank, "dist_world: rank %d size %d", world.g->rank, world.g->size);
    run_all(&world);

    // a split group: ranks of equal parity, ordered by key = -rank (so in reverse order)
    int color = wrank % 2;
    DistGroup *g = dist_split(dist_world(), color, -wrank, "parity");
    int *members = lab_xmalloc((size_t)W * sizeof(int));
    int N = 0, me = -1;
    for (int r = W - 1; r >= 0; r--) {
        if (r % 2 != color) continue;
        if (r == wrank) me = N;
        members[N++] = r;
    }
    check(g->size == N && g->rank == me && strcmp(g->name, "parity") == 0,
          "dist_split: got rank %d of %d named %s, expected rank %d of %d named parity", g->rank, g->size, g->name,
          me, N);
    Group split = {g, members, N, me};
    on_world = 0;
    if (g->size == N && g->rank == me) run_all(&split);
    dist_group_free(g);

    // totals over all ranks
    int total_failed = 0, total_checks = 0;
    MPI_Allreduce(&nfailed, &total_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&nchecks, &total_checks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (nfailed) fprintf(stderr, "[rank %d] %d of %d checks failed\n", wrank, nfailed, nchecks);
    fflush(stderr);
    MPI_Barrier(MPI_COMM_WORLD);
    if (wrank == 0) printf("mpi_dist: %d checks, %d failed\n", total_checks, total_failed);
    free(world_members);
    free(members);
    dist_finalize();
    return total_failed ? 1 : 0;
}
