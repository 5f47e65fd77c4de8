// test_05_zero.c: chapter 05 (ZeRO stages 0-3) against single-device training, its memory and
// communication against the formulas, its checkpoints across layouts, and its exercises.
//
// The oracle is chapter 00's single-device run (./00_memory_budget/run --train) with the same
// flags. Every stage must give the same per-step losses and final weights on 1 rank (bit-exact:
// the same operations in the same order: the partition of one part is the whole buffer, the
// clipping norm one sum over it) and on 2, 3, 4 and 8 ranks within the tolerances of test_03:
// the gradient of each element is summed over the ranks in MPI's order (then divided by N,
// inexact for N = 3), so fp32 rounding differs at the 1e-7 level; Adam amplifies that for
// elements whose gradient is near 0. Measured here (6 steps of the small model): losses within
// 8.9e-8 relative, weights within 3.3e-5 absolute (3 ranks) over every stage on 2, 3, 4 ranks. Bounds: 1e-6
// relative on losses, 2e-4 absolute on weights, as in test_03.
//
// Memory and bytes are compared with formulas computed HERE from the config (the units' sizes
// and the shard convention of common/shard.h), not with anything the chapter computes.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gpt2.h"
#include "harness.h"
#include "harness_expect.h"
#include "harness_progress.h"
#include "mem.h"
#include "shard.h"

#define ORACLE "./00_memory_budget/run --train --quiet"
#define ZERO "./05_zero/run --quiet"
#define DDP "./03_ddp/run --quiet --overlap-steps 0"
// 118,528 parameters: units embed 18,432, two blocks of 49,984, head 128 (all divisible by 8)
#define SMALL_CFG "--layers 2 --channels 64 --heads 4 --seq 32"
#define SMALL SMALL_CFG " --batch 24 --steps 6"
#define LOSS_RTOL 1e-6f
#define PARAM_ATOL 2e-4f
#define BF16_LOSS_RTOL 1e-4f
#define BF16_PARAM_ATOL 8e-3f

static char *tmp_path(const char *tag) {
    static char buf[4][256];
    static int i = 0;
    char *p = buf[i++ % 4];
    snprintf(p, 256, "/tmp/lab_test05_%d_%s", (int)getpid(), tag);
    return p;
}

// The whole file into *buf (malloc'd); its size, 0 when it cannot be read.
static size_t read_all(const char *path, char **buf) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 ? fread(*buf, 1, (size_t)n, f) : 0;
    fclose(f);
    return got;
}

static void run_oracle(const char *flags, RunResults *out) {
    char *log = NULL;
    int rc = harness_run_dump(ORACLE, 1, flags, out, &log, 120);
    cr_assert_eq(rc, 0, "oracle run failed (%s):\n%s", flags, log);
    free(log);
}

// extra: 05's own flags (--bucket-kb, --in-flight ...), not given to the oracle
static void run_zero_x(int np, int stage, const char *extra, const char *flags, RunResults *out) {
    char *log = NULL, prog[256];
    snprintf(prog, sizeof prog, ZERO " --zero %d %s", stage, extra);
    int rc = harness_run_dump(prog, np, flags, out, &log, 150);
    cr_assert_eq(rc, 0, "05_zero --zero %d %s -np %d %s failed:\n%s", stage, extra, np, flags, log);
    free(log);
}

static void run_zero(int np, int stage, const char *flags, RunResults *out) {
    char *log = NULL, prog[128];
    snprintf(prog, sizeof prog, ZERO " --zero %d", stage);
    int rc = harness_run_dump(prog, np, flags, out, &log, 150);
    cr_assert_eq(rc, 0, "05_zero --zero %d -np %d %s failed:\n%s", stage, np, flags, log);
    free(log);
}

// ---------------------------------------------------------------------------------------------
// the formulas, from the config

typedef struct Units { int n; size_t size[64]; } Units;

static Units units_of(int L, int C, int V, int T) {
    GPT2Config cfg = {.V = V, .T = T, .L = L, .C = C, .NH = 4};
    GPT2Unit u[64];
    Units out;
    out.n = gpt2_stage_units(&cfg, 0, L, u);
    for (int i = 0; i < out.n; i++) out.size[i] = u[i].size;
    return out;
}
static Units small_units(void) { return units_of(2, 64, 256, 32); }

static size_t total(const Units *u) {
    size_t s = 0;
    for (int i = 0; i < u->n; i++) s += u->size[i];
    return s;
}
// The flat partition written out here: shard q of n elements starts at q*(n/N) + min(q, n%N).
static size_t flat_start(size_t n, int N, int q) {
    size_t base = n / (size_t)N, extra = n % (size_t)N;
    return (size_t)q * base + ((size_t)q < extra ? (size_t)q : extra);
}
// elements rank r owns: its shard of the whole flat buffer
static size_t owned(const Units *u, int N, int r) {
    return flat_start(total(u), N, r + 1) - flat_start(total(u), N, r);
}
// rank q's piece of unit i: the unit's intersection with shard q
static size_t piece(const Units *u, int i, int N, int q) {
    size_t off = 0;
    for (int j = 0; j < i; j++) off += u->size[j];
    size_t lo = flat_start(total(u), N, q), hi = flat_start(total(u), N, q + 1);
    size_t a = lo > off ? lo : off, b = hi < off + u->size[i] ? hi : off + u->size[i];
    return b > a ? b - a : 0;
}

// What one rank holds, per category, in bytes (e: bytes of a param/grad element).
static void expected_memory(const Units *u, int stage, int N, int r, int bf16, double x[5]) {
    const double n = (double)total(u), e = bf16 ? 2 : 4;
    const double s = stage == 0 ? n : (double)owned(u, N, r);
    x[0] = e * (stage == 3 ? s : n);        // params
    x[1] = e * (stage >= 2 ? s : n);        // grads
    x[2] = bf16 ? 4 * s : 0;                // fp32 master (fp32: the params are the master)
    x[3] = 4 * s;                           // adam m
    x[4] = 4 * s;                           // adam v
}

// Ring counting of one v-op (common/dist.h): reduce-scatter sent n - c_r, recv n - c_{r-1};
// all-gather sent n - c_{r+1}, recv n - c_r, with c_q rank q's block. Stages 1 and 2 move the
// whole buffer (stage 1 in one op, stage 2 bucket by bucket: the blocks of the buckets add up to
// the shards), stage 3 unit by unit (rank q's block of unit i: piece(u, i, N, q)).
static void expected_bytes(const Units *u, int stage, int N, int r, int bf16, double b[6]) {
    const double e = bf16 ? 2 : 4;
    memset(b, 0, 6 * sizeof(double));  // rs sent, rs recv, ag sent, ag recv, ar sent, ar recv
    if (N == 1) return;
    const double loss = (double)(2 * (N - 1) * 4 / N), norm = (double)(2 * (N - 1) * 8 / N);
    if (stage == 0) {
        double ar = (double)(2 * (uint64_t)(N - 1) * (uint64_t)(total(u) * (size_t)e) / (uint64_t)N);
        b[4] = b[5] = ar + loss;
        return;
    }
    b[4] = b[5] = loss + norm;
    const double psi = (double)total(u);
    b[0] = e * (psi - (double)owned(u, N, r));
    b[1] = e * (psi - (double)owned(u, N, (r + N - 1) % N));
    if (stage < 3) {
        b[2] = e * (psi - (double)owned(u, N, (r + 1) % N));
        b[3] = e * (psi - (double)owned(u, N, r));
        return;
    }
    for (int i = 0; i < u->n; i++) {
        const double n = (double)u->size[i];
        // gathers per step at stage 3: the embedding twice (forward, then the head's wte),
        // every block twice (forward, backward), the head once
        int times = i == u->n - 1 ? 1 : 2;
        b[2] += times * e * (n - (double)piece(u, i, N, (r + 1) % N));
        b[3] += times * e * (n - (double)piece(u, i, N, r));
    }
}

static void check_formulas(const RunResults *res, const Units *u, int stage, int N, int bf16,
                           const char *what) {
    static const char *mk[5] = {"params", "grads", "master", "opt_m", "opt_v"};
    static const char *bk[6] = {"rs_sent", "rs_recv", "ag_sent", "ag_recv", "ar_sent", "ar_recv"};
    for (int w = 0; w < 2; w++) {
        int r = w == 0 ? 0 : N - 1;
        const char *tag = w == 0 ? "first" : "last";
        double x[5], b[6];
        char key[48];
        expected_memory(u, stage, N, r, bf16, x);
        for (int c = 0; c < 5; c++) {
            snprintf(key, sizeof key, "%s_%s", tag, mk[c]);
            cr_expect_eq(results_get(res, key, -1), x[c], "%s rank %d: %s peak %.0f B, formula %.0f B",
                         what, r, mk[c], results_get(res, key, -1), x[c]);
        }
        expected_bytes(u, stage, N, r, bf16, b);
        double sum = 0;
        for (int c = 0; c < 6; c++) {
            snprintf(key, sizeof key, "%s_%s", tag, bk[c]);
            cr_expect_eq(results_get(res, key, -1), b[c], "%s rank %d: %s %.0f B per step, formula %.0f B",
                         what, r, bk[c], results_get(res, key, -1), b[c]);
            if (c % 2 == 0) sum += b[c];
        }
        snprintf(key, sizeof key, "%s_sent", tag);
        cr_expect_eq(results_get(res, key, -1), sum, "%s rank %d: %.0f B sent per step in all, "
                     "formula %.0f B", what, r, results_get(res, key, -1), sum);
    }
}

// ZeRO-2's gradient memory: my shard (grads) + the comm buffers' peak (buckets and the unit
// gradients backward writes) against the formula Ψ/N + in_flight·bucket + (the embedding's unit,
// alive through all of backward because the tied head adds to it first, + the largest other
// unit, one at a time), in bytes. Holds when a unit spans in_flight buckets (bucket-kb small);
// with in_flight >= the buckets, every bucket is alive: Ψ.
static void check_zero2_buckets(const RunResults *res, const Units *u, int N, int bucket_kb,
                                int in_flight, const char *what) {
    const double e = 4, B = bucket_kb * 1024.0 / e, psi = (double)total(u);
    const double nb = ceil(psi / B);
    double umax = 0;
    for (int i = 1; i < u->n; i++) umax = fmax(umax, (double)u->size[i]);
    const double buckets = nb > in_flight ? in_flight * B : psi;
    for (int w = 0; w < 2; w++) {
        int r = w == 0 ? 0 : N - 1;
        const char *tag = w == 0 ? "first" : "last";
        char kg[32], kc[32];
        snprintf(kg, sizeof kg, "%s_grads", tag);
        snprintf(kc, sizeof kc, "%s_comm", tag);
        double got = results_get(res, kg, -1) + results_get(res, kc, -1);
        double want = e * ((double)owned(u, N, r) + buckets + (double)u->size[0] + umax);
        cr_expect_eq(got, want, "%s rank %d: grads + comm bufs peak %.0f B, formula Ψ/N + %d x "
                     "bucket + units = %.0f B", what, r, got, in_flight, want);
    }
}

// Each stage on np ranks: the oracle's training, and the formulas. Stage 2 runs with small
// buckets (extra: 05's flags) and its gradient memory is checked too.
static void check_stage_x(const RunResults *oracle, int np, int stage, const char *extra,
                          const char *flags, int bf16) {
    RunResults r;
    run_zero_x(np, stage, extra, flags, &r);
    char what[256];
    snprintf(what, sizeof what, "05_zero --zero %d %s -np %d %s", stage, extra, np, flags);
    harness_assert_results_match(what, &r, oracle, bf16 ? BF16_LOSS_RTOL : LOSS_RTOL,
                                 bf16 ? BF16_PARAM_ATOL : PARAM_ATOL);
    Units u = small_units();
    check_formulas(&r, &u, stage, np, bf16, what);
    int kb = 0, inf = 0;
    const char *b = strstr(extra, "--bucket-kb "), *f = strstr(extra, "--in-flight ");
    if (stage == 2 && !bf16 && b && f && sscanf(b, "--bucket-kb %d", &kb) == 1 &&
        sscanf(f, "--in-flight %d", &inf) == 1)
        check_zero2_buckets(&r, &u, np, kb, inf, what);
    results_free(&r);
}

static void check_stage(const RunResults *oracle, int np, int stage, const char *flags, int bf16) {
    check_stage_x(oracle, np, stage, stage == 2 ? "--bucket-kb 16 --in-flight 2" : "", flags, bf16);
}

// ---------------------------------------------------------------------------------------------
// equivalence with single-device training, memory and bytes against the formulas

// One rank IS single-device training, at every stage: bit for bit.
Test(zero05, one_rank_every_stage_is_single_device_training_bit_exact, .timeout = 120) {
    RunResults o;
    run_oracle(SMALL, &o);
    for (int stage = 0; stage <= 3; stage++) {
        RunResults r;
        run_zero(1, stage, SMALL, &r);
        char what[64];
        snprintf(what, sizeof what, "05_zero --zero %d -np 1", stage);
        harness_assert_results_match(what, &r, &o, 0.0f, 0.0f);
        results_free(&r);
    }
    results_free(&o);
}

// Breaks seen to fail here (each restored after): stage 1's gradient reduce-scatter with
// DIST_SUM instead of DIST_AVG (gradients not averaged: losses off by 3.0e-4 relative, weights
// by 2.9e-4); stage 1's all-gather of the updated parameters skipped (a stale parameter shard
// on every other rank: losses off by 1.4e-2, weights by 4.3e-3). The clipping norm's all-reduce
// skipped is caught here only by the byte counts: see clipping_counts_every_element_once.
// (Stage 0 is checked on 1, 3 and 4 ranks.)
// Mutant: mutants/05-stale.patch (the all-gather after the step skipped: stale shards)
// Mutant: mutants/05-bucket-early.patch (a ZeRO-2 bucket launched before its lower part is in)
// Mutant: mutants/05-sum.patch (ZeRO-2's buckets summed, not averaged)
Test(zero05, stages_1_2_3_on_2_ranks_match_and_meet_the_formulas, .timeout = 150) {
    RunResults o;
    run_oracle(SMALL, &o);
    check_stage(&o, 2, 1, SMALL, 0);
    check_stage_x(&o, 2, 2, "--bucket-kb 8 --in-flight 3", SMALL, 0);
    check_stage(&o, 2, 3, SMALL, 0);
    results_free(&o);
}

// 3 ranks: the shards are uneven (118,528 = 3 x 39,509 + 1: shard 0 one element longer) and the
// shard boundaries cut blocks. (These breaks were seen to fail here on the earlier by-unit
// layout: the last piece of every unit one element short, weights off by 3.3e-2; rank 0's piece
// one element too long, caught by the memory formulas only. The flat layout's own break,
// mutants/05-drop-last.patch, is caught here.) Stage 2 with 16 KiB buckets, 2 in flight: its
// gradient memory is checked to the byte.
// Mutant: mutants/05-drop-last.patch
Test(zero05, every_stage_on_3_ranks_uneven_pieces_matches_and_meets_the_formulas, .timeout = 150) {
    RunResults o;
    run_oracle(SMALL, &o);
    for (int stage = 0; stage <= 3; stage++) check_stage(&o, 3, stage, SMALL, 0);
    results_free(&o);
}

// Breaks seen to fail here: stage 3 with the head's gathered unit kept after its backward
// (never gathered again: a stale parameter shard, losses off by 4.9e-5); stage 2 with the
// head's gradient never reduce-scattered (its pieces' gradients stay 0: weights off by 3.7e-3).
// Also against DDP (03) on the same 4 ranks: stage 0 is 03's --no-overlap step op for op (one
// all-reduce of the whole gradient, the same clipping and AdamW): bit-exact; stages 1-3 sum the
// same gradients by reduce-scatters: within the fp32 tolerance (measured 7.2e-7 on weights).
// And with N = 4 dividing Ψ, stages 1 and 2 move the notes' 2Ψ(N-1)/N elements exactly (stage 2
// bucket by bucket adds up to the same); stage 3's unit gathers are check_formulas'.
Test(zero05, every_stage_on_4_ranks_matches_00_and_03_and_meets_the_formulas, .timeout = 200) {
    RunResults o, d;
    run_oracle(SMALL, &o);
    char *log = NULL;
    int rc = harness_run_dump(DDP " --no-overlap", 4, SMALL, &d, &log, 120);
    cr_assert_eq(rc, 0, "03_ddp failed:\n%s", log);
    free(log);
    const Units u = small_units();
    const double psi = (double)total(&u);
    for (int stage = 0; stage <= 3; stage++) {
        RunResults r;
        run_zero(4, stage, SMALL, &r);
        char what[64];
        snprintf(what, sizeof what, "05_zero --zero %d -np 4", stage);
        harness_assert_results_match(what, &r, &o, LOSS_RTOL, PARAM_ATOL);
        check_formulas(&r, &u, stage, 4, 0, what);
        snprintf(what, sizeof what, "05_zero --zero %d -np 4 vs 03_ddp -np 4", stage);
        if (stage == 0) {
            harness_assert_results_match(what, &r, &d, 0.0f, 0.0f);
        } else if (stage < 3) {
            harness_assert_results_match(what, &r, &d, LOSS_RTOL, PARAM_ATOL);
            double elems = (results_get(&r, "first_rs_sent", -1) + results_get(&r, "first_ag_sent", -1)) / 4;
            double want = 2 * psi * 3 / 4;
            cr_expect_eq(elems, want, "--zero %d: %.0f elements sent by collectives per step, "
                         "formula %.0f", stage, elems, want);
        } else {  // stage 3: rank 0's share of the unit gathers is check_formulas'
            harness_assert_results_match(what, &r, &d, LOSS_RTOL, PARAM_ATOL);
        }
        results_free(&r);
    }
    results_free(&o);
    results_free(&d);
}

Test(zero05, stages_1_2_3_on_8_ranks_match_and_meet_the_formulas_fp32_and_bf16, .timeout = 240) {
    RunResults o;
    run_oracle(SMALL_CFG " --batch 16 --steps 3", &o);
    for (int stage = 1; stage <= 3; stage++)
        check_stage(&o, 8, stage, SMALL_CFG " --batch 16 --steps 3", 0);
    results_free(&o);
    // and bf16 (2-byte params and grads, fp32 master) at stage 3 on 8 ranks
    run_oracle(SMALL_CFG " --batch 16 --steps 3 --dtype bf16", &o);
    check_stage(&o, 8, 3, SMALL_CFG " --batch 16 --steps 3 --dtype bf16", 1);
    results_free(&o);
}

// Clipping from pieces: Σ g² over my pieces, summed over the ranks. With --grad-clip 0.05 the
// clipping bites (the default 1.0 does not in these 6 steps: the break below passes there), so a norm
// computed wrongly changes every update. Break seen to fail here: the all-reduce of Σ g²
// skipped (clipping on the local shard only: losses off by 3.7e-5 relative, weights by 4.6e-4); the SMALL runs above
// do not catch it, their gradient norm stays under the default clip of 1.
Test(zero05, clipping_counts_every_element_once, .timeout = 150) {
    RunResults o;
    run_oracle(SMALL " --grad-clip 0.05", &o);
    // every stage clips in zero.c's zero_step: stage 1 from the reduce-scattered whole gradient, 3 from its pieces
    check_stage(&o, 3, 1, SMALL " --grad-clip 0.05", 0);
    check_stage(&o, 3, 3, SMALL " --grad-clip 0.05", 0);
    results_free(&o);
}

// Mixed precision: bf16 params and grads (2 B, also on the wire), fp32 master and Adam
// sharded: (2+2+12)Ψ, 2Ψ+2Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N, and bf16 bytes on the wire. On one rank
// bit-exact with 00 --dtype bf16; on 3 ranks the bounds of test_03's bf16 tests (a bf16 sum
// rounds at every add, so its order moves a weight by up to one bf16 step: 1e-4 relative on
// losses, 8e-3 absolute on weights). Measured: losses within 2.8e-6, weights within 2.0e-3.
Test(zero05, bf16_matches_single_device_and_meets_the_2_2_12_formulas, .timeout = 150) {
    RunResults o;
    run_oracle(SMALL " --dtype bf16", &o);
    RunResults r;
    run_zero(1, 3, SMALL " --dtype bf16", &r);
    harness_assert_results_match("05_zero --zero 3 -np 1 --dtype bf16", &r, &o, 0.0f, 0.0f);
    results_free(&r);
    for (int stage = 0; stage <= 3; stage++) check_stage(&o, 3, stage, SMALL " --dtype bf16", 1);
    results_free(&o);
}

// ---------------------------------------------------------------------------------------------
// checkpoints: the state is the model, not the layout

Test(zero05, resume_is_exact_on_the_same_layout, .timeout = 150) {
    harness_assert_resume_exact(ZERO " --zero 3", 3, SMALL_CFG " --batch 24 --steps 8", 5);
}

// Saved on ZeRO-3 x 4 after 3 steps, resumed on ZeRO-1 x 2, on ZeRO-2 x 3 and on one rank: the
// continued losses and the final weights are the oracle's (uninterrupted) within the tolerance.
// Break seen to fail here: save_state not gathering Adam's m (left 0 in the file): losses of
// the resumed run off by 6.7e-3.
Test(zero05, resume_across_stages_and_world_sizes, .timeout = 200) {
    RunResults o;
    run_oracle(SMALL_CFG " --batch 24 --steps 8", &o);
    char *ck = tmp_path("x.ckpt"), flags[512];
    snprintf(flags, sizeof flags, ZERO " --zero 3 " SMALL_CFG " --batch 24 --steps 8 --stop-at 3 --save %s", ck);
    char *log = NULL;
    cr_assert_eq(harness_mpirun(4, flags, &log, 120), 0, "save run failed:\n%s", log);
    free(log);
    static const int np[3] = {2, 3, 1}, stage[3] = {1, 2, 0};
    for (int i = 0; i < 3; i++) {
        RunResults r;
        snprintf(flags, sizeof flags, SMALL_CFG " --batch 24 --steps 8 --resume %s", ck);
        run_zero(np[i], stage[i], flags, &r);
        for (int s = 0; s < 3; s++) r.losses[s] = o.losses[s];  // not run: NaN there
        char what[64];
        snprintf(what, sizeof what, "resumed on --zero %d x %d", stage[i], np[i]);
        harness_assert_results_match(what, &r, &o, LOSS_RTOL, PARAM_ATOL);
        results_free(&r);
    }
    // --load-weights (llm.c weights, written by 00 after 2 steps): the weights only (fresh
    // Adam, step 0), the same run as 00 --load-weights
    RunResults lw, olw;
    char *wf = tmp_path("w.bin");
    snprintf(flags, sizeof flags, SMALL_CFG " --batch 24 --steps 2 --save-weights %s", wf);
    run_oracle(flags, &olw);
    results_free(&olw);
    snprintf(flags, sizeof flags, SMALL_CFG " --batch 24 --steps 3 --load-weights %s", wf);
    run_oracle(flags, &olw);
    run_zero(3, 2, flags, &lw);
    harness_assert_results_match("--zero 2 x 3 --load-weights", &lw, &olw, LOSS_RTOL, PARAM_ATOL);
    cr_expect(olw.losses[0] != o.losses[0], "--load-weights: the first loss %g is the fresh "
              "model's: the weights were not loaded", (double)olw.losses[0]);
    results_free(&lw);
    results_free(&olw);
    unlink(wf);
    unlink(ck);
    results_free(&o);
}

Test(zero05, nan_fails_cleanly_and_keeps_the_checkpoint, .timeout = 120) {
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
    harness_assert_nan_fails_cleanly(ZERO " --zero 2", 3, SMALL_CFG " --batch 24 --steps 10", &cfg);
}

// ---------------------------------------------------------------------------------------------
// what it prints


// Without --quiet: ZeRO-3 on 3 ranks saves at step 3 of 7, ZeRO-2 on 3 ranks resumes with
// --log-every 2 --save-every 2. "resumed from" once, the progress lines (rank 0 alone, at steps
// 4, 5, 7) say the run's own losses, the final save is said once, and the wire table's bytes
// sent per step of rank 0 and of the last rank are the dump's (a counter reset at the wrong
// time shows only here), and as many as without the checkpoints.
// Mutant: mutants/session-progress-every-rank.patch
// Mutant: mutants/counters-per-step-keeps-save-cost.patch
Test(zero05, printed_progress_and_table_match_the_run, .timeout = 150) {
    char *ck = tmp_path("print.ckpt"), *ck2 = tmp_path("print2.ckpt"), cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, ZERO " --zero 3 " SMALL_CFG " --batch 24 --steps 7 --stop-at 3 "
             "--save %s", ck);
    cr_assert_eq(harness_mpirun(3, cmd, &out, 120), 0, "save run failed:\n%s", out);
    free(out);
    out = NULL;
    RunResults r;
    snprintf(cmd, sizeof cmd, SMALL_CFG " --batch 24 --steps 7 --log-every 2 --resume %s --save %s "
             "--save-every 2", ck, ck2);
    int rc = harness_run_dump("./05_zero/run --zero 2", 3, cmd, &r, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    const char *once = strstr(out, "resumed from");
    cr_assert(once && !strstr(once + 1, "resumed from"), "\"resumed from\" not once:\n%s", out);
    once = strstr(out, "saved training state (step 7)");
    cr_assert(once && !strstr(once + 1, "saved training state"), "the final save not said once "
              "(and no other):\n%s", out);
    cr_assert(harness_progress_matches(out, &r, 3, 7, 7, 2),
              "the progress lines do not say the run (details above on stderr)");
    // "  %-6d" then " %13s" per column: rank, reduce-scat, all-gather, all-reduce, sent
    const char *title = "Bytes on the wire per rank per step (dist counters)";
    for (int rank = 0; rank < 3; rank += 2) {
        double sent = results_get(&r, rank ? "last_sent" : "first_sent", -1);
        char want[32], cell[64];
        mem_format(want, sizeof want, sent);
        cr_assert(harness_table_cell_at(out, title, rank, 2 + 6 + 3 * 14 + 1, 13, cell), "no table:\n%s",
                  out);
        cr_assert_str_eq(cell, want, "rank %d's sent per step %s, the run's %.0f B = %s", rank,
                         cell, sent, want);
    }
    // the checkpoints' gathers are not a step's: the same run without --save sends as much
    RunResults q;
    snprintf(cmd, sizeof cmd, SMALL_CFG " --batch 24 --steps 7 --resume %s", ck);
    harness_assert_run_dump(ZERO " --zero 2", 3, cmd, &q);
    for (int i = 0; i < 2; i++) {
        const char *key = i ? "last_sent" : "first_sent";
        cr_assert_eq(results_get(&r, key, -1), results_get(&q, key, -2), "%s: %.0f B per step "
                     "with --save-every 2, %.0f B without", key, results_get(&r, key, -1),
                     results_get(&q, key, -2));
    }
    results_free(&q);
    unlink(ck);
    unlink(ck2);
    results_free(&r);
    free(out);
}

// ---------------------------------------------------------------------------------------------
// bad input

// A flag that does nothing at the stage given is refused, naming the stage it needs.
Test(zero05, bucket_and_in_flight_flags_are_refused_where_they_do_nothing, .timeout = 60) {
    for (int stage = 0; stage <= 3; stage++) {
        char cmd[256];
        if (stage != 2) {
            snprintf(cmd, sizeof cmd, ZERO " --zero %d --bucket-kb 16 " SMALL, stage);
            harness_assert_refused(2, cmd, "--bucket-kb", "--zero 2");
        }
        if (stage < 2) {
            snprintf(cmd, sizeof cmd, ZERO " --zero %d --in-flight 3 " SMALL, stage);
            harness_assert_refused(2, cmd, "--in-flight", "--zero 2 or 3");
        }
    }
}

Test(zero05, zero_4_is_refused_with_the_valid_range, .timeout = 60) {
    char *out = NULL;
    int rc = harness_mpirun(2, ZERO " --zero 4 " SMALL, &out, 30);
    cr_assert_neq(rc, 0);
    cr_assert(harness_contains(out, "--zero"), "no message naming --zero:\n%s", out);
    cr_assert(harness_contains(out, "3"), "the valid range is not named:\n%s", out);
    free(out);
}

Test(zero05, a_checkpoint_of_another_model_is_refused, .timeout = 90) {
    char *ck = tmp_path("other.ckpt"), flags[512], *out = NULL;
    snprintf(flags, sizeof flags, ZERO " --zero 1 --layers 1 --channels 64 --heads 4 --seq 32 "
             "--batch 8 --steps 1 --save %s", ck);
    cr_assert_eq(harness_mpirun(2, flags, &out, 60), 0, "%s", out);
    free(out);
    char *before = NULL, *after = NULL;
    size_t nb = read_all(ck, &before);
    // --save to the same file: a refused resume must not write it
    snprintf(flags, sizeof flags, ZERO " --zero 3 " SMALL " --resume %s --save %s", ck, ck);
    int rc = harness_mpirun(3, flags, &out, 30);
    cr_assert_neq(rc, 0);
    cr_assert_neq(rc, 124, "the refused resume did not end within 30 s (a rank left waiting)");
    cr_assert(harness_contains(out, ck), "the message does not name the file:\n%s", out);
    cr_assert(harness_contains(out, "layers") || harness_contains(out, "L="),
              "the message does not say which model differs:\n%s", out);
    size_t na = read_all(ck, &after);
    cr_expect(nb > 0 && na == nb && memcmp(before, after, nb) == 0,
              "the checkpoint changed (%zu B before, %zu B after)", nb, na);
    free(before);
    free(after);
    free(out);
    unlink(ck);
}

// ---------------------------------------------------------------------------------------------
// exercises: each suite runs only its own exercise's code (05.2 and 05.3 on a partition written
// in tests/mpi_05_zero.c, not on zero_layout_init)

#include "zero.h"

// 05.1: zero_layout_init_flat's pieces for N = 1..9 and every rank, against the convention
// written out here: shard q of the flat buffer (n elements) starts at q*(n/N) + min(q, n%N);
// rank r's piece of a unit is the unit's intersection with shard r (empty ones begin where the
// pieces of the ranks before r end), its pieces sit one after the other in its shard, and
// shard_n is the shard's length. Also the by-unit layout (06's: piece r of every unit).
static void layout_matches(const GPT2Config *cfg, int flat) {
    GPT2 m;
    gpt2_build(&m, *cfg, DEV_CPU);
    const size_t n = m.num_params;
    for (int N = 1; N <= 9; N++) {
        for (int r = 0; r < N; r++) {
            ZeroLayout z;
            if (flat) zero_layout_init_flat(&z, &m, N, r);
            else zero_layout_init(&z, &m, N, r);
            size_t local = 0, sb = flat_start(n, N, r), se = flat_start(n, N, r + 1);
            const char *init = flat ? "zero_layout_init_flat" : "zero_layout_init";
            expect_eq(z.nunits, m.nunits, "units of %s (one piece per unit of the model), N %d rank %d",
                      init, N, r);
            for (int u = 0; u < m.nunits; u++) {
                size_t un = m.units[u].size, ub = m.units[u].offset, begin, count;
                if (flat) {
                    size_t lo = sb < ub ? ub : sb > ub + un ? ub + un : sb;
                    size_t hi = se < ub ? ub : se > ub + un ? ub + un : se;
                    begin = lo - ub;
                    count = hi - lo;
                } else {
                    begin = flat_start(un, N, r);
                    count = flat_start(un, N, r + 1) - begin;
                }
                char of[160];
                snprintf(of, sizeof of, "%s, N %d rank %d, unit %d (%zu elements at %zu; this rank's "
                         "shard: [%zu, %zu) of %zu)", init, N, r, u, un, ub, sb, se, n);
                expect_or(cr_expect, z.p[u].unit_offset == ub, ub, z.p[u].unit_offset,
                          "the unit's offset in the model, %s", of);
                expect_or(cr_expect, z.p[u].unit_size == un, un, z.p[u].unit_size,
                          "the unit's size, %s", of);
                expect_or(cr_expect, z.p[u].begin == begin, begin, z.p[u].begin,
                          "where this rank's piece begins in the unit, %s", of);
                expect_or(cr_expect, z.p[u].count == count, count, z.p[u].count,
                          "the elements of this rank's piece, %s", of);
                if (count)
                    expect_or(cr_expect, z.p[u].local == local, local, z.p[u].local,
                              "where the piece sits in the shard (after the pieces of the units "
                              "before it), %s", of);
                local += count;
                size_t counts[16];
                zero_unit_counts(&z, u, counts);
                expect_or(cr_expect, counts[r] == count, count, counts[r],
                          "zero_unit_counts(unit %d)[%d] (this rank's piece), %s", u, r, of);
            }
            expect_or(cr_expect, z.shard_n == local, local, z.shard_n,
                      "the shard's length (the sum of its pieces), %s, N %d rank %d", init, N, r);
            if (flat)
                expect_or(cr_expect, z.shard_n == se - sb, se - sb, z.shard_n,
                          "the shard's length ([%zu, %zu) of the %zu parameters), %s, N %d rank %d",
                          sb, se, n, init, N, r);
            zero_layout_free(&z);
        }
    }
    gpt2_free(&m);
}

Test(ex05_1, flat_shards_of_the_small_model_for_1_to_9_ranks) {
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
    layout_matches(&cfg, 1);
}

// A model of 57 elements (its head 2C = 6): shards smaller than units, many empty pieces.
Test(ex05_1, shards_smaller_than_the_units_give_empty_pieces) {
    GPT2Config cfg = {.V = 5, .T = 3, .L = 1, .C = 3, .NH = 1};
    layout_matches(&cfg, 1);
}

Test(zero05, the_by_unit_layout_of_06_is_piece_r_of_every_unit) {
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
    layout_matches(&cfg, 0);
    GPT2Config tiny = {.V = 5, .T = 3, .L = 1, .C = 3, .NH = 1};
    layout_matches(&tiny, 0);
}

// mpirun -np N mpi_05_zero <what> for N = 1..5: exit 0, checks run, none failed.
static void mpi_zero_passes(const char *what, int max_np) {
    for (int np = 1; np <= max_np; np++) {
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tests/mpi_05_zero %s", harness_build_dir(), what);
        int rc = harness_mpirun(np, cmd, &out, 60);
        int checks = -1, failed = -1, ranks = -1;
        const char *line = out ? strstr(out, "mpi_05_zero: ") : NULL;
        const char *on = line ? strstr(line, " on ") : NULL;
        if (on) sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
        cr_expect(rc == 0 && ranks == np && checks > 0 && failed == 0, "%s",
                  expect_mpi_msg("mpi_05_zero", what, np, rc, ranks, checks, failed, out, 0));
        free(out);
        if (rc != 0) break;
    }
}

// Breaks seen to fail: DIST_SUM instead of DIST_AVG; the norm's all-reduce left out; the
// all-gather left out.
Test(ex05_2, zero_step_is_one_device_step_on_1_to_5_ranks, .timeout = 120) {
    mpi_zero_passes("zero1-step", 5);
}

// The same step on a flat buffer that is no GPT-2 (a layout of one unit, a hand-made parameter
// list): what chapter 09's pipeline stage would hand it.
Test(zero05, zero_step_on_a_bare_flat_buffer_on_1_to_5_ranks, .timeout = 120) {
    mpi_zero_passes("buffer-step", 5);
}

// dist.h's v-ops (05's flat partition runs on them), on 1..5 ranks.
Test(zero05, v_collectives_with_empty_blocks_and_their_bytes_on_1_to_5_ranks, .timeout = 120) {
    mpi_zero_passes("v-ops", 5);
}

// Break seen to fail: the piece sent from the shard's start instead of its own place (local).
Test(ex05_3, unit_gather_gives_every_rank_the_whole_unit_on_1_to_5_ranks, .timeout = 120) {
    mpi_zero_passes("gather-unit", 5);
}
