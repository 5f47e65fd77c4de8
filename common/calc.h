// calc.h: the lab's one set of formulas (chapter 00 teaches them; every chapter prints its
// formula columns from them): memory calculator, bytes on the wire, cost estimator, and the
// layout planner's interface (planner.c and the CLI stay in 00_memory_budget/).
//
// Three questions the notes ask before any GPU is switched on:
//   1. memory: how many bytes does one rank hold for params, grads, master weights, Adam m and v,
//      and activations, for a given model, precision, optimizer, ZeRO stage and DP/TP/PP layout?
//   2. cost:   GPU-hours = 6 * N * tokens / (peak FLOPS * MFU), wall-clock days, dollars.
//   3. plan:   on G GPUs of one type, which DP x TP x PP layouts (ZeRO stage, micro-batch,
//              recomputation) fit, ranked by an estimated step time that includes communication.
//
// Units: bytes are exact integers carried in doubles (exact below 2^53, i.e. 9 PB); printed
// as GB = 1e9 bytes (the notes' unit: "7B model = 112 GB") and GiB = 2^30 bytes side by side.
// Every function that takes user input has a *_check twin returning an error message (NULL when
// fine) instead of ending the program, so tests read messages and the CLI decides how to fail.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include "check.h"
#include "flags.h"
#include "gpt2.h"

// ------------------------------------------------------------------------------------------
// Models

typedef enum {
    CALC_ARCH_GPT2,   // LayerNorm (weight+bias), biases everywhere, learned positions (wpe)
    CALC_ARCH_LLAMA,  // RMSNorm (weight only), no biases, RoPE (no position parameters)
    CALC_ARCH_RAW,    // only a parameter count is known (--params): no per-layer view
} CalcArch;

typedef struct CalcModel {
    char name[32];      // "llama3-70b", "tiny", "custom", ...
    CalcArch arch;
    int V, T, L, C, NH; // vocab, context length, layers, channels, heads
    int KV;             // key/value heads (grouped-query attention); NH = plain multi-head
    int FFN;            // MLP hidden width (4C for GPT-2)
    int gated;          // 1: SwiGLU MLP, three C x FFN matrices (gate, up, down); 0: two
    int tied;           // 1: the output layer reuses the token embedding wte
    int64_t nparams;    // total parameters: computed from the dims, or given (CALC_ARCH_RAW)
    double published;   // the published count the preset is checked against (0: none)
    const char *about;  // one line: where the dims come from
    const char *alias;  // presets: the short name (--model 70b); else ""
} CalcModel;

// Presets: "tiny" (the lab's default model), "gpt2-124m", "gpt2-350m", "gpt2-774m",
// "gpt2-1.5b" (V = 50257, not llm.c's padded 50304), "llama2-7b", "llama2-13b", "llama3-70b",
// "llama3-405b" (Llama 3.1 405B); aliases "124m", "350m", "774m", "1.5b", "7b", "13b", "70b",
// "405b". Returns NULL for an unknown name.
const CalcModel *calc_model_preset(const char *name);
int calc_model_preset_count(void);
const CalcModel *calc_model_preset_at(int i);
// "unknown --model 'x': valid presets are tiny, gpt2-124m, ..." (static buffer).
const char *calc_model_preset_error(const char *name);

// A model from explicit dimensions (nparams computed). FFN == 0 picks the architecture's
// default: 4C for GPT-2, Llama's rule 256 * ceil((8C/3) / 256) for Llama. KV == 0 means NH.
CalcModel calc_model_dims(const char *name, CalcArch arch, int V, int T, int L, int C, int NH,
                          int KV, int FFN);
// The lab's own GPT-2 (what common/gpt2.c trains).
CalcModel calc_model_from_gpt2(const GPT2Config *cfg);
// Only a parameter count: model states can be computed, activations and TP/PP splits cannot.
CalcModel calc_model_raw(int64_t nparams);
// Parameter count from the dims (GPT-2: V*C + T*C + L*(12C^2 + 13C) + 2C for FFN = 4C).
int64_t calc_param_count(const CalcModel *m);
// NULL when the model is consistent, else what is wrong (static buffer).
const char *calc_model_check(const CalcModel *m);
// The message every *_check returns: formatted into one static buffer, valid until the next.
LAB_PRINTF(1, 2) const char *calc_msg(const char *fmt, ...);

// Parse a count with an optional suffix K, M, B (or G), T: "7e9", "7B", "124M", "15T".
// Returns NULL and sets *out, or an error message naming `flag` (static buffer).
const char *calc_parse_count(const char *s, const char *flag, double *out);
// Parse --dims "L=80,C=8192,NH=64,KV=8,FFN=28672,V=128256,T=8192,arch=llama,tied=0".
// Missing keys default to the tiny config (V=256 T=64 L=4 C=128 NH=4), arch=gpt2.
const char *calc_parse_dims(const char *s, CalcModel *out);

// ------------------------------------------------------------------------------------------
// GPUs

typedef struct CalcGpu {
    const char *name;     // "h100"
    const char *label;    // "H100 80GB SXM"
    double mem_bytes;     // HBM capacity (vendors' figure, read as GiB: HBM is sized in 2^30)
    double peak_flops;    // dense bf16 tensor-core peak, FLOP/s
    double bw_intra;      // NVLink bandwidth per GPU per direction, bytes/s (nominal)
    double bw_inter;      // InfiniBand bandwidth per GPU per direction, bytes/s (one NIC per GPU)
} CalcGpu;

// "a100-40", "a100-80", "h100", "h200"; NULL when unknown.
const CalcGpu *calc_gpu_preset(const char *name);
int calc_gpu_preset_count(void);
const CalcGpu *calc_gpu_preset_at(int i);
const char *calc_gpu_preset_error(const char *name);

// ------------------------------------------------------------------------------------------
// Memory per rank

typedef enum { CALC_FP32, CALC_BF16 } CalcDtype;      // bf16 = mixed precision (fp32 master)
typedef enum { CALC_ADAM, CALC_SGD } CalcOptim;       // SGD with momentum: one state buffer
typedef enum { CALC_RECOMPUTE_NONE, CALC_RECOMPUTE_SELECTIVE, CALC_RECOMPUTE_FULL } CalcRecompute;
// Which tensors a layer keeps for its backward pass. The two are the same accounting with a
// different list of stored tensors, chosen here rather than by a second function:
//   CALC_ACTS_PAPER  Korthikanti et al. 2022's GPT-3 block (dropout masks, bf16/fp16 values; SP
//                    and recomputation cut it): what Megatron stores, used for the large models.
//   CALC_ACTS_LAB    what chapter 09's TP stage (common/tp.c) stores per micro-batch, no
//                    dropout, the (B, NH/t, T, T) attention matrices twice, SP or not,
//                    recomputation (tp.h's tp_build, fp32 or bf16: selective drops the matrices, full keeps
//                    each block's output only; at t = 1 gpt2's own sets, chapter 08's, fp32 or bf16:
//                    calc_pipe_set_bytes_recompute). Each chunk's one layer of recompute
//                    scratch, allocated before the first step, is not in the walk
//                    (calc_recompute_scratch_bytes, calc_tp_recompute_scratch_bytes): exact for
//                    the lab's runs (the 8-rank test and tests/test_recompute.c check it).
typedef enum { CALC_ACTS_PAPER, CALC_ACTS_LAB } CalcActModel;

typedef struct CalcSetup {
    CalcDtype dtype;
    CalcOptim optim;
    int zero;           // ZeRO stage 0..3 over the DP group
    int dp, tp, pp;     // data, tensor, pipeline parallel degrees
    int sp;             // 1: sequence parallelism with TP (Megatron): activations split by tp
    int micro_batch;    // b, sequences per micro-batch
    int micro_batches;  // micro-batches per step (gradient accumulation); 1F1B keeps
                        // min(pp - stage, micro_batches) in flight. 0: assume a full pipeline.
    int seq_len;        // s, tokens per sequence; 0: the model's T
    CalcRecompute recompute;
    int chunks;         // v, model chunks per pipeline rank (interleaved 1F1B); 0 or 1: one.
                        // Virtual stage vs = chunk * pp + stage holds layers of S = pp * v.
    CalcActModel acts;  // which activation list (CALC_ACTS_PAPER unless said)
    int tp_fp32;        // 1: TP reduces fp32 values whatever the dtype (the lab's TP pieces compute
                        // in fp32 and reduce their fp32 buffers; Megatron reduces bf16: 0)
    int grads_whole;    // 1: the backward writes every chunk's WHOLE gradient buffer (the lab's TP
                        // stage), and ZeRO-1 and -2 reduce-scatter in place inside it: the rank
                        // holds the whole gradients whatever the stage (0: ZeRO-2 keeps only its
                        // pieces, the gradients written into buckets, as DeepSpeed's)
    int grid_order;     // where the ranks sit (calc_group_nodes): CALC_ORDER_TP_FIRST (0, chapter
                        // 09's grid: TP fastest, then DP, then PP) or CALC_ORDER_PP_FIRST
    int fsdp;           // with zero 3: FSDP's layout (every unit of a chunk cut into dp pieces,
                        // calc_chunk_units) instead of ZeRO-3's (the chunk's flat buffer cut)
    int keep_gathered;  // with zero 3 and grads_whole: a unit gathered once per step (FSDP's
                        // --reshard-after-forward 0), not around each forward and backward
    int split;          // 1: ZB-H1 (chapter 08's split backward; the lab's activation list, one
                        // chunk): a set lives from its F to its W, with what W reads from B
    int max_w;          // split: at most this many W's pending per stage (0: ZB-H1's own table)
    // How the lab's chapters cut their traffic into calls, for the link table's model of their
    // runs (session_print_links; 0: one call per collective, as the planner counts):
    int dp_buckets;     // ZeRO 0 and 2: the gradients go as this many collectives (03's buckets,
                        // or its tensors when they are all-reduced in place; 05's --bucket-kb),
                        // one ring's hops each (0 or 1: one)
    int unit_shards;    // with zero 3, one stage: chapters 05 and 06's unit by unit (fsdp: 06's
                        // pieces of every unit): each unit reduce-scattered after every
                        // micro-batch, and all-gathered around its uses: the embedding twice (its
                        // forward, the head's; kept for the head's backward), a block twice, the
                        // head once; keep_gathered: every unit once per micro-batch; 2: the
                        // reduce-scatters once per step (06's --no-sync)
    int loss_in_norm;   // the step's loss travels in the norm's all-reduce (06: two doubles)
    int sp_seq_calls;   // with sp: each reduce-scatter and all-gather of the activations is one
                        // call per sequence (common/tp.c: the lab's 07 and 09), micro_batch x
                        // the hops of one
} CalcSetup;

// Rank numbering of a DP x TP x PP grid; rank r sits on node r / gpus_per_node.
enum { CALC_ORDER_TP_FIRST = 0,   // rank = t + tp (d + dp p): a TP group is consecutive ranks
       CALC_ORDER_PP_FIRST = 1 }; // rank = p + pp (d + dp t): a PP group is consecutive ranks
enum { CALC_DIM_TP = 0, CALC_DIM_DP = 1, CALC_DIM_PP = 2 };
// The most nodes any one group along dim (CALC_DIM_*) spans, with gpus_per_node GPUs per node
// and the setup's grid_order: 1 when every such group stays inside a node. The planner times a
// group's traffic on the slowest link it crosses: inside a node when this is 1, else between.
int calc_group_nodes(const CalcSetup *s, int dim, int gpus_per_node);
// The planner's time of one group's traffic per step (alpha-beta: bytes / bw + hops x alpha):
// messages that come with every micro-batch (mb_*) are paid once per pipeline slot, `slots` of
// them (1F1B: m + pp - 1; the bubble's slots wait at the same pace), the rest once per step
// (nmb = m micro-batches: step_* - nmb x mb_*).
struct CalcTraffic;
double calc_traffic_slot_seconds(const struct CalcTraffic *t, double slots, int nmb, double bw,
                                 double alpha);

// fp32, Adam, ZeRO-0, DP=TP=PP=1, no SP, micro-batch 1, seq_len = T, no recomputation, one
// chunk, Korthikanti's activations.
CalcSetup calc_setup_default(void);
// The setup of a lab run (chapter 09's flags): dtype (fp32, or bf16 mixed precision), Adam, --batch sequences per step over dp
// replicas and m micro-batches (micro-batch = batch / (dp m)), T tokens, v chunks, ZeRO 0, 1
// or 2, the lab's activation list, TP on the wire in fp32 (tp_fp32), the whole gradients held
// (grads_whole). The run's figures are calc_rank_memory / calc_rank_comm of it (bf16: DP and PP
// carry bf16, TP fp32).
CalcSetup calc_setup_lab(int dp, int tp, int pp, int v, int m, int batch, int T, int zero,
                         CalcDtype dtype);
const char *calc_recompute_name(CalcRecompute r);  // "none", "selective", "full"
int calc_parse_dtype(const char *s, CalcDtype *out);          // 0 ok, -1 unknown
int calc_parse_optim(const char *s, CalcOptim *out);
int calc_parse_recompute(const char *s, CalcRecompute *out);

// Bytes per parameter of each model-state category before ZeRO sharding.
typedef struct CalcBytesPerParam {
    double params, grads, master, m, v;
} CalcBytesPerParam;
CalcBytesPerParam calc_bytes_per_param(CalcDtype dtype, CalcOptim optim);

// Elements of each model state that one rank keeps under ZeRO stage `zero` over dp ranks,
// out of psi: stage 1 shards the optimizer state (master, m, v), stage 2 also the gradients,
// stage 3 also the parameters. Shards are padded: ceil(psi / dp).
typedef struct CalcShard {
    int64_t params, grads, opt;
} CalcShard;
CalcShard calc_zero_shard(int64_t psi, int zero, int dp);

typedef struct CalcBreakdown {
    // bytes held by one rank of the heaviest pipeline stage
    double params, grads, master, m, v, acts, total;
    int64_t rank_params;     // parameters that rank owns after the TP/PP split, before ZeRO (Ψ)
    int stage, nstages;      // which stage is the heaviest, of how many
    int layers;              // layers on that stage
    int inflight;            // micro-batches whose activations that stage keeps (1F1B)
    char act_formula[320];   // which activation formula was used, in words
} CalcBreakdown;

// NULL when (model, setup) is valid, else a message naming the flag and valid values.
const char *calc_setup_check(const CalcModel *m, const CalcSetup *s);
// Memory of the heaviest rank: the largest calc_rank_memory over the stages (replica 0, whose
// ZeRO pieces are the longest). Call calc_setup_check first: invalid input ends the job.
CalcBreakdown calc_memory(const CalcModel *m, const CalcSetup *s);
// Memory of the rank at pipeline stage `stage` (0..pp-1), data-parallel replica `replica`
// (0..dp-1): its v chunks' parameters (calc_stage_params of each virtual stage), sharded as
// calc_zero_shard says, each chunk's buffer cut into dp pieces the way the runtime cuts it
// (common/shard.h: the first n % dp pieces one element longer), and its activations in flight.
CalcBreakdown calc_rank_memory(const CalcModel *m, const CalcSetup *s, int stage, int replica);
// Parameters one rank of pipeline stage `stage` holds after the TP/PP split (before ZeRO).
int64_t calc_stage_params(const CalcModel *m, int tp, int pp, int stage);
// Parameters every TP rank of virtual stage vs (of S) replicates: its layers' norms (and GPT-2's
// biases of row-parallel layers), the final norm on the last stage.
int64_t calc_stage_replicated_params(const CalcModel *m, int S, int vs);
// The units of the chunk of virtual stage vs of S on a TP rank of tp (GPT-2 only): the embedding
// (wte's rows and wpe) on vs 0, one per layer, the head (the final norm) on vs S-1 and there,
// when S > 1, the copy of the tied wte: the runtime's units (gpt2.h) in memory order. Fills
// sizes (room for calc_stage_layers + 3) and returns the count; they sum to calc_stage_params.
int calc_chunk_units(const CalcModel *m, int tp, int S, int vs, int64_t *sizes);
// Elements replica d keeps of the chunk's units (sizes, n in all) under the lab's ZeRO-3
// (fsdp 0: unit u's part of piece d of the chunk's flat buffer) or FSDP (fsdp 1: piece d of
// unit u): what a rank sends for u is the unit but its own part (a reduce-scatter) or but the
// next replica's (an all-gather).
int64_t calc_unit_piece(const int64_t *sizes, int nunits, int u, int fsdp, int dp, int d);
// Elements of piece d when n elements are cut into dp pieces, the first n % dp one longer.
int64_t calc_piece(int64_t n, int dp, int d);
// Elements of that piece d inside the range [lo, hi) of the n.
int64_t calc_range_piece(int64_t n, int dp, int d, int64_t lo, int64_t hi);
// Layers on pipeline stage `stage`: L/pp, or Llama 3's balanced split when (L+2) % pp == 0
// (first and last stage one layer fewer, to make room for the embedding and the head).
int calc_stage_layers(int L, int pp, int stage);

// Activation bytes of ONE layer for ONE micro-batch (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models"), value width w bytes (2 bf16, 4 fp32),
// 1-byte dropout masks: s*b*h*(16w + 2) + a*s^2*b*(2w + 1); for w = 2 that is the paper's
// s*b*h*(34 + 5*a*s/h). With TP t: s*b*h*(4w + 2 + 12w/t) + a*s^2*b*(2w+1)/t (w=2: 10 + 24/t +
// 5as/(ht)); with TP + SP everything / t. Selective recomputation drops the a*s^2 term, full
// recomputation keeps only the layer input, w*s*b*h (/t with SP).
double calc_layer_activation_bytes(const CalcModel *m, const CalcSetup *s);
// The exact bytes the lab's runtime allocates for activations AND their gradients (gpt2.h:
// ActTensors for every layer, gradients for one layer plus every block's output). With
// per layer  A = B*T*C*18 + B*T*4 + 2*B*NH*T*T  (ln1 .. residual3 of one block),
// outside     O = B*T*C*2 + B*T*3 + 2*B*T*V    (encoded, lnf and its mean/rstd, losses, logits, probs),
// gradients   D = B*T*C*(L + 17) + 2*B*NH*T*T + B*T*V:
//   GPT2_FP32: 4 * (L*A + O + D)
//   GPT2_BF16: 2 * L*A + 4 * (A + O + B*T*C + D)   (the L layers stored in bf16; one layer, the
//              outside tensors, a block's widened input and the gradients in fp32)
double calc_activation_bytes_lab(const GPT2Config *cfg, int B, int T, GPT2Dtype dtype);
// The same for a run that recomputes r (gpt2.h's GPT2Recompute; none: the above). Each
// block keeps of its A: selective A - 2*B*NH*T*T (the scores and softmax go), full B*T*C (its
// output, the next block's input); and the model ONE layer of what they drop, the scratch its
// backward recomputes into, fp32 in both dtypes (calc_recompute_scratch_bytes: 4 * (A - kept);
// bf16 rounds it through the gradients' scratch D, no more bytes):
//   GPT2_FP32: 4 * (L*kept + O + D) + 4 * (A - kept)
//   GPT2_BF16: 2 * L*kept + 4 * (kept + O + B*T*C + D) + 4 * (A - kept)
double calc_activation_bytes_recompute(const GPT2Config *cfg, int B, int T, GPT2Dtype dtype,
                                       GPT2Recompute r);
double calc_recompute_scratch_bytes(const GPT2Config *cfg, int B, int T, GPT2Recompute r);
// The lab's TP stage (CALC_ACTS_LAB, t > 1 or SP) recomputing s->recompute: the one layer of what
// its blocks do not keep, which each chunk's slice holds once (tp.h's tp_recompute_bytes): a
// block's set without recomputation less the set it keeps (selective 2*b*(a/t)*s^2 values,
// full all but its output).
double calc_tp_recompute_scratch_bytes(const CalcModel *m, const CalcSetup *s);

// 1 when total fits in mem_bytes.
int calc_fits(const CalcBreakdown *b, double mem_bytes);

// ------------------------------------------------------------------------------------------
// Bytes on the wire per rank (calc_comm.c): what one rank sends per step in its TP, DP and PP group,
// counted the way common/dist.c counts (what chapter 09 prints and its 8-rank test checks to
// the byte). A ring all-reduce of S bytes on n ranks sends 2(n-1)S/n (integer division), a
// reduce-scatter or all-gather of pieces every piece but one, a send its bytes, a broadcast's
// root its bytes once.
//   TP  per micro-batch and layer 4 all-reduces of b*s*h values (Megatron's g twice in forward,
//       f twice in backward; 6 with full recomputation, whose second forward repeats the g's,
//       under SP f's all-gathers and g's reduce-scatters: the same bytes);
//       the vocab-parallel embedding's sum (stage 0) and the head's f (last stage), b*s*h each;
//       the cross-entropy's max, sum of exp and target logit, b*s fp32 each; once per step the
//       clip norm (one double) and, with SP, the replicated parameters' gradients. SP replaces
//       each all-reduce by a reduce-scatter + all-gather: the same bytes.
//   DP  ZeRO-0 all-reduces every chunk's gradients once per step; ZeRO-1 reduce-scatters them
//       and all-gathers the updated parameters (the same 2(n-1)/n for even pieces); ZeRO-2
//       reduce-scatters after every micro-batch, but a chunk holding one end of the tied wte
//       (virtual stage 0 or S-1, S > 1) reduces its wte span (V/t·h values: the first chunk's
//       at the start of its buffer, the last's copy at the end) once per step, after the two
//       ends summed their gradients; ZeRO-3 also all-gathers the parameters twice per
//       micro-batch (forward and backward); plus the loss (one float), and with ZeRO the clip
//       norm's two parts (two doubles).
//   PP  per micro-batch and chunk one activation forward (not from the last virtual stage) and
//       one gradient back (not from the first), b*s*h values (/ t with SP: each TP rank sends
//       its sequence shard); once per step the clip norm (a double), the tied wte's gradient
//       between the first and the last stage (V/t x h values), the loss from the last stage.
// Values travel in the model's dtype (bf16 or fp32); the loss, norms and cross-entropy in fp32
// or fp64 as above.
typedef struct CalcTraffic {
    double mb_bytes;    // sent per micro-batch (all of this rank's chunks)
    double mb_hops;     // sequential message latencies per micro-batch (ring: 2(n-1) per all-reduce)
    double step_bytes;  // sent per optimizer step: m * mb_bytes + the once-per-step messages
    double step_hops;
} CalcTraffic;

typedef struct CalcComm {
    CalcTraffic tp, dp, pp;
    int micro_batches;  // m the step was counted with (micro_batches, or pp when that is 0)
} CalcComm;

CalcComm calc_rank_comm(const CalcModel *m, const CalcSetup *s, int stage, int replica);
// 2(n-1)*bytes/n rounded down, as dist counts a ring all-reduce of `bytes` on n ranks.
double calc_ring_all_reduce_bytes(double bytes, int n);
// Micro-batches per step the accounting assumes: micro_batches, or pp (a just-full pipeline).
int calc_micro_batches(const CalcSetup *s);

// The table (bytes/param, bytes, GB and GiB (or MB and MiB for small models), share), and the
// ASCII bars of the notes' "Training Memory per GPU" figure; mem_bytes > 0 draws the GPU's
// capacity as '|' (gpu_label names it) and says whether the total fits.
void calc_print_memory(FILE *out, const CalcModel *m, const CalcSetup *s, const CalcBreakdown *b);
void calc_print_bars(FILE *out, const CalcBreakdown *b, const char *gpu_label, double mem_bytes);

// ------------------------------------------------------------------------------------------
// Cost: GPU-hours = 6 * N * tokens / (peak FLOPS * MFU)

typedef struct CalcCostSpec {
    double nparams;      // N
    double tokens;
    double peak_flops;   // per GPU, FLOP/s
    double mfu;          // model FLOPs utilization, (0, 1]
    int gpus;            // for the wall clock
    double price;        // dollars per GPU-hour (>= 0)
} CalcCostSpec;

typedef struct CalcCost {
    double flops;        // 6 * N * tokens
    double gpu_seconds, gpu_hours, gpu_years;
    double wall_days;    // on `gpus` GPUs
    double dollars;
} CalcCost;

// The smallest MFU accepted (0.1 %): a utilization must be > 0, and one flag range, one check
// and one --help line say the same [CALC_MFU_MIN, 1].
#define CALC_MFU_MIN 0.001
const char *calc_cost_check(const CalcCostSpec *c);
CalcCost calc_cost(const CalcCostSpec *c);
void calc_print_cost(FILE *out, const CalcCostSpec *c, const CalcCost *r, const char *gpu_label);

// ------------------------------------------------------------------------------------------
// Planner (planner.c)

typedef struct CalcPlanSpec {
    int gpus;             // G
    int gpus_per_node;    // TP stays inside a node
    int global_batch;     // sequences per optimizer step, all ranks together
    int seq_len;          // 0: the model's T
    CalcDtype dtype;
    CalcOptim optim;
    double mem_bytes;     // capacity of one GPU
    double peak_flops;
    double mfu;           // fraction of peak the compute runs at (communication is added on top)
    double bw_intra;      // bytes/s per GPU per direction inside a node
    double bw_inter;      // bytes/s per GPU per direction between nodes
    double latency;       // alpha, seconds per message hop (inside a node; between nodes too
                          // unless latency_inter is set)
    double latency_inter; // alpha between nodes (0: latency; the virtual links have one each)
} CalcPlanSpec;

typedef struct CalcPlan {
    CalcSetup setup;      // dp, tp, pp, zero, sp, micro_batch, micro_batches, seq_len, recompute
    CalcBreakdown mem;
    int fits;
    // estimated time of one optimizer step, seconds (alpha-beta model, no overlap)
    double t_compute;     // pipeline-filled compute incl. bubble and recomputation
    double t_tp;          // tensor-parallel all-reduces
    double t_pp;          // pipeline send/recv
    double t_dp;          // data-parallel gradient sync / ZeRO gathers
    double t_step;
    double mfu;           // 6 N tokens / (G * peak * t_step)
    // bytes one GPU sends per step in each group (calc_rank_comm, the busiest stage of each)
    double b_tp, b_pp, b_dp;
    int tp_nodes;         // nodes one TP group spans (calc_group_nodes): 1 = inside a node
} CalcPlan;

typedef struct CalcPlanResult {
    CalcPlan *plans;      // every valid candidate: fitting ones first, each part by t_step
    int nplans, nfit;
    int min_gpus;         // nfit == 0: fewest GPUs (whole nodes) with a fitting layout; 0: none
    CalcPlan best_at_min; // the best layout at min_gpus
    double state_bytes;   // 16-bytes-per-param style total of model states (all ranks)
} CalcPlanResult;

const char *calc_plan_check(const CalcModel *m, const CalcPlanSpec *p);
// Enumerates tp (dividing gpus_per_node, or whole nodes of it, and the heads; plans with TP
// inside a node rank before any whose TP group spans nodes), pp (valid for L), dp = G/(tp*pp)
// (dividing the global batch), ZeRO 0-3, micro-batch 1..64 (powers of 2), recomputation;
// sequence parallelism on whenever tp > 1. Caller frees with calc_plan_free.
CalcPlanResult calc_plan(const CalcModel *m, const CalcPlanSpec *p);
void calc_plan_free(CalcPlanResult *r);
// The best fitting plan with this DP x TP x PP layout, or NULL.
const CalcPlan *calc_plan_find(const CalcPlanResult *r, int dp, int tp, int pp);
// Estimated step time of one candidate (fills the t_*, b_* fields and mfu of *c). The
// communication times are calc_rank_comm's bytes and hops: bytes / bandwidth + hops * alpha,
// per micro-batch slot for TP and PP (1F1B runs m + pp - 1 slots), per step for DP; each
// dimension's time is its busiest stage's.
void calc_plan_time(const CalcModel *m, const CalcPlanSpec *p, CalcPlan *c);
// The bandwidth a group along dim (CALC_DIM_*) is timed at: the slowest link it crosses (between
// nodes when calc_group_nodes says the group spans more than one node, else inside a node).
double calc_plan_link_bw(const CalcPlanSpec *p, const CalcSetup *s, int dim);
// The latency of that link (latency, or latency_inter when set and the group spans nodes).
double calc_plan_link_lat(const CalcPlanSpec *p, const CalcSetup *s, int dim);
// The layout report of --layout: memory per GPU by category and bytes per step per dimension
// for every pipeline stage (replica 0), then the step time per dimension and MFU (p: the
// GPU, bandwidths and MFU; p->global_batch = dp * m * micro-batch, p->gpus = dp * tp * pp).
void calc_print_layout(FILE *out, const CalcModel *m, const CalcSetup *s, const CalcPlanSpec *p,
                       const char *gpu_label);
// The ranked table, one row per DP x TP x PP layout (its best ZeRO/micro-batch/recompute);
// when nothing fits, why, and the fewest GPUs that would do.
void calc_print_plan(FILE *out, const CalcModel *m, const CalcPlanSpec *p,
                     const CalcPlanResult *r, int top, const char *gpu_label);

// ------------------------------------------------------------------------------------------
// Small formatting helpers shared by the printers.
char *calc_fmt_count(char *buf, size_t n, double count);   // "70.55 B", "834.3 K"
char *calc_fmt_commas(char *buf, size_t n, int64_t x);     // "834,304"

// ------------------------------------------------------------------------------------------
// Command line (calc_cli.c): the chapter's own flags and the calculator/cost/planner modes.

typedef struct CalcCliArgs {
    // The chapter's flags (calc_cli_flags points a FlagSpec table at these). The model
    // "--model lab" (the default), --dtype and --batch come from the shared flags (LabArgs).
    int list;               // --list-presets
    const char *model;      // --model PRESET or alias (7b, 70b, ...); "lab": --vocab --seq ...
    const char *params;     // --params N (NULL = not given)
    const char *dims;       // --dims "L=..,C=..,NH=..,..." (NULL = not given)
    const char *optimizer;  // --optimizer adam|sgd
    int zero;               // --zero 0..3
    int fsdp;               // --fsdp (with a lab --layout: chapter 09's FSDP, CalcSetup.fsdp)
    int dp, tp, pp;         // --dp --tp --pp
    int seq_parallel;       // --seq-parallel
    int micro_batch;        // --micro-batch (0: --batch for the lab model, else 1)
    int seq_len;            // --seq-len (0: the model's T)
    const char *gpu;        // --gpu a100-40|a100-80|h100|h200 (NULL: none for the memory
                            // table, h100 for --cost and --plan)
    float gpu_mem;          // --gpu-mem GB (0: the preset's)
    float peak_tflops;      // --peak-tflops (0: the preset's)
    int cost;               // --cost
    const char *tokens;     // --tokens N
    float mfu;              // --mfu
    int gpus;               // --gpus
    float price;            // --price $/GPU-hour
    int plan;               // --plan
    const char *layout;     // --layout DPxTPxPP (NULL: not given)
    int micro_batches;      // --micro-batches m (0: the lab model's 2, as chapter 09; else pp)
    int chunks;             // --chunks v (interleaved 1F1B)
    int gpus_per_node;      // --gpus-per-node
    int global_batch;       // --global-batch (sequences)
    float bw_intra, bw_inter;  // --bw-intra --bw-inter GB/s (0: the preset's)
    float latency_us;       // --latency-us
    int top;                // --top rows of the plan table
} CalcCliArgs;

#define CALC_CLI_MAX_FLAGS 40
CalcCliArgs calc_cli_defaults(void);
// The chapter's flags as a FlagSpec table pointing into *a (static storage; *n = its length).
// Pass them to lab_parse_args as (part of) the chapter's extra flags.
const FlagSpec *calc_cli_flags(CalcCliArgs *a, int *n);
// Runs the memory calculator, then --cost and --plan when asked, and prints (call on one
// rank). Bad input ends the job with lab_fail_collective. Returns 0.
int calc_cli_run(const CalcCliArgs *a, const LabArgs *lab);

// ------------------------------------------------------------------------------------------
// Sharded data parallelism (calc_shard.c): the formula columns of chapters 05 (ZeRO, the flat
// buffer in N pieces) and 06 (FSDP, every unit in N pieces), for the lab's GPT-2, whose flat
// buffer is its units in memory order: the embedding (wte, wpe), the L blocks, the head (the
// final LayerNorm; the output layer is wte, tied).

// The elements of each unit, sizes[0 .. L+1] (room for L + 2); returns L + 2.
int calc_gpt2_units(const CalcModel *m, int64_t *sizes);
// The elements rank q of N owns when every unit is cut into N pieces by the runtime's rule
// (calc_piece of each unit: FSDP's layout, common/zero.h's zero_layout_init).
int64_t calc_unit_shard(const int64_t *sizes, int nunits, int N, int q);
// The model states (params, grads, master, m, v; acts and total 0 .. total of the five) of a
// rank owning `shard` elements of a model of psi under ZeRO stage `zero` (which states are
// sharded: calc_zero_shard; what a sharded state holds: the rank's own shard, exactly).
CalcBreakdown calc_shard_state(int64_t psi, int64_t shard, int zero, CalcDtype dtype);
// Bytes one rank sends per step for the gradients and parameters of ZeRO stage `zero` on N
// ranks, e bytes a value, N dividing psi: 2 psi (N-1)/N (stage 0's all-reduce; 1, 2: the
// reduce-scatter and the all-gather), 3 psi (N-1)/N for stage 3 (parameters gathered for
// forward and again for backward). The loss and the clipping norm are extra.
double calc_zero_wire_bytes(int64_t psi, int zero, int N, double e);
// ZeRO-2's gradient memory during backward, bytes (chapter 05's buckets): my shard, the bucket
// buffers alive (in_flight of `bucket` elements; the whole gradient when it is fewer buckets),
// and the unit gradients the kernels write (the embedding's all through backward, the tied
// head adds to it first; one other unit at a time, the largest).
double calc_zero2_grad_bytes(int64_t psi, int64_t shard, int64_t bucket, int in_flight,
                             int64_t embed, int64_t largest_unit, double e);
// FSDP's collectives per step of K micro-batches over L blocks: all-gathers K (2L+3) with
// reshard after forward (every unit again for its backward but the head, which runs back to
// back; the embedding twice in forward, for the tied head), K (L+2) without; reduce-scatters
// (L+2) per micro-batch that syncs (K, or 1 with no_sync).
int calc_fsdp_all_gathers(int L, int reshard, int K);
int calc_fsdp_reduce_scatters(int L, int K, int no_sync);
// Their bytes per rank and step when G divides every unit: all-gather K (2 psi - head) (G-1)/G
// e with reshard (K psi (G-1)/G e without), reduce-scatter (K or 1) psi (G-1)/G e.
void calc_fsdp_wire_bytes(int64_t psi, int64_t head, int G, int K, int reshard, int no_sync,
                          double e, double *all_gather, double *reduce_scatter);

// ---- pipeline (calc_pipe.c) ----
// Chapter 08's formula columns, from gpt2.h's size formulas and the schedule table alone, to
// the byte: the activations a pipeline chunk keeps per micro-batch (Bm sequences of T tokens),
// the most it keeps at once when its table runs, and the bytes a stage sends per step. A chunk
// is nb consecutive blocks of cfg; the last virtual stage also holds the head.
struct Schedule;

// One activation set of a chunk (F allocates it, B frees it). fp32: the activations and their
// gradients (gpt2_act_sizes_range, gpt2_dact_sizes_range), plus W's saved gradients (10C per
// block and position) when split. bf16: the blocks' per-layer activations (ln1 .. residual3)
// in bf16, 2 bytes each; in fp32 one layer of them (the scratch a block computes in) with the
// embedding's and the head's, block_in (a block's input widened, BTC), the gradients, and W's
// saved gradients when split.
double calc_pipe_set_bytes(const GPT2Config *cfg, int nb, int has_head, int Bm, int T,
                           GPT2Dtype dtype, int split);
// The same when the chunk recomputes r: each of its nb blocks keeps calc_recompute_scratch_bytes
// less (fp32: 4 bytes a value; bf16: 2 in each stored layer, and 4 in its one fp32 layer); that
// one layer lives once per chunk model, from its build.
double calc_pipe_set_bytes_recompute(const GPT2Config *cfg, int nb, int has_head, int Bm, int T,
                                     GPT2Dtype dtype, int split, GPT2Recompute r);
// ZB-H1: what a deferred W keeps from B to W (gpt2_acts_keep_for_w): per block and position
// the inputs of its matmuls and LayerNorms (ln1, atty, ln2: C each; fch_gelu: 4C; the block's
// input, residual2: C each), the two LayerNorms' mean and rstd (4), the gradient of the
// block's output (C) and wsave (10C): fp32 20C + 4 floats. bf16 (gpt2.c's keep_for_w_bf16):
// the 8C + 4 of them stored per block stay bf16 (with each block's output, C, but the last's),
// and in fp32 one layer of them (8C + 4), the set's input (C), block_in (C), the gradients of
// the blocks' outputs (C per block) and wsave (10C per block).
double calc_pipe_w_bytes(const GPT2Config *cfg, int nb, int Bm, int T, GPT2Dtype dtype);
// The most activation bytes alive at once on pipeline rank `rank` when its row of table s
// runs op after op: + a set at F, - a set at B (split: + a W store), - a W store at W; every
// chunk holds cfg->L / (p v) blocks, the last virtual stage the head.
double calc_pipe_peak_bytes(const GPT2Config *cfg, const struct Schedule *s, int rank, int Bm,
                            int T, GPT2Dtype dtype);
// The same with sets that recompute r (the chunks' scratch layers, allocated before the first
// step, not counted: v * calc_recompute_scratch_bytes more for the whole run).
double calc_pipe_peak_bytes_recompute(const GPT2Config *cfg, const struct Schedule *s, int rank,
                                      int Bm, int T, GPT2Dtype dtype, GPT2Recompute r);
// Bytes rank `rank` of p sends per step: one message of msg_elems elements (Bm·T·C) of
// elem_bytes (fp32 4, bf16 2) per micro-batch for every boundary one of its v chunks has with
// a chunk on another rank (forward to the next virtual stage, backward to the previous).
double calc_pipe_sent_bytes(int p, int v, int m, int rank, double msg_elems, int elem_bytes);
