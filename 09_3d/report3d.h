// report3d.h: what chapter 09 prints and dumps: the setup (the model, the grid's shape, the
// schedule simulated), and after training every rank's bytes per step in its TP, DP and PP
// group against chapter 00's formula, and its memory (one row per rank; the --dump's figures).
#pragma once
#include <stddef.h>

#include "gpt2.h"
#include "grid3d.h"
#include "mem_predict.h"
#include "schedule.h"
#include "session.h"

// One rank's figures, in this order (session_gather_report: rank-major on rank 0).
enum {
    R3D_TP_SENT, R3D_DP_SENT, R3D_PP_SENT,    // bytes sent per step in each group (dist's counters)
    R3D_PARAMS, R3D_ACTS_PEAK, R3D_OPT_M,     // peak bytes of weights, activations, Adam's m
    R3D_COORD,                                // t + 100 d + 10000 p
    R3D_BLOCKS,                               // l0 + 100 l1 (the first chunk's l0, the last's l1)
    R3D_TP_FORMULA, R3D_DP_FORMULA, R3D_PP_FORMULA,  // chapter 00's calculator for this rank
    R3D_MASTER,                               // peak bytes of the fp32 master (bf16; 0 in fp32)
    R3D_NFIELDS
};

// What the figures are read from: the grid, the layout, this rank's blocks, its peak bytes of
// activation sets above the step's start (the executor's).
typedef struct R3dView {
    const Grid *g;
    int dp, tp, pp, v, m, zero;  // zero: 0 .. 3 (FSDP: 3 with fsdp)
    int fsdp, keep_gathered;     // FSDP's layout; --reshard-after-forward 0
    int l0, l1;
    size_t acts_peak;
    int sp;                // --sequence-parallel
    GPT2Recompute recompute;  // --recompute: smaller sets; full reruns the TP collectives
} R3dView;

// What a rank's memory is predicted from (before anything is allocated): the layout, the
// schedule's table, the DP layer's choices.
typedef struct R3dLayout {
    int dp, tp, pp, v, m;
    const Schedule *s;
    int zero, fsdp, prefetch, keep_gathered;  // zero 3 with fsdp: FSDP (as R3dView)
    GPT2Recompute recompute;                  // --recompute (fp32): smaller sets, a scratch layer a chunk
    int sp;                                   // --sequence-parallel: a TP stage's sets on T/tp rows
} R3dLayout;
// World rank `rank`'s peak bytes (mem_predict.h) for a global batch of `batch`: its model state
// from chapter 00's calculator (calc_rank_memory: the pieces ZeRO and FSDP keep, the whole
// gradients), the larger of the setup (the chunks built whole, then cut) and the step: the
// activation sets its table keeps at once (calc_pipe_peak_bytes at tp 1; tp.c's sets walked
// op by op otherwise), the executor's messages, the gathered units of ZeRO-3 / FSDP, scratch.
MemPrediction r3d_predict_memory(const void *ctx, const LabArgs *args, int batch, int rank);

// The model, the layout and the schedule (simulated with tf = tb), before training (rank 0).
void r3d_print_setup(const GPT2Config *cfg, const Schedule *s, int B, int dp, int tp, int Bm);
// This rank's figures over the steps the session ran (call before session_finish: the final
// checkpoint's collectives are not a step's).
void r3d_figures(const Session *s, const R3dView *v, double mine[R3D_NFIELDS]);
// Rank 0: the per-rank table (all: session_gather_report's, world ranks).
void r3d_print_table(const double *all, int world, int v, int bf16);
// Rank 0, after session_finish: the --dump (losses, final weights, ranks 0..7's figures).
void r3d_write_dump(const Session *s, const double *all);
// With --links (the virtual cluster, docs/CLUSTER.md), collective over the world: each
// dimension's link time per step, the seconds dist held this rank's ops on its TP, DP and PP
// group, against the planner's model for the same layout and links (chapter 00's bytes and hops
// of this rank, calc_rank_comm, over the link calc_group_nodes says the group crosses); the
// busiest rank of each, and the measured time per step. Rank 0 prints.
void r3d_print_links(const Session *s, const R3dView *v, int pp_first);
