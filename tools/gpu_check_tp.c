// gpu_check_tp.c: are the CUDA kernels of tensor parallelism (kernels.h's "tensor parallelism"
// section, used by common/tp.c) right? Each one runs on the CPU and on the GPU with the same
// random inputs and the outputs are compared, as tools/gpu_check does for the other kernels;
// then tp.h's halves and a whole TP block (slice 1 of 2 of a one-block model, built by tp_build
// on each device; one rank: every all-reduce the identity, tp_comm_single) run on both devices,
// forward and backward, and the sequence-parallel block (tp = 1 with SP: its reduce-scatters
// and all-gathers are copies); then a whole slice (tp_forward, tp_backward) and a pipeline stage
// of one, in fp32 and in bf16 (on CUDA a bf16 model's matmuls run in TF32), with and without
// SP: the slice's loss and each of its gradient tensors, the stage's loss and input gradient.
// (A one-rank slice without SP is gpt2's own model: tools/gpu_check checks that.)
//
//   make BUILD=build-cuda CUDA=1 build-cuda/tools/gpu_check_tp && ./build-cuda/tools/gpu_check_tp
//   EMU_TOOL=gpu_check_tp bash tests/cuda_emu/run.sh      (on a CPU: the CUDA code emulated)
//
// Comparison: rel = max |cuda - cpu| / max |cpu| over the tensor, within a tolerance per kind:
// 1e-6 for one formula per element (the GPU's expf against the CPU's exp_approx included),
// 1e-5 for sums in another order, 1e-4 for what goes through matmuls (cuBLAS vs CBLAS); a bf16
// model: 2e-3 on the loss (gpu_check.sh's bf16 bound) and 1e-2 on the bf16 gradients (TF32
// matmuls, and a value next to a rounding boundary lands one bf16 step away: up to 2^-7 =
// 7.8e-3 of the value; measured in the emulator 6.3e-3, one step of a gradient at 0.31). "exact"
// where both devices do the same float operations in the same order. Exit status 0 when every
// check passes; in a build without CUDA it says so and exits 0.
#include <stdio.h>

#ifndef LAB_CUDA
int main(void) {
    printf("gpu_check_tp: built without CUDA (rebuild with `make CUDA=1`); nothing to check\n");
    return 0;
}
#else

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_util.h"
#include "kernels.h"
#include "mem.h"
#include "tp.h"

#define EXACT 0.0
#define TOL_ELEMENTWISE 1e-6
#define TOL_REDUCTION 1e-5
#define TOL_MATMUL 1e-4
#define TOL_BF16_LOSS 2e-3
#define TOL_BF16_GRADS 1e-2

static const Kernels *kc, *kg;
static int nfail = 0;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float *host_rand(size_t n, float lo, float hi) {
    float *x = lab_xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)(rng_u32() >> 8) / 16777216.0f;
    return x;
}
static int *host_tokens(size_t n, int V) {
    int *x = lab_xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) x[i] = (int)(rng_u32() % (uint32_t)V);
    return x;
}

// Device copies, freed together at the end of each check.
#define MAX_LIVE 64
static void *live[MAX_LIVE];
static int nlive = 0;
static void *dev_upload(const void *host, size_t bytes) {
    LAB_CHECK(nlive < MAX_LIVE, "gpu_check_tp: more than %d live device buffers", MAX_LIVE);
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

// Compares n floats the GPU computed (got, copied to the host) with the CPU's; one table row.
static void check_host(const char *what, const char *output, const float *cpu, const float *got, size_t n,
                       double tol) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = cpu[i], b = got[i];
        if (a == b) continue;                        // equal infinities too
        double d = isnan(a) || isnan(b) ? INFINITY : fabs(a - b);
        if (d > err) err = d;
    }
    for (size_t i = 0; i < n; i++)
        if (isfinite(cpu[i]) && fabs(cpu[i]) > scale) scale = fabs(cpu[i]);
    double rel = err == 0.0 ? 0.0 : scale > 0.0 ? err / scale : INFINITY;
    int ok = tol == EXACT ? err == 0.0 : rel <= tol;
    char tol_s[16];
    if (tol == EXACT) snprintf(tol_s, sizeof tol_s, "exact");
    else snprintf(tol_s, sizeof tol_s, "%.0e", tol);
    printf("%-32s %-10s %9zu %12.3e %12.3e %10s  %s\n", what, output, n, err, rel, tol_s, ok ? "OK" : "FAIL");
    if (!ok) nfail++;
}
// The same for a device buffer.
static void check(const char *what, const char *output, const float *cpu, const float *dev, size_t n, double tol) {
    float *got = lab_xmalloc((n ? n : 1) * sizeof(float));
    lab_cuda_memcpy(got, dev, n * sizeof(float));
    check_host(what, output, cpu, got, n, tol);
    free(got);
}

// ---- the kernels ----------------------------------------------------------------------------------
// Awkward shapes, as gpu_check's: T, Vl not multiples of a warp, more rows than one block; this
// rank's vocabulary rows [v0, v0 + Vl) = [134, 201) of which 61 are real (the last 6: padding).
enum { B = 3, T = 37, C = 72, N = B * T, V = 300, VL = 67, V0 = 134, NVALID = 61 };

static void check_kernels(void) {
    // bias + residual after the reduce
    float *r = host_rand((size_t)N * C, -1, 1), *x = host_rand((size_t)N * C, -1, 1), *b = host_rand(C, -1, 1);
    float *out = lab_xcalloc((size_t)N * C, sizeof(float)), *d_out = dev_f32(NULL, (size_t)N * C);
    kc->tp_bias_residual_forward(out, r, x, b, N, C);
    kg->tp_bias_residual_forward(d_out, dev_f32(r, (size_t)N * C), dev_f32(x, (size_t)N * C), dev_f32(b, C), N, C);
    check("tp_bias_residual_forward", "out", out, d_out, (size_t)N * C, EXACT);  // (r + x) + b on both

    // masked embedding, with and without wpe
    float *wte = host_rand((size_t)VL * C, -1, 1), *wpe = host_rand((size_t)T * C, -1, 1);
    int *inp = host_tokens(N, V), *d_inp = dev_upload(inp, N * sizeof(int));
    float *d_wte = dev_f32(wte, (size_t)VL * C), *d_wpe = dev_f32(wpe, (size_t)T * C);
    kc->vocab_embed_forward(out, inp, wte, wpe, V0, VL, B, T, C);
    kg->vocab_embed_forward(d_out, d_inp, d_wte, d_wpe, V0, VL, B, T, C);
    check("vocab_embed_forward", "out", out, d_out, (size_t)N * C, EXACT);
    kc->vocab_embed_forward(out, inp, wte, NULL, V0, VL, B, T, C);
    kg->vocab_embed_forward(d_out, d_inp, d_wte, NULL, V0, VL, B, T, C);
    check("vocab_embed_forward (no wpe)", "out", out, d_out, (size_t)N * C, EXACT);

    // its backward: the parameter gradients start random (checks +=)
    float *dout = host_rand((size_t)N * C, -1, 1);
    float *dwte = host_rand((size_t)VL * C, -1, 1), *dwpe = host_rand((size_t)T * C, -1, 1);
    float *d_dwte = dev_f32(dwte, (size_t)VL * C), *d_dwpe = dev_f32(dwpe, (size_t)T * C);
    float *d_dout = dev_f32(dout, (size_t)N * C);
    kc->vocab_embed_backward(dwte, dwpe, dout, inp, V0, VL, B, T, C);
    kg->vocab_embed_backward(d_dwte, d_dwpe, d_dout, d_inp, V0, VL, B, T, C);
    check("vocab_embed_backward", "dwte", dwte, d_dwte, (size_t)VL * C, TOL_REDUCTION);
    check("vocab_embed_backward", "dwpe", dwpe, d_dwpe, (size_t)T * C, TOL_REDUCTION);
    kc->vocab_embed_backward(dwte, NULL, dout, inp, V0, VL, B, T, C);
    kg->vocab_embed_backward(d_dwte, NULL, d_dout, d_inp, V0, VL, B, T, C);
    check("vocab_embed_backward (no wpe)", "dwte", dwte, d_dwte, (size_t)VL * C, TOL_REDUCTION);

    // the cross-entropy pieces. Logits of a wide range; the padded columns hold a huge value
    // that would win the max and swamp the sum if either kernel looked at them.
    float *logits = host_rand((size_t)N * VL, -10, 10);
    for (int n = 0; n < N; n++)
        for (int v = NVALID; v < VL; v++) logits[(size_t)n * VL + v] = 1e4f;
    int *tgt = host_tokens(N, V), *d_tgt = dev_upload(tgt, N * sizeof(int));
    float *d_logits = dev_f32(logits, (size_t)N * VL);
    float *mx = lab_xcalloc(N, sizeof(float)), *d_mx = dev_f32(NULL, N);
    kc->vocab_ce_max(mx, logits, NVALID, N, VL);
    kg->vocab_ce_max(d_mx, d_logits, NVALID, N, VL);
    check("vocab_ce_max", "maxes", mx, d_mx, N, EXACT);
    float *none = lab_xcalloc(N, sizeof(float));
    kc->vocab_ce_max(none, logits, 0, N, VL);
    kg->vocab_ce_max(d_mx, d_logits, 0, N, VL);
    check("vocab_ce_max (no real rows)", "maxes", none, d_mx, N, EXACT);  // -inf on both
    // as after the MAX all-reduce: a global max at least the local one
    for (int n = 0; n < N; n++) mx[n] += (float)(n % 3);
    d_mx = dev_f32(mx, N);
    float *sums = lab_xcalloc(N, sizeof(float)), *tl = lab_xcalloc(N, sizeof(float));
    float *d_sums = dev_f32(NULL, N), *d_tl = dev_f32(NULL, N);
    kc->vocab_ce_sums(sums, tl, logits, mx, tgt, V0, NVALID, N, VL);
    kg->vocab_ce_sums(d_sums, d_tl, d_logits, d_mx, d_tgt, V0, NVALID, N, VL);
    check("vocab_ce_sums", "sums", sums, d_sums, N, TOL_REDUCTION);
    check("vocab_ce_sums", "tlogits", tl, d_tl, N, EXACT);
    float *losses = lab_xcalloc(N, sizeof(float)), *d_losses = dev_f32(NULL, N);
    d_sums = dev_f32(sums, N);  // the CPU's statistics on both sides from here on
    d_tl = dev_f32(tl, N);
    kc->vocab_ce_loss(losses, sums, mx, tl, N);
    kg->vocab_ce_loss(d_losses, d_sums, d_mx, d_tl, N);
    check("vocab_ce_loss", "losses", losses, d_losses, N, TOL_ELEMENTWISE);
    float *dl = host_rand((size_t)N * VL, -1, 1), *d_dl = dev_f32(dl, (size_t)N * VL);  // overwritten
    kc->vocab_ce_backward(dl, logits, mx, sums, tgt, 1.0f / N, V0, NVALID, N, VL);
    kg->vocab_ce_backward(d_dl, d_logits, d_mx, d_sums, d_tgt, 1.0f / N, V0, NVALID, N, VL);
    check("vocab_ce_backward", "dlogits", dl, d_dl, (size_t)N * VL, TOL_ELEMENTWISE);

    void *h[] = {r, x, b, out, wte, wpe, inp, dout, dwte, dwpe, logits, tgt, mx, none, sums, tl, losses, dl};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
    dev_free_all();
}

// ---- the pieces ---------------------------------------------------------------------------------------

enum { PB = 2, PT = 17, PC = 72, PNH = 4, PN = PB * PT };  // head size 18

// A slice of a one-block model on each device, the same random weights (LayerNorm weights near
// 1), its gradients zero, one set each (tp_build: rank r of tp, sp).
typedef struct { GPT2 m[2]; GPT2Acts a[2]; } Both;
static void both(Both *x, int tp, int r, int sp) {
    const GPT2Config cfg = {.V = 96, .T = PT, .L = 1, .C = PC, .NH = PNH};
    const TpShape sh = {.l0 = 0, .l1 = 1, .tp = tp, .r = r, .sp = sp, .B = PB, .T = PT};
    for (int d = 0; d < 2; d++) tp_build(&x->m[d], cfg, d ? DEV_CUDA : DEV_CPU, GPT2_FP32, sh, 7);
    const size_t n = x->m[0].num_params;
    float *w = host_rand(n, -0.3f, 0.3f);
    const GPT2BlockDims bd = tp_block_dims(PC, PNH, tp);
    GPT2BlockWeights v = gpt2_block_weights(&bd, w + gpt2_block_unit(&x->m[0], 0)->offset);
    for (int c = 0; c < PC; c++) v.ln1w[c] += 1.0f, v.ln2w[c] += 1.0f;
    for (int d = 0; d < 2; d++) {
        mem_copy(x->m[d].params, w, n * sizeof(float));
        tp_acts_alloc(&x->a[d], &x->m[d]);
    }
    free(w);
}
static void both_free(Both *x) {
    for (int d = 0; d < 2; d++) gpt2_acts_free(&x->a[d]), gpt2_free(&x->m[d]);
}

// The halves of rank 1 of tp = 2 (no communication): partial outputs and partial input
// gradients, and the weight gradients of the shard.
static void check_halves(void) {
    const int tp = 2;
    Both x;
    both(&x, tp, 1, 0);
    TpBlockRun h, g;
    tp_block_run(&h, &x.m[0], &x.a[0], 0);
    tp_block_run(&g, &x.m[1], &x.a[1], 0);
    size_t NC = (size_t)PN * PC;
    float *inp = host_rand(NC, -1, 1), *dout = host_rand(NC, -1, 1), *dinp = lab_xcalloc(NC, sizeof(float));
    float *d_inp = dev_f32(inp, NC), *d_dout = dev_f32(dout, NC), *d_dinp = dev_f32(NULL, NC);

    tp_attn_forward(&h, inp);
    tp_attn_forward(&g, d_inp);
    check("tp_attn_forward (tp 2, rank 1)", "qkv", h.x.qkv, g.x.qkv, (size_t)PN * 3 * PC / tp, TOL_MATMUL);
    check("tp_attn_forward (tp 2, rank 1)", "partial", h.x.attproj, g.x.attproj, NC, TOL_MATMUL);
    tp_attn_backward(&h, inp, dout, dinp);
    tp_attn_backward(&g, d_inp, d_dout, d_dinp);
    check("tp_attn_backward (tp 2, rank 1)", "dinp", dinp, d_dinp, NC, TOL_MATMUL);
    check("tp_attn_backward (tp 2, rank 1)", "dqkvw", h.dw.qkvw, g.dw.qkvw, 3 * PC / tp * PC, TOL_MATMUL);
    check("tp_attn_backward (tp 2, rank 1)", "dattprojw", h.dw.attprojw, g.dw.attprojw, PC * PC / tp, TOL_MATMUL);

    tp_mlp_forward(&h, inp);
    tp_mlp_forward(&g, d_inp);
    check("tp_mlp_forward (tp 2, rank 1)", "partial", h.x.fcproj, g.x.fcproj, NC, TOL_MATMUL);
    tp_mlp_backward(&h, inp, dout, dinp);
    tp_mlp_backward(&g, d_inp, d_dout, d_dinp);
    check("tp_mlp_backward (tp 2, rank 1)", "dinp", dinp, d_dinp, NC, TOL_MATMUL);
    check("tp_mlp_backward (tp 2, rank 1)", "dfcw", h.dw.fcw, g.dw.fcw, 4 * PC / tp * PC, TOL_MATMUL);
    check("tp_mlp_backward (tp 2, rank 1)", "dfcprojw", h.dw.fcprojw, g.dw.fcprojw, PC * 4 * PC / tp, TOL_MATMUL);

    both_free(&x);
    free(inp), free(dout), free(dinp);
    dev_free_all();
}

// A whole block on one rank (tp_comm_single): its output, input gradient and every weight
// gradient. sp 0: slice 1 of 2 (its g's and f's the identity: the composition on device
// buffers); sp 1: tp = 1 with SP (its reduce-scatters and all-gathers are copies: kernels in
// place included, tp_bias_residual_forward with out == x).
static void check_block(int sp) {
    Both x;
    both(&x, sp ? 1 : 2, sp ? 0 : 1, sp);
    const size_t rows = (size_t)x.a[0].rows, n = rows * PC;
    float *inp = host_rand(n, -1, 1), *dout = host_rand(n, -1, 1), *out = lab_xcalloc(n, sizeof(float));
    float *d_out = dev_f32(NULL, n);
    TpComm c = tp_comm_single();
    for (int d = 0; d < 2; d++) {
        mem_copy(gpt2_acts_input(&x.a[d]), inp, n * sizeof(float));
        tp_block_forward(&x.m[d], &x.a[d], &c, 0, NULL);
    }
    gpt2_acts_output(&x.m[0], &x.a[0], out);
    gpt2_acts_output(&x.m[1], &x.a[1], d_out);
    const char *fw = sp ? "tp_block_forward (tp 1, SP)" : "tp_block_forward (tp 2, rank 1)";
    const char *bw = sp ? "tp_block_backward (tp 1, SP)" : "tp_block_backward (tp 2, rank 1)";
    check(fw, "out", out, d_out, n, TOL_MATMUL);
    for (int d = 0; d < 2; d++) {
        mem_copy(gpt2_acts_doutput(&x.a[d]), dout, n * sizeof(float));
        tp_block_backward(&x.m[d], &x.a[d], &c, 0, NULL, NULL);
    }
    check(bw, "dinp", gpt2_acts_dinput(&x.a[0]), gpt2_acts_dinput(&x.a[1]), n, TOL_MATMUL);
    check(bw, "dweights", x.m[0].grads, x.m[1].grads, x.m[0].num_params, TOL_MATMUL);
    both_free(&x);
    free(inp), free(dout), free(out);
    dev_free_all();
}

// ---- a whole slice and a stage of one, on both devices -----------------------------------------------
// One rank (tp_comm_single): without SP slice 1 of 2 (the loss of its vocabulary rows: each
// device the same), with SP tp = 1; the same batch; one forward and one backward. The slice's
// gradients (tensor by tensor, widened from bf16), and a stage of blocks [1, L) fed the same
// input: its loss and the gradient of its input.
static void check_model(GPT2Dtype dtype, int sp) {
    const GPT2Config cfg = {.V = 96, .T = 16, .L = 2, .C = 32, .NH = 4};
    const int MB = 2, MN = MB * cfg.T, tp = sp ? 1 : 2, r = sp ? 0 : 1;
    int *in = host_tokens((size_t)MN, cfg.V), *tg = host_tokens((size_t)MN, cfg.V);
    const int bf16 = dtype == GPT2_BF16;
    char what[64];
    snprintf(what, sizeof what, "tp slice %s%s (tp %d)", bf16 ? "bf16" : "fp32", sp ? " SP" : "", tp);
    GPT2 m[2];
    GPT2Acts ma[2];
    float loss[2], *g[2];
    TpComm c = tp_comm_single();
    for (int d = 0; d < 2; d++) {  // every block: chapter 07's slice
        const TpShape sh = {.l0 = 0, .l1 = cfg.L, .tp = tp, .r = r, .sp = sp, .B = MB, .T = cfg.T};
        tp_build(&m[d], cfg, d ? DEV_CUDA : DEV_CPU, dtype, sh, 7);
        tp_acts_alloc(&ma[d], &m[d]);
        gpt2_acts_set_batch(&m[d], &ma[d], in, tg);
        loss[d] = tp_forward(&m[d], &ma[d], &c);
        tp_backward(&m[d], &ma[d], &c, 1.0f / (float)MN);
        if (sp) tp_sp_grads_all_reduce(&m[d], &c);
        g[d] = lab_xmalloc(m[d].num_params * sizeof(float));
        if (bf16) {
            uint16_t *h16 = lab_xmalloc(m[d].num_params * sizeof(uint16_t));
            mem_copy(h16, m[d].grads_bf16, m[d].num_params * sizeof(uint16_t));
            for (size_t i = 0; i < m[d].num_params; i++) g[d][i] = bf16_to_f32(h16[i]);
            free(h16);
        } else {
            mem_copy(g[d], m[d].grads, m[d].num_params * sizeof(float));
        }
    }
    check_host(what, "loss", &loss[0], &loss[1], 1, bf16 ? TOL_BF16_LOSS : TOL_MATMUL);
    for (int i = 0; i < m[0].nplist; i++)  // tensor by tensor: each against its own scale
        check_host(what, m[0].plist[i].name, g[0] + m[0].plist[i].offset, g[1] + m[0].plist[i].offset,
                   m[0].plist[i].size, bf16 ? TOL_BF16_GRADS : TOL_MATMUL);
    for (int d = 0; d < 2; d++) gpt2_acts_free(&ma[d]), gpt2_free(&m[d]), free(g[d]);
    if (sp) {
        free(in), free(tg);
        return;
    }
    // the last stage (blocks [1, L) and the head) from the same random input
    float *x = host_rand((size_t)MN * cfg.C, -1.0f, 1.0f);
    snprintf(what, sizeof what, "tp stage [1,%d) %s (tp %d)", cfg.L, bf16 ? "bf16" : "fp32", tp);
    for (int d = 0; d < 2; d++) {
        const TpShape sh = {.l0 = 1, .l1 = cfg.L, .tp = tp, .r = r, .sp = 0, .B = MB, .T = cfg.T};
        GPT2 st;
        GPT2Acts a;
        tp_build(&st, cfg, d ? DEV_CUDA : DEV_CPU, dtype, sh, 7);
        tp_acts_alloc(&a, &st);
        gpt2_acts_set_batch(&st, &a, NULL, tg);
        mem_copy(gpt2_acts_input(&a), x, (size_t)MN * cfg.C * sizeof(float));
        loss[d] = tp_forward(&st, &a, &c);
        tp_backward(&st, &a, &c, 1.0f / (float)MN);
        g[d] = lab_xmalloc((size_t)MN * cfg.C * sizeof(float));
        mem_copy(g[d], gpt2_acts_dinput(&a), (size_t)MN * cfg.C * sizeof(float));
        gpt2_acts_free(&a);
        gpt2_free(&st);
    }
    check_host(what, "loss", &loss[0], &loss[1], 1, bf16 ? TOL_BF16_LOSS : TOL_MATMUL);
    check_host(what, "dinput", g[0], g[1], (size_t)MN * cfg.C, bf16 ? TOL_BF16_GRADS : TOL_MATMUL);
    for (int d = 0; d < 2; d++) free(g[d]);
    free(x), free(in), free(tg);
}

int main(void) {
    if (lab_cuda_device_count() == 0)
        lab_fail("gpu_check_tp: no CUDA GPU is visible (nvidia-smi lists the GPUs; CUDA_VISIBLE_DEVICES may hide them)");
    lab_cuda_set_device(0);
    printf("gpu_check_tp: tensor-parallel kernels and pieces, CUDA vs CPU on %s\n", lab_cuda_device_name());
    printf("rel err = max |cuda - cpu| / max |cpu| over the tensor\n\n");
    printf("%-32s %-10s %9s %12s %12s %10s  %s\n", "kernel / piece", "output", "elements", "max abs err", "rel err",
           "tolerance", "result");
    kc = kernels_get(DEV_CPU);
    kg = kernels_get(DEV_CUDA);
    check_kernels();
    check_halves();
    check_block(0);
    check_block(1);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int sp = 0; sp < 2; sp++) check_model(bf16 ? GPT2_BF16 : GPT2_FP32, sp);
    lab_cuda_synchronize();
    if (nfail) printf("\nFAIL: %d check(s) failed\n", nfail);
    else printf("\nOK: every check passed\n");
    return nfail ? 1 : 0;
}

#endif  // LAB_CUDA
