// mpi_ring.c: the ring all-reduce of 04_ring_allreduce against the library, phase by phase,
// and the bytes each rank moves against the formulas.
//
// Launched by tests/test_04_ring.c as
//   mpirun -np N build/tests/mpi_ring <what>...
// with <what> among
//   scatter-reduce   ring_scatter_reduce alone: chunk (r+1) mod N is the library's sum
//   all-gather       ring_all_gather alone, from buffers that hold only chunk (r+1) mod N
//   pipelined-phase  ring_scatter_reduce_pipelined alone, for several segment sizes, and its add
//                    (ring_add) against the plain loop
//   all-reduce       ring_all_reduce and ring_all_reduce_pipelined, whole
//   naive            naive_all_reduce, every root
// on N = 1..8, for counts 0, 1, N-1 (fewer than N), N+1 and 3N+2 (not divisible), 4N and
// (1<<18)+3 (large), on the world and on a split group (odd and even ranks apart, in reverse
// order). Inputs are small integers that differ by rank and call, so sums are exact in fp32,
// results are compared bit for bit and a missing contribution shows. A chunk the phase must not
// touch is checked too. Bytes (dist counters of OP_SEND / OP_RECV, real bytes) are checked
// against the formulas written out below. Prints one summary line:
//   mpi_ring: <what> on N ranks: C checks, F failed
// and exits 1 when F > 0.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "mpitest.h"
#include "mem.h"
#include "ring.h"

static int salt = 0;

static float input(int r, size_t i) {
    return (float)((((size_t)r * 5 + i * 7 + (size_t)salt * 3) % 13) + (size_t)r % 3);
}

static float *alloc_f(size_t n) { return lab_xmalloc((n ? n : 1) * sizeof(float)); }

static void fill_input(float *x, size_t n, int r) {
    for (size_t i = 0; i < n; i++) x[i] = input(r, i);
}

// Written here, not taken from ring.c: chunk c is [start(c), start(c+1)), the first count % N
// chunks one element longer.
static size_t cstart(size_t count, int N, int c) {
    size_t q = count / (size_t)N, extra = count % (size_t)N;
    return (size_t)c * q + ((size_t)c < extra ? (size_t)c : extra);
}
static size_t clen(size_t count, int N, int c) { return cstart(count, N, c + 1) - cstart(count, N, c); }

// got[from, from+n) against want[from, from+n), bit for bit.
static void check_range(const char *what, const char *part, size_t count, const float *got, const float *want,
                        size_t from, size_t n, DistGroup *g) {
    for (size_t i = from; i < from + n; i++) {
        if (got[i] != want[i]) {
            mpi_check(0, "%s count %zu on %s (rank %d of %d): %s, element %zu is %g, want %g", what, count, g->name,
                      g->rank, g->size, part, i, (double)got[i], (double)want[i]);
            return;
        }
    }
    mpi_check(1, "%s", part);
}

// The library's all-reduce of this call's inputs.
static float *library_sum(size_t count, DistGroup *g) {
    float *x = alloc_f(count), *sum = alloc_f(count);
    fill_input(x, count, g->rank);
    dist_all_reduce(x, sum, count, DIST_F32, DIST_SUM, g);
    free(x);
    return sum;
}

// ---------------------------------------------------------------------------------------------

// After phase 1 only chunk (r+1) mod N is defined (the others hold partial sums whose order is
// the algorithm's business): it must be the library's sum, bit for bit.
static void check_scatter_reduce_result(const char *what, size_t count, const float *buf, const float *sum,
                                        DistGroup *g) {
    int own = (g->rank + 1) % g->size;
    check_range(what, "the chunk (r+1) mod N this rank ends with", count, buf, sum, cstart(count, g->size, own),
                clen(count, g->size, own), g);
}

static void test_scatter_reduce(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *sum = library_sum(count, g);
    float *buf = alloc_f(count), *tmp = alloc_f(clen(count, N, 0));
    fill_input(buf, count, r);
    mpi_bytes_mark();
    ring_scatter_reduce(buf, count, tmp, g, NULL);
    // Rank r sends every chunk but (r+1) mod N (the one it ends with) and receives every chunk
    // but r (the one it starts the ring with), each once.
    mpi_check_bytes("ring_scatter_reduce", count, (count - clen(count, N, (r + 1) % N)) * 4,
                (count - clen(count, N, r)) * 4, g);
    check_scatter_reduce_result("ring_scatter_reduce", count, buf, sum, g);
    free(sum);
    free(buf);
    free(tmp);
}

static void test_pipelined_phase(size_t count, size_t seg_elems, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *sum = library_sum(count, g);
    float *buf = alloc_f(count);
    fill_input(buf, count, r);
    RingWorkspace ws;
    ring_workspace_init(&ws, seg_elems * sizeof(float));
    size_t comm_before = mem_current(MEM_COMM), peak_before = mem_total_peak();
    mpi_bytes_mark();
    ring_scatter_reduce_pipelined(buf, count, &ws, g);
    mpi_check_bytes("ring_scatter_reduce_pipelined", count, (count - clen(count, N, (r + 1) % N)) * 4,
                (count - clen(count, N, r)) * 4, g);
    mpi_check(mem_current(MEM_COMM) == comm_before && mem_total_peak() == peak_before,
              "ring_scatter_reduce_pipelined allocated memory in the call (it must use its workspace)");
    char what[96];
    snprintf(what, sizeof what, "ring_scatter_reduce_pipelined (segment %zu floats)", seg_elems);
    check_scatter_reduce_result(what, count, buf, sum, g);
    ring_workspace_free(&ws);
    free(sum);
    free(buf);
}

// ring_add (the pipelined scatter-reduce's add, in blocks of 4 KiB with the next block's lines
// prefetched) against the plain loop, for lengths around the block size, and nothing written
// past the end (sentinels follow acc).
static void test_ring_add(void) {
    size_t lens[] = {0, 1, 15, 17, 1023, 1024, 1025, 2048, 2049, 5000};
    enum { GUARD = 64 };
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        size_t n = lens[k];
        float *acc = alloc_f(n + GUARD), *in = alloc_f(n), *want = alloc_f(n + GUARD);
        for (size_t i = 0; i < n + GUARD; i++) acc[i] = want[i] = (float)(i % 11);
        for (size_t i = 0; i < n; i++) in[i] = (float)(i % 7 + 1);
        for (size_t i = 0; i < n; i++) want[i] += in[i];
        ring_add(acc, in, n);
        size_t bad = n + GUARD;
        for (size_t i = 0; i < n + GUARD && bad == n + GUARD; i++)
            if (acc[i] != want[i]) bad = i;
        mpi_check(bad == n + GUARD, "ring_add of %zu floats: element %zu is %g, want %g%s", n, bad,
                  bad < n + GUARD ? (double)acc[bad] : 0.0, bad < n + GUARD ? (double)want[bad] : 0.0,
                  bad >= n && bad < n + GUARD ? " (written past the end)" : "");
        free(acc);
        free(in);
        free(want);
    }
}

static void test_all_gather(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    // The finished sums every rank should end with; this rank starts with only its chunk of
    // them, (r+1) mod N, and garbage (NaN) elsewhere.
    float *want = library_sum(count, g);
    float *buf = alloc_f(count);
    for (size_t i = 0; i < count; i++) buf[i] = NAN;
    int own = (r + 1) % N;
    memcpy(buf + cstart(count, N, own), want + cstart(count, N, own), clen(count, N, own) * sizeof(float));
    mpi_bytes_mark();
    ring_all_gather(buf, count, g, NULL);
    // Rank r sends every chunk but (r+2) mod N (the last one it receives) and receives every
    // chunk but (r+1) mod N (the one it had).
    mpi_check_bytes("ring_all_gather", count, (count - clen(count, N, (r + 2) % N)) * 4,
                (count - clen(count, N, own)) * 4, g);
    check_range("ring_all_gather", "the whole buffer", count, buf, want, 0, count, g);
    free(want);
    free(buf);
}

static void test_all_reduce(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *want = library_sum(count, g);
    float *buf = alloc_f(count);
    // phase 1 + phase 2: sends all but chunk r+1, then all but r+2; receives all but r, then all but r+1
    uint64_t sent = (2 * count - clen(count, N, (r + 1) % N) - clen(count, N, (r + 2) % N)) * 4;
    uint64_t recv = (2 * count - clen(count, N, r) - clen(count, N, (r + 1) % N)) * 4;
    if (N == 1) sent = recv = 0;
    fill_input(buf, count, r);
    mpi_bytes_mark();
    ring_all_reduce(buf, count, g);
    mpi_check_bytes("ring_all_reduce", count, sent, recv, g);
    if (count % (size_t)N == 0)  // the notes' 2(N-1)/N * S, exactly
        mpi_check(sent == 2ull * (uint64_t)(N - 1) * count * 4 / (uint64_t)N, "ring bytes %llu != 2(N-1)/N*S",
                  (unsigned long long)sent);
    check_range("ring_all_reduce", "the whole buffer", count, buf, want, 0, count, g);

    size_t segs[] = {1, 1000, 1u << 16};
    for (size_t k = 0; k < 3; k++) {
        if (segs[k] == 1 && count > 1000) continue;  // a message per float: too slow for large counts
        RingWorkspace ws;
        ring_workspace_init(&ws, segs[k] * sizeof(float));
        fill_input(buf, count, r);
        mpi_bytes_mark();
        ring_all_reduce_pipelined(buf, count, &ws, g);
        mpi_check_bytes("ring_all_reduce_pipelined", count, sent, recv, g);
        check_range("ring_all_reduce_pipelined", "the whole buffer", count, buf, want, 0, count, g);
        // again with the same workspace: nothing left over from the last call may matter
        fill_input(buf, count, r);
        ring_all_reduce_pipelined(buf, count, &ws, g);
        check_range("ring_all_reduce_pipelined (second call)", "the whole buffer", count, buf, want, 0, count, g);
        ring_workspace_free(&ws);
    }
    free(want);
    free(buf);
}

static void test_naive(size_t count, DistGroup *g) {
    int r = g->rank, N = g->size;
    float *want = library_sum(count, g);
    float *buf = alloc_f(count), *tmp = alloc_f(count);
    int roots[2] = {0, N - 1};
    for (int k = 0; k < (N > 1 ? 2 : 1); k++) {
        int root = roots[k];
        fill_input(buf, count, r);
        mpi_bytes_mark();
        naive_all_reduce(buf, count, tmp, root, g);
        uint64_t S = count * 4;
        uint64_t through = r == root ? (uint64_t)(N - 1) * S : S;  // (N-1)*S through the root
        mpi_check_bytes("naive_all_reduce", count, through, through, g);
        check_range("naive_all_reduce", "the whole buffer", count, buf, want, 0, count, g);
    }
    free(want);
    free(buf);
    free(tmp);
}

// ---------------------------------------------------------------------------------------------

static const char *KINDS[] = {"scatter-reduce", "all-gather", "pipelined-phase", "all-reduce", "naive"};
#define NKINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

static void run_kind(int kind, DistGroup *g) {
    int N = g->size;
    if (kind == 2) test_ring_add();  // the pipelined phase's add on its own (no communication)
    size_t counts[] = {0, 1, (size_t)(N > 1 ? N - 1 : 2), (size_t)N + 1, 3 * (size_t)N + 2, 4 * (size_t)N,
                       (1u << 18) + 3};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        size_t count = counts[c];
        salt++;
        switch (kind) {
        case 0: test_scatter_reduce(count, g); break;
        case 1: test_all_gather(count, g); break;
        case 2: {
            // segments of 1 float, of 3 (chunks straddle segments), and larger than any chunk
            size_t segs[] = {1, 3, 1000, 1u << 20};
            for (size_t k = 0; k < 4; k++) {
                if (segs[k] < 1000 && count > 1000) continue;
                salt++;
                test_pipelined_phase(count, segs[k], g);
            }
        } break;
        case 3: test_all_reduce(count, g); break;
        case 4: test_naive(count, g); break;
        default: break;
        }
    }
}

int main(int argc, char **argv) {
    return mpi_test_main(argc, argv, "mpi_ring",
                         "usage: mpi_ring <what>... (scatter-reduce all-gather pipelined-phase "
                         "all-reduce naive)",
                         KINDS, NKINDS, run_kind);
}
