// test_text.c: real text in, text out (common/text.h). The corpus (--data text) is the fortunes
// cleaned as text.h says; the validation batches are fixed and held out; the validation loss
// (--val-every) and the sample (--sample) are the same in every layout, within the chapter's
// bound where the training is not bit-exact; bad input is refused with one message.
//
// Validation and sampling run on world rank 0 from the whole model the chapter gathers, so a
// layout can only differ in its weights: a bit-exact layout (07 --tp 1, the training op for op
// as 00's) gives 00's validation loss and text exactly, and so does every layout before its
// first step (--steps 0: initialization is a pure function of the element's index). 09 on
// (1, 2, 2) after 4 steps: its validation loss within chapter 09's loss bound (test_09_3d.c,
// 1e-6 relative; measured 0 to 3e-8 here).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "gpt2.h"
#include "harness.h"
#include "results.h"
#include "text.h"

#define ORACLE "./00_memory_budget/run --train"
#define MODEL "--layers 2 --channels 32 --heads 4 --seq 32 --batch 8 --data text --lr 3e-3 --log-every 0"
static const GPT2Config CFG = {.V = 256, .T = 32, .L = 2, .C = 32, .NH = 4};
#define VAL_RTOL_09 1e-6  // chapter 09's loss bound (test_09_3d.c LOSS_RTOL)

// The sample a run printed (between text_print_sample's rules), malloc'd; NULL if none.
static char *sample_of(const char *out) {
    const char *a = out ? strstr(out, "----- sample -----\n") : NULL;
    const char *b = a ? strstr(a, "\n----- end of sample -----") : NULL;
    if (!b) return NULL;
    a += strlen("----- sample -----\n");
    char *s = calloc((size_t)(b - a) + 1, 1);
    memcpy(s, a, (size_t)(b - a));
    return s;
}

// Are the 64 bytes of raw those of the sample b? If not, both on stderr and where they part (the
// texts stay out of the assertion's message: a '%' in them would be read as a format).
// a: raw bytes (shown as text_shown does); b: a printed sample.
static int same_text(const uint8_t *raw, const char *b, const char *what_a, const char *what_b) {
    uint8_t a[65] = {0};
    for (int i = 0; i < 64; i++) a[i] = text_shown(raw[i]);
    if (b && strlen(b) == 64 && memcmp(a, b, 64) == 0) return 1;
    int k = 0;
    while (b && k < 64 && b[k] && (uint8_t)b[k] == a[k]) k++;
    fprintf(stderr, "%s text and %s part at byte %d:\n----\n%.64s\n----\n%s\n----\n", what_a,
            what_b, k, (const char *)a, b ? b : "(none)");
    return 0;
}

// Runs prog on np ranks with MODEL and flags; its dump into *r, its sample returned (or NULL).
static char *run_sample(const char *prog, int np, const char *flags, RunResults *r) {
    char all[1024], *out = NULL;
    snprintf(all, sizeof all, "%s %s", MODEL, flags);
    int rc = harness_run_dump(prog, np, all, r, &out, 120);
    cr_assert_eq(rc, 0, "%s -np %d %s failed (%d):\n%s", prog, np, all, rc, out);
    char *s = sample_of(out);
    free(out);
    return s;
}

// The corpus: fixed (two builds are the same bytes), English text of a few MB, the "%"
// separators turned into blank lines, no backspace or NUL left.
Test(text, corpus_is_the_fortunes_cleaned, .timeout = 30) {
    size_t n = 0, n2 = 0;
    uint8_t *a = text_corpus_bytes(TEXT_CORPUS_DIR, &n), *b = text_corpus_bytes(TEXT_CORPUS_DIR, &n2);
    cr_assert(n > 1000000 && n < 8000000, "the corpus has %zu bytes; expected a few MB", n);
    cr_assert(n == n2 && memcmp(a, b, n) == 0, "two builds of the corpus differ");
    cr_assert(!memchr(a, 0, n) && !memchr(a, '\b', n), "a NUL or backspace left in the corpus");
    cr_assert(!strstr((const char *)a, "\n%\n"), "a '%%' separator line left in the corpus");
    size_t blank = 0, letters = 0;
    for (size_t i = 0; i < n; i++) {
        blank += i > 0 && a[i] == '\n' && a[i - 1] == '\n';
        letters += (a[i] | 0x20) >= 'a' && (a[i] | 0x20) <= 'z';
    }
    cr_assert(blank > 10000, "only %zu blank lines: the quotes are not separated", blank);
    cr_assert(letters > n / 2, "%zu letters in %zu bytes: not English text", letters, n);
    free(a), free(b);
}

// A file of 9000 letters then 1000 digits: its last 10 % (the digits) is the validation split.
// Every validation row is digits, every training row letters; the validation batches do not
// depend on the data seed (the same in every run and layout) and differ from batch to batch.
// Mutant: mutants/val-tail-overlaps-train.patch
Test(text, validation_rows_are_held_out_and_fixed, .timeout = 30) {
    char path[] = "/tmp/lab-text-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    for (int i = 0; i < 10000; i++) fputc(i < 9000 ? 'a' + i % 26 : '0' + i % 10, f);
    fclose(f);
    enum { B = 8, T = 16 };
    DataSource d1, d2;
    data_init_file(&d1, path, T, 1);
    data_init_file(&d2, path, T, 999);
    data_split_validation(&d1, T);
    data_split_validation(&d2, T);
    unlink(path);
    cr_assert_eq(d1.train_bytes, 9000);
    int in[B * T], tg[B * T], in2[B * T], tg2[B * T], first[B * T];
    for (int i = 0; i < 3; i++) {
        data_val_batch(&d1, i, B, T, in, tg);
        data_val_batch(&d2, i, B, T, in2, tg2);
        cr_assert(!memcmp(in, in2, sizeof in) && !memcmp(tg, tg2, sizeof tg),
                  "validation batch %d depends on the data seed", i);
        for (int k = 0; k < B * T; k++)
            cr_assert(in[k] >= '0' && in[k] <= '9' && tg[k] >= '0' && tg[k] <= '9',
                      "validation batch %d row %d reads byte '%c': not from the held-out 10 %%", i,
                      k / T, in[k] >= '0' && in[k] <= '9' ? tg[k] : in[k]);
        if (i == 0) memcpy(first, in, sizeof in);
        else cr_assert(memcmp(first, in, sizeof in) != 0, "validation batches 0 and %d are equal", i);
    }
    for (int step = 0; step < 50; step++) {
        data_batch(&d1, (uint64_t)step, B, T, 0, B, in, tg);
        for (int k = 0; k < B * T; k++)
            cr_assert(in[k] >= 'a' && tg[k] >= 'a', "training step %d reads held-out byte '%c'",
                      step, in[k] < 'a' ? in[k] : tg[k]);
    }
    data_free(&d1), data_free(&d2);
}

// The validation loss of a run (--val-every 2 --steps 4: after steps 2 and 4; the dump holds the
// last) is the loss of its final weights on the held-out batches, computed here from the dump,
// bit for bit; the same in 07 --tp 1 (bit-exact training) and within chapter 09's bound on
// (1, 2, 2).
// Mutant: mutants/val-stale-weights.patch
Test(text, val_loss_is_the_weights_and_the_same_in_every_layout, .timeout = 60) {
    RunResults o, t1, g;
    free(run_sample(ORACLE, 1, "--steps 4 --val-every 2", &o));
    cr_assert(results_has(&o, "val_loss"), "00 --val-every: no val_loss in the dump");
    DataSource d;
    text_corpus_init(&d, CFG.T, 42);
    double want = text_val_loss(&CFG, o.params, &d, 8, CFG.T), got = results_get(&o, "val_loss", NAN);
    data_free(&d);
    cr_assert(got == want, "00's last validation loss %.9g is not its final weights' %.9g: "
              "validated other weights", got, want);
    free(run_sample("./07_tensor_parallel/run --tp 1", 1, "--steps 4 --val-every 2", &t1));
    cr_assert(results_get(&t1, "val_loss", NAN) == got, "07 --tp 1: validation loss %.9g, 00's %.9g",
              results_get(&t1, "val_loss", NAN), got);
    free(run_sample("./09_3d/run --tp 2 --pp 2", 4, "--steps 4 --val-every 2", &g));
    double rel = fabs(results_get(&g, "val_loss", NAN) - got) / got;
    fprintf(stderr, "09 (1,2,2) validation loss: %.9g, 00's %.9g, relative %.2g\n",
            results_get(&g, "val_loss", NAN), got, rel);
    cr_assert(rel <= VAL_RTOL_09, "09 (1,2,2): validation loss %.9g, 00's %.9g: %.2g relative > %g",
              results_get(&g, "val_loss", NAN), got, rel, VAL_RTOL_09);
    results_free(&o), results_free(&t1), results_free(&g);
}

// A fixed seed draws the same text: from 00, from the sampler called here on 00's final weights
// (twice), from 07 --tp 1 (the same weights bit for bit); before any step, 09's (1, 2, 2) slices
// gathered are the initial model (--seed's, built here), and give its text.
// Mutant: mutants/sample-seed-per-layout.patch
Test(text, a_seed_draws_the_same_text_from_every_layout, .timeout = 60) {
    RunResults a, t1, z9;
    const char *flags = "--steps 3 --sample 64 --temperature 0.8 --sample-seed 5";
    char *sa = run_sample(ORACLE, 1, flags, &a);
    cr_assert(sa, "00 --sample printed no sample");
    uint8_t here[64], again[64];
    TextSampling sp = {64, 0.8f, 0, 5};
    text_sample(&CFG, a.params, &sp, here);
    text_sample(&CFG, a.params, &sp, again);
    cr_assert(memcmp(here, again, 64) == 0, "the sampler drew two texts from one seed");
    cr_assert(same_text(here, sa, "the sampler here, on 00's final weights", "00's"),
              "the sampler here, on 00's final weights, drew another text than 00 printed");
    char *st = run_sample("./07_tensor_parallel/run --tp 1", 1, flags, &t1);
    cr_assert(sa && st && strcmp(st, sa) == 0 && same_text(here, st, "00's", "07 --tp 1's"),
              "07 --tp 1 (bit-exact) drew another text than 00");
    char *s9 = run_sample("./09_3d/run --tp 2 --pp 2", 4, "--steps 0 --sample 64 --sample-seed 5", &z9);
    GPT2 m;
    gpt2_build(&m, CFG, DEV_CPU);
    gpt2_init_params(&m, 1337);  // --seed's default
    float *init = malloc(m.num_params * sizeof(float));
    gpt2_to_llmc(&CFG, m.params, init);
    TextSampling sp0 = {64, 1.0f, 0, 5};
    text_sample(&CFG, init, &sp0, here);
    cr_assert(same_text(here, s9, "the initial model's", "09 (1,2,2)'s at step 0"),
              "09 (1,2,2), its initial slices gathered, drew another text than the initial model");
    free(init);
    gpt2_free(&m);
    free(sa), free(st), free(s9);
    results_free(&a), results_free(&t1), results_free(&z9);
}

// Bad input: one clear message, every rank out (two ranks where a rank could be left behind: a
// file every rank reads, a flag a chapter refuses after the parse). An empty, a binary, a file
// too short to keep 10 % for validation; the corpus's files missing.
Test(text, bad_data_is_refused, .timeout = 120) {
    char dir[] = "/tmp/lab-text-bad-XXXXXX", cmd[1024];
    cr_assert(mkdtemp(dir));
    char p[1100];
    snprintf(p, sizeof p, "%s/empty.txt", dir);
    fclose(fopen(p, "w"));
    snprintf(p, sizeof p, "%s/bin.txt", dir);
    FILE *f = fopen(p, "wb");
    for (int i = 0; i < 4096; i++) fputc(i % 7 ? 'x' : 0, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/short.txt", dir);
    f = fopen(p, "wb");
    for (int i = 0; i < 100; i++) fputc('a' + i % 26, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, ORACLE " --data %s/empty.txt", dir);
    harness_assert_refused(1, cmd, "empty.txt has 0 bytes", "--seq");
    snprintf(cmd, sizeof cmd, "./05_zero/run --data %s/bin.txt", dir);
    harness_assert_refused(2, cmd, "looks binary", "NUL byte at offset 0");
    snprintf(cmd, sizeof cmd, ORACLE " --seq 16 --data %s/short.txt --val-every 2", dir);
    harness_assert_refused(1, cmd, "short.txt has 100 bytes", "validation");
    snprintf(cmd, sizeof cmd, "env LAB_FORTUNES_DIR=%s ./05_zero/run --data text", dir);
    harness_assert_refused(2, cmd, "--data text: cannot open", "fortunes-min");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

// Bad sampling flags, and --generate from a state of another model, from nothing, or on ranks.
Test(text, bad_sampling_input_is_refused, .timeout = 120) {
    char dir[] = "/tmp/lab-text-gen-XXXXXX", cmd[1024];
    cr_assert(mkdtemp(dir));
    harness_assert_refused(1, ORACLE " --vocab 128 --sample 10", "--sample 10", "--vocab 256");
    harness_assert_refused(1, ORACLE " --top-k 5", "--top-k", "--sample N");
    // --generate: a state of another model; no file; in a chapter that trains on ranks
    snprintf(cmd, sizeof cmd, ORACLE " " MODEL " --steps 1 --save %s/s.ckpt", dir);
    cr_assert_eq(harness_run(cmd, NULL, 60), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --generate --layers 3 --resume %s/s.ckpt", dir);
    harness_assert_refused(1, cmd, "holds another model", "--layers 2");
    harness_assert_refused(1, "./00_memory_budget/run --generate", "--generate", "--resume");
    snprintf(cmd, sizeof cmd, "./05_zero/run " MODEL " --generate --resume %s/s.ckpt", dir);
    harness_assert_refused(2, cmd, "run it with chapter 00", "a state saved by any layout");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
