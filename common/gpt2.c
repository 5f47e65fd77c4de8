// gpt2.c: GPT-2 as docs/ARCHITECTURE.md specifies it: one flat, block-major parameter buffer (units), the
// activations of a (B,T) micro-batch as objects, and forward/backward in pieces (embedding,
// block l, head) that read their weights from any address.
//
// All tensor work goes through the kernel table m->k, so the same code runs on CPU and GPU;
// the buffers live on m->dev and are only touched here through mem_copy/mem_zero.
#include "gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

// ----------------------------------------------------------------------------------------------
// Config and parameter layout

static const char *tensor_names[GPT2_NUM_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

const char *gpt2_tensor_name(int tensor) {
    if (tensor < 0 || tensor >= GPT2_NUM_TENSORS) return "?";
    return tensor_names[tensor];
}

void gpt2_config_check(const GPT2Config *cfg) {
    const struct { const char *name; int value; } fields[] = {
        {"V (vocabulary size)", cfg->V}, {"T (max sequence length)", cfg->T},
        {"L (layers)", cfg->L},          {"C (channels)", cfg->C},
        {"NH (heads)", cfg->NH},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].value < 1)
            lab_fail_collective("model config: %s = %d, but it must be at least 1", fields[i].name,
                                fields[i].value);
    if (cfg->C % cfg->NH != 0)
        lab_fail_collective("model config: C = %d is not divisible by NH = %d (every head gets "
                            "C/NH channels); pick NH among the divisors of C",
                            cfg->C, cfg->NH);
}

GPT2Config gpt2_config_tiny(void) {
    GPT2Config cfg = {.V = 256, .T = 64, .L = 4, .C = 128, .NH = 4};
    return cfg;
}

void gpt2_param_sizes(const GPT2Config *cfg, size_t sizes[GPT2_NUM_TENSORS]) {
    size_t V = (size_t)cfg->V, T = (size_t)cfg->T, L = (size_t)cfg->L, C = (size_t)cfg->C;
    sizes[GPT2_WTE] = V * C;
    sizes[GPT2_WPE] = T * C;
    sizes[GPT2_LN1W] = L * C;
    sizes[GPT2_LN1B] = L * C;
    sizes[GPT2_QKVW] = L * (3 * C) * C;
    sizes[GPT2_QKVB] = L * (3 * C);
    sizes[GPT2_ATTPROJW] = L * C * C;
    sizes[GPT2_ATTPROJB] = L * C;
    sizes[GPT2_LN2W] = L * C;
    sizes[GPT2_LN2B] = L * C;
    sizes[GPT2_FCW] = L * (4 * C) * C;
    sizes[GPT2_FCB] = L * (4 * C);
    sizes[GPT2_FCPROJW] = L * C * (4 * C);
    sizes[GPT2_FCPROJB] = L * C;
    sizes[GPT2_LNFW] = C;
    sizes[GPT2_LNFB] = C;
}

size_t gpt2_param_count(const GPT2Config *cfg) {
    size_t sizes[GPT2_NUM_TENSORS], n = 0;
    gpt2_param_sizes(cfg, sizes);
    for (int i = 0; i < GPT2_NUM_TENSORS; i++) n += sizes[i];
    return n;
}

// 2-D weight matrices: the ones AdamW decays.
static int is_matrix(int tensor) {
    return tensor == GPT2_WTE || tensor == GPT2_WPE || tensor == GPT2_QKVW ||
           tensor == GPT2_ATTPROJW || tensor == GPT2_FCW || tensor == GPT2_FCPROJW;
}

static int is_block_tensor(int tensor) { return tensor >= GPT2_LN1W && tensor <= GPT2_FCPROJB; }

// The widths of a block unit of TP slice r of t (t = 1: the full block; every slice has the
// same): the ONE place every block kernel call and every unit size takes its shapes from.
static GPT2BlockDims dims_tp(const GPT2Config *cfg, int tp) { return tp_block_dims(cfg->C, cfg->NH, tp); }
static GPT2BlockDims block_dims(const GPT2 *m) { return dims_tp(&m->cfg, m->tp); }
// Rows of the tied wte one slice holds: V, or V padded to a multiple of t, over t.
static size_t vocab_rows(const GPT2Config *cfg, int tp) { return (size_t)tp_vocab(cfg->V, tp, 0).Vl; }

// Offset of tensor t of layer l (-1 for the unstacked ones) in llm.c's stacked file order.
static size_t llmc_offset(const GPT2Config *cfg, int t, int l) {
    size_t sizes[GPT2_NUM_TENSORS], offset = 0;
    gpt2_param_sizes(cfg, sizes);
    for (int i = 0; i < t; i++) offset += sizes[i];
    if (is_block_tensor(t)) offset += (size_t)l * (sizes[t] / (size_t)cfg->L);
    return offset;
}

static void check_stage(const GPT2Config *cfg, int l0, int l1) {
    if (l0 < 0 || l1 > cfg->L || l0 >= l1)
        lab_fail_collective("model stage: blocks [%d, %d) of a model with L = %d: a stage holds "
                            "blocks [l0, l1) with 0 <= l0 < l1 <= L", l0, l1, cfg->L);
}

// The units of blocks [l0, l1) of TP slice r of t (gpt2_build_tp): the same list at the slice's
// widths (wte's Vl rows, block shards); global offsets are the full model's (t = 1: exact).
static int stage_units(const GPT2Config *cfg, int l0, int l1, int tp, GPT2Unit *out) {
    check_stage(cfg, l0, l1);
    GPT2BlockDims d = dims_tp(cfg, tp), fd = dims_tp(cfg, 1);
    size_t V = vocab_rows(cfg, tp), T = (size_t)cfg->T, C = (size_t)cfg->C;
    size_t embed = V * C + T * C, block = gpt2_block_layout(&d, NULL, NULL);
    // where the full model's units start (the slice's own sizes above)
    size_t fembed = (size_t)cfg->V * C + T * C, fblock = gpt2_block_layout(&fd, NULL, NULL);
    int n = 0;
    size_t at = 0;
#define UNIT(K, LAYER, GLOBAL, SIZE)                                                  \
    do {                                                                              \
        if (out) out[n] = (GPT2Unit){(K), (LAYER), at, (GLOBAL), (SIZE)};             \
        at += (SIZE);                                                                 \
        n++;                                                                          \
    } while (0)
    if (l0 == 0) UNIT(GPT2_UNIT_EMBED, -1, 0, embed);
    for (int l = l0; l < l1; l++) UNIT(GPT2_UNIT_BLOCK, l, fembed + (size_t)l * fblock, block);
    if (l1 == cfg->L) {
        UNIT(GPT2_UNIT_HEAD, -1, fembed + (size_t)cfg->L * fblock, 2 * C);
        if (l0 > 0) UNIT(GPT2_UNIT_TIED_WTE, -1, 0, V * C);
    }
#undef UNIT
    return n;
}

int gpt2_stage_units(const GPT2Config *cfg, int l0, int l1, GPT2Unit *out) {
    return stage_units(cfg, l0, l1, 1, out);
}

// Tensors a TP group splits (vocab-parallel wte; column-parallel qkv, fc; row-parallel attproj,
// fcproj weights), by kind; the rest is replicated.
static int is_sliced(int t) {
    return t == GPT2_WTE || (is_block_tensor(t) && tp_block_sliced(t - GPT2_LN1W));
}

static int stage_params(const GPT2Config *cfg, int l0, int l1, int tp, GPT2Param *out) {
    GPT2Unit *units = lab_xcalloc((size_t)(l1 - l0 + 3), sizeof(GPT2Unit));
    int nu = stage_units(cfg, l0, l1, tp, units);
    GPT2BlockDims d = dims_tp(cfg, tp);
    size_t boff[GPT2_BLOCK_TENSORS], bsize[GPT2_BLOCK_TENSORS];
    gpt2_block_layout(&d, boff, bsize);
    size_t V = vocab_rows(cfg, tp), T = (size_t)cfg->T, C = (size_t)cfg->C;
    int n = 0;
    for (int u = 0; u < nu; u++) {
        const GPT2Unit *un = &units[u];
        int tensors[GPT2_BLOCK_TENSORS], nt = 0;
        size_t within[GPT2_BLOCK_TENSORS], size[GPT2_BLOCK_TENSORS];
        switch (un->kind) {
        case GPT2_UNIT_EMBED:
            tensors[0] = GPT2_WTE, within[0] = 0, size[0] = V * C;
            tensors[1] = GPT2_WPE, within[1] = V * C, size[1] = T * C;
            nt = 2;
            break;
        case GPT2_UNIT_BLOCK:
            for (nt = 0; nt < GPT2_BLOCK_TENSORS; nt++)
                tensors[nt] = GPT2_LN1W + nt, within[nt] = boff[nt], size[nt] = bsize[nt];
            break;
        case GPT2_UNIT_HEAD:
            tensors[0] = GPT2_LNFW, within[0] = 0, size[0] = C;
            tensors[1] = GPT2_LNFB, within[1] = C, size[1] = C;
            nt = 2;
            break;
        case GPT2_UNIT_TIED_WTE:
            tensors[0] = GPT2_WTE, within[0] = 0, size[0] = V * C;
            nt = 1;
            break;
        }
        for (int i = 0; i < nt; i++, n++) {
            if (!out) continue;
            GPT2Param *p = &out[n];
            int t = tensors[i];
            memset(p, 0, sizeof *p);
            if (un->kind == GPT2_UNIT_BLOCK) snprintf(p->name, sizeof p->name, "h.%d.%s", un->layer, tensor_names[t]);
            else snprintf(p->name, sizeof p->name, "%s", tensor_names[t]);
            p->tensor = t;
            p->layer = un->layer;
            p->offset = un->offset + within[i];
            p->global_offset = un->global_offset + within[i];
            p->llmc_offset = llmc_offset(cfg, t, un->layer);
            p->size = size[i];
            p->decay = is_matrix(t);
            p->tied_copy = un->kind == GPT2_UNIT_TIED_WTE;
            p->sliced = is_sliced(t);
        }
    }
    free(units);
    return n;
}

int gpt2_stage_params(const GPT2Config *cfg, int l0, int l1, GPT2Param *out) {
    return stage_params(cfg, l0, l1, 1, out);
}

int gpt2_params(const GPT2Config *cfg, GPT2Param *out) { return gpt2_stage_params(cfg, 0, cfg->L, out); }

static size_t stage_param_count(const GPT2Config *cfg, int l0, int l1, int tp) {
    GPT2Unit *units = lab_xcalloc((size_t)(l1 - l0 + 3), sizeof(GPT2Unit));
    int nu = stage_units(cfg, l0, l1, tp, units);
    size_t n = units[nu - 1].offset + units[nu - 1].size;
    free(units);
    return n;
}

size_t gpt2_stage_param_count(const GPT2Config *cfg, int l0, int l1) { return stage_param_count(cfg, l0, l1, 1); }

const GPT2Unit *gpt2_block_unit(const GPT2 *m, int l) {
    LAB_CHECK(l >= m->l0 && l < m->l1, "block %d is not in this model's blocks [%d, %d)", l, m->l0, m->l1);
    const GPT2Unit *u = &m->units[m->has_embed + (l - m->l0)];
    LAB_CHECK(u->kind == GPT2_UNIT_BLOCK && u->layer == l, "unit table out of order at block %d", l);
    return u;
}

size_t gpt2_tensor_offset(const GPT2 *m, int tensor, int layer) {
    for (int i = 0; i < m->nplist; i++)
        if (m->plist[i].tensor == tensor && m->plist[i].layer == layer) return m->plist[i].offset;
    lab_fail("gpt2_tensor_offset: this model holds no %s of layer %d (blocks [%d, %d))",
             gpt2_tensor_name(tensor), layer, m->l0, m->l1);
}

// The full model's buffer <-> llm.c's stacked order: each parameter is one contiguous range in both.
static void permute(const GPT2Config *cfg, const float *from, float *to, int to_llmc) {
    int n = gpt2_params(cfg, NULL);
    GPT2Param *p = lab_xcalloc((size_t)n, sizeof(GPT2Param));
    gpt2_params(cfg, p);
    for (int i = 0; i < n; i++) {
        size_t src = to_llmc ? p[i].offset : p[i].llmc_offset;
        size_t dst = to_llmc ? p[i].llmc_offset : p[i].offset;
        memcpy(to + dst, from + src, p[i].size * sizeof(float));
    }
    free(p);
}

void gpt2_to_llmc(const GPT2Config *cfg, const float *mem, float *llmc) { permute(cfg, mem, llmc, 1); }
void gpt2_from_llmc(const GPT2Config *cfg, const float *llmc, float *mem) { permute(cfg, llmc, mem, 0); }

// Indices of the first and last per-layer tensor in ActTensors order (encoded is 0).
enum { ACT_LN1 = 1, ACT_RESIDUAL3 = 16 };

void gpt2_act_sizes_range(const GPT2Config *cfg, int nblocks, int head, int B, int T,
                          size_t sizes[GPT2_NUM_ACTS]) {
    size_t L = (size_t)nblocks, C = (size_t)cfg->C, NH = (size_t)cfg->NH, V = (size_t)cfg->V;
    size_t BT = (size_t)B * (size_t)T, H = head ? 1 : 0;
    size_t i = 0;
    sizes[i++] = BT * C;                          // encoded
    sizes[i++] = L * BT * C;                      // ln1
    sizes[i++] = L * BT;                          // ln1_mean
    sizes[i++] = L * BT;                          // ln1_rstd
    sizes[i++] = L * BT * 3 * C;                  // qkv
    sizes[i++] = L * BT * C;                      // atty
    sizes[i++] = L * (size_t)B * NH * T * T;      // preatt
    sizes[i++] = L * (size_t)B * NH * T * T;      // att
    sizes[i++] = L * BT * C;                      // attproj
    sizes[i++] = L * BT * C;                      // residual2
    sizes[i++] = L * BT * C;                      // ln2
    sizes[i++] = L * BT;                          // ln2_mean
    sizes[i++] = L * BT;                          // ln2_rstd
    sizes[i++] = L * BT * 4 * C;                  // fch
    sizes[i++] = L * BT * 4 * C;                  // fch_gelu
    sizes[i++] = L * BT * C;                      // fcproj
    sizes[i++] = L * BT * C;                      // residual3
    sizes[i++] = H * BT * C;                      // lnf
    sizes[i++] = H * BT;                          // lnf_mean
    sizes[i++] = H * BT;                          // lnf_rstd
    sizes[i++] = H * BT * V;                      // logits
    sizes[i++] = H * BT * V;                      // probs
    sizes[i++] = H * BT;                          // losses
    LAB_CHECK(i == GPT2_NUM_ACTS, "gpt2_act_sizes: %zu sizes for %d tensors", i, GPT2_NUM_ACTS);
}

void gpt2_act_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]) {
    gpt2_act_sizes_range(cfg, cfg->L, 1, B, T, sizes);
}

// ActTensors index i of a block's tensors: recomputed under r (not kept by the set)?
enum { ACT_PREATT = 6, ACT_ATT = 7 };
static int recomputed(GPT2Recompute r, int i) {
    if (r == GPT2_RECOMPUTE_FULL) return i >= ACT_LN1 && i < ACT_RESIDUAL3;  // all but the output
    if (r == GPT2_RECOMPUTE_SELECTIVE) return i == ACT_PREATT || i == ACT_ATT;
    return 0;
}

void gpt2_act_sizes_recompute(const GPT2Config *cfg, int nblocks, int head, int B, int T,
                              GPT2Recompute r, size_t sizes[GPT2_NUM_ACTS]) {
    gpt2_act_sizes_range(cfg, nblocks, head, B, T, sizes);
    for (int i = 0; i < GPT2_NUM_ACTS; i++)
        if (recomputed(r, i)) sizes[i] = 0;
}

size_t gpt2_recompute_scratch(const GPT2Config *cfg, GPT2Recompute r, int B, int T) {
    size_t one[GPT2_NUM_ACTS], n = 0;  // one layer, in ActTensors order
    gpt2_act_sizes_range(cfg, 1, 0, B, T, one);
    for (int i = 0; i < GPT2_NUM_ACTS; i++)
        if (recomputed(r, i)) n += one[i];
    return n;
}

double gpt2_recompute_flops_dtype(const GPT2Config *cfg, GPT2Recompute r, GPT2Dtype dtype, int B,
                                  int T) {
    const double C = cfg->C, BT = (double)B * T, attn = 4.0 * C * T;  // QK^T and att*V
    if (r == GPT2_RECOMPUTE_FULL) return BT * (2.0 * (12.0 * C * C + 13.0 * C) + attn);
    if (r != GPT2_RECOMPUTE_SELECTIVE) return 0.0;
    // bf16: ln1 (2C weights) and the qkv matmul (3C^2 + 3C) again too, 2 FLOPs per weight
    return BT * (attn + (dtype == GPT2_BF16 ? 2.0 * (3.0 * C * C + 5.0 * C) : 0.0));
}

double gpt2_block_flops_per_step(const GPT2Config *cfg, int B, int T) {
    const double C = cfg->C;
    return (double)B * T * (6.0 * (12.0 * C * C + 13.0 * C) + 12.0 * C * T);
}

void gpt2_print_recompute_flops(double counted, double formula, const char *blocks, int tp, double step,
                                GPT2Recompute r, GPT2Dtype dtype) {
    char per[16] = "";
    if (tp > 1) snprintf(per, sizeof per, " / %d", tp);
    printf("\nRecomputation (--recompute %s), per step:\n", gpt2_recompute_name(r));
    const int bf16_sel = r == GPT2_RECOMPUTE_SELECTIVE && dtype == GPT2_BF16;
    printf("  FLOPs run again   %.4g counted = %.4g by the formula (%s x %s%s%s) -> %.4f x the step's %.4g"
           " model FLOPs%s\n", counted, formula, blocks,
           r == GPT2_RECOMPUTE_FULL ? "(2*(12C^2+13C) + 4CT) BT"
           : bf16_sel               ? "(2*(3C^2+5C) + 4CT) BT"
                                    : "4CT BT",
           per, bf16_sel ? ": bf16 reruns ln1 and qkv too" : "", 1.0 + counted / step, step,
           r == GPT2_RECOMPUTE_FULL ? " (the notes: about 4/3)" : "");
}

void gpt2_print_recompute_cost(const GPT2 *const *models, int n, int steps, int B, int T) {
    const GPT2 *m = models[0];
    double counted = 0.0;
    int blocks = 0;
    for (int i = 0; i < n; i++) counted += models[i]->rc_flops, blocks += models[i]->l1 - models[i]->l0;
    const int tp = m->tp > 1 ? m->tp : 1;
    const double formula = blocks * gpt2_recompute_flops_dtype(&m->cfg, m->recompute, m->dtype, B, T) / tp;
    const double step = blocks * gpt2_block_flops_per_step(&m->cfg, B, T) / tp;
    char what[32];
    snprintf(what, sizeof what, "%d blocks", blocks);
    gpt2_print_recompute_flops(counted / steps, formula, what, tp, step, m->recompute, m->dtype);
}

const char *gpt2_recompute_name(GPT2Recompute r) {
    return r == GPT2_RECOMPUTE_FULL ? "full" : r == GPT2_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

void gpt2_dact_sizes_range(const GPT2Config *cfg, int nblocks, int head, int B, int T,
                           size_t sizes[GPT2_NUM_ACTS]) {
    size_t L = (size_t)nblocks, C = (size_t)cfg->C, NH = (size_t)cfg->NH, V = (size_t)cfg->V;
    size_t BT = (size_t)B * (size_t)T, H = head ? 1 : 0;
    size_t i = 0;
    sizes[i++] = BT * C;                          // encoded: the gradient of block l0's input
    sizes[i++] = BT * C;                          // ln1        \.
    sizes[i++] = 0;                               // ln1_mean    |
    sizes[i++] = 0;                               // ln1_rstd    |
    sizes[i++] = BT * 3 * C;                      // qkv         |
    sizes[i++] = BT * C;                          // atty        |
    sizes[i++] = (size_t)B * NH * T * T;          // preatt      |
    sizes[i++] = (size_t)B * NH * T * T;          // att         |  one layer of scratch,
    sizes[i++] = 0;                               // attproj     |  shared by all blocks
    sizes[i++] = BT * C;                          // residual2   |
    sizes[i++] = BT * C;                          // ln2         |
    sizes[i++] = 0;                               // ln2_mean    |
    sizes[i++] = 0;                               // ln2_rstd    |
    sizes[i++] = BT * 4 * C;                      // fch         |
    sizes[i++] = BT * 4 * C;                      // fch_gelu    |
    sizes[i++] = 0;                               // fcproj     /
    sizes[i++] = L * BT * C;                      // residual3: every block's output
    sizes[i++] = H * BT * C;                      // lnf
    sizes[i++] = 0;                               // lnf_mean
    sizes[i++] = 0;                               // lnf_rstd
    sizes[i++] = H * BT * V;                      // logits
    sizes[i++] = 0;                               // probs
    sizes[i++] = 0;                               // losses
    LAB_CHECK(i == GPT2_NUM_ACTS, "gpt2_dact_sizes: %zu sizes for %d tensors", i, GPT2_NUM_ACTS);
}

void gpt2_dact_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]) {
    gpt2_dact_sizes_range(cfg, cfg->L, 1, B, T, sizes);
}

// Point the named views into a flat buffer, in struct order (the same order as the sizes);
// a tensor of size 0 gets NULL.
static void point_acts(ActTensors *a, float *base, const size_t sizes[GPT2_NUM_ACTS]) {
    float **views[GPT2_NUM_ACTS] = {
        &a->encoded, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->preatt,
        &a->att, &a->attproj, &a->residual2, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch,
        &a->fch_gelu, &a->fcproj, &a->residual3, &a->lnf, &a->lnf_mean, &a->lnf_rstd,
        &a->logits, &a->probs, &a->losses,
    };
    for (int i = 0; i < GPT2_NUM_ACTS; i++) {
        *views[i] = sizes[i] ? base : NULL;
        base += sizes[i];
    }
}

// ----------------------------------------------------------------------------------------------
// Initialization: a counter-based random generator, so that the element with llm.c index i is a
// pure function of (seed, i) and any slice, in any layout, can be drawn alone.

// splitmix64's finalizer: a bijective 64-bit mix with good avalanche.
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A standard normal for element i (Box-Muller on two uniforms hashed from (seed, i)).
static double normal_at(uint64_t seed, size_t i) {
    const uint64_t golden = 0x9e3779b97f4a7c15ull;
    uint64_t stream = mix64(seed + golden);  // nearby seeds give unrelated streams
    uint64_t h1 = mix64(stream + (2 * (uint64_t)i + 1) * golden);
    uint64_t h2 = mix64(stream + (2 * (uint64_t)i + 2) * golden);
    double u1 = ((double)(h1 >> 11) + 0.5) * 0x1p-53;  // (0, 1): log(u1) is finite
    double u2 = (double)(h2 >> 11) * 0x1p-53;          // [0, 1)
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// Elements [from, from + n) of parameter p, into out.
static void init_param(const GPT2Config *cfg, uint64_t seed, const GPT2Param *p, size_t from,
                       size_t n, float *out) {
    int t = p->tensor;
    if (is_matrix(t)) {
        // residual projections add into the residual stream once per layer: scale their init so
        // the stream's variance does not grow with depth (GPT-2 paper); the FULL model's L
        double residual_scale = 1.0 / sqrt(2.0 * cfg->L);
        double std = 0.02 * (t == GPT2_ATTPROJW || t == GPT2_FCPROJW ? residual_scale : 1.0);
        size_t base = p->llmc_offset + from;
        for (size_t i = 0; i < n; i++) out[i] = (float)(std * normal_at(seed, base + i));
    } else {
        float value = (t == GPT2_LN1W || t == GPT2_LN2W || t == GPT2_LNFW) ? 1.0f : 0.0f;  // LN weight 1, biases 0
        for (size_t i = 0; i < n; i++) out[i] = value;
    }
}

void gpt2_init_slice(const GPT2Config *cfg, uint64_t seed, size_t begin, size_t end, float *out_host) {
    size_t total = gpt2_param_count(cfg);
    LAB_CHECK(begin <= end && end <= total, "gpt2_init_slice: range [%zu, %zu) outside the %zu parameters",
              begin, end, total);
    int n = gpt2_params(cfg, NULL);
    GPT2Param *p = lab_xcalloc((size_t)n, sizeof(GPT2Param));
    gpt2_params(cfg, p);
    for (int i = 0; i < n; i++) {
        size_t lo = p[i].offset > begin ? p[i].offset : begin;
        size_t hi = p[i].offset + p[i].size < end ? p[i].offset + p[i].size : end;
        if (lo < hi) init_param(cfg, seed, &p[i], lo - p[i].offset, hi - lo, out_host + (lo - begin));
    }
    free(p);
}

// A TP slice (t > 1): each unit drawn from the full model's indices (gpt2_layout.h's runs of
// the block tensors, wte's rows; wpe and the head whole), the padded wte rows zero.
static void init_slice_tp(const GPT2 *m, uint64_t seed, float *out) {
    const GPT2Config *cfg = &m->cfg;
    const int C = cfg->C, t = m->tp, r = m->tp_rank;
    const TpVocab tv = tp_vocab(cfg->V, t, r);
    const GPT2BlockDims fd = gpt2_block_dims(cfg), sd = block_dims(m);
    size_t foff[GPT2_BLOCK_TENSORS], soff[GPT2_BLOCK_TENSORS];
    gpt2_block_layout(&fd, foff, NULL);  // where block tensor i starts in the full unit
    gpt2_block_layout(&sd, soff, NULL);  // ... and in the slice's
    const size_t c = (size_t)C, wl = (size_t)tv.Vl * c;
    for (int u = 0; u < m->nunits; u++) {
        const GPT2Unit *un = &m->units[u];
        float *at = out + un->offset;
        const size_t g0 = un->global_offset;
        if (un->kind == GPT2_UNIT_BLOCK) {
            TpRun run;
            for (int i = 0; i < GPT2_BLOCK_TENSORS; i++)
                for (size_t j = 0; tp_slice_run(i, j, C, t, r, &run); j++)
                    gpt2_init_slice(cfg, seed, g0 + foff[i] + run.full, g0 + foff[i] + run.full + run.n,
                                    at + soff[i] + run.shard);
        } else if (un->kind == GPT2_UNIT_HEAD) {
            gpt2_init_slice(cfg, seed, g0, g0 + un->size, at);
        } else {  // EMBED, TIED_WTE: wte's rows (wte starts the full model), then wpe
            gpt2_init_slice(cfg, seed, (size_t)tv.v0 * c, (size_t)(tv.v0 + tv.nvalid) * c, at);
            memset(at + (size_t)tv.nvalid * c, 0, (size_t)(tv.Vl - tv.nvalid) * c * sizeof(float));
            if (un->kind == GPT2_UNIT_EMBED)
                gpt2_init_slice(cfg, seed, (size_t)cfg->V * c, (size_t)(cfg->V + cfg->T) * c, at + wl);
        }
    }
}

void gpt2_init_local(const GPT2 *m, uint64_t seed, float *out_host) {
    if (m->tp > 1) {
        init_slice_tp(m, seed, out_host);
        return;
    }
    for (int i = 0; i < m->nplist; i++)
        init_param(&m->cfg, seed, &m->plist[i], 0, m->plist[i].size, out_host + m->plist[i].offset);
}

// buf (n floats, host or device) readable on the host: itself, or a copy (*tmp, to free).
static const float *on_host(const float *buf, size_t n, float **tmp) {
    *tmp = NULL;
    if (mem_device_of(buf) == DEV_CPU) return buf;
    *tmp = lab_xmalloc(n * sizeof(float));
    mem_copy(*tmp, buf, n * sizeof(float));
    return *tmp;
}

// The whole <-> slice pair: each unit of m between its place in m's buffer and the full
// model's (gpt2_layout.h's slicing for wte's rows and the block shards; the rest whole). A
// device buffer goes through the host.
void gpt2_unshard(const GPT2 *m, const float *buf_any, float *full_mem, int with_replicated) {
    const GPT2Config *cfg = &m->cfg;
    const TpVocab tv = tp_vocab(cfg->V, m->tp, m->tp_rank);
    float *tmp;
    const float *buf = on_host(buf_any, m->num_params, &tmp);
    for (int u = 0; u < m->nunits; u++) {
        const GPT2Unit *un = &m->units[u];
        const float *at = buf + un->offset;
        float *to = full_mem + un->global_offset;
        if (un->kind == GPT2_UNIT_BLOCK) {
            GPT2BlockWeights fb = gpt2_full_block(cfg, full_mem, un->layer);
            GPT2BlockWeights sb = tp_block_views((float *)at, cfg->C, m->tp);
            tp_block_unshard(&fb, &sb, cfg->C, m->tp, m->tp_rank, with_replicated);
        } else if (un->kind == GPT2_UNIT_EMBED) {
            tp_wte_unshard(to, at, &tv, cfg->C);
            if (with_replicated)
                memcpy(to + (size_t)cfg->V * cfg->C, at + (size_t)tv.Vl * cfg->C,
                       (size_t)cfg->T * cfg->C * sizeof(float));
        } else if (un->kind == GPT2_UNIT_HEAD && with_replicated) {
            memcpy(to, at, un->size * sizeof(float));
        }  // the tied copy never: the first stage's wte is the one
    }
    free(tmp);
}

void gpt2_shard(const GPT2 *m, const float *full_mem, float *buf_any) {
    const GPT2Config *cfg = &m->cfg;
    const TpVocab tv = tp_vocab(cfg->V, m->tp, m->tp_rank);
    const int dev = mem_device_of(buf_any) != DEV_CPU;  // written on the host, then copied over
    float *buf = dev ? lab_xcalloc(m->num_params, sizeof(float)) : buf_any;
    for (int u = 0; u < m->nunits; u++) {
        const GPT2Unit *un = &m->units[u];
        float *at = buf + un->offset;
        const float *from = full_mem + un->global_offset;
        if (un->kind == GPT2_UNIT_BLOCK) {
            GPT2BlockWeights fb = gpt2_full_block(cfg, (float *)full_mem, un->layer);
            GPT2BlockWeights sb = tp_block_views(at, cfg->C, m->tp);
            tp_block_shard(&sb, &fb, cfg->C, m->tp, m->tp_rank);
        } else if (un->kind == GPT2_UNIT_HEAD) {
            memcpy(at, from, un->size * sizeof(float));
        } else {  // EMBED, TIED_WTE: wte's rows (the tied copy too: a resume fills both)
            tp_wte_shard(at, from, &tv, cfg->C);
            if (un->kind == GPT2_UNIT_EMBED)
                memcpy(at + (size_t)tv.Vl * cfg->C, from + (size_t)cfg->V * cfg->C,
                       (size_t)cfg->T * cfg->C * sizeof(float));
        }
    }
    if (dev) {
        mem_copy(buf_any, buf, m->num_params * sizeof(float));
        free(buf);
    }
}

void gpt2_weights_to_host(const GPT2 *m, float *host) {
    if (m->dtype == GPT2_FP32) {
        mem_copy(host, m->params, m->num_params * sizeof(float));
        return;
    }
    uint16_t *h16 = lab_xmalloc(m->num_params * sizeof(uint16_t));
    mem_copy(h16, m->params_bf16, m->num_params * sizeof(uint16_t));
    kernels_cpu.bf16_to_f32(host, h16, m->num_params);
    free(h16);
}

// ----------------------------------------------------------------------------------------------
// Lifecycle

void gpt2_build(GPT2 *m, GPT2Config cfg, Device dev) { gpt2_build_dtype(m, cfg, dev, GPT2_FP32); }

void gpt2_build_dtype(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype) {
    gpt2_config_check(&cfg);
    gpt2_build_stage(m, cfg, dev, dtype, 0, cfg.L);
}

// The largest piece, in floats: the embedding (wte, wpe), one block, or the head (wte, lnf).
static size_t largest_piece(const GPT2Config *cfg, int tp) {
    size_t V = vocab_rows(cfg, tp), T = (size_t)cfg->T, C = (size_t)cfg->C;
    GPT2BlockDims d = dims_tp(cfg, tp);
    size_t embed = V * C + T * C, head = V * C + 2 * C, block = gpt2_block_layout(&d, NULL, NULL);
    size_t most = embed > head ? embed : head;
    return most > block ? most : block;
}

void gpt2_build_stage(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype, int l0, int l1) {
    gpt2_build_tp(m, cfg, dev, dtype, l0, l1, 1, 0);
}

void gpt2_build_tp(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype, int l0, int l1, int tp, int r) {
    gpt2_config_check(&cfg);
    check_stage(&cfg, l0, l1);
    if (tp > 1) tp_check_config(&cfg, tp);
    LAB_CHECK(tp >= 1 && r >= 0 && r < tp, "gpt2_build_tp: slice %d of %d", r, tp);
    memset(m, 0, sizeof *m);
    m->tp = tp;
    m->tp_rank = r;
    m->cfg = cfg;
    m->dev = dev;
    // bf16 models may multiply on tensor cores in TF32 (kernels.h): it keeps more bits than bf16
    m->k = dtype == GPT2_BF16 ? kernels_get_tf32(dev) : kernels_get(dev);
    m->dtype = dtype;
    m->l0 = l0;
    m->l1 = l1;
    m->has_embed = l0 == 0;
    m->has_head = l1 == cfg.L;
    m->nplist = stage_params(&cfg, l0, l1, tp, NULL);
    m->plist = lab_xcalloc((size_t)m->nplist, sizeof(GPT2Param));
    stage_params(&cfg, l0, l1, tp, m->plist);
    m->nunits = stage_units(&cfg, l0, l1, tp, NULL);
    m->units = lab_xcalloc((size_t)m->nunits, sizeof(GPT2Unit));
    stage_units(&cfg, l0, l1, tp, m->units);
    m->num_params = stage_param_count(&cfg, l0, l1, tp);
    m->wte_offset = m->has_embed ? 0 : m->units[m->nunits - 1].offset;  // the TIED_WTE unit
    if (dtype == GPT2_BF16) {
        m->params_bf16 = mem_alloc(m->num_params * sizeof(uint16_t), MEM_PARAMS, dev);
        m->work_size = largest_piece(&cfg, tp);
        m->work = mem_alloc(m->work_size * sizeof(float), MEM_OTHER, dev);
        return;
    }
    m->params = mem_alloc(m->num_params * sizeof(float), MEM_PARAMS, dev);
}

void gpt2_init_params(GPT2 *m, uint64_t seed) {
    if (m->dtype == GPT2_BF16) {  // draw in fp32, store rounded to bf16
        float *host = mem_alloc(m->num_params * sizeof(float), MEM_OTHER, DEV_CPU);
        uint16_t *host16 = mem_alloc(m->num_params * sizeof(uint16_t), MEM_OTHER, DEV_CPU);
        gpt2_init_local(m, seed, host);
        kernels_cpu.f32_to_bf16(host16, host, m->num_params);
        mem_copy(m->params_bf16, host16, m->num_params * sizeof(uint16_t));
        mem_free(host);
        mem_free(host16);
        return;
    }
    if (m->dev == DEV_CPU) {
        gpt2_init_local(m, seed, m->params);
        return;
    }
    float *host = mem_alloc(m->num_params * sizeof(float), MEM_OTHER, DEV_CPU);
    gpt2_init_local(m, seed, host);
    mem_copy(m->params, host, m->num_params * sizeof(float));
    mem_free(host);
}

void gpt2_alloc_grads(GPT2 *m) {
    if (m->dtype == GPT2_BF16) {
        if (m->grads_bf16) return;
        m->grads_bf16 = mem_alloc(m->num_params * sizeof(uint16_t), MEM_GRADS, m->dev);
        m->work_grads = mem_alloc(m->work_size * sizeof(float), MEM_OTHER, m->dev);
        return;
    }
    if (m->grads) return;
    m->grads = mem_alloc(m->num_params * sizeof(float), MEM_GRADS, m->dev);
}

// The activations: fp32, all of them in acts. bf16: the per-layer ones (ln1 .. residual3 of
// every block held) stored rounded in acts_bf16, and acts in fp32 with ONE layer of them (where
// a block computes, and where its backward widens its stored layer) plus the embedding's and the
// head's. The activation gradients (dacts): da.X is the gradient of a.X, laid out by
// gpt2_dact_sizes_range, fp32 in both precisions.
void gpt2_acts_alloc(GPT2Acts *a, const GPT2 *m, int B, int T) {
    LAB_CHECK(m->tp == 1 && !m->sp, "gpt2_acts_alloc: a TP slice (t = %d%s) has tp.c's sets "
              "(tp_acts_alloc)", m->tp, m->sp ? ", sequence parallel" : "");
    if (B < 1) lab_fail("batch size B = %d: it must be at least 1", B);
    if (T < 1 || T > m->cfg.T)
        lab_fail("sequence length T = %d: it must be between 1 and the model's maximum T = %d", T,
                 m->cfg.T);
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = T;
    a->l0 = m->l0;
    a->l1 = m->l1;
    a->dtype = m->dtype;
    a->rows = B * T;
    int nb = m->l1 - m->l0;
    LAB_CHECK(!m->recompute || (B == m->rc_B && T == m->rc_T), "gpt2_acts_alloc: a set of (%d, %d) "
              "on a model that recomputes for sets of (%d, %d)", B, T, m->rc_B, m->rc_T);
    a->recompute = m->recompute;
    a->rc = m->rc_scratch;
    gpt2_act_sizes_recompute(&m->cfg, m->dtype == GPT2_BF16 ? 1 : nb, m->has_head, B, T,
                             m->recompute, a->act_sizes);
    gpt2_dact_sizes_range(&m->cfg, nb, m->has_head, B, T, a->dact_sizes);
    for (int i = 0; i < GPT2_NUM_ACTS; i++) {
        a->num_acts += a->act_sizes[i];
        a->num_dacts += a->dact_sizes[i];
    }
    a->acts = mem_alloc(a->num_acts * sizeof(float), MEM_ACTS, m->dev);
    a->dacts = mem_alloc(a->num_dacts * sizeof(float), MEM_ACTS, m->dev);
    point_acts(&a->a, a->acts, a->act_sizes);
    point_acts(&a->da, a->dacts, a->dact_sizes);
    size_t BT = (size_t)B * T;
    if (m->dtype == GPT2_BF16) {
        // one layer's activations: the 16 tensors from ln1 to residual3, contiguous in acts
        for (int i = ACT_LN1; i <= ACT_RESIDUAL3; i++) a->layer_act_size += a->act_sizes[i];
        a->acts_bf16 = mem_alloc((size_t)nb * a->layer_act_size * sizeof(uint16_t), MEM_ACTS, m->dev);
        a->block_in = mem_alloc(BT * (size_t)m->cfg.C * sizeof(float), MEM_ACTS, m->dev);
    }
    a->inputs = mem_alloc(BT * sizeof(int), MEM_OTHER, m->dev);
    a->targets = mem_alloc(BT * sizeof(int), MEM_OTHER, m->dev);
    a->host_losses = mem_alloc(BT * sizeof(float), MEM_OTHER, DEV_CPU);
}

// What a block's W needs from its B: the gradients of ln1, qkv, residual2, ln2, fch.
static size_t wsave_floats(const GPT2BlockDims *d, size_t BT) {
    return BT * ((size_t)d->C * 3 + 3 * (size_t)d->ATT + (size_t)d->FC);
}

void gpt2_acts_alloc_split(GPT2Acts *a, const GPT2 *m) {
    LAB_CHECK(a->acts, "gpt2_acts_alloc_split before gpt2_acts_alloc");
    LAB_CHECK(!a->recompute, "gpt2_acts_alloc_split: a split backward's W reads what its B "
              "recomputed, later: recomputation (%s) is for the whole backward", gpt2_recompute_name(a->recompute));
    if (a->wsave) return;
    GPT2BlockDims d = block_dims(m);
    a->wsave_per_block = wsave_floats(&d, (size_t)a->B * a->T);
    a->wsave = mem_alloc((size_t)(a->l1 - a->l0) * a->wsave_per_block * sizeof(float), MEM_ACTS, m->dev);
}

void gpt2_acts_free(GPT2Acts *a) {
    mem_free(a->acts);
    mem_free(a->acts_bf16);
    if (!a->slice) mem_free(a->block_in);  // (a slice's is its model's: tp_block_in)
    mem_free(a->dacts);
    mem_free(a->wsave);
    if (!a->borrows_batch) mem_free(a->inputs), mem_free(a->targets);
    mem_free(a->host_losses);
    memset(a, 0, sizeof *a);
}

// bf16: the same tensors, in the set's own layout. Each stored layer keeps, still rounded, what
// W reads (ln1 and its mean and rstd, atty, residual2, ln2 and its statistics, fch_gelu: the
// order of ActTensors) followed by its output residual3 (the next block's input; not for the
// last block); the one-layer fp32 scratch shrinks to the set's input (encoded) and one layer of
// those tensors, where gpt2_layer_widen widens them. W then reads the very values it read before.
// block_in (where gpt2_piece_input widens a block's input), wsave and the gradients of the blocks'
// outputs stay; the rest goes.
static void keep_for_w_bf16(GPT2Acts *a, const GPT2 *m) {
    // the tensors W reads, by index in ActTensors: encoded (0), ln1, ln1_mean, ln1_rstd (1-3),
    // atty (5), residual2 (9), ln2, ln2_mean, ln2_rstd (10-12), fch_gelu (14)
    static const unsigned char for_w[ACT_RESIDUAL3] = {1, 1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0};
    const size_t nb = (size_t)(a->l1 - a->l0), BTC = (size_t)a->B * a->T * (size_t)m->cfg.C;
    size_t sizes[GPT2_NUM_ACTS] = {0}, wl = 0;  // the scratch's tensors; one layer of them
    for (int i = 0; i < ACT_RESIDUAL3; i++) {
        sizes[i] = for_w[i] ? a->act_sizes[i] : 0;
        if (i >= ACT_LN1) wl += sizes[i];
    }
    const size_t stride = wl + BTC;  // a kept layer: its W tensors, then its output
    uint16_t *keep = mem_alloc((nb * stride - BTC) * sizeof(uint16_t), MEM_ACTS, m->dev);
    for (size_t li = 0; li < nb; li++) {
        const uint16_t *from = a->acts_bf16 + li * a->layer_act_size;
        uint16_t *to = keep + li * stride;
        for (int i = ACT_LN1; i <= ACT_RESIDUAL3; i++) {
            if (sizes[i] || (i == ACT_RESIDUAL3 && li + 1 < nb)) {
                mem_copy(to, from, a->act_sizes[i] * sizeof(uint16_t));
                to += a->act_sizes[i];
            }
            from += a->act_sizes[i];
        }
    }
    float *scratch = mem_alloc((BTC + wl) * sizeof(float), MEM_ACTS, m->dev);
    mem_copy(scratch, a->a.encoded, BTC * sizeof(float));  // block l0's input
    float *dout = mem_alloc(nb * BTC * sizeof(float), MEM_ACTS, m->dev);
    mem_copy(dout, a->da.residual3, nb * BTC * sizeof(float));  // fcproj's W reads it
    mem_free(a->acts), mem_free(a->acts_bf16), mem_free(a->dacts);
    mem_free(a->inputs), mem_free(a->targets), mem_free(a->host_losses);
    a->inputs = a->targets = NULL, a->host_losses = NULL;
    a->acts = scratch, a->acts_bf16 = keep, a->dacts = dout;
    a->layer_act_size = stride;
    point_acts(&a->a, scratch, sizes);
    a->da = (ActTensors){.residual3 = dout};
    a->w_only = 1;
}

// What the blocks' W read, moved out of a whole fp32 set (see gpt2.h). The forward tensors go
// into one new buffer (acts), laid out as the stacked tensors are, so layer_acts finds them;
// the gradients of the blocks' outputs into another (dacts); wsave is kept as it is.
void gpt2_acts_keep_for_w(GPT2Acts *a, const GPT2 *m) {
    LAB_CHECK(a->wsave && a->acts, "gpt2_acts_keep_for_w: needs a split activation set");
    if (a->w_only) return;
    if (a->dtype == GPT2_BF16) {
        keep_for_w_bf16(a, m);
        return;
    }
    GPT2BlockDims d = block_dims(m);
    const size_t nb = (size_t)(a->l1 - a->l0), BT = (size_t)a->B * a->T, BTC = BT * (size_t)d.C;
    const size_t BTA = BT * (size_t)d.ATT, BTF = BT * (size_t)d.FC;
    float *keep = mem_alloc(gpt2_acts_w_floats(m, a->B, a->T) * sizeof(float), MEM_ACTS, m->dev);
    ActTensors k = {0}, dk = {0};
    float *at = keep;
#define MOVE(name, n)                                        \
    k.name = at;                                             \
    mem_copy(at, a->a.name, (n) * sizeof(float));            \
    at += (n);
    MOVE(encoded, BTC)               // the blocks' inputs: block 0's, then the outputs of
    MOVE(residual3, (nb - 1) * BTC)  // blocks 0 .. nb-2
    MOVE(ln1, nb * BTC)
    MOVE(ln1_mean, nb * BT)
    MOVE(ln1_rstd, nb * BT)
    MOVE(atty, nb * BTA)
    MOVE(residual2, nb * BTC)
    MOVE(ln2, nb * BTC)
    MOVE(ln2_mean, nb * BT)
    MOVE(ln2_rstd, nb * BT)
    MOVE(fch_gelu, nb * BTF)
#undef MOVE
    dk.residual3 = at;  // the gradient of every block's output (fcproj's W reads it)
    mem_copy(at, a->da.residual3, nb * BTC * sizeof(float));
    mem_free(a->acts);
    mem_free(a->dacts);
    mem_free(a->inputs), mem_free(a->targets), mem_free(a->host_losses);
    a->inputs = a->targets = NULL, a->host_losses = NULL;
    a->acts = keep, a->dacts = NULL;
    a->a = k, a->da = dk;
    a->w_only = 1;
}

size_t gpt2_acts_w_floats(const GPT2 *m, int B, int T) {
    GPT2BlockDims d = block_dims(m);
    const size_t nb = (size_t)(m->l1 - m->l0), BT = (size_t)B * T;
    // per block: the inputs of its matmuls and LayerNorms (ln1, atty, ln2, fch_gelu, the block's
    // input, residual2), the LayerNorms' statistics, and the gradient of its output
    return nb * BT * ((size_t)d.C * 4 + d.ATT + d.FC + 4 + d.C);
}

void gpt2_set_recompute(GPT2 *m, GPT2Recompute r, int B, int T) {
    LAB_CHECK(r == GPT2_RECOMPUTE_NONE || (m->tp == 1 && !m->sp),
              "gpt2_set_recompute: recomputation runs on models of whole blocks (t = %d, sp %d)",
              m->tp, m->sp);
    mem_free(m->rc_scratch);
    m->rc_scratch = NULL;
    m->recompute = r;
    m->rc_B = B, m->rc_T = T;
    if (r != GPT2_RECOMPUTE_NONE)
        m->rc_scratch = mem_alloc(gpt2_recompute_scratch(&m->cfg, r, B, T) * sizeof(float), MEM_ACTS,
                                  m->dev);
}

void gpt2_alloc_acts(GPT2 *m, int B, int T) {
    if (B < 1) lab_fail("batch size B = %d: it must be at least 1", B);
    if (T < 1 || T > m->cfg.T)
        lab_fail("sequence length T = %d: it must be between 1 and the model's maximum T = %d", T,
                 m->cfg.T);
    if (m->act.acts) gpt2_acts_free(&m->act);
    gpt2_acts_alloc(&m->act, m, B, T);
}

void gpt2_free(GPT2 *m) {
    mem_free(m->rc_scratch);
    gpt2_acts_free(&m->act);
    mem_free(m->params);
    mem_free(m->grads);
    mem_free(m->params_bf16);
    mem_free(m->grads_bf16);
    mem_free(m->work);
    mem_free(m->work_grads);
    mem_free(m->tp_scratch), mem_free(m->tp_layer), mem_free(m->tp_block_in);
    free(m->plist);
    free(m->units);
    memset(m, 0, sizeof *m);
}

static void check_tokens(const int *tokens, size_t n, int V, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            lab_fail("%s token %d at position %zu is outside the vocabulary [0, %d)", what,
                     tokens[i], i, V);
}

static GPT2Acts *acts_of(GPT2 *m, GPT2Acts *a) { return a ? a : &m->act; }

void gpt2_acts_set_batch(const GPT2 *m, GPT2Acts *a, const int *inputs, const int *targets) {
    if (!a) a = (GPT2Acts *)&m->act;
    LAB_CHECK(a->acts, "gpt2_set_batch before gpt2_alloc_acts");
    size_t BT = (size_t)a->B * a->T;
    if (inputs) {
        check_tokens(inputs, BT, m->cfg.V, "input");
        if (a->borrows_batch) a->inputs = (int *)inputs;  // read in place until the next batch
        else mem_copy(a->inputs, inputs, BT * sizeof(int));
    }
    a->has_targets = targets != NULL;
    if (targets) {
        check_tokens(targets, BT, m->cfg.V, "target");
        if (a->borrows_batch) a->targets = (int *)targets;
        else mem_copy(a->targets, targets, BT * sizeof(int));
    }
}

void gpt2_set_batch(GPT2 *m, const int *inputs, const int *targets) {
    LAB_CHECK(inputs, "gpt2_set_batch: inputs is NULL");
    gpt2_acts_set_batch(m, &m->act, inputs, targets);
}

float *gpt2_acts_input(GPT2Acts *a) { return a->a.encoded; }
float *gpt2_acts_dinput(GPT2Acts *a) { return a->da.encoded; }
float *gpt2_acts_doutput(GPT2Acts *a) {
    if (a->slice) return a->da.encoded;  // a slice's backward runs in place on the stream's gradient
    size_t BTC = a->act_sizes[0];  // encoded: (B,T,C)
    return a->da.residual3 + (size_t)(a->l1 - a->l0 - 1) * BTC;
}

// ----------------------------------------------------------------------------------------------
// Views of one block's activations: layer li's slice (li = l - l0, local) of every per-layer
// tensor of an activation set (stacked, or block-major: layer_stride), with the widths of
// GPT2BlockDims.

// A block's views moved to the chunk that starts at row r (= sequence r/T); NULL stays NULL.
static float *rows_from(float *p, size_t r, size_t width) { return p ? p + r * width : NULL; }

// A recomputing set's block views of what it does not keep: the model's one layer of scratch,
// the same for every block (layer li's values are there only after its backward recomputed them).
static void rc_views(const GPT2Acts *s, const GPT2BlockDims *dm, GPT2LayerActs *x) {
    size_t BT = (size_t)s->B * s->T, c = (size_t)dm->C, A = (size_t)dm->ATT, F = (size_t)dm->FC;
    size_t att = (size_t)s->B * dm->NH * s->T * s->T;
    float *p = s->rc;
    if (s->recompute == GPT2_RECOMPUTE_SELECTIVE) {
        x->preatt = p, x->att = p + att;
        return;
    }
    // full: ActTensors order, one layer (gpt2_recompute_scratch)
    x->ln1 = p, p += BT * c;
    x->ln1_mean = p, p += BT;
    x->ln1_rstd = p, p += BT;
    x->qkv = p, p += BT * 3 * A;
    x->atty = p, p += BT * A;
    x->preatt = p, p += att;
    x->att = p, p += att;
    x->attproj = p, p += BT * c;
    x->residual2 = p, p += BT * c;
    x->ln2 = p, p += BT * c;
    x->ln2_mean = p, p += BT;
    x->ln2_rstd = p, p += BT;
    x->fch = p, p += BT * F;
    x->fch_gelu = p, p += BT * F;
    x->fcproj = p;
}

static GPT2LayerActs layer_acts(const GPT2Acts *s, const GPT2BlockDims *dm, int li) {
    const ActTensors *a = &s->a;
    size_t BT = (size_t)s->B * s->T, c = (size_t)dm->C, A = (size_t)dm->ATT, F = (size_t)dm->FC;
    size_t L = (size_t)li, att = (size_t)s->B * dm->NH * s->T * s->T;
    if (s->layer_stride) {  // block-major: every tensor of block li one stride further
        const size_t o = L * s->layer_stride;
        GPT2LayerActs x = {
            rows_from(a->ln1, o, 1), rows_from(a->ln1_mean, o, 1), rows_from(a->ln1_rstd, o, 1),
            rows_from(a->qkv, o, 1), rows_from(a->atty, o, 1), rows_from(a->preatt, o, 1),
            rows_from(a->att, o, 1), rows_from(a->attproj, o, 1), rows_from(a->residual2, o, 1),
            rows_from(a->ln2, o, 1), rows_from(a->ln2_mean, o, 1), rows_from(a->ln2_rstd, o, 1),
            rows_from(a->fch, o, 1), rows_from(a->fch_gelu, o, 1), rows_from(a->fcproj, o, 1),
            rows_from(a->residual3, o, 1),
        };
        return x;
    }
    // (rows_from: a tensor a W-only set does not keep stays NULL)
    GPT2LayerActs x0 = {
        rows_from(a->ln1, L * BT, c), rows_from(a->ln1_mean, L * BT, 1),
        rows_from(a->ln1_rstd, L * BT, 1),
        rows_from(a->qkv, L * BT, 3 * A),
        rows_from(a->atty, L * BT, A),
        rows_from(a->preatt, L, att), rows_from(a->att, L, att),
        rows_from(a->attproj, L * BT, c), rows_from(a->residual2, L * BT, c),
        rows_from(a->ln2, L * BT, c), rows_from(a->ln2_mean, L * BT, 1),
        rows_from(a->ln2_rstd, L * BT, 1),
        rows_from(a->fch, L * BT, F), rows_from(a->fch_gelu, L * BT, F),
        rows_from(a->fcproj, L * BT, c), rows_from(a->residual3, L * BT, c),
    };
    if (s->recompute) rc_views(s, dm, &x0);
    return x0;
}

// The gradient scratch of one block (gpt2_dact_sizes): the same buffers for every layer, except
// residual3, the gradient of block li's own output. attproj, fcproj are never materialized.
// With split (wsave != NULL), the gradients W reads (ln1, qkv, residual2, ln2, fch) are the
// block's own slice of wsave instead, so they survive until its W.
static GPT2LayerActs layer_dacts(const GPT2Acts *acts, const GPT2BlockDims *dm, int li, int split) {
    const ActTensors *da = &acts->da;
    size_t BT = (size_t)acts->B * acts->T, BTC = BT * (size_t)dm->C;
    GPT2LayerActs x = {
        da->ln1, NULL, NULL, da->qkv, da->atty, da->preatt, da->att, NULL, da->residual2,
        da->ln2, NULL, NULL, da->fch, da->fch_gelu, NULL, da->residual3 + (size_t)li * BTC,
    };
    if (split) {
        float *w = acts->wsave + (size_t)li * acts->wsave_per_block;
        x.ln1 = w;
        x.qkv = x.ln1 + BTC;
        x.residual2 = x.qkv + BT * 3 * (size_t)dm->ATT;
        x.ln2 = x.residual2 + BTC;
        x.fch = x.ln2 + BTC;
    }
    return x;
}

// Elements of the stream (rows, C): what enters and leaves a block.
static size_t stream_elems(const GPT2 *m, const GPT2Acts *a) { return (size_t)a->rows * (size_t)m->cfg.C; }

// The residual stream entering local block li: the set's input for li = 0, else block li-1's
// output (fp32 sets; for bf16 see gpt2_piece_input).
static float *block_input(const GPT2 *m, const GPT2Acts *a, int li) {
    const size_t stride = a->layer_stride ? a->layer_stride : stream_elems(m, a);
    return li == 0 ? a->a.encoded : a->a.residual3 + (size_t)(li - 1) * stride;
}

// The gradient of that stream (gpt2's own sets): da.encoded, or the gradient of block li-1's output.
static float *stream_grad(const GPT2Acts *a, size_t BTC, int li) {
    return li == 0 ? a->da.encoded : a->da.residual3 + (size_t)(li - 1) * BTC;
}

const float *gpt2_piece_input(const GPT2 *m, GPT2Acts *a, int l) {
    const size_t n = stream_elems(m, a);
    int li = l - a->l0;
    if (m->dtype == GPT2_FP32 || li == 0) return block_input(m, a, li);
    // residual3 is the last tensor of a stored layer
    const uint16_t *out = a->acts_bf16 + (size_t)li * a->layer_act_size - n;
    m->k->bf16_to_f32(a->block_in, out, n);
    return a->block_in;
}

void gpt2_acts_output(const GPT2 *m, GPT2Acts *a, float *out) {
    const size_t n = stream_elems(m, a);
    int nb = a->l1 - a->l0;
    if (m->dtype == GPT2_FP32) mem_copy(out, block_input(m, a, nb), n * sizeof(float));
    else m->k->bf16_to_f32(out, a->acts_bf16 + (size_t)nb * a->layer_act_size - n, n);
}

GPT2LayerActs gpt2_layer_acts(const GPT2 *m, const GPT2Acts *a, int l) {
    const GPT2BlockDims dm = block_dims(m);
    return layer_acts(a, &dm, m->dtype == GPT2_BF16 ? 0 : l - a->l0);
}

// bf16: where the fp32 layer starts, its first tensor: ln1 (under full recomputation the layer
// is the block's output alone)
static float *layer_start(const GPT2Acts *a) { return a->a.ln1 ? a->a.ln1 : a->a.residual3; }

void gpt2_layer_widen(const GPT2 *m, GPT2Acts *a, int l) {
    if (m->dtype != GPT2_BF16) return;
    size_t n = a->layer_act_size - (a->w_only ? stream_elems(m, a) : 0);
    m->k->bf16_to_f32(layer_start(a), a->acts_bf16 + (size_t)(l - a->l0) * a->layer_act_size, n);
}

void gpt2_layer_store(const GPT2 *m, GPT2Acts *a, int l) {
    if (m->dtype != GPT2_BF16) return;
    m->k->f32_to_bf16(a->acts_bf16 + (size_t)(l - a->l0) * a->layer_act_size, layer_start(a),
                      a->layer_act_size);
}

float gpt2_acts_mean_loss(GPT2Acts *a) {
    const int N = a->B * a->T;
    const float *losses = a->a.losses;
    if (a->host_losses) {  // (a set on the host may sum its losses in place)
        mem_copy(a->host_losses, losses, (size_t)N * sizeof(float));
        losses = a->host_losses;
    }
    double sum = 0.0;  // in position order: the same bits on every run
    for (int i = 0; i < N; i++) sum += losses[i];
    return (float)(sum / N);
}

static void check_block(const GPT2 *m, const GPT2Acts *a, int l, const char *fn) {
    LAB_CHECK(l >= m->l0 && l < m->l1, "%s: block %d, but the model holds blocks [%d, %d)", fn, l,
              m->l0, m->l1);
    LAB_CHECK(a->acts, "%s before gpt2_alloc_acts / gpt2_acts_alloc", fn);
    LAB_CHECK(a->l0 == m->l0 && a->l1 == m->l1, "%s: activation set of blocks [%d, %d) on a model "
              "of blocks [%d, %d)", fn, a->l0, a->l1, m->l0, m->l1);
}

// ----------------------------------------------------------------------------------------------
// The weights of one piece: one or two contiguous spans (the embedding: its unit; a block: its
// unit; the head: wte and its unit), each at any address, in the model's dtype. In fp32 they
// are read in place. In bf16 they are widened into m->work before the piece runs, its gradients
// are accumulated in fp32 in m->work_grads, and rounded once into the bf16 gradient spans when
// its backward is done (gpt2.h's GPT2Piece).

static size_t esize(const GPT2 *m) { return m->dtype == GPT2_BF16 ? sizeof(uint16_t) : sizeof(float); }

// m's own weights / gradients at element offset off (a span in place).
static const void *own_w(const GPT2 *m, size_t off) {
    const char *base = m->dtype == GPT2_BF16 ? (const char *)m->params_bf16 : (const char *)m->params;
    return base + off * esize(m);
}
static void *own_g(const GPT2 *m, size_t off) {
    char *base = m->dtype == GPT2_BF16 ? (char *)m->grads_bf16 : (char *)m->grads;
    LAB_CHECK(base, "a backward into the model's own gradients before gpt2_alloc_grads");
    return base + off * esize(m);
}

static void piece_add(GPT2Piece *pc, const void *w, void *g, size_t size) {
    LAB_CHECK(pc->n < 2, "a piece has at most 2 spans");
    pc->w[pc->n] = w;
    pc->g[pc->n] = g;
    pc->size[pc->n] = size;
    pc->n++;
}

// Pointers to the piece's fp32 weights, one per span.
void gpt2_piece_weights(GPT2 *m, const GPT2Piece *pc, float *w[2]) {
    size_t at = 0;
    for (size_t i = 0; i < pc->n && i < 2; i++) {
        if (m->dtype == GPT2_FP32) {
            w[i] = (float *)pc->w[i];  // read only: the kernels take const weights
            continue;
        }
        w[i] = m->work + at;
        m->k->bf16_to_f32(w[i], pc->w[i], pc->size[i]);
        at += pc->size[i];
    }
}

// Pointers to the piece's fp32 weight gradients. bf16 widens the gradient accumulated so far
// (the backward kernels add into it: += in fp32).
void gpt2_piece_grads(GPT2 *m, const GPT2Piece *pc, float *g[2]) {
    LAB_CHECK(m->dtype == GPT2_FP32 || m->work_grads, "a bf16 backward before gpt2_alloc_grads");
    size_t at = 0;
    for (size_t i = 0; i < pc->n && i < 2; i++) {
        if (m->dtype == GPT2_FP32) {
            g[i] = pc->g[i];
            continue;
        }
        g[i] = m->work_grads + at;
        m->k->bf16_to_f32(g[i], pc->g[i], pc->size[i]);
        at += pc->size[i];
    }
}

// After the piece's backward: bf16 rounds its fp32 gradients back into their spans.
void gpt2_piece_grads_done(GPT2 *m, const GPT2Piece *pc) {
    if (m->dtype == GPT2_FP32) return;
    size_t at = 0;
    for (size_t i = 0; i < pc->n && i < 2; i++) {
        m->k->f32_to_bf16(pc->g[i], m->work_grads + at, pc->size[i]);
        at += pc->size[i];
    }
}

size_t gpt2_wte_elems(const GPT2 *m) { return vocab_rows(&m->cfg, m->tp) * (size_t)m->cfg.C; }

void gpt2_piece_embed(GPT2Piece *pc, const GPT2 *m, const void *w, void *g, int need_grads) {
    LAB_CHECK(m->has_embed, "the embedding runs on the first stage only (this one holds blocks [%d, %d))",
              m->l0, m->l1);
    const GPT2Unit *u = &m->units[0];
    memset(pc, 0, sizeof *pc);
    piece_add(pc, w ? w : own_w(m, u->offset), need_grads ? (g ? g : own_g(m, u->offset)) : NULL,
              u->size);
}

void gpt2_piece_block(GPT2Piece *pc, const GPT2 *m, int l, const void *w, void *g, int need_w, int need_grads) {
    const GPT2Unit *u = gpt2_block_unit(m, l);
    memset(pc, 0, sizeof *pc);
    piece_add(pc, need_w ? (w ? w : own_w(m, u->offset)) : NULL,
              need_grads ? (g ? g : own_g(m, u->offset)) : NULL, u->size);
}

void gpt2_piece_head(GPT2Piece *pc, const GPT2 *m, const void *wte, const void *w, void *dwte, void *g,
                        int need_grads) {
    LAB_CHECK(m->has_head, "the head runs on the last stage only (this one holds blocks [%d, %d))",
              m->l0, m->l1);
    const GPT2Unit *u = &m->units[m->has_embed + (m->l1 - m->l0)];
    LAB_CHECK(u->kind == GPT2_UNIT_HEAD, "unit table: no head after the blocks");
    memset(pc, 0, sizeof *pc);
    piece_add(pc, wte ? wte : own_w(m, m->wte_offset),
              need_grads ? (dwte ? dwte : own_g(m, m->wte_offset)) : NULL, gpt2_wte_elems(m));
    piece_add(pc, w ? w : own_w(m, u->offset), need_grads ? (g ? g : own_g(m, u->offset)) : NULL,
              u->size);
}

// ----------------------------------------------------------------------------------------------
// Forward

void gpt2_embed_forward_w(GPT2 *m, GPT2Acts *acts, const void *embed_w) {
    GPT2Acts *a = acts_of(m, acts);
    GPT2Piece pc = {0};
    gpt2_piece_embed(&pc, m, embed_w, NULL, 0);
    float *w[2] = {0};  // the unit: wte (V,C) then wpe (T,C)
    gpt2_piece_weights(m, &pc, w);
    m->k->encoder_forward(a->a.encoded, a->inputs, w[0], w[0] + gpt2_wte_elems(m), a->B, a->T, m->cfg.C);
}

// A block works on its rows in chunks of a few whole sequences (attention mixes only the rows of
// one sequence; everything else works row by row). On a CPU a chunk's intermediates (its rows
// of ln1, qkv, fch, ...) then stay in the core's L2 cache from the op that writes them to the
// op that reads them, instead of going out to memory and back (the whole batch's are several
// MiB per op; a GEMM of these shapes runs ~30% slower on operands that are not in cache). A GPU
// wants the opposite, kernels as large as possible: one chunk of B sequences.
#define CPU_CHUNK_ROWS 256  // rows per chunk on a CPU: fch is 256 x 4C floats = 512 KiB at C=128


static int chunk_seqs(const GPT2 *m, const GPT2Acts *a) {
    if (m->dev != DEV_CPU) return a->B;
    int seqs = CPU_CHUNK_ROWS / a->T;
    return seqs < 1 ? 1 : seqs > a->B ? a->B : seqs;
}

static GPT2LayerActs layer_rows(GPT2LayerActs x, size_t r, const GPT2BlockDims *dm, int T) {
    size_t c = (size_t)dm->C, A = (size_t)dm->ATT, F = (size_t)dm->FC;
    size_t att = (size_t)dm->NH * T;  // a sequence's T rows own NH·T·T scores
    GPT2LayerActs y = {
        rows_from(x.ln1, r, c), rows_from(x.ln1_mean, r, 1), rows_from(x.ln1_rstd, r, 1),
        rows_from(x.qkv, r, 3 * A),
        rows_from(x.atty, r, A),
        rows_from(x.preatt, r, att), rows_from(x.att, r, att),
        rows_from(x.attproj, r, c), rows_from(x.residual2, r, c),
        rows_from(x.ln2, r, c), rows_from(x.ln2_mean, r, 1), rows_from(x.ln2_rstd, r, 1),
        rows_from(x.fch, r, F), rows_from(x.fch_gelu, r, F),
        rows_from(x.fcproj, r, c), rows_from(x.residual3, r, c),
    };
    return y;
}

// Forward of one block on Bc sequences (BT = Bc·T rows): residual is their input rows, a their
// rows of the block's activations.
static void block_forward_rows(const Kernels *k, const GPT2BlockWeights *wp, const GPT2LayerActs *ap,
                               const float *residual, int Bc, int T, const GPT2BlockDims *dm) {
    const GPT2BlockWeights w = *wp;
    const GPT2LayerActs a = *ap;
    int BT = Bc * T, C = dm->C, A = dm->ATT, F = dm->FC;
    // x = x + attn(ln1(x))
    k->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w.ln1w, w.ln1b, BT, C);
    k->matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, BT, C, 3 * A);
    k->attention_forward(a.atty, a.preatt, a.att, a.qkv, Bc, T, A, dm->NH);
    k->matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, BT, A, C);
    k->residual_forward(a.residual2, residual, a.attproj, (size_t)BT * C);
    // x = x + mlp(ln2(x))
    k->layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, BT, C);
    k->matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, BT, C, F);
    k->gelu_forward(a.fch_gelu, a.fch, (size_t)BT * F);
    k->matmul_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, BT, F, C);
    k->residual_forward(a.residual3, a.residual2, a.fcproj, (size_t)BT * C);
}

void gpt2_block_forward_w(GPT2 *m, GPT2Acts *acts, int l, const void *block_w) {
    GPT2Acts *a = acts_of(m, acts);
    check_block(m, a, l, "gpt2_block_forward");
    int B = a->B, T = a->T;
    GPT2BlockDims dm = block_dims(m);
    GPT2Piece pc = {0};
    gpt2_piece_block(&pc, m, l, block_w, NULL, 1, 0);
    float *wv[2] = {0};
    gpt2_piece_weights(m, &pc, wv);
    GPT2BlockWeights w = gpt2_block_weights(&dm, wv[0]);
    GPT2LayerActs la = gpt2_layer_acts(m, a, l);
    const float *residual = gpt2_piece_input(m, a, l);  // (B,T,C)
    int step = chunk_seqs(m, a);
    for (int b0 = 0; b0 < B; b0 += step) {
        int Bc = B - b0 < step ? B - b0 : step;
        size_t r = (size_t)b0 * T;  // first row of the chunk
        GPT2LayerActs ac = layer_rows(la, r, &dm, T);
        block_forward_rows(m->k, &w, &ac, residual + r * dm.C, Bc, T, &dm);
    }
    gpt2_layer_store(m, a, l);  // bf16: the layer rounded to nearest even (backward widens it)
}

float gpt2_head_forward_w(GPT2 *m, GPT2Acts *acts, const void *wte, const void *head_w) {
    GPT2Acts *a = acts_of(m, acts);
    const Kernels *k = m->k;
    int BT = a->B * a->T, C = m->cfg.C, V = m->cfg.V;
    GPT2Piece pc = {0};
    gpt2_piece_head(&pc, m, wte, head_w, NULL, NULL, 0);
    const float *residual = gpt2_piece_input(m, a, m->l1);  // last block's output
    float *w[2] = {0};  // wte; the head unit: lnfw, lnfb
    gpt2_piece_weights(m, &pc, w);
    k->layernorm_forward(a->a.lnf, a->a.lnf_mean, a->a.lnf_rstd, residual, w[1], w[1] + C, BT, C);
    // logits (B,T,V) = lnf (B,T,C) · wte (V,C)ᵀ: the output layer is the embedding, transposed
    k->matmul_forward(a->a.logits, a->a.lnf, w[0], NULL, BT, C, V);
    k->softmax_forward(a->a.probs, a->a.logits, BT, V);
    if (!a->has_targets) return -1.0f;
    k->crossentropy_forward(a->a.losses, a->a.probs, a->targets, BT, V);
    return gpt2_acts_mean_loss(a);
}

float gpt2_forward_acts(GPT2 *m, GPT2Acts *acts, const int *inputs, const int *targets) {
    GPT2Acts *a = acts_of(m, acts);
    if (inputs || targets) gpt2_acts_set_batch(m, a, inputs, targets);  // none: the batch already set
    if (m->has_embed) gpt2_embed_forward_w(m, a, NULL);
    for (int l = m->l0; l < m->l1; l++) gpt2_block_forward_w(m, a, l, NULL);
    return m->has_head ? gpt2_head_forward_w(m, a, NULL, NULL) : -1.0f;
}

void gpt2_embed_forward(GPT2 *m) { gpt2_embed_forward_w(m, NULL, NULL); }
void gpt2_block_forward(GPT2 *m, int l) { gpt2_block_forward_w(m, NULL, l, NULL); }
float gpt2_head_forward(GPT2 *m) { return gpt2_head_forward_w(m, NULL, NULL, NULL); }

float gpt2_forward(GPT2 *m, const int *inputs, const int *targets) {
    if (inputs) gpt2_set_batch(m, inputs, targets);  // NULL: use the batch already set
    return gpt2_forward_acts(m, NULL, NULL, NULL);
}

// ----------------------------------------------------------------------------------------------
// Backward. Parameter gradients accumulate (+=). Activation gradients need no zeroing: every
// kernel overwrites the input gradients it computes (kernels.h). A block reads the gradient of
// its output (da.residual3 of that block) and never writes it, so a pipeline stage can write
// the gradient it receives there (gpt2_acts_doutput) before the backward of its last block; it
// writes the gradient of its input (da.residual3 of block l-1, or da.encoded for block l0).

void gpt2_zero_grad(GPT2 *m) {
    LAB_CHECK(m->grads || m->grads_bf16, "gpt2_zero_grad before gpt2_alloc_grads");
    if (m->dtype == GPT2_BF16) mem_zero(m->grads_bf16, m->num_params * sizeof(uint16_t));
    else mem_zero(m->grads, m->num_params * sizeof(float));
}

void gpt2_head_backward_w(GPT2 *m, GPT2Acts *acts, float dloss, const void *wte,
                          const void *head_w, void *dwte, void *dhead_w) {
    GPT2Acts *a = acts_of(m, acts);
    const Kernels *k = m->k;
    int BT = a->B * a->T, C = m->cfg.C, V = m->cfg.V;
    LAB_CHECK(a->has_targets, "gpt2_head_backward: the batch has no targets (no loss to differentiate)");
    GPT2Piece pc = {0};
    gpt2_piece_head(&pc, m, wte, head_w, dwte, dhead_w, 1);
    const float *residual = gpt2_piece_input(m, a, m->l1);
    float *dresidual = stream_grad(a, (size_t)BT * C, m->l1 - m->l0);
    float *w[2] = {0}, *dw[2] = {0};  // wte; lnfw, lnfb
    gpt2_piece_weights(m, &pc, w);
    gpt2_piece_grads(m, &pc, dw);
    k->crossentropy_softmax_backward(a->da.logits, a->a.probs, a->targets, dloss, BT, V);
    k->matmul_backward(a->da.lnf, dw[0], NULL, a->da.logits, a->a.lnf, w[0], BT, C, V);
    k->layernorm_backward(dresidual, dw[1], dw[1] + C, a->da.lnf, NULL, residual, w[1],
                          a->a.lnf_mean, a->a.lnf_rstd, BT, C);
    gpt2_piece_grads_done(m, &pc);
}

// What a pass of a block's backward computes: the input gradient (B), the weight gradients (W),
// or both (the two interleaved op by op, as one backward).
enum { BACK_INPUT = 1, BACK_WEIGHTS = 2, BACK_BOTH = 3 };

// Backward of one block on Bc sequences, the chunk's rows of everything (see
// block_forward_rows). Reads d.residual3 (the gradient of the block's output). BACK_INPUT
// writes dresidual (that of its input) and the intermediate gradients; BACK_WEIGHTS adds into
// the weight gradients dw from the intermediate gradients already there. Each kernel call of
// BACK_BOTH is made by one of the two passes with the same operands, so B then W == BOTH.
static void block_backward_rows(const Kernels *k, const GPT2BlockWeights *wp,
                                const GPT2BlockWeights *dwp, const GPT2LayerActs *ap,
                                const GPT2LayerActs *dp, const float *residual, float *dresidual,
                                int Bc, int T, const GPT2BlockDims *dm, int pass) {
    const GPT2BlockWeights w = *wp, dw = *dwp;
    const GPT2LayerActs a = *ap, d = *dp;
    int BT = Bc * T, C = dm->C, A = dm->ATT, F = dm->FC;
    int in = pass & BACK_INPUT, wt = pass & BACK_WEIGHTS;
#define IN(x) (in ? (x) : NULL)
#define WT(x) (wt ? (x) : NULL)
    // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))). A sum passes its gradient
    // unchanged to both terms, so the fcproj backward reads d.residual3 directly (d.fcproj is
    // not materialized), and d.residual2 = d.residual3 (the skip path) + ln2's backward.
    k->matmul_backward(IN(d.fch_gelu), WT(dw.fcprojw), WT(dw.fcprojb), d.residual3, a.fch_gelu,
                       w.fcprojw, BT, F, C);
    if (in) k->gelu_backward(d.fch, a.fch, d.fch_gelu, (size_t)BT * F);
    k->matmul_backward(IN(d.ln2), WT(dw.fcw), WT(dw.fcb), d.fch, a.ln2, w.fcw, BT, C, F);
    k->layernorm_backward(IN(d.residual2), WT(dw.ln2w), WT(dw.ln2b), d.ln2, d.residual3,
                          a.residual2, w.ln2w, a.ln2_mean, a.ln2_rstd, BT, C);

    // Attention: residual2 = residual + attproj(attention(qkv(ln1(residual)))); same trick.
    k->matmul_backward(IN(d.atty), WT(dw.attprojw), WT(dw.attprojb), d.residual2, a.atty,
                       w.attprojw, BT, A, C);
    if (in) k->attention_backward(d.qkv, d.preatt, d.att, d.atty, a.qkv, a.att, Bc, T, A, dm->NH);
    k->matmul_backward(IN(d.ln1), WT(dw.qkvw), WT(dw.qkvb), d.qkv, a.ln1, w.qkvw, BT, C, 3 * A);
    k->layernorm_backward(IN(dresidual), WT(dw.ln1w), WT(dw.ln1b), d.ln1, d.residual2, residual,
                          w.ln1w, a.ln1_mean, a.ln1_rstd, BT, C);
#undef IN
#undef WT
}

// What the forward of a recomputing set did not keep, again, into the model's scratch, chunk by
// chunk as the forward ran. Full: the block's forward from its kept input. Selective: the scores
// and softmax from qkv (atty rewritten with its own bits); bf16 keeps qkv rounded, and the
// forward's softmax read the unrounded one, so bf16 first recomputes ln1 and qkv from the
// block's input (into the fp32 layer, which gpt2_layer_widen then overwrites with the kept,
// rounded, values).
static void recompute_block(GPT2 *m, GPT2Acts *a, const GPT2LayerActs *la, const GPT2BlockWeights *w,
                            const float *residual, int pass, const char *fn) {
    LAB_CHECK(pass == BACK_BOTH, "%s: a recomputing set runs the whole backward", fn);
    const int B = a->B, T = a->T, step = chunk_seqs(m, a);
    const GPT2BlockDims dm = block_dims(m);
    const Kernels *k = m->k;
    double t0 = lab_now();
    for (int b0 = 0; b0 < B; b0 += step) {
        int Bc = B - b0 < step ? B - b0 : step;
        size_t r = (size_t)b0 * T;
        GPT2LayerActs ac = layer_rows(*la, r, &dm, T);
        const float *in = residual + r * dm.C;
        if (a->recompute == GPT2_RECOMPUTE_FULL) {  // the block's forward, from its kept input
            block_forward_rows(k, w, &ac, in, Bc, T, &dm);
            continue;
        }
        if (m->dtype == GPT2_BF16) {
            k->layernorm_forward(ac.ln1, ac.ln1_mean, ac.ln1_rstd, in, w->ln1w, w->ln1b, Bc * T, dm.C);
            k->matmul_forward(ac.qkv, ac.ln1, w->qkvw, w->qkvb, Bc * T, dm.C, 3 * dm.ATT);
        }
        k->attention_forward(ac.atty, ac.preatt, ac.att, ac.qkv, Bc, T, dm.ATT, dm.NH);
    }
    m->rc_flops += gpt2_recompute_flops_dtype(&m->cfg, a->recompute, m->dtype, B, T);
    m->rc_seconds += lab_now() - t0;
}

void gpt2_round_through_bf16(const GPT2 *m, float *x, size_t n, uint16_t *tmp, size_t cap) {
    for (size_t i = 0; i < n; i += cap) {
        const size_t c = n - i < cap ? n - i : cap;
        m->k->f32_to_bf16(tmp, x + i, c);
        m->k->bf16_to_f32(x + i, tmp, c);
    }
}

// bf16: the forward stored every tensor rounded, and the backward of a set that keeps them reads
// them widened; the recomputed ones (the model's scratch, fp32) are rounded the same way, through
// the set's gradient scratch of one block (da.ln1 .. da.fch_gelu, free until this backward writes
// it), so the backward reads the very values it reads without recomputation.
static void round_recomputed(const GPT2 *m, GPT2Acts *a) {
    if (m->dtype != GPT2_BF16) return;
    gpt2_round_through_bf16(m, a->rc, gpt2_recompute_scratch(&m->cfg, a->recompute, a->B, a->T),
                            (uint16_t *)a->da.ln1, 2 * (size_t)(a->da.residual3 - a->da.ln1));
}

// One backward pass over block l's rows, chunk by chunk (the same chunks as the forward: the
// weight gradients get their chunks' contributions in the same order in every pass).
static void block_backward(GPT2 *m, GPT2Acts *a, int l, const void *block_w, void *dblock_w,
                           int pass, const char *fn) {
    check_block(m, a, l, fn);
    int split = pass != BACK_BOTH;
    LAB_CHECK(!split || a->wsave, "%s: the split backward needs gpt2_acts_alloc_split", fn);
    LAB_CHECK(!a->w_only || pass == BACK_WEIGHTS, "%s: the set keeps only what W reads "
              "(gpt2_acts_keep_for_w)", fn);
    int B = a->B, T = a->T;
    GPT2BlockDims dm = block_dims(m);
    size_t BTC = (size_t)B * T * dm.C;
    GPT2Piece pc = {0};
    gpt2_piece_block(&pc, m, l, block_w, dblock_w, pass & BACK_INPUT, pass & BACK_WEIGHTS);
    GPT2BlockWeights w = {0}, dw = {0};  // W needs no weights, B no weight gradients
    float *wv[2] = {0}, *dwv[2] = {0};
    if (pass & BACK_INPUT) {
        gpt2_piece_weights(m, &pc, wv);
        w = gpt2_block_weights(&dm, wv[0]);
    }
    if (pass & BACK_WEIGHTS) {
        gpt2_piece_grads(m, &pc, dwv);
        dw = gpt2_block_weights(&dm, dwv[0]);
    }
    GPT2LayerActs la = gpt2_layer_acts(m, a, l);
    GPT2LayerActs d = layer_dacts(a, &dm, l - a->l0, split);
    const float *residual = gpt2_piece_input(m, a, l);
    float *dresidual = stream_grad(a, BTC, l - a->l0);
    int step = chunk_seqs(m, a);
    if (a->recompute) recompute_block(m, a, &la, &w, residual, pass, fn);
    gpt2_layer_widen(m, a, l);  // bf16: the stored layer into the fp32 scratch
    if (a->recompute) round_recomputed(m, a);  // bf16: as the forward's store rounded them
    for (int b0 = 0; b0 < B; b0 += step) {
        int Bc = B - b0 < step ? B - b0 : step;
        size_t r = (size_t)b0 * T;
        GPT2LayerActs ac = layer_rows(la, r, &dm, T), dc = layer_rows(d, r, &dm, T);
        block_backward_rows(m->k, &w, &dw, &ac, &dc, residual + r * dm.C, dresidual + r * dm.C,
                            Bc, T, &dm, pass);
    }
    if (pass & BACK_WEIGHTS) gpt2_piece_grads_done(m, &pc);
}

void gpt2_block_backward_w(GPT2 *m, GPT2Acts *acts, int l, const void *block_w, void *dblock_w) {
    block_backward(m, acts_of(m, acts), l, block_w, dblock_w, BACK_BOTH, "gpt2_block_backward");
}

void gpt2_block_backward_input(GPT2 *m, GPT2Acts *acts, int l, const void *block_w) {
    block_backward(m, acts_of(m, acts), l, block_w, NULL, BACK_INPUT, "gpt2_block_backward_input");
}

void gpt2_block_backward_weights(GPT2 *m, GPT2Acts *acts, int l, void *dblock_w) {
    block_backward(m, acts_of(m, acts), l, NULL, dblock_w, BACK_WEIGHTS,
                   "gpt2_block_backward_weights");
}

void gpt2_embed_backward_w(GPT2 *m, GPT2Acts *acts, void *dembed_w) {
    GPT2Acts *a = acts_of(m, acts);
    GPT2Piece pc = {0};
    gpt2_piece_embed(&pc, m, NULL, dembed_w, 1);
    float *dw[2] = {0};  // the unit: wte then wpe
    gpt2_piece_grads(m, &pc, dw);
    m->k->encoder_backward(dw[0], dw[0] + gpt2_wte_elems(m), a->da.encoded, a->inputs, a->B, a->T,
                           m->cfg.C);
    gpt2_piece_grads_done(m, &pc);
}

void gpt2_backward_acts(GPT2 *m, GPT2Acts *acts, float dloss) {
    GPT2Acts *a = acts_of(m, acts);
    if (m->has_head) gpt2_head_backward_w(m, a, dloss, NULL, NULL, NULL, NULL);
    for (int l = m->l1 - 1; l >= m->l0; l--) gpt2_block_backward_w(m, a, l, NULL, NULL);
    if (m->has_embed) gpt2_embed_backward_w(m, a, NULL);
}

void gpt2_head_backward(GPT2 *m, float dloss) { gpt2_head_backward_w(m, NULL, dloss, NULL, NULL, NULL, NULL); }
void gpt2_block_backward(GPT2 *m, int l) { gpt2_block_backward_w(m, NULL, l, NULL, NULL); }
void gpt2_embed_backward(GPT2 *m) { gpt2_embed_backward_w(m, NULL, NULL); }
void gpt2_backward(GPT2 *m, float dloss) { gpt2_backward_acts(m, NULL, dloss); }

// ----------------------------------------------------------------------------------------------
// Model FLOPs of one training step, the convention of MFU (PaLM paper, appendix B):
//   6 FLOPs per parameter per token for the matmuls (2 forward, 4 backward), counting every
//   parameter but wpe (a table lookup, no matmul); wte counts once, as the output layer.
//   12·L·C·T per token for attention: QKᵀ and att·V, 2·T·C FLOPs each per token and layer
//   forward, ×3 with the backward; the full T×T square, not halved for causality.
double gpt2_flops_per_step(const GPT2Config *cfg, int B, int T) {
    double N = (double)gpt2_param_count(cfg) - (double)cfg->T * cfg->C;
    double per_token = 6.0 * N + 12.0 * cfg->L * (double)cfg->C * T;
    return per_token * B * T;
}
