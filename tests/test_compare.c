// test_compare.c: tools/compare.sh, the student's "does it still train like one device?" (issue
// 27): a run's --dump against chapter 00's run of the same shared flags, as distances. Checked
// against the tests' own comparer (harness_max_rel_diff / harness_max_abs_diff on the two dumps):
// 0 for a run that is one device bit for bit, the same distances as the harness's for one that
// is not, and a chapter's own flags kept away from 00.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "results.h"

#define MODEL "--layers 2 --channels 32 --heads 2 --seq 16 --batch 8 --steps 4"

// The two distances the tool printed ("largest relative difference X", "... absolute ... Y").
static void printed(const char *out, double *rel, double *abs_) {
    const char *r = strstr(out, "largest relative difference ");
    const char *a = strstr(out, "largest absolute difference ");
    cr_assert(r && a, "no distances printed:\n%s", out);
    cr_assert(sscanf(r, "largest relative difference %lf", rel) == 1 &&
              sscanf(a, "largest absolute difference %lf", abs_) == 1, "%s", out);
}

// A pipeline of one stage and one micro-batch is chapter 00's step op for op (08's README): the
// tool must say 0 and 0, every loss and weight equal bit for bit.
// Seen failing before: no tools/compare.sh ("No such file").
Test(compare, a_run_that_is_one_device_is_0_and_0, .timeout = 120) {
    char *out = NULL;
    int rc = harness_run("bash tools/compare.sh --np 1 08_pipeline --micro-batches 1 " MODEL, &out,
                         100);
    cr_assert_eq(rc, 0, "%s", out);
    double rel, abs_;
    printed(out, &rel, &abs_);
    cr_assert(rel == 0 && abs_ == 0, "a bit-exact run: %g and %g:\n%s", rel, abs_, out);
    cr_assert(strstr(out, "4 steps in both, 4 equal bit for bit") &&
              strstr(out, "34176 in both, 34176 equal bit for bit"), "%s", out);
    free(out);
}

// A run that differs (--lr 2e-3 where 00 is given 1e-3): the tool prints the distances the
// harness measures on the same two dumps (to its 3 digits).
Test(compare, a_different_run_is_its_distance, .timeout = 120) {
    char dir[] = "/tmp/lab-compare-test-XXXXXX", cmd[1024], *out = NULL;
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --train " MODEL " --lr 2e-3 --quiet --dump "
             "%s/a.dump && ./00_memory_budget/run --train " MODEL " --lr 1e-3 --quiet --dump "
             "%s/b.dump", dir, dir);
    cr_assert_eq(harness_run(cmd, &out, 60), 0, "%s", out);
    free(out);
    RunResults a, b;
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/a.dump", dir);
    cr_assert_eq(results_read(path, &a, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/b.dump", dir);
    cr_assert_eq(results_read(path, &b, err, sizeof err), 0, "%s", err);
    double want_rel = 0;
    for (int s = 0; s < a.nsteps; s++)
        want_rel = fmax(want_rel, harness_max_rel_diff(&a.losses[s], &b.losses[s], 1));
    const double want_abs = harness_max_abs_diff(a.params, b.params, a.nparams);
    cr_assert(want_rel > 0 && want_abs > 0, "the two runs should differ");

    snprintf(cmd, sizeof cmd, "bash tools/compare.sh %s/a.dump " MODEL " --lr 1e-3", dir);
    cr_assert_eq(harness_run(cmd, &out, 60), 0, "%s", out);
    double rel, abs_;
    printed(out, &rel, &abs_);
    cr_assert(fabs(rel - want_rel) <= 5e-3 * want_rel && fabs(abs_ - want_abs) <= 5e-3 * want_abs,
              "printed %g and %g; the harness measures %g and %g:\n%s", rel, abs_, want_rel,
              want_abs, out);
    free(out);
    results_free(&a), results_free(&b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

// A chapter's own flags (05's --zero, 03's --bucket-mb and --no-overlap... here --zero 2 and
// --in-flight) are not 00's: the tool keeps them away from 00 (which refuses them), and the run,
// not bit for bit, is within the tests' fp32 tolerances. A bad target is one clear message.
Test(compare, chapter_flags_stay_with_the_chapter, .timeout = 120) {
    char *out = NULL;
    int rc = harness_run("bash tools/compare.sh --np 2 05_zero --zero 2 --in-flight 1 " MODEL, &out,
                         100);
    cr_assert_eq(rc, 0, "%s", out);
    const char *against = strstr(out, "against: ");
    const char *eol = against ? strchr(against, '\n') : NULL;
    cr_assert(against && eol, "no \"against:\" line:\n%s", out);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(eol - against), against);
    cr_assert(!strstr(line, "--zero") && !strstr(line, "--in-flight") && strstr(line, "--layers 2"),
              "00 ran with: %s", line);
    double rel, abs_;
    printed(out, &rel, &abs_);
    cr_assert(rel <= 1e-6 && abs_ <= 2e-4, "ZeRO-2 on 2 ranks: %g and %g:\n%s", rel, abs_, out);
    free(out);
    rc = harness_run("bash tools/compare.sh 05_zeroo " MODEL, &out, 30);
    cr_assert(rc == 2 && strstr(out, "no ./05_zeroo/run"), "rc %d:\n%s", rc, out);
    free(out);
}
