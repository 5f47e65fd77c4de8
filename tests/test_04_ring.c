// test_04_ring.c: the ring all-reduce of 04_ring_allreduce on 1..8 ranks, phase by phase
// (tests/mpi_ring.c does the checking), and the chapter's program (--show, the benchmark).
//
// Suites ex04_1 .. ex04_3 grade exercises 04.1 .. 04.3 (make grade). Each one runs only the
// code of its own exercise, so one can be done without the others.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_expect.h"

// mpirun -np N mpi_ring <what> for N = 1..8: each must exit 0 and report checks, none failed.
static void ring_passes_on_1_to_8_ranks(const char *what) {
    for (int np = 1; np <= 8; np++) {
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tests/mpi_ring %s", harness_build_dir(), what);
        int rc = harness_mpirun(np, cmd, &out, 120);
        int checks = -1, failed = -1, ranks = -1;
        const char *line = out ? strstr(out, "mpi_ring: ") : NULL;
        const char *on = line ? strstr(line, " on ") : NULL;
        if (on) sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
        cr_expect(rc == 0 && ranks == np && checks > 0 && failed == 0, "%s",
                  expect_mpi_msg("mpi_ring", what, np, rc, ranks, checks, failed, out, 0));
        free(out);
        if (rc != 0) break;
    }
}

Test(ex04_1, scatter_reduce_phase_matches_library_on_1_to_8_ranks, .timeout = 240) {
    ring_passes_on_1_to_8_ranks("scatter-reduce");
}

Test(ex04_2, all_gather_phase_matches_library_on_1_to_8_ranks, .timeout = 240) {
    ring_passes_on_1_to_8_ranks("all-gather");
}

Test(ex04_3, pipelined_scatter_reduce_matches_library_on_1_to_8_ranks, .timeout = 240) {
    ring_passes_on_1_to_8_ranks("pipelined-phase");
}

// Needs 04.1 and 04.2 (and 04.3 for the pipelined ring): the whole all-reduce, and the naive root.
Test(ring, all_reduce_and_naive_match_library_on_1_to_8_ranks, .timeout = 240) {
    ring_passes_on_1_to_8_ranks("all-reduce naive");
}

// --show draws the notes' picture: 4 GPUs x 4 chunks, N-1 = 3 steps per phase, and ends right.
Test(ring, show_draws_the_notes_picture, .timeout = 120) {
    char *out = NULL;
    int rc = harness_mpirun(4, "./04_ring_allreduce/run --show", &out, 60);
    cr_assert(rc == 0, "--show on 4 ranks exited %d\n%s", rc, out);
    cr_expect(harness_contains(out, "GPU 0    a0       b0       c0       d0"), "no initial state a0 b0 c0 d0\n%s", out);
    cr_expect(harness_contains(out, "scatter-reduce step 3/3") && !harness_contains(out, "scatter-reduce step 4/"),
              "the scatter-reduce does not take N-1 = 3 steps\n%s", out);
    cr_expect(harness_contains(out, "all-gather step 3/3") && !harness_contains(out, "all-gather step 4/"),
              "the all-gather does not take N-1 = 3 steps\n%s", out);
    // after step 1 GPU 1 holds a0+a1, just arrived
    cr_expect(harness_contains(out, "GPU 1    a0+a1 *"), "GPU 1 does not hold a0+a1 after step 1\n%s", out);
    cr_expect(harness_contains(out, "same as dist_all_reduce on every GPU: yes"), "the ring's result is wrong\n%s", out);
    cr_expect(harness_contains(out, "each GPU sent 24 B and received 24 B"),
              "bytes are not 2(N-1)/N * S = 24 B for S = 16 B on 4 ranks\n%s", out);
    free(out);
}

// The benchmark checks every row and measures bytes per rank against the formulas; a short run.
Test(ring, benchmark_rows_are_correct_and_bytes_match_formulas, .timeout = 180) {
    char *out = NULL;
    int rc = harness_mpirun(3, "./04_ring_allreduce/run --min-bytes 4 --max-bytes 128K --step-factor 8 "
                               "--warmup-iters 1 --iters 2 --segment-kib 4",
                            &out, 120);
    cr_assert(rc == 0, "the benchmark on 3 ranks exited %d\n%s", rc, out);
    cr_expect(harness_contains(out, "measured == formula on every rank: yes"), "bytes per rank differ\n%s", out);
    cr_expect(harness_contains(out, "# all rows correct: yes (0 wrong elements)"), "a row is wrong\n%s", out);
    // 4 B (one float: fewer elements than ranks) up to 128 KiB, 4 algorithms per size
    const char *algos[] = {"ring", "ring pipelined", "MPI_Allreduce", "naive root"};
    for (int a = 0; a < 4; a++) {
        char row[64];
        snprintf(row, sizeof row, "float    sum  %s", algos[a]);
        cr_expect(harness_contains(out, row), "no row for %s\n%s", algos[a], out);
    }
    cr_expect(harness_contains(out, "\n             4             1  float"), "no row for 4 bytes\n%s", out);
    cr_expect(harness_contains(out, "\n        131072         32768  float"), "no row for 128 KiB\n%s", out);
    free(out);
}

Test(ring, bad_sizes_are_refused, .timeout = 60) {
    char *out = NULL;
    int rc = harness_mpirun(2, "./04_ring_allreduce/run --min-bytes 1X", &out, 60);
    cr_expect(rc != 0 && harness_contains(out, "--min-bytes '1X'"), "--min-bytes 1X was not refused by name\n%s", out);
    free(out);
    rc = harness_mpirun(2, "./04_ring_allreduce/run --min-bytes 1M --max-bytes 1K", &out, 60);
    cr_expect(rc != 0 && harness_contains(out, "--max-bytes '1K'"), "max < min was not refused\n%s", out);
    free(out);
    rc = harness_mpirun(9, "./04_ring_allreduce/run --show", &out, 60);
    cr_expect(rc != 0 && harness_contains(out, "--show draws at most 8 ranks"), "--show on 9 ranks was not refused\n%s",
              out);
    free(out);
}
