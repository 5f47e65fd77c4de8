// test_kernels.c: the CPU kernels, one layer at a time.
//
//   - every forward against a naive reference written here in double precision;
//   - every backward against central finite differences of its own forward, on the random
//     scalar objective J = Σ out·R (so dout = R), on small shapes (B=2, T=20, C=40, NH=2,
//     V=37): big enough that the kernels' 16-wide SIMD chunks AND their scalar tails both run
//     (a row of 20 or 40 is one or two whole chunks plus a tail);
//   - backward OVERWRITES the gradients of its inputs (they start as garbage, NaN included, in
//     every finite-difference test) and ACCUMULATES (+=) into the gradients of the parameters;
//   - the optimizer pieces and the bf16 conversions (suite bf16) against hand-derived values.
//
// Finite differences in fp32: the forward's rounding makes J noisy at ~1e-6 (J is summed in
// double, but each output carries fp32 rounding), so h must not be tiny: h = 1e-2 on inputs of
// size ~1, with the 4-point stencil (8(J(x+h) - J(x-h)) - (J(x+2h) - J(x-2h))) / 12h, whose
// truncation error is O(h⁴) ~ 1e-8; the noise becomes ~1e-5 to 1e-4 in the estimate.
// A gradient passes when |analytic - numeric| <= FD_ATOL + FD_RTOL·|numeric|.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define FD_H 1e-2
#define FD_ATOL 2e-4
#define FD_RTOL 2e-3

enum { B = 2, T = 20, C = 40, NH = 2, V = 37, N = B * T };

static const Kernels *K(void) { return kernels_get(DEV_CPU); }

// ---- small utilities ---------------------------------------------------------------------------

static uint64_t rng_state = 1;
static float frand(void) {  // uniform in [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
// Every buffer of a test is remembered and freed after it (clean under LeakSanitizer).
static void *live[256];
static int nlive = 0;
static void *track(void *p) {
    cr_assert(nlive < 256, "too many test buffers");
    return live[nlive++] = p;
}
static void free_all(void) {
    while (nlive > 0) free(live[--nlive]);
}
TestSuite(kernels, .fini = free_all);

static float *rand_buf(size_t n, float scale) {
    float *x = track(malloc(n * sizeof(float)));
    for (size_t i = 0; i < n; i++) x[i] = scale * frand();
    return x;
}
static float *zeros(size_t n) { return track(calloc(n ? n : 1, sizeof(float))); }
// An input-gradient buffer before a backward: garbage (NaN and large values) that an overwriting
// backward must never read.
static float *garbage(size_t n) {
    float *x = track(malloc((n ? n : 1) * sizeof(float)));
    for (size_t i = 0; i < n; i++) x[i] = i % 3 == 0 ? NAN : 1e3f * frand();
    return x;
}
static float *copy_buf(const float *x, size_t n) {
    float *y = track(malloc(n * sizeof(float)));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double dot_d(const float *a, const float *r, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)r[i];
    return s;
}

// A forward pass turned into the scalar objective J = Σ out·R.
typedef double (*Objective)(void *ctx);

// Compare grad[i] with the central difference of f at x[i], for every i < n.
static void check_grad(const char *what, float *x, const float *grad, size_t n, Objective f,
                       void *ctx) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        float saved = x[i];
        double j[4];  // J at x - 2h, x - h, x + h, x + 2h
        const float steps[4] = {-2.0f * (float)FD_H, -(float)FD_H, (float)FD_H, 2.0f * (float)FD_H};
        for (int k = 0; k < 4; k++) {
            x[i] = saved + steps[k];
            j[k] = f(ctx);
        }
        x[i] = saved;
        double num = (8.0 * (j[2] - j[1]) - (j[3] - j[0])) / (12.0 * FD_H);
        double err = fabs((double)grad[i] - num);
        double allowed = FD_ATOL + FD_RTOL * fabs(num);
        if (err / allowed > worst) worst = err / allowed;
        cr_assert(err <= allowed, "%s[%zu]: backward %.6g, finite difference %.6g (|diff| %.3g > %.3g)",
                  what, i, (double)grad[i], num, err, allowed);
    }
    cr_log_info("%s: worst error %.2f of the tolerance", what, worst);
}

static void assert_close(const char *what, const float *got, const double *want, size_t n,
                         double rtol, double atol) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= atol + rtol * fabs(want[i]),
                  "%s[%zu] = %.8g, reference %.8g", what, i, (double)got[i], want[i]);
}

// ---- encoder -----------------------------------------------------------------------------------

typedef struct { int inp[N]; float *wte, *wpe, *out, *R; } EncCtx;
static double enc_obj(void *p) {
    EncCtx *c = p;
    K()->encoder_forward(c->out, c->inp, c->wte, c->wpe, B, T, C);
    return dot_d(c->out, c->R, (size_t)N * C);
}
static void enc_setup(EncCtx *c) {
    for (int i = 0; i < N; i++) c->inp[i] = (i * 7 + 3) % V;
    c->inp[1] = c->inp[0];  // a repeated token: its wte row gets two contributions
    c->wte = rand_buf((size_t)V * C, 1.0f);
    c->wpe = rand_buf((size_t)T * C, 1.0f);
    c->out = zeros((size_t)N * C);
    c->R = rand_buf((size_t)N * C, 1.0f);
}

Test(kernels, encoder_forward_matches_reference) {
    EncCtx c;
    enc_setup(&c);
    enc_obj(&c);
    double want[N * C];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                want[(b * T + t) * C + i] = (double)c.wte[c.inp[b * T + t] * C + i] + c.wpe[t * C + i];
    assert_close("encoded", c.out, want, N * C, 1e-7, 0.0);
}

Test(kernels, encoder_backward_matches_finite_differences) {
    EncCtx c;
    enc_setup(&c);
    float *dwte = zeros((size_t)V * C), *dwpe = zeros((size_t)T * C);
    K()->encoder_backward(dwte, dwpe, c.R, c.inp, B, T, C);
    check_grad("dwte", c.wte, dwte, (size_t)V * C, enc_obj, &c);
    check_grad("dwpe", c.wpe, dwpe, (size_t)T * C, enc_obj, &c);
}

// ---- layernorm ---------------------------------------------------------------------------------

// S: a skip connection around the LayerNorm, J = Σ out·R + Σ inp·S (the input's gradient then
// arrives both ways: dskip = S, and the backward must add it).
typedef struct { float *inp, *w, *b, *out, *mean, *rstd, *R, *S; } LnCtx;
static double ln_obj(void *p) {
    LnCtx *c = p;
    K()->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, N, C);
    double skip = c->S ? dot_d(c->inp, c->S, (size_t)N * C) : 0.0;
    return dot_d(c->out, c->R, (size_t)N * C) + skip;
}
static void ln_setup(LnCtx *c) {
    c->inp = rand_buf((size_t)N * C, 2.0f);
    c->w = rand_buf(C, 1.0f);
    c->b = rand_buf(C, 1.0f);
    c->out = zeros((size_t)N * C);
    c->mean = zeros(N);
    c->rstd = zeros(N);
    c->R = rand_buf((size_t)N * C, 1.0f);
    c->S = NULL;
}

Test(kernels, layernorm_forward_matches_reference) {
    LnCtx c;
    ln_setup(&c);
    ln_obj(&c);
    double want[N * C];
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += c.inp[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (c.inp[n * C + i] - m) * (c.inp[n * C + i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++) want[n * C + i] = (c.inp[n * C + i] - m) * s * c.w[i] + c.b[i];
        cr_assert_float_eq(c.mean[n], m, 1e-6);
        cr_assert(fabs(c.rstd[n] - s) <= 1e-5 * s);
    }
    assert_close("ln", c.out, want, N * C, 1e-5, 1e-6);
}

Test(kernels, layernorm_backward_matches_finite_differences) {
    LnCtx c;
    ln_setup(&c);
    ln_obj(&c);  // fills mean, rstd
    float *dinp = garbage((size_t)N * C), *dw = zeros(C), *db = zeros(C);
    K()->layernorm_backward(dinp, dw, db, c.R, NULL, c.inp, c.w, c.mean, c.rstd, N, C);
    check_grad("ln dinp", c.inp, dinp, (size_t)N * C, ln_obj, &c);
    check_grad("ln dw", c.w, dw, C, ln_obj, &c);
    check_grad("ln db", c.b, db, C, ln_obj, &c);
}

Test(kernels, layernorm_backward_adds_the_skip_gradient) {
    LnCtx c;
    ln_setup(&c);
    c.S = rand_buf((size_t)N * C, 1.0f);
    ln_obj(&c);
    float *dinp = garbage((size_t)N * C), *dw = zeros(C), *db = zeros(C);
    K()->layernorm_backward(dinp, dw, db, c.R, c.S, c.inp, c.w, c.mean, c.rstd, N, C);
    check_grad("ln dinp (with dskip)", c.inp, dinp, (size_t)N * C, ln_obj, &c);
}

// A split backward calls the LayerNorm backward twice: dinp only (dw = db = NULL), later dw and
// db only (dinp = NULL). Each half must give exactly the bits of the call that computes both
// (gpt2.h: B then W == the full backward). The weight half accumulates (+=) like the full call.
// Seen to fail: the dinp-only half skipping the skip gradient; the weight half using
// dout * w instead of dout for db.
Test(kernels, layernorm_backward_halves_equal_the_whole) {
    LnCtx c;
    ln_setup(&c);
    c.S = rand_buf((size_t)N * C, 1.0f);
    ln_obj(&c);
    float *dinp = garbage((size_t)N * C), *dw = rand_buf(C, 1.0f), *db = rand_buf(C, 1.0f);
    float *dinp2 = garbage((size_t)N * C), *dw2 = zeros(C), *db2 = zeros(C);
    memcpy(dw2, dw, C * sizeof(float));  // both start from the same accumulated values
    memcpy(db2, db, C * sizeof(float));
    K()->layernorm_backward(dinp, dw, db, c.R, c.S, c.inp, c.w, c.mean, c.rstd, N, C);
    K()->layernorm_backward(dinp2, NULL, NULL, c.R, c.S, c.inp, c.w, c.mean, c.rstd, N, C);
    K()->layernorm_backward(NULL, dw2, db2, c.R, c.S, c.inp, c.w, c.mean, c.rstd, N, C);
    cr_assert(memcmp(dinp, dinp2, (size_t)N * C * sizeof(float)) == 0, "dinp of the B half differs");
    cr_assert(memcmp(dw, dw2, C * sizeof(float)) == 0, "dw of the W half differs");
    cr_assert(memcmp(db, db2, C * sizeof(float)) == 0, "db of the W half differs");
}

// ---- matmul ------------------------------------------------------------------------------------

enum { MC = 24, MOC = 20 };
typedef struct { float *inp, *w, *bias, *out, *R; } MmCtx;
static double mm_obj(void *p) {
    MmCtx *c = p;
    K()->matmul_forward(c->out, c->inp, c->w, c->bias, N, MC, MOC);
    return dot_d(c->out, c->R, (size_t)N * MOC);
}
static void mm_setup(MmCtx *c) {
    c->inp = rand_buf((size_t)N * MC, 1.0f);
    c->w = rand_buf((size_t)MOC * MC, 1.0f);
    c->bias = rand_buf(MOC, 1.0f);
    c->out = zeros((size_t)N * MOC);
    c->R = rand_buf((size_t)N * MOC, 1.0f);
}

Test(kernels, matmul_forward_matches_triple_loop) {
    MmCtx c;
    mm_setup(&c);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *bias = with_bias ? c.bias : NULL;
        K()->matmul_forward(c.out, c.inp, c.w, bias, N, MC, MOC);
        double want[N * MOC];
        for (int n = 0; n < N; n++)
            for (int o = 0; o < MOC; o++) {
                double s = bias ? bias[o] : 0.0;
                for (int i = 0; i < MC; i++) s += (double)c.inp[n * MC + i] * c.w[o * MC + i];
                want[n * MOC + o] = s;
            }
        assert_close(with_bias ? "out (bias)" : "out (no bias)", c.out, want, N * MOC, 1e-5, 1e-6);
    }
}

Test(kernels, matmul_backward_matches_finite_differences) {
    MmCtx c;
    mm_setup(&c);
    float *dinp = garbage((size_t)N * MC), *dw = zeros((size_t)MOC * MC), *db = zeros(MOC);
    K()->matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, MC, MOC);
    check_grad("mm dinp", c.inp, dinp, (size_t)N * MC, mm_obj, &c);
    check_grad("mm dw", c.w, dw, (size_t)MOC * MC, mm_obj, &c);
    check_grad("mm dbias", c.bias, db, MOC, mm_obj, &c);
}

Test(kernels, matmul_backward_skips_null_outputs) {
    MmCtx c;
    mm_setup(&c);
    float *dw = zeros((size_t)MOC * MC), *dw2 = zeros((size_t)MOC * MC);
    K()->matmul_backward(NULL, dw, NULL, c.R, c.inp, c.w, N, MC, MOC);
    K()->matmul_backward(zeros((size_t)N * MC), dw2, zeros(MOC), c.R, c.inp, c.w, N, MC, MOC);
    for (int i = 0; i < MOC * MC; i++) cr_assert_eq(dw[i], dw2[i]);
}

// ---- attention ---------------------------------------------------------------------------------

typedef struct { float *qkv, *out, *preatt, *att, *R; } AttCtx;
static double att_obj(void *p) {
    AttCtx *c = p;
    K()->attention_forward(c->out, c->preatt, c->att, c->qkv, B, T, C, NH);
    return dot_d(c->out, c->R, (size_t)N * C);
}
static void att_setup(AttCtx *c) {
    c->qkv = rand_buf((size_t)N * 3 * C, 1.5f);
    c->out = zeros((size_t)N * C);
    c->preatt = zeros((size_t)B * NH * T * T);
    c->att = zeros((size_t)B * NH * T * T);
    c->R = rand_buf((size_t)N * C, 1.0f);
}

// Causal attention written out directly: head h uses channels [h·hs, (h+1)·hs) of Q, K, V.
static void attention_reference(double *out, const float *qkv) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                const float *q = qkv + (b * T + t) * 3 * C + h * hs;
                double w[T], mx = -1e300, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++) s += (double)q[i] * k[i];
                    w[t2] = s * scale;
                    if (w[t2] > mx) mx = w[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) sum += (w[t2] = exp(w[t2] - mx));
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int t2 = 0; t2 <= t; t2++) o += w[t2] / sum * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = o;
                }
            }
}

Test(kernels, attention_forward_matches_reference) {
    AttCtx c;
    att_setup(&c);
    att_obj(&c);
    double want[N * C];
    attention_reference(want, c.qkv);
    assert_close("atty", c.out, want, N * C, 1e-5, 1e-6);
    // att rows are probabilities over the visible past, zero on the future
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int t2 = 0; t2 < T; t2++) {
                float a = c.att[(bh * T + t) * T + t2];
                if (t2 > t) cr_assert_eq(a, 0.0f, "att[%d][%d][%d] sees the future", bh, t, t2);
                s += a;
            }
            cr_assert(fabs(s - 1.0) < 1e-5, "att row (%d, %d) sums to %.8f", bh, t, s);
        }
}

Test(kernels, attention_backward_matches_finite_differences) {
    AttCtx c;
    att_setup(&c);
    att_obj(&c);
    float *dqkv = garbage((size_t)N * 3 * C);
    float *dpreatt = rand_buf((size_t)B * NH * T * T, 1.0f);  // scratch: garbage must not matter
    float *datt = rand_buf((size_t)B * NH * T * T, 1.0f);
    K()->attention_backward(dqkv, dpreatt, datt, c.R, c.qkv, c.att, B, T, C, NH);
    check_grad("attention dqkv", c.qkv, dqkv, (size_t)N * 3 * C, att_obj, &c);
}

// ---- gelu ----------------------------------------------------------------------------------------

enum { NG = 64 };
typedef struct { float *inp, *out, *R; } GeluCtx;
static double gelu_obj(void *p) {
    GeluCtx *c = p;
    K()->gelu_forward(c->out, c->inp, NG);
    return dot_d(c->out, c->R, NG);
}
static void gelu_setup(GeluCtx *c) {
    c->inp = rand_buf(NG, 4.0f);  // covers both tails and the bend around 0
    c->out = zeros(NG);
    c->R = rand_buf(NG, 1.0f);
}

Test(kernels, gelu_forward_matches_tanh_formula) {
    GeluCtx c;
    gelu_setup(&c);
    float extreme[6] = {-100.0f, -20.0f, 0.0f, 1e-30f, 20.0f, 100.0f};
    memcpy(c.inp, extreme, sizeof extreme);
    gelu_obj(&c);
    double want[NG];
    for (int i = 0; i < NG; i++) {
        double x = c.inp[i];
        want[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    assert_close("gelu", c.out, want, NG, 1e-6, 1e-7);
}

Test(kernels, gelu_backward_matches_finite_differences) {
    GeluCtx c;
    gelu_setup(&c);
    float *dinp = garbage(NG);
    K()->gelu_backward(dinp, c.inp, c.R, NG);
    check_grad("gelu dinp", c.inp, dinp, NG, gelu_obj, &c);
}

// ---- residual ----------------------------------------------------------------------------------

typedef struct { float *a, *b, *out, *R; } ResCtx;
static double res_obj(void *p) {
    ResCtx *c = p;
    K()->residual_forward(c->out, c->a, c->b, (size_t)N * C);
    return dot_d(c->out, c->R, (size_t)N * C);
}

Test(kernels, residual_forward_and_backward) {
    ResCtx c = {rand_buf((size_t)N * C, 1), rand_buf((size_t)N * C, 1), zeros((size_t)N * C),
                rand_buf((size_t)N * C, 1)};
    res_obj(&c);
    for (int i = 0; i < N * C; i++) cr_assert_eq(c.out[i], c.a[i] + c.b[i]);
    float *da = garbage((size_t)N * C), *db = garbage((size_t)N * C);
    K()->residual_backward(da, db, c.R, (size_t)N * C);
    check_grad("residual da", c.a, da, (size_t)N * C, res_obj, &c);
    check_grad("residual db", c.b, db, (size_t)N * C, res_obj, &c);
}

// ---- softmax + cross-entropy ------------------------------------------------------------------

typedef struct { float *logits, *probs, *losses; int targets[N]; float dloss; } CeCtx;
static double ce_obj(void *p) {  // J = dloss · Σ losses (dloss = 1/N: the mean loss)
    CeCtx *c = p;
    K()->softmax_forward(c->probs, c->logits, N, V);
    K()->crossentropy_forward(c->losses, c->probs, c->targets, N, V);
    double s = 0;
    for (int n = 0; n < N; n++) s += c->losses[n];
    return s * c->dloss;
}
static void ce_setup(CeCtx *c) {
    c->logits = rand_buf((size_t)N * V, 3.0f);
    c->probs = zeros((size_t)N * V);
    c->losses = zeros(N);
    for (int n = 0; n < N; n++) c->targets[n] = (n * 5 + 1) % V;
    c->dloss = 1.0f / N;
    // e^100 overflows fp32: softmax must subtract the row's true max to tell 100 from 95
    c->logits[1] = 100.0f;  // row 0's target is 1: in the first SIMD chunk of the row
    c->logits[2] = 95.0f;
    c->targets[1] = 34;  // row 1: the same in the scalar tail (columns 32..36)
    c->logits[V + 34] = 100.0f;
    c->logits[V + 35] = 95.0f;
}

Test(kernels, softmax_crossentropy_forward_matches_reference) {
    CeCtx c;
    ce_setup(&c);
    ce_obj(&c);
    for (int n = 0; n < N; n++) {
        double mx = -1e300, sum = 0, want[V];
        for (int v = 0; v < V; v++) mx = fmax(mx, c.logits[n * V + v]);
        for (int v = 0; v < V; v++) sum += exp((double)c.logits[n * V + v] - mx);
        for (int v = 0; v < V; v++) want[v] = exp((double)c.logits[n * V + v] - mx) / sum;
        assert_close("probs", c.probs + n * V, want, V, 1e-6, 1e-12);
        double loss = -log(want[c.targets[n]]);
        cr_assert(fabs(c.losses[n] - loss) <= 1e-5 * fmax(1.0, loss), "loss[%d] = %g, reference %g",
                  n, (double)c.losses[n], loss);
    }
}

Test(kernels, crossentropy_softmax_backward_matches_finite_differences) {
    CeCtx c;
    ce_setup(&c);
    ce_obj(&c);
    float *dlogits = garbage((size_t)N * V);
    K()->crossentropy_softmax_backward(dlogits, c.probs, c.targets, c.dloss, N, V);
    check_grad("dlogits", c.logits, dlogits, (size_t)N * V, ce_obj, &c);
}

// ---- backward overwrites input gradients, accumulates parameter gradients ---------------------
// A backward run on buffers that hold G0 must give: for an input gradient exactly its result
// from zeros (G0, here garbage with NaNs, is never read); for a parameter gradient
// G0 + (its result from zeros).

static void assert_accumulates(const char *what, const float *from_zero, const float *g0,
                               const float *from_g0, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double want = (double)g0[i] + from_zero[i];
        cr_assert(fabs(from_g0[i] - want) <= 1e-5 * (1.0 + fabs(want)),
                  "%s[%zu]: %g, want G0 + grad = %g (backward must add, not overwrite)", what, i,
                  (double)from_g0[i], want);
    }
}

static void assert_overwrites(const char *what, const float *from_zero, const float *from_g0,
                              size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert(from_g0[i] == from_zero[i],
                  "%s[%zu]: %g from garbage, %g from zeros (backward must overwrite, not add)",
                  what, i, (double)from_g0[i], (double)from_zero[i]);
}

Test(kernels, backward_overwrites_inputs_accumulates_params) {
    // matmul: dinp overwritten; dw, dbias accumulate
    MmCtx m;
    mm_setup(&m);
    size_t ni = (size_t)N * MC, nw = (size_t)MOC * MC;
    float *di = zeros(ni), *dw = zeros(nw), *db = zeros(MOC);
    K()->matmul_backward(di, dw, db, m.R, m.inp, m.w, N, MC, MOC);
    float *gw = rand_buf(nw, 1), *gb = rand_buf(MOC, 1);
    float *di2 = garbage(ni), *dw2 = copy_buf(gw, nw), *db2 = copy_buf(gb, MOC);
    K()->matmul_backward(di2, dw2, db2, m.R, m.inp, m.w, N, MC, MOC);
    assert_overwrites("matmul dinp", di, di2, ni);
    assert_accumulates("matmul dw", dw, gw, dw2, nw);
    assert_accumulates("matmul dbias", db, gb, db2, MOC);

    // layernorm: dinp overwritten (with and without dskip); dw, db accumulate
    LnCtx l;
    ln_setup(&l);
    ln_obj(&l);
    size_t nl = (size_t)N * C;
    float *skip = rand_buf(nl, 1);
    for (int with_skip = 0; with_skip < 2; with_skip++) {
        const float *dskip = with_skip ? skip : NULL;
        float *ldi = zeros(nl), *ldw = zeros(C), *ldb = zeros(C);
        K()->layernorm_backward(ldi, ldw, ldb, l.R, dskip, l.inp, l.w, l.mean, l.rstd, N, C);
        float *lgw = rand_buf(C, 1), *lgb = rand_buf(C, 1);
        float *ldi2 = garbage(nl), *ldw2 = copy_buf(lgw, C), *ldb2 = copy_buf(lgb, C);
        K()->layernorm_backward(ldi2, ldw2, ldb2, l.R, dskip, l.inp, l.w, l.mean, l.rstd, N, C);
        assert_overwrites("layernorm dinp", ldi, ldi2, nl);
        assert_accumulates("layernorm dw", ldw, lgw, ldw2, C);
        assert_accumulates("layernorm db", ldb, lgb, ldb2, C);
    }

    // attention: dqkv overwritten
    AttCtx a;
    att_setup(&a);
    att_obj(&a);
    size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T;
    float *dq = zeros(nq), *s1 = zeros(na), *s2 = zeros(na);
    K()->attention_backward(dq, s1, s2, a.R, a.qkv, a.att, B, T, C, NH);
    float *dq2 = garbage(nq);
    K()->attention_backward(dq2, garbage(na), garbage(na), a.R, a.qkv, a.att, B, T, C, NH);
    assert_overwrites("attention dqkv", dq, dq2, nq);

    // gelu, residual, cross-entropy overwrite; the encoder (dwte, dwpe) accumulates
    GeluCtx g;
    gelu_setup(&g);
    float *gd = zeros(NG), *gd2 = garbage(NG);
    K()->gelu_backward(gd, g.inp, g.R, NG);
    K()->gelu_backward(gd2, g.inp, g.R, NG);
    assert_overwrites("gelu dinp", gd, gd2, NG);

    float *r = rand_buf(nl, 1), *ra = zeros(nl), *rb = zeros(nl);
    float *ra2 = garbage(nl), *rb2 = garbage(nl);
    K()->residual_backward(ra, rb, r, nl);
    K()->residual_backward(ra2, rb2, r, nl);
    assert_overwrites("residual da", ra, ra2, nl);
    assert_overwrites("residual db", rb, rb2, nl);

    EncCtx e;
    enc_setup(&e);
    size_t nte = (size_t)V * C, npe = (size_t)T * C;
    float *ete = zeros(nte), *epe = zeros(npe), *g0te = rand_buf(nte, 1), *g0pe = rand_buf(npe, 1);
    float *ete2 = copy_buf(g0te, nte), *epe2 = copy_buf(g0pe, npe);
    K()->encoder_backward(ete, epe, e.R, e.inp, B, T, C);
    K()->encoder_backward(ete2, epe2, e.R, e.inp, B, T, C);
    assert_accumulates("encoder dwte", ete, g0te, ete2, nte);
    assert_accumulates("encoder dwpe", epe, g0pe, epe2, npe);

    CeCtx ce;
    ce_setup(&ce);
    ce_obj(&ce);
    size_t nv = (size_t)N * V;
    float *dl = zeros(nv), *dl2 = garbage(nv);
    K()->crossentropy_softmax_backward(dl, ce.probs, ce.targets, ce.dloss, N, V);
    K()->crossentropy_softmax_backward(dl2, ce.probs, ce.targets, ce.dloss, N, V);
    assert_overwrites("dlogits", dl, dl2, nv);
}

// ---- optimizer pieces --------------------------------------------------------------------------

Test(kernels, adamw_update_matches_formula) {
    enum { NA = 600 };  // two whole chunks of 256 and a partial one
    float *p = rand_buf(NA, 1), *g = rand_buf(NA, 1), *m = rand_buf(NA, 0.1f), *v = rand_buf(NA, 0.1f);
    for (int i = 0; i < NA; i++) v[i] = fabsf(v[i]);
    float *p0 = copy_buf(p, NA), *m0 = copy_buf(m, NA), *v0 = copy_buf(v, NA);
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    int t = 3;
    float bc1 = 1.0f - powf(b1, t), bc2 = 1.0f - powf(b2, t);
    K()->adamw_update(p, g, m, v, NA, lr, b1, b2, eps, wd, bc1, bc2, gs);
    for (int i = 0; i < NA; i++) {
        double gi = (double)g[i] * gs;
        double mi = b1 * (double)m0[i] + (1 - b1) * gi;
        double vi = b2 * (double)v0[i] + (1 - b2) * gi * gi;
        double pi = p0[i] - lr * ((mi / bc1) / (sqrt(vi / bc2) + eps) + wd * (double)p0[i]);
        // fp32 rounding, relative to the size of the terms (m and v may cancel to near 0)
        double mtol = 1e-6 * (fabs(b1 * m0[i]) + fabs((1 - b1) * gi));
        double vtol = 1e-6 * (fabs(b2 * v0[i]) + fabs((1 - b2) * gi * gi));
        double ptol = 1e-6 * (fabs(p0[i]) + fabs(pi - p0[i]));
        cr_assert(fabs(m[i] - mi) <= mtol, "m[%d] = %.9g, want %.9g", i, (double)m[i], mi);
        cr_assert(fabs(v[i] - vi) <= vtol, "v[%d] = %.9g, want %.9g", i, (double)v[i], vi);
        cr_assert(fabs(p[i] - pi) <= ptol, "param[%d] = %.9g, want %.9g", i, (double)p[i], pi);
    }
}

Test(kernels, sum_squares_and_scale) {
    enum { NS = 1001 };  // not a multiple of the partial-sum width
    float *x = rand_buf(NS, 3);
    double want = 0;
    for (int i = 0; i < NS; i++) want += (double)x[i] * x[i];
    cr_assert(fabs(K()->sum_squares(x, NS) - want) <= 1e-12 * want);
    cr_assert_eq(K()->sum_squares(x, 0), 0.0);
    float *y = copy_buf(x, NS);
    K()->scale(y, -0.25f, NS);
    for (int i = 0; i < NS; i++) cr_assert_eq(y[i], x[i] * -0.25f);
}

// ---- bf16 ----------------------------------------------------------------------------------------

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint16_t bf(uint32_t bits) { return bf16_from_f32(f32_from_bits(bits)); }

Test(bf16, exact_values_are_kept) {
    cr_assert_eq(bf(0x3f800000u), 0x3f80);  // 1.0
    cr_assert_eq(bf(0xc0490000u), 0xc049);  // -3.140625
    cr_assert_eq(bf(0x00000000u), 0x0000);  // +0
    cr_assert_eq(bf(0x80000000u), 0x8000);  // -0
    cr_assert_eq(bf16_to_f32(0x3f80), 1.0f);
    cr_assert_eq(bf16_to_f32(0xc049), -3.140625f);
}

Test(bf16, rounds_to_nearest) {
    cr_assert_eq(bf(0x3f808001u), 0x3f81);  // just above half an ulp: up
    cr_assert_eq(bf(0x3f807fffu), 0x3f80);  // just below half an ulp: down
    cr_assert_eq(bf(0xbf80c000u), 0xbf81);  // negative: magnitude rounds the same way
}

Test(bf16, ties_go_to_even) {
    cr_assert_eq(bf(0x3f808000u), 0x3f80);  // 1 + 2^-8: halfway between 0x3f80 (even) and 0x3f81
    cr_assert_eq(bf(0x3f818000u), 0x3f82);  // halfway between 0x3f81 and 0x3f82 (even): up
    cr_assert_eq(bf(0xbf818000u), 0xbf82);
    cr_assert_eq(bf(0x3fff8000u), 0x4000);  // the tie carries into the exponent: 1.99609375 -> 2
}

Test(bf16, nan_stays_quiet_nan) {
    cr_assert_eq(bf(0x7fc00000u), 0x7fc0);  // quiet NaN
    cr_assert_eq(bf(0xffc00000u), 0xffc0);  // negative quiet NaN keeps its sign
    cr_assert_eq(bf(0x7f800001u), 0x7fc0);  // signaling NaN, payload only in the low bits:
                                            // truncation would give Inf, rounding too
    cr_assert_eq(bf(0x7fffffffu), 0x7fff);  // all-ones payload must not carry into the sign
    cr_assert(isnan(bf16_to_f32(bf(0x7f800001u))));
}

Test(bf16, infinities_are_kept) {
    cr_assert_eq(bf(0x7f800000u), 0x7f80);
    cr_assert_eq(bf(0xff800000u), 0xff80);
    cr_assert(isinf(bf16_to_f32(0x7f80)) && bf16_to_f32(0x7f80) > 0);
    cr_assert(isinf(bf16_to_f32(0xff80)) && bf16_to_f32(0xff80) < 0);
}

Test(bf16, overflow_rounds_to_infinity) {
    cr_assert_eq(bf(0x7f7fffffu), 0x7f80);  // FLT_MAX is above bf16's max finite + half an ulp
    cr_assert_eq(bf(0xff7fffffu), 0xff80);
    cr_assert_eq(bf(0x7f7f8000u), 0x7f80);  // tie between 0x7f7f (odd) and Inf: to "even" Inf
    cr_assert_eq(bf(0x7f7f7fffu), 0x7f7f);  // below the tie: stays at bf16's max finite
}

Test(bf16, subnormals_round_bit_exactly) {
    cr_assert_eq(bf(0x00000001u), 0x0000);  // smallest fp32 subnormal: rounds to +0
    cr_assert_eq(bf(0x00008000u), 0x0000);  // tie, even is 0
    cr_assert_eq(bf(0x00018000u), 0x0002);  // tie, even is 2
    cr_assert_eq(bf(0x0000ffffu), 0x0001);
    cr_assert_eq(bf(0x80008001u), 0x8001);
    cr_assert_eq(bf(0x007fffffu), 0x0080);  // largest subnormal rounds up to the smallest normal
    cr_assert_eq(bf16_to_f32(0x0001), f32_from_bits(0x00010000u));
}

Test(bf16, round_trip_of_every_bf16_value) {
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        cr_assert_eq(bf16_from_f32(f), h, "bf16 0x%04x does not survive the round trip", h);
    }
}

Test(bf16, kernel_arrays_match_the_scalar_helpers) {
    uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x7f800001u, 0xff800000u, 0x00018000u,
                       0x7f7fffffu, 0x12345678u, 0x80000000u, 0xc0490fdbu};
    enum { NB = sizeof bits / sizeof bits[0] };
    float in[NB], back[NB];
    uint16_t out[NB];
    for (int i = 0; i < NB; i++) in[i] = f32_from_bits(bits[i]);
    K()->f32_to_bf16(out, in, NB);
    K()->bf16_to_f32(back, out, NB);
    for (int i = 0; i < NB; i++) {
        cr_assert_eq(out[i], bf16_from_f32(in[i]), "element %d", i);
        uint32_t want = (uint32_t)out[i] << 16, got;
        memcpy(&got, &back[i], sizeof got);
        cr_assert_eq(got, want, "element %d", i);
    }
}

Test(kernels, table_is_complete) {
    const Kernels *k = kernels_get(DEV_CPU);
    cr_assert_eq(k, &kernels_cpu);
    cr_assert_str_eq(k->name, "cpu");
    cr_assert(k->encoder_forward && k->encoder_backward && k->layernorm_forward &&
              k->layernorm_backward && k->matmul_forward && k->matmul_backward &&
              k->attention_forward && k->attention_backward && k->gelu_forward &&
              k->gelu_backward && k->residual_forward && k->residual_backward &&
              k->softmax_forward && k->crossentropy_forward &&
              k->crossentropy_softmax_backward && k->adamw_update && k->sum_squares &&
              k->scale && k->f32_to_bf16 && k->bf16_to_f32);
}
