// cuda_util.h: the few CUDA runtime calls the C side needs, behind plain C functions so that
// only common/*.cu files include CUDA headers. Available when built with LAB_CUDA; every call
// is checked and fails the job with file:line and the CUDA error string.
#pragma once
#include <stddef.h>

#ifdef LAB_CUDA
#ifdef __cplusplus
extern "C" {
#endif
// cudaMalloc + cudaMemset 0; NULL when the GPU is out of memory (the caller says so, with the
// size and what fits: mem_fail_out_of_memory); any other CUDA error fails the job here.
void *lab_cuda_malloc(size_t bytes);
// The current GPU's free and total bytes (cudaMemGetInfo); 0, or -1 when CUDA cannot say.
int lab_cuda_mem_info(size_t *free_b, size_t *total_b);
void lab_cuda_free(void *p);
void lab_cuda_memcpy(void *dst, const void *src, size_t bytes);   // cudaMemcpyDefault, synchronous
void lab_cuda_memset0(void *p, size_t bytes);
void lab_cuda_synchronize(void);
int lab_cuda_device_count(void);
// How many GPUs this process can use, never failing: 0 with CUDA's reason in why (no driver,
// no device, ...) when there are none. For the user-facing --device cuda check.
int lab_cuda_visible(char *why, size_t n);
void lab_cuda_set_device(int dev);
const char *lab_cuda_device_name(void);
#ifdef __cplusplus
}
#endif
#endif
