// kernels.h: the layers of GPT-2, forward and backward, as plain functions on flat buffers.
//
// One table of function pointers per device: kernels_get(DEV_CPU) (CBLAS matmuls, the rest in
// plain C) and kernels_get(DEV_CUDA) (cuBLAS + hand-written kernels, only in a CUDA build).
// Same signatures for both, so the model code is written once.
//
// Conventions (llm.c's): row-major; N = B*T rows; weights stored (out, in), so a linear layer
// is out = inp · wᵀ + bias. A backward OVERWRITES the gradients of its inputs (dinp, dqkv,
// dlogits, ...: no zeroing needed before it, and nothing to clear between layers) and
// ACCUMULATES (+=) into the gradients of the parameters (dw, db, dwte, dwpe), so gradient
// accumulation over micro-batches needs no extra buffers; zero those before a step.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "mem.h"

#ifdef __cplusplus  // callable from the CUDA .cu files
extern "C" {
#endif

typedef struct Kernels {
    const char *name;  // "cpu" or "cuda"

    // out (B,T,C) = wte[inp] + wpe[t]
    void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe,
                            int B, int T, int C);
    // dwte, dwpe += from dout (B,T,C)
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp,
                             int B, int T, int C);

    // out (N,C) = (inp - mean) * rstd * w + b ; mean, rstd (N) saved for backward. eps 1e-5.
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    // dinp = dskip + (gradient through the LayerNorm); dw, db +=. A LayerNorm's input is a
    // residual stream that also flows past it through the skip connection: dskip (N,C) is the
    // gradient arriving that way (NULL: none), so the sum needs no separate pass. A split
    // backward computes the two halves at different times: dinp NULL (dw and db only) or dw and
    // db NULL (dinp only); each half gives exactly the bits of the call that computes both.
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *dskip, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);

    // out (N,OC) = inp (N,C) · w (OC,C)ᵀ + bias (OC); bias may be NULL.
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC);
    // dinp (N,C) = dout · w ; dw (OC,C) += doutᵀ · inp ; dbias (OC) += Σ_rows dout.
    // Any of dinp, dw, dbias may be NULL (not needed).
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);

    // qkv (B,T,3C) rows [Q;K;V] -> out (B,T,C); preatt, att (B,NH,T,T) saved (causal).
    void (*attention_forward)(float *out, float *preatt, float *att, const float *qkv,
                              int B, int T, int C, int NH);
    // dqkv (B,T,3C) = the gradient of qkv from dout (B,T,C), through the saved att; written,
    // not added to. dpreatt, datt (B,NH,T,T) are scratch (overwritten; the CPU uses one
    // head-sized scratch of its own instead, and leaves them alone).
    void (*attention_backward)(float *dqkv, float *dpreatt, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH);

    // GELU, tanh approximation. n elements.
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    // dinp = gelu'(inp) · dout, written (not added to).
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);

    // out = a + b (n); backward: da = dout, db = dout.
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    void (*residual_backward)(float *da, float *db, const float *dout, size_t n);

    // probs (N,V) = softmax(logits); losses (N) = -log probs[target].
    void (*softmax_forward)(float *probs, const float *logits, int N, int V);
    void (*crossentropy_forward)(float *losses, const float *probs, const int *targets, int N, int V);
    // dlogits (N,V) = (probs - onehot(target)) * dloss   (dloss = 1/(B*T) for a mean loss)
    void (*crossentropy_softmax_backward)(float *dlogits, const float *probs, const int *targets,
                                          float dloss, int N, int V);

    // AdamW on n contiguous elements; see optim.h for the meaning of each argument.
    // decay: the weight decay to apply to these elements (0 for biases and LayerNorm).
    void (*adamw_update)(float *param, const float *grad, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float decay,
                         float bc1, float bc2, float grad_scale);
    // Σ g² over n elements, accumulated in double (for the global gradient norm).
    double (*sum_squares)(const float *g, size_t n);
    // x *= s over n elements.
    void (*scale)(float *x, float s, size_t n);

    // bf16 storage: round to nearest even; NaN stays NaN.
    void (*f32_to_bf16)(uint16_t *out, const float *in, size_t n);
    void (*bf16_to_f32)(float *out, const uint16_t *in, size_t n);

    // ---- tensor parallelism (common/tp.h) ----------------------------------------------------
    // A row-parallel layer's output is a sum of partial products; its bias is added once, after
    // the all-reduce, together with the residual: out (N,C) = resid + x + bias[c]. (Backward:
    // the gradient passes to resid and x unchanged; dbias = matmul_backward's column sums.)
    void (*tp_bias_residual_forward)(float *out, const float *resid, const float *x,
                                     const float *bias, int N, int C);
    // Vocab-parallel embedding: this rank holds rows [v0, v0 + Vl) of wte as wte_local (Vl,C).
    // out (B,T,C) = (inp in range ? wte_local[inp - v0] : 0) + (wpe ? wpe[t] : 0); summed over
    // the group it is wte[inp] + wpe[t] (pass wpe on ONE rank only).
    void (*vocab_embed_forward)(float *out, const int *inp, const float *wte_local,
                                const float *wpe, int v0, int Vl, int B, int T, int C);
    // dwte_local += rows of the in-range tokens; dwpe += Σ_b dout (skipped when NULL).
    void (*vocab_embed_backward)(float *dwte_local, float *dwpe, const float *dout,
                                 const int *inp, int v0, int Vl, int B, int T, int C);
    // Vocab-parallel cross-entropy on local logits (N,Vl) of vocabulary rows [v0, v0 + Vl), of
    // which the first nvalid are real (the rest: padding, never part of the softmax).
    // maxes (N) = max over the valid local logits (-inf when nvalid == 0).
    void (*vocab_ce_max)(float *maxes, const float *logits, int nvalid, int N, int Vl);
    // With maxes already the GLOBAL max: sums (N) = Σ_valid exp(logit - max); tlogits (N) =
    // logit of the target when this rank owns it (v0 <= target < v0 + nvalid), else 0.
    void (*vocab_ce_sums)(float *sums, float *tlogits, const float *logits, const float *maxes,
                          const int *targets, int v0, int nvalid, int N, int Vl);
    // With global sums and target logits: losses (N) = log(sum) + max - target logit.
    void (*vocab_ce_loss)(float *losses, const float *sums, const float *maxes,
                          const float *tlogits, int N);
    // dlogits (N,Vl) = (exp(logit - max) / sum - onehot(target)) * dloss on the valid columns,
    // 0 on the padded ones. Overwrites dlogits.
    void (*vocab_ce_backward)(float *dlogits, const float *logits, const float *maxes,
                              const float *sums, const int *targets, float dloss, int v0,
                              int nvalid, int N, int Vl);
} Kernels;

// A device's table initializer lists its functions with KERNELS_ENTRIES(KERNEL_ENTRY, f): `.x =
// x,` for every field x but .name, in the fields' order (as C++ wants); each device names its
// functions after the fields, except for .bf16_to_f32 (the host helper's name below): f.
#define KERNEL_ENTRY(f) .f = f,
#define KERNELS_ENTRIES(X, bf16_to_f32_fn)                                                          \
    X(encoder_forward) X(encoder_backward) X(layernorm_forward) X(layernorm_backward)               \
    X(matmul_forward) X(matmul_backward) X(attention_forward) X(attention_backward)                 \
    X(gelu_forward) X(gelu_backward) X(residual_forward) X(residual_backward) X(softmax_forward)    \
    X(crossentropy_forward) X(crossentropy_softmax_backward) X(adamw_update) X(sum_squares)         \
    X(scale) X(f32_to_bf16) .bf16_to_f32 = bf16_to_f32_fn, X(tp_bias_residual_forward)              \
    X(vocab_embed_forward) X(vocab_embed_backward) X(vocab_ce_max) X(vocab_ce_sums)                 \
    X(vocab_ce_loss) X(vocab_ce_backward)

// The table for a device. DEV_CUDA in a build without CUDA fails with a clear message.
const Kernels *kernels_get(Device dev);
// The table for bf16 models: on CUDA the matmuls (and attention's) round their inputs to TF32
// (10 mantissa bits, more than bf16 keeps) and run on tensor cores; every other kernel is
// kernels_get's. On the CPU it is kernels_get(DEV_CPU): plain fp32.
const Kernels *kernels_get_tf32(Device dev);
extern const Kernels kernels_cpu;
// BLAS threads of this process for the CPU matmuls (--threads; overrides OPENBLAS_NUM_THREADS).
void kernels_set_threads(int n);

// Host helpers, usable everywhere (bit-exact reference for tests).
uint16_t bf16_from_f32(float f);
float bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
