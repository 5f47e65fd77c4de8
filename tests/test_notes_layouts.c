// test_notes_layouts.c: the notes' layouts re-derived (tools/notes_layouts.sh, which runs
// ./00_memory_budget/run and ./09_3d/run): for 7B DP 8, 70B DP 64 x TP 8, 405B DP 256 x TP 8 x
// PP 8 and "70B on 8 H100s", the full-size line is chapter 00's planner's own output (the test
// asks the planner again with the command the script names and finds the row there, verbatim),
// and the scaled run of the same shape on the virtual cluster measures what 00 predicts for it:
// every rank's params, master, Adam m and activation peak equal the calculator's row of its stage
// to the byte, and each dimension's held link time equals the calculator's model within 5 % (the
// modelled clock: exact, not a benchmark), with 09's planner column equal to 00's --layout for
// the same scaled run. Three tests (the script runs an 8-rank job per layout; the last one does
// 512 micro-batches).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

// The text of a line that starts with `head` inside [from, to), up to the newline (malloc'd), or
// NULL.
static char *line_after(const char *from, const char *to, const char *head) {
    for (const char *at = strstr(from, head); at && at < to; at = strstr(at + 1, head)) {
        if (at != from && at[-1] != '\n') continue;
        const char *v = at + strlen(head), *end = strchr(v, '\n');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        char *s = malloc(n + 1);
        memcpy(s, v, n);
        s[n] = '\0';
        return s;
    }
    return NULL;
}

// One layout's section of the script's output ("== ..." up to the next "\n== " or the summary),
// checked. `dp tp pp`: the notes' layout at full size (0: the planner's answer, read from it).
static void check_section(const char *out, const char *title, int dp, int tp, int pp) {
    char head[128];
    snprintf(head, sizeof head, "\n== %s", title);
    const char *s = strstr(out, head);
    cr_assert(s, "no section '== %s' in the script's output:\n%s", title, out);
    s += 1;
    const char *e = strstr(s + 3, "\n== ");
    if (!e) e = strstr(s, "\nSummary:");
    if (!e) e = s + strlen(s);

    // the full-size line: the planner's own row, for the notes' layout
    char *cmd = line_after(s, e, "full size, chapter 00's planner: ");
    char *row = line_after(s, e, "  its row: ");
    cr_assert(cmd && row, "%s: no planner command or row:\n%.*s", title, (int)(e - s), s);
    int r_dp = 0, r_tp = 0, r_pp = 0, rank = 0;
    cr_assert_eq(sscanf(row, "%d %d x %d x %d", &rank, &r_dp, &r_tp, &r_pp), 4, "%s: row '%s'", title, row);
    char *plan = NULL;
    int rc = harness_run(cmd, &plan, 60);
    cr_assert_eq(rc, 0, "%s: the planner's command failed (exit %d): %s\n%s", title, rc, cmd, plan);
    cr_assert(strstr(plan, row), "%s: the row the script quotes is not what the planner prints for "
              "'%s':\n  script: %s\n%s", title, cmd, row, plan);
    if (dp > 0) {
        cr_assert(r_dp == dp && r_tp == tp && r_pp == pp, "%s: the row is %d x %d x %d, the notes' "
                  "layout is %d x %d x %d", title, r_dp, r_tp, r_pp, dp, tp, pp);
    } else {  // the planner's answer: the fewest GPUs that fit, and the best layout there
        char *ans = line_after(s, e, "  The fewest GPUs");
        cr_assert(ans, "%s: no 'The fewest GPUs' line", title);
        char quoted[600];
        snprintf(quoted, sizeof quoted, "The fewest GPUs%s", ans);
        cr_assert(strstr(plan, quoted), "%s: the answer is not the planner's:\n  %s\n%s", title, quoted, plan);
        char want[64];
        snprintf(want, sizeof want, "DP %d x TP %d x PP %d,", r_dp, r_tp, r_pp);
        cr_assert(strstr(ans, want), "%s: the row's layout (%s) is not the answer's: %s", title, want, ans);
        free(ans);
    }
    free(plan);
    free(cmd);
    free(row);

    // the scaled run: memory per rank, measured / predicted, to the byte
    int world = 0;
    const char *sc = strstr(s, "\nscaled: ");
    cr_assert(sc && sc < e, "%s: no scaled run", title);
    const char *paren = strstr(sc, " ranks), nodes");
    cr_assert(paren && paren < e, "%s: no rank count on the scaled line", title);
    while (paren > sc && paren[-1] >= '0' && paren[-1] <= '9') paren--;
    world = atoi(paren);
    cr_assert(world >= 1 && world <= 8, "%s: %d ranks", title, world);
    int rows = 0;
    for (const char *l = strchr(sc + 1, '\n'); l && l < e; l = strchr(l + 1, '\n')) {
        int r, t, d, p;
        double v[8];
        if (sscanf(l + 1, " %d (%d,%d,%d) %lf/%lf %lf/%lf %lf/%lf %lf/%lf", &r, &t, &d, &p, &v[0],
                   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 12)
            continue;
        static const char *what[4] = {"params", "master", "Adam m", "activations"};
        for (int i = 0; i < 4; i++)
            cr_assert(v[2 * i] == v[2 * i + 1], "%s: rank %d (%d,%d,%d) measured %s %.0f bytes, "
                      "00's calculator predicts %.0f\n%.*s", title, r, t, d, p, what[i], v[2 * i],
                      v[2 * i + 1], (int)(e - s), s);
        cr_assert(v[0] > 0 && v[6] > 0, "%s: rank %d measured nothing", title, r);
        rows++;
    }
    cr_assert_eq(rows, world, "%s: %d memory rows for %d ranks\n%.*s", title, rows, world, (int)(e - s), s);

    // the link time per dimension: held = model within 5 %, 09's planner = 00's
    int dims = 0, busy = 0;
    for (const char *l = strchr(sc + 1, '\n'); l && l < e; l = strchr(l + 1, '\n')) {
        char dim[8], link[16];
        double held, model, p9, p0;
        if (sscanf(l + 1, " %7s %15s %lf %lf %lf %lf", dim, link, &held, &model, &p9, &p0) != 6 ||
            (strcmp(dim, "TP") && strcmp(dim, "PP") && strcmp(dim, "DP")))
            continue;
        dims++;
        busy += model > 0;
        cr_assert(fabs(held - model) <= 0.05 * model + 1e-3, "%s: %s held %.3f ms per step, the "
                  "model %.3f ms (not within 5 %%)\n%.*s", title, dim, held, model, (int)(e - s), s);
        cr_assert(fabs(p9 - p0) <= 0.01 * p0 + 2e-3, "%s: %s: 09's planner column %.3f ms, 00's "
                  "--layout for the same run %.3f ms\n%.*s", title, dim, p9, p0, (int)(e - s), s);
        cr_assert((model > 0) == (strcmp(link, "none") != 0), "%s: %s on link '%s' holds %.3f ms",
                  title, dim, link, model);
    }
    cr_assert_eq(dims, 3, "%s: %d link rows\n%.*s", title, dims, (int)(e - s), s);
    cr_assert_gt(busy, 0, "%s: no dimension held anything", title);
}

static char *run_script(const char *layouts) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "NOTES_LAYOUTS='%s' bash tools/notes_layouts.sh", layouts);
    char *out = NULL;
    int rc = harness_run(cmd, &out, 110);
    cr_assert_eq(rc, 0, "%s failed (exit %d):\n%s", cmd, rc, out ? out : "");
    cr_assert(harness_contains(out, "\nSummary:"), "%s", out);
    return out;
}

// Mutant: mutants/notes-layouts-mb-as-m.patch
Test(notes_layouts, the_7b_and_70b_rows_match_the_planner, .timeout = 120) {
    char *out = run_script("7b 70b");
    check_section(out, "7B: DP 8", 8, 1, 1);
    check_section(out, "70B: DP 64 x TP 8", 64, 8, 1);
    free(out);
}

// Mutant: mutants/notes-layouts-mb-as-m.patch
// Mutant: mutants/notes-layouts-calc-pp-sp-whole.patch
Test(notes_layouts, the_405b_row_matches_the_planner, .timeout = 120) {
    char *out = run_script("405b");
    check_section(out, "405B: DP 256 x TP 8 x PP 8", 256, 8, 8);
    free(out);
}

// Mutant: mutants/notes-layouts-mb-as-m.patch
// Mutant: mutants/notes-layouts-calc-pp-sp-whole.patch
Test(notes_layouts, the_70b_on_8_h100s_matches_the_planner, .timeout = 120) {
    char *out = run_script("70b-on-8");
    check_section(out, "70B on 8 H100s", 0, 0, 0);
    free(out);
}
