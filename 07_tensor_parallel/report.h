// report.h: what chapter 07 prints: who holds what (an ASCII picture), the all-reduces of one
// step against the formula, the memory of every rank against the formula.
#pragma once
#include <stdint.h>

#include "dist.h"
#include "results.h"
#include "session.h"
#include "tp.h"

// One run's measured figures (per step) and the formulas they are checked against.
typedef struct Tp7Figures {
    int tp, steps, sp;                                    // sp: sequence parallel
    GPT2Recompute recompute;                              // --recompute (tp.h's tp_build)
    double calls[TP_NSITES], floats[TP_NSITES];           // per step, from the TpComm counters
    double want_calls[TP_NSITES], want_floats[TP_NSITES]; // the formula
    double tp_sent, tp_recv, want_tp_sent;  // bytes per step in the TP group (dist's counters)
    double layer_sent, want_layer_sent;     // of one block (its 4 all-reduces), per step
    int bf16;                               // --dtype bf16: 2-byte weights, grads, stored acts
    double params, want_params;             // bytes of weights on this rank
    double grads, want_grads;               // of their gradients
    double master, want_master;             // of the fp32 master (bf16 only; 0 in fp32)
    double sharded, replicated;             // of which sliced / replicated (bytes)
    double acts, want_acts;                 // peak activation bytes (MEM_ACTS) on this rank
    double rc_layer;                        // of which the recompute layer (0: none)
    double block_acts, megatron_block_acts; // one block's saved activations, and Megatron's
                                            // sbh(10 + 24/t + 5as/(ht)) for the same shape
    double adjusted_block_acts;             // the same formula adjusted to this model (report.c)
    double peak, tokens_per_s;
} Tp7Figures;

// m: this rank's slice (tp_build's: its shape, one batch of m->tp_B rows).
void tp7_print_layout(const GPT2 *m, int world, int dp);
// Reads the counters of the run's `steps` steps (comm: the TpComm the loop used).
void tp7_measure(Tp7Figures *f, const GPT2 *m, const TpComm *comm, DistGroup *tpg, int steps,
                 double elapsed, int global_batch);
// --links: the link time of the TP and DP groups per step against chapter 00's calculator and
// the planner (session_print_links; this layout: DP x TP, sequence parallel or not). Collective
// over the world.
void tp7_print_links(const Session *s, int tp, int sp, GPT2Recompute recompute);
// Collective over the world (a per-rank table gathered to rank 0).
void tp7_print_report(const Tp7Figures *f, const GPT2 *m, DistGroup *tpg, int world);
// Largest |w - w on group rank 0| over the replicated tensors (LayerNorms, wpe, the row-parallel
// biases) of the slice's whole master (host or device): 0 when every rank applied the same
// updates to them. Collective over g.
double tp7_replicated_max_diff(const GPT2 *m, const float *master, DistGroup *g);
// --dump (world rank 0, after session_finish): the losses and final weights, the figures, the
// layout (dp) and the replicated tensors' largest difference across the TP group.
void tp7_write_dump(const Session *s, const Tp7Figures *f, int dp, double replicated_max_diff);
