// test_matrix.c: the test matrix of issue 22 ("a test matrix, not samples"): every training
// chapter x {fp32, bf16} x {one rank, several, uneven} x {uninterrupted, saved at step K and
// resumed} x {no accumulation, accumulation where the chapter offers it}, each cell checked
// against chapter 00's run with the same model flags, with the bounds of the chapter's own
// tests (tests/test_0X_*.c). Bugs hide in the cells no test visits: the deliberate bugs in
// mutants/ that survived the old suite are caught here (each test below names its mutants).
//
// Not part of `make test`: `make matrix` runs it (CI, its own stage). Table-driven: a chapter
// added later is one line in ROWS and one MATRIX_TESTS line (tests <row>_<dtype>_lay<1..3>).
//
// Each cell is three runs: the uninterrupted run, `--stop-at K --save F` and `--resume F`.
//   uninterrupted: losses and final weights against 00 within the chapter's bounds (bit-exact
//                  where the chapter's tests say so: one rank, no accumulation)
//   resumed:       the resumed steps' losses and the final weights against 00 within the same
//                  bounds, and bit-exact against the uninterrupted run of the same cell
// The oracle (00 --train) runs once per distinct model flags and dtype, cached on disk for the
// whole Criterion run (tests run in forked processes).
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define ORACLE "./00_memory_budget/run --train --quiet"
// 59,584 parameters: not a multiple of 3 (uneven ZeRO/FSDP shards on 3 ranks); batch 24
// divides over 3 ranks x 4 micro-steps (03), 3 x 2 (06, 09) and 8 micro-batches (08). (With
// --batch 12 one wte row whose gradient is near 0 puts 07-09 4.4e-5 from 00 after Adam, above
// their bounds on one rank too: the batch their tests measured is kept.)
#define MODEL "--layers 4 --channels 32 --heads 4 --seq 16 --batch 24 --steps 3"
#define STOP 2  // the interrupted run saves after step STOP; the resumed run does the rest

#define EXACT_FP32 1
#define EXACT_BF16 2
#define EXACT (EXACT_FP32 | EXACT_BF16)

typedef struct {
    int np;             // 0: no such layout
    const char *flags;  // the chapter's layout flags
    const char *model;  // model flags the oracle gets too (e.g. --vocab 251)
    const char *label;  // one, several, uneven (and why)
    int twin_np;             // > 0: a run the chapter says gives the same bits (the same
    const char *twin_flags;  // computation laid out otherwise): checked bit for bit
} Layout;

typedef struct {
    const char *name;    // the row: chapter and variant
    const char *prog;    // the program and its fixed flags
    Layout layouts[3];
    const char *accum[2];  // "" = no accumulation; NULL = the chapter offers none
    float rtol, atol;      // fp32 bounds: losses relative, weights absolute (the chapter's tests)
    float bf_rtol, bf_atol;
    int exact1;            // bit-exact on one rank without accumulation (the chapter's tests say so):
                           // EXACT_FP32 | EXACT_BF16
} Row;

#define L(np, flags, model, label) {np, flags, model, label, 0, NULL}
#define ONE_SEVERAL_UNEVEN(flags) \
    {L(1, flags, "", "one"), L(2, flags, "", "several"), L(3, flags, "", "uneven (3 ranks)")}
#define DP_BOUNDS 1e-6f, 2e-4f, 1e-4f, 8e-3f  // test_02/03/05/06
#define ZERO_ROW(s) \
    {"05 --zero " #s, "./05_zero/run --quiet", ONE_SEVERAL_UNEVEN("--zero " #s), {"", NULL}, DP_BOUNDS, EXACT}
#define PIPE_LAYOUTS(f) {L(1, f, "", "one"), L(2, f, "", "several"), L(4, f, "", "several (4 stages)")}

// Every training chapter, one line each (08 every schedule, 05 every stage).
static const Row ROWS[] = {
    {"00 --train", ORACLE, {L(1, "", "", "one")}, {"", NULL}, 0, 0, 0, 0, EXACT},
    {"02", "./02_data_parallel/run --quiet", ONE_SEVERAL_UNEVEN(""), {"", NULL}, DP_BOUNDS, EXACT},
    {"03", "./03_ddp/run --quiet --overlap-steps 0", ONE_SEVERAL_UNEVEN(""), {"", "--grad-accum 4"},
     DP_BOUNDS, EXACT},
    ZERO_ROW(0), ZERO_ROW(1), ZERO_ROW(2), ZERO_ROW(3),
    {"06", "./06_fsdp/run --quiet", ONE_SEVERAL_UNEVEN(""), {"", "--grad-accum 2"}, DP_BOUNDS, EXACT},
    // 07's uneven count is the vocabulary: V = 251 over tp 2; --tp 1 runs gpt2's own pieces: 00's bits
    {"07", "./07_tensor_parallel/run --quiet",
     {L(1, "--tp 1", "", "one"), L(2, "--tp 2", "", "several"), L(2, "--tp 2", "--vocab 251", "uneven (V=251 on tp 2)")},
     {"", NULL}, 1e-6f, 2e-5f, 1e-4f, 8e-3f, EXACT},
    // 08's accumulation is its micro-batches (m = 1: none); layers must divide over the stages,
    // so its third layout is 4 stages; interleaved needs m a multiple of the stages (m 4 and 8)
    {"08 gpipe", "./08_pipeline/run --quiet", PIPE_LAYOUTS("--schedule gpipe"),
     {"--micro-batches 1", "--micro-batches 4"}, 1e-6f, 3e-5f, 2e-4f, 8e-3f, EXACT_BF16},
    {"08 1f1b", "./08_pipeline/run --quiet", PIPE_LAYOUTS("--schedule 1f1b"),
     {"--micro-batches 1", "--micro-batches 4"}, 1e-6f, 3e-5f, 2e-4f, 8e-3f, EXACT_BF16},
    {"08 zb", "./08_pipeline/run --quiet", PIPE_LAYOUTS("--schedule zb"),
     {"--micro-batches 1", "--micro-batches 4"}, 1e-6f, 3e-5f, 2e-4f, 8e-3f, EXACT_BF16},
    {"08 interleaved", "./08_pipeline/run --quiet",
     // two chunks on one rank: the message between them rounds as a real one (bf16), so the
     // bits are 1F1B's on 2 ranks (the same stage boundaries)
     {{1, "--schedule interleaved --chunks 2", "", "one (2 chunks)", 2, "--schedule 1f1b"},
      L(2, "--schedule interleaved --chunks 2", "", "several"),
      L(4, "--schedule interleaved --chunks 1", "", "several (4 stages)")},
     {"--micro-batches 4", "--micro-batches 8"}, 1e-6f, 3e-5f, 2e-4f, 8e-3f, 0},
    // 09: one rank, (dp, tp, pp) = (1, 2, 2), and ZeRO-1 over dp 3 (uneven pieces); one rank with
    // tp 1 is 08's bits (test_09_3d), so exact where 08's one rank is (bf16). Weights bound 3e-5
    // as the row below: the average over 3 replicas rounds (dp 3 with tp 1 is 05's ZeRO-1 on 3
    // ranks bit for bit, measured 1.2e-5 from 00, as its --zero 0)
    {"09", "./09_3d/run --quiet",
     {L(1, "", "", "one"), L(4, "--tp 2 --pp 2", "", "several (1,2,2)"),
      L(3, "--dp 3 --zero 1", "", "uneven (ZeRO-1 over dp 3)")},
     {"--micro-batches 1", "--micro-batches 2"}, 1e-6f, 3e-5f, 2e-4f, 8e-3f, EXACT_BF16},
    // 09 --zero 2 (09_3d/dp.h): one rank, dp 2 x pp 2 (both ends of the tied wte), and dp 3 x
    // tp 2 (uneven pieces); 6-rank weights bound 3e-5 (test_09_3d's UNEVEN_PARAM_ATOL: the
    // average over 3 replicas rounds)
    {"09 --zero 2", "./09_3d/run --quiet --zero 2",
     {L(1, "", "", "one"), L(4, "--dp 2 --pp 2", "", "several (2,1,2)"),
      L(6, "--dp 3 --tp 2", "", "uneven (ZeRO-2 over dp 3 x tp 2)")},
     {"--micro-batches 1", "--micro-batches 2"}, 1e-6f, 3e-5f, 2e-4f, 8e-3f, EXACT_BF16},
};
#define NROWS ((int)(sizeof ROWS / sizeof ROWS[0]))

// ---- the oracle, once per model flags and dtype for the whole run ---------------------------

static void cache_path(char *buf, size_t n, const char *flags) {
    unsigned long h = 5381;
    for (const char *p = flags; *p; p++) h = h * 33 + (unsigned char)*p;
    snprintf(buf, n, "/tmp/lab_matrix_%d/oracle_%lx.dump", (int)getppid(), h);
}

static int oracle(const char *flags, RunResults *out) {
    char path[256], err[256];
    cache_path(path, sizeof path, flags);
    if (results_read(path, out, err, sizeof err) == 0) return 1;
    char *log = NULL;
    if (harness_run_dump(ORACLE, 1, flags, out, &log, 120) != 0) {
        fprintf(stderr, "oracle %s failed:\n%s\n", flags, log);
        free(log);
        return 0;
    }
    free(log);
    *strrchr(path, '/') = '\0';
    mkdir(path, 0700);
    path[strlen(path)] = '/';
    results_write(path, out);  // atomic: two tests writing it at once both write the same
    return 1;
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    (void)stats;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/lab_matrix_%d", (int)getpid());
    if (system(cmd) != 0) fprintf(stderr, "could not remove /tmp/lab_matrix_%d\n", (int)getpid());
}

// ---- one cell --------------------------------------------------------------------------------

typedef struct {
    int cells, failed;
    double worst;  // measured / bound of the worst failed cell (inf: bit-exact broken)
    char first[600];
} Tally;

static double ratio(double d, double bound) { return d <= bound ? 0.0 : bound > 0 ? d / bound : INFINITY; }

// a against the oracle o from step `from` on; 1 when within (rtol, atol)
static int check(Tally *t, const char *what, const RunResults *a, const RunResults *o, int from,
                 float rtol, float atol) {
    t->cells++;
    char msg[600];
    if (a->nsteps != o->nsteps || a->nparams != o->nparams) {
        snprintf(msg, sizeof msg, "%s: %d steps, %zu weights; 00 has %d and %zu", what, a->nsteps,
                 a->nparams, o->nsteps, o->nparams);
        fprintf(stderr, "FAIL %s\n", msg);
        if (t->failed++ == 0 || t->worst < INFINITY) snprintf(t->first, sizeof t->first, "%s", msg), t->worst = INFINITY;
        return 0;
    }
    double dl = harness_max_rel_diff(a->losses + from, o->losses + from, (size_t)(a->nsteps - from));
    double dp = harness_max_abs_diff(a->params, o->params, a->nparams);
    double r = fmax(ratio(dl, rtol), ratio(dp, atol));
    snprintf(msg, sizeof msg, "%s: losses %.2g (bound %.2g), weights %.2g (bound %.2g)", what, dl,
             (double)rtol, dp, (double)atol);
    if (r == 0.0) {
        fprintf(stderr, "ok   %s\n", msg);
        return 1;
    }
    fprintf(stderr, "FAIL %s\n", msg);
    if (t->failed++ == 0 || r > t->worst) {
        t->worst = r;
        snprintf(t->first, sizeof t->first, "%s", msg);
    }
    return 0;
}

static void fail_run(Tally *t, const char *what, const char *log) {
    t->cells++;
    fprintf(stderr, "FAIL %s: the run failed:\n%s\n", what, log ? log : "");
    if (t->failed++ == 0 || t->worst < INFINITY) {
        t->worst = INFINITY;
        snprintf(t->first, sizeof t->first, "%s: the run failed", what);
    }
}

static void run_cell(Tally *t, const Row *row, const Layout *lay, const char *acc, int bf16) {
    char model[256], flags[512], what[256], ck[128], cmd[1024], more[768];
    snprintf(model, sizeof model, MODEL " %s%s", lay->model, bf16 ? " --dtype bf16" : "");
    snprintf(flags, sizeof flags, "%s %s %s", model, lay->flags, acc);
    snprintf(what, sizeof what, "%s %s -np %d %s%s%s [%s]", row->name, bf16 ? "bf16" : "fp32", lay->np,
             lay->flags, *acc ? " " : "", acc, lay->label);
    int exact = (row->exact1 & (bf16 ? EXACT_BF16 : EXACT_FP32)) && lay->np == 1 &&
                (acc[0] == '\0' || strcmp(acc, "--micro-batches 1") == 0);
    float rtol = exact ? 0.0f : bf16 ? row->bf_rtol : row->rtol;
    float atol = exact ? 0.0f : bf16 ? row->bf_atol : row->atol;
    RunResults o, whole, res;
    if (!oracle(model, &o)) {
        fail_run(t, what, "the oracle failed");
        return;
    }
    char *log = NULL, w2[320];
    if (harness_run_dump(row->prog, lay->np, flags, &whole, &log, 180) != 0) {
        fail_run(t, what, log);
        free(log);
        results_free(&o);
        return;
    }
    free(log);
    log = NULL;
    snprintf(w2, sizeof w2, "%s uninterrupted", what);
    check(t, w2, &whole, &o, 0, rtol, atol);
    if (lay->twin_np > 0) {
        RunResults tw;
        snprintf(more, sizeof more, "%s %s %s", model, lay->twin_flags, acc);
        snprintf(w2, sizeof w2, "%s vs -np %d %s (the same bits)", what, lay->twin_np, lay->twin_flags);
        if (harness_run_dump(row->prog, lay->twin_np, more, &tw, &log, 180) != 0) {
            fail_run(t, w2, log);
        } else {
            check(t, w2, &whole, &tw, 0, 0.0f, 0.0f);
            results_free(&tw);
        }
        free(log);
        log = NULL;
    }

    snprintf(ck, sizeof ck, "/tmp/lab_matrix_%d_%d.ckpt", (int)getppid(), (int)getpid());
    snprintf(cmd, sizeof cmd, "%s %s --stop-at %d --save %s", row->prog, flags, STOP, ck);
    snprintf(more, sizeof more, "%s --resume %s", flags, ck);
    snprintf(w2, sizeof w2, "%s resumed at %d", what, STOP);
    if (harness_mpirun(lay->np, cmd, &log, 180) != 0 ||
        (free(log), log = NULL, harness_run_dump(row->prog, lay->np, more, &res, &log, 180) != 0)) {
        fail_run(t, w2, log);
    } else {
        if (check(t, w2, &res, &o, STOP, rtol, atol)) {
            // and bit for bit the uninterrupted run of this cell
            snprintf(w2, sizeof w2, "%s resumed at %d vs uninterrupted", what, STOP);
            check(t, w2, &res, &whole, STOP, 0.0f, 0.0f);
        }
        results_free(&res);
    }
    free(log);
    unlink(ck);
    results_free(&whole);
    results_free(&o);
}

// The cells of row `name` in one dtype and one layout (0 one rank, 1 several, 2 uneven).
static void run_rows(const char *name, int bf16, int l) {
    Tally t = {0, 0, 0.0, ""};
    const Row *row = NULL;
    for (int i = 0; i < NROWS; i++)
        if (strcmp(ROWS[i].name, name) == 0) row = &ROWS[i];
    cr_assert(row != NULL, "no row %s", name);
    if (row->layouts[l].np == 0) cr_skip_test("%s has no layout %d", name, l + 1);
    for (int a = 0; a < 2; a++)
        if (row->accum[a] != NULL) run_cell(&t, row, &row->layouts[l], row->accum[a], bf16);
    fprintf(stderr, "%s %s %s: %d checks, %d failed\n", name, bf16 ? "bf16" : "fp32",
            row->layouts[l].label, t.cells, t.failed);
    cr_assert(t.failed == 0, "%d of %d checks failed; worst %s", t.failed, t.cells, t.first);
}

// Tests <id>_<dtype>_lay<k>: row `name`, layout k (1 one rank, 2 several, 3 uneven), so that a
// mutant names the few cells that catch it.
#define MATRIX_DTYPE_TESTS(id, name, dt, bf16)                                                 \
    Test(matrix, id##_##dt##_lay1, .timeout = 300) { run_rows(name, bf16, 0); }                \
    Test(matrix, id##_##dt##_lay2, .timeout = 300) { run_rows(name, bf16, 1); }                \
    Test(matrix, id##_##dt##_lay3, .timeout = 300) { run_rows(name, bf16, 2); }
#define MATRIX_TESTS(id, name) MATRIX_DTYPE_TESTS(id, name, fp32, 0) MATRIX_DTYPE_TESTS(id, name, bf16, 1)

MATRIX_TESTS(ch00, "00 --train")
MATRIX_TESTS(ch02, "02")
MATRIX_TESTS(ch03, "03")
MATRIX_TESTS(ch05_zero0, "05 --zero 0")
// Mutant: mutants/zero12-bf16-save-whole-weights.patch (bf16 resumed cells, 05 --zero 1 and 2)
MATRIX_TESTS(ch05_zero1, "05 --zero 1")
MATRIX_TESTS(ch05_zero2, "05 --zero 2")
MATRIX_TESTS(ch05_zero3, "05 --zero 3")
// Mutant: mutants/fsdp-bf16-accum-rounds-addend.patch (bf16 --grad-accum 2 cells)
MATRIX_TESTS(ch06, "06")
// Mutant: mutants/whole-load-bcast-weights-only.patch (resumed cells on several ranks, 07 and 08)
MATRIX_TESTS(ch07, "07")
// Mutant: mutants/pipe-one-stage-ckpt-order.patch (-np 1 resumed cells of every schedule)
MATRIX_TESTS(ch08_gpipe, "08 gpipe")
MATRIX_TESTS(ch08_1f1b, "08 1f1b")
MATRIX_TESTS(ch08_zb, "08 zb")
// Mutant: mutants/pipe-local-msg-skips-bf16-rounding.patch (bf16 two chunks on one rank vs 1F1B on 2)
MATRIX_TESTS(ch08_interleaved, "08 interleaved")
MATRIX_TESTS(ch09, "09")
MATRIX_TESTS(ch09_zero2, "09 --zero 2")

// Every row is named by a test above.
Test(matrix, every_row_has_its_tests) {
    static const char *named[] = {"00 --train", "02", "03", "05 --zero 0", "05 --zero 1", "05 --zero 2",
                                  "05 --zero 3", "06", "07", "08 gpipe", "08 1f1b", "08 zb",
                                  "08 interleaved", "09", "09 --zero 2"};
    for (int i = 0; i < NROWS; i++) {
        int found = 0;
        for (size_t k = 0; k < sizeof named / sizeof named[0]; k++) found |= strcmp(named[k], ROWS[i].name) == 0;
        cr_assert(found, "row %s has no MATRIX_TESTS line", ROWS[i].name);
    }
}

// ---- at least one run without --quiet: its progress lines and its per-rank table -------------

// 09 on (dp, tp, pp) = (2, 2, 2) without --quiet, --log-every 1: one progress line per step whose
// loss is the dumped loss to the 4 digits printed, and in the per-rank table every rank's TP, DP
// and PP bytes per step equal to the formula to the byte ('=': what only this table shows).
// Mutant: mutants/counter-reset-wrong-group.patch
Test(matrix, progress_lines_without_quiet, .timeout = 300) {
    RunResults r;
    char *log = NULL;
    int rc = harness_run_dump("./09_3d/run --log-every 1", 8, MODEL " --tp 2 --pp 2", &r, &log, 180);
    cr_assert_eq(rc, 0, "09 -np 8 --tp 2 --pp 2 failed:\n%s", log);
    int seen = 0, rows = 0, bad = 0;
    char first[400] = "";
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        int s, n, rank;
        float loss;
        char co[16];
        if (sscanf(line, "step %d/%d loss %f", &s, &n, &loss) == 3) {
            char want[32], got[32];
            snprintf(want, sizeof want, "%.4f", (double)r.losses[s - 1]);
            snprintf(got, sizeof got, "%.4f", (double)loss);
            cr_assert(s == seen + 1 && n == r.nsteps && strcmp(want, got) == 0,
                      "progress line '%s': want step %d/%d loss %s", line, seen + 1, r.nsteps, want);
            seen++;
        } else if (sscanf(line, " %d (%15[0-9,])", &rank, co) == 2 && strstr(line, "B (") != NULL) {
            rows++;
            int eq = 0;
            for (const char *p = line; (p = strstr(p, "(=")) != NULL; p++) eq++;
            if (eq != 3 && bad++ == 0) snprintf(first, sizeof first, "%s", line);
        }
    }
    cr_assert_eq(seen, r.nsteps, "%d progress lines for %d steps:\n%s", seen, r.nsteps, log);
    cr_assert_eq(rows, 8, "%d rows in the per-rank table, want 8", rows);
    cr_assert_eq(bad, 0, "%d of 8 ranks' bytes per step are not the formula's (3 columns with '=' each); "
                 "first: %s", bad, first);
    results_free(&r);
    free(log);
}
