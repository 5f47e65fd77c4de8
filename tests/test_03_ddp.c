// test_03_ddp.c: chapter 03 (DDP) against single-device training, and its exercises.
//
// The oracle is chapter 00's single-device run (./00_memory_budget/run --train) with the same
// flags: same init (--seed), same data (--data-seed), same AdamW and clipping. DDP must give the
// same per-step losses and final weights for 1, 2, 3, 4 and 8 ranks, with one bucket, two,
// several and one per parameter, with and without overlap, with and without accumulation.
//
// Tolerances. On one rank the arithmetic is the oracle's, op for op: bit-exact. On N ranks the
// gradient of each element is summed in another order (per-rank partial sums over fewer rows,
// then MPI's reduction, then the division by N, which is inexact for N = 3), so fp32 rounding
// differs at the 1e-7 relative level. Measured on every run below (6 steps of the small model,
// 2 steps of the tiny one): losses differ by at most 1.8e-7 relative; weights by at most
// 2.8e-5 absolute (3 ranks with --grad-accum 4; 1e-6 for most runs). The weights move more than
// the losses because Adam divides by sqrt(v): for an element whose gradient is near 0 a
// rounding difference changes the update by a sizeable fraction of lr = 1e-3. The bounds are
// 1e-6 relative on losses and 2e-4 absolute on weights: a few times above the worst we
// measured, and far below what a broken strategy gives (with the initial broadcast or the
// gradient all-reduce removed, losses differ by ~1e-2 and weights by ~7e-3; checked).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "ddp_buckets.h"
#include "gpt2.h"
#include "harness.h"
#include "harness_expect.h"
#include "harness_progress.h"
#include "mem.h"

#define ORACLE "./00_memory_budget/run --train --quiet"
#define DDP "./03_ddp/run --quiet --overlap-steps 0"
// The small model most tests use: 118,528 parameters = 463 KiB of fp32 gradients.
// SMALL_MODEL: for runs that set their own --batch and --steps (a flag given twice is refused)
#define SMALL_MODEL "--layers 2 --channels 64 --heads 4 --seq 32"
#define SMALL SMALL_MODEL " --batch 24 --steps 6"
#define SMALL_NPARAMS 118528.0
#define LOSS_RTOL 1e-6f
#define PARAM_ATOL 2e-4f

// Bucket caps for the small model (its 28 parameters, 463 KiB, in reverse module order).
#define ONE_BUCKET ""                                          // 1 MiB first cap > 463 KiB
#define TWO_BUCKETS "--first-bucket-mb 0.1"                    // >= 100 KiB, then the rest
#define SEVERAL_BUCKETS "--first-bucket-mb 0.02 --bucket-mb 0.05"
#define PER_PARAM_BUCKETS "--first-bucket-mb 0 --bucket-mb 0"  // every bucket closes at once

static char *tmp_path(const char *tag) {
    static char buf[4][256];
    static int i = 0;
    char *p = buf[i++ % 4];
    snprintf(p, 256, "/tmp/lab_test03_%d_%s", (int)getpid(), tag);
    return p;
}

static void run_oracle(const char *flags, RunResults *out) {
    char *log = NULL;
    int rc = harness_run_dump(ORACLE, 1, flags, out, &log, 120);
    cr_assert(rc == 0, "%s", expect_msg_log("exit 0", expect_fmt_(rc), log, "the oracle, %s %s", ORACLE, flags));
    free(log);
}

static void run_ddp(int np, const char *flags, RunResults *out) {
    char *log = NULL;
    int rc = harness_run_dump(DDP, np, flags, out, &log, 120);
    cr_assert(rc == 0, "%s", expect_msg_log("exit 0", expect_fmt_(rc), log, "mpirun -np %d %s %s", np, DDP, flags));
    free(log);
}

// One DDP run against the oracle: losses, weights, identical replicas, and the bucket count.
static void check_equivalent(const RunResults *oracle, int np, const char *flags, int buckets) {
    RunResults r;
    run_ddp(np, flags, &r);
    char what[256];
    snprintf(what, sizeof what, "03_ddp -np %d %s", np, flags);
    harness_assert_results_match(what, &r, oracle, LOSS_RTOL, PARAM_ATOL);
    expect_eq(results_get(&r, "replica_max_diff", -1), 0.0,
              "%s: max |p_r - p_0| over the ranks' weights after training (the replicas agree)", what);
    if (buckets >= 0) expect_eq(results_get(&r, "buckets", -1), buckets, "%s: buckets", what);
    results_free(&r);
}

// ---------------------------------------------------------------------------------------------
// equivalence with single-device training

// One rank IS single-device training: the same operations in the same order, bit for bit.
Test(ddp03, one_rank_is_single_device_training_bit_exact, .timeout = 120) {
    RunResults o, r;
    run_oracle(SMALL, &o);
    run_ddp(1, SMALL " " SEVERAL_BUCKETS, &r);
    harness_assert_results_match("03_ddp -np 1", &r, &o, 0.0f, 0.0f);
    results_free(&o);
    results_free(&r);
}

Test(ddp03, matches_single_device_with_overlap_for_2_3_4_8_ranks, .timeout = 240) {
    RunResults o;
    run_oracle(SMALL, &o);
    check_equivalent(&o, 2, SMALL " " SEVERAL_BUCKETS, -1);
    check_equivalent(&o, 3, SMALL " " PER_PARAM_BUCKETS, 28);
    check_equivalent(&o, 4, SMALL " " TWO_BUCKETS, 2);
    check_equivalent(&o, 8, SMALL " " ONE_BUCKET, 1);
    results_free(&o);
}

// The default runs the buckets on a communication thread, in place (views); the other ways
// (non-blocking MPI polled between pieces, packed bucket buffers, every bucket started after
// backward) must train the same.
Test(ddp03, matches_single_device_with_every_progress_and_packing, .timeout = 240) {
    RunResults o;
    run_oracle(SMALL, &o);
    check_equivalent(&o, 2, SMALL " --progress poll " SEVERAL_BUCKETS, -1);
    check_equivalent(&o, 3, SMALL " --progress poll --pack-buckets " SEVERAL_BUCKETS, -1);
    check_equivalent(&o, 4, SMALL " --pack-buckets " TWO_BUCKETS, 2);
    check_equivalent(&o, 2, SMALL " --progress thread --pack-buckets " PER_PARAM_BUCKETS, 28);
    check_equivalent(&o, 3, SMALL " --launch-after-backward " SEVERAL_BUCKETS, -1);
    results_free(&o);
}

Test(ddp03, matches_single_device_without_overlap, .timeout = 180) {
    RunResults o;
    run_oracle(SMALL, &o);
    check_equivalent(&o, 2, SMALL " --no-overlap", 0);
    check_equivalent(&o, 4, SMALL " --no-overlap", 0);
    results_free(&o);
}

// Accumulation: the same global batch (24 rows) as K=4 micro-batches per rank equals the
// oracle's one big batch.
Test(ddp03, grad_accum_4_matches_single_device, .timeout = 180) {
    RunResults o;
    run_oracle(SMALL, &o);
    check_equivalent(&o, 2, SMALL " --grad-accum 4 " SEVERAL_BUCKETS, -1);
    check_equivalent(&o, 3, SMALL " --grad-accum 4 " PER_PARAM_BUCKETS, 28);
    check_equivalent(&o, 1, SMALL " --grad-accum 4", 1);
    results_free(&o);
}

// The default tiny config (834,304 parameters, 2 buckets under the default caps), briefly.
Test(ddp03, tiny_default_config_matches_single_device, .timeout = 240) {
    RunResults o;
    run_oracle("--steps 2", &o);
    check_equivalent(&o, 4, "--steps 2", 2);  // the tiny config: no SMALL
    results_free(&o);
}

// Several buckets really are several: "several" gives more than 2 and fewer than 28.
Test(ddp03, bucket_caps_give_the_intended_counts, .timeout = 120) {
    RunResults r;
    run_ddp(2, SMALL_MODEL " --batch 24 --steps 1 " SEVERAL_BUCKETS, &r);
    double nb = results_get(&r, "buckets", -1);
    cr_assert(nb > 2 && nb < 28, "SEVERAL_BUCKETS gave %g buckets", nb);
    double total = 0;
    for (int b = 0; b < (int)nb && b < 16; b++) {
        char key[48];
        snprintf(key, sizeof key, "bucket_bytes_%d", b);
        total += results_get(&r, key, 0);
    }
    if (nb <= 16) cr_assert_eq(total, 4.0 * SMALL_NPARAMS, "buckets hold %g bytes, not all", total);
    results_free(&r);
}

// ---------------------------------------------------------------------------------------------
// communication volume

// Each rank sends and receives 2(N-1)/N x the gradient bytes per step (ring all-reduce), plus
// the same for the 4-byte loss, whatever the bucketing. N = 2, 4, 8 make every bucket's share
// an integer; for N = 3 each all-reduce rounds down (one per parameter: the buckets are views),
// so the total may be up to one byte per parameter (28) under the formula.
Test(ddp03, bytes_per_step_are_the_all_reduce_formula, .timeout = 180) {
    struct { int np; const char *flags; } runs[] = {
        {2, SEVERAL_BUCKETS}, {4, PER_PARAM_BUCKETS}, {8, "--no-overlap"}, {3, SEVERAL_BUCKETS},
        {2, "--progress poll --pack-buckets " SEVERAL_BUCKETS},
    };
    double S = 4.0 * SMALL_NPARAMS;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        RunResults r;
        char flags[256];
        snprintf(flags, sizeof flags, SMALL_MODEL " --batch 24 --steps 1 %s", runs[i].flags);
        run_ddp(runs[i].np, flags, &r);
        double N = runs[i].np, nar = 28;  // all-reduces per step, at most
        double grad = results_get(&r, "grad_bytes_sent_per_step", -1);
        double want = 2 * (N - 1) * S / N;
        double loss = floor(2 * (N - 1) * 4 / N);
        if (runs[i].np != 3) {
            cr_assert_eq(grad, want, "-np %d %s: %g gradient bytes sent per step, formula %g",
                         runs[i].np, runs[i].flags, grad, want);
        } else {
            cr_assert(grad <= want && grad > want - nar, "-np 3: %g bytes, formula %g", grad,
                      want);
        }
        cr_assert_eq(results_get(&r, "bytes_sent_per_step", -1), grad + loss,
                     "-np %d: all bytes sent per step = gradients + the loss", runs[i].np);
        cr_assert_eq(results_get(&r, "bytes_recv_per_step", -1), grad + loss,
                     "-np %d: received = sent (an all-reduce is symmetric)", runs[i].np);
        results_free(&r);
    }
}

// no_sync: K=4 micro-steps communicate once per step: the same bytes as K=1. Gradients differ
// across ranks inside no_sync (each rank saw other rows) and agree after the sync.
Test(ddp03, no_sync_gradients_differ_then_agree, .timeout = 120) {
    RunResults acc, one;
    run_ddp(2, SMALL_MODEL " --batch 24 --steps 3 --grad-accum 4 --check-no-sync " SEVERAL_BUCKETS, &acc);
    run_ddp(2, SMALL_MODEL " --batch 24 --steps 3 " SEVERAL_BUCKETS, &one);
    cr_assert_eq(results_get(&acc, "nosync_checks", -1), 9, "3 steps x 3 no_sync micro-steps");
    cr_assert_eq(results_get(&acc, "nosync_differ", -1), 9,
                 "inside no_sync the ranks' gradients must differ (%g of 9 did)",
                 results_get(&acc, "nosync_differ", -1));
    cr_assert_eq(results_get(&acc, "sync_checks", -1), 3);
    cr_assert_eq(results_get(&acc, "sync_agree", -1), 3, "after the sync gradients must agree");
    cr_assert_eq(results_get(&acc, "grad_bytes_sent_per_step", -1),
                 results_get(&one, "grad_bytes_sent_per_step", -2),
                 "accumulation must communicate once per step, not once per micro-step");
    results_free(&acc);
    results_free(&one);
}

// Memory: every rank holds the full model state (16 B/param in fp32); the buckets are views
// of the gradients (no memory) unless --pack-buckets gives them their own buffers.
Test(ddp03, every_rank_holds_the_full_model_state, .timeout = 120) {
    double S = 4.0 * SMALL_NPARAMS;
    for (int pack = 0; pack <= 1; pack++) {
        RunResults r;
        run_ddp(2, pack ? SMALL_MODEL " --batch 24 --steps 1 --pack-buckets " SEVERAL_BUCKETS
                        : SMALL_MODEL " --batch 24 --steps 1 " SEVERAL_BUCKETS, &r);
        cr_assert_eq(results_get(&r, "mem_params", -1), S);
        cr_assert_eq(results_get(&r, "mem_grads", -1), S);
        cr_assert_eq(results_get(&r, "mem_opt_m", -1), S);
        cr_assert_eq(results_get(&r, "mem_opt_v", -1), S);
        cr_assert_eq(results_get(&r, "mem_comm", -1), pack ? S : 0.0, "%s",
                     pack ? "packed bucket buffers: one copy of the gradients"
                          : "bucket views: no buffers");
        results_free(&r);
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 mixed precision (--dtype bf16): bf16 weights and gradients, the gradients all-reduced in
// bf16 (half the bytes), fp32 master weights and Adam m, v on every rank.
//
// On one rank DDP bf16 is chapter 00's --dtype bf16 training op for op: bit-exact. On N ranks
// each rank's gradient is a bf16 rounding of a partial sum over fewer rows, and every pairwise
// add of the bf16 all-reduce rounds again (to 8 significant bits), so the averaged gradient
// differs from the 1-rank one by up to ~2^-8 relative; through clipping and Adam that moves
// a master weight by a fraction of lr, and a bf16 weight next to a rounding boundary lands one
// bf16 step away (2^-8 = 3.9e-3 in [0.5, 1), 2^-7 = 7.8e-3 in [1, 2): the LayerNorm gains).
// Measured (6 steps of the small model, 2, 3, 4, 8 ranks, several buckets, views or packed,
// with and without overlap): losses differ from the 1-rank run by at most 9.9e-6 relative,
// weights by at most 3.9e-3 absolute. Bounds: losses 1e-4 relative (10x the worst), weights
// 8e-3 absolute (one bf16 step at 1.0; 2x the worst). With the gradient all-reduce removed
// (checked) the losses differ by 5.8e-3 (2 ranks) and 1.2e-2 (4 ranks) relative, 58x and 120x
// the bound, and the replicas differ; the weights alone (7e-3 apart after 6 steps) would not
// show it, the losses do.
#define BF16_LOSS_RTOL 1e-4f
#define BF16_PARAM_ATOL 8e-3f

Test(ddp03, bf16_one_rank_is_single_device_bf16_bit_exact, .timeout = 120) {
    RunResults o, r;
    run_oracle(SMALL " --dtype bf16", &o);
    run_ddp(1, SMALL " --dtype bf16 " SEVERAL_BUCKETS, &r);
    harness_assert_results_match("03_ddp -np 1 --dtype bf16", &r, &o, 0.0f, 0.0f);
    results_free(&o);
    results_free(&r);
}

Test(ddp03, bf16_matches_one_rank_bf16_on_2_and_4_ranks, .timeout = 240) {
    RunResults one;
    run_ddp(1, SMALL " --dtype bf16", &one);
    const struct { int np; const char *flags; } runs[] = {
        {2, SMALL " --dtype bf16 " SEVERAL_BUCKETS},
        {4, SMALL " --dtype bf16 " TWO_BUCKETS},
        {4, SMALL " --dtype bf16 --progress poll --pack-buckets " SEVERAL_BUCKETS},
        {2, SMALL " --dtype bf16 --no-overlap"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        RunResults r;
        run_ddp(runs[i].np, runs[i].flags, &r);
        char what[256];
        snprintf(what, sizeof what, "03_ddp -np %d %s", runs[i].np, runs[i].flags);
        harness_assert_results_match(what, &r, &one, BF16_LOSS_RTOL, BF16_PARAM_ATOL);
        cr_assert_eq(results_get(&r, "replica_max_diff", -1), 0.0,
                     "%s: the replicas' master weights differ after training", what);
        results_free(&r);
    }
    results_free(&one);
}

// Bytes per step: the all-reduce formula with S = 2 bytes x parameters (half of fp32's), for
// N = 2 and 4 (integer shares). The start broadcasts rank 0's fp32 master weights (4 B each).
// Memory: bf16 params and grads (2 B), fp32 master, m and v (4 B each): 16 B per parameter.
Test(ddp03, bf16_halves_the_gradient_bytes, .timeout = 120) {
    const double n = SMALL_NPARAMS, S = 2.0 * n;
    const int nps[] = {2, 4};
    for (int i = 0; i < 2; i++) {
        RunResults r;
        run_ddp(nps[i], SMALL_MODEL " --batch 24 --dtype bf16 --steps 2 " SEVERAL_BUCKETS, &r);
        double N = nps[i], want = 2 * (N - 1) * S / N;
        double loss = floor(2 * (N - 1) * 4 / N);
        cr_assert_eq(results_get(&r, "grad_bytes_sent_per_step", -1), want,
                     "-np %d --dtype bf16: %g gradient bytes sent per step, formula 2(N-1)/N x "
                     "2 B x %g = %g", nps[i], results_get(&r, "grad_bytes_sent_per_step", -1), n,
                     want);
        cr_assert_eq(results_get(&r, "bytes_sent_per_step", -1), want + loss);
        cr_assert_eq(results_get(&r, "bytes_recv_per_step", -1), want + loss);
        cr_assert_eq(results_get(&r, "bytes_sent_broadcast", -1), 4.0 * n,
                     "rank 0 broadcasts its fp32 master weights");
        cr_assert_eq(results_get(&r, "mem_params", -1), S, "bf16 weights: 2 B per parameter");
        cr_assert_eq(results_get(&r, "mem_grads", -1), S, "bf16 gradients: 2 B per parameter");
        cr_assert_eq(results_get(&r, "mem_master", -1), 4.0 * n, "fp32 master on every rank");
        cr_assert_eq(results_get(&r, "mem_opt_m", -1), 4.0 * n);
        cr_assert_eq(results_get(&r, "mem_opt_v", -1), 4.0 * n);
        results_free(&r);
    }
}

// ---------------------------------------------------------------------------------------------
// timeline and overlap report

// Read the trace JSON and find, on rank 0, a bucket's all-reduce span that is in flight while a
// backward block computes: [ts, ts+dur] of both intersect.
Test(ddp03, trace_shows_all_reduce_overlapping_backward, .timeout = 120) {
    const char *path = tmp_path("trace.json");
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "./03_ddp/run " SMALL_MODEL " --batch 24 --steps 3 %s --trace %s", PER_PARAM_BUCKETS,
             path);
    int rc = harness_mpirun(2, cmd, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(harness_contains(out, "communication hidden behind backward = "),
              "the share hidden is printed:\n%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no trace file %s", path);
    double comm[512][2], comp[512][2];
    int nc = 0, np = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        const char *ts = strstr(line, "\"ts\":"), *du = strstr(line, "\"dur\":");
        if (!ts || !du || !strstr(line, "\"pid\":0,")) continue;
        double t0 = atof(ts + 5), t1 = t0 + atof(du + 6);
        if (strstr(line, "all-reduce bucket") && nc < 512) { comm[nc][0] = t0; comm[nc][1] = t1; nc++; }
        if (strstr(line, "backward block") && np < 512) { comp[np][0] = t0; comp[np][1] = t1; np++; }
    }
    fclose(f);
    unlink(path);
    cr_assert(nc >= 3 * 28, "expected 28 bucket spans per step on rank 0, found %d in 3 steps", nc);
    cr_assert(np >= 3 * 2, "expected the backward blocks on rank 0, found %d", np);
    int overlapping = 0;
    for (int i = 0; i < nc; i++)
        for (int j = 0; j < np; j++)
            if (comm[i][0] < comp[j][1] && comp[j][0] < comm[i][1]) overlapping++;
    cr_assert(overlapping > 0, "no all-reduce span overlaps a backward block on rank 0");
    free(out);
}

// The share of communication hidden behind backward (overlap.c) means what it says: exactly 0
// when nothing is launched before backward ends (--no-overlap, --launch-after-backward), within
// (0, 100] % when buckets are launched inside backward (a bucket launched after a piece is in
// flight before backward ends, so more than 0), and not a number at all on one rank. With
// --overlap-steps 2, so the calibration runs as well. Seen failing with the old formula
// 100 (1 - (step - compute only) / comm only) put back: --no-overlap gave -368 %, -158 % and
// -1766 % on three runs, never exactly 0.
static double overlap_pct_of(int np, const char *flags) {
    RunResults r;
    char *log = NULL;
    int rc = harness_run_dump("./03_ddp/run --quiet --overlap-steps 2", np, flags, &r, &log, 120);
    cr_assert_eq(rc, 0, "03_ddp -np %d %s failed:\n%s", np, flags, log);
    free(log);
    double pct = results_get(&r, "overlap_pct", -1000.0);
    results_free(&r);
    return pct;
}

Test(ddp03, overlap_share_is_0_without_overlap_and_within_0_100_with_it, .timeout = 180) {
    double none = overlap_pct_of(2, SMALL_MODEL " --batch 24 --steps 3 --no-overlap");
    cr_assert_eq(none, 0.0, "--no-overlap: %g %% hidden, 0 by construction", none);
    double late = overlap_pct_of(3, SMALL_MODEL " --batch 24 --steps 3 --launch-after-backward " SEVERAL_BUCKETS);
    cr_assert_eq(late, 0.0, "--launch-after-backward: %g %% hidden, 0 by construction", late);
    double on = overlap_pct_of(2, SMALL_MODEL " --batch 24 --steps 3 " PER_PARAM_BUCKETS);
    cr_assert(on > 0.0 && on <= 100.0, "overlap: %g %% hidden, want (0, 100]", on);
    double poll = overlap_pct_of(2, SMALL_MODEL " --batch 24 --steps 3 --progress poll " SEVERAL_BUCKETS);
    cr_assert(poll > 0.0 && poll <= 100.0, "--progress poll: %g %% hidden, want (0, 100]", poll);
    double one = overlap_pct_of(1, SMALL_MODEL " --batch 24 --steps 2");
    cr_assert_eq(one, -1000.0, "one rank communicates nothing: no figure, got %g", one);
    char *out = NULL;
    int rc = harness_mpirun(1, "./03_ddp/run " SMALL_MODEL " --batch 24 --steps 2", &out, 60);
    cr_assert(rc == 0 && harness_contains(out, "cannot be measured on this run: one rank"),
              "one rank says why there is no figure:\n%s", out);
    free(out);
}

// ---------------------------------------------------------------------------------------------
// reliability

// N steps == K steps, save, resume, N-K steps: bit-identical, on 2 ranks.
Test(ddp03, resume_is_bit_exact, .timeout = 240) {
    harness_assert_resume_exact(DDP, 2, SMALL_MODEL " --batch 24 --steps 8", 5);
}

// Without --quiet, on 2 ranks and resumed at step 3: "resumed from" once, the progress lines
// once for the whole job (rank 0) from the resumed step on, with the run's losses, and the
// per-rank table's bytes sent per step equal to the dump's (a counter reset on the wrong rank
// or at the wrong time shows only here).
// Mutant: mutants/session-progress-every-rank.patch
Test(ddp03, printed_progress_and_table_match_the_run, .timeout = 180) {
    const char *ck = tmp_path("print.ckpt");
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s " SMALL_MODEL " --batch 24 --steps 7 --stop-at 3 --save %s", DDP, ck);
    int rc = harness_mpirun(2, cmd, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    out = NULL;
    RunResults r;
    snprintf(cmd, sizeof cmd, SMALL_MODEL " --batch 24 --steps 7 --log-every 2 --grad-accum 2 --check-no-sync --resume %s", ck);
    rc = harness_run_dump("./03_ddp/run --overlap-steps 0", 2, cmd, &r, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    const char *once = strstr(out, "resumed from");
    cr_assert(once && !strstr(once + 1, "resumed from"), "\"resumed from\" not once:\n%s", out);
    cr_assert(harness_progress_matches(out, &r, 3, 7, 7, 2),
              "the progress lines do not say the run (details above on stderr)");
    const char *title = "Per rank (per step; every rank does the same work: no master)";
    double sent = results_get(&r, "bytes_sent_per_step", -1);
    char want[32], cell[32];
    mem_format(want, sizeof want, sent);
    for (int rank = 0; rank < 2; rank++) {
        cr_assert(harness_table_cell(out, title, rank, 3, cell, sizeof cell), "no table:\n%s",
                  out);
        cr_assert_str_eq(cell, want, "rank %d's sent per step %s, the run's %.0f B = %s", rank,
                         cell, sent, want);
    }
    char line[96];
    snprintf(line, sizeof line, "(+ the loss) = %.0f B on every rank", sent);
    cr_assert(harness_contains(out, line), "no \"%s\":\n%s", line, out);
    unlink(ck);
    results_free(&r);
    free(out);
}

// A NaN in one rank's gradient reaches every rank through the all-reduce; the job stops with
// a message naming the step, promptly, and the last checkpoint survives.
Test(ddp03, nan_fails_cleanly_and_keeps_the_checkpoint, .timeout = 120) {
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};  // SMALL
    harness_assert_nan_fails_cleanly(DDP, 3, SMALL_MODEL " --batch 24 --steps 10", &cfg);
}

// A rank that dies mid-run (no MPI_Finalize) ends the whole job promptly: no rank hangs in an
// all-reduce, and the checkpoint written before is intact.
Test(ddp03, killed_rank_ends_the_job_promptly, .timeout = 120) {
    const char *ck = tmp_path("kill.ckpt");
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, DDP " " SMALL_MODEL " --batch 24 --steps 200 --save %s --save-every 1 --kill-rank 2 --kill-step 3", ck);
    double t0 = lab_now();
    int rc = harness_mpirun(4, cmd, &out, 60);
    double took = lab_now() - t0;
    cr_assert_neq(rc, 0, "the job must fail when a rank dies:\n%s", out);
    cr_assert_neq(rc, 124, "the job hung after rank 2 died:\n%s", out);
    cr_assert(took < 30, "the job took %.1f s to end after a rank died", took);
    cr_assert(harness_contains(out, "exiting abruptly at step 3"), "%s", out);
    GPT2Config cfg = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
    size_t n = gpt2_param_count(&cfg);
    TrainState st = {.params = malloc(n * 4), .m = malloc(n * 4), .v = malloc(n * 4)};
    ckpt_load_state(ck, &cfg, &st);
    // rank 0 saved after steps 1, 2, 3; step 3's all-reduce can never complete without rank 2
    cr_assert_eq(st.step, 3, "the checkpoint should be the one after 3 steps, not %d", st.step);
    free(st.params); free(st.m); free(st.v);
    unlink(ck);
    free(out);
}

Test(ddp03, uneven_batch_is_refused_with_a_clear_message, .timeout = 60) {
    char *out = NULL;
    int rc = harness_mpirun(3, DDP " " SMALL_MODEL " --steps 6 --batch 16", &out, 60);
    cr_assert(rc != 0 && rc != 124, "rc %d", rc);
    cr_assert(harness_contains(out, "--batch 16") && harness_contains(out, "--batch 18"), "%s", out);
    free(out);
    rc = harness_mpirun(2, DDP " " SMALL " --grad-accum 5", &out, 60);
    cr_assert(rc != 0 && rc != 124, "rc %d", rc);
    cr_assert(harness_contains(out, "--grad-accum 5"), "%s", out);
    free(out);
}

// ---------------------------------------------------------------------------------------------
// the bucket machinery, without MPI

// PyTorch's model.parameters() order for GPT-2: wte, wpe, block 0's twelve, ..., lnfw, lnfb.
Test(ddp03_units, module_order_is_pytorch_parameters_order) {
    GPT2Config cfg = {.V = 64, .T = 16, .L = 3, .C = 32, .NH = 2};
    GPT2Param p[4 + 12 * 3];
    cr_assert_eq(ddp_module_order(&cfg, p), 4 + 12 * 3);
    cr_assert_str_eq(p[0].name, "wte");
    cr_assert_str_eq(p[1].name, "wpe");
    const char *block[12] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                             "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 12; t++) {
            char want[32];
            snprintf(want, sizeof want, "h.%d.%s", l, block[t]);
            cr_assert_str_eq(p[2 + 12 * l + t].name, want);
        }
    cr_assert_str_eq(p[38].name, "lnfw");
    cr_assert_str_eq(p[39].name, "lnfb");
    // every element of the flat buffer exactly once
    size_t total = 0;
    for (int i = 0; i < 40; i++) total += p[i].size;
    cr_assert_eq(total, gpt2_param_count(&cfg));
}

// When is a gradient final? Pieces run head (0), block L-1 (1), ..., block 0 (L), embedding.
Test(ddp03_units, ready_piece_follows_backward_and_the_tied_embedding) {
    GPT2Config cfg = {.V = 64, .T = 16, .L = 3, .C = 32, .NH = 2};
    GPT2Param p[40];
    ddp_module_order(&cfg, p);
    cr_assert_eq(ddp_num_pieces(&cfg), 5);
    cr_assert_eq(ddp_ready_piece(&p[0], 3), 4, "wte: only after the embedding (tied weights)");
    cr_assert_eq(ddp_ready_piece(&p[1], 3), 4, "wpe: after the embedding");
    cr_assert_eq(ddp_ready_piece(&p[2], 3), 3, "block 0: the last block backward runs");
    cr_assert_eq(ddp_ready_piece(&p[2 + 24], 3), 1, "block 2: right after the head");
    cr_assert_eq(ddp_ready_piece(&p[38], 3), 0, "lnfw: the head");
}

// ---------------------------------------------------------------------------------------------
// Exercise 03.1: bucket assignment (a pure function: no MPI needed)

static int assign(const size_t *bytes, int n, size_t first, size_t cap, int *of) {
    for (int i = 0; i < n; i++) of[i] = -1;
    return ddp_assign_buckets(bytes, n, first, cap, of);
}

// The number of buckets ddp_assign_buckets returns for bytes[0..n), first cap, cap.
#define expect_buckets(got, want, bytes, n, first, cap)                                           \
    expect_eq((got), (want), "buckets of ddp_assign_buckets(%d parameters of %zu, %zu, ... bytes, " \
              "first cap %zu, cap %zu)", (n), (size_t)(bytes)[0], (size_t)(bytes)[1],           \
              (size_t)(first), (size_t)(cap))

static void assert_assignment(const int *got, const int *want, int n) {
    for (int i = 0; i < n; i++)
        expect_eq(got[i], want[i], "the bucket of parameter %d (in the order the gradients become ready)", i);
}

// A bucket closes when its size reaches the cap: 40+40 = 80 >= 50 closes the first,
// 40+40+40 = 120 >= 100 the second.
Test(ex03_1, a_bucket_closes_when_it_reaches_its_cap) {
    size_t bytes[5] = {40, 40, 40, 40, 40};
    int of[5], want[5] = {0, 0, 1, 1, 1};
    expect_buckets(assign(bytes, 5, 50, 100, of), 2, bytes, 5, 50, 100);
    assert_assignment(of, want, 5);
}

// Exactly at the cap counts as full (>=, not >).
Test(ex03_1, exactly_the_cap_is_full) {
    size_t bytes[4] = {50, 50, 50, 7};
    int of[4], want[4] = {0, 1, 1, 2};
    expect_buckets(assign(bytes, 4, 50, 100, of), 3, bytes, 4, 50, 100);
    assert_assignment(of, want, 4);
}

// The first bucket has its own (small) cap, every later one the big cap.
Test(ex03_1, the_first_bucket_has_its_own_cap) {
    size_t bytes[8] = {10, 10, 10, 10, 10, 10, 10, 10};
    int of[8], want[8] = {0, 1, 1, 1, 2, 2, 2, 3};
    expect_buckets(assign(bytes, 8, 10, 30, of), 4, bytes, 8, 10, 30);
    assert_assignment(of, want, 8);
}

Test(ex03_1, cap_zero_gives_one_bucket_per_parameter) {
    size_t bytes[6] = {4, 400, 4, 4000, 4, 4};
    int of[6], want[6] = {0, 1, 2, 3, 4, 5};
    expect_buckets(assign(bytes, 6, 0, 0, of), 6, bytes, 6, 0, 0);
    assert_assignment(of, want, 6);
}

Test(ex03_1, huge_caps_give_one_bucket) {
    size_t bytes[5] = {4, 400, 4, 4000, 4};
    int of[5], want[5] = {0, 0, 0, 0, 0};
    expect_buckets(assign(bytes, 5, 1u << 30, 1u << 30, of), 1, bytes, 5, 1u << 30, 1u << 30);
    assert_assignment(of, want, 5);
}

// The tiny model (834,304 parameters) under PyTorch's defaults (first 1 MiB, then 25 MiB), in
// reverse module order: lnfb, lnfw and block 3 hold 794,112 bytes; h.2.fcprojb (512 B) and
// h.2.fcprojw (262,144 B) bring the first bucket to 1,056,768 >= 1 MiB. Worked out by hand from
// the tensor shapes (C = 128, 4C = 512).
Test(ex03_1, tiny_model_default_caps) {
    GPT2Config cfg = gpt2_config_tiny();
    GPT2Param p[52];
    expect_eq(ddp_module_order(&cfg, p), 52, "parameters of the tiny model in module order");
    size_t bytes[52];
    char names[52][32];
    for (int i = 0; i < 52; i++) {  // reverse module order
        bytes[i] = p[51 - i].size * 4;
        snprintf(names[i], 32, "%s", p[51 - i].name);
    }
    int of[52];
    expect_eq(assign(bytes, 52, 1u << 20, 25u << 20, of), 2,
              "buckets of the tiny model's 52 parameters (reverse module order), first cap 1 MiB, cap 25 MiB");
    expect_str_eq(names[15], "h.2.fcprojw", "the 16th parameter in reverse module order");
    for (int i = 0; i < 52; i++)
        expect_eq(of[i], i <= 15 ? 0 : 1, "the bucket of %s (parameter %d in reverse module order; the "
                  "first bucket closes at h.2.fcprojw, 1,056,768 >= 1 MiB bytes)", names[i], i);
}

// ---------------------------------------------------------------------------------------------
// Exercise 03.2: launch on ready (tests/mpi_ddp_launch.c runs real backward pieces with hooks
// on a hand-made bucket layout, checks when each bucket starts and the averaged gradients)

static void run_launch_check(int np, const char *flags) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tests/mpi_ddp_launch %s", harness_build_dir(), flags);
    int rc = harness_mpirun(np, cmd, &out, 30);
    cr_assert(rc == 0, "%s", expect_msg_log("exit 0", expect_fmt_(rc), out,
              "mpirun -np %d mpi_ddp_launch %s: its checks (the FAIL lines below say which value "
              "came out and which was expected)", np, flags));
    cr_assert(harness_contains(out, "mpi_ddp_launch: OK"), "%s",
              expect_msg_log("the line \"mpi_ddp_launch: OK\"", "no such line", out,
                             "mpirun -np %d mpi_ddp_launch %s: its summary", np, flags));
    free(out);
}

Test(ex03_2, buckets_launch_as_soon_as_complete_on_2_ranks, .timeout = 90) {
    run_launch_check(2, "");
}
Test(ex03_2, buckets_launch_as_soon_as_complete_on_3_ranks, .timeout = 90) {
    run_launch_check(3, "");
}
Test(ex03_2, views_on_the_communication_thread_on_2_and_3_ranks, .timeout = 90) {
    run_launch_check(2, "--thread-views");
    run_launch_check(3, "--thread-views");
}

// ---------------------------------------------------------------------------------------------
// The communication thread (common/dist.h) that runs the buckets by default:
// tests/mpi_ddp_comm_thread.c against the blocking all-reduce, on 1 to 8 ranks.

Test(ddp03, comm_thread_all_reduce_equals_blocking_on_1_to_8_ranks, .timeout = 120) {
    const int nps[] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tests/mpi_ddp_comm_thread", harness_build_dir());
        int rc = harness_mpirun(nps[i], cmd, &out, 60);
        cr_assert_eq(rc, 0, "mpi_ddp_comm_thread -np %d failed (rc %d):\n%s", nps[i], rc, out);
        cr_assert(harness_contains(out, "mpi_ddp_comm_thread: OK"), "%s", out);
        free(out);
    }
}

// While an all-reduce is queued on the thread the caller may not use MPI (thread level
// SERIALIZED): refused with a message, on every rank, not a hang or a race.
Test(ddp03, comm_thread_refuses_mpi_calls_while_ops_are_queued, .timeout = 60) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tests/mpi_ddp_comm_thread --misuse", harness_build_dir());
    int rc = harness_mpirun(2, cmd, &out, 30);
    cr_assert_neq(rc, 0, "the misuse was not refused:\n%s", out);
    cr_assert(harness_contains(out, "queued on the communication thread"), "%s", out);
    cr_assert(!harness_contains(out, "NOT refused"), "%s", out);
    free(out);
}

// ---------------------------------------------------------------------------------------------
// Exercise 03.3: no_sync gradient accumulation. Run with --no-overlap (one all-reduce, no
// buckets), so these tests need no other exercise.

Test(ex03_3, accumulation_matches_single_device, .timeout = 180) {
    RunResults o;
    run_oracle(SMALL, &o);
    check_equivalent(&o, 2, SMALL " --no-overlap --grad-accum 4", 0);
    check_equivalent(&o, 3, SMALL " --no-overlap --grad-accum 2", 0);
    results_free(&o);
}

Test(ex03_3, only_the_last_micro_step_communicates, .timeout = 120) {
    RunResults r;
    run_ddp(2, SMALL_MODEL " --batch 24 --steps 3 --no-overlap --grad-accum 4 --check-no-sync", &r);
    const char *run = "03_ddp -np 2 --steps 3 --grad-accum 4 --check-no-sync";
    expect_eq(results_get(&r, "nosync_checks", -1), 9,
              "micro-steps checked inside no_sync (3 steps x 3 no_sync micro-steps), %s", run);
    expect_eq(results_get(&r, "nosync_differ", -1), 9,
              "no_sync micro-steps whose gradients differ across ranks (nothing communicated inside "
              "no_sync), %s", run);
    expect_eq(results_get(&r, "sync_agree", -1), 3,
              "steps whose gradients agree across ranks after the last micro-step (it all-reduces), %s", run);
    expect_eq(results_get(&r, "grad_bytes_sent_per_step", -1), 4.0 * SMALL_NPARAMS,
              "gradient bytes sent per step (one all-reduce: 2(N-1)/N x S = S on 2 ranks), %s", run);
    results_free(&r);
}
