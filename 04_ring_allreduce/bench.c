// bench.c: all-reduce bandwidth, the way nccl-tests reports it, and bytes per rank.
//
// For each message size S (bytes of one rank's buffer) and each algorithm:
//   time   mean time of one in-place all-reduce over `iters` timed calls (after `warmup`
//          untimed ones), of the slowest rank; the algorithms take `repeats` turns at this and
//          each keeps its fastest, so that a burst of other work on a shared machine hits all alike
//   algbw  S / time
//   busbw  algbw * 2(N-1)/N: the rate each rank's link must carry for an all-reduce, so it is
//          comparable across N and with a link's (here: the memory system's) bandwidth
//   #wrong elements that differ from the exact sum after the first call, over all ranks. Every
//          input is a small integer (0..7), so every sum is exact in fp32 whatever the order.
// Rows: the ring of ring.c, the pipelined ring, Open MPI's MPI_Allreduce (dist_all_reduce) and
// the naive root of naive.c; a summary puts the best lab ring against MPI and one core's memcpy.
#include "bench.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "health.h"
#include "mem.h"
#include "ring.h"

enum { ALGO_RING = 0, ALGO_PIPELINED, ALGO_MPI, ALGO_NAIVE, NALGO };
static const char *ALGO_NAME[NALGO] = {"ring", "ring pipelined", "MPI_Allreduce", "naive root"};

typedef struct Bench {
    float *buf;  // (max_count,) the all-reduce buffer
    float *tmp;  // (max_count,) naive's scratch on the root; memcpy's destination
    RingWorkspace ws;
} Bench;

static void run_algo(int algo, float *buf, size_t count, Bench *b, DistGroup *g) {
    switch (algo) {
    case ALGO_RING: ring_all_reduce(buf, count, g); break;
    case ALGO_PIPELINED: ring_all_reduce_pipelined(buf, count, &b->ws, g); break;
    case ALGO_MPI: dist_all_reduce(NULL, buf, count, DIST_F32, DIST_SUM, g); break;
    case ALGO_NAIVE: naive_all_reduce(buf, count, b->tmp, 0, g); break;
    default: LAB_CHECK(0, "bad algorithm %d", algo);
    }
}

// Rank r's element i: a small integer (0..7) that depends on i only through a 3-bit hash of i, so
// the exact sum over ranks is one of 8 values, and a chunk that lands in the wrong place shows.
static unsigned hash3(size_t i) { return (unsigned)(((uint32_t)i * 2654435761u) >> 29); }
static float input_h(int r, unsigned h) { return (float)((h + 3u * (unsigned)r) % 8u); }
static float input(int r, size_t i) { return input_h(r, hash3(i)); }

static void fill_input(float *x, size_t count, int r) {
    for (size_t i = 0; i < count; i++) x[i] = input(r, i);
}

static long count_wrong(const float *x, size_t count, DistGroup *g) {
    float want[8];
    for (unsigned h = 0; h < 8; h++) {
        want[h] = 0.0f;
        for (int r = 0; r < g->size; r++) want[h] += input_h(r, h);
    }
    long wrong = 0;
    for (size_t i = 0; i < count; i++) wrong += x[i] != want[hash3(i)];
    return wrong;
}

static double max_over_ranks(double x, DistGroup *g) {
    dist_all_reduce(NULL, &x, 1, DIST_F64, DIST_MAX, g);
    return x;
}

static long sum_over_ranks(long x, DistGroup *g) {
    double d = (double)x;
    dist_all_reduce(NULL, &d, 1, DIST_F64, DIST_SUM, g);
    return (long)d;
}

// Fill, run once, count the wrong elements (all ranks), then the rest of the warm-up calls.
static long check_and_warm_up(int algo, size_t count, const RingBenchOpts *o, Bench *b, DistGroup *g) {
    fill_input(b->buf, count, g->rank);
    run_algo(algo, b->buf, count, b, g);  // the first warm-up call is the one we check
    long wrong = sum_over_ranks(count_wrong(b->buf, count, g), g);
    for (int i = 1; i < o->warmup; i++) run_algo(algo, b->buf, count, b, g);
    return wrong;
}

// Seconds per call of `algo`: the mean of `iters` calls, on the slowest rank. Each turn starts
// from the inputs; the calls go on reducing the same buffer (sums of sums: N^iters times larger,
// the speed of an add does not depend on the values).
static double time_algo(int algo, size_t count, const RingBenchOpts *o, Bench *b, DistGroup *g) {
    fill_input(b->buf, count, g->rank);
    dist_barrier(g);
    double t0 = lab_now();
    for (int i = 0; i < o->iters; i++) run_algo(algo, b->buf, count, b, g);
    double t = (lab_now() - t0) / o->iters;
    return max_over_ranks(t, g);
}

// One core copying `bytes` while the other ranks wait: the memory system's pace for one rank.
static double memcpy_gbps(size_t bytes, const RingBenchOpts *o, Bench *b, DistGroup *g) {
    double gbps = 0.0;
    dist_barrier(g);
    if (g->rank == 0) {
        for (int i = 0; i < o->warmup; i++) memcpy(b->tmp, b->buf, bytes);
        for (int rep = 0; rep < o->repeats; rep++) {
            double t0 = lab_now();
            for (int i = 0; i < o->iters; i++) memcpy(b->tmp, b->buf, bytes);
            double x = (double)bytes / ((lab_now() - t0) / o->iters) / 1e9;
            if (x > gbps) gbps = x;
        }
    }
    dist_barrier(g);
    return max_over_ranks(gbps, g);
}

#define MAX_ROWS 64

long ring_bench(const RingBenchOpts *o, DistGroup *g) {
    int N = g->size, r0 = g->rank == 0;
    size_t sizes[MAX_ROWS];
    int nsizes = 0;
    for (size_t s = o->min_bytes; s <= o->max_bytes && nsizes < MAX_ROWS; s *= (size_t)o->step_factor) {
        sizes[nsizes++] = s / sizeof(float) * sizeof(float);
        if (s > o->max_bytes / (size_t)o->step_factor) break;
    }
    size_t max_count = sizes[nsizes - 1] / sizeof(float);
    Bench b;
    b.buf = mem_alloc(max_count * sizeof(float), MEM_OTHER, DEV_CPU);
    b.tmp = mem_alloc(max_count * sizeof(float), MEM_COMM, DEV_CPU);
    ring_workspace_init(&b.ws, o->seg_bytes);

    double factor = 2.0 * (N - 1) / N;
    double busbw[MAX_ROWS][NALGO], mem_bw[MAX_ROWS];
    long total_wrong = 0;
    if (r0) {
        printf("# in-place all-reduce of float (sum) on %d ranks, %d warm-up calls, then time = mean of %d calls on the "
               "slowest rank,\n# the fastest of %d turns (the algorithms take turns)\n", N, o->warmup, o->iters, o->repeats);
        printf("# busbw = algbw * 2(N-1)/N = algbw * %.3f; #wrong = wrong elements over all ranks after the first call\n",
               factor);
        printf("# pipelined ring: segments of %zu KiB\n#\n", o->seg_bytes / 1024);
        printf("# %12s  %12s  %5s  %5s  %-14s  %10s  %7s  %7s  %6s  %9s\n", "size", "count", "type", "redop",
               "algorithm", "time", "algbw", "busbw", "#wrong", "busbw/MPI");
        printf("# %12s  %12s  %5s  %5s  %-14s  %10s  %7s  %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
               "(GB/s)");
    }
    for (int si = 0; si < nsizes; si++) {
        size_t bytes = sizes[si], count = bytes / sizeof(float);
        double t[NALGO];
        long wrong[NALGO];
        for (int a = 0; a < NALGO; a++) {
            wrong[a] = check_and_warm_up(a, count, o, &b, g);
            total_wrong += wrong[a];
            t[a] = 1e30;
        }
        for (int rep = 0; rep < o->repeats; rep++)
            for (int a = 0; a < NALGO; a++) {
                double x = time_algo(a, count, o, &b, g);
                if (x < t[a]) t[a] = x;
            }
        for (int a = 0; a < NALGO; a++) busbw[si][a] = (double)bytes / t[a] / 1e9 * factor;
        mem_bw[si] = memcpy_gbps(bytes, o, &b, g);
        if (!r0) continue;
        for (int a = 0; a < NALGO; a++) {
            char ratio[16] = "-";
            if (N > 1) snprintf(ratio, sizeof ratio, "%.2f", busbw[si][a] / busbw[si][ALGO_MPI]);
            printf("  %12zu  %12zu  %5s  %5s  %-14s  %10.1f  %7.2f  %7.2f  %6ld  %9s\n", bytes, count, "float", "sum",
                   ALGO_NAME[a], t[a] * 1e6, (double)bytes / t[a] / 1e9, busbw[si][a], wrong[a], ratio);
        }
        fflush(stdout);
    }
    if (r0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        double ceiling = 0.8 * (N > cores ? (double)cores / N : 1.0);
        printf("#\n# summary (busbw in GB/s): the lab's rings against Open MPI's MPI_Allreduce, and one core's memcpy\n");
        printf("# %12s  %7s  %9s  %7s  %7s  %7s  %13s  %14s  %16s\n", "size (B)", "ring", "pipelined", "MPI", "naive",
               "memcpy", "pipelined/MPI", "pipelined/ring", "pipelined/memcpy");
        for (int si = 0; si < nsizes; si++) {
            char ratio[16] = "-";
            if (N > 1) snprintf(ratio, sizeof ratio, "%.2f", busbw[si][ALGO_PIPELINED] / busbw[si][ALGO_MPI]);
            printf("  %12zu  %7.2f  %9.2f  %7.2f  %7.2f  %7.2f  %13s  %14.2f  %16.2f\n", sizes[si], busbw[si][ALGO_RING],
                   busbw[si][ALGO_PIPELINED], busbw[si][ALGO_MPI], busbw[si][ALGO_NAIVE], mem_bw[si], ratio,
                   busbw[si][ALGO_PIPELINED] / busbw[si][ALGO_RING], busbw[si][ALGO_PIPELINED] / mem_bw[si]);
        }
        printf("# pipelined/ring: no allocation per call (the ring's fresh tmp costs a page fault per 4 KiB), each\n"
               "#   segment added while still in cache, the next segment in flight meanwhile, and the add asks for\n"
               "#   the lines it will write one 4 KiB block ahead (ring_add in ring_pipelined.c)\n");
        printf("# pipelined/memcpy: a byte received costs memory traffic 3 in the scatter-reduce (read the sender's copy,\n"
               "#   read and write our own) and 2 in the all-gather (read, write): 2.5 per busbw byte, against 2 per\n"
               "#   byte of memcpy, so at most 0.8 with a core per rank; %d ranks on %ld cores here: at most %.2f\n",
               N, cores, ceiling);
        printf("# all rows correct: %s (%ld wrong elements)\n", total_wrong == 0 ? "yes" : "NO", total_wrong);
        char note[512];
        if (*health_cores_note(note, sizeof note, 1, "the times and bandwidths above"))
            printf("# %s\n", note);
    }
    ring_workspace_free(&b.ws);
    mem_free(b.buf);
    mem_free(b.tmp);
    return total_wrong;
}

// ---------------------------------------------------------------------------------------------
// bytes per rank

typedef struct { uint64_t sent, recv; } Moved;

static Moved measure(int algo, float *buf, size_t count, Bench *b, DistGroup *g) {
    const DistCounters *c = dist_counters();
    uint64_t s0 = c->sent[OP_SEND], r0 = c->recv[OP_RECV];
    fill_input(buf, count, g->rank);
    run_algo(algo, buf, count, b, g);
    Moved m = {c->sent[OP_SEND] - s0, c->recv[OP_RECV] - r0};
    return m;
}

int ring_bytes_table(size_t bytes, size_t seg_bytes, DistGroup *g) {
    int N = g->size, r = g->rank;
    size_t count = bytes / sizeof(float) / (size_t)N * (size_t)N;  // N divides it: the formulas are exact
    if (count == 0) count = (size_t)N;
    uint64_t S = count * sizeof(float);
    Bench b;
    b.buf = mem_alloc(count * sizeof(float), MEM_OTHER, DEV_CPU);
    b.tmp = mem_alloc(count * sizeof(float), MEM_COMM, DEV_CPU);
    ring_workspace_init(&b.ws, seg_bytes);
    Moved m[3] = {measure(ALGO_RING, b.buf, count, &b, g), measure(ALGO_PIPELINED, b.buf, count, &b, g),
                  measure(ALGO_NAIVE, b.buf, count, &b, g)};
    // the formulas
    uint64_t ring = 2 * (uint64_t)(N - 1) * S / (uint64_t)N;
    uint64_t naive = r == 0 ? (uint64_t)(N - 1) * S : (N > 1 ? S : 0);
    int ok = m[0].sent == ring && m[0].recv == ring && m[1].sent == ring && m[1].recv == ring &&
             m[2].sent == naive && m[2].recv == naive;
    uint64_t mine[7] = {m[0].sent, m[0].recv, m[1].sent, m[1].recv, m[2].sent, m[2].recv, (uint64_t)ok};
    uint64_t *all = r == 0 ? lab_xmalloc((size_t)N * sizeof mine) : NULL;
    dist_gather(mine, all, 7 * sizeof(uint64_t), DIST_U8, 0, g);
    int any_bad = !ok;
    dist_all_reduce(NULL, &any_bad, 1, DIST_I32, DIST_MAX, g);
    if (r == 0) {
        char sbuf[32];
        printf("bytes each rank sends / receives in one all-reduce of S = %s on N = %d ranks\n",
               mem_format(sbuf, sizeof sbuf, (double)S), N);
        printf("(measured with the dist counters of send/recv, which count the bytes really passed; each cell:\n"
               " sent / received)\n");
        printf("  %-6s  %21s  %21s  %21s\n", "rank", "ring", "ring pipelined", "naive (root rank 0)");
        for (int rr = 0; rr < N; rr++) {
            uint64_t *x = all + (size_t)rr * 7;
            char cell[3][48];
            for (int k = 0; k < 3; k++) {
                char a[16], c[16];
                mem_format(a, sizeof a, (double)x[2 * k]);
                mem_format(c, sizeof c, (double)x[2 * k + 1]);
                snprintf(cell[k], sizeof cell[k], "%s / %s", a, c);
            }
            printf("  %-6d  %21s  %21s  %21s\n", rr, cell[0], cell[1], cell[2]);
        }
        char f1[16], f2[16], f3[16];
        mem_format(f1, sizeof f1, (double)(2 * (uint64_t)(N - 1) * S / (uint64_t)N));
        mem_format(f2, sizeof f2, (double)((uint64_t)(N - 1) * S));
        mem_format(f3, sizeof f3, (double)(N > 1 ? S : 0));
        printf("  formula: ring 2(N-1)/N * S = %s each way on every rank; naive (N-1) * S = %s each way\n"
               "           through the root, S = %s on the others\n", f1, f2, f3);
        printf("  measured == formula on every rank: %s\n", any_bad ? "NO" : "yes");
        free(all);
    }
    ring_workspace_free(&b.ws);
    mem_free(b.buf);
    mem_free(b.tmp);
    return !any_bad;
}

size_t ring_parse_size(const char *s) {
    char *end = NULL;
    if (!s || !isdigit((unsigned char)*s)) return 0;
    unsigned long long v = strtoull(s, &end, 10);
    size_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024 * 1024 * 1024, end++;
    if (*end != '\0') return 0;
    return (size_t)v * mult;
}
