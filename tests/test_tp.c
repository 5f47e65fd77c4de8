// test_tp.c: the tensor-parallel pieces (common/tp.h). The equivalence with the full model, the
// all-reduce counts and the mutants run in tests/mpi_tp.c (see its header); this file launches
// it on 4 ranks (tp = 4 on the world, tp = 2 on each half) and on 2 (tp = 2, and tp = 1 alone),
// and checks what needs no MPI: the layout's slices, a slice's memory, its optimizer's pieces.
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
Test(tp, two_stages_compute_what_the_whole_slice_computes_on_tp_4_2_1, .timeout = 300) {
    mpi_tp_passes(4, "stages");
    mpi_tp_passes(2, "stages");
}

// The split backward (ZB-H1's B and W on a TP slice, tp.h): B then W gives tp_backward's bits,
// fp32 and bf16, with and without SP, B making the same collectives and W none (mpi_tp split).
// Seen failing: "tp=4 fp32 sp=0: the gradient of h.0.fcprojw differs between tp_backward and
// B then W" (B copies the output's gradient for W after overwriting it); the same for sp=1 with
// W's fcproj gradient from the rank's rows only.
// Mutant: mutants/tp-zb-dout-after-b.patch
// Mutant: mutants/tp-zb-sp-w-local-dout.patch
Test(tp, the_split_backward_is_the_backward_bit_for_bit_on_tp_4_2_1, .timeout = 300) {
    mpi_tp_passes(4, "split");
    mpi_tp_passes(2, "split");
}

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
    size_t s[GPT2_BLOCK_TENSORS], want[GPT2_BLOCK_TENSORS] = {32, 32, 24 * 32, 24, 32 * 8, 32, 32, 32, 32 * 32, 32, 32 * 32, 32};
    tp_block_sizes(32, 4, s);
    for (int i = 0; i < GPT2_BLOCK_TENSORS; i++) cr_expect(s[i] == want[i], "tensor %d: %zu, want %zu", i, s[i], want[i]);
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
    GPT2BlockWeights vf = tp_block_views(full, C, 1), vb = tp_block_views(back, C, 1);
    int tps[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int tp = tps[k];
        for (size_t i = 0; i < n; i++) back[i] = NAN;
        size_t ns = tp_block_count(C, tp);
        float *shard = malloc(ns * sizeof(float));
        GPT2BlockWeights vs = tp_block_views(shard, C, tp);
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
// every rank's units hold exactly gpt2_layout.h's slices of the full model's initial weights
// (wte's rows, wpe, each block's shard, lnfw lnfb; the last stage's tied copy too), and the
// slices of the sliced tensors are marked. Seen failing: a unit's global offset taken from the
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
                        GPT2BlockWeights fb = gpt2_full_block(&cfg, full.params, un->layer);
                        GPT2BlockWeights sb = tp_block_views(at, cfg.C, tp);
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
                          "[%d, %d) slice %d of %d: the initial weights are not the layout's slices", l0, l1, r, tp);
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

// ---- a slice's sets and its optimizer state: no communication needed ------------------------------

#include "mem.h"
#include "optim.h"
#include "zero.h"

static GPT2Config small_cfg(void) {
    GPT2Config c = {.V = 64, .T = 8, .L = 3, .C = 32, .NH = 4};
    return c;
}

// What a slice's set and its model's shared buffers allocate (MEM_ACTS, measured) is what
// tp_acts_bytes and tp_shared_bytes (mem_predict's figures, from the shape alone) say: slice 1
// of 2, fp32 and bf16, with and without SP, the whole model and a first and a last stage (the
// stage without the head has no head's tensors). Seen failing (by hand: the stream's gradient
// left out of tp_acts_bytes): "fp32 [0, 3) t=2: ... a set allocated 93312 B (formula 91264)".
Test(tp, a_slice_allocates_what_its_formulas_say) {
    const GPT2Config cfg = small_cfg();
    const int cuts[3][2] = {{0, 3}, {0, 1}, {1, 3}};
    for (int d = 0; d < 2; d++)
        for (int sp = 0; sp < 2; sp++)
            for (int c = 0; c < 3; c++) {
                const GPT2Dtype dt = d ? GPT2_BF16 : GPT2_FP32;
                const TpShape s = {cuts[c][0], cuts[c][1], 2, 1, sp, 2, cfg.T, GPT2_RECOMPUTE_NONE};
                GPT2 m;
                GPT2Acts a;
                size_t before = mem_current(MEM_ACTS);
                tp_build(&m, cfg, DEV_CPU, dt, s, 3);
                size_t shared = mem_current(MEM_ACTS) - before;
                tp_acts_alloc(&a, &m);
                size_t set = mem_current(MEM_ACTS) - before - shared;
                cr_expect(shared == tp_shared_bytes(&cfg, s, dt) && set == tp_acts_bytes(&cfg, s, dt),
                          "%s [%d, %d) t=2%s: the model shares %zu B (formula %zu), a set allocated %zu B "
                          "(formula %zu)", d ? "bf16" : "fp32", s.l0, s.l1, sp ? " SP" : "", shared,
                          tp_shared_bytes(&cfg, s, dt), set, tp_acts_bytes(&cfg, s, dt));
                gpt2_acts_free(&a);
                gpt2_free(&m);
            }
}

// The optimizer state of pieces (09's ZeRO-1 over DP: zero_shard_alloc on a buffer layout of 2
// parts) stepped on their gradient pieces updates exactly those elements as the whole buffer's
// state (07's: one part) does: the two pieces together give the weights the unsharded step
// gives, bit for bit, on a TP slice in fp32 and in bf16 (the master pieces too: each the whole
// master's piece, starting from the slice's own init). Seen failing (with the optimizer state
// this one replaced): the bf16 master indexed from lo instead of lo - opt_lo (the piece's
// master written out of its bounds: "malloc(): invalid size").
Test(tp, the_pieces_of_the_optimizer_step_are_the_whole_step) {
    const GPT2Config cfg = small_cfg();
    const AdamW h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                     .grad_clip = 0.0f, .warmup_steps = 0, .total_steps = 10, .min_lr_frac = 0.1f};
    for (int d = 0; d < 2; d++) {
        const GPT2Dtype dt = d ? GPT2_BF16 : GPT2_FP32;
        GPT2 m[3];  // the whole step, piece 0 of 2, piece 1 of 2 (each on its own copy)
        ZeroLayout z[3];
        ZeroShard b[3];
        for (int s = 0; s < 3; s++) {
            tp_build(&m[s], cfg, DEV_CPU, dt, (TpShape){0, cfg.L, 2, 1, 0, 2, cfg.T, GPT2_RECOMPUTE_NONE}, 5);
            for (size_t i = 0; i < m[s].num_params; i++) {  // a gradient with no structure
                float g = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
                if (d) m[s].grads_bf16[i] = bf16_from_f32(g);
                else m[s].grads[i] = g;
            }
            zero_layout_init_buffer(&z[s], m[s].num_params, s ? 2 : 1, s ? s - 1 : 0);
            zero_shard_alloc(&b[s], &z[s], &m[s], 5);
            zero_adamw(&z[s], &b[s], &h, 0, 1.0f);
        }
        const size_t n = m[0].num_params, esz = d ? 2 : 4;
        const char *w0 = d ? (const char *)m[0].params_bf16 : (const char *)m[0].params;
        for (int s = 1; s < 3; s++) {
            const size_t lo = z[s].shard_begin, cnt = z[s].shard_n;
            const char *w = d ? (const char *)m[s].params_bf16 : (const char *)m[s].params;
            cr_expect(memcmp(w + lo * esz, w0 + lo * esz, cnt * esz) == 0,
                      "%s: piece %d's step differs from the whole step's", d ? "bf16" : "fp32", s - 1);
            if (d)
                cr_expect(memcmp(b[s].master, b[0].master + lo, cnt * sizeof(float)) == 0,
                          "bf16: the master of piece %d differs from the whole step's", s - 1);
        }
        cr_expect(z[1].shard_n + z[2].shard_n == n && z[1].shard_n > 0 && z[2].shard_n > 0, "the pieces cover the buffer");
        for (int s = 0; s < 3; s++) zero_shard_free(&b[s]), zero_layout_free(&z[s]), gpt2_free(&m[s]);
    }
}
