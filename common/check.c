// check.c: one clear message, then the whole job ends (see check.h).
#include "check.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int lab_log_rank = 0;
int lab_log_world = 1;
void (*lab_abort_hook)(int code) = NULL;

// How long a rank other than 0 waits in lab_fail_collective for rank 0's abort to end it.
#define COLLECTIVE_WAIT_S 3

// Ends the job: MPI_Abort through the hook when MPI is up (so no rank is left waiting in a
// collective), a plain exit otherwise.
static LAB_NORETURN void lab_end(int code) {
    fflush(stdout);
    fflush(stderr);
    if (lab_abort_hook) lab_abort_hook(code);
    exit(code);  // the hook should not return; if it does, still end this process
}

static void print_prefixed(const char *what, const char *fmt, va_list ap) {
    // Build the whole line first so that lines from different ranks do not interleave.
    char msg[2048];
    int n = 0;
    if (lab_log_world > 1) n = snprintf(msg, sizeof msg, "[rank %d] ", lab_log_rank);
    n += snprintf(msg + n, sizeof msg - (size_t)n, "%s", what);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

void lab_fail(const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    print_prefixed("error: ", fmt, ap);
    va_end(ap);
    lab_end(1);
}

void lab_fail_collective(const char *fmt, ...) {
    fflush(stdout);
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lab_log_rank == 0) {
        // Every rank found the same error: one message, without a rank prefix.
        fprintf(stderr, "error: %s\n", msg);
        fflush(stderr);
    } else if (!lab_abort_hook) {
        // Before MPI is up (flag parsing): every rank parsed the same argv, so rank 0 has
        // the same error; give it time to print before this rank's exit ends the job.
        sleep(1);
    } else {
        // Rank 0 prints and aborts the whole job, which ends this rank during the wait. If
        // this rank is still alive after it, rank 0 did not meet the error (only some ranks
        // did): print it here, with the rank, so that it is never lost.
        sleep(COLLECTIVE_WAIT_S);
        fprintf(stderr, "[rank %d] error: %s\n", lab_log_rank, msg);
        fflush(stderr);
    }
    lab_end(1);
}

void lab_fail_at(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    char what[512];
    snprintf(what, sizeof what, "internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    print_prefixed(what, fmt, ap);
    va_end(ap);
    lab_end(1);
}

void lab_exercise_todo(const char *id, const char *title, const char *readme) {
    fflush(stdout);
    if (lab_log_rank == 0) {
        char l1[256], l2[512], l3[256];
        snprintf(l1, sizeof l1, "exercise %s (%s) is not implemented yet", id, title);
        snprintf(l2, sizeof l2, "read %s", readme);
        snprintf(l3, sizeof l3, "and implement the region marked EXERCISE %s", id);
        size_t w = strlen(l1);
        if (strlen(l2) > w) w = strlen(l2);
        if (strlen(l3) > w) w = strlen(l3);
        char bar[600];
        size_t nb = w + 4 < sizeof bar - 1 ? w + 4 : sizeof bar - 1;
        memset(bar, '-', nb);
        bar[nb] = '\0';
        fprintf(stderr, "+%s+\n", bar);
        fprintf(stderr, "|  %-*s  |\n", (int)w, l1);
        fprintf(stderr, "|  %-*s  |\n", (int)w, l2);
        fprintf(stderr, "|  %-*s  |\n", (int)w, l3);
        fprintf(stderr, "+%s+\n", bar);
        fflush(stderr);
    } else {
        sleep(1);  // the same stub is hit on every rank: let rank 0's box be the one seen
    }
    lab_end(1);
}

void *lab_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) lab_fail("out of host memory: malloc of %zu bytes failed", bytes);
    return p;
}

void *lab_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) lab_fail("out of host memory: calloc of %zu x %zu bytes failed", n, size);
    return p;
}

double lab_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
