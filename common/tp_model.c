// tp_model.c: one rank's share of a tensor-parallel GPT-2 (see tp_model.h).
#include "tp_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"

// Where tensor `tensor` (layer -1: wte, wpe, lnfw, lnfb) starts in the FULL model's flat buffer.
static size_t full_offset(const GPT2Config *cfg, int tensor) {
    GPT2Param list[TPM_MAX_PARAMS];
    int n = gpt2_params(cfg, list);
    for (int j = 0; j < n; j++)
        if (list[j].tensor == tensor && list[j].layer < 0) return list[j].offset;
    lab_fail("tp_model: the model has no tensor %s", gpt2_tensor_name(tensor));
    return 0;
}

// Appends a tensor of the flat buffer to the list; returns its offset.
static size_t add(TpModel *m, size_t *at, const char *name, int tensor, int layer, size_t size,
                  int decay, int sharded) {
    LAB_CHECK(m->nplist < TPM_MAX_PARAMS, "tp_model: more than %d tensors", TPM_MAX_PARAMS);
    GPT2Param *p = &m->plist[m->nplist];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->tensor = tensor, p->layer = layer, p->offset = *at, p->size = size, p->decay = decay;
    m->sharded[m->nplist++] = sharded;
    *at += size;
    return p->offset;
}

// The 12 tensors of a block in TpBlock order: which are sliced across the group (the column-
// and row-parallel matrices and the column-parallel biases) and which are 2-D (weight decay).
static const int block_sharded[TP_BLOCK_TENSORS] = {0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0};
static const int block_decay[TP_BLOCK_TENSORS] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0};
static const char *const block_names[TP_BLOCK_TENSORS] = {
    "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"};

void tpm_build(TpModel *m, GPT2Config cfg, int tp, int r, int B, int T, uint64_t seed) {
    tpm_build_sp(m, cfg, tp, r, B, T, seed, 0);
}

void tpm_build_sp(TpModel *m, GPT2Config cfg, int tp, int r, int B, int T, uint64_t seed, int sp) {
    memset(m, 0, sizeof *m);
    tp_check_config(&cfg, tp);
    if (sp) tp_check_sequence_parallel(T, tp);
    m->cfg = cfg, m->tp = tp, m->r = r, m->B = B, m->T = T, m->sp = sp;
    m->tv = tp_vocab(cfg.V, tp, r);
    const size_t C = (size_t)cfg.C, L = (size_t)cfg.L, Vl = (size_t)m->tv.Vl;

    // 1. The flat buffer's layout (tp_model.h).
    size_t at = 0, off_wte, off_wpe, off_lnfw, off_lnfb, off_block[64], sizes[TP_BLOCK_TENSORS];
    LAB_CHECK(L <= 64, "tp_model: at most 64 blocks");
    tp_block_sizes(cfg.C, tp, sizes);
    off_wte = add(m, &at, "wte (local rows)", GPT2_WTE, -1, Vl * C, 1, 1);
    off_wpe = add(m, &at, "wpe", GPT2_WPE, -1, (size_t)cfg.T * C, 1, 0);
    for (size_t l = 0; l < L; l++) {
        off_block[l] = at;
        for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
            char name[32];
            snprintf(name, sizeof name, "h.%zu.%s", l, block_names[i]);
            add(m, &at, name, -1, (int)l, sizes[i], block_decay[i], block_sharded[i]);
        }
    }
    off_lnfw = add(m, &at, "lnfw", GPT2_LNFW, -1, C, 0, 0);
    off_lnfb = add(m, &at, "lnfb", GPT2_LNFB, -1, C, 0, 0);
    m->n = at;

    // 2. Weights, gradients, Adam state: four flat buffers, tagged for the memory report.
    m->params = mem_alloc(m->n * sizeof(float), MEM_PARAMS, DEV_CPU);
    m->grads = mem_alloc(m->n * sizeof(float), MEM_GRADS, DEV_CPU);
    m->opt_m = mem_alloc(m->n * sizeof(float), MEM_OPT_M, DEV_CPU);
    m->opt_v = mem_alloc(m->n * sizeof(float), MEM_OPT_V, DEV_CPU);
    memset(m->grads, 0, m->n * sizeof(float));
    memset(m->opt_m, 0, m->n * sizeof(float));
    memset(m->opt_v, 0, m->n * sizeof(float));
    m->wte = m->params + off_wte, m->dwte = m->grads + off_wte;
    m->wpe = m->params + off_wpe, m->dwpe = m->grads + off_wpe;
    m->lnfw = m->params + off_lnfw, m->dlnfw = m->grads + off_lnfw;
    m->lnfb = m->params + off_lnfb, m->dlnfb = m->grads + off_lnfb;
    m->w = lab_xcalloc(L, sizeof(TpBlock));
    m->dw = lab_xcalloc(L, sizeof(TpBlock));
    for (size_t l = 0; l < L; l++) {
        tp_block_views(&m->w[l], m->params + off_block[l], cfg.C, tp);
        tp_block_views(&m->dw[l], m->grads + off_block[l], cfg.C, tp);
    }

    // 3. The weights of gpt2_init_params(seed)'s model, this rank's slices only: no rank ever
    //    holds the full model (each element is initialized from its index in the full model).
    tp_wte_init(m->wte, &cfg, seed, &m->tv);
    size_t wpe0 = full_offset(&cfg, GPT2_WPE), lnf0 = full_offset(&cfg, GPT2_LNFW),
           lnb0 = full_offset(&cfg, GPT2_LNFB);
    gpt2_init_slice(&cfg, seed, wpe0, wpe0 + (size_t)cfg.T * C, m->wpe);
    gpt2_init_slice(&cfg, seed, lnf0, lnf0 + C, m->lnfw);
    gpt2_init_slice(&cfg, seed, lnb0, lnb0 + C, m->lnfb);
    for (size_t l = 0; l < L; l++) tp_block_init(&m->w[l], &cfg, seed, (int)l, tp, r);

    // 4. Activations for (B, T): every block's saved set, one scratch, the head's.
    m->a = lab_xcalloc(L, sizeof(TpBlockActs));
    if (sp) {  // (tp.h's SP section: the stream on this rank's B·T/t positions)
        const size_t Nl = (size_t)B * T / (size_t)tp;
        tp_sp_scratch_alloc(&m->s, B, T, cfg.C, cfg.NH, tp, DEV_CPU);
        for (size_t l = 0; l < L; l++)
            tp_sp_block_acts_alloc(&m->a[l], B, T, cfg.C, cfg.NH, tp, m->s.partial, DEV_CPU);
        tp_sp_head_acts_alloc(&m->h, B, T, cfg.C, tp, &m->tv, DEV_CPU);
        m->enc = mem_alloc(Nl * C * sizeof(float), MEM_ACTS, DEV_CPU);
        m->dx = mem_alloc(Nl * C * sizeof(float), MEM_ACTS, DEV_CPU);
        return;
    }
    for (size_t l = 0; l < L; l++) tp_block_acts_alloc(&m->a[l], B, T, cfg.C, cfg.NH, tp, DEV_CPU);
    tp_scratch_alloc(&m->s, B, T, cfg.C, cfg.NH, tp, DEV_CPU);
    tp_head_acts_alloc(&m->h, B * T, cfg.C, &m->tv, DEV_CPU);
    m->enc = mem_alloc((size_t)B * T * C * sizeof(float), MEM_ACTS, DEV_CPU);
    m->dx = mem_alloc((size_t)B * T * C * sizeof(float), MEM_ACTS, DEV_CPU);
}

void tpm_free(TpModel *m) {
    for (int l = 0; l < m->cfg.L; l++) tp_block_acts_free(&m->a[l]);
    tp_scratch_free(&m->s);
    tp_head_acts_free(&m->h);
    mem_free(m->enc), mem_free(m->dx);
    mem_free(m->params), mem_free(m->grads), mem_free(m->opt_m), mem_free(m->opt_v);
    free(m->a), free(m->w), free(m->dw);
    memset(m, 0, sizeof *m);
}

void tpm_zero_grad(TpModel *m) { memset(m->grads, 0, m->n * sizeof(float)); }

// tpm_forward under sequence parallelism: the stream on this rank's positions (tp.h).
static void sp_forward(TpModel *m, TpComm *c, const int *inputs, const int *targets) {
    const Kernels *k = kernels_get(DEV_CPU);
    tp_sp_embed_forward(k, c, &m->tv, m->enc, m->s.full, inputs, m->wte, m->wpe, m->B, m->T, m->cfg.C);
    const float *x = m->enc;  // (N/t, C): this rank's positions
    for (int l = 0; l < m->cfg.L; l++) {
        tp_sp_block_forward(k, c, &m->w[l], &m->a[l], &m->s, x);  // 2 all-gathers, 2 reduce-scatters
        x = m->a[l].out;
    }
    tp_sp_head_forward(k, c, &m->tv, &m->h, x, m->lnfw, m->lnfb, m->wte, targets);
}

float tpm_forward(TpModel *m, TpComm *c, const int *inputs, const int *targets) {
    const Kernels *k = kernels_get(DEV_CPU);
    const int C = m->cfg.C, N = m->B * m->T;
    if (m->sp) {
        sp_forward(m, c, inputs, targets);
        double sum = 0.0;  // the losses of every position (the head gathered them all)
        for (int i = 0; i < N; i++) sum += m->h.losses[i];
        return (float)(sum / N);
    }
    // embedding: each rank looks up the tokens it owns, one all-reduce of (N, C) sums them
    tp_embed_forward(k, c, &m->tv, m->enc, inputs, m->wte, m->wpe, m->B, m->T, C);
    const float *x = m->enc;  // (N, C), the same on every rank of the group
    for (int l = 0; l < m->cfg.L; l++) {
        tp_block_forward(k, c, &m->w[l], &m->a[l], x);  // g after each half: 2 all-reduces
        x = m->a[l].out;
    }
    // lnf, logits on this rank's vocabulary rows, the loss from three all-reduces of N floats
    tp_head_forward(k, c, &m->tv, &m->h, x, m->lnfw, m->lnfb, m->wte, targets);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->h.losses[i];
    return (float)(sum / N);
}

// The replicated tensors whose gradients SP leaves partial (each rank: its positions' share).
static const int sp_partial[TP_BLOCK_TENSORS] = {1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1};

// tpm_backward under sequence parallelism, then the group's sum of the partial gradients.
static void sp_backward(TpModel *m, TpComm *c, const int *inputs, const int *targets, float dloss) {
    const Kernels *k = kernels_get(DEV_CPU);
    const int L = m->cfg.L, C = m->cfg.C;
    const float *x = L ? m->a[L - 1].out : m->enc;
    tp_sp_head_backward(k, c, &m->tv, &m->h, x, m->lnfw, m->wte, m->dlnfw, m->dlnfb, m->dwte, targets,
                        dloss, m->dx);
    for (int l = L - 1; l >= 0; l--)
        tp_sp_block_backward(k, c, &m->w[l], &m->dw[l], &m->a[l], &m->s, l ? m->a[l - 1].out : m->enc,
                             m->dx, m->dx);
    // the embedding needs every position's gradient (its rows of wte see all the tokens): the
    // reverse of its forward reduce-scatter; dwpe then comes out whole on every rank
    tp_seq_all_gather(c, m->dx, m->s.full, m->B, m->T, C, TP_SITE_EMBED_BWD);
    tp_embed_backward(k, &m->tv, m->dwte, m->dwpe, m->s.full, inputs, m->B, m->T, C);
    // one all-reduce of the partial gradients, packed: L·6C + 2C floats
    size_t n = (size_t)(6 * L + 2) * C, at = 0;
    float *pack = lab_xmalloc(n * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {  // 0: pack, 1: unpack the sums
        at = 0;
        for (int l = 0; l < L; l++)
            for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
                if (!sp_partial[i]) continue;
                float *g = (&m->dw[l].ln1w)[i];
                if (pass == 0) memcpy(pack + at, g, (size_t)C * sizeof(float));
                else memcpy(g, pack + at, (size_t)C * sizeof(float));
                at += (size_t)C;
            }
        float *tail[2] = {m->dlnfw, m->dlnfb};
        for (int j = 0; j < 2; j++, at += (size_t)C) {
            if (pass == 0) memcpy(pack + at, tail[j], (size_t)C * sizeof(float));
            else memcpy(tail[j], pack + at, (size_t)C * sizeof(float));
        }
        if (pass == 0) tp_all_reduce(c, pack, n, TP_SUM, TP_SITE_SP_GRADS);
    }
    LAB_CHECK(at == n, "sp_backward: packed %zu of %zu", at, n);
    free(pack);
}

void tpm_backward(TpModel *m, TpComm *c, const int *inputs, const int *targets, float dloss) {
    const Kernels *k = kernels_get(DEV_CPU);
    const int L = m->cfg.L;
    if (m->sp) {
        sp_backward(m, c, inputs, targets, dloss);
        return;
    }
    const float *x = L ? m->a[L - 1].out : m->enc;
    // head: f at its input all-reduces d lnf-input (each rank saw only its vocabulary columns)
    tp_head_backward(k, c, &m->tv, &m->h, x, m->lnfw, m->wte, m->dlnfw, m->dlnfb, m->dwte, targets,
                     dloss, m->dx);
    for (int l = L - 1; l >= 0; l--)  // f at each half's input: 2 all-reduces per block
        tp_block_backward(k, c, &m->w[l], &m->dw[l], &m->a[l], &m->s, l ? m->a[l - 1].out : m->enc,
                          m->dx, m->dx);
    tp_embed_backward(k, &m->tv, m->dwte, m->dwpe, m->dx, inputs, m->B, m->T, m->cfg.C);
}

void tpm_adamw_step(TpModel *m, const AdamW *h, int step, DistGroup *g) {
    const Kernels *k = kernels_get(DEV_CPU);
    // ||grad||² of the FULL model: each slice lives on one rank (sum over the group), each
    // replicated tensor on all of them with the same value (count it once).
    double sq[2] = {0.0, 0.0};  // sharded, replicated
    for (int i = 0; i < m->nplist; i++)
        sq[m->sharded[i] ? 0 : 1] += k->sum_squares(m->grads + m->plist[i].offset, m->plist[i].size);
    dist_all_reduce(&sq[0], &sq[0], 1, DIST_F64, DIST_SUM, g);
    float scale = adamw_clip_scale(h, sq[0] + sq[1], step);
    adamw_step(h, k, step, m->params, m->grads, m->opt_m, m->opt_v, 0, m->n, m->plist, m->nplist,
               scale);
}

// Block l's shard, the local wte rows, wpe, lnfw, lnfb of a flat buffer of m's layout (the
// offsets of m->params' views, applied to `flat`).
static void flat_views(const TpModel *m, const float *flat, int l, TpBlock *b) {
    tp_block_views(b, (float *)flat + (m->w[l].ln1w - m->params), m->cfg.C, m->tp);
}
#define FLAT(m, flat, view) ((float *)(flat) + ((m)->view - (m)->params))

void tpm_gather_flat(const TpModel *m, DistGroup *g, const float *flat, float *full_mem) {
    const GPT2Config *cfg = &m->cfg;
    const size_t n = gpt2_param_count(cfg), C = (size_t)cfg->C;
    float *mine = lab_xcalloc(n, sizeof(float));  // zero where another rank writes
    for (int l = 0; l < cfg->L; l++) {
        TpBlock fb, sb;
        tp_block_of_model(&fb, cfg, mine, l);
        flat_views(m, flat, l, &sb);
        tp_block_unshard(&fb, &sb, cfg->C, m->tp, m->r, m->r == 0);
    }
    tp_wte_unshard(mine + full_offset(cfg, GPT2_WTE), FLAT(m, flat, wte), &m->tv, cfg->C);
    if (m->r == 0) {
        memcpy(mine + full_offset(cfg, GPT2_WPE), FLAT(m, flat, wpe), (size_t)cfg->T * C * sizeof(float));
        memcpy(mine + full_offset(cfg, GPT2_LNFW), FLAT(m, flat, lnfw), C * sizeof(float));
        memcpy(mine + full_offset(cfg, GPT2_LNFB), FLAT(m, flat, lnfb), C * sizeof(float));
    }
    dist_reduce(mine, m->r == 0 ? full_mem : NULL, n, DIST_F32, DIST_SUM, 0, g);
    free(mine);
}

void tpm_take_flat(const TpModel *m, const float *full_mem, float *flat) {
    const GPT2Config *cfg = &m->cfg;
    const size_t C = (size_t)cfg->C;
    for (int l = 0; l < cfg->L; l++) {
        TpBlock fb, sb;
        tp_block_of_model(&fb, cfg, (float *)full_mem, l);
        flat_views(m, flat, l, &sb);
        tp_block_shard(&sb, &fb, cfg->C, m->tp, m->r);
    }
    tp_wte_shard(FLAT(m, flat, wte), full_mem + full_offset(cfg, GPT2_WTE), &m->tv, cfg->C);
    memcpy(FLAT(m, flat, wpe), full_mem + full_offset(cfg, GPT2_WPE), (size_t)cfg->T * C * sizeof(float));
    memcpy(FLAT(m, flat, lnfw), full_mem + full_offset(cfg, GPT2_LNFW), C * sizeof(float));
    memcpy(FLAT(m, flat, lnfb), full_mem + full_offset(cfg, GPT2_LNFB), C * sizeof(float));
}

void tpm_gather_full(const TpModel *m, DistGroup *g, float *full) {
    const size_t n = gpt2_param_count(&m->cfg);
    float *sum = m->r == 0 ? lab_xcalloc(n, sizeof(float)) : NULL;
    tpm_gather_flat(m, g, m->params, sum);
    if (m->r == 0) gpt2_to_llmc(&m->cfg, sum, full);  // memory order -> llm.c's order
    free(sum);
}

double tpm_replicated_max_diff(const TpModel *m, DistGroup *g) {
    double worst = 0.0;
    for (int i = 0; i < m->nplist; i++) {
        if (m->sharded[i]) continue;
        size_t n = m->plist[i].size;
        const float *mine = m->params + m->plist[i].offset;
        float *ref = lab_xmalloc(n * sizeof(float));
        memcpy(ref, mine, n * sizeof(float));
        dist_broadcast(ref, n, DIST_F32, 0, g);
        for (size_t j = 0; j < n; j++) {
            double d = fabs((double)mine[j] - (double)ref[j]);
            if (!(d <= worst)) worst = d;  // NaN counts as the worst
        }
        free(ref);
    }
    dist_all_reduce(&worst, &worst, 1, DIST_F64, DIST_MAX, g);
    return worst;
}

size_t tpm_block_act_floats(const TpModel *m) {
    const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.C, t = (size_t)m->tp;
    const size_t att = (size_t)m->B * (size_t)(m->cfg.NH / m->tp) * m->T * m->T;
    // SP: ln1, ln2 gathered (N,C); residual2, out this rank's positions (N/t,C); the 4
    // statistics (N/t); qkv, atty, preatt, att, fch, fch_gelu as below
    if (m->sp) return 2 * N * C + 4 * (N / t) + 4 * N * (C / t) + 2 * att + 2 * (N / t) * C + 2 * N * (4 * C / t);
    // ln1, attproj, residual2, ln2, fcproj, out: (N,C) each, replicated; 4 LayerNorm statistics
    // (N); qkv (N,3C/t) and atty (N,C/t); preatt and att (B,NH/t,T,T); fch, fch_gelu (N,4C/t)
    return 6 * N * C + 4 * N + 4 * N * (C / t) + 2 * att + 2 * N * (4 * C / t);
}

void tpm_weight_split(const TpModel *m, size_t *sharded, size_t *replicated) {
    *sharded = *replicated = 0;
    for (int i = 0; i < m->nplist; i++) *(m->sharded[i] ? sharded : replicated) += m->plist[i].size;
}
