// test_why_tp.c: question 5 as an experiment (tools/why_tp_in_node.sh, which runs ./09_3d/run
// twice): on 2 virtual nodes of 4 ranks, 09's TP 4 x PP 2 with TP inside the nodes (--grid-order
// tp-first) is faster than with TP across them (pp-first), as the planner predicts. Where the TP
// groups landed is checked on the modelled clock (the link time dist held them for, exact); the
// wall clock only for the order (the ratio itself is a benchmark: on shared cores the compute's
// time varies by more than 20 %; the script prints the figures).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

// The script's row of one order: "  tp-first  TP inside, PP between  <step ms> <TP held ms> <PP
// held ms> <planner TP> <planner PP> <planner comm>". 1 when found.
static int order_row(const char *out, const char *order, double v[6]) {
    char head[32];
    snprintf(head, sizeof head, "\n  %s ", order);
    const char *at = out ? strstr(out, head) : NULL;
    if (!at) return 0;
    char a[16], b[16], c[16], d[16];
    return sscanf(at + strlen(head), " %15s %15s %15s %15s %lf %lf %lf %lf %lf %lf", a, b, c, d, &v[0],
                  &v[1], &v[2], &v[3], &v[4], &v[5]) == 10;
}

// Mutant: mutants/grid-order-ignored.patch
Test(why_tp, tp_inside_a_node_is_faster_as_the_planner_says, .timeout = 60) {
    char *out = NULL;
    int rc = harness_run("bash tools/why_tp_in_node.sh", &out, 55);
    cr_assert_eq(rc, 0, "tools/why_tp_in_node.sh failed (exit %d):\n%s", rc, out ? out : "");
    double tp_in[6], tp_across[6];   // step, TP held, PP held, planner TP, PP, comm (ms)
    cr_assert(order_row(out, "tp-first", tp_in) && order_row(out, "pp-first", tp_across),
              "no rows for both orders:\n%s", out);
    // where the groups landed (the modelled clock, exact): TP across the nodes is held far
    // longer than TP inside, as the planner says of the same layouts
    cr_assert_gt(tp_across[3], 2 * tp_in[3], "the planner: TP across %.1f ms, inside %.1f ms",
                 tp_across[3], tp_in[3]);
    cr_assert_gt(tp_across[1], 2 * tp_in[1], "dist held TP %.1f ms per step with --grid-order "
                 "pp-first, %.1f ms with tp-first: the TP groups did not move across the nodes\n%s",
                 tp_across[1], tp_in[1], out);
    // the wall clock: TP across is slower, as the planner predicts (the margin is the planner's
    // difference; the compute's noise on shared cores is well below it)
    cr_assert_gt(tp_across[0], tp_in[0], "TP across the nodes %.1f ms per step, TP inside %.1f "
                 "ms: not slower as the planner predicts\n%s", tp_across[0], tp_in[0], out);
    cr_assert(harness_contains(out, "Answer: "), "%s", out);
    free(out);
}
