// tp.c: Megatron tensor parallelism on a GPT2 slice (see tp.h for the split and the picture).
#include "tp.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"
#include "optim.h"
#include "train.h"

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

// ---- the slice's shapes ----------------------------------------------------------------------------

// t = 1 without SP: the slice is the whole tensors and gpt2.c's own pieces run it (tp.h's top).
static int own_path(const GPT2 *m) { return m->tp == 1 && !m->sp; }

// What one block saves, and the scratch, as element counts of a shape (N = B·T positions; the
// stream's own tensors on Nr rows: N, or N/t under sequence parallelism).
typedef struct Sizes {
    size_t N, Nr, C, Cl, Hl, att, Vl;
} Sizes;
static Sizes sizes_of(const GPT2Config *cfg, TpShape s) {
    const size_t N = (size_t)s.B * (size_t)s.T, t = (size_t)s.tp;
    Sizes z = {N, s.sp ? N / t : N, (size_t)cfg->C, (size_t)cfg->C / t, 4 * (size_t)cfg->C / t,
               (size_t)s.B * (size_t)(cfg->NH / s.tp) * (size_t)s.T * (size_t)s.T,
               (size_t)tp_vocab(cfg->V, s.tp, s.r).Vl};
    return z;
}

// Carves n floats off *at.
static float *take(float **at, size_t n) {
    float *p = *at;
    *at += n;
    return p;
}

// One block's saved tensors, in ActTensors' order (ln1 .. residual3): ln1, ln2 (N,C) (under SP
// the GATHERED LayerNorm outputs, kept so backward needs no second all-gather), the LayerNorm
// statistics (Nr), qkv, atty (N,3Cl), (N,Cl), preatt, att (B,NHl,T,T), fch, fch_gelu (N,Hl),
// residual2 and the output (Nr,C); attproj and fcproj (N,C) the partial sums, except under SP,
// where they live in the scratch's one `partial` (NULL here: backward never reads them).
static size_t layer_elems(const Sizes *z, int sp) {
    return 2 * z->N * z->C + 4 * z->Nr + 4 * z->N * z->Cl + 2 * z->att + 2 * z->Nr * z->C +
           2 * z->N * z->Hl + (sp ? 0 : 2 * z->N * z->C);
}
// What a block's set keeps of it under recomputation r (tp.h, tp_build): selective all but
// preatt and att, full its output only (Nr,C); the rest is the one recompute layer.
static size_t kept_elems(const Sizes *z, int sp, GPT2Recompute r) {
    if (r == GPT2_RECOMPUTE_FULL) return z->Nr * z->C;
    return layer_elems(z, sp) - (r == GPT2_RECOMPUTE_SELECTIVE ? 2 * z->att : 0);
}
static size_t rc_elems(const Sizes *z, int sp, GPT2Recompute r) {
    return r == GPT2_RECOMPUTE_NONE ? 0 : layer_elems(z, sp) - kept_elems(z, sp, r);
}
// Carves n floats off *rc when the tensor is recomputed (dropped), else off *kept.
static float *take_rc(float **kept, float **rc, int dropped, size_t n) { return take(dropped ? rc : kept, n); }
// Block views in ActTensors' order: the kept tensors off kept, the recomputed ones off rc (the
// model's one recompute layer; r none: rc unused).
static void carve_views(GPT2LayerActs *x, float *kept, float *rc, const Sizes *z, int sp, GPT2Recompute r) {
    float *at = kept, *q = rc;
    const size_t N = z->N, Nr = z->Nr, C = z->C;
    const int f = r == GPT2_RECOMPUTE_FULL, sc = f || r == GPT2_RECOMPUTE_SELECTIVE;
    x->ln1 = take_rc(&at, &q, f, N * C), x->ln1_mean = take_rc(&at, &q, f, Nr);
    x->ln1_rstd = take_rc(&at, &q, f, Nr);
    x->qkv = take_rc(&at, &q, f, 3 * N * z->Cl), x->atty = take_rc(&at, &q, f, N * z->Cl);
    x->preatt = take_rc(&at, &q, sc, z->att), x->att = take_rc(&at, &q, sc, z->att);
    x->attproj = sp ? NULL : take_rc(&at, &q, f, N * C);
    x->residual2 = take_rc(&at, &q, f, Nr * C);
    x->ln2 = take_rc(&at, &q, f, N * C), x->ln2_mean = take_rc(&at, &q, f, Nr);
    x->ln2_rstd = take_rc(&at, &q, f, Nr);
    x->fch = take_rc(&at, &q, f, N * z->Hl), x->fch_gelu = take_rc(&at, &q, f, N * z->Hl);
    x->fcproj = sp ? NULL : take_rc(&at, &q, f, N * C);
    x->residual3 = take(&at, Nr * C);
    LAB_CHECK(at == kept + kept_elems(z, sp, r) && q == rc + rc_elems(z, sp, r),
              "tp: a block's set does not add up");
}
static void carve_layer(ActTensors *x, float *base, float *rc, const Sizes *z, int sp, GPT2Recompute r) {
    GPT2LayerActs v;
    carve_views(&v, base, rc, z, sp, r);
    x->ln1 = v.ln1, x->ln1_mean = v.ln1_mean, x->ln1_rstd = v.ln1_rstd, x->qkv = v.qkv, x->atty = v.atty;
    x->preatt = v.preatt, x->att = v.att, x->attproj = v.attproj, x->residual2 = v.residual2;
    x->ln2 = v.ln2, x->ln2_mean = v.ln2_mean, x->ln2_rstd = v.ln2_rstd, x->fch = v.fch;
    x->fch_gelu = v.fch_gelu, x->fcproj = v.fcproj, x->residual3 = v.residual3;
}

// The gradients inside one block: d ln (N,C), d residual2 (Nr,C), d qkv, d atty, d preatt,
// d att, d fch, d fch_gelu; SP: full (N,C), dlnl (Nr,C), partial (N,C).
static size_t scratch_elems(const Sizes *z, int sp) {
    return z->N * z->C + z->Nr * z->C + 4 * z->N * z->Cl + 2 * z->att + 2 * z->N * z->Hl +
           (sp ? 2 * z->N * z->C + z->Nr * z->C : 0);
}
static void carve_scratch(TpScratch *s, float *base, const Sizes *z, int sp) {
    float *at = base;
    const size_t N = z->N, C = z->C;
    memset(s, 0, sizeof *s);
    s->dln = take(&at, N * C), s->dresidual2 = take(&at, z->Nr * C);
    s->dqkv = take(&at, 3 * N * z->Cl), s->datty = take(&at, N * z->Cl);
    s->dpreatt = take(&at, z->att), s->datt = take(&at, z->att);
    s->dfch = take(&at, N * z->Hl), s->dfch_gelu = take(&at, N * z->Hl);
    if (sp) s->full = take(&at, N * C), s->dlnl = take(&at, z->Nr * C), s->partial = take(&at, N * C);
    LAB_CHECK(at == base + scratch_elems(z, sp), "tp: the scratch does not add up");
}

// The head's fp32 tensors of a set (the last stage): lnf (N,C), SP its local rows (Nr,C), lnf's
// mean and rstd (Nr), the logits (N,Vl), the losses and the loss's 3 statistics (N); in the
// gradients: d lnf (N,C), d logits (N,Vl).
static size_t head_elems(const Sizes *z, int sp) {
    return 2 * z->N * z->C + (sp ? z->Nr * z->C : 0) + 2 * z->Nr + 2 * z->N * z->Vl + 4 * z->N;
}

size_t tp_acts_bytes(const GPT2Config *cfg, TpShape s, GPT2Dtype dtype) {
    const Sizes z = sizes_of(cfg, s);
    const size_t blocks = (size_t)(s.l1 - s.l0) * kept_elems(&z, s.sp, s.recompute);
    // the stream's input and its gradient (Nr,C), the head where the set has it: fp32
    const size_t rest = 2 * z.Nr * z.C + (s.l1 == cfg->L ? head_elems(&z, s.sp) : 0);
    return (dtype == GPT2_BF16 ? 2 : 4) * blocks + 4 * rest;
}

size_t tp_shared_bytes(const GPT2Config *cfg, TpShape s, GPT2Dtype dtype) {
    const Sizes z = sizes_of(cfg, s);
    size_t floats = scratch_elems(&z, s.sp);
    // bf16: tp_layer (the kept tensors' fp32 layer: with the recompute layer, one block's
    // whole set), tp_block_in
    if (dtype == GPT2_BF16) floats += kept_elems(&z, s.sp, s.recompute) + z.Nr * z.C;
    return 4 * floats + tp_recompute_bytes(cfg, s);
}

double tp_recompute_flops(const GPT2Config *cfg, GPT2Recompute r, GPT2Dtype dtype, int B, int T, int tp) {
    return gpt2_recompute_flops_dtype(cfg, r, dtype, B, T) / tp;  // each term: 1/t of the columns or heads
}

size_t tp_recompute_bytes(const GPT2Config *cfg, TpShape s) {
    const Sizes z = sizes_of(cfg, s);
    return 4 * rc_elems(&z, s.sp, s.recompute);
}

static TpShape shape_of(const GPT2 *m) {
    TpShape s = {m->l0, m->l1, m->tp, m->tp_rank, m->sp, m->tp_B, m->tp_T, m->recompute};
    return s;
}

void tp_build(GPT2 *m, GPT2Config cfg, Device dev, GPT2Dtype dtype, TpShape s, uint64_t seed) {
    if (s.sp) tp_check_sequence_parallel(s.T, s.tp);
    gpt2_build_tp(m, cfg, dev, dtype, s.l0, s.l1, s.tp, s.r);
    gpt2_alloc_grads(m);
    gpt2_init_params(m, seed);
    m->sp = s.sp, m->tp_B = s.B, m->tp_T = s.T;
    if (own_path(m)) {  // gpt2's sets carry their own
        if (s.recompute != GPT2_RECOMPUTE_NONE) gpt2_set_recompute(m, s.recompute, s.B, s.T);
        return;
    }
    const Sizes z = sizes_of(&cfg, s);
    m->tp_scratch = mem_alloc(scratch_elems(&z, s.sp) * sizeof(float), MEM_ACTS, dev);
    if (s.recompute != GPT2_RECOMPUTE_NONE) {  // the one layer the sets' backwards recompute into
        m->recompute = s.recompute, m->rc_B = s.B, m->rc_T = s.T;
        m->rc_scratch = mem_alloc(rc_elems(&z, s.sp, s.recompute) * sizeof(float), MEM_ACTS, dev);
    }
    if (dtype == GPT2_BF16) {  // (recomputing: the kept tensors' part; the rest is rc_scratch)
        m->tp_layer = mem_alloc(kept_elems(&z, s.sp, s.recompute) * sizeof(float), MEM_ACTS, dev);
        m->tp_block_in = mem_alloc(z.Nr * z.C * sizeof(float), MEM_ACTS, dev);
    }
}

static TpScratch scratch_of(const GPT2 *m) {
    const Sizes z = sizes_of(&m->cfg, shape_of(m));
    TpScratch s;
    carve_scratch(&s, m->tp_scratch, &z, m->sp);
    return s;
}

void tp_acts_alloc(GPT2Acts *a, const GPT2 *m) {
    if (own_path(m)) {
        gpt2_acts_alloc(a, m, m->tp_B, m->tp_T);
        return;
    }
    LAB_CHECK(m->tp_scratch, "tp_acts_alloc: the slice was not built by tp_build");
    const TpShape s = shape_of(m);
    const Sizes z = sizes_of(&m->cfg, s);
    const int nb = m->l1 - m->l0, bf16 = m->dtype == GPT2_BF16;
    const size_t E = kept_elems(&z, s.sp, s.recompute), stream = z.Nr * z.C;  // (recompute: fp32)
    memset(a, 0, sizeof *a);
    a->B = s.B, a->T = s.T, a->l0 = m->l0, a->l1 = m->l1, a->dtype = m->dtype;
    a->slice = 1, a->rows = (int)z.Nr;
    a->recompute = m->recompute, a->rc = m->rc_scratch;
    // fp32 activations: the stream's input, the blocks' sets (fp32: block-major, layer_stride
    // apart; bf16: in acts_bf16, computing in the model's tp_layer), the head's
    const size_t head = m->has_head ? head_elems(&z, s.sp) : 0;
    const size_t nacts = stream + (bf16 ? 0 : (size_t)nb * E) + head - (m->has_head ? z.N * z.C + z.N * z.Vl : 0);
    a->acts = mem_alloc(nacts * sizeof(float), MEM_ACTS, m->dev);
    float *at = a->acts;
    a->a.encoded = take(&at, stream);
    if (bf16) {  // the kept tensors contiguous in tp_layer (what the store rounds), the rest rc
        carve_layer(&a->a, m->tp_layer, m->rc_scratch, &z, s.sp, s.recompute);
        if (s.recompute == GPT2_RECOMPUTE_FULL) a->a.ln1 = NULL;  // (the layer starts at the output)
        a->acts_bf16 = mem_alloc((size_t)nb * E * sizeof(uint16_t), MEM_ACTS, m->dev);
        a->block_in = m->tp_block_in;
    } else {
        carve_layer(&a->a, at, m->rc_scratch, &z, s.sp, s.recompute);
        at += (size_t)nb * E;
        a->layer_stride = E;
    }
    a->layer_act_size = E;
    // the gradients: of the stream (in place, block by block), of lnf and the logits (the head)
    a->dacts = mem_alloc((stream + (m->has_head ? z.N * z.C + z.N * z.Vl : 0)) * sizeof(float), MEM_ACTS,
                         m->dev);
    a->da.encoded = a->dacts;
    if (m->has_head) {
        a->a.lnf = take(&at, z.N * z.C);
        if (s.sp) a->lnf_local = take(&at, z.Nr * z.C);
        a->a.lnf_mean = take(&at, z.Nr), a->a.lnf_rstd = take(&at, z.Nr);
        a->a.logits = take(&at, z.N * z.Vl), a->a.losses = take(&at, z.N);
        a->ce_max = take(&at, z.N), a->ce_sum = take(&at, z.N), a->ce_target = take(&at, z.N);
        a->da.lnf = a->dacts + stream, a->da.logits = a->da.lnf + z.N * z.C;
    }
    LAB_CHECK(at == a->acts + nacts, "tp_acts_alloc: %zu of %zu floats carved", (size_t)(at - a->acts), nacts);
    // the batch: read in place on the host; a device needs copies, and a host copy of the losses
    a->borrows_batch = m->dev == DEV_CPU;
    if (m->dev != DEV_CPU) {
        a->inputs = mem_alloc(z.N * sizeof(int), MEM_OTHER, m->dev);
        a->targets = mem_alloc(z.N * sizeof(int), MEM_OTHER, m->dev);
        a->host_losses = mem_alloc(z.N * sizeof(float), MEM_OTHER, DEV_CPU);
    }
}

// ---- the pieces ------------------------------------------------------------------------------------

// Block l's saved tensors (bf16: the model's one fp32 layer); under SP the partial sums live in
// the scratch.
static GPT2LayerActs layer_of(const GPT2 *m, const GPT2Acts *a, int l, const TpScratch *s) {
    GPT2LayerActs x = gpt2_layer_acts(m, a, l);
    if (m->recompute) {  // block l's kept tensors (block-major, after the stream's input) and the
                         // recompute layer's views, the same for every block
        const Sizes z = sizes_of(&m->cfg, shape_of(m));
        float *kept = m->dtype == GPT2_BF16 ? m->tp_layer
                                            : a->acts + z.Nr * z.C + (size_t)(l - a->l0) * a->layer_stride;
        carve_views(&x, kept, m->rc_scratch, &z, m->sp, m->recompute);
    }
    if (m->sp) x.attproj = x.fcproj = s->partial;
    return x;
}

// Block l's run: its piece's weights (unless a split backward's W, which reads none: with_w 0)
// and gradients (with_grads) as fp32, its tensors.
static void block_begin_w(TpBlockRun *b, GPT2Piece *p, GPT2 *m, GPT2Acts *a, int l, const void *w,
                          void *g, int with_w, int with_grads) {
    memset(b, 0, sizeof *b);
    b->k = m->k, b->B = a->B, b->T = a->T, b->N = a->B * a->T;
    b->d = tp_block_dims(m->cfg.C, m->cfg.NH, m->tp);
    gpt2_piece_block(p, m, l, w, g, with_w, with_grads);
    float *wv[2] = {0}, *gv[2] = {0};
    if (with_w) {
        gpt2_piece_weights(m, p, wv);
        b->w = gpt2_block_weights(&b->d, wv[0]);
    }
    if (with_grads) {
        gpt2_piece_grads(m, p, gv);
        b->dw = gpt2_block_weights(&b->d, gv[0]);
    }
    b->s = scratch_of(m);
    b->x = layer_of(m, a, l, &b->s);
}

static void block_begin(TpBlockRun *b, GPT2Piece *p, GPT2 *m, GPT2Acts *a, int l, const void *w,
                        void *g, int with_grads) {
    block_begin_w(b, p, m, a, l, w, g, 1, with_grads);
}

void tp_block_run(TpBlockRun *b, GPT2 *m, GPT2Acts *a, int l) {
    LAB_CHECK(m->dtype == GPT2_FP32 && !own_path(m), "tp_block_run: an fp32 slice");
    GPT2Piece p;
    block_begin(b, &p, m, a, l, NULL, NULL, 1);
}

void tp_embed_forward(GPT2 *m, GPT2Acts *a, TpComm *c) { tp_embed_forward_w(m, a, c, NULL); }

void tp_embed_forward_w(GPT2 *m, GPT2Acts *a, TpComm *c, const void *embed_w) {
    if (own_path(m)) {
        gpt2_embed_forward_w(m, a, embed_w);
        return;
    }
    const TpVocab tv = tp_vocab(m->cfg.V, m->tp, m->tp_rank);
    const int B = a->B, T = a->T, C = m->cfg.C;
    GPT2Piece p;
    gpt2_piece_embed(&p, m, embed_w, NULL, 0);
    float *w[2] = {0};  // the unit: wte's Vl rows, then wpe
    gpt2_piece_weights(m, &p, w);
    const float *wpe = c->rank == 0 ? w[0] + (size_t)tv.Vl * C : NULL;
    // wpe on rank 0 only: the sum over the group then has it once. Every other term is the
    // owning rank's row or an exact 0, so the sum is wte[inp] + wpe[t] bit for bit.
    if (!m->sp) {
        m->k->vocab_embed_forward(a->a.encoded, a->inputs, w[0], wpe, tv.v0, tv.Vl, B, T, C);
        tp_all_reduce(c, a->a.encoded, (size_t)B * T * C, TP_SUM, TP_SITE_EMBED);
    } else {  // the lookup into the scratch, reduce-scattered onto this rank's positions
        const TpScratch s = scratch_of(m);
        m->k->vocab_embed_forward(s.full, a->inputs, w[0], wpe, tv.v0, tv.Vl, B, T, C);
        tp_seq_reduce_scatter(c, s.full, a->a.encoded, B, T, C, TP_SITE_EMBED);
    }
}

void tp_embed_backward(GPT2 *m, GPT2Acts *a, TpComm *c) {
    if (own_path(m)) {
        gpt2_embed_backward_w(m, a, NULL);
        return;
    }
    const TpVocab tv = tp_vocab(m->cfg.V, m->tp, m->tp_rank);
    const int B = a->B, T = a->T, C = m->cfg.C;
    const float *dx = a->da.encoded;
    if (m->sp) {  // the embedding's rows of wte see every position: the reverse of its forward
        const TpScratch s = scratch_of(m);
        tp_seq_all_gather(c, a->da.encoded, s.full, B, T, C, TP_SITE_EMBED_BWD);
        dx = s.full;
    }
    GPT2Piece p;
    gpt2_piece_embed(&p, m, NULL, NULL, 1);
    float *g[2] = {0};
    gpt2_piece_grads(m, &p, g);
    m->k->vocab_embed_backward(g[0], g[0] + (size_t)tv.Vl * C, dx, a->inputs, tv.v0, tv.Vl, B, T, C);
    gpt2_piece_grads_done(m, &p);
}

// Sequence parallelism's block (tp.h's top): the LayerNorms and residuals on this rank's Nl
// rows, f an all-gather of the LayerNorm's output, g a reduce-scatter of the partial sums.
static void sp_block_forward(TpBlockRun *b, TpComm *c, const float *in) {
    const Kernels *k = b->k;
    GPT2BlockWeights w = b->w;
    GPT2LayerActs x = b->x;
    const int B = b->B, T = b->T, C = b->d.C, Nl = b->N / c->tp;
    // attention half: ln1 on this rank's positions, f = all-gather, the heads, g = reduce-scatter
    k->layernorm_forward(b->s.partial, x.ln1_mean, x.ln1_rstd, in, w.ln1w, w.ln1b, Nl, C);
    tp_seq_all_gather(c, b->s.partial, x.ln1, B, T, C, TP_SITE_ATTN_F_FWD);      // f
    tp_attn_forward(b, x.ln1);                                // x.attproj (= s.partial): partial
    tp_seq_reduce_scatter(c, x.attproj, x.residual2, B, T, C, TP_SITE_ATTN_G);   // g
    k->tp_bias_residual_forward(x.residual2, in, x.residual2, w.attprojb, Nl, C);
    // MLP half, the same way
    k->layernorm_forward(b->s.partial, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, Nl, C);
    tp_seq_all_gather(c, b->s.partial, x.ln2, B, T, C, TP_SITE_MLP_F_FWD);
    tp_mlp_forward(b, x.ln2);
    tp_seq_reduce_scatter(c, x.fcproj, x.residual3, B, T, C, TP_SITE_MLP_G);
    k->tp_bias_residual_forward(x.residual3, x.residual2, x.residual3, w.fcprojb, Nl, C);
}

// Block l's forward from `in`, the stream entering it (tp_block_forward's, and full
// recomputation's second run from the same kept input).
static void block_forward(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w, const float *in) {
    TpBlockRun b;
    GPT2Piece p;
    block_begin(&b, &p, m, a, l, block_w, NULL, 0);
    const Kernels *k = b.k;
    const GPT2BlockWeights w = b.w;
    const GPT2LayerActs x = b.x;
    const int N = b.N, C = b.d.C;
    const size_t NC = (size_t)N * C;
    if (m->sp) {
        sp_block_forward(&b, c, in);
    } else {
        // EXERCISE 07.1 The TP block forward and its g all-reduces -> 07_tensor_parallel/README.md#exercise-071-the-tp-block-forward-and-its-g-all-reduces
        k->layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, in, w.ln1w, w.ln1b, N, C);
        tp_attn_forward(&b, x.ln1);                                // f: the identity forward
        tp_all_reduce(c, x.attproj, NC, TP_SUM, TP_SITE_ATTN_G);   // g
        k->tp_bias_residual_forward(x.residual2, in, x.attproj, w.attprojb, N, C);
        k->layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, N, C);
        tp_mlp_forward(&b, x.ln2);
        tp_all_reduce(c, x.fcproj, NC, TP_SUM, TP_SITE_MLP_G);
        k->tp_bias_residual_forward(x.residual3, x.residual2, x.fcproj, w.fcprojb, N, C);
        // END EXERCISE 07.1
    }
    gpt2_layer_store(m, a, l);  // bf16: the block's set stored rounded
}

void tp_block_forward(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w) {
    if (own_path(m)) {
        gpt2_block_forward_w(m, a, l, block_w);
        return;
    }
    block_forward(m, a, c, l, block_w, gpt2_piece_input(m, a, l));  // (the stream entering block l)
}

// dout (Nl,C) -> dinp (Nl,C) (may alias dout); the replicated tensors' gradients PARTIAL.
static void sp_block_backward(TpBlockRun *b, TpComm *c, const float *in, const float *dout, float *dinp) {
    const Kernels *k = b->k;
    const GPT2BlockWeights w = b->w, dw = b->dw;
    const GPT2LayerActs x = b->x;
    const TpScratch s = b->s;
    const int B = b->B, T = b->T, C = b->d.C, Nl = b->N / c->tp;
    // MLP half. The bias saw this rank's positions only: a partial gradient (summed later).
    k->matmul_backward(NULL, NULL, dw.fcprojb, dout, NULL, NULL, Nl, 0, C);
    tp_seq_all_gather(c, dout, s.full, B, T, C, TP_SITE_MLP_G_BWD);    // g's backward
    tp_mlp_backward(b, x.ln2, s.full, s.dln);                          // d ln2 (N,C): partial
    tp_seq_reduce_scatter(c, s.dln, s.dlnl, B, T, C, TP_SITE_MLP_F);   // f's backward
    k->layernorm_backward(s.dresidual2, dw.ln2w, dw.ln2b, s.dlnl, dout, x.residual2, w.ln2w,
                          x.ln2_mean, x.ln2_rstd, Nl, C);
    // attention half
    k->matmul_backward(NULL, NULL, dw.attprojb, s.dresidual2, NULL, NULL, Nl, 0, C);
    tp_seq_all_gather(c, s.dresidual2, s.full, B, T, C, TP_SITE_ATTN_G_BWD);
    tp_attn_backward(b, x.ln1, s.full, s.dln);
    tp_seq_reduce_scatter(c, s.dln, s.dlnl, B, T, C, TP_SITE_ATTN_F);
    k->layernorm_backward(dinp, dw.ln1w, dw.ln1b, s.dlnl, s.dresidual2, in, w.ln1w, x.ln1_mean,
                          x.ln1_rstd, Nl, C);
}

// bf16: the forward stored every tensor of a block rounded, and the backward without
// recomputation reads them widened; the recomputed ones (fp32, the recompute layer) are rounded
// the same way, through the slice's backward scratch (free until the backward writes it).
static void round_recomputed(GPT2 *m) {
    if (m->dtype != GPT2_BF16) return;
    const Sizes z = sizes_of(&m->cfg, shape_of(m));
    gpt2_round_through_bf16(m, m->rc_scratch, rc_elems(&z, m->sp, m->recompute),
                            (uint16_t *)m->tp_scratch, 2 * scratch_elems(&z, m->sp));
}

// Recomputation (tp_build): what block l's set did not keep, again, into the slice's recompute
// layer, before its backward reads it. Full: the block's forward from its kept input, its f and
// g collectives included (the output, kept, rewritten with its own bits); selective: the
// attention core of this rank's heads from the kept qkv (atty rewritten with its own bits).
// bf16 computes in fp32 from the stored (rounded) input, so the same run reproduces the
// forward's fp32 values; selective first reruns ln1 and qkv (the forward's softmax read qkv
// before the store rounded it; under SP with f's all-gather of ln1 once more).
static void recompute_block(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w) {
    const double t0 = lab_now();
    if (m->recompute == GPT2_RECOMPUTE_FULL) {  // from its kept input: block l-1's kept output
        block_forward(m, a, c, l, block_w, gpt2_piece_input(m, a, l));
    } else {
        const int bf16 = m->dtype == GPT2_BF16;
        TpBlockRun b;
        GPT2Piece p;
        block_begin_w(&b, &p, m, a, l, bf16 ? block_w : NULL, NULL, bf16, 0);
        if (bf16) {  // ln1 and qkv as the forward computed them (f: the identity, SP all-gather)
            const float *in = gpt2_piece_input(m, a, l);
            const int N = b.N, C = b.d.C;
            if (m->sp) {
                m->k->layernorm_forward(b.s.partial, b.x.ln1_mean, b.x.ln1_rstd, in, b.w.ln1w, b.w.ln1b,
                                        N / c->tp, C);
                tp_seq_all_gather(c, b.s.partial, b.x.ln1, b.B, b.T, C, TP_SITE_ATTN_F_FWD);
            } else {
                m->k->layernorm_forward(b.x.ln1, b.x.ln1_mean, b.x.ln1_rstd, in, b.w.ln1w, b.w.ln1b, N, C);
            }
            m->k->matmul_forward(b.x.qkv, b.x.ln1, b.w.qkvw, b.w.qkvb, N, C, 3 * b.d.ATT);
        }
        m->k->attention_forward(b.x.atty, b.x.preatt, b.x.att, b.x.qkv, b.B, b.T, b.d.ATT, b.d.NH);
    }
    round_recomputed(m);  // bf16: as the forward's store rounded them
    m->rc_flops += tp_recompute_flops(&m->cfg, m->recompute, m->dtype, m->tp_B, m->tp_T, m->tp);
    m->rc_seconds += lab_now() - t0;
}

void tp_block_backward(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w, void *dblock_w) {
    if (own_path(m)) {
        gpt2_block_backward_w(m, a, l, block_w, dblock_w);
        return;
    }
    if (m->recompute) recompute_block(m, a, c, l, block_w);
    TpBlockRun b;
    GPT2Piece p;
    block_begin(&b, &p, m, a, l, block_w, dblock_w, 1);
    gpt2_layer_widen(m, a, l);                    // bf16: the stored set into the fp32 layer
    const float *in = gpt2_piece_input(m, a, l);
    float *dx = a->da.encoded;  // the gradient of the block's output, then of its input (in place)
    const Kernels *k = b.k;
    const GPT2BlockWeights w = b.w, dw = b.dw;
    const GPT2LayerActs x = b.x;
    const TpScratch s = b.s;
    const int N = b.N, C = b.d.C;
    const size_t NC = (size_t)N * C;
    if (m->sp) {
        sp_block_backward(&b, c, in, dx, dx);
    } else {
        // MLP half. g's backward is the identity: d out (replicated) reaches fcproj and its bias.
        k->matmul_backward(NULL, NULL, dw.fcprojb, dx, NULL, NULL, N, 0, C);
        tp_mlp_backward(&b, x.ln2, dx, s.dln);
        tp_all_reduce(c, s.dln, NC, TP_SUM, TP_SITE_MLP_F);         // f: the partial d ln2 -> whole
        k->layernorm_backward(s.dresidual2, dw.ln2w, dw.ln2b, s.dln, dx, x.residual2, w.ln2w,
                              x.ln2_mean, x.ln2_rstd, N, C);
        // attention half
        k->matmul_backward(NULL, NULL, dw.attprojb, s.dresidual2, NULL, NULL, N, 0, C);
        tp_attn_backward(&b, x.ln1, s.dresidual2, s.dln);
        tp_all_reduce(c, s.dln, NC, TP_SUM, TP_SITE_ATTN_F);
        k->layernorm_backward(dx, dw.ln1w, dw.ln1b, s.dln, s.dresidual2, in, w.ln1w, x.ln1_mean,
                              x.ln1_rstd, N, C);
    }
    gpt2_piece_grads_done(m, &p);
}

// ---- the split backward (zero bubble's B and W) ----------------------------------------------------

// What a block's W reads from its B, per block of a split set (tp_acts_alloc_split): the
// gradient of the block's output (the stream's, overwritten in place by B), d fch (N,Hl), the
// whole d ln2 and d ln1 (f's all-reduce done: W sends nothing), d residual2, d qkv (N,3Cl);
// under SP d ln2, d ln1, d residual2 and the output's gradient are this rank's rows (Nr,C), and
// the two all-gathered gradients that reach the row-parallel weights (N,C) are kept as well.
typedef struct TpWSave {
    float *dout, *dfch, *dln2, *dres2, *dqkv, *dln1;
    float *gmlp, *gattn;  // SP: g's backward all-gathers, the fcprojw and attprojw operands
} TpWSave;

static size_t wsave_elems(const Sizes *z, int sp) {
    return 4 * z->Nr * z->C + z->N * (z->Hl + 3 * z->Cl) + (sp ? 2 * z->N * z->C : 0);
}

static TpWSave wsave_of(const GPT2 *m, const GPT2Acts *a, int l) {
    const Sizes z = sizes_of(&m->cfg, shape_of(m));
    LAB_CHECK(a->wsave, "tp: the split backward needs tp_acts_alloc_split");
    float *at = a->wsave + (size_t)(l - a->l0) * a->wsave_per_block;
    TpWSave w = {0};
    w.dout = take(&at, z.Nr * z.C), w.dfch = take(&at, z.N * z.Hl);
    w.dln2 = take(&at, z.Nr * z.C), w.dres2 = take(&at, z.Nr * z.C);
    w.dqkv = take(&at, 3 * z.N * z.Cl), w.dln1 = take(&at, z.Nr * z.C);
    if (m->sp) w.gmlp = take(&at, z.N * z.C), w.gattn = take(&at, z.N * z.C);
    return w;
}

void tp_acts_alloc_split(GPT2Acts *a, const GPT2 *m) {
    if (own_path(m)) {
        gpt2_acts_alloc_split(a, m);
        return;
    }
    LAB_CHECK(a->acts && a->slice, "tp_acts_alloc_split before tp_acts_alloc");
    LAB_CHECK(!m->recompute, "tp_acts_alloc_split: a split backward's W reads what its B would "
              "recompute, later: recomputation (%s) is for the whole backward", gpt2_recompute_name(m->recompute));
    if (a->wsave) return;
    const Sizes z = sizes_of(&m->cfg, shape_of(m));
    a->wsave_per_block = wsave_elems(&z, m->sp);
    a->wsave = mem_alloc((size_t)(m->l1 - m->l0) * a->wsave_per_block * sizeof(float), MEM_ACTS, m->dev);
}

size_t tp_wsave_bytes(const GPT2Config *cfg, TpShape s) {
    const Sizes z = sizes_of(cfg, s);
    return 4 * (size_t)(s.l1 - s.l0) * wsave_elems(&z, s.sp);
}

void tp_acts_keep_for_w(GPT2Acts *a, const GPT2 *m) {
    if (own_path(m)) gpt2_acts_keep_for_w(a, m);  // (a slice's set stays whole until its W)
}

// B of block l: tp_block_backward's input-gradient half, op for op, every f and g collective
// where the input gradient needs it; the intermediate gradients W reads land in the set's wsave
// (the kernels' weight-gradient arguments NULL: B writes no weight gradient).
void tp_block_backward_input(GPT2 *m, GPT2Acts *a, TpComm *c, int l, const void *block_w) {
    if (own_path(m)) {
        gpt2_block_backward_input(m, a, l, block_w);
        return;
    }
    TpBlockRun b;
    GPT2Piece p;
    block_begin(&b, &p, m, a, l, block_w, NULL, 0);
    gpt2_layer_widen(m, a, l);
    const float *in = gpt2_piece_input(m, a, l);
    float *dx = a->da.encoded;  // d out, then d in (in place)
    const Kernels *k = b.k;
    const GPT2BlockWeights w = b.w;
    const GPT2LayerActs x = b.x;
    const TpScratch s = b.s;
    const TpWSave v = wsave_of(m, a, l);
    const int B = b.B, T = b.T, N = b.N, Nr = a->rows, C = b.d.C, Cl = b.d.ATT, NHl = b.d.NH,
              Hl = b.d.FC;
    mem_copy(v.dout, dx, (size_t)Nr * C * sizeof(float));  // W's fcproj reads it
    // MLP half: g's backward (SP: an all-gather of d out), the heads' d ln2 (partial), f's
    const float *gm = dx;
    if (m->sp) tp_seq_all_gather(c, dx, v.gmlp, B, T, C, TP_SITE_MLP_G_BWD), gm = v.gmlp;
    k->matmul_backward(s.dfch_gelu, NULL, NULL, gm, x.fch_gelu, w.fcprojw, N, Hl, C);
    k->gelu_backward(v.dfch, x.fch, s.dfch_gelu, (size_t)N * Hl);
    if (!m->sp) {
        k->matmul_backward(v.dln2, NULL, NULL, v.dfch, x.ln2, w.fcw, N, C, Hl);
        tp_all_reduce(c, v.dln2, (size_t)N * C, TP_SUM, TP_SITE_MLP_F);
    } else {
        k->matmul_backward(s.dln, NULL, NULL, v.dfch, x.ln2, w.fcw, N, C, Hl);
        tp_seq_reduce_scatter(c, s.dln, v.dln2, B, T, C, TP_SITE_MLP_F);
    }
    k->layernorm_backward(v.dres2, NULL, NULL, v.dln2, dx, x.residual2, w.ln2w, x.ln2_mean,
                          x.ln2_rstd, Nr, C);
    // attention half
    const float *ga = v.dres2;
    if (m->sp) tp_seq_all_gather(c, v.dres2, v.gattn, B, T, C, TP_SITE_ATTN_G_BWD), ga = v.gattn;
    k->matmul_backward(s.datty, NULL, NULL, ga, x.atty, w.attprojw, N, Cl, C);
    k->attention_backward(v.dqkv, s.dpreatt, s.datt, s.datty, x.qkv, x.att, B, T, Cl, NHl);
    if (!m->sp) {
        k->matmul_backward(v.dln1, NULL, NULL, v.dqkv, x.ln1, w.qkvw, N, C, 3 * Cl);
        tp_all_reduce(c, v.dln1, (size_t)N * C, TP_SUM, TP_SITE_ATTN_F);
    } else {
        k->matmul_backward(s.dln, NULL, NULL, v.dqkv, x.ln1, w.qkvw, N, C, 3 * Cl);
        tp_seq_reduce_scatter(c, s.dln, v.dln1, B, T, C, TP_SITE_ATTN_F);
    }
    k->layernorm_backward(dx, NULL, NULL, v.dln1, v.dres2, in, w.ln1w, x.ln1_mean, x.ln1_rstd, Nr, C);
}

// W of block l: the twelve weight gradients from what B kept, the same kernel calls on the same
// operands as tp_block_backward's (so B then W gives its bits); no communication, and no
// weights read (a weight gradient needs the activations and the output's gradient only).
void tp_block_backward_weights(GPT2 *m, GPT2Acts *a, int l, void *dblock_w) {
    if (own_path(m)) {
        gpt2_block_backward_weights(m, a, l, dblock_w);
        return;
    }
    TpBlockRun b;
    GPT2Piece p;
    block_begin_w(&b, &p, m, a, l, NULL, dblock_w, 0, 1);
    gpt2_layer_widen(m, a, l);
    const float *in = gpt2_piece_input(m, a, l);
    const Kernels *k = b.k;
    const GPT2BlockWeights dw = b.dw;
    const GPT2LayerActs x = b.x;
    const TpWSave v = wsave_of(m, a, l);
    const int N = b.N, Nr = a->rows, C = b.d.C, Cl = b.d.ATT, Hl = b.d.FC;
    const float *gm = m->sp ? v.gmlp : v.dout, *ga = m->sp ? v.gattn : v.dres2;
    k->matmul_backward(NULL, NULL, dw.fcprojb, v.dout, NULL, NULL, Nr, 0, C);
    k->matmul_backward(NULL, dw.fcprojw, NULL, gm, x.fch_gelu, NULL, N, Hl, C);
    k->matmul_backward(NULL, dw.fcw, dw.fcb, v.dfch, x.ln2, NULL, N, C, Hl);
    k->layernorm_backward(NULL, dw.ln2w, dw.ln2b, v.dln2, NULL, x.residual2, NULL, x.ln2_mean,
                          x.ln2_rstd, Nr, C);
    k->matmul_backward(NULL, NULL, dw.attprojb, v.dres2, NULL, NULL, Nr, 0, C);
    k->matmul_backward(NULL, dw.attprojw, NULL, ga, x.atty, NULL, N, Cl, C);
    k->matmul_backward(NULL, dw.qkvw, dw.qkvb, v.dqkv, x.ln1, NULL, N, C, 3 * Cl);
    k->layernorm_backward(NULL, dw.ln1w, dw.ln1b, v.dln1, NULL, in, NULL, x.ln1_mean, x.ln1_rstd,
                          Nr, C);
    gpt2_piece_grads_done(m, &p);
}

float tp_head_forward(GPT2 *m, GPT2Acts *a, TpComm *c) { return tp_head_forward_w(m, a, c, NULL, NULL); }

float tp_head_forward_w(GPT2 *m, GPT2Acts *a, TpComm *c, const void *wte, const void *head_w) {
    if (own_path(m)) return gpt2_head_forward_w(m, a, wte, head_w);
    LAB_CHECK(a->has_targets, "tp_head_forward: the batch has no targets");
    const TpVocab tv = tp_vocab(m->cfg.V, m->tp, m->tp_rank);
    const int N = a->B * a->T, C = m->cfg.C;
    GPT2Piece p;
    gpt2_piece_head(&p, m, wte, head_w, NULL, NULL, 0);
    const float *x = gpt2_piece_input(m, a, m->l1);  // the last block's output
    float *w[2] = {0};  // wte's rows; lnfw, lnfb
    gpt2_piece_weights(m, &p, w);
    if (!m->sp) {  // f at the head's input: the identity forward
        m->k->layernorm_forward(a->a.lnf, a->a.lnf_mean, a->a.lnf_rstd, x, w[1], w[1] + C, N, C);
    } else {       // lnf on this rank's positions, f = all-gather of every position
        m->k->layernorm_forward(a->lnf_local, a->a.lnf_mean, a->a.lnf_rstd, x, w[1], w[1] + C, a->rows, C);
        tp_seq_all_gather(c, a->lnf_local, a->a.lnf, a->B, a->T, C, TP_SITE_HEAD_F_FWD);
    }
    m->k->matmul_forward(a->a.logits, a->a.lnf, w[0], NULL, N, C, tv.Vl);  // column-parallel (tied wte)
    TpLossStats st = {a->ce_max, a->ce_sum, a->ce_target};
    tp_crossentropy_forward(m->k, c, &tv, a->a.losses, &st, a->a.logits, a->targets, N);
    return gpt2_acts_mean_loss(a);
}

void tp_head_backward(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss) {
    tp_head_backward_w(m, a, c, dloss, NULL, NULL);
}

void tp_head_backward_w(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss, const void *wte,
                        const void *head_w) {
    if (own_path(m)) {
        gpt2_head_backward_w(m, a, dloss, wte, head_w, NULL, NULL);
        return;
    }
    const TpVocab tv = tp_vocab(m->cfg.V, m->tp, m->tp_rank);
    const int N = a->B * a->T, C = m->cfg.C;
    GPT2Piece p;
    gpt2_piece_head(&p, m, wte, head_w, NULL, NULL, 1);
    const float *x = gpt2_piece_input(m, a, m->l1);
    float *w[2] = {0}, *g[2] = {0};
    gpt2_piece_weights(m, &p, w);
    gpt2_piece_grads(m, &p, g);
    const TpLossStats st = {a->ce_max, a->ce_sum, a->ce_target};
    tp_crossentropy_backward(m->k, &tv, a->da.logits, &st, a->a.logits, a->targets, dloss, N);
    m->k->matmul_backward(a->da.lnf, g[0], NULL, a->da.logits, a->a.lnf, w[0], N, C, tv.Vl);
    if (!m->sp) {  // f: this rank's vocabulary columns only -> the whole gradient of lnf
        tp_all_reduce(c, a->da.lnf, (size_t)N * C, TP_SUM, TP_SITE_HEAD_F);
        m->k->layernorm_backward(a->da.encoded, g[1], g[1] + C, a->da.lnf, NULL, x, w[1], a->a.lnf_mean,
                                 a->a.lnf_rstd, N, C);
    } else {       // f's backward: a reduce-scatter onto this rank's positions; lnfw, lnfb partial
        tp_seq_reduce_scatter(c, a->da.lnf, a->lnf_local, a->B, a->T, C, TP_SITE_HEAD_F);
        m->k->layernorm_backward(a->da.encoded, g[1], g[1] + C, a->lnf_local, NULL, x, w[1], a->a.lnf_mean,
                                 a->a.lnf_rstd, a->rows, C);
    }
    gpt2_piece_grads_done(m, &p);
}

// The replicated tensors whose gradients SP leaves partial (each rank: its positions' share).
static const int sp_partial[GPT2_BLOCK_TENSORS] = {1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1};

void tp_sp_grads_all_reduce(GPT2 *m, TpComm *c) {
    LAB_CHECK(m->sp, "tp_sp_grads_all_reduce without sequence parallelism");
    const int nb = m->l1 - m->l0;
    const size_t C = (size_t)m->cfg.C, n = (size_t)(6 * nb + (m->has_head ? 2 : 0)) * C;
    size_t in_block[GPT2_BLOCK_TENSORS];  // where a tensor starts in a block unit
    const GPT2BlockDims d = tp_block_dims(m->cfg.C, m->cfg.NH, m->tp);
    gpt2_block_layout(&d, in_block, NULL);
    // (the host's pack is not counted; a device's is communication memory)
    float *pack = m->dev == DEV_CPU ? lab_xmalloc(n * sizeof(float)) : mem_alloc(n * sizeof(float), MEM_COMM, m->dev);
    for (int pass = 0; pass < 2; pass++) {  // 0: pack, 1: unpack the sums
        size_t at = 0;
        for (int j = 0; j <= nb; j++)  // the blocks' six partial tensors each, then lnfw, lnfb
            for (int i = 0; i < (j < nb ? GPT2_BLOCK_TENSORS : m->has_head ? 2 : 0); i++) {
                if (j < nb && !sp_partial[i]) continue;
                const size_t off = j < nb ? gpt2_block_unit(m, m->l0 + j)->offset + in_block[i]
                                          : m->units[m->has_embed + nb].offset + (size_t)i * C;
                if (m->dtype == GPT2_BF16) {
                    if (pass == 0) m->k->bf16_to_f32(pack + at, m->grads_bf16 + off, C);
                    else m->k->f32_to_bf16(m->grads_bf16 + off, pack + at, C);
                } else if (pass == 0) mem_copy(pack + at, m->grads + off, C * sizeof(float));
                else mem_copy(m->grads + off, pack + at, C * sizeof(float));
                at += C;
            }
        LAB_CHECK(at == n, "tp_sp_grads_all_reduce: packed %zu of %zu", at, n);
        if (pass == 0) tp_all_reduce(c, pack, n, TP_SUM, TP_SITE_SP_GRADS);
    }
    if (m->dev == DEV_CPU) free(pack);
    else mem_free(pack);
}

float tp_forward(GPT2 *m, GPT2Acts *a, TpComm *c) {
    if (m->has_embed) tp_embed_forward(m, a, c);
    for (int l = m->l0; l < m->l1; l++) tp_block_forward(m, a, c, l, NULL);
    return m->has_head ? tp_head_forward(m, a, c) : 0.0f;
}

void tp_backward(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss) {
    if (m->has_head) tp_head_backward(m, a, c, dloss);
    for (int l = m->l1 - 1; l >= m->l0; l--) tp_block_backward(m, a, c, l, NULL, NULL);
    if (m->has_embed) tp_embed_backward(m, a, c);
}

void tp_backward_input(GPT2 *m, GPT2Acts *a, TpComm *c, float dloss) {
    if (m->has_head) tp_head_backward(m, a, c, dloss);
    for (int l = m->l1 - 1; l >= m->l0; l--) tp_block_backward_input(m, a, c, l, NULL);
    if (m->has_embed) tp_embed_backward(m, a, c);
}

void tp_backward_weights(GPT2 *m, GPT2Acts *a) {
    for (int l = m->l1 - 1; l >= m->l0; l--) tp_block_backward_weights(m, a, l, NULL);
}

// ---- the clipping norm -----------------------------------------------------------------------------

void tp_norm_parts(const GPT2 *m, size_t lo, size_t hi, const void *g, double sq[2]) {
    const size_t e = m->dtype == GPT2_BF16 ? sizeof(uint16_t) : sizeof(float);
    sq[0] = sq[1] = 0.0;
    if (own_path(m)) {  // the tied copy, where there is one, is the buffer's last unit
        const size_t end = m->has_head && !m->has_embed ? m->wte_offset : m->num_params;
        const size_t to = hi < end ? hi : end;
        if (lo < to) sq[0] = train_grad_sum_squares(m, g, to - lo);
        return;
    }
    for (int i = 0; i < m->nplist; i++) {
        const GPT2Param *p = &m->plist[i];
        const size_t b = p->offset, en = b + p->size;
        const size_t from = b > lo ? b : lo, to = en < hi ? en : hi;  // the tensor's part in range
        if (p->tied_copy || from >= to) continue;
        sq[p->sliced ? 0 : 1] += train_grad_sum_squares(m, (const char *)g + (from - lo) * e,
                                                         to - from);
    }
    // Each TP rank counts the replicated tensors from its own copy, so a NaN/Inf in one rank's
    // copy (a fault on that rank) would be seen by that rank alone: put it into the sliced
    // part too, which the caller sums over the TP group, and every rank finds it (--on-nan: one
    // decision everywhere). A finite part changes nothing.
    if (!isfinite(sq[1])) sq[0] = sq[1];
}

// ---- the halves ------------------------------------------------------------------------------------

void tp_attn_forward(TpBlockRun *b, const float *inp) {
    const Kernels *k = b->k;
    const int N = b->N, C = b->d.C, Cl = b->d.ATT, NHl = b->d.NH;
    // column-parallel: q, k, v of this rank's heads, (N,3Cl) rows [Q_r; K_r; V_r]
    k->matmul_forward(b->x.qkv, inp, b->w.qkvw, b->w.qkvb, N, C, 3 * Cl);
    // Cl channels of NHl heads: the head size Cl/NHl = C/NH, so the scale is the full model's
    k->attention_forward(b->x.atty, b->x.preatt, b->x.att, b->x.qkv, b->B, b->T, Cl, NHl);
    // row-parallel: this rank's columns of the projection, a partial sum, no bias
    k->matmul_forward(b->x.attproj, b->x.atty, b->w.attprojw, NULL, N, Cl, C);
}

void tp_attn_backward(TpBlockRun *b, const float *inp, const float *dout, float *dinp) {
    const Kernels *k = b->k;
    const int N = b->N, C = b->d.C, Cl = b->d.ATT, NHl = b->d.NH;
    k->matmul_backward(b->s.datty, b->dw.attprojw, NULL, dout, b->x.atty, b->w.attprojw, N, Cl, C);
    k->attention_backward(b->s.dqkv, b->s.dpreatt, b->s.datt, b->s.datty, b->x.qkv, b->x.att, b->B, b->T, Cl, NHl);
    k->matmul_backward(dinp, b->dw.qkvw, b->dw.qkvb, b->s.dqkv, inp, b->w.qkvw, N, C, 3 * Cl);
}

void tp_mlp_forward(TpBlockRun *b, const float *inp) {
    const Kernels *k = b->k;
    const int N = b->N, C = b->d.C, Hl = b->d.FC;
    k->matmul_forward(b->x.fch, inp, b->w.fcw, b->w.fcb, N, C, Hl);        // column-parallel
    k->gelu_forward(b->x.fch_gelu, b->x.fch, (size_t)N * Hl);
    k->matmul_forward(b->x.fcproj, b->x.fch_gelu, b->w.fcprojw, NULL, N, Hl, C);  // row-parallel, partial
}

void tp_mlp_backward(TpBlockRun *b, const float *inp, const float *dout, float *dinp) {
    const Kernels *k = b->k;
    const int N = b->N, C = b->d.C, Hl = b->d.FC;
    // EXERCISE 07.2 Column and row parallel MLP backward -> 07_tensor_parallel/README.md#exercise-072-column-and-row-parallel-mlp-backward
    k->matmul_backward(b->s.dfch_gelu, b->dw.fcprojw, NULL, dout, b->x.fch_gelu, b->w.fcprojw, N, Hl, C);
    k->gelu_backward(b->s.dfch, b->x.fch, b->s.dfch_gelu, (size_t)N * Hl);
    k->matmul_backward(dinp, b->dw.fcw, b->dw.fcb, b->s.dfch, inp, b->w.fcw, N, C, Hl);
    // END EXERCISE 07.2
}

// ---- the vocabulary's loss -------------------------------------------------------------------------

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

// ---- sequence parallelism's collectives ------------------------------------------------------------

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
