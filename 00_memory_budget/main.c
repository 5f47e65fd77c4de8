// 00_memory_budget: where one device's memory goes, and what training costs.
//
// Two halves:
//   ./00_memory_budget/run [--model 7b --dtype bf16 ...]   the calculator, cost and planner
//                                                          (calc.c, planner.c, calc_cli.c)
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
#include "optim.h"
#include "results.h"
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
    "  ./00_memory_budget/run --train --steps 200    train the tiny GPT on one device and\n"
    "                                                compare measured memory with the formula\n"
    "  ./00_memory_budget/run --train --dtype bf16   the same in mixed precision: bf16 params,\n"
    "                                                grads and saved activations, fp32 master\n"
    "                                                and Adam m, v\n"
    "\n"
    "The training run is single-device by definition: run it without mpirun or with -np 1.\n";

// Chapter flags of the training run (the calculator's are in calc_cli.c).
typedef struct TrainFlags {
    int train;     // run the real training instead of the calculator
} TrainFlags;

static void train(const LabArgs *args);

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
    int nextra = 1 + ncalc;
    FlagSpec *extra = lab_xcalloc((size_t)nextra, sizeof(FlagSpec));
    memcpy(extra, train_flags, sizeof(train_flags));
    memcpy(extra + 1, calc_flags, (size_t)ncalc * sizeof(FlagSpec));
    lab_parse_args_for(LAB_FLAGS_SINGLE, argc, argv, &args, extra, nextra, "00_memory_budget/run", USAGE);
    free(extra);

    if (tf.train) {
        if (dist_size() != 1)
            lab_fail_collective("00_memory_budget --train is the single-device run: launch it "
                                "with -np 1 (or without mpirun), not with %d ranks", dist_size());
        train(&args);
    } else if (dist_rank() == 0) {
        calc_cli_run(&calc, &args);
    }
    dist_finalize();
    return 0;
}

// The memory the runtime really allocated, next to the calculator's prediction.
static void print_measured_vs_predicted(const GPT2Config *cfg, int B, int T, int bf16) {
    CalcModel cm = calc_model_from_gpt2(cfg);
    CalcSetup cs = calc_setup_default();
    cs.dtype = bf16 ? CALC_BF16 : CALC_FP32;
    cs.micro_batch = B;
    cs.seq_len = T;
    CalcBreakdown pred = calc_memory(&cm, &cs);
    double acts_lab = calc_activation_bytes_lab(cfg, B, T, bf16 ? GPT2_BF16 : GPT2_FP32);
    struct { const char *name; MemCategory cat; double predicted; } rows[] = {
        {"params", MEM_PARAMS, pred.params},  {"grads", MEM_GRADS, pred.grads},
        {"master", MEM_MASTER, pred.master},  {"adam m", MEM_OPT_M, pred.m},
        {"adam v", MEM_OPT_V, pred.v},    {"activations", MEM_ACTS, acts_lab},
    };
    char a[32], b[32];
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
    printf("  activations: the lab keeps every tensor llm.c keeps (incl. the (B,NH,T,T) attention\n"
           "  matrices, logits and probs) and the gradients of one block's = %s; the Korthikanti\n"
           "  et al. formula for the same shapes (%s) gives %s. See README: the real run.\n",
           mem_format(a, sizeof a, acts_lab), bf16 ? "bf16, 2 bytes" : "fp32, 2 bytes -> 4",
           mem_format(b, sizeof b, pred.acts));
    if (bf16)
        printf("  (--dtype bf16: the blocks' saved activations are stored in bf16; one layer of\n"
               "  them, the embedding's and head's activations and all gradients stay fp32)\n");
}

static void train(const LabArgs *args) {
    GPT2Config cfg = lab_args_config(args);
    Device dev = lab_args_device(args);
    const int bf16 = strcmp(args->dtype, "bf16") == 0;  // mixed precision
    const int B = args->batch, T = cfg.T;
    trace_init(args->trace);

    // The model: parameters initialized from --seed, gradients, activations for (B, T).
    GPT2 model;
    gpt2_build_dtype(&model, cfg, dev, bf16 ? GPT2_BF16 : GPT2_FP32);
    gpt2_alloc_grads(&model);
    gpt2_alloc_acts(&model, B, T);
    const Kernels *k = model.k;
    const size_t n = model.num_params;
    GPT2Param *plist = lab_xcalloc((size_t)gpt2_params(&cfg, NULL), sizeof(GPT2Param));
    int nplist = gpt2_params(&cfg, plist);

    // The weights AdamW updates. fp32: the parameters themselves. bf16: an fp32 master copy
    // (4 more bytes per parameter), because an update smaller than half a bf16 step (1/256 of
    // the weight) would round away if added to the bf16 weights directly.
    // (common/train.h holds these steps, shared with the data-parallel chapters.)
    float *master = train_master_alloc(&model);

    // The optimizer state: Adam's m and v, one float per parameter each.
    float *opt_m = mem_alloc(n * sizeof(float), MEM_OPT_M, dev);
    float *opt_v = mem_alloc(n * sizeof(float), MEM_OPT_V, dev);
    AdamW opt = lab_args_adamw(args);

    // The starting weights, into `master`: resumed, loaded, or fresh from --seed.
    int start = 0;
    if (args->resume) {
        start = ckpt_resume_training(args->resume, &cfg, master, opt_m, opt_v, n);
        printf("resumed from %s at step %d\n", args->resume, start);
    } else if (args->load_weights) {
        ckpt_load_weights_into(args->load_weights, &cfg, master, n);
    } else {
        train_master_init(&model, master, (uint64_t)args->seed);
    }
    // bf16: the weights the forward pass reads are the master rounded to nearest even.
    train_master_to_model(&model, master);

    // The data: the global batch of step s is a pure function of (data seed, s).
    DataSource data;
    lab_args_data(args, &data);
    int *inputs = mem_alloc((size_t)B * T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)B * T * sizeof(int), MEM_OTHER, DEV_CPU);

    if (!args->quiet) {
        char buf[32];
        printf("tiny GPT-2: V=%d T=%d L=%d C=%d NH=%d, %zu parameters (%s %s), batch %d x %d, "
               "device %s\n", cfg.V, cfg.T, cfg.L, cfg.C, cfg.NH, n,
               mem_format(buf, sizeof buf, (double)n * (bf16 ? 2 : 4)), bf16 ? "bf16" : "fp32",
               B, T, k->name);
        if (!args->data)
            printf("data: synthetic Markov source, entropy rate %.4f nats/token; loss floor for "
                   "T=%d: %.4f (ln V = %.4f at init)\n", data_entropy_rate(&data), T,
                   data_loss_floor(&data, T), log((double)cfg.V));
    }

    const int end = lab_args_end_step(args);
    float *losses = lab_xcalloc((size_t)args->steps, sizeof(float));   // NaN: not run here
    for (int s = 0; s < args->steps; s++) losses[s] = NAN;
    double t_start = lab_now(), t_last = t_start;
    for (int step = start; step < end; step++) {
        // 1. the batch of this step
        data_batch(&data, (uint64_t)step, B, T, 0, B, inputs, targets);
        // 2. forward: mean cross-entropy over the B*T positions
        int tok = trace_begin("forward", TRACE_COMPUTE);
        gpt2_zero_grad(&model);
        float loss = gpt2_forward(&model, inputs, targets);
        trace_end(tok);
        // 3. backward: d(mean loss)/d(loss at a position) = 1/(B*T)
        tok = trace_begin("backward", TRACE_COMPUTE);
        gpt2_backward(&model, 1.0f / (float)(B * T));
        trace_end(tok);
        if (step == args->inject_nan_step) train_inject_nan(&model);  // fault injection
        // 4. clip the global gradient norm (fails the run on NaN/Inf), then AdamW on the master.
        //    bf16: the gradients are widened to fp32 a chunk at a time, AdamW updates the fp32
        //    master, then the bf16 weights become the master rounded to nearest even.
        tok = trace_begin("optimizer", TRACE_COMPUTE);
        train_adamw_step(&opt, &model, step, master, opt_m, opt_v, plist, nplist);
        trace_end(tok);
        losses[step] = loss;

        double now = lab_now();
        int last = step == end - 1;
        if (!args->quiet && args->log_every > 0 && (step % args->log_every == 0 || last)) {
            double per_step = (now - t_start) / (step - start + 1);
            printf("step %5d/%d  loss %.4f  lr %.2e  %8.0f tok/s  ETA %5.1f s\n", step + 1,
                   args->steps, loss, adamw_lr(&opt, step), (double)B * T / (now - t_last),
                   per_step * (args->steps - step - 1));
            fflush(stdout);
        }
        t_last = now;
        if (args->save && args->save_every > 0 && (step + 1) % args->save_every == 0 && !last) {
            // periodic checkpoint (the final one is written after the loop); bf16: the state
            // holds the fp32 master weights, so a resume is exact
            ckpt_save_training(args->save, &cfg, step + 1, (uint64_t)args->seed,
                               (uint64_t)args->data_seed, master, opt_m, opt_v, n);
        }
    }
    double elapsed = lab_now() - t_start;

    // Checkpoints and results: host copies of the parameters (bf16: the weights the forward
    // pass reads, widened to fp32; the training state keeps the fp32 master instead).
    float *host_params = lab_xmalloc(n * sizeof(float));
    train_params_to_host(&model, host_params);
    if (args->save) {
        ckpt_save_training(args->save, &cfg, end, (uint64_t)args->seed, (uint64_t)args->data_seed,
                           master, opt_m, opt_v, n);
        if (!args->quiet) printf("saved training state (step %d) to %s\n", end, args->save);
    }
    if (args->save_weights) ckpt_save_weights(args->save_weights, &cfg, host_params);

    if (!args->quiet && end > start) {
        printf("%d steps in %.2f s: %.0f tokens/s\n", end - start, elapsed,
               (double)B * T * (end - start) / elapsed);
        print_measured_vs_predicted(&cfg, B, T, bf16);
    }
    if (args->dump) {   // for the test harness: losses, final weights, measured memory
        RunResults out;
        results_init(&out, end, n);
        memcpy(out.losses, losses, (size_t)end * sizeof(float));
        memcpy(out.params, host_params, n * sizeof(float));
        results_set_memory(&out);
        results_write(args->dump, &out);
        results_free(&out);
    }
    trace_finish();
    free(host_params);
    free(losses);
    free(plist);
    data_free(&data);
    train_master_free(&model, master);  // before gpt2_free: in fp32 it is the parameters
    gpt2_free(&model);
    mem_free(opt_m);
    mem_free(opt_v);
    mem_free(inputs);
    mem_free(targets);
}
