// test_links.c: the virtual nodes and links (common/dist_link.c, docs/CLUSTER.md).
//
// tests/mpi_links.c on 4 ranks in 2 virtual nodes checks the model itself (each op's held time
// is bytes / bw + hops x latency on the link it crosses; a message across nodes arrives no
// sooner than that); here, besides, chapter 09's losses and weights are the same bits with and
// without links (the links only wait, they never touch a byte), and a malformed --links is
// refused with the valid forms.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "results.h"

// Mutant: mutants/links-inter-as-intra.patch
Test(links, messages_are_held_for_the_models_time, .timeout = 60) {
    char prog[512], *out = NULL;
    snprintf(prog, sizeof prog, "%s/tests/mpi_links", harness_build_dir());
    int rc = harness_mpirun(4, prog, &out, 50);
    int ok = rc == 0 && harness_contains(out, " 0 failed") && harness_contains(out, "mpi_links: ");
    cr_assert(ok, "mpi_links on 4 ranks failed (exit %d):\n%s", rc, out);
    free(out);
}

#define RUN3D "./09_3d/run --quiet --layers 2 --channels 32 --heads 4 --seq 16 --batch 8 --steps 2"

// TP 2 x PP 2 on 2 virtual nodes of 2 (TP inside, PP across): the same bits as without links.
Test(links, losses_and_weights_are_bit_identical, .timeout = 90) {
    RunResults a, b;
    char *log = NULL;
    int rc = harness_run_dump(RUN3D, 4, "--tp 2 --pp 2", &a, &log, 40);
    cr_assert_eq(rc, 0, "09 without links failed:\n%s", log ? log : "");
    free(log), log = NULL;
    rc = harness_run_dump(RUN3D, 4, "--tp 2 --pp 2 --links 2:1,50:0.1,500", &b, &log, 40);
    cr_assert_eq(rc, 0, "09 with links failed:\n%s", log ? log : "");
    free(log);
    cr_assert_eq(a.nsteps, b.nsteps);
    cr_assert_eq(a.nparams, b.nparams);
    cr_assert(memcmp(a.losses, b.losses, (size_t)a.nsteps * sizeof(float)) == 0,
              "the losses differ with links on: %.9g vs %.9g", (double)a.losses[0], (double)b.losses[0]);
    cr_assert(memcmp(a.params, b.params, a.nparams * sizeof(float)) == 0,
              "the weights differ with links on");
    results_free(&a);
    results_free(&b);
}

Test(links, a_malformed_spec_is_refused, .timeout = 60) {
    const char *words[] = {"--links 3:fast", "valid: G:BW,LAT:BW,LAT", "h100:4:cpu"};
    cr_assert(harness_refuses(2, RUN3D " --links 3:fast", words, 3));
    const char *words2[] = {"--links h200:4", "PRESET"};
    cr_assert(harness_refuses(2, RUN3D " --links h200:4", words2, 2));
}
