// flags.h: one strict command line for every chapter.
//
// Every chapter gets the shared flags (model, data, training, output, reliability); a chapter
// adds its own with a table of FlagSpec. Parsing is strict: an unknown flag, a missing value,
// a malformed or out-of-range number, or a missing file is an error that names the flag and
// what would be valid, on every rank at once (lab_fail_collective), never silently ignored.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include "data.h"
#include "gpt2.h"
#include "optim.h"

typedef enum { FLAG_INT, FLAG_FLOAT, FLAG_STRING, FLAG_BOOL, FLAG_CHOICE } FlagKind;

typedef struct FlagSpec {
    const char *name;     // "--bucket-mb"
    FlagKind kind;
    void *ptr;            // int*, float*, const char**, int* (bool: 1 when given), const char** (choice)
    double min, max;      // valid range for numbers (inclusive)
    const char *choices;  // FLAG_CHOICE: "cpu|cuda"
    const char *help;     // one line; the default is printed from *ptr
} FlagSpec;

// The shared flags. Defaults are the tiny config (docs/ARCHITECTURE.md, "The model").
typedef struct LabArgs {
    // model
    int V, T, L, C, NH;
    // training
    int batch;            // global batch B (sequences per step, all ranks together)
    int steps;
    float lr, weight_decay, grad_clip;
    int warmup;
    int seed;             // model init seed
    int data_seed;        // data seed
    const char *data;     // NULL: synthetic source; "text": the lab's corpus (common/text.h);
                          // else a byte-level text file
    // hardware
    const char *device;   // "cpu" | "cuda"
    const char *backend;  // "mpi" | "nccl"
    const char *dtype;    // "fp32" | "bf16"
    int threads;          // BLAS threads per rank
    float mem_limit_mib;  // host memory the ranks on this machine may use together (0: MemAvailable;
                          // mem_predict.h refuses a run predicted to need more)
    // output
    int log_every;        // print a progress line every N steps (0: only the summary)
    int quiet;
    const char *trace;    // Chrome/Perfetto trace JSON path
    const char *dump;     // results file for the test harness (losses, final params, counters)
    const char *log;      // one JSON line per step (common/health.h), written by rank 0
    // reliability
    const char *save;     // training-state checkpoint path, written every save_every steps and at the end
    int save_every;
    const char *resume;   // training-state checkpoint to resume from
    const char *allow_changed;  // --resume may change these identity fields ("steps,lr", "all")
    const char *load_weights;  // llm.c gpt2_*.bin weights to start from
    const char *save_weights;  // write llm.c gpt2_*.bin weights at the end
    // checkpoints as the notes' 10.9 (common/ckpt.h: the policy)
    int async_save;       // --async-save: a host snapshot, written by a background thread
    int save_sharded;     // --save-sharded: --save is a directory, each rank writes its part
    int keep_last;        // --keep-last K: "<save>.step-N" files, the newest K kept (0: off)
    float save_every_min; // --save-every-min X: also a checkpoint when X minutes passed (0: off)
    int stop_at;          // stop after this many steps as if interrupted (-1: run all --steps)
    int inject_nan_step;  // fault injection: a NaN into a gradient in the step of this index
                          // (counted from 0; the flag counts from 1 like the progress lines; -1: off)
    int kill_rank;        // fault injection: this rank exits abruptly ...
    int kill_step;        // ... at the start of the step of this index (counted from 0; -1: off)
    // hangs (common/watchdog.h)
    float collective_timeout;  // a rank waiting longer in one dist op ends the job (0: off)
    const char *inject_hang;   // "R:S[:X]": rank R stops without dying at the start of step S
    int hang_rank, hang_step;  // (counted from 1 like the progress lines; the field is the index;
    float hang_seconds;        // -1: off), for X seconds (0: forever)
    // production: NaN/Inf, loss spikes, OOM (the notes' 10.8; session.h runs the policies)
    const char *on_nan;      // "stop" (end the run) | "skip" (skip the step's update, count it)
    const char *on_spike;    // "warn" | "skip" | "rollback" | "stop"
    float spike_z;           // a loss this many standard deviations above the window's mean is a spike
    int spike_window;        // steps the loss's (and the health line's) z-scores look back over
    float rollback_lr_scale; // --on-spike rollback: the lr x this for the steps replayed
    int rollback_skip;       // --on-spike rollback: the steps whose update is skipped, from the spike's
    int inject_spike_step;   // fault: this step's batch is corrupted (index from 0; the flag counts
                             // from 1; -1: off)
    const char *inject_oom;  // fault: "RANK:STEP" or "STEP" (rank 0): an allocation fails there
    int oom_rank, oom_step;  // ... parsed (oom_step: an index from 0; -1: off)
    // activation recomputation (LAB_FLAGS_RECOMPUTE; gpt2.h's GPT2Recompute)
    const char *recompute;   // "none" | "selective" | "full"
    // virtual cluster (dist.h, "Virtual nodes and links"; docs/CLUSTER.md)
    const char *links;       // "G:BW,LAT:BW,LAT" or "PRESET:G[:cpu]"; NULL: off
    // text (common/text.h): validation and sampling, on world rank 0 from the whole model
    int val_every;           // the loss on the held-out batches every N steps and at the end (0: off)
    int sample;              // generate N bytes at the end of the run (0: off)
    float temperature;       // sampling: logits / temperature
    int top_k;               // sampling: only the k most likely bytes (0: all)
    int sample_seed;         // sampling: the seed of the draws
    int generate;            // sample from --resume / --load-weights without training (chapter 00)
} LabArgs;

LabArgs lab_args_defaults(void);
// What the shared flags describe, as the runtime's own types (so every chapter reads them alike):
GPT2Config lab_args_config(const LabArgs *a);          // --vocab --seq --layers --channels --heads
Device lab_args_device(const LabArgs *a);              // --device
AdamW lab_args_adamw(const LabArgs *a);                // --lr --weight-decay --grad-clip --warmup --steps
void lab_args_data(const LabArgs *a, DataSource *d);   // --data FILE, or the synthetic source
                                                       // (--data text: the corpus, common/text.h;
                                                       // --val-every: a file's last 10 % held out)
int lab_args_corpus(const LabArgs *a);                 // --data text (the corpus, not a file)?
                                                       // (--inject-spike-step corrupts a batch)
int lab_args_end_step(const LabArgs *a);               // --steps, or --stop-at when earlier
// --recompute as gpt2.h's mode (none, selective, full; fp32 or bf16).
GPT2Recompute lab_args_recompute(const LabArgs *a);

// The groups of shared flags a program takes. A shared flag of a group it does not take is
// refused with a message naming the program (a flag with no effect must not be accepted
// silently); --help lists only the groups it takes. --help itself is always there.
enum {
    LAB_FLAGS_MODEL = 1 << 0,        // --vocab --seq --layers --channels --heads
    LAB_FLAGS_TRAINING = 1 << 1,     // --batch --steps --lr ... --data
    LAB_FLAGS_HARDWARE = 1 << 2,     // --device --backend --dtype --threads --mem-limit
    LAB_FLAGS_OUTPUT = 1 << 3,       // --log-every --quiet --trace --dump
    LAB_FLAGS_RELIABILITY = 1 << 4,  // --save --save-every --resume --load-weights --save-weights
                                     // --stop-at --inject-nan-step, --on-nan, --on-spike ...,
                                     // --inject-spike-step, --inject-oom-step
    LAB_FLAGS_KILL = 1 << 5,         // --kill-rank --kill-step --inject-hang (a rank dies or
                                     // hangs: multi-rank training programs)
    LAB_FLAGS_COMM = 1 << 6,         // --collective-timeout, --links (ranks that wait for each
                                     // other; also taken with LAB_FLAGS_KILL)
    LAB_FLAGS_NONE = LAB_FLAGS_COMM, // only the program's own flags and --collective-timeout (01,
                                     // 04: nothing to train, but ranks that communicate)
    LAB_FLAGS_ALL = (1 << 7) - 1,    // every shared flag (a multi-rank training chapter)
    LAB_FLAGS_SINGLE = LAB_FLAGS_ALL & ~LAB_FLAGS_KILL & ~LAB_FLAGS_COMM,  // one device (00)
    LAB_FLAGS_RECOMPUTE = 1 << 7,    // --recompute: only the programs whose runs recompute
                                     // (00 --train, 07, 08, 09), not in LAB_FLAGS_ALL
};

// Parse argv into *a (pre-filled with defaults) and the chapter's extra flags; every shared
// group is taken (lab_parse_args_for with LAB_FLAGS_ALL).
// `usage` is the chapter's --help text (what it shows, how to run it). --help prints it, then
// every flag with its default and valid range, on rank 0, and exits 0 on every rank.
// Checked here, before the first step, so that a mistake does not cost a run: no flag is given
// twice (none is repeatable), input files (--data --resume --load-weights) are regular readable
// files (a FIFO would block; a --resume may be a --save-sharded directory, checked whole: its
// manifest and every shard's CRC) and a --resume/--load-weights file is whole (exact size, CRC),
// output paths (--save --save-weights --trace --dump) are regular files or new, each differs
// from every input and every other output after links (--resume F --save F excepted: the run
// continues the state it read), and rank 0 creates and removes the "<path>.tmp" each is written
// through, a --resume state has steps left to run, fault flags name a step and rank of this
// run, --device cuda has a GPU, and a --resume state recorded the same data, data seed, --steps
// and hyperparameters as this run (ckpt.h, RunIdentity), or --allow-changed names each change.
// Sets the process's run identity (ckpt_set_identity) that every saved state records.
void lab_parse_args(int argc, char **argv, LabArgs *a, const FlagSpec *extra, int nextra,
                    const char *program, const char *usage);
// The same, taking only the shared flag groups in `groups` (LAB_FLAGS_*).
void lab_parse_args_for(unsigned groups, int argc, char **argv, LabArgs *a, const FlagSpec *extra,
                        int nextra, const char *program, const char *usage);

// Flags that mean something only next to another (03's --bucket-mb without --no-overlap, 00's
// --steps with --train): the chapter asks whether they were given, and refuses them with
// lab_fail_collective naming what they need, because a flag that does nothing must not be
// accepted silently. Call after lab_parse_args (which has refused malformed command lines).
// Was `name` on the command line ("--name V", "--name=V", or the switch "--name")?
int lab_flag_given(int argc, char **argv, const char *name);
// The first shared flag of `groups` (LAB_FLAGS_*) on the command line that is not one of
// `keep` (NULL-terminated; NULL: none kept), or NULL.
const char *lab_shared_flag_given(int argc, char **argv, unsigned groups, const char *const *keep);

// Print the flags of the shared groups in `groups` (LAB_FLAGS_*) as a table (used by --help).
void lab_print_flags_for(unsigned groups, FILE *out, const LabArgs *a, const FlagSpec *extra,
                         int nextra);
