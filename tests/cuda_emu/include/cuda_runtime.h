// cuda_runtime.h (CPU emulator): just enough of the CUDA runtime to run common/*.cu on a
// machine without a GPU, so that tools/gpu_check can compare the CUDA kernels with the CPU
// ones here too (tests/cuda_emu/run.sh). It checks the CUDA code's logic (index arithmetic,
// masks, reductions, warp shuffles, barriers, launch shapes, cuBLAS arguments), not its speed
// and not the real compiler or hardware: the real test is tools/gpu_check on a GPU.
//
// How a launch runs: blocks one after another; the threads of a block are coroutines
// (ucontext) on one OS thread. A thread runs until it finishes or waits at a barrier
// (__syncthreads, or the two warp barriers inside __shfl_xor_sync); when every thread of the
// block (or of the warp) waits, they are released. Misuse a GPU would punish is an error
// here: a shuffle with lanes that already exited, threads waiting at different barriers
// (deadlock), a launch with an invalid shape, the TF32 math mode (in cublas_v2.h).
//
// "Device" memory is host memory between two PROT_NONE guard pages, the buffer placed at
// the END of its pages: a kernel that writes past the end of a buffer segfaults at once.
// The .cu files are compiled as C++ after rewriting `kernel<<<grid, block>>>(args)` into
// `emu_launch(kernel, emu_cfg(grid, block))(args)` (see run.sh).
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __shared__ static  // one copy shared by the block's threads (blocks run one at a time)
#define __forceinline__ inline

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// The built-in variables: set by the scheduler before it resumes a thread.
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

[[noreturn]] inline void emu_die(const char *what) {
    fprintf(stderr, "cuda_emu: %s\n", what);
    abort();
}

// ---- errors ----------------------------------------------------------------------------------

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
};
inline cudaError_t emu_last_error = cudaSuccess;

inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInsufficientDriver: return "insufficient driver";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu_last_error;
    emu_last_error = cudaSuccess;
    return e;
}

// ---- device and memory ---------------------------------------------------------------------------

struct cudaDeviceProp {
    char name[256];
};
inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    snprintf(p->name, sizeof p->name, "CPU emulator (tests/cuda_emu)");
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    *free_b = *total_b = (size_t)1 << 34;
    return cudaSuccess;
}

struct EmuAlloc {
    char *base;   // the mapping: guard page, body, guard page
    size_t len;
    size_t bytes; // what the caller asked for
};
inline std::map<char *, EmuAlloc> emu_allocs;

inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (bytes + page - 1) / page * page;
    if (body == 0) body = page;
    char *base = (char *)mmap(NULL, body + 2 * page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return cudaErrorMemoryAllocation;
    mprotect(base, page, PROT_NONE);
    mprotect(base + page + body, page, PROT_NONE);
    // End exactly at the guard page for float and int buffers (a multiple of 4 bytes); a
    // buffer of doubles (a multiple of 8 bytes) then still starts 8-byte aligned.
    size_t rounded = (bytes + 3) / 4 * 4;
    char *q = base + page + body - rounded;
    memset(q, 0xff, rounded);  // NaN everywhere: reading memory never written shows up
    emu_allocs[q] = EmuAlloc{base, body + 2 * page, bytes};
    *p = q;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void *p) {
    auto it = emu_allocs.find((char *)p);
    if (it == emu_allocs.end()) return cudaErrorInvalidValue;
    munmap(it->second.base, it->second.len);
    emu_allocs.erase(it);
    return cudaSuccess;
}
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
    memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    memset(p, value, bytes);
    return cudaSuccess;
}

// ---- device intrinsics ---------------------------------------------------------------------------------

inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }

// ---- the scheduler ---------------------------------------------------------------------------------------

enum EmuState { EMU_RUNNABLE, EMU_WAIT_BLOCK, EMU_WAIT_WARP, EMU_DONE };
struct EmuThread {
    ucontext_t ctx;
    dim3 tid;
    EmuState state;
    double slot;  // the value this lane offers in a shuffle
};
inline ucontext_t emu_sched;
inline std::vector<EmuThread> emu_threads;
inline std::vector<char *> emu_stacks;
inline int emu_cur = -1;  // index of the running thread, -1 in host code
inline std::function<void()> *emu_body;
constexpr size_t EMU_STACK = 128 * 1024;

inline void emu_entry(void) {
    (*emu_body)();
    emu_threads[emu_cur].state = EMU_DONE;  // returns to emu_sched through uc_link
}

inline void emu_wait(EmuState s) {
    if (emu_cur < 0) emu_die("a barrier or shuffle called outside a kernel");
    EmuThread &t = emu_threads[emu_cur];
    t.state = s;
    swapcontext(&t.ctx, &emu_sched);
}

inline void __syncthreads(void) { emu_wait(EMU_WAIT_BLOCK); }

// Butterfly exchange inside a warp of 32 lanes: offer the value, wait for the warp, read the
// partner's, wait again (so nobody overwrites a slot before the whole warp has read it).
template <class V>
inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32) {
    static_assert(sizeof(V) <= sizeof(double), "shuffle of a type wider than 8 bytes");
    if (mask != 0xffffffffu || width != 32) emu_die("__shfl_xor_sync: only the full-warp form is emulated");
    int me = emu_cur;
    memcpy(&emu_threads[me].slot, &v, sizeof v);
    emu_wait(EMU_WAIT_WARP);
    int src = (me / 32) * 32 + ((me % 32) ^ lane_mask);
    if (src >= (int)emu_threads.size()) emu_die("__shfl_xor_sync: partner lane outside the block");
    V r;
    memcpy(&r, &emu_threads[src].slot, sizeof r);
    emu_wait(EMU_WAIT_WARP);
    return r;
}

// Runs one block to completion.
inline void emu_run_block(std::function<void()> &body) {
    size_t n = (size_t)blockDim.x * blockDim.y * blockDim.z;
    emu_threads.assign(n, EmuThread{});
    while (emu_stacks.size() < n) emu_stacks.push_back((char *)malloc(EMU_STACK));
    emu_body = &body;
    for (size_t i = 0; i < n; i++) {
        EmuThread &t = emu_threads[i];
        t.tid = dim3((unsigned)(i % blockDim.x), (unsigned)(i / blockDim.x % blockDim.y),
                     (unsigned)(i / ((size_t)blockDim.x * blockDim.y)));
        t.state = EMU_RUNNABLE;
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = emu_stacks[i];
        t.ctx.uc_stack.ss_size = EMU_STACK;
        t.ctx.uc_link = &emu_sched;
        makecontext(&t.ctx, emu_entry, 0);
    }
    for (;;) {
        // run every runnable thread until it finishes or waits
        for (size_t i = 0; i < n; i++) {
            if (emu_threads[i].state != EMU_RUNNABLE) continue;
            emu_cur = (int)i;
            threadIdx = emu_threads[i].tid;
            swapcontext(&emu_sched, &emu_threads[i].ctx);
        }
        emu_cur = -1;
        size_t done = 0, at_block = 0;
        for (auto &t : emu_threads) {
            done += t.state == EMU_DONE;
            at_block += t.state == EMU_WAIT_BLOCK;
        }
        if (done == n) break;
        // release the warps whose lanes all wait in a shuffle
        int released = 0;
        for (size_t w = 0; w < n; w += 32) {
            size_t end = w + 32 < n ? w + 32 : n;
            size_t waiting = 0, exited = 0;
            for (size_t i = w; i < end; i++) {
                waiting += emu_threads[i].state == EMU_WAIT_WARP;
                exited += emu_threads[i].state == EMU_DONE;
            }
            if (waiting == 0) continue;
            if (exited) emu_die("__shfl_xor_sync with a full mask while lanes of the warp have exited");
            if (waiting == end - w) {
                for (size_t i = w; i < end; i++) emu_threads[i].state = EMU_RUNNABLE;
                released = 1;
            }
        }
        if (released) continue;
        // __syncthreads: released when every thread that has not exited waits there
        if (at_block + done == n) {
            for (auto &t : emu_threads)
                if (t.state == EMU_WAIT_BLOCK) t.state = EMU_RUNNABLE;
            continue;
        }
        emu_die("deadlock: threads wait at different barriers (divergent __syncthreads or shuffle)");
    }
}

struct EmuCfg {
    dim3 grid, block;
};
inline EmuCfg emu_cfg(dim3 grid, dim3 block, size_t shared_bytes = 0, void *stream = NULL) {
    if (shared_bytes != 0 || stream != NULL) emu_die("dynamic shared memory and streams are not emulated");
    return EmuCfg{grid, block};
}

template <class F>
struct EmuLauncher {
    F kernel;
    EmuCfg cfg;
    template <class... A>
    void operator()(A... args) {
        dim3 g = cfg.grid, b = cfg.block;
        size_t threads = (size_t)b.x * b.y * b.z;
        if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 ||
            threads == 0 || threads > 1024 || b.z > 64) {
            emu_last_error = cudaErrorInvalidConfiguration;  // as a real launch: nothing runs
            return;
        }
        std::function<void()> body = [&]() { kernel(args...); };
        gridDim = g;
        blockDim = b;
        for (unsigned z = 0; z < g.z; z++)
            for (unsigned y = 0; y < g.y; y++)
                for (unsigned x = 0; x < g.x; x++) {
                    blockIdx = dim3(x, y, z);
                    emu_run_block(body);
                }
    }
};
template <class F>
inline EmuLauncher<F> emu_launch(F kernel, EmuCfg cfg) {
    return EmuLauncher<F>{kernel, cfg};
}
