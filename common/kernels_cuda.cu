// kernels_cuda.cu: the Kernels table (kernels.h) on an NVIDIA GPU.
//
// Matmuls go to cuBLAS; everything else is a small hand-written kernel that computes the
// same formula, in the same form, as kernels_cpu.c, so the two can be read side by side.
// All pointers are device pointers. Every kernel launch and cuBLAS call is checked (file:line).
// tools/gpu_check compares each kernel here with its CPU twin.
//
// Two patterns recur:
//   - elementwise ops use grid-stride loops: any n works with a bounded grid;
//   - row ops (LayerNorm, softmax) give one warp (32 threads) to each row and combine the
//     lanes' partial sums with warp shuffles.
// Nothing uses atomics: every output element is written by one thread that adds its terms in
// a fixed order, so a run is bit-for-bit repeatable (a resumed run equals an unbroken one).
//
// cuBLAS is column-major. A row-major (R, K) matrix is, read column-major, its transpose
// (K, R) with leading dimension K. Each cuBLAS call below states the row-major product it
// computes; the arguments follow from that rule.
#include <assert.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "cuda_util.h"
#include "kernels.h"

// ---- checks ---------------------------------------------------------------------------------

static void cuda_check(cudaError_t err, const char *file, int line) {
    if (err != cudaSuccess)
        lab_fail_at(file, line, "CUDA error %d: %s", (int)err, cudaGetErrorString(err));
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
// A bad launch (too many threads, no device, ...) is reported here, not at some later call.
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

static void cublas_check(cublasStatus_t status, const char *file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        lab_fail_at(file, line, "cuBLAS error %d: %s", (int)status, cublasGetStatusString(status));
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

// Tensor cores. kernels_cuda multiplies in plain fp32, no TF32: results then agree with the
// CPU to fp32 rounding, which the equivalence tests rely on. The table of bf16 models
// (kernels_cuda_tf32, at the end) lets cuBLAS round each matmul input to TF32 (10 mantissa
// bits, more than bf16's 8; fp32 accumulation) and run on tensor cores, 8x the fp32 rate on an
// H100. Its matmul wrappers set this flag for the duration of one call.
static int use_tf32 = 0;

// One cuBLAS handle per process, created on first use (after the rank picked its GPU).
static cublasHandle_t cublas(void) {
    static cublasHandle_t handle = NULL;
    if (handle == NULL) cublasCheck(cublasCreate(&handle));
    cublasCheck(cublasSetMathMode(handle, use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return handle;
}

// ---- launch shapes --------------------------------------------------------------------------

#define BLOCK 256        // threads per block for elementwise and row kernels
#define WARP 32          // threads per warp; one warp per row in the row kernels
#define MAX_GRID 8192    // cap for grid-stride loops (enough blocks to fill any GPU)
#define COL_LANES 32     // column sums: rows split over 32 threads per column (bias_backward)

// Blocks for an elementwise kernel over n elements.
static unsigned grid_for(size_t n) {
    size_t blocks = (n + BLOCK - 1) / BLOCK;
    if (blocks > MAX_GRID) blocks = MAX_GRID;
    if (blocks == 0) blocks = 1;
    return (unsigned)blocks;
}
// Blocks for a row kernel: BLOCK / WARP rows per block.
static unsigned grid_for_rows(size_t rows) {
    size_t per_block = BLOCK / WARP;
    size_t blocks = (rows + per_block - 1) / per_block;
    return blocks == 0 ? 1 : (unsigned)blocks;
}

// Grid-stride loop helpers: this thread's first index and the stride.
__device__ static size_t thread_index(void) {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ static size_t thread_count(void) {
    return (size_t)gridDim.x * blockDim.x;
}
// The row a warp owns in a row kernel, and the thread's lane (0..31) in it.
__device__ static size_t warp_row(void) {
    return (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
}
__device__ static int lane_id(void) {
    return (int)(threadIdx.x % WARP);
}

// Sum / max over the 32 lanes of a warp; every lane gets the result (butterfly pattern).
__device__ static float warp_sum(float x) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}
__device__ static float warp_max(float x) {
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

// ---- encoder --------------------------------------------------------------------------------

// out (B,T,C) = wte[inp[b,t]] + wpe[t]
__global__ static void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                              const float *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        size_t bt = i / C, c = i % C, t = bt % T;
        size_t ix = (size_t)inp[bt];
        out[i] = wte[ix * C + c] + wpe[t * C + c];
    }
}

// dwpe (T,C): thread (t,c) adds dout[b,t,c] for b = 0..B-1 in order.
__global__ static void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T,
                                                   int C) {
    size_t n = (size_t)T * C;
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += dout[((size_t)b * T + t) * C + c];
        dwpe[i] = acc;
    }
}

// dwte (V,C): a token may occur at several positions, and only one thread may write its row.
// Block i (one per position) handles token inp[i] only if i is its FIRST occurrence; it then
// adds the dout rows of all its occurrences, in position order.
__global__ static void encoder_backward_wte_kernel(float *dwte, const float *dout, const int *inp,
                                                   int N, int C) {
    int i = (int)blockIdx.x;  // position b*T + t
    int ix = inp[i];
    for (int j = 0; j < i; j++)
        if (inp[j] == ix) return;  // an earlier position owns this token (whole block leaves)
    float *row = dwte + (size_t)ix * C;
    for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
        float acc = row[c];
        for (int j = i; j < N; j++)
            if (inp[j] == ix) acc += dout[(size_t)j * C + c];
        row[c] = acc;
    }
}

static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C) {
    encoder_forward_kernel<<<grid_for((size_t)B * T * C), BLOCK>>>(out, inp, wte, wpe, B, T, C);
    launchCheck();
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C) {
    if (B * T == 0) return;
    encoder_backward_wpe_kernel<<<grid_for((size_t)T * C), BLOCK>>>(dwpe, dout, B, T, C);
    launchCheck();
    encoder_backward_wte_kernel<<<B * T, BLOCK>>>(dwte, dout, inp, B * T, C);
    launchCheck();
}

// ---- column sums (bias and LayerNorm weight gradients) ----------------------------------------

// A block covers 32 columns (threadIdx.x) with COL_LANES threads each (threadIdx.y): thread y
// sums rows y, y + COL_LANES, y + 2·COL_LANES, ...; then thread y = 0 adds the COL_LANES
// partial sums in order. (Threads of a warp read 32 neighboring columns: coalesced.)
// db (OC) += Σ_n dout[n, :]   over dout (N, OC)
__global__ static void bias_backward_kernel(float *db, const float *dout, int N, int OC) {
    __shared__ float part[COL_LANES][WARP];
    int o = (int)(blockIdx.x * WARP + threadIdx.x);
    float acc = 0.0f;
    if (o < OC)
        for (int n = (int)threadIdx.y; n < N; n += COL_LANES) acc += dout[(size_t)n * OC + o];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float sum = 0.0f;
        for (int y = 0; y < COL_LANES; y++) sum += part[y][threadIdx.x];
        db[o] += sum;
    }
}

static void bias_backward(float *db, const float *dout, int N, int OC) {
    dim3 block(WARP, COL_LANES);
    unsigned blocks = (unsigned)((OC + WARP - 1) / WARP);
    if (blocks == 0) return;
    bias_backward_kernel<<<blocks, block>>>(db, dout, N, OC);
    launchCheck();
}

// ---- LayerNorm --------------------------------------------------------------------------------

// One warp per row n: mean, then variance around it (two passes, as on the CPU).
__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *w, const float *b,
                                                int N, int C) {
    size_t n = warp_row();
    if (n >= (size_t)N) return;  // the whole warp leaves together
    int lane = lane_id();
    const float *x = inp + n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP) sum += x[c];
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float d = x[c] - m;
        var += d * d;
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
    float *y = out + n * C;
    for (int c = lane; c < C; c += WARP) y[c] = (x[c] - m) * s * w[c] + b[c];
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

// dinp, one warp per row:  with norm = (x - mean) * rstd and dnorm = w * dout,
//   dinp = dskip + (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd   (dskip may be NULL)
__global__ static void layernorm_backward_inp_kernel(float *dinp, const float *dout,
                                                     const float *dskip, const float *inp,
                                                     const float *w,
                                                     const float *mean, const float *rstd, int N,
                                                     int C) {
    size_t n = warp_row();
    if (n >= (size_t)N) return;
    int lane = lane_id();
    const float *x = inp + n * C, *dy = dout + n * C;
    float m = mean[n], s = rstd[n];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float norm = (x[c] - m) * s;
        float dnorm = w[c] * dy[c];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
    }
    float dnorm_mean = warp_sum(dnorm_sum) / C;
    float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    float *dx = dinp + n * C;
    const float *skip = dskip ? dskip + n * C : NULL;
    for (int c = lane; c < C; c += WARP) {
        float norm = (x[c] - m) * s;
        float dnorm = w[c] * dy[c];
        dx[c] = (skip ? skip[c] : 0.0f) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

// dw (C) += Σ_n dout * norm,  db (C) += Σ_n dout: column sums, laid out like bias_backward.
__global__ static void layernorm_backward_params_kernel(float *dw, float *db, const float *dout,
                                                        const float *inp, const float *mean,
                                                        const float *rstd, int N, int C) {
    __shared__ float part_w[COL_LANES][WARP];
    __shared__ float part_b[COL_LANES][WARP];
    int c = (int)(blockIdx.x * WARP + threadIdx.x);
    float acc_w = 0.0f, acc_b = 0.0f;
    if (c < C) {
        for (int n = (int)threadIdx.y; n < N; n += COL_LANES) {
            size_t i = (size_t)n * C + c;
            float norm = (inp[i] - mean[n]) * rstd[n];
            acc_w += dout[i] * norm;
            acc_b += dout[i];
        }
    }
    part_w[threadIdx.y][threadIdx.x] = acc_w;
    part_b[threadIdx.y][threadIdx.x] = acc_b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float sum_w = 0.0f, sum_b = 0.0f;
        for (int y = 0; y < COL_LANES; y++) {
            sum_w += part_w[y][threadIdx.x];
            sum_b += part_b[y][threadIdx.x];
        }
        if (dw) dw[c] += sum_w;
        if (db) db[c] += sum_b;
    }
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
    layernorm_forward_kernel<<<grid_for_rows((size_t)N), BLOCK>>>(out, mean, rstd, inp, w, b, N, C);
    launchCheck();
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *dskip, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C) {
    if (dinp) {
        layernorm_backward_inp_kernel<<<grid_for_rows((size_t)N), BLOCK>>>(dinp, dout, dskip, inp,
                                                                           w, mean, rstd, N, C);
        launchCheck();
    }
    if ((dw || db) && C > 0) {
        dim3 block(WARP, COL_LANES);
        unsigned blocks = (unsigned)((C + WARP - 1) / WARP);
        layernorm_backward_params_kernel<<<blocks, block>>>(dw, db, dout, inp, mean, rstd, N, C);
        launchCheck();
    }
}

// ---- matmul (cuBLAS) ----------------------------------------------------------------------------

// out (N,OC) += bias (OC), broadcast over rows.
__global__ static void add_bias_kernel(float *out, const float *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    for (size_t i = thread_index(); i < n; i += thread_count()) out[i] += bias[i % OC];
}

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int C, int OC) {
    const float one = 1.0f, zero = 0.0f;
    // out (N,OC) = inp (N,C) · wᵀ.  Column-major: outᵀ (OC,N) = (w read as (C,OC))ᵀ · inpᵀ (C,N).
    cublasCheck(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w, C, inp, C, &zero,
                            out, OC));
    if (bias) {
        add_bias_kernel<<<grid_for((size_t)N * OC), BLOCK>>>(out, bias, N, OC);
        launchCheck();
    }
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC) {
    // beta = 0 overwrites the input gradient, beta = 1 accumulates into the weight gradient
    const float one = 1.0f, zero = 0.0f;
    if (dinp) {
        // dinp (N,C) = dout (N,OC) · w (OC,C).  Column-major: dinpᵀ (C,N) = wᵀ (C,OC) · doutᵀ (OC,N).
        cublasCheck(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w, C, dout, OC,
                                &zero, dinp, C));
    }
    if (dw) {
        // dw (OC,C) += doutᵀ (OC,N) · inp (N,C).  Column-major: dwᵀ (C,OC) += inpᵀ (C,N) · dout (N,OC).
        cublasCheck(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC,
                                &one, dw, C));
    }
    if (dbias) bias_backward(dbias, dout, N, OC);
}

// ---- attention ------------------------------------------------------------------------------------
//
// Per batch row b and head h (hs = C/NH), with q_t, k_t, v_t the head's slices of qkv row t:
//   preatt[t][t2] = scale · q_t · k_t2      att[t] = softmax(preatt[t][0..t]), 0 beyond t
//   out_t = Σ_t2 att[t][t2] v_t2
// The heads of one b are one strided-batched cuBLAS call: head h's q starts hs floats after
// head h-1's, rows are 3C apart, so q, k, v are used in place inside qkv (no copies).

// att row r = (b,h,t) of (B*NH*T, T): causal softmax of preatt's row, one warp per row.
// The masked entries t2 > t become preatt = -inf and att = 0, as on the CPU.
__global__ static void attention_softmax_kernel(float *att, float *preatt, int BNH, int T) {
    size_t r = warp_row();
    if (r >= (size_t)BNH * T) return;
    int lane = lane_id();
    int t = (int)(r % T);
    float *x = preatt + r * T;
    float *y = att + r * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += WARP) maxval = fmaxf(maxval, x[t2]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += WARP) {
        float e = expf(x[t2] - maxval);
        y[t2] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);  // sum >= 1: the max term is exp(0)
    for (int t2 = lane; t2 < T; t2 += WARP) {
        if (t2 <= t) {
            y[t2] *= inv;
        } else {
            x[t2] = -INFINITY;
            y[t2] = 0.0f;
        }
    }
}

// Softmax backward, one warp per row:  dpreatt[t2] = att[t2] · (datt[t2] - Σ_t3 att[t3] datt[t3])
// for t2 <= t, and 0 for the masked t2 > t.
__global__ static void attention_softmax_backward_kernel(float *dpreatt, const float *datt,
                                                         const float *att, int BNH, int T) {
    size_t r = warp_row();
    if (r >= (size_t)BNH * T) return;
    int lane = lane_id();
    int t = (int)(r % T);
    const float *a = att + r * T, *da = datt + r * T;
    float *dp = dpreatt + r * T;
    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += WARP) dot += a[t2] * da[t2];
    dot = warp_sum(dot);
    for (int t2 = lane; t2 < T; t2 += WARP) dp[t2] = t2 <= t ? a[t2] * (da[t2] - dot) : 0.0f;
}

static void attention_forward(float *out, float *preatt, float *att, const float *qkv, int B,
                              int T, int C, int NH) {
    int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs), one = 1.0f, zero = 0.0f;
    const long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * 3 * C;  // (T, 3C) rows; head h at +h*hs
        const float *k = q + C;
        float *pre = preatt + (size_t)b * NH * TT;     // (NH, T, T)
        // preatt[h] (T,T) = scale · q (T,hs) · kᵀ.  Column-major: preattᵀ = (kᵀ read (hs,T))ᵀ · qᵀ.
        // Every t2 is computed; the softmax then masks t2 > t.
        cublasCheck(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale,
                                              k, 3 * C, hs, q, 3 * C, hs, &zero, pre, T, TT, NH));
    }
    attention_softmax_kernel<<<grid_for_rows((size_t)B * NH * T), BLOCK>>>(att, preatt, B * NH, T);
    launchCheck();
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * 3 * C + 2 * C;
        const float *a = att + (size_t)b * NH * TT;
        float *o = out + (size_t)b * T * C;            // (T, C) rows; head h at +h*hs
        // out[h] (T,hs) = att[h] (T,T) · v (T,hs).  Column-major: outᵀ (hs,T) = vᵀ (hs,T) · attᵀ (T,T).
        cublasCheck(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, v,
                                              3 * C, hs, a, T, TT, &zero, o, C, hs, NH));
    }
}

static void attention_backward(float *dqkv, float *dpreatt, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs), one = 1.0f, zero = 0.0f;
    const long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * 3 * C + 2 * C;
        const float *dy = dout + (size_t)b * T * C;
        float *dv = dqkv + (size_t)b * T * 3 * C + 2 * C;
        const float *a = att + (size_t)b * NH * TT;
        float *da = datt + (size_t)b * NH * TT;
        // datt[h] (T,T) = dout[h] (T,hs) · vᵀ.  Column-major: dattᵀ = (vᵀ read (hs,T))ᵀ · doutᵀ.
        cublasCheck(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one, v,
                                              3 * C, hs, dy, C, hs, &zero, da, T, TT, NH));
        // dv[h] (T,hs) = att[h]ᵀ (T,T) · dout[h] (T,hs).  Column-major: dvᵀ = doutᵀ · att.
        cublasCheck(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, dy,
                                              C, hs, a, T, TT, &zero, dv, 3 * C, hs, NH));
    }
    attention_softmax_backward_kernel<<<grid_for_rows((size_t)B * NH * T), BLOCK>>>(dpreatt, datt,
                                                                                    att, B * NH, T);
    launchCheck();
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * 3 * C;
        const float *k = q + C;
        float *dq = dqkv + (size_t)b * T * 3 * C;
        float *dk = dq + C;
        const float *dp = dpreatt + (size_t)b * NH * TT;
        // dq[h] (T,hs) = scale · dpreatt[h] (T,T) · k (T,hs).  Column-major: dqᵀ = kᵀ · dpreattᵀ.
        cublasCheck(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &scale, k,
                                              3 * C, hs, dp, T, TT, &zero, dq, 3 * C, hs, NH));
        // dk[h] (T,hs) = scale · dpreatt[h]ᵀ · q (T,hs).  Column-major: dkᵀ = qᵀ · dpreatt.
        cublasCheck(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &scale, q,
                                              3 * C, hs, dp, T, TT, &zero, dk, 3 * C, hs, NH));
    }
}

// ---- GELU, residual -------------------------------------------------------------------------------

// GELU, tanh approximation: gelu(x) = 0.5·x·(1 + tanh(u)), u = sqrt(2/π)·(x + 0.044715·x³),
// computed as on the CPU through 0.5·(1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^(-2u)).
// For very negative x, e^(-2u) overflows to inf and the result is (-)0, as it should be.
#define GELU_SCALE 0.7978845608028654f  // sqrt(2/π)
#define GELU_CUBIC 0.044715f

__global__ static void gelu_forward_kernel(float *out, const float *inp, size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        out[i] = x / (1.0f + expf(-2.0f * u));
    }
}

// dinp = gelu'(x) · dout, with gelu'(x) = s + x·s·(1-s)·2u',  s = sigmoid(2u),
// u' = sqrt(2/π)·(1 + 3·0.044715·x²)
__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        float grad = s + x * s * (1.0f - s) * 2.0f * du;
        dinp[i] = grad * dout[i];
    }
}

__global__ static void residual_forward_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count()) out[i] = a[i] + b[i];
}

__global__ static void residual_backward_kernel(float *da, float *db, const float *dout, size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        da[i] = dout[i];
        db[i] = dout[i];
    }
}

static void gelu_forward(float *out, const float *inp, size_t n) {
    gelu_forward_kernel<<<grid_for(n), BLOCK>>>(out, inp, n);
    launchCheck();
}
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    gelu_backward_kernel<<<grid_for(n), BLOCK>>>(dinp, inp, dout, n);
    launchCheck();
}
static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    residual_forward_kernel<<<grid_for(n), BLOCK>>>(out, a, b, n);
    launchCheck();
}
static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    residual_backward_kernel<<<grid_for(n), BLOCK>>>(da, db, dout, n);
    launchCheck();
}

// ---- softmax and cross-entropy ---------------------------------------------------------------------

// probs row n = softmax(logits row n), one warp per row.
__global__ static void softmax_forward_kernel(float *probs, const float *logits, int N, int V) {
    size_t n = warp_row();
    if (n >= (size_t)N) return;
    int lane = lane_id();
    const float *x = logits + n * V;
    float *p = probs + n * V;
    float maxval = -INFINITY;
    for (int v = lane; v < V; v += WARP) maxval = fmaxf(maxval, x[v]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int v = lane; v < V; v += WARP) {
        float e = expf(x[v] - maxval);
        p[v] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int v = lane; v < V; v += WARP) p[v] *= inv;
}

// losses[n] = -log probs[n, targets[n]]
__global__ static void crossentropy_forward_kernel(float *losses, const float *probs,
                                                   const int *targets, int N, int V) {
    for (size_t n = thread_index(); n < (size_t)N; n += thread_count()) {
        int t = targets[n];
        // A target outside the vocabulary stops the kernel; the next CUDA call then fails
        // with "device-side assert triggered" (the CPU checks the same with LAB_CHECK).
        assert(t >= 0 && t < V);
        losses[n] = -logf(probs[n * V + (size_t)t]);
    }
}

// dlogits (N,V) = (probs - onehot(target)) · dloss, in the CPU's order: probs·dloss, then
// -= dloss at the target.
__global__ static void crossentropy_softmax_backward_kernel(float *dlogits, const float *probs,
                                                            const int *targets, float dloss, int N,
                                                            int V) {
    size_t total = (size_t)N * V;
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        size_t n = i / V, v = i % V;
        float d = probs[i] * dloss;
        if (v == (size_t)targets[n]) d -= dloss;
        dlogits[i] = d;
    }
}

static void softmax_forward(float *probs, const float *logits, int N, int V) {
    softmax_forward_kernel<<<grid_for_rows((size_t)N), BLOCK>>>(probs, logits, N, V);
    launchCheck();
}
static void crossentropy_forward(float *losses, const float *probs, const int *targets, int N,
                                 int V) {
    crossentropy_forward_kernel<<<grid_for((size_t)N), BLOCK>>>(losses, probs, targets, N, V);
    launchCheck();
}
static void crossentropy_softmax_backward(float *dlogits, const float *probs, const int *targets,
                                          float dloss, int N, int V) {
    crossentropy_softmax_backward_kernel<<<grid_for((size_t)N * V), BLOCK>>>(dlogits, probs, targets,
                                                                            dloss, N, V);
    launchCheck();
}

// ---- optimizer and gradient norm -------------------------------------------------------------------

// AdamW, element-wise (formulas in optim.c): g = grad · grad_scale, then
//   m = β1 m + (1-β1) g,  v = β2 v + (1-β2) g²,  p -= lr (m/bc1 / (sqrt(v/bc2) + eps) + decay p)
__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float decay,
                                    float bc1, float bc2, float grad_scale) {
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float m_hat = mi / bc1;
        float v_hat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        param[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + decay * param[i]);
    }
}

static void adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float decay, float bc1, float bc2,
                         float grad_scale) {
    adamw_kernel<<<grid_for(n), BLOCK>>>(param, grad, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2,
                                         grad_scale);
    launchCheck();
}

// Σ g² in double. A fixed grid of SUMSQ_BLOCKS blocks (so the summation order never depends
// on n): each thread sums a grid-stride slice, each block reduces its threads in shared
// memory, and the host adds the block sums in order.
#define SUMSQ_BLOCKS 256
__global__ static void sum_squares_kernel(double *block_sums, const float *g, size_t n) {
    __shared__ double part[BLOCK];
    double acc = 0.0;
    for (size_t i = thread_index(); i < n; i += thread_count()) acc += (double)g[i] * (double)g[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int half = BLOCK / 2; half > 0; half /= 2) {  // tree: 256 -> 128 -> ... -> 1
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) block_sums[blockIdx.x] = part[0];
}

static double sum_squares(const float *g, size_t n) {
    static double *block_sums = NULL;  // device scratch, kept for the whole run
    if (block_sums == NULL) {
        block_sums = (double *)lab_cuda_malloc(SUMSQ_BLOCKS * sizeof(double));
        if (block_sums == NULL)
            mem_fail_out_of_memory(SUMSQ_BLOCKS * sizeof(double), MEM_OTHER, DEV_CUDA);
    }
    sum_squares_kernel<<<SUMSQ_BLOCKS, BLOCK>>>(block_sums, g, n);
    launchCheck();
    double host[SUMSQ_BLOCKS];
    lab_cuda_memcpy(host, block_sums, sizeof host);  // synchronous: waits for the kernel
    double sum = 0.0;
    for (int i = 0; i < SUMSQ_BLOCKS; i++) sum += host[i];
    return sum;
}

__global__ static void scale_kernel(float *x, float s, size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count()) x[i] *= s;
}

static void scale(float *x, float s, size_t n) {
    scale_kernel<<<grid_for(n), BLOCK>>>(x, s, n);
    launchCheck();
}

// ---- bf16 storage ------------------------------------------------------------------------------------

// bf16 is the top 16 bits of an fp32. Round to nearest, ties to even: add 0x7FFF plus the
// lowest kept bit, then truncate. A NaN keeps its top bits and gets the quiet bit, so it
// cannot round into an Inf.
__device__ static uint16_t bf16_round(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__global__ static void f32_to_bf16_kernel(uint16_t *out, const float *in, size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count()) out[i] = bf16_round(in[i]);
}

__global__ static void bf16_to_f32_kernel(float *out, const uint16_t *in, size_t n) {
    for (size_t i = thread_index(); i < n; i += thread_count())
        out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

static void f32_to_bf16(uint16_t *out, const float *in, size_t n) {
    f32_to_bf16_kernel<<<grid_for(n), BLOCK>>>(out, in, n);
    launchCheck();
}
static void bf16_to_f32_dev(float *out, const uint16_t *in, size_t n) {
    bf16_to_f32_kernel<<<grid_for(n), BLOCK>>>(out, in, n);
    launchCheck();
}

// ---- tensor parallelism (common/tp.h) --------------------------------------------------------------
// The same formulas as kernels_cpu.c's section of that name; see kernels.h for the shapes.

// out (N,C) = resid + x + bias[c]
__global__ static void tp_bias_residual_forward_kernel(float *out, const float *resid,
                                                       const float *x, const float *bias, int N,
                                                       int C) {
    size_t n = (size_t)N * C;
    for (size_t i = thread_index(); i < n; i += thread_count())
        out[i] = resid[i] + x[i] + bias[i % C];
}

// out (B,T,C) = (inp in [v0, v0 + Vl) ? wte_local[inp - v0] : 0) + (wpe ? wpe[t] : 0)
__global__ static void vocab_embed_forward_kernel(float *out, const int *inp,
                                                  const float *wte_local, const float *wpe,
                                                  int v0, int Vl, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        size_t bt = i / C, c = i % C, t = bt % T;
        int local = inp[bt] - v0;
        float e = local >= 0 && local < Vl ? wte_local[(size_t)local * C + c] : 0.0f;
        out[i] = e + (wpe ? wpe[t * C + c] : 0.0f);
    }
}

// dwte_local: as encoder_backward_wte_kernel (the block of a token's first position adds all
// its positions in order), for the in-range tokens only.
__global__ static void vocab_embed_backward_wte_kernel(float *dwte_local, const float *dout,
                                                       const int *inp, int v0, int Vl, int N,
                                                       int C) {
    int i = (int)blockIdx.x;
    int ix = inp[i];
    if (ix - v0 < 0 || ix - v0 >= Vl) return;  // another rank's token
    for (int j = 0; j < i; j++)
        if (inp[j] == ix) return;
    float *row = dwte_local + (size_t)(ix - v0) * C;
    for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
        float acc = row[c];
        for (int j = i; j < N; j++)
            if (inp[j] == ix) acc += dout[(size_t)j * C + c];
        row[c] = acc;
    }
}

// One warp per row: max over the first nvalid logits.
__global__ static void vocab_ce_max_kernel(float *maxes, const float *logits, int nvalid, int N,
                                           int Vl) {
    size_t n = warp_row();
    if (n >= (size_t)N) return;
    const float *x = logits + n * Vl;
    float m = -INFINITY;
    for (int v = lane_id(); v < nvalid; v += WARP) m = fmaxf(m, x[v]);
    m = warp_max(m);
    if (lane_id() == 0) maxes[n] = m;
}

// One warp per row: Σ_valid exp(logit - max), and the target logit if this rank owns it.
__global__ static void vocab_ce_sums_kernel(float *sums, float *tlogits, const float *logits,
                                            const float *maxes, const int *targets, int v0,
                                            int nvalid, int N, int Vl) {
    size_t n = warp_row();
    if (n >= (size_t)N) return;
    const float *x = logits + n * Vl;
    float s = 0.0f;
    for (int v = lane_id(); v < nvalid; v += WARP) s += expf(x[v] - maxes[n]);
    s = warp_sum(s);
    if (lane_id() == 0) {
        int local = targets[n] - v0;
        sums[n] = s;
        tlogits[n] = local >= 0 && local < nvalid ? x[local] : 0.0f;
    }
}

__global__ static void vocab_ce_loss_kernel(float *losses, const float *sums, const float *maxes,
                                            const float *tlogits, int N) {
    for (size_t n = thread_index(); n < (size_t)N; n += thread_count())
        losses[n] = logf(sums[n]) + maxes[n] - tlogits[n];
}

__global__ static void vocab_ce_backward_kernel(float *dlogits, const float *logits,
                                                const float *maxes, const float *sums,
                                                const int *targets, float dloss, int v0,
                                                int nvalid, int N, int Vl) {
    size_t total = (size_t)N * Vl;
    for (size_t i = thread_index(); i < total; i += thread_count()) {
        size_t n = i / Vl;
        int v = (int)(i % Vl);
        float d = 0.0f;  // padding: no gradient
        if (v < nvalid) {
            d = expf(logits[i] - maxes[n]) * (1.0f / sums[n]) * dloss;
            if (v == targets[n] - v0) d -= dloss;
        }
        dlogits[i] = d;
    }
}

static void tp_bias_residual_forward(float *out, const float *resid, const float *x,
                                     const float *bias, int N, int C) {
    tp_bias_residual_forward_kernel<<<grid_for((size_t)N * C), BLOCK>>>(out, resid, x, bias, N, C);
    launchCheck();
}
static void vocab_embed_forward(float *out, const int *inp, const float *wte_local,
                                const float *wpe, int v0, int Vl, int B, int T, int C) {
    vocab_embed_forward_kernel<<<grid_for((size_t)B * T * C), BLOCK>>>(out, inp, wte_local, wpe, v0,
                                                                      Vl, B, T, C);
    launchCheck();
}
static void vocab_embed_backward(float *dwte_local, float *dwpe, const float *dout,
                                 const int *inp, int v0, int Vl, int B, int T, int C) {
    if (B * T == 0) return;
    if (dwpe) {
        encoder_backward_wpe_kernel<<<grid_for((size_t)T * C), BLOCK>>>(dwpe, dout, B, T, C);
        launchCheck();
    }
    vocab_embed_backward_wte_kernel<<<B * T, BLOCK>>>(dwte_local, dout, inp, v0, Vl, B * T, C);
    launchCheck();
}
static void vocab_ce_max(float *maxes, const float *logits, int nvalid, int N, int Vl) {
    vocab_ce_max_kernel<<<grid_for_rows((size_t)N), BLOCK>>>(maxes, logits, nvalid, N, Vl);
    launchCheck();
}
static void vocab_ce_sums(float *sums, float *tlogits, const float *logits, const float *maxes,
                          const int *targets, int v0, int nvalid, int N, int Vl) {
    vocab_ce_sums_kernel<<<grid_for_rows((size_t)N), BLOCK>>>(sums, tlogits, logits, maxes, targets,
                                                            v0, nvalid, N, Vl);
    launchCheck();
}
static void vocab_ce_loss(float *losses, const float *sums, const float *maxes,
                          const float *tlogits, int N) {
    vocab_ce_loss_kernel<<<grid_for((size_t)N), BLOCK>>>(losses, sums, maxes, tlogits, N);
    launchCheck();
}
static void vocab_ce_backward(float *dlogits, const float *logits, const float *maxes,
                              const float *sums, const int *targets, float dloss, int v0,
                              int nvalid, int N, int Vl) {
    vocab_ce_backward_kernel<<<grid_for((size_t)N * Vl), BLOCK>>>(dlogits, logits, maxes, sums,
                                                                targets, dloss, v0, nvalid, N, Vl);
    launchCheck();
}

// ---- the table ----------------------------------------------------------------------------------------

extern "C" const Kernels kernels_cuda = {
    .name = "cuda",
    KERNELS_ENTRIES(KERNEL_ENTRY, bf16_to_f32_dev)
};

// ---- the table of bf16 models: the same kernels, matmuls on tensor cores in TF32 -------------------

#define WITH_TF32(call) do { use_tf32 = 1; call; use_tf32 = 0; } while (0)
static void matmul_forward_tf32(float *out, const float *inp, const float *w, const float *bias,
                                int N, int C, int OC) {
    WITH_TF32(matmul_forward(out, inp, w, bias, N, C, OC));
}
static void matmul_backward_tf32(float *dinp, float *dw, float *dbias, const float *dout,
                                 const float *inp, const float *w, int N, int C, int OC) {
    WITH_TF32(matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC));
}
static void attention_forward_tf32(float *out, float *preatt, float *att, const float *qkv, int B,
                                   int T, int C, int NH) {
    WITH_TF32(attention_forward(out, preatt, att, qkv, B, T, C, NH));
}
static void attention_backward_tf32(float *dqkv, float *dpreatt, float *datt, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C,
                                    int NH) {
    WITH_TF32(attention_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, C, NH));
}
#undef WITH_TF32

extern "C" const Kernels *kernels_cuda_tf32(void) {
    static Kernels table;
    if (table.name == NULL) {
        table = kernels_cuda;
        table.matmul_forward = matmul_forward_tf32;
        table.matmul_backward = matmul_backward_tf32;
        table.attention_forward = attention_forward_tf32;
        table.attention_backward = attention_backward_tf32;
        table.name = "cuda (tf32 matmuls)";
    }
    return &table;
}
