// optim.c: AdamW (Loshchilov & Hutter) as llm.c and PyTorch run it.
//
//   m = β1·m + (1-β1)·g          v = β2·v + (1-β2)·g²          (g already multiplied by the clip scale)
//   m̂ = m / (1-β1^t)             v̂ = v / (1-β2^t)              (bias correction, t = step + 1)
//   p -= lr · (m̂ / (√v̂ + ε) + wd·p)                            (decoupled decay, 2-D weights only)
//
// The element-wise update runs in the device kernel (k->adamw_update); this file decides the
// learning rate, the clip scale and, per parameter, whether weight decay applies.
#include "optim.h"

#include <math.h>

#include "check.h"

AdamW adamw_defaults(void) {
    AdamW h;
    h.lr = 1e-3f;
    h.beta1 = 0.9f;
    h.beta2 = 0.95f;
    h.eps = 1e-8f;
    h.weight_decay = 0.1f;
    h.grad_clip = 1.0f;
    h.warmup_steps = 0;
    h.total_steps = 0;  // 0: no decay. A chapter sets it to --steps (the run's length).
    h.min_lr_frac = 0.1f;
    h.skip_nan = 0;
    return h;
}

float adamw_lr(const AdamW *h, int step) {
    // Linear warmup: lr/W, 2lr/W, ..., lr over steps 0 .. W-1.
    if (step < h->warmup_steps) return h->lr * (float)(step + 1) / (float)h->warmup_steps;
    if (h->total_steps <= h->warmup_steps) return h->lr;  // no decay phase
    // Cosine from lr (at the end of warmup) to min_lr_frac * lr (at total_steps), then flat.
    double ratio = (double)(step - h->warmup_steps) / (double)(h->total_steps - h->warmup_steps);
    if (ratio > 1.0) ratio = 1.0;
    double min_lr = (double)h->min_lr_frac * (double)h->lr;
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));  // 1 -> 0
    return (float)(min_lr + coeff * ((double)h->lr - min_lr));
}

float adamw_clip_scale(const AdamW *h, double global_norm_sq, int step) {
    if (!isfinite(global_norm_sq) && h->skip_nan) return ADAMW_SKIP;  // --on-nan skip
    if (!isfinite(global_norm_sq))
        // step + 1: counted from 1, as the progress lines; every rank that steps sees the same
        // averaged gradient, so one message (rank 0's)
        lab_fail_collective("NaN/Inf in the gradients at step %d (global norm^2 = %g): the "
                            "update would destroy the weights, so training stops before it. "
                            "Usual causes: a learning rate too high (try a lower --lr or a "
                            "--warmup), or a fault injected with --inject-nan-step; --on-nan skip "
                            "skips such a step's update instead",
                            step + 1, global_norm_sq);
    if (h->grad_clip <= 0.0f) return 1.0f;
    double norm = sqrt(global_norm_sq);
    return norm > (double)h->grad_clip ? (float)((double)h->grad_clip / norm) : 1.0f;
}

// fp32 AdamW on [lo, hi): a range may start or end inside a parameter, so each parameter's
// overlap with it is one kernel call, with that parameter's weight decay.
static void update_f32(const AdamW *h, const Kernels *k, int step, float *param, const float *grad,
                       float *m, float *v, size_t lo, size_t hi, const GPT2Param *params,
                       int nparams, float grad_scale) {
    LAB_CHECK(lo <= hi, "adamw_update: empty range [%zu, %zu)", lo, hi);
    int t = step + 1;
    float lr = adamw_lr(h, step);
    float bc1 = (float)(1.0 - pow((double)h->beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)h->beta2, (double)t));
    size_t covered = 0;
    for (int i = 0; i < nparams; i++) {
        size_t a = params[i].offset, b = params[i].offset + params[i].size;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a >= b) continue;
        size_t off = a - lo;  // position in the range-local buffers
        float decay = params[i].decay ? h->weight_decay : 0.0f;
        k->adamw_update(param + off, grad + off, m + off, v + off, b - a, lr, h->beta1, h->beta2,
                        h->eps, decay, bc1, bc2, grad_scale);
        covered += b - a;
    }
    LAB_CHECK(covered == hi - lo,
              "adamw_update: the parameter list covers %zu of the %zu elements in [%zu, %zu)",
              covered, hi - lo, lo, hi);
}

void adamw_update(const AdamW *h, const Kernels *k, int step, const AdamWRange *r,
                  const GPT2Param *params, int nparams, float grad_scale) {
    if (grad_scale == ADAMW_SKIP) return;  // a skipped step: weights, m and v as they were
    if (!r->bf16) {
        update_f32(h, k, step, r->master, r->grad, r->m, r->v, r->lo, r->hi, params, nparams,
                   grad_scale);
        return;
    }
    LAB_CHECK(r->chunk > 0, "adamw_update: bf16 with a scratch buffer of 0 floats");
    const uint16_t *grad = r->grad;
    for (size_t a = r->lo; a < r->hi; a += r->chunk) {
        size_t b = r->hi - a < r->chunk ? r->hi : a + r->chunk;
        size_t off = a - r->lo;  // position in the range-local buffers
        k->bf16_to_f32(r->scratch, grad + off, b - a);
        update_f32(h, k, step, r->master + off, r->scratch, r->m + off, r->v + off, a, b, params,
                   nparams, grad_scale);
        k->f32_to_bf16(r->bf16 + off, r->master + off, b - a);
    }
}

void adamw_step(const AdamW *h, const Kernels *k, int step, float *param, const float *grad,
                float *m, float *v, size_t lo, size_t hi, const GPT2Param *params, int nparams,
                float grad_scale) {
    AdamWRange r = {.lo = lo, .hi = hi, .master = param, .grad = grad, .m = m, .v = v};
    adamw_update(h, k, step, &r, params, nparams, grad_scale);
}

double bf16_sum_squares(const Kernels *k, const uint16_t *g, size_t n, float *scratch, size_t chunk) {
    LAB_CHECK(chunk > 0, "bf16_sum_squares: a scratch buffer of 0 floats");
    double sum = 0.0;
    for (size_t a = 0; a < n; a += chunk) {
        size_t len = n - a < chunk ? n - a : chunk;
        k->bf16_to_f32(scratch, g + a, len);
        sum += k->sum_squares(scratch, len);
    }
    return sum;
}
