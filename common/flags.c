// flags.c: the strict, table-driven command line of flags.h.
//
// Every flag is a row of a table (name, kind, where the value goes, valid range, help). The
// parser, the error messages and the --help table are all generated from the same rows, so a
// flag cannot be documented in one place and parsed differently in another.
#include "flags.h"
#include "kernels.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "text.h"
#include "ckpt.h"
#include "dist.h"
#include "watchdog.h"
#include "health.h"
#ifdef LAB_CUDA
#include "cuda_util.h"
#endif

#define MAX_INT_FLAG 1000000000.0

// What a FILE flag names: nothing checked, a file to read, a file to write.
enum { FILE_NONE, FILE_IN, FILE_OUT };

// A row of the table: the public FlagSpec plus what --help and the file check need.
typedef struct Flag {
    const char *group;    // "model", "training", "hardware", "output", "reliability", "chapter"
    unsigned mask;        // its LAB_FLAGS_* group bit (0: always taken: --help, chapter flags)
    int taken;            // the program takes it (its group is among the program's groups)
    const char *metavar;  // "N", "X", "FILE", ... (NULL for a switch)
    int file;             // FILE_IN: a regular readable file; FILE_OUT: in a writable directory
    FlagSpec s;
} Flag;

// The rows, sized from the inputs: NSHARED shared rows + the chapter's (add() checks the room,
// so a chapter with many flags gets a clear internal error instead of an overflow).
#define NSHARED 72
typedef struct Table {
    Flag *rows;
    int n, cap;
} Table;

static const char *GROUPS[] = {"model", "training", "hardware", "output", "reliability", "chapter"};
#define NGROUPS ((int)(sizeof(GROUPS) / sizeof(GROUPS[0])))

LabArgs lab_args_defaults(void) {
    LabArgs a;
    memset(&a, 0, sizeof(a));
    a.V = 256; a.T = 64; a.L = 4; a.C = 128; a.NH = 4;  // the tiny config (docs/ARCHITECTURE.md)
    a.batch = 16;
    a.steps = 20;
    a.lr = 1e-3f;
    a.weight_decay = 0.1f;
    a.grad_clip = 1.0f;
    a.warmup = 0;
    a.seed = 1337;
    a.data_seed = 42;
    a.data = NULL;
    a.device = "cpu";
    a.backend = "mpi";
    a.dtype = "fp32";
    a.threads = 1;
    a.log_every = 10;
    a.quiet = 0;
    a.save_every = 0;
    a.inject_nan_step = -1;
    a.stop_at = -1;
    a.kill_rank = -1;
    a.kill_step = -1;
    a.collective_timeout = (float)WATCHDOG_DEFAULT_S;
    a.hang_rank = a.hang_step = -1;
    a.on_nan = "stop";
    a.on_spike = "warn";
    a.spike_z = 6.0f;
    a.spike_window = HEALTH_WINDOW;
    a.rollback_lr_scale = 1.0f;
    a.rollback_skip = 1;
    a.inject_spike_step = -1;
    a.oom_rank = -1;
    a.oom_step = -1;
    a.recompute = "none";
    a.temperature = 1.0f;
    a.sample_seed = 1;
    return a;
}

GPT2Config lab_args_config(const LabArgs *a) {
    GPT2Config c = {a->V, a->T, a->L, a->C, a->NH};
    return c;
}

Device lab_args_device(const LabArgs *a) {
    return strcmp(a->device, "cuda") == 0 ? DEV_CUDA : DEV_CPU;
}

AdamW lab_args_adamw(const LabArgs *a) {
    AdamW h = adamw_defaults();
    h.lr = a->lr;
    h.weight_decay = a->weight_decay;
    h.grad_clip = a->grad_clip;
    h.warmup_steps = a->warmup;
    h.total_steps = a->steps;   // cosine decay over the whole run
    h.skip_nan = strcmp(a->on_nan, "skip") == 0;
    return h;
}

GPT2Recompute lab_args_recompute(const LabArgs *a) {
    GPT2Recompute r = strcmp(a->recompute, "full") == 0        ? GPT2_RECOMPUTE_FULL
                      : strcmp(a->recompute, "selective") == 0 ? GPT2_RECOMPUTE_SELECTIVE
                                                               : GPT2_RECOMPUTE_NONE;
    return r;  // (the parser took none|selective|full only; fp32 and bf16 both recompute)
}

int lab_args_end_step(const LabArgs *a) {
    return a->stop_at >= 0 && a->stop_at < a->steps ? a->stop_at : a->steps;
}

int lab_args_corpus(const LabArgs *a) { return a->data && strcmp(a->data, "text") == 0; }

void lab_args_data(const LabArgs *a, DataSource *d) {
    if (lab_args_corpus(a)) text_corpus_init(d, a->T, (uint64_t)a->data_seed);  // split 90/10
    else if (a->data) data_init_file(d, a->data, a->T, (uint64_t)a->data_seed);
    else data_init_synthetic(d, a->V, (uint64_t)a->data_seed);
    const uint8_t *nul = a->data ? memchr(d->bytes, 0, d->nbytes) : NULL;
    if (nul)  // (every rank read the same file: one message)
        lab_fail_collective("the data file %s looks binary (a NUL byte at offset %zu): --data "
                            "takes a text file, read as bytes (or --data text, the lab's corpus)",
                            a->data, (size_t)(nul - d->bytes));
    if (a->data && a->val_every > 0) data_split_validation(d, a->T);  // a file: its last 10 %
    if (a->inject_spike_step >= 0) data_corrupt_step(d, (uint64_t)a->inject_spike_step);
}

// ---- the table ----------------------------------------------------------------------------

static unsigned group_mask(const char *group) {
    static const unsigned masks[] = {LAB_FLAGS_MODEL, LAB_FLAGS_TRAINING, LAB_FLAGS_HARDWARE,
                                     LAB_FLAGS_OUTPUT, LAB_FLAGS_RELIABILITY, 0};
    for (int g = 0; g < NGROUPS; g++)
        if (strcmp(group, GROUPS[g]) == 0) return masks[g];
    return 0;
}

static Flag row(const char *group, const char *name, const char *metavar, FlagKind kind, void *ptr,
                double min, double max, const char *choices, const char *help) {
    Flag f = {group, group_mask(group), 1, metavar, FILE_NONE, {name, kind, ptr, min, max, choices, help}};
    return f;
}

static void add(Table *t, Flag f) {
    LAB_CHECK(t->n < t->cap, "flag table full at %s (%d rows): raise NSHARED in flags.c", f.s.name,
              t->cap);
    t->rows[t->n++] = f;
}

// The shared flags pointing into *a, then the chapter's, into a new table; a shared flag is
// taken when its group is in `groups`.
static Table build_table(LabArgs *a, const FlagSpec *extra, int nextra, unsigned groups) {
    LAB_CHECK(nextra >= 0 && (nextra == 0 || extra), "chapter flags: %d rows at %p", nextra,
              (const void *)extra);
    Table t = {lab_xmalloc((size_t)(NSHARED + nextra) * sizeof(Flag)), 0, NSHARED + nextra};
    Flag *out = t.rows;
    add(&t, row("model", "--vocab", "N", FLAG_INT, &a->V, 8, 262144, NULL, "vocabulary size V (256 = bytes)"));
    add(&t, row("model", "--seq", "N", FLAG_INT, &a->T, 1, 8192, NULL, "sequence length T (tokens per row)"));
    add(&t, row("model", "--layers", "N", FLAG_INT, &a->L, 1, 256, NULL, "transformer blocks L"));
    add(&t, row("model", "--channels", "N", FLAG_INT, &a->C, 1, 65536, NULL, "channels C (a multiple of --heads)"));
    add(&t, row("model", "--heads", "N", FLAG_INT, &a->NH, 1, 1024, NULL, "attention heads NH"));
    add(&t, row("training", "--batch", "N", FLAG_INT, &a->batch, 1, 1048576, NULL, "global batch B: sequences per step, all ranks together"));
    add(&t, row("training", "--steps", "N", FLAG_INT, &a->steps, 0, MAX_INT_FLAG, NULL, "optimizer steps"));
    add(&t, row("training", "--lr", "X", FLAG_FLOAT, &a->lr, 0, 10, NULL, "peak learning rate (AdamW)"));
    add(&t, row("training", "--weight-decay", "X", FLAG_FLOAT, &a->weight_decay, 0, 10, NULL, "AdamW weight decay (2-D weights only)"));
    add(&t, row("training", "--grad-clip", "X", FLAG_FLOAT, &a->grad_clip, 0, 1e6, NULL, "max global gradient L2 norm (0 = no clipping)"));
    add(&t, row("training", "--warmup", "N", FLAG_INT, &a->warmup, 0, MAX_INT_FLAG, NULL, "linear learning-rate warmup steps"));
    add(&t, row("training", "--seed", "N", FLAG_INT, &a->seed, 0, 2147483647.0, NULL, "model initialization seed"));
    add(&t, row("training", "--data-seed", "N", FLAG_INT, &a->data_seed, 0, 2147483647.0, NULL, "data seed (which sequences each step sees)"));
    add(&t, row("training", "--data", "FILE", FLAG_STRING, &a->data, 0, 0, NULL, "byte-level text file, or text: the lab's corpus (Debian's fortunes; default: the synthetic Markov source)"));
    out[t.n - 1].file = FILE_IN;
    add(&t, row("hardware", "--device", "D", FLAG_CHOICE, &a->device, 0, 0, "cpu|cuda", "where the math runs"));
    add(&t, row("hardware", "--backend", "B", FLAG_CHOICE, &a->backend, 0, 0, "mpi|nccl", "communication backend (nccl needs --device cuda)"));
    add(&t, row("hardware", "--dtype", "T", FLAG_CHOICE, &a->dtype, 0, 0, "fp32|bf16", "parameter/activation precision (bf16: mixed precision)"));
    add(&t, row("hardware", "--threads", "N", FLAG_INT, &a->threads, 1, 256, NULL, "BLAS threads per rank (overrides OPENBLAS_NUM_THREADS)"));
    add(&t, row("hardware", "--mem-limit", "MiB", FLAG_FLOAT, &a->mem_limit_mib, 0, 1e9, NULL, "refuse a run whose ranks on this machine are predicted to need more host memory together (0 = MemAvailable)"));
    add(&t, row("output", "--log-every", "N", FLAG_INT, &a->log_every, 0, MAX_INT_FLAG, NULL, "progress line every N steps (0 = summary only)"));
    add(&t, row("output", "--quiet", NULL, FLAG_BOOL, &a->quiet, 0, 1, NULL, "print nothing but errors (the results: --dump, --save, --trace)"));
    add(&t, row("output", "--trace", "FILE", FLAG_STRING, &a->trace, 0, 0, NULL, "write a Chrome/Perfetto timeline (JSON)"));
    out[t.n - 1].file = FILE_OUT;
    add(&t, row("output", "--log", "FILE", FLAG_STRING, &a->log, 0, 0, NULL, "one JSON line per step: loss, grad norm, lr, tokens/s, MFU (tools/plot.sh)"));
    out[t.n - 1].file = FILE_OUT;
    add(&t, row("output", "--dump", "FILE", FLAG_STRING, &a->dump, 0, 0, NULL, "write losses, final weights and counters (for tests)"));
    out[t.n - 1].file = FILE_OUT;
    add(&t, row("output", "--help", NULL, FLAG_BOOL, NULL, 0, 1, NULL, "print this help and exit"));
    out[t.n - 1].mask = 0;  // every program has --help
    add(&t, row("reliability", "--save", "FILE", FLAG_STRING, &a->save, 0, 0, NULL, "training-state checkpoint (every --save-every steps and at the end)"));
    out[t.n - 1].file = FILE_OUT;
    add(&t, row("reliability", "--save-every", "N", FLAG_INT, &a->save_every, 0, MAX_INT_FLAG, NULL, "checkpoint period in steps (0 = only at the end)"));
    add(&t, row("reliability", "--resume", "FILE", FLAG_STRING, &a->resume, 0, 0, NULL, "resume from a training-state checkpoint (a file, or a --save-sharded directory)"));
    out[t.n - 1].file = FILE_IN;
    add(&t, row("reliability", "--allow-changed", "F,..", FLAG_STRING, &a->allow_changed, 0, 0, NULL, "let --resume change these of the state's run: " RUN_IDENTITY_FIELDS ", or all"));
    add(&t, row("reliability", "--load-weights", "FILE", FLAG_STRING, &a->load_weights, 0, 0, NULL, "start from llm.c gpt2_*.bin weights"));
    out[t.n - 1].file = FILE_IN;
    add(&t, row("reliability", "--save-weights", "FILE", FLAG_STRING, &a->save_weights, 0, 0, NULL, "write llm.c gpt2_*.bin weights at the end"));
    out[t.n - 1].file = FILE_OUT;
    // checkpoints as the notes' 10.9 (common/ckpt.h): async, sharded, rotated, timed
    add(&t, row("reliability", "--async-save", NULL, FLAG_BOOL, &a->async_save, 0, 1, NULL, "write each checkpoint from a host snapshot in a background thread while training goes on"));
    add(&t, row("reliability", "--save-sharded", NULL, FLAG_BOOL, &a->save_sharded, 0, 1, NULL, "--save DIR: each rank writes its part of the state, plus a manifest; any layout resumes it"));
    add(&t, row("reliability", "--keep-last", "K", FLAG_INT, &a->keep_last, 0, 1000000, NULL, "write <save>.step-N, point <save> at it, keep the newest K (0 = one file, replaced)"));
    add(&t, row("reliability", "--save-every-min", "X", FLAG_FLOAT, &a->save_every_min, 0, 1e6, NULL, "also a checkpoint once X minutes passed since the last (0 = off; rank 0 decides for all)"));
    add(&t, row("reliability", "--stop-at", "N", FLAG_INT, &a->stop_at, -1, MAX_INT_FLAG, NULL, "stop after N steps as if interrupted (to test --save/--resume; -1 = off)"));
    add(&t, row("reliability", "--inject-nan-step", "N", FLAG_INT, &a->inject_nan_step, -1, MAX_INT_FLAG, NULL, "fault: put a NaN into a gradient in step N (counted from 1, as the progress lines; -1 = off)"));
    add(&t, row("reliability", "--kill-rank", "R", FLAG_INT, &a->kill_rank, -1, 1048576, NULL, "fault: rank R exits abruptly at --kill-step (-1 = off)"));
    out[t.n - 1].mask = LAB_FLAGS_KILL;
    add(&t, row("reliability", "--kill-step", "N", FLAG_INT, &a->kill_step, -1, MAX_INT_FLAG, NULL, "fault: --kill-rank dies after N completed steps (-1 = off)"));
    out[t.n - 1].mask = LAB_FLAGS_KILL;
    add(&t, row("reliability", "--collective-timeout", "S", FLAG_FLOAT, &a->collective_timeout, 0, 1e6, NULL, "a rank waiting S seconds in one collective, send or recv ends the job with a diagnosis: group, op, sequence number, what each rank does (0 = off)"));
    out[t.n - 1].mask = LAB_FLAGS_COMM | LAB_FLAGS_KILL;  // every multi-rank program
    add(&t, row("reliability", "--inject-hang", "R:S[:X]", FLAG_STRING, &a->inject_hang, 0, 0, NULL, "fault: rank R stops without dying at the start of step S (counted from 1), or sleeps X seconds"));
    out[t.n - 1].mask = LAB_FLAGS_KILL;
    // production (notes 10.8): what a NaN or a loss spike does, and the faults that test it
    add(&t, row("reliability", "--on-nan", "P", FLAG_CHOICE, &a->on_nan, 0, 0, "stop|skip", "a NaN/Inf gradient: stop the run, or skip the step's update on every rank (counted)"));
    add(&t, row("reliability", "--on-spike", "P", FLAG_CHOICE, &a->on_spike, 0, 0, "warn|skip|rollback|stop", "a loss spike: warn, skip the step's update, roll back to the last checkpoint (--save-every), or stop"));
    add(&t, row("reliability", "--spike-z", "Z", FLAG_FLOAT, &a->spike_z, 1, 1e6, NULL, "a loss Z standard deviations above the mean of the last --spike-window steps is a spike"));
    add(&t, row("reliability", "--spike-window", "W", FLAG_INT, &a->spike_window, HEALTH_Z_MIN, HEALTH_WINDOW_MAX, NULL, "steps the loss and grad-norm z-scores look back over"));
    add(&t, row("reliability", "--rollback-lr-scale", "F", FLAG_FLOAT, &a->rollback_lr_scale, 1e-6, 1, NULL, "--on-spike rollback: the lr x F for the steps replayed up to the spike"));
    add(&t, row("reliability", "--rollback-skip", "N", FLAG_INT, &a->rollback_skip, 1, MAX_INT_FLAG, NULL, "--on-spike rollback: skip the updates of N steps from the spike's (its data)"));
    add(&t, row("reliability", "--inject-spike-step", "N", FLAG_INT, &a->inject_spike_step, -1, MAX_INT_FLAG, NULL, "fault: corrupt step N's batch (every token id off by V/2; counted from 1; -1 = off)"));
    add(&t, row("reliability", "--inject-oom-step", "R:N", FLAG_STRING, &a->inject_oom, 0, 0, NULL, "fault: an allocation fails on rank R at step N (N alone: rank 0; counted from 1)"));
    // activation recomputation: the programs that take LAB_FLAGS_RECOMPUTE (not in LAB_FLAGS_ALL)
    add(&t, row("training", "--recompute", "M", FLAG_CHOICE, &a->recompute, 0, 0, "none|selective|full", "activation recomputation: selective recomputes attention's scores and softmax in backward, full keeps only each block's input and reruns its forward"));
    out[t.n - 1].mask = LAB_FLAGS_RECOMPUTE;
    // the virtual cluster (dist_link.c, docs/CLUSTER.md): nodes of G ranks and their links
    add(&t, row("reliability", "--links", "SPEC", FLAG_STRING, &a->links, 0, 0, NULL, "virtual nodes and links: G:BW,LAT:BW,LAT (G ranks per node; GB/s and us inside a node, then between nodes) or PRESET:G[:cpu] (h100, a100; cpu: scaled to this machine's compute); every message is held for its alpha-beta time"));
    out[t.n - 1].mask = LAB_FLAGS_COMM | LAB_FLAGS_KILL;  // every multi-rank program
    // text (common/text.h): validation and sampling on rank 0, from the whole model gathered
    add(&t, row("output", "--val-every", "N", FLAG_INT, &a->val_every, 0, MAX_INT_FLAG, NULL, "loss on held-out data every N steps and at the end (a --data file keeps its last 10 % for it; 0 = off)"));
    add(&t, row("output", "--sample", "N", FLAG_INT, &a->sample, 0, 1048576, NULL, "generate N bytes at the end (needs --vocab 256; 0 = off)"));
    add(&t, row("output", "--temperature", "X", FLAG_FLOAT, &a->temperature, 1e-3, 100, NULL, "--sample: logits / X before the softmax (below 1: surer)"));
    add(&t, row("output", "--top-k", "K", FLAG_INT, &a->top_k, 0, 256, NULL, "--sample: draw from the K most likely bytes only (0 = all)"));
    add(&t, row("output", "--sample-seed", "N", FLAG_INT, &a->sample_seed, 0, 2147483647.0, NULL, "--sample: the seed of the draws"));
    add(&t, row("output", "--generate", NULL, FLAG_BOOL, &a->generate, 0, 1, NULL, "sample --sample N bytes (default 200) from --resume or --load-weights without training (chapter 00)"));
    for (int i = 0; i < nextra; i++) {
        const FlagSpec *e = &extra[i];
        LAB_CHECK(e->name && strncmp(e->name, "--", 2) == 0, "chapter flag %d: name '%s' must start with --",
                  i, e->name ? e->name : "(null)");
        LAB_CHECK(e->ptr != NULL, "chapter flag %s has no ptr", e->name);
        LAB_CHECK(e->kind != FLAG_CHOICE || e->choices, "chapter flag %s: a choice needs choices", e->name);
        for (int j = 0; j < t.n; j++)
            LAB_CHECK(strcmp(out[j].s.name, e->name) != 0, "chapter flag %s is defined twice", e->name);
        const char *mv = e->kind == FLAG_INT ? "N" : e->kind == FLAG_FLOAT ? "X"
                       : e->kind == FLAG_BOOL ? NULL : e->kind == FLAG_CHOICE ? "C" : "S";
        Flag f = {"chapter", 0, 1, mv, FILE_NONE, *e};
        add(&t, f);
    }
    for (int i = 0; i < t.n; i++) out[i].taken = out[i].mask == 0 || (out[i].mask & groups) != 0;
    return t;
}

// ---- messages -------------------------------------------------------------------------------

// This process's rank: from MPI once it is up, else from the launcher's environment, so that
// an error or --help before dist_init still prints once under mpirun.
static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : fallback;
}
static int flags_rank(int *world) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) {
        int r;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, world);
        return r;
    }
    *world = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
    return env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", 0));
}

// Every rank parses the same argv and finds the same error: rank 0 prints it, all end.
LAB_NORETURN LAB_PRINTF(1, 2) static void flag_fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int up = 0;
    MPI_Initialized(&up);
    if (!up) {  // before dist_init: take the rank from the launcher so only rank 0 prints
        lab_log_rank = flags_rank(&lab_log_world);
    }
    lab_fail_collective("%s", msg);
}

// 1000000 rather than 1e+06; 0.001 stays 0.001.
static void format_number(char *buf, size_t n, double x) {
    if (x == floor(x) && fabs(x) < 1e15) snprintf(buf, n, "%.0f", x);
    else snprintf(buf, n, "%g", x);
}

// "[0, 100]", "cpu|cuda", ... (what --help prints in its "valid" column)
static void describe_valid(const Flag *f, char *buf, size_t n) {
    switch (f->s.kind) {
    case FLAG_INT: snprintf(buf, n, "[%.0f, %.0f]", f->s.min, f->s.max); break;
    case FLAG_FLOAT: {
        char lo[32], hi[32];
        format_number(lo, sizeof(lo), f->s.min);
        format_number(hi, sizeof(hi), f->s.max);
        snprintf(buf, n, "[%s, %s]", lo, hi);
        break;
    }
    case FLAG_CHOICE: snprintf(buf, n, "%s", f->s.choices); break;
    case FLAG_BOOL: snprintf(buf, n, "switch"); break;
    case FLAG_STRING:
        snprintf(buf, n, "%s", f->file == FILE_IN ? "existing file"
                               : f->file == FILE_OUT ? "writable path"
                               : f->metavar && strcmp(f->metavar, "FILE") == 0 ? "path" : "text");
        break;
    }
}

static void describe_default(const Flag *f, char *buf, size_t n) {
    if (!f->s.ptr) { snprintf(buf, n, "-"); return; }
    switch (f->s.kind) {
    case FLAG_INT: {   // below its range: "not given" (the help line says what that means)
        const int v = *(const int *)f->s.ptr;
        if (v < f->s.min) snprintf(buf, n, "-");
        else snprintf(buf, n, "%d", v);
        break;
    }
    case FLAG_FLOAT: snprintf(buf, n, "%g", (double)*(const float *)f->s.ptr); break;
    case FLAG_BOOL: snprintf(buf, n, "%s", *(const int *)f->s.ptr ? "on" : "off"); break;
    case FLAG_STRING:
    case FLAG_CHOICE: {
        const char *s = *(const char *const *)f->s.ptr;
        snprintf(buf, n, "%s", s ? s : "-");
        break;
    }
    }
}

// Edit distance between two short strings, for "did you mean".
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 1000;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

LAB_NORETURN static void fail_unknown(const char *name, const Flag *flags, int nflags) {
    const char *best = NULL;
    int best_d = 1000;
    for (int i = 0; i < nflags; i++) {
        if (!flags[i].taken) continue;
        int dist = edit_distance(name, flags[i].s.name);
        if (dist < best_d) { best_d = dist; best = flags[i].s.name; }
    }
    // Close enough to be a typo: a couple of edits, and not a rewrite of the whole name.
    int len = (int)strlen(name) - 2;
    if (best && best_d < len && best_d <= (len > 6 ? len / 3 : 2))
        flag_fail("unknown flag %s (did you mean %s?); run with --help to list every flag", name, best);
    flag_fail("unknown flag %s; run with --help to list every flag", name);
}

// ---- files ----------------------------------------------------------------------------------

// A file to read: a regular file, checked with stat() BEFORE any open, since opening a FIFO
// blocks until a writer comes (the run would hang in flag parsing).
static void check_input_file(const char *name, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        flag_fail("%s %s: cannot use this file: %s", name, path, strerror(errno));
    if (S_ISDIR(st.st_mode) && strcmp(name, "--resume") == 0 && ckpt_is_sharded(path)) return;
    if (S_ISDIR(st.st_mode))
        flag_fail("%s %s: is a directory, expected a file", name, path);
    if (!S_ISREG(st.st_mode))
        flag_fail("%s %s: is not a regular file (a FIFO, socket or device); valid: a regular file",
                  name, path);
    FILE *fp = fopen(path, "rb");
    if (!fp) flag_fail("%s %s: cannot read this file: %s", name, path, strerror(errno));
    fclose(fp);
}

// The directory a path is in: "." for a bare name, "/" for "/name".
static void dir_of(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, n, ".");
    else if (slash == path) snprintf(dir, n, "/");
    else snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

// A file to write at the end of the run (or every --save-every steps): its directory must exist
// and be writable now, so that a typo is found before the training, not after it, and the path
// must be a regular file or nothing yet (the writer renames "<path>.tmp" over it: a FIFO or a
// device there would be replaced by a regular file).
static void check_output_path(const char *name, const char *path) {
    struct stat st, lst;
    // a link to a directory: a sharded checkpoint's (check_combinations wants --save-sharded)
    int link_to_dir = lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) && ckpt_is_sharded(path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && !(strcmp(name, "--save") == 0 && link_to_dir))
        flag_fail("%s %s: is a directory; valid: a file path in a writable directory%s", name, path,
                  strcmp(name, "--save") == 0 ? " (--save-sharded writes <path>.step-N/ and links "
                  "<path> to it)" : "");
    if (link_to_dir) return;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        flag_fail("%s %s: is %s, which the output would replace; valid: a regular file or a path "
                  "that does not exist yet", name, path, S_ISFIFO(st.st_mode) ? "a FIFO"
                  : S_ISSOCK(st.st_mode) ? "a socket" : "a device");
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    if (stat(dir, &st) != 0)
        flag_fail("%s %s: the directory %s does not exist (%s); create it or pick another path",
                  name, path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        flag_fail("%s %s: %s is not a directory; valid: a file path in a writable directory", name,
                  path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        flag_fail("%s %s: cannot write in the directory %s (%s); pick a writable directory", name,
                  path, dir, strerror(errno));
}

// ---- every file of the run together ----------------------------------------------------------

// What identifies the file a path names, after links: "dev:ino" when it exists, else the real
// path of its directory and its name (a file not yet there is named by where it will be).
static void file_key(const char *path, char *key, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0) {
        snprintf(key, n, "ino %llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
        return;
    }
    char dir[4096], real[PATH_MAX];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    dir_of(path, dir, sizeof dir);
    if (!realpath(dir, real)) snprintf(real, sizeof real, "%s", dir);
    snprintf(key, n, "path %s/%s", real, base);
}

// A file flag the command line gave: the flag, its path, in or out, and the path's tmp.
typedef struct GivenFile {
    const char *name, *path;
    int file;
    char key[4200], tmp_key[4200];  // the file, and "<path>.tmp" that an output is written through
} GivenFile;

// The runtime writes every output through "<path>.tmp" (ckpt.c, results.c, trace.c): created,
// then renamed over <path>. Created and removed here, before step 1, so that a directory that
// exists but takes no files (/proc, /sys, a read-only mount, where root's access() says yes)
// is refused now, not at the first save. Rank 0 writes the outputs, so rank 0 tries. A tmp
// already there (left by a killed save) is left for the save to replace.
static void probe_output(const char *name, const char *path) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    struct stat st;
    if (lstat(tmp, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            flag_fail("%s %s: it is written through %s, which exists and is not a regular file; "
                      "remove it or pick another path", name, path, tmp);
        return;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        int err = errno;
        char dir[4096];
        dir_of(path, dir, sizeof dir);
        flag_fail("%s %s: cannot create %s, the temporary file it is written through: %s (the "
                  "directory %s exists but does not take new files); pick another directory",
                  name, path, tmp, strerror(err), dir);
    }
    close(fd);
    if (unlink(tmp) != 0)
        flag_fail("%s %s: created %s but cannot remove it (%s); pick another directory", name,
                  path, tmp, strerror(errno));
}

// Every output differs from every input and from every other output, its tmp included (a save
// removes a stale "<path>.tmp"). One pair is allowed: --resume F --save F continues the state
// it read (the load is done before the first save, and each save replaces F whole).
static void check_files(const Flag *flags, int n) {
    GivenFile *g = lab_xcalloc((size_t)n, sizeof(GivenFile));
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (flags[i].file == FILE_NONE || !*(const char *const *)flags[i].s.ptr) continue;
        GivenFile *x = &g[k++];
        x->name = flags[i].s.name;
        x->path = *(const char *const *)flags[i].s.ptr;
        x->file = flags[i].file;
        file_key(x->path, x->key, sizeof x->key);
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", x->path);
        file_key(tmp, x->tmp_key, sizeof x->tmp_key);
    }
    for (int i = 0; i < k; i++) {
        if (g[i].file != FILE_OUT) continue;
        for (int j = 0; j < k; j++) {
            if (j == i) continue;
            const GivenFile *o = &g[i], *x = &g[j];
            int continues = strcmp(o->name, "--save") == 0 && strcmp(x->name, "--resume") == 0;
            if (strcmp(o->key, x->key) == 0 && !continues) {
                if (x->file == FILE_IN)
                    flag_fail("%s %s and %s %s are the same file: writing %s would destroy the "
                              "input; give %s another path", o->name, o->path, x->name, x->path,
                              o->name, o->name);
                if (j < i)  // each pair of outputs said once
                    flag_fail("%s %s and %s %s are the same file: one output would overwrite the "
                              "other; give each its own path", x->name, x->path, o->name, o->path);
            }
            if (strcmp(o->tmp_key, x->key) == 0)
                flag_fail("%s %s is written through %s.tmp, which is the file of %s %s: the write "
                          "would destroy it; give %s another path", o->name, o->path, o->path,
                          x->name, x->path, o->name);
        }
    }
    int world = 1;
    if (flags_rank(&world) == 0)
        for (int i = 0; i < k; i++)
            if (g[i].file == FILE_OUT) probe_output(g[i].name, g[i].path);
    free(g);
}

// ---- values ---------------------------------------------------------------------------------

static void set_value(const Flag *f, const char *value) {
    const char *name = f->s.name;
    char valid[160];
    describe_valid(f, valid, sizeof(valid));
    switch (f->s.kind) {
    case FLAG_INT: {
        char *end = NULL;
        errno = 0;
        long x = (*value && !isspace((unsigned char)*value)) ? strtol(value, &end, 10) : 0;
        if (!end || end == value || *end != '\0')
            flag_fail("%s '%s' is not an integer; valid: an integer in %s", name, value, valid);
        if (errno == ERANGE || (double)x < f->s.min || (double)x > f->s.max)
            flag_fail("%s %s is out of range; valid range: %s", name, value, valid);
        *(int *)f->s.ptr = (int)x;
        break;
    }
    case FLAG_FLOAT: {
        char *end = NULL;
        errno = 0;
        double x = (*value && !isspace((unsigned char)*value)) ? strtod(value, &end) : 0.0;
        if (!end || end == value || *end != '\0')
            flag_fail("%s '%s' is not a number; valid: a number in %s", name, value, valid);
        if (isnan(x) || (isinf(x) && errno != ERANGE))  // "nan", "inf" written as such
            flag_fail("%s '%s' is not a finite number; valid: a number in %s", name, value, valid);
        // Beyond fp32 (1e999, 1e39), or so close to 0 that fp32 loses it (1e-320 is 0, 1e-40 a
        // denormal): out of the range the float can hold, said with the range the flag takes.
        if ((errno == ERANGE && fabs(x) > 1.0) || fabs(x) > FLT_MAX)
            flag_fail("%s %s is out of range (beyond the largest fp32, %g); valid range: %s", name,
                      value, (double)FLT_MAX, valid);
        if (x != 0.0 ? fabs(x) < FLT_MIN : errno == ERANGE)
            flag_fail("%s %s is out of range (nonzero values below %g underflow in fp32); valid "
                      "range: %s, either 0 or at least %g", name, value, (double)FLT_MIN, valid,
                      (double)FLT_MIN);
        if (x < f->s.min || x > f->s.max)
            flag_fail("%s %s is out of range; valid range: %s", name, value, valid);
        *(float *)f->s.ptr = (float)x;
        break;
    }
    case FLAG_CHOICE: {
        const char *c = f->s.choices;
        size_t len = strlen(value);
        while (*c) {
            const char *bar = strchr(c, '|');
            size_t clen = bar ? (size_t)(bar - c) : strlen(c);
            if (clen == len && strncmp(c, value, len) == 0) {
                *(const char **)f->s.ptr = value;
                return;
            }
            c += clen + (bar ? 1 : 0);
        }
        flag_fail("%s '%s' is not a valid choice; valid choices: %s", name, value, f->s.choices);
    }
    case FLAG_STRING: {
        if (!*value) flag_fail("%s needs a non-empty value", name);
        if (f->file == FILE_IN && !(strcmp(name, "--data") == 0 && strcmp(value, "text") == 0))
            check_input_file(name, value);  // (--data text: the corpus, not a file)
        if (f->file == FILE_OUT) check_output_path(name, value);
        *(const char **)f->s.ptr = value;
        break;
    }
    case FLAG_BOOL:
        *(int *)f->s.ptr = 1;
        break;
    }
}

// ---- help -----------------------------------------------------------------------------------

void lab_print_flags_for(unsigned groups, FILE *out, const LabArgs *a, const FlagSpec *extra,
                         int nextra) {
    LabArgs copy = *a;  // the table points into it; values are only read here
    Table t = build_table(&copy, extra, nextra, groups);
    const Flag *flags = t.rows;
    // Column widths: flag (with metavar), default, valid.
    char def[128], valid[160], left[96];
    int wl = 4, wd = 7, wv = 5;
    for (int i = 0; i < t.n; i++) {
        if (!flags[i].taken) continue;
        snprintf(left, sizeof(left), "%s%s%s", flags[i].s.name, flags[i].metavar ? " " : "",
                 flags[i].metavar ? flags[i].metavar : "");
        describe_default(&flags[i], def, sizeof(def));
        describe_valid(&flags[i], valid, sizeof(valid));
        if ((int)strlen(left) > wl) wl = (int)strlen(left);
        if ((int)strlen(def) > wd) wd = (int)strlen(def);
        if ((int)strlen(valid) > wv) wv = (int)strlen(valid);
    }
    fprintf(out, "  %-*s  %-*s  %-*s  %s\n", wl, "flag", wd, "default", wv, "valid", "meaning");
    for (int g = 0; g < NGROUPS; g++) {
        int printed = 0;
        for (int i = 0; i < t.n; i++) {
            if (!flags[i].taken || strcmp(flags[i].group, GROUPS[g]) != 0) continue;
            if (!printed) fprintf(out, "%s\n", GROUPS[g]);
            printed = 1;
            snprintf(left, sizeof(left), "%s%s%s", flags[i].s.name, flags[i].metavar ? " " : "",
                     flags[i].metavar ? flags[i].metavar : "");
            describe_default(&flags[i], def, sizeof(def));
            describe_valid(&flags[i], valid, sizeof(valid));
            fprintf(out, "  %-*s  %-*s  %-*s  %s\n", wl, left, wd, def, wv, valid,
                    flags[i].s.help ? flags[i].s.help : "");
        }
    }
    free(t.rows);
}

LAB_NORETURN static void print_help_and_exit(unsigned groups, const LabArgs *a,
                                             const FlagSpec *extra, int nextra,
                                             const char *program, const char *usage) {
    int world = 1;
    if (flags_rank(&world) == 0) {
        if (usage && *usage) printf("%s%s", usage, usage[strlen(usage) - 1] == '\n' ? "" : "\n");
        else printf("%s\n", program ? program : "");
        printf("\nflags (--flag VALUE or --flag=VALUE):\n");
        lab_print_flags_for(groups, stdout, a, extra, nextra);
    }
    fflush(stdout);
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Finalize();
    exit(0);
}

// ---- parsing --------------------------------------------------------------------------------

// A shared flag of a group this program does not take: it would have no effect.
LAB_NORETURN static void fail_not_taken(const Flag *f, const char *program) {
    char prog[128];
    // "01_primitives: the communication primitives" -> "01_primitives"
    snprintf(prog, sizeof prog, "%s", program && *program ? program : "this program");
    prog[strcspn(prog, ": ")] = '\0';
    if (f->mask == LAB_FLAGS_KILL)
        flag_fail("%s: %s runs on one rank and takes no --kill-rank/--kill-step/--inject-hang (no "
                  "other rank would notice); run with --help to list its flags", f->s.name, prog);
    if (f->mask & LAB_FLAGS_COMM)
        flag_fail("%s: %s runs on one rank, which never waits for another: it has no collective "
                  "watchdog; run with --help to list its flags", f->s.name, prog);
    if (f->mask == LAB_FLAGS_RECOMPUTE)
        flag_fail("%s: %s does not recompute activations; it is offered by 00_memory_budget "
                  "--train, 07_tensor_parallel, 08_pipeline and 09_3d (fp32); run with --help to "
                  "list its flags", f->s.name, prog);
    flag_fail("%s: %s takes no %s flags (it would have no effect here); run with --help to list "
              "its flags", f->s.name, prog, f->group);
}

// --device cuda needs a CUDA build and a visible GPU: said here, once, as the user's mistake,
// before anything tries to allocate on a device that is not there.
static void check_cuda_visible(void) {
#ifdef LAB_CUDA
    char why[256];
    if (lab_cuda_visible(why, sizeof why) == 0)
        flag_fail("--device cuda: no CUDA GPU is visible (%s); use --device cpu", why);
#else
    flag_fail("--device cuda needs a CUDA build: rebuild with `make CUDA=1` on a machine with "
              "nvcc, or use --device cpu");
#endif
}

// A --data file shorter than one sequence (T inputs + 1 target) cannot give a single row.
static void check_data_length(const char *path, int T) {
    struct stat st;
    if (stat(path, &st) == 0 && (long long)st.st_size < (long long)T + 1)
        flag_fail("--data %s has %lld bytes; a sequence of --seq %d needs at least %d (T inputs "
                  "and the next byte as target); use a longer file or a smaller --seq", path,
                  (long long)st.st_size, T, T + 1);
}

// What this run's flags say about its trajectory (ckpt.h, RunIdentity); the --data file's CRC
// only when a state is resumed or saved (a run that does neither reads it once, not twice).
static RunIdentity run_identity(const LabArgs *a) {
    RunIdentity id = {.steps = a->steps, .warmup = a->warmup, .batch = a->batch,
                      .seed = (uint64_t)a->seed, .data_seed = (uint64_t)a->data_seed, .lr = a->lr,
                      .weight_decay = a->weight_decay, .grad_clip = a->grad_clip,
                      .has_data = a->data != NULL};
    if (a->data) {
        snprintf(id.data, sizeof id.data, "%s", a->data);
        char why[256];
        if ((a->resume || a->save) && !lab_args_corpus(a) &&
            ckpt_file_crc(a->data, &id.data_size, &id.data_crc, why, sizeof why) != 0)
            flag_fail("--data %s: %s", a->data, why);
    }
    return id;
}

// Is `name` in the comma-separated --allow-changed list ("all" names every field)?
static int allowed(const char *list, const char *name) {
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if ((len == strlen(name) && strncmp(p, name, len) == 0) || (len == 3 && !strncmp(p, "all", 3)))
            return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

// --allow-changed names known fields, and only with --resume (else it would do nothing).
static void check_allow_list(const LabArgs *a) {
    if (!a->allow_changed) return;
    if (!a->resume)
        flag_fail("--allow-changed %s: only a --resume can change a run; give --resume FILE or "
                  "drop it", a->allow_changed);
    static const char *names[] = {"data", "data-seed", "steps", "lr", "warmup", "weight-decay",
                                  "grad-clip", "batch", "seed", "all"};
    for (const char *p = a->allow_changed; *p;) {
        size_t len = strcspn(p, ","), k = 0;
        while (k < sizeof names / sizeof names[0] &&
               !(strlen(names[k]) == len && strncmp(p, names[k], len) == 0)) k++;
        if (k == sizeof names / sizeof names[0])
            flag_fail("--allow-changed %s: unknown field '%.*s'; valid: %s, or all (comma-"
                      "separated)", a->allow_changed, (int)len, p, RUN_IDENTITY_FIELDS);
        p += len + (p[len] == ',');
    }
}

// The state's run against this one: a change of data, data seed, --steps or a hyperparameter
// trains something else than the state's run would have, silently. Refused, every change named
// with its old and new value, unless --allow-changed names it; what it allowed is said.
static void check_identity(const LabArgs *a, const RunIdentity *now) {
    RunIdentity was;
    char why[512], lines[16][160];
    const char *names[16];
    int world = 1, rank = flags_rank(&world);
    int has = ckpt_state_identity(a->resume, &was, why, sizeof why);
    if (has < 0) flag_fail("--resume %s: %s", a->resume, why);
    if (has == 0) {
        if (rank == 0)
            fprintf(stderr, "note: --resume %s: a state of format 1 records no data, --steps or "
                    "hyperparameters; they are not checked\n", a->resume);
        return;
    }
    int k = ckpt_identity_diff(&was, now, lines, names, 16);
    char msg[3072];
    int len = 0, refused = 0;
    for (int i = 0; i < k; i++)
        if (!allowed(a->allow_changed, names[i])) {
            len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s", refused ? "; " : "", lines[i]);
            if (len >= (int)sizeof msg) len = (int)sizeof msg - 1;
            refused++;
        }
    if (refused) {
        char fields[256];
        int fl = 0;
        for (int i = 0; i < k; i++)
            if (!allowed(a->allow_changed, names[i]))
                fl += snprintf(fields + fl, sizeof fields - (size_t)fl, "%s%s", fl ? "," : "", names[i]);
        flag_fail("--resume %s: this run differs from the state's in %d field%s, so it would train "
                  "something else: %s. Resume with the state's values, or pass --allow-changed "
                  "%s (or all) to continue anyway", a->resume, refused, refused > 1 ? "s" : "",
                  msg, fields);
    }
    for (int i = 0; i < k && rank == 0; i++)
        fprintf(stderr, "note: --allow-changed: %s accepted\n", lines[i]);
}

// A state to resume must have steps left to run (else the run does nothing and rewrites the
// file under a wrong label), and the fault flags must come after it.
static void check_resume(const LabArgs *a, int end, const RunIdentity *now) {
    int step = 0, total = 0;
    char why[512];
    if (ckpt_state_peek(a->resume, &step, &total, why, sizeof why) != 0)
        flag_fail("--resume %s: %s", a->resume, why);
    // a state of another model is refused by the load, naming the field that differs; its
    // hyperparameters are not this model's to compare
    GPT2Config was, want = lab_args_config(a);
    if (ckpt_state_config(a->resume, &was, why, sizeof why) != 0)
        flag_fail("--resume %s: %s", a->resume, why);
    if (memcmp(&was, &want, sizeof was) == 0) check_identity(a, now);
    if (step >= a->steps)
        flag_fail("--resume %s: the state is at step %d, --steps %d: nothing to do; pass "
                  "--steps > %d%s", a->resume, step, a->steps, step,
                  total == step ? " and --allow-changed steps (its run ended there)" : "");
    if (end <= step)
        flag_fail("--resume %s: the state is at step %d, --stop-at %d: nothing to do; pass "
                  "--stop-at > %d (or -1)", a->resume, step, end, step);
    if (a->kill_step >= 0 && a->kill_step < step)
        flag_fail("--kill-step %d: the run resumes after step %d, so rank %d would never be "
                  "killed; valid: %d .. %d", a->kill_step, step, a->kill_rank, step, end - 1);
    if (a->inject_nan_step >= 0 && a->inject_nan_step < step)
        flag_fail("--inject-nan-step %d: the run resumes after step %d, so no NaN would be "
                  "injected; valid: %d .. %d", a->inject_nan_step + 1, step, step + 1, end);
    if (a->hang_step >= 0 && a->hang_step < step)
        flag_fail("--inject-hang %s: the run resumes after step %d, so no rank would hang; valid "
                  "steps: %d .. %d", a->inject_hang, step, step + 1, end);
    if (a->inject_spike_step >= 0 && a->inject_spike_step < step)
        flag_fail("--inject-spike-step %d: the run resumes after step %d, so no batch would be "
                  "corrupted; valid: %d .. %d", a->inject_spike_step + 1, step, step + 1, end);
    if (a->oom_step >= 0 && a->oom_step < step)
        flag_fail("--inject-oom-step %s: the run resumes after step %d, so no allocation would "
                  "fail; valid steps: %d .. %d", a->inject_oom, step, step + 1, end);
}

static int world_size_now(void) {
    int world = 1;
    flags_rank(&world);
    return world;
}

// --inject-hang R:S[:X] into hang_rank, hang_step (the index: S - 1), hang_seconds (0: forever).
static void check_inject_hang(LabArgs *a, int world) {
    if (!a->inject_hang) return;
    const char *v = a->inject_hang;
    int r = -1, step = -1, used = 0;
    double x = 0;
    char rest[2] = "";
    int k = sscanf(v, "%d:%d%n", &r, &step, &used);
    if (k == 2 && v[used] == ':' && (sscanf(v + used + 1, "%lf%1s", &x, rest) != 1 || !(x > 0) || x > 1e6))
        k = 0;
    else if (k == 2 && v[used] != ':' && v[used] != '\0')
        k = 0;
    if (k != 2)
        flag_fail("--inject-hang %s: expected RANK:STEP or RANK:STEP:SECONDS (e.g. 1:3, rank 1 stops at "
                  "the start of step 3; 1:3:0.5, it sleeps 0.5 s there)", v);
    const int end = lab_args_end_step(a);
    if (r < 0 || r >= world)
        flag_fail("--inject-hang %s: this job has %d rank%s; valid ranks: 0 .. %d", v, world,
                  world > 1 ? "s" : "", world - 1);
    if (step < 1 || step > end)
        flag_fail("--inject-hang %s: step %d is not a step of this run; valid: 1 .. %d (counted from 1, "
                  "as the progress lines)", v, step, end);
    if (world < 2 && x == 0)
        flag_fail("--inject-hang %s: on one rank no other rank waits for the hung one, so the run would "
                  "hang forever; run on 2 ranks or more, or give RANK:STEP:SECONDS (a slow rank)", v);
    a->hang_rank = r;
    a->hang_step = step - 1;
    a->hang_seconds = (float)x;
}

// The production flags (notes 10.8; session.h runs them). The fault steps count from 1, as the
// progress lines (the fields hold indices); a fault at a step this run never reaches, or on a
// rank it does not have, would silently do nothing: refused. A rollback needs a checkpoint to go
// back to, and the rollback's own flags do nothing without one.
static void check_production(LabArgs *a) {
    const int end = lab_args_end_step(a);
    if (a->inject_spike_step == 0 || a->inject_spike_step > end)
        flag_fail("--inject-spike-step %d: %s; valid: 1 .. %d, or -1 (off)", a->inject_spike_step,
                  a->inject_spike_step == 0 ? "steps count from 1 (as the progress lines print them)"
                                            : "this run has fewer steps, so no batch would be corrupted",
                  end);
    if (a->inject_spike_step > 0) a->inject_spike_step--;
    if (a->inject_oom) {
        int world = 1, rank = 0, step = 0, used = 0;
        flags_rank(&world);
        const char *v = a->inject_oom;
        int ok = strchr(v, ':') ? sscanf(v, "%d:%d%n", &rank, &step, &used) == 2
                                : sscanf(v, "%d%n", &step, &used) == 1;
        if (!ok || v[used] != '\0' || rank < 0 || rank >= world || step < 1 || step > end)
            flag_fail("--inject-oom-step %s: expected RANK:STEP (or STEP, on rank 0), a rank of this "
                      "job (0 .. %d) and a step of this run, counted from 1 (1 .. %d)", v,
                      world - 1, end);
        a->oom_rank = rank;
        a->oom_step = step - 1;
    }
    if (strcmp(a->on_spike, "rollback") == 0 && (!a->save || a->save_every <= 0))
        flag_fail("--on-spike rollback goes back to the last checkpoint, so it needs them: add "
                  "--save FILE --save-every N (a checkpoint every N steps)");
    if (strcmp(a->on_spike, "rollback") != 0 && (a->rollback_lr_scale != 1.0f || a->rollback_skip != 1))
        flag_fail("--rollback-lr-scale and --rollback-skip act only after a rollback: add "
                  "--on-spike rollback (got --on-spike %s)", a->on_spike);
}

// --async-save, --save-sharded, --keep-last, --save-every-min: all about --save's checkpoints.
static void check_ckpt_policy(const LabArgs *a) {
    const char *which = a->async_save ? "--async-save" : a->save_sharded ? "--save-sharded"
                        : a->keep_last ? "--keep-last" : a->save_every_min > 0 ? "--save-every-min"
                        : NULL;
    if (which && !a->save)
        flag_fail("%s acts on the checkpoints of --save: add --save %s", which,
                  a->save_sharded ? "DIR" : "FILE");
    struct stat lst;
    if (a->save && !a->save_sharded && lstat(a->save, &lst) == 0 && S_ISLNK(lst.st_mode) &&
        ckpt_is_sharded(a->save))
        flag_fail("--save %s is a sharded checkpoint (a directory): add --save-sharded, or give "
                  "another path", a->save);
}

// --val-every, --sample and its knobs, --generate (common/text.h).
static void check_text(LabArgs *a) {
    if (a->sample > 0 && a->V != 256)
        flag_fail("--sample %d generates bytes, so it needs --vocab 256 (got --vocab %d)",
                  a->sample, a->V);
    if (a->sample == 0 && !a->generate &&
        (a->temperature != 1.0f || a->top_k != 0 || a->sample_seed != 1))
        flag_fail("--temperature, --top-k and --sample-seed shape a sample: add --sample N (or "
                  "--generate)");
    if (!a->generate) return;
    if (a->sample == 0) a->sample = 200;
    if (a->V != 256)
        flag_fail("--generate samples bytes, so it needs --vocab 256 (got --vocab %d)", a->V);
    const char *path = a->resume ? a->resume : a->load_weights;
    if (!path)
        flag_fail("--generate samples from saved weights: give --resume STATE (a --save file) or "
                  "--load-weights FILE (a --save-weights file)");
    GPT2Config have, want = lab_args_config(a);
    char why[512];
    int rc = a->resume ? ckpt_state_config(path, &have, why, sizeof why)
                       : ckpt_weights_peek(path, &have, why, sizeof why);
    if (rc != 0) flag_fail("--generate: %s %s: %s", a->resume ? "--resume" : "--load-weights", path, why);
    if (memcmp(&have, &want, sizeof have) != 0)
        flag_fail("--generate: %s holds another model (--vocab %d --seq %d --layers %d --channels "
                  "%d --heads %d) than these flags describe (--vocab %d --seq %d --layers %d "
                  "--channels %d --heads %d): give the file's model flags", path, have.V, have.T,
                  have.L, have.C, have.NH, want.V, want.T, want.L, want.C, want.NH);
}

// Checks that involve more than one flag.
static void check_combinations(LabArgs *a, const RunIdentity *now) {
    if (a->C % a->NH != 0) {
        int below = a->NH < a->C ? a->NH : a->C, above = a->NH;  // the nearest divisors of C
        while (a->C % below != 0) below--;
        while (above < a->C && a->C % above != 0) above++;
        if (above > a->C) above = below;
        char alt[32] = "";
        if (above != below) snprintf(alt, sizeof(alt), " or --heads %d", above);
        flag_fail("--channels %d is not divisible by --heads %d: each head gets C/NH channels; "
                  "e.g. --heads %d%s", a->C, a->NH, below, alt);
    }
    if (a->data && a->V != 256)
        flag_fail("--data %s is read as bytes, so --vocab must be 256 (got %d)", a->data, a->V);
    if (strcmp(a->device, "cuda") == 0) check_cuda_visible();
    if (strcmp(a->backend, "nccl") == 0 && strcmp(a->device, "cuda") != 0)
        flag_fail("--backend nccl needs --device cuda (NCCL moves GPU buffers); use --backend mpi "
                  "with --device %s", a->device);
    if (a->resume && a->load_weights)
        flag_fail("--resume %s and --load-weights %s both set the weights; give only one",
                  a->resume, a->load_weights);
    if (a->save_every > 0 && !a->save)
        flag_fail("--save-every %d needs --save FILE (where to write the checkpoint)", a->save_every);
    check_ckpt_policy(a);
    check_inject_hang(a, world_size_now());
    if ((a->kill_rank >= 0) != (a->kill_step >= 0))
        flag_fail("--kill-rank and --kill-step go together (which rank dies, and when); got "
                  "--kill-rank %d --kill-step %d", a->kill_rank, a->kill_step);
    int world = 1;
    flags_rank(&world);
    if (a->kill_rank >= world)
        flag_fail("--kill-rank %d: this job has %d ranks; valid: 0 .. %d", a->kill_rank, world,
                  world - 1);
    if (a->data && !lab_args_corpus(a)) check_data_length(a->data, a->T);
    check_text(a);
    // Fault flags that name a step this run never reaches would silently do nothing.
    const int end = lab_args_end_step(a);
    char ends[96];
    if (end < a->steps) snprintf(ends, sizeof ends, "--stop-at %d", end);
    else snprintf(ends, sizeof ends, "--steps %d", a->steps);
    if (a->kill_step >= end)
        flag_fail("--kill-step %d: this run ends after %d steps (%s), so rank %d would never be "
                  "killed; valid: 0 .. %d (the kill comes after that many completed steps)",
                  a->kill_step, end, ends, a->kill_rank, end - 1);
    if (a->inject_nan_step >= end)
        flag_fail("--inject-nan-step %d: this run has %d steps (%s), so no NaN would be injected; "
                  "valid: 1 .. %d", a->inject_nan_step + 1, end, ends, end);
    check_allow_list(a);
    if (a->resume && !a->generate) check_resume(a, end, now);
    if (a->load_weights) {  // a damaged file refused now, once, not by each rank at its load
        GPT2Config have;
        char why[512];
        if (ckpt_weights_peek(a->load_weights, &have, why, sizeof why) != 0)
            flag_fail("--load-weights %s: %s", a->load_weights, why);
    }
}

// --links: parsed on every rank alike (a scaled preset uses rank 0's measured peak, so every
// rank holds the same times), then handed to dist (dist_link.c).
static void configure_links(const LabArgs *a, int mpi_up) {
    if (!a->links) return;
    double peak = 0;
    if (strstr(a->links, ":cpu")) {
        int rank = 0;
        if (mpi_up) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == 0) peak = dist_links_cpu_peak();
        if (mpi_up) MPI_Bcast(&peak, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    DistLinks l;
    const char *err = dist_links_parse(a->links, &l, peak);
    if (err) flag_fail("%s", err);
    dist_links_set(&l);
}

void lab_parse_args_for(unsigned groups, int argc, char **argv, LabArgs *a, const FlagSpec *extra,
                        int nextra, const char *program, const char *usage) {
    // --help anywhere wins, so that it works even next to a mistake.
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            print_help_and_exit(groups, a, extra, nextra, program, usage);

    Table t = build_table(a, extra, nextra, groups);
    const Flag *flags = t.rows;
    const int n = t.n;
    const char **given = lab_xcalloc((size_t)n, sizeof(char *));  // the value each flag got
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            flag_fail("unexpected argument '%s': every option is a --flag (run with --help to "
                      "list them)", arg);
        // --name=value or --name value
        char name[256];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof(name)) flag_fail("unknown flag %.*s; run with --help to list every flag", (int)len, arg);
        memcpy(name, arg, len);
        name[len] = '\0';
        const Flag *f = NULL;
        for (int j = 0; j < n && !f; j++)
            if (strcmp(flags[j].s.name, name) == 0) f = &flags[j];
        if (!f) fail_unknown(name, flags, n);
        if (!f->taken) fail_not_taken(f, program);
        // A flag given twice: which one did the user mean? (No flag is repeatable today; the
        // last one winning silently hid a mistake in a long command line.)
        const char *before = given[f - flags];
        if (before && f->s.kind == FLAG_BOOL)
            flag_fail("%s given twice; give it once", name);
        if (before)
            flag_fail("%s given twice (%s %s, then %s %s); give it once", name, name, before, name,
                      eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : "");
        if (f->s.kind == FLAG_BOOL) {
            if (eq) flag_fail("%s is a switch and takes no value (got '%s'); write just %s", name,
                              eq + 1, name);
            set_value(f, "");
            given[f - flags] = "";
            continue;
        }
        const char *value;
        if (eq) {
            value = eq + 1;
        } else {
            // A following "--flag" is not a value: the value was forgotten.
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                char valid[160];
                describe_valid(f, valid, sizeof(valid));
                flag_fail("%s needs a value (%s %s); valid: %s", name, name,
                          f->metavar ? f->metavar : "VALUE", valid);
            }
            value = argv[++i];
        }
        set_value(f, value);
        given[f - flags] = value;
    }
    free(given);
    check_files(flags, n);
    free(t.rows);
    // --inject-nan-step counts steps from 1 like the progress lines; the field is the index.
    if (a->inject_nan_step == 0)
        flag_fail("--inject-nan-step 0: steps count from 1 (as the progress lines print them); "
                  "valid: 1 .. %d, or -1 (off)", lab_args_end_step(a));
    if (a->inject_nan_step > 0) a->inject_nan_step--;
    check_production(a);
    RunIdentity id = run_identity(a);
    check_combinations(a, &id);
    ckpt_set_identity(&id);
    CkptPolicy pol = {.async = a->async_save, .keep_last = a->keep_last, .sharded = a->save_sharded};
    ckpt_set_policy(&pol);
    ckpt_set_command(argc, argv);
    GPT2Config cfg = lab_args_config(a);
    gpt2_config_check(&cfg);
    kernels_set_threads(a->threads);   // BLAS threads of this rank (--threads)
    // the watchdog (collective over the world; every rank parses the same flags here)
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) watchdog_start(a->collective_timeout);
    configure_links(a, up && !down);
}

void lab_parse_args(int argc, char **argv, LabArgs *a, const FlagSpec *extra, int nextra,
                    const char *program, const char *usage) {
    lab_parse_args_for(LAB_FLAGS_ALL, argc, argv, a, extra, nextra, program, usage);
}

// ---- flags that need another ------------------------------------------------------------------

// Does the word `arg` give the flag `name` ("--name" or "--name=V")? (A value never starts with
// "--": the parser took such a word for a forgotten value.)
static int arg_gives(const char *arg, const char *name) {
    const size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

int lab_flag_given(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (arg_gives(argv[i], name)) return 1;
    return 0;
}

const char *lab_shared_flag_given(int argc, char **argv, unsigned groups, const char *const *keep) {
    LabArgs dummy = lab_args_defaults();  // the table's rows point into it; only names are read
    Table t = build_table(&dummy, NULL, 0, LAB_FLAGS_ALL);
    const char *found = NULL;
    for (int i = 1; i < argc && !found; i++)
        for (int j = 0; j < t.n && !found; j++) {
            const Flag *f = &t.rows[j];
            if (!(f->mask & groups) || !arg_gives(argv[i], f->s.name)) continue;
            int kept = 0;
            for (int k = 0; keep && keep[k] && !kept; k++) kept = strcmp(keep[k], f->s.name) == 0;
            if (!kept) found = f->s.name;  // a string literal of the table: outlives it
        }
    free(t.rows);
    return found;
}
