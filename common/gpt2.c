// gpt2.c: GPT-2 as DESIGN.md specifies it: one flat parameter buffer with named views, the
// activations of a (B,T) batch, and forward/backward in pieces (embedding, block l, head).
//
// All tensor work goes through the kernel table m->k, so the same code runs on CPU and GPU;
// the buffers live on m->dev and are only touched here through mem_copy/mem_zero.
#include "gpt2.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

// ----------------------------------------------------------------------------------------------
// Config and parameter layout

static const char *tensor_names[GPT2_NUM_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

// Tensor indices, in llm.c's order.
enum {
    T_WTE, T_WPE, T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_ATTPROJW, T_ATTPROJB,
    T_LN2W, T_LN2B, T_FCW, T_FCB, T_FCPROJW, T_FCPROJB, T_LNFW, T_LNFB
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
    sizes[T_WTE] = V * C;
    sizes[T_WPE] = T * C;
    sizes[T_LN1W] = L * C;
    sizes[T_LN1B] = L * C;
    sizes[T_QKVW] = L * (3 * C) * C;
    sizes[T_QKVB] = L * (3 * C);
    sizes[T_ATTPROJW] = L * C * C;
    sizes[T_ATTPROJB] = L * C;
    sizes[T_LN2W] = L * C;
    sizes[T_LN2B] = L * C;
    sizes[T_FCW] = L * (4 * C) * C;
    sizes[T_FCB] = L * (4 * C);
    sizes[T_FCPROJW] = L * C * (4 * C);
    sizes[T_FCPROJB] = L * C;
    sizes[T_LNFW] = C;
    sizes[T_LNFB] = C;
}

size_t gpt2_param_count(const GPT2Config *cfg) {
    size_t sizes[GPT2_NUM_TENSORS], n = 0;
    gpt2_param_sizes(cfg, sizes);
    for (int i = 0; i < GPT2_NUM_TENSORS; i++) n += sizes[i];
    return n;
}

// 2-D weight matrices: the ones AdamW decays.
static int is_matrix(int tensor) {
    return tensor == T_WTE || tensor == T_WPE || tensor == T_QKVW || tensor == T_ATTPROJW ||
           tensor == T_FCW || tensor == T_FCPROJW;
}

int gpt2_params(const GPT2Config *cfg, GPT2Param *out) {
    size_t sizes[GPT2_NUM_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    int count = 0;
    size_t offset = 0;
    for (int t = 0; t < GPT2_NUM_TENSORS; t++) {
        int per_layer = !(t == T_WTE || t == T_WPE || t == T_LNFW || t == T_LNFB);
        int nlayers = per_layer ? cfg->L : 1;
        size_t size = sizes[t] / (size_t)nlayers;
        for (int l = 0; l < nlayers; l++) {
            if (out) {
                GPT2Param *p = &out[count];
                if (per_layer) snprintf(p->name, sizeof p->name, "h.%d.%s", l, tensor_names[t]);
                else snprintf(p->name, sizeof p->name, "%s", tensor_names[t]);
                p->tensor = t;
                p->layer = per_layer ? l : -1;
                p->offset = offset;
                p->size = size;
                p->decay = is_matrix(t);
            }
            offset += size;
            count++;
        }
    }
    return count;
}

// Indices of the first and last per-layer tensor in ActTensors order (encoded is 0).
enum { ACT_LN1 = 1, ACT_RESIDUAL3 = 16 };

void gpt2_act_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]) {
    size_t L = (size_t)cfg->L, C = (size_t)cfg->C, NH = (size_t)cfg->NH, V = (size_t)cfg->V;
    size_t BT = (size_t)B * (size_t)T;
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
    sizes[i++] = BT * C;                          // lnf
    sizes[i++] = BT;                              // lnf_mean
    sizes[i++] = BT;                              // lnf_rstd
    sizes[i++] = BT * V;                          // logits
    sizes[i++] = BT * V;                          // probs
    sizes[i++] = BT;                              // losses
    LAB_CHECK(i == GPT2_NUM_ACTS, "gpt2_act_sizes: %zu sizes for %d tensors", i, GPT2_NUM_ACTS);
}

void gpt2_dact_sizes(const GPT2Config *cfg, int B, int T, size_t sizes[GPT2_NUM_ACTS]) {
    size_t L = (size_t)cfg->L, C = (size_t)cfg->C, NH = (size_t)cfg->NH, V = (size_t)cfg->V;
    size_t BT = (size_t)B * (size_t)T;
    size_t i = 0;
    sizes[i++] = BT * C;                          // encoded: the gradient of block 0's input
    sizes[i++] = BT * C;                          // ln1        \.
    sizes[i++] = 0;                               // ln1_mean    |
    sizes[i++] = 0;                               // ln1_rstd    |
    sizes[i++] = BT * 3 * C;                      // qkv         |
    sizes[i++] = BT * C;                          // atty        |
    sizes[i++] = (size_t)B * NH * T * T;          // preatt      |
    sizes[i++] = (size_t)B * NH * T * T;          // att         |  one layer of scratch,
    sizes[i++] = 0;                               // attproj     |  shared by all L blocks
    sizes[i++] = BT * C;                          // residual2   |
    sizes[i++] = BT * C;                          // ln2         |
    sizes[i++] = 0;                               // ln2_mean    |
    sizes[i++] = 0;                               // ln2_rstd    |
    sizes[i++] = BT * 4 * C;                      // fch         |
    sizes[i++] = BT * 4 * C;                      // fch_gelu    |
    sizes[i++] = 0;                               // fcproj     /
    sizes[i++] = L * BT * C;                      // residual3: every block's output, L layers
    sizes[i++] = BT * C;                          // lnf
    sizes[i++] = 0;                               // lnf_mean
    sizes[i++] = 0;                               // lnf_rstd
    sizes[i++] = BT * V;                          // logits
    sizes[i++] = 0;                               // probs
    sizes[i++] = 0;                               // losses
    LAB_CHECK(i == GPT2_NUM_ACTS, "gpt2_dact_sizes: %zu sizes for %d tensors", i, GPT2_NUM_ACTS);
}

// Point the named views into a flat buffer, in struct order (the same order as the sizes);
// a tensor of size 0 gets NULL.
static void point_params(ParamTensors *p, float *base, const size_t sizes[GPT2_NUM_TENSORS]) {
    float **views[GPT2_NUM_TENSORS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb, &p->lnfw, &p->lnfb,
    };
    for (int i = 0; i < GPT2_NUM_TENSORS; i++) {
        *views[i] = base;
        base += sizes[i];
    }
}

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
// Initialization: a counter-based random generator, so that element i of the flat buffer is a
// pure function of (seed, i) and any slice can be drawn without drawing what comes before it.

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

void gpt2_init_slice(const GPT2Config *cfg, uint64_t seed, size_t begin, size_t end, float *out_host) {
    size_t sizes[GPT2_NUM_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    size_t total = gpt2_param_count(cfg);
    LAB_CHECK(begin <= end && end <= total, "gpt2_init_slice: range [%zu, %zu) outside the %zu parameters",
              begin, end, total);
    // residual projections add into the residual stream once per layer: scale their init so the
    // stream's variance does not grow with depth (GPT-2 paper)
    double residual_scale = 1.0 / sqrt(2.0 * cfg->L);
    size_t offset = 0;
    for (int t = 0; t < GPT2_NUM_TENSORS; t++) {
        size_t lo = offset > begin ? offset : begin;
        size_t hi = offset + sizes[t] < end ? offset + sizes[t] : end;
        offset += sizes[t];
        if (lo >= hi) continue;
        float *out = out_host + (lo - begin);
        size_t n = hi - lo;
        if (is_matrix(t)) {
            double std = 0.02 * (t == T_ATTPROJW || t == T_FCPROJW ? residual_scale : 1.0);
            for (size_t i = 0; i < n; i++) out[i] = (float)(std * normal_at(seed, lo + i));
        } else {
            float value = (t == T_LN1W || t == T_LN2W || t == T_LNFW) ? 1.0f : 0.0f;  // LN weight 1, biases 0
            for (size_t i = 0; i < n; i++) out[i] = value;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Lifecycle

void gpt2_build(GPT2 *m, GPT2Config cfg, Device dev) { gpt2_build_dtype(m, cfg, dev, GPT2_FP32); }

// The largest piece, in floats: the embedding (wte, wpe), one block, or the head (wte, lnf).
static size_t largest_piece(const GPT2Config *cfg) {
    size_t V = (size_t)cfg->V, T = (size_t)cfg->T, C = (size_t)cfg->C;
    size_t embed = V * C + T * C, head = V * C + 2 * C, block = 12 * C * C + 13 * C;
    size_t most = embed > head ? embed : head;
    return most > block ? most : block;
}

void gpt2_build_dtype(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype) {
    gpt2_config_check(&cfg);
    memset(m, 0, sizeof *m);
    m->cfg = cfg;
    m->dev = dev;
    // bf16 models may multiply on tensor cores in TF32 (kernels.h): it keeps more bits than bf16
    m->k = dtype == GPT2_BF16 ? kernels_get_tf32(dev) : kernels_get(dev);
    m->dtype = dtype;
    gpt2_param_sizes(&cfg, m->param_sizes);
    m->num_params = gpt2_param_count(&cfg);
    if (dtype == GPT2_BF16) {
        m->params_bf16 = mem_alloc(m->num_params * sizeof(uint16_t), MEM_PARAMS, dev);
        m->work_size = largest_piece(&cfg);
        m->work = mem_alloc(m->work_size * sizeof(float), MEM_OTHER, dev);
        return;
    }
    m->params = mem_alloc(m->num_params * sizeof(float), MEM_PARAMS, dev);
    point_params(&m->p, m->params, m->param_sizes);
}

void gpt2_init_params(GPT2 *m, uint64_t seed) {
    if (m->dtype == GPT2_BF16) {  // draw in fp32, store rounded to bf16
        float *host = mem_alloc(m->num_params * sizeof(float), MEM_OTHER, DEV_CPU);
        uint16_t *host16 = mem_alloc(m->num_params * sizeof(uint16_t), MEM_OTHER, DEV_CPU);
        gpt2_init_slice(&m->cfg, seed, 0, m->num_params, host);
        kernels_cpu.f32_to_bf16(host16, host, m->num_params);
        mem_copy(m->params_bf16, host16, m->num_params * sizeof(uint16_t));
        mem_free(host);
        mem_free(host16);
        return;
    }
    if (m->dev == DEV_CPU) {
        gpt2_init_slice(&m->cfg, seed, 0, m->num_params, m->params);
        return;
    }
    float *host = mem_alloc(m->num_params * sizeof(float), MEM_OTHER, DEV_CPU);
    gpt2_init_slice(&m->cfg, seed, 0, m->num_params, host);
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
    point_params(&m->g, m->grads, m->param_sizes);
}

static void free_acts(GPT2 *m) {
    mem_free(m->acts);
    mem_free(m->acts_bf16);
    mem_free(m->block_in);
    mem_free(m->dacts);
    mem_free(m->inputs);
    mem_free(m->targets);
    mem_free(m->host_losses);
    m->acts = m->dacts = m->host_losses = m->block_in = NULL;
    m->acts_bf16 = NULL;
    m->inputs = m->targets = NULL;
    memset(&m->a, 0, sizeof m->a);
    memset(&m->da, 0, sizeof m->da);
}

// The activations: fp32, all of them in acts. bf16: the per-layer ones (ln1 .. residual3 of
// every block) stored rounded in acts_bf16, and acts in fp32 with ONE layer of them (where a
// block computes, and where its backward widens its stored layer) plus the embedding's and the
// head's. The activation gradients (dacts): da.X is the gradient of a.X, laid out by
// gpt2_dact_sizes, fp32 in both precisions.
void gpt2_alloc_acts(GPT2 *m, int B, int T) {
    if (B < 1) lab_fail("batch size B = %d: it must be at least 1", B);
    if (T < 1 || T > m->cfg.T)
        lab_fail("sequence length T = %d: it must be between 1 and the model's maximum T = %d", T,
                 m->cfg.T);
    if (m->acts) free_acts(m);
    m->B = B;
    m->T = T;
    GPT2Config one_layer = m->cfg;
    one_layer.L = 1;
    gpt2_act_sizes(m->dtype == GPT2_BF16 ? &one_layer : &m->cfg, B, T, m->act_sizes);
    gpt2_dact_sizes(&m->cfg, B, T, m->dact_sizes);
    m->num_acts = m->num_dacts = 0;
    for (int i = 0; i < GPT2_NUM_ACTS; i++) {
        m->num_acts += m->act_sizes[i];
        m->num_dacts += m->dact_sizes[i];
    }
    m->acts = mem_alloc(m->num_acts * sizeof(float), MEM_ACTS, m->dev);
    m->dacts = mem_alloc(m->num_dacts * sizeof(float), MEM_ACTS, m->dev);
    point_acts(&m->a, m->acts, m->act_sizes);
    point_acts(&m->da, m->dacts, m->dact_sizes);
    size_t BT = (size_t)B * T;
    if (m->dtype == GPT2_BF16) {
        // one layer's activations: the 16 tensors from ln1 to residual3, contiguous in acts
        m->layer_act_size = 0;
        for (int i = ACT_LN1; i <= ACT_RESIDUAL3; i++) m->layer_act_size += m->act_sizes[i];
        m->acts_bf16 = mem_alloc((size_t)m->cfg.L * m->layer_act_size * sizeof(uint16_t),
                                 MEM_ACTS, m->dev);
        m->block_in = mem_alloc(BT * (size_t)m->cfg.C * sizeof(float), MEM_ACTS, m->dev);
    }
    m->inputs = mem_alloc(BT * sizeof(int), MEM_OTHER, m->dev);
    m->targets = mem_alloc(BT * sizeof(int), MEM_OTHER, m->dev);
    m->host_losses = mem_alloc(BT * sizeof(float), MEM_OTHER, DEV_CPU);
    m->has_targets = 0;
}

void gpt2_free(GPT2 *m) {
    free_acts(m);
    mem_free(m->params);
    mem_free(m->grads);
    mem_free(m->params_bf16);
    mem_free(m->grads_bf16);
    mem_free(m->work);
    mem_free(m->work_grads);
    memset(m, 0, sizeof *m);
}

static void check_tokens(const int *tokens, size_t n, int V, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            lab_fail("%s token %d at position %zu is outside the vocabulary [0, %d)", what,
                     tokens[i], i, V);
}

void gpt2_set_batch(GPT2 *m, const int *inputs, const int *targets) {
    LAB_CHECK(m->acts, "gpt2_set_batch before gpt2_alloc_acts");
    size_t BT = (size_t)m->B * m->T;
    check_tokens(inputs, BT, m->cfg.V, "input");
    mem_copy(m->inputs, inputs, BT * sizeof(int));
    m->has_targets = targets != NULL;
    if (targets) {
        check_tokens(targets, BT, m->cfg.V, "target");
        mem_copy(m->targets, targets, BT * sizeof(int));
    }
}

// ----------------------------------------------------------------------------------------------
// Views of one block: layer l's slice of every stacked tensor.

typedef struct LayerParams {
    float *ln1w, *ln1b;          // (C)
    float *qkvw, *qkvb;          // (3C, C), (3C)
    float *attprojw, *attprojb;  // (C, C), (C)
    float *ln2w, *ln2b;          // (C)
    float *fcw, *fcb;            // (4C, C), (4C)
    float *fcprojw, *fcprojb;    // (C, 4C), (C)
} LayerParams;


typedef struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C), (B,T), (B,T)
    float *qkv;                        // (B,T,3C)
    float *atty;                       // (B,T,C)
    float *preatt, *att;               // (B,NH,T,T)
    float *attproj, *residual2;        // (B,T,C)
    float *ln2, *ln2_mean, *ln2_rstd;  // (B,T,C), (B,T), (B,T)
    float *fch, *fch_gelu;             // (B,T,4C)
    float *fcproj, *residual3;         // (B,T,C)
} LayerActs;

static LayerActs layer_acts(const ActTensors *a, int B, int T, int C, int NH, int l) {
    size_t BT = (size_t)B * T, c = (size_t)C, L = (size_t)l;
    size_t att = (size_t)B * NH * T * T;
    LayerActs x = {
        a->ln1 + L * BT * c, a->ln1_mean + L * BT, a->ln1_rstd + L * BT,
        a->qkv + L * BT * 3 * c,
        a->atty + L * BT * c,
        a->preatt + L * att, a->att + L * att,
        a->attproj + L * BT * c, a->residual2 + L * BT * c,
        a->ln2 + L * BT * c, a->ln2_mean + L * BT, a->ln2_rstd + L * BT,
        a->fch + L * BT * 4 * c, a->fch_gelu + L * BT * 4 * c,
        a->fcproj + L * BT * c, a->residual3 + L * BT * c,
    };
    return x;
}

// The gradient scratch of one block (gpt2_dact_sizes): the same buffers for every layer, except
// residual3, the gradient of block l's own output. attproj, fcproj are never materialized.
static LayerActs layer_dacts(const ActTensors *da, size_t BTC, int l) {
    LayerActs x = {
        da->ln1, NULL, NULL, da->qkv, da->atty, da->preatt, da->att, NULL, da->residual2,
        da->ln2, NULL, NULL, da->fch, da->fch_gelu, NULL, da->residual3 + (size_t)l * BTC,
    };
    return x;
}

// The residual stream entering block l: the embedding for block 0, else block l-1's output.
// (Used for the gradients, and for the activations in fp32; see piece_input.)
static float *block_input(const ActTensors *a, size_t BTC, int l) {
    return l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BTC;
}

// The input of block l (l = L: of the head), in fp32. bf16: block l-1's output as stored,
// rounded to bf16, widened into block_in, so that the next piece reads exactly the stored
// values, in its forward and again in its backward (on a GPU the activations are bf16 tensors).
static const float *piece_input(GPT2 *m, int l) {
    size_t BTC = (size_t)m->B * m->T * m->cfg.C;
    if (m->dtype == GPT2_FP32 || l == 0) return block_input(&m->a, BTC, l);
    // residual3 is the last tensor of a stored layer
    const uint16_t *out = m->acts_bf16 + (size_t)l * m->layer_act_size - BTC;
    m->k->bf16_to_f32(m->block_in, out, BTC);
    return m->block_in;
}

// Layer l's activations: in place (fp32), or the one-layer fp32 scratch (bf16).
static LayerActs block_acts(const GPT2 *m, int l) {
    return layer_acts(&m->a, m->B, m->T, m->cfg.C, m->cfg.NH, m->dtype == GPT2_BF16 ? 0 : l);
}

// ----------------------------------------------------------------------------------------------
// The weights of one piece. A piece reads a few ranges of the flat parameter buffer: the
// embedding wte and wpe; block l its layer's slice of the 12 stacked tensors; the head wte,
// lnfw and lnfb. In fp32 they are read in place. In bf16 they are widened into m->work before
// the piece runs, its gradients are accumulated in fp32 in m->work_grads, and rounded once
// into grads_bf16 when its backward is done.

#define PIECE_MAX 12
typedef struct Piece {
    int n;                     // ranges
    size_t offset[PIECE_MAX];  // element offset in the flat buffer
    size_t size[PIECE_MAX];    // elements
} Piece;

static void piece_add(Piece *pc, const GPT2 *m, int t, int l) {
    size_t offset = 0;
    for (int i = 0; i < t; i++) offset += m->param_sizes[i];
    int per_layer = l >= 0;
    size_t size = m->param_sizes[t] / (per_layer ? (size_t)m->cfg.L : 1);
    pc->offset[pc->n] = offset + (per_layer ? (size_t)l * size : 0);
    pc->size[pc->n] = size;
    pc->n++;
}

static Piece piece_embed(const GPT2 *m) {  // wte, wpe
    Piece pc = {0};
    piece_add(&pc, m, T_WTE, -1);
    piece_add(&pc, m, T_WPE, -1);
    return pc;
}

static Piece piece_head(const GPT2 *m) {   // wte, lnfw, lnfb
    Piece pc = {0};
    piece_add(&pc, m, T_WTE, -1);
    piece_add(&pc, m, T_LNFW, -1);
    piece_add(&pc, m, T_LNFB, -1);
    return pc;
}

static Piece piece_block(const GPT2 *m, int l) {  // ln1w .. fcprojb of layer l
    Piece pc = {0};
    for (int t = T_LN1W; t <= T_FCPROJB; t++) piece_add(&pc, m, t, l);
    return pc;
}

// Pointers to the piece's fp32 weights, one per range.
static void piece_weights(GPT2 *m, const Piece *pc, float *w[PIECE_MAX]) {
    size_t at = 0;
    for (int i = 0; i < pc->n; i++) {
        if (m->dtype == GPT2_FP32) {
            w[i] = m->params + pc->offset[i];
            continue;
        }
        w[i] = m->work + at;
        m->k->bf16_to_f32(w[i], m->params_bf16 + pc->offset[i], pc->size[i]);
        at += pc->size[i];
    }
}

// Pointers to the piece's fp32 weight gradients. bf16 widens the gradient accumulated so far
// (the backward kernels add into it: += in fp32).
static void piece_grads(GPT2 *m, const Piece *pc, float *g[PIECE_MAX]) {
    size_t at = 0;
    for (int i = 0; i < pc->n; i++) {
        if (m->dtype == GPT2_FP32) {
            g[i] = m->grads + pc->offset[i];
            continue;
        }
        g[i] = m->work_grads + at;
        m->k->bf16_to_f32(g[i], m->grads_bf16 + pc->offset[i], pc->size[i]);
        at += pc->size[i];
    }
}

// After the piece's backward: bf16 rounds its fp32 gradients back into grads_bf16.
static void piece_grads_done(GPT2 *m, const Piece *pc) {
    if (m->dtype == GPT2_FP32) return;
    size_t at = 0;
    for (int i = 0; i < pc->n; i++) {
        m->k->f32_to_bf16(m->grads_bf16 + pc->offset[i], m->work_grads + at, pc->size[i]);
        at += pc->size[i];
    }
}

// A block's 12 ranges, named.
static LayerParams layer_params(float *v[PIECE_MAX]) {
    LayerParams w = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
    return w;
}

static int has_grads(const GPT2 *m) { return m->grads != NULL || m->grads_bf16 != NULL; }

// ----------------------------------------------------------------------------------------------
// Forward

void gpt2_embed_forward(GPT2 *m) {
    Piece pc = piece_embed(m);
    float *w[PIECE_MAX];  // wte, wpe
    piece_weights(m, &pc, w);
    m->k->encoder_forward(m->a.encoded, m->inputs, w[0], w[1], m->B, m->T, m->cfg.C);
}

// A block works on its rows in chunks of a few whole sequences (attention mixes only the rows of
// one sequence; everything else works row by row). On a CPU a chunk's intermediates (its rows
// of ln1, qkv, fch, ...) then stay in the core's L2 cache from the op that writes them to the
// op that reads them, instead of going out to memory and back (the whole batch's are several
// MiB per op; a GEMM of these shapes runs ~30% slower on operands that are not in cache). A GPU
// wants the opposite, kernels as large as possible: one chunk of B sequences.
#define CPU_CHUNK_ROWS 256  // rows per chunk on a CPU: fch is 256 x 4C floats = 512 KiB at C=128

static int chunk_seqs(const GPT2 *m) {
    if (m->dev != DEV_CPU) return m->B;
    int seqs = CPU_CHUNK_ROWS / m->T;
    return seqs < 1 ? 1 : seqs > m->B ? m->B : seqs;
}

// A block's views moved to the chunk that starts at row r (= sequence r/T); NULL stays NULL.
static float *rows_from(float *p, size_t r, size_t width) { return p ? p + r * width : NULL; }
static LayerActs layer_rows(LayerActs x, size_t r, int C, int NH, int T) {
    size_t c = (size_t)C, att = (size_t)NH * T;  // a sequence's T rows own NH·T·T scores
    LayerActs y = {
        rows_from(x.ln1, r, c), rows_from(x.ln1_mean, r, 1), rows_from(x.ln1_rstd, r, 1),
        rows_from(x.qkv, r, 3 * c),
        rows_from(x.atty, r, c),
        rows_from(x.preatt, r, att), rows_from(x.att, r, att),
        rows_from(x.attproj, r, c), rows_from(x.residual2, r, c),
        rows_from(x.ln2, r, c), rows_from(x.ln2_mean, r, 1), rows_from(x.ln2_rstd, r, 1),
        rows_from(x.fch, r, 4 * c), rows_from(x.fch_gelu, r, 4 * c),
        rows_from(x.fcproj, r, c), rows_from(x.residual3, r, c),
    };
    return y;
}

// Forward of one block on Bc sequences (BT = Bc·T rows): residual is their input rows, a their
// rows of the block's activations.
static void block_forward_rows(const Kernels *k, const LayerParams *wp, const LayerActs *ap,
                               const float *residual, int Bc, int T, int C, int NH) {
    const LayerParams w = *wp;
    const LayerActs a = *ap;
    int BT = Bc * T;
    // x = x + attn(ln1(x))
    k->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w.ln1w, w.ln1b, BT, C);
    k->matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, BT, C, 3 * C);
    k->attention_forward(a.atty, a.preatt, a.att, a.qkv, Bc, T, C, NH);
    k->matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, BT, C, C);
    k->residual_forward(a.residual2, residual, a.attproj, (size_t)BT * C);
    // x = x + mlp(ln2(x))
    k->layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, BT, C);
    k->matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, BT, C, 4 * C);
    k->gelu_forward(a.fch_gelu, a.fch, (size_t)BT * 4 * C);
    k->matmul_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * C, C);
    k->residual_forward(a.residual3, a.residual2, a.fcproj, (size_t)BT * C);
}

void gpt2_block_forward(GPT2 *m, int l) {
    int B = m->B, T = m->T, C = m->cfg.C, NH = m->cfg.NH;
    LAB_CHECK(l >= 0 && l < m->cfg.L, "gpt2_block_forward: block %d of %d", l, m->cfg.L);
    Piece pc = piece_block(m, l);
    float *wv[PIECE_MAX];
    piece_weights(m, &pc, wv);
    LayerParams w = layer_params(wv);
    LayerActs a = block_acts(m, l);
    const float *residual = piece_input(m, l);  // (B,T,C)
    int step = chunk_seqs(m);
    for (int b0 = 0; b0 < B; b0 += step) {
        int Bc = B - b0 < step ? B - b0 : step;
        size_t r = (size_t)b0 * T;  // first row of the chunk
        LayerActs ac = layer_rows(a, r, C, NH, T);
        block_forward_rows(m->k, &w, &ac, residual + r * C, Bc, T, C, NH);
    }
    // bf16: store the layer rounded to nearest even (backward widens it again)
    if (m->dtype == GPT2_BF16)
        m->k->f32_to_bf16(m->acts_bf16 + (size_t)l * m->layer_act_size, a.ln1, m->layer_act_size);
}

float gpt2_head_forward(GPT2 *m) {
    const Kernels *k = m->k;
    int BT = m->B * m->T, C = m->cfg.C, V = m->cfg.V;
    const float *residual = piece_input(m, m->cfg.L);  // last block's output
    Piece pc = piece_head(m);
    float *w[PIECE_MAX];  // wte, lnfw, lnfb
    piece_weights(m, &pc, w);
    k->layernorm_forward(m->a.lnf, m->a.lnf_mean, m->a.lnf_rstd, residual, w[1], w[2], BT, C);
    // logits (B,T,V) = lnf (B,T,C) · wte (V,C)ᵀ: the output layer is the embedding, transposed
    k->matmul_forward(m->a.logits, m->a.lnf, w[0], NULL, BT, C, V);
    k->softmax_forward(m->a.probs, m->a.logits, BT, V);
    if (!m->has_targets) return -1.0f;
    k->crossentropy_forward(m->a.losses, m->a.probs, m->targets, BT, V);
    mem_copy(m->host_losses, m->a.losses, (size_t)BT * sizeof(float));
    double sum = 0.0;  // in position order: the same bits on every run
    for (int i = 0; i < BT; i++) sum += m->host_losses[i];
    return (float)(sum / BT);
}

float gpt2_forward(GPT2 *m, const int *inputs, const int *targets) {
    if (inputs) gpt2_set_batch(m, inputs, targets);  // NULL: use the batch already set
    gpt2_embed_forward(m);
    for (int l = 0; l < m->cfg.L; l++) gpt2_block_forward(m, l);
    return gpt2_head_forward(m);
}

// ----------------------------------------------------------------------------------------------
// Backward. Parameter gradients accumulate (+=). Activation gradients need no zeroing: every
// kernel overwrites the input gradients it computes (kernels.h). A block reads the gradient of
// its output (da.residual3 of that block) and never writes it, so a pipeline stage can write
// the gradient it receives there before calling gpt2_block_backward; it writes the gradient of
// its input (da.residual3 of block l-1, or da.encoded).

void gpt2_zero_grad(GPT2 *m) {
    LAB_CHECK(has_grads(m), "gpt2_zero_grad before gpt2_alloc_grads");
    if (m->dtype == GPT2_BF16) mem_zero(m->grads_bf16, m->num_params * sizeof(uint16_t));
    else mem_zero(m->grads, m->num_params * sizeof(float));
}

void gpt2_head_backward(GPT2 *m, float dloss) {
    const Kernels *k = m->k;
    int BT = m->B * m->T, C = m->cfg.C, V = m->cfg.V, L = m->cfg.L;
    LAB_CHECK(has_grads(m), "gpt2_head_backward before gpt2_alloc_grads");
    LAB_CHECK(m->has_targets, "gpt2_head_backward: the batch has no targets (no loss to differentiate)");
    const float *residual = piece_input(m, L);
    float *dresidual = block_input(&m->da, (size_t)BT * C, L);
    Piece pc = piece_head(m);
    float *w[PIECE_MAX], *dw[PIECE_MAX];  // wte, lnfw, lnfb
    piece_weights(m, &pc, w);
    piece_grads(m, &pc, dw);
    k->crossentropy_softmax_backward(m->da.logits, m->a.probs, m->targets, dloss, BT, V);
    k->matmul_backward(m->da.lnf, dw[0], NULL, m->da.logits, m->a.lnf, w[0], BT, C, V);
    k->layernorm_backward(dresidual, dw[1], dw[2], m->da.lnf, NULL, residual, w[1],
                          m->a.lnf_mean, m->a.lnf_rstd, BT, C);
    piece_grads_done(m, &pc);
}

// Backward of one block on Bc sequences, the chunk's rows of everything (see
// block_forward_rows). Reads d.residual3 (the gradient of the block's output); writes dresidual
// (that of its input); adds into the weight gradients dw.
static void block_backward_rows(const Kernels *k, const LayerParams *wp, const LayerParams *dwp,
                                const LayerActs *ap, const LayerActs *dp, const float *residual,
                                float *dresidual, int Bc, int T, int C, int NH) {
    const LayerParams w = *wp, dw = *dwp;
    const LayerActs a = *ap, d = *dp;
    int BT = Bc * T;
    size_t BTC = (size_t)BT * C;
    // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))). A sum passes its gradient
    // unchanged to both terms, so the fcproj backward reads d.residual3 directly (d.fcproj is
    // not materialized), and d.residual2 = d.residual3 (the skip path) + ln2's backward.
    k->matmul_backward(d.fch_gelu, dw.fcprojw, dw.fcprojb, d.residual3, a.fch_gelu, w.fcprojw, BT, 4 * C, C);
    k->gelu_backward(d.fch, a.fch, d.fch_gelu, BTC * 4);
    k->matmul_backward(d.ln2, dw.fcw, dw.fcb, d.fch, a.ln2, w.fcw, BT, C, 4 * C);
    k->layernorm_backward(d.residual2, dw.ln2w, dw.ln2b, d.ln2, d.residual3, a.residual2, w.ln2w,
                          a.ln2_mean, a.ln2_rstd, BT, C);

    // Attention: residual2 = residual + attproj(attention(qkv(ln1(residual)))); same trick.
    k->matmul_backward(d.atty, dw.attprojw, dw.attprojb, d.residual2, a.atty, w.attprojw, BT, C, C);
    k->attention_backward(d.qkv, d.preatt, d.att, d.atty, a.qkv, a.att, Bc, T, C, NH);
    k->matmul_backward(d.ln1, dw.qkvw, dw.qkvb, d.qkv, a.ln1, w.qkvw, BT, C, 3 * C);
    k->layernorm_backward(dresidual, dw.ln1w, dw.ln1b, d.ln1, d.residual2, residual, w.ln1w,
                          a.ln1_mean, a.ln1_rstd, BT, C);
}

// Reads da.residual3 of block l (the gradient of its output); writes the gradient of its
// input (da.residual3 of block l-1, or da.encoded for block 0).
void gpt2_block_backward(GPT2 *m, int l) {
    int B = m->B, T = m->T, C = m->cfg.C, NH = m->cfg.NH;
    size_t BTC = (size_t)B * T * C;
    LAB_CHECK(l >= 0 && l < m->cfg.L, "gpt2_block_backward: block %d of %d", l, m->cfg.L);
    LAB_CHECK(has_grads(m), "gpt2_block_backward before gpt2_alloc_grads");
    Piece pc = piece_block(m, l);
    float *wv[PIECE_MAX], *dwv[PIECE_MAX];
    piece_weights(m, &pc, wv);
    piece_grads(m, &pc, dwv);
    LayerParams w = layer_params(wv);
    LayerParams dw = layer_params(dwv);
    LayerActs a = block_acts(m, l);
    LayerActs d = layer_dacts(&m->da, BTC, l);
    // bf16: widen the stored layer into the fp32 scratch
    if (m->dtype == GPT2_BF16)
        m->k->bf16_to_f32(a.ln1, m->acts_bf16 + (size_t)l * m->layer_act_size, m->layer_act_size);
    const float *residual = piece_input(m, l);
    float *dresidual = block_input(&m->da, BTC, l);
    int step = chunk_seqs(m);
    for (int b0 = 0; b0 < B; b0 += step) {
        int Bc = B - b0 < step ? B - b0 : step;
        size_t r = (size_t)b0 * T;
        LayerActs ac = layer_rows(a, r, C, NH, T), dc = layer_rows(d, r, C, NH, T);
        block_backward_rows(m->k, &w, &dw, &ac, &dc, residual + r * C, dresidual + r * C, Bc, T,
                            C, NH);
    }
    piece_grads_done(m, &pc);
}

void gpt2_embed_backward(GPT2 *m) {
    LAB_CHECK(has_grads(m), "gpt2_embed_backward before gpt2_alloc_grads");
    Piece pc = piece_embed(m);
    float *dw[PIECE_MAX];  // wte, wpe
    piece_grads(m, &pc, dw);
    m->k->encoder_backward(dw[0], dw[1], m->da.encoded, m->inputs, m->B, m->T, m->cfg.C);
    piece_grads_done(m, &pc);
}

void gpt2_backward(GPT2 *m, float dloss) {
    gpt2_head_backward(m, dloss);
    for (int l = m->cfg.L - 1; l >= 0; l--) gpt2_block_backward(m, l);
    gpt2_embed_backward(m);
}

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
