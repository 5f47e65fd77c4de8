// test_gpt2_units.c: the model cut into pieces (gpt2.h), on the CPU, fp32 and bf16.
//
//   - layout: the block-major buffer is llm.c's order permuted (init bit-exact); units tile it;
//     files written before the change (tests/fixtures/pre_units) load and resume bit-exactly;
//   - external weights: every piece fed a copy of its unit elsewhere == in place, bit-exact;
//   - stages: [0, l1) and [l1, L) chained == the full model (loss, every gradient);
//   - activation objects: two micro-batches alive at once == one after the other; m
//     accumulated micro-batches == one batch of m*b rows; memory tagged and freed;
//   - split backward: B then W == the full backward, bit-exact.
// Each test's comment names the deliberate break it was seen to catch.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "gpt2.h"
#include "harness.h"
#include "mem.h"
#include "train.h"

// Small enough to be fast, big enough that every block tensor has several rows and the CPU
// processes a block in more than one chunk (B*T = 6*48 = 288 rows > 256 per chunk).
static GPT2Config cfg3(void) {
    GPT2Config c = {.V = 40, .T = 48, .L = 3, .C = 16, .NH = 4};
    return c;
}
#define BATCH 6

static uint64_t rng = 12345;
static int rnd_token(int V) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((rng >> 33) % (uint64_t)V);
}
static void tokens(int *x, size_t n, int V) {
    for (size_t i = 0; i < n; i++) x[i] = rnd_token(V);
}

static const char *dtype_name(GPT2Dtype d) { return d == GPT2_BF16 ? "bf16" : "fp32"; }
static size_t esz(GPT2Dtype d) { return d == GPT2_BF16 ? 2 : 4; }

// The model's gradients (or weights) as fp32 in its MEMORY order, on the host.
static float *grads_mem(const GPT2 *m) {
    float *h = malloc(m->num_params * sizeof(float));
    if (m->dtype == GPT2_FP32) {
        memcpy(h, m->grads, m->num_params * sizeof(float));
    } else {
        for (size_t i = 0; i < m->num_params; i++) h[i] = bf16_to_f32(m->grads_bf16[i]);
    }
    return h;
}
static float *params_mem(const GPT2 *m) {
    float *h = malloc(m->num_params * sizeof(float));
    if (m->dtype == GPT2_FP32) memcpy(h, m->params, m->num_params * sizeof(float));
    else for (size_t i = 0; i < m->num_params; i++) h[i] = bf16_to_f32(m->params_bf16[i]);
    return h;
}

static void build(GPT2 *m, GPT2Dtype dt, int l0, int l1) {
    gpt2_build_stage(m, cfg3(), DEV_CPU, dt, l0, l1);
    gpt2_init_params(m, 77);
    gpt2_alloc_grads(m);
    gpt2_zero_grad(m);
}

// ---- layout ------------------------------------------------------------------------------------

// The init of the block-major buffer is the llm.c-order init permuted: the element with llm.c
// index i holds std·normal(seed, i) whatever its place in memory. The reference is the file
// the code BEFORE this layout wrote at init (fixtures/pre_units/init.bin, llm.c order).
// Seen to fail: init drawing normal_at(seed, memory offset) instead of the llm.c index.
Test(units, init_is_the_old_llmc_init_permuted) {
    GPT2Config c = {.V = 32, .T = 8, .L = 2, .C = 8, .NH = 2};
    size_t n = gpt2_param_count(&c);
    float *old = malloc(n * sizeof(float)), *mine = malloc(n * sizeof(float));
    ckpt_load_weights("tests/fixtures/pre_units/init.bin", &c, old);  // llm.c order
    GPT2 m;
    gpt2_build(&m, c, DEV_CPU);
    gpt2_init_params(&m, 7);
    train_params_to_host(&m, mine);  // llm.c order
    cr_assert(memcmp(old, mine, n * sizeof(float)) == 0, "init differs from the pre-change init");
    // and the memory buffer is that, permuted: the loader's mapping gives the same bits
    float *loaded = malloc(n * sizeof(float));
    ckpt_load_weights_into("tests/fixtures/pre_units/init.bin", &c, loaded, n);
    cr_assert(memcmp(loaded, m.params, n * sizeof(float)) == 0, "memory layout of the loaded file");
    // the permutation really moves things (else the checks above would prove little): block 0's
    // ln1b follows its ln1w in memory, but in llm.c's order block 1's ln1w comes between
    GPT2Param p[4 + 12 * 2];
    gpt2_params(&c, p);
    cr_assert_eq(p[3].offset, p[2].offset + 8);
    cr_assert_eq(p[3].llmc_offset, p[2].llmc_offset + 16);
    free(old), free(mine), free(loaded);
    gpt2_free(&m);
}

// A block's 12 tensors are one unit; the units tile the buffer in order; a stage's parameters
// carry their global offsets, and the tied copy of wte points at wte.
// Seen to fail: a block unit's global offset off by one element.
Test(units, units_tile_the_buffer) {
    GPT2Config c = cfg3();
    GPT2 m;
    gpt2_build(&m, c, DEV_CPU);
    cr_assert_eq(m.nunits, c.L + 2);
    size_t at = 0;
    for (int u = 0; u < m.nunits; u++) {
        cr_assert_eq(m.units[u].offset, at, "unit %d at %zu, want %zu", u, m.units[u].offset, at);
        cr_assert_eq(m.units[u].global_offset, at);
        at += m.units[u].size;
    }
    cr_assert_eq(at, gpt2_param_count(&c));
    GPT2BlockDims d = gpt2_block_dims(&c);
    size_t C = (size_t)c.C;
    cr_assert_eq(gpt2_block_layout(&d, NULL, NULL), 12 * C * C + 13 * C);
    cr_assert_eq(gpt2_block_unit(&m, 1)->offset, gpt2_tensor_offset(&m, GPT2_LN1W, 1));
    cr_assert_eq(gpt2_tensor_offset(&m, GPT2_LN1W, 2),
                 gpt2_tensor_offset(&m, GPT2_FCPROJB, 1) + C);
    gpt2_free(&m);
    // a middle stage and a last stage
    GPT2 s;
    gpt2_build_stage(&s, c, DEV_CPU, GPT2_FP32, 2, 3);
    cr_assert_eq(s.nunits, 3);  // block 2, head, the tied wte
    cr_assert_eq(s.units[0].kind, GPT2_UNIT_BLOCK);
    cr_assert_eq(s.units[1].kind, GPT2_UNIT_HEAD);
    cr_assert_eq(s.units[2].kind, GPT2_UNIT_TIED_WTE);
    cr_assert_eq(s.units[2].global_offset, 0);
    cr_assert_eq(s.wte_offset, s.units[2].offset);
    cr_assert_eq(s.num_params, gpt2_stage_param_count(&c, 2, 3));
    int tied = 0;
    for (int i = 0; i < s.nplist; i++) tied += s.plist[i].tied_copy;
    cr_assert_eq(tied, 1);
    gpt2_free(&s);
}

// Weights and a training state written BEFORE the layout change (llm.c order in memory then)
// load into today's model and training continues exactly: resuming the old step-2 state for
// two more steps gives the old 4-step run's losses and weights (fp32 and bf16), and the old
// step-2 weights file equals the old state's weights (bit for bit: no arithmetic).
// The old run's figures are fixtures made by the optimized build on the machine of that day;
// another build (the sanitizer build, whose code is vectorized differently) or another CPU
// (-march=native) may round the same sums differently, so the continued run is held to
// 1e-6 relative on losses and 1e-6 absolute on weights: an order of magnitude above the
// differences those builds make (0 bits in the optimized build here; last-bit drift under
// SAN=1), far below what a layout bug makes (a weight read from the wrong place moves the
// loss by more than 1e-3).
// Seen to fail: ckpt_resume_training copying the state's weights without the llm.c mapping
// (the resumed step 2 loss differs, fp32 and bf16).
static void resume_old(const char *dtype, const char *state, const char *dump) {
    RunResults want, got;
    char err[256];
    cr_assert_eq(results_read(dump, &want, err, sizeof err), 0, "%s", err);
    char flags[512];
    snprintf(flags, sizeof flags, "--vocab 32 --seq 8 --layers 2 --channels 8 --heads 2 --batch 4 "
             "--seed 7 --steps 4 --dtype %s --resume %s", dtype, state);
    char *out = NULL;
    int rc = harness_run_dump("./00_memory_budget/run --train --quiet", 1, flags, &got, &out, 120);
    cr_assert_eq(rc, 0, "run failed:\n%s", out);
    cr_assert_eq(got.nsteps, 4);
    for (int s = 2; s < 4; s++)
        cr_assert(fabs((double)got.losses[s] - want.losses[s]) <= 1e-6 * fabs(want.losses[s]),
                  "%s step %d: loss %.9g, before the change %.9g", dtype, s,
                  (double)got.losses[s], (double)want.losses[s]);
    cr_assert_eq(got.nparams, want.nparams);
    double worst = 0.0;
    for (size_t i = 0; i < want.nparams; i++) {
        double d = fabs((double)got.params[i] - (double)want.params[i]);
        if (!(d <= worst)) worst = d;  // NaN counts as the worst
    }
    cr_assert(worst <= 1e-6, "%s: final weights differ from the pre-change run by %.3g", dtype,
              worst);
    free(out);
    results_free(&want);
    results_free(&got);
}
Test(units, old_files_resume_exactly_fp32) {
    resume_old("fp32", "tests/fixtures/pre_units/s2.bin", "tests/fixtures/pre_units/d4.dump");
    GPT2Config c = {.V = 32, .T = 8, .L = 2, .C = 8, .NH = 2};
    size_t n = gpt2_param_count(&c);
    float *w = malloc(n * sizeof(float)), *p = malloc(n * sizeof(float));
    float *mm = malloc(n * sizeof(float)), *vv = malloc(n * sizeof(float));
    ckpt_load_weights_into("tests/fixtures/pre_units/w2.bin", &c, w, n);
    cr_assert_eq(ckpt_resume_training("tests/fixtures/pre_units/s2.bin", &c, p, mm, vv, n), 2);
    cr_assert(memcmp(w, p, n * sizeof(float)) == 0, "old weights file != old state's weights");
    free(w), free(p), free(mm), free(vv);
}
Test(units, old_files_resume_exactly_bf16) {
    resume_old("bf16", "tests/fixtures/pre_units/s2_bf16.bin", "tests/fixtures/pre_units/d4_bf16.dump");
}

// Save and load through the llm.c file order: the model's memory buffer comes back bit-exact,
// and the file itself is in llm.c's order (its first V*C floats are wte, then wpe, then ln1w of
// EVERY layer). Seen to fail: ckpt_load_weights_into without the mapping.
Test(units, weights_file_round_trip) {
    GPT2Config c = cfg3();
    GPT2 m;
    gpt2_build(&m, c, DEV_CPU);
    gpt2_init_params(&m, 3);
    for (size_t i = 0; i < m.num_params; i++) m.params[i] += 1e-3f * (float)(i % 101);  // no repeats
    size_t n = m.num_params;
    float *file = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    train_params_to_host(&m, file);
    char path[] = "/tmp/lab-units-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    ckpt_save_weights(path, &c, file);
    ckpt_load_weights_into(path, &c, back, n);
    cr_assert(memcmp(back, m.params, n * sizeof(float)) == 0, "round trip changed the weights");
    // file order: after wte (V*C) and wpe (T*C), L*C values of ln1w (layer 0 then 1 then 2)
    size_t ln1 = (size_t)c.V * c.C + (size_t)c.T * c.C;
    for (int l = 0; l < c.L; l++)
        cr_assert(memcmp(file + ln1 + (size_t)l * c.C, m.params + gpt2_tensor_offset(&m, GPT2_LN1W, l),
                         (size_t)c.C * sizeof(float)) == 0, "ln1w of layer %d not at its llm.c place", l);
    remove(path);
    free(file), free(back);
    gpt2_free(&m);
}

// ---- external weights --------------------------------------------------------------------------

// Every piece fed weights from a copy of its unit at another address, gradients into unit-shaped
// buffers there too, while the model's own weights are poisoned (NaN) and its own gradients
// must stay zero: == the same model run in place, bit-exact (loss, every gradient).
// Seen to fail: gpt2_block_forward_w ignoring block_w (reads the NaNs: loss NaN); the head
// backward writing into the model's own dwte instead of the caller's.
static void external_equals_in_place(GPT2Dtype dt) {
    GPT2Config c = cfg3();
    int BT = BATCH * c.T;
    int *x = malloc((size_t)BT * sizeof(int)), *y = malloc((size_t)BT * sizeof(int));
    tokens(x, (size_t)BT, c.V);
    tokens(y, (size_t)BT, c.V);
    GPT2 a, b;
    build(&a, dt, 0, c.L);
    build(&b, dt, 0, c.L);
    gpt2_alloc_acts(&a, BATCH, c.T);
    gpt2_alloc_acts(&b, BATCH, c.T);
    float la = gpt2_forward(&a, x, y);
    gpt2_backward(&a, 1.0f / (float)BT);

    size_t bytes = b.num_params * esz(dt);
    char *w = mem_alloc(bytes, MEM_OTHER, DEV_CPU), *g = mem_alloc(bytes, MEM_OTHER, DEV_CPU);
    memcpy(w, train_params(&b), bytes);
    mem_zero(g, bytes);
    if (dt == GPT2_FP32) for (size_t i = 0; i < b.num_params; i++) b.params[i] = NAN;
    else for (size_t i = 0; i < b.num_params; i++) b.params_bf16[i] = bf16_from_f32(NAN);
    const GPT2Unit *emb = &b.units[0], *head = &b.units[b.nunits - 1];
#define AT(buf, off) ((buf) + (off) * esz(dt))
    gpt2_acts_set_batch(&b, NULL, x, y);
    gpt2_embed_forward_w(&b, NULL, AT(w, emb->offset));
    for (int l = 0; l < c.L; l++) gpt2_block_forward_w(&b, NULL, l, AT(w, gpt2_block_unit(&b, l)->offset));
    float lb = gpt2_head_forward_w(&b, NULL, AT(w, 0), AT(w, head->offset));
    gpt2_head_backward_w(&b, NULL, 1.0f / (float)BT, AT(w, 0), AT(w, head->offset), AT(g, 0),
                         AT(g, head->offset));
    for (int l = c.L - 1; l >= 0; l--) {
        size_t off = gpt2_block_unit(&b, l)->offset;
        gpt2_block_backward_w(&b, NULL, l, AT(w, off), AT(g, off));
    }
    gpt2_embed_backward_w(&b, NULL, AT(g, emb->offset));
#undef AT
    cr_assert_eq(la, lb, "%s: loss in place %.9g, external %.9g", dtype_name(dt), (double)la, (double)lb);
    cr_assert(memcmp(g, train_grads(&a), bytes) == 0, "%s: external gradients differ", dtype_name(dt));
    float *own = grads_mem(&b);
    for (size_t i = 0; i < b.num_params; i++)
        cr_assert_eq(own[i], 0.0f, "%s: the model's own gradient %zu was written", dtype_name(dt), i);
    free(own);
    mem_free(w);
    mem_free(g);
    gpt2_free(&a);
    gpt2_free(&b);
    free(x), free(y);
}
Test(units, external_weights_equal_in_place_fp32) { external_equals_in_place(GPT2_FP32); }
Test(units, external_weights_equal_in_place_bf16) { external_equals_in_place(GPT2_BF16); }

// ---- stages ------------------------------------------------------------------------------------

// Stages [0, l1) and [l1, L) chained (the boundary activation copied forward, its gradient
// copied back) == the full model: the same loss and, parameter by parameter at its global
// offset, the same gradients, BIT-EXACT, except wte: the full model adds the head's and the
// embedding's part into one buffer, the stages each hold one part and the chapter sums them,
// so the sum is the same terms in another order: fp32 within 1e-6 of the largest |wte grad|;
// bf16 within 2^-7 of |head part| + |embedding part| per element (each part is rounded to
// bf16 once before the sum, the full model rounds after each part: a few roundings of 2^-9).
// The stages' initial weights are the slices of the full init (bit-exact, the copy of wte too).
// Seen to fail: residual_scale from the stage's own block count (init differs);
// gpt2_acts_input pointing at da.encoded (block l1 does not read what was received: loss
// differs); gpt2_acts_doutput pointing at block l0 instead of l1-1 (stage 0's gradients differ).
static void stages_equal_full(GPT2Dtype dt, int l1) {
    GPT2Config c = cfg3();
    int BT = BATCH * c.T;
    size_t BTC = (size_t)BT * c.C;
    int *x = malloc((size_t)BT * sizeof(int)), *y = malloc((size_t)BT * sizeof(int));
    tokens(x, (size_t)BT, c.V);
    tokens(y, (size_t)BT, c.V);
    GPT2 full, s0, s1;
    build(&full, dt, 0, c.L);
    build(&s0, dt, 0, l1);
    build(&s1, dt, l1, c.L);
    gpt2_alloc_acts(&full, BATCH, c.T);
    float loss = gpt2_forward(&full, x, y);
    gpt2_backward(&full, 1.0f / (float)BT);

    GPT2Acts a0, a1;
    gpt2_acts_alloc(&a0, &s0, BATCH, c.T);
    gpt2_acts_alloc(&a1, &s1, BATCH, c.T);
    cr_assert_eq(gpt2_forward_acts(&s0, &a0, x, NULL), -1.0f);
    float *boundary = malloc(BTC * sizeof(float));
    gpt2_acts_output(&s0, &a0, boundary);                       // "send"
    memcpy(gpt2_acts_input(&a1), boundary, BTC * sizeof(float));  // "receive"
    float loss1 = gpt2_forward_acts(&s1, &a1, NULL, y);
    cr_assert_eq(loss1, loss, "%s l1=%d: chained loss %.9g, full %.9g", dtype_name(dt), l1,
                 (double)loss1, (double)loss);
    gpt2_backward_acts(&s1, &a1, 1.0f / (float)BT);
    memcpy(gpt2_acts_doutput(&a0), gpt2_acts_dinput(&a1), BTC * sizeof(float));
    gpt2_backward_acts(&s0, &a0, 1.0f / (float)BT);

    float *gf = grads_mem(&full), *pf = params_mem(&full);
    const GPT2 *st[2] = {&s0, &s1};
    float *wte_sum = calloc((size_t)c.V * c.C, sizeof(float));
    float *wte_parts[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        float *g = grads_mem(st[k]), *p = params_mem(st[k]);
        for (int i = 0; i < st[k]->nplist; i++) {
            const GPT2Param *q = &st[k]->plist[i];
            cr_assert(memcmp(p + q->offset, pf + q->global_offset, q->size * sizeof(float)) == 0,
                      "%s stage %d: init of %s is not the full init's slice", dtype_name(dt), k, q->name);
            if (q->tensor == GPT2_WTE) {
                wte_parts[k] = malloc(q->size * sizeof(float));
                memcpy(wte_parts[k], g + q->offset, q->size * sizeof(float));
                for (size_t j = 0; j < q->size; j++) wte_sum[j] += g[q->offset + j];
                continue;
            }
            cr_assert(memcmp(g + q->offset, gf + q->global_offset, q->size * sizeof(float)) == 0,
                      "%s l1=%d stage %d: gradient of %s differs from the full model's", dtype_name(dt),
                      l1, k, q->name);
        }
        free(g), free(p);
    }
    cr_assert(wte_parts[0] && wte_parts[1], "both stages hold wte");
    double gmax = 0;
    for (size_t j = 0; j < (size_t)c.V * c.C; j++) gmax = fmax(gmax, fabs(gf[j]));
    for (size_t j = 0; j < (size_t)c.V * c.C; j++) {
        double tol = dt == GPT2_FP32 ? 1e-6 * gmax
                                     : 0x1p-7 * (fabs(wte_parts[0][j]) + fabs(wte_parts[1][j])) + 1e-30;
        cr_assert(fabs(wte_sum[j] - gf[j]) <= tol, "%s: wte grad %zu: stages sum %.9g, full %.9g",
                  dtype_name(dt), j, (double)wte_sum[j], (double)gf[j]);
    }
    // the two parts are both there: neither alone is the full gradient
    cr_assert(fabs(wte_parts[0][0] - gf[0]) > 0 || fabs(wte_parts[1][0] - gf[0]) > 0);
    free(wte_parts[0]), free(wte_parts[1]), free(wte_sum);
    free(gf), free(pf), free(boundary);
    gpt2_acts_free(&a0);
    gpt2_acts_free(&a1);
    gpt2_free(&full), gpt2_free(&s0), gpt2_free(&s1);
    free(x), free(y);
}
Test(units, stages_chained_equal_full_fp32) {
    stages_equal_full(GPT2_FP32, 1);
    stages_equal_full(GPT2_FP32, 2);
}
Test(units, stages_chained_equal_full_bf16) {
    stages_equal_full(GPT2_BF16, 1);
    stages_equal_full(GPT2_BF16, 2);
}

// A bad stage range is refused with a message naming the valid range.
Test(units, bad_stage_is_refused, .exit_code = 1) {
    GPT2 m;
    gpt2_build_stage(&m, cfg3(), DEV_CPU, GPT2_FP32, 2, 2);
}

// ---- activation objects ------------------------------------------------------------------------

// Two micro-batches alive at once (forward A, forward B, backward B, backward A) == the two
// run one after the other on the model's default activation set (B then A: the gradients
// accumulate in the same order), bit-exact: losses, per-position losses, gradients.
// Seen to fail: acts_of() ignoring its argument (every set aliasing m->act: B's forward
// overwrites A's activations, A's backward then differs).
static void two_alive(GPT2Dtype dt) {
    GPT2Config c = cfg3();
    int BT = 2 * c.T;
    int *xa = malloc((size_t)BT * sizeof(int)), *ya = malloc((size_t)BT * sizeof(int));
    int *xb = malloc((size_t)BT * sizeof(int)), *yb = malloc((size_t)BT * sizeof(int));
    tokens(xa, (size_t)BT, c.V), tokens(ya, (size_t)BT, c.V);
    tokens(xb, (size_t)BT, c.V), tokens(yb, (size_t)BT, c.V);
    float d = 1.0f / (float)(2 * BT);
    GPT2 seq, par;
    build(&seq, dt, 0, c.L);
    build(&par, dt, 0, c.L);
    gpt2_alloc_acts(&seq, 2, c.T);
    float lb_seq = gpt2_forward(&seq, xb, yb);
    gpt2_backward(&seq, d);
    float la_seq = gpt2_forward(&seq, xa, ya);
    gpt2_backward(&seq, d);

    GPT2Acts A, B;
    gpt2_acts_alloc(&A, &par, 2, c.T);
    gpt2_acts_alloc(&B, &par, 2, c.T);
    float la = gpt2_forward_acts(&par, &A, xa, ya);
    float lb = gpt2_forward_acts(&par, &B, xb, yb);
    gpt2_backward_acts(&par, &B, d);
    gpt2_backward_acts(&par, &A, d);
    cr_assert_eq(la, la_seq, "%s: loss A %.9g vs %.9g", dtype_name(dt), (double)la, (double)la_seq);
    cr_assert_eq(lb, lb_seq, "%s: loss B %.9g vs %.9g", dtype_name(dt), (double)lb, (double)lb_seq);
    cr_assert(memcmp(A.host_losses, seq.act.host_losses, (size_t)BT * sizeof(float)) == 0);
    cr_assert(memcmp(train_grads(&par), train_grads(&seq), par.num_params * esz(dt)) == 0,
              "%s: gradients of the interleaved micro-batches differ", dtype_name(dt));
    gpt2_acts_free(&A);
    gpt2_acts_free(&B);
    gpt2_free(&seq), gpt2_free(&par);
    free(xa), free(ya), free(xb), free(yb);
}
Test(units, two_microbatches_alive_fp32) { two_alive(GPT2_FP32); }
Test(units, two_microbatches_alive_bf16) { two_alive(GPT2_BF16); }

// m = 3 accumulated micro-batches of b = 2 sequences with dloss = 1/(m*b*T) == one batch of
// m*b = 6 sequences with dloss = 1/(6T). Not bit-exact: each weight gradient is the same sum of
// 6T products, grouped per micro-batch (3 GEMMs adding into dw) instead of per CPU chunk; fp32
// reassociation over ~300 terms stays within ~1e-6 of the largest term, so: every gradient
// within 1e-5 of its tensor's largest |gradient|, the mean loss within 1e-6 relative.
// Seen to fail: dloss = 1/(b*T) (not divided by m: every gradient 3x too large).
Test(units, accumulated_microbatches_equal_one_batch) {
    GPT2Config c = cfg3();
    int m = 3, b = 2, BT = m * b * c.T;
    int *x = malloc((size_t)BT * sizeof(int)), *y = malloc((size_t)BT * sizeof(int));
    tokens(x, (size_t)BT, c.V);
    tokens(y, (size_t)BT, c.V);
    GPT2 one, acc;
    build(&one, GPT2_FP32, 0, c.L);
    build(&acc, GPT2_FP32, 0, c.L);
    gpt2_alloc_acts(&one, m * b, c.T);
    float loss = gpt2_forward(&one, x, y);
    gpt2_backward(&one, 1.0f / (float)BT);
    GPT2Acts mb[3];
    double loss_acc = 0;
    for (int i = 0; i < m; i++) {  // all forwards first (as a pipeline would), then backwards
        gpt2_acts_alloc(&mb[i], &acc, b, c.T);
        loss_acc += gpt2_forward_acts(&acc, &mb[i], x + (size_t)i * b * c.T, y + (size_t)i * b * c.T) / m;
    }
    for (int i = m - 1; i >= 0; i--) {
        gpt2_backward_acts(&acc, &mb[i], 1.0f / (float)BT);
        gpt2_acts_free(&mb[i]);
    }
    cr_assert(fabs(loss_acc - loss) <= 1e-6 * fabs(loss), "loss %.9g vs one batch %.9g", loss_acc,
              (double)loss);
    for (int i = 0; i < one.nplist; i++) {
        const GPT2Param *p = &one.plist[i];
        double gmax = 0, worst = 0;
        for (size_t j = 0; j < p->size; j++) {
            gmax = fmax(gmax, fabs(one.grads[p->offset + j]));
            worst = fmax(worst, fabs(one.grads[p->offset + j] - acc.grads[p->offset + j]));
        }
        cr_assert(worst <= 1e-5 * gmax, "%s: accumulated gradient off by %.3g (largest %.3g)",
                  p->name, worst, gmax);
    }
    gpt2_free(&one), gpt2_free(&acc);
    free(x), free(y);
}

// Every byte of an activation set is MEM_ACTS and is released by gpt2_acts_free; the default
// set's bytes are exactly the formula of chapter 00 (tests/test_00_train.c checks that against
// the calculator); the split storage is 10*B*T*C floats per block held.
// Seen to fail: gpt2_acts_free not freeing wsave (MEM_ACTS not back to where it was).
Test(units, activation_memory_is_tagged_and_freed) {
    GPT2Config c = cfg3();
    GPT2 m;
    build(&m, GPT2_FP32, 0, c.L);
    size_t before = mem_current(MEM_ACTS);
    GPT2Acts a;
    gpt2_acts_alloc(&a, &m, 2, c.T);
    size_t sizes[GPT2_NUM_ACTS], dsizes[GPT2_NUM_ACTS], want = 0;
    gpt2_act_sizes(&c, 2, c.T, sizes);
    gpt2_dact_sizes(&c, 2, c.T, dsizes);
    for (int i = 0; i < GPT2_NUM_ACTS; i++) want += (sizes[i] + dsizes[i]) * sizeof(float);
    cr_assert_eq(mem_current(MEM_ACTS) - before, want);
    gpt2_acts_alloc_split(&a, &m);
    size_t split = (size_t)c.L * 10 * 2 * c.T * c.C * sizeof(float);
    cr_assert_eq(mem_current(MEM_ACTS) - before, want + split);
    gpt2_acts_free(&a);
    cr_assert_eq(mem_current(MEM_ACTS), before);
    gpt2_free(&m);
}

// ---- split backward ----------------------------------------------------------------------------

// Per block, B (input gradient) then W (weight gradients) later, even after all other blocks'
// B, == gpt2_block_backward: every gradient and the gradient of the model's input, bit-exact.
// Seen to fail: W computing the ln2 weight gradient from d.residual2 instead of d.ln2; B
// writing d.fch into the shared scratch (W of an earlier block then reads a later block's).
static void split_equals_full(GPT2Dtype dt) {
    GPT2Config c = cfg3();
    int BT = BATCH * c.T;
    int *x = malloc((size_t)BT * sizeof(int)), *y = malloc((size_t)BT * sizeof(int));
    tokens(x, (size_t)BT, c.V);
    tokens(y, (size_t)BT, c.V);
    GPT2 full, split;
    build(&full, dt, 0, c.L);
    build(&split, dt, 0, c.L);
    gpt2_alloc_acts(&full, BATCH, c.T);
    gpt2_forward(&full, x, y);
    gpt2_backward(&full, 1.0f / (float)BT);
    GPT2Acts a;
    gpt2_acts_alloc(&a, &split, BATCH, c.T);
    gpt2_acts_alloc_split(&a, &split);
    gpt2_forward_acts(&split, &a, x, y);
    gpt2_head_backward_w(&split, &a, 1.0f / (float)BT, NULL, NULL, NULL, NULL);
    for (int l = c.L - 1; l >= 0; l--) gpt2_block_backward_input(&split, &a, l, NULL);
    // the gradient of the embedding's output is complete before any W ran
    cr_assert(memcmp(a.da.encoded, full.act.da.encoded, (size_t)BT * c.C * sizeof(float)) == 0,
              "%s: input gradient after B differs", dtype_name(dt));
    gpt2_embed_backward_w(&split, &a, NULL);
    for (int l = 0; l < c.L; l++) gpt2_block_backward_weights(&split, &a, l, NULL);  // any order
    cr_assert(memcmp(train_grads(&split), train_grads(&full), split.num_params * esz(dt)) == 0,
              "%s: B then W gradients differ from the full backward", dtype_name(dt));
    gpt2_acts_free(&a);
    gpt2_free(&full), gpt2_free(&split);
    free(x), free(y);
}
Test(units, split_backward_equals_full_fp32) { split_equals_full(GPT2_FP32); }
Test(units, split_backward_equals_full_bf16) { split_equals_full(GPT2_BF16); }
