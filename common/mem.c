// mem.c: tagged allocations and per-category current/peak bytes (see mem.h).
//
// A small table of live allocations {ptr, bytes, category, device}: enough to free by pointer,
// to know which device a pointer lives on, and to count bytes per category.
#include "mem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#ifdef LAB_CUDA
#include "cuda_util.h"
#endif

typedef struct Allocation {
    void *ptr;
    size_t bytes;      // as requested (what the report counts)
    MemCategory cat;
    Device dev;
} Allocation;

static Allocation *allocs = NULL;
static size_t nallocs = 0, cap_allocs = 0;
static size_t cur[MEM_NCATS], peak[MEM_NCATS];
static size_t total_cur = 0, total_peak = 0;
static size_t process_peak = 0;  // total_peak that mem_reset_peaks leaves alone
static double predicted_peak = 0;  // mem_predict.h's prediction for this rank

static const char *cat_names[MEM_NCATS] = {
    "params", "grads", "master", "adam m", "adam v", "activations", "comm", "other",
};

const char *mem_category_name(MemCategory cat) {
    if ((int)cat < 0 || cat >= MEM_NCATS) return "?";
    return cat_names[cat];
}

// Index of p in the table, or -1. Linear: a model has a few dozen live buffers.
static long find_alloc(const void *p) {
    for (size_t i = nallocs; i-- > 0;)
        if (allocs[i].ptr == p) return (long)i;
    return -1;
}

double mem_host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024.0;
}

int mem_ranks_on_this_machine(void) {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return lab_log_world > 0 ? lab_log_world : 1;
}

// Bytes this rank holds on `dev` now (its live allocations there).
static double held_on(Device dev) {
    double sum = 0;
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i].dev == dev) sum += (double)allocs[i].bytes;
    return sum;
}

static const char *injected;  // mem_fail_next_alloc's reason, until the allocation it fails

// An allocation failed: every rank builds the same model, so every rank meets it with the same
// size; one message (lab_fail_collective), the same for host and GPU memory: what was asked,
// what the memory has, what would fit, and which flags size it. An injected failure
// (--inject-oom-step) is one rank's: its message at once (the others wait in a collective).
void mem_fail_out_of_memory(size_t bytes, MemCategory cat, Device dev) {
    char want[32], avail[32], each[32], total[32], held[32];
    const char *lower = cat == MEM_ACTS || cat == MEM_OTHER
                            ? "a smaller --batch (or --seq)"
                      : cat == MEM_COMM ? "a smaller model or smaller communication buffers"
                                        : "a smaller model (--layers, --channels, --vocab)";
    const char *what = mem_category_name(cat);
    mem_format(want, sizeof want, (double)bytes);
    if (injected)
        lab_fail("out of %s memory: allocating %s for %s failed (%s)",
                 dev == DEV_CUDA ? "GPU" : "host", want, what, injected);
    if (dev == DEV_CUDA) {
        // the GPU's free memory already counts what the other ranks and processes on it hold:
        // this rank's buffers fit in what it holds plus what is free
        size_t free_b = 0, total_b = 0;
#ifdef LAB_CUDA
        if (lab_cuda_mem_info(&free_b, &total_b) != 0) total_b = 0;
#endif
        if (total_b == 0)
            lab_fail_collective("out of GPU memory: allocating %s for %s failed; use %s", want,
                                what, lower);
        mem_format(avail, sizeof avail, (double)free_b);
        mem_format(total, sizeof total, (double)total_b);
        mem_format(held, sizeof held, held_on(DEV_CUDA));
        mem_format(each, sizeof each, held_on(DEV_CUDA) + (double)free_b);
        lab_fail_collective("out of GPU memory: allocating %s for %s failed; the GPU has %s free "
                            "of %s, and this rank holds %s on it already: about %s for all of "
                            "this rank's GPU buffers: use %s", want, what, avail, total, held,
                            each, lower);
    }
    double free_bytes = mem_host_available();
    int ranks = mem_ranks_on_this_machine();
    if (free_bytes < 0)
        lab_fail_collective("out of host memory: allocating %s for %s failed; use %s", want,
                            what, lower);
    mem_format(avail, sizeof avail, free_bytes);
    mem_format(each, sizeof each, free_bytes / ranks);
    lab_fail_collective("out of host memory: allocating %s for %s failed; this machine has %s "
                        "available (MemAvailable) for the %d rank%s of this job on it, about %s "
                        "per rank for all of its buffers: use %s", want, what, avail, ranks,
                        ranks == 1 ? "" : "s", each, lower);
}

void *mem_alloc(size_t bytes, MemCategory cat, Device dev) {
    LAB_CHECK((int)cat >= 0 && cat < MEM_NCATS, "mem_alloc: bad category %d", (int)cat);
    // Every allocation gets its own non-NULL pointer, even for 0 bytes, so it can be tracked.
    size_t want = bytes ? bytes : 1;
    void *p = NULL;
    if (injected) {
        // --inject-oom-step: this allocation fails (p stays NULL)
    } else if (dev == DEV_CUDA) {
#ifdef LAB_CUDA
        p = lab_cuda_malloc(want);  // zeroed; NULL when the GPU is out of memory
#else
        lab_fail("--device cuda needs a CUDA build: rebuild with `make CUDA=1` on a machine with nvcc");
#endif
    } else {
        // 64-byte aligned (one cache line, AVX-512 loads); aligned_alloc wants a multiple.
        size_t rounded = (want + 63) / 64 * 64;
        if (rounded < want) p = NULL;  // overflow
        else p = aligned_alloc(64, rounded);
        if (p) memset(p, 0, rounded);
    }
    if (!p) mem_fail_out_of_memory(bytes, cat, dev);
    if (nallocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
        Allocation *grown = realloc(allocs, cap_allocs * sizeof(Allocation));
        if (!grown) lab_fail("out of host memory: growing the allocation table");
        allocs = grown;
    }
    allocs[nallocs++] = (Allocation){p, bytes, cat, dev};
    cur[cat] += bytes;
    if (cur[cat] > peak[cat]) peak[cat] = cur[cat];
    total_cur += bytes;
    if (total_cur > total_peak) total_peak = total_cur;
    if (total_cur > process_peak) process_peak = total_cur;
    return p;
}

void mem_free(void *p) {
    if (!p) return;
    long i = find_alloc(p);
    LAB_CHECK(i >= 0, "mem_free: %p was not allocated by mem_alloc (or freed twice)", p);
    Allocation a = allocs[i];
    cur[a.cat] -= a.bytes;
    total_cur -= a.bytes;
    allocs[i] = allocs[--nallocs];
    if (a.dev == DEV_CUDA) {
#ifdef LAB_CUDA
        lab_cuda_free(p);
#endif
    } else {
        free(p);
    }
}

size_t mem_size_of(const void *p) {
    long i = find_alloc(p);
    LAB_CHECK(i >= 0, "mem_size_of: %p is not a live mem_alloc allocation", p);
    return allocs[i].bytes;
}

size_t mem_current(MemCategory cat) { return cur[cat]; }
size_t mem_peak(MemCategory cat) { return peak[cat]; }
size_t mem_total_current(void) { return total_cur; }
size_t mem_total_peak(void) { return total_peak; }
size_t mem_process_peak(void) { return process_peak; }
void mem_set_predicted_peak(double bytes) { predicted_peak = bytes; }
double mem_predicted_peak(void) { return predicted_peak; }

void mem_reset_peaks(void) {
    for (int c = 0; c < MEM_NCATS; c++) peak[c] = cur[c];
    total_peak = total_cur;
}

MemPeaks mem_peaks_save(void) {
    MemPeaks p;
    memcpy(p.peak, peak, sizeof peak);
    p.total = total_peak;
    p.process = process_peak;
    return p;
}

void mem_peaks_restore(const MemPeaks *p) {  // (never below what is live now)
    for (int c = 0; c < MEM_NCATS; c++) peak[c] = p->peak[c] > cur[c] ? p->peak[c] : cur[c];
    total_peak = p->total > total_cur ? p->total : total_cur;
    process_peak = p->process > total_cur ? p->process : total_cur;
}

char *mem_format(char *buf, size_t n, double bytes) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%.0f %s", bytes, units[u]);
    else snprintf(buf, n, "%.2f %s", bytes, units[u]);
    return buf;
}

void mem_report(FILE *out, const char *title) {
    char c1[32], c2[32];
    fprintf(out, "%s\n", title ? title : "memory");
    fprintf(out, "  %-12s %12s %12s %7s\n", "category", "current", "peak", "share");
    for (int c = 0; c < MEM_NCATS; c++) {
        double share = total_cur ? 100.0 * (double)cur[c] / (double)total_cur : 0.0;
        fprintf(out, "  %-12s %12s %12s %6.1f%%\n", cat_names[c],
                mem_format(c1, sizeof c1, (double)cur[c]), mem_format(c2, sizeof c2, (double)peak[c]),
                share);
    }
    fprintf(out, "  %-12s %12s %12s %6.1f%%\n", "total", mem_format(c1, sizeof c1, (double)total_cur),
            mem_format(c2, sizeof c2, (double)total_peak), total_cur ? 100.0 : 0.0);
}

Device mem_device_of(const void *p) {
    // Pointers inside an allocation (views) count too: search by range.
    const char *q = p;
    for (size_t i = 0; i < nallocs; i++) {
        const char *base = allocs[i].ptr;
        if (q >= base && q < base + (allocs[i].bytes ? allocs[i].bytes : 1)) return allocs[i].dev;
    }
    return DEV_CPU;
}

void mem_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
#ifdef LAB_CUDA
    if (mem_device_of(dst) == DEV_CUDA || mem_device_of(src) == DEV_CUDA) {
        lab_cuda_memcpy(dst, src, bytes);
        return;
    }
#endif
    memmove(dst, src, bytes);
}

void mem_zero(void *p, size_t bytes) {
    if (bytes == 0) return;
#ifdef LAB_CUDA
    if (mem_device_of(p) == DEV_CUDA) {
        lab_cuda_memset0(p, bytes);
        return;
    }
#endif
    memset(p, 0, bytes);
}

void mem_fail_next_alloc(const char *why) { injected = why; }
