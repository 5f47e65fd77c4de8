// test_links.c: the virtual nodes and links (common/dist_link.c, docs/CLUSTER.md).
//
// tests/mpi_links.c on 4 ranks in 2 virtual nodes checks the model itself (each op's held time
// is bytes / bw + hops x latency on the link it crosses; a message across nodes arrives no
// sooner than that); here, besides, chapter 09's losses and weights are the same bits with and
// without links (the links only wait, they never touch a byte), and a malformed --links is
// refused with the valid forms.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
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

// ---- where the time goes: every chapter's link table (common/session_links.c) ----------------

#define SMALL "--layers 2 --channels 32 --heads 4 --seq 16 --batch 8 --steps 2"
// 1 rank per node: every group crosses nodes; 0.5 GB/s and 200 us, so that bytes and hops
// both weigh (the figures are the modelled clock's, not the wall clock's)
#define LINKS "--links 1:1,50:0.5,200"

// The planner's figure for a TP or PP row (00_memory_budget/planner.c's pace: once per 1F1B
// slot), the busiest stage's, for a layout of dp x tp x pp with m micro-batches of the small
// model, every group between nodes.
static double planner_ms(int dp, int tp, int pp, int m, int sp, int dim) {
    const GPT2Config cfg = {256, 16, 2, 32, 4};
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    CalcSetup cs = calc_setup_lab(dp, tp, pp, 1, m, 8, 16, 0, CALC_FP32);
    cs.sp = sp, cs.sp_seq_calls = sp;  // (tp.c: SP's collectives one call per sequence)
    double most = 0;
    for (int p = 0; p < pp; p++) {
        const CalcComm k = calc_rank_comm(&cm, &cs, p, 0);
        const CalcTraffic *t = dim == CALC_DIM_TP ? &k.tp : &k.pp;
        const double s = calc_traffic_slot_seconds(t, m + (double)(pp - 1), m, 0.5e9, 200e-6);
        if (s > most) most = s;
    }
    return 1e3 * most;
}

// One chapter on np ranks with LINKS: each named row's held time is its model's within 5 %,
// and its planner figure is there: DP's the model's own (once per step), TP's and PP's
// planner_ms (want_tp, want_pp; < 0: not checked).
static void check_rows(const char *what, int np, const char *cmd, const char *rows,
                       double want_tp, double want_pp) {
    char *out = NULL, full[512];
    snprintf(full, sizeof full, "%s " SMALL " " LINKS, cmd);
    int rc = harness_mpirun(np, full, &out, 60);
    cr_assert_eq(rc, 0, "%s with links failed (exit %d):\n%s", what, rc, out ? out : "");
    for (const char *d = rows; *d; d += 2) {
        char dim[3] = {d[0], d[1], 0};
        double held = row_value(out, dim, "held "), model = row_value(out, dim, "model ");
        double planner = row_value(out, dim, "planner ");
        cr_assert(held > 0 && model > 0 && planner > 0, "%s: no %s row with held, model and "
                  "planner times:\n%s", what, dim, out);
        cr_assert(held >= 0.95 * model && held <= 1.05 * model, "%s: %s held %.4f ms per step, "
                  "the calculator's bytes and hops on its link give %.4f ms\n%s", what, dim, held,
                  model, out);
        double want = dim[0] == 'D' ? model : dim[0] == 'T' ? want_tp : want_pp;
        if (want >= 0)
            cr_assert(fabs(planner - want) <= 0.0015, "%s: %s planner %.4f ms, the planner's "
                      "pace on the calculator's traffic gives %.4f ms\n%s", what, dim, planner,
                      want, out);
    }
    free(out);
}

// Every training chapter prints the table with --links, and its held time per group is the
// calculator's for that chapter's layout: 03's all-reduces (one per tensor, in place), 05's
// stages (1, and 3 unit by unit), 06's units, 07's TP with SP (one call per sequence) and DP,
// 07 recomputing (full: its f and g twice per block), 08's pipeline.
// Mutant: mutants/links-table-wrong-group.patch
// Mutant: mutants/links-calc-one-bucket.patch
// Mutant: mutants/links-07-recompute-unmodelled.patch
Test(links, every_chapters_table_is_the_calculators, .timeout = 120) {
    check_rows("03_ddp", 2, "./03_ddp/run --bucket-mb 0.02 --first-bucket-mb 0.01", "DP", -1, -1);
    check_rows("05_zero --zero 1", 2, "./05_zero/run --zero 1", "DP", -1, -1);
    check_rows("05_zero --zero 3", 2, "./05_zero/run --zero 3", "DP", -1, -1);
    check_rows("06_fsdp", 2, "./06_fsdp/run", "DP", -1, -1);
    check_rows("07_tensor_parallel", 4, "./07_tensor_parallel/run --tp 2 --sequence-parallel",
               "TPDP", planner_ms(2, 2, 1, 1, 1, CALC_DIM_TP), -1);
    // full recomputation reruns each block's f and g: the model counts them once more
    check_rows("07_tensor_parallel --recompute full", 2,
               "./07_tensor_parallel/run --tp 2 --recompute full", "TP", -1, -1);
    check_rows("08_pipeline", 2, "./08_pipeline/run --micro-batches 4", "PP", -1,
               planner_ms(1, 1, 2, 4, 0, CALC_DIM_PP));
}
