// kernels_cpu.c: the layers of GPT-2 on the CPU, in fp32 (see kernels.h for the contract).
//
// Matmuls go through cblas_sgemm (OpenBLAS): they are ~95% of the FLOPs. Everything else is
// plain C loops written so that `gcc -O3 -march=native` turns them into SIMD code:
//   - no reductions over a loop of floats (the compiler may not reorder float additions, so a
//     plain `s += x[i]` stays scalar); sums use 16 partial sums in a fixed order instead, which
//     vectorizes and is still deterministic (same inputs -> same bits, on every rank);
//   - exp() is our own (exp_approx), since libm's expf is a call the compiler cannot vectorize.
// A backward OVERWRITES the gradients of its inputs and ACCUMULATES (+=) into the gradients
// of the parameters, as kernels.h says.

// gcc only, three switches. fp-contract=fast lets gcc fuse a*b + c into one FMA instruction
// (one rounding instead of two: results change in the last bits). gcc
// fuses only in GNU C mode, and the Makefile compiles ISO C (-std=c11); clang fuses within an
// expression by default. Without it GELU, LayerNorm and exp_approx run ~1.5x slower. The other
// two change no result (clang needs neither):
//   no-trapping-math: this file never reads floating-point exception flags, so the vectorizer
//     may treat the compares and the rounding in exp_approx as side-effect free;
//   no-thread-jumps: otherwise gcc duplicates the code after exp_approx's clamps for the
//     clamped constants (e.g. x / (1 + e^88) in GELU) and, vectorized, computes that copy for
//     every element: its results are subnormal floats, which cost ~100 cycles each (GELU 7x slower).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-thread-jumps", "fp-contract=fast")
#endif

#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "check.h"

// ----------------------------------------------------------------------------------------------
// Small helpers

// Partial sums for reductions: 16 floats = one AVX-512 register (two AVX2 ones). The loops over
// the 16 lanes carry `#pragma GCC unroll 1`: kept as a loop, each becomes one SIMD instruction
// on the vector of partial sums. Fully unrolled (gcc's default), gcc vectorizes the loop over
// the chunks instead and shuffles lanes around: layernorm backward ran 7x slower that way.
#define NACC 16

// Σ acc[j] as a tree (8 + 8, 4 + 4, 2 + 2, 1 + 1): 4 dependent additions instead of 16.
static inline float sum_partials(const float acc[NACC]) {
    float s[NACC];
    for (int j = 0; j < NACC; j++) s[j] = acc[j];
    for (int half = NACC / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++) s[j] += s[j + half];
    return s[0];
}

// Σ x[i], i < n, as 16 interleaved partial sums (see the top of the file).
static inline float sum_f32(const float *x, int n) {
    float acc[NACC] = {0}, tail = 0.0f;
    int i = 0;
    for (; i + NACC <= n; i += NACC)
#pragma GCC unroll 1
        for (int j = 0; j < NACC; j++) acc[j] += x[i + j];
    for (; i < n; i++) tail += x[i];
    return sum_partials(acc) + tail;
}

// max x[i], i < n (n >= 1)
static inline float max_f32(const float *x, int n) {
    float acc[NACC];
    for (int j = 0; j < NACC; j++) acc[j] = x[0];
    int i = 0;
    for (; i + NACC <= n; i += NACC)
#pragma GCC unroll 1
        for (int j = 0; j < NACC; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    float m = acc[0];
    for (int j = 1; j < NACC; j++) m = acc[j] > m ? acc[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// e^x with a relative error of about 1e-7 (1 ulp), in a form the compiler vectorizes:
// e^x = 2^k · e^r with k = round(x / ln2), |r| <= ln2/2, and e^r by its Taylor series to r^7
// (the first omitted term, r^8/8! < 6e-9, is below fp32 resolution).
// x is clamped to [-87, 88] so that 2^k stays a normal float: e^-87 ≈ 1.6e-38 stands in for
// anything smaller (harmless next to the 1 that softmax and GELU add to it). NaN stays NaN.
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float k = floorf(x * 1.44269504088896341f + 0.5f);  // x / ln2, rounded
    // r = x - k·ln2, with ln2 split in two so that k·ln2_hi is exact (Cody-Waite).
    float r = x - k * 0.693145751953125f;
    r = r - k * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    // 2^k built directly in the exponent field (k + 127 is in [1, 254]).
    union { int32_t i; float f; } two_k = {.i = ((int32_t)k + 127) << 23};
    return p * two_k.f;
}

// ----------------------------------------------------------------------------------------------
// Embedding

static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe,
                            int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            int tok = inp[b * T + t];
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tok * C;
            const float *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
    }
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                             int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            int tok = inp[b * T + t];
            const float *d = dout + ((size_t)b * T + t) * C;
            float *de = dwte + (size_t)tok * C;
            float *dp = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                de[i] += d[i];
                dp[i] += d[i];
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// LayerNorm: out = (x - mean) / sqrt(var + eps) * w + b, over the C channels of each row.

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
    const float eps = 1e-5f;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float m = sum_f32(x, C) / (float)C;
        // variance around the mean (two passes: no cancellation as with E[x²] - m²)
        float acc[NACC] = {0}, tail = 0.0f;
        int i = 0;
        for (; i + NACC <= C; i += NACC)
#pragma GCC unroll 1
            for (int j = 0; j < NACC; j++) {
                float d = x[i + j] - m;
                acc[j] += d * d;
            }
        for (; i < C; i++) tail += (x[i] - m) * (x[i] - m);
        float var = (sum_partials(acc) + tail) / (float)C;
        float s = 1.0f / sqrtf(var + eps);
        for (i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

// With xhat = (x - mean)·rstd and g = dout·w (the gradient wrt xhat):
//   dx = dskip + rstd · (g - mean(g) - xhat · mean(g · xhat)),   dw += dout · xhat,   db += dout.
// (restrict: the outputs never overlap the inputs; without it gcc needs more run-time overlap
// checks than it is willing to emit, and the last loop stays scalar.)
static void layernorm_backward(float *restrict dinp, float *restrict dw, float *restrict db,
                               const float *restrict dout, const float *restrict dskip,
                               const float *restrict inp, const float *restrict w,
                               const float *mean, const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        if (!dinp) {  // the weight gradients alone (a split backward's W): the same sums
            for (int i = 0; i < C; i++) {
                float xhat = (x[i] - m) * s;
                dw[i] += d[i] * xhat;
                db[i] += d[i];
            }
            continue;
        }
        const float *skip = dskip ? dskip + (size_t)n * C : NULL;
        float *dx = dinp + (size_t)n * C;
        float acc_g[NACC] = {0}, acc_gx[NACC] = {0}, tail_g = 0.0f, tail_gx = 0.0f;
        int i = 0;
        for (; i + NACC <= C; i += NACC)
#pragma GCC unroll 1
            for (int j = 0; j < NACC; j++) {
                float g = d[i + j] * w[i + j];
                acc_g[j] += g;
                acc_gx[j] += g * ((x[i + j] - m) * s);
            }
        for (; i < C; i++) {
            float g = d[i] * w[i];
            tail_g += g;
            tail_gx += g * ((x[i] - m) * s);
        }
        float g_mean = (sum_partials(acc_g) + tail_g) / (float)C;
        float gx_mean = (sum_partials(acc_gx) + tail_gx) / (float)C;
        for (i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            float g = d[i] * w[i];
            dx[i] = (skip ? skip[i] : 0.0f) + s * (g - g_mean - xhat * gx_mean);
            if (dw) {  // (dw NULL: the input gradient alone, a split backward's B)
                dw[i] += d[i] * xhat;
                db[i] += d[i];
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Linear layer: out (N,OC) = inp (N,C) · w (OC,C)ᵀ + bias

static void matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC) {
    float beta = 0.0f;
    if (bias) {
        // Start every row from the bias and let the GEMM add to it (beta = 1).
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

static void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC) {
    // dinp (N,C) = dout (N,OC) · w (OC,C)   (beta = 0: overwritten)
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                    0.0f, dinp, C);
    // dw (OC,C) += dout (N,OC)ᵀ · inp (N,C)
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dw, C);
    // dbias (OC) += column sums of dout, row by row (the inner loop runs along a row: SIMD)
    if (dbias)
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++) dbias[o] += d[o];
        }
}

// ----------------------------------------------------------------------------------------------
// Causal self-attention, per (batch, head), with hs = C/NH channels per head:
//   preatt = q·kᵀ / sqrt(hs)   (T,T), then -inf above the diagonal (a position sees only the past)
//   att    = softmax(preatt) row by row
//   out    = att · v           (T,hs), written into the head's columns of out (B,T,C)
// q, k, v of head h are columns [h·hs, (h+1)·hs) of the Q, K, V thirds of a qkv row (3C):
// strided views, which cblas_sgemm reads directly through its leading dimension (3C).
// k and v are copied transposed first (transpose_head) where a product needs kᵀ or vᵀ.
// The T×T products are full GEMMs (the masked half is computed, then overwritten): for short
// sequences one GEMM beats skipping half the work in scalar loops.

// *buf (of *cap floats) grown to hold at least need floats (its contents are not kept).
static void grow_scratch(float **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    mem_free(*buf);
    *buf = mem_alloc(need * sizeof(float), MEM_OTHER, DEV_CPU);
    *cap = need;
}

// One head's k (or v) as a contiguous (hs, T) matrix: with it, q·kᵀ is a plain (NN) GEMM, which
// OpenBLAS runs ~2x faster on these small shapes than the same product with a transposed operand.
// The buffer is reused by every call (one thread per rank) and grows when a larger one is needed.
static float *transpose_head(const float *x, int T, int hs, int ld) {
    static float *buf = NULL;
    static size_t cap = 0;
    grow_scratch(&buf, &cap, (size_t)T * hs);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs; i++) buf[(size_t)i * T + t] = x[(size_t)t * ld + i];
    return buf;
}

// datt and dpreatt of ONE head, 2·T·T floats, reused by every head (and grown when needed). The
// caller's (B,NH,T,T) scratch suits a GPU, which works on all heads at once; here one head at
// a time runs, and a T×T pair that stays in the L1 cache beats streaming B·NH of them through
// memory.
static float *head_scratch(int T) {
    static float *buf = NULL;
    static size_t cap = 0;
    grow_scratch(&buf, &cap, 2 * (size_t)T * T);
    return buf;
}

// Row t of a causal T×T score matrix sees columns 0..t; the row loops run to the end of the
// 16-wide chunk that holds column t (capped at T), so they split into whole SIMD chunks.
static inline int visible_chunk_end(int t, int T) {
    int end = (t / NACC + 1) * NACC;
    return end < T ? end : T;
}

static void attention_forward(float *out, float *preatt, float *att, const float *qkv,
                              int B, int T, int C, int NH) {
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *pre = preatt + ((size_t)b * NH + h) * T * T;
            float *a = att + ((size_t)b * NH + h) * T * T;
            // pre (T,T) = scale · q (T,hs) · kᵀ (hs,T)
            float *kT = transpose_head(k, T, hs, C3);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, T, hs, scale, q, C3, kT, T,
                        0.0f, pre, T);
            for (int t = 0; t < T; t++) {
                float *pr = pre + (size_t)t * T;
                float *ar = a + (size_t)t * T;
                // Visible positions are 0..t. The loops run in whole chunks of 16 up to the chunk
                // that holds t (SIMD, no scalar tail), masking the future: max, exp and sum, then
                // normalize; what lies beyond gets preatt = -inf and att = 0.
                int nchunk = visible_chunk_end(t, T);
                float macc[NACC];
                for (int j = 0; j < NACC; j++) macc[j] = pr[0];
                int t2 = 0;
                for (; t2 + NACC <= nchunk; t2 += NACC)
#pragma GCC unroll 1
                    for (int j = 0; j < NACC; j++) {
                        float x = t2 + j <= t ? pr[t2 + j] : pr[0];
                        macc[j] = x > macc[j] ? x : macc[j];
                    }
                float mx = macc[0];
                for (int j = 1; j < NACC; j++) mx = macc[j] > mx ? macc[j] : mx;
                for (; t2 < nchunk; t2++) mx = t2 <= t && pr[t2] > mx ? pr[t2] : mx;  // T % 16 != 0
                float acc[NACC] = {0}, tail = 0.0f;
                for (t2 = 0; t2 + NACC <= nchunk; t2 += NACC)
#pragma GCC unroll 1
                    for (int j = 0; j < NACC; j++) {
                        float e = t2 + j <= t ? exp_approx(pr[t2 + j] - mx) : 0.0f;
                        ar[t2 + j] = e;
                        acc[j] += e;
                    }
                for (; t2 < nchunk; t2++) {  // only when T is not a multiple of 16
                    ar[t2] = t2 <= t ? exp_approx(pr[t2] - mx) : 0.0f;
                    tail += ar[t2];
                }
                float inv = 1.0f / (sum_partials(acc) + tail);
                for (t2 = 0; t2 < nchunk; t2++) {
                    ar[t2] *= inv;  // 0 stays 0
                    pr[t2] = t2 <= t ? pr[t2] : -INFINITY;
                }
                for (; t2 < T; t2++) {
                    pr[t2] = -INFINITY;
                    ar[t2] = 0.0f;
                }
            }
            // out (T,hs) = att (T,T) · v (T,hs)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3,
                        0.0f, out + (size_t)b * T * C + (size_t)h * hs, C);
        }
    }
}

// Backward of the above, per (batch, head):
//   datt   = dout · vᵀ                   dv = attᵀ · dout
//   dpreatt = att ⊙ (datt - rowsum(att ⊙ datt))      (softmax backward; 0 above the diagonal)
//   dq = scale · dpreatt · k             dk = scale · dpreattᵀ · q
static void attention_backward(float *dqkv, float *dpreatt, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH) {
    (void)dpreatt, (void)datt;  // one head's scratch instead (head_scratch)
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *da = head_scratch(T), *dpre = da + (size_t)T * T;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t hoff = (size_t)b * T * C3 + (size_t)h * hs;
            const float *q = qkv + hoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + hoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            const float *dout_h = dout + (size_t)b * T * C + (size_t)h * hs;
            // datt (T,T) = dout (T,hs) · vᵀ (hs,T)
            float *vT = transpose_head(v, T, hs, C3);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, T, hs, 1.0f, dout_h, C, vT, T,
                        0.0f, da, T);
            // dv (T,hs) = att (T,T)ᵀ · dout (T,hs)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dout_h, C,
                        0.0f, dv, C3);
            for (int t = 0; t < T; t++) {
                const float *ar = a + (size_t)t * T;
                const float *dar = da + (size_t)t * T;
                float *dpr = dpre + (size_t)t * T;
                // att is exactly 0 for t2 > t, so whole chunks of 16 need no mask here
                int nchunk = visible_chunk_end(t, T);
                float acc[NACC] = {0}, tail = 0.0f;
                int t2 = 0;
                for (; t2 + NACC <= nchunk; t2 += NACC)
#pragma GCC unroll 1
                    for (int j = 0; j < NACC; j++) acc[j] += ar[t2 + j] * dar[t2 + j];
                for (; t2 < nchunk; t2++) tail += ar[t2] * dar[t2];
                float dot = sum_partials(acc) + tail;
                for (t2 = 0; t2 < nchunk; t2++) dpr[t2] = ar[t2] * (dar[t2] - dot);
                for (; t2 < T; t2++) dpr[t2] = 0.0f;
            }
            // dq (T,hs) = scale · dpreatt (T,T) · k (T,hs)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dpre, T, k, C3,
                        0.0f, dq, C3);
            // dk (T,hs) = scale · dpreatt (T,T)ᵀ · q (T,hs)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dpre, T, q, C3,
                        0.0f, dk, C3);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// GELU, tanh approximation: gelu(x) = 0.5·x·(1 + tanh(u)), u = sqrt(2/π)·(x + 0.044715·x³).
// Computed through the identity 0.5·(1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^(-2u)): one exp,
// no tanh call, and no cancellation where tanh(u) is near -1.

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/π)
#define GELU_CUBIC 0.044715f

static void gelu_forward(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        out[i] = x / (1.0f + exp_approx(-2.0f * u));
    }
}

// d gelu / dx = s + x · s·(1-s) · 2u',  s = sigmoid(2u),  u' = sqrt(2/π)·(1 + 3·0.044715·x²)
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        float s = 1.0f / (1.0f + exp_approx(-2.0f * u));
        float grad = s + x * s * (1.0f - s) * 2.0f * du;
        dinp[i] = grad * dout[i];
    }
}

// ----------------------------------------------------------------------------------------------
// Residual connection

static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        da[i] = dout[i];
        db[i] = dout[i];
    }
}

// ----------------------------------------------------------------------------------------------
// Output: softmax over the vocabulary and cross-entropy

static void softmax_forward(float *probs, const float *logits, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        // Subtracting the max keeps e^x finite. (exp_approx's clamp makes a probability below
        // e^-87 come out as ~1e-38 instead of 0: a loss of 87 instead of +inf at worst.)
        float mx = max_f32(x, V);
        for (int v = 0; v < V; v++) p[v] = exp_approx(x[v] - mx);
        float inv = 1.0f / sum_f32(p, V);
        for (int v = 0; v < V; v++) p[v] *= inv;
    }
}

static void crossentropy_forward(float *losses, const float *probs, const int *targets, int N, int V) {
    for (int n = 0; n < N; n++) {
        int t = targets[n];
        LAB_CHECK(t >= 0 && t < V, "target %d at position %d is outside the vocabulary [0, %d)", t, n, V);
        losses[n] = -logf(probs[(size_t)n * V + t]);
    }
}

static void crossentropy_softmax_backward(float *dlogits, const float *probs, const int *targets,
                                          float dloss, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *dl = dlogits + (size_t)n * V;
        for (int v = 0; v < V; v++) dl[v] = p[v] * dloss;
        dl[targets[n]] -= dloss;
    }
}

// ----------------------------------------------------------------------------------------------
// Optimizer pieces

// bc1 = 1 - beta1^t and bc2 = 1 - beta2^t are the bias corrections of step t (see optim.c).
// sqrtf may set errno, so gcc keeps it a scalar call and would leave the whole loop scalar
// (4x slower). So chunks of 256: SIMD loop, sqrt loop, SIMD loop; same arithmetic as one loop.
static void adamw_update(float *restrict param, const float *restrict grad, float *restrict m,
                         float *restrict v, size_t n, float lr, float beta1, float beta2,
                         float eps, float decay, float bc1, float bc2, float grad_scale) {
    enum { CHUNK = 256 };
    float denom[CHUNK];
    // a division costs ~10x a multiplication: divide once here, multiply per element
    const float inv_bc1 = 1.0f / bc1, inv_bc2 = 1.0f / bc2;
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
        float *p = param + i0, *mc = m + i0, *vc = v + i0;
        const float *g = grad + i0;
        for (size_t i = 0; i < len; i++) {
            float gi = g[i] * grad_scale;
            mc[i] = beta1 * mc[i] + (1.0f - beta1) * gi;
            vc[i] = beta2 * vc[i] + (1.0f - beta2) * gi * gi;
            denom[i] = vc[i] * inv_bc2;  // v̂
        }
        for (size_t i = 0; i < len; i++) denom[i] = sqrtf(denom[i]) + eps;
        for (size_t i = 0; i < len; i++) {
            float mhat = mc[i] * inv_bc1;
            p[i] -= lr * (mhat / denom[i] + decay * p[i]);
        }
    }
}

static double sum_squares(const float *g, size_t n) {
    // 8 partial sums in double: a fixed order (deterministic), and SIMD-friendly.
    double acc[8] = {0}, tail = 0.0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) acc[j] += (double)g[i + j] * (double)g[i + j];
    for (; i < n; i++) tail += (double)g[i] * (double)g[i];
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s + tail;
}

static void scale(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

// ----------------------------------------------------------------------------------------------
// bf16: the top 16 bits of an fp32 (same exponent range, 8 bits of mantissa).

uint16_t bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)    // NaN: keep sign and payload top, force quiet bit
        return (uint16_t)((u >> 16) | 0x0040u);
    // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate.
    // Works unchanged for subnormals, and rounds the largest finite values up to Inf.
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void f32_to_bf16(uint16_t *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = bf16_from_f32(in[i]);
}

static void bf16_to_f32_array(float *out, const uint16_t *in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(in[i]);
}

// ---- tensor parallelism (common/tp.h) ----------------------------------------------------------

static void tp_bias_residual_forward(float *out, const float *resid, const float *x,
                                     const float *bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        for (int c = 0; c < C; c++) out[row + c] = resid[row + c] + x[row + c] + bias[c];
    }
}

static void vocab_embed_forward(float *out, const int *inp, const float *wte_local,
                                const float *wpe, int v0, int Vl, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            int local = inp[b * T + t] - v0;
            // The same sum as encoder_forward (wte + wpe), so the owning rank's row is exact.
            const float *e = local >= 0 && local < Vl ? wte_local + (size_t)local * C : NULL;
            const float *p = wpe ? wpe + (size_t)t * C : NULL;
            for (int i = 0; i < C; i++) o[i] = (e ? e[i] : 0.0f) + (p ? p[i] : 0.0f);
        }
    }
}

static void vocab_embed_backward(float *dwte_local, float *dwpe, const float *dout,
                                 const int *inp, int v0, int Vl, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            int local = inp[b * T + t] - v0;
            if (local >= 0 && local < Vl) {
                float *de = dwte_local + (size_t)local * C;
                for (int i = 0; i < C; i++) de[i] += d[i];
            }
            if (dwpe) {
                float *dp = dwpe + (size_t)t * C;
                for (int i = 0; i < C; i++) dp[i] += d[i];
            }
        }
    }
}

static void vocab_ce_max(float *maxes, const float *logits, int nvalid, int N, int Vl) {
    for (int n = 0; n < N; n++) maxes[n] = nvalid > 0 ? max_f32(logits + (size_t)n * Vl, nvalid) : -INFINITY;
}

static void vocab_ce_sums(float *sums, float *tlogits, const float *logits, const float *maxes,
                          const int *targets, int v0, int nvalid, int N, int Vl) {
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        float s = 0.0f;
        for (int v = 0; v < nvalid; v++) s += exp_approx(x[v] - maxes[n]);  // softmax's exp
        sums[n] = s;
        int local = targets[n] - v0;
        tlogits[n] = local >= 0 && local < nvalid ? x[local] : 0.0f;
    }
}

static void vocab_ce_loss(float *losses, const float *sums, const float *maxes,
                          const float *tlogits, int N) {
    for (int n = 0; n < N; n++) losses[n] = logf(sums[n]) + maxes[n] - tlogits[n];
}

static void vocab_ce_backward(float *dlogits, const float *logits, const float *maxes,
                              const float *sums, const int *targets, float dloss, int v0,
                              int nvalid, int N, int Vl) {
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        float *dl = dlogits + (size_t)n * Vl;
        float inv = 1.0f / sums[n];  // as softmax_forward: e * (1/sum), then * dloss
        for (int v = 0; v < nvalid; v++) dl[v] = exp_approx(x[v] - maxes[n]) * inv * dloss;
        for (int v = nvalid; v < Vl; v++) dl[v] = 0.0f;  // padding: no gradient
        int local = targets[n] - v0;
        if (local >= 0 && local < nvalid) dl[local] -= dloss;
    }
}

// ----------------------------------------------------------------------------------------------

const Kernels kernels_cpu = {
    .name = "cpu",
    KERNELS_ENTRIES(KERNEL_ENTRY, bf16_to_f32_array)
};

#ifdef LAB_CUDA
extern const Kernels kernels_cuda;             // common/kernels_cuda.cu
extern const Kernels *kernels_cuda_tf32(void);  // common/kernels_cuda.cu
#endif

const Kernels *kernels_get(Device dev) {
    if (dev == DEV_CPU) return &kernels_cpu;
#ifdef LAB_CUDA
    if (dev == DEV_CUDA) return &kernels_cuda;
#endif
    if (dev == DEV_CUDA)
        lab_fail("this build has no CUDA: rebuild with make CUDA=1 on a machine with nvcc");
    lab_fail("unknown device %d: valid devices are cpu (0) and cuda (1)", (int)dev);
}

const Kernels *kernels_get_tf32(Device dev) {
#ifdef LAB_CUDA
    if (dev == DEV_CUDA) return kernels_cuda_tf32();
#endif
    return kernels_get(dev);
}

void kernels_set_threads(int n) {
    LAB_CHECK(n >= 1, "BLAS threads must be >= 1, got %d", n);
    openblas_set_num_threads(n);
}
