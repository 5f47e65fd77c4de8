// test_dist.c: runs tests/mpi_dist.c (every dist.h op against a local reference, and the byte
// counters against dist.h's formulas) on several world sizes, and checks that failures end
// the whole job with one clear message.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

// Occurrences of needle in haystack.
static int count_of(const char *haystack, const char *needle) {
    int n = 0;
    for (const char *p = haystack; p && (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

static void run_mpi_dist(int np) {
    char prog[512];
    snprintf(prog, sizeof prog, "%s/tests/mpi_dist", harness_build_dir());
    char *out = NULL;
    int rc = harness_mpirun(np, prog, &out, 180);
    int ok = rc == 0 && harness_contains(out, " 0 failed") && harness_contains(out, "mpi_dist: ");
    if (!ok) fprintf(stderr, "--- mpi_dist on %d ranks (exit %d):\n%s\n", np, rc, out);
    cr_assert(ok, "mpi_dist on %d ranks failed (exit %d); its output is above", np, rc);
    free(out);
}

Test(dist, ops_on_1_rank, .timeout = 200) { run_mpi_dist(1); }
Test(dist, ops_on_2_ranks, .timeout = 200) { run_mpi_dist(2); }
// Mutant: mutants/dist-allreduce-bytes-rounding.patch (3 ranks: a message that does not split evenly)
Test(dist, ops_on_3_ranks, .timeout = 200) { run_mpi_dist(3); }
Test(dist, ops_on_4_ranks, .timeout = 200) { run_mpi_dist(4); }
Test(dist, ops_on_5_ranks, .timeout = 200) { run_mpi_dist(5); }
Test(dist, ops_on_8_ranks, .timeout = 200) { run_mpi_dist(8); }

// Every op again on device buffers (mem_alloc DEV_CUDA): the MPI backend stages them through
// host memory. Needs a CUDA build and a GPU: set LAB_TEST_GPU=1 where one is visible.
// (Without a GPU, tests/cuda_emu can run mpi_dist --device cuda on the CPU.)
Test(dist, ops_on_device_buffers_2_ranks, .timeout = 300) {
    if (getenv("LAB_TEST_GPU") == NULL) cr_skip_test("set LAB_TEST_GPU=1 on a machine with a GPU");
    char prog[512];
    snprintf(prog, sizeof prog, "%s/tests/mpi_dist --device cuda", harness_build_dir());
    char *out = NULL;
    int rc = harness_mpirun(2, prog, &out, 280);
    int ok = rc == 0 && harness_contains(out, "buffers on cuda") && harness_contains(out, " 0 failed");
    cr_assert(ok, "mpi_dist --device cuda on 2 ranks failed (exit %d):\n%s", rc, out);
    free(out);
}

static int run_mode(int np, const char *mode, char **out) {
    char prog[512];
    snprintf(prog, sizeof prog, "%s/tests/mpi_dist %s", harness_build_dir(), mode);
    return harness_mpirun(np, prog, out, 60);
}

// One rank fails while the others wait in a barrier: the job ends (no hang), non-zero, and
// the message names the rank.
Test(dist, failure_on_one_rank_ends_the_job, .timeout = 90) {
    char *out = NULL;
    int rc = run_mode(3, "--fail-rank 1", &out);
    cr_expect(rc != 0 && rc != 124, "exit %d (124 = hung until the timeout)\n%s", rc, out);
    cr_expect(harness_contains(out, "[rank 1] error: injected failure on rank 1"), "message missing:\n%s", out);
    cr_expect(!harness_contains(out, "passed the barrier"), "other ranks went on:\n%s", out);
    free(out);
}

// Every rank fails identically: the message appears once, without a rank prefix.
Test(dist, collective_failure_prints_once, .timeout = 90) {
    char *out = NULL;
    int rc = run_mode(4, "--fail-collective", &out);
    cr_expect(rc != 0 && rc != 124, "exit %d\n%s", rc, out);
    cr_expect_eq(count_of(out, "error: the same error on every rank (world 4)"), 1, "expected exactly once:\n%s", out);
    cr_expect(!harness_contains(out, "[rank"), "a rank prefix was printed:\n%s", out);
    free(out);
}

Test(dist, exercise_stub_says_what_to_do, .timeout = 90) {
    char *out = NULL;
    int rc = run_mode(2, "--exercise-todo", &out);
    cr_expect(rc != 0 && rc != 124, "exit %d\n%s", rc, out);
    cr_expect_eq(count_of(out, "exercise 04.1 (Scatter-reduce phase) is not implemented yet"), 1, "%s", out);
    cr_expect(harness_contains(out, "04_ring_allreduce/README.md#exercise-041-scatter-reduce-phase"), "%s", out);
    cr_expect(harness_contains(out, "EXERCISE 04.1"), "%s", out);
    free(out);
}

// A count over MPI's int limit is refused before any rank touches memory or waits.
Test(dist, count_over_int_max_is_refused, .timeout = 90) {
    char *out = NULL;
    int rc = run_mode(2, "--overflow", &out);
    cr_expect(rc != 0 && rc != 124, "exit %d\n%s", rc, out);
    cr_expect(harness_contains(out, "internal error at common/dist"), "%s", out);
    cr_expect(harness_contains(out, "over MPI's limit"), "%s", out);
    cr_expect(!harness_contains(out, "was accepted"), "%s", out);
    free(out);
}

// The merged timeline: one process row per rank, named tracks, spans in microseconds.
Test(dist, trace_merges_every_rank, .timeout = 90) {
    char path[128], tmp[140], mode[160];
    snprintf(path, sizeof path, "/tmp/lab-test-trace-%d.json", (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(mode, sizeof mode, "--trace %s", path);
    unlink(path);
    char *out = NULL;
    int rc = run_mode(3, mode, &out);
    cr_assert_eq(rc, 0, "exit %d\n%s", rc, out);
    free(out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no trace written to %s", path);
    static char json[1 << 16];
    size_t n = fread(json, 1, sizeof json - 1, f);
    json[n] = '\0';
    fclose(f);
    cr_expect_eq(access(tmp, F_OK), -1, "the temporary file was left behind");
    cr_expect_eq(strncmp(json, "{\"traceEvents\":[", 16), 0, "not a trace:\n%s", json);
    cr_expect(harness_contains(json, "]}"), "unterminated:\n%s", json);
    cr_expect_eq(count_of(json, "\"ph\":\"X\""), 6, "expected 2 spans x 3 ranks:\n%s", json);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "\"args\":{\"name\":\"rank %d\"}", r);
        cr_expect(harness_contains(json, want), "process row of rank %d missing", r);
        snprintf(want, sizeof want, "\"name\":\"compute step\",\"ph\":\"X\",\"pid\":%d,\"tid\":0", r);
        cr_expect(harness_contains(json, want), "compute span of rank %d missing:\n%s", r, json);
        snprintf(want, sizeof want, "\"ph\":\"X\",\"pid\":%d,\"tid\":1", r);
        cr_expect(harness_contains(json, want), "communication span of rank %d missing", r);
    }
    cr_expect_eq(count_of(json, "\"name\":\"compute\""), 3, "track name compute missing");
    cr_expect_eq(count_of(json, "\"name\":\"communication\""), 3, "track name communication missing");
    cr_expect(harness_contains(json, "\"name\":\"say \\\"hi\\\"\""), "quote not escaped:\n%s", json);
    // the compute spans slept 20 ms: durations are in microseconds, starts are after t0
    for (const char *p = json; (p = strstr(p, "\"name\":\"compute step\"")) != NULL; p++) {
        double ts = -1, dur = -1;
        const char *q = strstr(p, "\"ts\":"), *d = strstr(p, "\"dur\":");
        cr_assert(q && d);
        ts = atof(q + 5);
        dur = atof(d + 6);
        cr_expect(ts >= 0 && ts < 60e6, "ts %g us is not relative to the barrier", ts);
        cr_expect(dur >= 19000 && dur < 10e6, "dur %g us for a 20 ms span", dur);
    }
    unlink(path);
}
