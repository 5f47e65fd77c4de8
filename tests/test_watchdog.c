// test_watchdog.c: hangs end with one diagnosis (common/watchdog.h, --collective-timeout).
//
// What each proves, with S = 2 s (the hang tests' --collective-timeout):
//   - a hang with a known history (tests/mpi_watchdog.c) is named exactly: the group and its
//     ranks, the op and its sequence number, which ranks reached it, what the others did last
//     (collectives, a send/recv deadlock, collectives called in different orders, a rank that
//     left early, the communication thread);
//   - a chapter with a pipeline (08, pp 2) and --inject-hang, and a chapter with DP (03, its
//     communication thread) with a rank SIGSTOPped from outside, end within S + 10 s with that
//     diagnosis, once (one "error:" for the job);
//   - with --collective-timeout 0 the same 08 hang is still running at S + 10 s (then the test
//     kills it): the watchdog is what ends it;
//   - a rank that is only slow (1 s, S = 3) does not trip it;
//   - a malformed --inject-hang, and --collective-timeout on one device (00), are refused with
//     one message.
// The deadlines are the hang's bound (S + 10 s), not a speed check: a healthy run is far inside.
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define S 2  // --collective-timeout of the hang tests, seconds

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

// The diagnosis' first line (malloc'd), or NULL.
static char *summary_line(const char *out) {
    const char *p = out ? strstr(out, "error: collective timeout") : NULL;
    if (!p) return NULL;
    size_t n = strcspn(p, "\n");
    char *line = lab_xmalloc(n + 1);
    memcpy(line, p, n);
    line[n] = '\0';
    return line;
}

// The run failed (not by the test's deadline) with exactly one error, the watchdog's; returns
// its first line.
static char *one_diagnosis(int rc, const char *what, const char *out) {
    cr_assert(rc != 0, "%s: the run succeeded; expected the watchdog to end it:\n%s", what, out);
    cr_assert(rc != 124, "%s: still running after S + 10 = %d s: the watchdog did not end it:\n%s", what,
              S + 10, out);
    cr_assert_eq(count(out, "error:"), 1, "%s: expected one error (the watchdog's diagnosis), got %d:\n%s",
                 what, count(out, "error:"), out);
    char *line = summary_line(out);
    cr_assert(line, "%s: no \"error: collective timeout\" in the output:\n%s", what, out);
    return line;
}

static void expect_in(const char *line, const char *words, const char *out) {
    cr_assert(strstr(line, words), "the diagnosis does not say \"%s\":\n  %s\nwhole output:\n%s", words, line, out);
}

static char *run_case(const char *what, int np) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tests/mpi_watchdog %s %d", harness_build_dir(), what, S);
    int rc = harness_mpirun(np, cmd, &out, S + 10);
    free(one_diagnosis(rc, what, out));
    return out;
}

// Mutant: mutants/watchdog-seq-per-process.patch
Test(watchdog, collective_named_with_its_group_number, .timeout = 60) {
    char *out = run_case("coll", 3), *line = summary_line(out);
    // five all-reduces on the world, three barriers on "sub" in between: the world's sixth
    expect_in(line, "world group {0,1,2}: ranks 0,1 wait in all-reduce #6 (rank ", out);
    expect_in(line, "rank 2 has not reached it: it is outside communication", out);
    expect_in(line, "in step 5, last op: sub barrier #3)", out);
    free(line);
    free(out);
}

Test(watchdog, send_recv_deadlock_named, .timeout = 60) {
    char *out = run_case("p2p", 2), *line = summary_line(out);
    // three messages went through; the fourth is never sent, rank 0 waits in a barrier instead
    expect_in(line, "world group {0,1}: rank 1 waits in recv #4 from rank 0 for ", out);
    expect_in(line, "; rank 0 is in world barrier #1 (for ", out);
    free(line);
    free(out);
}

Test(watchdog, collectives_in_different_orders_named, .timeout = 60) {
    char *out = run_case("order", 2), *line = summary_line(out);
    expect_in(line, "world group {0,1}: rank 0 waits in barrier #3 for ", out);
    expect_in(line, "rank 1 has not reached it: it is in world broadcast #3 (for ", out);
    expect_in(line, "a different collective at the same place: the ranks called world's collectives in "
              "different orders", out);
    free(line);
    free(out);
}

Test(watchdog, rank_that_left_early_named, .timeout = 60) {
    char *out = run_case("early", 2), *line = summary_line(out);
    expect_in(line, "world group {0,1}: rank 0 waits in all-reduce #2 for ", out);
    expect_in(line, "rank 1 has not reached it: it has finished: it called dist_finalize", out);
    free(line);
    free(out);
}

Test(watchdog, communication_thread_named, .timeout = 60) {
    char *out = run_case("thread", 2), *line = summary_line(out);
    expect_in(line, "world group {0,1}: rank 0", out);
    expect_in(line, "waits in all-reduce #3", out);
    expect_in(line, "rank 1 has not reached it: it is outside communication", out);
    expect_in(line, "last op: world all-reduce #2)", out);
    free(line);
    free(out);
}

// 08 with two stages; rank 1 stops at the start of step 3. Each 08 step makes four collectives
// on the world (the clock's barrier, the tied wte's all-reduce, the loss's broadcast, which
// comes before the update so that --on-spike can judge the loss, then the norm's all-reduce;
// its sends and receives count apart): rank 0 waits in step 3's barrier, #9, and rank 1's last
// collective was step 2's norm all-reduce, #8.
#define PIPE_HANG "./08_pipeline/run --steps 50 --log-every 1 --inject-hang 1:3"

// Mutant: mutants/watchdog-never-fires.patch
Test(watchdog, pipeline_hang_ends_with_diagnosis, .timeout = 60) {
    char *out = NULL;
    int rc = harness_mpirun(2, PIPE_HANG " --collective-timeout 2", &out, S + 10);
    char *line = one_diagnosis(rc, "08 --inject-hang 1:3", out);
    expect_in(line, "world group {0,1}: rank 0 waits in barrier #9 for ", out);
    expect_in(line, "rank 1 has not reached it: it is outside communication for ", out);
    expect_in(line, "in step 3, last op: world all-reduce #8)", out);
    cr_assert(strstr(out, "--inject-hang: stopping without dying at the start of step 3"), "%s", out);
    free(line);
    free(out);
}

Test(watchdog, without_watchdog_the_hang_stays, .timeout = 60) {
    char *out = NULL;
    int rc = harness_mpirun(2, PIPE_HANG " --collective-timeout 0", &out, S + 10);
    // the rank stopped, and nothing else ended the job: the deadline killed it
    cr_assert(strstr(out, "--inject-hang: stopping without dying"), "the hang was not injected:\n%s", out);
    cr_assert_eq(rc, 124, "with --collective-timeout 0 the hang ended by itself (exit %d) before S + 10 = %d s:\n%s",
                 rc, S + 10, out);
    free(out);
}

Test(watchdog, slow_rank_does_not_trip_it, .timeout = 60) {
    char *out = NULL;
    // rank 1 sleeps 1 s at the start of step 3; S = 3 leaves it 2 s of room
    int rc = harness_mpirun(2, "./08_pipeline/run --steps 5 --log-every 1 --inject-hang 1:3:1 "
                            "--collective-timeout 3", &out, 60);
    cr_assert(strstr(out, "--inject-hang: sleeping 1.0 s at the start of step 3"), "no sleep injected:\n%s", out);
    cr_assert_eq(rc, 0, "a rank only 1 s slow ended the run (S = 3):\n%s", out);
    cr_assert(!strstr(out, "collective timeout"), "%s", out);
    free(out);
}

// Runs `cmd` (its output read as it comes). The line "[pid N] ..." names the process to stop;
// at the first line holding `trigger` it gets SIGSTOP. Returns the exit status (124: killed at
// timeout_s), the output, and the seconds from the SIGSTOP to the end (-1: never sent).
static int run_and_stop(const char *cmd, int timeout_s, const char *trigger, char **output, double *after) {
    char *full = lab_xmalloc(strlen(cmd) + 64);
    sprintf(full, "timeout -k 5 %d %s </dev/null 2>&1", timeout_s, cmd);
    fflush(stdout);
    fflush(stderr);
    FILE *p = popen(full, "r");
    free(full);
    cr_assert(p, "popen failed");
    size_t cap = 1 << 16, len = 0;
    char *buf = lab_xmalloc(cap), line[4096];
    buf[0] = '\0';
    int pid = -1;
    double t_stop = -1;
    while (fgets(line, sizeof line, p)) {
        size_t n = strlen(line);
        if (len + n + 1 > cap) {
            while (len + n + 1 > cap) cap *= 2;
            buf = realloc(buf, cap);
            cr_assert(buf);
        }
        memcpy(buf + len, line, n + 1);
        len += n;
        const char *at = strstr(line, "[pid ");
        if (at && pid < 0) pid = atoi(at + 5);
        if (t_stop < 0 && pid > 0 && strstr(line, trigger)) {
            kill((pid_t)pid, SIGSTOP);
            t_stop = lab_now();
        }
    }
    int status = pclose(p);
    *after = t_stop < 0 ? -1 : lab_now() - t_stop;
    // the stopped rank must be gone with its job; if not (a failure), do not leave it behind
    char path[64], cmdline[256] = "";
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = pid > 0 ? fopen(path, "r") : NULL;
    if (f) {
        size_t k = fread(cmdline, 1, sizeof cmdline - 1, f);
        cmdline[k] = '\0';
        fclose(f);
        if (strstr(cmdline, "/run")) kill((pid_t)pid, SIGKILL);
    }
    *output = buf;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    return rc;
}

// 03 (DDP, its communication thread all-reducing the buckets): rank 1 gets SIGSTOP from outside
// once step 3 is printed; the ranks agree on the world's collectives one by one, so rank 0 is
// blocked in the first all-reduce rank 1 has not reached, the one after rank 1's last.
Test(watchdog, ddp_sigstop_ends_with_diagnosis, .timeout = 90) {
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader "
             "--mca mpi_yield_when_idle 1 -x OPENBLAS_NUM_THREADS=1 -np 2 sh -c 'if [ "
             "\"$OMPI_COMM_WORLD_RANK\" = 1 ]; then echo \"[pid $$] rank 1\" >&2; fi; exec "
             "./03_ddp/run --steps 1000 --log-every 1 --collective-timeout %d'", S);
    double after = -1;
    int rc = run_and_stop(cmd, 60, "step     3/", &out, &after);
    cr_assert(after >= 0, "rank 1 was never stopped (no pid line or no step 3):\n%s", out);
    cr_assert(after <= S + 10, "the job ended %.1f s after the SIGSTOP (limit S + 10 = %d s):\n%s", after, S + 10,
              out);
    char *line = one_diagnosis(rc, "03 with rank 1 stopped", out);
    expect_in(line, "world group {0,1}: rank 0", out);
    expect_in(line, "stopped (SIGSTOP or a debugger)", out);
    // the op rank 0 is blocked in, and what rank 1 did last (outside communication) or is in
    unsigned long n = 0, m = 0;
    const char *w = strstr(line, "all-reduce #");
    cr_assert(w && sscanf(w, "all-reduce #%lu", &n) == 1, "no all-reduce named:\n  %s\n%s", line, out);
    const char *last = strstr(line, "last op: world all-reduce #");
    if (last) {
        cr_assert(sscanf(last, "last op: world all-reduce #%lu", &m) == 1);
        cr_assert_eq(m + 1, n, "rank 0 waits in all-reduce #%lu but rank 1's last was #%lu:\n  %s", n, m, line);
    } else {
        cr_assert(strstr(line, "rank 1 reached it but is stopped") || strstr(line, "it is stopped (SIGSTOP or a debugger) in world"),
                  "rank 1 is neither outside communication nor in an op:\n  %s\n%s", line, out);
    }
    free(line);
    free(out);
}

Test(watchdog, bad_flags_refused, .timeout = 120) {
    harness_assert_refused(2, "./08_pipeline/run --steps 5 --inject-hang 1", "--inject-hang 1", "RANK:STEP");
    harness_assert_refused(2, "./08_pipeline/run --steps 5 --inject-hang 2:3", "--inject-hang 2:3", "0 .. 1");
    harness_assert_refused(2, "./08_pipeline/run --steps 5 --inject-hang 1:6", "--inject-hang 1:6", "1 .. 5");
    harness_assert_refused(2, "./08_pipeline/run --steps 5 --inject-hang 1:2:-1", "--inject-hang 1:2:-1",
                           "SECONDS");
    harness_assert_refused(1, "./08_pipeline/run --steps 5 --inject-hang 0:2", "--inject-hang 0:2",
                           "hang forever");
    // one device: no rank ever waits for another, so the flag would do nothing
    harness_assert_refused(1, "./00_memory_budget/run --train --steps 2 --collective-timeout 3",
                           "--collective-timeout", "one rank");
}
