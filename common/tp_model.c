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

// The four flat buffers of n floats (weights, gradients, Adam m and v), zeroed, tagged for the
// memory report.
static void flat_buffers(size_t n, float **params, float **grads, float **opt_m, float **opt_v) {
    static const MemCategory cat[4] = {MEM_PARAMS, MEM_GRADS, MEM_OPT_M, MEM_OPT_V};
    float **buf[4] = {params, grads, opt_m, opt_v};
    for (int i = 0; i < 4; i++) {
        *buf[i] = mem_alloc(n * sizeof(float), cat[i], DEV_CPU);
        memset(*buf[i], 0, n * sizeof(float));
    }
}

// Views of n blocks' weights and gradients (blocks at off[0 .. n) of the flat buffers).
static void block_views(TpBlock **w, TpBlock **dw, float *params, float *grads, const size_t *off,
                        size_t n, int C, int tp) {
    *w = lab_xcalloc(n, sizeof(TpBlock));
    *dw = lab_xcalloc(n, sizeof(TpBlock));
    for (size_t j = 0; j < n; j++) {
        tp_block_views(&(*w)[j], params + off[j], C, tp);
        tp_block_views(&(*dw)[j], grads + off[j], C, tp);
    }
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
    flat_buffers(m->n, &m->params, &m->grads, &m->opt_m, &m->opt_v);
    m->wte = m->params + off_wte, m->dwte = m->grads + off_wte;
    m->wpe = m->params + off_wpe, m->dwpe = m->grads + off_wpe;
    m->lnfw = m->params + off_lnfw, m->dlnfw = m->grads + off_lnfw;
    m->lnfb = m->params + off_lnfb, m->dlnfb = m->grads + off_lnfb;
    block_views(&m->w, &m->dw, m->params, m->grads, off_block, L, cfg.C, tp);

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

// ---- one pipeline stage of a TP model (tp_model.h) ---------------------------------------------

void tpm_stage_build(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B, int T,
                     uint64_t seed) {
    memset(st, 0, sizeof *st);
    tp_check_config(&cfg, tp);
    LAB_CHECK(0 <= l0 && l0 < l1 && l1 <= cfg.L, "tp stage: blocks [%d, %d) of %d", l0, l1, cfg.L);
    st->cfg = cfg, st->tp = tp, st->r = r, st->l0 = l0, st->l1 = l1, st->B = B, st->T = T;
    st->has_embed = l0 == 0, st->has_head = l1 == cfg.L;
    st->tv = tp_vocab(cfg.V, tp, r);
    const size_t C = (size_t)cfg.C, nb = (size_t)(l1 - l0), Vl = (size_t)st->tv.Vl;

    // 1. The layout (tp_model.h); add() fills the TpModel-shaped list, so borrow one.
    TpModel *lay = lab_xcalloc(1, sizeof(TpModel));
    size_t at = 0, off_wte = 0, off_wpe = 0, off_lnf = 0, off_block[64], sizes[TP_BLOCK_TENSORS];
    LAB_CHECK(nb <= 64, "tp stage: at most 64 blocks");
    tp_block_sizes(cfg.C, tp, sizes);
    if (st->has_embed || st->has_head)
        off_wte = add(lay, &at, st->has_embed ? "wte (local rows)" : "wte (local rows, tied copy)",
                      GPT2_WTE, -1, Vl * C, 1, 1);
    if (st->has_embed) off_wpe = add(lay, &at, "wpe", GPT2_WPE, -1, (size_t)cfg.T * C, 1, 0);
    for (size_t j = 0; j < nb; j++) {
        off_block[j] = at;
        for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
            char name[32];
            snprintf(name, sizeof name, "h.%zu.%s", (size_t)l0 + j, block_names[i]);
            add(lay, &at, name, -1, l0 + (int)j, sizes[i], block_decay[i], block_sharded[i]);
        }
    }
    if (st->has_head) {
        off_lnf = add(lay, &at, "lnfw", GPT2_LNFW, -1, C, 0, 0);
        add(lay, &at, "lnfb", GPT2_LNFB, -1, C, 0, 0);
    }
    st->n = at, st->nplist = lay->nplist;
    memcpy(st->plist, lay->plist, sizeof st->plist);
    memcpy(st->sharded, lay->sharded, sizeof st->sharded);
    if (st->has_head && !st->has_embed) st->tied_copy[0] = 1;
    free(lay);

    // 2. Weights, gradients, Adam state.
    flat_buffers(st->n, &st->params, &st->grads, &st->opt_m, &st->opt_v);
    if (st->has_embed || st->has_head) st->wte = st->params + off_wte, st->dwte = st->grads + off_wte;
    if (st->has_embed) st->wpe = st->params + off_wpe, st->dwpe = st->grads + off_wpe;
    if (st->has_head) {
        st->lnfw = st->params + off_lnf, st->dlnfw = st->grads + off_lnf;
        st->lnfb = st->lnfw + C, st->dlnfb = st->dlnfw + C;
    }
    block_views(&st->w, &st->dw, st->params, st->grads, off_block, nb, cfg.C, tp);

    // 3. The slices of gpt2_init_params(seed)'s model (the tied copy: the same rows as wte).
    if (st->wte) tp_wte_init(st->wte, &cfg, seed, &st->tv);
    if (st->has_embed) {
        size_t wpe0 = full_offset(&cfg, GPT2_WPE);
        gpt2_init_slice(&cfg, seed, wpe0, wpe0 + (size_t)cfg.T * C, st->wpe);
    }
    if (st->has_head) {
        size_t lnf0 = full_offset(&cfg, GPT2_LNFW), lnb0 = full_offset(&cfg, GPT2_LNFB);
        gpt2_init_slice(&cfg, seed, lnf0, lnf0 + C, st->lnfw);
        gpt2_init_slice(&cfg, seed, lnb0, lnb0 + C, st->lnfb);
    }
    for (size_t j = 0; j < nb; j++) tp_block_init(&st->w[j], &cfg, seed, l0 + (int)j, tp, r);
    tp_scratch_alloc(&st->s, B, T, cfg.C, cfg.NH, tp, DEV_CPU);
}

void tpm_stage_free(TpStage *st) {
    tp_scratch_free(&st->s);
    mem_free(st->params), mem_free(st->grads), mem_free(st->opt_m), mem_free(st->opt_v);
    free(st->w), free(st->dw);
    memset(st, 0, sizeof *st);
}

void tpm_stage_acts_alloc(TpStageActs *x, const TpStage *st) {
    const int nb = st->l1 - st->l0, N = st->B * st->T, C = st->cfg.C;
    memset(x, 0, sizeof *x);
    x->a = lab_xcalloc((size_t)nb, sizeof(TpBlockActs));
    for (int j = 0; j < nb; j++)
        tp_block_acts_alloc(&x->a[j], st->B, st->T, C, st->cfg.NH, st->tp, DEV_CPU);
    if (st->has_head) tp_head_acts_alloc(&x->h, N, C, &st->tv, DEV_CPU);
    x->in = mem_alloc((size_t)N * C * sizeof(float), MEM_ACTS, DEV_CPU);
    x->dx = mem_alloc((size_t)N * C * sizeof(float), MEM_ACTS, DEV_CPU);
}

void tpm_stage_acts_free(TpStageActs *x, const TpStage *st) {
    for (int j = 0; j < st->l1 - st->l0; j++) tp_block_acts_free(&x->a[j]);
    if (st->has_head) tp_head_acts_free(&x->h);
    mem_free(x->in), mem_free(x->dx);
    free(x->a);
    memset(x, 0, sizeof *x);
}

size_t tpm_stage_act_bytes(const TpStage *st) {
    const size_t N = (size_t)st->B * st->T, C = (size_t)st->cfg.C, t = (size_t)st->tp;
    const size_t att = (size_t)st->B * (size_t)(st->cfg.NH / st->tp) * st->T * st->T;
    // a block: ln1, attproj, residual2, ln2, fcproj, out (N,C); 4 LayerNorm statistics (N);
    // qkv + atty (N,4C/t); preatt, att; fch, fch_gelu (N,4C/t) each
    size_t floats = (size_t)(st->l1 - st->l0) * (6 * N * C + 4 * N + 12 * N * (C / t) + 2 * att);
    // the head: lnf, dlnf (N,C); mean, rstd, losses and the loss's 3 statistics (N); logits and
    // dlogits (N, Vl)
    if (st->has_head) floats += 2 * N * C + 6 * N + 2 * N * (size_t)st->tv.Vl;
    return 4 * (floats + 2 * N * C);  // + in, dx
}

float tpm_stage_forward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets) {
    const Kernels *k = kernels_get(DEV_CPU);
    const int N = st->B * st->T;
    if (st->has_embed)  // the vocab-parallel lookup: one all-reduce of (N, C)
        tp_embed_forward(k, c, &st->tv, x->in, inputs, st->wte, st->wpe, st->B, st->T, st->cfg.C);
    const float *h = x->in;
    for (int j = 0; j < st->l1 - st->l0; j++) {
        tp_block_forward(k, c, &st->w[j], &x->a[j], h);  // the two g all-reduces
        h = x->a[j].out;
    }
    if (!st->has_head) return 0.0f;
    tp_head_forward(k, c, &st->tv, &x->h, h, st->lnfw, st->lnfb, st->wte, targets);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += x->h.losses[i];
    return (float)(sum / N);
}

const float *tpm_stage_output(const TpStage *st, const TpStageActs *x) {
    return st->l1 > st->l0 ? x->a[st->l1 - st->l0 - 1].out : x->in;
}

void tpm_stage_backward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets, float dloss) {
    const Kernels *k = kernels_get(DEV_CPU);
    const int nb = st->l1 - st->l0;
    if (st->has_head)  // from the loss; f at the head's input: one all-reduce of (N, C)
        tp_head_backward(k, c, &st->tv, &x->h, tpm_stage_output(st, x), st->lnfw, st->wte,
                         st->dlnfw, st->dlnfb, st->dwte, targets, dloss, x->dx);
    for (int j = nb - 1; j >= 0; j--)  // the two f all-reduces per block
        tp_block_backward(k, c, &st->w[j], &st->dw[j], &x->a[j], &st->s,
                          j ? x->a[j - 1].out : x->in, x->dx, x->dx);
    if (st->has_embed)
        tp_embed_backward(k, &st->tv, st->dwte, st->dwpe, x->dx, inputs, st->B, st->T, st->cfg.C);
}

void tpm_stage_norm_parts_range(const TpStage *st, size_t lo, size_t hi, const void *gv, double sq[2]) {
    const float *g = gv;
    const Kernels *k = kernels_get(DEV_CPU);
    sq[0] = sq[1] = 0.0;
    for (int i = 0; i < st->nplist; i++) {
        const size_t b = st->plist[i].offset, e = b + st->plist[i].size;
        const size_t from = b > lo ? b : lo, to = e < hi ? e : hi;  // the tensor's part in range
        if (st->tied_copy[i] || from >= to) continue;
        sq[st->sharded[i] ? 0 : 1] += k->sum_squares(g + (from - lo), to - from);
    }
}

void tpm_stage_norm_parts(const TpStage *st, double sq[2]) {
    tpm_stage_norm_parts_range(st, 0, st->n, st->grads, sq);
}

// The views of buf's tensors (a buffer in the stage's layout) at the offsets of st's own.
static float *stage_at(const TpStage *st, const float *buf, const float *view) {
    return view ? (float *)buf + (view - st->params) : NULL;
}

void tpm_stage_unshard_buf(const TpStage *st, const float *buf, float *full_mem, int with_replicated) {
    const GPT2Config *cfg = &st->cfg;
    const size_t C = (size_t)cfg->C;
    for (int j = 0; j < st->l1 - st->l0; j++) {
        TpBlock fb, sb;
        tp_block_of_model(&fb, cfg, full_mem, st->l0 + j);
        tp_block_views(&sb, stage_at(st, buf, st->w[j].ln1w), cfg->C, st->tp);
        tp_block_unshard(&fb, &sb, cfg->C, st->tp, st->r, with_replicated);
    }
    if (st->has_embed) {
        tp_wte_unshard(full_mem + full_offset(cfg, GPT2_WTE), stage_at(st, buf, st->wte), &st->tv, cfg->C);
        if (with_replicated)
            memcpy(full_mem + full_offset(cfg, GPT2_WPE), stage_at(st, buf, st->wpe),
                   (size_t)cfg->T * C * sizeof(float));
    }
    if (st->has_head && with_replicated) {
        memcpy(full_mem + full_offset(cfg, GPT2_LNFW), stage_at(st, buf, st->lnfw), C * sizeof(float));
        memcpy(full_mem + full_offset(cfg, GPT2_LNFB), stage_at(st, buf, st->lnfb), C * sizeof(float));
    }
}

void tpm_stage_unshard(const TpStage *st, float *full_mem, int with_replicated) {
    tpm_stage_unshard_buf(st, st->params, full_mem, with_replicated);
}

void tpm_stage_shard_buf(const TpStage *st, const float *full_mem, float *buf) {
    const GPT2Config *cfg = &st->cfg;
    const size_t C = (size_t)cfg->C;
    for (int j = 0; j < st->l1 - st->l0; j++) {
        TpBlock fb, sb;
        tp_block_of_model(&fb, cfg, (float *)full_mem, st->l0 + j);
        tp_block_views(&sb, stage_at(st, buf, st->w[j].ln1w), cfg->C, st->tp);
        tp_block_shard(&sb, &fb, cfg->C, st->tp, st->r);
    }
    if (st->wte)  // the first stage's rows, or the last stage's copy of the same rows
        tp_wte_shard(stage_at(st, buf, st->wte), full_mem + full_offset(cfg, GPT2_WTE), &st->tv, cfg->C);
    if (st->has_embed)
        memcpy(stage_at(st, buf, st->wpe), full_mem + full_offset(cfg, GPT2_WPE),
               (size_t)cfg->T * C * sizeof(float));
    if (st->has_head) {
        memcpy(stage_at(st, buf, st->lnfw), full_mem + full_offset(cfg, GPT2_LNFW), C * sizeof(float));
        memcpy(stage_at(st, buf, st->lnfb), full_mem + full_offset(cfg, GPT2_LNFB), C * sizeof(float));
    }
}

// ---- API stubs (being implemented) --------------------------------------------------------------
void tpm_build_opts(TpModel *m, GPT2Config cfg, int tp, int r, int B, int T, uint64_t seed, TpOpts o) {
    if (o.dev != DEV_CPU || o.dtype != GPT2_FP32) lab_fail("tpm_build_opts: not yet");
    tpm_build_sp(m, cfg, tp, r, B, T, seed, o.sp);
}
void *tpm_grad_buf(const TpModel *m) { return m->grads; }
DistDtype tpm_dist_dtype(const TpModel *m) { (void)m; return DIST_F32; }
void tpm_poison_grad(TpModel *m) { m->grads[0] = NAN; }
void tpm_master_to_params(TpModel *m) { (void)m; }
size_t tpm_block_act_bytes(const TpModel *m) { return 4 * tpm_block_act_floats(m); }
void tpm_stage_build_opts(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B, int T,
                          uint64_t seed, TpOpts o) {
    if (o.dev != DEV_CPU || o.dtype != GPT2_FP32 || o.sp) lab_fail("tpm_stage_build_opts: not yet");
    tpm_stage_build(st, cfg, tp, r, l0, l1, B, T, seed);
}
size_t tpm_stage_work_act_bytes(const TpStage *st) { (void)st; return 0; }
void *tpm_stage_grad_buf(const TpStage *st) { return st->grads; }
void *tpm_stage_wte_grad(const TpStage *st) { return st->dwte; }
DistDtype tpm_stage_dist_dtype(const TpStage *st) { (void)st; return DIST_F32; }
void tpm_stage_zero_grad(TpStage *st) { memset(st->grads, 0, st->n * sizeof(float)); }
void tpm_stage_poison_grad(TpStage *st) { st->grads[0] = NAN; }
void tpm_stage_adamw_range(TpStage *st, const AdamW *h, int step, size_t lo, size_t hi,
                           const void *grad_shard, float scale) {
    adamw_step(h, kernels_get(DEV_CPU), step, st->params + lo, grad_shard, st->opt_m, st->opt_v, lo, hi,
               st->plist, st->nplist, scale);
}
void tpm_stage_master_to_params(TpStage *st, size_t lo, size_t hi) { (void)st, (void)lo, (void)hi; }
void tpm_to_host_f32(float *host, const void *buf, size_t n, DistDtype type) {
    if (type != DIST_F32) lab_fail("tpm_to_host_f32: not yet");
    mem_copy(host, buf, n * sizeof(float));
}
