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

#include "check.h"
#include "data.h"
#include "dist.h"
#include "dp_master.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "mem_predict.h"
#include "optim.h"
#include "results.h"
#include "session.h"
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

static void print_header(const Session *s, DpReduce how) {
    char buf[32], model[128];
    printf("DataParallel on %d rank%s, rank 0 is the master: %s (%s %s), device %s\n", s->N,
           s->N > 1 ? "s" : "", session_model_line(s, model, sizeof model),
           mem_format(buf, sizeof buf, (double)s->n * s->e), s->bf16 ? "bf16" : "fp32",
           s->model.k->name);
    printf("every step: replicate weights -> scatter %d x %d batch (%d rows each) -> "
           "forward/backward -> %s reduce of gradients to rank 0 -> AdamW on rank 0 only\n",
           s->args->batch, s->T, s->rows, how == DP_REDUCE_TREE ? "tree" : "linear");
}

// The run's figures: the per-rank table (rank 0 moves N-1 times the bytes of any other rank),
// the --dump file. `mine` is this rank's R_NFIELDS.
static void report(Session *s, DpReduce how, double *mine) {
    const int N = s->N, nrun = session_steps_run(s);
    mine[R_PARAMS] = (double)mem_peak(MEM_PARAMS);
    mine[R_GRADS] = (double)mem_peak(MEM_GRADS);
    mine[R_OPT] = (double)(mem_peak(MEM_MASTER) + mem_peak(MEM_OPT_M) + mem_peak(MEM_OPT_V));
    mine[R_COMM_MEM] = (double)mem_peak(MEM_COMM);
    mine[R_TOTAL] = (double)mem_total_peak();
    double *all = session_gather_report(s, mine, R_NFIELDS);
    if (s->rank != 0) return;

    if (!s->args->quiet && nrun > 0) {
        session_print_throughput(s, 1);
        static const SessionColumn cols[] = {
            {"compute", R_COMPUTE, COL_MS}, {"wait", R_WAIT, COL_MS}, {"comm", R_COMM, COL_MS},
            {"step", R_STEP, COL_MS}, {"sent", R_SENT, COL_BYTES}, {"recv", R_RECV, COL_BYTES},
            {"params", R_PARAMS, COL_BYTES}, {"grads", R_GRADS, COL_BYTES},
            {"optimizer", R_OPT, COL_BYTES}, {"comm bufs", R_COMM_MEM, COL_BYTES},
            {"peak mem", R_TOTAL, COL_BYTES}};
        session_print_rank_table("Per rank (per step)", cols, (int)(sizeof cols / sizeof cols[0]),
                                 all, N, R_NFIELDS, "master");
        session_print_cores_note(s, "the compute, wait, comm and step times");
        double S = (double)s->e * (double)s->n;
        int recv_copies = how == DP_REDUCE_LINEAR ? N - 1 : dp_tree_rounds(N);
        printf("  master sends (N-1) x %.0f B of weights + its batch rows; receives %d x %.0f B of "
               "gradients (%s reduce; linear would be N-1 = %d)\n", S, recv_copies, S,
               how == DP_REDUCE_TREE ? "tree: ceil(log2 N)" : "linear", N - 1);
        printf("  wait = blocked at the barrier before a communication phase (the others wait "
               "for the master's optimizer step, the master for the slowest rank)\n");
        printf("  optimizer = Adam m and v%s: only the master has them\n",
               s->bf16 ? " and the fp32 master weights" : "");
    }
    if (s->args->dump) {
        RunResults out;
        session_dump_open(s, &out);
        results_set(&out, "world_size", N);
        results_set(&out, "bytes_sent_per_step", mine[R_SENT]);
        results_set(&out, "bytes_recv_per_step", mine[R_RECV]);
        for (int r = 1; r < N && r < 16; r++) {  // a worker's figures, for the tests
            results_setf(&out, all[(size_t)r * R_NFIELDS + R_SENT], "rank%d_bytes_sent_per_step", r);
            results_setf(&out, all[(size_t)r * R_NFIELDS + R_RECV], "rank%d_bytes_recv_per_step", r);
        }
        results_set(&out, "rank1_mem_opt", N > 1 ? all[R_NFIELDS + R_OPT] : 0);
        session_dump_close(s, &out);
    }
    free(all);
}

// The memory rank `rank` will allocate for a global batch of `batch` (mem_predict.h): a replica
// of its rows (the optimizer on the master only), the master's whole global batch, and the
// buffer the reduce receives gradients into.
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const DpFlags *f = ctx;
    const int N = dist_size(), master = rank == 0, bf16 = strcmp(args->dtype, "bf16") == 0;
    GPT2Config cfg = lab_args_config(args);
    MemPrediction p = mem_predict_replica(&cfg, (batch + N - 1) / N, bf16, master);
    int receives = strcmp(f->reduce, "linear") == 0 ? master : dp_tree_receives(rank, N);
    if (master) p.buffers += 2.0 * batch * cfg.T * sizeof(int);
    if (receives) p.buffers += (double)gpt2_param_count(&cfg) * (bf16 ? 2 : 4);
    if (receives && bf16) p.buffers += 2.0 * DP_ACCUM_CHUNK * sizeof(float);  // dp_accumulate
    return p;
}

static void train(const LabArgs *args, const DpFlags *f) {
    const DistGroup *world = dist_world();
    const int rank = world->rank, N = world->size, master = rank == 0;
    const DpReduce how = strcmp(f->reduce, "linear") == 0 ? DP_REDUCE_LINEAR : DP_REDUCE_TREE;
    int row0, rows;
    data_slice(args->batch, rank, N, &row0, &rows);  // checks that B splits; rank 0 splits
    mem_refuse_if_it_cannot_fit(args, predict_memory, f, N);  // before the first allocation

    // The model on every rank (only the master's weights matter: the others receive them every
    // step); the optimizer (weights, Adam m and v) on the master only: common/session.c.
    Session s;
    session_init(&s, args, rows, master);
    const int B = args->batch, T = s.T;
    GPT2 *model = &s.model;
    int start = master ? session_load_or_init(&s, (uint64_t)args->seed) : 0;
    dist_broadcast(&start, 1, DIST_I32, 0, s.world);  // (the workers learn it from the master)
    session_start_at(&s, start);
    // The master makes the whole global batch, and receives gradients to add.
    int *all_inputs = master ? mem_alloc((size_t)B * T * sizeof(int), MEM_COMM, DEV_CPU) : NULL;
    int *all_targets = master ? mem_alloc((size_t)B * T * sizeof(int), MEM_COMM, DEV_CPU) : NULL;
    int receives = how == DP_REDUCE_LINEAR ? master : dp_tree_receives(rank, N);
    void *scratch = receives ? mem_alloc(s.n * s.e, MEM_COMM, s.dev) : NULL;
    float *slice_losses = master ? lab_xcalloc((size_t)N, sizeof(float)) : NULL;
    if (!args->quiet && master) print_header(&s, how);

    double t_compute = 0, t_wait = 0, t_comm = 0;
    dist_counters_reset();
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (fault injection: --kill-rank, --kill-step)
        // (wait: a barrier before each communication phase separates waiting for the others,
        //  here for the master's optimizer step, from moving bytes)
        double t0 = lab_now();
        dist_barrier(s.world);
        double t1 = lab_now();
        // 1. replicate: the master's current weights to every rank
        int tok = trace_begin("replicate weights", TRACE_COMM);
        dp_replicate(train_params(model), s.n, s.dt, s.world);
        trace_end(tok);
        // 2. scatter: the master makes the global batch of this step and splits it
        if (master) data_batch(&s.data, (uint64_t)step, B, T, 0, B, all_inputs, all_targets);
        tok = trace_begin("scatter batch", TRACE_COMM);
        dp_scatter_batch(all_inputs, all_targets, s.inputs, s.targets, rows, T, s.world);
        trace_end(tok);
        double t2 = lab_now();

        // 3. forward and backward on this rank's rows. The objective is the mean loss over the
        //    whole global batch, so each position counts 1/(B*T) and the gradients are SUMMED.
        gpt2_zero_grad(model);
        tok = trace_begin("forward", TRACE_COMPUTE);
        float slice_loss = gpt2_forward(model, s.inputs, s.targets);
        trace_end(tok);
        tok = trace_begin("backward", TRACE_COMPUTE);
        gpt2_backward(model, 1.0f / ((float)B * (float)T));
        trace_end(tok);
        session_inject_nan(&s, step, N - 1);  // a NaN in one rank's gradient
        double t3 = lab_now();
        dist_barrier(s.world);
        double t4 = lab_now();

        // 4. gather: the losses (the master averages the N slice means) and the gradients
        tok = trace_begin("gather losses, reduce gradients", TRACE_COMM);
        dist_gather(&slice_loss, slice_losses, 1, DIST_F32, 0, s.world);
        dp_reduce_grads(train_grads(model), scratch, s.n, s.dt, how, model->k, s.world);
        trace_end(tok);
        double t5 = lab_now();
        float loss = 0.0f;
        if (master) {
            for (int r = 0; r < N; r++) loss += slice_losses[r];
            loss /= (float)N;
        }
        // 5. the master alone, unless the loss spiked (--on-spike; every rank asks): clip +
        //    AdamW. The others will wait at the next barrier.
        if (session_may_update(&s, step, loss) && master) {
            tok = trace_begin("optimizer (master only)", TRACE_COMPUTE);
            session_grad_norm_sq(&s, train_adamw_step(&s.opt, model, step, s.master, s.opt_m,
                                                      s.opt_v, s.plist, s.nplist));
            trace_end(tok);
        }
        double now = lab_now();
        t_wait += (t1 - t0) + (t4 - t3);
        t_comm += (t2 - t1) + (t5 - t4);
        t_compute += (t3 - t2) + (now - t5);
        session_phase(&s, "compute", (t3 - t2) + (now - t5));  // --log's phases (the master's)
        session_phase(&s, "wait", (t1 - t0) + (t4 - t3));
        session_phase(&s, "comm", (t2 - t1) + (t5 - t4));
        session_step_end(&s, step, loss);  // health line, --log, periodic --save (the master)
    }
    const int nrun = session_steps_run(&s);
    double mine[R_NFIELDS] = {0};  // per step
    mine[R_SENT] = nrun ? (double)dist_bytes_sent() / nrun : 0;
    mine[R_RECV] = nrun ? (double)dist_bytes_recv() / nrun : 0;
    session_finish(&s);  // final --save, --save-weights (the master's weights), --trace
    mine[R_COMPUTE] = nrun ? t_compute / nrun : 0;
    mine[R_WAIT] = nrun ? t_wait / nrun : 0;
    mine[R_COMM] = nrun ? t_comm / nrun : 0;
    mine[R_STEP] = nrun ? session_elapsed(&s) / nrun : 0;
    report(&s, how, mine);

    free(slice_losses);
    mem_free(scratch);
    mem_free(all_inputs);
    mem_free(all_targets);
    session_free(&s);
}
