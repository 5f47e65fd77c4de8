// test_summary.c: what every training chapter says about its run (issue 27): did it learn (the
// "learned:" line of common/session.c: the last loss between ln V and the data's floor, and how
// far along that way the run got), and, when its ranks share cores, a note next to its timing
// figures naming them (session_print_cores_note). Parameterized tests over every training
// chapter: a chapter added later is covered by one line in CHAPTERS.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "results.h"

// Every training chapter, with the fixed flags of a small valid layout and its ranks.
// (Arrays, not pointers: Criterion hands each parameter to a new process by value.)
// figures: what its notes must name besides the progress lines' tok/s and MFU (the loop's):
// session_print_throughput's figures, and the chapter's own timing tables'.
typedef struct Chapter {
    char tag[8];
    char run[120];
    int np;
    char figures[2][64];
} Chapter;
#define ALL_RANKS "the tokens/s and ms per step figures"
static const Chapter CHAPTERS[] = {
    {"00", "./00_memory_budget/run --train", 1, {"the tokens/s figures"}},
    {"02", "./02_data_parallel/run", 2, {ALL_RANKS, "the compute, wait, comm and step times"}},
    {"03", "./03_ddp/run", 2, {ALL_RANKS, "the communication hidden behind backward"}},
    {"05", "./05_zero/run --zero 3", 2, {ALL_RANKS}},
    {"06", "./06_fsdp/run", 2, {ALL_RANKS}},
    {"07", "./07_tensor_parallel/run --tp 2", 2, {""}},
    {"08", "./08_pipeline/run", 2, {"the tokens/s figures", "idle, bubble and imbalance"}},
    {"09", "./09_3d/run --tp 1 --pp 2", 2, {""}},
};
#define NCHAPTERS (sizeof CHAPTERS / sizeof CHAPTERS[0])

#define MODEL "--layers 2 --channels 32 --heads 2 --seq 16 --batch 8 --steps 4 --log-every 2"
#define T 16
#define V 256

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

// The synthetic source's floor for sequences of T, written out here from its definition
// (common/data.h): the first token of a row is uniform (ln V), each of the T-1 others has the
// chain's entropy rate, 1.75 bits (successors with probabilities 1/2, 1/4, 1/8, 1/8).
static double floor_of_the_chain(void) {
    const double rate = (0.5 * 1 + 0.25 * 2 + 0.125 * 3 + 0.125 * 3) * log(2.0);  // 1.75 bits
    return (log((double)V) + (T - 1) * rate) / T;
}

// The line the run must print: its last loss (the dump's), at step `end` of `steps`.
static void expected_line(char *buf, size_t n, float loss, int end, int steps) {
    const double lnV = log((double)V), fl = floor_of_the_chain();
    snprintf(buf, n, "learned: loss %.4f at step %d/%d, %.1f %% of the way from ln V = %.4f (a "
             "uniform guess) to the data's floor %.4f (T=%d)\n", (double)loss, end, steps,
             100.0 * (lnV - (double)loss) / (lnV - fl), lnV, fl, T);
}

ParameterizedTestParameters(summary, every_chapter_says_how_far_it_learned) {
    static Chapter chapters[NCHAPTERS];
    memcpy(chapters, CHAPTERS, sizeof CHAPTERS);
    return cr_make_param_array(Chapter, chapters, NCHAPTERS);
}

// Once, on rank 0, after the last step, with the run's own last loss (its --dump), the
// chain's floor for T = 16 (1.4838) and ln 256; nothing under --quiet.
// Seen failing before the fix: /work/main's chapters print no "learned:" line at all (only 00
// printed the floor, in its header).
ParameterizedTest(const Chapter *c, summary, every_chapter_says_how_far_it_learned, .timeout = 120) {
    RunResults r;
    char *out = NULL, want[256];
    int rc = harness_run_dump(c->run, c->np, MODEL, &r, &out, 90);
    cr_assert_eq(rc, 0, "chapter %s: the run failed:\n%s", c->tag, out);
    cr_assert_eq(r.nsteps, 4, "chapter %s: %d losses in the dump", c->tag, r.nsteps);
    expected_line(want, sizeof want, r.losses[3], 4, 4);
    cr_assert_eq(count(out, "learned: "), 1, "chapter %s: \"learned:\" %d times, want once:\n%s",
                 c->tag, count(out, "learned: "), out);
    cr_assert(strstr(out, want), "chapter %s: no line\n  %swith the run's last loss:\n%s", c->tag,
              want, out);
    const char *last = strstr(out, "step     4/4");
    cr_assert(last && last < strstr(out, "learned: "), "chapter %s: the line is not after the last "
              "step:\n%s", c->tag, out);
    results_free(&r);
    free(out);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s " MODEL " --quiet", c->run);
    cr_assert_eq(harness_mpirun(c->np, cmd, &out, 90), 0, "chapter %s --quiet:\n%s", c->tag, out);
    cr_assert(!strstr(out, "learned"), "chapter %s: --quiet printed:\n%s", c->tag, out);
    free(out);
}

// Stopped early (--stop-at), the line says where the run got; a --data text file has no known
// floor, and the line says so instead of a percentage.
Test(summary, a_stopped_run_and_a_text_file_say_so, .timeout = 120) {
    RunResults r;
    char *out = NULL, want[256];
    int rc = harness_run_dump("./00_memory_budget/run --train", 1, MODEL " --stop-at 2", &r, &out, 60);
    cr_assert_eq(rc, 0, "%s", out);
    expected_line(want, sizeof want, r.losses[1], 2, 4);
    cr_assert(strstr(out, want), "no line\n  %s:\n%s", want, out);
    results_free(&r);
    free(out);
    rc = harness_run_dump("./00_memory_budget/run --train", 1, MODEL " --data Makefile", &r, &out, 60);
    cr_assert_eq(rc, 0, "%s", out);
    snprintf(want, sizeof want, "learned: loss %.4f at step 4/4, from ln V = %.4f (a uniform "
             "guess); a text file's floor is not known\n", (double)r.losses[3], log(256.0));
    cr_assert(strstr(out, want), "no line\n  %s:\n%s", want, out);
    results_free(&r);
    free(out);
}

ParameterizedTestParameters(summary, shared_cores_are_said_next_to_the_timings) {
    static Chapter chapters[NCHAPTERS];
    memcpy(chapters, CHAPTERS, sizeof CHAPTERS);
    return cr_make_param_array(Chapter, chapters, NCHAPTERS);
}

// Ranks x threads above the machine's cores (LAB_CORES=1, --threads 2: on any machine): a note
// over the first progress line naming their tok/s and MFU, and one under each timing figure
// the chapter prints (CHAPTERS' figures), each saying how many ranks share how many cores; with
// a core for every thread (LAB_CORES=64): no note. Seen failing before the fix: /work/main's
// chapters print no note (03 alone said "ranks share cores" under its overlap, and counted
// neither the threads nor a cgroup's quota).
ParameterizedTest(const Chapter *c, summary, shared_cores_are_said_next_to_the_timings,
                  .timeout = 120) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s " MODEL " --threads 2", c->run);
    setenv("LAB_CORES", "1", 1);
    int rc = harness_mpirun(c->np, cmd, &out, 90);
    cr_assert_eq(rc, 0, "chapter %s: the run failed:\n%s", c->tag, out);
    char who[96];
    snprintf(who, sizeof who, "note: %d rank%s x 2 threads share 1 core here", c->np,
             c->np == 1 ? "" : "s");
    int want = 1;
    const char *first = strstr(out, "note: "), *step = strstr(out, "step     1/4");
    const char *tok = first ? strstr(first, "the tok/s and MFU of the progress lines") : NULL;
    cr_assert(first && step && tok && tok < step, "chapter %s: no note over the first progress "
              "line:\n%s", c->tag, out);
    for (int k = 0; k < 2; k++) {
        if (!c->figures[k][0]) continue;
        want++;
        cr_assert(strstr(out, c->figures[k]), "chapter %s: no note names \"%s\":\n%s", c->tag,
                  c->figures[k], out);
    }
    cr_assert_eq(count(out, "note: "), want, "chapter %s: %d notes, want %d:\n%s", c->tag,
                 count(out, "note: "), want, out);
    cr_assert_eq(count(out, who), want, "chapter %s: not every note says \"%s\":\n%s", c->tag, who,
                 out);
    free(out);
    setenv("LAB_CORES", "64", 1);
    snprintf(cmd, sizeof cmd, "%s " MODEL, c->run);
    rc = harness_mpirun(c->np, cmd, &out, 90);
    cr_assert_eq(rc, 0, "chapter %s: the run failed:\n%s", c->tag, out);
    cr_assert(!strstr(out, "note: "), "chapter %s: a note with a core per rank:\n%s", c->tag, out);
    free(out);
    unsetenv("LAB_CORES");
}
