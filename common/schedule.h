// schedule.h: pipeline schedules as DATA.
//
// A schedule is a table: for every stage (rank) r, the ordered list of operations it runs in
// one training step. An operation is F (forward), B (backward) or W (weight gradient) of one
// micro-batch on one of the rank's chunks. With v chunks per rank the model is cut into p*v
// "virtual stages" of L/(p*v) blocks each; chunk c of rank r is virtual stage c*p + r
// (Megatron's interleaving: rank r holds blocks of virtual stages r, p+r, 2p+r, ...).
// The sends and receives are implied by the table:
//   F(i) on virtual stage s > 0          receives the activation of micro-batch i from s-1;
//   F(i) on virtual stage s < p*v-1      sends its output to s+1;
//   B(i) on virtual stage s < p*v-1      receives the gradient of its output from s+1;
//   B(i) on virtual stage s > 0          sends the gradient of its input to s-1.
// Sends never block (they are posted and completed at the end of the step), receives do: so a
// table deadlocks exactly when some receive waits, in a cycle, on an op that comes after it.
// Without a split backward (split == 0) B computes the input AND weight gradients; with it
// (ZB-H1), B only the input gradient, and W, any later, the weight gradients of the blocks.
//
// One table feeds: the executor (pipe_exec.h, over send/recv; sched_validate refuses a bad table
// before it runs), the simulator (sched_simulate: a time model, the deadlock check, the bubble
// and activations in flight), the ASCII printer and the trace. Generators: GPipe, 1F1B,
// interleaved 1F1B, ZB-H1.
#pragma once
#include <stddef.h>
#include <stdio.h>

typedef enum { PIPE_F = 0, PIPE_B = 1, PIPE_W = 2 } PipeOpKind;

typedef struct PipeOp {
    PipeOpKind kind;
    int mb;      // micro-batch 0..m-1
    int chunk;   // 0..v-1: virtual stage chunk*p + rank
} PipeOp;

#define SCHED_MAX_STAGES 64

typedef struct Schedule {
    const char *name;   // "gpipe", "1f1b", "interleaved", "zb"
    int p, v, m;        // stages (ranks), chunks per rank, micro-batches
    int split;          // 1: B is the input gradient only, W separate (zero bubble)
    int nops[SCHED_MAX_STAGES];
    PipeOp *ops[SCHED_MAX_STAGES];  // ops[r][0 .. nops[r]) in the order rank r runs them
} Schedule;

// The generators fill s (free it with sched_free). They fail the job (lab_fail_collective) on
// arguments the schedule cannot take, naming what would be valid.
void sched_gpipe(Schedule *s, int p, int m);
void sched_1f1b(Schedule *s, int p, int m);
void sched_interleaved(Schedule *s, int p, int v, int m);  // needs m a multiple of p
void sched_zb_h1(Schedule *s, int p, int m);  // W deferred: p-r sets, up to m W stores (schedule.c)
// ZB-H1 with at most max_w W stores pending on any stage (0: no cap, sched_zb_h1's table).
void sched_zb_h1_capped(Schedule *s, int p, int m, int max_w);
// By name: "gpipe" | "1f1b" | "interleaved" | "zb" (v is used by "interleaved" only).
void sched_make(Schedule *s, const char *name, int p, int v, int m);
void sched_free(Schedule *s);

// The interleaved order (Megatron): the k-th forward of a rank (k = 0 .. m*v-1) runs chunk
// interleaved_chunk(k, p, v, 1) on micro-batch interleaved_mb(k, p, v); its k-th backward the
// chunk interleaved_chunk(k, p, v, 0) (chunks in reverse) on the same micro-batch order.
int interleaved_chunk(int k, int p, int v, int forward);
int interleaved_mb(int k, int p, int v);
// Warm-up forwards of rank r in interleaved 1F1B (before its first backward).
int interleaved_warmup(int r, int p, int v, int m);

// Structure check: every rank runs F, B (and W when split) exactly once for every micro-batch
// of every chunk it holds, every B after its F, every W after its B. 0 if fine; else -1 and a
// message naming the first problem in err.
int sched_check(const Schedule *s, char *err, size_t errlen);

// The check a table passes before it runs (pipe_exec_init calls it): sched_check, then the
// simulator finds no deadlock. 0 if fine; else -1 and one message in err naming the problem and
// what a valid table is.
int sched_validate(const Schedule *s, char *err, size_t errlen);

// The time model: one whole stage (L/p blocks) takes tf to forward a micro-batch, tb for the
// input gradient and tw for the weight gradient (a chunk: 1/v of each); a message costs
// alpha + beta * bytes. Without a split, B takes tb + tw.
typedef struct SchedTimes {
    double tf, tb, tw;
    double alpha, beta, msg_bytes;
} SchedTimes;

// The bubble the formulas predict, apart from the load imbalance. A step takes as long as its
// busiest stage k (the bottleneck) is busy, plus the time k idles:
//   step = busy_k / (1 - bubble_k),   bubble_k = 1 - busy_k / step.
// With equal stages bubble_k is the schedule's bubble, (p-1)/(m+p-1) for GPipe and 1F1B. With
// unequal ones every other stage r idles more: idle_r = 1 - (busy_r / busy_k)(1 - bubble_k),
// exactly, the extra (1 - busy_r / busy_k)(1 - bubble_k) coming from the load imbalance
// (1 - busy_r / busy_k, at most 1 - busy_min / busy_k), which a balanced partition of the
// layers would remove, not the schedule.
typedef struct BubbleSplit {
    int bottleneck;     // the busiest stage (the first of equals)
    double bubble;      // its idle share of the step: 1 - busy_max / span
    double imbalance;   // 1 - busy_min / busy_max
} BubbleSplit;
// busy[0 .. p): each stage's time in its ops; span: the step's time (0: all zero).
BubbleSplit sched_bubble_split(const double *busy, int p, double span);

typedef struct SimResult {
    int deadlock;              // 1: some ops never ran (err says which waits on what)
    char err[256];
    double makespan;           // end of the last op (all stages start at 0)
    double busy[SCHED_MAX_STAGES];    // time spent in ops
    double bubble[SCHED_MAX_STAGES];  // 1 - busy / makespan
    int peak_inflight[SCHED_MAX_STAGES];  // most activation sets alive at once (F .. B)
    double *start[SCHED_MAX_STAGES];  // per op (nops[r]), the simulated start and end
    double *end[SCHED_MAX_STAGES];
    int sends[SCHED_MAX_STAGES], recvs[SCHED_MAX_STAGES];  // messages sent / received per rank
    BubbleSplit split;         // busy[] split at makespan: the bottleneck's bubble, the imbalance
} SimResult;

// Runs the table under the time model. 0 if every op ran; -1 on a deadlock (r->err).
int sched_simulate(const Schedule *s, const SchedTimes *t, SimResult *r);
// The same with each stage's own op times: t[r] (r = 0 .. p-1) gives stage r's tf, tb, tw (its
// chunks: 1/v of each); the link is t[0]'s. Chapter 08 feeds it the times it measured.
int sched_simulate_stages(const Schedule *s, const SchedTimes *t, SimResult *r);
void sim_free(SimResult *r);

// Activation sets alive at once on each rank when the table runs op after op (F allocates one,
// B frees it; with a split backward B keeps what W needs, a "W store", until W): the same count
// as the simulator's, from the order alone. sched_peak_wstores: the most W stores alive at once
// (0 without a split).
int sched_peak_inflight(const Schedule *s, int rank);
int sched_peak_wstores(const Schedule *s, int rank);

// The theory: bubble fraction of a stage under equal op times and free communication.
//   gpipe, 1f1b:  (p-1) / (m + p - 1)
//   interleaved:  (p-1) / (v*m + p - 1)
//   zb (ZB-H1):   (p-1)(tf + tb - tw) / (m(tf + tb + tw) + (p-1)(tf + tb - tw))   for m >= p
//                 (with fewer micro-batches there are not enough W's to fill the bubbles)
double sched_theory_bubble(const Schedule *s, const SchedTimes *t);

// The picture: one row per stage, time as columns (one column per `unit` of time), each op
// drawn as its letter (F, B, W; lower case for odd chunks) followed by its micro-batch number,
// idle time as '.'. start/end: per rank per op times (simulated or measured, same unit). A
// picture wider than max_cols is cut there, and a line under it says so. Returns the width of
// the whole picture.
int sched_print(FILE *out, const Schedule *s, double *const *start, double *const *end,
                double unit, int max_cols);
