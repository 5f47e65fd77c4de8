// test_optim.c: AdamW (common/optim.c) against the formulas, written out here in double.
//
// The parameter list is made by hand (a weight, a bias, a weight), so the tests do not depend
// on the model and the decay pattern is known: decay on elements [0,10) and [17,30) only.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "check.h"
#include "kernels.h"
#include "optim.h"


// ---- a hand-made parameter list ---------------------------------------------------------------

#define NP 3
#define N 30
static const GPT2Param PARAMS[NP] = {
    {.name = "h.0.w", .tensor = 4, .offset = 0, .size = 10, .decay = 1},    // [0, 10): a 2-D weight, decayed
    {.name = "h.0.b", .tensor = 5, .offset = 10, .size = 7, .decay = 0},    // [10, 17): a bias, not decayed
    {.name = "h.0.w2", .tensor = 6, .offset = 17, .size = 13, .decay = 1},  // [17, 30): decayed
};

// Deterministic values in [-1, 1).
static float val(int i, int salt) {
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)salt * 40503u;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    return (float)(x % 20000) / 10000.0f - 1.0f;
}

// ---- the reference: AdamW in double, straight from the paper + PyTorch's bias correction ----
static void ref_step(double *p, const double *g, double *m, double *v, int step, double lr,
                     double b1, double b2, double eps, double wd, double scale) {
    int t = step + 1;
    for (int i = 0; i < N; i++) {
        double gi = g[i] * scale;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
        int decayed = i < 10 || i >= 17;
        p[i] -= lr * mhat / (sqrt(vhat) + eps) + (decayed ? lr * wd * p[i] : 0.0);
    }
}

// fp32 AdamW through the one entry point: elements [lo, hi), every buffer at element lo.
static void step32(const AdamW *h, const Kernels *k, int step, float *p, const float *g, float *m,
                   float *v, size_t lo, size_t hi, const GPT2Param *pl, int np, float scale) {
    AdamWRange r = {.lo = lo, .hi = hi, .master = p, .grad = g, .m = m, .v = v};
    adamw_update(h, k, step, &r, pl, np, scale);
}

Test(optim, defaults) {
    AdamW h = adamw_defaults();
    cr_assert_float_eq(h.lr, 1e-3f, 1e-12);
    cr_assert_float_eq(h.beta1, 0.9f, 1e-12);
    cr_assert_float_eq(h.beta2, 0.95f, 1e-12);
    cr_assert_float_eq(h.eps, 1e-8f, 1e-15);
    cr_assert_float_eq(h.weight_decay, 0.1f, 1e-12);
    cr_assert_float_eq(h.grad_clip, 1.0f, 1e-12);
    cr_assert_eq(h.warmup_steps, 0);
    cr_assert_float_eq(h.min_lr_frac, 0.1f, 1e-12);
}

Test(optim, step_matches_double_reference) {
    const Kernels *k = kernels_get(DEV_CPU);
    AdamW h = adamw_defaults();
    h.lr = 1e-2f;            // large enough that decay and bias correction show
    h.weight_decay = 0.5f;
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double rp[N], rg[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i] = val(i, 1);
    for (int step = 0; step < 6; step++) {
        for (int i = 0; i < N; i++) rg[i] = g[i] = val(i, 100 + step) * (step + 1);
        float scale = step == 2 ? 0.25f : 1.0f;  // one clipped step
        step32(&h, k, step, p, g, m, v, 0, N, PARAMS, NP, scale);
        ref_step(rp, rg, rm, rv, step, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, scale);
        for (int i = 0; i < N; i++) {
            // fp32 vs double over a few element-wise operations: a few ulps of |p| <= 1.
            cr_assert(fabs(p[i] - rp[i]) < 2e-6, "step %d param %d: %.8f, reference %.8f", step, i, p[i], rp[i]);
            cr_assert(fabs(m[i] - rm[i]) < 1e-5 * (1 + fabs(rm[i])), "step %d m[%d]: %g vs %g", step, i, m[i], rm[i]);
            cr_assert(fabs(v[i] - rv[i]) < 1e-5 * (1 + fabs(rv[i])), "step %d v[%d]: %g vs %g", step, i, v[i], rv[i]);
        }
    }
}

Test(optim, weight_decay_only_on_decay_params) {
    // Zero gradient: Adam's part is 0, so what moves is weight decay alone: p *= 1 - lr*wd.
    const Kernels *k = kernels_get(DEV_CPU);
    AdamW h = adamw_defaults();
    h.lr = 0.1f;
    h.weight_decay = 0.5f;
    float p[N], g[N] = {0}, m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++) p[i] = 1.0f;
    step32(&h, k, 0, p, g, m, v, 0, N, PARAMS, NP, 1.0f);
    for (int i = 0; i < N; i++) {
        float want = (i < 10 || i >= 17) ? 0.95f : 1.0f;
        cr_assert_float_eq(p[i], want, 1e-6, "element %d: %.7f, want %.7f", i, p[i], want);
    }
}

Test(optim, first_step_is_bias_corrected) {
    // At t = 1, m̂ = g and v̂ = g², so every element moves by lr * g/(|g| + eps) = ±lr.
    const Kernels *k = kernels_get(DEV_CPU);
    AdamW h = adamw_defaults();
    h.weight_decay = 0.0f;
    float p[N] = {0}, g[N], m[N] = {0}, v[N] = {0};
    for (int i = 0; i < N; i++) g[i] = val(i, 7) + (val(i, 7) >= 0 ? 0.01f : -0.01f);
    step32(&h, k, 0, p, g, m, v, 0, N, PARAMS, NP, 1.0f);
    for (int i = 0; i < N; i++)
        cr_assert_float_eq(p[i], g[i] > 0 ? -1e-3f : 1e-3f, 1e-8, "element %d moved by %g", i, p[i]);
}

Test(optim, zero_style_split_is_bit_exact) {
    // Updating [0,k) and [k,N) as two shards, each in its own shard-local buffers, must equal
    // updating [0,N) at once, bit for bit, for every split point (inside parameters too).
    const Kernels *k = kernels_get(DEV_CPU);
    AdamW h = adamw_defaults();
    h.warmup_steps = 2;
    h.total_steps = 5;
    for (int split = 0; split <= N; split++) {
        float p[N], m[N] = {0}, v[N] = {0}, g[N];
        float sp[N], sm[N] = {0}, sv[N] = {0};  // shards: [0,split) then [split,N) at sp+split
        for (int i = 0; i < N; i++) sp[i] = p[i] = val(i, 3);
        for (int step = 0; step < 4; step++) {
            for (int i = 0; i < N; i++) g[i] = val(i, 50 + step);
            step32(&h, k, step, p, g, m, v, 0, N, PARAMS, NP, 0.7f);
            float *a_p = malloc(sizeof(float) * (size_t)(split + 1)), *b_p = malloc(sizeof(float) * (size_t)(N - split + 1));
            float *a_m = malloc(sizeof(float) * (size_t)(split + 1)), *b_m = malloc(sizeof(float) * (size_t)(N - split + 1));
            float *a_v = malloc(sizeof(float) * (size_t)(split + 1)), *b_v = malloc(sizeof(float) * (size_t)(N - split + 1));
            memcpy(a_p, sp, sizeof(float) * (size_t)split); memcpy(b_p, sp + split, sizeof(float) * (size_t)(N - split));
            memcpy(a_m, sm, sizeof(float) * (size_t)split); memcpy(b_m, sm + split, sizeof(float) * (size_t)(N - split));
            memcpy(a_v, sv, sizeof(float) * (size_t)split); memcpy(b_v, sv + split, sizeof(float) * (size_t)(N - split));
            step32(&h, k, step, a_p, g, a_m, a_v, 0, (size_t)split, PARAMS, NP, 0.7f);
            step32(&h, k, step, b_p, g + split, b_m, b_v, (size_t)split, N, PARAMS, NP, 0.7f);
            memcpy(sp, a_p, sizeof(float) * (size_t)split); memcpy(sp + split, b_p, sizeof(float) * (size_t)(N - split));
            memcpy(sm, a_m, sizeof(float) * (size_t)split); memcpy(sm + split, b_m, sizeof(float) * (size_t)(N - split));
            memcpy(sv, a_v, sizeof(float) * (size_t)split); memcpy(sv + split, b_v, sizeof(float) * (size_t)(N - split));
            free(a_p); free(b_p); free(a_m); free(b_m); free(a_v); free(b_v);
        }
        cr_assert(memcmp(p, sp, sizeof(p)) == 0, "split at %d: params differ", split);
        cr_assert(memcmp(m, sm, sizeof(m)) == 0, "split at %d: m differs", split);
        cr_assert(memcmp(v, sv, sizeof(v)) == 0, "split at %d: v differs", split);
    }
}

Test(optim, bf16_range_is_fp32_on_widened_grads_then_rounded) {
    // bf16 through adamw_update: any range [lo, hi) (inside parameters too), any chunk of the
    // scratch (across parameter boundaries too) must equal, bit for bit, the fp32 update of the
    // master on the widened gradients followed by rounding the master to bf16.
    const Kernels *k = kernels_get(DEV_CPU);
    AdamW h = adamw_defaults();
    h.warmup_steps = 1;
    h.total_steps = 4;
    const size_t ranges[][2] = {{0, N}, {3, 22}, {10, 17}, {29, 30}, {5, 5}};
    const size_t chunks[] = {1, 4, 7, 64};
    for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++)
        for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
            const size_t lo = ranges[ri][0], hi = ranges[ri][1];
            float w[N], m[N] = {0}, v[N] = {0}, rw[N], rm[N] = {0}, rv[N] = {0}, g32[N];
            float scratch[64];
            uint16_t wb[N] = {0}, g16[N];
            for (int i = 0; i < N; i++) rw[i] = w[i] = val(i, 9);
            for (int step = 0; step < 3; step++) {
                for (int i = 0; i < N; i++) {
                    g16[i] = bf16_from_f32(val(i, 60 + step));
                    g32[i] = bf16_to_f32(g16[i]);
                }
                AdamWRange r = {.lo = lo, .hi = hi, .master = w + lo, .grad = g16 + lo,
                                .m = m + lo, .v = v + lo, .bf16 = wb + lo, .scratch = scratch,
                                .chunk = chunks[ci]};
                adamw_update(&h, k, step, &r, PARAMS, NP, 0.6f);
                step32(&h, k, step, rw + lo, g32 + lo, rm + lo, rv + lo, lo, hi, PARAMS, NP, 0.6f);
            }
            cr_assert(memcmp(w, rw, sizeof w) == 0, "[%zu, %zu) chunk %zu: master differs", lo,
                      hi, chunks[ci]);
            cr_assert(memcmp(m, rm, sizeof m) == 0 && memcmp(v, rv, sizeof v) == 0,
                      "[%zu, %zu) chunk %zu: m or v differs", lo, hi, chunks[ci]);
            for (size_t i = 0; i < N; i++) {
                uint16_t want = i >= lo && i < hi ? bf16_from_f32(rw[i]) : 0;
                cr_assert_eq(wb[i], want, "[%zu, %zu) chunk %zu: bf16 weight %zu is %#x, want "
                             "%#x (the master rounded)", lo, hi, chunks[ci], i, wb[i], want);
            }
        }
}

static void step_with_hole(void *arg) {
    (void)arg;
    // A list that misses [10,17): the update of [0,30) must refuse, not skip the bias.
    GPT2Param two[2] = {PARAMS[0], PARAMS[2]};
    AdamW h = adamw_defaults();
    float p[N] = {0}, g[N] = {0}, m[N] = {0}, v[N] = {0};
    step32(&h, kernels_get(DEV_CPU), 0, p, g, m, v, 0, N, two, 2, 1.0f);
}

Test(optim, range_not_covered_by_params_is_an_error) {
    cr_assert(harness_expect_fail(step_with_hole, NULL), "a hole in the parameter list went unnoticed");
}

// ---- schedule and clipping ------------------------------------------------------------------

Test(optim, lr_schedule_points) {
    AdamW h = adamw_defaults();
    h.lr = 1e-3f;
    h.warmup_steps = 4;
    h.total_steps = 20;
    h.min_lr_frac = 0.1f;
    // Warmup: lr * (step+1) / warmup.
    cr_assert_float_eq(adamw_lr(&h, 0), 2.5e-4f, 1e-9);
    cr_assert_float_eq(adamw_lr(&h, 1), 5.0e-4f, 1e-9);
    cr_assert_float_eq(adamw_lr(&h, 3), 1.0e-3f, 1e-9);   // peak at the end of warmup
    cr_assert_float_eq(adamw_lr(&h, 4), 1.0e-3f, 1e-9);   // cosine starts at the peak
    // Halfway through the decay (step 12 of [4, 20]): min + (lr - min)/2 = 1e-4 + 4.5e-4.
    cr_assert_float_eq(adamw_lr(&h, 12), 5.5e-4f, 1e-9);
    // A quarter of the way (step 8): min + (lr - min) * (1 + cos(pi/4))/2.
    cr_assert_float_eq(adamw_lr(&h, 8), 1e-4 + 9e-4 * (1 + sqrt(0.5)) / 2, 1e-9);
    cr_assert_float_eq(adamw_lr(&h, 20), 1.0e-4f, 1e-9);  // min_lr_frac * lr at total_steps
    cr_assert_float_eq(adamw_lr(&h, 25), 1.0e-4f, 1e-9);  // and after
    // Monotone decay after warmup.
    for (int s = 4; s < 20; s++) cr_assert(adamw_lr(&h, s + 1) <= adamw_lr(&h, s));
    // No warmup, no decay: constant.
    AdamW c = adamw_defaults();
    cr_assert_float_eq(adamw_lr(&c, 0), 1e-3f, 1e-9);
    cr_assert_float_eq(adamw_lr(&c, 1000), 1e-3f, 1e-9);
}

Test(optim, clip_scale) {
    AdamW h = adamw_defaults();  // clip 1.0
    cr_assert_float_eq(adamw_clip_scale(&h, 4.0, 0), 0.5f, 1e-7);   // norm 2 -> scale 1/2
    cr_assert_float_eq(adamw_clip_scale(&h, 0.25, 0), 1.0f, 0);     // norm 0.5: untouched
    cr_assert_float_eq(adamw_clip_scale(&h, 1.0, 0), 1.0f, 0);      // exactly at the limit
    cr_assert_float_eq(adamw_clip_scale(&h, 0.0, 0), 1.0f, 0);
    h.grad_clip = 3.0f;
    cr_assert_float_eq(adamw_clip_scale(&h, 36.0, 0), 0.5f, 1e-7);  // norm 6 -> 3/6
    h.grad_clip = 0.0f;                                             // clipping off
    cr_assert_float_eq(adamw_clip_scale(&h, 1e6, 0), 1.0f, 0);
}

static double g_norm_sq;
static float g_clip = 1.0f;
static void clip_bad(void *arg) {
    (void)arg;
    AdamW h = adamw_defaults();
    h.grad_clip = g_clip;
    adamw_clip_scale(&h, g_norm_sq, 7);
}

Test(optim, nan_or_inf_gradient_is_refused) {
    double bad[] = {NAN, INFINITY};
    for (int i = 0; i < 2; i++) {
        g_norm_sq = bad[i];
        const char *msg = harness_expect_fail(clip_bad, NULL);
        cr_assert(msg, "a %g gradient norm was accepted", bad[i]);
        cr_assert(strstr(msg, "NaN/Inf in the gradients at step 8"), "unclear message: %s", msg);  // index 7 = the 8th step
        cr_assert(strstr(msg, "global norm^2 = "), "message lacks the norm: %s", msg);
    }
    // Even with clipping off, a NaN must not pass.
    g_norm_sq = NAN;
    g_clip = 0.0f;
    cr_assert(harness_expect_fail(clip_bad, NULL), "a NaN gradient norm passed with clipping off");
}
