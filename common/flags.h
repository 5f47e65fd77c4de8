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

// The shared flags. Defaults are the tiny config of DESIGN.md.
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
    const char *data;     // NULL: synthetic source; else a byte-level text file
    // hardware
    const char *device;   // "cpu" | "cuda"
    const char *backend;  // "mpi" | "nccl"
    const char *dtype;    // "fp32" | "bf16"
    int threads;          // BLAS threads per rank
    // output
    int log_every;        // print a progress line every N steps (0: only the summary)
    int quiet;
    const char *trace;    // Chrome/Perfetto trace JSON path
    const char *dump;     // results file for the test harness (losses, final params, counters)
    // reliability
    const char *save;     // training-state checkpoint path, written every save_every steps and at the end
    int save_every;
    const char *resume;   // training-state checkpoint to resume from
    const char *load_weights;  // llm.c gpt2_*.bin weights to start from
    const char *save_weights;  // write llm.c gpt2_*.bin weights at the end
    int stop_at;          // stop after this many steps as if interrupted (-1: run all --steps)
    int inject_nan_step;  // fault injection: put a NaN into a gradient at this step (-1: off)
    int kill_rank;        // fault injection: this rank exits abruptly ...
    int kill_step;        // ... at this step (-1: off)
} LabArgs;

LabArgs lab_args_defaults(void);
// What the shared flags describe, as the runtime's own types (so every chapter reads them alike):
GPT2Config lab_args_config(const LabArgs *a);          // --vocab --seq --layers --channels --heads
Device lab_args_device(const LabArgs *a);              // --device
AdamW lab_args_adamw(const LabArgs *a);                // --lr --weight-decay --grad-clip --warmup --steps
void lab_args_data(const LabArgs *a, DataSource *d);   // --data FILE, or the synthetic source
int lab_args_end_step(const LabArgs *a);               // --steps, or --stop-at when earlier

// Parse argv into *a (pre-filled with defaults) and the chapter's extra flags.
// `usage` is the chapter's --help text (what it shows, how to run it). --help prints it, then
// every flag with its default and valid range, on rank 0, and exits 0 on every rank.
void lab_parse_args(int argc, char **argv, LabArgs *a, const FlagSpec *extra, int nextra,
                    const char *program, const char *usage);

// Print the flags as a table (used by --help).
void lab_print_flags(FILE *out, const LabArgs *a, const FlagSpec *extra, int nextra);
