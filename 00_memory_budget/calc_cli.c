// calc_cli.c: the chapter's command line for the calculator, the cost estimate and the planner.
//
//   ./00_memory_budget/run                                   the lab's tiny model, fp32 + Adam
//   ./00_memory_budget/run --params 7B --dtype bf16 --gpu a100-80     the notes' 112 GB
//   ./00_memory_budget/run --model 70b --cost --tokens 15T --gpu h100 --mfu 0.45
//   ./00_memory_budget/run --model 70b --dtype bf16 --plan --gpus 8 --gpu h100
//   ./00_memory_budget/run --model 70b --dtype bf16 --layout 64x8x1 --zero 1 --seq-parallel
//   ./00_memory_budget/run --layers 4 --channels 32 --heads 4 --seq 16 --batch 8 --layout 2x2x2
//                                     chapter 09's 8-rank run, predicted: memory and bytes per rank
#include <stdlib.h>
#include <string.h>
#include "calc.h"
#include "check.h"

CalcCliArgs calc_cli_defaults(void) {
    CalcCliArgs a;
    memset(&a, 0, sizeof a);
    a.model = "lab";
    a.params = NULL;
    a.dims = NULL;
    a.optimizer = "adam";
    a.zero = 0;
    a.fsdp = 0;
    a.dp = a.tp = a.pp = 1;
    a.micro_batch = 0;
    a.seq_len = 0;
    a.gpu = NULL;
    a.mfu = 0.45f;        // the notes' example; 40-55 % is excellent
    a.gpus = 8;
    a.price = 3.0f;       // the notes' $/GPU-hour
    a.gpus_per_node = 8;
    a.global_batch = 512;
    a.latency_us = 5.0f;
    a.top = 10;
    a.layout = NULL;
    a.micro_batches = 0;
    a.chunks = 1;
    return a;
}

const FlagSpec *calc_cli_flags(CalcCliArgs *a, int *n) {
    static FlagSpec f[CALC_CLI_MAX_FLAGS];
    int k = 0;
    f[k++] = (FlagSpec){"--model", FLAG_STRING, &a->model, 0, 0, NULL,
        "lab (the --vocab/--seq/... model), tiny, gpt2-124m/350m/774m/1.5b, llama2-7b/13b, "
        "llama3-70b/405b (aliases 124m ... 7b 13b 70b 405b)"};
    f[k++] = (FlagSpec){"--params", FLAG_STRING, &a->params, 0, 0, NULL,
        "a raw parameter count instead of a model: 7B, 124M, 7e9 (model states only)"};
    f[k++] = (FlagSpec){"--dims", FLAG_STRING, &a->dims, 0, 0, NULL,
        "explicit model: L=80,C=8192,NH=64,KV=8,FFN=28672,V=128256,T=8192,arch=llama"};
    f[k++] = (FlagSpec){"--list-presets", FLAG_BOOL, &a->list, 0, 1, NULL,
        "list the model and GPU presets and exit"};
    f[k++] = (FlagSpec){"--optimizer", FLAG_CHOICE, &a->optimizer, 0, 0, "adam|sgd",
        "adam (m and v) or sgd with momentum (one buffer)"};
    f[k++] = (FlagSpec){"--zero", FLAG_INT, &a->zero, 0, 3, NULL,
        "ZeRO stage over the DP group: 1 optimizer, 2 + grads, 3 + params"};
    f[k++] = (FlagSpec){"--fsdp", FLAG_BOOL, &a->fsdp, 0, 1, NULL,
        "with a --layout of the lab model: chapter 09's --fsdp (every unit of a chunk in dp "
        "pieces; the states of --zero 3)"};
    f[k++] = (FlagSpec){"--dp", FLAG_INT, &a->dp, 1, 1 << 24, NULL, "data-parallel degree"};
    f[k++] = (FlagSpec){"--tp", FLAG_INT, &a->tp, 1, 1 << 16, NULL,
        "tensor-parallel degree (divides the heads)"};
    f[k++] = (FlagSpec){"--pp", FLAG_INT, &a->pp, 1, 1 << 16, NULL,
        "pipeline-parallel degree (splits the layers)"};
    f[k++] = (FlagSpec){"--seq-parallel", FLAG_BOOL, &a->seq_parallel, 0, 1, NULL,
        "sequence parallelism with TP: activations split by tp too"};
    f[k++] = (FlagSpec){"--micro-batch", FLAG_INT, &a->micro_batch, 0, 1 << 20, NULL,
        "sequences per micro-batch b (0: --batch for the lab model, else 1)"};
    f[k++] = (FlagSpec){"--seq-len", FLAG_INT, &a->seq_len, 0, 1 << 24, NULL,
        "tokens per sequence s (0: the model's T)"};
    f[k++] = (FlagSpec){"--gpu", FLAG_CHOICE, &a->gpu, 0, 0, "a100-40|a100-80|h100|h200",
        "GPU to fit in (default: none for the table, h100 for --cost/--plan)"};
    f[k++] = (FlagSpec){"--gpu-mem", FLAG_FLOAT, &a->gpu_mem, 0, 1e6, NULL,
        "GPU memory in GB = 1e9 bytes (0: the --gpu preset's)"};
    f[k++] = (FlagSpec){"--peak-tflops", FLAG_FLOAT, &a->peak_tflops, 0, 1e6, NULL,
        "peak bf16 TFLOP/s per GPU (0: the --gpu preset's)"};
    f[k++] = (FlagSpec){"--cost", FLAG_BOOL, &a->cost, 0, 1, NULL,
        "training cost: GPU-hours = 6 N tokens / (peak x MFU), days, dollars"};
    f[k++] = (FlagSpec){"--tokens", FLAG_STRING, &a->tokens, 0, 0, NULL,
        "training tokens for --cost: 15T, 1e12, 300B"};
    f[k++] = (FlagSpec){"--mfu", FLAG_FLOAT, &a->mfu, CALC_MFU_MIN, 1, NULL,
        "model FLOPs utilization (must be > 0; 0.40-0.55 is excellent)"};
    f[k++] = (FlagSpec){"--gpus", FLAG_INT, &a->gpus, 1, 1 << 24, NULL,
        "GPUs for --cost's wall clock and for --plan"};
    f[k++] = (FlagSpec){"--price", FLAG_FLOAT, &a->price, 0, 1e6, NULL, "dollars per GPU-hour"};
    f[k++] = (FlagSpec){"--plan", FLAG_BOOL, &a->plan, 0, 1, NULL,
        "rank the DP x TP x PP layouts that fit on --gpus GPUs"};
    f[k++] = (FlagSpec){"--gpus-per-node", FLAG_INT, &a->gpus_per_node, 1, 1024, NULL,
        "GPUs per node (TP stays inside a node)"};
    f[k++] = (FlagSpec){"--global-batch", FLAG_INT, &a->global_batch, 1, 1 << 24, NULL,
        "sequences per optimizer step for --plan"};
    f[k++] = (FlagSpec){"--bw-intra", FLAG_FLOAT, &a->bw_intra, 0, 1e5, NULL,
        "GB/s per GPU inside a node (0: the preset's NVLink)"};
    f[k++] = (FlagSpec){"--bw-inter", FLAG_FLOAT, &a->bw_inter, 0, 1e5, NULL,
        "GB/s per GPU between nodes (0: the preset's InfiniBand)"};
    f[k++] = (FlagSpec){"--latency-us", FLAG_FLOAT, &a->latency_us, 0, 1e6, NULL,
        "alpha: microseconds per message hop"};
    f[k++] = (FlagSpec){"--layout", FLAG_STRING, &a->layout, 0, 0, NULL,
        "DPxTPxPP, e.g. 2x2x2: memory and bytes per step of every stage, step time, MFU"};
    f[k++] = (FlagSpec){"--micro-batches", FLAG_INT, &a->micro_batches, 0, 1 << 20, NULL,
        "micro-batches per step m (0: 2 for the lab model, as chapter 09; pp for the others)"};
    f[k++] = (FlagSpec){"--chunks", FLAG_INT, &a->chunks, 1, 1 << 16, NULL,
        "model chunks per pipeline rank v (interleaved 1F1B)"};
    f[k++] = (FlagSpec){"--top", FLAG_INT, &a->top, 1, 1000, NULL, "rows of the plan table"};
    LAB_CHECK(k <= CALC_CLI_MAX_FLAGS, "calc_cli_flags: %d flags, room for %d", k,
              CALC_CLI_MAX_FLAGS);
    *n = k;
    return f;
}

static void print_presets(FILE *out) {
    char ours[32], pub[32];
    fprintf(out, "Model presets (parameter counts: ours from the dims, and the published size)\n");
    fprintf(out, "  %-12s %-5s %10s %10s %7s %6s %4s %6s %4s %3s %6s  %s\n", "name", "alias",
            "params", "published", "V", "T", "L", "C", "NH", "KV", "FFN", "about");
    for (int i = 0; i < calc_model_preset_count(); i++) {
        const CalcModel *m = calc_model_preset_at(i);
        fprintf(out, "  %-12s %-5s %10s %10s %7d %6d %4d %6d %4d %3d %6d  %s\n", m->name, m->alias,
                calc_fmt_count(ours, sizeof ours, (double)m->nparams),
                calc_fmt_count(pub, sizeof pub, m->published), m->V, m->T, m->L, m->C, m->NH,
                m->KV, m->FFN, m->about);
    }
    fprintf(out, "\nGPU presets (memory as GB = 1e9 and GiB = 2^30; peak = dense bf16)\n");
    fprintf(out, "  %-8s %-11s %9s %9s %12s %11s %14s\n", "name", "label", "GB", "GiB",
            "peak TFLOP/s", "NVLink GB/s", "InfiniBand GB/s");
    for (int i = 0; i < calc_gpu_preset_count(); i++) {
        const CalcGpu *g = calc_gpu_preset_at(i);
        fprintf(out, "  %-8s %-11s %9.2f %9.2f %12.0f %11.0f %14.0f\n", g->name, g->label,
                g->mem_bytes / 1e9, g->mem_bytes / (1024.0 * 1024 * 1024), g->peak_flops / 1e12,
                g->bw_intra / 1e9, g->bw_inter / 1e9);
    }
}

// The model from --model / --params / --dims (only one of them).
static CalcModel resolve_model(const CalcCliArgs *a, const LabArgs *lab) {
    int by_model = a->model && strcmp(a->model, "lab") != 0;
    int given = by_model + (a->params != NULL) + (a->dims != NULL);
    if (given > 1)
        lab_fail_collective("give only one of --model, --params and --dims (got%s%s%s)",
                            by_model ? " --model" : "", a->params ? " --params" : "",
                            a->dims ? " --dims" : "");
    if (a->params) {
        double n = 0;
        const char *err = calc_parse_count(a->params, "--params", &n);
        if (err) lab_fail_collective("%s", err);
        return calc_model_raw((int64_t)(n + 0.5));
    }
    if (a->dims) {
        CalcModel m;
        const char *err = calc_parse_dims(a->dims, &m);
        if (err) lab_fail_collective("%s", err);
        return m;
    }
    if (!by_model) {
        GPT2Config cfg = lab_args_config(lab);
        return calc_model_from_gpt2(&cfg);
    }
    const CalcModel *m = calc_model_preset(a->model);
    if (!m) lab_fail_collective("%s", calc_model_preset_error(a->model));
    return *m;
}

// --layout "2x2x2": DP x TP x PP, three positive integers. Returns NULL or what is wrong.
static const char *parse_layout(const char *text, int *dp, int *tp, int *pp) {
    static char err[256];
    int n = -1;
    if (strspn(text, "0123456789x") != strlen(text) ||
        sscanf(text, "%dx%dx%d%n", dp, tp, pp, &n) != 3 || n < 0 || text[n] != '\0' || *dp < 1 ||
        *tp < 1 || *pp < 1) {
        snprintf(err, sizeof err, "--layout '%s': expected DPxTPxPP, three positive integers "
                 "(e.g. 2x2x2, 64x8x1, 256x8x8)", text);
        return err;
    }
    return NULL;
}

int calc_cli_run(const CalcCliArgs *a, const LabArgs *lab) {
    if (a->list) {
        print_presets(stdout);
        return 0;
    }
    CalcModel model = resolve_model(a, lab);
    int is_lab = strcmp(model.name, "lab") == 0;
    CalcSetup s = calc_setup_default();
    if (calc_parse_dtype(lab->dtype, &s.dtype) != 0)
        lab_fail_collective("--dtype %s: valid: fp32, bf16 (bf16 = mixed precision)", lab->dtype);
    if (calc_parse_optim(a->optimizer, &s.optim) != 0)
        lab_fail_collective("--optimizer %s: valid: adam, sgd", a->optimizer);
    // (--recompute is a shared flag, LAB_FLAGS_RECOMPUTE: the training run takes it too)
    if (calc_parse_recompute(lab->recompute, &s.recompute) != 0)
        lab_fail_collective("--recompute %s: valid: none, selective, full", lab->recompute);
    s.zero = a->zero;
    s.dp = a->dp;
    s.tp = a->tp;
    s.pp = a->pp;
    s.sp = a->seq_parallel;
    s.micro_batch = a->micro_batch > 0 ? a->micro_batch : is_lab ? lab->batch : 1;
    s.seq_len = a->seq_len;
    s.micro_batches = a->micro_batches;
    s.chunks = a->chunks;
    const char *err = NULL;
    if (a->layout) {
        if (a->dp != 1 || a->tp != 1 || a->pp != 1)
            lab_fail_collective("--layout %s and --dp/--tp/--pp both give the layout: use one of "
                                "them", a->layout);
        if (a->plan) lab_fail_collective("--layout details one layout, --plan ranks them all: use one");
        if ((err = parse_layout(a->layout, &s.dp, &s.tp, &s.pp))) lab_fail_collective("%s", err);
        if (is_lab) {
            // chapter 09's run: --batch sequences per step over dp replicas x m micro-batches,
            // the activations its TP stage stores
            if (s.micro_batches == 0) s.micro_batches = 2;
            if (a->micro_batch == 0) {
                if (lab->batch % (s.dp * s.micro_batches) != 0)
                    lab_fail_collective("--batch %d does not split into %d replicas x %d "
                                        "micro-batches; use a multiple of %d (or --micro-batch)",
                                        lab->batch, s.dp, s.micro_batches, s.dp * s.micro_batches);
                s.micro_batch = lab->batch / (s.dp * s.micro_batches);
            }
            if (a->fsdp && a->zero != 0 && a->zero != 3)
                lab_fail_collective("--fsdp with --zero %d: FSDP shards what --zero 3 does; leave "
                                    "--zero out (or 3)", a->zero);
            if (a->fsdp) s.zero = 3, s.fsdp = 1;
            s.acts = CALC_ACTS_LAB;  // what calc_setup_lab sets for a 09 run: its stored
            s.tp_fp32 = 1;           // tensors, TP reduced in fp32 (DP, PP in --dtype), and
            s.grads_whole = 1;       // the whole gradients its TP stage's backward writes
        }
    }
    if (a->fsdp && !s.fsdp)
        lab_fail_collective("--fsdp details chapter 09's FSDP: give it a --layout DPxTPxPP of the "
                            "lab model (--model lab, the default)");
    if ((err = calc_setup_check(&model, &s))) lab_fail_collective("%s", err);

    const CalcGpu *gpu = NULL;
    if (a->gpu) {
        gpu = calc_gpu_preset(a->gpu);
        if (!gpu) lab_fail_collective("%s", calc_gpu_preset_error(a->gpu));
    }
    double capacity = a->gpu_mem > 0 ? a->gpu_mem * 1e9 : gpu ? gpu->mem_bytes : 0;
    const char *label = a->gpu_mem > 0 ? "--gpu-mem" : gpu ? gpu->label : NULL;

    // Every flag is checked before the first line of output: a mistake in --cost or --plan
    // must not hide below a table.
    const CalcGpu *hw = gpu ? gpu : calc_gpu_preset("h100");  // --cost and --plan need a GPU
    const char *hw_label = a->gpu_mem > 0 || a->peak_tflops > 0 ? "custom" : hw->label;
    double peak = a->peak_tflops > 0 ? a->peak_tflops * 1e12 : hw->peak_flops;
    if (a->tokens && !a->cost)
        lab_fail_collective("--tokens %s has no effect without --cost (add --cost for the training "
                            "cost)", a->tokens);
    CalcCostSpec c = {(double)model.nparams, 0, peak, a->mfu, a->gpus, a->price};
    if (a->cost) {
        if (!a->tokens) lab_fail_collective("--cost needs --tokens N (e.g. --tokens 15T)");
        err = calc_parse_count(a->tokens, "--tokens", &c.tokens);
        if (!err) err = calc_cost_check(&c);
        if (err) lab_fail_collective("%s", err);
    }
    CalcPlanSpec p;
    memset(&p, 0, sizeof p);
    if (a->plan || a->layout) {
        if (a->layout && model.arch == CALC_ARCH_RAW)
            lab_fail_collective("--layout needs the model's dimensions to split it (use --model or "
                                "--dims, not --params)");
        // --layout: the GPUs and the global batch are the layout's
        p.gpus = a->layout ? s.dp * s.tp * s.pp : a->gpus;
        p.gpus_per_node = a->gpus_per_node;
        p.global_batch = a->layout ? s.dp * calc_micro_batches(&s) * s.micro_batch : a->global_batch;
        p.seq_len = a->seq_len;
        p.dtype = s.dtype;
        p.optim = s.optim;
        p.mem_bytes = a->gpu_mem > 0 ? a->gpu_mem * 1e9 : hw->mem_bytes;
        p.peak_flops = peak;
        p.mfu = a->mfu;
        p.bw_intra = a->bw_intra > 0 ? a->bw_intra * 1e9 : hw->bw_intra;
        p.bw_inter = a->bw_inter > 0 ? a->bw_inter * 1e9 : hw->bw_inter;
        p.latency = a->latency_us * 1e-6;
        if (a->layout && p.gpus > p.gpus_per_node && p.gpus % p.gpus_per_node != 0)
            lab_fail_collective("--layout %s: %d GPUs are not a whole number of nodes of "
                                "--gpus-per-node %d (valid: a multiple of %d, or at most %d GPUs)",
                                a->layout, p.gpus, p.gpus_per_node, p.gpus_per_node, p.gpus_per_node);
        err = calc_plan_check(&model, &p);
        if (err) lab_fail_collective("%s", err);
    }

    CalcBreakdown b = calc_memory(&model, &s);
    calc_print_memory(stdout, &model, &s, &b);
    if ((is_lab || strcmp(model.name, "tiny") == 0) && !a->layout) {
        GPT2Config cfg = {model.V, model.T, model.L, model.C, model.NH};
        int T = s.seq_len > 0 ? s.seq_len : model.T;
        int bf16 = s.dtype == CALC_BF16;
        const double lab =
            calc_activation_bytes_lab(&cfg, s.micro_batch, T, bf16 ? GPT2_BF16 : GPT2_FP32);
        char bin[32];
        if (s.recompute == CALC_RECOMPUTE_NONE) {
            printf("  this lab's runtime keeps every activation llm.c keeps (%s), and the gradients of "
                   "one block's: %.3f MB = %s for B=%d T=%d (README: the real run)\n",
                   bf16 ? "bf16, one layer in fp32" : "fp32", lab / 1e6,
                   mem_format(bin, sizeof bin, lab), s.micro_batch, T);
        } else {  // (GPT2Recompute numbers its modes as CalcRecompute does)
            char without[32];
            const double rc = calc_activation_bytes_recompute(&cfg, s.micro_batch, T,
                                                              bf16 ? GPT2_BF16 : GPT2_FP32,
                                                              (GPT2Recompute)s.recompute);
            printf("  this lab's runtime with --recompute %s (--train%s) keeps %s, one layer of the "
                   "rest to recompute into, and the gradients of one block's: %.3f MB = %s for "
                   "B=%d T=%d (without: %s; README: recomputation)\n",
                   calc_recompute_name(s.recompute), bf16 ? ", bf16" : "",
                   s.recompute == CALC_RECOMPUTE_FULL ? "each block's input" : "all but the attention scores and softmax",
                   rc / 1e6, mem_format(bin, sizeof bin, rc), s.micro_batch, T,
                   mem_format(without, sizeof without, lab));
        }
    }
    calc_print_bars(stdout, &b, label, capacity);
    if (a->layout) calc_print_layout(stdout, &model, &s, &p, hw_label);
    if (a->cost) {
        CalcCost r = calc_cost(&c);
        calc_print_cost(stdout, &c, &r, hw_label);
    }
    if (a->plan) {
        CalcPlanResult r = calc_plan(&model, &p);
        calc_print_plan(stdout, &model, &p, &r, a->top, hw_label);
        if (r.nfit == 0 && r.min_gpus > 0) {   // show what the smallest fitting count offers
            p.gpus = r.min_gpus;
            CalcPlanResult more = calc_plan(&model, &p);
            calc_print_plan(stdout, &model, &p, &more, a->top, hw_label);
            calc_plan_free(&more);
        }
        calc_plan_free(&r);
    }
    return 0;
}
