// optim.h: AdamW with bias correction and decoupled weight decay, global gradient-norm
// clipping, learning-rate warmup + cosine decay, and NaN/Inf detection.
//
// The update works on any range [lo, hi) of the flat parameter buffer, so a ZeRO rank can
// update only its shard: weight decay is looked up from the parameter list (2-D weights only).
#pragma once
#include <stddef.h>
#include "gpt2.h"
#include "kernels.h"

typedef struct AdamW {
    float lr;            // peak learning rate
    float beta1, beta2, eps;
    float weight_decay;  // applied to 2-D weights only
    float grad_clip;     // max global L2 norm of the gradient (0 = no clipping)
    int warmup_steps;    // linear warmup from lr/warmup to lr
    int total_steps;     // cosine decay to min_lr_frac * lr at total_steps
    float min_lr_frac;
    int skip_nan;        // a NaN/Inf gradient skips the step's update (--on-nan skip) instead of
                         // ending the run (0, the default: --on-nan stop)
} AdamW;

AdamW adamw_defaults(void);  // lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1, clip 1.0, ...

// Learning rate at step (0-based).
float adamw_lr(const AdamW *h, int step);

// Gradient-norm clipping: given the GLOBAL squared norm (the chapter sums it over shards or
// ranks), returns the factor to multiply gradients by (1 when within grad_clip). When the norm
// is not finite: fails the job with "NaN/Inf in the gradients at step S", or, with skip_nan,
// returns ADAMW_SKIP. The norm is global, so every rank that steps finds the same.
float adamw_clip_scale(const AdamW *h, double global_norm_sq, int step);
// The grad_scale that makes adamw_update change nothing: not the weights, not Adam's m and v
// (a skipped step, --on-nan skip). Every update path passes adamw_clip_scale's answer on.
#define ADAMW_SKIP (-1.0f)

// The one AdamW entry point: a step (t = step + 1 for bias correction) on elements [lo, hi)
// of the flat numbering of `params` (the parameter list the weight decay is looked up in), any
// range of any buffer, fp32 or bf16. Every pointer points at element lo of its buffer (whole
// buffers pass lo = 0 offsets; a shard passes its shard-local storage).
//   fp32: AdamW updates `master`, which IS the model's weights; grad is fp32.
//   bf16 (bf16 != NULL): master is the fp32 master copy; grad is bf16, widened to fp32 a chunk
//     at a time into scratch (chunk floats, on the same device as the buffers); after each
//     chunk's update the bf16 weights become the master rounded to nearest even.
// grad_scale multiplies the gradient first (clipping: adamw_clip_scale); ADAMW_SKIP: no update.
typedef struct AdamWRange {
    size_t lo, hi;          // the range, in the parameter list's numbering
    float *master;          // the fp32 weights AdamW updates
    const void *grad;       // fp32, or bf16 when bf16 is set
    float *m, *v;           // Adam's moments (fp32)
    uint16_t *bf16;         // mixed precision: the bf16 weights rounded from master; NULL: fp32
    float *scratch;         // bf16: where the gradient is widened, chunk floats at a time
    size_t chunk;
} AdamWRange;

void adamw_update(const AdamW *h, const Kernels *k, int step, const AdamWRange *r,
                  const GPT2Param *params, int nparams, float grad_scale);

// adamw_update on an fp32 range, as one call (the tools' benchmarks and GPU check use it); new
// code calls adamw_update.
void adamw_step(const AdamW *h, const Kernels *k, int step, float *param, const float *grad,
                float *m, float *v, size_t lo, size_t hi, const GPT2Param *params, int nparams,
                float grad_scale);
// Σ g² over n bf16 gradients (widened chunk by chunk into scratch), accumulated in double.
double bf16_sum_squares(const Kernels *k, const uint16_t *g, size_t n, float *scratch, size_t chunk);
