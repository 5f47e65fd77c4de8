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

// The value after `key` on the row of `dim` in 09's "link time per step" block, or -1.
static double row_value(const char *out, const char *dim, const char *key) {
    const char *at = out ? strstr(out, "link time per step on the virtual cluster") : NULL;
    char head[16];
    snprintf(head, sizeof head, "\n  %-3s", dim);
    at = at ? strstr(at, head) : NULL;
    if (!at) return -1;
    const char *end = strchr(at + 1, '\n');
    const char *k = strstr(at, key);
    if (!k || (end && k > end)) return -1;
    return atof(k + strlen(key));
}

// 09 with TP 2 inside each node of 2 and PP 2 across: the link time dist held each group for
// per step is chapter 00's bytes and hops of the busiest rank on that link, within 5 % (the
// modelled clock, not the wall clock).
// Mutant: mutants/links-allreduce-half-hops.patch
Test(links, the_held_time_per_group_is_the_calculators, .timeout = 90) {
    char *out = NULL;
    int rc = harness_mpirun(4, "./09_3d/run --layers 2 --channels 32 --heads 4 --seq 16 --batch 8 "
                            "--steps 2 --tp 2 --pp 2 --links 2:1,50:0.1,500", &out, 80);
    cr_assert_eq(rc, 0, "09 with links failed (exit %d):\n%s", rc, out ? out : "");
    const char *dims[2] = {"TP", "PP"};
    for (int i = 0; i < 2; i++) {
        double held = row_value(out, dims[i], "held "), model = row_value(out, dims[i], "model ");
        cr_assert(held > 0 && model > 0, "no %s row with held and model times:\n%s", dims[i], out);
        cr_assert(held >= 0.95 * model && held <= 1.05 * model, "%s: dist held %.4f ms per step, "
                  "the calculator's bytes and hops on its link give %.4f ms\n%s", dims[i], held,
                  model, out);
    }
    cr_assert(harness_contains(out, "TP   2 ranks inside a node"), "%s", out);
    cr_assert(harness_contains(out, "PP   2 ranks between nodes"), "%s", out);
    free(out);
}
