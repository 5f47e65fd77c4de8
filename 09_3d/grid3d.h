// grid3d.h: the 3D grid of chapter 09: world ranks laid out as TP x DP x PP, one process group
// per line of the grid, and the clipping norm reduced across them.
//
// The layout is Megatron's: TP fastest (consecutive ranks, i.e. the GPUs of one node, share the
// chatty TP all-reduces), then DP, then PP (the stages are the slowest coordinate, so a stage
// boundary is where the job crosses nodes):
//     rank = t + tp·(d + dp·p),   t in [0, tp), d in [0, dp), p in [0, pp)
// A TP group is the tp ranks with the same (d, p); a DP group the dp ranks with the same (t, p)
// (they hold the SAME slices of the same stage); a PP group the pp ranks with the same (t, d)
// (they hold the stages of one replica's slice t, and send activations along it).
#pragma once
#include <stdio.h>

#include "dist.h"

typedef struct GridCoord { int t, d, p; } GridCoord;

enum { GRID_TP = 0, GRID_DP = 1, GRID_PP = 2 };

// The coordinates of world rank `rank` in a tp x dp x pp grid (TP fastest, then DP, then PP).
GridCoord grid_coord(int rank, int tp, int dp, int pp);
// The inverse: the world rank at c.
int grid_rank(GridCoord c, int tp, int dp, int pp);
// The group of `rank` along dimension dim (GRID_TP, GRID_DP, GRID_PP), as dist_split takes it:
// color = the same for exactly the ranks of that group (they differ only in that coordinate),
// key = the rank's place in it (its coordinate along dim).
void grid_group_color(int rank, int tp, int dp, int pp, int dim, int *color, int *key);

typedef struct Grid {
    int world, tp, dp, pp;
    int rank;
    int pp_first;                // the ranks numbered PP fastest (grid_init_ordered)
    GridCoord c;                 // this rank's coordinates
    DistGroup *tpg, *dpg, *ppg;  // its groups (group rank == c.t, c.d, c.p)
} Grid;

// Checks the arguments against the world and the model (world == dp·tp·pp, tp divides the
// heads, pp·chunks divides the layers): one message naming the valid choices, every rank exits
// (lab_fail_collective). dp 0: inferred as world / (tp·pp).
void grid_check(int world, int *dp, int tp, int pp, int chunks, int NH, int L);
// Builds the grid and its three groups (collective over the world).
void grid_init(Grid *g, int tp, int dp, int pp);
// The same with the ranks in another order when pp_first: rank = p + pp·(d + dp·t), PP
// fastest and TP slowest, so a TP group spreads over nodes (--grid-order pp-first: question 5's
// experiment). The coordinates and groups are those of the rank's place, so training is the same.
void grid_init_ordered(Grid *g, int tp, int dp, int pp, int pp_first);
void grid_free(Grid *g);
// The picture: which world rank sits at which (t, d, p), and the members of each group.
void grid_print(FILE *out, const Grid *g);
// Members (world ranks, in group order) of this rank's group along dim: out[0 .. size).
// Collective over that group.
int grid_members(const Grid *g, int dim, int *out);

// The squared global gradient norm of the WHOLE model from this rank's parts: sq[0] = Σ g² of
// the tensors sliced over TP, sq[1] = of the TP-replicated ones (tied copies already left out).
// The slices are summed over the TP group, the replicated tensors counted once, the stages
// summed over PP; DP adds nothing (after the average every replica holds the same gradient).
// Every rank gets the same value. Collective over the TP and PP groups.
double grid_clip_norm_sq(const Grid *g, const double sq[2]);
