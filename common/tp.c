// tp.c: Megatron tensor parallelism's pieces (see tp.h for the split and the picture).
#include "tp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

// ---- communication ------------------------------------------------------------------------------

static const char *site_names[TP_NSITES] = {
    "embed", "attn g", "mlp g", "attn f", "mlp f", "loss max", "loss sumexp", "loss target", "head f", "other",
    "attn f fwd", "mlp f fwd", "attn g bwd", "mlp g bwd", "head f fwd", "embed bwd", "sp grads",
};
const char *tp_site_name(TpSite s) { return s >= 0 && s < TP_NSITES ? site_names[s] : "?"; }

static void group_all_reduce(TpComm *c, float *buf, size_t n, TpOp op, TpSite site) {
    (void)site;
    dist_all_reduce(buf, buf, n, DIST_F32, op == TP_MAX ? DIST_MAX : DIST_SUM, (DistGroup *)c->ctx);
}
static void group_reduce_scatter(TpComm *c, const float *send, float *recv, size_t n, TpSite site) {
    (void)site;
    dist_reduce_scatter(send, recv, n, DIST_F32, DIST_SUM, (DistGroup *)c->ctx);
}
static void group_all_gather(TpComm *c, const float *send, float *recv, size_t n, TpSite site) {
    (void)site;
    dist_all_gather(send, recv, n, DIST_F32, (DistGroup *)c->ctx);
}
TpComm tp_comm_group(DistGroup *g) {
    TpComm c = {.tp = g->size, .rank = g->rank, .all_reduce = group_all_reduce,
                .reduce_scatter = group_reduce_scatter, .all_gather = group_all_gather, .ctx = g};
    return c;
}

static void single_all_reduce(TpComm *c, float *buf, size_t n, TpOp op, TpSite site) {
    (void)c, (void)buf, (void)n, (void)op, (void)site;  // one rank: the sum is the value itself
}
static void single_copy(TpComm *c, const float *send, float *recv, size_t n, TpSite site) {
    (void)c, (void)site;  // one rank: its block is the whole (host or device buffers)
    mem_copy(recv, send, n * sizeof(float));
}
TpComm tp_comm_single(void) {
    TpComm c = {.tp = 1, .rank = 0, .all_reduce = single_all_reduce, .reduce_scatter = single_copy,
                .all_gather = single_copy};
    return c;
}

void tp_all_reduce(TpComm *c, float *buf, size_t n, TpOp op, TpSite site) {
    LAB_CHECK(site >= 0 && site < TP_NSITES, "tp_all_reduce: bad site %d", (int)site);
    c->calls[site]++;
    c->floats[site] += n;
    c->all_reduce(c, buf, n, op, site);
}

void tp_check_config(const GPT2Config *cfg, int tp) {
    if (tp < 1) lab_fail_collective("tensor-parallel degree %d: it must be >= 1", tp);
    if (cfg->NH % tp != 0) {
        char valid[128] = "";
        size_t len = 0;
        for (int d = 1; d <= cfg->NH && len + 12 < sizeof valid; d++)
            if (cfg->NH % d == 0) len += (size_t)snprintf(valid + len, sizeof valid - len, "%s%d", len ? ", " : "", d);
        lab_fail_collective("tensor-parallel degree %d does not divide the %d heads (each rank "
                            "holds whole heads): valid degrees for NH=%d are %s",
                            tp, cfg->NH, cfg->NH, valid);
    }
}

// ---- a block's shard --------------------------------------------------------------------------------

// Block tensor i (TpBlock's field order) is gpt2's tensor kind GPT2_LN1W + i; the sharded ones:
enum {
    QKVW = GPT2_QKVW - GPT2_LN1W, QKVB = GPT2_QKVB - GPT2_LN1W, ATTPROJW = GPT2_ATTPROJW - GPT2_LN1W,
    FCW = GPT2_FCW - GPT2_LN1W, FCB = GPT2_FCB - GPT2_LN1W, FCPROJW = GPT2_FCPROJW - GPT2_LN1W,
};
static float **field(TpBlock *v, int i) { return &v->ln1w + i; }
static float *cfield(const TpBlock *v, int i) { return (&v->ln1w)[i]; }

GPT2BlockDims tp_block_dims(int C, int NH, int tp) {
    LAB_CHECK(tp >= 1 && C % tp == 0 && NH % tp == 0, "tp_block_dims: C=%d NH=%d do not split over tp=%d", C, NH, tp);
    GPT2BlockDims d = {.C = C, .NH = NH / tp, .ATT = C / tp, .FC = 4 * C / tp};
    return d;
}

// The layout is gpt2's (gpt2_block_layout), at the shard's widths; NH does not enter it.
static GPT2BlockDims layout_dims(int C, int tp) {
    LAB_CHECK(tp >= 1 && C % tp == 0, "tp: C=%d is not divisible by tp=%d", C, tp);
    GPT2BlockDims d = {.C = C, .NH = 0, .ATT = C / tp, .FC = 4 * C / tp};
    return d;
}

void tp_block_sizes(int C, int tp, size_t sizes[TP_BLOCK_TENSORS]) {
    GPT2BlockDims d = layout_dims(C, tp);
    gpt2_block_layout(&d, NULL, sizes);
}

size_t tp_block_count(int C, int tp) {
    GPT2BlockDims d = layout_dims(C, tp);
    return gpt2_block_layout(&d, NULL, NULL);
}

void tp_block_views(TpBlock *v, float *base, int C, int tp) {
    GPT2BlockDims d = layout_dims(C, tp);
    *v = gpt2_block_weights(&d, base);
}

// Offsets of block l's 12 tensors in the model's flat buffer, from gpt2_params.
static void block_offsets(const GPT2Config *cfg, int l, size_t off[TP_BLOCK_TENSORS]) {
    int n = gpt2_params(cfg, NULL);
    GPT2Param *list = lab_xmalloc((size_t)n * sizeof *list);
    gpt2_params(cfg, list);
    for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
        off[i] = SIZE_MAX;
        for (int j = 0; j < n; j++)
            if (list[j].layer == l && list[j].tensor == GPT2_LN1W + i) off[i] = list[j].offset;
        LAB_CHECK(off[i] != SIZE_MAX, "no h.%d.%s in the model (L=%d)", l, gpt2_tensor_name(GPT2_LN1W + i), cfg->L);
    }
    free(list);
}

void tp_block_of_model(TpBlock *v, const GPT2Config *cfg, float *params, int l) {
    size_t off[TP_BLOCK_TENSORS];
    block_offsets(cfg, l, off);
    for (int i = 0; i < TP_BLOCK_TENSORS; i++) *field(v, i) = params + off[i];
}

// The sharded tensors are one of two kinds, and each kind is a set of contiguous runs:
//   row slices (column-parallel): rows [lo, lo + rows) of a (R, in) matrix or an (R) bias;
//     qkvw / qkvb have three (Q, K, V), fcw / fcb one;
//   column slices (row-parallel): columns [r·w, (r+1)·w) of each of the C rows of a (C, tp·w)
//     matrix: attprojw (w = Cl), fcprojw (w = Hl).
// run(i, j, ...) gives the j-th run of tensor i as (offset in the full tensor, offset in the
// shard, length); it returns 0 when tensor i has no j-th run. Replicated tensors: one run, all.
typedef struct { size_t full, shard, n; } Run;
static int run(int i, size_t j, int C, int tp, int r, Run *out) {
    size_t c = (size_t)C, cl = c / (size_t)tp, hl = 4 * c / (size_t)tp, rr = (size_t)r;
    switch (i) {
    case QKVW: case QKVB: {  // qkvw (3C, C) / qkvb (3C): rows j·C + [r·Cl, (r+1)·Cl), j = Q, K, V
        size_t in = i == QKVW ? c : 1;
        if (j >= 3) return 0;
        *out = (Run){(j * c + rr * cl) * in, j * cl * in, cl * in};
        return 1;
    }
    case FCW: case FCB: {  // fcw (4C, C) / fcb (4C): rows [r·Hl, (r+1)·Hl)
        size_t in = i == FCW ? c : 1;
        if (j >= 1) return 0;
        *out = (Run){rr * hl * in, 0, hl * in};
        return 1;
    }
    case ATTPROJW: case FCPROJW: {  // attprojw (C, C) / fcprojw (C, 4C): row j's columns of rank r
        size_t w = i == ATTPROJW ? cl : hl;
        if (j >= c) return 0;
        *out = (Run){j * w * (size_t)tp + rr * w, j * w, w};
        return 1;
    }
    default:  // replicated (C)
        if (j >= 1) return 0;
        *out = (Run){0, 0, c};
        return 1;
    }
}
static int is_replicated(int i) {
    return !(i == QKVW || i == QKVB || i == ATTPROJW || i == FCW || i == FCB || i == FCPROJW);
}

void tp_block_shard(TpBlock *shard, const TpBlock *full, int C, int tp, int r) {
    LAB_CHECK(r >= 0 && r < tp, "tp_block_shard: rank %d outside [0, %d)", r, tp);
    Run u;
    for (int i = 0; i < TP_BLOCK_TENSORS; i++)
        for (size_t j = 0; run(i, j, C, tp, r, &u); j++)
            memcpy(cfield(shard, i) + u.shard, cfield(full, i) + u.full, u.n * sizeof(float));
}

void tp_block_unshard(TpBlock *full, const TpBlock *shard, int C, int tp, int r, int with_replicated) {
    LAB_CHECK(r >= 0 && r < tp, "tp_block_unshard: rank %d outside [0, %d)", r, tp);
    Run u;
    for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
        if (is_replicated(i) && !with_replicated) continue;
        for (size_t j = 0; run(i, j, C, tp, r, &u); j++)
            memcpy(cfield(full, i) + u.full, cfield(shard, i) + u.shard, u.n * sizeof(float));
    }
}

void tp_block_init(TpBlock *shard, const GPT2Config *cfg, uint64_t seed, int l, int tp, int r) {
    tp_check_config(cfg, tp);
    size_t off[TP_BLOCK_TENSORS];  // where block l's tensors start in the full model
    block_offsets(cfg, l, off);
    Run u;
    for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
        size_t base = off[i];
        for (size_t j = 0; run(i, j, cfg->C, tp, r, &u); j++)
            gpt2_init_slice(cfg, seed, base + u.full, base + u.full + u.n, cfield(shard, i) + u.shard);
    }
}

// ---- a block's activations ------------------------------------------------------------------------

// Carves n floats off *at (for the one-allocation structs below).
static float *take(float **at, size_t n) {
    float *p = *at;
    *at += n;
    return p;
}

// The saved set of a block, carved from one allocation. Nr: the rows of the stream's own
// tensors (residual2, out, the LayerNorm statistics): N, or N/t under sequence parallelism;
// partial: NULL (attproj and fcproj are the block's own (N,C)), or a shared (N,C) buffer.
static void acts_carve(TpBlockActs *a, int B, int T, int C, int NH, int tp, size_t Nr, float *partial,
                       Device dev) {
    size_t N = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, hl = 4 * c / (size_t)tp;
    size_t att = (size_t)B * (size_t)(NH / tp) * T * T;
    size_t total = 2 * N * c + 4 * Nr + 4 * N * cl + 2 * att + 2 * Nr * c + 2 * N * hl + (partial ? 0 : 2 * N * c);
    memset(a, 0, sizeof *a);
    a->B = B, a->T = T, a->C = C, a->NH = NH, a->tp = tp;
    a->mem = mem_alloc(total * sizeof(float), MEM_ACTS, dev);
    float *at = a->mem;
    a->ln1 = take(&at, N * c), a->ln1_mean = take(&at, Nr), a->ln1_rstd = take(&at, Nr);
    a->qkv = take(&at, 3 * N * cl), a->atty = take(&at, N * cl);
    a->preatt = take(&at, att), a->att = take(&at, att);
    a->attproj = partial ? partial : take(&at, N * c);
    a->residual2 = take(&at, Nr * c);
    a->ln2 = take(&at, N * c), a->ln2_mean = take(&at, Nr), a->ln2_rstd = take(&at, Nr);
    a->fch = take(&at, N * hl), a->fch_gelu = take(&at, N * hl);
    a->fcproj = partial ? partial : take(&at, N * c);
    a->out = take(&at, Nr * c);
    LAB_CHECK(at == a->mem + total, "tp_block_acts_alloc: sizes do not add up");
}

void tp_block_acts_alloc(TpBlockActs *a, int B, int T, int C, int NH, int tp, Device dev) {
    LAB_CHECK(NH % tp == 0 && C % NH == 0, "tp_block_acts_alloc: C=%d NH=%d tp=%d do not split", C, NH, tp);
    acts_carve(a, B, T, C, NH, tp, (size_t)B * T, NULL, dev);
}
void tp_block_acts_free(TpBlockActs *a) {
    mem_free(a->mem);
    memset(a, 0, sizeof *a);
}

// One block's backward scratch, carved from one allocation; sp: dresidual2 on N/t rows, and
// the SP buffers (full, dlnl, partial).
static void scratch_carve(TpScratch *s, int B, int T, int C, int NH, int tp, int sp, Device dev) {
    size_t N = (size_t)B * T, Nr = sp ? N / (size_t)tp : N, c = (size_t)C, cl = c / (size_t)tp, hl = 4 * c / (size_t)tp;
    size_t att = (size_t)B * (size_t)(NH / tp) * T * T;
    size_t total = N * c + Nr * c + 4 * N * cl + 2 * att + 2 * N * hl + (sp ? 2 * N * c + Nr * c : 0);
    memset(s, 0, sizeof *s);
    s->mem = mem_alloc(total * sizeof(float), MEM_ACTS, dev);
    float *at = s->mem;
    s->dln = take(&at, N * c), s->dresidual2 = take(&at, Nr * c);
    s->dqkv = take(&at, 3 * N * cl), s->datty = take(&at, N * cl);
    s->dpreatt = take(&at, att), s->datt = take(&at, att);
    s->dfch = take(&at, N * hl), s->dfch_gelu = take(&at, N * hl);
    if (sp) s->full = take(&at, N * c), s->dlnl = take(&at, Nr * c), s->partial = take(&at, N * c);
    LAB_CHECK(at == s->mem + total, "tp_scratch_alloc: sizes do not add up");
}
void tp_scratch_alloc(TpScratch *s, int B, int T, int C, int NH, int tp, Device dev) {
    scratch_carve(s, B, T, C, NH, tp, 0, dev);
}
void tp_scratch_free(TpScratch *s) {
    mem_free(s->mem);
    memset(s, 0, sizeof *s);
}

// ---- the halves ------------------------------------------------------------------------------------

void tp_attn_forward(const Kernels *k, const TpBlock *w, TpBlockActs *a, const float *inp) {
    int N = a->B * a->T, C = a->C, Cl = C / a->tp, NHl = a->NH / a->tp;
    // column-parallel: q, k, v of this rank's heads, (N,3Cl) rows [Q_r; K_r; V_r]
    k->matmul_forward(a->qkv, inp, w->qkvw, w->qkvb, N, C, 3 * Cl);
    // Cl channels of NHl heads: the head size Cl/NHl = C/NH, so the scale is the full model's
    k->attention_forward(a->atty, a->preatt, a->att, a->qkv, a->B, a->T, Cl, NHl);
    // row-parallel: this rank's columns of the projection, a partial sum, no bias
    k->matmul_forward(a->attproj, a->atty, w->attprojw, NULL, N, Cl, C);
}

void tp_attn_backward(const Kernels *k, const TpBlock *w, TpBlock *dw, const TpBlockActs *a,
                      TpScratch *s, const float *inp, const float *dout, float *dinp) {
    int N = a->B * a->T, C = a->C, Cl = C / a->tp, NHl = a->NH / a->tp;
    k->matmul_backward(s->datty, dw->attprojw, NULL, dout, a->atty, w->attprojw, N, Cl, C);
    k->attention_backward(s->dqkv, s->dpreatt, s->datt, s->datty, a->qkv, a->att, a->B, a->T, Cl, NHl);
    k->matmul_backward(dinp, dw->qkvw, dw->qkvb, s->dqkv, inp, w->qkvw, N, C, 3 * Cl);
}

void tp_mlp_forward(const Kernels *k, const TpBlock *w, TpBlockActs *a, const float *inp) {
    int N = a->B * a->T, C = a->C, Hl = 4 * C / a->tp;
    k->matmul_forward(a->fch, inp, w->fcw, w->fcb, N, C, Hl);       // column-parallel
    k->gelu_forward(a->fch_gelu, a->fch, (size_t)N * Hl);
    k->matmul_forward(a->fcproj, a->fch_gelu, w->fcprojw, NULL, N, Hl, C);  // row-parallel, partial
}

void tp_mlp_backward(const Kernels *k, const TpBlock *w, TpBlock *dw, const TpBlockActs *a,
                     TpScratch *s, const float *inp, const float *dout, float *dinp) {
    int N = a->B * a->T, C = a->C, Hl = 4 * C / a->tp;
    // EXERCISE 07.2 Column and row parallel MLP backward -> 07_tensor_parallel/README.md#exercise-072-column-and-row-parallel-mlp-backward
    k->matmul_backward(s->dfch_gelu, dw->fcprojw, NULL, dout, a->fch_gelu, w->fcprojw, N, Hl, C);
    k->gelu_backward(s->dfch, a->fch, s->dfch_gelu, (size_t)N * Hl);
    k->matmul_backward(dinp, dw->fcw, dw->fcb, s->dfch, inp, w->fcw, N, C, Hl);
    // END EXERCISE 07.2
}

// ---- the block --------------------------------------------------------------------------------------

void tp_block_forward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlockActs *a, const float *inp) {
    LAB_CHECK(c->tp == a->tp, "tp_block_forward: activations for tp=%d on a group of %d", a->tp, c->tp);
    int N = a->B * a->T, C = a->C;
    size_t NC = (size_t)N * C;
    // EXERCISE 07.1 The TP block forward and its g all-reduces -> 07_tensor_parallel/README.md#exercise-071-the-tp-block-forward-and-its-g-all-reduces
    k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, inp, w->ln1w, w->ln1b, N, C);
    tp_attn_forward(k, w, a, a->ln1);                            // f: identity forward
    tp_all_reduce(c, a->attproj, NC, TP_SUM, TP_SITE_ATTN_G);    // g
    k->tp_bias_residual_forward(a->residual2, inp, a->attproj, w->attprojb, N, C);
    k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2w, w->ln2b, N, C);
    tp_mlp_forward(k, w, a, a->ln2);
    tp_all_reduce(c, a->fcproj, NC, TP_SUM, TP_SITE_MLP_G);
    k->tp_bias_residual_forward(a->out, a->residual2, a->fcproj, w->fcprojb, N, C);
    // END EXERCISE 07.1
}

void tp_block_backward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlock *dw,
                       const TpBlockActs *a, TpScratch *s, const float *inp, const float *dout,
                       float *dinp) {
    int N = a->B * a->T, C = a->C;
    size_t NC = (size_t)N * C;
    // MLP half. g's backward is the identity: dout (replicated) reaches fcproj and its bias.
    k->matmul_backward(NULL, NULL, dw->fcprojb, dout, NULL, NULL, N, 0, C);
    tp_mlp_backward(k, w, dw, a, s, a->ln2, dout, s->dln);
    tp_all_reduce(c, s->dln, NC, TP_SUM, TP_SITE_MLP_F);         // f: the partial d ln2 -> whole
    k->layernorm_backward(s->dresidual2, dw->ln2w, dw->ln2b, s->dln, dout, a->residual2, w->ln2w,
                          a->ln2_mean, a->ln2_rstd, N, C);
    // attention half
    k->matmul_backward(NULL, NULL, dw->attprojb, s->dresidual2, NULL, NULL, N, 0, C);
    tp_attn_backward(k, w, dw, a, s, a->ln1, s->dresidual2, s->dln);
    tp_all_reduce(c, s->dln, NC, TP_SUM, TP_SITE_ATTN_F);
    k->layernorm_backward(dinp, dw->ln1w, dw->ln1b, s->dln, s->dresidual2, inp, w->ln1w,
                          a->ln1_mean, a->ln1_rstd, N, C);
}

// ---- the vocabulary ---------------------------------------------------------------------------------

TpVocab tp_vocab(int V, int tp, int r) {
    LAB_CHECK(V >= 1 && tp >= 1 && r >= 0 && r < tp, "tp_vocab: V=%d tp=%d r=%d", V, tp, r);
    TpVocab tv;
    tv.V = V;
    tv.Vp = (V + tp - 1) / tp * tp;  // padded up to a multiple of tp
    tv.Vl = tv.Vp / tp;
    tv.v0 = r * tv.Vl;
    int real = V - tv.v0;            // this rank's real rows: the rest of its range is padding
    tv.nvalid = real < 0 ? 0 : real > tv.Vl ? tv.Vl : real;
    return tv;
}

void tp_wte_shard(float *wte_local, const float *wte, const TpVocab *tv, int C) {
    size_t c = (size_t)C;
    memcpy(wte_local, wte + (size_t)tv->v0 * c, (size_t)tv->nvalid * c * sizeof(float));
    memset(wte_local + (size_t)tv->nvalid * c, 0, (size_t)(tv->Vl - tv->nvalid) * c * sizeof(float));
}

void tp_wte_unshard(float *wte, const float *wte_local, const TpVocab *tv, int C) {
    size_t c = (size_t)C;
    memcpy(wte + (size_t)tv->v0 * c, wte_local, (size_t)tv->nvalid * c * sizeof(float));
}

void tp_wte_init(float *wte_local, const GPT2Config *cfg, uint64_t seed, const TpVocab *tv) {
    int n = gpt2_params(cfg, NULL);
    GPT2Param *list = lab_xmalloc((size_t)n * sizeof *list);
    gpt2_params(cfg, list);
    size_t base = SIZE_MAX, c = (size_t)cfg->C;
    for (int j = 0; j < n; j++)
        if (list[j].tensor == GPT2_WTE) base = list[j].offset;
    free(list);
    LAB_CHECK(base != SIZE_MAX, "tp_wte_init: the model has no wte");
    size_t lo = base + (size_t)tv->v0 * c;
    gpt2_init_slice(cfg, seed, lo, lo + (size_t)tv->nvalid * c, wte_local);
    memset(wte_local + (size_t)tv->nvalid * c, 0, (size_t)(tv->Vl - tv->nvalid) * c * sizeof(float));
}

void tp_embed_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *out, const int *inp,
                      const float *wte_local, const float *wpe, int B, int T, int C) {
    // wpe on rank 0 only: the sum over the group then has it once. Every other term is the
    // owning rank's row or an exact 0, so the sum is wte[inp] + wpe[t] bit for bit.
    k->vocab_embed_forward(out, inp, wte_local, c->rank == 0 ? wpe : NULL, tv->v0, tv->Vl, B, T, C);
    tp_all_reduce(c, out, (size_t)B * T * C, TP_SUM, TP_SITE_EMBED);
}

void tp_embed_backward(const Kernels *k, const TpVocab *tv, float *dwte_local, float *dwpe,
                       const float *dout, const int *inp, int B, int T, int C) {
    k->vocab_embed_backward(dwte_local, dwpe, dout, inp, tv->v0, tv->Vl, B, T, C);
}

void tp_loss_stats_alloc(TpLossStats *st, int N, Device dev) {
    st->mem = mem_alloc(3 * (size_t)N * sizeof(float), MEM_ACTS, dev);
    st->maxes = st->mem, st->sums = st->mem + N, st->tlogits = st->mem + 2 * (size_t)N;
}
void tp_loss_stats_free(TpLossStats *st) {
    mem_free(st->mem);
    memset(st, 0, sizeof *st);
}

void tp_crossentropy_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *losses,
                             TpLossStats *st, const float *logits, const int *targets, int N) {
    // 1. the global max (so that no exp overflows on any rank), 2. Σ exp(logit - max) over the
    // whole vocabulary, 3. the target's logit, which one rank has (the others add 0).
    // EXERCISE 07.3 Vocab parallel cross entropy -> 07_tensor_parallel/README.md#exercise-073-vocab-parallel-cross-entropy
    k->vocab_ce_max(st->maxes, logits, tv->nvalid, N, tv->Vl);
    tp_all_reduce(c, st->maxes, (size_t)N, TP_MAX, TP_SITE_CE_MAX);
    k->vocab_ce_sums(st->sums, st->tlogits, logits, st->maxes, targets, tv->v0, tv->nvalid, N, tv->Vl);
    tp_all_reduce(c, st->sums, (size_t)N, TP_SUM, TP_SITE_CE_SUMEXP);
    tp_all_reduce(c, st->tlogits, (size_t)N, TP_SUM, TP_SITE_CE_TARGET);
    // -log softmax_target = log Σ exp(logit - max) + max - logit_target
    k->vocab_ce_loss(losses, st->sums, st->maxes, st->tlogits, N);
    // END EXERCISE 07.3
}

void tp_crossentropy_backward(const Kernels *k, const TpVocab *tv, float *dlogits,
                              const TpLossStats *st, const float *logits, const int *targets,
                              float dloss, int N) {
    k->vocab_ce_backward(dlogits, logits, st->maxes, st->sums, targets, dloss, tv->v0, tv->nvalid, N, tv->Vl);
}

// ---- the head ---------------------------------------------------------------------------------------

void tp_head_acts_alloc(TpHeadActs *h, int N, int C, const TpVocab *tv, Device dev) {
    size_t n = (size_t)N, c = (size_t)C, vl = (size_t)tv->Vl;
    size_t total = 2 * n * c + 3 * n + 2 * n * vl;
    memset(h, 0, sizeof *h);
    h->N = N, h->C = C;
    h->mem = mem_alloc(total * sizeof(float), MEM_ACTS, dev);
    float *at = h->mem;
    h->lnf = take(&at, n * c), h->lnf_mean = take(&at, n), h->lnf_rstd = take(&at, n);
    h->logits = take(&at, n * vl), h->dlogits = take(&at, n * vl);
    h->losses = take(&at, n), h->dlnf = take(&at, n * c);
    LAB_CHECK(at == h->mem + total, "tp_head_acts_alloc: sizes do not add up");
    tp_loss_stats_alloc(&h->st, N, dev);
}
void tp_head_acts_free(TpHeadActs *h) {
    tp_loss_stats_free(&h->st);
    mem_free(h->mem);
    memset(h, 0, sizeof *h);
}

void tp_head_forward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                     const float *lnfw, const float *lnfb, const float *wte_local, const int *targets) {
    int N = h->N, C = h->C;
    k->layernorm_forward(h->lnf, h->lnf_mean, h->lnf_rstd, x, lnfw, lnfb, N, C);
    k->matmul_forward(h->logits, h->lnf, wte_local, NULL, N, C, tv->Vl);  // column-parallel (tied wte)
    tp_crossentropy_forward(k, c, tv, h->losses, &h->st, h->logits, targets, N);
}

void tp_head_backward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                      const float *lnfw, const float *wte_local, float *dlnfw, float *dlnfb,
                      float *dwte_local, const int *targets, float dloss, float *dx) {
    int N = h->N, C = h->C;
    tp_crossentropy_backward(k, tv, h->dlogits, &h->st, h->logits, targets, dloss, N);
    k->matmul_backward(h->dlnf, dwte_local, NULL, h->dlogits, h->lnf, wte_local, N, C, tv->Vl);
    tp_all_reduce(c, h->dlnf, (size_t)N * C, TP_SUM, TP_SITE_HEAD_F);  // this rank's columns only
    k->layernorm_backward(dx, dlnfw, dlnfb, h->dlnf, NULL, x, lnfw, h->lnf_mean, h->lnf_rstd, N, C);
}

// ---- sequence parallelism ------------------------------------------------------------------------

void tp_check_sequence_parallel(int T, int tp) {
    if (tp >= 1 && T % tp != 0)
        lab_fail_collective("--sequence-parallel splits each sequence of T=%d positions over the "
                            "%d ranks of a TP group: T must be a multiple of %d (e.g. --seq %d)",
                            T, tp, tp, (T / tp + 1) * tp);
}

// One call per sequence: sequence b's (T,C) block is contiguous, and its t blocks of T/t
// positions are the ranks' parts (block r: positions [r·T/t, (r+1)·T/t)).
void tp_seq_reduce_scatter(TpComm *c, const float *full, float *local, int B, int T, int C, TpSite site) {
    LAB_CHECK(site >= 0 && site < TP_NSITES && T % c->tp == 0, "tp_seq_reduce_scatter: site %d, T=%d tp=%d",
              (int)site, T, c->tp);
    const size_t per = (size_t)(T / c->tp) * C;  // one rank's positions of one sequence
    c->calls[site]++;
    c->floats[site] += (size_t)B * T * C;
    for (int b = 0; b < B; b++)
        c->reduce_scatter(c, full + (size_t)b * T * C, local + (size_t)b * per, per, site);
}

void tp_seq_all_gather(TpComm *c, const float *local, float *full, int B, int T, int C, TpSite site) {
    LAB_CHECK(site >= 0 && site < TP_NSITES && T % c->tp == 0, "tp_seq_all_gather: site %d, T=%d tp=%d",
              (int)site, T, c->tp);
    // EXERCISE 07.4 The f operator under sequence parallelism -> 07_tensor_parallel/README.md#exercise-074-the-f-operator-under-sequence-parallelism
    const size_t per = (size_t)(T / c->tp) * C;  // one rank's positions of one sequence
    c->calls[site]++;
    c->floats[site] += (size_t)B * T * C;        // counted as the whole tensor, once
    for (int b = 0; b < B; b++)                  // sequence b: its t blocks at their places
        c->all_gather(c, local + (size_t)b * per, full + (size_t)b * T * C, per, site);
    // END EXERCISE 07.4
}

void tp_sp_block_acts_alloc(TpBlockActs *a, int B, int T, int C, int NH, int tp, float *partial, Device dev) {
    LAB_CHECK(NH % tp == 0 && C % NH == 0 && T % tp == 0 && partial, "tp_sp_block_acts_alloc: C=%d NH=%d "
              "T=%d tp=%d do not split (or no partial buffer)", C, NH, T, tp);
    acts_carve(a, B, T, C, NH, tp, (size_t)B * T / (size_t)tp, partial, dev);
}

void tp_sp_scratch_alloc(TpScratch *s, int B, int T, int C, int NH, int tp, Device dev) {
    LAB_CHECK(T % tp == 0, "tp_sp_scratch_alloc: T=%d tp=%d", T, tp);
    scratch_carve(s, B, T, C, NH, tp, 1, dev);
}

void tp_sp_block_forward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlockActs *a, TpScratch *s,
                         const float *inp) {
    LAB_CHECK(c->tp == a->tp, "tp_sp_block_forward: activations for tp=%d on a group of %d", a->tp, c->tp);
    const int B = a->B, T = a->T, C = a->C, Nl = B * T / a->tp;
    // attention half: ln1 on this rank's positions, f = all-gather, the heads, g = reduce-scatter
    k->layernorm_forward(s->partial, a->ln1_mean, a->ln1_rstd, inp, w->ln1w, w->ln1b, Nl, C);
    tp_seq_all_gather(c, s->partial, a->ln1, B, T, C, TP_SITE_ATTN_F_FWD);          // f
    tp_attn_forward(k, w, a, a->ln1);                        // a->attproj (= s->partial): partial
    tp_seq_reduce_scatter(c, a->attproj, a->residual2, B, T, C, TP_SITE_ATTN_G);    // g
    k->tp_bias_residual_forward(a->residual2, inp, a->residual2, w->attprojb, Nl, C);
    // MLP half, the same way
    k->layernorm_forward(s->partial, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2w, w->ln2b, Nl, C);
    tp_seq_all_gather(c, s->partial, a->ln2, B, T, C, TP_SITE_MLP_F_FWD);
    tp_mlp_forward(k, w, a, a->ln2);
    tp_seq_reduce_scatter(c, a->fcproj, a->out, B, T, C, TP_SITE_MLP_G);
    k->tp_bias_residual_forward(a->out, a->residual2, a->out, w->fcprojb, Nl, C);
}

void tp_sp_block_backward(const Kernels *k, TpComm *c, const TpBlock *w, TpBlock *dw,
                          const TpBlockActs *a, TpScratch *s, const float *inp, const float *dout,
                          float *dinp) {
    const int B = a->B, T = a->T, C = a->C, Nl = B * T / a->tp;
    // MLP half. The bias saw this rank's positions only: a partial gradient (summed by the caller).
    k->matmul_backward(NULL, NULL, dw->fcprojb, dout, NULL, NULL, Nl, 0, C);
    tp_seq_all_gather(c, dout, s->full, B, T, C, TP_SITE_MLP_G_BWD);    // g's backward
    tp_mlp_backward(k, w, dw, a, s, a->ln2, s->full, s->dln);           // d ln2 (N,C): partial
    tp_seq_reduce_scatter(c, s->dln, s->dlnl, B, T, C, TP_SITE_MLP_F);  // f's backward
    k->layernorm_backward(s->dresidual2, dw->ln2w, dw->ln2b, s->dlnl, dout, a->residual2, w->ln2w,
                          a->ln2_mean, a->ln2_rstd, Nl, C);
    // attention half
    k->matmul_backward(NULL, NULL, dw->attprojb, s->dresidual2, NULL, NULL, Nl, 0, C);
    tp_seq_all_gather(c, s->dresidual2, s->full, B, T, C, TP_SITE_ATTN_G_BWD);
    tp_attn_backward(k, w, dw, a, s, a->ln1, s->full, s->dln);
    tp_seq_reduce_scatter(c, s->dln, s->dlnl, B, T, C, TP_SITE_ATTN_F);
    k->layernorm_backward(dinp, dw->ln1w, dw->ln1b, s->dlnl, s->dresidual2, inp, w->ln1w,
                          a->ln1_mean, a->ln1_rstd, Nl, C);
}

void tp_sp_embed_forward(const Kernels *k, TpComm *c, const TpVocab *tv, float *out, float *full,
                         const int *inp, const float *wte_local, const float *wpe, int B, int T, int C) {
    k->vocab_embed_forward(full, inp, wte_local, c->rank == 0 ? wpe : NULL, tv->v0, tv->Vl, B, T, C);
    tp_seq_reduce_scatter(c, full, out, B, T, C, TP_SITE_EMBED);
}

void tp_sp_head_acts_alloc(TpHeadActs *h, int B, int T, int C, int tp, const TpVocab *tv, Device dev) {
    LAB_CHECK(T % tp == 0, "tp_sp_head_acts_alloc: T=%d tp=%d", T, tp);
    size_t n = (size_t)B * T, nl = n / (size_t)tp, c = (size_t)C, vl = (size_t)tv->Vl;
    size_t total = 2 * n * c + nl * c + 2 * nl + n + 2 * n * vl;
    memset(h, 0, sizeof *h);
    h->N = B * T, h->C = C, h->B = B, h->T = T, h->tp = tp;
    h->mem = mem_alloc(total * sizeof(float), MEM_ACTS, dev);
    float *at = h->mem;
    h->lnf = take(&at, n * c), h->lnfl = take(&at, nl * c);
    h->lnf_mean = take(&at, nl), h->lnf_rstd = take(&at, nl);
    h->logits = take(&at, n * vl), h->dlogits = take(&at, n * vl);
    h->losses = take(&at, n), h->dlnf = take(&at, n * c);
    LAB_CHECK(at == h->mem + total, "tp_sp_head_acts_alloc: sizes do not add up");
    tp_loss_stats_alloc(&h->st, h->N, dev);
}

void tp_sp_head_forward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                        const float *lnfw, const float *lnfb, const float *wte_local, const int *targets) {
    const int N = h->N, C = h->C, Nl = N / h->tp;
    k->layernorm_forward(h->lnfl, h->lnf_mean, h->lnf_rstd, x, lnfw, lnfb, Nl, C);
    tp_seq_all_gather(c, h->lnfl, h->lnf, h->B, h->T, C, TP_SITE_HEAD_F_FWD);  // f
    k->matmul_forward(h->logits, h->lnf, wte_local, NULL, N, C, tv->Vl);
    tp_crossentropy_forward(k, c, tv, h->losses, &h->st, h->logits, targets, N);
}

void tp_sp_head_backward(const Kernels *k, TpComm *c, const TpVocab *tv, TpHeadActs *h, const float *x,
                         const float *lnfw, const float *wte_local, float *dlnfw, float *dlnfb,
                         float *dwte_local, const int *targets, float dloss, float *dx) {
    const int N = h->N, C = h->C, Nl = N / h->tp;
    tp_crossentropy_backward(k, tv, h->dlogits, &h->st, h->logits, targets, dloss, N);
    k->matmul_backward(h->dlnf, dwte_local, NULL, h->dlogits, h->lnf, wte_local, N, C, tv->Vl);
    tp_seq_reduce_scatter(c, h->dlnf, h->lnfl, h->B, h->T, C, TP_SITE_HEAD_F);  // f's backward
    k->layernorm_backward(dx, dlnfw, dlnfb, h->lnfl, NULL, x, lnfw, h->lnf_mean, h->lnf_rstd, Nl, C);
}
