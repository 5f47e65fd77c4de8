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
} AdamW;

AdamW adamw_defaults(void);  // lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1, clip 1.0, ...

// Learning rate at step (0-based).
float adamw_lr(const AdamW *h, int step);

// Gradient-norm clipping: given the GLOBAL squared norm (the chapter sums it over shards or
// ranks), returns the factor to multiply gradients by (1 when within grad_clip). Fails the job
// with "NaN/Inf gradient at step S" when the norm is not finite.
float adamw_clip_scale(const AdamW *h, double global_norm_sq, int step);

// One AdamW step (t = step + 1 for bias correction) on elements [lo, hi) of the flat buffers.
// param, grad, m, v point at element lo (shard-local storage). grad_scale multiplies the
// gradient first (clipping). params: the model's parameter list (gpt2_params), nparams long.
void adamw_step(const AdamW *h, const Kernels *k, int step, float *param, const float *grad,
                float *m, float *v, size_t lo, size_t hi, const GPT2Param *params, int nparams,
                float grad_scale);

// Mixed precision: bf16 parameters and gradients, fp32 master weights and m, v (all shard-local
// from element lo, like adamw_step). The bf16 gradients are widened to fp32 a chunk at a time
// into `scratch` (chunk floats on the same device); per chunk AdamW updates the fp32 master,
// then the bf16 parameters become the master rounded to nearest even.
void adamw_step_bf16(const AdamW *h, const Kernels *k, int step, float *master, uint16_t *param,
                     const uint16_t *grad, float *m, float *v, size_t lo, size_t hi,
                     const GPT2Param *params, int nparams, float grad_scale, float *scratch,
                     size_t chunk);
// Σ g² over n bf16 gradients (widened chunk by chunk into scratch), accumulated in double.
double bf16_sum_squares(const Kernels *k, const uint16_t *g, size_t n, float *scratch, size_t chunk);
