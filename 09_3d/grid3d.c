// grid3d.c: the TP x DP x PP grid and its groups (grid3d.h).
#include "grid3d.h"

#include <stdlib.h>

#include "check.h"

GridCoord grid_coord(int rank, int tp, int dp, int pp) {
    LAB_CHECK(tp > 0 && dp > 0 && pp > 0 && 0 <= rank && rank < tp * dp * pp,
              "grid: rank %d is not in a %d x %d x %d grid", rank, tp, dp, pp);
    GridCoord c = {0, 0, 0};
    // EXERCISE 09.1 Building the groups from the grid -> 09_3d/README.md#exercise-091-building-the-groups-from-the-grid
    c.t = rank % tp;         // fastest: consecutive ranks
    c.d = (rank / tp) % dp;  // then the replicas
    c.p = rank / (tp * dp);  // slowest: the stages
    // END EXERCISE 09.1
    return c;
}

int grid_rank(GridCoord c, int tp, int dp, int pp) {
    (void)pp;
    return c.t + tp * (c.d + dp * c.p);
}

void grid_group_color(int rank, int tp, int dp, int pp, int dim, int *color, int *key) {
    GridCoord c = grid_coord(rank, tp, dp, pp);
    // the color: the two coordinates the group's ranks share, numbered; the key: the third
    switch (dim) {
    case GRID_TP: *color = c.d + dp * c.p, *key = c.t; break;
    case GRID_DP: *color = c.t + tp * c.p, *key = c.d; break;
    default:      *color = c.t + tp * c.d, *key = c.p; break;
    }
}

void grid_check(int world, int *dp, int tp, int pp, int chunks, int NH, int L) {
    if (tp < 1 || pp < 1 || world % (tp * pp) != 0)
        lab_fail_collective("--tp %d x --pp %d = %d does not divide the %d ranks of the job; the grid "
                            "is dp x tp x pp = world: choose tp and pp whose product divides %d",
                            tp, pp, tp * pp, world, world);
    if (*dp == 0) *dp = world / (tp * pp);
    if (*dp * tp * pp != world)
        lab_fail_collective("--dp %d x --tp %d x --pp %d = %d, but the job has %d ranks; dp x tp x pp "
                            "must equal the world (or leave --dp out: %d)", *dp, tp, pp,
                            *dp * tp * pp, world, world / (tp * pp));
    if (NH % tp != 0) {
        char valid[128] = "";
        size_t at = 0;
        for (int d = 1; d <= NH && at + 8 < sizeof valid; d++)
            if (NH % d == 0) at += (size_t)snprintf(valid + at, sizeof valid - at, "%s%d", at ? ", " : "", d);
        lab_fail_collective("--tp %d does not divide the %d heads (whole heads per rank); valid "
                            "degrees for NH=%d are %s", tp, NH, NH, valid);
    }
    if (L % (pp * chunks) != 0 || pp * chunks > L)
        lab_fail_collective("--pp %d x --chunks %d = %d stages do not divide the %d layers (every "
                            "stage holds the same number of blocks); use a pp x chunks that divides "
                            "%d, or --layers %d, %d, ...", pp, chunks, pp * chunks, L, L,
                            pp * chunks, 2 * pp * chunks);
}

void grid_init(Grid *g, int tp, int dp, int pp) { grid_init_ordered(g, tp, dp, pp, 0); }

void grid_init_ordered(Grid *g, int tp, int dp, int pp, int pp_first) {
    g->world = dist_size(), g->rank = dist_rank(), g->tp = tp, g->dp = dp, g->pp = pp;
    LAB_CHECK(g->world == tp * dp * pp, "grid: %d ranks for %d x %d x %d", g->world, tp, dp, pp);
    int color[3], key[3];
    // pp_first: this rank stands at the place the TP-first grid gives the rank with the same
    // (t, d, p), read PP fastest; its groups are that place's
    int place = g->rank;
    g->pp_first = pp_first;
    if (pp_first) {
        const int p = g->rank % pp, d = (g->rank / pp) % dp, t = g->rank / (pp * dp);
        place = grid_rank((GridCoord){t, d, p}, tp, dp, pp);
    }
    for (int dim = 0; dim < 3; dim++) grid_group_color(place, tp, dp, pp, dim, &color[dim], &key[dim]);
    g->c = (GridCoord){key[GRID_TP], key[GRID_DP], key[GRID_PP]};
    g->tpg = dist_split(dist_world(), color[GRID_TP], key[GRID_TP], "tp");
    g->dpg = dist_split(dist_world(), color[GRID_DP], key[GRID_DP], "dp");
    g->ppg = dist_split(dist_world(), color[GRID_PP], key[GRID_PP], "pp");
}

void grid_free(Grid *g) {
    dist_group_free(g->ppg);
    dist_group_free(g->dpg);
    dist_group_free(g->tpg);
}

int grid_members(const Grid *g, int dim, int *out) {
    DistGroup *grp = dim == GRID_TP ? g->tpg : dim == GRID_DP ? g->dpg : g->ppg;
    int me = g->rank;
    dist_all_gather(&me, out, 1, DIST_I32, grp);
    return grp->size;
}

// "{0,2,4}" into buf (cut short with "..." when it does not fit).
static const char *format_list(char *buf, size_t len, const int *m, int n) {
    size_t at = (size_t)snprintf(buf, len, "{");
    for (int i = 0; i < n && at + 16 < len; i++) at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? "," : "", m[i]);
    snprintf(buf + at, len - at, at + 16 < len ? "}" : "...}");
    return buf;
}

void grid_print(FILE *out, const Grid *g) {
    // every rank's coordinates and groups, gathered to rank 0
    int mine[3 + 3 * 64] = {0}, n[3];
    mine[0] = g->c.t, mine[1] = g->c.d, mine[2] = g->c.p;
    for (int dim = 0; dim < 3; dim++) {
        int *m = lab_xcalloc((size_t)g->world, sizeof(int));
        n[dim] = grid_members(g, dim, m);
        for (int i = 0; i < n[dim] && i < 64; i++) mine[3 + 64 * dim + i] = m[i];
        free(m);
    }
    const int W = 3 + 3 * 64;
    int *all = g->rank == 0 ? lab_xcalloc((size_t)g->world * W, sizeof(int)) : NULL;
    dist_gather(mine, all, W, DIST_I32, 0, dist_world());
    if (g->rank == 0) {
        fprintf(out, "the grid: %d ranks = dp %d x tp %d x pp %d, %s\n", g->world, g->dp, g->tp,
                g->pp, g->pp_first ? "PP fastest, then DP, then TP (--grid-order pp-first)"
                                   : "TP fastest, then DP, then PP");
        for (int p = 0; p < g->pp; p++) {
            fprintf(out, "  stage p=%d%*s", p, 4, "");
            for (int t = 0; t < g->tp; t++) fprintf(out, " t=%-3d", t);
            fprintf(out, "\n");
            for (int d = 0; d < g->dp; d++) {
                fprintf(out, "    replica d=%-3d", d);
                for (int t = 0; t < g->tp; t++) {
                    int who = -1;
                    for (int r = 0; r < g->world; r++) {
                        const int *a = all + (size_t)r * W;
                        if (a[0] == t && a[1] == d && a[2] == p) who = r;
                    }
                    fprintf(out, " r%-4d", who);
                }
                fprintf(out, "\n");
            }
        }
        if (g->world <= 64) {
            fprintf(out, "  %-5s %-11s %-18s %-18s %-18s\n", "rank", "(t,d,p)", "tp group",
                    "dp group", "pp group");
            for (int r = 0; r < g->world; r++) {
                const int *a = all + (size_t)r * W;
                char co[24];
                snprintf(co, sizeof co, "(%d,%d,%d)", a[0], a[1], a[2]);
                char l[3][64];
                for (int dim = 0; dim < 3; dim++)
                    format_list(l[dim], sizeof l[dim], a + 3 + 64 * dim, n[dim] < 64 ? n[dim] : 64);
                fprintf(out, "  %-5d %-11s %-18s %-18s %-18s\n", r, co, l[0], l[1], l[2]);
            }
        }
    }
    free(all);
}

double grid_clip_norm_sq(const Grid *g, const double sq[2]) {
    LAB_CHECK(g->tpg && g->ppg, "grid_clip_norm_sq: the grid's groups are not built");
    double norm_sq = 0.0;
    // EXERCISE 09.2 The clipping norm across groups -> 09_3d/README.md#exercise-092-the-clipping-norm-across-groups
    double sliced = sq[0];
    dist_all_reduce(&sliced, &sliced, 1, DIST_F64, DIST_SUM, g->tpg);  // each slice on one TP rank
    norm_sq = sliced + sq[1];  // the replicated tensors: the same on every TP rank, counted once
    dist_all_reduce(&norm_sq, &norm_sq, 1, DIST_F64, DIST_SUM, g->ppg);  // disjoint stages
    // END EXERCISE 09.2
    (void)sq;
    return norm_sq;
}
