// session.h: the setup and reporting every training chapter repeats, so that a chapter's
// train() shows only its own idea (who computes, who communicates, who steps).
//
// A training session is: the model (fp32, or bf16 mixed precision), its gradients and one
// activation set for this rank's rows; the optimizer (the weights AdamW updates, Adam m and v)
// where this rank has one; the data source and this rank's (rows, T) batch buffers; the losses
// of every step; the progress line, the checkpoints, the fault hooks and the final --dump.
// What the chapter does between session_init and session_finish is its training loop:
//
//     Session s;
//     session_init(&s, args, rows, 1);
//     int start = session_load_or_init(&s, args->seed);
//     for (int step = start; step < s.end; step++) {
//         session_step_begin(&s, step);                       // --kill-rank/--kill-step
//         ... batch, forward, backward, (communication), train_adamw_step ...
//         session_step_end(&s, step, loss);                    // loss, progress, checkpoint
//     }
//     session_finish(&s);                                      // final checkpoint and weights
//
// Rank 0 is the writer everywhere: it prints the progress line, writes every checkpoint and
// the --dump file (in 02 it is the master, in 00 and 03 it holds the same state as every rank).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "optim.h"
#include "results.h"

typedef struct Session {
    const LabArgs *args;
    GPT2Config cfg;
    Device dev;
    int bf16;              // --dtype bf16: mixed precision (common/train.h)
    DistGroup *world;
    int rank, N;
    GPT2 model;            // parameters, gradients, activations for (rows, T)
    size_t n;              // parameters
    DistDtype dt;          // the gradients' (and the forward weights') type: DIST_F32/DIST_BF16
    size_t e;              // bytes per element of dt: 4, or 2 in bf16
    GPT2Param *plist;      // the named parameter tensors (clipping and weight decay)
    int nplist;
    // The optimizer, where this rank has one (else all NULL): the weights AdamW updates (fp32:
    // the parameters themselves; bf16: an fp32 master copy), Adam's m and v.
    float *master, *opt_m, *opt_v;
    AdamW opt;
    DataSource data;       // the global batch of step s is a pure function of (data seed, s)
    int rows, T;           // this rank's batch buffers are (rows, T)
    int *inputs, *targets;
    int start, end;        // steps [start, end) run here (resume, --steps, --stop-at)
    float *losses;         // (--steps) the loss of every step; NaN where not run here
    double t_start, t_last;  // wall clock at the loop's start / at the last step's end
    float *host_params;    // (n) final weights as fp32 on rank 0 (session_finish), else NULL
} Session;

// Everything the loop needs, allocated in the order the chapters always did: model (with
// gradients and activations for `rows` rows), optimizer state if has_optimizer (0: this rank
// has none, like 02's workers, or the chapter allocates its own, e.g. a shard), data, batch
// buffers. Selects the NCCL backend first when --backend nccl (it picks the rank's GPU).
void session_init(Session *s, const LabArgs *args, int rows, int has_optimizer);
// The starting weights into s->master (then into the model): --resume (weights, Adam state and
// step), --load-weights, or fresh from `seed`. Returns the first step (also s->start).
int session_load_or_init(Session *s, uint64_t seed);

// Top of a step: the fault hook (--kill-rank R --kill-step S: rank R exits abruptly); at the
// first step the loop's clock starts (progress line, session_elapsed).
void session_step_begin(Session *s, int step);
// --inject-nan-step: a NaN into this rank's gradient at that step, if this rank is `who`.
void session_inject_nan(Session *s, int step, int who);
// The end of a step: records the loss, prints the progress line (rank 0, every --log-every
// steps and the last), writes the periodic --save checkpoint (rank 0, every --save-every).
void session_step_end(Session *s, int step, float loss);

// After the loop: the final --save checkpoint and --save-weights (rank 0), the final weights
// as fp32 on rank 0 (s->host_params), the --trace file (collective). Read the run's byte
// counters before: the trace is gathered with dist calls.
void session_finish(Session *s);
double session_elapsed(const Session *s);  // seconds of the loop
int session_steps_run(const Session *s);   // end - start (0 when resuming at the end)

// --dump (rank 0): open fills the losses and final weights; add the chapter's figures with
// results_set; close adds the memory figures, writes the file and frees it.
void session_dump_open(const Session *s, RunResults *out);
void session_dump_close(const Session *s, RunResults *out);

// The per-rank report: every rank's `nfields` doubles gathered to rank 0 (rank-major; NULL on
// the other ranks; free it), and a table of chosen fields, one row per rank.
double *session_gather_report(const Session *s, const double *mine, int nfields);
typedef enum { COL_MS, COL_BYTES } SessionColumnKind;  // seconds shown as ms; bytes as KiB...
typedef struct SessionColumn {
    const char *title;
    int field;             // index into each rank's fields
    SessionColumnKind kind;
} SessionColumn;
// rank0_note: appended to rank 0's label ("master"), or NULL.
void session_print_rank_table(const char *title, const SessionColumn *cols, int ncols,
                              const double *all, int nranks, int nfields, const char *rank0_note);

// "GPT-2 V=.. T=.. L=.. C=.. NH=.., n parameters" for the chapters' first line.
const char *session_model_line(const Session *s, char *buf, size_t len);

// Frees what session_init allocated (the chapter frees its own first: gpt2_free comes last).
void session_free(Session *s);
