// mpi_links.c: the virtual links (common/dist_link.c) on 4 ranks in 2 virtual nodes of 2.
//
// Launched by tests/test_links.c as `mpirun -np 4 build/tests/mpi_links`. The links are slow
// on purpose (inside a node 1 GB/s and 100 us, between nodes 10 MB/s and 1 ms), so each op's
// hold is milliseconds, far above this machine's own cost of moving the bytes. Checks:
//   - the modelled clock: each op's held seconds (dist_link_held_seconds) are the alpha-beta
//     formula, bytes / bw + hops x latency, on the link the op crosses, to 1e-9 relative;
//   - the wall clock: a message of n bytes to a rank on the other node arrives no sooner than
//     the model's time after it was sent, and an all-reduce over both nodes takes at least its
//     time (a lower bound only: a loaded machine may be slower, never faster);
//   - the data: every result is the same bits as without the links.
// Prints "mpi_links: on 4 ranks: C checks, F failed".
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "mpitest.h"

static double now(void) { return lab_now(); }

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    const int W = dist_size(), r = dist_rank();
    LAB_CHECK(W == 4, "mpi_links runs on 4 ranks (2 virtual nodes of 2), not %d", W);
    DistLinks l;
    const char *err = dist_links_parse("2:1,100:0.01,1000", &l, 0);
    LAB_CHECK(err == NULL, "%s", err);
    dist_links_set(&l);
    if (r == 0) dist_links_print(stdout);
    DistGroup *w = dist_world();
    const DistLink intra = {1e9, 100e-6}, inter = {1e7, 1e-3};
    mpi_check(dist_group_nodes(w) == 2, "the world spans %d nodes, not 2", dist_group_nodes(w));

    // 1. point to point: rank 0 sends n bytes to rank 2 (the other node), then to rank 1 (its own)
    const size_t n = 100000;
    unsigned char *buf = lab_xcalloc(n, 1);
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 7 + 3);
    const double t_inter = (double)n / inter.bw + inter.lat, t_intra = (double)n / intra.bw + intra.lat;
    for (int pass = 0; pass < 2; pass++) {
        int dst = pass == 0 ? 2 : 1;
        dist_barrier(w);
        dist_link_held_reset(w);
        double t0 = now();   // the ranks left the barrier together (to within its hold)
        if (r == 0) {
            dist_send(buf, n, DIST_U8, dst, 5, w);
            double want = pass == 0 ? t_inter : t_intra;
            double got = dist_link_held_seconds(w);
            mpi_check(fabs(got - want) <= 1e-9 * want, "send of %zu bytes to rank %d: held %.9g s, "
                      "the model says %.9g s", n, dst, got, want);
        } else if (r == dst) {
            unsigned char *in = lab_xcalloc(n, 1);
            dist_recv(in, n, DIST_U8, 0, 5, w);
            double took = now() - t0, want = pass == 0 ? t_inter : t_intra;
            mpi_check(took >= want, "%zu bytes from rank 0 to rank %d (%s) arrived after %.6f s, "
                      "before the model's %.6f s", n, dst, pass == 0 ? "between nodes" : "inside a node",
                      took, want);
            mpi_check(memcmp(in, buf, n) == 0, "the message to rank %d changed on the way", dst);
            free(in);
        }
    }

    // 2. an all-reduce over both nodes: the slowest link (between), 2(n-1)/n S bytes, 2(n-1) hops
    const size_t count = 25000;   // 100 kB of fp32
    float *x = lab_xcalloc(count, sizeof(float));
    for (size_t i = 0; i < count; i++) x[i] = (float)((int)((i + (size_t)r) % 17) - 8);
    dist_barrier(w);
    dist_link_held_reset(w);
    double t0 = now();
    dist_all_reduce(x, x, count, DIST_F32, DIST_SUM, w);
    double took = now() - t0;
    double S = (double)count * 4, want = floor(2.0 * (W - 1) * S / W) / inter.bw + 2.0 * (W - 1) * inter.lat;
    double got = dist_link_held_seconds(w);
    mpi_check(fabs(got - want) <= 1e-9 * want, "all-reduce of %.0f bytes on 4 ranks in 2 nodes: held "
              "%.9g s, the model says %.9g s", S, got, want);
    mpi_check(took >= want, "all-reduce took %.6f s, less than the model's %.6f s", took, want);
    int exact = 1;
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int q = 0; q < W; q++) s += (float)((int)((i + (size_t)q) % 17) - 8);
        exact &= x[i] == s;
    }
    mpi_check(exact, "the all-reduce's sums differ with the links on");

    // 3. a group inside one node ({0,1} and {2,3}): its all-reduce is timed on the fast link
    DistGroup *node = dist_split(w, r / 2, r, "node");
    mpi_check(dist_group_nodes(node) == 1, "a node's group spans %d nodes", dist_group_nodes(node));
    dist_link_held_reset(node);
    dist_all_reduce(x, x, count, DIST_F32, DIST_SUM, node);
    want = floor(2.0 * 1 * S / 2) / intra.bw + 2.0 * intra.lat;
    got = dist_link_held_seconds(node);
    mpi_check(fabs(got - want) <= 1e-9 * want, "all-reduce inside a node: held %.9g s, the model "
              "says %.9g s", got, want);
    dist_group_free(node);

    // the checks of every rank, summed on rank 0
    int mine[2] = {0, mpi_failed()}, all[2] = {0, 0};
    mine[0] = mpi_checks();
    dist_all_reduce(mine, all, 2, DIST_I32, DIST_SUM, w);
    if (r == 0) printf("mpi_links: on %d ranks: %d checks, %d failed\n", W, all[0], all[1]);
    free(x);
    free(buf);
    dist_finalize();
    return all[1] > 0;
}
