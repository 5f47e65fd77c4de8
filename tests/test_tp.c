// test_tp.c: the tensor-parallel pieces (common/tp.h). The equivalence with the full model, the
// all-reduce counts and the mutants run in tests/mpi_tp.c (see its header); this file launches
// it on 4 ranks (tp = 4 on the world, tp = 2 on each half) and on 2 (tp = 2, and tp = 1 alone),
// and checks the pieces that need no MPI.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tp.h"

static void mpi_tp_passes(int np, const char *what) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tests/mpi_tp %s", harness_build_dir(), what);
    int rc = harness_mpirun(np, cmd, &out, 240);
    int checks = -1, failed = -1, ranks = -1;
    const char *line = out ? strstr(out, "mpi_tp: ") : NULL;
    while (line && strstr(line + 1, "mpi_tp: ")) line = strstr(line + 1, "mpi_tp: ");  // the summary is last
    const char *on = line ? strstr(line, " on ") : NULL;
    if (on) sscanf(on, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
    cr_expect(rc == 0 && ranks == np && checks > 0 && failed == 0,
              "mpi_tp %s on %d ranks: exit %d, summary: %d ranks %d checks %d failed\n%s", what, np, rc, ranks,
              checks, failed, out ? out : "(no output)");
    free(out);
}

Test(tp, equals_the_full_model_on_tp_4_and_2, .timeout = 300) { mpi_tp_passes(4, "equiv"); }
Test(tp, equals_the_full_model_on_tp_2_and_1, .timeout = 300) { mpi_tp_passes(2, "equiv"); }
Test(tp, loss_makes_three_all_reduces_of_BT_floats, .timeout = 300) { mpi_tp_passes(4, "count"); }
Test(tp, each_known_bug_is_caught_on_tp_4_and_2, .timeout = 300) { mpi_tp_passes(4, "mutants"); }
