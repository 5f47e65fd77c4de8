// mem.h: every tensor allocation is tagged by what it holds, so each rank can report where
// its memory goes (the 16-bytes-per-parameter story of chapter 00, measured, not assumed).
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "check.h"

#ifdef __cplusplus  // callable from the CUDA .cu files
extern "C" {
#endif

typedef enum { DEV_CPU = 0, DEV_CUDA = 1 } Device;

typedef enum {
    MEM_PARAMS = 0,  // the weights the forward pass reads (fp32, or bf16 in mixed precision)
    MEM_GRADS,       // their gradients
    MEM_MASTER,      // fp32 master weights (mixed precision only)
    MEM_OPT_M,       // Adam first moment
    MEM_OPT_V,       // Adam second moment
    MEM_ACTS,        // activations saved for backward, and their gradients
    MEM_COMM,        // communication buffers (buckets, staging, gathered shards)
    MEM_OTHER,       // everything else (inputs, targets, scratch)
    MEM_NCATS
} MemCategory;

// Zero-initialized allocation of `bytes` on `dev`, counted under `cat`. Never returns NULL
// (fails the job with a message that names the category and size). bytes == 0 is allowed.
void *mem_alloc(size_t bytes, MemCategory cat, Device dev);
// The one out-of-memory message, host or GPU (mem_alloc's, and the CUDA code's own scratch):
// the size, what the memory has (MemAvailable shared by this machine's ranks; the GPU's free
// memory and what this rank holds on it), and the flags that make it smaller. Said once for
// the job (every rank meets the same size).
LAB_NORETURN void mem_fail_out_of_memory(size_t bytes, MemCategory cat, Device dev);
void mem_free(void *p);                 // NULL is fine
// Fault injection (--inject-oom-step): the next mem_alloc of this process fails as if the
// device were full, through the same out-of-memory message, naming `why` (a string that
// outlives the call) and this rank alone (the others did not fail: lab_fail, not collective).
void mem_fail_next_alloc(const char *why);
size_t mem_size_of(const void *p);      // bytes of a live allocation

size_t mem_current(MemCategory cat);    // bytes live now
size_t mem_peak(MemCategory cat);       // high-water mark since start or last reset
size_t mem_total_current(void);
size_t mem_total_peak(void);            // peak of the total (not the sum of per-category peaks)
size_t mem_process_peak(void);          // peak of the total since the process started (the
                                        // memory it needed; mem_reset_peaks leaves it)
void mem_reset_peaks(void);             // peaks := current
// The peaks as they are now, and back: an aside that must not count in the run's figures (the
// loop's validation and sampling model, common/text.h) saves them before and restores them
// once it has freed what it allocated (a peak is never restored below what is live then).
typedef struct MemPeaks { size_t peak[MEM_NCATS], total, process; } MemPeaks;
MemPeaks mem_peaks_save(void);
void mem_peaks_restore(const MemPeaks *p);
// This rank's peak as predicted before it allocated (mem_predict.h records it; 0: none).
void mem_set_predicted_peak(double bytes);
double mem_predicted_peak(void);
const char *mem_category_name(MemCategory cat);   // "params", "grads", "master", "adam m", ...

// Aligned table: category, current, peak (KiB/MiB/GiB), share of total.
void mem_report(FILE *out, const char *title);
// Human-readable bytes with unit into buf ("12.50 MiB"). Returns buf.
char *mem_format(char *buf, size_t n, double bytes);

// Bytes the kernel says a new host allocation can still get (MemAvailable of /proc/meminfo), or -1.
double mem_host_available(void);
// Ranks of this job on this machine, which share its memory: from the launcher
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE), else the whole job.
int mem_ranks_on_this_machine(void);

// Device of a pointer: allocations made here know theirs; any other pointer is host memory.
Device mem_device_of(const void *p);
// Copy between any two buffers (host or device, found from the allocation table).
void mem_copy(void *dst, const void *src, size_t bytes);
void mem_zero(void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
