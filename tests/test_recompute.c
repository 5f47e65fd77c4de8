// test_recompute.c: activation recomputation (--recompute none|selective|full).
//
// Recomputing a block's forward runs the same kernels on the same inputs in the same chunks, so
// a run that recomputes trains exactly the run that does not: the same losses and final weights,
// bit for bit. What it changes is memory and compute: the measured activation peak equals the
// calculator's formula for the mode to the byte (calc_activation_bytes_recompute; chapter 08's
// pipeline: calc_pipe_peak_bytes_recompute), the up-front prediction (mem_predicted) stays the
// measured peak, and the FLOPs run again are counted as they run and equal the formula. In fp32
// and bf16, and in chapter 09 also with ZeRO-3 and FSDP's sharded weights.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "gpt2.h"
#include "harness.h"
#include "results.h"
#include "schedule.h"
#include "tp.h"

#define RUN00 "./00_memory_budget/run --train --quiet"
#define FLAGS00 "--steps 3 --batch 8"

static const char *const MODES[] = {"none", "selective", "full"};
static const GPT2Recompute RC[] = {GPT2_RECOMPUTE_NONE, GPT2_RECOMPUTE_SELECTIVE, GPT2_RECOMPUTE_FULL};

// a and b: the same steps, losses and weights, bit for bit
static void assert_same_bits(const char *what, const RunResults *a, const RunResults *b) {
    cr_assert_eq(a->nsteps, b->nsteps, "%s: %d steps vs %d", what, a->nsteps, b->nsteps);
    cr_assert_eq(a->nparams, b->nparams, "%s: %zu weights vs %zu", what, a->nparams, b->nparams);
    for (int s = 0; s < a->nsteps; s++)
        cr_assert_eq(memcmp(&a->losses[s], &b->losses[s], sizeof(float)), 0,
                     "%s: step %d loss %.9g vs %.9g without recomputation", what, s + 1,
                     a->losses[s], b->losses[s]);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < a->nparams; i++)
        if (memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    cr_assert_eq(bad, 0, "%s: %zu of %zu final weights differ from the run without recomputation "
                 "(first at %zu: %.9g vs %.9g)", what, bad, a->nparams, first,
                 bad ? a->params[first] : 0.0, bad ? b->params[first] : 0.0);
}

// 00 --train in dtype dt, once per mode: the bits of none; each mode's activation peak the
// calculator's formula, to the byte, the up-front prediction the measured peak, and the FLOPs the
// backward ran again (gpt2_recompute_flops_dtype, counted as they ran) printed. acts: the peaks.
// The printed FLOPs line of a run that recomputes (gpt2_print_recompute_flops): the counted
// figure and the formula's, both as the test computes the formula (want, per step), to the 4
// digits printed.
static void assert_flops_line(const char *what, const char *out, double want) {
    char line[96];
    snprintf(line, sizeof line, "FLOPs run again   %.4g counted = %.4g by the formula", want, want);
    cr_assert(harness_contains(out, line), "%s: does not print '%s' (counted = the formula):\n%s",
              what, line, out);
}

static void check_train00(GPT2Dtype dt, double acts[3], double extra[3]) {
    GPT2Config cfg = gpt2_config_tiny();
    const double step = gpt2_flops_per_step(&cfg, 8, cfg.T);
    const char *dname = dt == GPT2_BF16 ? "bf16" : "fp32";
    RunResults r[3];
    char *out[3];
    for (int i = 0; i < 3; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, FLAGS00 " --dtype %s --recompute %s --log-every 0", dname,
                 MODES[i]);
        int rc = harness_run_dump("./00_memory_budget/run --train", 1, flags, &r[i], &out[i], 120);
        cr_assert_eq(rc, 0, "%s --recompute %s failed:\n%s", dname, MODES[i], out[i]);
    }
    for (int i = 1; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s --recompute %s", dname, MODES[i]);
        assert_same_bits(what, &r[i], &r[0]);
    }
    for (int i = 0; i < 3; i++) {
        const double want = calc_activation_bytes_recompute(&cfg, 8, cfg.T, dt, RC[i]);
        acts[i] = results_get(&r[i], "mem_acts", -1);
        cr_log_info("%s --recompute %-9s activations measured %.0f B, formula %.0f B", dname,
                    MODES[i], acts[i], want);
        cr_assert_eq(acts[i], want, "%s --recompute %s: measured activation peak %.0f B, the "
                     "calculator says %.0f B (off by %+.0f)", dname, MODES[i], acts[i], want,
                     acts[i] - want);
        cr_assert_eq(results_get(&r[i], "mem_predicted", -1), results_get(&r[i], "mem_peak", -2),
                     "%s --recompute %s: predicted peak %.0f B, measured %.0f B", dname, MODES[i],
                     results_get(&r[i], "mem_predicted", -1), results_get(&r[i], "mem_peak", -2));
        extra[i] = cfg.L * gpt2_recompute_flops_dtype(&cfg, RC[i], dt, 8, cfg.T) / step;
        if (i == 0) continue;
        char want_line[64];
        snprintf(want_line, sizeof want_line, "-> %.4f x the step's", 1.0 + extra[i]);
        cr_log_info("%s --recompute %s: %.4f x the step's FLOPs", dname, MODES[i], 1.0 + extra[i]);
        cr_assert(harness_contains(out[i], want_line), "%s --recompute %s does not print '%s':\n%s",
                  dname, MODES[i], want_line, out[i]);
    }
    for (int i = 0; i < 3; i++) results_free(&r[i]), free(out[i]);
}

// Chapter 00 --train, once per mode: selective and full train the bits of none; the measured
// activation peak is the calculator's formula for the mode, to the byte, and so is the up-front
// prediction the refusal uses; recomputing saves what the formula says; the FLOPs the backward
// ran again, counted as they ran, are the formula's (full: one more forward of the blocks, the
// notes' "about 4/3" of the step; selective: only QK^T and att*V), and the run prints them.
// Mutant: mutants/recompute-stale-input.patch
// Mutant: mutants/recompute-selective-skipped.patch
// Mutant: mutants/recompute-calc-keeps-one-tensor-more.patch
Test(recompute, train00) {
    GPT2Config cfg = gpt2_config_tiny();
    double acts[3], extra[3];
    check_train00(GPT2_FP32, acts, extra);
    cr_assert(fabs(1.0 + extra[2] - 4.0 / 3.0) < 0.03, "full: %.4f x the step, not about 4/3",
              1.0 + extra[2]);
    // full keeps one (B,T,C) per block instead of A; selective drops the B*NH*T*T scores
    const double BT = 8.0 * cfg.T, att = 2.0 * 8 * cfg.NH * (double)cfg.T * cfg.T;
    const double A = BT * cfg.C * 18 + BT * 4 + att;
    cr_assert_eq(acts[0] - acts[1], 4.0 * (cfg.L - 1) * att);
    cr_assert_eq(acts[0] - acts[2], 4.0 * (cfg.L - 1) * (A - BT * cfg.C));
}

// Chapter 08 on 2 ranks (1F1B, m = 4, every mode; interleaved, v = 2, none and full, each of
// its chunks with its own scratch layer): the same bits in every mode, and
// each stage's measured activation peak (MEM_ACTS above the step's start, at op boundaries) is
// the calculator's walk of its table with the mode's sets, to the byte. A stage keeps of each
// in-flight micro-batch its blocks' inputs only (full); its chunks' scratch layers come before
// the first step: the up-front prediction counts them and still covers the measured peak. The
// FLOPs rank 0's chunks ran again, summed and printed, are the formula's for their L/2 blocks.
// Mutant: mutants/recompute-stale-input.patch
// Mutant: mutants/recompute-calc-keeps-one-tensor-more.patch
Test(recompute, pipeline08) {
    static const struct { const char *sched; int v; int selective; } layouts[] = {
        {"1f1b", 1, 1}, {"interleaved", 2, 0},  // (interleaved: none and full)
    };
    GPT2Config cfg = gpt2_config_tiny();
    const int B = 8, m = 4, Bm = B / m;
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        RunResults r[3];
        Schedule sc;
        sched_make(&sc, layouts[k].sched, 2, layouts[k].v, m);
        for (int i = 0; i < 3; i++) {
            if (RC[i] == GPT2_RECOMPUTE_SELECTIVE && !layouts[k].selective) continue;
            char flags[256];
            snprintf(flags, sizeof flags, "--steps 2 --batch %d --micro-batches %d --schedule %s "
                     "--chunks %d --recompute %s", B, m, layouts[k].sched, layouts[k].v, MODES[i]);
            harness_assert_run_dump("./08_pipeline/run --quiet", 2, flags, &r[i]);
            if (RC[i]) {  // once more, not --quiet (its report's buffers move the peak): the FLOPs
                char cmd[320], *out;  // line of rank 0's chunks, L/2 blocks in all
                snprintf(cmd, sizeof cmd, "./08_pipeline/run %s", flags);
                int rc = harness_mpirun(2, cmd, &out, 120);
                cr_assert_eq(rc, 0, "08 %s failed:\n%s", flags, out);
                assert_flops_line(flags, out, cfg.L / 2 * gpt2_recompute_flops_dtype(&cfg, RC[i],
                                  GPT2_FP32, B, cfg.T));
                free(out);
            }
            for (int rank = 0; rank < 2; rank++) {
                char key[64];
                snprintf(key, sizeof key, "peak_act_bytes_r%d", rank);
                const double got = results_get(&r[i], key, -1);
                const double want = calc_pipe_peak_bytes_recompute(&cfg, &sc, rank, Bm, cfg.T,
                                                                   GPT2_FP32, RC[i]);
                cr_log_info("08 %s --recompute %-9s stage %d: acts peak %.0f B, formula %.0f B",
                            layouts[k].sched, MODES[i], rank, got, want);
                cr_assert_eq(got, want, "08 %s --recompute %s stage %d: activation peak %.0f B, the "
                             "calculator says %.0f B (off by %+.0f)", layouts[k].sched, MODES[i],
                             rank, got, want, got - want);
            }
            const double pred = results_get(&r[i], "mem_predicted", -1);
            const double peak = results_get(&r[i], "mem_peak", -2);
            cr_assert(pred >= peak && pred <= 1.1 * peak, "08 %s --recompute %s: predicted %.0f B, "
                      "measured peak %.0f B", layouts[k].sched, MODES[i], pred, peak);
        }
        for (int i = 1; i < 3; i++) {
            if (RC[i] == GPT2_RECOMPUTE_SELECTIVE && !layouts[k].selective) continue;
            char what[64];
            snprintf(what, sizeof what, "08 %s --recompute %s", layouts[k].sched, MODES[i]);
            assert_same_bits(what, &r[i], &r[0]);
        }
        for (int i = 0; i < 3; i++)
            if (RC[i] != GPT2_RECOMPUTE_SELECTIVE || layouts[k].selective) results_free(&r[i]);
        sched_free(&sc);
    }
}

// Chapter 09 at --tp 1 (its stages run gpt2's own pieces and sets, as 08's): 2 stages, 1F1B,
// m = 2. The same bits in every mode, and each rank's activation peak is the
// calculator's calc_rank_memory for the layout with the mode (calc_setup_lab's lab list).
// Mutant: mutants/recompute-stale-input.patch
Test(recompute, grid09_tp1) {
    GPT2Config cfg = gpt2_config_tiny();
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    RunResults r[3];
    for (int i = 0; i < 3; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, "--tp 1 --pp 2 --steps 2 --batch 8 --micro-batches 2 "
                 "--recompute %s", MODES[i]);
        harness_assert_run_dump("./09_3d/run --quiet", 2, flags, &r[i]);
        CalcSetup cs = calc_setup_lab(1, 1, 2, 1, 2, 8, cfg.T, 0, CALC_FP32);
        cs.recompute = (CalcRecompute)RC[i];
        for (int rk = 0; rk < 2; rk++) {
            char key[32];
            snprintf(key, sizeof key, "acts_peak_r%d", rk);
            const double got = results_get(&r[i], key, -1);
            const double want = calc_rank_memory(&cm, &cs, rk, 0).acts;
            cr_assert_eq(got, want, "09 --recompute %s rank %d: activation peak %.0f B, the "
                         "calculator says %.0f B (off by %+.0f)", MODES[i], rk, got, want, got - want);
        }
    }
    assert_same_bits("09 --recompute selective", &r[1], &r[0]);
    assert_same_bits("09 --recompute full", &r[2], &r[0]);
    for (int i = 0; i < 3; i++) results_free(&r[i]);
}

// Chapter 07 at --tp 2, without and with --sequence-parallel (tp.c's slices: tp.h's tp_build).
// Every mode trains the bits of none. The activation peak (MEM_ACTS: the slice's one set, the
// TP backward scratch, and the recompute layer) is to the byte the calculator's set for the
// layout (calc_rank_memory of the lab's TP stage, one micro-batch: selective drops the heads'
// scores and softmax, full keeps each block's output), plus its recompute layer
// (calc_tp_recompute_scratch_bytes), plus the backward scratch tp.c shares (tp_shared_bytes
// without recomputation); 07's own printed formula says the same, and the up-front prediction
// moves by what the peak moves. Full recomputation reruns each block's g (under SP also f's
// all-gather): 6 instead of 4 of a block's tensors per step, and 07's formula for the bytes the
// TP group sends still holds to the byte. The FLOPs rank 0's slice ran again, counted as they
// ran and printed, are the formula's share of them: L x gpt2_recompute_flops_dtype / t.
static void check_tp07(CalcDtype dt) {
    const int bf16 = dt == CALC_BF16;
    GPT2Config cfg = gpt2_config_tiny();
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    const int B = 4;
    for (int sp = 0; sp < 2; sp++) {
        RunResults r[3];
        double want[3];
        for (int i = 0; i < 3; i++) {
            char flags[256];
            snprintf(flags, sizeof flags, "--tp 2 --steps 2 --batch %d --dtype %s --recompute %s%s", B,
                     bf16 ? "bf16" : "fp32", MODES[i], sp ? " --sequence-parallel" : "");
            char *out;  // (not --quiet: the recomputation's FLOPs line, rank 0's slice)
            int rc = harness_run_dump("./07_tensor_parallel/run", 2, flags, &r[i], &out, 120);
            cr_assert_eq(rc, 0, "07 %s failed:\n%s", flags, out);
            if (RC[i]) assert_flops_line(flags, out, cfg.L * gpt2_recompute_flops_dtype(&cfg, RC[i],
                                         bf16 ? GPT2_BF16 : GPT2_FP32, B, cfg.T) / 2);
            free(out);
            CalcSetup cs = calc_setup_lab(1, 2, 1, 1, 1, B, cfg.T, 0, dt);
            cs.sp = sp, cs.recompute = (CalcRecompute)RC[i];
            const TpShape none = {.l0 = 0, .l1 = cfg.L, .tp = 2, .r = 0, .sp = sp, .B = B, .T = cfg.T};
            want[i] = calc_rank_memory(&cm, &cs, 0, 0).acts +
                      (RC[i] ? calc_tp_recompute_scratch_bytes(&cm, &cs) : 0.0) +
                      (double)tp_shared_bytes(&cfg, none, bf16 ? GPT2_BF16 : GPT2_FP32);
            const double got = results_get(&r[i], "mem_acts", -1);
            cr_log_info("07 --tp 2%s %s --recompute %-9s activations %.0f B, calculator %.0f B",
                        sp ? " --sequence-parallel" : "", bf16 ? "bf16" : "fp32", MODES[i], got, want[i]);
            cr_assert_eq(got, want[i], "07 --tp 2%s --recompute %s: activation peak %.0f B, the "
                         "calculator says %.0f B (off by %+.0f)", sp ? " SP" : "", MODES[i], got,
                         want[i], got - want[i]);
            cr_assert_eq(got, results_get(&r[i], "want_mem_acts", -2), "07 --recompute %s: its "
                         "printed formula %.0f B", MODES[i], results_get(&r[i], "want_mem_acts", -2));
            const double sent = results_get(&r[i], "tp_sent_per_step", -1);
            const double wsent = results_get(&r[i], "want_tp_sent_per_step", -2);
            cr_assert_eq(sent, wsent, "07 --tp 2%s --recompute %s: the TP group sent %.0f B per "
                         "step, formula %.0f B", sp ? " SP" : "", MODES[i], sent, wsent);
        }
        for (int i = 1; i < 3; i++) {
            char what[64];
            snprintf(what, sizeof what, "07 --tp 2%s %s --recompute %s", sp ? " SP" : "",
                     bf16 ? "bf16" : "fp32", MODES[i]);
            assert_same_bits(what, &r[i], &r[0]);
            const double dpeak = results_get(&r[i], "mem_peak", -1) - results_get(&r[0], "mem_peak", -1);
            const double dpred = results_get(&r[i], "mem_predicted", -1) -
                                 results_get(&r[0], "mem_predicted", -1);
            cr_assert_eq(dpred, dpeak, "%s: the prediction moved %+.0f B, the peak %+.0f B", what,
                         dpred, dpeak);
        }
        // full: 2 more of a block's (B*T, C) tensors per block and step, 2(t-1)/t of each on the
        // wire (fp32 in bf16 too); bf16 selective under SP: ln1's all-gather, (t-1)/t of one
        const double NC4 = 4.0 * B * cfg.T * cfg.C;
        cr_assert_eq(results_get(&r[2], "tp_sent_per_step", 0) - results_get(&r[0], "tp_sent_per_step", 0),
                     cfg.L * 2 * NC4 * 2 * (2 - 1) / 2);
        cr_assert_eq(results_get(&r[1], "tp_sent_per_step", 0) - results_get(&r[0], "tp_sent_per_step", 0),
                     bf16 && sp ? cfg.L * NC4 * (2 - 1) / 2 : 0.0);
        for (int i = 0; i < 3; i++) results_free(&r[i]);
    }
}

// Mutant: mutants/recompute-tp-skips-collective.patch
// Mutant: mutants/recompute-tp-stale-input.patch
// Mutant: mutants/recompute-tp-calc-sp-input-whole.patch
// Mutant: mutants/recompute-tp-flops-whole-block.patch
Test(recompute, tp07) { check_tp07(CALC_FP32); }

// bf16 (tp.h): the kept tensors and what was recomputed rounded as the forward's store rounds
// them, selective first rerunning ln1 and qkv (under SP with ln1's all-gather once more): the
// bits of bf16 without recomputation, the calculator's bf16 set and 07's formula to the byte.
// Mutant: mutants/recompute-tp-bf16-unrounded.patch
// Mutant: mutants/recompute-tp-bf16-selective-stale-qkv.patch
Test(recompute, tp07_bf16) { check_tp07(CALC_BF16); }

// Chapter 09 at --tp 2, every mode: the same bits as none; each rank's activation peak (the
// sets its table keeps at once) is the calculator's calc_rank_memory with the mode, and the
// bytes each rank sends in its TP group per step are calc_rank_comm's with the mode (full: the
// forward's collectives once more per block), to the byte; the FLOPs rank 0's stage ran again,
// as printed, are its L/pp blocks' formula on its 4/dp rows a step, / t.
static void check_grid09_tp(int dp, int tp, int pp, int sp, CalcDtype dt) {
    const char *dtype = dt == CALC_BF16 ? "bf16" : "fp32";
    GPT2Config cfg = gpt2_config_tiny();
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    const int world = dp * tp * pp;
    RunResults r[3];
    for (int i = 0; i < 3; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, "--dp %d --tp %d --pp %d --steps 2 --batch 4 "
                 "--micro-batches 2 --dtype %s --recompute %s%s", dp, tp, pp, dtype, MODES[i],
                 sp ? " --sequence-parallel" : "");
        char *out;  // (not --quiet: rank 0's stage, L/pp blocks of its slice, 4/dp rows a step)
        int rc = harness_run_dump("./09_3d/run", world, flags, &r[i], &out, 120);
        cr_assert_eq(rc, 0, "09 %s failed:\n%s", flags, out);
        if (RC[i]) assert_flops_line(flags, out, cfg.L / pp * gpt2_recompute_flops_dtype(&cfg, RC[i],
                                     dt == CALC_BF16 ? GPT2_BF16 : GPT2_FP32, 4 / dp, cfg.T) / tp);
        free(out);
        CalcSetup cs = calc_setup_lab(dp, tp, pp, 1, 2, 4, cfg.T, 0, dt);
        cs.sp = sp, cs.recompute = (CalcRecompute)RC[i];
        for (int rk = 0; rk < world; rk++) {
            const int d = (rk / tp) % dp, p = rk / (tp * dp);
            char key[32];
            snprintf(key, sizeof key, "acts_peak_r%d", rk);
            double got = results_get(&r[i], key, -1), want = calc_rank_memory(&cm, &cs, p, d).acts;
            cr_log_info("09 (%d,%d,%d)%s --recompute %-9s rank %d: acts peak %.0f B, formula %.0f B",
                        dp, tp, pp, sp ? " SP" : "", MODES[i], rk, got, want);
            cr_assert_eq(got, want, "09 (%d,%d,%d)%s --recompute %s rank %d: activation peak "
                         "%.0f B, the calculator says %.0f B (off by %+.0f)", dp, tp, pp,
                         sp ? " SP" : "", MODES[i], rk, got, want, got - want);
            snprintf(key, sizeof key, "tp_sent_r%d", rk);
            got = results_get(&r[i], key, -1), want = calc_rank_comm(&cm, &cs, p, d).tp.step_bytes;
            cr_assert_eq(got, want, "09 (%d,%d,%d)%s --recompute %s rank %d: sent %.0f B per step "
                         "in its TP group, the calculator says %.0f B", dp, tp, pp, sp ? " SP" : "",
                         MODES[i], rk, got, want);
        }
    }
    for (int i = 1; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "09 (%d,%d,%d)%s %s --recompute %s", dp, tp, pp, sp ? " SP" : "",
                 dtype, MODES[i]);
        assert_same_bits(what, &r[i], &r[0]);
    }
    for (int i = 0; i < 3; i++) results_free(&r[i]);
}

// (dp,tp,pp) = (1,2,2), 1F1B with m = 2: TP stages of a pipeline.
// Mutant: mutants/recompute-tp-skips-collective.patch
// Mutant: mutants/recompute-tp-stale-input.patch
// Mutant: mutants/recompute-tp-flops-whole-block.patch
Test(recompute, grid09_tp2) { check_grid09_tp(1, 2, 2, 0, CALC_FP32); }

// (dp,tp,pp) = (2,2,1) with --sequence-parallel: SP's all-gathers and reduce-scatters rerun.
// Mutant: mutants/recompute-tp-skips-collective.patch
// Mutant: mutants/recompute-tp-stale-input.patch
// Mutant: mutants/recompute-tp-calc-sp-input-whole.patch
Test(recompute, grid09_tp2_sp) { check_grid09_tp(2, 2, 1, 1, CALC_FP32); }

// The same two layouts in bf16: the bits of bf16 without recomputation, the calculator's bf16
// activation peak and TP bytes per rank (bf16 selective under SP: ln1's all-gather once more).
// Mutant: mutants/recompute-tp-bf16-unrounded.patch
// Mutant: mutants/recompute-tp-bf16-selective-stale-qkv.patch
Test(recompute, grid09_tp2_bf16) { check_grid09_tp(1, 2, 2, 0, CALC_BF16); }
// Mutant: mutants/recompute-tp-bf16-unrounded.patch
// Mutant: mutants/recompute-tp-bf16-selective-stale-qkv.patch
Test(recompute, grid09_tp2_sp_bf16) { check_grid09_tp(2, 2, 1, 1, CALC_BF16); }
// bf16. A block computes in fp32 from its input as stored (rounded) and stores its tensors
// rounded; recomputing from that same input reproduces the forward's fp32 values, rounded as the
// store rounded them they are the values the backward reads without recomputation (selective
// first reruns ln1 and qkv: the forward's softmax read qkv before it was rounded). So bf16 runs
// that recompute train the bits of bf16 without, and their activation peak is the calculator's
// bf16 formula for the mode, to the byte.

// Chapter 00 --train --dtype bf16, once per mode: the bits of none, the activation peak the
// calculator's, the up-front prediction the measured peak, the FLOPs run again the formula's
// (bf16 selective: ln1 and the qkv matmul too, gpt2_recompute_flops_dtype).
// Mutant: mutants/recompute-bf16-unrounded.patch
// Mutant: mutants/recompute-bf16-selective-stale-qkv.patch
// Mutant: mutants/recompute-bf16-calc-stores-whole-layer.patch
Test(recompute, train00_bf16) {
    double acts[3], extra[3];
    check_train00(GPT2_BF16, acts, extra);
}

// Chapter 08 --dtype bf16 on 2 ranks (1F1B, m = 4): every mode trains the bits of none, and each
// stage's activation peak is the calculator's walk of its table with bf16 sets, to the byte.
// Mutant: mutants/recompute-bf16-unrounded.patch
// Mutant: mutants/recompute-bf16-selective-stale-qkv.patch
// Mutant: mutants/recompute-bf16-pipe-set-keeps-all.patch
Test(recompute, pipeline08_bf16) {
    GPT2Config cfg = gpt2_config_tiny();
    const int B = 8, m = 4, Bm = B / m;
    Schedule sc;
    sched_make(&sc, "1f1b", 2, 1, m);
    RunResults r[3];
    for (int i = 0; i < 3; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, "--steps 2 --batch %d --micro-batches %d --schedule 1f1b "
                 "--dtype bf16 --recompute %s", B, m, MODES[i]);
        harness_assert_run_dump("./08_pipeline/run --quiet", 2, flags, &r[i]);
        for (int rank = 0; rank < 2; rank++) {
            char key[64];
            snprintf(key, sizeof key, "peak_act_bytes_r%d", rank);
            const double got = results_get(&r[i], key, -1);
            const double want = calc_pipe_peak_bytes_recompute(&cfg, &sc, rank, Bm, cfg.T, GPT2_BF16, RC[i]);
            cr_log_info("08 bf16 --recompute %-9s stage %d: acts peak %.0f B, formula %.0f B",
                        MODES[i], rank, got, want);
            cr_assert_eq(got, want, "08 bf16 --recompute %s stage %d: activation peak %.0f B, the "
                         "calculator says %.0f B (off by %+.0f)", MODES[i], rank, got, want, got - want);
        }
    }
    assert_same_bits("08 bf16 --recompute selective", &r[1], &r[0]);
    assert_same_bits("08 bf16 --recompute full", &r[2], &r[0]);
    for (int i = 0; i < 3; i++) results_free(&r[i]);
    sched_free(&sc);
}

// 09's activation peaks of one run against calc_rank_memory for its layout, rank by rank
// (rank = t + tp*(d + dp*p), tp 1: d + dp*p); the up-front prediction covers the measured peak.
static void assert_09_acts(const char *what, const RunResults *r, int dp, int pp, int m, int zero,
                           int fsdp, CalcDtype dt, GPT2Recompute rc) {
    GPT2Config cfg = gpt2_config_tiny();
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    CalcSetup cs = calc_setup_lab(dp, 1, pp, 1, m, 8, cfg.T, zero, dt);
    cs.fsdp = fsdp;
    cs.recompute = (CalcRecompute)rc;
    for (int rk = 0; rk < dp * pp; rk++) {
        char key[32];
        snprintf(key, sizeof key, "acts_peak_r%d", rk);
        const double got = results_get(r, key, -1);
        const double want = calc_rank_memory(&cm, &cs, rk / dp, rk % dp).acts;
        cr_assert_eq(got, want, "%s rank %d: activation peak %.0f B, the calculator says %.0f B "
                     "(off by %+.0f)", what, rk, got, want, got - want);
    }
    const double pred = results_get(r, "mem_predicted", -1), peak = results_get(r, "mem_peak", -2);
    cr_assert(pred >= peak, "%s: the up-front prediction %.0f B is below the measured peak %.0f B",
              what, pred, peak);
}

// Chapter 09 --dtype bf16 at --tp 1 (2 stages, 1F1B, m = 2): every mode the bits of none, each
// rank's activation peak the calculator's.
// Mutant: mutants/recompute-bf16-unrounded.patch
// Mutant: mutants/recompute-bf16-selective-stale-qkv.patch
// Mutant: mutants/recompute-bf16-pipe-set-keeps-all.patch
Test(recompute, grid09_bf16_tp1) {
    RunResults r[3];
    for (int i = 0; i < 3; i++) {
        char flags[256], what[64];
        snprintf(flags, sizeof flags, "--tp 1 --pp 2 --steps 2 --batch 8 --micro-batches 2 "
                 "--dtype bf16 --recompute %s", MODES[i]);
        harness_assert_run_dump("./09_3d/run --quiet", 2, flags, &r[i]);
        snprintf(what, sizeof what, "09 bf16 --recompute %s", MODES[i]);
        assert_09_acts(what, &r[i], 1, 2, 2, 0, 0, CALC_BF16, RC[i]);
    }
    assert_same_bits("09 bf16 --recompute selective", &r[1], &r[0]);
    assert_same_bits("09 bf16 --recompute full", &r[2], &r[0]);
    for (int i = 0; i < 3; i++) results_free(&r[i]);
}

// Chapter 09 (dp, tp, pp) = (2, 1, 2) with sharded weights: ZeRO-3 (bf16) and FSDP (fp32) gather a
// block's unit before its backward, and the backward's recomputation reads that unit: full
// recomputation trains the bits of none, each rank's activation peak the calculator's.
// Mutant: mutants/recompute-stale-input.patch
// Mutant: mutants/recompute-bf16-unrounded.patch
// Mutant: mutants/recompute-zero3-own-weights.patch
Test(recompute, grid09_sharded) {
    static const struct { const char *flags, *dtype; int fsdp; CalcDtype dt; } runs[] = {
        {"--zero 3", "bf16", 0, CALC_BF16}, {"--fsdp", "fp32", 1, CALC_FP32},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        RunResults r[2];
        for (int i = 0; i < 2; i++) {
            const GPT2Recompute rc = i ? GPT2_RECOMPUTE_FULL : GPT2_RECOMPUTE_NONE;
            char flags[256], what[96];
            snprintf(flags, sizeof flags, "--tp 1 --pp 2 --steps 2 --batch 8 --micro-batches 2 %s "
                     "--dtype %s --recompute %s", runs[k].flags, runs[k].dtype, gpt2_recompute_name(rc));
            harness_assert_run_dump("./09_3d/run --quiet", 4, flags, &r[i]);
            snprintf(what, sizeof what, "09 (2,1,2) %s %s --recompute %s", runs[k].flags,
                     runs[k].dtype, gpt2_recompute_name(rc));
            assert_09_acts(what, &r[i], 2, 2, 2, 3, runs[k].fsdp, runs[k].dt, rc);
        }
        char what[96];
        snprintf(what, sizeof what, "09 (2,1,2) %s %s --recompute full", runs[k].flags, runs[k].dtype);
        assert_same_bits(what, &r[1], &r[0]);
        results_free(&r[0]), results_free(&r[1]);
    }
}

// What the runs do not offer is refused with one message naming what is.
Test(recompute, refusals) {
    harness_assert_refused(2, "./09_3d/run --quiet --steps 1 --batch 8 --tp 1 --pp 2 --schedule zb "
                           "--recompute full", "--recompute full with --schedule zb",
                           "offered with --schedule gpipe, 1f1b and interleaved");
    harness_assert_refused(2, "./03_ddp/run --quiet --steps 1 --recompute full", "--recompute",
                           "offered by 00_memory_budget --train, 07_tensor_parallel, 08_pipeline and 09_3d");
    harness_assert_refused(2, "./08_pipeline/run --quiet --steps 1 --batch 8 --schedule zb "
                           "--recompute selective", "--recompute selective with --schedule zb",
                           "offered with --schedule gpipe, 1f1b and interleaved");
    harness_assert_refused(2, "./09_3d/run --quiet --steps 1 --batch 8 --pp 2 --schedule zb "
                           "--recompute full", "--recompute full with --schedule zb",
                           "offered with --schedule gpipe, 1f1b and interleaved");
}
