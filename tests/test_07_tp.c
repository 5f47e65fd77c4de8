// test_07_tp.c: chapter 07 (tensor parallelism) against single-device training.
//
// The oracle is chapter 00's single-device run (./00_memory_budget/run --train) with the same
// flags: same init (--seed), same data, same AdamW and clipping. A TP run must give the same
// per-step losses and, gathered back from the shards, the same final weights, for tp = 1, 2, 4,
// for a vocabulary tp does not divide (V = 250 on tp = 4, padded to 252; V = 251 on tp = 2,
// padded to 252) and with TP groups that are data-parallel replicas (4 ranks, --tp 2).
//
// Tolerances. With tp > 1 a row-parallel matmul adds t partial dot products of C/t (or 4C/t)
// terms, and the all-reduce adds them in another order than one long dot product; the loss's
// max / sum of exp / target logit are computed per vocabulary slice, then reduced; the clip
// norm is summed tensor by tensor. Measured over 6 steps of SMALL (printed on stderr by every
// run): losses within 8.6e-8 relative (0 in most runs), weights within 2.1e-6 absolute (tp 2:
// 1.5e-6, tp 4: 1.4e-6, V=251 on tp 2: 1.3e-6, V=250 on tp 4: 2.1e-6, 2 groups of tp 2: 1.2e-6).
// The weights move more than the losses because Adam divides by sqrt(v): for an element whose
// gradient is near 0 a rounding difference changes the update by a sizeable fraction of lr.
// The bounds: 1e-6 relative on losses, 2e-5 absolute on weights (10x the worst measured).
// tp = 1 runs gpt2's own pieces (common/tp.h): chapter 00 bit for bit (tp07/tp_1_is_chapter_00).
// Seen failing (each break made by hand in 07_tensor_parallel/, then restored):
//   the clip's norm not summed over the group: default clip: losses 7e-6, weights 4.2e-5 (tp 2),
//     7e-5 (tp 4); the_clip_norm_is_the_full_models (--grad-clip 0.1) fails;
//   the data-parallel gradient average removed: 2 groups of tp 2 differ by 4.1e-3 in the losses;
//   the replicated tensors gathered from every rank: weights off by 1.
// And each mechanism tp.h provides, broken by a mutant (mutants/07-*.patch, applied to a copy of
// the tree by tools/mutants.sh): the positive test that names it must fail with it applied.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2.h"
#include "harness.h"
#include "harness_expect.h"

#define ORACLE "./00_memory_budget/run --train --quiet"
#define TP "./07_tensor_parallel/run --quiet"
#define SMALL "--layers 2 --channels 32 --heads 4 --seq 16 --batch 4 --steps 6"
#define LOSS_RTOL 1e-6f
#define PARAM_ATOL 2e-5f

static void run(const char *prog, int np, const char *flags, RunResults *out) {
    char *log = NULL;
    int rc = harness_run_dump(prog, np, flags, out, &log, 120);
    cr_assert_eq(rc, 0, "%s -np %d %s failed:\n%s", prog, np, flags, log);
    free(log);
}

// Worst loss (relative) and weight (absolute) difference of a from b, printed for the record.
static void diffs(const char *what, const RunResults *a, const RunResults *b, float *dl, float *dp) {
    cr_assert_eq(a->nsteps, b->nsteps, "%s: %d steps vs %d", what, a->nsteps, b->nsteps);
    cr_assert_eq(a->nparams, b->nparams, "%s: %zu parameters vs %zu", what, a->nparams, b->nparams);
    *dl = harness_max_rel_diff(a->losses, b->losses, (size_t)a->nsteps);
    *dp = harness_max_abs_diff(a->params, b->params, a->nparams);
    fprintf(stderr, "test_07: %-44s losses within %.2g (rel), weights within %.2g (abs)\n", what,
            (double)*dl, (double)*dp);
}

// The TP run (flags `model` + `tpflags`) against the oracle o (00 with `model`), within the
// bounds; the replicated tensors the same on every rank.
static void check_against(const RunResults *o, int np, const char *tpflags, const char *model,
                          float loss_rtol, float param_atol) {
    char flags[256], what[256];
    RunResults r;
    snprintf(flags, sizeof flags, "%s %s %s", SMALL, model, tpflags);
    run(TP, np, flags, &r);
    snprintf(what, sizeof what, "-np %d %s %s", np, tpflags, model);
    float dl, dp;
    diffs(what, &r, o, &dl, &dp);
    harness_assert_results_match(what, &r, o, loss_rtol, param_atol);
    // the replicated tensors (LayerNorms, wpe, row-parallel biases) are the same on every rank
    // (measured 0; seen failing: with mutants/07-attn-f.patch, the LayerNorm gradients computed
    // from a partial input gradient, they differ by 7.0e-3 on tp 2)
    cr_assert_eq(results_get(&r, "replicated_max_diff", -1), 0.0,
                 "%s: the replicated tensors differ across the group's ranks by %g", what,
                 results_get(&r, "replicated_max_diff", -1));
    results_free(&r);
}

static void check_equivalent(int np, const char *tpflags, const char *model) {
    char flags[256];
    snprintf(flags, sizeof flags, "%s %s", SMALL, model);
    RunResults o;
    run(ORACLE, 1, flags, &o);
    check_against(&o, np, tpflags, model, LOSS_RTOL, PARAM_ATOL);
    results_free(&o);
}

// Each of these mutants is a real bug of TP implementations, caught here far outside the bounds.
// Measured (6 steps, SMALL), losses / weights:
//   07-attn-f (tp 2)     3.2e-4 / 5.9e-3   f's backward all-reduce at the attention input missing
//   07-mlp-f (tp 4)      4.2e-4 / 5.9e-3   ... at the MLP input
//   07-ce-sumexp (tp 2)  0.13   / 6.7e-3   the softmax normalised by the local vocabulary
//   07-heads (tp 2)      1.7e-3 / 0.12     q, k, v rows of the next rank's heads
// Mutant: mutants/07-attn-f.patch
// Mutant: mutants/07-mlp-f.patch
// Mutant: mutants/07-ce-sumexp.patch
// Mutant: mutants/07-heads.patch
Test(tp07, tp_1_2_4_reproduce_single_device_training, .timeout = 240) {
    check_equivalent(1, "--tp 1", "");
    check_equivalent(2, "--tp 2", "");
    check_equivalent(4, "--tp 4", "");
}

// Sequence parallelism (--sequence-parallel): the same sums on the other side of the same
// wire, so the same tolerance. The embedding's reduce-scatter adds the same terms as its
// all-reduce (bit for bit); the LayerNorms' gradients are sums of t partial column sums (the
// order differs). Measured (6 steps, SMALL): losses 0 (rel), weights 1.6e-6 (tp 2), 1.5e-6 (tp 4,
// V = 250); also 1.6e-6 for 2 groups of tp 2 (-np 4 --tp 2, run by hand: left out of CI for
// time). Under SP every rank computes the LayerNorms' (and the row-parallel biases') gradients
// from its own T/t positions: forgetting their all-reduce (a known Megatron / GPT-NeoX bug) makes
// each rank update its copy with its share only; the copies drift apart (replicated_max_diff)
// and the loss leaves the oracle's. Measured with the mutant (tp 2): losses 4.4e-4 / weights
// 6.2e-3, the replicated copies 7.0e-3 apart.
// Mutant: mutants/07-sp-grads.patch
// --tp 1 is chapter 00's training bit for bit (tp.h: one rank without SP runs gpt2's own
// pieces and sets, and the norm is one sum as 00 takes it): the losses, the final weights and
// the checkpoint (the training state: master, Adam m and v), fp32 and bf16, with clipping at
// every step (--grad-clip 0.1) and without. Seen failing: the t = 1 slice run through the TP
// pieces instead (mutants/tp1-through-tp-pieces.patch: the row-parallel biases added after the
// matmul, the loss per vocabulary slice, the norm per tensor, as before this model was one).
// Mutant: mutants/tp1-through-tp-pieces.patch
static void check_bit_identical(const char *what, const char *flags, int np, const char *prog, const char *oflags) {
    char a[256], b[256], f1[512], f2[512], *log = NULL;
    snprintf(a, sizeof a, "/tmp/test07_bits_a_%d.ckpt", (int)getpid());
    snprintf(b, sizeof b, "/tmp/test07_bits_b_%d.ckpt", (int)getpid());
    snprintf(f1, sizeof f1, "%s --save %s", oflags, a);
    snprintf(f2, sizeof f2, "%s --save %s", flags, b);
    RunResults o, r;
    run(ORACLE, 1, f1, &o);
    run(prog, np, f2, &r);
    cr_assert(o.nsteps == r.nsteps && o.nparams == r.nparams, "%s: the runs differ in shape", what);
    cr_assert(memcmp(o.losses, r.losses, (size_t)o.nsteps * sizeof(float)) == 0,
              "%s: the losses are not chapter 00's bits (worst %g relative)", what,
              (double)harness_max_rel_diff(r.losses, o.losses, (size_t)o.nsteps));
    cr_assert(memcmp(o.params, r.params, o.nparams * sizeof(float)) == 0,
              "%s: the final weights are not chapter 00's bits (worst %g)", what,
              (double)harness_max_abs_diff(r.params, o.params, o.nparams));
    char cmd[640];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    cr_assert_eq(harness_run(cmd, &log, 30), 0, "%s: the checkpoints differ (cmp %s %s)", what, a, b);
    free(log);
    fprintf(stderr, "test_07: %-44s chapter 00's bits (losses, weights, checkpoint)\n", what);
    unlink(a), unlink(b);
    results_free(&o), results_free(&r);
}

Test(tp07, tp_1_is_chapter_00_bit_for_bit, .timeout = 120) {
    static const char *const models[4] = {"", "--grad-clip 0.1", "--dtype bf16", "--dtype bf16 --grad-clip 0.1"};
    for (int i = 0; i < 4; i++) {
        char flags[256], what[128];
        snprintf(flags, sizeof flags, "%s %s", SMALL, models[i]);
        snprintf(what, sizeof what, "--tp 1 %s", models[i]);
        char tpf[320];
        snprintf(tpf, sizeof tpf, "%s --tp 1", flags);
        check_bit_identical(what, tpf, 1, TP, flags);
    }
}

Test(tp07, sequence_parallel_tp_2_4_reproduce_single_device_training, .timeout = 180) {
    check_equivalent(2, "--tp 2 --sequence-parallel", "");
    check_equivalent(4, "--tp 4 --sequence-parallel", "--vocab 250");  // and a padded vocabulary
}

Test(tp07, a_vocabulary_tp_does_not_divide_is_padded, .timeout = 180) {
    check_equivalent(2, "--tp 2", "--vocab 251");  // padded to 252: 126 rows per rank
    check_equivalent(4, "--tp 4", "--vocab 250");  // padded to 252: 63 rows per rank
}

// Clipping must see the norm of the FULL gradient: the slices' squares summed over the group,
// the replicated tensors' counted once. With --grad-clip 0.1 every step clips.
Test(tp07, the_clip_norm_is_the_full_models, .timeout = 120) {
    check_equivalent(4, "--tp 4", "--grad-clip 0.1");
}

Test(tp07, tp_groups_as_data_parallel_replicas, .timeout = 180) {
    check_equivalent(4, "--tp 2", "");  // 2 TP groups of 2, each half of the batch
}

// ---- bf16 mixed precision (--dtype bf16) -------------------------------------------------------
//
// Against chapter 00's --train --dtype bf16: the same storage (bf16 weights, gradients and
// stored block activations, fp32 master and Adam m, v) and the same rounding points (each piece
// widened, computed in fp32, its gradients rounded once after its backward; each block's saved
// set rounded when it is stored, the next piece reading the rounded output). What differs is
// what differs in fp32 (the order of the partial sums of the row-parallel matmuls, the loss's
// per-slice statistics, the norm tensor by tensor; SP: the LayerNorms' partial gradients summed
// over the group, in fp32, and rounded once more), but now each difference can move a stored
// value across a bf16 rounding boundary: one bf16 step, 2^-8 relative. A weight next to a
// boundary then lands one bf16 step away: 2^-8 = 3.9e-3 in [0.5, 1), 2^-7 = 7.8e-3 in [1, 2)
// (the LayerNorm gains), as in 03's bf16 runs. With tp < world the gradients are averaged in
// bf16 (like 03), which rounds again. Measured (6 steps, SMALL), losses (rel) / weights (abs):
//   tp 1: 0 / 0 (00's bits)  tp 2: 1.6e-6 / 6.1e-5   tp 4: 1.9e-6 / 6.1e-5   tp 2 V=250: 1.4e-6 / 2.4e-4
//   SP tp 2: 4.3e-6 / 2.4e-4   SP tp 4: 3.9e-6 / 2.4e-4   SP tp 2 V=250: 7.0e-6 / 9.9e-4
//   2 groups of tp 2 (bf16 gradient average): 8.5e-6 / 1.0e-3; with SP, V=250: 1.8e-5 / 1.3e-3
// Bounds (03's): losses 1e-4 relative (5x the worst), weights 8e-3 absolute (one bf16 step at
// 1.0). An fp32 run against the bf16 oracle: 2.7e-5 / 3.6e-3, inside those bounds; so tp 1, which
// is 00's own run, gets a bound of 0 (a run skipping the bf16 roundings fails it), and the memory
// test below checks the storage at tp 2.
// The mechanisms broken must be seen within the bf16 bounds too: the SP all-reduce of the
// LayerNorms' partial gradients forgotten (measured 6 steps, tp 2: losses 4.2e-4 relative, 4x
// the bound, the replicated copies 7.0e-3 apart) and f's backward all-reduce at the attention
// input (3.1e-4).
#define BF16 "--dtype bf16"
#define BF16_LOSS_RTOL 1e-4f
#define BF16_PARAM_ATOL 8e-3f

// tp 1, 2, 4 and tp 2 with V = 250 (padded to 252), without and with SP: one oracle per model.
// Mutant: mutants/07-sp-grads.patch
// Mutant: mutants/07-attn-f.patch
Test(tp07, bf16_tp_1_2_4_reproduce_single_device_bf16_training, .timeout = 240) {
    static const char *const models[2] = {BF16, BF16 " --vocab 250"};
    for (int i = 0; i < 2; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, "%s %s", SMALL, models[i]);
        RunResults o;
        run(ORACLE, 1, flags, &o);
        static const int tps[2][3] = {{1, 2, 4}, {2, 0, 0}};
        for (int j = 0; j < 3 && tps[i][j]; j++)
            for (int sp = 0; sp < 2; sp++) {
                const int t = tps[i][j];
                if (sp && t == 1) continue;  // (SP on one rank is the plain run)
                char tpf[64];
                snprintf(tpf, sizeof tpf, "--tp %d%s", t, sp ? " --sequence-parallel" : "");
                if (t == 1)  // one rank: 00's own pieces (tp_1_is_chapter_00_bit_for_bit)
                    check_against(&o, 1, tpf, models[i], 0.0f, 0.0f);
                else
                    check_against(&o, t, tpf, models[i], BF16_LOSS_RTOL, BF16_PARAM_ATOL);
            }
        // 2 TP groups of 2: the bf16 gradient average over the data-parallel replicas
        check_against(&o, 4, i == 0 ? "--tp 2" : "--tp 2 --sequence-parallel", models[i],
                      BF16_LOSS_RTOL, BF16_PARAM_ATOL);
        results_free(&o);
    }
}

// bf16 memory from the shapes (the fp32 formulas of the tests below, at the bf16 sizes):
// weights and gradients 2 bytes each, the fp32 master 4, Adam m and v 4 each; activations:
// every block's saved set at 2 bytes per element, plus ONE fp32 working set of a block and the
// widened input of the running piece (N·C, SP: N·C/t); the backward's scratch, the head and the
// embedding's output and d x stay fp32. Seen failing: the stored sets allocated as floats
// (by hand in the TP model: "tp=2 bf16: activations 535552 B, formula 419840").
Test(tp07, bf16_memory_is_two_bytes_per_weight_and_stored_activation, .timeout = 120) {
    const int V = 250, T = 16, C = 32, L = 2, NH = 4, B = 4, tp = 2;
    for (int sp = 0; sp < 2; sp++) {
        char flags[256];
        snprintf(flags, sizeof flags, "--vocab %d --layers %d --channels %d --heads %d --seq %d "
                 "--batch %d --steps 1 --tp %d --dtype bf16%s", V, L, C, NH, T, B, tp,
                 sp ? " --sequence-parallel" : "");
        RunResults r;
        run(TP, tp, flags, &r);
        double Vp = tp * ((V + tp - 1) / tp), c = C;
        double sliced = Vp * c + L * (3 * c * c + 3 * c + c * c + 4 * c * c + 4 * c + 4 * c * c);
        double n = sliced / tp + T * c + 2 * c + L * 6 * c;  // elements on this rank
        const struct { const char *key; double want; } w[] = {
            {"mem_params", 2 * n}, {"mem_grads", 2 * n}, {"mem_master", 4 * n}};
        for (int i = 0; i < 3; i++)
            cr_assert_eq(results_get(&r, w[i].key, -1), w[i].want, "tp=%d bf16%s: %s %g B, formula %g",
                         tp, sp ? " SP" : "", w[i].key, results_get(&r, w[i].key, -1), w[i].want);
        double N = B * T, NC = N * c, att = (double)B * (NH / tp) * T * T, block, rest;
        if (sp) {
            block = 2 * NC + 2 * NC / tp + 4 * N / tp + 12 * NC / tp + 2 * att;
            rest = (3 * NC + 14 * NC / tp + 2 * att) + (2 * NC + NC / tp + 2 * N / tp + 4 * N + 2 * N * Vp / tp) +
                   2 * NC / tp + NC / tp;  // scratch, head, embedding, the widened input
        } else {
            block = 6 * NC + 4 * N + 12 * NC / tp + 2 * att;
            rest = (2 * NC + 12 * NC / tp + 2 * att) + (2 * NC + 6 * N + 2 * N * Vp / tp) + 2 * NC + NC;
        }
        double acts = 2 * L * block + 4 * (block + rest);
        cr_assert_eq(results_get(&r, "mem_acts", -1), acts, "tp=%d bf16%s: activations %g B, formula %g",
                     tp, sp ? " SP" : "", results_get(&r, "mem_acts", -1), acts);
        cr_assert_eq(results_get(&r, "block_acts", -1), 2 * block, "tp=%d bf16%s: a block stores %g B, "
                     "formula %g", tp, sp ? " SP" : "", results_get(&r, "block_acts", -1), 2 * block);
        fprintf(stderr, "test_07: bf16 tp 2%s: weights %g B (2/elem), master %g B (4/elem), activations "
                "%g B == formula\n", sp ? " SP" : "", 2 * n, 4 * n, acts);
        results_free(&r);
    }
}

// ---- communication: calls and bytes per step == the formula --------------------------------------

// The formula, written here from the shapes: per block 2 forward (g) + 2 backward (f)
// all-reduces of B·T·C floats, one for the embedding and one for f at the head's input, three
// of B·T floats in the loss (max, sum of exp, target logit) and none other; each all-reduce of
// S bytes moves 2(t-1)/t·S per rank (dist's ring model, rounded down per call), plus the clip
// norm's all-reduce of one double. Seen failing: the clip's all-reduce of two doubles instead of
// one ("tp=2: 82704 bytes sent per step in the TP group, formula 82696").
//
// Sequence parallel (sp): each all-reduce of N·C becomes a reduce-scatter and an all-gather of
// N·C, each (t-1)/t of its bytes on the wire, made as one call per sequence (B/dp calls of T·C):
// g and f keep their sites for one of the two (g's reduce-scatter forward, f's reduce-scatter
// backward, the embedding's forward, the head's f backward) and the other has its own site
// (attn/mlp f fwd, attn/mlp g bwd, head f fwd, embed bwd); plus one all-reduce of the
// replicated tensors' partial gradients, (6L + 2)·C floats. The total is the all-reduces' +
// that one. Seen failing: tp_seq_reduce_scatter counting this rank's floats instead of the whole
// tensor's ("tp=2 floats_embed: 1024 floats per step, want 2048").
static void check_bytes_sp(int np, int tp, int B, int T, int C, int L, int sp) {
    char flags[256];
    snprintf(flags, sizeof flags, "--layers %d --channels %d --heads 4 --seq %d --batch %d --steps 2 --tp %d%s",
             L, C, T, B, tp, sp ? " --sequence-parallel" : "");
    RunResults r;
    run(TP, np, flags, &r);
    const int dp = np / tp, Bl = B / dp;
    const double N = (double)Bl * T, NC = N * C, s = sp ? 1 : 0, k = sp ? 1 : 2;
    struct { const char *site; double calls, floats, kind; } want[] = {
        {"embed", 1, NC, k},  {"attn_g", L, L * NC, k}, {"mlp_g", L, L * NC, k},   {"attn_f", L, L * NC, k},
        {"mlp_f", L, L * NC, k}, {"ce_max", 1, N, 2}, {"ce_sumexp", 1, N, 2}, {"ce_target", 1, N, 2},
        {"head_f", 1, NC, k}, {"other", 0, 0, 2},
        {"attn_f_fwd", s * L, s * L * NC, 1}, {"mlp_f_fwd", s * L, s * L * NC, 1},
        {"attn_g_bwd", s * L, s * L * NC, 1}, {"mlp_g_bwd", s * L, s * L * NC, 1},
        {"head_f_fwd", s, s * NC, 1}, {"embed_bwd", s, s * NC, 1},
        {"sp_grads", s, s * (6 * L + 2) * C, 2}};
    double bytes = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char k[48];
        snprintf(k, sizeof k, "calls_%s", want[i].site);
        cr_assert_eq(results_get(&r, k, -1), want[i].calls, "tp=%d %s: %g all-reduces per step, want %g",
                     tp, k, results_get(&r, k, -1), want[i].calls);
        snprintf(k, sizeof k, "floats_%s", want[i].site);
        cr_assert_eq(results_get(&r, k, -1), want[i].floats, "tp=%d %s: %g floats per step, want %g",
                     tp, k, results_get(&r, k, -1), want[i].floats);
        if (want[i].calls > 0) {
            unsigned long long S = (unsigned long long)(want[i].floats / want[i].calls) * 4;
            if (want[i].kind == 2) bytes += want[i].calls * (double)(2ull * (tp - 1) * S / tp);
            else bytes += want[i].calls * Bl * (double)((tp - 1) * (S / Bl) / tp);  // per sequence
        }
    }
    bytes += (double)(2ull * (tp - 1) * 8 / tp);
    cr_assert_eq(results_get(&r, "tp_sent_per_step", -1), bytes,
                 "tp=%d: %g bytes sent per step in the TP group, formula %g", tp,
                 results_get(&r, "tp_sent_per_step", -1), bytes);
    cr_assert_eq(results_get(&r, "tp_recv_per_step", -1), bytes, "tp=%d: recv %g, formula %g", tp,
                 results_get(&r, "tp_recv_per_step", -1), bytes);
    results_free(&r);
}
static void check_bytes(int np, int tp, int B, int T, int C, int L) { check_bytes_sp(np, tp, B, T, C, L, 0); }

// Same bytes on the wire: SP's total == the all-reduces' total + the "sp grads" all-reduce,
// each measured (dist's counters), not computed.
Test(tp07, sequence_parallel_bytes_are_the_formula_and_the_all_reduces, .timeout = 120) {
    check_bytes_sp(4, 4, 2, 8, 64, 3, 1);
    check_bytes_sp(4, 2, 4, 8, 32, 1, 1);  // dp x tp
    RunResults a, b;
    const char *f = "--layers 2 --channels 32 --heads 4 --seq 16 --batch 4 --steps 2 --tp 2";
    char g[256];
    snprintf(g, sizeof g, "%s --sequence-parallel", f);
    run(TP, 2, f, &a);
    run(TP, 2, g, &b);
    double extra = 2.0 * 1 * 4 * (6 * 2 + 2) * 32 / 2;  // 2(t-1)/t of (6L + 2)·C floats
    cr_assert_eq(results_get(&b, "tp_sent_per_step", -1), results_get(&a, "tp_sent_per_step", -1) + extra,
                 "SP sends %g bytes per step, the all-reduces %g + the LayerNorm gradients %g",
                 results_get(&b, "tp_sent_per_step", -1), results_get(&a, "tp_sent_per_step", -1), extra);
    results_free(&a);
    results_free(&b);
}

Test(tp07, bytes_per_step_are_the_formula_and_the_loss_makes_three, .timeout = 120) {
    check_bytes(2, 2, 4, 16, 32, 2);
    check_bytes(4, 4, 2, 8, 64, 3);
    check_bytes(4, 2, 4, 8, 32, 1);  // dp x tp: the TP group's traffic only
}

// ---- memory: weights Ψ/t for the sliced tensors + the replicated rest; activations -------------

// The formulas, written here from the shapes (fp32): weights: the sliced tensors (wte padded
// to Vp = t·ceil(V/t) rows, qkvw, qkvb, attprojw, fcw, fcb, fcprojw) over t, the replicated
// ones (wpe, lnf, and per block ln1, ln2, attprojb, fcprojb) whole. Activations (N = B·T):
// per block 6NC + 4N + 12NC/t + 2·B·(NH/t)·T² floats, the backward's scratch
// 2NC + 12NC/t + 2·B·(NH/t)·T², the head 2NC + 6N + 2N·Vp/t, the embedding's output and its
// gradient 2NC. tp = 1 runs gpt2's own sets: chapter 00's activations (calc_activation_bytes_lab's
// list, written here from the shapes: per block 18NC + 4N + 2·B·NH·T² stored, the input, lnf,
// its statistics, the losses, logits and probs 2NC + 3N + 2NV; the gradients of one block's
// tensors 15NC + 2·B·NH·T², of every block's output L·NC, of the input, lnf and the logits
// 2NC + NV). Seen failing: the embedding's output allocated twice as large (when tp 1 ran the
// TP pieces: "tp=1: activations 680448 B, formula 672256").
Test(tp07, memory_per_rank_is_the_formula, .timeout = 120) {
    const int V = 250, T = 16, C = 32, L = 2, NH = 4, B = 4;
    for (int tp = 1; tp <= 4; tp *= 2) {
        char flags[256];
        snprintf(flags, sizeof flags, "--vocab %d --layers %d --channels %d --heads %d --seq %d "
                 "--batch %d --steps 1 --tp %d", V, L, C, NH, T, B, tp);
        RunResults r;
        run(TP, tp, flags, &r);
        double Vp = tp * ((V + tp - 1) / tp), c = C;
        double sliced = Vp * c + L * (3 * c * c + 3 * c + c * c + 4 * c * c + 4 * c + 4 * c * c);
        double replicated = T * c + 2 * c + L * 6 * c;
        double want_w = 4 * (sliced / tp + replicated);
        cr_assert_eq(results_get(&r, "mem_params", -1), want_w, "tp=%d: weights %g B, formula %g",
                     tp, results_get(&r, "mem_params", -1), want_w);
        cr_assert_eq(results_get(&r, "mem_grads", -1), want_w, "tp=%d: gradients %g B, formula %g",
                     tp, results_get(&r, "mem_grads", -1), want_w);
        double N = B * T, NC = N * c, att = (double)B * (NH / tp) * T * T;
        double acts = L * (6 * NC + 4 * N + 12 * NC / tp + 2 * att) + (2 * NC + 12 * NC / tp + 2 * att) +
                      (2 * NC + 6 * N + 2 * N * Vp / tp) + 2 * NC;
        if (tp == 1)
            acts = L * (18 * NC + 4 * N + 2 * att) + (2 * NC + 3 * N + 2 * N * V) +
                   (15 * NC + 2 * att + L * NC + 2 * NC + N * V);
        cr_assert_eq(results_get(&r, "mem_acts", -1), 4 * acts, "tp=%d: activations %g B, formula %g",
                     tp, results_get(&r, "mem_acts", -1), 4 * acts);
        results_free(&r);
    }
}

// Sequence parallel, written from the shapes (N = B·T, t | T): per block ln1, ln2 gathered
// (2NC), residual2 and out on this rank's positions (2NC/t), 4 statistics (4N/t), qkv, atty,
// fch, fch_gelu (12NC/t), preatt, att (2·B·(NH/t)·T²); the scratch 3NC + 14NC/t + 2·B·(NH/t)·T²
// (a gathered gradient, a scattered one, the forward's partial sums, dresidual2 on N/t rows);
// the head 2NC + NC/t + 2N/t + 4N + 2N·Vp/t; the embedding's output and d x 2NC/t. And one
// block against Megatron's sbh(34/t + 5as/(ht)) adjusted to this model (README): fp32, no
// dropout, preatt kept, the LayerNorm outputs kept gathered: sbh(8 + 56/t + 8as/(ht)) + 16sb/t
// bytes, the same figure by another route (the paper's terms, not our allocation), and less
// than without SP: sbh(24 + 48/t + 8as/(ht)) + 16sb. Seen failing: ln1's mean allocated on N
// rows, not N/t (then on tp 2: "tp=2 SP: activations 375296 B, formula 375040").
Test(tp07, sequence_parallel_memory_is_the_formula_and_smaller, .timeout = 120) {
    const int V = 256, T = 16, C = 32, L = 2, NH = 4, B = 4;
    for (int tp = 4; tp <= 4; tp *= 2) {  // (tp 2 measured too, by hand: 375040 B, 90624 B a block)
        char flags[256];
        snprintf(flags, sizeof flags, "--vocab %d --layers %d --channels %d --heads %d --seq %d "
                 "--batch %d --steps 1 --tp %d", V, L, C, NH, T, B, tp);
        RunResults r, q;
        run(TP, tp, flags, &q);
        strcat(flags, " --sequence-parallel");
        run(TP, tp, flags, &r);
        double N = B * T, NC = N * C, att = (double)B * (NH / tp) * T * T, Vp = V;
        double block = 2 * NC + 2 * NC / tp + 4 * N / tp + 12 * NC / tp + 2 * att;
        double acts = L * block + (3 * NC + 14 * NC / tp + 2 * att) +
                      (2 * NC + NC / tp + 2 * N / tp + 4 * N + 2 * N * Vp / tp) + 2 * NC / tp;
        cr_assert_eq(results_get(&r, "mem_acts", -1), 4 * acts, "tp=%d SP: activations %g B, formula %g",
                     tp, results_get(&r, "mem_acts", -1), 4 * acts);
        double sbh = (double)T * B * C, sb = (double)T * B, as_ht = (double)NH * T / ((double)C * tp);
        double paper_sp = sbh * (8 + 56.0 / tp + 8 * as_ht) + 16 * sb / tp;
        double paper = sbh * (24 + 48.0 / tp + 8 * as_ht) + 16 * sb;
        cr_assert_eq(results_get(&r, "block_acts", -1), paper_sp, "tp=%d SP: one block %g B, adjusted "
                     "Megatron formula %g", tp, results_get(&r, "block_acts", -1), paper_sp);
        cr_assert_eq(results_get(&q, "block_acts", -1), paper, "tp=%d: one block %g B, adjusted "
                     "Megatron formula %g", tp, results_get(&q, "block_acts", -1), paper);
        cr_assert(results_get(&r, "mem_acts", -1) < results_get(&q, "mem_acts", -1),
                  "tp=%d: SP activations %g B, not fewer than without SP %g", tp,
                  results_get(&r, "mem_acts", -1), results_get(&q, "mem_acts", -1));
        fprintf(stderr, "test_07: tp=%d activations %g B without SP, %g B with SP (one block %g -> %g)\n",
                tp, results_get(&q, "mem_acts", -1), results_get(&r, "mem_acts", -1),
                results_get(&q, "block_acts", -1), results_get(&r, "block_acts", -1));
        results_free(&q);
        results_free(&r);
    }
}

// ---- bad input: one clear message, every rank exits --------------------------------------------

Test(tp07, bad_tp_is_refused_with_what_would_be_valid, .timeout = 120) {
    harness_assert_refused(3, TP " --tp 3 --steps 1", "valid degrees for NH=4 are 1, 2, 4");
    harness_assert_refused(2, TP " --tp 4 --steps 1", "larger than the 2 ranks");
    harness_assert_refused(3, TP " --tp 2 --steps 1", "does not divide the 3 ranks");
    harness_assert_refused(4, TP " --tp 4 --seq 10 --sequence-parallel --steps 1", "T must be a multiple of 4 (e.g. --seq 12)");
    // SP splits the sequence over the ranks of a TP group: one rank has nothing to split
    harness_assert_refused(1, TP " --tp 1 --sequence-parallel --steps 1", "--tp 1 has one rank", "Use --tp 2 or more");
}

// ---- checkpoints: the full model's state, so any layout resumes any other's ---------------------

// Same layout: resuming at step 3 gives the uninterrupted run's bits (harness_resume_is_exact).
// Across layouts: the state moves exactly (mpi_07_tp ckpt: gather(take(state)) == state, bit for
// bit, tp = 4, 2), so TP 4 resuming chapter 00's step-3 checkpoint, and 00 resuming TP 4's,
// then train as the uninterrupted 00 run within the equivalence tolerance (the steps on the
// other side round differently, not the hand-over). Measured: TP4 from 00's state: losses 0,
// weights 2.1e-7; 00 from TP4's: losses 0, weights 1.4e-6. Seen failing: the shard
// taking wpe from lnfw's offset ("resume: the final weights differ after resuming at step 3").
static void mpi_07_passes(int np, const char *what);
// a (resumed at step `from`) against b (uninterrupted): the losses of the steps a ran, the weights
static void check_resumed(const char *what, const RunResults *a, const RunResults *b, int from) {
    cr_assert(a->nsteps == b->nsteps && a->nparams == b->nparams, "%s: %d steps / %zu weights vs %d / %zu",
              what, a->nsteps, a->nparams, b->nsteps, b->nparams);
    float dl = harness_max_rel_diff(a->losses + from, b->losses + from, (size_t)(a->nsteps - from));
    float dp = harness_max_abs_diff(a->params, b->params, a->nparams);
    fprintf(stderr, "test_07: %-44s losses within %.2g (rel), weights within %.2g (abs)\n", what,
            (double)dl, (double)dp);
    cr_assert(dl <= LOSS_RTOL && dp <= PARAM_ATOL, "%s: losses within %g, weights within %g (bounds %g, %g)",
              what, (double)dl, (double)dp, (double)LOSS_RTOL, (double)PARAM_ATOL);
}

Test(tp07, checkpoints_move_between_tp_4_and_one_rank, .timeout = 180) {
    harness_assert_resume_exact(TP " --tp 2 --sequence-parallel", 2, SMALL, 3);
    // bf16: the checkpoint holds the fp32 master; the bf16 weights are rounded from it again
    harness_assert_resume_exact(TP " --tp 2 --dtype bf16", 2, SMALL, 3);
    mpi_07_passes(4, "ckpt");  // tp = 4 and 2
    char a[256], b[256], flags[1024], *log = NULL;
    snprintf(a, sizeof a, "/tmp/test07_from00_%d.ckpt", (int)getpid());
    snprintf(b, sizeof b, "/tmp/test07_fromtp_%d.ckpt", (int)getpid());
    RunResults o, r, q;
    run(ORACLE, 1, SMALL, &o);
    snprintf(flags, sizeof flags, "%s %s --stop-at 3 --save %s", ORACLE, SMALL, a);
    cr_assert_eq(harness_mpirun(1, flags, &log, 60), 0, "00 --save: %s", log);
    free(log), log = NULL;
    snprintf(flags, sizeof flags, "%s --tp 4 --resume %s", SMALL, a);
    run(TP, 4, flags, &r);
    check_resumed("TP 4 resumed from 00's step 3", &r, &o, 3);
    snprintf(flags, sizeof flags, "%s %s --tp 4 --stop-at 3 --save %s", TP, SMALL, b);
    cr_assert_eq(harness_mpirun(4, flags, &log, 60), 0, "TP 4 --save: %s", log);
    free(log);
    snprintf(flags, sizeof flags, "%s --resume %s", SMALL, b);
    run(ORACLE, 1, flags, &q);
    check_resumed("00 resumed from TP 4's step 3", &q, &o, 3);
    unlink(a), unlink(b);
    results_free(&o), results_free(&r), results_free(&q);
}

// ---- the exercises: each piece alone (tests/mpi_07_tp.c), on tp = 4 and 2 (np 4: the world
// and a split group of 2) and on tp = 2 and 1 (np 2) ------------------------------------------------

static void mpi_07_passes(int np, const char *what) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tests/mpi_07_tp %s", harness_build_dir(), what);
    int rc = harness_mpirun(np, cmd, &out, 120);
    int checks = -1, failed = -1, ranks = -1;
    const char *line = out ? strstr(out, "mpi_07_tp: ") : NULL;
    while (line && strstr(line + 1, "mpi_07_tp: ")) line = strstr(line + 1, "mpi_07_tp: ");  // the summary
    const char *on = line ? strstr(line, " on ") : NULL;
    if (on) sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
    cr_expect(rc == 0 && ranks == np && checks > 0 && failed == 0, "%s",
              expect_mpi_msg("mpi_07_tp", what, np, rc, ranks, checks, failed, out, 1500));
    free(out);
}

// 07.1: g. Seen failing: the MLP's g all-reduce removed from tp_block_forward (block output off
// by 0.16). (The breaks each kind catches: tests/mpi_07_tp.c's top.)
Test(ex07_1, the_tp_block_forward_equals_the_full_block_on_tp_4_and_2, .timeout = 120) { mpi_07_passes(4, "block"); }
Test(ex07_1, the_tp_block_forward_equals_the_full_block_on_tp_2_and_1, .timeout = 120) { mpi_07_passes(2, "block"); }
// 07.2: column- and row-parallel linear, backward. Seen failing: fcproj's weight gradient
// taken against fch instead of GELU(fch) (off by 1.5).
Test(ex07_2, mlp_backward_slices_and_summed_input_gradient_on_tp_4_and_2, .timeout = 120) { mpi_07_passes(4, "mlp"); }
Test(ex07_2, mlp_backward_slices_and_summed_input_gradient_on_tp_2_and_1, .timeout = 120) { mpi_07_passes(2, "mlp"); }
// 07.3: vocab-parallel cross-entropy. Seen failing: the sum of exp not all-reduced (off by 0.12).
Test(ex07_3, vocab_parallel_loss_equals_the_full_loss_on_tp_4_and_2, .timeout = 120) { mpi_07_passes(4, "ce"); }
Test(ex07_3, vocab_parallel_loss_equals_the_full_loss_on_tp_2_and_1, .timeout = 120) { mpi_07_passes(2, "ce"); }
// 07.4: f under sequence parallelism (its forward all-gather). Seen failing: the sequence's
// offset in the gathered tensor taken as b·T/t·C instead of b·T·C ("an all-gathered position is
// not where it belongs"; the SP block output off by 0.10).
Test(ex07_4, seq_parallel_f_gathers_every_position_in_place_on_tp_4_and_2, .timeout = 120) { mpi_07_passes(4, "seq-f"); }
Test(ex07_4, seq_parallel_f_gathers_every_position_in_place_on_tp_2_and_1, .timeout = 120) { mpi_07_passes(2, "seq-f"); }
