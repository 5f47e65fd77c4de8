// tp_model.c: one rank's share of a tensor-parallel GPT-2 (see tp_model.h).
#include "tp_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"

// ---- the flat buffers, on a device, in a precision ---------------------------------------------

// Bytes per stored element (params_bf16, the stored activations) of dtype.
static size_t esize(GPT2Dtype dtype) { return dtype == GPT2_BF16 ? sizeof(uint16_t) : sizeof(float); }

// The weights and gradients: a GPT2 TP slice (gpt2_build_tp: its layout, its buffers on dev,
// bf16's work buffers, the initial weights), seen through the stage's fields. CUDA: the batch's
// device copies. (The optimizer's state is the caller's: TpOpt.)
static void storage_alloc(TpStage *st, uint64_t seed) {
    GPT2 *g = &st->g;
    gpt2_build_tp(g, st->cfg, st->dev, st->dtype, st->l0, st->l1, st->tp, st->r);
    gpt2_alloc_grads(g);
    gpt2_init_params(g, seed);
    st->n = g->num_params;
    st->params = g->params, st->grads = g->grads;
    st->params_bf16 = g->params_bf16, st->grads_bf16 = g->grads_bf16;
    st->x.work = g->work, st->x.work_grads = g->work_grads, st->x.work_size = g->work_size;
    const size_t N = (size_t)st->B * st->T;
    if (st->dev != DEV_CPU) {  // the host's batch and losses cross over (on the host: read in place)
        st->x.inputs = mem_alloc(N * sizeof(int), MEM_OTHER, st->dev);
        st->x.targets = mem_alloc(N * sizeof(int), MEM_OTHER, st->dev);
        st->x.host_losses = lab_xcalloc(N, sizeof(float));
    }
}

static void storage_free(TpStage *st) {
    gpt2_free(&st->g);
    mem_free(st->x.block_in);
    mem_free(st->x.inputs), mem_free(st->x.targets), free(st->x.host_losses);
}

// The stage's slices of gpt2_init_params(seed)'s model, fp32 on the host (n floats, to free).
static float *init_host(const TpStage *st, uint64_t seed) {
    float *h = lab_xcalloc(st->n, sizeof(float));
    gpt2_init_local(&st->g, seed, h);
    return h;
}

// Rows of the residual stream on this rank: B·T, or B·T/t under sequence parallelism.
static size_t stream_rows(const TpStage *c) { return (size_t)c->B * c->T / (size_t)(c->sp ? c->tp : 1); }

// One block's activations for the stage's micro-batch (SP: tp.h's SP set, whose attproj and
// fcproj live in the scratch's one `partial`).
static void block_set_alloc(const TpStage *st, TpBlockActs *a) {
    const GPT2Config *c = &st->cfg;
    if (st->sp) tp_sp_block_acts_alloc(a, st->B, st->T, c->C, c->NH, st->tp, st->s.partial, st->dev);
    else tp_block_acts_alloc(a, st->B, st->T, c->C, c->NH, st->tp, st->dev);
}

// Blocks [l0, l1) of the full model, with the embedding when l0 == 0 and the head when l1 == L.
void tpm_stage_build_opts(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B, int T,
                          uint64_t seed, TpOpts o) {
    memset(st, 0, sizeof *st);
    tp_check_config(&cfg, tp);
    LAB_CHECK(0 <= l0 && l0 < l1 && l1 <= cfg.L, "tp stage: blocks [%d, %d) of %d", l0, l1, cfg.L);
    LAB_CHECK(o.dtype == GPT2_FP32 || o.dtype == GPT2_BF16, "tp_model: dtype %d", (int)o.dtype);
    // SP's partial gradients are summed once per backward (tpm_stage_backward): one batch per
    // step on the whole model (chapter 07), not micro-batches accumulating on a stage
    if (o.sp && (l0 != 0 || l1 != cfg.L))
        lab_fail_collective("tensor-parallel pipeline stages run without sequence parallelism "
                            "(only the whole model, chapter 07, has it)");
    if (o.sp) tp_check_sequence_parallel(T, tp);
    st->cfg = cfg, st->tp = tp, st->r = r, st->l0 = l0, st->l1 = l1, st->B = B, st->T = T, st->sp = o.sp;
    st->has_embed = l0 == 0, st->has_head = l1 == cfg.L;
    st->dev = o.dev, st->dtype = o.dtype;
    st->tv = tp_vocab(cfg.V, tp, r);
    const size_t C = (size_t)cfg.C, nb = (size_t)(l1 - l0), Vl = (size_t)st->tv.Vl;

    // 1. The layout and the weights (tp_model.h): the GPT2 slice's, its tensors and where they start
    storage_alloc(st, seed);
    const GPT2 *g = &st->g;
    st->k = g->k;  // bf16 on CUDA: the matmuls on tensor cores (TF32 inputs)
    LAB_CHECK(g->nplist <= TPM_MAX_PARAMS && nb <= 64, "tp stage: more than %d tensors", TPM_MAX_PARAMS);
    st->nplist = g->nplist;
    for (int i = 0; i < g->nplist; i++) {
        st->plist[i] = g->plist[i];
        st->sharded[i] = g->plist[i].sliced, st->tied_copy[i] = g->plist[i].tied_copy;
    }
    st->off_wte = g->wte_offset;
    if (st->has_embed) st->off_wpe = g->units[0].offset + Vl * C;
    st->off_block = lab_xcalloc(nb, sizeof(size_t));
    for (size_t j = 0; j < nb; j++) st->off_block[j] = gpt2_block_unit(g, l0 + (int)j)->offset;
    if (st->has_head) st->off_lnf = g->units[st->has_embed + nb].offset;
    // 2. The blocks' backward scratch
    if (o.sp) tp_sp_scratch_alloc(&st->s, B, T, cfg.C, cfg.NH, tp, o.dev);
    else tp_scratch_alloc(&st->s, B, T, cfg.C, cfg.NH, tp, o.dev);
    // 3. bf16: the blocks' one fp32 working set, the widened input; a stage that sends its
    //    output, the widened copy of it (tpm_stage_output)
    if (st->dtype == GPT2_BF16) {
        const size_t NC = stream_rows(st) * C;
        block_set_alloc(st, &st->wa);
        st->x.block_in = mem_alloc(NC * sizeof(float), MEM_ACTS, st->dev);
        if (!st->has_head) st->out = mem_alloc(NC * sizeof(float), MEM_ACTS, st->dev);
    }
}

// ---- the optimizer's state: the caller's (tp_model.h) ---------------------------------------------

void tpm_opt_alloc(TpOpt *o, TpStage *st, uint64_t seed, size_t lo, size_t hi) {
    LAB_CHECK(lo <= hi && hi <= st->n, "tpm_opt_alloc: [%zu, %zu) of %zu", lo, hi, st->n);
    const size_t n = hi - lo;
    memset(o, 0, sizeof *o);
    o->lo = lo, o->hi = hi;
    if (st->dtype == GPT2_BF16) {  // the fp32 master of the piece: the initial values, unrounded
        o->master = mem_alloc(n * sizeof(float), MEM_MASTER, st->dev);
        float *h = init_host(st, seed);
        mem_copy(o->master, h + lo, n * sizeof(float));
        free(h);
    } else {
        o->master = st->params + lo;  // the weights themselves
    }
    o->m = mem_alloc(n * sizeof(float), MEM_OPT_M, st->dev);
    o->v = mem_alloc(n * sizeof(float), MEM_OPT_V, st->dev);
}

void tpm_opt_free(TpOpt *o, const TpStage *st) {
    if (st->dtype == GPT2_BF16) mem_free(o->master);
    mem_free(o->m), mem_free(o->v);
    memset(o, 0, sizeof *o);
}

void tpm_stage_set_weights(TpStage *st, const TpOpt *o) {
    if (st->dtype == GPT2_BF16)
        st->k->f32_to_bf16(st->params_bf16 + o->lo, o->master, o->hi - o->lo);
}

static int nblocks(const TpStage *st) { return st->l1 - st->l0; }

// ---- the pieces: embedding, block shards, head ----------------------------------------------------
//
// A piece's weights are one or two spans of the flat buffer. fp32: read (and their gradients
// accumulated) in place. bf16 (gpt2.c's piece mechanism): widened into work before the piece
// runs, its gradients widened into work_grads, accumulated there in fp32 by the backward, and
// rounded back once when the piece's backward is done.

typedef struct Piece {
    int n;               // spans
    size_t off[2], size[2];
} Piece;

static Piece piece_embed(const TpStage *c) {  // wte's local rows (Vl, C), wpe (T, C)
    const size_t C = (size_t)c->cfg.C;
    Piece p = {2, {c->off_wte, c->off_wpe}, {(size_t)c->tv.Vl * C, (size_t)c->cfg.T * C}};
    return p;
}
static Piece piece_block(const TpStage *c, int j) {  // one shard: tp_block_count contiguous elements
    Piece p = {1, {c->off_block[j], 0}, {tp_block_count(c->cfg.C, c->tp), 0}};
    return p;
}
static Piece piece_head(const TpStage *c) {  // wte's local rows (the output layer), lnfw lnfb
    const size_t C = (size_t)c->cfg.C;
    Piece p = {2, {c->off_wte, c->off_lnf}, {(size_t)c->tv.Vl * C, 2 * C}};
    return p;
}

// The piece's spans as fp32, one pointer per span: in place in f32 (fp32), or the bf16 spans of
// b16 widened into work (bf16).
static void piece_fp32(const TpStage *c, const Piece *p, float *f32, const uint16_t *b16, float *work,
                       float *out[2]) {
    size_t at = 0;
    for (int i = 0; i < p->n; i++) {
        if (c->dtype == GPT2_FP32) {
            out[i] = f32 + p->off[i];
            continue;
        }
        out[i] = work + at;
        c->k->bf16_to_f32(out[i], b16 + p->off[i], p->size[i]);
        at += p->size[i];
    }
}
// Its weights; its weight gradients (bf16: the sum so far, widened: the backward adds to it).
static void piece_weights(const TpStage *c, const Piece *p, float *w[2]) {
    piece_fp32(c, p, c->params, c->params_bf16, c->x.work, w);
}
static void piece_grads(const TpStage *c, const Piece *p, float *g[2]) {
    piece_fp32(c, p, c->grads, c->grads_bf16, c->x.work_grads, g);
}

// After the piece's backward: bf16 rounds its fp32 gradients back into their spans, once.
static void piece_grads_done(const TpStage *c, const Piece *p) {
    if (c->dtype == GPT2_FP32) return;
    size_t at = 0;
    for (int i = 0; i < p->n; i++) {
        c->k->f32_to_bf16(c->grads_bf16 + p->off[i], c->x.work_grads + at, p->size[i]);
        at += p->size[i];
    }
}

// The host's batch where the kernels read it: in place on the host, copied to the device.
static const int *batch_on_dev(int *dev_buf, const int *host, size_t n) {
    if (!host || !dev_buf) return host;
    mem_copy(dev_buf, host, n * sizeof(int));
    return dev_buf;
}

// The mean of the N per-position losses (the same on every rank of the group), summed on the
// host in position order.
static float mean_loss(const TpStage *c, const float *losses) {
    const int N = c->B * c->T;
    if (c->x.host_losses) {
        mem_copy(c->x.host_losses, losses, (size_t)N * sizeof(float));
        losses = c->x.host_losses;
    }
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    return (float)(sum / N);
}

// The activations block j computes in: its own set (fp32), the one working set (bf16).
static TpBlockActs *acts_of(const TpStage *c, TpBlockActs *a, int j) {
    return c->dtype == GPT2_BF16 ? a : &a[j];
}

// Elements of one block's saved set (the working set's one allocation).
static size_t set_elems(const TpBlockActs *a) { return mem_size_of(a->mem) / sizeof(float); }

// Block j's stored output, widened into dst (bf16; the stored sets have the working set's layout).
static void stored_output(const TpStage *c, const TpBlockActs *ws, const uint16_t *store, int j, float *dst) {
    const size_t E = set_elems(ws), out = (size_t)(ws->out - ws->mem);
    c->k->bf16_to_f32(dst, store + (size_t)j * E + out, stream_rows(c) * (size_t)c->cfg.C);
}

// The input of local block j (j = nb: of the head): `in` for j = 0; else block j-1's output, in
// place (fp32) or as stored, rounded, widened into block_in (bf16: exactly what a bf16 model's
// next piece reads, in its forward and again in its backward).
static const float *block_input(const TpStage *c, const TpBlockActs *a, const uint16_t *store,
                                const float *in, int j) {
    if (j == 0) return in;
    if (c->dtype == GPT2_FP32) return a[j - 1].out;
    stored_output(c, a, store, j - 1, c->x.block_in);
    return c->x.block_in;
}

static void embed_forward(const TpStage *c, TpComm *comm, float *out, const int *inputs) {
    Piece p = piece_embed(c);
    float *w[2];
    piece_weights(c, &p, w);
    if (c->sp)  // (N/t, C): this rank's positions
        tp_sp_embed_forward(c->k, comm, &c->tv, out, c->s.full, inputs, w[0], w[1], c->B, c->T, c->cfg.C);
    else  // each rank looks up the tokens it owns, one all-reduce of (N, C) sums them
        tp_embed_forward(c->k, comm, &c->tv, out, inputs, w[0], w[1], c->B, c->T, c->cfg.C);
}

static void embed_backward(const TpStage *c, const float *dout, const int *inputs) {
    Piece p = piece_embed(c);
    float *g[2];
    piece_grads(c, &p, g);
    tp_embed_backward(c->k, &c->tv, g[0], g[1], dout, inputs, c->B, c->T, c->cfg.C);
    piece_grads_done(c, &p);
}

// The blocks, forward: a (fp32: nb sets; bf16: the working set, each block's set then stored
// rounded in store), from the stream `in`. g after each half: 2 all-reduces (SP: 2 all-gathers
// and 2 reduce-scatters) per block.
static void blocks_forward(const TpStage *c, TpComm *comm, TpBlockActs *a, uint16_t *store, const float *in) {
    for (int j = 0; j < nblocks(c); j++) {
        Piece p = piece_block(c, j);
        float *w[2];
        piece_weights(c, &p, w);
        TpBlock wv;
        tp_block_views(&wv, w[0], c->cfg.C, c->tp);
        TpBlockActs *aj = acts_of(c, a, j);
        const float *x = block_input(c, a, store, in, j);
        if (c->sp) tp_sp_block_forward(c->k, comm, &wv, aj, (TpScratch *)&c->s, x);
        else tp_block_forward(c->k, comm, &wv, aj, x);
        if (c->dtype == GPT2_BF16) c->k->f32_to_bf16(store + (size_t)j * set_elems(aj), aj->mem, set_elems(aj));
    }
}

// The blocks, backward, from the top: dx the gradient of the last block's output, then of each
// block's input (in place). f at each half's input: 2 all-reduces per block (SP: reduce-scatters,
// and the g's all-gathers).
static void blocks_backward(const TpStage *c, TpComm *comm, TpBlockActs *a, const uint16_t *store,
                            const float *in, float *dx) {
    for (int j = nblocks(c) - 1; j >= 0; j--) {
        Piece p = piece_block(c, j);
        float *w[2], *g[2];
        piece_weights(c, &p, w);
        piece_grads(c, &p, g);
        TpBlock wv, dwv;
        tp_block_views(&wv, w[0], c->cfg.C, c->tp);
        tp_block_views(&dwv, g[0], c->cfg.C, c->tp);
        TpBlockActs *aj = acts_of(c, a, j);
        if (c->dtype == GPT2_BF16)  // the stored set back into the working set
            c->k->bf16_to_f32(aj->mem, store + (size_t)j * set_elems(aj), set_elems(aj));
        const float *x = block_input(c, a, store, in, j);
        if (c->sp) tp_sp_block_backward(c->k, comm, &wv, &dwv, aj, (TpScratch *)&c->s, x, dx, dx);
        else tp_block_backward(c->k, comm, &wv, &dwv, aj, (TpScratch *)&c->s, x, dx, dx);
        piece_grads_done(c, &p);
    }
}

// lnf, logits on this rank's vocabulary rows, the loss from three all-reduces of N floats.
static float head_forward(const TpStage *c, TpComm *comm, TpHeadActs *h, const float *x, const int *targets) {
    Piece p = piece_head(c);
    float *w[2];
    piece_weights(c, &p, w);
    const int C = c->cfg.C;
    if (c->sp) tp_sp_head_forward(c->k, comm, &c->tv, h, x, w[1], w[1] + C, w[0], targets);
    else tp_head_forward(c->k, comm, &c->tv, h, x, w[1], w[1] + C, w[0], targets);
    return mean_loss(c, h->losses);
}

// From the loss; f at the head's input all-reduces d lnf-input (each rank saw only its
// vocabulary columns): dx.
static void head_backward(const TpStage *c, TpComm *comm, TpHeadActs *h, const float *x, const int *targets,
                          float dloss, float *dx) {
    Piece p = piece_head(c);
    float *w[2], *g[2];
    piece_weights(c, &p, w);
    piece_grads(c, &p, g);
    const int C = c->cfg.C;
    if (c->sp)
        tp_sp_head_backward(c->k, comm, &c->tv, h, x, w[1], w[0], g[1], g[1] + C, g[0], targets, dloss, dx);
    else tp_head_backward(c->k, comm, &c->tv, h, x, w[1], w[0], g[1], g[1] + C, g[0], targets, dloss, dx);
    piece_grads_done(c, &p);
}


// The first element of a gradient buffer of `type` := NaN (host or device).
static void poison(void *g, DistDtype type) {
    float nan = NAN;
    uint16_t nan16 = bf16_from_f32(NAN);
    if (type == DIST_BF16) mem_copy(g, &nan16, sizeof nan16);
    else mem_copy(g, &nan, sizeof nan);
}

// The replicated tensors whose gradients SP leaves partial (each rank: its positions' share).
static const int sp_partial[TP_BLOCK_TENSORS] = {1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1};

// Under SP: one all-reduce of the partial gradients, packed, L·6C + 2C floats (fp32 on the wire;
// bf16 widens the stored gradients into the pack and rounds the sums back).
static void sp_grads_all_reduce(const TpStage *k, TpComm *c) {
    const int L = nblocks(k);
    const size_t C = (size_t)k->cfg.C, n = (size_t)(6 * L + 2) * C;
    size_t sizes[TP_BLOCK_TENSORS], in_block[TP_BLOCK_TENSORS];  // where a tensor starts in a shard
    tp_block_sizes(k->cfg.C, k->tp, sizes);
    for (size_t i = 0, at = 0; i < TP_BLOCK_TENSORS; at += sizes[i], i++) in_block[i] = at;
    // (the host's pack is not counted, as before; a device's is communication memory)
    float *pack = k->dev == DEV_CPU ? lab_xmalloc(n * sizeof(float)) : mem_alloc(n * sizeof(float), MEM_COMM, k->dev);
    for (int pass = 0; pass < 2; pass++) {  // 0: pack, 1: unpack the sums
        size_t at = 0;
        for (int t = 0; t <= L; t++)  // the blocks' six partial tensors each, then lnfw, lnfb
            for (int i = 0; i < (t < L ? TP_BLOCK_TENSORS : 2); i++, at += C) {
                if (t < L && !sp_partial[i]) {
                    at -= C;
                    continue;
                }
                size_t off = t < L ? k->off_block[t] + in_block[i] : k->off_lnf + (size_t)i * C;
                if (k->dtype == GPT2_BF16) {
                    if (pass == 0) k->k->bf16_to_f32(pack + at, k->grads_bf16 + off, C);
                    else k->k->f32_to_bf16(k->grads_bf16 + off, pack + at, C);
                } else if (pass == 0) mem_copy(pack + at, k->grads + off, C * sizeof(float));
                else mem_copy(k->grads + off, pack + at, C * sizeof(float));
            }
        LAB_CHECK(at == n, "sp_backward: packed %zu of %zu", at, n);
        if (pass == 0) tp_all_reduce(c, pack, n, TP_SUM, TP_SITE_SP_GRADS);
    }
    if (k->dev == DEV_CPU) free(pack);
    else mem_free(pack);
}

// Σ g² over elements [lo, hi) of the flat buffer, read from g (hi - lo elements of the storage
// precision, from lo): sq[0] the sliced tensors', sq[1] the replicated ones'; the tied copy left out.
static void norm_parts(const TpStage *c, size_t lo, size_t hi, const void *g, double sq[2]) {
    sq[0] = sq[1] = 0.0;
    for (int i = 0; i < c->nplist; i++) {
        const size_t b = c->plist[i].offset, e = b + c->plist[i].size;
        const size_t from = b > lo ? b : lo, to = e < hi ? e : hi;  // the tensor's part in range
        if (c->tied_copy[i] || from >= to) continue;
        if (c->dtype == GPT2_BF16)
            sq[c->sharded[i] ? 0 : 1] += bf16_sum_squares(c->k, (const uint16_t *)g + (from - lo), to - from,
                                                          c->x.work_grads, c->x.work_size);
        else sq[c->sharded[i] ? 0 : 1] += c->k->sum_squares((const float *)g + (from - lo), to - from);
    }
    // Each TP rank counts the replicated tensors from its own copy, so a NaN/Inf in one rank's
    // copy (a fault on that rank) would be seen by that rank alone: put it into the sliced
    // part too, which the caller sums over the TP group, and every rank finds it (--on-nan: one
    // decision everywhere). A finite part changes nothing.
    if (!isfinite(sq[1])) sq[0] = sq[1];
}


// ---- moving the weights in and out (host or device buffers, staged through the host) ------------

void tpm_to_host_f32(float *host, const void *buf, size_t n, DistDtype type) {
    LAB_CHECK(type == DIST_F32 || type == DIST_BF16, "tpm_to_host_f32: fp32 or bf16 buffers only");
    if (type == DIST_F32) {
        mem_copy(host, buf, n * sizeof(float));
        return;
    }
    uint16_t *h16 = lab_xmalloc(n * sizeof(uint16_t));
    mem_copy(h16, buf, n * sizeof(uint16_t));
    kernels_cpu.bf16_to_f32(host, h16, n);
    free(h16);
}

// buf (n floats) readable on the host: itself, or a copy (*tmp, to free).
static const float *on_host(const float *buf, size_t n, float **tmp) {
    *tmp = NULL;
    if (mem_device_of(buf) == DEV_CPU) return buf;
    *tmp = lab_xmalloc(n * sizeof(float));
    mem_copy(*tmp, buf, n * sizeof(float));
    return *tmp;
}
// Where to write n floats meant for buf: buf on the host, else a host buffer (*tmp) that
// to_dev then copies over.
static float *for_host(float *buf, size_t n, float **tmp) {
    *tmp = mem_device_of(buf) == DEV_CPU ? NULL : lab_xcalloc(n, sizeof(float));
    return *tmp ? *tmp : buf;
}
static void to_dev(float *buf, float *tmp, size_t n) {
    if (!tmp) return;
    mem_copy(buf, tmp, n * sizeof(float));
    free(tmp);
}

double tpm_replicated_max_diff(const TpStage *m, const TpOpt *o, DistGroup *g) {
    LAB_CHECK(o->lo == 0 && o->hi == m->n, "tpm_replicated_max_diff: the master is a piece [%zu, %zu)",
              o->lo, o->hi);
    double worst = 0.0;
    float *tmp;
    const float *params = on_host(o->master, m->n, &tmp);
    for (int i = 0; i < m->nplist; i++) {
        if (m->sharded[i]) continue;
        size_t n = m->plist[i].size;
        const float *mine = params + m->plist[i].offset;
        float *ref = lab_xmalloc(n * sizeof(float));
        memcpy(ref, mine, n * sizeof(float));
        dist_broadcast(ref, n, DIST_F32, 0, g);
        for (size_t j = 0; j < n; j++) {
            double d = fabs((double)mine[j] - (double)ref[j]);
            if (!(d <= worst)) worst = d;  // NaN counts as the worst
        }
        free(ref);
    }
    free(tmp);
    dist_all_reduce(&worst, &worst, 1, DIST_F64, DIST_MAX, g);
    return worst;
}

// ---- the stage's work: a micro-batch's activations, forward, backward ----------------------------

void tpm_stage_build(TpStage *st, GPT2Config cfg, int tp, int r, int l0, int l1, int B, int T,
                     uint64_t seed) {
    TpOpts o = {.dev = DEV_CPU, .dtype = GPT2_FP32, .sp = 0};
    tpm_stage_build_opts(st, cfg, tp, r, l0, l1, B, T, seed, o);
}

void tpm_stage_free(TpStage *st) {
    tp_scratch_free(&st->s);
    if (st->dtype == GPT2_BF16) tp_block_acts_free(&st->wa);
    mem_free(st->out);
    storage_free(st);
    free(st->off_block);
    memset(st, 0, sizeof *st);
}

size_t tpm_block_act_floats(const TpStage *st) {
    const size_t N = (size_t)st->B * st->T, C = (size_t)st->cfg.C, t = (size_t)st->tp;
    const size_t att = (size_t)st->B * (size_t)(st->cfg.NH / st->tp) * st->T * st->T;
    // SP: ln1, ln2 gathered (N,C); residual2, out this rank's positions (N/t,C); the 4
    // statistics (N/t); qkv, atty, preatt, att, fch, fch_gelu as below
    if (st->sp) return 2 * N * C + 4 * (N / t) + 4 * N * (C / t) + 2 * att + 2 * (N / t) * C + 2 * N * (4 * C / t);
    // ln1, attproj, residual2, ln2, fcproj, out: (N,C) each, replicated; 4 LayerNorm statistics
    // (N); qkv (N,3C/t) and atty (N,C/t); preatt and att (B,NH/t,T,T); fch, fch_gelu (N,4C/t)
    return 6 * N * C + 4 * N + 4 * N * (C / t) + 2 * att + 2 * N * (4 * C / t);
}

size_t tpm_block_act_bytes(const TpStage *st) { return esize(st->dtype) * tpm_block_act_floats(st); }

void tpm_weight_split(const TpStage *st, size_t *sharded, size_t *replicated) {
    *sharded = *replicated = 0;
    for (int i = 0; i < st->nplist; i++)
        if (!st->tied_copy[i]) *(st->sharded[i] ? sharded : replicated) += st->plist[i].size;
}

void tpm_stage_acts_alloc(TpStageActs *x, const TpStage *st) {
    const int nb = st->l1 - st->l0, C = st->cfg.C;
    const size_t rows = stream_rows(st);
    memset(x, 0, sizeof *x);
    if (st->dtype == GPT2_BF16) {  // the sets stored rounded; they compute in st->wa
        x->a_bf16 = mem_alloc((size_t)nb * tpm_block_act_floats(st) * sizeof(uint16_t), MEM_ACTS, st->dev);
    } else {
        x->a = lab_xcalloc((size_t)nb, sizeof(TpBlockActs));
        for (int j = 0; j < nb; j++) block_set_alloc(st, &x->a[j]);
        LAB_CHECK(set_elems(&x->a[0]) == tpm_block_act_floats(st), "tp_model: a block's set is %zu "
                  "floats, the formula %zu", set_elems(&x->a[0]), tpm_block_act_floats(st));
    }
    if (st->has_head && st->sp) tp_sp_head_acts_alloc(&x->h, st->B, st->T, C, st->tp, &st->tv, st->dev);
    else if (st->has_head) tp_head_acts_alloc(&x->h, st->B * st->T, C, &st->tv, st->dev);
    x->in = mem_alloc(rows * C * sizeof(float), MEM_ACTS, st->dev);
    x->dx = mem_alloc(rows * C * sizeof(float), MEM_ACTS, st->dev);
}

void tpm_stage_acts_free(TpStageActs *x, const TpStage *st) {
    if (x->a)
        for (int j = 0; j < st->l1 - st->l0; j++) tp_block_acts_free(&x->a[j]);
    if (st->has_head) tp_head_acts_free(&x->h);
    mem_free(x->in), mem_free(x->dx), mem_free(x->a_bf16);
    free(x->a);
    memset(x, 0, sizeof *x);
}

size_t tpm_stage_act_bytes(const TpStage *st) {
    const size_t N = (size_t)st->B * st->T, C = (size_t)st->cfg.C, t = (size_t)st->tp;
    const size_t rows = stream_rows(st), Vl = (size_t)st->tv.Vl;
    // the blocks' sets, at the storage's bytes per element
    size_t bytes = (size_t)(st->l1 - st->l0) * tpm_block_act_bytes(st);
    // the head: lnf, dlnf (N,C); mean, rstd (N; SP N/t, and lnf's local part (N/t,C)); losses and
    // the loss's 3 statistics (N); logits and dlogits (N, Vl); in, dx (rows,C): fp32
    size_t floats = 2 * rows * C;
    if (st->has_head && st->sp) floats += 2 * N * C + N / t * C + 2 * (N / t) + 4 * N + 2 * N * Vl;
    else if (st->has_head) floats += 2 * N * C + 6 * N + 2 * N * Vl;
    return bytes + 4 * floats;
}

size_t tpm_stage_work_act_bytes(const TpStage *st) {
    if (st->dtype != GPT2_BF16) return 0;  // wa, block_in and (a stage that sends) out
    return 4 * (tpm_block_act_floats(st) + (st->has_head ? 1 : 2) * stream_rows(st) * (size_t)st->cfg.C);
}

// The activations the stage's blocks compute in: the micro-batch's own sets, or the working set.
static TpBlockActs *stage_sets(TpStage *st, TpStageActs *x) { return x->a ? x->a : &st->wa; }

float tpm_stage_forward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets) {
    const size_t N = (size_t)st->B * st->T;
    const int *in = batch_on_dev(st->x.inputs, inputs, N), *tg = batch_on_dev(st->x.targets, targets, N);
    // the embedding (the vocab-parallel lookup: 1 all-reduce; SP: a reduce-scatter onto this
    // rank's positions), the blocks (g after each half), the head (lnf, logits on this rank's
    // vocabulary rows, the loss from 3 all-reduces of N)
    if (st->has_embed) embed_forward(st, c, x->in, in);
    blocks_forward(st, c, stage_sets(st, x), x->a_bf16, x->in);
    if (!st->has_head) return 0.0f;
    return head_forward(st, c, &x->h, block_input(st, stage_sets(st, x), x->a_bf16, x->in, nblocks(st)), tg);
}

const float *tpm_stage_output(const TpStage *st, const TpStageActs *x) {
    const int nb = nblocks(st);
    if (st->dtype == GPT2_FP32) return x->a[nb - 1].out;
    LAB_CHECK(st->out, "tpm_stage_output: the last stage sends no output");
    stored_output(st, &st->wa, x->a_bf16, nb - 1, st->out);
    return st->out;
}

void tpm_stage_backward(TpStage *st, TpComm *c, TpStageActs *x, const int *inputs,
                        const int *targets, float dloss) {
    const size_t N = (size_t)st->B * st->T;
    const int *in = batch_on_dev(st->x.inputs, inputs, N), *tg = batch_on_dev(st->x.targets, targets, N);
    TpBlockActs *a = stage_sets(st, x);
    if (st->has_head)  // from the loss; f at the head's input: one all-reduce of (N, C)
        head_backward(st, c, &x->h, block_input(st, a, x->a_bf16, x->in, nblocks(st)), tg, dloss, x->dx);
    blocks_backward(st, c, a, x->a_bf16, x->in, x->dx);  // the two f all-reduces per block
    if (!st->has_embed) return;
    if (!st->sp) {
        embed_backward(st, x->dx, in);
        return;
    }
    // SP: the embedding needs every position's gradient (its rows of wte see all the tokens):
    // the reverse of its forward reduce-scatter; dwpe then comes out whole on every rank
    tp_seq_all_gather(c, x->dx, st->s.full, st->B, st->T, st->cfg.C, TP_SITE_EMBED_BWD);
    embed_backward(st, st->s.full, in);
    sp_grads_all_reduce(st, c);
}

void *tpm_stage_grad_buf(const TpStage *st) {
    return st->dtype == GPT2_BF16 ? (void *)st->grads_bf16 : (void *)st->grads;
}
DistDtype tpm_stage_dist_dtype(const TpStage *st) { return st->dtype == GPT2_BF16 ? DIST_BF16 : DIST_F32; }
void *tpm_stage_wte_grad(const TpStage *st) {
    if (!st->has_embed && !st->has_head) return NULL;
    return (char *)tpm_stage_grad_buf(st) + st->off_wte * esize(st->dtype);
}
void tpm_stage_zero_grad(TpStage *st) { mem_zero(tpm_stage_grad_buf(st), st->n * esize(st->dtype)); }
void tpm_stage_poison_grad(TpStage *st) { poison(tpm_stage_grad_buf(st), tpm_stage_dist_dtype(st)); }

void tpm_stage_adamw(TpStage *st, const AdamW *h, int step, const TpOpt *o, const void *grad_shard,
                     float scale) {
    const size_t lo = o->lo, hi = o->hi;  // master, grad, m, v: shard-local from lo (optim.h)
    if (st->dtype == GPT2_BF16)
        adamw_step_bf16(h, st->k, step, o->master, st->params_bf16 + lo, grad_shard, o->m, o->v, lo, hi,
                        st->plist, st->nplist, scale, st->x.work_grads, st->x.work_size);
    else adamw_step(h, st->k, step, o->master, grad_shard, o->m, o->v, lo, hi, st->plist, st->nplist, scale);
}

void tpm_stage_norm_parts_range(const TpStage *st, size_t lo, size_t hi, const void *g, double sq[2]) {
    norm_parts(st, lo, hi, g, sq);
}

void tpm_stage_norm_parts(const TpStage *st, double sq[2]) {
    tpm_stage_norm_parts_range(st, 0, st->n, tpm_stage_grad_buf(st), sq);
}

double tpm_stage_adamw_step(TpStage *st, const AdamW *h, int step, const TpOpt *o, DistGroup *g) {
    // ||grad||² of the FULL model: each slice lives on one rank (sum over the group), each
    // replicated tensor on all of them with the same value (count it once).
    double sq[2];  // sharded, replicated
    tpm_stage_norm_parts(st, sq);
    dist_all_reduce(&sq[0], &sq[0], 1, DIST_F64, DIST_SUM, g);
    float scale = adamw_clip_scale(h, sq[0] + sq[1], step);
    tpm_stage_adamw(st, h, step, o, tpm_stage_grad_buf(st), scale);
    return sq[0] + sq[1];
}

void tpm_unshard(const TpStage *st, const float *buf_any, float *full_mem, int with_replicated) {
    float *tmp;
    gpt2_unshard(&st->g, on_host(buf_any, st->n, &tmp), full_mem, with_replicated);
    free(tmp);
}

void tpm_unshard_weights(const TpStage *st, float *full_mem, int with_replicated) {
    if (st->dtype == GPT2_FP32) {
        tpm_unshard(st, st->params, full_mem, with_replicated);
        return;
    }
    float *w = lab_xmalloc(st->n * sizeof(float));  // the weights the forward reads, widened
    tpm_to_host_f32(w, st->params_bf16, st->n, DIST_BF16);
    tpm_unshard(st, w, full_mem, with_replicated);
    free(w);
}

void tpm_shard(const TpStage *st, const float *full_mem, float *buf_any) {
    float *tmp, *buf = for_host(buf_any, st->n, &tmp);
    gpt2_shard(&st->g, full_mem, buf);
    to_dev(buf_any, tmp, st->n);
}
