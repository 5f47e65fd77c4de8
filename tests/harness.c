// harness.c: launching programs from Criterion tests and comparing their results (harness.h).
#include "harness.h"
#include <setjmp.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "harness_expect.h"

const char *harness_build_dir(void) {
    const char *b = getenv("LAB_BUILD");
    return (b && b[0]) ? b : "build";
}

// A malloc'd string from a printf format.
static char *str_printf(const char *fmt, ...) LAB_PRINTF(1, 2);
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = lab_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

// cmd inside single quotes for sh: every ' becomes '\''.
static char *shell_quote(const char *cmd) {
    size_t n = 3;
    for (const char *p = cmd; *p; p++) n += *p == '\'' ? 4 : 1;
    char *q = lab_xmalloc(n), *w = q;
    *w++ = '\'';
    for (const char *p = cmd; *p; p++) {
        if (*p == '\'') {
            memcpy(w, "'\\''", 4);
            w += 4;
        } else {
            *w++ = *p;
        }
    }
    *w++ = '\'';
    *w = '\0';
    return q;
}

// Runs cmd (stdout and stderr captured into *output) and reads its output as it comes. With a
// trigger (not NULL), at the first line containing it, records the time since the start in *t_trigger
// (else -1) and, when sig > 0, sends sig to the process named "[pid N]" in that line.
// *t_end: when the output ended. Returns the exit status (124 on timeout).
static int run_watch(const char *cmd, int timeout_s, const char *trigger, int sig, char **output,
                     double *t_trigger, double *t_end) {
    char *quoted = shell_quote(cmd);
    // timeout signals its whole process group, so mpirun and every rank go too.
    char *full = str_printf("timeout -k 5 %d sh -c %s </dev/null 2>&1", timeout_s, quoted);
    free(quoted);
    fflush(stdout);
    fflush(stderr);
    double t0 = lab_now();
    *t_trigger = -1.0;
    FILE *p = popen(full, "r");
    free(full);
    if (!p) {
        *output = str_printf("(popen failed)");
        *t_end = 0;
        return -1;
    }
    size_t cap = 4096, len = 0;
    char *buf = lab_xmalloc(cap), line[4096];
    buf[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        size_t n = strlen(line);
        if (len + n + 1 > cap) {
            while (len + n + 1 > cap) cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) lab_fail("run_watch: out of memory capturing output of %s", cmd);
            buf = grown;
        }
        memcpy(buf + len, line, n + 1);
        len += n;
        if (trigger && *t_trigger < 0 && strstr(line, trigger)) {
            *t_trigger = lab_now() - t0;
            const char *at = strstr(line, "[pid ");
            if (sig > 0 && at) kill((pid_t)atoi(at + 5), sig);
        }
    }
    int status = pclose(p);
    *t_end = lab_now() - t0;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if ((rc == 124 || rc == 137) && *t_end >= timeout_s) rc = 124;
    *output = buf;
    return rc;
}

int harness_run(const char *cmd, char **output, int timeout_s) {
    double t_trigger, t_end;
    char *out = NULL;
    int rc = run_watch(cmd, timeout_s, NULL, 0, &out, &t_trigger, &t_end);
    if (output) *output = out;
    else free(out);
    return rc;
}

// The lab's mpirun line; env: "NAME=VALUE" set for every rank, or NULL.
static char *mpirun_cmd(int np, const char *env, const char *prog_and_args) {
    char *xenv = env ? str_printf("%s ", env) : str_printf("%s", "");
    char *xflag = env ? str_printf("-x %.*s ", (int)strcspn(env, "="), env) : str_printf("%s", "");
    // The transport: shared memory between the ranks of this machine, or what LAB_TEST_MCA says
    // (tests/test_nodes.c: TCP, the transport between separate nodes)
    const char *mca = getenv("LAB_TEST_MCA");
    if (!mca || !*mca) mca = "--mca btl self,vader";
    char *cmd = str_printf("%smpirun --allow-run-as-root --oversubscribe --bind-to none %s "
                           "--mca mpi_yield_when_idle 1 -x OPENBLAS_NUM_THREADS=1 %s-np %d %s",
                           xenv, mca, xflag, np, prog_and_args);
    free(xenv);
    free(xflag);
    return cmd;
}

int harness_mpirun(int np, const char *prog_and_args, char **output, int timeout_s) {
    char *cmd = mpirun_cmd(np, NULL, prog_and_args);
    int rc = harness_run(cmd, output, timeout_s);
    free(cmd);
    return rc;
}

int harness_run_dump(const char *prog, int np, const char *flags, RunResults *out, char **output, int timeout_s) {
    memset(out, 0, sizeof *out);
    char path[] = "/tmp/lab-dump-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        if (output) *output = str_printf("harness_run_dump: mkstemp failed");
        return -1;
    }
    close(fd);
    unlink(path);  // the run must create it: a stale empty file must not pass for a result
    char *args = str_printf("%s %s --dump %s", prog, flags ? flags : "", path);
    char *text = NULL;
    int rc = harness_mpirun(np, args, &text, timeout_s);
    free(args);
    if (rc == 0) {
        char err[512];
        if (results_read(path, out, err, sizeof err) != 0) {
            char *more = str_printf("%s\nharness_run_dump: %s\n", text, err);
            free(text);
            text = more;
            rc = -1;
        }
    }
    unlink(path);
    char tmp[sizeof path + 4];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp);
    if (output) *output = text;
    else free(text);
    return rc;
}

float harness_max_abs_diff(const float *a, const float *b, size_t n) {
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

float harness_max_rel_diff(const float *a, const float *b, size_t n) {
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]) / fmaxf(fabsf(b[i]), 1e-30f);
        if (isnan(d)) return INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

char *harness_results_mismatch(const char *what, const RunResults *a, const RunResults *b,
                               float loss_rtol, float param_atol) {
    if (a->nsteps != b->nsteps || a->nparams != b->nparams) {
        char want[96], got[96];
        snprintf(want, sizeof want, "%d steps and %zu weights (the reference run's)", b->nsteps, b->nparams);
        snprintf(got, sizeof got, "%d steps and %zu weights", a->nsteps, a->nparams);
        return expect_msg(want, got, "%s: the run's shape", what);
    }
    // worst loss step
    int ws = -1;
    float wrel = 0.0f;
    for (int s = 0; s < a->nsteps; s++) {
        float rel = harness_max_rel_diff(&a->losses[s], &b->losses[s], 1);
        if (ws < 0 || rel > wrel) {
            ws = s;
            wrel = rel;
        }
    }
    // worst parameter
    size_t wi = 0;
    float wabs = -1.0f;
    for (size_t i = 0; i < a->nparams; i++) {
        float d = harness_max_abs_diff(&a->params[i], &b->params[i], 1);
        if (d > wabs) {
            wi = i;
            wabs = d;
        }
    }
    int loss_bad = ws >= 0 && !(wrel <= loss_rtol), param_bad = a->nparams > 0 && !(wabs <= param_atol);
    if (!loss_bad && !param_bad) return NULL;
    char what2[512], want[256] = "", got[256] = "";
    snprintf(what2, sizeof what2, "%s, against the reference run:%s%s", what,
             loss_bad ? " the loss of the worst step" : "", param_bad ? (loss_bad ? " and the worst weight" : " the worst weight") : "");
    if (loss_bad) {
        snprintf(want, sizeof want, "step %d loss %.9g (relative difference <= %.3g)", ws, (double)b->losses[ws],
                 (double)loss_rtol);
        snprintf(got, sizeof got, "step %d loss %.9g (relative difference %.3g)", ws, (double)a->losses[ws],
                 (double)wrel);
    }
    if (param_bad) {
        snprintf(want + strlen(want), sizeof want - strlen(want), "%sweight %zu = %.9g (absolute difference <= %.3g)",
                 loss_bad ? "; " : "", wi, (double)b->params[wi], (double)param_atol);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%sweight %zu = %.9g (absolute difference %.3g)",
                 loss_bad ? "; " : "", wi, (double)a->params[wi], (double)wabs);
    }
    return expect_msg(want, got, "%s", what2);
}

int harness_results_match(const char *what, const RunResults *a, const RunResults *b, float loss_rtol,
                          float param_atol) {
    char *why = harness_results_mismatch(what, a, b, loss_rtol, param_atol);
    if (why) fprintf(stderr, "%s\n", why);
    free(why);
    return why == NULL;
}

int harness_contains(const char *haystack, const char *needle) {
    return haystack != NULL && needle != NULL && strstr(haystack, needle) != NULL;
}

// ---- catching lab_fail in-process (harness_expect_fail) ----------------------------------------
static jmp_buf fail_env;
static void fail_hook(int code) {
    (void)code;
    longjmp(fail_env, 1);
}

const char *harness_expect_fail(void (*fn)(void *), void *arg) {
    static char msg[4096];
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    volatile int failed = 0;
    lab_abort_hook = fail_hook;
    if (setjmp(fail_env) == 0) fn(arg);
    else failed = 1;
    lab_abort_hook = NULL;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(msg, 1, sizeof(msg) - 1, tmp);
    msg[n] = '\0';
    fclose(tmp);
    if (failed) fprintf(stderr, "(expected failure) %s", msg);
    return failed ? msg : NULL;
}

// ---- reliability checks shared by the training chapters ----------------------------------------

static void harness_tmp(char *buf, size_t len, const char *tag) {
    snprintf(buf, len, "/tmp/lab_harness_%d_%s", (int)getpid(), tag);
}

int harness_resume_is_exact(const char *prog, int np, const char *flags, int stop_at) {
    char ck[256], cmd[1024], more[1024], *out = NULL;
    harness_tmp(ck, sizeof ck, "resume.ckpt");
    RunResults whole, second;
    int ok = 1;
    if (harness_run_dump(prog, np, flags, &whole, &out, 180) != 0) {
        fprintf(stderr, "resume: the uninterrupted run failed:\n%s\n", out ? out : "");
        free(out);
        return 0;
    }
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "%s %s --stop-at %d --save %s", prog, flags, stop_at, ck);
    int rc = harness_mpirun(np, cmd, &out, 180);
    snprintf(more, sizeof more, "%s --resume %s", flags, ck);
    if (rc != 0 || harness_run_dump(prog, np, more, &second, &out, 180) != 0) {
        fprintf(stderr, "resume: the interrupted or the resumed run failed:\n%s\n", out ? out : "");
        results_free(&whole);
        free(out);
        unlink(ck);
        return 0;
    }
    for (int s = stop_at; s < whole.nsteps && s < second.nsteps; s++)
        if (memcmp(&whole.losses[s], &second.losses[s], sizeof(float)) != 0) {
            fprintf(stderr, "resume: step %d: loss %.9g, resumed %.9g\n", s, whole.losses[s],
                    second.losses[s]);
            ok = 0;
        }
    if (whole.nsteps != second.nsteps || whole.nparams != second.nparams ||
        memcmp(whole.params, second.params, whole.nparams * sizeof(float)) != 0) {
        fprintf(stderr, "resume: the final weights differ after resuming at step %d\n", stop_at);
        ok = 0;
    }
    results_free(&whole);
    results_free(&second);
    free(out);
    unlink(ck);
    return ok;
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

// The run failed at step 5 or 6 saving every 2 steps: the file on disk must hold step 4's state,
// whole (the last save before the failure, not torn by it).
static int ckpt_on_disk_is_step_4(const char *ck, const GPT2Config *cfg, const char *what) {
    size_t n = gpt2_param_count(cfg);
    TrainState st = {.params = malloc(n * 4), .m = malloc(n * 4), .v = malloc(n * 4)};
    ckpt_load_state(ck, cfg, &st);
    int ok = st.step == 4;
    if (!ok) fprintf(stderr, "%s: the checkpoint on disk is after step %d, not 4\n", what, st.step);
    free(st.params), free(st.m), free(st.v);
    return ok;
}

int harness_nan_fails_cleanly(const char *prog, int np, const char *flags, const GPT2Config *cfg) {
    char ck[256], cmd[1024], *out = NULL;
    harness_tmp(ck, sizeof ck, "nan.ckpt");
    snprintf(cmd, sizeof cmd, "%s %s --save %s --save-every 2 --inject-nan-step 5", prog, flags, ck);
    int rc = harness_mpirun(np, cmd, &out, 60), ok = 1;
    if (rc == 0 || rc == 124) {
        fprintf(stderr, "nan: the run %s:\n%s\n", rc == 0 ? "succeeded" : "hung", out ? out : "");
        ok = 0;
    } else if (!harness_contains(out, "NaN") || !harness_contains(out, "step 5")) {
        fprintf(stderr, "nan: the message does not name NaN and step 5:\n%s\n", out ? out : "");
        ok = 0;
    } else if (count_of(out, "error:") != 1) {  // every rank sees the averaged NaN: say it once
        fprintf(stderr, "nan: the error is printed %d times, not once:\n%s\n", count_of(out, "error:"),
                out ? out : "");
        ok = 0;
    } else {
        ok = ckpt_on_disk_is_step_4(ck, cfg, "nan");
    }
    free(out);
    unlink(ck);
    return ok;
}

// ---- watching a run line by line (kill, signal during a save) ------------------------------------

int harness_kill_ends_promptly(const char *prog, int np, const char *flags) {
    char cmd[1024], *out = NULL;
    // many steps: if the job outlived its killed rank, it would run into the timeout
    snprintf(cmd, sizeof cmd, "%s %s --steps 1000 --kill-rank %d --kill-step 2", prog, flags, np - 1);
    char *mp = mpirun_cmd(np, NULL, cmd);
    double t_kill, t_end;
    int rc = run_watch(mp, 120, "--kill-rank", 0, &out, &t_kill, &t_end), ok = 1;
    free(mp);
    double since = t_kill >= 0 ? t_end - t_kill : t_end;
    if (rc == 0 || rc == 124) {
        fprintf(stderr, "kill: the job %s after rank %d died:\n%s\n", rc == 0 ? "succeeded" : "hung",
                np - 1, out);
        ok = 0;
    } else if (since > HARNESS_PROMPT_S) {
        fprintf(stderr, "kill: the job took %.1f s to end after rank %d died (%s; limit %.0f s):\n%s\n",
                since, np - 1, t_kill >= 0 ? "from its message" : "from the launch: no message seen",
                HARNESS_PROMPT_S, out);
        ok = 0;
    }
    free(out);
    return ok;
}

int harness_oom_fails_cleanly(const char *prog, int np, const char *flags, const GPT2Config *cfg) {
    char ck[256], cmd[1024], *out = NULL;
    harness_tmp(ck, sizeof ck, "oom.ckpt");
    unlink(ck);
    // many steps: if a rank outlived the failed one, the job would run into the timeout. Step
    // 6: the state after 4 steps is written by then (step 5's collectives waited for rank 0 to
    // finish its save; failing at step 5, the last rank could abort that write, and the file
    // would rightly still hold step 2's state)
    snprintf(cmd, sizeof cmd, "%s %s --steps 1000 --save %s --save-every 2 --inject-oom-step %d:6",
             prog, flags, ck, np - 1);
    char *mp = mpirun_cmd(np, NULL, cmd);
    double t_msg, t_end;
    int rc = run_watch(mp, 120, "out of host memory", 0, &out, &t_msg, &t_end), ok = 1;
    free(mp);
    char who[32];
    snprintf(who, sizeof who, "[rank %d] error:", np - 1);
    if (rc == 0 || rc == 124) {
        fprintf(stderr, "oom: the job %s:\n%s\n", rc == 0 ? "succeeded" : "hung", out);
        ok = 0;
    } else if (t_msg < 0 || !harness_contains(out, "--inject-oom-step") ||
               (np > 1 && !harness_contains(out, who))) {
        fprintf(stderr, "oom: no out-of-memory message from rank %d naming --inject-oom-step:\n%s\n",
                np - 1, out);
        ok = 0;
    } else if (count_of(out, "error:") != 1) {  // the failing rank says it, once
        fprintf(stderr, "oom: the error is printed %d times, not once:\n%s\n", count_of(out, "error:"),
                out);
        ok = 0;
    } else if (t_end - t_msg > HARNESS_PROMPT_S) {
        fprintf(stderr, "oom: the job took %.1f s to end after the message (limit %.0f s):\n%s\n",
                t_end - t_msg, HARNESS_PROMPT_S, out);
        ok = 0;
    } else {
        ok = ckpt_on_disk_is_step_4(ck, cfg, "oom");
    }
    free(out);
    unlink(ck);
    return ok;
}

// What a test thread reads back from a TrainState file (failures caught, not fatal).
static const char *g_load_path;
static const GPT2Config *g_load_cfg;
static TrainState *g_load_state;
static void load_state_fn(void *arg) {
    (void)arg;
    ckpt_load_state(g_load_path, g_load_cfg, g_load_state);
}

unsigned char *harness_slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *b = lab_xmalloc((size_t)(size > 0 ? size : 0) + 1);
    *n = fread(b, 1, (size_t)(size > 0 ? size : 0), f);
    b[*n] = 0;  // (a text file reads as a C string)
    fclose(f);
    return b;
}

int harness_save_signal_is_safe(const char *prog, int np, const char *flags, const GPT2Config *cfg,
                                int sig) {
    char ck[256], tmp[300], cmd[1024], *out = NULL;
    harness_tmp(ck, sizeof ck, "sig.ckpt");
    snprintf(tmp, sizeof tmp, "%s.tmp", ck);
    unlink(ck);
    unlink(tmp);
    int ok = 1;
    // 1. the checkpoint to keep: the state after 2 steps
    snprintf(cmd, sizeof cmd, "%s %s --steps 2 --save %s", prog, flags, ck);
    if (harness_mpirun(np, cmd, &out, 120) != 0) {
        fprintf(stderr, "save-signal: the first run failed:\n%s\n", out ? out : "");
        free(out);
        return 0;
    }
    free(out);
    size_t n0;
    unsigned char *before = harness_slurp(ck, &n0);
    // 2. a run whose first save stalls, its tmp written, until the signal comes
    snprintf(cmd, sizeof cmd, "%s %s --steps 4 --save %s --save-every 1", prog, flags, ck);
    char *mp = mpirun_cmd(np, "LAB_SAVE_STALL_S=60", cmd);
    double t_sig, t_end;
    int rc = run_watch(mp, 120, "LAB_SAVE_STALL_S: stalling", sig, &out, &t_sig, &t_end);
    free(mp);
    size_t n1;
    unsigned char *after = harness_slurp(ck, &n1);
    if (t_sig < 0) {
        fprintf(stderr, "save-signal: the run never stalled in a save (LAB_SAVE_STALL_S):\n%s\n", out);
        ok = 0;
    } else if (rc == 0 || rc == 124 || t_end - t_sig > HARNESS_PROMPT_S) {
        fprintf(stderr, "save-signal: after signal %d in the save the job %s (%.1f s):\n%s\n", sig,
                rc == 0 ? "succeeded" : rc == 124 ? "hung" : "took too long", t_end - t_sig, out);
        ok = 0;
    } else if (!before || !after || n0 != n1 || memcmp(before, after, n0) != 0) {
        fprintf(stderr, "save-signal: %s changed under signal %d in a save (%zu -> %zu bytes)\n", ck,
                sig, n0, n1);
        ok = 0;
    } else {
        size_t n = gpt2_param_count(cfg);
        TrainState st = {.params = lab_xmalloc(n * 4), .m = lab_xmalloc(n * 4), .v = lab_xmalloc(n * 4)};
        g_load_path = ck, g_load_cfg = cfg, g_load_state = &st;
        const char *why = harness_expect_fail(load_state_fn, NULL);
        if (why || st.step != 2) {
            fprintf(stderr, "save-signal: the kept %s %s\n", ck, why ? why : "is not the state after step 2");
            ok = 0;
        }
        free(st.params), free(st.m), free(st.v);
    }
    free(out);
    out = NULL;
    free(before);
    free(after);
    // 3. the next save replaces the tmp the signal left behind
    if (ok) {
        // the kept state ended a 2-step run: one step more is a longer schedule, allowed
        snprintf(cmd, sizeof cmd, "%s %s --steps 3 --allow-changed steps --resume %s --save %s",
                 prog, flags, ck, ck);
        rc = harness_mpirun(np, cmd, &out, 120);
        if (rc != 0 || access(tmp, F_OK) == 0) {
            fprintf(stderr, "save-signal: resuming from the kept checkpoint %s:\n%s\n",
                    rc != 0 ? "failed" : "left the stale tmp behind", out ? out : "");
            ok = 0;
        }
        free(out);
    }
    unlink(ck);
    unlink(tmp);
    return ok;
}

int harness_reliability_holds(const char *prog, int np, const char *flags, const GPT2Config *cfg) {
    int ok = 1;
    if (np > 1 && !harness_kill_ends_promptly(prog, np, flags)) ok = 0;
    if (!harness_save_signal_is_safe(prog, np, flags, cfg, SIGTERM)) ok = 0;
    if (!harness_save_signal_is_safe(prog, np, flags, cfg, SIGKILL)) ok = 0;
    char nan_flags[1024];
    snprintf(nan_flags, sizeof nan_flags, "%s --steps 10", flags);
    if (!harness_nan_fails_cleanly(prog, np, nan_flags, cfg)) ok = 0;
    if (!harness_oom_fails_cleanly(prog, np, flags, cfg)) ok = 0;
    return ok;
}

// (not inlined: gcc's -Wdangling-pointer then mistakes the output for harness_run's local)
static __attribute__((noinline)) int mpirun_output(int np, const char *cmd, char **out, int timeout_s) {
    return harness_mpirun(np, cmd, out, timeout_s);
}

int harness_mpi_program_passes(const char *prog, const char *what, int max_np, int timeout_s, char **why) {
    char head[160];
    snprintf(head, sizeof head, "%s: ", prog);
    for (int np = 1; np <= max_np; np++) {
        char cmd[512];
        char *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tests/%s %s", harness_build_dir(), prog, what);
        int rc = mpirun_output(np, cmd, &out, timeout_s);
        int checks = -1, failed = -1, ranks = -1;
        const char *line = out ? strstr(out, head) : NULL;
        if (line && (line = strstr(line, " on ")) != NULL)
            sscanf(line, " on %d ranks: %d checks, %d failed", &ranks, &checks, &failed);
        int ok = rc == 0 && ranks == np && checks > 0 && failed == 0;
        if (!ok) *why = expect_mpi_msg(prog, what, np, rc, ranks, checks, failed, out, 0);
        free(out);
        if (!ok) return 0;
    }
    return 1;
}

int harness_diffs(const char *tag, const char *what, const RunResults *a, const RunResults *b,
                  float *dl, float *dp) {
    *dl = *dp = INFINITY;
    if (a->nsteps != b->nsteps || a->nparams != b->nparams) {
        fprintf(stderr, "%s: %s: %d steps and %zu weights vs %d and %zu\n", tag, what, a->nsteps,
                a->nparams, b->nsteps, b->nparams);
        return 0;
    }
    *dl = harness_max_rel_diff(a->losses, b->losses, (size_t)a->nsteps);
    *dp = harness_max_abs_diff(a->params, b->params, a->nparams);
    fprintf(stderr, "%s: %-62s losses within %.2g (rel), weights within %.2g (abs)\n", tag, what,
            (double)*dl, (double)*dp);
    return 1;
}

int harness_refuses(int np, const char *cmd, const char *const *words, int nwords) {
    char *out = NULL;
    int rc = mpirun_output(np, cmd, &out, 60);
    char why[256] = "";
    if (rc == 0) snprintf(why, sizeof why, "it was accepted");
    else if (rc == 124) snprintf(why, sizeof why, "the job hung (killed after 60 s)");
    for (int i = 0; !why[0] && i < nwords; i++)
        if (!harness_contains(out, words[i]))
            snprintf(why, sizeof why, "the message does not say \"%s\"", words[i]);
    if (!why[0] && nwords > 0) {
        const char *first = strstr(out, words[0]);
        if (strstr(first + 1, words[0])) snprintf(why, sizeof why, "the message is printed more than once");
    }
    if (why[0]) fprintf(stderr, "-np %d %s: exit %d, %s:\n%s\n", np, cmd, rc, why, out ? out : "(no output)");
    free(out);
    return why[0] == 0;
}

int harness_read_lines(const char *path, char **lines, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    char buf[4096];
    while (n < max && fgets(buf, sizeof buf, f)) lines[n++] = strdup(buf);
    fclose(f);
    return n;
}
