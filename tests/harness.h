// harness.h: helpers for Criterion tests that launch programs (MPI jobs, chapter runs) and
// compare what they dumped.
//
// Criterion runs each test in a forked process, where a raw fork() confuses it; popen() of a
// shell command works, so every launch here goes through popen (docs/ARCHITECTURE.md, "Proof").
// Tests run from the repository root; binaries are found under harness_build_dir().
#pragma once
#include <stddef.h>
#include "gpt2.h"
#include "results.h"

// The build directory of the test binaries: $LAB_BUILD, default "build".
const char *harness_build_dir(void);

// Runs `sh -c cmd` with stdout and stderr captured together into *output (malloc'd, NUL-ended;
// pass NULL to discard). Kills it after timeout_s seconds. Returns the exit status, or 124 on
// timeout.
int harness_run(const char *cmd, char **output, int timeout_s);

// mpirun -np <np> <prog_and_args> with the lab's launch flags (root allowed, oversubscribed,
// shared memory, one BLAS thread per rank, no binding). Same return value as harness_run.
int harness_mpirun(int np, const char *prog_and_args, char **output, int timeout_s);

// Runs `mpirun -np <np> <prog> <flags> --dump <tmpfile>`, reads the results file into *out and
// deletes it. Returns the exit status; when the run succeeded but the file cannot be read,
// returns -1 and puts the reason into *output (appended). `output` may be NULL.
int harness_run_dump(const char *prog, int np, const char *flags, RunResults *out, char **output, int timeout_s);

// max_i |a_i - b_i| / max(|b_i|, 1e-30); NaN anywhere gives +inf.
float harness_max_rel_diff(const float *a, const float *b, size_t n);
// max_i |a_i - b_i|; NaN anywhere gives +inf.
float harness_max_abs_diff(const float *a, const float *b, size_t n);

// 1 when a and b have the same number of steps and parameters, every loss within relative
// loss_rtol and every parameter within absolute param_atol. Otherwise prints (stderr, prefixed
// by `what`) the worst step and the worst parameter index with both values, and returns 0.
int harness_results_match(const char *what, const RunResults *a, const RunResults *b, float loss_rtol,
                          float param_atol);

// Runs harness_run_dump (timeout 120 s) and fails the Criterion test, with the run's output,
// unless it succeeded.
#define harness_assert_run_dump(prog, np, flags, out)                                             \
    do {                                                                                          \
        char *log_ = NULL;                                                                        \
        int rc_ = harness_run_dump((prog), (np), (flags), (out), &log_, 120);                     \
        cr_assert_eq(rc_, 0, "%s -np %d %s failed:\n%s", (prog), (np), (flags), log_);           \
        free(log_);                                                                               \
    } while (0)

// The worst loss (relative) and weight (absolute) difference of a from b, into *dl and *dp, and
// printed for the record on stderr ("<tag>: <what> losses within ..., weights within ...").
// Returns 0 (and prints why) when a and b do not have the same numbers of steps and weights.
int harness_diffs(const char *tag, const char *what, const RunResults *a, const RunResults *b,
                  float *dl, float *dp);

// NULL when harness_results_match holds; otherwise its failure message (malloc'd; see
// harness_expect.h): the worst step's loss and the worst weight, expected (b's) and got (a's).
char *harness_results_mismatch(const char *what, const RunResults *a, const RunResults *b,
                               float loss_rtol, float param_atol);

// Criterion assertion on top of harness_results_mismatch (b: the reference run).
#define harness_assert_results_match(what, a, b, loss_rtol, param_atol)                          \
    do {                                                                                          \
        char *why_ = harness_results_mismatch((what), (a), (b), (loss_rtol), (param_atol));       \
        cr_assert(why_ == NULL, "%s", why_);                                                      \
    } while (0)

// Reliability checks every training chapter runs. prog: the program and its fixed flags (e.g.
// "./03_ddp/run --quiet"); flags: the model and run flags (with --steps). 1 when the check
// holds; otherwise prints why (stderr) and returns 0.
//   resume: `flags --stop-at K --save F`, then `flags --resume F`, on np ranks: the losses of
//           steps K.. and the final weights are bit-identical with one uninterrupted run.
//   nan:    `flags --save F --save-every 2 --inject-nan-step 5` on np ranks: the job fails
//           promptly (no hang) with one message (not one per rank) naming NaN and step 5 (the
//           5th step, as the progress lines count), and F holds the state after step 4
//           (cfg: the model of flags, to read F).
int harness_resume_is_exact(const char *prog, int np, const char *flags, int stop_at);
int harness_nan_fails_cleanly(const char *prog, int np, const char *flags, const GPT2Config *cfg);
#define harness_assert_resume_exact(prog, np, flags, stop_at)                                     \
    cr_assert(harness_resume_is_exact((prog), (np), (flags), (stop_at)),                          \
              "%s -np %d: resuming is not exact (details above on stderr)", (prog), (np))
#define harness_assert_nan_fails_cleanly(prog, np, flags, cfg)                                    \
    cr_assert(harness_nan_fails_cleanly((prog), (np), (flags), (cfg)),                            \
              "%s -np %d: a NaN did not end the run cleanly (details above on stderr)", (prog), (np))

// The reliability every training chapter owes, present and future, each check on np ranks;
// prog: the program and its fixed flags, flags: the model flags WITHOUT --steps (each check
// adds its own; a flag given twice is refused). 1 when it holds; otherwise prints why (stderr).
//   kill:        --kill-rank np-1 --kill-step 2 of a 1000-step run: the job ends with a non-zero
//                status within HARNESS_PROMPT_S of the rank's message (no survivor waits forever).
//   save-signal: a 2-step run saves F; a second run (LAB_SAVE_STALL_S: its first save stalls
//                with the tmp written) gets `sig` inside that save: the job ends non-zero within
//                HARNESS_PROMPT_S, F is byte-for-byte the 2-step state and loads; resuming from
//                it then works and leaves no <F>.tmp behind.
//   oom:         --inject-oom-step np-1:6 of a 1000-step run saving every 2 steps: one
//                out-of-memory message, from rank np-1, naming the flag; the job ends non-zero
//                within HARNESS_PROMPT_S of it, and the checkpoint on disk loads and holds step 4.
//   reliability: all of them (kill only when np > 1, as one rank has nobody to notice), the
//                save-signal check with SIGTERM and with SIGKILL, the NaN check
//                (harness_nan_fails_cleanly, with --steps 10) and the OOM check. One call per
//                chapter.
#define HARNESS_PROMPT_S 10.0
int harness_kill_ends_promptly(const char *prog, int np, const char *flags);
int harness_oom_fails_cleanly(const char *prog, int np, const char *flags, const GPT2Config *cfg);
int harness_save_signal_is_safe(const char *prog, int np, const char *flags, const GPT2Config *cfg,
                                int sig);
int harness_reliability_holds(const char *prog, int np, const char *flags, const GPT2Config *cfg);
#define harness_assert_reliable(prog, np, flags, cfg)                                             \
    cr_assert(harness_reliability_holds((prog), (np), (flags), (cfg)),                            \
              "%s -np %d: a reliability check failed (details above on stderr)", (prog), (np))

// Does `haystack` contain `needle`? (NULL haystack: no.)
int harness_contains(const char *haystack, const char *needle);
// A text file's lines (at most max, each malloc'd, newline kept); returns how many, -1 if the
// file cannot be opened.
int harness_read_lines(const char *path, char **lines, int max);
// A file's bytes (malloc'd, *n of them, followed by a 0 so a text file is a C string), or NULL
// if it cannot be opened.
unsigned char *harness_slurp(const char *path, size_t *n);

// A refused run (bad input): `cmd` on np ranks must end within 60 s with a failure whose output
// says every one of words[0 .. nwords), and words[0] only once (one message for the job, not one
// per rank). 1 if so; else 0, with the reason and the output on stderr.
int harness_refuses(int np, const char *cmd, const char *const *words, int nwords);
#define harness_assert_refused(np, cmd, ...)                                                      \
    cr_assert(harness_refuses((np), (cmd), (const char *[]){__VA_ARGS__},                        \
                              (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *))),   \
              "-np %d %s: not refused with one clear message (details above on stderr)", (np),   \
              (cmd))

// Runs fn(arg) in this process and catches a lab_fail/LAB_CHECK inside it: lab_fail calls
// lab_abort_hook before exit(), and a hook that longjmps back lets the test read the message
// (stderr is captured into a temp file meanwhile) and assert on its words. Returns the message
// it printed if it failed through lab_fail, NULL if fn returned normally.
const char *harness_expect_fail(void (*fn)(void *), void *arg);

// An MPI test program (tests/mpi_*.c on tests/mpitest.h) on 1, 2, ... max_np ranks:
// `<build>/tests/<prog> <what>` must exit 0 and its summary line "<prog>: <what> on N ranks:
// C checks, F failed" report N = np, C > 0, F = 0. 1 when that holds on every rank count (it
// stops at the first that fails); otherwise returns 0 with *why the failure message
// (expect_mpi_msg: expected, got, the README section, the run's output; malloc'd).
int harness_mpi_program_passes(const char *prog, const char *what, int max_np, int timeout_s, char **why);
