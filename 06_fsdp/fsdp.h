// fsdp.h: FSDP's runtime, unit by unit: each unit's state machine, the plan of one micro-batch
// (the ops in order, the all-gathers they need, the prefetch queue), and the reduce-scatter hook.
//
// A unit is one contiguous range of the flat parameter buffer (common/gpt2.h: embedding, each
// block, head): FSDP's FlatParameter. It is sharded over the shard group exactly as ZeRO-3
// shards it (common/zero.h: rank r owns piece r of every unit), and lives in one of four states:
//
//     SHARDED --all-gather issued--> GATHERING --wait--> GATHERED --free--> FREED
//        (only my piece)            (buffer, in flight)   (whole unit)      (my piece again;
//                                                                           the next use gathers)
//
// The plan (fsdp_plan_build) lists the ops of one micro-batch, forward then backward, with the
// units each reads; walking it with the reshard rule gives the all-gathers in the order they are
// needed: the prefetch queue. Before op k the runtime issues the queue's entries up to the last
// one op k needs plus `prefetch` more (in forward order in forward, in backward order in
// backward), then waits for op k's own; after op k it frees what the rule says.
// The reshard rule: after a FORWARD op a unit is freed when --reshard-after-forward is 1 and the
// next op does not read it; after a BACKWARD op when no later op of the micro-batch reads it.
// After the backward op that completes a unit's gradient comes the hook: its reduce-scatter.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "kernels.h"
#include "mem.h"
#include "zero.h"

typedef enum { FSDP_SHARDED = 0, FSDP_GATHERING, FSDP_GATHERED, FSDP_FREED } FsdpState;
typedef enum { FSDP_EMBED = 0, FSDP_BLOCK, FSDP_HEAD } FsdpPiece;

// ---------------------------------------------------------------------------------------------
// The plan of one micro-batch

#define FSDP_MAX_NEED 2
typedef struct FsdpOp {
    int backward;               // 0 forward, 1 backward
    FsdpPiece piece;            // what runs: the embedding, block `layer`, the head
    int layer;                  // FSDP_BLOCK: the block, else -1
    int need[FSDP_MAX_NEED];    // the units whose gathered weights the op reads
    int nneed;
    int done;                   // backward: the unit whose gradient is complete after it, else -1
    int nfree;                  // the units freed after it (the reshard rule)
    int free[FSDP_MAX_NEED];
} FsdpOp;

typedef struct FsdpPlan {
    int L, nunits, reshard;
    FsdpOp *ops;                // forward ops [0, nfwd), then backward ops [nfwd, nops)
    int nops, nfwd;
    int *entry_unit, *entry_op; // the all-gathers in order: the prefetch queue
    int nentries, nfwd_entries; // forward's entries come first
} FsdpPlan;

// The plan of a model of L blocks (units 0 = embedding, 1 + l = block l, L + 1 = head; the head
// reads the embedding's wte too) with the reshard rule above.
void fsdp_plan_build(FsdpPlan *p, int L, int reshard);
void fsdp_plan_free(FsdpPlan *p);
// "embed", "block 3", "head": the unit's name for tables and traces.
const char *fsdp_unit_name(int u, int L, char *buf, size_t len);

// ---------------------------------------------------------------------------------------------
// The runtime

typedef struct FsdpUnit {
    FsdpState state;
    ZeroUnit buf;               // the gather, wait, free and reduce-scatter ZeRO-3 shares (zero.h):
                                // buf.w the whole unit while GATHERING, GATHERED (MEM_COMM);
                                // buf.g its unsharded gradient while backward accumulates (MEM_GRADS)
} FsdpUnit;

typedef struct Fsdp {
    const ZeroLayout *z;        // my pieces of every unit (over the shard group)
    DistGroup *shard;           // the ranks a unit is sharded over
    DistGroup *rep;             // HSDP: the ranks holding the same pieces (size 1: plain FSDP)
    DistDtype dt;               // the gathered weights' and the gradients' type
    size_t e;                   // its bytes
    Device dev;
    const Kernels *k;
    float *scratch;             // bf16: fp32 scratch for adding pieces (2 halves), else NULL
    size_t scratch_n;
    void *param_shard;          // my pieces of the parameters (model dtype)
    void *grad_shard;           // my pieces of the averaged gradients (model dtype)
    FsdpUnit *u;                // (nunits)
    int nunits;
    int prefetch;               // entries issued ahead of the current op (0: off)
    int in_flight;              // reduce-scatters that may be pending at once
    // the queue of one micro-batch
    int next;                   // the next plan entry to issue
    int *rsq, rs_head, rs_tail; // reduce-scatters in flight, oldest first
    // what happened (per step counts are taken from the dist counters; these explain them)
    int *log, nlog, log_cap;    // every all-gather issued in the current micro-batch, in order
    int unplanned;              // all-gathers an op had to issue itself (not in the plan)
    int wasted;                 // gathered units freed without being used
    int poison;                 // --inject-nan-step: the next hook's unit gradient gets a NaN
} Fsdp;

void fsdp_init(Fsdp *F, const ZeroLayout *z, DistGroup *shard, DistGroup *rep, DistDtype dt,
               Device dev, const Kernels *k, float *scratch, size_t scratch_n, void *param_shard,
               void *grad_shard);
void fsdp_free(Fsdp *F);

// One transition of unit u's state machine: SHARDED/FREED -> GATHERING (a buffer for the whole
// unit, the all-gather of every rank's piece issued), GATHERING -> GATHERED (waited),
// GATHERED -> FREED (the buffer released).
void fsdp_unit_step(Fsdp *F, int u);

// The walk over a plan. fsdp_begin_micro before the first op of a micro-batch; fsdp_before_op:
// issue the prefetch window, gather what op k reads; then the op reads fsdp_weights(F, u);
// fsdp_after_op: the reshard rule's frees. fsdp_end_micro: frees whatever is still gathered
// (nothing, when the plan is right) and waits for every reduce-scatter.
void fsdp_begin_micro(Fsdp *F);
void fsdp_before_op(Fsdp *F, const FsdpPlan *p, int k);
const void *fsdp_weights(const Fsdp *F, int u);
void fsdp_after_op(Fsdp *F, const FsdpPlan *p, int k);
void fsdp_end_micro(Fsdp *F);

// The gradient buffer of unit u for this backward (allocated zeroed at first use; in no_sync it
// stays from one micro-batch to the next, accumulating).
void *fsdp_unit_grads(Fsdp *F, int u);
// The hook at the end of unit u's backward: sync ? reduce-scatter (average over the shard
// group) its gradient, my piece landing in place inside the unit buffer : nothing (no_sync).
void fsdp_grads_done(Fsdp *F, int u, int sync);
// The oldest pending reduce-scatter: waited, all-reduced over the replicas (HSDP), added into
// my gradient piece, the unit buffer freed.
void fsdp_grads_reap(Fsdp *F);
