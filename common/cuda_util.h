// cuda_util.h: the few CUDA runtime calls the C side needs, behind plain C functions so that
// only common/*.cu files include CUDA headers. Available when built with LAB_CUDA; every call
// is checked and fails the job with file:line and the CUDA error string.
#pragma once
#include <stddef.h>

#ifdef LAB_CUDA
#ifdef __cplusplus
extern "C" {
#endif
void *lab_cuda_malloc(size_t bytes);            // cudaMalloc + cudaMemset 0
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
