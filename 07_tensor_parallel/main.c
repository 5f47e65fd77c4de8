// 07_tensor_parallel: Megatron-LM tensor parallelism (Shoeybi et al. 2019).
//
//   make 07_tensor_parallel && mpirun -np 4 ./07_tensor_parallel/run --tp 4
//
// The world is split into TP groups of --tp consecutive ranks (and, when --tp < world, the
// groups are data-parallel replicas of each other). Inside a group every rank holds:
//   - its heads of every block's attention: the q, k, v rows of those heads (column-parallel)
//     and the attention projection's matching columns (row-parallel);
//   - its hidden units of every block's MLP: fc's rows (column-parallel), fcproj's columns
//     (row-parallel);
//   - its rows of the tied wte (the vocabulary split: V/tp rows, padded when tp does not
//     divide V);
//   - all of the rest (LayerNorms, wpe, the row-parallel layers' biases): replicated.
// One step: the embedding all-reduces the rows each rank looked up; per block, each half
// (attention, MLP) computes on its own shard and g all-reduces the partial outputs; the loss is
// computed from the local logits with three all-reduces of B·T floats (max, sum of exp, target
// logit) and never gathers the logits; backward mirrors it: f at each half's input all-reduces
// the gradient. Every rank then updates its own slice of the weights with AdamW (the norm for
// clipping summed over the group). --sequence-parallel (Korthikanti et al. 2022): between the
// halves the stream lives on T/tp positions of each sequence per rank; each all-reduce of B·T·C
// becomes a reduce-scatter (g) or an all-gather (f), and the LayerNorms' partial gradients are
// all-reduced. --save / --resume move the FULL model (any --tp, or chapter 00, resumes it).
// --dtype bf16: gpt2's mixed precision piece by piece (bf16 weights, gradients and stored
// activations, an fp32 master; every piece computes in fp32 and the all-reduces carry fp32);
// --device cuda runs the same pieces on the GPU's kernels, --backend nccl their collectives. The
// pieces are common/tp.h's; tp_model.c lays them out in one flat buffer (the TpStage of every
// block); this file is the training loop, the checkpoints and the report (report.c).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "optim.h"
#include "report.h"
#include "results.h"
#include "tp.h"
#include "tp_model.h"
#include "trace.h"

static const char *USAGE =
    "07_tensor_parallel: Megatron tensor parallelism. Every block's attention is split by heads\n"
    "and its MLP by hidden units over the --tp ranks of a group; the partial results meet in\n"
    "all-reduces (4 per block per step); the loss never gathers the logits.\n"
    "\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 4           4-way TP: 1 head of 4 per rank\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --vocab 251\n"
    "                                                          a vocabulary tp does not divide:\n"
    "                                                          padded to 252 rows, 126 per rank\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 2           2 TP groups of 2, data-parallel\n"
    "  mpirun -np 1 ./07_tensor_parallel/run --tp 1           one rank: chapter 00's training\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 4 --sequence-parallel\n"
    "                                                          sequence parallelism: the same bytes\n"
    "                                                          on the wire (reduce-scatter +\n"
    "                                                          all-gather), fewer activations\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --dtype bf16\n"
    "                                                          mixed precision: bf16 weights,\n"
    "                                                          gradients and stored activations,\n"
    "                                                          fp32 master; fp32 compute and wire\n"
    "  mpirun -np 2 ./07_tensor_parallel/run --tp 2 --device cuda --backend nccl\n"
    "                                                          on GPUs (one per rank), NCCL\n"
    "  mpirun -np 4 ./07_tensor_parallel/run --tp 4 --save s.ckpt --stop-at 4\n"
    "  ./00_memory_budget/run --train --resume s.ckpt           the checkpoint holds the full model,\n"
    "                                                          not the slices: chapter 00 (or any\n"
    "                                                          --tp) resumes it\n"
    "\n"
    "--tp must divide the number of heads (whole heads per rank) and the number of ranks.\n"
    "It prints which rank holds which heads, hidden units and vocabulary rows, the all-reduces\n"
    "of one step with their sizes against the formula, and the memory of each rank.\n";

typedef struct TpFlags {
    int tp;               // ranks per TP group (0: all ranks)
    int sp;               // --sequence-parallel
} TpFlags;

// The whole model's `buf` (a buffer of m's layout: the master, Adam's m or v) in memory order on
// g's rank 0 (full: zeroed, gpt2_param_count floats; NULL elsewhere): every rank writes its
// slices (the replicated tensors from rank 0) into a zeroed buffer, the group sums them (x + 0
// == x: exact). Collective over g.
static void gather_whole(const TpStage *m, const float *buf, DistGroup *g, float *full) {
    const size_t n = gpt2_param_count(&m->cfg);
    float *mine = lab_xcalloc(n, sizeof(float));
    if (buf) tpm_unshard(m, buf, mine, g->rank == 0);
    else tpm_unshard_weights(m, mine, g->rank == 0);  // the weights the forward reads
    dist_reduce(mine, full, n, DIST_F32, DIST_SUM, 0, g);
    free(mine);
}

// --save: the FULL training state (bf16: its fp32 master; and Adam's m, v), gathered from the
// slices of TP group 0 (ckg: a copy of the TP group, so that a save's traffic stays out of the
// step's counters), written by world rank 0 in the lab's format: any --tp, and chapter 00,
// resumes it. (--save-weights writes the weights the forward reads, below.)
static void save_state(const TpStage *m, const TpOpt *o, DistGroup *ckg, int in_group0,
                       const LabArgs *args, int step) {
    if (!in_group0) return;
    const size_t n = gpt2_param_count(&m->cfg);
    float *buf[3] = {NULL, NULL, NULL};
    const float *flat[3] = {o->master, o->m, o->v};
    for (int i = 0; i < 3; i++) {
        if (ckg->rank == 0) buf[i] = lab_xcalloc(n, sizeof(float));
        gather_whole(m, flat[i], ckg, buf[i]);
    }
    if (ckg->rank == 0)
        ckpt_save_training(args->save, &m->cfg, step, (uint64_t)args->seed, (uint64_t)args->data_seed,
                           buf[0], buf[1], buf[2], n);
    for (int i = 0; i < 3; i++) free(buf[i]);
}

// --resume / --load-weights: world rank 0 reads the full model, every rank takes its slices
// (tpm_shard: the exact inverse of the gather). Returns the step to continue from.
static int load_state(TpStage *m, TpOpt *o, const LabArgs *args) {
    if (!args->resume && !args->load_weights) return 0;
    const size_t n = gpt2_param_count(&m->cfg);
    float *buf[3] = {lab_xcalloc(n, sizeof(float)), lab_xcalloc(n, sizeof(float)), lab_xcalloc(n, sizeof(float))};
    float *flat[3] = {o->master, o->m, o->v};
    int start = 0;
    if (dist_rank() == 0) {
        if (args->resume) start = ckpt_resume_training(args->resume, &m->cfg, buf[0], buf[1], buf[2], n);
        else ckpt_load_weights_into(args->load_weights, &m->cfg, buf[0], n);
    }
    dist_broadcast(&start, 1, DIST_I32, 0, dist_world());
    for (int i = 0; i < (args->resume ? 3 : 1); i++) {
        dist_broadcast(buf[i], n, DIST_F32, 0, dist_world());
        tpm_shard(m, buf[i], flat[i]);
    }
    tpm_stage_set_weights(m, o);  // bf16: the weights the forward reads, from the master
    if (args->resume && !args->quiet && dist_rank() == 0)
        printf("resumed from %s at step %d\n", args->resume, start);
    for (int i = 0; i < 3; i++) free(buf[i]);
    return start;
}

static void train(const LabArgs *args, const TpFlags *f) {
    const int rank = dist_rank(), world = dist_size();
    const GPT2Config cfg = lab_args_config(args);
    // 1. The groups: TP = consecutive ranks (inside a node), DP = the same place in each group.
    const int tp = f->tp ? f->tp : world;
    if (tp > world)
        lab_fail_collective("--tp %d: larger than the %d rank%s of the job; valid: a divisor of "
                            "%d (and of the %d heads)", tp, world, world > 1 ? "s" : "", world,
                            cfg.NH);
    if (world % tp != 0)
        lab_fail_collective("--tp %d does not divide the %d ranks into whole TP groups; valid: "
                            "a divisor of %d (and of the %d heads)", tp, world, world, cfg.NH);
    tp_check_config(&cfg, tp);  // whole heads per rank
    const int dp = world / tp;
    if (args->batch % dp != 0)
        lab_fail_collective("--batch %d does not split over %d data-parallel groups; use a "
                            "multiple of %d", args->batch, dp, dp);
    DistGroup *tpg = dist_split(dist_world(), rank / tp, rank % tp, "tp");
    DistGroup *dpg = dist_split(dist_world(), rank % tp, rank / tp, "dp");
    int row0, Bl;  // this group's rows of the global batch (every rank of a group: the same)
    data_slice(args->batch, dpg->rank, dp, &row0, &Bl);

    // 2. This rank's share of the model, initialized slice by slice from --seed, on --device in
    //    --dtype (bf16: the fp32 master beside bf16 weights and gradients).
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);
    //    Every block (l0 = 0, l1 = L) and one batch's activations, kept across the steps; the
    //    optimizer's state of the whole slice (bf16: the fp32 master; Adam's m, v).
    const TpOpts opts = {.dev = lab_args_device(args),
                         .dtype = strcmp(args->dtype, "bf16") == 0 ? GPT2_BF16 : GPT2_FP32, .sp = f->sp};
    TpStage m;
    TpStageActs acts;
    tpm_stage_build_opts(&m, cfg, tp, tpg->rank, 0, cfg.L, Bl, cfg.T, (uint64_t)args->seed, opts);
    tpm_stage_acts_alloc(&acts, &m);
    TpOpt ost;
    tpm_opt_alloc(&ost, &m, (uint64_t)args->seed, 0, m.n);
    DistGroup *ckg = dist_split(dist_world(), rank / tp, rank % tp, "tp-ckpt");
    const int start = load_state(&m, &ost, args);
    TpComm comm = tp_comm_group(tpg);
    AdamW opt = lab_args_adamw(args);
    DataSource data;
    lab_args_data(args, &data);
    int *inputs = mem_alloc((size_t)Bl * cfg.T * sizeof(int), MEM_OTHER, DEV_CPU);
    int *targets = mem_alloc((size_t)Bl * cfg.T * sizeof(int), MEM_OTHER, DEV_CPU);
    const int steps = lab_args_end_step(args);
    float *losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    if (!args->quiet && rank == 0) tp7_print_layout(&m, world, dp);

    trace_init(args->trace);
    dist_counters_reset();
    dist_group_counters_reset(tpg);
    dist_group_counters_reset(dpg);
    double t0 = lab_now(), t_last = t0;
    for (int step = start; step < steps; step++) {
        if (step == args->kill_step && rank == args->kill_rank) {  // --kill-rank: a rank dies
            fprintf(stderr, "[rank %d] --kill-rank: exiting abruptly at step %d\n", rank, step);
            fflush(stderr);
            _exit(1);
        }
        // 3. The group's batch: every rank of the group reads the same rows.
        data_batch(&data, (uint64_t)step, args->batch, cfg.T, row0, Bl, inputs, targets);
        // 4. Forward: embedding (1 all-reduce), L blocks (2 each: g), loss (3 of B·T).
        //    Sequence parallel: the stream on this rank's T/tp positions of each sequence;
        //    each all-reduce of B·T·C a reduce-scatter (g) or an all-gather (f).
        int tok = trace_begin("forward", TRACE_COMPUTE);
        float loss = tpm_stage_forward(&m, &comm, &acts, inputs, targets);
        trace_end(tok);
        // 5. Backward: head (f: 1), L blocks (f: 2 each); the mean over this group's rows.
        //    Sequence parallel: the mirror image, then one all-reduce of the LayerNorms' and
        //    the row-parallel biases' gradients (each rank saw its positions only).
        tpm_stage_zero_grad(&m);
        tok = trace_begin("backward", TRACE_COMPUTE);
        tpm_stage_backward(&m, &comm, &acts, inputs, targets, 1.0f / ((float)Bl * (float)cfg.T));
        trace_end(tok);
        if (step == args->inject_nan_step && rank == 0) tpm_stage_poison_grad(&m);  // --inject-nan-step
        // 6. Data parallel across groups (--tp < world): average the slices rank r of every
        //    group holds (the same slices; in their storage precision, bf16 like 03), and the loss.
        if (dp > 1) {
            dist_all_reduce(tpm_stage_grad_buf(&m), tpm_stage_grad_buf(&m), m.n, tpm_stage_dist_dtype(&m),
                            DIST_AVG, dpg);
            dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, dpg);
        }
        // 7. Every rank updates its own slice; the replicated tensors get the same update
        //    everywhere (same gradients, same clip scale).
        tok = trace_begin("optimizer", TRACE_COMPUTE);
        tpm_stage_adamw_step(&m, &opt, step, &ost, tpg);
        trace_end(tok);
        losses[step] = loss;
        double now = lab_now();
        if (!args->quiet && rank == 0 && args->log_every > 0 &&
            (step % args->log_every == 0 || step == steps - 1))
            printf("step %5d/%d  loss %.4f  lr %.2e  %8.0f tok/s\n", step + 1, args->steps, loss,
                   adamw_lr(&opt, step), (double)args->batch * cfg.T / (now - t_last));
        t_last = now;
        if (args->save && args->save_every > 0 && (step + 1) % args->save_every == 0 && step + 1 < steps)
            save_state(&m, &ost, ckg, dpg->rank == 0, args, step + 1);
    }
    double elapsed = lab_now() - t0;

    // 8. The report: communication per step against the formula, memory per rank.
    Tp7Figures fig;
    tp7_measure(&fig, &m, &comm, tpg, steps - start, elapsed, args->batch);
    if (args->save) {
        save_state(&m, &ost, ckg, dpg->rank == 0, args, steps);
        if (!args->quiet && rank == 0) printf("saved training state (step %d) to %s\n", steps, args->save);
    }
    if (!args->quiet) tp7_print_report(&fig, &m, tpg, world);
    trace_finish();  // --trace: the timeline (collective)
    // 9. --dump: the full model's weights gathered back (rank 0 of each group; world rank 0
    //    writes), the losses, the figures.
    double replicated_diff = args->dump ? tpm_replicated_max_diff(&m, &ost, tpg) : 0.0;
    float *full = tpg->rank == 0 ? lab_xcalloc(gpt2_param_count(&cfg), sizeof(float)) : NULL;
    if (args->dump || args->save_weights) {  // the weights the forward reads, in llm.c's order
        float *mem = tpg->rank == 0 ? lab_xcalloc(gpt2_param_count(&cfg), sizeof(float)) : NULL;
        gather_whole(&m, NULL, tpg, mem);
        if (mem) gpt2_to_llmc(&cfg, mem, full);
        free(mem);
    }
    if (args->save_weights && rank == 0) ckpt_save_weights(args->save_weights, &cfg, full);
    if (args->dump && rank == 0) {
        RunResults out;
        results_init(&out, steps, gpt2_param_count(&cfg));
        memcpy(out.losses, losses, (size_t)steps * sizeof(float));
        memcpy(out.params, full, gpt2_param_count(&cfg) * sizeof(float));
        tp7_results(&fig, &out);
        results_set(&out, "world_size", world);
        results_set(&out, "tp", tp);
        results_set(&out, "dp", dp);
        results_set(&out, "replicated_max_diff", replicated_diff);
        results_write(args->dump, &out);
        results_free(&out);
    }
    free(full);
    free(losses);
    mem_free(inputs);
    mem_free(targets);
    data_free(&data);
    tpm_opt_free(&ost, &m);
    tpm_stage_acts_free(&acts, &m);
    tpm_stage_free(&m);
    dist_group_free(ckg);
    dist_group_free(dpg);
    dist_group_free(tpg);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    TpFlags f = {.tp = 0, .sp = 0};
    FlagSpec extra[] = {
        {"--tp", FLAG_INT, &f.tp, 0, 1 << 20, NULL,
         "ranks per tensor-parallel group (0: all ranks); must divide the heads and the ranks"},
        {"--sequence-parallel", FLAG_BOOL, &f.sp, 0, 1, NULL,
         "sequence parallelism: LayerNorms and residuals on T/tp positions per rank, g a "
         "reduce-scatter, f an all-gather (--seq must be a multiple of --tp)"},
    };
    lab_parse_args_for(LAB_FLAGS_MODEL | LAB_FLAGS_TRAINING | LAB_FLAGS_HARDWARE | LAB_FLAGS_OUTPUT |
                           LAB_FLAGS_RELIABILITY | LAB_FLAGS_KILL, argc, argv, &args,
                       extra, (int)(sizeof extra / sizeof extra[0]), "07_tensor_parallel/run",
                       USAGE);
    train(&args, &f);
    dist_finalize();
    return 0;
}
