// test_questions.c: docs/QUESTIONS.md, the notes' eight questions answered with the lab (issue
// 27), cannot go stale. Each test runs one question's commands through tools/questions.sh (what
// `make questions` runs) and fails when a line the page quotes, or a figure its answer quotes, is
// no longer what the commands print. The commands run the chapters 00_memory_budget, 03_ddp,
// 05_zero, 06_fsdp and 08_pipeline (named here so that tools/mutants.sh builds them).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static void question(int n) {
    char cmd[64], *out = NULL;
    snprintf(cmd, sizeof cmd, "bash tools/questions.sh %d", n);
    int rc = harness_run(cmd, &out, 280);
    cr_expect_eq(rc, 0,
                 "docs/QUESTIONS.md, question %d, no longer shows what its commands print:\n%s\n"
                 "  expected: every quoted line and answer figure as the commands print it\n"
                 "  look at:  bash tools/questions.sh --show %d (what they print now), then update "
                 "the page",
                 n, out ? out : "", n);
    free(out);
}

Test(questions, q1_what_each_strategy_cuts, .timeout = 300) { question(1); }
Test(questions, q2_zero_stages, .timeout = 300) { question(2); }
Test(questions, q3_fsdp_and_zero3, .timeout = 300) { question(3); }
Test(questions, q4_70b_on_8_h100s, .timeout = 300) { question(4); }
Test(questions, q5_tp_inside_a_node, .timeout = 300) { question(5); }
Test(questions, q6_1f1b_and_gpipe, .timeout = 300) { question(6); }
// Mutant: mutants/questions-stale-figure.patch (a quoted output line no longer printed)
// Mutant: mutants/questions-stale-answer.patch (an answer's figure no longer printed)
Test(questions, q7_cost_of_7b_on_1t_tokens, .timeout = 300) { question(7); }
Test(questions, q8_loss_spikes, .timeout = 300) { question(8); }

// The checker itself can fail: copies of the page with one thing edited must each be refused.
// Mutant: mutants/questions-checker-accepts-all.patch
static void refused(const char *what, const char *sed_expr, const char *why) {
    char tmpl[] = "/tmp/lab-questions-test-XXXXXX";
    int fd = mkstemp(tmpl);
    cr_assert(fd >= 0, "mkstemp failed");
    close(fd);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "sed -e '%s' docs/QUESTIONS.md > %s && ! cmp -s docs/QUESTIONS.md %s",
             sed_expr, tmpl, tmpl);
    int rc = harness_run(cmd, &out, 30);
    cr_assert_eq(rc, 0, "%s: the edit '%s' changed nothing in docs/QUESTIONS.md (was the page "
                 "reworded? adapt this test):\n%s", what, sed_expr, out ? out : "");
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "bash tools/questions.sh --file %s 7", tmpl);
    rc = harness_run(cmd, &out, 120);
    unlink(tmpl);
    cr_expect(rc != 0 && strstr(out, why),
              "%s: tools/questions.sh accepted it\n  expected: exit status not 0 and \"%s\"\n"
              "  got:      exit %d and\n%s", what, why, rc, out ? out : "");
    free(out);
}

Test(questions, the_checker_refuses_an_edited_page, .timeout = 300) {
    refused("a quoted output figure changed", "s/GPU-hours                2.621e+04/GPU-hours                2.620e+04/",
            "is not what the command prints now");
    refused("an answer's figure changed", "s/`2.621e+04` H100-hours/`2.620e+04` H100-hours/",
            "which none of its commands prints now");
    refused("a quoted line left out between two consecutive ones", "/^  tokens                   1.00 T$/d",
            "is not what the command prints now");
    refused("two quoted lines swapped", "/^  parameters N             7.00 B$/{h;d};/^  tokens                   1.00 T$/G",
            "is not what the command prints now");
}
