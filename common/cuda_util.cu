// cuda_util.cu: the few CUDA runtime calls the C side needs (see cuda_util.h). Every call is
// checked: a failure ends the job with file:line and CUDA's own description of the error.
#include <cuda_runtime.h>

#include "check.h"
#include "cuda_util.h"

// Every rank runs the same calls on its own GPU, and a CUDA error (no device, a driver fault)
// usually hits them all alike: rank 0 prints, the others follow (lab_fail_collective).
static void cuda_check(cudaError_t err, const char *file, int line) {
    if (err != cudaSuccess)
        lab_fail_collective("CUDA error %d at %s:%d: %s (is a GPU visible? try nvidia-smi)",
                            (int)err, file, line, cudaGetErrorString(err));
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

void *lab_cuda_malloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;  // a valid, unique pointer even for an empty tensor
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky: clear it, so the next call does not see it
        return NULL;               // the caller's message says the size and what fits
    }
    // not memory: no usable device, a driver problem; a smaller batch would not help
    if (err != cudaSuccess)
        lab_fail_collective("cudaMalloc of %zu bytes failed: %s (is a GPU visible? try "
                            "nvidia-smi, or use --device cpu)", bytes, cudaGetErrorString(err));
    cudaCheck(cudaMemset(p, 0, bytes));
    return p;
}

int lab_cuda_mem_info(size_t *free_b, size_t *total_b) {
    *free_b = *total_b = 0;
    if (cudaMemGetInfo(free_b, total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

void lab_cuda_free(void *p) {
    if (p) cudaCheck(cudaFree(p));
}

void lab_cuda_memcpy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    // cudaMemcpyDefault: the direction is found from the pointers (unified addressing).
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void lab_cuda_memset0(void *p, size_t bytes) {
    if (bytes == 0) return;
    cudaCheck(cudaMemset(p, 0, bytes));
}

void lab_cuda_synchronize(void) {
    cudaCheck(cudaDeviceSynchronize());
}

int lab_cuda_device_count(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    // No driver or no device is an answer (0 GPUs), not an internal error.
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();  // clear the sticky error state
        return 0;
    }
    cudaCheck(err);
    return n;
}

int lab_cuda_visible(char *why, size_t n) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        snprintf(why, n, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
        (void)cudaGetLastError();  // clear the sticky error state
        return 0;
    }
    if (count == 0) snprintf(why, n, "cudaGetDeviceCount: 0 devices");
    return count;
}

void lab_cuda_set_device(int dev) {
    int n = lab_cuda_device_count();
    if (dev < 0 || dev >= n)
        lab_fail("GPU %d requested but this node has %d GPU(s) (valid: 0..%d)", dev, n, n - 1);
    cudaCheck(cudaSetDevice(dev));
}

const char *lab_cuda_device_name(void) {
    static char name[256];
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    snprintf(name, sizeof name, "%s", prop.name);
    return name;
}
