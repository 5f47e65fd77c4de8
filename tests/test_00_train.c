// test_00_train.c: the single-device training run of chapter 00 (the lab's oracle).
//
// It learns (the loss approaches the synthetic source's entropy floor), its measured memory
// equals the calculator's formula, it resumes bit-exactly from a checkpoint, and it fails
// cleanly (NaN, bad launch) without losing the last checkpoint.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calc.h"
#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "gpt2.h"
#include "harness.h"
#include "harness_progress.h"
#include "mem.h"

#define RUN00 "./00_memory_budget/run --train --quiet"

static char *tmp_path(const char *tag) {
    static char buf[4][256];
    static int i = 0;
    char *p = buf[i++ % 4];
    snprintf(p, 256, "/tmp/lab_test00_%d_%s", (int)getpid(), tag);
    return p;
}

// Training on the synthetic Markov source approaches its entropy floor. A small model and a
// short run keep this test fast; the margin is 0.15 nats/token above the floor (the loss at
// init is ln 64 = 4.16, about 2.9 nats above it), averaged over the last 10 steps.
Test(train00, learns_the_synthetic_source) {
    RunResults r;
    char *out = NULL;
    const char *flags = "--vocab 64 --seq 32 --layers 2 --channels 64 --heads 4 --batch 16 "
                        "--steps 300 --lr 3e-3 --weight-decay 0";
    int rc = harness_run_dump(RUN00, 1, flags, &r, &out, 300);
    cr_assert_eq(rc, 0, "run failed:\n%s", out);
    DataSource d;
    data_init_synthetic(&d, 64, 1);
    double floor = data_loss_floor(&d, 32);
    data_free(&d);
    double tail = 0;
    for (int s = r.nsteps - 10; s < r.nsteps; s++) tail += r.losses[s] / 10.0;
    cr_log_info("loss at step 1 %.4f, mean of the last 10 steps %.4f, floor %.4f",
                r.losses[0], tail, floor);
    cr_assert(fabs(r.losses[0] - log(64.0)) < 0.1, "initial loss %.4f is not ~ln 64", r.losses[0]);
    cr_assert(tail < floor + 0.15, "final loss %.4f not within 0.15 of the floor %.4f", tail, floor);
    cr_assert(tail > floor - 0.05, "final loss %.4f below the entropy floor %.4f: impossible", tail,
              floor);
    results_free(&r);
    free(out);
}

// The bytes the runtime really allocated equal the calculator's prediction: exactly for the
// model state, exactly for the lab's activation formula.
Test(train00, measured_memory_matches_the_calculator) {
    RunResults r;
    char *out = NULL;
    int rc = harness_run_dump(RUN00, 1, "--steps 2", &r, &out, 120);
    cr_assert_eq(rc, 0, "run failed:\n%s", out);
    GPT2Config cfg = gpt2_config_tiny();
    CalcModel cm = calc_model_from_gpt2(&cfg);
    CalcSetup cs = calc_setup_default();
    cs.micro_batch = 16;
    CalcBreakdown b = calc_memory(&cm, &cs);
    double n = (double)gpt2_param_count(&cfg);
    cr_assert_eq(results_get(&r, "mem_params", -1), b.params);
    cr_assert_eq(results_get(&r, "mem_grads", -1), b.grads);
    cr_assert_eq(results_get(&r, "mem_master", -1), b.master);
    cr_assert_eq(results_get(&r, "mem_opt_m", -1), b.m);
    cr_assert_eq(results_get(&r, "mem_opt_v", -1), b.v);
    cr_assert_eq(b.params + b.grads + b.master + b.m + b.v, 16.0 * n, "fp32 Adam is 16 B/param");
    cr_assert_eq(results_get(&r, "mem_acts", -1), calc_activation_bytes_lab(&cfg, 16, 64, GPT2_FP32));
    results_free(&r);
    free(out);
}

// Train N steps == train K, save, resume, train N-K: bit-identical losses and weights.
Test(train00, resume_is_bit_exact) {
    const char *ck = tmp_path("resume.ckpt");
    RunResults whole, second;
    char *out = NULL, cmd[512];
    int rc = harness_run_dump(RUN00, 1, "--steps 8", &whole, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s --steps 8 --stop-at 5 --save %s", RUN00, ck);
    free(out);
    rc = harness_run(cmd, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    snprintf(cmd, sizeof cmd, "--steps 8 --resume %s", ck);
    free(out);
    rc = harness_run_dump(RUN00, 1, cmd, &second, &out, 120);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_eq(second.nsteps, 8);
    for (int s = 5; s < 8; s++)
        cr_assert_eq(memcmp(&whole.losses[s], &second.losses[s], sizeof(float)), 0,
                     "step %d: loss %.9g vs resumed %.9g", s, whole.losses[s], second.losses[s]);
    cr_assert_eq(whole.nparams, second.nparams);
    cr_assert_eq(memcmp(whole.params, second.params, whole.nparams * sizeof(float)), 0,
                 "final weights differ after resume");
    // A resume from a different step would not match: the check above can fail.
    cr_assert_neq(memcmp(&whole.losses[4], &whole.losses[5], sizeof(float)), 0);
    unlink(ck);
    results_free(&whole);
    results_free(&second);
    free(out);
}

// Without --quiet: the progress line (common/session.c, the same in every chapter) is printed
// every --log-every steps and at the last, and says the run's own losses; then "N steps in".
// Mutant: mutants/session-progress-cadence.patch
Test(train00, progress_lines_say_the_runs_losses) {
    RunResults r;
    char *out = NULL;
    int rc = harness_run_dump("./00_memory_budget/run --train", 1,
                              "--layers 2 --channels 64 --heads 4 --seq 32 --batch 8 --steps 8 "
                              "--log-every 3", &r, &out, 120);
    cr_assert_eq(rc, 0, "run failed:\n%s", out);
    cr_assert(harness_contains(out, "step     1/8") && harness_contains(out, "step     8/8"),
              "no progress line:\n%s", out);
    cr_assert(harness_progress_matches(out, &r, 0, 8, 8, 3),
              "the progress lines do not say the run (details above on stderr)");
    results_free(&r);
    free(out);
}

// The loop skeleton with a chapter's own (sharded) state, as 05-09 give it: the checkpoint
// cadence calls the chapter's save on every rank, the final weights come from the chapter's
// gather, the save's bytes are counted apart (tests/mpi_session.c), on 1, 2 and 3 ranks.
// Mutant: mutants/session-save-cost-uncounted.patch
Test(session, loop_drives_a_chapters_own_state_on_1_2_3_ranks, .timeout = 120) {
    for (int np = 1; np <= 3; np++) {
        char cmd[256], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tests/mpi_session", harness_build_dir());
        int rc = harness_mpirun(np, cmd, &out, 60);
        cr_assert(rc == 0 && harness_contains(out, "mpi_session: OK"), "-np %d (rc %d):\n%s", np,
                  rc, out);
        free(out);
    }
}

// A NaN in a gradient stops the run with a message naming the step, promptly, and the
// checkpoint written before it survives intact.
Test(train00, nan_fails_cleanly_and_keeps_the_checkpoint) {
    const char *ck = tmp_path("nan.ckpt");
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s --steps 10 --save %s --save-every 2 --inject-nan-step 5", RUN00, ck);
    int rc = harness_run(cmd, &out, 60);
    cr_assert_neq(rc, 0, "a NaN gradient must fail the run");
    cr_assert_neq(rc, 124, "the run hung instead of failing");
    cr_assert(harness_contains(out, "NaN") && harness_contains(out, "step 5"),
              "message should name NaN and the step:\n%s", out);
    GPT2Config cfg = gpt2_config_tiny();
    size_t n = gpt2_param_count(&cfg);
    TrainState st = {.params = malloc(n * 4), .m = malloc(n * 4), .v = malloc(n * 4)};
    ckpt_load_state(ck, &cfg, &st);   // would end this test process if corrupted
    cr_assert_eq(st.step, 4, "the last good checkpoint is the one after step 4");
    for (size_t i = 0; i < n; i++) cr_assert(isfinite(st.params[i]));
    free(st.params); free(st.m); free(st.v);
    unlink(ck);
    free(out);
}

// The single-device run refuses to be launched on several ranks, and no rank hangs.
Test(train00, refuses_several_ranks) {
    char *out = NULL;
    int rc = harness_mpirun(2, RUN00 " --steps 2", &out, 60);
    cr_assert_neq(rc, 0);
    cr_assert_neq(rc, 124, "hung");
    cr_assert(harness_contains(out, "-np 1"), "message should say how to launch it:\n%s", out);
    free(out);
}

// --train with a batch whose predicted memory exceeds what is available is refused at once,
// with the predicted numbers, before allocating (not killed by the OOM killer minutes later).
// With --mem-limit, so that the outcome does not depend on this machine: the prediction for
// --batch 512 (about 1.9 GiB) exceeds 100 MiB; --batch 4 (about 30 MiB) fits, and its measured
// model state is the one the refusal predicted. Seen failing with the refusal (then
// refuse_if_it_cannot_fit, now mem_refuse_if_it_cannot_fit) not called (the run trained: rc 0,
// no message), and with Adam's v left out of the prediction ("model state 12.73 MiB" not in the
// message).
Test(train00, run_predicted_not_to_fit_is_refused_before_allocating, .timeout = 60) {
    char *out = NULL;
    double t0 = lab_now();
    int rc = harness_run(RUN00 " --steps 1 --batch 512 --mem-limit 100", &out, 30);
    double took = lab_now() - t0;
    cr_assert(rc != 0 && rc != 124, "must be refused (rc %d):\n%s", rc, out);
    cr_assert(harness_contains(out, "predicted memory") && harness_contains(out, "--mem-limit") &&
              harness_contains(out, "100.00 MiB") && harness_contains(out, "--batch 23 or less"),
              "the message names the prediction, the limit and a batch that fits:\n%s", out);
    cr_assert_lt(took, 20.0, "refused only after %.1f s: it must not allocate and train", took);
    // The predicted model state is what a run that fits really allocates (measured, mem.h).
    RunResults r;
    char *log = NULL;
    rc = harness_run_dump(RUN00, 1, "--steps 1 --batch 4 --mem-limit 100", &r, &log, 60);
    cr_assert_eq(rc, 0, "a run that fits is not refused:\n%s", log);
    double state = results_get(&r, "mem_params", -1) + results_get(&r, "mem_grads", -1) +
                   results_get(&r, "mem_master", -1) + results_get(&r, "mem_opt_m", -1) +
                   results_get(&r, "mem_opt_v", -1);
    char want[64], sz[32];
    snprintf(want, sizeof want, "model state %s", mem_format(sz, sizeof sz, state));
    cr_assert(harness_contains(out, want), "the refusal should say '%s' (measured):\n%s", want, out);
    results_free(&r);
    free(log);
    free(out);
}

// The case, on this machine's MemAvailable: --batch 8192 (about 30 GiB predicted).
// Where MemAvailable is larger than the prediction the run would not be refused, and this test
// checks instead that the prediction is below what /proc/meminfo says (and does not run it).
Test(train00, batch_8192_refused_against_memavailable, .timeout = 60) {
    GPT2Config cfg = gpt2_config_tiny();
    double need = calc_activation_bytes_lab(&cfg, 8192, cfg.T, GPT2_FP32);
    FILE *f = fopen("/proc/meminfo", "r");
    cr_assert(f, "/proc/meminfo");
    char line[256];
    double avail_kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &avail_kib) == 1) break;
    fclose(f);
    if (need <= avail_kib * 1024.0) {
        cr_log_warn("MemAvailable %.1f GiB holds --batch 8192's %.1f GiB: not run",
                    avail_kib / 1048576.0, need / 1073741824.0);
        return;
    }
    char *out = NULL;
    int rc = harness_run(RUN00 " --steps 1 --batch 8192", &out, 30);
    cr_assert(rc != 0 && rc != 124, "must be refused at once (rc %d):\n%s", rc, out);
    cr_assert(harness_contains(out, "predicted memory") && harness_contains(out, "MemAvailable"),
              "the message names the prediction and MemAvailable:\n%s", out);
    free(out);
}
