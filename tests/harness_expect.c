// harness_expect.c: the exercise tests' failure messages (harness_expect.h).
#include "harness_expect.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

// A malloc'd string from a printf format.
static char *vfmt(const char *fmt, va_list ap) {
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    char *s = lab_xmalloc((size_t)(n < 0 ? 0 : n) + 1);
    s[0] = '\0';
    if (n >= 0) vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

static char *fmt(const char *f, ...) LAB_PRINTF(1, 2);
static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = vfmt(f, ap);
    va_end(ap);
    return s;
}

// The exercise id of the running test's suite: ex08_1 -> "08.1"; 0 outside an ex* suite.
static int exercise_id(char id[16]) {
    const char *suite = criterion_current_test ? criterion_current_test->category : NULL;
    int ch = -1, n = -1, len = 0;
    if (!suite || sscanf(suite, "ex%2d_%d%n", &ch, &n, &len) != 2 || suite[len] != '\0') return 0;
    snprintf(id, 16, "%02d.%d", ch, n);
    return 1;
}

const char *expect_prefix(void) {
    static char buf[32];
    char id[16];
    if (!exercise_id(id)) return "";
    snprintf(buf, sizeof buf, "exercise %s: ", id);
    return buf;
}

const char *expect_read(void) {
    static char buf[512];
    char id[16];
    if (!exercise_id(id)) return "";
    // the marker's link: "// EXERCISE 08.1 The 1F1B table -> 08_pipeline/README.md#..."
    char cmd[256], line[512] = "";
    snprintf(cmd, sizeof cmd,
             "grep -rhF -m1 --include='*.c' -e '// EXERCISE %s ' common [0-9][0-9]_* 2>/dev/null", id);
    fflush(stdout);
    fflush(stderr);
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = '\0';
        while (fgetc(p) != EOF) {}
        pclose(p);
    }
    const char *link = strstr(line, " -> ");
    if (link) {
        link += 4;
        size_t n = strcspn(link, " \r\n");
        snprintf(buf, sizeof buf, "\n  read      %.*s", (int)n, link);
    } else {
        snprintf(buf, sizeof buf, "\n  read      the chapter README's section \"Exercise %s\"", id);
    }
    return buf;
}

static char *msg(const char *want, const char *got, const char *log, const char *what) {
    return fmt("%s%s\n  expected  %s\n  got       %s%s%s%s", expect_prefix(), what, want, got,
               expect_read(), log ? "\n  its output:\n" : "", log ? log : "");
}

char *expect_msg(const char *want, const char *got, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *what = vfmt(f, ap);
    va_end(ap);
    return msg(want, got, NULL, what);
}

char *expect_msg_log(const char *want, const char *got, const char *log, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *what = vfmt(f, ap);
    va_end(ap);
    return msg(want, got, log ? log : "(no output)", what);
}

char *expect_mpi_msg(const char *prog, const char *what, int np, int rc, int ranks, int checks,
                     int failed, const char *out, size_t tail) {
    char *want = fmt("exit 0, summary \"on %d ranks: C checks, 0 failed\" with C > 0", np);
    char *got = ranks < 0 ? fmt("exit %d, no summary line%s", rc, rc == 124 ? " (killed: it ran past its time)" : "")
                          : fmt("exit %d, summary \"on %d ranks: %d checks, %d failed\"", rc, ranks, checks, failed);
    size_t len = out ? strlen(out) : 0;
    const char *log = out ? out + (tail && len > tail ? len - tail : 0) : NULL;
    if (log && log != out) {  // from the first whole line
        const char *nl = strchr(log, '\n');
        if (nl) log = nl + 1;
    }
    char *what_ = fmt("mpirun -np %d %s %s: its checks (the FAIL lines below say which value came out "
                      "and which was expected)", np, prog, what);
    return msg(want, got, log ? log : "(no output)", what_);
}

char *expect_fmt_ll(long long x) { return fmt("%lld", x); }
char *expect_fmt_ull(unsigned long long x) { return fmt("%llu", x); }
char *expect_fmt_s(const char *x) { return fmt("%s", x ? x : "(null)"); }

char *expect_fmt_d(double x) {
    if (x == floor(x) && fabs(x) < 1e17) return fmt("%.0f", x);  // a count of bytes, of steps: whole
    char buf[64];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    return fmt("%s", buf);
}

char *expect_fmt_f(float x) {
    char buf[64];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return fmt("%s", buf);
}

char *expect_within_(double want, double tol) {
    char *w = expect_fmt_d(want);
    char *s = fmt("%s (within %g)", w, tol);
    free(w);
    return s;
}

char *expect_within_rel_(double want, double rtol) {
    char *w = expect_fmt_d(want);
    char *s = fmt("%s (within %g %%)", w, 100 * rtol);
    free(w);
    return s;
}
