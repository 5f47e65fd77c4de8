// harness_progress.c: a run's printed progress lines and per-rank table against its --dump
// (harness_progress.h).
#include "harness_progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The next line of *p into buf (without the newline); 0 at the end.
static int next_line(const char **p, char *buf, size_t len) {
    if (!*p || !**p) return 0;
    const char *e = strchr(*p, '\n');
    size_t n = e ? (size_t)(e - *p) : strlen(*p);
    size_t k = n < len - 1 ? n : len - 1;
    memcpy(buf, *p, k);
    buf[k] = '\0';
    *p = e ? e + 1 : *p + n;
    return 1;
}

int harness_progress_matches(const char *output, const RunResults *r, int start, int end,
                             int steps, int log_every) {
    char line[512];
    const char *p = output;
    int want = log_every > 0 ? start : end;  // the next step that must print a line (0: none)
    while (want < end && !(want % log_every == 0 || want == end - 1)) want++;
    int ok = 1, throughput = 0;
    while (ok && next_line(&p, line, sizeof line)) {
        int i, n, nrun;
        char loss[32], zl[32], gnorm[32], zg[32], mfu[32];
        double lr, tok, eta;
        if (sscanf(line, "%d steps in", &nrun) == 1 && strstr(line, " steps in ")) {
            throughput = 1;
            if (nrun != end - start) {
                fprintf(stderr, "progress: \"%s\" after %d steps\n", line, end - start);
                ok = 0;
            }
            continue;
        }
        if (strncmp(line, "step ", 5) != 0) continue;
        if (sscanf(line, "step %d/%d  loss %31s z %31s  gnorm %31s z %31s  lr %lf  %lf tok/s  MFU "
                   "%31s  ETA %lf s", &i, &n, loss, zl, gnorm, zg, &lr, &tok, mfu, &eta) != 10) {
            fprintf(stderr, "progress: unreadable line \"%s\"\n", line);
            ok = 0;
            break;
        }
        if (want >= end || i != want + 1 || n != steps) {
            fprintf(stderr, "progress: \"%s\" where step %d/%d was due\n", line, want + 1, steps);
            ok = 0;
            break;
        }
        char expect[32];
        snprintf(expect, sizeof expect, "%.4f", (double)r->losses[want]);
        if (want >= r->nsteps || strcmp(loss, expect) != 0) {
            fprintf(stderr, "progress: \"%s\" prints loss %s, the run's loss of step %d is %s\n",
                    line, loss, want + 1, expect);
            ok = 0;
        }
        if (!(lr > 0) || !(tok > 0) || !isfinite(tok) || !(eta >= 0) ||
            (want == steps - 1 && eta != 0.0)) {
            fprintf(stderr, "progress: \"%s\": lr, tok/s or ETA out of range\n", line);
            ok = 0;
        }
        // the health columns: a grad norm (rank 0 has it in 00/02/03), an MFU in (0, 100] %,
        // the z-scores "-" for the first HEALTH_Z_MIN steps of the run, then numbers
        double g = atof(gnorm), m = atof(mfu);
        int zdue = want - start >= 5;
        if (!(g > 0) || !isfinite(g) || !(m > 0 && m <= 100) || mfu[strlen(mfu) - 1] != '%' ||
            (strcmp(zl, "-") == 0) == zdue || (strcmp(zg, "-") == 0) == zdue) {
            fprintf(stderr, "progress: \"%s\": grad norm, z-scores or MFU out of range\n", line);
            ok = 0;
        }
        for (want++; want < end && !(want % log_every == 0 || want == end - 1);) want++;
    }
    if (ok && want < end) {
        fprintf(stderr, "progress: no line for step %d/%d\n", want + 1, steps);
        ok = 0;
    }
    if (ok && end > start && !throughput) {
        fprintf(stderr, "progress: no \"N steps in\" line\n");
        ok = 0;
    }
    if (!ok) fprintf(stderr, "---- the output:\n%s\n----\n", output ? output : "(none)");
    return ok;
}

int harness_table_cell(const char *output, const char *title, int rank, int col, char *buf,
                       size_t len) {
    const char *t = output ? strstr(output, title) : NULL;
    if (!t) return 0;
    char line[1024];
    const char *p = strchr(t, '\n');
    if (!p) return 0;
    p++;
    if (!next_line(&p, line, sizeof line)) return 0;  // the column titles
    for (int r = 0; r <= rank; r++)
        if (!next_line(&p, line, sizeof line)) return 0;
    // "  %-10s" then " %11s" per column (session_print_rank_table)
    size_t at = 2 + 10 + (size_t)col * 12 + 1;
    if (strlen(line) < at + 11) return 0;
    const char *c = line + at;
    while (*c == ' ') c++;
    size_t n = (size_t)(line + at + 11 - c);
    if (n >= len) n = len - 1;
    memcpy(buf, c, n);
    buf[n] = '\0';
    return 1;
}

int harness_table_cell_at(const char *out, const char *title, int row, size_t at, size_t width,
                          char *buf) {
    const char *p = out ? strstr(out, title) : NULL;
    for (int skip = 0; p && skip < row + 2; skip++) p = (p = strchr(p, '\n')) ? p + 1 : NULL;
    const char *e = p ? strchr(p, '\n') : NULL;
    if (!p || !e || (size_t)(e - p) < at + width || width >= 64) return 0;
    const char *c = p + at, *end = p + at + width;
    while (c < end && *c == ' ') c++;
    while (end > c && end[-1] == ' ') end--;
    memcpy(buf, c, (size_t)(end - c));
    buf[end - c] = '\0';
    return 1;
}
