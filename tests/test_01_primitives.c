// test_01_primitives.c: the collectives of 01_primitives/collectives.c, built from send/recv,
// against the library's on 1..8 ranks (tests/mpi_collectives.c does the checking), and the
// chapter's program on the notes' examples.
//
// Suites ex01_1 .. ex01_4 grade exercises 01.1 .. 01.4 (make grade).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_expect.h"

// mpirun -np N mpi_collectives <what> for N = 1..8: each must exit 0 and report checks, none failed.
static void collectives_pass_on_1_to_8_ranks(const char *what) {
    for (int np = 1; np <= 8; np++) {
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tests/mpi_collectives %s", harness_build_dir(), what);
        int rc = harness_mpirun(np, cmd, &out, 120);
        int checks = -1, failed = -1, ranks = -1;
        const char *line = out ? strstr(out, "mpi_collectives: ") : NULL;
        const char *on = line ? strstr(line, " on ") : NULL;
        if (on) sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
        cr_expect(rc == 0 && ranks == np && checks > 0 && failed == 0, "%s",
                  expect_mpi_msg("mpi_collectives", what, np, rc, ranks, checks, failed, out, 0));
        free(out);
        if (rc != 0) break;  // the first failing size says enough
    }
}

Test(ex01_1, broadcast_from_send_recv_matches_library_on_1_to_8_ranks, .timeout = 240) {
    collectives_pass_on_1_to_8_ranks("broadcast");
}

Test(ex01_2, reduce_from_send_recv_matches_library_on_1_to_8_ranks, .timeout = 240) {
    collectives_pass_on_1_to_8_ranks("reduce");
}

Test(ex01_3, reduce_scatter_from_sendrecv_matches_library_on_1_to_8_ranks, .timeout = 240) {
    collectives_pass_on_1_to_8_ranks("reduce-scatter");
}

Test(ex01_4, all_gather_from_sendrecv_matches_library_on_1_to_8_ranks, .timeout = 240) {
    collectives_pass_on_1_to_8_ranks("all-gather");
}

// scatter and gather are worked examples (not exercises); all-reduce is 01.3 + 01.4 together.
Test(primitives, scatter_gather_all_reduce_match_library_on_1_to_8_ranks, .timeout = 240) {
    collectives_pass_on_1_to_8_ranks("scatter gather all-reduce");
}

// The line of `text` (from `from` on) that starts with "  Rank <r> ", copied into line.
static int rank_line(const char *from, int r, char *line, size_t n) {
    char key[32];
    snprintf(key, sizeof key, "\n  Rank %d ", r);
    const char *p = from ? strstr(from, key) : NULL;
    if (!p) return 0;
    p++;
    size_t len = strcspn(p, "\n");
    if (len >= n) len = n - 1;
    memcpy(line, p, len);
    line[len] = '\0';
    return 1;
}

static int occurrences(const char *s, const char *needle) {
    int k = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) k++;
    return k;
}

// The program shows the notes' examples with their numbers.
Test(primitives, run_shows_the_notes_examples, .timeout = 120) {
    char cmd[256], *out = NULL;
    snprintf(cmd, sizeof cmd, "./01_primitives/run");
    int rc = harness_mpirun(4, cmd, &out, 60);
    cr_assert(rc == 0, "01_primitives/run on 4 ranks exited %d\n%s", rc, out);
    // all-reduce: [1,2] [3,4] [5,6] [7,8] -> [16, 20] on every rank, by the library and by send/recv
    const char *ar = strstr(out, "== all-reduce (SUM) ==");
    cr_assert(ar != NULL, "no all-reduce section\n%s", out);
    char line[512];
    for (int r = 0; r < 4; r++) {
        char before[32];
        snprintf(before, sizeof before, "[%d, %d]", 2 * r + 1, 2 * r + 2);
        cr_assert(rank_line(ar, r, line, sizeof line), "no all-reduce row for rank %d\n%s", r, out);
        cr_expect(strstr(line, before) == line + strspn(line, "Rank 0123456789 ") && occurrences(line, "[16, 20]") == 2,
                  "all-reduce row of rank %d is not %s -> [16, 20] (library) [16, 20] (send/recv): '%s'", r, before,
                  line);
    }
    cr_expect(strstr(out, "reduce-scatter + all-gather == all-reduce on every rank: yes") != NULL,
              "the identity is not shown as holding\n%s", out);
    cr_expect(strstr(out, "== library (dist_*): NO") == NULL && strstr(out, ": NO") == NULL,
              "a send/recv version differs from the library\n%s", out);
    free(out);

    // reduce-scatter on 2 ranks is exactly the notes' example: [1, 2] [3, 4] -> [4] [6]
    rc = harness_mpirun(2, "./01_primitives/run --only reduce-scatter", &out, 60);
    cr_assert(rc == 0, "01_primitives/run --only reduce-scatter on 2 ranks exited %d\n%s", rc, out);
    char l0[512], l1[512];
    cr_assert(rank_line(out, 0, l0, sizeof l0) && rank_line(out, 1, l1, sizeof l1), "no rows\n%s", out);
    cr_expect(strstr(l0, "[1, 2]") && occurrences(l0, "[4]") == 2 && strstr(l1, "[3, 4]") && occurrences(l1, "[6]") == 2,
              "the notes' reduce-scatter example is not [1, 2] [3, 4] -> [4] [6]:\n%s\n%s", l0, l1);
    cr_expect(!harness_contains(out, "== all-reduce"), "--only reduce-scatter showed other primitives\n%s", out);
    free(out);
}

// A bad flag is refused with a message that names it.
Test(primitives, unknown_only_value_is_refused, .timeout = 60) {
    char *out = NULL;
    int rc = harness_mpirun(2, "./01_primitives/run --only allreduce", &out, 60);
    cr_expect(rc != 0, "--only allreduce was accepted\n%s", out);
    cr_expect(harness_contains(out, "--only") && harness_contains(out, "all-reduce"),
              "the message does not name the flag and the valid choices\n%s", out);
    free(out);
}
