// test_user_errors.c: nothing a user types destroys their data (issue 23), on every training
// chapter: each bad input of BAD below is given to each chapter of CHAPTERS, and must be refused
// before step 1 with one message (not one per rank) that says what is wrong, every rank gone
// within PROMPT_S, every input file byte for byte as it was and no output written.
//
// A chapter added later is covered by one line in CHAPTERS (a parameterized test: Criterion runs
// the chapters side by side).
//
// Seen failing before the fixes (this file run from /work/main's root, i.e. on the chapters as
// they were, with the old common/): chapter 03:
//   same-file data/save: accepted (exit 0), t.txt replaced by a checkpoint, "checksum changed";
//   resume/save-weights: accepted, s.ckpt turned into a weights file; save/dump: accepted;
//   save to a FIFO: accepted, the FIFO replaced by a regular file;
//   --save /proc/..: accepted, trained, then failed at the save (after step 1);
//   flipped step byte: "the state is at step 130 ... pass --steps > 130", no "CRC32";
//   a byte appended to a state or weights file: accepted (exit 0);
//   768 GiB of params: "out of host memory" printed by each rank, no size that fits;
//   the state of another model on 08 and 09: "config mismatch" printed by each rank;
//   --steps twice: accepted (the last won); --lr 1e-320: "is not a finite number";
//   a resume that trains something else (item 3; states with the run's identity, ckpt.h): with
//   --data-seed 7 on a seed-42 state, --data t.txt on a synthetic state, --steps 10 on a 4-step
//   state, and --data d.txt whose bytes changed since the save: each accepted (exit 0) and
//   trained. (Without the check in flags.c, check_identity returning at once: the same.)
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "gpt2.h"
#include "harness.h"

// Every training chapter, with the fixed flags of a small valid layout and its ranks.
// (Arrays, not pointers: Criterion hands each parameter to a new process by value.)
// predicts: the chapter predicts its memory before allocating (mem_predict.h).
typedef struct Chapter {
    char tag[8];
    char run[120];
    int np;
    int predicts;
} Chapter;
static const Chapter CHAPTERS[] = {
    {"00", "./00_memory_budget/run --train", 1, 1},
    {"02", "./02_data_parallel/run", 2, 1},
    {"03", "./03_ddp/run", 2, 1},
    {"05", "./05_zero/run --zero 3", 2, 1},
    {"06", "./06_fsdp/run", 2, 1},
    {"07", "./07_tensor_parallel/run --tp 2", 2, 1},
    {"08", "./08_pipeline/run", 2, 1},
    {"09", "./09_3d/run --tp 1 --pp 2", 2, 1},
};

#define MODEL "--layers 2 --channels 32 --heads 2 --seq 16 --batch 8 --steps 4"
static const GPT2Config CFG = {.V = 256, .T = 16, .L = 2, .C = 32, .NH = 2};
#define PROMPT_S 10.0  // a refusal ends the job in about 1 s; mpirun on a loaded machine adds some
#define TIMEOUT_S 60

// A bad input: the flags after MODEL ("@" stands for the test's directory; bare: instead of
// MODEL), the words the one message must say (a chapter that predicts its memory refuses a run
// too big before it allocates, and says it its own way: words_pred), and words it must not say
// (a misleading hint). pred_only: only for the chapters that predict (the others would allocate
// until the OOM killer came).
typedef struct Bad {
    const char *what, *flags;
    int bare;
    const char *words[4];
    const char *words_pred[4];
    const char *never;
    int pred_only;
} Bad;

static const Bad BAD[] = {
    // item 1: an output that is an input (through a link), or another output, or a FIFO
    {"output is the input", "--data @/t.txt --save @/t.link", 0,
     {"--save @/t.link", "--data @/t.txt", "same file"}, {0}, NULL, 0},
    {"output is the resumed state", "--resume @/s.ckpt --save-weights @/s.ckpt", 0,
     {"--save-weights @/s.ckpt", "--resume @/s.ckpt", "same file"}, {0}, NULL, 0},
    {"two outputs, one file", "--save @/o.ckpt --dump @/o.ckpt", 0,
     {"--save @/o.ckpt", "--dump @/o.ckpt", "same file"}, {0}, NULL, 0},
    {"output is a FIFO", "--save @/fifo", 0, {"--save @/fifo", "is a FIFO"}, {0}, NULL, 0},
    // item 5: a directory that exists but takes no files, found before step 1
    {"output under /proc", "--trace /proc/lab_user_errors.json", 0,
     {"--trace /proc/lab_user_errors.json", "cannot create /proc/lab_user_errors.json.tmp"}, {0},
     "does the directory exist", 0},
    // item 4: the CRC and the exact size before any header field
    {"flipped step byte", "--resume @/flip.ckpt", 0, {"--resume @/flip.ckpt", "CRC32 mismatch"}, {0},
     "pass --steps", 0},
    {"state with a byte appended", "--resume @/app.ckpt", 0, {"--resume @/app.ckpt", "appended"},
     {0}, NULL, 0},
    {"weights with a byte appended", "--load-weights @/app.bin", 0,
     {"--load-weights @/app.bin", "appended"}, {0}, NULL, 0},
    // item 6: one message, also where every rank loads the file (08, 09)
    {"state of another model", "--resume @/other.ckpt", 0,
     {"config mismatch in @/other.ckpt", "T (--seq) = 8, this run has 16"}, {0}, NULL, 0},
    // item 6: one message naming what fits
    {"768 GiB of params", "--layers 64 --channels 16384 --heads 128 --seq 16 --batch 8 --steps 1", 1,
     {"out of host memory", "available", "per rank", "--layers"},
     {"predicted memory", "available", "smaller model"}, NULL, 0},
    // item 2: a batch that cannot fit is refused before anything is allocated, naming one that
    // fits: against MemAvailable (the issue's -np 4 08 case: 1.44 TiB a rank), and against
    // --mem-limit (deterministic: any machine)
    {"a batch that cannot fit", "--layers 2 --channels 32 --heads 2 --seq 16 --batch 1048576 "
     "--steps 2", 1, {0}, {"predicted memory", "per rank", "MemAvailable", "or less"}, NULL, 1},
    {"a batch over --mem-limit", "--layers 2 --channels 32 --heads 2 --seq 16 --batch 4096 "
     "--steps 2 --mem-limit 64", 1, {0},
     {"predicted memory", "exceeds the 64.00 MiB available (--mem-limit)", "or less"}, NULL, 1},
    // item 7 and 8
    {"a flag twice", "--steps 3", 0, {"--steps given twice", "--steps 4", "--steps 3"}, {0}, NULL, 0},
    {"an lr fp32 cannot hold", "--lr 1e-320", 0, {"--lr 1e-320 is out of range", "[0, 10]"}, {0},
     "finite", 0},
    // item 3: a resume that would train something else (id.ckpt: the MODEL run's state, step 2)
    {"resume, another data seed", "--resume @/id.ckpt --data-seed 7", 0,
     {"--resume @/id.ckpt", "data-seed 42 -> 7", "--allow-changed data-seed"}, {0}, NULL, 0},
    {"resume, a file for the synthetic data", "--resume @/id.ckpt --data @/t.txt", 0,
     {"data synthetic -> @/t.txt (4096 bytes", "--allow-changed data"}, {0}, NULL, 0},
    {"resume, a longer schedule", "--layers 2 --channels 32 --heads 2 --seq 16 --batch 8 --steps 10 "
     "--resume @/id.ckpt", 1, {"steps 4 -> 10", "--allow-changed steps"}, {0}, NULL, 0},
    {"resume, the data file changed", "--data @/d.txt --resume @/dstate.ckpt", 0,
     {"data @/d.txt (4096 bytes, crc32 ", "-> @/d.txt (4096 bytes", "--allow-changed data"}, {0},
     NULL, 0},
};
#define NBAD (sizeof BAD / sizeof BAD[0])

// The inputs every case may read, and their checksums.
static const char *INPUTS[] = {"t.txt", "s.ckpt", "w.bin", "flip.ckpt", "app.ckpt", "app.bin",
                               "other.ckpt", "id.ckpt", "dstate.ckpt", "d.txt"};
#define NIN (sizeof INPUTS / sizeof INPUTS[0])

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = lab_xmalloc(*n + 1);
    *n = fread(b, 1, *n, f);
    fclose(f);
    return b;
}

static uint32_t crc_of_file(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    if (!b) return 0;
    uint32_t crc = crc32_of(b, n) ^ (uint32_t)n;
    free(b);
    return crc;
}

// The test's directory: a text file (and a link to it), a state after 2 steps and weights of
// the MODEL config, the same with a flipped step byte or a byte appended, and a FIFO.
static void make_inputs(char *dir, size_t len) {
    snprintf(dir, len, "/tmp/lab_user_errors_%d_XXXXXX", (int)getpid());
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    char p[512], q[512];
    size_t n = gpt2_param_count(&CFG);
    float *zeros = calloc(n, sizeof(float));
    char text[4096];
    for (size_t i = 0; i < sizeof text; i++) text[i] = (char)('a' + (i * 7) % 26);
    snprintf(p, sizeof p, "%s/t.txt", dir);
    write_bytes(p, text, sizeof text);
    snprintf(q, sizeof q, "%s/t.link", dir);
    cr_assert_eq(symlink("t.txt", q), 0);
    TrainState st = {.cfg = CFG, .step = 2, .n = n, .params = zeros, .m = zeros, .v = zeros};
    snprintf(p, sizeof p, "%s/s.ckpt", dir);
    ckpt_save_state(p, &st);
    size_t size;
    unsigned char *raw = read_bytes(p, &size);
    raw[32] ^= 0x80;  // step 2 -> 130, the CRC no longer matches
    snprintf(q, sizeof q, "%s/flip.ckpt", dir);
    write_bytes(q, raw, size);
    raw[32] ^= 0x80;
    raw[size] = 'x';
    snprintf(q, sizeof q, "%s/app.ckpt", dir);
    write_bytes(q, raw, size + 1);
    free(raw);
    GPT2Config other = CFG;  // --seq 8: a whole, valid state of another model
    other.T = 8;
    st.cfg = other;
    st.n = gpt2_param_count(&other);
    float *more = calloc(st.n, sizeof(float));
    st.params = st.m = st.v = more;
    snprintf(q, sizeof q, "%s/other.ckpt", dir);
    ckpt_save_state(q, &st);
    free(more);
    snprintf(p, sizeof p, "%s/w.bin", dir);
    ckpt_save_weights(p, &CFG, zeros);
    raw = read_bytes(p, &size);
    raw[size] = 'x';
    snprintf(q, sizeof q, "%s/app.bin", dir);
    write_bytes(q, raw, size + 1);
    free(raw);
    snprintf(p, sizeof p, "%s/fifo", dir);
    cr_assert_eq(mkfifo(p, 0600), 0);
    // States that record their run (format 2): MODEL's, on the synthetic source; and on d.txt,
    // whose bytes then change (same path, same size).
    RunIdentity id = {.steps = 4, .warmup = 0, .batch = 8, .seed = 1337, .data_seed = 42,
                      .lr = 1e-3f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    ckpt_set_identity(&id);
    st.cfg = CFG, st.n = n, st.params = st.m = st.v = zeros;
    snprintf(p, sizeof p, "%s/id.ckpt", dir);
    ckpt_save_state(p, &st);
    snprintf(p, sizeof p, "%s/d.txt", dir);
    write_bytes(p, text, sizeof text);
    char why[256];
    id.has_data = 1;
    snprintf(id.data, sizeof id.data, "%.200s", p);
    cr_assert_eq(ckpt_file_crc(p, &id.data_size, &id.data_crc, why, sizeof why), 0, "%s", why);
    ckpt_set_identity(&id);
    snprintf(q, sizeof q, "%s/dstate.ckpt", dir);
    ckpt_save_state(q, &st);
    ckpt_set_identity(NULL);  // the states above this block stay format 1
    text[100] ^= 1;
    write_bytes(p, text, sizeof text);
    free(zeros);
}

static void remove_inputs(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

// s with every "@" replaced by dir.
static void expand(char *out, size_t len, const char *s, const char *dir) {
    size_t k = 0;
    for (; *s && k + 1 < len; s++) {
        if (*s == '@') k += (size_t)snprintf(out + k, len - k, "%s", dir);
        else out[k++] = *s;
        if (k >= len) k = len - 1;
    }
    out[k] = '\0';
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

// One bad input on one chapter, in a directory of its own: 1 when it was refused cleanly, else 0
// (said on stderr with the run's output).
typedef struct Job {
    const Chapter *c;
    const Bad *bad;
    char dir[256];
    uint32_t sums[NIN];
    int ok;
} Job;

static void *run_job(void *arg) {
    Job *j = arg;
    if (!j->c) return NULL;  // not a case of this chapter
    const Chapter *c = j->c;
    const Bad *bad = j->bad;
    const char *dir = j->dir;
    char flags[1024], cmd[2048], word[512], why[640] = "";
    expand(flags, sizeof flags, bad->flags, dir);
    snprintf(cmd, sizeof cmd, "%s %s %s", c->run, bad->bare ? "" : MODEL, flags);
    char *out = NULL;
    double t0 = lab_now();
    int rc = harness_mpirun(c->np, cmd, &out, TIMEOUT_S);
    double secs = lab_now() - t0;
    const char *const *words = c->predicts && bad->words_pred[0] ? bad->words_pred : bad->words;
    if (rc == 0) snprintf(why, sizeof why, "accepted (exit 0)");
    else if (rc == 124) snprintf(why, sizeof why, "hung (killed after %d s)", TIMEOUT_S);
    else if (secs > PROMPT_S) snprintf(why, sizeof why, "took %.1f s to end", secs);
    for (int w = 0; !why[0] && w < 4 && words[w]; w++) {
        expand(word, sizeof word, words[w], dir);
        if (!harness_contains(out, word)) snprintf(why, sizeof why, "no \"%s\" in the message", word);
    }
    if (!why[0] && count(out, "error:") != 1)
        snprintf(why, sizeof why, "\"error:\" printed %d times, not once", count(out, "error:"));
    if (!why[0] && bad->never && harness_contains(out, bad->never))
        snprintf(why, sizeof why, "the message says \"%s\"", bad->never);
    if (!why[0] && harness_contains(out, "  loss "))  // a progress line
        snprintf(why, sizeof why, "refused only after step 1");
    for (size_t i = 0; !why[0] && i < NIN; i++)
        if (crc_of_file(dir, INPUTS[i]) != j->sums[i])
            snprintf(why, sizeof why, "the input %s/%s changed (checksum)", dir, INPUTS[i]);
    struct stat st;
    char p[512];
    snprintf(p, sizeof p, "%s/fifo", dir);
    if (!why[0] && (stat(p, &st) != 0 || !S_ISFIFO(st.st_mode)))
        snprintf(why, sizeof why, "%s is no longer a FIFO", p);
    snprintf(p, sizeof p, "%s/o.ckpt", dir);
    if (!why[0] && access(p, F_OK) == 0) snprintf(why, sizeof why, "%s was written", p);
    if (why[0])
        fprintf(stderr, "%s, %s: %s\n  -np %d %s\n%s\n", c->tag, bad->what, why, c->np, cmd,
                out ? out : "(no output)");
    free(out);
    j->ok = why[0] == 0;
    return NULL;
}

// The jobs, JOBS_AT_ONCE at a time: a refused run mostly waits (for mpirun, for the abort), so
// running a few side by side keeps the whole test short even under -j1.
#define JOBS_AT_ONCE 4
static Job g_jobs[NBAD];
static size_t g_next, g_njobs;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        size_t k = g_next++;
        pthread_mutex_unlock(&g_lock);
        if (k >= g_njobs) return NULL;
        run_job(&g_jobs[k]);
    }
}

// Every bad input of BAD on one chapter; returns the number not refused cleanly.
static int refuse_all(const Chapter *c) {
    Job *jobs = g_jobs;
    for (size_t b = 0; b < NBAD; b++) {
        jobs[b] = (Job){.c = c, .bad = &BAD[b]};
        make_inputs(jobs[b].dir, sizeof jobs[b].dir);
        for (size_t i = 0; i < NIN; i++) jobs[b].sums[i] = crc_of_file(jobs[b].dir, INPUTS[i]);
    }
    g_next = 0, g_njobs = NBAD;
    for (size_t b = 0; b < NBAD; b++)  // (a case a chapter does not take passes at once)
        if (BAD[b].pred_only && !c->predicts) jobs[b].ok = 1, jobs[b].c = NULL;
    pthread_t t[JOBS_AT_ONCE];
    for (int i = 0; i < JOBS_AT_ONCE; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < JOBS_AT_ONCE; i++) pthread_join(t[i], NULL);
    int failed = 0;
    for (size_t b = 0; b < NBAD; b++) {
        failed += !jobs[b].ok;
        remove_inputs(jobs[b].dir);
    }
    return failed;
}

ParameterizedTestParameters(user_errors, every_chapter) {
    static Chapter chapters[sizeof CHAPTERS / sizeof CHAPTERS[0]];
    memcpy(chapters, CHAPTERS, sizeof CHAPTERS);
    return cr_make_param_array(Chapter, chapters, sizeof CHAPTERS / sizeof CHAPTERS[0]);
}

ParameterizedTest(const Chapter *c, user_errors, every_chapter, .timeout = 300) {
    int failed = refuse_all(c);
    cr_assert_eq(failed, 0, "chapter %s: %d of %zu bad inputs not refused cleanly (above)", c->tag,
                 failed, NBAD);
}

// What a resume of the states above prints: a format-1 state (no identity) loads on every
// chapter with one note; "restored step 2 from ..." is said once, also where every rank reads
// the state (08, 09). Seen failing before: no note, no "restored" line.
Test(user_errors, a_format_1_state_resumes_with_a_note_on_every_chapter, .timeout = 300) {
    char dir[256], cmd[2048], *out = NULL;
    make_inputs(dir, sizeof dir);
    int bad = 0;
    for (size_t i = 0; i < sizeof CHAPTERS / sizeof CHAPTERS[0]; i++) {
        const Chapter *c = &CHAPTERS[i];
        snprintf(cmd, sizeof cmd, "%s %s --quiet --resume %s/s.ckpt", c->run, MODEL, dir);
        int rc = harness_mpirun(c->np, cmd, &out, TIMEOUT_S);
        int notes = count(out, "a state of format 1 records no data"), said = count(out, "restored step 2 from");
        if (rc != 0 || notes != 1 || said != 1) {
            fprintf(stderr, "%s: rc %d, the note %d times, \"restored step 2\" %d times:\n%s\n",
                    c->tag, rc, notes, said, out ? out : "");
            bad++;
        }
        free(out);
        out = NULL;
    }
    remove_inputs(dir);
    cr_assert_eq(bad, 0, "%d chapters did not resume a format-1 state with one note (above)", bad);
}

// The lr of each step's progress line, "lr X" after "step N/M": into lr[N-1] (as text).
static void lrs_of(const char *out, char lr[][16], int n) {
    for (int s = 0; s < n; s++) lr[s][0] = '\0';
    for (const char *p = out; p && (p = strstr(p, "step ")); p += 5) {
        int step = 0;
        const char *q = strstr(p, " lr ");
        if (sscanf(p, "step %d/", &step) == 1 && step >= 1 && step <= n && q)
            sscanf(q, " lr %15s", lr[step - 1]);
    }
}

// --allow-changed steps lets the 6-step state of a run go on to step 10, says so once, and
// the steps it runs follow the 10-step schedule: their lr (progress line) equals a fresh 10-step
// run's (checked on 05, whose save and load go through zero.c).
// Without --allow-changed the same resume is refused (the table above, "a longer schedule").
// Seen failing before: the note missing (the resume was accepted without one).
Test(user_errors, allow_changed_steps_resumes_on_the_longer_schedule, .timeout = 120) {
    char dir[256], cmd[2048], *out = NULL, lr_resumed[10][16], lr_fresh[10][16];
    make_inputs(dir, sizeof dir);
    const char *run = "./05_zero/run --zero 3";
#define M6 "--layers 2 --channels 32 --heads 2 --seq 16 --batch 8 --log-every 1"
    snprintf(cmd, sizeof cmd, "%s " M6 " --steps 6 --save %s/six.ckpt", run, dir);
    cr_assert_eq(harness_mpirun(2, cmd, &out, TIMEOUT_S), 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s " M6 " --steps 10 --resume %s/six.ckpt --allow-changed steps",
             run, dir);
    cr_assert_eq(harness_mpirun(2, cmd, &out, TIMEOUT_S), 0, "%s", out);
    cr_assert_eq(count(out, "note: --allow-changed: steps 6 -> 10"), 1, "%s", out);
    cr_assert_eq(count(out, "restored step 6 from"), 1, "%s", out);
    lrs_of(out, lr_resumed, 10);
    free(out);
    snprintf(cmd, sizeof cmd, "%s " M6 " --steps 10", run);
    cr_assert_eq(harness_mpirun(2, cmd, &out, TIMEOUT_S), 0, "%s", out);
    lrs_of(out, lr_fresh, 10);
    free(out);
    for (int s = 6; s < 10; s++) {
        fprintf(stderr, "test_user_errors: step %d lr: resumed %s, fresh 10-step run %s\n", s + 1,
                lr_resumed[s], lr_fresh[s]);
        cr_assert(lr_resumed[s][0] && strcmp(lr_resumed[s], lr_fresh[s]) == 0,
                  "step %d: lr %s after the resume, %s in a 10-step run", s + 1, lr_resumed[s],
                  lr_fresh[s]);
    }
#undef M6
    remove_inputs(dir);
}

// Item 7: a flag that would do nothing next to the others is refused with one message naming
// what it needs (05's --bucket-kb / --in-flight and 08's --stages: their chapters' tests). 03's
// bucket flags with --no-overlap (no buckets), its no_sync check without accumulation (no
// micro-step inside no_sync); chapter 00's training flags without --train (the calculator runs)
// and the calculator's flags with it. Nothing is written: the --save case leaves no file.
// Seen failing before the fix: every case accepted (exit 0), the training flags' calculator
// printing its table and saving nothing, `--train --model 7b` training the lab's model.
Test(user_errors, flags_that_would_do_nothing_are_refused, .timeout = 200) {
    static const struct {
        int np;
        const char *cmd, *words[3];
    } cases[] = {
        {2, "./03_ddp/run " MODEL " --check-no-sync", {"--check-no-sync compares", "--grad-accum 1 has no micro-step", "add --grad-accum 2"}},
        {2, "./03_ddp/run " MODEL " --no-overlap --bucket-mb 1", {"--bucket-mb is about the gradient buckets", "--no-overlap has none"}},
        {2, "./03_ddp/run " MODEL " --first-bucket-mb=0.5 --no-overlap", {"--first-bucket-mb is about", "drop --first-bucket-mb or --no-overlap"}},
        {2, "./03_ddp/run " MODEL " --no-overlap --pack-buckets", {"--pack-buckets is about", "--no-overlap has none"}},
        {2, "./03_ddp/run " MODEL " --no-overlap --progress poll", {"--progress is about", "--no-overlap has none"}},
        {2, "./03_ddp/run " MODEL " --no-overlap --launch-after-backward", {"--launch-after-backward is about"}},
        {1, "./00_memory_budget/run --steps 3", {"--steps is a training run's flag and needs --train", "add --train, or drop --steps"}},
        {1, "./00_memory_budget/run --save /tmp/lab_user_errors_calc.ckpt", {"--save is a training run's flag", "--train"}},
        {1, "./00_memory_budget/run --layers 2 --inject-nan-step 1", {"--inject-nan-step is a training run's flag"}},
        {1, "./00_memory_budget/run --quiet", {"--quiet is a training run's flag"}},
        {1, "./00_memory_budget/run --train " MODEL " --model 7b", {"--model is the calculator's", "drop --model or --train"}},
        {1, "./00_memory_budget/run --zero=1 --train", {"--zero is the calculator's"}},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int nwords = 0;
        while (nwords < 3 && cases[i].words[nwords]) nwords++;
        failed += !harness_refuses(cases[i].np, cases[i].cmd, cases[i].words, nwords);
    }
    cr_assert_eq(access("/tmp/lab_user_errors_calc.ckpt", F_OK), -1,
                 "the calculator given --save wrote /tmp/lab_user_errors_calc.ckpt");
    cr_assert_eq(failed, 0, "%d flags that do nothing were not refused cleanly (above)", failed);
    // and the flags of each half still run there
    char *out = NULL;
    cr_assert_eq(harness_run("./00_memory_budget/run --layers 2 --batch 4 --dtype bf16", &out, 60),
                 0, "the calculator with --batch and --dtype:\n%s", out);
    free(out);
}

// Item 2's proof: every chapter that predicts its memory (mem_predict.h) predicts at least what
// its ranks really allocate (mem.h's count: the --dump's mem_peak, the process's peak, rank 0's),
// and not more than 10 % above it, on the layouts above, fp32 and bf16. The prediction is the
// chapter's own, made before it allocated (mem_predicted); the measurement is mem.c's.
// Seen failing before the fix: /work/old's binaries (LAB_BUILD=/work/old/build, run from
// /work/old) write neither figure ("no mem_predicted in the dump").
// Mutant: mutants/mem-pipe-one-set-short.patch
ParameterizedTestParameters(user_errors, memory_prediction_holds) {
    static Chapter chapters[sizeof CHAPTERS / sizeof CHAPTERS[0]];
    memcpy(chapters, CHAPTERS, sizeof CHAPTERS);
    return cr_make_param_array(Chapter, chapters, sizeof CHAPTERS / sizeof CHAPTERS[0]);
}

ParameterizedTest(const Chapter *c, user_errors, memory_prediction_holds, .timeout = 300) {
    if (!c->predicts) {
        cr_log_warn("chapter %s does not predict its memory yet: not checked", c->tag);
        return;
    }
    static const char *dtypes[] = {"fp32", "bf16"};
    for (int d = 0; d < 2; d++) {
        char flags[256];
        snprintf(flags, sizeof flags, "%s --quiet --dtype %s", MODEL, dtypes[d]);
        RunResults r;
        char *out = NULL;
        int rc = harness_run_dump(c->run, c->np, flags, &r, &out, 120);
        cr_assert_eq(rc, 0, "chapter %s %s: the run failed:\n%s", c->tag, dtypes[d], out);
        cr_assert(results_has(&r, "mem_predicted") && results_has(&r, "mem_peak"),
                  "chapter %s %s: no mem_predicted / mem_peak in the dump", c->tag, dtypes[d]);
        const double pred = results_get(&r, "mem_predicted", 0), meas = results_get(&r, "mem_peak", 0);
        cr_log_info("chapter %s %s: predicted %.0f B, measured %.0f B, ratio %.4f", c->tag,
                    dtypes[d], pred, meas, pred / meas);
        cr_assert(meas > 0 && pred >= meas, "chapter %s %s: predicted %.0f B < measured %.0f B "
                  "(ratio %.4f): a run the prediction lets through may not fit", c->tag, dtypes[d],
                  pred, meas, pred / meas);
        cr_assert(pred <= 1.10 * meas, "chapter %s %s: predicted %.0f B is %.1f %% above the "
                  "measured %.0f B (bound 10 %%)", c->tag, dtypes[d], pred, 100 * (pred / meas - 1),
                  meas);
        results_free(&r);
        free(out);
    }
}

// A chapter started without mpirun (a singleton, the way `./00_memory_budget/run` is run) says
// its error in one line and nothing else: the process ends itself instead of through MPI_Abort,
// whose six-line Open MPI banner buried the lab's line (seen failing before common/dist_mpi.c's
// singleton end: 9 lines on every chapter). Each chapter meets a bad flag value after MPI is up.
// Mutant: mutants/singleton-abort-banner.patch
ParameterizedTestParameters(user_errors, a_singleton_says_its_error_alone) {
    return cr_make_param_array(Chapter, (void *)CHAPTERS, sizeof CHAPTERS / sizeof CHAPTERS[0]);
}

ParameterizedTest(const Chapter *c, user_errors, a_singleton_says_its_error_alone, .timeout = 60) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "env -u OMPI_COMM_WORLD_SIZE %s %s --lr -1", c->run, MODEL);
    char *out = NULL;
    int rc = harness_run(cmd, &out, 30);
    int lines = 0;
    for (const char *p = out; p && *p; p++) lines += *p == '\n';
    cr_assert(rc != 0 && rc != 124, "chapter %s: %s: rc %d:\n%s", c->tag, cmd, rc, out);
    cr_assert(lines == 1 && strncmp(out, "error: ", 7) == 0,
              "chapter %s: %s printed %d lines, not the one \"error:\" line:\n%s", c->tag, cmd,
              lines, out);
    free(out);
}
