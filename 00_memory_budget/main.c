// 00_memory_budget: where one device's memory goes, and what training costs.
//
// Two halves:
//   ./00_memory_budget/run [--model 7b --dtype bf16 ...]   the calculator, cost and planner
//                                                          (common/calc.c, planner.c, calc_cli.c)
//   ./00_memory_budget/run --train [--steps 200 ...]       a real single-device training run of
//                                                          the tiny GPT whose measured memory is
//                                                          printed next to the calculator's
//                                                          prediction, category by category.
//
// The training run below is THE single-device oracle of the lab: every parallel chapter must
// reproduce its losses and final weights. Read it top to bottom: it is the loop of the notes,
//     for step: batch -> forward -> backward -> clip -> AdamW update
// with nothing hidden but the layers themselves (common/gpt2.c, common/kernels_cpu.c).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "mem_predict.h"
#include "optim.h"
#include "results.h"
#include "session.h"
#include "text.h"
#include "trace.h"
#include "train.h"

static const char *USAGE =
    "00_memory_budget: where one device's memory goes, and what training costs.\n"
    "\n"
    "  ./00_memory_budget/run                        the 16-bytes-per-parameter story for the\n"
    "                                                tiny model, as a table and bars\n"
    "  ./00_memory_budget/run --model 7b --dtype bf16 --gpu a100-80\n"
    "                                                does a 7B model fit on an A100 80GB?\n"
    "  ./00_memory_budget/run --model 70b --cost --tokens 15e12 --gpu h100 --mfu 0.45\n"
    "                                                GPU-hours, days and dollars\n"
    "  ./00_memory_budget/run --model 70b --dtype bf16 --plan --gpus 8 --gpu h100\n"
    "                                                which DP x TP x PP layout fits?\n"
    "  ./00_memory_budget/run --model 70b --dtype bf16 --layout 64x8x1 --zero 1 --seq-parallel\n"
    "                                                one layout: memory and bytes per step per\n"
    "                                                dimension of every stage, step time, MFU\n"
    "  ./00_memory_budget/run --layers 4 --channels 32 --heads 4 --seq 16 --batch 8 --layout 2x2x2\n"
    "                                                what chapter 09's 8-rank run will measure\n"
    "                                                (mpirun -np 8 ./09_3d/run --tp 2 --pp 2 ...)\n"
    "  ./00_memory_budget/run --train --steps 200    train the tiny GPT on one device and\n"
    "                                                compare measured memory with the formula\n"
    "  ./00_memory_budget/run --train --dtype bf16   the same in mixed precision: bf16 params,\n"
    "                                                grads and saved activations, fp32 master\n"
    "                                                and Adam m, v\n"
    "  ./00_memory_budget/run --train --recompute full\n"
    "                                                keep only each block's input, rerun its\n"
    "                                                forward in backward: the same bits, less\n"
    "                                                activation memory, more compute\n"
    "  ./00_memory_budget/run --train --data text --val-every 100 --sample 300 --save s.ckpt\n"
    "                                                train on English (the lab's corpus), watch\n"
    "                                                the held-out loss, read what it writes\n"
    "  ./00_memory_budget/run --generate --resume s.ckpt --sample 500 --temperature 0.8\n"
    "                                                write text from a saved state (any layout's)\n"
    "\n"
    "The training run is single-device by definition: run it without mpirun or with -np 1.\n"
    "The calculator takes the model flags, --batch and --dtype; the training flags (--steps,\n"
    "--save, ...) need --train, and the calculator's (--model, --zero, ...) are refused with it.\n";

// Chapter flags of the training run (the calculator's are in calc_cli.c).
typedef struct TrainFlags {
    int train;  // run the real training instead of the calculator
} TrainFlags;

static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank);
static void train(const LabArgs *args);
static void generate(const LabArgs *args);

// The two halves take different flags; one of the other half would do nothing, so it is
// refused: the calculator reads the model flags, --batch and --dtype only (it trains nothing,
// saves nothing, prints no progress), and --train trains the lab's model, which the
// calculator's flags (--model, --zero, --gpu ...) do not describe.
static void refuse_flags_of_the_other_half(int argc, char **argv, int train, const FlagSpec *calc,
                                         int ncalc) {
    if (train) {
        for (int i = 0; i < ncalc; i++)
            if (lab_flag_given(argc, argv, calc[i].name))
                lab_fail_collective("%s is the calculator's (it sizes a model on paper) and "
                                    "--train trains the lab's GPT of --layers --channels --heads "
                                    "--seq --vocab: drop %s or --train", calc[i].name,
                                    calc[i].name);
        return;
    }
    static const char *const calculators[] = {"--batch", "--dtype", "--recompute", NULL};
    const char *name = lab_shared_flag_given(argc, argv, LAB_FLAGS_SINGLE & ~LAB_FLAGS_MODEL,
                                             calculators);
    if (name)
        lab_fail_collective("%s is a training run's flag and needs --train (without it the "
                            "calculator runs, which takes the model flags, --batch and --dtype "
                            "only): add --train, or drop %s", name, name);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    TrainFlags tf = {.train = 0};
    CalcCliArgs calc = calc_cli_defaults();

    FlagSpec train_flags[] = {
        {"--train", FLAG_BOOL, &tf.train, 0, 1, NULL,
         "train the tiny GPT on one device; print measured vs predicted memory"},
    };
    int ncalc = 0;
    const FlagSpec *calc_flags = calc_cli_flags(&calc, &ncalc);
    const int ntrain = (int)(sizeof train_flags / sizeof train_flags[0]);
    int nextra = ntrain + ncalc;
    FlagSpec *extra = lab_xcalloc((size_t)nextra, sizeof(FlagSpec));
    memcpy(extra, train_flags, sizeof(train_flags));
    memcpy(extra + ntrain, calc_flags, (size_t)ncalc * sizeof(FlagSpec));
    lab_parse_args_for(LAB_FLAGS_SINGLE | LAB_FLAGS_RECOMPUTE, argc, argv, &args, extra, nextra, "00_memory_budget/run", USAGE);
    free(extra);
    if (args.generate) {  // sampling from saved weights: neither the calculator nor training
        if (tf.train)
            lab_fail_collective("--generate samples from saved weights without training: drop "
                                "--train (or --generate)");
        if (dist_size() != 1)
            lab_fail_collective("--generate runs on one device: launch it with -np 1 (or without "
                                "mpirun), not with %d ranks", dist_size());
        generate(&args);
        dist_finalize();
        return 0;
    }
    refuse_flags_of_the_other_half(argc, argv, tf.train, calc_flags, ncalc);

    if (tf.train) {
        if (dist_size() != 1)
            lab_fail_collective("00_memory_budget --train is the single-device run: launch it "
                                "with -np 1 (or without mpirun), not with %d ranks", dist_size());
        // a run that cannot fit is refused before the first allocation, with the numbers
        mem_refuse_if_it_cannot_fit(&args, predict_memory, NULL, 1);
        train(&args);
    } else if (dist_rank() == 0) {
        calc_cli_run(&calc, &args);
    }
    dist_finalize();
    return 0;
}

// The memory the runtime really allocated, next to the calculator's prediction.
static void print_measured_vs_predicted(const GPT2Config *cfg, int B, int T, int bf16,
                                        GPT2Recompute rc) {
    CalcModel cm = calc_model_from_gpt2(cfg);
    CalcSetup cs = calc_setup_default();
    cs.dtype = bf16 ? CALC_BF16 : CALC_FP32;
    cs.micro_batch = B;
    cs.seq_len = T;
    cs.recompute = (CalcRecompute)rc;  // (the same numbering; the paper's formula for the mode)
    CalcBreakdown pred = calc_memory(&cm, &cs);
    double acts_lab = calc_activation_bytes_recompute(cfg, B, T, bf16 ? GPT2_BF16 : GPT2_FP32, rc);
    struct { const char *name; MemCategory cat; double predicted; } rows[] = {
        {"params", MEM_PARAMS, pred.params},  {"grads", MEM_GRADS, pred.grads},
        {"master", MEM_MASTER, pred.master},  {"adam m", MEM_OPT_M, pred.m},
        {"adam v", MEM_OPT_V, pred.v},    {"activations", MEM_ACTS, acts_lab},
    };
    char a[32], b[32], c[32];
    printf("\nMemory of this run: measured (peak per category) vs predicted\n");
    printf("  %-12s %14s %14s %10s\n", "category", "measured", "predicted", "match");
    int exact_ok = 1;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        double meas = (double)mem_peak(rows[i].cat);
        int exact = meas == rows[i].predicted;
        if (rows[i].cat != MEM_ACTS && !exact) exact_ok = 0;
        printf("  %-12s %14s %14s %10s\n", rows[i].name, mem_format(a, sizeof a, meas),
               mem_format(b, sizeof b, rows[i].predicted),
               exact ? "exact" : "MISMATCH");
    }
    printf("  model state (params+grads+master+m+v) = %.0f bytes = %.1f bytes/param (%s)\n",
           pred.params + pred.grads + pred.master + pred.m + pred.v,
           (pred.params + pred.grads + pred.master + pred.m + pred.v) /
               (double)gpt2_param_count(cfg),
           exact_ok ? "matches the runtime exactly" : "DOES NOT match the runtime");
    if (rc == GPT2_RECOMPUTE_NONE)
        printf("  activations: the lab keeps every tensor llm.c keeps (incl. the (B,NH,T,T) attention\n"
               "  matrices, logits and probs) and the gradients of one block's = %s; the Korthikanti\n"
               "  et al. formula for the same shapes (%s) gives %s. See README: the real run.\n",
               mem_format(a, sizeof a, acts_lab), bf16 ? "bf16, 2 bytes" : "fp32, 2 bytes -> 4",
               mem_format(b, sizeof b, pred.acts));
    else
        printf("  activations: --recompute %s: each block keeps %s;\n"
               "  one layer of the rest is the scratch its backward recomputes into; with the outer\n"
               "  tensors and the gradients of one block's = %s (without recomputation: %s);\n"
               "  the Korthikanti et al. formula for the same shapes and recomputation (%s) gives %s.\n",
               gpt2_recompute_name(rc),
               rc == GPT2_RECOMPUTE_FULL ? "only its input" : "all but the attention scores and softmax",
               mem_format(a, sizeof a, acts_lab),
               mem_format(b, sizeof b, calc_activation_bytes_lab(cfg, B, T, bf16 ? GPT2_BF16 : GPT2_FP32)),
               bf16 ? "bf16, 2 bytes" : "fp32, 2 bytes -> 4", mem_format(c, sizeof c, pred.acts));
    if (bf16)
        printf("  (--dtype bf16: the blocks' saved activations are stored in bf16; one layer of\n"
               "  them, the embedding's and head's activations and all gradients stay fp32)\n");
}

// What recomputation cost: the model FLOPs the backwards ran again (counted as they ran) against
// the step's (gpt2_flops_per_step), and the time they took against the step's compute time.
// The formula: full recomputation reruns each block's forward, about a third of the step's 6N
// FLOPs per token (the notes' 4/3); selective only QK^T and att*V, 4*C*T per token and block
// (bf16: ln1 and the qkv matmul too, gpt2_recompute_flops_dtype).
static void print_recompute_cost(const Session *s, int B, int T, double step_seconds) {
    const GPT2 *m = &s->model;
    const int steps = session_steps_run(s);
    const double step = gpt2_flops_per_step(&s->cfg, B, T);
    const double counted = m->rc_flops / steps;
    const double formula = s->cfg.L * gpt2_recompute_flops_dtype(&s->cfg, m->recompute, m->dtype, B, T);
    gpt2_print_recompute_flops(counted, formula, "L", 1, step, m->recompute, m->dtype);
    printf("  time              %.2f ms of %.2f ms forward+backward recomputing -> measured ratio "
           "%.3f (step / step without it)\n", 1e3 * m->rc_seconds / steps, 1e3 * step_seconds / steps,
           step_seconds / (step_seconds - m->rc_seconds));
}

static void print_header(const Session *s) {
    char buf[32], model[128];
    printf("tiny %s (%s %s), batch %d x %d, device %s\n",
           session_model_line(s, model, sizeof model),
           mem_format(buf, sizeof buf, (double)s->n * (s->bf16 ? 2 : 4)), s->bf16 ? "bf16" : "fp32",
           s->args->batch, s->T, s->model.k->name);
    if (!s->args->data)
        printf("data: synthetic Markov source, entropy rate %.4f nats/token; loss floor for T=%d: "
               "%.4f (ln V = %.4f at init)\n", data_entropy_rate(&s->data), s->T,
               data_loss_floor(&s->data, s->T), log((double)s->cfg.V));
}

// The memory this run will allocate, predicted before anything is allocated: the model state
// (parameters and gradients in the model's type, bf16's fp32 master, Adam's m and v in fp32:
// what session_init allocates; the calculator's calc_bytes_per_param says the same, but it is
// exercise 00.1, and this oracle run must not depend on a student's stub), the activations this
// runtime keeps for (B, T) (calc_activation_bytes_lab) and the batch and scratch buffers:
// common/mem_predict.c. Only on the CPU: --device cuda allocates on the GPU, whose memory the
// runtime reports itself.
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    (void)ctx, (void)rank;
    GPT2Config cfg = lab_args_config(args);
    return mem_predict_replica_recompute(&cfg, batch, strcmp(args->dtype, "bf16") == 0, 1,
                                         lab_args_recompute(args));
}

static void train(const LabArgs *args) {
    // The model (parameters initialized from --seed, gradients, activations for (B, T)), the
    // optimizer (fp32: AdamW updates the parameters themselves; bf16: an fp32 master copy, 4
    // more bytes per parameter, because an update smaller than half a bf16 step would round
    // away in the bf16 weights), Adam's m and v, the data (the global batch of step s is a
    // pure function of (data seed, s)): common/session.c; the steps: common/train.c.
    Session s;
    session_init(&s, args, args->batch, 1);
    const int B = args->batch, T = s.T;
    double compute_seconds = 0;  // forward + backward (what recomputation adds to)
    session_start_at(&s, session_load_or_init(&s, (uint64_t)args->seed));  // resumed/loaded/fresh
    if (!args->quiet) print_header(&s);

    // (the next step is step + 1; after a rollback, --on-spike, the checkpoint's)
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (fault injection: --kill-rank 0 --kill-step, --inject-oom-step)
        // 1. the batch of this step
        data_batch(&s.data, (uint64_t)step, B, T, 0, B, s.inputs, s.targets);
        // 2. forward: mean cross-entropy over the B*T positions
        double t0 = lab_now();
        int tok = trace_begin("forward", TRACE_COMPUTE);
        gpt2_zero_grad(&s.model);
        float loss = gpt2_forward(&s.model, s.inputs, s.targets);
        trace_end(tok);
        // 3. backward: d(mean loss)/d(loss at a position) = 1/(B*T)
        double t1 = lab_now();
        tok = trace_begin("backward", TRACE_COMPUTE);
        gpt2_backward(&s.model, 1.0f / (float)(B * T));
        trace_end(tok);
        session_inject_nan(&s, step, 0);  // fault injection: --inject-nan-step
        // 4. unless the loss spiked (--on-spike: warn, skip, rollback, stop), clip the global
        //    gradient norm (NaN/Inf stops the run, or --on-nan skip skips the update), then AdamW
        //    on the master. bf16: the gradients are widened to fp32 a chunk at a time, AdamW
        //    updates the fp32 master, then the bf16 weights become the master rounded to nearest
        //    even.
        double t2 = lab_now();
        if (session_may_update(&s, step, loss)) {
            tok = trace_begin("optimizer", TRACE_COMPUTE);
            double norm_sq = train_adamw_step(&s.opt, &s.model, step, s.master, s.opt_m, s.opt_v,
                                              s.plist, s.nplist);
            trace_end(tok);
            session_grad_norm_sq(&s, norm_sq);  // the health line's grad norm (before clipping)
        }
        compute_seconds += t2 - t0;
        session_phase(&s, "forward", t1 - t0);
        session_phase(&s, "backward", t2 - t1);
        session_phase(&s, "optimizer", lab_now() - t2);
        session_step_end(&s, step, loss);  // health line, --log, periodic --save
    }

    session_finish(&s);  // final --save, --save-weights, --trace
    session_print_throughput(&s, 0);
    if (!args->quiet && session_steps_run(&s) > 0)
        print_measured_vs_predicted(&s.cfg, B, T, s.bf16, s.model.recompute);
    if (!args->quiet && session_steps_run(&s) > 0 && s.model.recompute != GPT2_RECOMPUTE_NONE)
        print_recompute_cost(&s, B, T, compute_seconds);
    if (args->dump) {  // for the test harness: losses, final weights, measured memory
        RunResults out;
        session_dump_open(&s, &out);
        session_dump_close(&s, &out);
    }
    session_free(&s);
}

// --generate: the whole model from a training state (--resume, written by any layout: a state is
// always the whole model) or a weight file (--load-weights), then --sample N bytes from it.
static void generate(const LabArgs *a) {
    GPT2Config cfg = lab_args_config(a);
    const size_t n = gpt2_param_count(&cfg);
    float *llmc = lab_xmalloc(n * sizeof(float));
    char from[1100];
    if (a->resume) {
        float *mem = mem_alloc(n * sizeof(float), MEM_OTHER, DEV_CPU);
        float *m = mem_alloc(n * sizeof(float), MEM_OTHER, DEV_CPU);
        float *v = mem_alloc(n * sizeof(float), MEM_OTHER, DEV_CPU);
        int step = ckpt_resume_training(a->resume, &cfg, mem, m, v, n);
        gpt2_to_llmc(&cfg, mem, llmc);
        mem_free(mem), mem_free(m), mem_free(v);
        snprintf(from, sizeof from, "the training state %s (step %d)", a->resume, step);
    } else {
        ckpt_load_weights(a->load_weights, &cfg, llmc);
        snprintf(from, sizeof from, "the weights %s", a->load_weights);
    }
    printf("generate: GPT-2 V=%d T=%d L=%d C=%d NH=%d, %zu parameters, from %s\n", cfg.V, cfg.T,
           cfg.L, cfg.C, cfg.NH, n, from);
    TextSampling sp = {a->sample, a->temperature, a->top_k, (uint64_t)a->sample_seed};
    uint8_t *text = lab_xmalloc((size_t)a->sample);
    double seconds = text_sample(&cfg, llmc, &sp, text);
    text_print_sample(&sp, text, seconds, "on one device");
    free(text);
    free(llmc);
}
