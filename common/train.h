// train.h: the pieces of a training step that every data-parallel chapter shares, in the
// model's precision (fp32, or bf16 mixed precision), so a chapter's main.c shows only what
// differs: who computes, who communicates, who steps.
//
// Mixed precision (GPT2_BF16) keeps the weights the forward pass reads and their gradients in
// bf16, and the optimizer's copy of the weights in fp32 (the "master" weights): an update
// smaller than half a bf16 step (1/256 of the weight) would round away if it were added to the
// bf16 weights directly. fp32 needs no second copy: the master IS the model's parameters.
#pragma once
#include <stddef.h>
#include "dist.h"
#include "gpt2.h"
#include "optim.h"

// The weights AdamW updates: fp32 -> m->params; bf16 -> a new fp32 buffer of num_params
// floats on the model's device, tagged MEM_MASTER (4 bytes per parameter). Free it with
// train_master_free, before gpt2_free (it needs the model to tell the two cases apart).
float *train_master_alloc(GPT2 *m);
void train_master_free(GPT2 *m, float *master);

// The weights the forward pass reads, from the master: bf16 rounds to nearest even into
// m->params_bf16; fp32 does nothing (they are the same buffer).
void train_master_to_model(GPT2 *m, const float *master);

// Fresh weights from --seed into the master, then into the model (train_master_to_model).
void train_master_init(GPT2 *m, float *master, uint64_t seed);

// The AdamW range of the whole model m (adamw_update, optim.h): its gradients, the caller's
// fp32 master (fp32: the weights themselves) and Adam m, v; bf16 rounds into params_bf16.
AdamWRange train_adamw_whole(GPT2 *m, float *master, float *opt_m, float *opt_v);
// Σ g² of n gradients of the model's dtype (bf16: widened a chunk at a time into work_grads).
double train_grad_sum_squares(const GPT2 *m, const void *g, size_t n);
// One optimizer step on the model's whole gradient (every rank of DDP, the master of 02, the
// single device of 00): clip the global norm (fails the run naming the step on NaN/Inf), then
// AdamW on the master, then the model's weights from the master. bf16 widens the gradients a
// chunk at a time into the model's scratch buffer (work_grads). Returns the global squared
// norm, before clipping (the health line's).
double train_adamw_step(const AdamW *h, GPT2 *m, int step, float *master, float *opt_m,
                        float *opt_v, const GPT2Param *plist, int nplist);

// The model's weights as fp32 on the host (n floats): checkpoints and results. bf16: the
// weights the forward pass reads, widened (the training state keeps the master instead).
// The full model's come in llm.c's order (the order of weights files and --dump files, the
// same for every memory layout); a stage's (gpt2_build_stage) in its own memory order.
void train_params_to_host(const GPT2 *m, float *host);
// The same from `params`, a buffer of m's weights in m's dtype and layout that m does not own
// (05's and 06's whole parameters, gathered from the shards for the copy).
void train_params_to_host_from(const GPT2 *m, const void *params, float *host);
// The model's gradients as fp32 on the host (n floats); bf16 widened; ordered as above.
void train_grads_to_host(const GPT2 *m, float *host);

// The model's gradient buffer and its type on the wire: grads (DIST_F32) or grads_bf16
// (DIST_BF16); the weights the forward pass reads (params or params_bf16), with the same type.
void *train_grads(GPT2 *m);
void *train_params(GPT2 *m);
DistDtype train_dtype(const GPT2 *m);

// Fault injection (--inject-nan-step): a NaN in the model's first gradient element.
void train_inject_nan(GPT2 *m);
