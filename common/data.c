// data.c: the token sources of data.h.
//
// Every random choice is a counter-based hash of (seed, step, row, position): no generator
// state is carried from one call to the next. That is what makes the global batch a pure
// function of (seed, step) and lets a rank produce its rows alone, without the others.
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

uint64_t data_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// A hash of four counters. `domain` keeps the successor table and the token draws apart.
static uint64_t hash4(uint64_t domain, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = data_mix64(domain);
    h = data_mix64(h ^ a);
    h = data_mix64(h ^ b);
    return data_mix64(h ^ c);
}

// Uniform double in [0, 1) from the top 53 bits.
static double unit_double(uint64_t h) { return (double)(h >> 11) * (1.0 / 9007199254740992.0); }

enum { DOMAIN_SUCC = 1, DOMAIN_TOKEN = 2, DOMAIN_FIRST = 3, DOMAIN_OFFSET = 4, DOMAIN_VAL = 5 };

void data_init_synthetic(DataSource *d, int V, uint64_t seed) {
    if (V < 8) lab_fail("the synthetic data source needs --vocab >= 8, got %d", V);
    memset(d, 0, sizeof(*d));
    d->V = V;
    d->seed = seed;
    d->succ_count = 4;
    d->succ_prob[0] = 0.5f;
    d->succ_prob[1] = 0.25f;
    d->succ_prob[2] = 0.125f;
    d->succ_prob[3] = 0.125f;
    d->succ = lab_xmalloc((size_t)V * (size_t)d->succ_count * sizeof(int));
    // Successors of token i: distinct tokens drawn uniformly (redraw on a repeat), so each row
    // of the transition matrix has exactly the probabilities of succ_prob.
    for (int i = 0; i < V; i++) {
        int *row = d->succ + (size_t)i * (size_t)d->succ_count;
        uint64_t attempt = 0;
        for (int j = 0; j < d->succ_count; j++) {
            for (;;) {
                int cand = (int)(hash4(DOMAIN_SUCC, seed, (uint64_t)i, attempt++) % (uint64_t)V);
                int repeat = 0;
                for (int q = 0; q < j; q++) repeat |= (row[q] == cand);
                if (!repeat) { row[j] = cand; break; }
            }
        }
    }
}

void data_init_file(DataSource *d, const char *path, int T, uint64_t seed) {
    LAB_CHECK(T >= 1, "sequence length %d", T);
    memset(d, 0, sizeof(*d));
    // Every rank reads the same file and meets the same problem: one message (rank 0's).
    // stat() before fopen(): opening a FIFO would block until a writer comes.
    struct stat st;
    if (stat(path, &st) != 0)
        lab_fail_collective("cannot use the data file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        lab_fail_collective("the data file %s is not a regular file (a directory, FIFO, socket or "
                            "device); --data needs a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) lab_fail_collective("cannot open the data file %s: %s", path, strerror(errno));
    size_t size = (size_t)st.st_size;
    size_t need = (size_t)T + 1;
    if (size < need)
        lab_fail_collective("the data file %s has %zu bytes; a sequence of --seq %d needs at least "
                            "%zu bytes", path, size, T, need);
    d->bytes = lab_xmalloc(size);
    size_t got = fread(d->bytes, 1, size, f);
    if (got != size)
        lab_fail_collective("cannot read the data file %s: got %zu of %zu bytes (%s)", path, got,
                            size, ferror(f) ? strerror(errno) : "file shrank while reading");
    fclose(f);
    d->V = 256;  // byte-level
    d->seed = seed;
    d->is_file = 1;
    d->path = strdup(path);
    d->nbytes = size;
}

void data_free(DataSource *d) {
    free(d->succ);
    free(d->bytes);
    free((void *)d->path);
    memset(d, 0, sizeof(*d));
}

double data_entropy_rate(const DataSource *d) {
    if (d->is_file) return -1.0;
    // Every token has the same distribution over distinct successors, so every row of the
    // transition matrix has the same entropy, and that is the rate whatever the state.
    double h = 0.0;
    for (int j = 0; j < d->succ_count; j++) {
        double p = d->succ_prob[j];
        if (p > 0) h -= p * log(p);
    }
    return h;
}

double data_loss_floor(const DataSource *d, int T) {
    if (d->is_file) return -1.0;
    // Position 0 predicts a token drawn with no context (ln V); the other T-1 follow the chain.
    return (log((double)d->V) + (double)(T - 1) * data_entropy_rate(d)) / (double)T;
}

// Next token of the chain after `prev`, with the uniform draw u in [0, 1).
static int markov_next(const DataSource *d, int prev, double u) {
    const int *row = d->succ + (size_t)prev * (size_t)d->succ_count;
    double cum = 0.0;
    for (int j = 0; j < d->succ_count - 1; j++) {
        cum += d->succ_prob[j];
        if (u < cum) return row[j];
    }
    return row[d->succ_count - 1];
}

// The T+1 tokens of row b of step s (a pure function of seed, s, b).
//   synthetic: x[0] is a uniform "start" token that the chain does not depend on, x[1] is
//              uniform, then x[t+1] follows the chain from x[t]. So the first target has no
//              context (ln V) and the other T-1 targets have the entropy rate: the loss floor.
//   file:      T+1 consecutive bytes from an offset drawn from (seed, s, b).
static void make_row(const DataSource *d, uint64_t step, int b, int T, int *seq) {
    if (d->is_file) {
        LAB_CHECK(d->nbytes >= (size_t)T + 1, "data file %s is shorter than --seq %d + 1", d->path, T);
        size_t n = d->train_bytes ? d->train_bytes : d->nbytes;  // (validation: the rest)
        uint64_t nstarts = (uint64_t)(n - (size_t)T);  // offsets 0 .. n-T-1
        size_t off = (size_t)(hash4(DOMAIN_OFFSET, d->seed, step, (uint64_t)b) % nstarts);
        for (int t = 0; t <= T; t++) seq[t] = d->bytes[off + (size_t)t];
        return;
    }
    uint64_t V = (uint64_t)d->V;
    seq[0] = (int)(hash4(DOMAIN_FIRST, d->seed, step, ((uint64_t)b << 1) | 0) % V);
    if (T >= 1) seq[1] = (int)(hash4(DOMAIN_FIRST, d->seed, step, ((uint64_t)b << 1) | 1) % V);
    uint64_t rowkey = hash4(DOMAIN_TOKEN, d->seed, step, (uint64_t)b);
    for (int t = 1; t < T; t++) {
        double u = unit_double(data_mix64(rowkey ^ (uint64_t)t));
        seq[t + 1] = markov_next(d, seq[t], u);
    }
}

void data_batch(const DataSource *d, uint64_t step, int B, int T, int row0, int nrows,
                int *inputs, int *targets) {
    LAB_CHECK(row0 >= 0 && nrows >= 0 && row0 + nrows <= B,
              "rows [%d, %d) are outside a batch of %d", row0, row0 + nrows, B);
    LAB_CHECK(T >= 1, "sequence length %d", T);
    if (d->is_file && d->nbytes < (size_t)T + 1)
        lab_fail_collective("the data file %s has %zu bytes; --seq %d needs at least %d", d->path,
                            d->nbytes, T, T + 1);
    int *seq = lab_xmalloc(((size_t)T + 1) * sizeof(int));
    const int corrupt = d->has_spike && step == d->spike_step;
    for (int r = 0; r < nrows; r++) {
        make_row(d, step, row0 + r, T, seq);
        // --inject-spike-step: every token id off by V/2 (a batch tokenized with the wrong
        // vocabulary, a file in the wrong encoding): the model's predictions are all wrong
        for (int t = 0; corrupt && t <= T; t++) seq[t] = (seq[t] + d->V / 2) % d->V;
        memcpy(inputs + (size_t)r * (size_t)T, seq, (size_t)T * sizeof(int));
        memcpy(targets + (size_t)r * (size_t)T, seq + 1, (size_t)T * sizeof(int));
    }
    free(seq);
}

void data_split_validation(DataSource *d, int T) {
    if (!d->is_file || d->train_bytes) return;  // synthetic: nothing to hold out; split already
    size_t val = d->nbytes / 10, train = d->nbytes - val;
    if (val < (size_t)T + 1 || train < (size_t)T + 1)
        lab_fail_collective("%s has %zu bytes: too few to keep its last 10 %% (%zu bytes) for "
                            "validation with sequences of --seq %d (each part needs %d bytes); "
                            "use a longer file, a smaller --seq, or no --val-every", d->path,
                            d->nbytes, val, T, T + 1);
    d->train_bytes = train;
}

void data_val_batch(const DataSource *d, int i, int B, int T, int *inputs, int *targets) {
    LAB_CHECK(i >= 0 && B >= 1 && T >= 1, "validation batch %d of %d x %d", i, B, T);
    int *seq = lab_xmalloc(((size_t)T + 1) * sizeof(int));
    for (int b = 0; b < B; b++) {
        if (d->is_file) {
            LAB_CHECK(d->train_bytes, "data_val_batch: %s has no held-out part "
                      "(data_split_validation)", d->path);
            uint64_t nstarts = (uint64_t)(d->nbytes - d->train_bytes - (size_t)T);
            size_t off = d->train_bytes +
                         (size_t)(hash4(DOMAIN_VAL, (uint64_t)i, (uint64_t)b, 0) % nstarts);
            for (int t = 0; t <= T; t++) seq[t] = d->bytes[off + (size_t)t];
        } else {
            make_row(d, (1ull << 63) + (uint64_t)i, b, T, seq);  // a step no run reaches
        }
        memcpy(inputs + (size_t)b * (size_t)T, seq, (size_t)T * sizeof(int));
        memcpy(targets + (size_t)b * (size_t)T, seq + 1, (size_t)T * sizeof(int));
    }
    free(seq);
}

void data_slice(int B, int rank, int n, int *row0, int *nrows) {
    LAB_CHECK(n >= 1 && rank >= 0 && rank < n, "rank %d of %d", rank, n);
    if (B < 1 || B % n != 0) {
        int lower = (B / n) * n;
        if (lower < n) lower = n;
        lab_fail_collective("--batch %d does not split evenly over a data-parallel world size "
                            "of %d ranks (every rank must get the same number of sequences): "
                            "use a multiple of %d, e.g. --batch %d or --batch %d",
                            B, n, n, lower, lower + n);
    }
    *nrows = B / n;
    *row0 = rank * *nrows;
}

void data_corrupt_step(DataSource *d, uint64_t step) {
    d->has_spike = 1;
    d->spike_step = step;
}
