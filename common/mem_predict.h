// mem_predict.h: the host memory a training run will need, predicted before anything is
// allocated, and the one refusal of a run that cannot fit.
//
// Without it a run too big for the machine allocates for a minute, then the kernel's OOM killer
// ends one rank (rc 137) and nothing says why. Every training chapter predicts the peak bytes of
// each of its ranks from the shapes it is about to allocate (the calculator's formulas:
// calc_activation_bytes_lab, calc_shard_state, calc_pipe_peak_bytes ...) and calls
// mem_refuse_if_it_cannot_fit at the top of its setup: the ranks sharing this machine
// (mem_ranks_on_this_machine) count together against --mem-limit MiB, or MemAvailable.
//
//   static MemPrediction predict(const void *ctx, const LabArgs *args, int batch, int rank) {
//       ... this rank's bytes for a global batch of `batch` ...
//   }
//   mem_refuse_if_it_cannot_fit(args, predict, &ctx, batch_step);  // before the first mem_alloc
//
// The prediction is what mem.h measures (mem_total_peak): the --dump holds both (mem_predicted,
// mem_peak), and the tests check
// predicted >= measured and within 10 % on every chapter's layouts (tests/test_user_errors.c).
#pragma once
#include "flags.h"
#include "gpt2.h"

// One rank's peak bytes, in three parts (the message names them).
typedef struct MemPrediction {
    double state;    // parameters, gradients, fp32 master, Adam m and v
    double acts;     // activations saved for backward and their gradients, at their peak
    double buffers;  // batch, communication and scratch buffers
} MemPrediction;

double mem_prediction_total(MemPrediction p);

// What session_init(s, args, rows, has_optimizer) allocates: a whole replica (params and grads
// in the model's type, bf16's fp32 master and Adam's m and v when it has the optimizer), the
// activations for (rows, T) and the batch and scratch buffers of mem_predict_scratch.
MemPrediction mem_predict_replica(const GPT2Config *cfg, int rows, int bf16, int has_optimizer);
// The same for a run that recomputes r (fp32 or bf16; calc_activation_bytes_recompute).
MemPrediction mem_predict_replica_recompute(const GPT2Config *cfg, int rows, int bf16,
                                            int has_optimizer, GPT2Recompute r);

// The buffers every rank that runs a model of `rows` x T holds besides its state and
// activations: the session's and the model's inputs and targets (rows x T ints each), the
// per-position losses, the CPU kernels' per-head attention scratch, bf16's fp32 work buffers of
// one piece (for the weights and the gradients). `nparams_piece`: the largest piece's elements
// (bf16), 0 for fp32.
double mem_predict_scratch(const GPT2Config *cfg, int rows, int bf16, double nparams_piece);

// The elements of the model's largest piece (the embedding, one block or the head: gpt2.c's
// work_size), which bf16's two fp32 work buffers hold. For a TP slice it is an upper bound.
double mem_predict_largest_piece(const GPT2Config *cfg);

// A pipeline rank (chapter 08): its v chunks of a table `s` for p ranks, micro-batches of Bm
// rows. State: each chunk's parameters (calc_stage_params: blocks, the embedding on the first
// stage, the head and the tied wte's copy on the last) with their grads, master, m and v. The
// activations: the most the table keeps at once (calc_pipe_peak_bytes), and with a split backward
// (zb) the W tensors one B allocates before it frees its set. Buffers: the scratch of
// mem_predict_scratch, each live set's inputs, targets and losses, and the executor's send
// buffers (pipe_exec_init: 2 v m messages of Bm x T x C floats, bf16 their wire copies too).
// The chunks recompute r (fp32 or bf16; GPT2_RECOMPUTE_NONE: nothing): smaller sets, and one
// layer of scratch per chunk.
struct Schedule;
MemPrediction mem_predict_pipeline_recompute(const GPT2Config *cfg, const struct Schedule *s,
                                             int rank, int Bm, int bf16, GPT2Recompute r);

// A tensor-parallel slice r of tp of the whole model (chapter 07) for a batch of `rows`: the
// slice's parameters (calc_stage_params) with grads, master, m and v; the activations (tp.h's
// tp_acts_bytes and tp_shared_bytes, asked of the slice's shape), the session's batch and the
// kernels' scratch. t = 1 without SP runs gpt2's own pieces: mem_predict_replica. The slice
// recomputes rc (fp32 or bf16; tp.h's tp_build; GPT2_RECOMPUTE_NONE: nothing): smaller sets, one
// scratch layer.
MemPrediction mem_predict_tp_recompute(const GPT2Config *cfg, int tp, int r, int sp, int rows, int bf16,
                                       GPT2Recompute rc);

// A chapter's prediction of rank `rank`'s peak for a global --batch of `batch`; ctx: its flags.
typedef MemPrediction (*MemPredictFn)(const void *ctx, const LabArgs *args, int batch, int rank);

// The largest predicted rank of the job (over ranks 0 .. world-1) for --batch `batch`.
MemPrediction mem_predict_largest_rank(MemPredictFn fn, const void *ctx, const LabArgs *args,
                                       int batch, int world);

// Refuses the run, before any big allocation, when the largest rank's prediction times the
// ranks on this machine exceeds --mem-limit (MiB) or else MemAvailable: one message on rank 0
// ("error: --batch B: predicted memory X per rank (...) x N ranks on this machine = Y exceeds
// the Z available (MemAvailable); use --batch F or less (or --mem-limit MiB to override)"),
// every rank exits (lab_fail_collective). F is the largest multiple of batch_step that fits.
// Only with --device cpu: on a GPU the runtime reports its own out-of-memory.
void mem_refuse_if_it_cannot_fit(const LabArgs *args, MemPredictFn fn, const void *ctx,
                                 int batch_step);
// (It records this rank's prediction in mem.h, mem_set_predicted_peak: the --dump's
// mem_predicted, next to the measured mem_peak.)
