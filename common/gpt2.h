// gpt2.h: GPT-2, exactly as docs/ARCHITECTURE.md specifies it, in fp32 or bf16, on one device.
//
// Parameters live in ONE flat buffer, BLOCK-MAJOR (each block's parameters one contiguous
// range, a "unit"):
//     [wte wpe] [block 0] [block 1] ... [block L-1] [lnfw lnfb]
//      unit 0    unit 1                  unit L      unit L+1
// a block unit is its 12 tensors in llm.c's tensor order (ln1w ln1b qkvw qkvb attprojw attprojb
// ln2w ln2b fcw fcb fcprojw fcprojb). Gradients mirror that layout. llm.c's stacked order
// (wte, wpe, then each kind of tensor for all L layers, lnfw, lnfb) exists only in FILES:
// gpt2_to_llmc / gpt2_from_llmc convert, and ckpt.c's device-level functions and
// train_params_to_host use them, so weights, training states and --dump files are
// layout-independent. Initialization is a pure function of (seed, the element's index in llm.c's
// order): every layout (and every slice of one) starts from the same numbers.
//
// Forward and backward are exposed per piece (embedding, block l, head) so that a chapter can
// act between blocks: launch a bucket's all-reduce, gather the next unit, send to a stage. Every
// piece can run with weights supplied by the caller (the _w functions: a gathered FSDP unit, a
// copy anywhere), on an activation set of the caller's (GPT2Acts: one per micro-batch, several
// alive at once), and a block's backward can be split into its input gradient (B) and its
// weight gradient (W), as zero-bubble pipelines schedule them.
//
// Partial models (pipeline stages) hold blocks [l0, l1) only; see gpt2_build_stage.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "gpt2_layout.h"
#include "kernels.h"
#include "mem.h"

#define GPT2_NUM_ACTS 23
typedef struct ActTensors {
    float *encoded;   // (B, T, C)  the input of the first block held (embedding, or received)
    float *ln1;       // (L, B, T, C)      L: the blocks the activation set holds
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
    float *lnf;       // (B, T, C)    the head's: NULL on a stage without the head
    float *lnf_mean;  // (B, T)
    float *lnf_rstd;  // (B, T)
    float *logits;    // (B, T, V)
    float *probs;     // (B, T, V)
    float *losses;    // (B, T)
} ActTensors;

// One parameter in the PyTorch sense: a tensor, or one layer's slice of a stacked tensor.
// These are the units DDP buckets are made of. Listed in MEMORY order.
typedef struct GPT2Param {
    char name[32];        // "h.2.qkvw", "wte", ...
    int tensor;           // GPT2_WTE .. GPT2_LNFB
    int layer;            // block index (of the full model), or -1 for wte, wpe, lnfw, lnfb
    size_t offset;        // element offset in THIS model's flat buffer
    size_t size;          // elements
    int decay;            // 1 for 2-D weight matrices (AdamW weight decay applies), else 0
    size_t global_offset; // element offset in the FULL model's flat buffer (== offset there)
    size_t llmc_offset;   // element offset in llm.c's stacked order (files)
    int tied_copy;        // 1: a last stage's copy of wte (see gpt2_build_stage), else 0
    int sliced;           // 1: a kind a TP group splits (wte, qkvw, qkvb, attprojw, fcw, fcb,
                          // fcprojw), whatever t; else replicated over the group
} GPT2Param;

// A unit: a contiguous range of the flat buffer that one piece reads (FSDP/ZeRO-3 gather one
// unit as one range). The full model has L+2: 0 = EMBED (wte, wpe), 1..L = BLOCK l-1,
// L+1 = HEAD (lnfw, lnfb; the head also reads wte, the EMBED unit's first V*C elements).
typedef enum { GPT2_UNIT_EMBED, GPT2_UNIT_BLOCK, GPT2_UNIT_HEAD, GPT2_UNIT_TIED_WTE } GPT2UnitKind;
typedef struct GPT2Unit {
    GPT2UnitKind kind;
    int layer;            // BLOCK: the block's index in the full model; else -1
    size_t offset;        // element offset in this model's buffer
    size_t global_offset; // in the full model's buffer (TIED_WTE: 0, where wte is)
    size_t size;          // elements
} GPT2Unit;

// Storage precision. GPT2_BF16 is mixed precision: the parameters, their gradients and the
// activations the blocks save for backward are stored in bf16 (2 bytes each, rounded to
// nearest even); every piece computes in fp32, on small fp32 copies of its own weights and
// activations (see gpt2_build_dtype). The fp32 master weights and Adam's m, v belong to the
// caller. On CUDA its matmuls run on tensor cores in TF32 (kernels_get_tf32).
typedef enum { GPT2_FP32 = 0, GPT2_BF16 = 1 } GPT2Dtype;

// Activation recomputation (Korthikanti et al. 2022), gpt2_set_recompute. NONE: every block keeps
// its 16 tensors until its backward. SELECTIVE: a block keeps all but the attention scores and
// their softmax (preatt, att: the B*NH*T*T ones), and its backward first recomputes them from the
// qkv it kept. FULL: a block keeps only its output (= the next block's input; the first block's
// input is the set's encoded), and its backward first runs its forward again from its input.
// The recomputed tensors of every set of a model live in ONE layer of scratch the model owns
// (rc_scratch): a backward recomputes into it and reads it at once. The same kernels on the same
// inputs in the same chunks: the recomputed values are the forward's, bit for bit. bf16: a block
// computes in fp32 from its input as stored (rounded), and stores its tensors rounded; its
// recomputation starts from that same input, and rounds what it recomputed as the store did, so
// the backward reads the values it reads without recomputation. bf16 keeps qkv rounded, and the
// forward's softmax read it unrounded: selective then recomputes ln1 and qkv first.
typedef enum { GPT2_RECOMPUTE_NONE = 0, GPT2_RECOMPUTE_SELECTIVE = 1, GPT2_RECOMPUTE_FULL = 2 } GPT2Recompute;

// One micro-batch's activations over the blocks [l0, l1) of the model it was made for: the
// forward activations, their gradients, the batch (inputs, targets) and the losses. Several can
// be alive at once (a pipeline stage keeps one per micro-batch in flight); each is freed when
// its backward is done. Every byte of the activations is tagged MEM_ACTS.
// Pipeline boundaries: a.encoded is the input of block l0 (the embedding's output on the first
// stage; a stage l0 > 0 writes the activation it receives there, gpt2_acts_input);
// da.encoded is the gradient of that input (computed by block l0's backward: to send back);
// the gradient of the stage's output goes to gpt2_acts_doutput (block l1-1 reads it).
typedef struct GPT2Acts {
    int B, T;
    int l0, l1;               // the blocks whose activations are held (the model's)
    GPT2Dtype dtype;
    size_t act_sizes[GPT2_NUM_ACTS];  // of acts (bf16: one layer of the per-layer tensors)
    size_t num_acts;
    float *acts;              // fp32 activations (MEM_ACTS); bf16: see acts_bf16
    ActTensors a;             // views into acts
    size_t dact_sizes[GPT2_NUM_ACTS];  // gpt2_dact_sizes
    size_t num_dacts;
    float *dacts;             // gradients of the activations (MEM_ACTS), see gpt2_dact_sizes
    ActTensors da;            // views into dacts; NULL for the gradients never materialized
    int *inputs;              // (B, T) on dev (MEM_OTHER)
    int *targets;             // (B, T) on dev (MEM_OTHER)
    int has_targets;
    float *host_losses;       // (B, T) host copy of the per-position losses (head only)
    // bf16: the per-layer activations (ln1 .. residual3) of every block held are stored here,
    // rounded; acts holds ONE layer of them in fp32 (a block computes there, and its backward
    // widens its stored layer back there) and the embedding's and head's.
    uint16_t *acts_bf16;      // (l1-l0) * layer_act_size (MEM_ACTS, 2 bytes each)
    size_t layer_act_size;    // elements of one layer's activations
    float *block_in;          // bf16: (B,T,C) widened input of the piece running now (MEM_ACTS)
    // Split backward (gpt2_acts_alloc_split): what a block's W needs from its B, per block:
    // the gradients of ln1 (BTC), qkv (3BTC), residual2 (BTC), ln2 (BTC), fch (4BTC) =
    // 10*B*T*C floats per block held (MEM_ACTS). NULL until allocated.
    float *wsave;
    size_t wsave_per_block;   // floats per block: 10 * B * T * C
    int w_only;               // 1 after gpt2_acts_keep_for_w: only the blocks' W may run on it
    // A TP slice's set (common/tp.c's tp_acts_alloc, for t > 1 or sequence parallelism; 0 for
    // gpt2's own). Its blocks' sets are block-major (each block's 16 tensors ln1 .. residual3 at
    // the slice's widths one after the other, layer_stride elements apart; bf16: acts_bf16,
    // computing in the model's one fp32 layer); da.encoded is the gradient of the stream, in
    // place: of the stage's output before its backward, of its input after. See tp.h.
    int slice;
    int rows;                 // rows of the residual stream: B·T (sequence parallel: B·T/t)
    size_t layer_stride;      // 0: the stacked layout (gpt2_act_sizes); else block-major
    float *ce_max, *ce_sum, *ce_target;  // the vocab-parallel loss's statistics, (B·T) each
    float *lnf_local;         // sequence parallel: lnf's output on this rank's rows (rows, C)
    int borrows_batch;        // 1: inputs, targets are the caller's host arrays (a slice's set
                              // on the host reads the batch in place), not the set's
    GPT2Recompute recompute;  // its model's (gpt2_set_recompute): the recomputed tensors have
                              // size 0 here (views NULL) and live in rc, the model's scratch
    float *rc;
} GPT2Acts;

typedef struct GPT2 {
    GPT2Config cfg;     // the FULL model's config (cfg.L counts all blocks, also on a stage)
    int tp, tp_rank;    // TP slice tp_rank of tp (gpt2_build_tp; 1, 0: the whole tensors)
    Device dev;
    const Kernels *k;
    GPT2Dtype dtype;
    int l0, l1;         // the blocks held: [l0, l1) ([0, L) for the full model)
    int has_embed;      // l0 == 0: wte and wpe, the embedding
    int has_head;       // l1 == L: lnfw, lnfb and the output layer (wte, or its tied copy)
    size_t num_params;  // elements held (the full model: gpt2_param_count)
    int nplist;         // parameters held, in memory order
    GPT2Param *plist;   // (gpt2_stage_params)
    int nunits;
    GPT2Unit *units;    // in memory order (gpt2_stage_units)
    size_t wte_offset;  // where the wte the head reads starts (0, or the tied copy's offset)
    float *params;      // flat, num_params (MEM_PARAMS); NULL in bf16
    float *grads;       // flat, num_params (MEM_GRADS), NULL until gpt2_alloc_grads or in bf16
    // Mixed precision (dtype GPT2_BF16). Then params and grads are NULL.
    uint16_t *params_bf16; // flat, num_params (MEM_PARAMS, 2 bytes each)
    uint16_t *grads_bf16;  // flat, num_params (MEM_GRADS), NULL until gpt2_alloc_grads
    size_t work_size;      // floats in the largest piece: max(embed, one block, head)
    float *work;           // fp32 weights of the piece running now (MEM_OTHER)
    float *work_grads;     // fp32 gradients of that piece (MEM_OTHER), with the grads
    GPT2Acts act;          // the default activation set (gpt2_alloc_acts); NULL acts use it
    // A TP slice's pieces (common/tp.c; t > 1 or sequence parallelism): what the activation
    // sets of every micro-batch of (tp_B, tp_T) share (tp_build, MEM_ACTS): the backward's
    // gradients inside one block (tp_scratch); bf16: the fp32 layer a block computes in
    // (tp_layer) and the widened input of the piece running now (tp_block_in).
    int sp;                // sequence parallelism: the stream on B·T/t rows of this rank
    int tp_B, tp_T;
    float *tp_scratch, *tp_layer, *tp_block_in;
    // Recomputation (gpt2_set_recompute): the mode every set allocated after it takes, the one
    // layer of recomputed tensors those sets share (MEM_ACTS, for sets of (rc_B, rc_T)), and what
    // the backwards recomputed so far: model FLOPs (gpt2_recompute_flops_dtype's count) and seconds.
    GPT2Recompute recompute;
    float *rc_scratch;
    int rc_B, rc_T;
    double rc_flops, rc_seconds;
} GPT2;

// Config helpers. gpt2_config_check fails the job with a message naming the bad field.
void gpt2_config_check(const GPT2Config *cfg);
GPT2Config gpt2_config_tiny(void);             // V=256 T=64 L=4 C=128 NH=4
// Element counts of the 16 tensor kinds, stacked over L (llm.c's file layout).
void gpt2_param_sizes(const GPT2Config *cfg, size_t sizes[GPT2_NUM_TENSORS]);
size_t gpt2_param_count(const GPT2Config *cfg);
const char *gpt2_tensor_name(int tensor);      // "wte", "wpe", "ln1w", ...
// The full model's parameters in MEMORY order (wte, wpe, block 0's twelve, ..., lnfw, lnfb).
// Fills out (if not NULL) and returns the count, 4 + 12 * L.
int gpt2_params(const GPT2Config *cfg, GPT2Param *out);
// The same for a stage holding blocks [l0, l1) (see gpt2_build_stage): local offsets, global
// offsets into the full model. Returns the count.
int gpt2_stage_params(const GPT2Config *cfg, int l0, int l1, GPT2Param *out);
// The units of a stage [l0, l1) ([0, L): the full model's L+2) in memory order; returns the count.
int gpt2_stage_units(const GPT2Config *cfg, int l0, int l1, GPT2Unit *out);
// Elements a stage holds (gpt2_param_count for [0, L)).
size_t gpt2_stage_param_count(const GPT2Config *cfg, int l0, int l1);
// The unit of block l (of the full model) in m; fails if m does not hold it.
const GPT2Unit *gpt2_block_unit(const GPT2 *m, int l);
// Local element offset of tensor `tensor` of block `layer` (-1: wte, wpe, lnfw, lnfb) in m.
size_t gpt2_tensor_offset(const GPT2 *m, int tensor, int layer);

// The full model's flat buffer (memory order) <-> llm.c's stacked order, on the host
// (num_params floats each; not in place).
void gpt2_to_llmc(const GPT2Config *cfg, const float *mem, float *llmc);
void gpt2_from_llmc(const GPT2Config *cfg, const float *llmc, float *mem);

// Activation element counts for (B, T) of a set over nblocks blocks, with or without the head.
// gpt2_act_sizes / gpt2_dact_sizes: the full model's (nblocks = cfg->L, head).
void gpt2_act_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]);
void gpt2_act_sizes_range(const GPT2Config *cfg, int nblocks, int head, int B, int T,
                          size_t sizes[GPT2_NUM_ACTS]);
// The same for a set of a model that recomputes r: the recomputed tensors 0 (the model's scratch).
void gpt2_act_sizes_recompute(const GPT2Config *cfg, int nblocks, int head, int B, int T,
                              GPT2Recompute r, size_t sizes[GPT2_NUM_ACTS]);
// Element counts of the activation GRADIENTS (dacts), in ActTensors order. The activations are
// kept for every layer until backward; a block's internal gradients live only during its own
// backward, so ONE layer of them serves all L blocks (less memory, and it stays in cache):
// ln1, qkv, atty, preatt, att, residual2, ln2, fch, fch_gelu have one layer's size. Kept for
// every layer: residual3, the gradient of each block's output (a block reads it and writes the
// one below; a pipeline stage writes the gradient it receives there). Size 0 (view NULL), never
// materialized: attproj and fcproj (a sum passes its gradient through unchanged), the LayerNorm
// means and rstds, probs and losses (the loss backward goes to the logits directly).
void gpt2_dact_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]);
void gpt2_dact_sizes_range(const GPT2Config *cfg, int nblocks, int head, int B, int T,
                           size_t sizes[GPT2_NUM_ACTS]);

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
// A partial model (pipeline stage) holding blocks [l0, l1), 0 <= l0 < l1 <= cfg.L, with the
// embedding unit if l0 == 0 and the head unit if l1 == L. Memory order: [wte wpe] (first
// stage) [blocks l0..l1-1] [lnfw lnfb] (last stage) [wte] (last stage that is not the first).
// The tied wte: the embedding and the output layer share it. A stage that has both holds it
// once; otherwise the first stage holds wte (in its EMBED unit) and the last stage holds a COPY
// (its TIED_WTE unit, tied_copy = 1 in its parameter list) for the output layer. Both start from
// the same init; each gets only its own part of the gradient, so the chapter must sum the two
// wte gradients (all-reduce between first and last stage) before the optimizer step, and count
// wte once in the clipping norm. gpt2_build_stage(m, cfg, dev, dtype, 0, cfg.L) ==
// gpt2_build_dtype.
void gpt2_build_stage(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype, int l0, int l1);
// TP slice r of t (tensor parallelism, common/tp.h) of blocks [l0, l1): the same units at the
// slice's widths (gpt2_layout.h): wte's rows [r·Vl, (r+1)·Vl) of V padded to a multiple of t
// (padded rows zero), wpe, each block's shard (a block unit of tp_block_dims' widths), lnfw lnfb,
// in the order above. t = 1 is gpt2_build_stage. global_offset is where the FULL tensor or unit
// starts. Weights, gradients and bf16 work buffers as above; a slice (t > 1, or sequence
// parallel) runs tp.c's pieces on tp.c's activation sets (tp_build, tp_acts_alloc): this file's
// sets refuse it; t = 1 without SP runs this file's own.
void gpt2_build_tp(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype, int l0, int l1, int tp, int r);
// Whole <-> slice: gpt2_unshard writes m's buffer buf (num_params floats, m's layout: weights,
// a master, Adam's m or v; host or device) into its places of full_mem (on the host: the FULL
// model's memory order, zeroed by the caller): the slices always, the replicated tensors only
// when with_replicated, a tied copy never (so such buffers of a TP x PP grid, one
// with_replicated per TP group, sum to the whole model exactly). gpt2_shard is its inverse (a
// tied copy filled too): checkpoints move between any layouts, bit for bit. Every save, load and
// --dump of a layer-cut or sliced layout (07, 08, 09) goes through this pair.
void gpt2_unshard(const GPT2 *m, const float *buf, float *full_mem, int with_replicated);
void gpt2_shard(const GPT2 *m, const float *full_mem, float *buf);
// The weights the forward reads (fp32 params, or params_bf16 widened) as fp32 on the host, in
// m's memory order (num_params floats): what a --dump gathers through gpt2_unshard.
void gpt2_weights_to_host(const GPT2 *m, float *host);
// Initialization: N(0, 0.02) weights, residual projections (attprojw, fcprojw) scaled by
// 1/sqrt(2L) (the FULL L, also on a stage), biases 0, LayerNorm weights 1. Each element's value
// is a pure function of (seed, cfg, its index in llm.c's order): a stage, a shard, any layout
// holds exactly the slice of the full init.
void gpt2_init_params(GPT2 *m, uint64_t seed);
// Elements [begin, end) of the FULL model's flat buffer (memory order) as initialized.
void gpt2_init_slice(const GPT2Config *cfg, uint64_t seed, size_t begin, size_t end, float *out_host);
// m's own parameters (num_params, its memory order) as initialized, on the host.
void gpt2_init_local(const GPT2 *m, uint64_t seed, float *out_host);
void gpt2_alloc_grads(GPT2 *m);
void gpt2_alloc_acts(GPT2 *m, int B, int T);   // (re)allocates m->act
// Activation recomputation for the sets of (B, T) allocated after this call (see
// GPT2Recompute): allocates the model's one layer of recomputed tensors (gpt2_recompute_scratch
// floats). Models of whole blocks only (tp = 1, no SP), fp32 or bf16; the split backward
// refuses it.
void gpt2_set_recompute(GPT2 *m, GPT2Recompute r, int B, int T);
const char *gpt2_recompute_name(GPT2Recompute r);   // "none", "selective", "full"
// Floats of that scratch: selective 2*B*NH*T*T; full one layer but the block's output.
size_t gpt2_recompute_scratch(const GPT2Config *cfg, GPT2Recompute r, int B, int T);
// x[0..n) rounded to bf16 and back in place, as a bf16 store rounds them (the recomputed
// tensors a bf16 backward reads), through tmp, room for cap bf16 values.
void gpt2_round_through_bf16(const GPT2 *m, float *x, size_t n, uint16_t *tmp, size_t cap);
// Model FLOPs one block's recomputation runs (gpt2_flops_per_step's convention): full, the
// block's forward 2*(12C^2 + 13C) + 4*C*T per token; selective, QK^T and att*V, 4*C*T per token,
// and in bf16 ln1 and the qkv matmul too, 2*(3C^2 + 5C) per token more.
double gpt2_recompute_flops_dtype(const GPT2Config *cfg, GPT2Recompute r, GPT2Dtype dtype, int B,
                                  int T);
// Model FLOPs of one block's training step (gpt2_flops_per_step's share of a block):
// 6*(12C^2 + 13C) + 12*C*T per token, three times full recomputation's.
double gpt2_block_flops_per_step(const GPT2Config *cfg, int B, int T);
// What recomputation cost, per step, printed: the model FLOPs the backwards ran again as counted
// (GPT2.rc_flops) against the formula's (blocks x the per-block formula, / tp for a TP slice)
// and against step, the model FLOPs of the step's work on the same blocks ("-> x the step's").
void gpt2_print_recompute_flops(double counted, double formula, const char *blocks, int tp, double step,
                                GPT2Recompute r, GPT2Dtype dtype);
// The same for this rank's models (a pipeline stage's chunks, or one): their counters summed over
// steps steps of B rows (all micro-batches) of T; formula and step of their blocks, / their tp.
void gpt2_print_recompute_cost(const GPT2 *const *models, int n, int steps, int B, int T);
void gpt2_free(GPT2 *m);

// Activation sets. gpt2_acts_alloc: one (B, T) micro-batch over m's blocks [l0, l1), in m's
// precision, on m's device. gpt2_acts_alloc_split adds the storage the split backward needs
// (GPT2Acts.wsave). gpt2_acts_free releases every byte (and zeroes the struct).
void gpt2_acts_alloc(GPT2Acts *a, const GPT2 *m, int B, int T);
void gpt2_acts_alloc_split(GPT2Acts *a, const GPT2 *m);
void gpt2_acts_free(GPT2Acts *a);
// After the B of every block of a split set: keep only what the blocks' W read (the
// inputs of their matmuls and LayerNorms, the LayerNorm statistics, the gradient of each block's
// output, and wsave), free the rest (the head's logits and probabilities, attention's T x T,
// the other gradients). Then only gpt2_block_backward_weights may run on it; gpt2_acts_free
// frees it. bf16 sets keep the same tensors still rounded to bf16 (with each block's output but
// the last's), and a one-layer fp32 scratch of them that W widens them into (gpt2.c).
// gpt2_acts_w_floats: the floats it moves into its own buffer (fp32; per block and position:
// 5C + ATT + FC + 4; wsave stays as it is).
void gpt2_acts_keep_for_w(GPT2Acts *a, const GPT2 *m);
size_t gpt2_acts_w_floats(const GPT2 *m, int B, int T);
// Copy a (B,T) batch to the device (a slice's set on the host: read in place, borrows_batch).
// targets may be NULL (inference: no loss). acts NULL: m->act.
void gpt2_acts_set_batch(const GPT2 *m, GPT2Acts *a, const int *inputs, const int *targets);
// Pipeline boundaries (fp32, (B,T,C) on the device): where a stage l0 > 0 writes its input; the
// gradient of that input after block l0's backward; where the gradient of the stage's output
// goes before block l1-1's backward; and the stage's output copied into out (bf16: the stored,
// rounded values widened, exactly what the next block of the full model would read).
float *gpt2_acts_input(GPT2Acts *a);
float *gpt2_acts_dinput(GPT2Acts *a);
float *gpt2_acts_doutput(GPT2Acts *a);
void gpt2_acts_output(const GPT2 *m, GPT2Acts *a, float *out);

// Copy a (B,T) batch into m->act. targets may be NULL (inference: no loss).
void gpt2_set_batch(GPT2 *m, const int *inputs, const int *targets);

// Pieces with caller-supplied weights and activation set. acts NULL: m->act. Weights: one unit
// in the model's dtype (fp32 floats or bf16 words) at ANY address (NULL: m's own, in place):
// embed_w the EMBED unit (wte then wpe), block_w a BLOCK unit, head_w the HEAD unit (lnfw then
// lnfb), wte the (V, C) output-layer weights. Gradients: a unit-shaped buffer of the same dtype
// (NULL: m's own), ACCUMULATED into (+=).
void gpt2_embed_forward_w(GPT2 *m, GPT2Acts *acts, const void *embed_w);
void gpt2_block_forward_w(GPT2 *m, GPT2Acts *acts, int l, const void *block_w);
float gpt2_head_forward_w(GPT2 *m, GPT2Acts *acts, const void *wte, const void *head_w);
void gpt2_head_backward_w(GPT2 *m, GPT2Acts *acts, float dloss, const void *wte,
                          const void *head_w, void *dwte, void *dhead_w);
void gpt2_block_backward_w(GPT2 *m, GPT2Acts *acts, int l, const void *block_w, void *dblock_w);
void gpt2_embed_backward_w(GPT2 *m, GPT2Acts *acts, void *dembed_w);
// The split backward of block l (needs gpt2_acts_alloc_split). B: the gradient of the block's
// input (through every op), keeping what W needs in acts->wsave; W, any time later (before the
// next forward of this acts' block l): the 12 weight gradients. B then W gives exactly the bits
// of gpt2_block_backward_w (the same kernels on the same operands, in the same order per output).
void gpt2_block_backward_input(GPT2 *m, GPT2Acts *acts, int l, const void *block_w);
void gpt2_block_backward_weights(GPT2 *m, GPT2Acts *acts, int l, void *dblock_w);

// Whole passes over m's blocks on one activation set (a stage: embedding only if it has it,
// head only if it has it; a stage without the head returns -1 and its backward starts from the
// gradient in gpt2_acts_doutput).
float gpt2_forward_acts(GPT2 *m, GPT2Acts *acts, const int *inputs, const int *targets);
void gpt2_backward_acts(GPT2 *m, GPT2Acts *acts, float dloss);

// The original API, on m->act and m's own weights.
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

// ---- the machinery of the pieces, for a layout that computes a piece its own way ------------
// (common/tp.c's TP slices: the same weights, the same bf16 widening and rounding, the same
// stored activations as gpt2's own pieces, so there is one copy of them.)
//
// A piece's weights are one or two spans (the embedding: its unit, wte's rows then wpe; a
// block: its unit; the head: wte, then its unit lnfw lnfb), each at any address in the model's
// dtype (NULL: m's own), and its gradients the same (NULL: m's own; need_grads 0: none).
// gpt2_piece_weights / _grads give fp32 pointers, one per span: in place in fp32; bf16 widens
// the spans into m->work / m->work_grads (the gradients summed so far: the backward adds to
// them) and gpt2_piece_grads_done rounds the gradients back into their spans, once.
typedef struct GPT2Piece {
    size_t n;              // spans
    const void *w[2];      // weights of each span (float or uint16_t)
    void *g[2];            // gradients of each span (NULL: not needed)
    size_t size[2];        // elements
} GPT2Piece;
void gpt2_piece_embed(GPT2Piece *pc, const GPT2 *m, const void *w, void *g, int need_grads);
void gpt2_piece_block(GPT2Piece *pc, const GPT2 *m, int l, const void *w, void *g, int need_w,
                      int need_grads);
void gpt2_piece_head(GPT2Piece *pc, const GPT2 *m, const void *wte, const void *w, void *dwte,
                     void *g, int need_grads);
void gpt2_piece_weights(GPT2 *m, const GPT2Piece *pc, float *w[2]);
void gpt2_piece_grads(GPT2 *m, const GPT2Piece *pc, float *g[2]);
void gpt2_piece_grads_done(GPT2 *m, const GPT2Piece *pc);
size_t gpt2_wte_elems(const GPT2 *m);  // wte's rows this model holds (V, or a slice's Vl) x C

// One block's saved activations by name, at its widths: the 16 per-layer tensors of ActTensors.
typedef struct GPT2LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C), (B,T), (B,T)
    float *qkv;                        // (B,T,3ATT)
    float *atty;                       // (B,T,ATT)
    float *preatt, *att;               // (B,NH,T,T)
    float *attproj, *residual2;        // (B,T,C)
    float *ln2, *ln2_mean, *ln2_rstd;  // (B,T,C), (B,T), (B,T)
    float *fch, *fch_gelu;             // (B,T,FC)
    float *fcproj, *residual3;         // (B,T,C): residual3 is the block's output
} GPT2LayerActs;
// Block l's activations: its own in fp32; in bf16 the one fp32 layer every block of the set
// computes in. gpt2_layer_store (bf16, after block l's forward) rounds that layer into block l's
// stored place; gpt2_layer_widen (bf16, before its backward) widens it back. fp32: nothing.
GPT2LayerActs gpt2_layer_acts(const GPT2 *m, const GPT2Acts *a, int l);
void gpt2_layer_store(const GPT2 *m, GPT2Acts *a, int l);
void gpt2_layer_widen(const GPT2 *m, GPT2Acts *a, int l);
// The input of block l (l = l1: of the head), fp32: the set's input, or block l-1's output in
// place; bf16: block l-1's output as stored, rounded, widened into a->block_in, so that the
// next piece reads exactly the stored values, forward and backward (on a GPU the activations
// are bf16 tensors).
const float *gpt2_piece_input(const GPT2 *m, GPT2Acts *a, int l);
// The mean of the set's per-position losses (a.losses, on its device), summed on the host in
// position order: the same bits on every run.
float gpt2_acts_mean_loss(GPT2Acts *a);

// Model FLOPs of one training step (forward + backward) on B*T tokens: 6*N*B*T for the
// matmuls with parameters (incl. the tied output layer) + 12*L*C*T*B*T for attention
// (QKᵀ and AV, forward and backward, not halved for causality, as in PaLM's MFU formula).
double gpt2_flops_per_step(const GPT2Config *cfg, int B, int T);
