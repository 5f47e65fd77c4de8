// results.h: what a chapter run writes with --dump FILE, for the test harness to compare runs:
// per-step losses, the final parameters (full, gathered on rank 0), and named figures
// (bytes sent per step, memory per category, ...). Written atomically with a CRC32.
//
// File layout (little-endian): "LABDUMP1", int32 nsteps, float losses[nsteps], uint64 nparams,
// float params[nparams], int32 nkv, nkv x (char key[48], double value), uint32 crc of all before.
#pragma once
#include <stddef.h>

#include "check.h"

#define RESULTS_MAX_KV 128  // 09 on 8 ranks: 64 per-rank memory keys, the peak and prediction, --val-every's loss

typedef struct RunResults {
    int nsteps;
    float *losses;          // nsteps (malloc'd)
    size_t nparams;
    float *params;          // nparams (malloc'd), may be NULL when nparams == 0
    int nkv;
    char keys[RESULTS_MAX_KV][48];
    double vals[RESULTS_MAX_KV];
} RunResults;

void results_init(RunResults *r, int nsteps, size_t nparams);   // allocates, zeroes
void results_set(RunResults *r, const char *key, double val);   // add or overwrite
// results_set with the key built printf-style: results_setf(r, v, "first_%s", name).
void results_setf(RunResults *r, double val, const char *fmt, ...) LAB_PRINTF(3, 4);
double results_get(const RunResults *r, const char *key, double missing);
int results_has(const RunResults *r, const char *key);
void results_write(const char *path, const RunResults *r);      // atomic; fails the job on error
// 0 on success; on failure returns -1 and writes a reason into err (never aborts: tests use it).
int results_read(const char *path, RunResults *r, char *err, size_t errlen);
void results_free(RunResults *r);
// The peak bytes of every memory category of this process (mem.h), as the figures
// mem_params, mem_grads, mem_master, mem_opt_m, mem_opt_v, mem_acts, mem_comm, mem_other, and
// mem_peak: the peak of their total since the process started (mem_process_peak: what the run
// needed, not the sum of the peaks; mem_reset_peaks does not lower it), and, where the
// chapter predicted it before allocating (mem_predict.h), mem_predicted (mem_predicted_peak).
void results_set_memory(RunResults *r);
// Only the last two (for a dump whose 64 figures are nearly all taken: 08's).
void results_set_peak(RunResults *r);
