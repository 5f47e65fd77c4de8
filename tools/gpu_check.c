// gpu_check.c: is the CUDA path right? It runs every CUDA kernel and the matching CPU kernel
// on the same random inputs and compares the outputs, then trains a tiny GPT-2 for a few
// steps on both devices and compares gradients, losses and weights, and checks the model's
// pieces on CUDA (external units, split backward, chained stages). Needs one GPU.
//
//   make BUILD=build-cuda CUDA=1 build-cuda/tools/gpu_check && ./build-cuda/tools/gpu_check
//
//   gpu_check                      kernels, then the training comparison
//   gpu_check --kernels-only       kernels only
//   gpu_check --compare-dumps A B [LOSS_RTOL PARAM_ATOL]
//                                  per-step losses and final weights of two --dump files (a
//                                  chapter run with --device cpu and --device cuda, or on N
//                                  ranks and on 1), within the tolerances (default 1e-4, 1e-3)
//
// Exit status: 0 when every check passes, 1 otherwise. In a build without CUDA it says so
// and exits 0 (nothing to check).
//
// How outputs are compared: err = max |cuda - cpu| over the tensor, and rel = err / max |cpu|
// (relative to the tensor's scale, so an element near zero does not blow it up). A check
// passes when rel <= its tolerance; "exact" means err must be 0 (same operations in the same
// order on both devices).
#include <stdio.h>

#ifndef LAB_CUDA

int main(void) {
    printf("gpu_check: built without CUDA (rebuild with `make CUDA=1` on a machine with nvcc); "
           "nothing to check\n");
    return 0;
}

#else

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_util.h"
#include "gpt2.h"
#include "kernels.h"
#include "mem.h"
#include "optim.h"
#include "results.h"
#include "train.h"

static const Kernels *kc;  // the CPU kernels: the reference
static const Kernels *kg;  // the CUDA kernels under test
static int nfail = 0;

// ---- random inputs (a fixed xorshift stream: every run checks the same numbers) ------------

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float rng_uniform(float lo, float hi) {  // in [lo, hi)
    return lo + (hi - lo) * (float)(rng_u32() >> 8) / 16777216.0f;
}
static float *host_rand(size_t n, float lo, float hi) {
    float *x = lab_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
    return x;
}
static int *host_tokens(size_t n, int V) {
    int *x = lab_xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) x[i] = (int)(rng_u32() % (uint32_t)V);
    return x;
}
static float *host_copy(const float *x, size_t n) {
    float *y = lab_xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

// ---- device buffers (freed together at the end of each check) -------------------------------

#define MAX_LIVE 64
static void *live[MAX_LIVE];
static int nlive = 0;

static void *dev_upload(const void *host, size_t bytes) {
    LAB_CHECK(nlive < MAX_LIVE, "gpu_check: more than %d live device buffers", MAX_LIVE);
    void *d = lab_cuda_malloc(bytes);
    if (host) lab_cuda_memcpy(d, host, bytes);
    live[nlive++] = d;
    return d;
}
static float *dev_f32(const float *host, size_t n) { return dev_upload(host, n * sizeof(float)); }
static void dev_free_all(void) {
    for (int i = 0; i < nlive; i++) lab_cuda_free(live[i]);
    nlive = 0;
}

// ---- comparison -----------------------------------------------------------------------------

#define EXACT 0.0

static void print_header(const char *title) {
    printf("\n%s\n", title);
    printf("%-30s %-8s %9s %12s %12s %10s  %s\n", "kernel", "output", "elements", "max abs err",
           "rel err", "tolerance", "result");
    printf("%-30s %-8s %9s %12s %12s %10s  %s\n", "------------------------------", "--------",
           "---------", "------------", "------------", "----------", "------");
}

// One table row: compares n floats (cpu on the host, cuda on the host too) and counts failures.
// Equal values (also equal infinities) have error 0; a NaN on one side only fails.
static int report(const char *kernel, const char *output, const float *cpu, const float *cuda,
                  size_t n, double tol) {
    double err = 0.0, scale = 0.0;
    int nan_mismatch = 0;
    for (size_t i = 0; i < n; i++) {
        double a = cpu[i], b = cuda[i];
        if (isnan(a) || isnan(b)) {
            if (!(isnan(a) && isnan(b))) nan_mismatch = 1;
            continue;
        }
        if (a == b) continue;
        double d = fabs(a - b);  // +inf when only one side is infinite
        if (d > err) err = d;
    }
    for (size_t i = 0; i < n; i++)
        if (isfinite(cpu[i]) && fabs(cpu[i]) > scale) scale = fabs(cpu[i]);
    double rel = err == 0.0 ? 0.0 : (scale > 0.0 ? err / scale : INFINITY);
    if (nan_mismatch) err = rel = INFINITY;
    int ok = tol == EXACT ? err == 0.0 : rel <= tol;
    char tol_s[16];
    if (tol == EXACT) snprintf(tol_s, sizeof tol_s, "exact");
    else snprintf(tol_s, sizeof tol_s, "%.0e", tol);
    printf("%-30s %-8s %9zu %12.3e %12.3e %10s  %s\n", kernel, output, n, err, rel, tol_s,
           ok ? "OK" : "FAIL");
    if (!ok) nfail++;
    return ok;
}

// Downloads n floats of a device buffer and compares them with the CPU's.
static int check(const char *kernel, const char *output, const float *cpu, const float *dev,
                 size_t n, double tol) {
    float *got = lab_xmalloc(n * sizeof(float));
    lab_cuda_memcpy(got, dev, n * sizeof(float));
    int ok = report(kernel, output, cpu, got, n, tol);
    free(got);
    return ok;
}

// ---- the kernels, one check each ------------------------------------------------------------
//
// Shapes are deliberately awkward: T and V not multiples of 32 (a warp), head size 18, and
// more rows than one block, so partial warps, masks and grid-stride tails are all exercised.
// Backward kernels start from random gradients, which checks that they OVERWRITE the input
// gradients (dinp, ...) and ACCUMULATE (+=) into the parameter gradients (dw, db, ...).

enum { B = 3, T = 37, C = 72, NH = 4, V = 300, N = B * T };

// Tolerances (relative to the tensor's max, see the top of the file). fp32 has ~6e-8 relative
// precision; sums of up to a few hundred terms in a different order (warp shuffles, cuBLAS
// tiles vs CBLAS) stay well below 1e-5. Matmul-based outputs get 1e-4: cuBLAS is set to plain
// fp32; TF32 tensor cores (10-bit mantissa) would show up here as errors around 1e-3.
#define TOL_ELEMENTWISE 1e-6  // one formula per element (fused multiply-add or expf vs exp_approx)
#define TOL_REDUCTION 1e-5    // row or column sums in another order
#define TOL_MATMUL 1e-4       // cuBLAS vs CBLAS
#define TOL_TF32 5e-3         // cuBLAS in TF32 (inputs rounded to 10 mantissa bits) vs CBLAS fp32
static double tol_matmul = TOL_MATMUL;  // check_matmul's bound: TOL_TF32 for the TF32 table

static void check_encoder(void) {
    float *wte = host_rand((size_t)V * C, -1, 1), *wpe = host_rand((size_t)T * C, -1, 1);
    int *inp = host_tokens(N, V);
    for (int i = 0; i < N; i += 3) inp[i] = 7;  // a token at many positions: dwte sums them
    float *out = lab_xcalloc((size_t)N * C, sizeof(float));
    kc->encoder_forward(out, inp, wte, wpe, B, T, C);
    float *d_out = dev_f32(NULL, (size_t)N * C);
    int *d_inp = dev_upload(inp, N * sizeof(int));
    kg->encoder_forward(d_out, d_inp, dev_f32(wte, (size_t)V * C), dev_f32(wpe, (size_t)T * C), B,
                        T, C);
    check("encoder_forward", "out", out, d_out, (size_t)N * C, EXACT);

    float *dout = host_rand((size_t)N * C, -1, 1);
    float *dwte = host_rand((size_t)V * C, -1, 1), *dwpe = host_rand((size_t)T * C, -1, 1);
    float *d_dwte = dev_f32(dwte, (size_t)V * C), *d_dwpe = dev_f32(dwpe, (size_t)T * C);
    kc->encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    kg->encoder_backward(d_dwte, d_dwpe, dev_f32(dout, (size_t)N * C), d_inp, B, T, C);
    // The CUDA kernel adds each row's terms in the CPU's order (position by position).
    check("encoder_backward", "dwte", dwte, d_dwte, (size_t)V * C, EXACT);
    check("encoder_backward", "dwpe", dwpe, d_dwpe, (size_t)T * C, EXACT);
    free(wte), free(wpe), free(inp), free(out), free(dout), free(dwte), free(dwpe);
    dev_free_all();
}

static void check_layernorm(void) {
    // inputs with an offset and a spread, as residual-stream activations have
    float *inp = host_rand((size_t)N * C, -3, 5), *w = host_rand(C, 0.5f, 1.5f);
    float *b = host_rand(C, -0.5f, 0.5f);
    float *out = lab_xcalloc((size_t)N * C, sizeof(float)), *mean = lab_xcalloc(N, sizeof(float));
    float *rstd = lab_xcalloc(N, sizeof(float));
    kc->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    float *d_inp = dev_f32(inp, (size_t)N * C), *d_w = dev_f32(w, C), *d_b = dev_f32(b, C);
    float *d_out = dev_f32(NULL, (size_t)N * C), *d_mean = dev_f32(NULL, N), *d_rstd = dev_f32(NULL, N);
    kg->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    check("layernorm_forward", "out", out, d_out, (size_t)N * C, TOL_REDUCTION);
    check("layernorm_forward", "mean", mean, d_mean, N, TOL_REDUCTION);
    check("layernorm_forward", "rstd", rstd, d_rstd, N, TOL_REDUCTION);

    // backward from the CPU's mean and rstd on both sides
    float *dout = host_rand((size_t)N * C, -1, 1);
    float *dinp = host_rand((size_t)N * C, -1, 1), *dw = host_rand(C, -1, 1), *db = host_rand(C, -1, 1);
    float *d_dinp = dev_f32(dinp, (size_t)N * C), *d_dw = dev_f32(dw, C), *d_db = dev_f32(db, C);
    float *dskip = host_rand((size_t)N * C, -1, 1);  // the gradient through the skip connection
    kc->layernorm_backward(dinp, dw, db, dout, dskip, inp, w, mean, rstd, N, C);
    kg->layernorm_backward(d_dinp, d_dw, d_db, dev_f32(dout, (size_t)N * C),
                           dev_f32(dskip, (size_t)N * C), d_inp, d_w, dev_f32(mean, N),
                           dev_f32(rstd, N), N, C);
    check("layernorm_backward", "dinp", dinp, d_dinp, (size_t)N * C, TOL_REDUCTION);
    check("layernorm_backward", "dw", dw, d_dw, C, TOL_REDUCTION);
    check("layernorm_backward", "db", db, d_db, C, TOL_REDUCTION);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp);
    free(dw), free(db), free(dskip);
    dev_free_all();
}

static void check_matmul(void) {
    const int OC = 3 * C + 5;  // not a multiple of 32 either
    float *inp = host_rand((size_t)N * C, -1, 1), *w = host_rand((size_t)OC * C, -1, 1);
    float *bias = host_rand(OC, -1, 1);
    float *d_inp = dev_f32(inp, (size_t)N * C), *d_w = dev_f32(w, (size_t)OC * C);
    float *d_bias = dev_f32(bias, OC);
    float *out = lab_xcalloc((size_t)N * OC, sizeof(float));
    float *d_out = dev_f32(NULL, (size_t)N * OC);
    kc->matmul_forward(out, inp, w, bias, N, C, OC);
    kg->matmul_forward(d_out, d_inp, d_w, d_bias, N, C, OC);
    check("matmul_forward", "out", out, d_out, (size_t)N * OC, tol_matmul);
    kc->matmul_forward(out, inp, w, NULL, N, C, OC);
    kg->matmul_forward(d_out, d_inp, d_w, NULL, N, C, OC);
    check("matmul_forward (no bias)", "out", out, d_out, (size_t)N * OC, tol_matmul);

    float *dout = host_rand((size_t)N * OC, -1, 1), *d_dout = dev_f32(dout, (size_t)N * OC);
    float *dinp = host_rand((size_t)N * C, -1, 1), *dw = host_rand((size_t)OC * C, -1, 1);
    float *dbias = host_rand(OC, -1, 1);
    float *d_dinp = dev_f32(dinp, (size_t)N * C), *d_dw = dev_f32(dw, (size_t)OC * C);
    float *d_dbias = dev_f32(dbias, OC);
    kc->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
    kg->matmul_backward(d_dinp, d_dw, d_dbias, d_dout, d_inp, d_w, N, C, OC);
    check("matmul_backward", "dinp", dinp, d_dinp, (size_t)N * C, tol_matmul);
    check("matmul_backward", "dw", dw, d_dw, (size_t)OC * C, tol_matmul);
    check("matmul_backward", "dbias", dbias, d_dbias, OC, TOL_REDUCTION);
    // NULL outputs are skipped (the first layer needs no dinp): dw and dbias only
    kc->matmul_backward(NULL, dw, dbias, dout, inp, w, N, C, OC);
    kg->matmul_backward(NULL, d_dw, d_dbias, d_dout, d_inp, d_w, N, C, OC);
    check("matmul_backward (dinp NULL)", "dw", dw, d_dw, (size_t)OC * C, tol_matmul);
    check("matmul_backward (dinp NULL)", "dbias", dbias, d_dbias, OC, TOL_REDUCTION);
    free(inp), free(w), free(bias), free(out), free(dout), free(dinp), free(dw), free(dbias);
    dev_free_all();
}

// The table of bf16 models (kernels_get_tf32): the same matmuls on tensor cores, inputs in TF32.
static void check_matmul_tf32(void) {
    const Kernels *fp32 = kg;
    kg = kernels_get_tf32(DEV_CUDA);
    tol_matmul = TOL_TF32;
    print_header("matmuls of bf16 models: TF32 tensor cores (kernels_get_tf32) vs CPU fp32");
    check_matmul();
    kg = fp32;
    tol_matmul = TOL_MATMUL;
}

static void check_attention(void) {
    size_t natt = (size_t)B * NH * T * T;
    float *qkv = host_rand((size_t)N * 3 * C, -2, 2);
    float *out = lab_xcalloc((size_t)N * C, sizeof(float));
    float *preatt = lab_xcalloc(natt, sizeof(float)), *att = lab_xcalloc(natt, sizeof(float));
    kc->attention_forward(out, preatt, att, qkv, B, T, C, NH);
    float *d_qkv = dev_f32(qkv, (size_t)N * 3 * C), *d_out = dev_f32(NULL, (size_t)N * C);
    float *d_preatt = dev_f32(NULL, natt), *d_att = dev_f32(NULL, natt);
    kg->attention_forward(d_out, d_preatt, d_att, d_qkv, B, T, C, NH);
    check("attention_forward", "preatt", preatt, d_preatt, natt, TOL_MATMUL);
    check("attention_forward", "att", att, d_att, natt, TOL_MATMUL);
    check("attention_forward", "out", out, d_out, (size_t)N * C, TOL_MATMUL);

    // backward from the CPU's att on both sides; dpreatt and datt are scratch (not compared)
    float *dout = host_rand((size_t)N * C, -1, 1);
    float *dqkv = host_rand((size_t)N * 3 * C, -1, 1);
    float *d_dqkv = dev_f32(dqkv, (size_t)N * 3 * C);
    float *dpreatt = lab_xcalloc(natt, sizeof(float)), *datt = lab_xcalloc(natt, sizeof(float));
    kc->attention_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, C, NH);
    kg->attention_backward(d_dqkv, dev_f32(NULL, natt), dev_f32(NULL, natt),
                           dev_f32(dout, (size_t)N * C), d_qkv, dev_f32(att, natt), B, T, C, NH);
    check("attention_backward", "dqkv", dqkv, d_dqkv, (size_t)N * 3 * C, TOL_MATMUL);
    free(qkv), free(out), free(preatt), free(att), free(dout), free(dqkv), free(dpreatt), free(datt);
    dev_free_all();
}

static void check_elementwise(void) {
    const size_t n = 100003;  // more than one block, not a multiple of anything
    float *x = host_rand(n, -6, 6), *y = host_rand(n, -1, 1), *dout = host_rand(n, -1, 1);
    float *d_x = dev_f32(x, n), *d_y = dev_f32(y, n), *d_dout = dev_f32(dout, n);

    float *out = lab_xcalloc(n, sizeof(float)), *d_out = dev_f32(NULL, n);
    kc->gelu_forward(out, x, n);
    kg->gelu_forward(d_out, d_x, n);
    check("gelu_forward", "out", out, d_out, n, TOL_ELEMENTWISE);
    float *dinp = host_rand(n, -1, 1), *d_dinp = dev_f32(dinp, n);
    kc->gelu_backward(dinp, x, dout, n);
    kg->gelu_backward(d_dinp, d_x, d_dout, n);
    check("gelu_backward", "dinp", dinp, d_dinp, n, TOL_REDUCTION);

    kc->residual_forward(out, x, y, n);
    kg->residual_forward(d_out, d_x, d_y, n);
    check("residual_forward", "out", out, d_out, n, EXACT);
    float *da = host_copy(x, n), *db = host_copy(y, n);
    kc->residual_backward(da, db, dout, n);
    kg->residual_backward(d_x, d_y, d_dout, n);  // x, y reused as the gradients
    check("residual_backward", "da", da, d_x, n, EXACT);
    check("residual_backward", "db", db, d_y, n, EXACT);

    kc->scale(da, 0.37f, n);
    kg->scale(d_x, 0.37f, n);
    check("scale", "x", da, d_x, n, EXACT);

    // Σ g² in double: compare to 1e-12 relative (products are exact in double; only the
    // order of the additions differs).
    double s_cpu = kc->sum_squares(dout, n), s_gpu = kg->sum_squares(d_dout, n);
    double rel = fabs(s_gpu - s_cpu) / fabs(s_cpu);
    int ok = rel <= 1e-12;
    printf("%-30s %-8s %9zu %12.3e %12.3e %10s  %s\n", "sum_squares", "sum", n, fabs(s_gpu - s_cpu),
           rel, "1e-12", ok ? "OK" : "FAIL");
    if (!ok) nfail++;
    free(x), free(y), free(dout), free(out), free(dinp), free(da), free(db);
    dev_free_all();
}

static void check_softmax_crossentropy(void) {
    float *logits = host_rand((size_t)N * V, -10, 10);  // a wide range: the max must be removed
    int *targets = host_tokens(N, V);
    float *probs = lab_xcalloc((size_t)N * V, sizeof(float)), *d_probs = dev_f32(NULL, (size_t)N * V);
    kc->softmax_forward(probs, logits, N, V);
    kg->softmax_forward(d_probs, dev_f32(logits, (size_t)N * V), N, V);
    check("softmax_forward", "probs", probs, d_probs, (size_t)N * V, TOL_REDUCTION);

    // cross-entropy from the CPU's probs on both sides
    float *d_cprobs = dev_f32(probs, (size_t)N * V);
    int *d_targets = dev_upload(targets, N * sizeof(int));
    float *losses = lab_xcalloc(N, sizeof(float)), *d_losses = dev_f32(NULL, N);
    kc->crossentropy_forward(losses, probs, targets, N, V);
    kg->crossentropy_forward(d_losses, d_cprobs, d_targets, N, V);
    check("crossentropy_forward", "losses", losses, d_losses, N, TOL_ELEMENTWISE);

    float *dlogits = host_rand((size_t)N * V, -1, 1), *d_dlogits = dev_f32(dlogits, (size_t)N * V);
    kc->crossentropy_softmax_backward(dlogits, probs, targets, 1.0f / N, N, V);
    kg->crossentropy_softmax_backward(d_dlogits, d_cprobs, d_targets, 1.0f / N, N, V);
    check("crossentropy_softmax_backward", "dlogits", dlogits, d_dlogits, (size_t)N * V,
          TOL_ELEMENTWISE);
    free(logits), free(targets), free(probs), free(losses), free(dlogits);
    dev_free_all();
}

static void check_adamw(void) {
    const size_t n = 70001;
    float *param = host_rand(n, -1, 1), *grad = host_rand(n, -0.1f, 0.1f);
    float *m = host_rand(n, -0.01f, 0.01f), *v = host_rand(n, 0, 1e-3f);
    float *d_param = dev_f32(param, n), *d_m = dev_f32(m, n), *d_v = dev_f32(v, n);
    // step t = 3 of AdamW(lr 1e-3, betas 0.9/0.95, eps 1e-8, wd 0.1), gradients clipped by 0.5
    float b1 = 0.9f, b2 = 0.95f, bc1 = 1.0f - powf(b1, 3), bc2 = 1.0f - powf(b2, 3);
    kc->adamw_update(param, grad, m, v, n, 1e-3f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.5f);
    kg->adamw_update(d_param, dev_f32(grad, n), d_m, d_v, n, 1e-3f, b1, b2, 1e-8f, 0.1f, bc1, bc2,
                     0.5f);
    check("adamw_update", "param", param, d_param, n, TOL_ELEMENTWISE);
    check("adamw_update", "m", m, d_m, n, TOL_ELEMENTWISE);
    check("adamw_update", "v", v, d_v, n, TOL_ELEMENTWISE);
    free(param), free(grad), free(m), free(v);
    dev_free_all();
}

// bf16 conversions must agree bit for bit, including ties, subnormals, Inf, NaN and the
// largest floats (which round up to Inf).
static void check_bf16(void) {
    const size_t n = 4096;
    float *x = host_rand(n, -100, 100);
    uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                          0xffc00001u, 0x7f800001u, 0x7f7fffffu, 0x3f808000u, 0x3f818000u,
                          0x3f80ffffu, 0x00000001u, 0x807fffffu, 0x3f7fffffu, 0x00008000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) memcpy(&x[i], &special[i], 4);
    for (size_t i = 100; i < 200; i++) {  // exact ties: the low 16 bits are 0x8000
        uint32_t u = rng_u32();
        u = (u & 0xffff0000u) | 0x8000u;
        memcpy(&x[i], &u, 4);
    }
    uint16_t *h_cpu = lab_xmalloc(n * sizeof(uint16_t)), *h_gpu = lab_xmalloc(n * sizeof(uint16_t));
    uint16_t *d_h = dev_upload(NULL, n * sizeof(uint16_t));
    kc->f32_to_bf16(h_cpu, x, n);
    kg->f32_to_bf16(d_h, dev_f32(x, n), n);
    lab_cuda_memcpy(h_gpu, d_h, n * sizeof(uint16_t));
    size_t ndiff = 0;
    for (size_t i = 0; i < n; i++) ndiff += h_cpu[i] != h_gpu[i];
    printf("%-30s %-8s %9zu %12zu %12s %10s  %s\n", "f32_to_bf16", "bits", n, ndiff, "(bits)",
           "exact", ndiff == 0 ? "OK" : "FAIL");
    if (ndiff) nfail++;

    float *back = lab_xcalloc(n, sizeof(float)), *d_back = dev_f32(NULL, n);
    kc->bf16_to_f32(back, h_cpu, n);
    kg->bf16_to_f32(d_back, dev_upload(h_cpu, n * sizeof(uint16_t)), n);
    check("bf16_to_f32", "out", back, d_back, n, EXACT);
    free(x), free(h_cpu), free(h_gpu), free(back);
    dev_free_all();
}

// ---- a tiny GPT-2 trained on both devices -------------------------------------------------------

typedef struct Trainer {
    GPT2 model;
    float *m, *v;  // AdamW moments, on the model's device
} Trainer;

static void trainer_build(Trainer *tr, GPT2Config cfg, Device dev, int batch) {
    gpt2_build(&tr->model, cfg, dev);
    gpt2_init_params(&tr->model, 1337);
    gpt2_alloc_grads(&tr->model);
    gpt2_alloc_acts(&tr->model, batch, cfg.T);
    tr->m = mem_alloc(tr->model.num_params * sizeof(float), MEM_OPT_M, dev);
    tr->v = mem_alloc(tr->model.num_params * sizeof(float), MEM_OPT_V, dev);
}

static float trainer_forward_backward(Trainer *tr, const int *inputs, const int *targets) {
    GPT2 *m = &tr->model;
    gpt2_zero_grad(m);
    float loss = gpt2_forward(m, inputs, targets);
    gpt2_backward(m, 1.0f / (float)(m->act.B * m->act.T));
    return loss;
}

static void trainer_update(Trainer *tr, const AdamW *h, int step, const GPT2Param *plist, int np) {
    GPT2 *m = &tr->model;
    double norm_sq = m->k->sum_squares(m->grads, m->num_params);
    float clip = adamw_clip_scale(h, norm_sq, step);
    adamw_step(h, m->k, step, m->params, m->grads, tr->m, tr->v, 0, m->num_params, plist, np, clip);
}

static float *to_host(const float *p, size_t n) {
    float *h = lab_xmalloc(n * sizeof(float));
    mem_copy(h, p, n * sizeof(float));
    return h;
}

// Losses of 10 AdamW steps must agree to 1e-4 relative: fp32 differences in the order of
// sums (1e-6 relative) grow a little through training but stay far below that. The final
// weights may differ by at most lr (1e-3) per element: Adam divides by sqrt(v), so an
// element whose gradient is almost exactly 0 can take a different step on each device.
static void check_training(void) {
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
    const int batch = 4, steps = 10;
    Trainer cpu, gpu;
    trainer_build(&cpu, cfg, DEV_CPU, batch);
    trainer_build(&gpu, cfg, DEV_CUDA, batch);
    int np = gpt2_params(&cfg, NULL);
    GPT2Param *plist = lab_xmalloc((size_t)np * sizeof(GPT2Param));
    gpt2_params(&cfg, plist);
    AdamW h = adamw_defaults();
    h.total_steps = steps;

    // Data: a repeating pattern the model can learn (the loss must go down), with inputs and
    // targets shifted by one as in language modeling.
    size_t ntok = (size_t)batch * cfg.T;
    int *inputs = lab_xmalloc(ntok * sizeof(int)), *targets = lab_xmalloc(ntok * sizeof(int));
    const char *text = "the quick brown fox jumps over the lazy dog. ";
    size_t len = strlen(text);

    // Gradients of the first step, tensor by tensor.
    print_header("training a tiny GPT-2 (V=256 T=32 L=2 C=64 NH=4, batch 4): step-0 gradients");
    float loss_c[16], loss_g[16];
    for (int step = 0; step < steps; step++) {
        for (size_t i = 0; i < ntok; i++) {
            size_t pos = (size_t)step * 7 + (i / cfg.T) * 11 + i % cfg.T;
            inputs[i] = (unsigned char)text[pos % len];
            targets[i] = (unsigned char)text[(pos + 1) % len];
        }
        loss_c[step] = trainer_forward_backward(&cpu, inputs, targets);
        loss_g[step] = trainer_forward_backward(&gpu, inputs, targets);
        if (step == 0) {
            // per tensor kind, stacked over the layers: llm.c's order (train_grads_to_host)
            size_t n = cpu.model.num_params, sizes[GPT2_NUM_TENSORS];
            float *gc = malloc(n * sizeof(float)), *gg = malloc(n * sizeof(float));
            train_grads_to_host(&cpu.model, gc);
            train_grads_to_host(&gpu.model, gg);
            gpt2_param_sizes(&cfg, sizes);
            size_t off = 0;
            for (int t = 0; t < GPT2_NUM_TENSORS; t++) {
                char name[40];
                snprintf(name, sizeof name, "grad %s", gpt2_tensor_name(t));
                report(name, "grad", gc + off, gg + off, sizes[t], TOL_MATMUL);
                off += sizes[t];
            }
            free(gc);
            free(gg);
        }
        trainer_update(&cpu, &h, step, plist, np);
        trainer_update(&gpu, &h, step, plist, np);
    }

    printf("\n%6s %12s %12s %12s %10s  %s\n", "step", "loss cpu", "loss cuda", "rel diff",
           "tolerance", "result");
    for (int step = 0; step < steps; step++) {
        double rel = fabs((double)loss_g[step] - loss_c[step]) / fabs((double)loss_c[step]);
        int ok = rel <= 1e-4;  // NaN fails too
        printf("%6d %12.6f %12.6f %12.3e %10s  %s\n", step, loss_c[step], loss_g[step], rel, "1e-4",
               ok ? "OK" : "FAIL");
        if (!ok) nfail++;
    }
    if (!(loss_c[steps - 1] < loss_c[0])) {
        printf("the CPU loss did not go down (%.4f -> %.4f): the comparison proves little\n",
               loss_c[0], loss_c[steps - 1]);
        nfail++;
    }
    float *pg = to_host(gpu.model.params, gpu.model.num_params);
    double maxd = 0.0;
    for (size_t i = 0; i < cpu.model.num_params; i++) {
        double d = fabs((double)pg[i] - cpu.model.params[i]);
        if (!(d <= maxd)) maxd = isnan(d) ? INFINITY : d;
    }
    int ok = maxd <= 1e-3;
    printf("final weights: max |cuda - cpu| = %.3e over %zu parameters (tolerance 1e-3 = lr): %s\n",
           maxd, cpu.model.num_params, ok ? "OK" : "FAIL");
    if (!ok) nfail++;
    free(pg), free(plist), free(inputs), free(targets);
    mem_free(cpu.m), mem_free(cpu.v), mem_free(gpu.m), mem_free(gpu.v);
    gpt2_free(&cpu.model);
    gpt2_free(&gpu.model);
}

// bf16 mixed precision on both devices (common/train.h, as the chapters run it): bf16 weights,
// gradients and saved activations, fp32 master and Adam; CUDA multiplies in TF32. The two
// devices round different sums, and a master weight near a rounding boundary may land on the
// next bf16 value, so the bounds are bf16-sized. Losses 5e-4 relative: through the emulator
// (tests/cuda_emu, TF32 rounding included) the devices agreed within 3e-5, and a CUDA matmul
// that dropped its bias gradient missed by up to 1.5e-3. Weights 1.6e-2 (two bf16 steps at 1.0),
// a bound for gross errors only: the emulator measured 2.2e-3, the dropped bias 6.0e-3.
static void check_training_bf16(void) {
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
    const int B = 4, steps = 10;
    const Device devs[2] = {DEV_CPU, DEV_CUDA};
    GPT2 m[2];
    float *master[2], *opt_m[2], *opt_v[2], loss[2][16];
    int np = gpt2_params(&cfg, NULL);
    GPT2Param *plist = lab_xmalloc((size_t)np * sizeof(GPT2Param));
    gpt2_params(&cfg, plist);
    AdamW h = adamw_defaults();
    h.total_steps = steps;
    size_t ntok = (size_t)B * cfg.T;
    int *inputs = lab_xmalloc(ntok * sizeof(int)), *targets = lab_xmalloc(ntok * sizeof(int));
    for (int d = 0; d < 2; d++) {
        gpt2_build_dtype(&m[d], cfg, devs[d], GPT2_BF16);
        gpt2_alloc_grads(&m[d]);
        gpt2_alloc_acts(&m[d], B, cfg.T);
        master[d] = train_master_alloc(&m[d]);
        train_master_init(&m[d], master[d], 1337);
        opt_m[d] = mem_alloc(m[d].num_params * sizeof(float), MEM_OPT_M, devs[d]);
        opt_v[d] = mem_alloc(m[d].num_params * sizeof(float), MEM_OPT_V, devs[d]);
    }
    for (int step = 0; step < steps; step++) {
        for (size_t i = 0; i < ntok; i++) {  // a learnable pattern: each token predicts the next
            inputs[i] = (int)((i * 7 + (size_t)step) % 61);
            targets[i] = (int)((i * 7 + (size_t)step + 7) % 61);
        }
        for (int d = 0; d < 2; d++) {
            gpt2_zero_grad(&m[d]);
            loss[d][step] = gpt2_forward(&m[d], inputs, targets);
            gpt2_backward(&m[d], 1.0f / (float)ntok);
            train_adamw_step(&h, &m[d], step, master[d], opt_m[d], opt_v[d], plist, np);
        }
    }
    printf("\ntraining the same model in bf16 (%s on CUDA): losses\n", m[1].k->name);
    printf("%6s %12s %12s %12s %10s  %s\n", "step", "loss cpu", "loss cuda", "rel diff",
           "tolerance", "result");
    for (int step = 0; step < steps; step++) {
        double rel = fabs((double)loss[1][step] - loss[0][step]) / fabs((double)loss[0][step]);
        int ok = rel <= 5e-4;  // NaN fails too
        printf("%6d %12.6f %12.6f %12.3e %10s  %s\n", step, loss[0][step], loss[1][step], rel,
               "5e-4", ok ? "OK" : "FAIL");
        if (!ok) nfail++;
    }
    if (!(loss[0][steps - 1] < loss[0][0])) {
        printf("the CPU loss did not go down (%.4f -> %.4f): the comparison proves little\n",
               loss[0][0], loss[0][steps - 1]);
        nfail++;
    }
    size_t n = m[0].num_params;
    float *w[2] = {lab_xmalloc(n * sizeof(float)), lab_xmalloc(n * sizeof(float))};
    double maxd = 0.0;
    for (int d = 0; d < 2; d++) train_params_to_host(&m[d], w[d]);
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)w[1][i] - w[0][i]);
        if (!(diff <= maxd)) maxd = isnan(diff) ? INFINITY : diff;
    }
    int ok = maxd <= 1.6e-2;
    printf("final bf16 weights: max |cuda - cpu| = %.3e over %zu parameters (tolerance 1.6e-2): %s\n",
           maxd, n, ok ? "OK" : "FAIL");
    if (!ok) nfail++;
    for (int d = 0; d < 2; d++) {
        free(w[d]);
        train_master_free(&m[d], master[d]);
        mem_free(opt_m[d]);
        mem_free(opt_v[d]);
        gpt2_free(&m[d]);
    }
    free(plist), free(inputs), free(targets);
}

// ---- the pieces of gpt2.h on CUDA ----------------------------------------------------------------

// A model's weights or gradients (a device buffer of n values of its dtype) as host fp32.
static float *host_f32(const GPT2 *m, const void *dev, size_t n) {
    float *h = lab_xmalloc(n * sizeof(float));
    if (m->dtype == GPT2_FP32) {
        mem_copy(h, dev, n * sizeof(float));
        return h;
    }
    uint16_t *h16 = lab_xmalloc(n * sizeof(uint16_t));
    mem_copy(h16, dev, n * sizeof(uint16_t));
    kernels_cpu.bf16_to_f32(h, h16, n);
    free(h16);
    return h;
}

// On CUDA, against the same model's plain forward and backward ON CUDA: every piece fed a copy
// of its unit in another device buffer (gradients into one too) with the split backward (all
// B, then the embedding, then all W), and two chained stages [0,1) + [1,2). The same kernels run
// on the same operands, so the results must be the same bits; the stages' wte gradients are
// two parts summed in another order (fp32: within 1e-6 of the largest; bf16: 2^-7 relative).
static void check_pieces(GPT2Dtype dt) {
    GPT2Config cfg = {.V = 64, .T = 16, .L = 2, .C = 32, .NH = 4};
    const int B = 3;
    const int BT = B * cfg.T;
    const size_t BTC = (size_t)BT * cfg.C, es = dt == GPT2_BF16 ? 2 : 4;
    int *x = host_tokens((size_t)BT, cfg.V), *y = host_tokens((size_t)BT, cfg.V);
    float d = 1.0f / (float)BT;
    GPT2 ref, m, s0, s1;
    GPT2 *all[4] = {&ref, &m, &s0, &s1};
    gpt2_build_dtype(&ref, cfg, DEV_CUDA, dt);
    gpt2_build_dtype(&m, cfg, DEV_CUDA, dt);
    gpt2_build_stage(&s0, cfg, DEV_CUDA, dt, 0, 1);
    gpt2_build_stage(&s1, cfg, DEV_CUDA, dt, 1, 2);
    for (int i = 0; i < 4; i++) {
        gpt2_init_params(all[i], 5);
        gpt2_alloc_grads(all[i]);
        gpt2_zero_grad(all[i]);
    }
    gpt2_alloc_acts(&ref, B, cfg.T);
    float loss_ref = gpt2_forward(&ref, x, y);
    gpt2_backward(&ref, d);
    size_t n = ref.num_params;
    float *g_ref = host_f32(&ref, train_grads(&ref), n);

    // external units + split backward
    char *w = mem_alloc(n * es, MEM_OTHER, DEV_CUDA), *g = mem_alloc(n * es, MEM_OTHER, DEV_CUDA);
    mem_copy(w, train_params(&m), n * es);
    mem_zero(g, n * es);
    mem_zero(train_params(&m), n * es);  // the model's own weights: zeros, so reading them shows
    GPT2Acts a;
    gpt2_acts_alloc(&a, &m, B, cfg.T);
    gpt2_acts_alloc_split(&a, &m);
    const GPT2Unit *emb = &m.units[0], *head = &m.units[m.nunits - 1];
#define AT(buf, off) ((buf) + (off) * es)
    gpt2_acts_set_batch(&m, &a, x, y);
    gpt2_embed_forward_w(&m, &a, AT(w, emb->offset));
    for (int l = 0; l < cfg.L; l++) gpt2_block_forward_w(&m, &a, l, AT(w, gpt2_block_unit(&m, l)->offset));
    float loss_ext = gpt2_head_forward_w(&m, &a, AT(w, 0), AT(w, head->offset));
    gpt2_head_backward_w(&m, &a, d, AT(w, 0), AT(w, head->offset), AT(g, 0), AT(g, head->offset));
    for (int l = cfg.L - 1; l >= 0; l--)
        gpt2_block_backward_input(&m, &a, l, AT(w, gpt2_block_unit(&m, l)->offset));
    gpt2_embed_backward_w(&m, &a, AT(g, emb->offset));
    for (int l = 0; l < cfg.L; l++) gpt2_block_backward_weights(&m, &a, l, AT(g, gpt2_block_unit(&m, l)->offset));
#undef AT
    float *g_ext = host_f32(&m, g, n);
    printf("\n%s pieces on CUDA: loss in place %.7f, external units %.7f: %s\n", dt == GPT2_BF16 ? "bf16" : "fp32",
           loss_ref, loss_ext, loss_ref == loss_ext ? "OK" : "FAIL");
    if (loss_ref != loss_ext) nfail++;
    report("external + split (B, W)", "grads", g_ref, g_ext, n, EXACT);

    // two chained stages
    GPT2Acts a0, a1;
    gpt2_acts_alloc(&a0, &s0, B, cfg.T);
    gpt2_acts_alloc(&a1, &s1, B, cfg.T);
    gpt2_forward_acts(&s0, &a0, x, NULL);
    gpt2_acts_output(&s0, &a0, gpt2_acts_input(&a1));
    float loss_st = gpt2_forward_acts(&s1, &a1, NULL, y);
    gpt2_backward_acts(&s1, &a1, d);
    mem_copy(gpt2_acts_doutput(&a0), gpt2_acts_dinput(&a1), BTC * sizeof(float));
    gpt2_backward_acts(&s0, &a0, d);
    printf("%s stages [0,1) + [1,2) on CUDA: loss %.7f: %s\n", dt == GPT2_BF16 ? "bf16" : "fp32",
           loss_st, loss_st == loss_ref ? "OK" : "FAIL");
    if (loss_st != loss_ref) nfail++;
    size_t V = (size_t)cfg.V * cfg.C;
    float *wte = lab_xcalloc(V, sizeof(float)), *parts = lab_xcalloc(V, sizeof(float));
    float *g_st = lab_xcalloc(n, sizeof(float));  // the stages' gradients at their global offsets
    const GPT2 *st[2] = {&s0, &s1};
    for (int k = 0; k < 2; k++) {
        float *gs = host_f32(st[k], train_grads((GPT2 *)st[k]), st[k]->num_params);
        for (int i = 0; i < st[k]->nplist; i++) {
            const GPT2Param *p = &st[k]->plist[i];
            for (size_t j = 0; j < p->size; j++) {
                if (p->tensor == GPT2_WTE) {
                    wte[j] += gs[p->offset + j];
                    parts[j] += fabsf(gs[p->offset + j]);
                } else {
                    g_st[p->global_offset + j] = gs[p->offset + j];
                }
            }
        }
        free(gs);
    }
    memcpy(g_st, g_ref, V * sizeof(float));  // wte: checked below with its own bound
    report("stages chained (not wte)", "grads", g_ref, g_st, n, EXACT);
    double gmax = 0, worst = 0;
    int wte_ok = 1;
    for (size_t j = 0; j < V; j++) gmax = fmax(gmax, fabs(g_ref[j]));
    for (size_t j = 0; j < V; j++) {
        double diff = fabs((double)wte[j] - g_ref[j]);
        double tol = dt == GPT2_FP32 ? 1e-6 * gmax : 0x1p-7 * parts[j];
        worst = fmax(worst, diff);
        if (!(diff <= tol)) wte_ok = 0;
    }
    printf("stages chained: wte gradient (two parts summed): max diff %.3e: %s\n", worst,
           wte_ok ? "OK" : "FAIL");
    if (!wte_ok) nfail++;
    gpt2_acts_free(&a), gpt2_acts_free(&a0), gpt2_acts_free(&a1);
    mem_free(w), mem_free(g);
    for (int i = 0; i < 4; i++) gpt2_free(all[i]);
    free(g_ref), free(g_ext), free(g_st), free(wte), free(parts), free(x), free(y);
}

// ---- --compare-dumps: a chapter run on each device -------------------------------------------------

// Tolerances: losses relative, final weights absolute (defaults 1e-4 and 1e-3 = lr: fp32 on two
// devices). The script passes wider ones for bf16 and tighter ones for N ranks vs 1.
static int compare_dumps(const char *path_cpu, const char *path_cuda, double loss_rtol,
                         double param_atol) {
    RunResults a, b;
    char err[256];
    if (results_read(path_cpu, &a, err, sizeof err) != 0) lab_fail("%s: %s", path_cpu, err);
    if (results_read(path_cuda, &b, err, sizeof err) != 0) lab_fail("%s: %s", path_cuda, err);
    if (a.nsteps != b.nsteps || a.nparams != b.nparams)
        lab_fail("%s has %d steps and %zu parameters but %s has %d and %zu: not the same run",
                 path_cpu, a.nsteps, a.nparams, path_cuda, b.nsteps, b.nparams);
    printf("%6s %12s %12s %12s %10s  %s\n", "step", "loss cpu", "loss cuda", "rel diff",
           "tolerance", "result");
    int bad = 0;
    for (int s = 0; s < a.nsteps; s++) {
        double rel = fabs((double)b.losses[s] - a.losses[s]) / fabs((double)a.losses[s]);
        int ok = rel <= loss_rtol;
        printf("%6d %12.6f %12.6f %12.3e %10.0e  %s\n", s, a.losses[s], b.losses[s], rel, loss_rtol,
               ok ? "OK" : "FAIL");
        bad += !ok;
    }
    double maxd = 0.0;
    for (size_t i = 0; i < a.nparams; i++) {
        double d = fabs((double)a.params[i] - b.params[i]);
        if (!(d <= maxd)) maxd = isnan(d) ? INFINITY : d;
    }
    if (a.nparams) {
        int ok = maxd <= param_atol;
        printf("final weights: max |cuda - cpu| = %.3e over %zu parameters (tolerance %.0e): %s\n",
               maxd, a.nparams, param_atol, ok ? "OK" : "FAIL");
        bad += !ok;
    }
    printf("%s\n", bad ? "FAIL: the two runs differ beyond the tolerances"
                       : "OK: the same training within the tolerances");
    results_free(&a);
    results_free(&b);
    return bad ? 1 : 0;
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    int kernels_only = 0;
    if ((argc == 4 || argc == 6) && strcmp(argv[1], "--compare-dumps") == 0) {
        double loss_rtol = argc == 6 ? atof(argv[4]) : 1e-4, param_atol = argc == 6 ? atof(argv[5]) : 1e-3;
        if (!(loss_rtol > 0) || !(param_atol > 0))
            lab_fail("gpu_check --compare-dumps A B LOSS_RTOL PARAM_ATOL: tolerances must be "
                     "positive numbers (got %s %s)", argv[4], argv[5]);
        return compare_dumps(argv[2], argv[3], loss_rtol, param_atol);
    }
    if (argc == 2 && strcmp(argv[1], "--kernels-only") == 0) kernels_only = 1;
    else if (argc != 1)
        lab_fail("gpu_check: unknown arguments (valid: no argument, --kernels-only, or "
                 "--compare-dumps DUMP_A DUMP_B [LOSS_RTOL PARAM_ATOL])");

    int ngpu = lab_cuda_device_count();
    if (ngpu == 0)
        lab_fail("gpu_check: no CUDA GPU is visible (nvidia-smi lists the GPUs; "
                 "CUDA_VISIBLE_DEVICES may hide them)");
    lab_cuda_set_device(0);
    printf("gpu_check: CUDA kernels vs CPU kernels on %s (%d GPU(s) visible)\n",
           lab_cuda_device_name(), ngpu);
    printf("rel err = max |cuda - cpu| / max |cpu| over the tensor\n");
    kc = kernels_get(DEV_CPU);
    kg = kernels_get(DEV_CUDA);

    print_header("kernels");
    check_encoder();
    check_layernorm();
    check_matmul();
    check_matmul_tf32();
    print_header("kernels (continued)");
    check_attention();
    check_elementwise();
    check_softmax_crossentropy();
    check_adamw();
    check_bf16();
    if (!kernels_only) {
        check_training();
        check_training_bf16();
        print_header("gpt2.h pieces on CUDA: external units, split backward, stages");
        check_pieces(GPT2_FP32);
        check_pieces(GPT2_BF16);
    }

    lab_cuda_synchronize();
    if (nfail) printf("\nFAIL: %d check(s) failed\n", nfail);
    else printf("\nOK: every check passed\n");
    return nfail ? 1 : 0;
}

#endif  // LAB_CUDA
