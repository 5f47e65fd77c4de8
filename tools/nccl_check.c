// nccl_check.c: is the NCCL backend of dist.h right? Every dist op runs with --backend nccl on
// device buffers (one GPU per rank), and its result is compared with a reference computed here
// on the host: every input is a formula of (rank, index), so each rank can work out what every
// other rank holds. The same op then runs on host buffers (which go over MPI whatever the
// backend), and the byte counters of the two runs must be equal (the model in dist.h).
//
//   make BUILD=build-cuda CUDA=1 build-cuda/tools/nccl_check
//   ./build-cuda/tools/nccl_check                   one rank, one GPU
//   mpirun -np 4 ./build-cuda/tools/nccl_check      4 ranks, 4 GPUs
//
// Each op runs in each dtype (f32, bf16, f64, i32, u8) and, for the reductions, with SUM, AVG
// and MAX. Inputs are small integers, so sums and maxima are exact in every dtype; AVG of
// floats is not (NCCL multiplies by 1/N before summing): err = max |got - expected| /
// max(1, max |expected|) must stay within the dtype's tolerance (integers: exact).
// Exit status: 0 when every check passes, 1 otherwise. In a build without CUDA it says so and
// exits 0 (nothing to check).
#include <stdio.h>

#ifndef LAB_CUDA

int main(void) {
    printf("nccl_check: built without CUDA (rebuild with `make CUDA=1` on a machine with nvcc and "
           "NCCL); nothing to check\n");
    return 0;
}

#else

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "kernels.h"
#include "mem.h"

// The cases: one op in one form. Forms are those of dist.c's top comment.
typedef enum {
    C_BCAST, C_IBCAST,
    C_AR, C_AR_IP, C_IAR,
    C_REDUCE, C_REDUCE_IP,
    C_RS, C_RS_IP, C_RS_BLOCK, C_IRS,
    C_AG, C_AG_BLOCK, C_AG_START, C_IAG,
    C_SCATTER, C_SCATTER_IP,
    C_GATHER, C_GATHER_IP,
    C_SENDRECV, C_SEND_RECV, C_ISEND_IRECV,
    C_SPLIT_AR,
    C_NCASES
} CaseId;

static const struct {
    const char *op, *form;
    int reduces;  // runs with SUM, AVG and MAX
} cases[C_NCASES] = {
    [C_BCAST] = {"broadcast", "blocking", 0},
    [C_IBCAST] = {"broadcast", "non-blocking", 0},
    [C_AR] = {"all_reduce", "out of place", 1},
    [C_AR_IP] = {"all_reduce", "in place", 1},
    [C_IAR] = {"all_reduce", "non-blocking", 1},
    [C_REDUCE] = {"reduce", "out of place", 1},
    [C_REDUCE_IP] = {"reduce", "in place (send NULL)", 1},
    [C_RS] = {"reduce_scatter", "out of place", 1},
    [C_RS_IP] = {"reduce_scatter", "in place (to start)", 1},
    [C_RS_BLOCK] = {"reduce_scatter", "in place (to block r)", 1},
    [C_IRS] = {"reduce_scatter", "non-blocking", 1},
    [C_AG] = {"all_gather", "out of place", 0},
    [C_AG_BLOCK] = {"all_gather", "in place (from block r)", 0},
    [C_AG_START] = {"all_gather", "in place (from start)", 0},
    [C_IAG] = {"all_gather", "non-blocking, dist_test", 0},
    [C_SCATTER] = {"scatter", "out of place", 0},
    [C_SCATTER_IP] = {"scatter", "root in place (to start)", 0},
    [C_GATHER] = {"gather", "out of place", 0},
    [C_GATHER_IP] = {"gather", "root in place (from start)", 0},
    [C_SENDRECV] = {"sendrecv", "ring r -> r+1", 0},
    [C_SEND_RECV] = {"send / recv", "pairs 2k -> 2k+1", 0},
    [C_ISEND_IRECV] = {"isend / irecv", "pairs 2k+1 -> 2k", 0},
    [C_SPLIT_AR] = {"all_reduce", "group split before", 1},
};

static const char *dtype_name[DIST_NDTYPES] = {"f32", "bf16", "f64", "i32", "u8"};
static const char *op_name[] = {"sum", "avg", "max"};

static int N, R, ROOT;        // world size, this rank, the root of rooted ops (the last rank)
static DistGroup *early;      // ranks of equal parity, split before the NCCL backend was chosen
static const size_t n = 1001; // elements per block (odd: blocks of bf16 and u8 start unaligned)

// ---- values ----------------------------------------------------------------------------------

// What rank p holds at index j: a small integer (u8: non-negative).
static double value(int p, size_t j, DistDtype dt) {
    if (dt == DIST_U8) return (double)(((size_t)p * 5 + j * 3) % 16);
    return (double)(((size_t)p * 7 + j * 3 + 1) % 11) - 5.0;
}

// The reduction over ranks first, first + stride, ... < N of value(p, j).
static double reduced(DistOp op, DistDtype dt, size_t j, int first, int stride) {
    double sum = 0, max = -1e300;
    int count = 0;
    for (int p = first; p < N; p += stride, count++) {
        double v = value(p, j, dt);
        sum += v;
        max = v > max ? v : max;
    }
    if (op == DIST_MAX) return max;
    if (op == DIST_SUM) return sum;
    if (dt == DIST_I32 || dt == DIST_U8) return (double)((int64_t)sum / count);  // C's truncation
    return sum / count;
}

static void put(void *buf, size_t i, DistDtype dt, double v) {
    switch (dt) {
    case DIST_F32: ((float *)buf)[i] = (float)v; break;
    case DIST_BF16: ((uint16_t *)buf)[i] = bf16_from_f32((float)v); break;
    case DIST_F64: ((double *)buf)[i] = v; break;
    case DIST_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DIST_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: lab_fail("bad dtype %d", (int)dt);
    }
}

static double get(const void *buf, size_t i, DistDtype dt) {
    switch (dt) {
    case DIST_F32: return ((const float *)buf)[i];
    case DIST_BF16: return bf16_to_f32(((const uint16_t *)buf)[i]);
    case DIST_F64: return ((const double *)buf)[i];
    case DIST_I32: return ((const int32_t *)buf)[i];
    case DIST_U8: return ((const uint8_t *)buf)[i];
    default: lab_fail("bad dtype %d", (int)dt);
    }
}

static double tolerance(DistDtype dt, DistOp op) {
    if (op != DIST_AVG || dt == DIST_I32 || dt == DIST_U8) return 0;
    return dt == DIST_BF16 ? 2e-2 : dt == DIST_F32 ? 1e-6 : 1e-12;
}

// ---- one case ------------------------------------------------------------------------------------

// A case's host data: the initial contents of buffers a and b, and what b (from element eoff,
// en elements) must hold afterwards. Ops read a as send and b as recv; in-place forms keep
// everything in b.
typedef struct Setup {
    size_t na, nb;
    double *a, *b;     // initial values (NULL: buffer unused)
    double *expect;    // en values
    size_t eoff, en;
} Setup;

static double *vals(size_t count) { return lab_xcalloc(count ? count : 1, sizeof(double)); }

static Setup setup(CaseId c, DistDtype dt, DistOp op) {
    Setup s = {0};
    int prev = (R + N - 1) % N, partner = R ^ 1;
    size_t Nn = (size_t)N * n;
    switch (c) {
    case C_BCAST: case C_IBCAST:
        s.nb = n, s.b = vals(n), s.en = n, s.expect = vals(n);
        for (size_t i = 0; i < n; i++) s.b[i] = value(R == ROOT ? R : R + N, i, dt), s.expect[i] = value(ROOT, i, dt);
        break;
    case C_AR: case C_IAR: case C_REDUCE: case C_AR_IP: case C_REDUCE_IP: case C_SPLIT_AR: {
        int in_place = c == C_AR_IP || c == C_REDUCE_IP;
        s.na = in_place ? 0 : n, s.a = in_place ? NULL : vals(n);
        s.nb = n, s.b = vals(n), s.expect = vals(n);
        s.en = (c == C_REDUCE || c == C_REDUCE_IP) && R != ROOT ? 0 : n;
        int first = c == C_SPLIT_AR ? R % 2 : 0, stride = c == C_SPLIT_AR ? 2 : 1;
        for (size_t i = 0; i < n; i++) {
            (in_place ? s.b : s.a)[i] = value(R, i, dt);
            s.expect[i] = reduced(op, dt, i, first, stride);
        }
    } break;
    case C_RS: case C_IRS: case C_RS_IP: case C_RS_BLOCK: {
        int out_of_place = c == C_RS || c == C_IRS;
        s.na = out_of_place ? Nn : 0, s.a = out_of_place ? vals(Nn) : NULL;
        s.nb = out_of_place ? n : Nn, s.b = vals(s.nb);
        for (size_t j = 0; j < Nn; j++) (out_of_place ? s.a : s.b)[j] = value(R, j, dt);
        s.en = n, s.expect = vals(n), s.eoff = c == C_RS_BLOCK ? (size_t)R * n : 0;
        for (size_t i = 0; i < n; i++) s.expect[i] = reduced(op, dt, (size_t)R * n + i, 0, 1);
    } break;
    case C_AG: case C_IAG: case C_AG_BLOCK: case C_AG_START: {
        int out_of_place = c == C_AG || c == C_IAG;
        s.na = out_of_place ? n : 0, s.a = out_of_place ? vals(n) : NULL;
        s.nb = Nn, s.b = vals(Nn), s.en = Nn, s.expect = vals(Nn);
        size_t mine = c == C_AG_START ? 0 : (size_t)R * n;  // where this rank's block starts
        for (size_t i = 0; i < n; i++) (out_of_place ? s.a : s.b + mine)[i] = value(R, i, dt);
        for (int p = 0; p < N; p++)
            for (size_t i = 0; i < n; i++) s.expect[(size_t)p * n + i] = value(p, i, dt);
    } break;
    case C_SCATTER: case C_SCATTER_IP: {
        int root_in_b = c == C_SCATTER_IP && R == ROOT;
        s.na = (R == ROOT && !root_in_b) ? Nn : 0, s.a = s.na ? vals(Nn) : NULL;
        s.nb = root_in_b ? Nn : n, s.b = vals(s.nb), s.en = n, s.expect = vals(n);
        if (R == ROOT)
            for (size_t j = 0; j < Nn; j++) (root_in_b ? s.b : s.a)[j] = value(ROOT, j, dt);
        for (size_t i = 0; i < n; i++) s.expect[i] = value(ROOT, (size_t)R * n + i, dt);
    } break;
    case C_GATHER: case C_GATHER_IP: {
        int root_in_b = c == C_GATHER_IP && R == ROOT;
        s.na = root_in_b ? 0 : n, s.a = root_in_b ? NULL : vals(n);
        s.nb = R == ROOT ? Nn : 0, s.b = s.nb ? vals(Nn) : NULL;
        for (size_t i = 0; i < n; i++) (root_in_b ? s.b : s.a)[i] = value(R, i, dt);  // root: at the start
        s.en = R == ROOT ? Nn : 0, s.expect = vals(Nn);
        for (int p = 0; p < N; p++)
            for (size_t i = 0; i < n; i++) s.expect[(size_t)p * n + i] = value(p, i, dt);
    } break;
    case C_SENDRECV:
        s.na = n, s.a = vals(n), s.nb = n, s.b = vals(n), s.en = n, s.expect = vals(n);
        for (size_t i = 0; i < n; i++) s.a[i] = value(R, i, dt), s.expect[i] = value(prev, i, dt);
        break;
    case C_SEND_RECV: case C_ISEND_IRECV: {
        // The sender of a pair: the even rank for send/recv, the odd one for isend/irecv.
        int sender = c == C_SEND_RECV ? R % 2 == 0 : R % 2 == 1;
        s.na = n, s.a = vals(n), s.nb = n, s.b = vals(n), s.expect = vals(n);
        s.en = (partner < N && !sender) ? n : 0;
        for (size_t i = 0; i < n; i++) s.a[i] = value(R, i, dt), s.expect[i] = value(partner, i, dt);
    } break;
    default: lab_fail("bad case %d", (int)c);
    }
    return s;
}

// Runs case c on buffers a and b (both on the device, or both on the host).
static void call(CaseId c, char *a, char *b, DistDtype dt, DistOp op) {
    DistGroup *w = dist_world();
    size_t es = dist_dtype_size(dt);
    int next = (R + 1) % N, prev = (R + N - 1) % N, partner = R ^ 1;
    DistWork work;
    switch (c) {
    case C_BCAST: dist_broadcast(b, n, dt, ROOT, w); break;
    case C_IBCAST: work = dist_ibroadcast(b, n, dt, ROOT, w), dist_wait(&work); break;
    case C_AR: dist_all_reduce(a, b, n, dt, op, w); break;
    case C_AR_IP: dist_all_reduce(b, b, n, dt, op, w); break;
    case C_IAR: work = dist_iall_reduce(a, b, n, dt, op, w), dist_wait(&work); break;
    case C_REDUCE: dist_reduce(a, R == ROOT ? b : NULL, n, dt, op, ROOT, w); break;
    case C_REDUCE_IP: dist_reduce(NULL, b, n, dt, op, ROOT, w); break;
    case C_RS: dist_reduce_scatter(a, b, n, dt, op, w); break;
    case C_RS_IP: dist_reduce_scatter(b, b, n, dt, op, w); break;
    case C_RS_BLOCK: dist_reduce_scatter(b, b + (size_t)R * n * es, n, dt, op, w); break;
    case C_IRS: work = dist_ireduce_scatter(a, b, n, dt, op, w), dist_wait(&work); break;
    case C_AG: dist_all_gather(a, b, n, dt, w); break;
    case C_AG_BLOCK: dist_all_gather(b + (size_t)R * n * es, b, n, dt, w); break;
    case C_AG_START: dist_all_gather(b, b, n, dt, w); break;
    case C_IAG:
        work = dist_iall_gather(a, b, n, dt, w);
        while (!dist_test(&work)) {}
        break;
    case C_SCATTER: dist_scatter(a, b, n, dt, ROOT, w); break;
    case C_SCATTER_IP:
        if (R == ROOT) dist_scatter(b, b, n, dt, ROOT, w);
        else dist_scatter(NULL, b, n, dt, ROOT, w);
        break;
    case C_GATHER: dist_gather(a, b, n, dt, ROOT, w); break;
    case C_GATHER_IP:
        if (R == ROOT) dist_gather(b, b, n, dt, ROOT, w);
        else dist_gather(a, NULL, n, dt, ROOT, w);
        break;
    case C_SENDRECV: dist_sendrecv(a, n, next, b, n, prev, dt, 7, w); break;
    case C_SEND_RECV:
        if (partner >= N) break;
        if (R % 2 == 0) dist_send(a, n, dt, partner, 7, w);
        else dist_recv(b, n, dt, partner, 7, w);
        break;
    case C_ISEND_IRECV:
        if (partner >= N) break;
        work = R % 2 == 1 ? dist_isend(a, n, dt, partner, 7, w) : dist_irecv(b, n, dt, partner, 7, w);
        dist_wait(&work);
        break;
    case C_SPLIT_AR: dist_all_reduce(a, b, n, dt, op, early); break;
    default: lab_fail("bad case %d", (int)c);
    }
}

// Runs case c on `dev` buffers; returns err (as in the top comment) and the bytes counted.
static double run_on(Device dev, CaseId c, const Setup *s, DistDtype dt, DistOp op, uint64_t bytes[2]) {
    size_t es = dist_dtype_size(dt);
    char *host = lab_xcalloc(s->na + s->nb + 1, es);
    char *a = s->a ? mem_alloc(s->na * es, MEM_COMM, dev) : NULL;
    char *b = s->b ? mem_alloc(s->nb * es, MEM_COMM, dev) : NULL;
    if (a) {
        for (size_t i = 0; i < s->na; i++) put(host, i, dt, s->a[i]);
        mem_copy(a, host, s->na * es);
    }
    if (b) {
        for (size_t i = 0; i < s->nb; i++) put(host, i, dt, s->b[i]);
        mem_copy(b, host, s->nb * es);
    }
    dist_counters_reset();
    call(c, a, b, dt, op);
    bytes[0] = dist_bytes_sent(), bytes[1] = dist_bytes_recv();

    double err = 0, scale = 1;
    if (s->en) mem_copy(host, b + s->eoff * es, s->en * es);
    for (size_t i = 0; i < s->en; i++) {
        err = fmax(err, fabs(get(host, i, dt) - s->expect[i]));
        scale = fmax(scale, fabs(s->expect[i]));
    }
    mem_free(a);
    mem_free(b);
    free(host);
    return err / scale;
}

// The largest x over every rank.
static double world_max(double x) {
    dist_all_reduce(NULL, &x, 1, DIST_F64, DIST_MAX, dist_world());  // host buffer: over MPI
    return x;
}

static char *format_bytes(char *buf, size_t len, uint64_t b) {
    snprintf(buf, len, "%llu B", (unsigned long long)b);
    return buf;
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    N = dist_size(), R = dist_rank(), ROOT = N - 1;
    early = dist_split(dist_world(), R % 2, R, "early");  // before NCCL: its comm comes lazily
    dist_set_backend(DIST_BACKEND_NCCL);                  // picks this rank's GPU
    if (R == 0) {
        printf("nccl_check: every dist op with --backend nccl on device buffers, %d rank(s), %zu elements "
               "per block, root = rank %d\n", N, n, ROOT);
        printf("err = max |got - expected| / max(1, max |expected|), worst over dtypes, ops and ranks\n"
               "sent, recv: rank 0's bytes for f32 (sum) with NCCL; counters: NCCL's equal to those of the "
               "same op on host buffers (MPI), every rank\n\n");
        printf("%-15s %-27s %6s %10s %12s %12s %-9s %s\n", "op", "form", "checks", "err", "sent", "recv",
               "counters", "result");
    }
    int nfail = 0;
    for (int c = 0; c < C_NCASES; c++) {
        double worst = 0;
        int checks = 0, bad = 0, counters_differ = 0;
        uint64_t shown[2] = {0, 0};
        for (int dt = 0; dt < DIST_NDTYPES; dt++) {
            for (int op = 0; op < (cases[c].reduces ? 3 : 1); op++) {
                Setup s = setup((CaseId)c, (DistDtype)dt, (DistOp)op);
                uint64_t nccl_bytes[2], mpi_bytes[2];
                double err = run_on(DEV_CUDA, (CaseId)c, &s, (DistDtype)dt, (DistOp)op, nccl_bytes);
                double err_mpi = run_on(DEV_CPU, (CaseId)c, &s, (DistDtype)dt, (DistOp)op, mpi_bytes);
                double differ = (nccl_bytes[0] != mpi_bytes[0] || nccl_bytes[1] != mpi_bytes[1]) ? 1 : 0;
                err = world_max(err), err_mpi = world_max(err_mpi), differ = world_max(differ);
                double tol = tolerance((DistDtype)dt, (DistOp)op);
                if (err > tol || err_mpi > tol || differ > 0) {
                    bad++;
                    if (R == 0)
                        printf("  mismatch: %s %s, %s %s: err %.3g (MPI on host: %.3g, tolerance %.3g), "
                               "bytes sent/recv NCCL %llu/%llu vs MPI %llu/%llu\n",
                               cases[c].op, cases[c].form, dtype_name[dt], cases[c].reduces ? op_name[op] : "",
                               err, err_mpi, tol, (unsigned long long)nccl_bytes[0],
                               (unsigned long long)nccl_bytes[1], (unsigned long long)mpi_bytes[0],
                               (unsigned long long)mpi_bytes[1]);
                }
                counters_differ |= differ > 0;
                worst = fmax(worst, err);
                checks++;
                if (dt == DIST_F32 && op == DIST_SUM) shown[0] = nccl_bytes[0], shown[1] = nccl_bytes[1];
                free(s.a), free(s.b), free(s.expect);
            }
        }
        nfail += bad;
        if (R == 0) {
            char sb[32], rb[32];
            printf("%-15s %-27s %6d %10.2e %12s %12s %-9s %s\n", cases[c].op, cases[c].form, checks, worst,
                   format_bytes(sb, sizeof sb, shown[0]), format_bytes(rb, sizeof rb, shown[1]),
                   counters_differ ? "DIFFER" : "equal", bad ? "FAIL" : "ok");
        }
    }
    if (R == 0) {
        if (nfail) printf("\nFAIL: %d check(s) failed\n", nfail);
        else printf("\nOK: every check passed\n");
    }
    dist_group_free(early);
    dist_finalize();
    return nfail ? 1 : 0;
}

#endif  // LAB_CUDA
