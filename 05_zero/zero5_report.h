// zero5_report.h: what chapter 05 prints and dumps: the memory of every rank against the formulas
// (common/calc.h, calc_shard.c), the bytes on the wire, the four stages side by side.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "flags.h"
#include "session.h"
#include "zero.h"

// What the report reads of a run.
typedef struct Zero5View {
    Session *s;
    const ZeroLayout *z;  // the partition (stage 0: one part)
    int stage;
    int in_flight, nbuckets;  // ZeRO-2
    size_t bucket;            // ZeRO-2: elements of a bucket
} Zero5View;

// The per-rank figures: measured peaks (mem.h), the formulas, bytes per step.
enum { Z5_PARAMS, Z5_GRADS, Z5_MASTER, Z5_OPT_M, Z5_OPT_V, Z5_ACTS, Z5_COMM, Z5_TOTAL,
       Z5_XPARAMS, Z5_XGRADS, Z5_XMASTER, Z5_XOPT_M, Z5_XOPT_V,  // the formulas
       Z5_RS_SENT, Z5_RS_RECV, Z5_AG_SENT, Z5_AG_RECV, Z5_AR_SENT, Z5_AR_RECV, Z5_SENT, Z5_RECV,
       Z5_STEP, Z5_NFIELDS };

extern const char *const ZERO5_STAGE_NAME[4];

// The first lines (rank 0, unless --quiet): the stage, the model, the partition.
void zero5_banner(const Zero5View *v, const LabArgs *args);
// My figures (mine: Z5_NFIELDS): peaks, formulas, and the dist counters per step run, less
// what the checkpoints cost (save_cost).
void zero5_figures(const Zero5View *v, double *mine, const DistCounters *save_cost);
// Rank 0, with every rank's figures (all: N x Z5_NFIELDS): the tables, and --dump.
void zero5_report(const Zero5View *v, const double *all, const LabArgs *args);
// --links: DP's link time per step against chapter 00's calculator and the planner
// (session_print_links). Collective over the world.
void zero5_print_links(const Zero5View *v);
