// test_health.c: the health line and --log (common/health.c, common/session.c).
//
// The grad norm printed and logged is the norm of the gradient the update was computed from,
// before clipping, checked against an independent computation (the model's gradient at the
// run's weights, its norm summed here); chapters 02 and 03 log chapter 00's norms; every --log
// line is valid JSON with every field; z-scores and MFU follow their definitions.
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "data.h"
#include "gpt2.h"
#include "harness.h"
#include "health.h"
#include "train.h"

static char *tmp_path(const char *tag) {
    static char buf[8][256];
    static int i = 0;
    char *p = buf[i++ % 8];
    snprintf(p, 256, "/tmp/lab_testhealth_%d_%s", (int)getpid(), tag);
    return p;
}

// ---- a small strict JSON reader: validates a line and finds numbers by key ----

typedef struct {
    const char *p;
    int ok;
} J;

static void ws(J *j) {
    while (*j->p == ' ' || *j->p == '\t') j->p++;
}
static void value(J *j);
static void string(J *j) {
    if (*j->p != '"') { j->ok = 0; return; }
    for (j->p++; *j->p && *j->p != '"'; j->p++)
        if (*j->p == '\\' && j->p[1]) j->p++;
    if (*j->p != '"') { j->ok = 0; return; }
    j->p++;
}
static void number(J *j) {
    char *end;
    if (!(*j->p == '-' || isdigit((unsigned char)*j->p))) { j->ok = 0; return; }
    strtod(j->p, &end);
    if (end == j->p) j->ok = 0;
    j->p = end;
}
static void object(J *j) {
    j->p++;  // '{'
    ws(j);
    if (*j->p == '}') { j->p++; return; }
    while (j->ok) {
        ws(j);
        string(j);
        ws(j);
        if (*j->p != ':') { j->ok = 0; return; }
        j->p++;
        value(j);
        ws(j);
        if (*j->p == ',') { j->p++; continue; }
        if (*j->p == '}') { j->p++; return; }
        j->ok = 0;
    }
}
static void value(J *j) {
    ws(j);
    if (*j->p == '{') object(j);
    else if (*j->p == '"') string(j);
    else if (!strncmp(j->p, "true", 4)) j->p += 4;
    else if (!strncmp(j->p, "false", 5)) j->p += 5;
    else if (!strncmp(j->p, "null", 4)) j->p += 4;
    else number(j);
}
// 1 if line is exactly one JSON object (then a newline or nothing)
static int json_valid(const char *line) {
    J j = {line, 1};
    ws(&j);
    if (*j.p != '{') return 0;
    value(&j);
    ws(&j);
    return j.ok && (*j.p == '\0' || *j.p == '\n');
}
// The raw text after "key": in line (keys are unique in the lab's lines), or NULL.
static const char *json_at(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? p + strlen(k) : NULL;
}
static double json_num(const char *line, const char *key) {
    const char *p = json_at(line, key);
    if (!p || !strncmp(p, "null", 4)) return NAN;
    return strtod(p, NULL);
}

static void free_lines(char **lines, int n) {
    for (int i = 0; i < n; i++) free(lines[i]);
}

static int run(const char *cmd, char **out) {
    int rc = harness_run(cmd, out, 300);
    return rc;
}

// ---- units ----

Test(health, z_of_a_constant_window_is_0_and_of_a_spike_large) {
    HealthWindow w;
    health_window_init(&w, HEALTH_WINDOW);
    for (int i = 0; i < HEALTH_Z_MIN - 1; i++) health_window_push(&w, 2.5);
    cr_assert(isnan(health_z(&w, 2.5)), "a z-score before the window holds %d steps", HEALTH_Z_MIN);
    for (int i = 0; i < 30; i++) health_window_push(&w, 2.5);
    cr_assert_eq(health_z(&w, 2.5), 0.0, "z of a constant window's own value: %g", health_z(&w, 2.5));
    cr_assert(health_z(&w, 2.6) > 1e6, "a spike over a constant window: z %g", health_z(&w, 2.6));
    // values 1..20 (the window holds the last 20): mean 10.5, sd sqrt((20^2-1)/12)
    for (int i = 1; i <= 40; i++) health_window_push(&w, i <= 20 ? 0.0 : (double)(i - 20));
    double sd = sqrt((400.0 - 1.0) / 12.0);
    cr_assert(fabs(health_z(&w, 30.0) - (30.0 - 10.5) / sd) < 1e-12, "z %g, want %g",
              health_z(&w, 30.0), (30.0 - 10.5) / sd);
    health_window_push(&w, NAN);  // left out: the z of the next step is unchanged
    cr_assert(fabs(health_z(&w, 30.0) - (30.0 - 10.5) / sd) < 1e-12);
}

Test(health, mfu_is_flops_over_time_over_peak) {
    cr_assert(fabs(health_mfu(6e12, 2.0, 1e12, 4) - 0.75) < 1e-15);
    cr_assert(isnan(health_mfu(6e12, 2.0, 0, 1)), "an unknown peak gives no MFU");
}

// ---- runs ----

#define TINY "--layers 2 --channels 64 --heads 4 --seq 32 --batch 8"

// Every --log line is one JSON object with every field; one line per step; MFU, tokens/s are
// the model FLOPs (6 N + attention, counted here from the shapes) over the step's time.
Test(health, log_lines_parse_and_say_the_step) {
    char *log = tmp_path("parse.jsonl"), cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --train --quiet " TINY " --steps 7 --log %s",
             log);
    cr_assert_eq(run(cmd, &out), 0, "run failed:\n%s", out);
    char *lines[16];
    int n = harness_read_lines(log, lines, 16);
    cr_assert_eq(n, 7, "%d lines in --log for 7 steps", n);
    static const char *fields[] = {"step", "loss", "grad_norm", "clipped", "lr", "tokens_per_s",
                                   "mfu", "flops", "peak_flops", "z_loss", "z_grad_norm",
                                   "time_s", "sent_bytes", "step\":"};
    // the model FLOPs per step, from the shapes: V=256 T=32 L=2 C=64, B=8
    const double V = 256, T = 32, L = 2, C = 64, B = 8;
    const double N = V * C + L * (12 * C * C + 13 * C) + 2 * C;  // without the position table
    const double flops = (6 * N + 12 * L * C * T) * B * T;
    for (int i = 0; i < n; i++) {
        const char *l = lines[i];
        cr_assert(json_valid(l), "line %d is not one JSON object: %s", i + 1, l);
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            cr_assert(json_at(l, fields[f]) || strstr(l, fields[f]), "line %d has no %s: %s",
                      i + 1, fields[f], l);
        cr_assert_eq((int)json_num(l, "step"), i + 1, "%s", l);
        cr_assert(!strncmp(json_at(l, "clipped"), "true", 4) ||
                  !strncmp(json_at(l, "clipped"), "false", 5), "%s", l);
        double dt = json_num(strstr(l, "\"time_s\""), "step");
        double peak = json_num(l, "peak_flops");
        cr_assert(dt > 0 && peak > 1e8, "step time %g, peak %g", dt, peak);
        cr_assert(fabs(json_num(l, "flops") - flops) <= 1e-9 * flops, "flops %g, want %g",
                  json_num(l, "flops"), flops);
        cr_assert(fabs(json_num(l, "mfu") - flops / dt / peak) <= 1e-9 * flops / dt / peak,
                  "mfu %g, want %g", json_num(l, "mfu"), flops / dt / peak);
        cr_assert(fabs(json_num(l, "tokens_per_s") - B * T / dt) <= 1e-9 * B * T / dt);
        // z appears once the window holds HEALTH_Z_MIN steps
        cr_assert_eq(isnan(json_num(l, "z_loss")), i < HEALTH_Z_MIN, "%s", l);
        cr_assert_eq(isnan(json_num(l, "z_grad_norm")), i < HEALTH_Z_MIN, "%s", l);
    }
    free_lines(lines, n);
    unlink(log);
    free(out);
}

// The norm of the gradient of `step` (0-based) at the weights in `weights` (llm.c order),
// computed here: forward + backward on the step's batch, the squares summed in double.
static double oracle_norm(const char *weights, int step) {
    GPT2Config cfg = gpt2_config_tiny();
    cfg.L = 2, cfg.C = 64, cfg.NH = 4, cfg.T = 32;
    const int B = 8, T = 32;
    GPT2 m;
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_alloc_grads(&m);
    gpt2_alloc_acts(&m, B, T);
    ckpt_load_weights_into(weights, &cfg, m.params, m.num_params);
    DataSource d;
    data_init_synthetic(&d, cfg.V, 42);
    int in[8 * 32], tg[8 * 32];
    data_batch(&d, (uint64_t)step, B, T, 0, B, in, tg);
    gpt2_zero_grad(&m);
    gpt2_forward(&m, in, tg);
    gpt2_backward(&m, 1.0f / (float)(B * T));
    double sq = 0;
    for (size_t i = 0; i < m.num_params; i++) sq += (double)m.grads[i] * m.grads[i];
    data_free(&d);
    gpt2_free(&m);
    return sqrt(sq);
}

// The logged and printed grad norm is the norm before clipping: the norm of the gradient at
// the weights the step started from (those of the same run stopped there: --stop-at, so the
// lr schedule is the same), computed here.
// The run clips (clip 1.0, the norms are ~2), so a clipped norm would read 1.0.
// Mutant: mutants/health-clipped-norm.patch
Test(health, grad_norm_is_the_norm_before_clipping, .timeout = 120) {
    char *log = tmp_path("norm.jsonl"), *w2 = tmp_path("w2.bin"), cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --train " TINY " --steps 3 --log-every 1 --log %s", log);
    cr_assert_eq(run(cmd, &out), 0, "run failed:\n%s", out);
    char *printed = out;
    out = NULL;
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --train --quiet " TINY " --steps 3 --stop-at 2 --save-weights %s", w2);
    cr_assert_eq(run(cmd, &out), 0, "run failed:\n%s", out);
    char *lines[8];
    int n = harness_read_lines(log, lines, 8);
    cr_assert_eq(n, 3);
    double logged = json_num(lines[2], "grad_norm"), want = oracle_norm(w2, 2);
    double rel = fabs(logged - want) / want;
    cr_log_info("step 3: logged grad norm %.9g, computed here %.9g (rel. %.2g)", logged, want, rel);
    cr_assert(rel < 1e-6, "logged grad norm %.9g, the gradient's norm is %.9g (rel. %.2g)", logged,
              want, rel);
    cr_assert(want > 1.0, "the run must clip for this test to tell (norm %g)", want);
    cr_assert(!strncmp(json_at(lines[2], "clipped"), "true", 4), "norm %g > clip 1 but %s", want,
              lines[2]);
    // the printed line says the same, to its 4 decimals
    char expect[64];
    snprintf(expect, sizeof expect, "gnorm %8.4f", logged);
    const char *l3 = strstr(printed, "step     3/3");
    cr_assert(l3 && strstr(l3, expect), "no \"%s\" in step 3's line:\n%s", expect, printed);
    free_lines(lines, n);
    unlink(log);
    unlink(w2);
    free(out);
    free(printed);
}

// 02, 03, 07 (TP 2) and 09 (PP 2) on 2 ranks log chapter 00's grad norms (the same gradient,
// summed in another order; 07 and 09 give the loop the global norm their clipping is given).
// Mutant: mutants/tp-health-norm-unsummed.patch
// Mutant: mutants/3d-health-norm-one-stage.patch
Test(health, ddp_chapters_log_chapter_00s_norms, .timeout = 400) {
    const char *progs[] = {"./02_data_parallel/run", "./03_ddp/run", "./07_tensor_parallel/run --tp 2",
                           "./09_3d/run --tp 1 --pp 2"};
    const char *names[] = {"02.jsonl", "03.jsonl", "07.jsonl", "09.jsonl"};
    char *ref = tmp_path("ref.jsonl"), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --train --quiet " TINY " --steps 4 --log %s", ref);
    cr_assert_eq(run(cmd, &out), 0, "run failed:\n%s", out);
    free(out);
    char *want[8];
    cr_assert_eq(harness_read_lines(ref, want, 8), 4);
    for (int p = 0; p < 4; p++) {
        char *log = tmp_path(names[p]);
        snprintf(cmd, sizeof cmd, "%s --quiet " TINY " --steps 4 --log %s", progs[p], log);
        out = NULL;
        cr_assert_eq(harness_mpirun(2, cmd, &out, 120), 0, "%s failed:\n%s", progs[p], out);
        free(out);
        char *got[8];
        int n = harness_read_lines(log, got, 8);
        cr_assert_eq(n, 4, "%s: %d lines", progs[p], n);
        for (int i = 0; i < n; i++) {
            cr_assert(json_valid(got[i]), "%s", got[i]);
            double g = json_num(got[i], "grad_norm"), w = json_num(want[i], "grad_norm");
            cr_assert(fabs(g - w) <= 1e-6 * w, "%s step %d: grad norm %.9g, 00's %.9g", progs[p],
                      i + 1, g, w);
            cr_assert(json_num(strstr(got[i], "\"sent_bytes\""), "all") > 0,
                      "%s: no bytes sent in step %d: %s", progs[p], i + 1, got[i]);
        }
        free_lines(got, n);
        unlink(log);
    }
    free_lines(want, 4);
    unlink(ref);
}

// tools/plot.sh draws a run's --log as a PNG (skipped where gnuplot is not installed; without
// it the script must say how to install it).
Test(health, plot_sh_draws_a_png, .timeout = 120) {
    char *log = tmp_path("plot.jsonl"), *png = tmp_path("plot.png"), cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "./00_memory_budget/run --train --quiet " TINY " --steps 8 --log %s", log);
    cr_assert_eq(run(cmd, &out), 0, "run failed:\n%s", out);
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "bash tools/plot.sh %s %s", log, png);
    int rc = run(cmd, &out);
    if (rc != 0 && harness_contains(out, "gnuplot is not installed")) {
        unlink(log);
        free(out);
        cr_skip_test("gnuplot is not installed");
    }
    cr_assert_eq(rc, 0, "plot.sh failed:\n%s", out);
    FILE *f = fopen(png, "rb");
    unsigned char sig[8] = {0};
    cr_assert(f && fread(sig, 1, 8, f) == 8, "no %s", png);
    fclose(f);
    cr_assert(!memcmp(sig, "\x89PNG\r\n\x1a\n", 8), "%s is not a PNG", png);
    unlink(log);
    unlink(png);
    free(out);
}
