// bench_watchdog.c: what the collective watchdog (common/watchdog.h) costs per dist op.
//
//   mpirun -np 2 build/tools/bench_watchdog [--ops N] [--runs R]
//
// The watchdog is started (as --collective-timeout 60 would), then runs of N ops alternate with
// its recording off and on (watchdog_on: what --collective-timeout 0 leaves off), R runs of
// each, so the machine's drift shows in both alike. Three ops:
//   record   the bookkeeping alone: the op's record begins and ends, no MPI (rank 0 only);
//   barrier  dist_barrier on the world: the shortest collective (its waits are all latency);
//   send     a ping-pong of 4 bytes between ranks 0 and 1 (dist_send / dist_recv), per message.
// Each line: the median ns/op off and on, [min .. max] over the runs, and on/off with the range
// of the per-pair ratios (run k off against run k on). A shared machine is noisy: read the
// ratios, not the absolute times.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "watchdog.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    double *s = lab_xmalloc((size_t)n * sizeof(double));
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

static double lo(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static double hi(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

enum { REC, BARRIER, SEND, NOPS };
static const char *names[NOPS] = {"record (no MPI)", "barrier", "send/recv 4 B"};

// ns per op of n ops of kind k, on every rank (rank 0's figure is reported)
static double run(int k, int n, DistGroup *w) {
    int x = 0;
    dist_barrier(w);
    double t0 = lab_now();
    for (int i = 0; i < n; i++) {
        if (k == REC) {
            if (w->rank == 0 && watchdog_on)
                watchdog_op_end(watchdog_op_begin(w, OP_BARRIER, -1, (uint64_t)i + 1, -1, 0, 0, 0), WD_CALLER);
        } else if (k == BARRIER) {
            dist_barrier(w);
        } else if (w->rank == 0) {
            dist_send(&x, 1, DIST_I32, 1, 3, w);
            dist_recv(&x, 1, DIST_I32, 1, 3, w);
        } else if (w->rank == 1) {
            dist_recv(&x, 1, DIST_I32, 0, 3, w);
            dist_send(&x, 1, DIST_I32, 0, 3, w);
        }
    }
    double ns = 1e9 * (lab_now() - t0) / n / (k == SEND ? 2 : 1);
    dist_broadcast(&ns, 1, DIST_F64, 0, w);
    return ns;
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    int n = 20000, runs = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--ops") == 0) n = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
        else lab_fail_collective("bench_watchdog: unknown option %s (--ops N, --runs R)", argv[i]);
    }
    if (n < 1 || runs < 1 || runs > 100) lab_fail_collective("bench_watchdog: --ops >= 1, --runs 1 .. 100");
    DistGroup *w = dist_world();
    if (w->size < 2) lab_fail_collective("bench_watchdog: run it on 2 ranks or more (mpirun -np 2): one rank has no watchdog");
    watchdog_start(60.0);
    if (w->rank == 0)
        printf("bench_watchdog: %d ranks, %d ops per run, %d runs off and on, alternating (ns per op, rank 0)\n",
               w->size, n, runs);
    for (int k = 0; k < NOPS; k++) {
        double off[100], on[100], ratio[100];
        run(k, n / 10, w);  // warm-up
        for (int r = 0; r < runs; r++) {
            watchdog_on = 0;
            off[r] = run(k, n, w);
            watchdog_on = 1;
            on[r] = run(k, n, w);
            ratio[r] = on[r] / off[r];
        }
        if (w->rank != 0) continue;
        if (k == REC) {
            printf("  %-16s  off %8.1f  on %8.1f ns/op [%.1f .. %.1f]: the recording's own cost\n", names[k],
                   median(off, runs), median(on, runs), lo(on, runs), hi(on, runs));
            continue;
        }
        printf("  %-16s  off %8.1f [%.1f .. %.1f]  on %8.1f [%.1f .. %.1f] ns/op  on/off %.3f [%.3f .. %.3f]\n",
               names[k], median(off, runs), lo(off, runs), hi(off, runs), median(on, runs), lo(on, runs),
               hi(on, runs), median(ratio, runs), lo(ratio, runs), hi(ratio, runs));
    }
    fflush(stdout);
    dist_finalize();
    return 0;
}
