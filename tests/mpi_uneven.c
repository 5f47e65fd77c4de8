// mpi_uneven.c: dist.h's uneven ops (reduce_scatter_n, all_gather_n, gather_n) against a plain
// local reference, the per-group byte counters against dist.h's formulas, and the
// communication thread running ops of several groups in launch order.
//
// Launched by tests/test_dist_uneven.c as
//   mpirun -np N build/tests/mpi_uneven <what>...
// with <what> among rs ag gather counters thread (mpitest.h: each runs on the world and on a
// split group). Each rank's input is a pure function of (world rank, index, salt), so every
// rank computes what an op must return without communicating: the reference is the plain sum
// (or average) over the group's members, sliced by the shard convention written out again here
// (ref_shard), not by common/shard.c. Inputs are small integers (-8..8): sums over up to 8 ranks
// are exact in fp32 and bf16 whatever the reduction order, so results compare bit for bit.
// Counts: 0, 1, 2 (fewer than N: empty shards), N-1, N+1, 7N+3, and 834,304 (the default
// model's parameters, which 3 does not divide; world, f32, blocking only, to stay quick).
//
// First arguments (before <what>): --device runs rs, ag and gather on device copies of the
// buffers (mem_alloc DEV_CUDA: the MPI backend stages them through host memory), and
// --device --nccl on the NCCL backend (padded reduce-scatter, grouped send/recv gathers). Both
// need a CUDA build; tests/cuda_emu/run_nccl.sh runs them over its NCCL emulator on the CPU.
//
// Breaks seen to be caught (on 3 ranks), each restored after:
//   MPI v-counts from an even split (dist_mpi.c block_arrays)      rs, ag, gather: wrong elements
//   AVG of a non-blocking rs_n over the whole n (dist.c work_new)   rs: writes past recv (guard)
//   gather_n's counts arrays not made at the root                   gather: the job fails (MPI_ERR_ARG)
//   rs_n's recv counted with its own block, not the left one's      counters: group + process
//   all_gather_n's sent counted with its own block                  counters: group + process
//   group counters not kept (dist.c count_bytes)                    counters: group
//   the thread's queue jumped (a new op run before older ones)      thread: rs then ag, in order
//   NCCL uneven rs: shards copied from p * maxlen, not their start  --device --nccl rs (emulator)
//   staging copies back only this rank's block of an all-gather     --device ag (emulator)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "mem.h"
#include "mpitest.h"

static int salt = 0;  // changes every call, so a stale buffer never passes for a result

// ---------------------------------------------------------------------------------------------
// values and the reference

static double input(int world_rank, size_t i) {
    return (double)((int)(((size_t)world_rank * 37 + i * 11 + (size_t)salt * 5) % 17) - 8);
}

// bf16 written here independently of the library: round to nearest, ties to even.
static uint16_t ref_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static size_t esz(DistDtype dt) { return dt == DIST_BF16 ? 2 : 4; }

static void put(void *buf, DistDtype dt, size_t i, double v) {
    if (dt == DIST_BF16) ((uint16_t *)buf)[i] = ref_bf16((float)v);
    else ((float *)buf)[i] = (float)v;
}

// The shard convention, written out again: the first n % N shards one element longer.
static void ref_shard(size_t n, int N, int p, size_t *begin, size_t *len) {
    size_t q = n / (size_t)N, extra = n % (size_t)N, pp = (size_t)p;
    *len = q + (pp < extra ? 1 : 0);
    *begin = pp * q + (pp < extra ? pp : extra);
}

// World rank of each group rank (members[N]).
static int *members_of(DistGroup *g) {
    int *m = lab_xmalloc((size_t)g->size * sizeof(int));
    int me = dist_rank();
    dist_all_gather(&me, m, 1, DIST_I32, g);
    return m;
}

// ref[j] = op over the members' inputs at index begin + j (j < len), stored as dt.
static void reduced(void *ref, DistDtype dt, DistOp op, const int *members, int N, size_t begin, size_t len) {
    for (size_t j = 0; j < len; j++) {
        double s = 0;
        for (int m = 0; m < N; m++) s += input(members[m], begin + j);
        if (op == DIST_AVG) {
            // dist.h: the sum, divided in the dtype's arithmetic (bf16: in fp32, rounded once)
            float a = (float)s / (float)N;
            if (dt == DIST_BF16) ((uint16_t *)ref)[j] = ref_bf16(a);
            else ((float *)ref)[j] = a;
        } else {
            put(ref, dt, j, s);
        }
    }
}

#define GUARD 16  // bytes behind every buffer that no op may write

static void *xbuf(size_t bytes) {
    void *p = lab_xmalloc(bytes + GUARD);
    memset(p, 0x5a, bytes + GUARD);  // garbage that is no valid result
    return p;
}

static int guard_intact(const void *buf, size_t bytes) {
    const unsigned char *g = (const unsigned char *)buf + bytes;
    for (int i = 0; i < GUARD; i++)
        if (g[i] != 0x5a) return 0;
    return 1;
}

static void compare(const void *got, const void *want, size_t n, DistDtype dt, const char *label, DistGroup *g) {
    size_t e = esz(dt);
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)got + i * e, (const char *)want + i * e, e) != 0) {
            mpi_check(0, "%s on %s (rank %d of %d): element %zu of %zu differs from the reference", label, g->name,
                      g->rank, g->size, i, n);
            return;
        }
    }
    mpi_check(1, "%s", label);
}

// --device: the ops run on device twins of the buffers (mpi_mirror, mpitest.h).

// ---------------------------------------------------------------------------------------------
// modes: how the op is started

enum { BLOCKING = 0, NONBLOCKING, THREAD, NMODES };
static const char *mode_name[] = {"blocking", "non-blocking", "comm thread"};
static const DistDtype dts[] = {DIST_F32, DIST_BF16};
static const DistOp ops[] = {DIST_SUM, DIST_AVG};

#define NCOUNTS 7
static void counts_for(int N, size_t out[NCOUNTS]) {
    size_t c[NCOUNTS] = {0, 1, 2, (size_t)N - 1, (size_t)N + 1, 7 * (size_t)N + 3, 834304};
    memcpy(out, c, sizeof c);
}
// The big count once per op kind: the world, f32, SUM, blocking.
static int skip(int ci, int mode, DistDtype dt, DistOp op, DistGroup *g) {
    return ci == NCOUNTS - 1 && (mode != BLOCKING || dt != DIST_F32 || op != DIST_SUM || g != dist_world());
}

static void begin_mode(int mode, DistGroup *g) {
    if (mode == THREAD) dist_comm_thread_start(g);
}
static void end_mode(int mode, DistGroup *g) {
    if (mode == THREAD) dist_comm_thread_stop(g);
}

// ---------------------------------------------------------------------------------------------
// reduce_scatter_n: separate buffers, input in recv (send == NULL), NCCL's form (recv inside send)

static void test_rs(DistGroup *g) {
    int N = g->size, r = g->rank, me = dist_rank();
    int *members = members_of(g);
    size_t counts[NCOUNTS];
    counts_for(N, counts);
    static const char *forms[] = {"separate", "send==NULL", "recv==send+begin"};
    for (int mode = 0; mode < (mpi_use_device ? THREAD : NMODES); mode++) {  // device buffers are never queued
        begin_mode(mode, g);
        for (int di = 0; di < 2; di++)
            for (int oi = 0; oi < 2; oi++)
                for (int ci = 0; ci < NCOUNTS; ci++)
                    for (int form = 0; form < 3; form++) {
                        DistDtype dt = dts[di];
                        DistOp op = ops[oi];
                        if (skip(ci, mode, dt, op, g) || (ci == NCOUNTS - 1 && form > 0)) continue;
                        size_t n = counts[ci], e = esz(dt), begin, len;
                        ref_shard(n, N, r, &begin, &len);
                        salt++;
                        char *in = xbuf(n * e), *out = xbuf(len * e), *want = xbuf(len * e);
                        for (size_t i = 0; i < n; i++) put(in, dt, i, input(me, i));
                        reduced(want, dt, op, members, N, begin, len);
                        const void *send = in;
                        void *recv = out, *result = out;
                        size_t recv_extent = len * e;
                        if (form == 1) { send = NULL; recv = result = in; recv_extent = n * e; }
                        if (form == 2) { recv = result = in + begin * e; recv_extent = len * e; }
                        mpi_mirror(in, n * e + GUARD);
                        mpi_mirror(out, len * e + GUARD);
                        if (mode == BLOCKING) {
                            dist_reduce_scatter_n(mpi_dev(send), mpi_dev(recv), n, dt, op, g);
                        } else {
                            DistWork w = dist_ireduce_scatter_n(mpi_dev(send), mpi_dev(recv), n, dt, op, g);
                            mpi_check(mode != THREAD || w.task != NULL, "rs: not queued on the thread");
                            dist_wait(&w);
                        }
                        mpi_unmirror();
                        char label[160];
                        snprintf(label, sizeof label, "reduce_scatter_n %s %s %s n=%zu %s", mode_name[mode],
                                 dt == DIST_BF16 ? "bf16" : "f32", op == DIST_AVG ? "avg" : "sum", n, forms[form]);
                        compare(result, want, len, dt, label, g);
                        mpi_check(guard_intact(form == 0 ? out : in, form == 0 ? len * e : n * e),
                                  "%s: wrote past the end of its buffer", label);
                        (void)recv_extent;
                        free(in);
                        free(out);
                        free(want);
                    }
        end_mode(mode, g);
    }
    free(members);
}

// ---------------------------------------------------------------------------------------------
// all_gather_n: separate, in place (send == NULL), own block at recv's start (send == recv)

static void test_ag(DistGroup *g) {
    int N = g->size, r = g->rank;
    int *members = members_of(g);
    size_t counts[NCOUNTS];
    counts_for(N, counts);
    static const char *forms[] = {"separate", "send==NULL", "send==recv"};
    for (int mode = 0; mode < (mpi_use_device ? THREAD : NMODES); mode++) {  // device buffers are never queued
        begin_mode(mode, g);
        for (int di = 0; di < 2; di++)
            for (int ci = 0; ci < NCOUNTS; ci++)
                for (int form = 0; form < 3; form++) {
                    DistDtype dt = dts[di];
                    if (skip(ci, mode, dt, DIST_SUM, g) || (ci == NCOUNTS - 1 && form > 0)) continue;
                    size_t n = counts[ci], e = esz(dt), begin, len;
                    ref_shard(n, N, r, &begin, &len);
                    salt++;
                    // everyone's block p holds member p's input at the indices of block p
                    char *want = xbuf(n * e), *mine = xbuf(len * e), *out = xbuf(n * e);
                    for (int p = 0; p < N; p++) {
                        size_t bp, lp;
                        ref_shard(n, N, p, &bp, &lp);
                        for (size_t j = 0; j < lp; j++) put(want, dt, bp + j, input(members[p], bp + j));
                    }
                    memcpy(mine, want + begin * e, len * e);
                    const void *send = mine;
                    if (form == 1) { memcpy(out + begin * e, mine, len * e); send = NULL; }
                    if (form == 2) { memcpy(out, mine, len * e); send = out; }
                    if (send == mine) mpi_mirror(mine, len * e + GUARD);
                    mpi_mirror(out, n * e + GUARD);
                    if (mode == BLOCKING) {
                        dist_all_gather_n(mpi_dev(send), mpi_dev(out), n, dt, g);
                    } else {
                        DistWork w = dist_iall_gather_n(mpi_dev(send), mpi_dev(out), n, dt, g);
                        mpi_check(mode != THREAD || w.task != NULL, "ag: not queued on the thread");
                        dist_wait(&w);
                    }
                    mpi_unmirror();
                    char label[160];
                    snprintf(label, sizeof label, "all_gather_n %s %s n=%zu %s", mode_name[mode],
                             dt == DIST_BF16 ? "bf16" : "f32", n, forms[form]);
                    compare(out, want, n, dt, label, g);
                    mpi_check(guard_intact(out, n * e), "%s: wrote past the end of recv", label);
                    free(want);
                    free(mine);
                    free(out);
                }
        end_mode(mode, g);
    }
    free(members);
}

// ---------------------------------------------------------------------------------------------
// gather_n (blocking only): roots 0 and N-1, separate and in place at the root

static void test_gather(DistGroup *g) {
    int N = g->size, r = g->rank;
    int *members = members_of(g);
    size_t counts[NCOUNTS];
    counts_for(N, counts);
    int roots[2] = {0, N - 1};
    for (int ri = 0; ri < (N > 1 ? 2 : 1); ri++)
        for (int di = 0; di < 2; di++)
            for (int ci = 0; ci < NCOUNTS; ci++)
                for (int form = 0; form < 2; form++) {
                    DistDtype dt = dts[di];
                    int root = roots[ri];
                    if (skip(ci, BLOCKING, dt, DIST_SUM, g) || (ci == NCOUNTS - 1 && (form > 0 || ri > 0))) continue;
                    size_t n = counts[ci], e = esz(dt), begin, len;
                    ref_shard(n, N, r, &begin, &len);
                    salt++;
                    char *want = xbuf(n * e), *mine = xbuf(len * e), *out = xbuf(n * e);
                    for (int p = 0; p < N; p++) {
                        size_t bp, lp;
                        ref_shard(n, N, p, &bp, &lp);
                        for (size_t j = 0; j < lp; j++) put(want, dt, bp + j, input(members[p], bp + j));
                    }
                    memcpy(mine, want + begin * e, len * e);
                    char *before = xbuf(n * e);
                    memcpy(before, out, n * e + GUARD);
                    const void *send = mine;
                    if (form == 1 && r == root) { memcpy(out + begin * e, mine, len * e); send = NULL; }
                    if (send == mine) mpi_mirror(mine, len * e + GUARD);
                    if (r == root) mpi_mirror(out, n * e + GUARD);
                    dist_gather_n(mpi_dev(send), r == root ? mpi_dev(out) : NULL, n, dt, root, g);
                    mpi_unmirror();
                    char label[160];
                    snprintf(label, sizeof label, "gather_n root %d %s n=%zu %s", root, dt == DIST_BF16 ? "bf16" : "f32",
                             n, form ? "in place" : "separate");
                    if (r == root) compare(out, want, n, dt, label, g);
                    mpi_check(guard_intact(out, n * e), "%s: wrote past the end of recv", label);
                    free(want);
                    free(mine);
                    free(out);
                    free(before);
                }
    free(members);
}

// ---------------------------------------------------------------------------------------------
// per-group counters: two groups split off g (by parity and by halves), ops on them
// interleaved; each group's counters == the formulas of its own ops, g's own counters do not
// move, and the process counters move by the sum of both.

typedef struct Expect {
    uint64_t calls[OP_NKINDS], sent[OP_NKINDS], recv[OP_NKINDS];
} Expect;

static void expect(Expect *x, DistOpKind k, uint64_t sent, uint64_t recv) {
    x->calls[k]++;
    x->sent[k] += sent;
    x->recv[k] += recv;
}

// dist.h's uneven formulas, from ref_shard (c_p = block p).
static uint64_t blk(size_t n, int N, int p) {
    size_t b, l;
    ref_shard(n, N, ((p % N) + N) % N, &b, &l);
    return l;
}

static void check_against(const DistCounters *got, const Expect *want, const char *what, DistGroup *g) {
    for (int k = 0; k < OP_NKINDS; k++)
        mpi_check(got->calls[k] == want->calls[k] && got->sent[k] == want->sent[k] && got->recv[k] == want->recv[k],
                  "%s on %s (rank %d of %d): %s counted %llu calls sent %llu recv %llu, formula %llu / %llu / %llu",
                  what, g->name, g->rank, g->size, dist_op_kind_name((DistOpKind)k),
                  (unsigned long long)got->calls[k], (unsigned long long)got->sent[k],
                  (unsigned long long)got->recv[k], (unsigned long long)want->calls[k],
                  (unsigned long long)want->sent[k], (unsigned long long)want->recv[k]);
}

static void diff(DistCounters *out, const DistCounters *a, const DistCounters *b) {
    for (int k = 0; k < OP_NKINDS; k++) {
        out->calls[k] = a->calls[k] - b->calls[k];
        out->sent[k] = a->sent[k] - b->sent[k];
        out->recv[k] = a->recv[k] - b->recv[k];
    }
}

static void test_counters(DistGroup *g) {
    DistGroup *ga = dist_split(g, g->rank % 2, g->rank, "parity2");
    DistGroup *gb = dist_split(g, g->rank < g->size / 2, g->rank, "halves");
    DistCounters proc0 = *dist_counters(), parent0 = *dist_group_counters(g);
    dist_group_counters_reset(ga);
    dist_group_counters_reset(gb);
    Expect xa, xb;
    memset(&xa, 0, sizeof xa);
    memset(&xb, 0, sizeof xb);
    size_t ns[] = {2, 7, 1001, 834304 / 64};
    for (int t = 0; t < 4; t++) {
        for (int which = 0; which < 2; which++) {
            DistGroup *h = which ? gb : ga;
            Expect *x = which ? &xb : &xa;
            int N = h->size, r = h->rank;
            size_t n = ns[t] + (size_t)which;  // different counts on the two groups
            for (int di = 0; di < 2; di++) {
                DistDtype dt = dts[di];
                uint64_t e = esz(dt);
                char *buf = xbuf(n * e), *blkbuf = xbuf(blk(n, N, r) * e + 1);
                memset(buf, 0, n * e);
                memset(blkbuf, 0, blk(n, N, r) * e);
                dist_reduce_scatter_n(buf, blkbuf, n, dt, DIST_SUM, h);
                expect(x, OP_REDUCE_SCATTER, (n - blk(n, N, r)) * e, (n - blk(n, N, r - 1)) * e);
                DistWork w = dist_iall_gather_n(blkbuf, buf, n, dt, h);
                dist_wait(&w);
                expect(x, OP_ALL_GATHER, (n - blk(n, N, r + 1)) * e, (n - blk(n, N, r)) * e);
                dist_gather_n(blkbuf, r == 0 ? buf : NULL, n, dt, 0, h);
                if (r == 0) expect(x, OP_GATHER, 0, (n - blk(n, N, 0)) * e);
                else expect(x, OP_GATHER, blk(n, N, r) * e, 0);
                dist_all_reduce(NULL, buf, n, dt, DIST_SUM, h);  // an even op counts in its group too
                uint64_t S = n * e, NN = (uint64_t)N;
                expect(x, OP_ALL_REDUCE, 2 * (NN - 1) * S / NN, 2 * (NN - 1) * S / NN);
                free(buf);
                free(blkbuf);
            }
        }
    }
    check_against(dist_group_counters(ga), &xa, "group counters (parity)", ga);
    check_against(dist_group_counters(gb), &xb, "group counters (halves)", gb);
    mpi_check(dist_group_bytes_sent(ga) == dist_group_counters(ga)->sent[OP_REDUCE_SCATTER] +
                                               dist_group_counters(ga)->sent[OP_ALL_GATHER] +
                                               dist_group_counters(ga)->sent[OP_GATHER] +
                                               dist_group_counters(ga)->sent[OP_ALL_REDUCE],
              "dist_group_bytes_sent is not the sum over op kinds");
    DistCounters dp, dparent;
    diff(&dp, dist_counters(), &proc0);
    diff(&dparent, dist_group_counters(g), &parent0);
    Expect both, none;
    memset(&none, 0, sizeof none);
    for (int k = 0; k < OP_NKINDS; k++) {
        both.calls[k] = xa.calls[k] + xb.calls[k];
        both.sent[k] = xa.sent[k] + xb.sent[k];
        both.recv[k] = xa.recv[k] + xb.recv[k];
    }
    check_against(&dp, &both, "process counters (both groups)", g);
    check_against(&dparent, &none, "the parent group's counters (no op on it)", g);
    dist_group_free(ga);
    dist_group_free(gb);
}

// ---------------------------------------------------------------------------------------------
// the communication thread: g and a group split off it both attached, their ops queued
// interleaved, waited for in reverse order.

static void test_thread(DistGroup *g) {
    int N = g->size, r = g->rank, me = dist_rank();
    DistGroup *h = dist_split(g, r % 2, r, "sub");  // g's ranks of r's parity
    int *gm = members_of(g);
    dist_comm_thread_start(g);
    dist_comm_thread_start(h);
    for (int di = 0; di < 2; di++) {
        DistDtype dt = dts[di];
        size_t n = 7 * (size_t)N + 3, e = esz(dt), begin, len;
        ref_shard(n, N, r, &begin, &len);
        salt++;
        // 1. x: all-reduce on h, then on g (queued in that order). In order, element i is
        //    the sum over g's ranks q of (the sum over q's parity group); the other order gives
        //    |my parity group| * (the sum over g), which differs when N >= 3.
        char *x = xbuf(n * e), *wantx = xbuf(n * e);
        for (size_t i = 0; i < n; i++) put(x, dt, i, input(me, i));
        for (size_t i = 0; i < n; i++) {
            double s = 0;
            for (int q = 0; q < N; q++)
                for (int q2 = q % 2; q2 < N; q2 += 2) s += input(gm[q2], i);
            put(wantx, dt, i, s);
        }
        // 2. y: reduce-scatter on g into yb, then all-gather of yb into z: the all-gather reads
        //    the reduce-scatter's result, so z == the all-reduce of y only when they ran in order.
        char *y = xbuf(n * e), *yb = xbuf(len * e), *z = xbuf(n * e), *wantz = xbuf(n * e);
        for (size_t i = 0; i < n; i++) put(y, dt, i, input(me, i));
        reduced(wantz, dt, DIST_SUM, gm, N, 0, n);
        // 3. the prefetch: an all-gather on h of this rank's block of p.
        int hN = h->size, hr = h->rank;
        int *hm = members_of(h);
        size_t hb, hl;
        ref_shard(n, hN, hr, &hb, &hl);
        char *pmine = xbuf(hl * e), *pall = xbuf(n * e), *wantp = xbuf(n * e);
        for (int p = 0; p < hN; p++) {
            size_t bp, lp;
            ref_shard(n, hN, p, &bp, &lp);
            for (size_t j = 0; j < lp; j++) put(wantp, dt, bp + j, input(hm[p], bp + j));
        }
        memcpy(pmine, wantp + hb * e, hl * e);

        // 4. a broadcast on h from its last rank, queued between them.
        char *bc = xbuf(n * e), *wantb = xbuf(n * e);
        for (size_t i = 0; i < n; i++) put(bc, dt, i, input(me, i) + 1);
        for (size_t i = 0; i < n; i++) put(wantb, dt, i, input(hm[hN - 1], i) + 1);

        DistWork w[6];
        w[0] = dist_iall_reduce(NULL, x, n, dt, DIST_SUM, h);
        w[1] = dist_ireduce_scatter_n(y, yb, n, dt, DIST_SUM, g);
        w[5] = dist_ibroadcast(bc, n, dt, hN - 1, h);
        w[2] = dist_iall_reduce(NULL, x, n, dt, DIST_SUM, g);
        w[3] = dist_iall_gather_n(yb, z, n, dt, g);
        w[4] = dist_iall_gather_n(pmine, pall, n, dt, h);
        for (int k = 0; k < 6; k++) mpi_check(w[k].task != NULL, "thread: op %d was not queued on the thread", k);
        // The caller computes and only looks at a flag (dist_test makes no MPI call on a queued
        // op): the prefetch can only complete here because the thread runs it. (A hang would
        // end at the test's timeout.)
        double acc = 0;
        size_t rounds = 0;
        while (!dist_test(&w[4])) {
            for (int k = 0; k < 1000; k++) acc += (double)((rounds + (size_t)k) % 7);
            rounds++;
        }
        double want_acc = 0;
        for (size_t t = 0; t < rounds; t++)
            for (int k = 0; k < 1000; k++) want_acc += (double)((t + (size_t)k) % 7);
        mpi_check(acc == want_acc, "thread: the caller's computation went wrong");
        dist_wait(&w[5]);
        for (int k = 3; k >= 0; k--) dist_wait(&w[k]);
        const char *dn = dt == DIST_BF16 ? "bf16" : "f32";
        char label[128];
        snprintf(label, sizeof label, "thread %s: all-reduce on h then g, in order", dn);
        compare(x, wantx, n, dt, label, g);
        snprintf(label, sizeof label, "thread %s: reduce_scatter_n then all_gather_n of its result", dn);
        compare(z, wantz, n, dt, label, g);
        snprintf(label, sizeof label, "thread %s: prefetch all_gather_n on h while computing", dn);
        compare(pall, wantp, n, dt, label, h);
        snprintf(label, sizeof label, "thread %s: broadcast on h", dn);
        compare(bc, wantb, n, dt, label, h);
        free(bc), free(wantb);
        free(x), free(wantx), free(y), free(yb), free(z), free(wantz), free(pmine), free(pall), free(wantp);
        free(hm);
    }
    dist_comm_thread_stop(h);
    dist_comm_thread_stop(g);
    mpi_check(g->thread == NULL && h->thread == NULL, "thread: a group is still attached after stop");
    free(gm);
    dist_group_free(h);
}

// ---------------------------------------------------------------------------------------------

static void run(int kind, DistGroup *g) {
    // The same salt on every rank of g (groups of different sizes ran different numbers of cases
    // before), so each rank's reference sees the inputs the others used.
    salt = 100000 * kind + (g == dist_world() ? 0 : 50000);
    switch (kind) {
    case 0: test_rs(g); break;
    case 1: test_ag(g); break;
    case 2: test_gather(g); break;
    case 3: test_counters(g); break;
    case 4: test_thread(g); break;
    default: break;
    }
}

// --device / --nccl, before the tests: the backend is chosen once dist_init has run (in run).
static int want_nccl = 0;

static void run_with_backend(int kind, DistGroup *g) {
    mpi_select_backend(want_nccl);
    LAB_CHECK(!mpi_use_device || kind <= 2, "--device runs rs, ag and gather only");
    run(kind, g);
}

int main(int argc, char **argv) {
    static const char *const kinds[] = {"rs", "ag", "gather", "counters", "thread"};
    want_nccl = mpi_take_device_flags(&argc, &argv);
    const char *prog = want_nccl ? "mpi_uneven (nccl)" : mpi_use_device ? "mpi_uneven (device, staged)" : "mpi_uneven";
    return mpi_test_main(argc, argv, prog,
                         "usage: mpi_uneven [--device [--nccl]] {rs|ag|gather|counters|thread}...", kinds, 5,
                         run_with_backend);
}
