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
    const char *line = out ? strstr(out, "mpi_tp: ") : NULL;
    while (line && strstr(line + 1, "mpi_tp: ")) line = strstr(line + 1, "mpi_tp: ");  // the summary is last
    const char *on = line ? strstr(line, " on ") : NULL;
    if (on) sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
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
