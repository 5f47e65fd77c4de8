// test_guard.c: the loop's guard (common/session_guard.c): a loss spike (--inject-spike-step)
// found by its z-score and skipped or rolled back, the same on every rank and layout; a NaN
// skipped (--on-nan skip) leaves the weights of a run whose step did no update; a clean run
// raises no alarm. (The OOM fault is every chapter's: test_reliability, harness_oom_fails_cleanly.)
//
// The run: MODEL for 18 steps, step 15's batch corrupted (every token id off by V/2). A window
// of 5 steps (--spike-window 5): this early the loss still falls fast, and over the default
// 20 steps the fall itself widens the window (a z of 2 at step 15); over 5 the spike's z is 8.4,
// the other steps' at most 1.3, against the default --spike-z 6.
//
// Oracles. Chapter 00 is the truth for 09 (dp, tp, pp) = (2, 2, 2); a skip or a rollback is
// checked against runs that do the same by other means: a checkpoint whose step is moved on
// by one is a state whose next step did no update (AdamW's step count and the lr schedule go
// on, the weights and Adam's m, v stay), and a replay at half the lr is a --resume with
// --lr halved (the schedule is linear in --lr, and halving a float is exact).
//
// Tolerances (09 against 00): test_09_3d.c's 1e-6 relative on losses; on weights its 1e-5 was
// measured over 3 steps, and over these 18 steps the CLEAN run's weights already differ from
// 00's by 6.2e-6 (measured; with the skip or the rollback: the same 6.2e-6), so 2e-5 here. A
// step's update is ~5e-4 on the weights (the skipped run against the one that warned), 25x
// the bound: a rank that updated when the others skipped is seen.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "gpt2.h"
#include "harness.h"

#define MODEL "--layers 2 --channels 64 --heads 4 --seq 32 --batch 8"
static const GPT2Config CFG = {.V = 256, .T = 32, .L = 2, .C = 64, .NH = 4};
#define SPIKE MODEL " --steps 18 --spike-window 5 --inject-spike-step 15"
#define ORACLE "./00_memory_budget/run --train --quiet"
#define ORACLE_SAYS "./00_memory_budget/run --train --log-every 0"  // (its messages: no --quiet)
#define RUN3D "./09_3d/run --quiet --tp 2 --pp 2"
#define LOSS_RTOL 1e-6f
#define PARAM_ATOL 2e-5f

static char *tmp(const char *tag) {
    static char buf[8][256];
    static int i = 0;
    char *p = buf[i++ % 8];
    snprintf(p, 256, "/tmp/lab_testguard_%d_%s", (int)getpid(), tag);
    return p;
}

static void run(const char *prog, int np, const char *flags, RunResults *out) {
    harness_assert_run_dump(prog, np, flags, out);
}


// The integer after "key": in line, or -1.
static int json_int(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? atoi(p + strlen(k)) : -1;
}

// --log of an 18-step run: step `at` (1-based) says "skipped":"<why>" and no other step was
// skipped; the last line counts `spikes` spike skips, `nans` NaN skips and `rollbacks`
// rollbacks. A rolled-back run logs its replayed steps again (lines are matched by their
// "step"): step `at` once more, as the step its rollback skips ("skipped":"rollback").
static void assert_log(const char *path, int at, const char *why, int spikes, int nans, int rollbacks) {
    char *l[64];
    int n = harness_read_lines(path, l, 64), seen = 0;
    cr_assert(n >= 18, "%s: %d lines, not 18 or more", path, n);
    char want[64];
    for (int i = 0; i < n; i++) {
        int step = json_int(l[i], "step"), is_at = step == at;
        snprintf(want, sizeof want, "\"skipped\":\"%s\"", seen ? "rollback" : why);
        cr_assert(!is_at || strstr(l[i], want), "%s: step %d is not %s:\n%s", path, step, want, l[i]);
        cr_assert(is_at || strstr(l[i], "\"skipped\":null"), "%s: step %d was skipped:\n%s", path,
                  step, l[i]);
        seen += is_at;
    }
    cr_assert_eq(seen, 1 + rollbacks, "%s: step %d logged %d times", path, at, seen);
    cr_assert_eq(json_int(l[n - 1], "spike_skips"), spikes, "%s: %s", path, l[n - 1]);
    cr_assert_eq(json_int(l[n - 1], "nan_skips"), nans, "%s: %s", path, l[n - 1]);
    cr_assert_eq(json_int(l[n - 1], "rollback_skips"), rollbacks, "%s: %s", path, l[n - 1]);
    cr_assert_eq(json_int(l[n - 1], "rollbacks"), rollbacks, "%s: %s", path, l[n - 1]);
    for (int i = 0; i < n; i++) free(l[i]);
}

// Bit for bit: every loss from `from` (0-based) on, and every weight.
static void assert_identical(const char *what, const RunResults *a, const RunResults *b, int from) {
    cr_assert(a->nsteps == b->nsteps && a->nparams == b->nparams, "%s: shapes differ", what);
    for (int i = from; i < a->nsteps; i++)
        cr_assert(memcmp(&a->losses[i], &b->losses[i], sizeof(float)) == 0,
                  "%s: the loss of step %d is %.9g, not %.9g", what, i + 1, a->losses[i], b->losses[i]);
    for (size_t i = 0; i < a->nparams; i++)
        cr_assert(memcmp(&a->params[i], &b->params[i], sizeof(float)) == 0,
                  "%s: weight %zu is %.9g, not %.9g", what, i, a->params[i], b->params[i]);
}

// The training state in path, its step moved to `step`: the state of a run whose step `step`
// (1-based) did no update, written in format 1 (no identity: a --resume with another --lr
// than the state's run is then only noted).
static void move_step(const char *path, int step) {
    size_t n = gpt2_param_count(&CFG);
    TrainState st = {.params = malloc(n * 4), .m = malloc(n * 4), .v = malloc(n * 4)};
    ckpt_load_state(path, &CFG, &st);
    st.step = step;
    ckpt_set_identity(NULL);
    ckpt_save_state(path, &st);
    free(st.params), free(st.m), free(st.v);
}

// ---- a loss spike, skipped --------------------------------------------------------------------

// Rank 0 decides and every rank follows: 00 and the 8 ranks of 09 skip step 15 alone, with the
// same losses and weights; the run that only warned differs (the skip mattered).
// Mutant: mutants/spike-decision-per-rank.patch
Test(guard, spike_skip_on_2x2x2_matches_single_device, .timeout = 300) {
    char f00[512], f09[512], fw[256];
    snprintf(f00, sizeof f00, SPIKE " --on-spike skip --log %s", tmp("skip00.jsonl"));
    snprintf(f09, sizeof f09, SPIKE " --on-spike skip --log %s", tmp("skip09.jsonl"));
    snprintf(fw, sizeof fw, SPIKE " --on-spike warn");
    RunResults a, b, w;
    run(ORACLE, 1, f00, &a);
    run(RUN3D, 8, f09, &b);
    run(ORACLE, 1, fw, &w);
    assert_log(tmp("skip00.jsonl"), 15, "spike", 1, 0, 0);
    assert_log(tmp("skip09.jsonl"), 15, "spike", 1, 0, 0);
    harness_assert_results_match("09 (2,2,2) --on-spike skip vs 00", &b, &a, LOSS_RTOL, PARAM_ATOL);
    float dl, dp;
    cr_assert(harness_diffs("test_guard", "warn vs skip", &w, &a, &dl, &dp), "shapes differ");
    cr_assert(dp > 10 * PARAM_ATOL, "the skip changed the weights by %g only", dp);
    results_free(&a), results_free(&b), results_free(&w);
    unlink(tmp("skip00.jsonl")), unlink(tmp("skip09.jsonl"));
}

// ---- a loss spike, rolled back ----------------------------------------------------------------

#define ROLLBACK " --on-spike rollback --save-every 10 --rollback-lr-scale 0.5"

// 09's rollback reads the checkpoint back through its own --resume code (its state.load) on 8
// ranks: the same losses (the replayed steps' too) and weights as 00's rollback.
// Mutant: mutants/3d-rollback-reads-nothing.patch
Test(guard, spike_rollback_on_2x2x2_matches_single_device, .timeout = 300) {
    char f00[512], f09[512];
    snprintf(f00, sizeof f00, SPIKE ROLLBACK " --save %s --log %s", tmp("rb00.ckpt"), tmp("rb00.jsonl"));
    snprintf(f09, sizeof f09, SPIKE ROLLBACK " --save %s --log %s", tmp("rb09.ckpt"), tmp("rb09.jsonl"));
    RunResults a, b;
    run(ORACLE, 1, f00, &a);
    run(RUN3D, 8, f09, &b);
    assert_log(tmp("rb00.jsonl"), 15, "spike", 1, 0, 1);
    assert_log(tmp("rb09.jsonl"), 15, "spike", 1, 0, 1);
    harness_assert_results_match("09 (2,2,2) --on-spike rollback vs 00", &b, &a, LOSS_RTOL, PARAM_ATOL);
    results_free(&a), results_free(&b);
    const char *rm[] = {"rb00.ckpt", "rb09.ckpt", "rb00.jsonl", "rb09.jsonl"};
    for (int i = 0; i < 4; i++) unlink(tmp(rm[i]));
}

// What a rollback does, built from other runs: the checkpoint of step 10 (--stop-at 10), steps
// 11-14 again at half the lr (--resume --lr 0.0005 --stop-at 14), step 15 without an update
// (the state's step moved on), then 16-18 at --lr (--resume): bit for bit the rollback's
// losses and weights. And with a scale of 1 the replay changes nothing: the rollback ends
// where --on-spike skip does, bit for bit.
// Mutant: mutants/rollback-lr-not-lowered.patch
Test(guard, rollback_is_a_resume_a_replay_and_a_skip, .timeout = 300) {
    char f[768], *ck = tmp("rbx.ckpt"), *ck2 = tmp("rbx2.ckpt");
    RunResults r, half, rest, one, skip;
    snprintf(f, sizeof f, SPIKE ROLLBACK " --save %s", tmp("rbx_run.ckpt"));
    run(ORACLE, 1, f, &r);
    // the oracle: 10 steps, 4 at half the lr, step 15 skipped, 3 more
    snprintf(f, sizeof f, MODEL " --steps 18 --stop-at 10 --save %s", ck);
    RunResults first;
    run(ORACLE, 1, f, &first);
    snprintf(f, sizeof f, MODEL " --steps 18 --resume %s --lr 0.0005 --allow-changed lr --stop-at 14 "
             "--save %s", ck, ck2);
    run(ORACLE, 1, f, &half);
    move_step(ck2, 15);
    snprintf(f, sizeof f, MODEL " --steps 18 --resume %s", ck2);
    run(ORACLE, 1, f, &rest);
    for (int i = 10; i < 14; i++)
        cr_assert(memcmp(&r.losses[i], &half.losses[i], 4) == 0, "replayed step %d: loss %.9g, "
                  "not the half-lr resume's %.9g", i + 1, r.losses[i], half.losses[i]);
    assert_identical("the rollback vs resume + half lr + skip", &r, &rest, 15);
    // a scale of 1: the same as a skip
    snprintf(f, sizeof f, SPIKE " --on-spike rollback --save-every 10 --save %s", tmp("rb1.ckpt"));
    run(ORACLE, 1, f, &one);
    run(ORACLE, 1, SPIKE " --on-spike skip", &skip);
    assert_identical("a rollback at lr x 1 vs a skip", &one, &skip, 0);
    results_free(&r), results_free(&first), results_free(&half), results_free(&rest);
    results_free(&one), results_free(&skip);
    const char *rm[] = {"rbx.ckpt", "rbx2.ckpt", "rbx_run.ckpt", "rb1.ckpt"};
    for (int i = 0; i < 4; i++) unlink(tmp(rm[i]));
}

// ---- a resume decides as the uninterrupted run --------------------------------------------------

// The state after 12 steps (--stop-at 12), resumed: step 15's spike comes 3 steps after the
// restart, fewer than the HEALTH_Z_MIN (5) values a z-score needs, so a resumed run whose
// window started empty would not see it, and would update. The guard's record in the state
// (format 3: the windows, the counts) brings the window back: the resumed run skips step 15 and
// ends bit for bit where the uninterrupted run does; its count goes on (1 spike skip).
static void resume_case(const char *prog, int np, const char *extra, const char *tag) {
    char f[768], ck[64], lg[64], what[128];
    snprintf(ck, sizeof ck, "res_%s.ckpt", tag);
    snprintf(lg, sizeof lg, "res_%s.jsonl", tag);
    const char *ckp = tmp(ck), *lgp = tmp(lg);
    RunResults whole, first, rest;
    snprintf(f, sizeof f, SPIKE " --on-spike skip --save %s.whole%s", ckp, extra);
    run(prog, np, f, &whole);
    // (the first 12 steps: no spike yet to inject)
    snprintf(f, sizeof f, MODEL " --steps 18 --spike-window 5 --on-spike skip --stop-at 12 "
             "--save %s%s", ckp, extra);
    run(prog, np, f, &first);
    snprintf(f, sizeof f, SPIKE " --on-spike skip --resume %s --log %s --save %s.rest%s", ckp, lgp,
             ckp, extra);
    run(prog, np, f, &rest);
    snprintf(what, sizeof what, "%s: resumed at 12 vs uninterrupted", tag);
    assert_identical(what, &whole, &rest, 12);
    char *l[32];
    int n = harness_read_lines(lgp, l, 32);
    cr_assert(n == 6, "%s: %d lines, not 6", lgp, n);
    cr_assert(strstr(l[2], "\"skipped\":\"spike\""), "%s: step 15 was not skipped:\n%s", tag, l[2]);
    cr_assert_eq(json_int(l[n - 1], "spike_skips"), 1, "%s: %s", tag, l[n - 1]);
    for (int i = 0; i < n; i++) free(l[i]);
    results_free(&whole), results_free(&first), results_free(&rest);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s %s %s.*", ckp, lgp, ckp);
    cr_assert_eq(system(rm), 0);
}

// On 00 (one file) and on 09, (tp, pp) = (2, 2), with --save-sharded (the record in rank 0's
// manifest; every rank takes it from rank 0).
// Mutant: mutants/guard-resume-forgets-window.patch
Test(guard, a_resume_decides_as_the_uninterrupted_run, .timeout = 300) {
    resume_case(ORACLE, 1, "", "00");
    resume_case("./09_3d/run --quiet --tp 2 --pp 2", 4, " --save-sharded", "09sharded");
}

// The number after "key": in line (a JSON number, or null: NaN).
static double json_double(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    if (!p || strncmp(p + strlen(k), "null", 4) == 0) return NAN;
    return strtod(p + strlen(k), NULL);
}

// A state saved with a window of 8 (the losses of steps 5 .. 12) resumed with --spike-window 6:
// the window keeps the newest 6 (steps 7 .. 12), so step 13's logged z-score is its loss against
// their mean and standard deviation (to rounding: the ring adds them in another order).
// Mutant: mutants/guard-resume-forgets-window.patch
Test(guard, a_resume_with_another_window_keeps_the_newest_values, .timeout = 120) {
    char f[512], *ck = tmp("win.ckpt"), *lg = tmp("win.jsonl");
    RunResults first, rest;
    snprintf(f, sizeof f, MODEL " --steps 18 --spike-window 8 --on-spike skip --stop-at 12 --save %s", ck);
    run(ORACLE, 1, f, &first);
    snprintf(f, sizeof f, MODEL " --steps 18 --spike-window 6 --on-spike skip --resume %s --log %s",
             ck, lg);
    run(ORACLE, 1, f, &rest);
    double mean = 0, var = 0;
    for (int i = 6; i < 12; i++) mean += first.losses[i] / 6.0;
    for (int i = 6; i < 12; i++) var += (first.losses[i] - mean) * (first.losses[i] - mean) / 6.0;
    const double want = (rest.losses[12] - mean) / sqrt(var);
    char *l[8];
    int n = harness_read_lines(lg, l, 8);
    cr_assert(n == 6, "%s: %d lines, not 6", lg, n);
    const double z = json_double(l[0], "z_loss");
    cr_assert(fabs(z - want) <= 1e-9 * fabs(want), "step 13's z-score is %.12g, not %.12g (the "
              "newest 6 of the saved 8 losses)", z, want);
    for (int i = 0; i < n; i++) free(l[i]);
    results_free(&first), results_free(&rest);
    unlink(ck), unlink(lg);
}

// A state without the record (format 2: a run that only warned saved it) resumed by a guarded
// run: one note, and the window starts empty.
Test(guard, a_state_without_the_record_is_noted, .timeout = 120) {
    char f[512], *out = NULL, *ck = tmp("v2.ckpt");
    RunResults first;
    snprintf(f, sizeof f, MODEL " --steps 18 --stop-at 12 --save %s", ck);
    run(ORACLE, 1, f, &first);
    results_free(&first);
    snprintf(f, sizeof f, ORACLE_SAYS " " SPIKE " --on-spike skip --resume %s", ck);
    int rc = harness_mpirun(1, f, &out, 60);
    cr_assert(rc == 0 && harness_contains(out, "holds no spike-detector window"),
              "no note (exit %d):\n%s", rc, out);
    free(out);
    unlink(ck);
}

// ---- no false alarm -----------------------------------------------------------------------------

// 200 clean steps of a small, noisy run (batch 8 x 16, lr 3e-3: its losses' z-scores reach
// +4.3, measured) under --on-spike stop and the default --spike-z 6 and window: no spike.
// Mutant: mutants/health-z-over-variance.patch
Test(guard, a_clean_run_of_200_steps_raises_no_alarm, .timeout = 300) {
    char *out = NULL;
    int rc = harness_mpirun(1, ORACLE " --layers 1 --channels 32 --heads 2 --seq 16 --batch 8 "
                            "--lr 3e-3 --steps 200 --on-spike stop", &out, 120);
    cr_assert(rc == 0 && !harness_contains(out, "spike"), "a clean run found a spike (exit %d):\n%s",
              rc, out);
    free(out);
}

// ---- NaN/Inf skipped ----------------------------------------------------------------------------

#define NAN12 MODEL " --steps 18 --inject-nan-step 12 --on-nan skip"

// The run whose step 12 did no update, built from checkpoints: the state after 11 steps, its
// step moved to 12, resumed to 18.
static void no_update_at_12(RunResults *out) {
    char f[512], *ck = tmp("nan.ckpt");
    RunResults first;
    snprintf(f, sizeof f, MODEL " --steps 18 --stop-at 11 --save %s", ck);
    run(ORACLE, 1, f, &first);
    results_free(&first);
    move_step(ck, 12);
    snprintf(f, sizeof f, MODEL " --steps 18 --resume %s", ck);
    run(ORACLE, 1, f, out);
    unlink(ck);
}

// A NaN in step 12's gradient under --on-nan skip: the run goes on, says so (the end's count,
// the --log line), and its weights are bit for bit those of a run whose step 12 did no update:
// the weights and Adam's m, v untouched.
// Mutant: mutants/nan-skip-moves-adam.patch
Test(guard, nan_skip_is_a_step_without_update, .timeout = 300) {
    char f[512], *out = NULL;
    snprintf(f, sizeof f, ORACLE_SAYS " " NAN12 " --log %s --dump %s", tmp("nan.jsonl"),
             tmp("nan.dump"));
    int rc = harness_mpirun(1, f, &out, 120);
    cr_assert(rc == 0 && harness_contains(out, "skipped updates: 1 (NaN/Inf 1"),
              "the run did not go on and count its skip (exit %d):\n%s", rc, out);
    free(out);
    assert_log(tmp("nan.jsonl"), 12, "nan", 0, 1, 0);
    RunResults a, o;
    char err[256];
    cr_assert_eq(results_read(tmp("nan.dump"), &a, err, sizeof err), 0, "%s", err);
    no_update_at_12(&o);
    assert_identical("--on-nan skip vs no update at step 12", &a, &o, 12);
    results_free(&a), results_free(&o);
    unlink(tmp("nan.jsonl")), unlink(tmp("nan.dump"));
}

// On 09 (2,2,2) the NaN goes into one rank's gradient (the last rank's: TP rank 1, whose
// first tensor is a LayerNorm weight, replicated over TP, which each TP rank counts in the norm
// from its own copy): every rank must skip. Against the run without step 12's update, within
// 09's bounds.
// Mutant: mutants/tp-norm-replicated-nan-unseen.patch
Test(guard, nan_skip_on_2x2x2_skips_on_every_rank, .timeout = 300) {
    RunResults b, o;
    run(RUN3D, 8, NAN12, &b);
    no_update_at_12(&o);
    float dl, dp;
    cr_assert(harness_diffs("test_guard", "09 (2,2,2) --on-nan skip vs no update at 12", &b, &o,
                            &dl, &dp), "shapes differ");
    for (int i = 12; i < 18; i++)
        cr_assert(fabsf(b.losses[i] - o.losses[i]) <= LOSS_RTOL * fabsf(o.losses[i]),
                  "step %d: loss %.9g, not %.9g", i + 1, b.losses[i], o.losses[i]);
    cr_assert(dp <= PARAM_ATOL, "the weights differ by %g (bound %g)", dp, PARAM_ATOL);
    results_free(&b), results_free(&o);
}
