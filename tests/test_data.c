// test_data.c: the token sources (common/data.c).
//
// What must hold: the global batch of a step is the same whatever the number of ranks, the
// ranks' slices are disjoint and cover it, the synthetic chain really has the entropy rate we
// claim (measured on a long sample, not taken from the code), and file windows stay in the file.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data.h"
#include "harness.h"


// ---- DistributedSampler slices ------------------------------------------------------------------

Test(data, slices_are_disjoint_and_cover_the_batch) {
    int cases[][2] = {{16, 1}, {16, 2}, {16, 4}, {12, 3}, {8, 8}, {30, 5}, {64, 16}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int B = cases[c][0], n = cases[c][1];
        int hits[64] = {0};
        for (int r = 0; r < n; r++) {
            int row0 = -1, nrows = -1;
            data_slice(B, r, n, &row0, &nrows);
            cr_assert_eq(nrows, B / n, "B=%d n=%d rank %d: %d rows, want %d", B, n, r, nrows, B / n);
            cr_assert(row0 >= 0 && row0 + nrows <= B, "B=%d n=%d rank %d: rows [%d,%d)", B, n, r,
                      row0, row0 + nrows);
            for (int i = row0; i < row0 + nrows; i++) hits[i]++;
        }
        for (int i = 0; i < B; i++)
            cr_assert_eq(hits[i], 1, "B=%d n=%d: row %d taken by %d ranks", B, n, i, hits[i]);
    }
}

static void slice_10_over_4(void *arg) {
    (void)arg;
    int row0, nrows;
    data_slice(10, 1, 4, &row0, &nrows);
}

Test(data, uneven_batch_is_refused_with_valid_sizes) {
    const char *msg = harness_expect_fail(slice_10_over_4, NULL);
    cr_assert(msg, "a batch of 10 over 4 ranks was accepted");
    cr_assert(strstr(msg, "--batch 10"), "message does not name --batch 10: %s", msg);
    cr_assert(strstr(msg, "4 ranks"), "message does not name the world size: %s", msg);
    cr_assert(strstr(msg, "--batch 8") && strstr(msg, "--batch 12"),
              "message does not suggest the nearest valid sizes 8 and 12: %s", msg);
}

// ---- the synthetic source ------------------------------------------------------------------------

// The whole batch, produced in one call.
static void whole_batch(const DataSource *d, uint64_t step, int B, int T, int *in, int *tg) {
    data_batch(d, step, B, T, 0, B, in, tg);
}

Test(data, global_batch_does_not_depend_on_world_size) {
    DataSource d;
    data_init_synthetic(&d, 256, 1234);
    int B = 16, T = 24;
    size_t N = (size_t)B * T;
    int *in = malloc(N * sizeof(int)), *tg = malloc(N * sizeof(int));
    int *in2 = malloc(N * sizeof(int)), *tg2 = malloc(N * sizeof(int));
    for (uint64_t step = 0; step < 3; step++) {
        whole_batch(&d, step, B, T, in, tg);
        int worlds[] = {2, 4, 8, 16};
        for (int w = 0; w < 4; w++) {
            int n = worlds[w];
            memset(in2, 0xff, N * sizeof(int));
            memset(tg2, 0xff, N * sizeof(int));
            // Ranks in reverse order: a row must not depend on what was produced before it.
            for (int r = n - 1; r >= 0; r--) {
                int row0, nrows;
                data_slice(B, r, n, &row0, &nrows);
                data_batch(&d, step, B, T, row0, nrows, in2 + (size_t)row0 * T, tg2 + (size_t)row0 * T);
            }
            cr_assert(memcmp(in, in2, N * sizeof(int)) == 0, "step %d: inputs differ on %d ranks", (int)step, n);
            cr_assert(memcmp(tg, tg2, N * sizeof(int)) == 0, "step %d: targets differ on %d ranks", (int)step, n);
        }
    }
    free(in); free(tg); free(in2); free(tg2);
    data_free(&d);
}

Test(data, deterministic_and_seed_dependent) {
    DataSource a, b, c;
    data_init_synthetic(&a, 64, 7);
    data_init_synthetic(&b, 64, 7);
    data_init_synthetic(&c, 64, 8);
    int B = 4, T = 32;
    size_t N = (size_t)B * T;
    int in_a[128], tg_a[128], in_b[128], tg_b[128], in_c[128], tg_c[128], in_s[128], tg_s[128];
    whole_batch(&a, 5, B, T, in_a, tg_a);
    whole_batch(&a, 5, B, T, in_b, tg_b);  // again, same source
    cr_assert(memcmp(in_a, in_b, N * sizeof(int)) == 0, "two calls for step 5 differ");
    whole_batch(&b, 5, B, T, in_b, tg_b);  // a fresh source with the same seed
    cr_assert(memcmp(in_a, in_b, N * sizeof(int)) == 0 && memcmp(tg_a, tg_b, N * sizeof(int)) == 0,
              "two sources with seed 7 give different batches");
    // Which successors each token has depends on the seed, not only the token draws.
    cr_assert(memcmp(a.succ, c.succ, 64 * 4 * sizeof(int)) != 0, "seeds 7 and 8 give the same chain");
    whole_batch(&c, 5, B, T, in_c, tg_c);
    cr_assert(memcmp(in_a, in_c, N * sizeof(int)) != 0, "seeds 7 and 8 give the same batch");
    whole_batch(&a, 6, B, T, in_s, tg_s);
    cr_assert(memcmp(in_a, in_s, N * sizeof(int)) != 0, "steps 5 and 6 give the same batch");
    // Rows of one step differ from each other (row index is part of the hash).
    cr_assert(memcmp(in_a, in_a + T, (size_t)T * sizeof(int)) != 0, "rows 0 and 1 are equal");
    data_free(&a); data_free(&b); data_free(&c);
}

Test(data, targets_are_inputs_shifted_and_follow_the_chain) {
    DataSource d;
    data_init_synthetic(&d, 32, 99);
    int B = 8, T = 40;
    int in[320], tg[320];
    whole_batch(&d, 3, B, T, in, tg);
    for (int b = 0; b < B; b++) {
        const int *x = in + b * T, *y = tg + b * T;
        for (int t = 0; t < T; t++) cr_assert(x[t] >= 0 && x[t] < 32 && y[t] >= 0 && y[t] < 32);
        for (int t = 0; t + 1 < T; t++)
            cr_assert_eq(x[t + 1], y[t], "row %d: inputs[%d] != targets[%d]", b, t + 1, t);
        // From position 1 on, each target is one of the 4 successors of its input.
        for (int t = 1; t < T; t++) {
            int ok = 0;
            for (int j = 0; j < d.succ_count; j++) ok |= d.succ[x[t] * d.succ_count + j] == y[t];
            cr_assert(ok, "row %d pos %d: %d -> %d is not a transition of the chain", b, t, x[t], y[t]);
        }
    }
    data_free(&d);
}

// Measured conditional entropy H(x[t+1] | x[t]) over a long sample vs data_entropy_rate.
static double measured_entropy(int V, uint64_t seed, int nsteps, int B, int T) {
    DataSource d;
    data_init_synthetic(&d, V, seed);
    size_t N = (size_t)B * T;
    int *in = malloc(N * sizeof(int)), *tg = malloc(N * sizeof(int));
    double *pair = calloc((size_t)V * V, sizeof(double)), *ctx = calloc((size_t)V, sizeof(double));
    double total = 0;
    for (int s = 0; s < nsteps; s++) {
        whole_batch(&d, (uint64_t)s, B, T, in, tg);
        for (int b = 0; b < B; b++)
            for (int t = 1; t < T; t++) {  // position 0 has no context by design
                int a = in[b * T + t], c = tg[b * T + t];
                pair[(size_t)a * V + c] += 1;
                ctx[a] += 1;
                total += 1;
            }
    }
    double h = 0;
    for (int a = 0; a < V; a++)
        for (int c = 0; c < V; c++) {
            double k = pair[(size_t)a * V + c];
            if (k > 0) h -= k / total * log(k / ctx[a]);
        }
    free(in); free(tg); free(pair); free(ctx);
    data_free(&d);
    return h;
}

Test(data, entropy_rate_matches_a_long_sample) {
    // 1.75 bits = 1.75 ln 2 nats: the distribution 1/2, 1/4, 1/8, 1/8.
    double expected = 1.75 * log(2.0);
    DataSource d;
    data_init_synthetic(&d, 256, 1);
    cr_assert_float_eq(data_entropy_rate(&d), expected, 1e-6, "entropy rate %.6f, want %.6f",
                       data_entropy_rate(&d), expected);
    int T = 64;
    double floor_want = (log(256.0) + (T - 1) * expected) / T;
    cr_assert_float_eq(data_loss_floor(&d, T), floor_want, 1e-6, "loss floor %.6f, want %.6f",
                       data_loss_floor(&d, T), floor_want);
    data_free(&d);
    // Margin 0.01 nats. Each sample has ~326k transitions: the plug-in estimate is biased low by
    // about (cells - contexts)/(2N) <= 0.0012 nats and fluctuates by ~0.0015 nats (measured over
    // seeds), so 0.01 is several standard errors, yet it catches a wrong probability (1/2, 1/4,
    // 1/4 gives 1.04 nats) or colliding successors (a repeat lowers a row's entropy by >= 0.17).
    // The data is a pure function of the seed, so the test is deterministic, never flaky.
    double h = measured_entropy(256, 1, 20, 64, 256);
    cr_log_info("V=256: measured %.5f nats/token, claimed %.5f", h, expected);
    cr_assert(fabs(h - expected) < 0.01, "measured %.4f nats/token, claimed %.4f", h, expected);
    // A small vocabulary, where colliding successors would be frequent if they were allowed.
    h = measured_entropy(8, 3, 40, 32, 256);
    cr_log_info("V=8: measured %.5f nats/token, claimed %.5f", h, expected);
    cr_assert(fabs(h - expected) < 0.01, "V=8: measured %.4f nats/token, claimed %.4f", h, expected);
}

Test(data, first_target_has_no_context) {
    // The loss floor counts ln V for position 0: its target must not follow the chain.
    DataSource d;
    data_init_synthetic(&d, 256, 5);
    int B = 64, T = 8, follows = 0, rows = 0;
    int in[512], tg[512];
    for (int s = 0; s < 20; s++) {
        whole_batch(&d, (uint64_t)s, B, T, in, tg);
        for (int b = 0; b < B; b++, rows++)
            for (int j = 0; j < d.succ_count; j++) follows += d.succ[in[b * T] * d.succ_count + j] == tg[b * T];
    }
    // By chance 4/256 of the rows; if the chain started at position 0, all of them.
    cr_assert(follows < rows / 10, "%d of %d first targets follow the chain", follows, rows);
    data_free(&d);
}

// ---- the file source -------------------------------------------------------------------------

static char *write_temp(const unsigned char *bytes, size_t n) {
    static char path[64];
    strcpy(path, "/tmp/lab_data_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
    return path;
}

Test(data, file_windows_lie_within_the_file) {
    // Every byte value at most once, so a window's position in the file is unambiguous.
    unsigned char bytes[200];
    for (int i = 0; i < 200; i++) bytes[i] = (unsigned char)((i * 37 + 11) % 256);
    char *path = write_temp(bytes, sizeof(bytes));
    int T = 31, B = 16;
    DataSource d;
    data_init_file(&d, path, T, 77);
    cr_assert_eq(d.V, 256);
    cr_assert_float_eq(data_entropy_rate(&d), -1.0, 1e-12);
    int in[16 * 31], tg[16 * 31];
    int seen_low = 0, seen_high = 0;
    for (int s = 0; s < 40; s++) {
        whole_batch(&d, (uint64_t)s, B, T, in, tg);
        for (int b = 0; b < B; b++) {
            int off = -1;
            for (int i = 0; i < 200; i++)
                if (bytes[i] == in[b * T]) off = i;
            cr_assert(off >= 0 && off + T + 1 <= 200, "step %d row %d starts at %d: window [%d,%d) "
                      "leaves the 200-byte file", s, b, off, off, off + T + 1);
            for (int t = 0; t < T; t++) {
                cr_assert_eq(in[b * T + t], bytes[off + t]);
                cr_assert_eq(tg[b * T + t], bytes[off + t + 1]);
            }
            seen_low |= off < 20;
            seen_high |= off > 200 - T - 1 - 20;
        }
    }
    cr_assert(seen_low && seen_high, "640 windows never reached both ends of the file");
    data_free(&d);
    unlink(path);
}

Test(data, file_of_exactly_T_plus_1_bytes_has_one_window) {
    unsigned char bytes[17];
    for (int i = 0; i < 17; i++) bytes[i] = (unsigned char)(100 + i);
    char *path = write_temp(bytes, sizeof(bytes));
    DataSource d;
    data_init_file(&d, path, 16, 3);
    int in[4 * 16], tg[4 * 16];
    for (int s = 0; s < 5; s++) {
        whole_batch(&d, (uint64_t)s, 4, 16, in, tg);
        for (int b = 0; b < 4; b++)
            for (int t = 0; t < 16; t++) {
                cr_assert_eq(in[b * 16 + t], 100 + t);
                cr_assert_eq(tg[b * 16 + t], 101 + t);
            }
    }
    data_free(&d);
    unlink(path);
}

static const char *g_path;
static void open_file_T16(void *arg) {
    DataSource *d = arg;
    data_init_file(d, g_path, 16, 1);
}

Test(data, short_or_missing_file_is_refused) {
    unsigned char bytes[16] = {0};
    char *path = write_temp(bytes, sizeof(bytes));
    DataSource d;
    g_path = path;
    const char *msg = harness_expect_fail(open_file_T16, &d);
    cr_assert(msg, "a 16-byte file was accepted for --seq 16");
    cr_assert(strstr(msg, path), "message does not name the file: %s", msg);
    cr_assert(strstr(msg, "16 bytes") && strstr(msg, "17"), "message does not give the sizes: %s", msg);
    unlink(path);
    g_path = "/tmp/lab_data_does_not_exist.txt";
    msg = harness_expect_fail(open_file_T16, &d);
    cr_assert(msg, "a missing file was accepted");
    cr_assert(strstr(msg, g_path) && strstr(msg, "No such file"), "unclear message: %s", msg);
}
