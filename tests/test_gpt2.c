// test_gpt2.c: the model as a whole, on the CPU.
//
//   - sizes and layout: parameter counts, the parameter list (block-major, with llm.c offsets), FLOPs;
//   - initialization: statistics, determinism, and any slice == that slice of the full init;
//   - a whole-model gradient check: finite differences of gpt2_forward's loss vs gpt2_backward,
//     on a sample of elements from every parameter;
//   - the loss at init is ln(V); the output layer is tied to wte;
//   - forward and backward in pieces == whole, bit for bit; gradient accumulation over two
//     half batches == one full batch.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"
#include "mem.h"

// A model small enough to finite-difference: 1,920 parameters.
static GPT2Config small_cfg(void) {
    GPT2Config cfg = {.V = 16, .T = 4, .L = 2, .C = 8, .NH = 2};
    return cfg;
}

static uint64_t rng_state = 7;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float frand(void) { return (float)rnd() / 2147483648.0f - 1.0f; }  // [-1, 1)

static void random_tokens(int *x, size_t n, int V) {
    for (size_t i = 0; i < n; i++) x[i] = (int)(rnd() % (uint32_t)V);
}

// Every parameter, LayerNorm weights and biases included, uniform in [-0.5, 0.5): a harder
// regime for a gradient check than the init (no gradient is trivially zero or tiny).
static void randomize_params(GPT2 *m) {
    for (size_t i = 0; i < m->num_params; i++) m->params[i] = 0.5f * frand();
}

// ---- sizes and layout --------------------------------------------------------------------------

Test(gpt2, parameter_counts) {
    GPT2Config tiny = gpt2_config_tiny();
    cr_assert_eq(tiny.V, 256);
    cr_assert_eq(tiny.T, 64);
    cr_assert_eq(tiny.L, 4);
    cr_assert_eq(tiny.C, 128);
    cr_assert_eq(tiny.NH, 4);
    cr_assert_eq(gpt2_param_count(&tiny), 834304);  // docs/ARCHITECTURE.md, "The model"
    // V·C + T·C + L·(12C² + 13C) + 2C, by hand for the small config: 128 + 32 + 2·872 + 16
    GPT2Config s = small_cfg();
    cr_assert_eq(gpt2_param_count(&s), 1920);
    size_t sizes[GPT2_NUM_TENSORS];
    gpt2_param_sizes(&s, sizes);
    size_t want[GPT2_NUM_TENSORS] = {128, 32, 16, 16, 384, 48, 128, 16, 16, 16, 512, 64, 512, 16, 8, 8};
    for (int i = 0; i < GPT2_NUM_TENSORS; i++)
        cr_assert_eq(sizes[i], want[i], "tensor %s: %zu elements, want %zu", gpt2_tensor_name(i),
                     sizes[i], want[i]);
}

// The memory layout is block-major (gpt2.h): the list walks the buffer in that order, and each
// parameter also knows where llm.c's stacked file order puts it.
Test(gpt2, param_list_covers_the_buffer_once_block_major) {
    GPT2Config s = small_cfg();  // L = 2
    int n = gpt2_params(&s, NULL);
    cr_assert_eq(n, 4 + 12 * 2);
    GPT2Param p[4 + 12 * 2];
    cr_assert_eq(gpt2_params(&s, p), n);
    const char *kinds[] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                           "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"};
    // llm.c's order by hand (sizes of the small config: wte 128, wpe 32, then per layer
    // ln1w 8, ln1b 8, qkvw 192, qkvb 24, attprojw 64, attprojb 8, ln2w 8, ln2b 8, fcw 256,
    // fcb 32, fcprojw 256, fcprojb 8, each stacked over the 2 layers; lnfw 8, lnfb 8)
    size_t per_layer[12] = {8, 8, 192, 24, 64, 8, 8, 8, 256, 32, 256, 8};
    size_t next = 0;
    for (int i = 0; i < n; i++) {
        char want[32];
        int l = (i - 2) / 12, k = (i - 2) % 12;
        if (i == 0) snprintf(want, sizeof want, "wte");
        else if (i == 1) snprintf(want, sizeof want, "wpe");
        else if (i == n - 2) snprintf(want, sizeof want, "lnfw");
        else if (i == n - 1) snprintf(want, sizeof want, "lnfb");
        else snprintf(want, sizeof want, "h.%d.%s", l, kinds[k]);
        cr_assert_str_eq(p[i].name, want);
        cr_assert_eq(p[i].offset, next, "%s starts at %zu, want %zu (no gap, no overlap)",
                     p[i].name, p[i].offset, next);
        cr_assert_eq(p[i].global_offset, p[i].offset, "%s: the full model's own offsets", p[i].name);
        cr_assert_eq(p[i].tied_copy, 0);
        next += p[i].size;
        int t = p[i].tensor;
        int block = i >= 2 && i < n - 2;
        cr_assert_eq(p[i].layer, block ? l : -1);
        if (block) {
            cr_assert_str_eq(gpt2_tensor_name(t), kinds[k]);
            size_t llmc = 160;  // after wte, wpe
            for (int j = 0; j < k; j++) llmc += 2 * per_layer[j];
            llmc += (size_t)l * per_layer[k];
            cr_assert_eq(p[i].llmc_offset, llmc, "%s: llm.c offset %zu, want %zu", p[i].name,
                         p[i].llmc_offset, llmc);
        } else {
            size_t llmc = i == 0 ? 0 : i == 1 ? 128 : i == n - 2 ? 1904 : 1912;
            cr_assert_eq(p[i].llmc_offset, llmc, "%s: llm.c offset %zu", p[i].name, p[i].llmc_offset);
        }
        int matrix = !strcmp(gpt2_tensor_name(t), "wte") || !strcmp(gpt2_tensor_name(t), "wpe") ||
                     !strcmp(gpt2_tensor_name(t), "qkvw") || !strcmp(gpt2_tensor_name(t), "attprojw") ||
                     !strcmp(gpt2_tensor_name(t), "fcw") || !strcmp(gpt2_tensor_name(t), "fcprojw");
        cr_assert_eq(p[i].decay, matrix, "%s: decay %d", p[i].name, p[i].decay);
    }
    cr_assert_eq(next, gpt2_param_count(&s));
    cr_assert_eq(p[4].size, (size_t)3 * 8 * 8);  // one layer's qkvw: (3C, C)
}

Test(gpt2, flops_per_step) {
    GPT2Config tiny = gpt2_config_tiny();
    // (6·(834304 - 64·128) + 12·4·128·64) · 16·64, worked out by hand
    cr_assert_eq(gpt2_flops_per_step(&tiny, 16, 64), 5478285312.0);
}

Test(gpt2, bad_config_is_refused, .exit_code = 1) {
    GPT2Config cfg = small_cfg();
    cfg.NH = 3;  // 8 channels do not split into 3 heads
    gpt2_config_check(&cfg);
}

// ---- initialization ----------------------------------------------------------------------------

// Mean and std of a tensor over all its layers.
static void stats(const float *x, size_t n, double *mean, double *std) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (size_t i = 0; i < n; i++) s2 += (x[i] - *mean) * (x[i] - *mean);
    *std = sqrt(s2 / n);
}

Test(gpt2, init_statistics) {
    GPT2 m;
    GPT2Config cfg = gpt2_config_tiny();
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 1234);
    // the tensors, stacked as llm.c stores them (gpt2_to_llmc), so each is one range
    float *f = malloc(m.num_params * sizeof(float));
    gpt2_to_llmc(&cfg, m.params, f);
    size_t param_sizes[GPT2_NUM_TENSORS];
    gpt2_param_sizes(&cfg, param_sizes);
    const float *t[GPT2_NUM_TENSORS];
    for (int i = 0, at = 0; i < GPT2_NUM_TENSORS; at += (int)param_sizes[i], i++) t[i] = f + at;
    double proj_std = 0.02 / sqrt(2.0 * cfg.L);
    struct { const float *x; size_t n; double std; const char *name; } w[] = {
        {t[GPT2_WTE], param_sizes[0], 0.02, "wte"},           {t[GPT2_WPE], param_sizes[1], 0.02, "wpe"},
        {t[GPT2_QKVW], param_sizes[4], 0.02, "qkvw"},         {t[GPT2_ATTPROJW], param_sizes[6], proj_std, "attprojw"},
        {t[GPT2_FCW], param_sizes[10], 0.02, "fcw"},          {t[GPT2_FCPROJW], param_sizes[12], proj_std, "fcprojw"},
    };
    size_t within_1sd = 0, total = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        double mean, std;
        stats(w[i].x, w[i].n, &mean, &std);
        // n >= 8192 samples: the std's relative standard error is 1/sqrt(2n) < 0.8%
        cr_assert(fabs(std / w[i].std - 1.0) < 0.03, "%s: std %.5f, want %.5f", w[i].name, std, w[i].std);
        cr_assert(fabs(mean) < 4.0 * w[i].std / sqrt((double)w[i].n), "%s: mean %.2e", w[i].name, mean);
        for (size_t j = 0; j < w[i].n; j++) within_1sd += fabs(w[i].x[j]) < w[i].std;
        total += w[i].n;
    }
    // normal, not merely the right variance: P(|z| < 1) = 0.6827
    cr_assert(fabs((double)within_1sd / total - 0.6827) < 0.005, "P(|z|<1) = %.4f",
              (double)within_1sd / total);
    const float *ones[] = {t[GPT2_LN1W], t[GPT2_LN2W], t[GPT2_LNFW]};
    size_t nones[] = {param_sizes[2], param_sizes[8], param_sizes[14]};
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < nones[i]; j++) cr_assert_eq(ones[i][j], 1.0f);
    int biases[] = {3, 5, 7, 9, 11, 13, 15};
    const float *bias_ptr[] = {t[GPT2_LN1B], t[GPT2_QKVB], t[GPT2_ATTPROJB], t[GPT2_LN2B], t[GPT2_FCB], t[GPT2_FCPROJB], t[GPT2_LNFB]};
    for (int i = 0; i < 7; i++)
        for (size_t j = 0; j < param_sizes[biases[i]]; j++)
            cr_assert_eq(bias_ptr[i][j], 0.0f, "%s[%zu] = %g", gpt2_tensor_name(biases[i]), j,
                         (double)bias_ptr[i][j]);
    free(f);
    gpt2_free(&m);
}

Test(gpt2, init_depends_on_the_seed_only) {
    GPT2Config cfg = small_cfg();
    size_t n = gpt2_param_count(&cfg);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    gpt2_init_slice(&cfg, 5, 0, n, a);
    gpt2_init_slice(&cfg, 5, 0, n, b);
    gpt2_init_slice(&cfg, 6, 0, n, c);
    cr_assert(memcmp(a, b, n * sizeof(float)) == 0, "same seed, different parameters");
    size_t same = 0;
    for (size_t i = 0; i < 128; i++) same += a[i] == c[i];  // wte
    cr_assert_eq(same, 0, "seeds 5 and 6 share %zu of 128 wte values", same);
    free(a);
    free(b);
    free(c);
}

Test(gpt2, init_slice_equals_slice_of_full_init) {
    GPT2 m;
    GPT2Config cfg = gpt2_config_tiny();
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 99);
    size_t n = m.num_params;
    // odd ranges, across tensor boundaries (wte ends at 32768, wpe at 40960), empty, whole
    size_t ranges[][2] = {{0, 1}, {7, 33333}, {32767, 40961}, {40960, 40960}, {123457, 654321},
                          {n - 5, n}, {0, n}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        size_t lo = ranges[r][0], hi = ranges[r][1];
        float *part = malloc((hi - lo + 1) * sizeof(float));
        gpt2_init_slice(&cfg, 99, lo, hi, part);
        cr_assert(memcmp(part, m.params + lo, (hi - lo) * sizeof(float)) == 0,
                  "init of [%zu, %zu) differs from the full init", lo, hi);
        free(part);
    }
    gpt2_free(&m);
}

// ---- forward -----------------------------------------------------------------------------------

Test(gpt2, loss_at_init_is_log_vocab) {
    GPT2 m;
    gpt2_build(&m, gpt2_config_tiny(), DEV_CPU);
    gpt2_init_params(&m, 42);
    int B = 4, T = 64;
    gpt2_alloc_acts(&m, B, T);
    int *x = malloc((size_t)B * T * sizeof(int)), *y = malloc((size_t)B * T * sizeof(int));
    random_tokens(x, (size_t)B * T, 256);
    random_tokens(y, (size_t)B * T, 256);
    float loss = gpt2_forward(&m, x, y);
    // Expected: ln V plus a little. Logits lnf·wteᵀ have std ~ 0.02·sqrt(C) ≈ 0.23 (+0.03), and
    // with tied embeddings the input token's own logit is ~ |wte row|² / its std ≈ 1.8 (+0.02).
    // So the margin is 0.1 above ln V, and the loss is never below ln V - 0.01.
    cr_assert(loss > log(256.0) - 0.01 && loss < log(256.0) + 0.1, "loss at init %.4f, ln(256) = %.4f",
              loss, log(256.0));
    cr_assert_eq(gpt2_forward(&m, x, NULL), -1.0f, "no targets: no loss");
    free(x);
    free(y);
    gpt2_free(&m);
}

Test(gpt2, output_layer_is_tied_to_wte) {
    GPT2 m;
    GPT2Config cfg = small_cfg();
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 3);
    randomize_params(&m);
    gpt2_alloc_acts(&m, 2, 4);
    int x[8], y[8];
    random_tokens(x, 8, cfg.V);
    random_tokens(y, 8, cfg.V);
    gpt2_forward(&m, x, y);
    for (int n = 0; n < 8; n++)
        for (int v = 0; v < cfg.V; v++) {
            double s = 0;
            for (int c = 0; c < cfg.C; c++) s += (double)m.act.a.lnf[n * cfg.C + c] * m.params[v * cfg.C + c];
            cr_assert(fabs(m.act.a.logits[n * cfg.V + v] - s) < 1e-5, "logit (%d, %d) = %g, lnf·wte = %g",
                      n, v, (double)m.act.a.logits[n * cfg.V + v], s);
        }
    gpt2_free(&m);
}

Test(gpt2, bad_token_is_refused, .exit_code = 1) {
    GPT2 m;
    gpt2_build(&m, small_cfg(), DEV_CPU);
    gpt2_alloc_acts(&m, 1, 2);
    int x[2] = {3, 16};  // V = 16: token 16 does not exist
    gpt2_set_batch(&m, x, NULL);
}

Test(gpt2, forward_in_pieces_equals_whole) {
    GPT2 m;
    GPT2Config cfg = small_cfg();
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 8);
    randomize_params(&m);
    gpt2_alloc_acts(&m, 3, 4);
    int x[12], y[12];
    random_tokens(x, 12, cfg.V);
    random_tokens(y, 12, cfg.V);
    float whole = gpt2_forward(&m, x, y);
    float *acts = malloc(m.act.num_acts * sizeof(float));
    memcpy(acts, m.act.acts, m.act.num_acts * sizeof(float));
    memset(m.act.acts, 0, m.act.num_acts * sizeof(float));
    gpt2_set_batch(&m, x, y);
    gpt2_embed_forward(&m);
    for (int l = 0; l < cfg.L; l++) gpt2_block_forward(&m, l);
    float pieces = gpt2_head_forward(&m);
    cr_assert_eq(pieces, whole);
    cr_assert(memcmp(acts, m.act.acts, m.act.num_acts * sizeof(float)) == 0, "activations differ");
    free(acts);
    gpt2_free(&m);
}

// ---- backward ----------------------------------------------------------------------------------

// Finite differences of the mean loss (h = 1e-2 on parameters of size ~0.5: the loss's fp32
// rounding, ~3e-7, becomes ~2e-5 in the estimate; truncation is ~h²·f'''/6 ~ 2e-5).
// Pass: |backward - numeric| <= 2e-4 + 2e-2·|numeric|.
Test(gpt2, gradient_check_whole_model) {
    GPT2 m;
    GPT2Config cfg = small_cfg();
    int B = 2, T = 4;
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 11);
    randomize_params(&m);
    gpt2_alloc_grads(&m);
    gpt2_alloc_acts(&m, B, T);
    int x[8], y[8];
    random_tokens(x, 8, cfg.V);
    random_tokens(y, 8, cfg.V);
    x[5] = x[1];  // a repeated token: its wte row collects two embedding gradients

    gpt2_zero_grad(&m);
    gpt2_forward(&m, x, y);
    gpt2_backward(&m, 1.0f / (float)(B * T));

    GPT2Param params[4 + 12 * 2];
    int np = gpt2_params(&cfg, params);
    const double h = 1e-2;
    double worst = 0;
    int checked = 0;
    for (int p = 0; p < np; p++) {
        for (int s = 0; s < 4; s++) {  // 4 elements of every parameter
            size_t i = params[p].offset + rnd() % params[p].size;
            float saved = m.params[i];
            m.params[i] = saved + (float)h;
            double lp = gpt2_forward(&m, x, y);
            m.params[i] = saved - (float)h;
            double lm = gpt2_forward(&m, x, y);
            m.params[i] = saved;
            double num = (lp - lm) / (2 * h);
            double err = fabs(m.grads[i] - num), allowed = 2e-4 + 2e-2 * fabs(num);
            cr_assert(err <= allowed, "%s (element %zu): backward %.6g, finite difference %.6g",
                      params[p].name, i - params[p].offset, (double)m.grads[i], num);
            if (err / allowed > worst) worst = err / allowed;
            checked++;
        }
    }
    cr_log_info("gradient check: %d elements, worst error %.2f of the tolerance", checked, worst);
    gpt2_free(&m);
}

Test(gpt2, backward_in_pieces_equals_whole) {
    GPT2 m;
    GPT2Config cfg = small_cfg();
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 12);
    randomize_params(&m);
    gpt2_alloc_grads(&m);
    gpt2_alloc_acts(&m, 2, 4);
    int x[8], y[8];
    random_tokens(x, 8, cfg.V);
    random_tokens(y, 8, cfg.V);
    gpt2_forward(&m, x, y);
    gpt2_zero_grad(&m);
    gpt2_backward(&m, 0.125f);
    float *whole = malloc(m.num_params * sizeof(float));
    memcpy(whole, m.grads, m.num_params * sizeof(float));
    // scribble on the activation gradients: the pieces must not depend on what was there
    for (size_t i = 0; i < m.act.num_dacts; i++) m.act.dacts[i] = 1e3f;
    gpt2_zero_grad(&m);
    gpt2_head_backward(&m, 0.125f);
    for (int l = cfg.L - 1; l >= 0; l--) gpt2_block_backward(&m, l);
    gpt2_embed_backward(&m);
    cr_assert(memcmp(whole, m.grads, m.num_params * sizeof(float)) == 0, "gradients differ");
    // and a second backward without zero_grad accumulates: twice the gradient, up to rounding
    // (a GEMM with beta = 1 adds its partial sums into the old value one block at a time), so
    // within 1e-6 of the largest gradient
    gpt2_backward(&m, 0.125f);
    double gmax = 0;
    for (size_t i = 0; i < m.num_params; i++) gmax = fmax(gmax, fabs(whole[i]));
    for (size_t i = 0; i < m.num_params; i++)
        cr_assert(fabs(m.grads[i] - 2.0 * whole[i]) <= 1e-6 * gmax,
                  "element %zu: %g after two backwards, want 2 x %g", i, (double)m.grads[i],
                  (double)whole[i]);
    free(whole);
    gpt2_free(&m);
}

// Two half batches, each backward with dloss = 1/(B·T) of the FULL batch, accumulate to the
// full batch's gradient. Not bit-exact: the weight-gradient GEMMs sum over rows in a different
// order. Tolerance: 1e-5 of the largest gradient of the model (fp32 has 6e-8 resolution).
Test(gpt2, gradient_accumulation_over_half_batches) {
    GPT2 m;
    GPT2Config cfg = small_cfg();
    int B = 4, T = 4;
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 13);
    randomize_params(&m);
    gpt2_alloc_grads(&m);
    int x[16], y[16];
    random_tokens(x, 16, cfg.V);
    random_tokens(y, 16, cfg.V);
    float dloss = 1.0f / (float)(B * T);

    gpt2_alloc_acts(&m, B, T);
    gpt2_zero_grad(&m);
    float full_loss = gpt2_forward(&m, x, y);
    gpt2_backward(&m, dloss);
    float *full = malloc(m.num_params * sizeof(float));
    memcpy(full, m.grads, m.num_params * sizeof(float));

    gpt2_alloc_acts(&m, B / 2, T);
    gpt2_zero_grad(&m);
    float l0 = gpt2_forward(&m, x, y);
    gpt2_backward(&m, dloss);
    float l1 = gpt2_forward(&m, x + 8, y + 8);
    gpt2_backward(&m, dloss);
    cr_assert(fabsf((l0 + l1) / 2 - full_loss) < 1e-6f * full_loss);

    double gmax = 0, dmax = 0;
    for (size_t i = 0; i < m.num_params; i++) gmax = fmax(gmax, fabs(full[i]));
    for (size_t i = 0; i < m.num_params; i++) dmax = fmax(dmax, fabs(full[i] - m.grads[i]));
    cr_assert(gmax > 0);
    cr_assert(dmax <= 1e-5 * gmax, "max |full - accumulated| = %.3g, largest gradient %.3g", dmax, gmax);
    cr_log_info("accumulation: max difference %.2g of the largest gradient", dmax / gmax);
    free(full);
    gpt2_free(&m);
}

// On a CPU a block runs its batch in chunks of whole sequences (gpt2.c, CPU_CHUNK_ROWS = 256
// rows): with T = 64 a batch of 5 is a chunk of 4 sequences and one of 1. Sequences are
// independent, so every position's loss must equal that of its sequence run alone (B = 1, one
// chunk), and the gradient must equal the accumulated gradients of the 5 single-sequence runs.
Test(gpt2, chunked_batch_equals_sequences_one_by_one) {
    GPT2 m;
    GPT2Config cfg = {.V = 16, .T = 64, .L = 2, .C = 8, .NH = 2};
    enum { B = 5, T = 64 };
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_init_params(&m, 14);
    randomize_params(&m);
    gpt2_alloc_grads(&m);
    int x[B * T], y[B * T];
    random_tokens(x, B * T, cfg.V);
    random_tokens(y, B * T, cfg.V);
    float dloss = 1.0f / (float)(B * T);

    gpt2_alloc_acts(&m, B, T);
    gpt2_zero_grad(&m);
    gpt2_forward(&m, x, y);
    gpt2_backward(&m, dloss);
    float *losses = malloc(B * T * sizeof(float)), *full = malloc(m.num_params * sizeof(float));
    memcpy(losses, m.act.host_losses, B * T * sizeof(float));
    memcpy(full, m.grads, m.num_params * sizeof(float));

    gpt2_alloc_acts(&m, 1, T);
    gpt2_zero_grad(&m);
    for (int b = 0; b < B; b++) {
        gpt2_forward(&m, x + b * T, y + b * T);
        gpt2_backward(&m, dloss);
        for (int t = 0; t < T; t++) {
            float want = m.act.host_losses[t], got = losses[b * T + t];
            cr_assert(fabsf(got - want) <= 1e-5f * want, "sequence %d position %d: loss %.8g in "
                      "the batch, %.8g alone", b, t, (double)got, (double)want);
        }
    }
    double gmax = 0, dmax = 0;
    for (size_t i = 0; i < m.num_params; i++) gmax = fmax(gmax, fabs(full[i]));
    for (size_t i = 0; i < m.num_params; i++) dmax = fmax(dmax, fabs(full[i] - m.grads[i]));
    cr_assert(gmax > 0);
    cr_assert(dmax <= 1e-5 * gmax, "max |batch - one by one| = %.3g, largest gradient %.3g", dmax,
              gmax);
    free(losses);
    free(full);
    gpt2_free(&m);
}
