// pipe_exec.h: the pipeline executor. Runs one stage's ops of a schedule table (schedule.h)
// for one training step, over point-to-point messages in the pipeline group; the stage's WORK
// (what F, B and W compute on a chunk, where their inputs and outputs live) is the caller's,
// given as calls. Chapter 08 runs it over whole-GPT-2 stages, chapter 09 over TP stages.
//
// For op F(mb) of chunk c on virtual stage vs = c*p + stage:
//   in = f_begin(c, mb)                       allocate mb's activation set; where its input goes
//   vs > 0:       receive the activation of mb from vs-1 into in
//   loss = forward(c, mb, out)                out: where the output goes (NULL on the last vs)
//   vs < S-1:     send out to vs+1
// For B(mb):
//   dout = b_begin(c, mb)                     where the gradient of the output goes
//   vs < S-1:     receive it from vs+1 into dout
//   backward(c, mb, din)                      din: where the gradient of the input goes (NULL on
//                                             vs 0); frees the set (split: keeps what W reads)
//   vs > 0:       send din to vs-1
// For W(mb) (split schedules): weights(c, mb), which frees what was kept.
// A message between two chunks on the same rank is a copy (rounded to bf16 as a message would
// be, on bf16 runs). Sends are posted without waiting and completed at the end of the step.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "kernels.h"
#include "mem.h"
#include "schedule.h"

typedef struct PipeWork {
    void *ctx;
    float *(*f_begin)(void *ctx, int chunk, int mb);
    float (*forward)(void *ctx, int chunk, int mb, float *out);  // the loss (last vs), else 0
    float *(*b_begin)(void *ctx, int chunk, int mb);
    void (*backward)(void *ctx, int chunk, int mb, float *din);
    void (*weights)(void *ctx, int chunk, int mb);  // NULL: the caller runs no split schedule
} PipeWork;

typedef struct PipeExec {
    const Schedule *s;
    PipeWork w;
    DistGroup *g;         // the pipeline group: its rank r is stage r
    int stage;            // this rank's stage
    size_t msg;           // elements per message (Bm·T·C)
    int bf16;             // 1: the messages travel as bf16, half the bytes
    const Kernels *k;     // (the bf16 conversions, on the messages' device)
    // filled by the executor
    float **sendbuf;      // [(dir·v + chunk)·m + mb]: the message F or B sent (MEM_COMM)
    uint16_t **wire;      // bf16: [slot] sendbuf[slot] rounded to bf16, as sent
    uint16_t *rwire;      // bf16: the message received, before it is widened
    DistWork *works;      // pending isends
    int nworks;
    unsigned char *state; // [chunk·m + mb]: 0 none, 1 after F, 2 after B (split)
    double *op_start, *op_end;  // this step's measured times of each op (lab_now), the wait for
                                // its message left out (op_start is after it)
    double wait;                // seconds the current op waited in receives
    size_t acts_base, acts_peak;  // MEM_ACTS live at the step's start; the most above it
    int live, live_peak;          // activation sets alive (F .. B), and the most at once
    int wlive, wlive_peak;        // split: W stores alive (B .. W), and the most at once
} PipeExec;

// Refuses a table that is not well formed or would deadlock (sched_validate; every rank fails
// with one message), then allocates the message buffers on dev. Fails the job if the tags
// would not fit under 30000 (tag 30000 and above are left to the caller).
void pipe_exec_init(PipeExec *x, const Schedule *s, PipeWork w, DistGroup *g, int stage,
                    size_t msg, int bf16, const Kernels *k, Device dev);
// Runs this stage's ops for one step; returns the sum of the micro-batch losses (0 except on
// the stage holding the last virtual stage). Resets live and the peaks' base at its start.
double pipe_exec_step(PipeExec *x);
void pipe_exec_free(PipeExec *x);

// The tied embedding across a pipeline: the first stage's wte gradient (from the embedding's
// lookups) and the last stage's copy (from the output layer) must both become their sum. `mine`
// (n gradient values of type dt, DIST_F32 or DIST_BF16, on its device) is this rank's; `local`
// the other use when this rank holds both (pp = 1 with chunks: a local add), else NULL and the
// other use is on pipeline rank `peer` (one sendrecv, tag 30000, from device buffers so that NCCL
// can move it too). The sum is taken on the host, bf16 widened to fp32 and rounded once (to
// nearest even); IEEE addition commutes, so both holders end with the same bits.
void pipe_sum_tied(void *mine, void *local, int peer, size_t n, DistDtype dt, DistGroup *g);
