// gpt2.h: GPT-2, exactly as DESIGN.md specifies it, in fp32, on one device.
//
// Parameters live in ONE flat buffer in llm.c's order (wte, wpe, ln1w, ln1b, qkvw, qkvb,
// attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb); per-layer tensors are
// stacked over L (ln1w is (L,C), qkvw is (L,3C,C), ...). Gradients mirror that layout.
// Forward and backward are exposed per piece (embedding, block l, head) so that a chapter can
// act between blocks: launch a bucket's all-reduce, gather the next shard, send to a stage.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "kernels.h"
#include "mem.h"

#define GPT2_NUM_TENSORS 16

typedef struct GPT2Config {
    int V;   // vocabulary size (256 = bytes)
    int T;   // maximum sequence length
    int L;   // number of blocks
    int C;   // channels
    int NH;  // heads (C % NH == 0)
} GPT2Config;

typedef struct ParamTensors {
    float *wte;      // (V, C)     tied with the output layer
    float *wpe;      // (T, C)
    float *ln1w;     // (L, C)
    float *ln1b;     // (L, C)
    float *qkvw;     // (L, 3C, C) rows ordered [Q; K; V]
    float *qkvb;     // (L, 3C)
    float *attprojw; // (L, C, C)
    float *attprojb; // (L, C)
    float *ln2w;     // (L, C)
    float *ln2b;     // (L, C)
    float *fcw;      // (L, 4C, C)
    float *fcb;      // (L, 4C)
    float *fcprojw;  // (L, C, 4C)
    float *fcprojb;  // (L, C)
    float *lnfw;     // (C)
    float *lnfb;     // (C)
} ParamTensors;

#define GPT2_NUM_ACTS 23
typedef struct ActTensors {
    float *encoded;   // (B, T, C)
    float *ln1;       // (L, B, T, C)
    float *ln1_mean;  // (L, B, T)
    float *ln1_rstd;  // (L, B, T)
    float *qkv;       // (L, B, T, 3C)
    float *atty;      // (L, B, T, C)
    float *preatt;    // (L, B, NH, T, T)
    float *att;       // (L, B, NH, T, T)
    float *attproj;   // (L, B, T, C)
    float *residual2; // (L, B, T, C)
    float *ln2;       // (L, B, T, C)
    float *ln2_mean;  // (L, B, T)
    float *ln2_rstd;  // (L, B, T)
    float *fch;       // (L, B, T, 4C)
    float *fch_gelu;  // (L, B, T, 4C)
    float *fcproj;    // (L, B, T, C)
    float *residual3; // (L, B, T, C)
    float *lnf;       // (B, T, C)
    float *lnf_mean;  // (B, T)
    float *lnf_rstd;  // (B, T)
    float *logits;    // (B, T, V)
    float *probs;     // (B, T, V)
    float *losses;    // (B, T)
} ActTensors;

// One parameter in the PyTorch sense: a tensor, or one layer's slice of a stacked tensor.
// These are the units DDP buckets and FSDP units are made of.
typedef struct GPT2Param {
    char name[32];    // "h.2.qkvw", "wte", ...
    int tensor;       // 0..15, index in llm.c's order
    int layer;        // block index, or -1 for wte, wpe, lnfw, lnfb
    size_t offset;    // element offset in the flat parameter buffer
    size_t size;      // elements
    int decay;        // 1 for 2-D weight matrices (AdamW weight decay applies), else 0
} GPT2Param;

// Storage precision. GPT2_BF16 is mixed precision: the parameters, their gradients and the
// activations the blocks save for backward are stored in bf16 (2 bytes each, rounded to
// nearest even); every piece computes in fp32, on small fp32 copies of its own weights and
// activations (see gpt2_build_dtype). The fp32 master weights and Adam's m, v belong to the
// caller. On CUDA its matmuls run on tensor cores in TF32 (kernels_get_tf32).
typedef enum { GPT2_FP32 = 0, GPT2_BF16 = 1 } GPT2Dtype;

typedef struct GPT2 {
    GPT2Config cfg;
    Device dev;
    const Kernels *k;
    size_t param_sizes[GPT2_NUM_TENSORS];
    size_t num_params;
    float *params;      // flat, num_params (MEM_PARAMS)
    ParamTensors p;     // views into params
    float *grads;       // flat, num_params (MEM_GRADS), NULL until gpt2_alloc_grads
    ParamTensors g;
    int B, T;           // activation shape, set by gpt2_alloc_acts
    size_t act_sizes[GPT2_NUM_ACTS];  // of acts (bf16: one layer of the per-layer tensors)
    size_t num_acts;
    float *acts;        // fp32 activations (MEM_ACTS); bf16: see acts_bf16
    ActTensors a;       // views into acts
    size_t dact_sizes[GPT2_NUM_ACTS];  // gpt2_dact_sizes
    size_t num_dacts;
    float *dacts;       // gradients of the activations (MEM_ACTS), see gpt2_dact_sizes
    ActTensors da;      // views into dacts; NULL for the gradients never materialized
    int *inputs;        // (B, T) on dev (MEM_OTHER)
    int *targets;       // (B, T) on dev (MEM_OTHER)
    int has_targets;
    float *host_losses; // (B, T) host copy of the per-position losses
    // Mixed precision (dtype GPT2_BF16). Then params, grads and the views p, g are NULL.
    GPT2Dtype dtype;
    uint16_t *params_bf16; // flat, num_params (MEM_PARAMS, 2 bytes each)
    uint16_t *grads_bf16;  // flat, num_params (MEM_GRADS), NULL until gpt2_alloc_grads
    size_t work_size;      // floats in the largest piece: max(embed, one block, head)
    float *work;           // fp32 weights of the piece running now (MEM_OTHER)
    float *work_grads;     // fp32 gradients of that piece (MEM_OTHER), with the grads
    // bf16 activations (GPT2_BF16): the per-layer activations (ln1 .. residual3) of every block
    // are stored here, rounded; acts holds ONE layer of them in fp32 (a block computes there,
    // and its backward widens its stored layer back there) and the embedding's and head's.
    uint16_t *acts_bf16;   // L * layer_act_size, layer after layer (MEM_ACTS, 2 bytes each)
    size_t layer_act_size; // elements of one layer's activations
    float *block_in;       // (B,T,C): the widened input of the piece running now (MEM_ACTS)
} GPT2;

// Config helpers. gpt2_config_check fails the job with a message naming the bad field.
void gpt2_config_check(const GPT2Config *cfg);
GPT2Config gpt2_config_tiny(void);             // V=256 T=64 L=4 C=128 NH=4
void gpt2_param_sizes(const GPT2Config *cfg, size_t sizes[GPT2_NUM_TENSORS]);
size_t gpt2_param_count(const GPT2Config *cfg);
const char *gpt2_tensor_name(int tensor);      // "wte", "wpe", "ln1w", ...
// The parameters in llm.c memory order: wte, wpe, then per tensor kind per layer, lnfw, lnfb.
// Fills out (if not NULL) and returns the count, 4 + 12 * L.
int gpt2_params(const GPT2Config *cfg, GPT2Param *out);
// Activation element counts for (B, T).
void gpt2_act_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]);
// Element counts of the activation GRADIENTS (dacts), in ActTensors order. The activations are
// kept for every layer until backward; a block's internal gradients live only during its own
// backward, so ONE layer of them serves all L blocks (less memory, and it stays in cache):
// ln1, qkv, atty, preatt, att, residual2, ln2, fch, fch_gelu have one layer's size. Kept for
// every layer: residual3, the gradient of each block's output (a block reads it and writes the
// one below; a pipeline stage writes the gradient it receives there). Size 0 (view NULL), never
// materialized: attproj and fcproj (a sum passes its gradient through unchanged), the LayerNorm
// means and rstds, probs and losses (the loss backward goes to the logits directly).
void gpt2_dact_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]);

// Lifecycle. gpt2_build allocates the parameters (zeroed) on dev; gpt2_init_params fills them.
void gpt2_build(GPT2 *m, GPT2Config cfg, Device dev);
// gpt2_build with a storage precision. GPT2_BF16: params_bf16 instead of params, and before a
// piece (embedding, block l, head) runs, its weights are widened into the fp32 buffer `work`
// (a GPU does this in registers as it loads each tile; on a CPU it needs a buffer, the size of
// the largest piece only). After the piece's backward its fp32 weight gradients are added into
// grads_bf16 with one rounding. Activations likewise: a block computes in an fp32 buffer of ONE
// layer, then stores that layer rounded to bf16 (acts_bf16); the next block reads its input
// from there (widened), so every piece reads the stored, rounded values, forward and backward;
// a block's backward widens its stored layer into the same fp32 buffer. Inside a block the
// forward computes in fp32 (its later ops read the unrounded values); what backward sees is
// what was stored. The embedding's output, the head's activations (LayerNorm, logits, probs,
// losses: the loss is computed in fp32) and all activation gradients stay fp32.
void gpt2_build_dtype(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype);
// Initialization: N(0, 0.02) weights, residual projections (attprojw, fcprojw) scaled by
// 1/sqrt(2L), biases 0, LayerNorm weights 1. Element i's value is a pure function of
// (seed, cfg, i): any shard can be initialized alone and equals the slice of the full init.
void gpt2_init_params(GPT2 *m, uint64_t seed);
void gpt2_init_slice(const GPT2Config *cfg, uint64_t seed, size_t begin, size_t end, float *out_host);
void gpt2_alloc_grads(GPT2 *m);
void gpt2_alloc_acts(GPT2 *m, int B, int T);
void gpt2_free(GPT2 *m);

// Copy a (B,T) batch to the device. targets may be NULL (inference: no loss).
void gpt2_set_batch(GPT2 *m, const int *inputs, const int *targets);

// Forward in pieces...
void gpt2_embed_forward(GPT2 *m);
void gpt2_block_forward(GPT2 *m, int l);
float gpt2_head_forward(GPT2 *m);   // final LayerNorm, logits, softmax, loss; returns mean loss
// ...or whole. Returns the mean cross-entropy over all B*T positions (or -1 without targets).
float gpt2_forward(GPT2 *m, const int *inputs, const int *targets);

// Zero the parameter gradients (the activation gradients need no zeroing: backward overwrites them).
void gpt2_zero_grad(GPT2 *m);
// Backward in pieces, from the head down. dloss is d(objective)/d(loss at each position):
// 1/(B*T) for the mean loss of this batch; chapters scale it for accumulation or sharding.
// Parameter gradients ACCUMULATE (+=).
void gpt2_head_backward(GPT2 *m, float dloss);
void gpt2_block_backward(GPT2 *m, int l);
void gpt2_embed_backward(GPT2 *m);
void gpt2_backward(GPT2 *m, float dloss);

// Model FLOPs of one training step (forward + backward) on B*T tokens: 6*N*B*T for the
// matmuls with parameters (incl. the tied output layer) + 12*L*C*T*B*T for attention
// (QKᵀ and AV, forward and backward, not halved for causality, as in PaLM's MFU formula).
double gpt2_flops_per_step(const GPT2Config *cfg, int B, int T);
