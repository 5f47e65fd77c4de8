// pipe_report.h: what chapter 08 prints and measures around its training loop (report.c): the
// four schedules side by side (--compare), the run's header and table, each step's op times
// (the clock), and after training the time, memory and message report against the formulas
// (the calculator's pipeline section, common/calc.h), and the --dump.
#pragma once
#include <stdint.h>

#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "pipe_exec.h"
#include "schedule.h"
#include "session.h"

// --compare: the four schedules simulated for p stages and m micro-batches (interleaved with
// v chunks, at least 2; zb capped at max_w W stores when max_w > 0), each with its picture.
void pipe8_compare(int p, int m, int v, int max_w, int cols);

// The run's header (stages, chunks, model, schedule, micro-batches) and its table simulated
// with tf = tb = tw, on stdout (call on rank 0).
void pipe8_print_setup(const Schedule *s, const GPT2Config *cfg, int B, int Bm, const char *dtype,
                       const char *device, int cols);

// This stage's measured time in each step after the first (the first warms caches and
// allocators; a run of one step keeps it): seconds in its F, B and W ops, the waits for
// messages left out (B: the whole backward when the schedule does not split it), and the span
// of the step, from the earliest stage's first op to the latest stage's end (all ranks read one
// monotonic clock, on one machine); the last step's timeline for its picture; the bytes sent.
typedef struct PipeClock {
    const Schedule *s;
    DistGroup *g;                 // the clock's group: the world, or with --links a copy of it
    int own_g;                    // (so that the clock's barrier stays out of PP's link time)
    int rank, start, end;
    int n;                        // steps kept
    double *op[3], *span;         // [n]; op[PIPE_F], op[PIPE_B], op[PIPE_W]
    double *pic_start, *pic_end;  // the last step's measured timeline (NULL: no step ran)
    double t0, t_steps;           // this step's start; the steps after the first (tokens/s)
    double sent_sum;              // bytes sent point to point, all steps
    uint64_t sent0;
} PipeClock;

void pipe8_clock_init(PipeClock *c, const Schedule *s, DistGroup *g, int start, int end);
// Before the step: the stages start together (a barrier: the timeline's zero).
void pipe8_clock_begin(PipeClock *c);
// After pipe_exec_step: the step's op times, its span (an all-reduce: every rank calls it).
void pipe8_clock_end(PipeClock *c, const PipeExec *x, int step);
// After the optimizer step: seconds since the step began (the steps after the first add up
// for tokens/s).
double pipe8_clock_step_time(PipeClock *c, int step);
void pipe8_clock_free(PipeClock *c);

// The run, for the report after training.
typedef struct PipeRun {
    const Schedule *s;
    const PipeExec *x;
    const Session *ses;       // the loop: config, flags, world, losses, final weights (rank 0)
    GPT2Dtype dtype;
    GPT2Recompute recompute;  // --recompute
    int B, Bm, T;
    int l0, l1;               // this rank's blocks: its first chunk's l0, its last chunk's l1
    int cols;                 // --picture-cols
} PipeRun;

// Collective over the pipeline group: every stage's figures gathered to rank 0, which prints
// the last step as it ran, the time per step against the simulation and the theory, memory and
// messages against the formulas (unless quiet), and writes the --dump.
void pipe8_report(const PipeRun *run, const PipeClock *c);
