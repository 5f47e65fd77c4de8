// data.h: where tokens come from.
//
// The global batch of step s is a pure function of (seed, s): B sequences of T+1 tokens,
// whatever the number of ranks. A data-parallel rank takes its slice of it (DistributedSampler
// semantics), so a run on N ranks sees exactly the tokens of the single-device run.
//
// Sources:
//   synthetic  an order-1 Markov chain over V tokens: every token has 4 successors, drawn with
//              probabilities 1/2, 1/4, 1/8, 1/8 (which successors: a pure function of the seed).
//              Entropy rate = 1.75 bits = 1.2130 nats per token, so a model that has learned
//              the chain reaches a mean loss of (ln V + (T-1) * 1.2130) / T (the first token
//              of each sequence has no context: uniform, ln V).
//   text file  bytes of a file (V must be 256); sequence b of step s starts at an offset drawn
//              from (seed, s, b). (The --data flag refuses a file with a NUL byte: binary, not
//              text; lab_args_data.)
//   text       `--data text`: the lab's corpus, built from a Debian package (common/text.h).
//
// Validation (--val-every): a byte source keeps its last 10 % apart (data_split_validation:
// the corpus always, a --data file when --val-every asks for it); training draws from the
// first 90 % only. data_val_batch gives the fixed held-out batches, the same in every layout
// (a pure function of their index: no seed, no rank, no step). The synthetic source has no
// end to hold out: its validation rows are rows of steps no run reaches.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct DataSource {
    int V;                   // vocabulary size
    uint64_t seed;
    int is_file;
    const char *path;        // for a file source
    uint8_t *bytes;          // file contents (host)
    size_t nbytes;
    size_t train_bytes;      // file: training reads bytes [0, train_bytes), validation the rest
                             // (data_split_validation); 0: training reads all, no validation
    int succ_count;          // synthetic: successors per token (4)
    int *succ;               // synthetic: (V, succ_count) successor table
    float succ_prob[8];      // synthetic: probability of each successor slot
    int has_spike;           // --inject-spike-step: the batch of step spike_step is corrupted
    uint64_t spike_step;
} DataSource;

// Synthetic Markov source over V tokens (V >= 8).
void data_init_synthetic(DataSource *d, int V, uint64_t seed);
// Byte-level text file; fails with a clear message if missing, unreadable or shorter than T+1.
void data_init_file(DataSource *d, const char *path, int T, uint64_t seed);
void data_free(DataSource *d);

// Entropy rate in nats per token (synthetic only; -1 for files) and the loss floor for
// sequences of length T (see above).
double data_entropy_rate(const DataSource *d);
double data_loss_floor(const DataSource *d, int T);

// Global batch of `step`: inputs and targets, each (B, T), targets = inputs shifted by one.
// Only rows [row0, row0 + nrows) are produced (a rank's slice), written at inputs[0..].
// The corrupted batch (data_corrupt_step) is bad data of the kind that makes a loss spike: every
// token id is off by V/2 (mod V), as if the batch were tokenized with the wrong vocabulary (a
// byte file: in the wrong encoding). Still a pure function of (seed, step, row), so the spike is
// the same on every layout.
void data_batch(const DataSource *d, uint64_t step, int B, int T, int row0, int nrows,
                int *inputs, int *targets);

// DistributedSampler slice: rank r of n gets rows [*row0, *row0 + *nrows) of a batch of B.
// Fails with a clear message unless B % n == 0 (every rank must process the same count).
void data_slice(int B, int rank, int n, int *row0, int *nrows);

// Keep the last 10 % of a byte source for validation (training reads the first 90 %). Fails
// with a clear message when either part is shorter than a sequence of T + 1 bytes.
void data_split_validation(DataSource *d, int T);
// Validation batch i (0, 1, ...): B rows of T inputs and targets from the held-out bytes (or,
// synthetic, from steps no run reaches). The same whatever the seed, the layout or the step.
void data_val_batch(const DataSource *d, int i, int B, int T, int *inputs, int *targets);

// splitmix64's finalizer (0x9E3779B97F4A7C15 added first): a bijection of 64-bit words that
// mixes every input bit. The draws of the data and of text sampling (common/text.c) hash with it.
uint64_t data_mix64(uint64_t x);

// Fault injection (--inject-spike-step): corrupt the batch of `step` (see data_batch).
void data_corrupt_step(DataSource *d, uint64_t step);
