// mpi_09_3d.c: chapter 09's exercises on real process groups.
//
// Launched by tests/test_09_3d.c (suites ex09_1, ex09_2) as
//   mpirun -np 8 build/tests/mpi_09_3d <what>...
// Each kind calls ONE exercise's code (and nothing of the other), on the world, for several
// grids of 8 ranks (dp x tp x pp = 2x2x2, 1x4x2, 2x1x4, 4x2x1):
//   groups  (09.1) grid_init's three groups: their members (world ranks, in group order) are
//           exactly the ranks the test computes from rank = t + tp·(d + dp·p) here.
//   norm    (09.2) grid_clip_norm_sq on groups built HERE (not by grid_init): every rank gets
//           the norm² of a made-up model whose parts are known: the slice of (t, p) has
//           squares 1 + t + 10·p, the replicated tensors of stage p 100·(p+1), the same on
//           every TP and DP rank; the whole model's norm² is Σ_p (Σ_t (1 + t + 10p) + 100(p+1)).
// Seen failing (each break made in 09_3d/grid3d.c by hand, then restored): norm: the replicated
// part summed over TP with the slices ("rank 0's clip norm² 926, want 326" on 2x2x2); groups: the
// TP coordinate taken as rank / (dp·pp) ("rank 4 at (1,0,1), want (0,0,1)").
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "grid3d.h"
#include "mpitest.h"

static const int GRIDS[][3] = {{2, 2, 2}, {4, 1, 2}, {1, 2, 4}, {2, 4, 1}};  // tp, dp, pp

static void expect_members(const Grid *g, int dim, int tp, int dp, int pp, const char *name) {
    const int r = g->rank, t = r % tp, d = (r / tp) % dp, p = r / (tp * dp);
    const int n = dim == GRID_TP ? tp : dim == GRID_DP ? dp : pp;
    int *got = calloc((size_t)g->world, sizeof(int));
    int size = grid_members(g, dim, got);
    mpi_check(size == n, "%dx%dx%d: rank %d's %s group has %d ranks, want %d", dp, tp, pp, r, name, size, n);
    for (int i = 0; i < n && i < size; i++) {
        int want = dim == GRID_TP ? i + tp * (d + dp * p)
                 : dim == GRID_DP ? t + tp * (i + dp * p) : t + tp * (d + dp * i);
        mpi_check(got[i] == want, "dp %d x tp %d x pp %d: rank %d's %s group member %d is world rank "
                  "%d, want %d", dp, tp, pp, r, name, i, got[i], want);
    }
    free(got);
}

static void run(int kind, DistGroup *world) {
    if (world != dist_world()) return;  // the grid is of the whole world
    const int W = world->size, r = world->rank;
    for (size_t k = 0; k < sizeof GRIDS / sizeof GRIDS[0]; k++) {
        const int tp = GRIDS[k][0], dp = GRIDS[k][1], pp = GRIDS[k][2];
        if (tp * dp * pp != W) continue;
        const int t = r % tp, d = (r / tp) % dp, p = r / (tp * dp);
        if (kind == 0) {
            Grid g;
            grid_init(&g, tp, dp, pp);
            mpi_check(g.c.t == t && g.c.d == d && g.c.p == p, "%dx%dx%d: rank %d at (%d,%d,%d), want "
                      "(%d,%d,%d)", dp, tp, pp, r, g.c.t, g.c.d, g.c.p, t, d, p);
            expect_members(&g, GRID_TP, tp, dp, pp, "tp");
            expect_members(&g, GRID_DP, tp, dp, pp, "dp");
            expect_members(&g, GRID_PP, tp, dp, pp, "pp");
            grid_free(&g);
        } else {
            Grid g = {.world = W, .tp = tp, .dp = dp, .pp = pp, .rank = r, .c = {t, d, p}};
            g.tpg = dist_split(world, d + dp * p, t, "tp");
            g.dpg = dist_split(world, t + tp * p, d, "dp");
            g.ppg = dist_split(world, t + tp * d, p, "pp");
            double sq[2] = {1.0 + t + 10.0 * p, 100.0 * (p + 1)};
            double want = 0;
            for (int q = 0; q < pp; q++) {
                for (int u = 0; u < tp; u++) want += 1.0 + u + 10.0 * q;
                want += 100.0 * (q + 1);
            }
            double got = grid_clip_norm_sq(&g, sq);
            mpi_check(got == want, "dp %d x tp %d x pp %d: rank %d's clip norm² %g, want %g (slices "
                      "summed over TP, replicated once, stages over PP, not over DP)", dp, tp, pp, r,
                      got, want);
            grid_free(&g);
        }
    }
}

int main(int argc, char **argv) {
    static const char *const kinds[] = {"groups", "norm"};
    return mpi_test_main(argc, argv, "mpi_09_3d", "usage: mpi_09_3d groups|norm ...", kinds, 2, run);
}
