// cublas_v2.h (CPU emulator): the cuBLAS calls common/kernels_cuda.cu makes, implemented as
// the plain column-major triple loop of the cuBLAS documentation (accumulated in double), with
// cuBLAS's own argument checks: a leading dimension too small for the matrix it describes is
// CUBLAS_STATUS_INVALID_VALUE, as on a GPU. See cuda_runtime.h here for the why.
#pragma once
#include "cuda_runtime.h"

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2, CUBLAS_TF32_TENSOR_OP_MATH = 3 };

struct EmuCublas {
    cublasMath_t math;
};
typedef EmuCublas *cublasHandle_t;

inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new EmuCublas{CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
inline const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    }
    return "unknown cuBLAS status";
}

// TF32 (CUBLAS_TF32_TENSOR_OP_MATH): each input keeps 10 of fp32's 23 mantissa bits, rounded to
// nearest even, before the products (accumulated at full precision, as tensor cores do).
inline double emu_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    float y;
    memcpy(&y, &u, 4);
    return y;
}

// C[i + j·ldc] = alpha · Σ_l op(A)(i,l) · op(B)(l,j) + beta · C[i + j·ldc]   (C not read if beta == 0)
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                                cublasOperation_t tb, int m, int n, int k,
                                                const float *alpha, const float *A, int lda,
                                                long long strideA, const float *B, int ldb,
                                                long long strideB, const float *beta, float *C,
                                                int ldc, long long strideC, int batch) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->math != CUBLAS_DEFAULT_MATH && h->math != CUBLAS_TF32_TENSOR_OP_MATH)
        emu_die("cuBLAS math mode is neither the default fp32 nor TF32");
    const bool tf32 = h->math == CUBLAS_TF32_TENSOR_OP_MATH;
    int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || lda < (rows_a > 1 ? rows_a : 1) ||
        ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int b = 0; b < batch; b++) {
        const float *Ab = A + b * strideA, *Bb = B + b * strideB;
        float *Cb = C + b * strideC;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0.0;
                for (int l = 0; l < k; l++) {
                    double a = ta == CUBLAS_OP_N ? Ab[i + (size_t)l * lda] : Ab[l + (size_t)i * lda];
                    double bb = tb == CUBLAS_OP_N ? Bb[l + (size_t)j * ldb] : Bb[j + (size_t)l * ldb];
                    s += tf32 ? emu_tf32((float)a) * emu_tf32((float)bb) : a * bb;
                }
                float *c = &Cb[i + (size_t)j * ldc];
                *c = (float)(*alpha * s + (*beta == 0.0f ? 0.0 : (double)*beta * *c));
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                  int m, int n, int k, const float *alpha, const float *A, int lda,
                                  const float *B, int ldb, const float *beta, float *C, int ldc) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc,
                                     0, 1);
}
