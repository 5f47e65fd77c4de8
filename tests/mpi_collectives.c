// mpi_collectives.c: the send/recv collectives of 01_primitives/collectives.c against the
// library's (dist_* over MPI), and the bytes they move against each algorithm's formula.
//
// Launched by tests/test_01_primitives.c as
//   mpirun -np N build/tests/mpi_collectives <what>...
// with <what> among broadcast reduce scatter gather reduce-scatter all-gather all-reduce, on
// N = 1..8. For counts 0, 1, N-1, N+1, 3N+2 and (1<<18) + 3, every root for the rooted ones
// (N <= 4; else 0, a middle one and N-1), on the world and on a split group (odd ranks and even
// ranks apart, in reverse order). Inputs are small integers, different on every rank and in
// every call, so sums are exact in fp32 whatever the order, a missing contribution or a stale
// buffer shows, and results are compared bit for bit. Prints one summary line:
//   mpi_collectives: <what> on N ranks: C checks, F failed
// and exits 1 when F > 0.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "collectives.h"
#include "dist.h"
#include "mpitest.h"

static int salt = 0;  // changes every call

// Element i of group rank r's input: a small integer (0..20).
static float input(int r, size_t i) {
    return (float)((((size_t)r * 7 + i * 3 + (size_t)salt * 5) % 17) + (size_t)r % 4);
}

static float *alloc_f(size_t n) { return lab_xmalloc((n ? n : 1) * sizeof(float)); }

static void fill_input(float *x, size_t n, int r) {
    for (size_t i = 0; i < n; i++) x[i] = input(r, i);
}

static void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

// First index where a and b differ (bitwise equal floats, or both NaN), or n.
static size_t first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) return i;
    return n;
}

static void report_diff(const char *what, size_t count, int root, const float *got, const float *want, size_t n,
                        DistGroup *g) {
    size_t i = first_diff(got, want, n);
    mpi_check(i == n, "%s count %zu root %d on %s (rank %d of %d): element %zu is %g, the library gives %g", what,
              count, root, g->name, g->rank, g->size, i, i < n ? (double)got[i] : 0.0, i < n ? (double)want[i] : 0.0);
}

// ---------------------------------------------------------------------------------------------
// one check per collective; E = 4 bytes per element

static void check_broadcast(size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *got = alloc_f(count), *want = alloc_f(count);
    fill_input(got, count, r);  // every rank starts with its own values: a missed recv shows
    memcpy(want, got, count * sizeof(float));
    dist_broadcast(want, count, DIST_F32, root, g);
    mpi_bytes_mark();
    prim_broadcast(got, count, root, g);
    uint64_t S = count * 4;
    mpi_check_bytes("prim_broadcast", count, r == root ? (uint64_t)(N - 1) * S : 0, r == root ? 0 : S, g);
    report_diff("prim_broadcast", count, root, got, want, count, g);
    free(got);
    free(want);
}

static void check_reduce(size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *x = alloc_f(count), *got = alloc_f(count), *want = alloc_f(count);
    fill_input(x, count, r);
    fill_nan(got, count);
    fill_nan(want, count);
    dist_reduce(x, want, count, DIST_F32, DIST_SUM, root, g);
    float *x_copy = alloc_f(count);
    memcpy(x_copy, x, count * sizeof(float));
    mpi_bytes_mark();
    prim_reduce(x, r == root ? got : NULL, count, root, g);
    uint64_t S = count * 4;
    mpi_check_bytes("prim_reduce", count, r == root ? 0 : S, r == root ? (uint64_t)(N - 1) * S : 0, g);
    mpi_check(first_diff(x, x_copy, count) == count, "prim_reduce count %zu changed its input on rank %d", count, r);
    if (r == root) report_diff("prim_reduce", count, root, got, want, count, g);
    // the in-place form at the root: send == recv
    fill_input(x, count, r);
    prim_reduce(x, r == root ? x : NULL, count, root, g);
    if (r == root) report_diff("prim_reduce (in place)", count, root, x, want, count, g);
    free(x);
    free(x_copy);
    free(got);
    free(want);
}

static void check_scatter(size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    size_t total = count * (size_t)N;
    float *src = alloc_f(total), *got = alloc_f(count), *want = alloc_f(count);
    fill_input(src, total, r);  // only the root's matters
    fill_nan(got, count);
    fill_nan(want, count);
    dist_scatter(src, want, count, DIST_F32, root, g);
    mpi_bytes_mark();
    prim_scatter(src, got, count, root, g);
    uint64_t B = count * 4;
    mpi_check_bytes("prim_scatter", count, r == root ? (uint64_t)(N - 1) * B : 0, r == root ? 0 : B, g);
    report_diff("prim_scatter", count, root, got, want, count, g);
    free(src);
    free(got);
    free(want);
}

static void check_gather(size_t count, int root, DistGroup *g) {
    int r = g->rank, N = g->size;
    size_t total = count * (size_t)N;
    float *x = alloc_f(count), *got = alloc_f(total), *want = alloc_f(total);
    fill_input(x, count, r);
    fill_nan(got, total);
    fill_nan(want, total);
    dist_gather(x, want, count, DIST_F32, root, g);
    mpi_bytes_mark();
    prim_gather(x, got, count, root, g);
    uint64_t B = count * 4;
    mpi_check_bytes("prim_gather", count, r == root ? 0 : B, r == root ? (uint64_t)(N - 1) * B : 0, g);
    if (r == root) report_diff("prim_gather", total, root, got, want, total, g);
    free(x);
    free(got);
    free(want);
}

// Independent of collectives.c: the first count % N blocks are one longer.
static size_t block_start(size_t count, int N, int i) {
    size_t q = count / (size_t)N, extra = count % (size_t)N;
    return (size_t)i * q + ((size_t)i < extra ? (size_t)i : extra);
}
static size_t block_len(size_t count, int N, int i) { return block_start(count, N, i + 1) - block_start(count, N, i); }

static void check_reduce_scatter(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *got = alloc_f(count), *want = alloc_f(count), *orig = alloc_f(count);
    fill_input(got, count, r);
    memcpy(orig, got, count * sizeof(float));
    size_t start = block_start(count, N, r), len = block_len(count, N, r);
    if (count % (size_t)N == 0) {
        // the library's reduce-scatter: block r of the sum lands in recv
        float *blk = alloc_f(len);
        dist_reduce_scatter(orig, blk, count / (size_t)N, DIST_F32, DIST_SUM, g);
        memcpy(want, orig, count * sizeof(float));
        memcpy(want + start, blk, len * sizeof(float));
        free(blk);
    } else {
        // blocks of unequal length: block r of the library's all-reduce
        float *sum = alloc_f(count);
        dist_all_reduce(orig, sum, count, DIST_F32, DIST_SUM, g);
        memcpy(want, orig, count * sizeof(float));
        memcpy(want + start, sum + start, len * sizeof(float));
        free(sum);
    }
    mpi_bytes_mark();
    prim_reduce_scatter(got, count, g);
    mpi_check_bytes("prim_reduce_scatter", count, (count - len) * 4, (uint64_t)(N - 1) * len * 4, g);
    // block r is the sum, and the other blocks are as they were
    report_diff("prim_reduce_scatter", count, -1, got, want, count, g);
    free(got);
    free(want);
    free(orig);
}

static void check_all_gather(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    size_t start = block_start(count, N, r), len = block_len(count, N, r);
    float *got = alloc_f(count), *want = alloc_f(count);
    // every rank's full input; only its own block is the piece it contributes
    fill_input(want, count, r);
    fill_nan(got, count);
    memcpy(got + start, want + start, len * sizeof(float));
    if (count % (size_t)N == 0) {
        dist_all_gather(got + start, want, len, DIST_F32, g);
    } else {
        // unequal blocks: each rank contributes its block into zeros, the library sums them
        float *piece = alloc_f(count);
        for (size_t i = 0; i < count; i++) piece[i] = 0.0f;
        memcpy(piece + start, got + start, len * sizeof(float));
        dist_all_reduce(piece, want, count, DIST_F32, DIST_SUM, g);
        free(piece);
    }
    mpi_bytes_mark();
    prim_all_gather(got, count, g);
    mpi_check_bytes("prim_all_gather", count, (uint64_t)(N - 1) * len * 4, (count - len) * 4, g);
    report_diff("prim_all_gather", count, -1, got, want, count, g);
    free(got);
    free(want);
}

static void check_all_reduce(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *got = alloc_f(count), *want = alloc_f(count);
    fill_input(got, count, r);
    memcpy(want, got, count * sizeof(float));
    dist_all_reduce(NULL, want, count, DIST_F32, DIST_SUM, g);
    mpi_bytes_mark();
    prim_all_reduce(got, count, g);
    size_t len = block_len(count, N, r);
    uint64_t moved = ((count - len) + (uint64_t)(N - 1) * len) * 4;
    mpi_check_bytes("prim_all_reduce", count, moved, moved, g);
    if (count % (size_t)N == 0)  // the notes' formula, exactly
        mpi_check(moved == 2ull * (uint64_t)(N - 1) * count * 4 / (uint64_t)N, "all-reduce bytes %llu != 2(N-1)/N*S",
                  (unsigned long long)moved);
    report_diff("prim_all_reduce", count, -1, got, want, count, g);
    free(got);
    free(want);
}

// ---------------------------------------------------------------------------------------------

static const char *KINDS[] = {"broadcast", "reduce", "scatter", "gather", "reduce-scatter", "all-gather", "all-reduce"};
#define NKINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

static void run_kind(int kind, DistGroup *g) {
    int N = g->size;
    size_t counts[] = {0, 1, (size_t)(N > 1 ? N - 1 : 2), (size_t)N + 1, 3 * (size_t)N + 2, (1u << 18) + 3};
    int roots[3] = {0, N / 2, N - 1}, nroots = N < 3 ? N : 3;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        size_t count = counts[c];
        // the rooted ones scatter/gather count per rank: keep the largest case at ~4 MiB total
        size_t per_rank = count > 1000 ? count / (size_t)N : count;
        for (int k = 0; k < nroots; k++) {
            salt++;
            switch (kind) {
            case 0: check_broadcast(count, roots[k], g); break;
            case 1: check_reduce(count, roots[k], g); break;
            case 2: check_scatter(per_rank, roots[k], g); break;
            case 3: check_gather(per_rank, roots[k], g); break;
            default: break;
            }
        }
        salt++;
        if (kind == 4) check_reduce_scatter(count, g);
        if (kind == 5) check_all_gather(count, g);
        if (kind == 6) check_all_reduce(count, g);
    }
}

int main(int argc, char **argv) {
    return mpi_test_main(argc, argv, "mpi_collectives",
                         "usage: mpi_collectives <what>... (broadcast reduce scatter gather "
                         "reduce-scatter all-gather all-reduce)",
                         KINDS, NKINDS, run_kind);
}
