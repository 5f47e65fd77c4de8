// 02_data_parallel: naive single-master DataParallel, the way nn.DataParallel trains.
//
//   make 02_data_parallel && mpirun -np 4 ./02_data_parallel/run [--reduce tree|linear]
//
// Rank 0 is the master (PyTorch's GPU 0); every step:
//   1. replicate  rank 0 sends its current weights to every rank
//   2. scatter    rank 0 makes the whole global batch and sends each rank its B/N rows
//                 ("give me all the data, I split it")
//   3. compute    every rank runs forward and backward on its rows
//   4. gather     the per-rank losses and the gradients come back to rank 0 (a linear or a
//                 tree reduce)
//   5. step       rank 0 alone clips and runs AdamW; the others hold no optimizer state and
//                 wait for the next replicate.
// The table at the end shows the price: rank 0 moves N-1 times the bytes of any other rank and
// the others spend the master's turns waiting. Compare it with 03_ddp's table.
// On one rank this program is single-device training (chapter 00's loop).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "dp_master.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "optim.h"
#include "results.h"
#include "trace.h"
#include "train.h"

static const char *USAGE =
    "02_data_parallel: naive single-master DataParallel. Rank 0 replicates the weights,\n"
    "scatters the batch, collects losses and gradients, and runs the optimizer alone.\n"
    "\n"
    "  mpirun -np 4 ./02_data_parallel/run                  tree reduce of the gradients\n"
    "  mpirun -np 4 ./02_data_parallel/run --reduce linear  every rank sends to rank 0 in turn\n"
    "  mpirun -np 4 ./02_data_parallel/run --dtype bf16     mixed precision: bf16 weights and\n"
    "                                                       gradients on the wire, fp32 master\n"
    "                                                       weights and Adam state on rank 0\n"
    "  mpirun -np 4 ./02_data_parallel/run --trace dp.json  timeline: open it at ui.perfetto.dev\n";

typedef struct DpFlags {
    const char *reduce;  // "tree" | "linear"
} DpFlags;

static void train(const LabArgs *args, const DpFlags *f);

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    DpFlags f = {.reduce = "tree"};
    FlagSpec extra[] = {
        {"--reduce", FLAG_CHOICE, &f.reduce, 0, 0, "tree|linear",
         "how gradients reach rank 0: binomial tree or one rank after another"},
    };
    lab_parse_args(argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]),
                   "02_data_parallel/run", USAGE);
    train(&args, &f);
    dist_finalize();
    return 0;
}

// What each rank reports at the end, gathered to rank 0 as doubles.
enum { R_COMPUTE, R_WAIT, R_COMM, R_STEP, R_SENT, R_RECV, R_PARAMS, R_GRADS, R_OPT, R_COMM_MEM,
       R_TOTAL, R_NFIELDS };

static void print_rank_table(const double *all, int N) {
    char s[7][32];
    printf("\nPer rank (per step)\n");
    printf("  %-10s %10s %10s %10s %10s %11s %11s %10s %10s %10s %10s %10s\n", "rank", "compute",
           "wait", "comm", "step", "sent", "recv", "params", "grads", "optimizer", "comm bufs",
           "peak mem");
    for (int r = 0; r < N; r++) {
        const double *v = all + (size_t)r * R_NFIELDS;
        char who[16];
        snprintf(who, sizeof who, r == 0 ? "%d (master)" : "%d", r);
        printf("  %-10s %7.1f ms %7.1f ms %7.1f ms %7.1f ms %11s %11s %10s %10s %10s %10s %10s\n",
               who, 1e3 * v[R_COMPUTE], 1e3 * v[R_WAIT],
               1e3 * v[R_COMM], 1e3 * v[R_STEP], mem_format(s[0], 32, v[R_SENT]),
               mem_format(s[1], 32, v[R_RECV]), mem_format(s[2], 32, v[R_PARAMS]),
               mem_format(s[3], 32, v[R_GRADS]), mem_format(s[4], 32, v[R_OPT]),
               mem_format(s[5], 32, v[R_COMM_MEM]), mem_format(s[6], 32, v[R_TOTAL]));
    }
}

static void train(const LabArgs *args, const DpFlags *f) {
    GPT2Config cfg = lab_args_config(args);
    Device dev = lab_args_device(args);
    const int bf16 = strcmp(args->dtype, "bf16") == 0;  // mixed precision (see common/train.h)
    // NCCL (GPU buffers; flags.c checks --device cuda) picks this rank's GPU: before allocating
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);
    DistGroup *world = dist_world();
    const int rank = world->rank, N = world->size, master = rank == 0;
    const DpReduce how = strcmp(f->reduce, "linear") == 0 ? DP_REDUCE_LINEAR : DP_REDUCE_TREE;
    const int B = args->batch, T = cfg.T;
    int row0, rows;
    data_slice(B, rank, N, &row0, &rows);  // only to check that B splits evenly; rank 0 splits
    trace_init(args->trace);

    // The model: only the master's weights matter; the others receive them every step.
    GPT2 model;
    gpt2_build_dtype(&model, cfg, dev, bf16 ? GPT2_BF16 : GPT2_FP32);
    gpt2_alloc_grads(&model);
    gpt2_alloc_acts(&model, rows, T);
    const Kernels *k = model.k;
    const size_t n = model.num_params;
    const DistDtype dt = train_dtype(&model);  // what weights and gradients travel as
    const size_t e = dist_dtype_size(dt);      // bytes per element: 4 (fp32) or 2 (bf16)
    GPT2Param *plist = lab_xcalloc((size_t)gpt2_params(&cfg, NULL), sizeof(GPT2Param));
    int nplist = gpt2_params(&cfg, plist);

    // Only the master has an optimizer: its weights (bf16: an fp32 master copy, 4 more bytes
    // per parameter) and its state (8 bytes per parameter).
    float *weights = master ? train_master_alloc(&model) : NULL;
    float *opt_m = master ? mem_alloc(n * sizeof(float), MEM_OPT_M, dev) : NULL;
    float *opt_v = master ? mem_alloc(n * sizeof(float), MEM_OPT_V, dev) : NULL;
    AdamW opt = lab_args_adamw(args);

    int start = 0;
    if (master && args->resume) {
        start = ckpt_resume_training(args->resume, &cfg, weights, opt_m, opt_v, n);
        train_master_to_model(&model, weights);
        if (!args->quiet) printf("resumed from %s at step %d\n", args->resume, start);
    } else if (master && args->load_weights) {
        ckpt_load_weights_into(args->load_weights, &cfg, weights, n);
        train_master_to_model(&model, weights);
    } else if (master) {
        train_master_init(&model, weights, (uint64_t)args->seed);
    }
    dist_broadcast(&start, 1, DIST_I32, 0, world);

    // The data: the master makes the whole global batch; every rank gets its rows.
    DataSource data;
    lab_args_data(args, &data);
    int *all_inputs = master ? mem_alloc((size_t)B * T * sizeof(int), MEM_COMM, DEV_CPU) : NULL;
    int *all_targets = master ? mem_alloc((size_t)B * T * sizeof(int), MEM_COMM, DEV_CPU) : NULL;
    int *inputs = mem_alloc((size_t)rows * T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)rows * T * sizeof(int), MEM_OTHER, DEV_CPU);
    // Where a received gradient lands before it is added (ranks that receive in the reduce).
    int receives = how == DP_REDUCE_LINEAR ? master : dp_tree_receives(rank, N);
    void *scratch = receives ? mem_alloc(n * e, MEM_COMM, dev) : NULL;
    float *slice_losses = master ? lab_xcalloc((size_t)N, sizeof(float)) : NULL;

    if (!args->quiet && master) {
        char buf[32];
        printf("DataParallel on %d rank%s, rank 0 is the master: GPT-2 V=%d T=%d L=%d C=%d "
               "NH=%d, %zu parameters (%s %s), device %s\n", N, N > 1 ? "s" : "", cfg.V, cfg.T,
               cfg.L, cfg.C, cfg.NH, n, mem_format(buf, sizeof buf, (double)n * e),
               bf16 ? "bf16" : "fp32", k->name);
        printf("every step: replicate weights -> scatter %d x %d batch (%d rows each) -> "
               "forward/backward -> %s reduce of gradients to rank 0 -> AdamW on rank 0 only\n",
               B, T, rows, how == DP_REDUCE_TREE ? "tree" : "linear");
    }

    const int end = lab_args_end_step(args);
    float *losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    for (int s = 0; s < args->steps; s++) losses[s] = NAN;
    double t_compute = 0, t_wait = 0, t_comm = 0;
    dist_counters_reset();

    double t_start = lab_now(), t_last = t_start;
    for (int step = start; step < end; step++) {
        if (step == args->kill_step && rank == args->kill_rank) {  // fault injection
            fprintf(stderr, "[rank %d] --kill-rank: exiting abruptly at step %d\n", rank, step);
            fflush(stderr);
            _exit(1);
        }
        // (wait: a barrier before each communication phase separates waiting for the others,
        //  here for the master's optimizer step, from moving bytes)
        double t0 = lab_now();
        dist_barrier(world);
        double t1 = lab_now();
        // 1. replicate: the master's current weights to every rank
        int tok = trace_begin("replicate weights", TRACE_COMM);
        dp_replicate(train_params(&model), n, dt, world);
        trace_end(tok);
        // 2. scatter: the master makes the global batch of this step and splits it
        if (master) data_batch(&data, (uint64_t)step, B, T, 0, B, all_inputs, all_targets);
        tok = trace_begin("scatter batch", TRACE_COMM);
        dp_scatter_batch(all_inputs, all_targets, inputs, targets, rows, T, world);
        trace_end(tok);
        double t2 = lab_now();

        // 3. forward and backward on this rank's rows. The objective is the mean loss over the
        //    whole global batch, so each position counts 1/(B*T) and the gradients are SUMMED.
        gpt2_zero_grad(&model);
        tok = trace_begin("forward", TRACE_COMPUTE);
        float slice_loss = gpt2_forward(&model, inputs, targets);
        trace_end(tok);
        tok = trace_begin("backward", TRACE_COMPUTE);
        gpt2_backward(&model, 1.0f / ((float)B * (float)T));
        trace_end(tok);
        if (step == args->inject_nan_step && rank == N - 1)  // a NaN in one rank's gradient
            train_inject_nan(&model);
        double t3 = lab_now();
        dist_barrier(world);
        double t4 = lab_now();

        // 4. gather: the losses (the master averages the N slice means) and the gradients
        tok = trace_begin("gather losses, reduce gradients", TRACE_COMM);
        dist_gather(&slice_loss, slice_losses, 1, DIST_F32, 0, world);
        dp_reduce_grads(train_grads(&model), scratch, n, dt, how, k, world);
        trace_end(tok);
        double t5 = lab_now();
        float loss = 0.0f;
        if (master) {
            for (int r = 0; r < N; r++) loss += slice_losses[r];
            loss /= (float)N;
            // 5. the master alone: clip + AdamW. The others will wait at the next barrier.
            tok = trace_begin("optimizer (master only)", TRACE_COMPUTE);
            train_adamw_step(&opt, &model, step, weights, opt_m, opt_v, plist, nplist);
            trace_end(tok);
        }
        double now = lab_now();
        t_wait += (t1 - t0) + (t4 - t3);
        t_comm += (t2 - t1) + (t5 - t4);
        t_compute += (t3 - t2) + (now - t5);
        losses[step] = loss;

        int last = step == end - 1;
        if (!args->quiet && master && args->log_every > 0 && (step % args->log_every == 0 || last)) {
            double per_step = (now - t_start) / (step - start + 1);
            printf("step %5d/%d  loss %.4f  lr %.2e  %8.0f tok/s  ETA %5.1f s\n", step + 1,
                   args->steps, loss, adamw_lr(&opt, step), (double)B * T / (now - t_last),
                   per_step * (args->steps - step - 1));
            fflush(stdout);
        }
        t_last = now;
        if (master && args->save && args->save_every > 0 && (step + 1) % args->save_every == 0 &&
            !last)
            ckpt_save_training(args->save, &cfg, step + 1, (uint64_t)args->seed,
                               (uint64_t)args->data_seed, weights, opt_m, opt_v, n);
    }
    double elapsed = lab_now() - t_start;
    const int nrun = end > start ? end - start : 0;
    double sent_step = nrun ? (double)dist_bytes_sent() / nrun : 0;
    double recv_step = nrun ? (double)dist_bytes_recv() / nrun : 0;
    trace_finish();

    // Only the master's weights are the model's.
    float *host_params = master ? lab_xmalloc(n * sizeof(float)) : NULL;
    if (master) {
        train_params_to_host(&model, host_params);  // bf16: widened; the state keeps the master
        if (args->save) {
            ckpt_save_training(args->save, &cfg, end, (uint64_t)args->seed,
                           (uint64_t)args->data_seed, weights, opt_m, opt_v, n);
            if (!args->quiet) printf("saved training state (step %d) to %s\n", end, args->save);
        }
        if (args->save_weights) ckpt_save_weights(args->save_weights, &cfg, host_params);
    }

    // Per-rank report, gathered to the master.
    double mine[R_NFIELDS] = {0};
    mine[R_COMPUTE] = nrun ? t_compute / nrun : 0;
    mine[R_WAIT] = nrun ? t_wait / nrun : 0;
    mine[R_COMM] = nrun ? t_comm / nrun : 0;
    mine[R_STEP] = nrun ? elapsed / nrun : 0;
    mine[R_SENT] = sent_step;
    mine[R_RECV] = recv_step;
    mine[R_PARAMS] = (double)mem_peak(MEM_PARAMS);
    mine[R_GRADS] = (double)mem_peak(MEM_GRADS);
    mine[R_OPT] = (double)(mem_peak(MEM_MASTER) + mem_peak(MEM_OPT_M) + mem_peak(MEM_OPT_V));
    mine[R_COMM_MEM] = (double)mem_peak(MEM_COMM);
    mine[R_TOTAL] = (double)mem_total_peak();
    double *all = master ? lab_xcalloc((size_t)N * R_NFIELDS, sizeof(double)) : NULL;
    dist_gather(mine, all, R_NFIELDS, DIST_F64, 0, world);

    if (master && !args->quiet && nrun > 0) {
        printf("%d steps in %.2f s: %.0f tokens/s (all ranks), %.1f ms per step\n", nrun, elapsed,
               (double)B * T * nrun / elapsed, 1e3 * elapsed / nrun);
        print_rank_table(all, N);
        double S = (double)e * (double)n;
        int recv_copies = how == DP_REDUCE_LINEAR ? N - 1 : dp_tree_rounds(N);
        printf("  master sends (N-1) x %.0f B of weights + its batch rows; receives %d x %.0f B of "
               "gradients (%s reduce; linear would be N-1 = %d)\n", S, recv_copies, S,
               how == DP_REDUCE_TREE ? "tree: ceil(log2 N)" : "linear", N - 1);
        printf("  wait = blocked at the barrier before a communication phase (the others wait "
               "for the master's optimizer step, the master for the slowest rank)\n");
        printf("  optimizer = Adam m and v%s: only the master has them\n",
               bf16 ? " and the fp32 master weights" : "");
    }

    if (master && args->dump) {
        RunResults out;
        results_init(&out, end, n);
        memcpy(out.losses, losses, (size_t)end * sizeof(float));
        memcpy(out.params, host_params, n * sizeof(float));
        results_set(&out, "world_size", N);
        results_set(&out, "bytes_sent_per_step", sent_step);
        results_set(&out, "bytes_recv_per_step", recv_step);
        for (int r = 1; r < N && r < 16; r++) {  // a worker's figures, for the tests
            char key[48];
            snprintf(key, sizeof key, "rank%d_bytes_sent_per_step", r);
            results_set(&out, key, all[(size_t)r * R_NFIELDS + R_SENT]);
            snprintf(key, sizeof key, "rank%d_bytes_recv_per_step", r);
            results_set(&out, key, all[(size_t)r * R_NFIELDS + R_RECV]);
        }
        results_set(&out, "rank1_mem_opt", N > 1 ? all[R_NFIELDS + R_OPT] : 0);
        results_set_memory(&out);
        results_write(args->dump, &out);
        results_free(&out);
    }

    free(all);
    free(host_params);
    free(losses);
    free(slice_losses);
    free(plist);
    data_free(&data);
    if (master) train_master_free(&model, weights);
    gpt2_free(&model);
    mem_free(opt_m);
    mem_free(opt_v);
    mem_free(scratch);
    mem_free(all_inputs);
    mem_free(all_targets);
    mem_free(inputs);
    mem_free(targets);
}
