// cuda_runtime.h (NCCL emulator, C): the CUDA runtime calls common/dist_nccl.c makes, on the
// host, so that tests/cuda_emu/run_nccl.sh can run tools/nccl_check on ranks without GPUs.
// "Device" memory is host memory (from cuda_util_emu.c). Every stream operation runs at
// once, in order, so streams and events order nothing here: this checks the backend's
// arguments (buffers, offsets, in-place forms, roots, groups, byte counters), not its
// stream ordering, which only a GPU run of nccl_check shows.
#pragma once
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotReady = 600 } cudaError_t;
typedef struct EmuStream *cudaStream_t;
typedef struct EmuEvent { int queries; } *cudaEvent_t;
typedef enum { cudaMemcpyDeviceToDevice = 3 } cudaMemcpyKind;
struct cudaPointerAttributes { int device; };

#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

static inline const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorNotReady ? "device not ready" : "invalid argument";
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = (cudaStream_t)0x2;  // the comm stream: a name only
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    e->queries = 0;
    return cudaSuccess;
}
// The first query of a recorded event says "not ready", so that dist_test's waiting path runs.
static inline cudaError_t cudaEventQuery(cudaEvent_t e) { return e->queries++ == 0 ? cudaErrorNotReady : cudaSuccess; }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)s, (void)e, (void)flags;
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                                          cudaStream_t s) {
    (void)k, (void)s;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
// Stream-ordered allocation (the uneven reduce-scatter's padded copies): here at once.
static inline cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    (void)s;
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)s; free(p); return cudaSuccess; }
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    (void)s;
    memset(p, v, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    (void)p;
    a->device = 0;
    return cudaSuccess;
}
