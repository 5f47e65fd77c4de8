// test_why_tp.c: question 5 as an experiment (tools/why_tp_in_node.sh, which runs ./09_3d/run
// twice): on 2 virtual nodes of 4 ranks, 09's TP 4 x PP 2 with TP inside the nodes (--grid-order
// tp-first) is faster than with TP across them (pp-first), as the planner predicts. (The ratio
// itself is a benchmark: on shared cores the compute's time varies by more than 20 %, so the test
// asks for the order, by a clear margin, and the script prints the figures.)
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

// The number after `key` on the first line of `text` that contains `line`, or -1.
static double number_after(const char *text, const char *line, const char *key) {
    const char *at = text ? strstr(text, line) : NULL;
    if (!at) return -1;
    const char *end = strchr(at, '\n');
    const char *k = strstr(at, key);
    if (!k || (end && k > end)) return -1;
    return atof(k + strlen(key));
}

// Mutant: mutants/grid-order-ignored.patch
Test(why_tp, tp_inside_a_node_is_faster_as_the_planner_says, .timeout = 60) {
    char *out = NULL;
    int rc = harness_run("bash tools/why_tp_in_node.sh", &out, 55);
    cr_assert_eq(rc, 0, "tools/why_tp_in_node.sh failed (exit %d):\n%s", rc, out ? out : "");
    double a = number_after(out, "  tp-first ", "PP between"), b = number_after(out, "  pp-first ", "PP inside");
    cr_assert(a > 0 && b > 0, "no step times for both orders (TP inside, PP between / TP between, "
              "PP inside):\n%s", out);
    double p_across = number_after(out, "  planner:  +", "(");
    double p_inside = number_after(out, "  planner:  +", "against ");
    cr_assert(p_across > 0 && p_inside > 0, "no planner line:\n%s", out);
    cr_assert_gt(p_across, p_inside, "the planner: TP across %.1f ms, inside %.1f ms", p_across, p_inside);
    // the planner: TP across costs more; the measurement agrees, by a clear margin (x1.2)
    cr_assert_gt(b, 1.2 * a, "TP across the nodes %.1f ms per step, TP inside %.1f ms: not "
                 "slower as the planner predicts\n%s", b, a, out);
    cr_assert(harness_contains(out, "Answer: "), "%s", out);
    free(out);
}
