// fsdp6_report.h: what chapter 06 measures and prints: the peak memory of every rank and phase
// against the formulas (the sharded state from the calculator, common/calc.h; the gathered
// units and unit gradients by walking the plan as the runtime does), the collectives per step,
// the two accumulation modes; and the --dump figures.
#pragma once
#include "dist.h"
#include "flags.h"
#include "fsdp.h"
#include "gpt2.h"
#include "session.h"
#include "zero.h"

typedef struct FsdpFlags {
    int reshard;          // --reshard-after-forward
    int prefetch;         // --prefetch
    int grad_accum;       // --grad-accum
    int no_sync;          // --no-sync
    int shard_group;      // --shard-group (0: the whole world)
} FsdpFlags;

enum { PH_FWD, PH_BWD, PH_OPT, PH_N };

// The categories the per-phase table shows (gathered weights are MEM_COMM; unit gradient
// buffers and my gradient pieces MEM_GRADS).
enum { C_PARAMS, C_GATHERED, C_GRADS, C_MASTER, C_OPT_M, C_OPT_V, C_ACTS, C_TOTAL, C_N };

typedef struct FsdpRun {
    Session *s;
    GPT2 *m;
    const FsdpFlags *f;
    int G, R;                 // shard group size, replicas
    DistGroup *shard, *rep;
    ZeroLayout z;
    FsdpPlan plan;
    Fsdp F;
    void *param_shard, *grad_shard;
    float *master, *opt_m, *opt_v;  // fp32 master: the parameter pieces themselves
    int K, Bm;
    double peak[PH_N][C_N];   // measured, the largest over the run's steps
    int fwd_log[64], nfwd_log, bwd_log[64], nbwd_log;  // step 1's all-gathers, in order
} FsdpRun;

enum { F_PEAK = 0,                                   // PH_N x C_N measured peaks
       F_XGATH = F_PEAK + PH_N * C_N, F_XGRADS = F_XGATH + PH_N,  // the formulas per phase
       F_XSTATE = F_XGRADS + PH_N,                   // params, master, m, v formulas
       F_CALLS = F_XSTATE + 4,                       // ag, rs, ar calls per step
       F_BYTES = F_CALLS + 3,                        // ag, rs, ar sent, recv per step
       F_XCALLS = F_BYTES + 6,                       // the formulas for ag, rs calls
       F_SENT = F_XCALLS + 2, F_RECV, F_STEP, F_NFIELDS };

// The first lines (rank 0, unless --quiet): the model, the units, the mode.
void fsdp6_banner(const FsdpRun *r, const LabArgs *args);
// My figures (mine: F_NFIELDS) after the run's nrun steps, less the checkpoints' collectives.
void fsdp6_figures(const FsdpRun *r, double *mine, const DistCounters *save_cost, int nrun);
// Rank 0, with every rank's figures (all: N x F_NFIELDS): the tables, and --dump.
void fsdp6_report(const FsdpRun *r, const double *all, const LabArgs *args);
// --links: DP's link time per step against chapter 00's calculator and the planner
// (session_print_links; not with --shard-group). Collective over the world.
void fsdp6_print_links(const FsdpRun *r);
