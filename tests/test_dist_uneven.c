// test_dist_uneven.c: runs tests/mpi_uneven.c (dist.h's uneven reduce-scatter / all-gather /
// gather against a plain reference, per-group byte counters against dist.h's formulas, and
// the communication thread with two groups) on 3, 5 and 7 ranks (and 1 and 2 for the edges),
// each on the world and on a split group.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void run_uneven(int np, const char *what) {
    char prog[512];
    snprintf(prog, sizeof prog, "%s/tests/mpi_uneven %s", harness_build_dir(), what);
    char *out = NULL;
    int rc = harness_mpirun(np, prog, &out, 240);
    int checks = 0, failed = -1;
    const char *line = out ? strstr(out, "mpi_uneven: ") : NULL;
    const char *on = line ? strstr(line, " ranks: ") : NULL;
    if (on) sscanf(on, " ranks: %d checks, %d failed", &checks, &failed);
    cr_assert(rc == 0 && failed == 0 && checks > 0, "mpi_uneven %s on %d ranks: exit %d, %d checks, %d failed\n%s",
              what, np, rc, checks, failed, out);
    free(out);
}

Test(dist_uneven, ops_on_1_and_2_ranks, .timeout = 300) {
    run_uneven(1, "rs ag gather counters thread");
    run_uneven(2, "rs ag gather counters thread");
}
Test(dist_uneven, ops_on_3_ranks, .timeout = 300) { run_uneven(3, "rs ag gather counters thread"); }
Test(dist_uneven, ops_on_5_ranks, .timeout = 300) { run_uneven(5, "rs ag gather counters thread"); }
Test(dist_uneven, ops_on_7_ranks, .timeout = 300) { run_uneven(7, "rs ag gather counters thread"); }
