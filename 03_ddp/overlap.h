// overlap.h: how much of DDP's communication backward hides, and what the communication costs.
//
// The share hidden is read off each step's timeline, not computed from differences of timings
// (which noise on a shared machine pushed to "295 %" or "-40 %"). In a step that communicates:
//   - backward runs over [b0, b1) (the last micro-step's, with --grad-accum);
//   - each bucket's all-reduce is in flight from its launch to the moment it is seen complete
//     (after the backward piece it finished in, or in ddp_wait); --no-overlap's one all-reduce
//     from its start to its end, after backward;
//   - communication time = the time during which at least one all-reduce is in flight (the
//     union of those intervals: buckets queued together count once), hidden = the part of it
//     inside [b0, b1).
// hidden / communication is in [0, 1] by construction, and exactly 0 when nothing is launched
// before backward ends (--no-overlap, --launch-after-backward). It is a share of time, not a
// speedup: a hidden all-reduce can still slow the compute it shares a core with; the
// calibration steps below (compute only, communication only) show that cost.
#pragma once
#include "data.h"
#include "ddp_buckets.h"
#include "dist.h"
#include "gpt2.h"

typedef struct OverlapMeter {
    double hidden_s;    // communication in flight inside backward, summed over the steps
    double inflight_s;  // communication in flight, summed over the steps
} OverlapMeter;

// One communicating step: backward over [b0, b1); the all-reduces in flight over the n
// intervals iv[i][0] .. iv[i][1] (any order; may overlap each other). Sorts iv.
void overlap_add_step(OverlapMeter *m, double b0, double b1, double (*iv)[2], int n);
// The same with the intervals of every bucket of d's last step (call right after ddp_wait).
void overlap_add_ddp_step(OverlapMeter *m, double b0, double b1, const Ddp *d);

// Calibration (--overlap-steps): a few more steps, each timed twice: compute only (forward and
// backward of every micro-batch, no all-reduce) and communication only (the same all-reduces,
// no compute, all ranks starting together at a barrier). The fastest of each is kept:
// interference only ever adds time. d NULL: one all-reduce of the whole gradient.
typedef struct OverlapCalibration {
    double compute_s, comm_s;  // fastest compute-only / communication-only step
    double ct_busy_s, ct_cpu_s;  // the communication thread in the fastest comm-only step:
                                 // wall time in all-reduces, and of it time on a core
} OverlapCalibration;
OverlapCalibration overlap_calibrate(GPT2 *m, const DataSource *data, int B, int row0, int Bm,
                                     int K, Ddp *d, DistGroup *g, int nsteps);

// What each rank reports (gathered to rank 0 as doubles, OVERLAP_NFIELDS of them).
enum { OV_HIDDEN, OV_INFLIGHT, OV_STEP, OV_CT_BUSY, OV_CT_CPU, OV_CAL_COMP, OV_CAL_COMM,
       OV_CAL_BUSY, OV_CAL_CPU, OVERLAP_NFIELDS };
// Packs the meter (per step: divided by nrun), the fastest training step, the communication
// thread's times per step during training and the calibration into out[OVERLAP_NFIELDS].
void overlap_pack(const OverlapMeter *m, int nrun, double fastest_step, double ct_busy_s,
                  double ct_cpu_s, const OverlapCalibration *c, double *out);

// The share hidden over all ranks (sum of hidden / sum of in flight), in percent; -1 when it
// cannot be measured (nothing was communicated: one rank, or no step run). rank_fields: each
// rank's OVERLAP_NFIELDS at all + r * stride.
double overlap_percent(const double *rank_fields, int nranks, int stride);
// The overlap section of 03's report (rank 0): the share hidden, or why it cannot be measured;
// with calibration steps the step / compute only / communication only times and, with a
// communication thread, what its all-reduces cost on each rank.
void overlap_print(const double *rank_fields, int nranks, int stride, int overlap_on,
                   int thread_on, int ncal);
