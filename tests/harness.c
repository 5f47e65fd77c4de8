// harness.c: launching programs from Criterion tests and comparing their results (harness.h).
#include "harness.h"
#include <setjmp.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"

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

int harness_run(const char *cmd, char **output, int timeout_s) {
    char *quoted = shell_quote(cmd);
    // timeout signals its whole process group, so mpirun and every rank go too.
    char *full = str_printf("timeout -k 5 %d sh -c %s </dev/null 2>&1", timeout_s, quoted);
    free(quoted);
    fflush(stdout);
    fflush(stderr);
    double t0 = lab_now();
    FILE *p = popen(full, "r");
    if (!p) {
        fprintf(stderr, "harness_run: popen failed for: %s\n", full);
        free(full);
        if (output) *output = str_printf("(popen failed)");
        return -1;
    }
    size_t cap = 4096, len = 0;
    char *buf = lab_xmalloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) lab_fail("harness_run: out of memory capturing output of %s", cmd);
            buf = grown;
        }
    }
    buf[len] = '\0';
    int status = pclose(p);
    double elapsed = lab_now() - t0;
    free(full);
    int rc;
    if (WIFEXITED(status)) rc = WEXITSTATUS(status);
    else rc = 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    // timeout exits 124 (or 137 when it had to KILL); either way the command ran out of time
    if ((rc == 124 || rc == 137) && elapsed >= timeout_s) rc = 124;
    if (output) *output = buf;
    else free(buf);
    return rc;
}

int harness_mpirun(int np, const char *prog_and_args, char **output, int timeout_s) {
    char *cmd = str_printf("mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader "
                           "--mca mpi_yield_when_idle 1 -x OPENBLAS_NUM_THREADS=1 -np %d %s",
                           np, prog_and_args);
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

int harness_results_match(const char *what, const RunResults *a, const RunResults *b, float loss_rtol,
                          float param_atol) {
    if (a->nsteps != b->nsteps || a->nparams != b->nparams) {
        fprintf(stderr, "%s: shapes differ: %d vs %d steps, %zu vs %zu parameters\n", what, a->nsteps, b->nsteps,
                a->nparams, b->nparams);
        return 0;
    }
    int ok = 1;
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
    if (ws >= 0 && !(wrel <= loss_rtol)) {
        fprintf(stderr, "%s: loss differs at step %d: %.9g vs %.9g (relative %.3g > tolerance %.3g)\n", what, ws,
                (double)a->losses[ws], (double)b->losses[ws], (double)wrel, (double)loss_rtol);
        ok = 0;
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
    if (a->nparams > 0 && !(wabs <= param_atol)) {
        fprintf(stderr, "%s: parameter %zu differs: %.9g vs %.9g (absolute %.3g > tolerance %.3g)\n", what, wi,
                (double)a->params[wi], (double)b->params[wi], (double)wabs, (double)param_atol);
        ok = 0;
    }
    return ok;
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
    } else {
        size_t n = gpt2_param_count(cfg);
        TrainState st = {.params = malloc(n * 4), .m = malloc(n * 4), .v = malloc(n * 4)};
        ckpt_load_state(ck, cfg, &st);
        if (st.step != 4) {
            fprintf(stderr, "nan: the checkpoint on disk is after step %d, not 4\n", st.step);
            ok = 0;
        }
        free(st.params), free(st.m), free(st.v);
    }
    free(out);
    unlink(ck);
    return ok;
}
