// test_tp.c: the tensor-parallel pieces (common/tp.h). The equivalence with the full model, the
// all-reduce counts and the mutants run in tests/mpi_tp.c (see its header); this file launches
// it on 4 ranks (tp = 4 on the world, tp = 2 on each half) and on 2 (tp = 2, and tp = 1 alone),
// and checks the pieces that need no MPI.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tp.h"

static void mpi_tp_passes(int np, const char *what) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tests/mpi_tp %s", harness_build_dir(), what);
    int rc = harness_mpirun(np, cmd, &out, 240);
    int checks = -1, failed = -1, ranks = -1;
    // the summary line ("mpi_tp: <what> on N ranks: C checks, F failed"), wherever it lands
    // among the ranks' lines (another rank may still be printing after it)
    for (const char *line = out ? strstr(out, "mpi_tp: ") : NULL; line && ranks < 0;
         line = strstr(line + 1, "mpi_tp: ")) {
        const char *eol = strchr(line, '\n'), *on = strstr(line, " on ");
        if (on && (!eol || on < eol) &&
            sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed) != 3)
            ranks = checks = failed = -1;
    }
    int ok = rc == 0 && ranks == np && checks > 0 && failed == 0;
    // the whole output on stderr (it can be long); the assertion names the run and shows its end
    if (!ok) fprintf(stderr, "---- mpi_tp %s on %d ranks:\n%s\n----\n", what, np, out ? out : "(no output)");
    size_t len = out ? strlen(out) : 0;
    cr_expect(ok, "mpi_tp %s on %d ranks: exit %d, summary: %d ranks %d checks %d failed; output ends:\n%s", what,
              np, rc, ranks, checks, failed, out ? out + (len > 1500 ? len - 1500 : 0) : "(no output)");
    free(out);
}

Test(tp, equals_the_full_model_on_tp_4_and_2, .timeout = 300) { mpi_tp_passes(4, "equiv"); }
Test(tp, equals_the_full_model_on_tp_2_and_1, .timeout = 300) { mpi_tp_passes(2, "equiv"); }
Test(tp, loss_makes_three_all_reduces_of_BT_floats, .timeout = 300) { mpi_tp_passes(4, "count"); }
Test(tp, each_known_bug_is_caught_on_tp_4_and_2, .timeout = 300) { mpi_tp_passes(4, "mutants"); }

// The vocabulary split, by hand: V = 250 on 4 ranks pads to 252, 63 rows each; rank 3 holds
// rows [189, 252), of which 250 - 189 = 61 are real. On 2 ranks 125 each, no padding.
Test(tp, vocab_is_padded_to_a_multiple_of_tp) {
    TpVocab a = tp_vocab(250, 4, 3);
    cr_expect(a.Vp == 252 && a.Vl == 63 && a.v0 == 189 && a.nvalid == 61,
              "V=250 tp=4 rank 3: Vp %d Vl %d v0 %d nvalid %d, want 252 63 189 61", a.Vp, a.Vl, a.v0, a.nvalid);
    TpVocab b = tp_vocab(250, 4, 0);
    cr_expect(b.v0 == 0 && b.nvalid == 63, "V=250 tp=4 rank 0: v0 %d nvalid %d, want 0 63", b.v0, b.nvalid);
    TpVocab c = tp_vocab(250, 2, 1);
    cr_expect(c.Vp == 250 && c.Vl == 125 && c.v0 == 125 && c.nvalid == 125,
              "V=250 tp=2 rank 1: Vp %d Vl %d v0 %d nvalid %d, want 250 125 125 125", c.Vp, c.Vl, c.v0, c.nvalid);
    TpVocab d = tp_vocab(5, 4, 3);  // 8 rows: rank 3 holds [6, 8), none of them real
    cr_expect(d.Vp == 8 && d.v0 == 6 && d.nvalid == 0, "V=5 tp=4 rank 3: Vp %d v0 %d nvalid %d, want 8 6 0",
              d.Vp, d.v0, d.nvalid);
}

// A shard's tensor sizes, by hand for C = 32, tp = 4 (Cl = 8, Hl = 32).
Test(tp, shard_sizes) {
    size_t s[TP_BLOCK_TENSORS], want[TP_BLOCK_TENSORS] = {32, 32, 24 * 32, 24, 32 * 8, 32, 32, 32, 32 * 32, 32, 32 * 32, 32};
    tp_block_sizes(32, 4, s);
    for (int i = 0; i < TP_BLOCK_TENSORS; i++) cr_expect(s[i] == want[i], "tensor %d: %zu, want %zu", i, s[i], want[i]);
    // tp = 1: a full block unit, 12C² + 13C
    cr_expect(tp_block_count(32, 1) == 12 * 32 * 32 + 13 * 32, "full block: %zu", tp_block_count(32, 1));
}

static void check_tp3(void *arg) {
    (void)arg;
    GPT2Config cfg = gpt2_config_tiny();  // NH = 4
    tp_check_config(&cfg, 3);
}
// Bad input: 3 ranks cannot split 4 heads; the message names the valid degrees.
Test(tp, a_degree_that_does_not_divide_the_heads_is_refused) {
    const char *msg = harness_expect_fail(check_tp3, NULL);
    cr_assert(msg != NULL, "tp_check_config accepted tp=3 for 4 heads");
    cr_expect(harness_contains(msg, "tensor-parallel degree 3") && harness_contains(msg, "1, 2, 4"),
              "message does not name the problem and the valid degrees: %s", msg);
}

// The shards of the tp ranks partition a full block: unsharding all of them into a buffer of
// NaNs rebuilds the block bit for bit (every element covered, none twice with another value),
// and tp = 1 is the identity. (Seen failing: rank r's column slice of attprojw / fcprojw
// starting at r·(w-1) instead of r·w left NaN holes.)
Test(tp, shards_of_all_ranks_rebuild_the_full_block) {
    const int C = 32;
    size_t n = tp_block_count(C, 1);
    float *full = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) full[i] = (float)i * 0.5f - 7.0f;  // every element distinct
    TpBlock vf, vb;
    tp_block_views(&vf, full, C, 1);
    tp_block_views(&vb, back, C, 1);
    int tps[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int tp = tps[k];
        for (size_t i = 0; i < n; i++) back[i] = NAN;
        size_t ns = tp_block_count(C, tp);
        float *shard = malloc(ns * sizeof(float));
        TpBlock vs;
        tp_block_views(&vs, shard, C, tp);
        for (int r = 0; r < tp; r++) {
            tp_block_shard(&vs, &vf, C, tp, r);
            tp_block_unshard(&vb, &vs, C, tp, r, r == tp - 1);
        }
        cr_expect(memcmp(full, back, n * sizeof(float)) == 0, "tp=%d: the shards do not rebuild the block", tp);
        free(shard);
    }
    free(full), free(back);
}

// A TP slice is a GPT2 (gpt2_build_tp): t = 1 is gpt2_build_stage (the same units, parameters
// and initial weights, bit for bit); for t = 2 and 4, on a first, a middle and a last stage,
// every rank's units hold exactly tp.c's slices of the full model's initial weights (wte's
// rows, wpe, each block's shard, lnfw lnfb; the last stage's tied copy too), and the slices
// of the sliced tensors are marked. Seen failing: a unit's global offset taken from the
// slice's own sizes (the head's init read from the wrong place: lnfw 0 instead of 1).
Test(tp, a_slice_is_a_gpt2_of_the_slice_widths) {
    const GPT2Config cfg = {.V = 61, .T = 8, .L = 3, .C = 32, .NH = 4};
    const int cuts[3][2] = {{0, 3}, {0, 1}, {1, 3}};
    GPT2 full, one, sl;
    gpt2_build(&full, cfg, DEV_CPU);
    gpt2_init_params(&full, 7);
    for (int c = 0; c < 3; c++) {
        const int l0 = cuts[c][0], l1 = cuts[c][1];
        GPT2 st;
        gpt2_build_stage(&st, cfg, DEV_CPU, GPT2_FP32, l0, l1);
        gpt2_init_params(&st, 7);
        gpt2_build_tp(&one, cfg, DEV_CPU, GPT2_FP32, l0, l1, 1, 0);
        gpt2_init_params(&one, 7);
        cr_expect(one.num_params == st.num_params && one.nplist == st.nplist && one.nunits == st.nunits &&
                  memcmp(one.units, st.units, (size_t)st.nunits * sizeof(GPT2Unit)) == 0 &&
                  memcmp(one.params, st.params, st.num_params * sizeof(float)) == 0,
                  "[%d, %d): t = 1 is not gpt2_build_stage", l0, l1);
        gpt2_free(&one), gpt2_free(&st);
        for (int tp = 2; tp <= 4; tp *= 2)
            for (int r = 0; r < tp; r++) {
                gpt2_build_tp(&sl, cfg, DEV_CPU, GPT2_FP32, l0, l1, tp, r);
                gpt2_init_params(&sl, 7);
                const TpVocab tv = tp_vocab(cfg.V, tp, r);
                const size_t C = (size_t)cfg.C, wl = (size_t)tv.Vl * C;
                float *want = calloc(sl.num_params, sizeof(float));
                for (int u = 0; u < sl.nunits; u++) {
                    const GPT2Unit *un = &sl.units[u];
                    float *at = want + un->offset;
                    if (un->kind == GPT2_UNIT_BLOCK) {
                        TpBlock fb, sb;
                        tp_block_of_model(&fb, &cfg, full.params, un->layer);
                        tp_block_views(&sb, at, cfg.C, tp);
                        tp_block_shard(&sb, &fb, cfg.C, tp, r);
                        cr_expect_eq(un->size, tp_block_count(cfg.C, tp));
                    } else if (un->kind == GPT2_UNIT_HEAD) {
                        memcpy(at, full.params + full.units[cfg.L + 1].offset, 2 * C * sizeof(float));
                    } else {  // EMBED, TIED_WTE: wte's rows (then wpe)
                        tp_wte_shard(at, full.params, &tv, cfg.C);
                        if (un->kind == GPT2_UNIT_EMBED)
                            memcpy(at + wl, full.params + (size_t)cfg.V * C, (size_t)cfg.T * C * sizeof(float));
                    }
                }
                cr_expect(memcmp(want, sl.params, sl.num_params * sizeof(float)) == 0,
                          "[%d, %d) slice %d of %d: the initial weights are not tp.c's slices", l0, l1, r, tp);
                int sliced = 0;
                for (int i = 0; i < sl.nplist; i++) sliced += sl.plist[i].sliced;
                cr_expect_eq(sliced, 6 * (l1 - l0) + (l0 == 0) + (l1 == cfg.L && l0 > 0),
                             "[%d, %d): %d sliced tensors", l0, l1, sliced);
                free(want);
                gpt2_free(&sl);
            }
    }
    gpt2_free(&full);
}

// ---- tp_model: the whole model and pipeline stages are one mechanism ----------------------------
//
// One rank (tp 1, tp_comm_single): a model cut into two TpStages, blocks [0, 1) and [1, 3), the
// first's output handed to the second's input and the second's input gradient back, must
// compute exactly what the stage of every block (chapter 07's model) computes (the same pieces, kernels and rounding points):
// the same loss and the same gradients bit for bit (wte aside: the model adds the head's and
// the embedding's parts into one buffer, the stages keep one part each), in fp32 and in bf16.
// In bf16 that checks that a stage's output is the stored, rounded value (what the model's next
// block reads). And the activation bytes a stage reports are the bytes it allocates. Seen
// failing: tpm_stage_output returning the working set's unrounded fp32 output in bf16 (by hand:
// "bf16: loss 4.16345072 (model) vs 4.16349554 (stages)", and every gradient of stage 0). The
// whole model's activation bytes are checked the same way, with and without SP.
#include "mem.h"
#include "tp_model.h"

static GPT2Config small_cfg(void) {
    GPT2Config c = {.V = 64, .T = 8, .L = 3, .C = 32, .NH = 4};
    return c;
}

// The gradient of tensor i of s's list, as fp32 on the host (n of them).
static void grad_of(const TpStage *st, int i, float *out) {
    const size_t esz = st->dtype == GPT2_BF16 ? 2 : 4;
    tpm_to_host_f32(out, (const char *)tpm_stage_grad_buf(st) + st->plist[i].offset * esz,
                    st->plist[i].size, tpm_stage_dist_dtype(st));
}

// Builds st and allocates x, expecting tpm_stage_act_bytes to be what acts_alloc allocated.
static void build_counted(TpStage *st, TpStageActs *x, GPT2Config cfg, int l0, int l1, int B, TpOpts o) {
    tpm_stage_build_opts(st, cfg, 1, 0, l0, l1, B, cfg.T, 42, o);
    size_t before = mem_current(MEM_ACTS);
    tpm_stage_acts_alloc(x, st);
    cr_expect_eq(mem_current(MEM_ACTS) - before, tpm_stage_act_bytes(st), "%s [%d, %d)%s: acts_alloc "
                 "allocated %zu B, tpm_stage_act_bytes says %zu", o.dtype == GPT2_BF16 ? "bf16" : "fp32",
                 l0, l1, o.sp ? " SP" : "", mem_current(MEM_ACTS) - before, tpm_stage_act_bytes(st));
}

Test(tp_model, two_stages_compute_what_the_whole_model_computes) {
    const GPT2Config cfg = small_cfg();
    const int B = 2, T = cfg.T, N = B * T;
    int in[16], tg[16];
    for (int i = 0; i < N; i++) in[i] = (i * 7 + 3) % cfg.V, tg[i] = (i * 5 + 1) % cfg.V;
    for (int d = 0; d < 2; d++) {
        const TpOpts o = {.dev = DEV_CPU, .dtype = d ? GPT2_BF16 : GPT2_FP32, .sp = 0};
        const char *dt = d ? "bf16" : "fp32";
        TpComm c = tp_comm_single();
        TpStage m, st[2];
        TpStageActs mx, x[2];
        build_counted(&m, &mx, cfg, 0, cfg.L, B, o);
        tpm_stage_zero_grad(&m);
        float lm = tpm_stage_forward(&m, &c, &mx, in, tg);
        tpm_stage_backward(&m, &c, &mx, in, tg, 1.0f / N);

        const int cut[3] = {0, 1, cfg.L};
        for (int s = 0; s < 2; s++) {
            build_counted(&st[s], &x[s], cfg, cut[s], cut[s + 1], B, o);
            tpm_stage_zero_grad(&st[s]);
        }
        tpm_stage_forward(&st[0], &c, &x[0], in, NULL);
        memcpy(x[1].in, tpm_stage_output(&st[0], &x[0]), (size_t)N * cfg.C * sizeof(float));
        float ls = tpm_stage_forward(&st[1], &c, &x[1], NULL, tg);
        tpm_stage_backward(&st[1], &c, &x[1], NULL, tg, 1.0f / N);
        memcpy(x[0].dx, x[1].dx, (size_t)N * cfg.C * sizeof(float));
        tpm_stage_backward(&st[0], &c, &x[0], in, NULL, 1.0f / N);
        cr_expect(memcmp(&lm, &ls, sizeof lm) == 0, "%s: loss %.9g (model) vs %.9g (stages)", dt, lm, ls);

        // every tensor of the model but wte, found by name in the stage that holds it
        float *a = malloc(tp_block_count(cfg.C, 1) * sizeof(float)), *b = malloc(tp_block_count(cfg.C, 1) * sizeof(float));
        int compared = 0;
        for (int i = 1; i < m.nplist; i++)
            for (int s = 0; s < 2; s++)
                for (int j = 0; j < st[s].nplist; j++) {
                    if (strcmp(st[s].plist[j].name, m.plist[i].name) != 0) continue;
                    grad_of(&m, i, a);
                    grad_of(&st[s], j, b);
                    cr_expect(memcmp(a, b, m.plist[i].size * sizeof(float)) == 0,
                              "%s: the gradient of %s differs between the model and stage %d", dt,
                              m.plist[i].name, s);
                    compared++;
                }
        cr_expect_eq(compared, m.nplist - 1, "%s: compared %d tensors of %d", dt, compared, m.nplist - 1);
        free(a), free(b);
        for (int s = 0; s < 2; s++) tpm_stage_acts_free(&x[s], &st[s]), tpm_stage_free(&st[s]);
        tpm_stage_acts_free(&mx, &m), tpm_stage_free(&m);
        TpOpts sp = o;  // the SP model's sets (tp 1: its one rank's positions are all of them)
        sp.sp = 1;
        build_counted(&m, &mx, cfg, 0, cfg.L, B, sp);
        tpm_stage_acts_free(&mx, &m), tpm_stage_free(&m);
    }
}

// ZeRO-1's pieces (chapter 09): a stage whose optimizer state (TpOpt) is the piece [lo, hi)
// only, stepped on its gradient piece, updates exactly those elements as the whole stage's step
// does: two stages holding [0, k) and [k, n) give, together, the weights the unsharded step
// gives, bit for bit, in fp32 and in bf16 (master and bf16 weights). Seen failing: the bf16 master indexed from lo
// instead of lo - opt_lo in the old tpm_stage_adamw_range (by hand: the piece's master written
// out of its bounds, the test crashes with "malloc(): invalid size").
Test(tp_model, zero1_pieces_of_the_optimizer_step_are_the_whole_step) {
    const GPT2Config cfg = small_cfg();
    const int B = 2, T = cfg.T, N = B * T;
    int in[16], tg[16];
    for (int i = 0; i < N; i++) in[i] = (i * 3 + 1) % cfg.V, tg[i] = (i * 11 + 2) % cfg.V;
    const AdamW h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                     .grad_clip = 0.0f, .warmup_steps = 0, .total_steps = 10, .min_lr_frac = 0.1f};
    for (int d = 0; d < 2; d++) {
        const TpOpts o = {.dev = DEV_CPU, .dtype = d ? GPT2_BF16 : GPT2_FP32, .sp = 0};
        TpComm c = tp_comm_single();
        TpStage st[3];  // the whole, [0, k), [k, n)
        TpOpt os[3];
        size_t k = 0;
        for (int s = 0; s < 3; s++) {
            TpStageActs x;
            tpm_stage_build_opts(&st[s], cfg, 1, 0, 0, cfg.L, B, T, 5, o);
            tpm_stage_acts_alloc(&x, &st[s]);
            tpm_stage_zero_grad(&st[s]);
            tpm_stage_forward(&st[s], &c, &x, in, tg);
            tpm_stage_backward(&st[s], &c, &x, in, tg, 1.0f / N);
            tpm_stage_acts_free(&x, &st[s]);
            k = st[s].n / 3;  // (a cut inside a tensor)
            const size_t lo = s == 2 ? k : 0, hi = s == 1 ? k : st[s].n;
            const size_t esz = d ? 2 : 4;
            const char *g = (const char *)tpm_stage_grad_buf(&st[s]) + lo * esz;
            tpm_opt_alloc(&os[s], &st[s], 5, lo, hi);
            tpm_stage_adamw(&st[s], &h, 0, &os[s], g, 1.0f);
        }
        const size_t n = st[0].n;
        float *whole = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        // the weights the forward reads: fp32 params, or params_bf16 widened
        DistDtype t = tpm_stage_dist_dtype(&st[0]);
        const void *w0 = d ? (const void *)st[0].params_bf16 : (const void *)st[0].params;
        tpm_to_host_f32(whole, w0, n, t);
        for (int s = 1; s < 3; s++) {
            const size_t lo = s == 2 ? k : 0, hi = s == 1 ? k : n, esz = d ? 2 : 4;
            const char *w = d ? (const char *)st[s].params_bf16 : (const char *)st[s].params;
            tpm_to_host_f32(got + lo, w + lo * esz, hi - lo, t);
            if (d)  // and the master piece: the whole step's master there
                cr_expect(memcmp(os[s].master, os[0].master + lo, (hi - lo) * sizeof(float)) == 0,
                          "bf16: the master of piece %d differs from the whole step's", s);
        }
        cr_expect(memcmp(whole, got, n * sizeof(float)) == 0, "%s: the pieces' step differs from the whole step",
                  d ? "bf16" : "fp32");
        free(whole), free(got);
        for (int s = 0; s < 3; s++) tpm_opt_free(&os[s], &st[s]), tpm_stage_free(&st[s]);
    }
}
