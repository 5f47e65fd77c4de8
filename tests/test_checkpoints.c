// test_checkpoints.c: checkpoints as the notes' 10.9 ask (common/ckpt.h, ckpt_shard.c):
// --async-save writes the same bytes as a synchronous save and a SIGKILL mid-write keeps the
// previous checkpoint; a --save-sharded checkpoint of one layout resumes under another exactly as
// the single file does; --keep-last K leaves K; a changed data file, a corrupted or a missing
// shard are refused with one message.
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "gpt2.h"
#include "harness.h"

#define CFG "--vocab 64 --seq 16 --layers 2 --channels 32 --heads 2 --batch 8"
#define RUN00 "./00_memory_budget/run --train"

static char *tmp_path(const char *tag) {
    static char buf[8][256];
    static int i = 0;
    char *p = buf[i++ % 8];
    snprintf(p, 256, "/tmp/lab_testckpt_%d_%s", (int)getpid(), tag);
    return p;
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    unsigned char *x = harness_slurp(a, &na), *y = harness_slurp(b, &nb);
    int same = x && y && na == nb && na > 0 && memcmp(x, y, na) == 0;
    if (!same) fprintf(stderr, "%s (%zu bytes) and %s (%zu bytes) differ\n", a, na, b, nb);
    free(x), free(y);
    return same;
}

// The same losses from step `from` on and the same final weights, bit for bit (the steps before
// a resume are NaN: not run there).
static void assert_same_run(const char *what, const RunResults *a, const RunResults *b, int from) {
    cr_assert(a->nsteps == b->nsteps && a->nparams == b->nparams && a->nparams > 0,
              "%s: %d steps / %zu params vs %d / %zu", what, a->nsteps, a->nparams, b->nsteps,
              b->nparams);
    for (int i = from; i < a->nsteps; i++)
        cr_assert(memcmp(&a->losses[i], &b->losses[i], 4) == 0, "%s: step %d loss %.9g vs %.9g",
                  what, i + 1, (double)a->losses[i], (double)b->losses[i]);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < a->nparams; i++)
        if (memcmp(&a->params[i], &b->params[i], 4) != 0 && bad++ == 0) first = i;
    cr_assert(bad == 0, "%s: %zu of %zu final weights differ (first: [%zu] %.9g vs %.9g)", what,
              bad, a->nparams, first, (double)a->params[first], (double)b->params[first]);
}

// The line of out that says "error" (a failed run's message), else all of out.
static const char *error_line(const char *out) {
    static char line[512];
    const char *e = out ? strstr(out, "error") : NULL;
    if (!e) return out ? out : "";
    const char *end = strchr(e, '\n');
    snprintf(line, sizeof line, "%.*s", (int)(end ? end - e : (long)strlen(e)), e);
    return line;
}

static void run_ok(int np, const char *cmd, char **out) {
    char *o = NULL;
    int rc = harness_mpirun(np, cmd, &o, 120);
    cr_assert_eq(rc, 0, "-np %d %s failed (rc %d):\n%s", np, cmd, rc, o ? o : "");
    if (out) *out = o;
    else free(o);
}

// The background write is the synchronous save's bytes: 00, and 09 on (tp 2, pp 2), each saving
// every 2 steps of 6 with and without --async-save; the run says the stall and the whole save.
// Mutant: mutants/ckpt-async-unjoined.patch
Test(checkpoints, async_file_equals_sync_file, .timeout = 120) {
    char *a = tmp_path("sync.ckpt"), *b = tmp_path("async.ckpt"), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, RUN00 " " CFG " --steps 6 --save-every 2 --save %s --quiet", a);
    run_ok(1, cmd, NULL);
    snprintf(cmd, sizeof cmd, RUN00 " " CFG " --steps 6 --save-every 2 --save %s --async-save "
             "--log-every 0", b);
    run_ok(1, cmd, &out);
    cr_assert(harness_contains(out, "checkpoints: 3 saves, training blocked") &&
              harness_contains(out, "in a background thread"), "no stall line:\n%s", out);
    free(out);
    cr_assert(same_file(a, b), "00: --async-save wrote other bytes than the synchronous save");
    snprintf(cmd, sizeof cmd, "./09_3d/run --tp 2 --pp 2 " CFG " --steps 6 --save-every 2 "
             "--save %s --quiet", a);
    run_ok(4, cmd, NULL);
    snprintf(cmd, sizeof cmd, "./09_3d/run --tp 2 --pp 2 " CFG " --steps 6 --save-every 2 "
             "--save %s --async-save --quiet", b);
    run_ok(4, cmd, NULL);
    cr_assert(same_file(a, b), "09: --async-save wrote other bytes than the synchronous save");
    unlink(a), unlink(b);
}

// A SIGKILL while the background thread is inside a save (LAB_SAVE_STALL_S: its tmp written, not
// yet renamed) leaves the previous checkpoint whole and loadable, and a resume from it works.
Test(checkpoints, async_sigkill_keeps_previous, .timeout = 120) {
    const GPT2Config cfg = {.V = 64, .T = 16, .L = 2, .NH = 2, .C = 32};
    cr_assert(harness_save_signal_is_safe(RUN00 " --quiet --async-save", 1, CFG, &cfg, SIGKILL),
              "a SIGKILL in an --async-save lost the previous checkpoint (details above)");
}

// Resharding: 09 on (tp 2, pp 2) stops at step 4 with a sharded checkpoint (4 shards) and with a
// single file; 05 --zero 1 on 2 ranks resumes each to step 6: the same losses and weights, bit
// for bit. Then 07 --tp 2 -> 00 the same way.
// Mutant: mutants/ckpt-shard-replicated-twice.patch
Test(checkpoints, sharded_resumes_in_another_layout_exactly, .timeout = 150) {
    char *dir = tmp_path("sh"), *file = tmp_path("whole.ckpt"), cmd[1024], *out = NULL;
    RunResults r1, r2;
    snprintf(cmd, sizeof cmd, "./09_3d/run --tp 2 --pp 2 " CFG " --steps 6 --stop-at 4 --save %s "
             "--save-sharded --quiet", dir);
    run_ok(4, cmd, NULL);
    snprintf(cmd, sizeof cmd, "./09_3d/run --tp 2 --pp 2 " CFG " --steps 6 --stop-at 4 --save %s "
             "--quiet", file);
    run_ok(4, cmd, NULL);
    char mf[300];
    snprintf(mf, sizeof mf, "%s/manifest", dir);
    size_t n = 0;
    char *text = (char *)harness_slurp(mf, &n);
    cr_assert(text && strstr(text, "shards 4\n") && strstr(text, "layout 4 ranks:") &&
              strstr(text, "--tp 2 --pp 2") && strstr(text, "data synthetic"),
              "the manifest does not say 4 shards, the layout and the data:\n%s", text ? text : "");
    free(text);
    snprintf(cmd, sizeof cmd, CFG " --steps 6 --resume %s", dir);
    cr_assert_eq(harness_run_dump("./05_zero/run --zero 1", 2, cmd, &r1, &out, 120), 0, "%s", out);
    cr_assert(harness_contains(out, "(4 shards, written on 4 ranks) in"), "no restore time:\n%s", out);
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, CFG " --steps 6 --resume %s", file);
    cr_assert_eq(harness_run_dump("./05_zero/run --zero 1", 2, cmd, &r2, &out, 120), 0, "%s", out);
    free(out);
    out = NULL;
    assert_same_run("09 (2,2) sharded -> 05 --zero 1, against the file", &r1, &r2, 4);
    results_free(&r1), results_free(&r2);
    // 07 --tp 2 -> 00
    snprintf(cmd, sizeof cmd, "./07_tensor_parallel/run --tp 2 " CFG " --steps 6 --stop-at 3 "
             "--save %s --save-sharded --quiet", dir);
    run_ok(2, cmd, NULL);
    snprintf(cmd, sizeof cmd, "./07_tensor_parallel/run --tp 2 " CFG " --steps 6 --stop-at 3 "
             "--save %s --quiet", file);
    run_ok(2, cmd, NULL);
    snprintf(cmd, sizeof cmd, CFG " --steps 6 --resume %s", dir);
    cr_assert_eq(harness_run_dump(RUN00, 1, cmd, &r1, &out, 120), 0, "%s", out);
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, CFG " --steps 6 --resume %s", file);
    cr_assert_eq(harness_run_dump(RUN00, 1, cmd, &r2, &out, 120), 0, "%s", out);
    free(out);
    assert_same_run("07 --tp 2 sharded -> 00, against the file", &r1, &r2, 3);
    results_free(&r1), results_free(&r2);
    // 09 on (dp, pp) = (2, 2) with --zero 1: each of the 4 ranks writes its ZeRO pieces -> 00
    snprintf(cmd, sizeof cmd, "./09_3d/run --dp 2 --pp 2 --zero 1 " CFG " --steps 6 --stop-at 3 "
             "--save %s --save-sharded --quiet", dir);
    run_ok(4, cmd, NULL);
    snprintf(cmd, sizeof cmd, "./09_3d/run --dp 2 --pp 2 --zero 1 " CFG " --steps 6 --stop-at 3 "
             "--save %s --quiet", file);
    run_ok(4, cmd, NULL);
    snprintf(mf, sizeof mf, "%s/manifest", dir);
    text = (char *)harness_slurp(mf, &n);
    cr_assert(text && strstr(text, "shards 4\n"), "--zero 1 on 4 ranks: not 4 shards:\n%s", text ? text : "");
    free(text);
    snprintf(cmd, sizeof cmd, CFG " --steps 6 --resume %s", dir);
    cr_assert_eq(harness_run_dump(RUN00, 1, cmd, &r1, &out, 120), 0, "%s", out);
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, CFG " --steps 6 --resume %s", file);
    cr_assert_eq(harness_run_dump(RUN00, 1, cmd, &r2, &out, 120), 0, "%s", out);
    free(out);
    assert_same_run("09 (dp 2, pp 2) --zero 1 sharded -> 00, against the file", &r1, &r2, 3);
    results_free(&r1), results_free(&r2);
    unlink(file);
}

// How many entries of the directory of `path` are "<base>.step-N" (a file or a directory)
static int count_steps(const char *path) {
    const char *slash = strrchr(path, '/'), *base = slash + 1;
    char dir[256];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    DIR *d = opendir(dir);
    struct dirent *e;
    int k = 0;
    size_t bl = strlen(base);
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, base, bl) && !strncmp(e->d_name + bl, ".step-", 6) &&
            !strchr(e->d_name + bl + 6, '.'))
            k++;
    if (d) closedir(d);
    return k;
}

// --keep-last 3 over 7 saves leaves exactly 3 files, <save> pointing at the newest; with
// --save-sharded and --keep-last 2 (05 on 2 ranks), exactly 2 directories.
// Mutant: mutants/ckpt-keep-last-one-more.patch
Test(checkpoints, keep_last_leaves_exactly_k, .timeout = 60) {
    char *p = tmp_path("rot.ckpt"), *q = tmp_path("rotsh"), cmd[1024], link[300];
    snprintf(cmd, sizeof cmd, RUN00 " " CFG " --steps 7 --save-every 1 --keep-last 3 --save %s "
             "--quiet", p);
    run_ok(1, cmd, NULL);
    cr_assert_eq(count_steps(p), 3, "--keep-last 3 left %d files", count_steps(p));
    ssize_t k = readlink(p, link, sizeof link - 1);
    cr_assert(k > 0, "%s is not a link", p);
    link[k] = '\0';
    cr_assert(strstr(link, ".step-7"), "%s points at %s, not the newest (step 7)", p, link);
    snprintf(cmd, sizeof cmd, "./05_zero/run --zero 2 " CFG " --steps 5 --save-every 1 "
             "--keep-last 2 --save-sharded --save %s --quiet", q);
    run_ok(2, cmd, NULL);
    cr_assert_eq(count_steps(q), 2, "sharded --keep-last 2 left %d directories", count_steps(q));
}

// A sharded checkpoint of one data file, resumed with another: refused, naming the data and
// --allow-changed. A corrupted shard and a missing shard: one message each, every rank out.
// Mutant: mutants/ckpt-shard-crc-unchecked.patch
Test(checkpoints, changed_data_and_bad_shards_refused, .timeout = 90) {
    char *d1 = tmp_path("data1"), *d2 = tmp_path("data2"), *dir = tmp_path("shd"), cmd[1024];
    FILE *f1 = fopen(d1, "wb"), *f2 = fopen(d2, "wb");
    for (int i = 0; i < 4000; i++) {
        fputc("the quick brown fox "[i % 20], f1);
        fputc("jumps over the dog  "[i % 20], f2);
    }
    fclose(f1), fclose(f2);
    const char *dcfg = "--vocab 256 --seq 16 --layers 2 --channels 32 --heads 2 --batch 8 --steps 6";
    snprintf(cmd, sizeof cmd, "./05_zero/run --zero 1 %s --data %s --stop-at 3 --save %s "
             "--save-sharded --quiet", dcfg, d1, dir);
    run_ok(2, cmd, NULL);
    snprintf(cmd, sizeof cmd, RUN00 " %s --data %s --resume %s --quiet", dcfg, d2, dir);
    harness_assert_refused(1, cmd, "--resume", "data", "--allow-changed");
    // one byte of shard 1 flipped: refused at the flags, on every rank, naming the shard
    char sh[300], cp[700];
    snprintf(sh, sizeof sh, "%s/shard-00001.bin", dir);
    snprintf(cp, sizeof cp, "cp -rL %s %s.bad && printf 'x' | dd of=%s.bad/shard-00001.bin bs=1 "
             "seek=300 conv=notrunc 2>/dev/null", dir, dir, dir);
    cr_assert_eq(system(cp), 0);
    snprintf(cmd, sizeof cmd, "./05_zero/run --zero 1 %s --data %s --resume %s.bad --quiet", dcfg,
             d1, dir);
    harness_assert_refused(2, cmd, "corrupted", "shard-00001.bin");
    snprintf(cp, sizeof cp, "rm -rf %s.bad && cp -rL %s %s.bad && rm %s.bad/shard-00000.bin", dir,
             dir, dir, dir);
    cr_assert_eq(system(cp), 0);
    harness_assert_refused(2, cmd, "missing", "shard-00000.bin");
    snprintf(cp, sizeof cp, "rm -rf %s.bad %s %s.step-*", dir, dir, dir);
    cr_assert_eq(system(cp), 0);
    unlink(d1), unlink(d2);
}

// --save-every-min: rank 0's clock decides, every rank follows. 09 on (2, 2) with a period of
// 60 us (shorter than any step of 4 ranks, so the clock calls for a save after every step
// whatever the machine's load; 6 ms was not always: a quiet machine ran 6 steps in less), sharded and async: each save is collective (every rank writes its shard, then the
// manifest), so a rank that decided alone would leave the others in another collective (the
// watchdog ends that within 10 s). The newest checkpoint holds step 6 in 4 shards, and 3 are kept.
// Mutant: mutants/ckpt-save-min-per-rank.patch
Test(checkpoints, save_every_min_is_one_decision, .timeout = 90) {
    char *dir = tmp_path("min"), cmd[1024], *out = NULL, mf[300];
    snprintf(cmd, sizeof cmd, "./09_3d/run --tp 2 --pp 2 " CFG " --steps 6 --save-every-min "
             "0.000001 --save-sharded --async-save --keep-last 3 --save %s --collective-timeout 10 "
             "--log-every 0", dir);
    run_ok(4, cmd, &out);
    int saves = 0;
    const char *line = strstr(out, "checkpoints: ");
    cr_assert(line && sscanf(line, "checkpoints: %d saves", &saves) == 1 && saves >= 2,
              "fewer than 2 saves in 6 steps of a 60 us period:\n%s", out);
    free(out);
    cr_assert_eq(count_steps(dir), saves < 3 ? saves : 3, "kept %d of %d saves", count_steps(dir), saves);
    snprintf(mf, sizeof mf, "%s/manifest", dir);
    size_t n = 0;
    char *text = (char *)harness_slurp(mf, &n);
    cr_assert(text && strstr(text, "step 6\n") && strstr(text, "shards 4\n"),
              "the newest checkpoint is not step 6 in 4 shards:\n%s", text ? text : "(none)");
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s.step-*", dir, dir);
    cr_assert_eq(system(cmd), 0);
}

// A rollback (--on-spike rollback) reads the last checkpoint back mid-run: with --save-sharded
// --async-save that checkpoint is complete only once every rank's write is joined and rank 0 has
// written its manifest (ckpt_settle before the load). 09 on 2 stages, a spike at step 12,
// checkpoints every 5: the same losses and weights as the run with one synchronous file.
// Mutant: mutants/ckpt-rollback-unsettled.patch
Test(checkpoints, rollback_reads_the_settled_checkpoint, .timeout = 90) {
    char *dir = tmp_path("rb"), *file = tmp_path("rb.ckpt"), cmd[1024], *out = NULL;
    const char *flags = CFG " --steps 16 --on-spike rollback --inject-spike-step 12 "
                        "--spike-window 5 --save-every 5";
    RunResults r1, r2;
    snprintf(cmd, sizeof cmd, "%s --save %s --save-sharded --async-save", flags, dir);
    cr_assert_eq(harness_run_dump("./09_3d/run --pp 2", 2, cmd, &r1, &out, 120), 0, "%s",
                 error_line(out));
    cr_assert(harness_contains(out, "rolled back to the checkpoint of step 10"), "no rollback:\n%s", out);
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "%s --save %s", flags, file);
    cr_assert_eq(harness_run_dump("./09_3d/run --pp 2", 2, cmd, &r2, &out, 120), 0, "%s", out);
    free(out);
    assert_same_run("rollback from a sharded async checkpoint, against one file", &r1, &r2, 0);
    results_free(&r1), results_free(&r2);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s.step-* %s", dir, dir, file);
    cr_assert_eq(system(cmd), 0);
}
