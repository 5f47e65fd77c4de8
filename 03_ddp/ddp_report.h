// ddp_report.h: 03's flags, what its training loop measures, and the report it prints from
// them (the header, the --check-no-sync tally, the per-rank table, the overlap, --dump).
// main.c's train() is the loop; this is what it hands over at the end.
#pragma once
#include "ddp_buckets.h"
#include "dist.h"
#include "gpt2.h"
#include "overlap.h"
#include "session.h"

// The chapter's own flags.
typedef struct DdpFlags {
    float bucket_mb;        // bucket cap (MiB), PyTorch's bucket_cap_mb
    float first_bucket_mb;  // cap of the first bucket (MiB): it launches early
    int grad_accum;         // micro-batches per optimizer step (no_sync on all but the last)
    int no_overlap;         // one all-reduce of all gradients after the whole backward
    int check_no_sync;      // compare gradients across ranks after every micro-step
    int overlap_steps;      // extra steps timed compute-only and comm-only (overlap %)
    const char *progress;   // who moves the bucket all-reduces: "thread" or "poll"
    int pack_buckets;       // copy each bucket into its own buffer (else: in place, views)
    int launch_late;        // buckets as usual, but all started after the whole backward
} DdpFlags;

// What the loop measures, per rank.
typedef struct DdpFigures {
    double *t_train;             // per step run: forward + backward + exposed communication
    double t_compute, t_wait;    // summed over the steps
    double grad_sent;            // bytes the gradient all-reduces sent
    double bcast_sent, bcast_recv;  // the weights' broadcast before the loop
    double ct_busy0, ct_cpu0;    // the communication thread's times before the loop ...
    double ct_busy, ct_cpu;      // ... and after it
    double sent, recv;           // bytes per step run (without the no_sync checks)
    // --check-no-sync: inside no_sync gradients must differ across ranks, after it agree
    int nosync_checks, nosync_differ, sync_checks, sync_agree;
    double check_sent, check_recv;  // the bytes the comparisons moved (left out per step)
    double replica_diff;         // (--dump) largest |p_r - p_0| over ranks and weights
    OverlapMeter meter;
} DdpFigures;

// Before the loop (after the broadcast): the broadcast's bytes, then the counters from zero.
void ddp_figures_start(DdpFigures *fig, const Session *s);
// --check-no-sync after a micro-step: do all ranks hold the same gradients right now?
void ddp_check_no_sync(DdpFigures *fig, GPT2 *m, DistGroup *g, int inside_no_sync);

void ddp_print_header(const Session *s, const DdpFlags *f, const Ddp *ddp, int Bl, int Bm);

// After the loop: the run's byte counters, the communication thread's times, the replicas'
// agreement (for --dump); before session_finish (which moves bytes: --trace).
void ddp_figures_end(DdpFigures *fig, Session *s);
// After session_finish: the calibration steps (overlap.c), the per-rank table, the no_sync
// tally, the overlap, the --dump file. Frees fig.
void ddp_report(Session *s, const DdpFlags *f, Ddp *ddp, DdpFigures *fig, int row0, int Bm);
