// cuda_util_emu.c (NCCL emulator): common/cuda_util.h over host memory, and an empty CUDA
// kernel table (nccl_check runs no kernels). See cuda_runtime.h here.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_util.h"
#include "kernels.h"

void *lab_cuda_malloc(size_t bytes) { return lab_xcalloc(bytes ? bytes : 1, 1); }
void lab_cuda_free(void *p) { free(p); }
void lab_cuda_memcpy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
void lab_cuda_memset0(void *p, size_t bytes) { memset(p, 0, bytes); }
void lab_cuda_synchronize(void) {}
int lab_cuda_device_count(void) { return 1; }
int lab_cuda_visible(char *why, size_t n) { (void)why; (void)n; return 1; }  // the emulated GPU
void lab_cuda_set_device(int dev) { LAB_CHECK(dev == 0, "emulated GPU %d: only GPU 0 exists", dev); }
const char *lab_cuda_device_name(void) { return "NCCL emulator (host memory)"; }

const Kernels kernels_cuda = {0};
const Kernels *kernels_cuda_tf32(void);  // kernels_cpu.c's kernels_get_tf32 names it
const Kernels *kernels_cuda_tf32(void) { return &kernels_cuda; }
