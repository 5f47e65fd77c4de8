// test_results.c: the --dump file round-trips exactly, and a damaged file is refused.
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "results.h"

// A fresh path in /tmp for this test process.
static void temp_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "/tmp/lab-test-results-%d-%s", (int)getpid(), name);
    unlink(buf);
}

static void make_sample(RunResults *r) {
    results_init(r, 5, 1000);
    for (int s = 0; s < 5; s++) r->losses[s] = 5.5f - 0.25f * (float)s;
    for (size_t i = 0; i < 1000; i++) r->params[i] = 0.001f * (float)i - 0.3f;
    results_set(r, "bytes_sent_per_step", 1234567.0);
    results_set(r, "mem_params", 3.0 * 1024 * 1024);
    results_set(r, "bytes_sent_per_step", 42.5);  // overwrite, not a second key
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

Test(results, keys_set_get_has) {
    RunResults r;
    make_sample(&r);
    cr_assert_eq(r.nkv, 2);
    cr_assert(results_has(&r, "mem_params"));
    cr_assert(!results_has(&r, "mem_grads"));
    cr_assert_eq(results_get(&r, "bytes_sent_per_step", -1), 42.5);
    cr_assert_eq(results_get(&r, "missing", -7.0), -7.0);
    results_free(&r);
}

Test(results, round_trip_is_exact) {
    char path[256], tmp[300];
    temp_path(path, sizeof path, "rt");
    RunResults a, b;
    make_sample(&a);
    results_write(path, &a);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_eq(access(tmp, F_OK), -1, "the temporary file was left behind");
    // 8 magic + 4 + 5*4 + 8 + 1000*4 + 4 + 2*(48+8) + 4 crc
    cr_assert_eq(file_size(path), 8 + 4 + 20 + 8 + 4000 + 4 + 112 + 4, "size %ld", file_size(path));
    char err[256] = "";
    cr_assert_eq(results_read(path, &b, err, sizeof err), 0, "read failed: %s", err);
    cr_assert_eq(b.nsteps, 5);
    cr_assert_eq(b.nparams, 1000);
    cr_assert_eq(memcmp(a.losses, b.losses, 5 * sizeof(float)), 0);
    cr_assert_eq(memcmp(a.params, b.params, 1000 * sizeof(float)), 0);
    cr_assert_eq(b.nkv, 2);
    cr_assert_eq(results_get(&b, "bytes_sent_per_step", -1), 42.5);
    cr_assert_eq(results_get(&b, "mem_params", -1), 3.0 * 1024 * 1024);
    results_free(&a);
    results_free(&b);
    unlink(path);
}

Test(results, empty_round_trip) {
    char path[256];
    temp_path(path, sizeof path, "empty");
    RunResults a, b;
    results_init(&a, 0, 0);
    cr_assert_null(a.params);
    results_write(path, &a);
    char err[256] = "";
    cr_assert_eq(results_read(path, &b, err, sizeof err), 0, "read failed: %s", err);
    cr_assert_eq(b.nsteps, 0);
    cr_assert_eq(b.nparams, 0);
    cr_assert_eq(b.nkv, 0);
    results_free(&a);
    results_free(&b);
    unlink(path);
}

// Rewrites the file with byte `at` flipped, or cut to `keep` bytes.
static void damage(const char *path, long at, long keep) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (at >= 0) buf[at] ^= 0x10;
    if (keep >= 0) n = (size_t)keep;
    f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
}

Test(results, flipped_byte_is_refused) {
    char path[256];
    temp_path(path, sizeof path, "flip");
    RunResults a, b;
    make_sample(&a);
    long where[] = {20, 8 + 4 + 20 + 8 + 2000, 0};  // a loss, a parameter, the magic
    for (int k = 0; k < 3; k++) {
        results_write(path, &a);
        damage(path, where[k], -1);
        char err[256] = "";
        cr_assert_eq(results_read(path, &b, err, sizeof err), -1, "a flipped byte at %ld was accepted", where[k]);
        cr_assert(strstr(err, path) != NULL, "the reason does not name the file: %s", err);
        cr_assert(strstr(err, k < 2 ? "CRC" : "magic") != NULL, "unclear reason: %s", err);
        cr_assert_null(b.losses);
    }
    results_free(&a);
    unlink(path);
}

Test(results, truncated_file_is_refused) {
    char path[256];
    temp_path(path, sizeof path, "trunc");
    RunResults a, b;
    make_sample(&a);
    long full = 8 + 4 + 20 + 8 + 4000 + 4 + 112 + 4;
    long keeps[] = {full - 1, full - 4, full / 2, 10, 0};
    for (int k = 0; k < 5; k++) {
        results_write(path, &a);
        damage(path, -1, keeps[k]);
        char err[256] = "";
        cr_assert_eq(results_read(path, &b, err, sizeof err), -1, "a file cut to %ld bytes was accepted", keeps[k]);
        cr_assert(strlen(err) > 0, "no reason given");
    }
    results_free(&a);
    unlink(path);
}

Test(results, missing_file_is_refused) {
    RunResults b;
    char err[256] = "";
    cr_assert_eq(results_read("/tmp/lab-no-such-dump-file", &b, err, sizeof err), -1);
    cr_assert(strstr(err, "/tmp/lab-no-such-dump-file") != NULL, "the reason does not name the file: %s", err);
}

// The write is atomic: a failed write leaves the previous file intact, and fails the job.
Test(results, write_into_missing_directory_fails_the_job, .exit_code = 1, .init = cr_redirect_stderr) {
    RunResults a;
    make_sample(&a);
    results_write("/tmp/lab-no-such-dir/x/results.bin", &a);
}

// ---- the harness (tests/harness.c) ----

Test(harness, run_captures_output_and_exit_status) {
    char *out = NULL;
    int rc = harness_run("echo 'it''s'; echo to-stderr >&2; exit 3", &out, 10);
    cr_assert_eq(rc, 3);
    cr_assert(harness_contains(out, "its") && harness_contains(out, "to-stderr"), "output: %s", out);
    free(out);
    rc = harness_run("printf %s \"it's quoted\"", &out, 10);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(out, "it's quoted");
    free(out);
}

Test(harness, run_times_out_with_124) {
    char *out = NULL;
    double t0 = lab_now();
    int rc = harness_run("echo started; sleep 30", &out, 1);
    cr_assert_eq(rc, 124, "exit %d", rc);
    cr_assert(lab_now() - t0 < 15, "the timeout did not stop it");
    cr_assert(harness_contains(out, "started"));
    free(out);
}

Test(harness, build_dir_from_env) {
    unsetenv("LAB_BUILD");
    cr_assert_str_eq(harness_build_dir(), "build");
    setenv("LAB_BUILD", "build-x", 1);
    cr_assert_str_eq(harness_build_dir(), "build-x");
}

Test(harness, diffs) {
    float a[4] = {1.0f, 2.0f, -4.0f, 0.0f}, b[4] = {1.0f, 2.5f, -4.0f, 0.0f};
    cr_assert_float_eq(harness_max_abs_diff(a, b, 4), 0.5f, 0);
    cr_assert_float_eq(harness_max_rel_diff(a, b, 4), 0.2f, 1e-7);
    cr_assert_float_eq(harness_max_abs_diff(a, a, 4), 0.0f, 0);
    a[3] = NAN;
    cr_assert(isinf(harness_max_abs_diff(a, b, 4)), "NaN must not compare as close");
    cr_assert(isinf(harness_max_rel_diff(a, b, 4)), "NaN must not compare as close");
}

Test(harness, results_match_with_tolerances, .init = cr_redirect_stderr) {
    RunResults a, b;
    make_sample(&a);
    make_sample(&b);
    cr_assert(harness_results_match("same", &a, &b, 0.0f, 0.0f));
    b.losses[3] *= 1.0f + 1e-6f;
    cr_assert(harness_results_match("loss within", &a, &b, 1e-5f, 0.0f));
    cr_assert(!harness_results_match("loss outside", &a, &b, 1e-7f, 0.0f));
    b.params[777] += 1e-3f;
    cr_assert(harness_results_match("param within", &a, &b, 1e-5f, 2e-3f));
    cr_assert(!harness_results_match("param outside", &a, &b, 1e-5f, 1e-4f));
    b.params[777] = NAN;
    cr_assert(!harness_results_match("param NaN", &a, &b, 1.0f, 1.0f));
    RunResults c;
    results_init(&c, 4, 1000);
    cr_assert(!harness_results_match("shape", &a, &c, 1.0f, 1.0f));
    results_free(&a);
    results_free(&b);
    results_free(&c);
}

Test(harness, run_dump_reads_what_the_run_wrote, .timeout = 60) {
    char prog[512], *out = NULL;
    snprintf(prog, sizeof prog, "%s/tests/mpi_dist", harness_build_dir());
    RunResults r;
    int rc = harness_run_dump(prog, 2, "--results 2", &r, &out, 50);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert_eq(r.nsteps, 3);
    cr_assert_eq(r.nparams, 10);
    cr_assert_eq(r.losses[2], 6.0f);
    cr_assert_eq(r.params[9], 9.0f);
    cr_assert_eq(results_get(&r, "world", -1), 2.0);
    results_free(&r);
    free(out);
    // a run that succeeds but writes no results file is an error, not an empty result
    // (--fail-rank 99 on one rank: nobody fails, and that mode ignores --dump)
    rc = harness_run_dump(prog, 1, "--fail-rank 99", &r, &out, 50);
    cr_assert_eq(rc, -1, "a run without a results file gave %d:\n%s", rc, out);
    cr_assert(harness_contains(out, "harness_run_dump: ") && harness_contains(out, "cannot open"), "%s", out);
    free(out);
}
