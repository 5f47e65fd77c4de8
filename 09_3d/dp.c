// dp.c: chapter 09's data-parallel layer (dp.h): DDP's average, ZeRO-1, -2 and -3 and FSDP over
// the replicas of a chunk, on common/zero.h's layouts of the chunk's buffer.
#include "dp.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"
#include "tp.h"
#include "trace.h"
#include "train.h"

void dpl_check(const DplOpts *o, int split_schedule) {
    const char *valid = "over DP 09 offers --zero 0 (DDP's average), 1 (ZeRO-1: Adam's state sharded "
                        "over the replicas), 2 (ZeRO-2: the gradients reduce-scattered every "
                        "micro-batch too), 3 (ZeRO-3: the weights sharded too), or --fsdp (FSDP's "
                        "by-unit shards, with --prefetch N and --reshard-after-forward 0|1)";
    if (o->zero < 0 || o->zero > 3) lab_fail_collective("--zero %d: %s", o->zero, valid);
    if (o->fsdp && o->zero) lab_fail_collective("--fsdp with --zero %d: %s", o->zero, valid);
    if (!o->fsdp && (o->prefetch >= 0 || o->reshard >= 0))
        lab_fail_collective("--prefetch and --reshard-after-forward shape FSDP's gathers: add --fsdp; %s",
                            valid);
    if (split_schedule && (o->zero == 3 || o->fsdp))
        lab_fail_collective("--schedule zb with %s: a W op adds a block's weight gradient after its "
                            "micro-batch's gradient was reduce-scattered unit by unit; use --zero 0, "
                            "1 or 2 with zb, or another schedule (gpipe, 1f1b, interleaved)",
                            o->fsdp ? "--fsdp" : "--zero 3");
}

// ---- sharded weights (ZeRO-3, FSDP): chunk c's units around this rank's pieces ---------------

// The unit of chunk m holding the wte the head reads: the embedding's, or the tied copy.
static int wte_unit(const GPT2 *m) { return m->has_embed ? 0 : m->nunits - 1; }
static int head_unit(const GPT2 *m) { return m->has_embed + (m->l1 - m->l0); }

// My pieces of the chunk's (initialized) whole weights into the shard buffers, then the whole
// weights freed: from here on every read of a unit goes through its gather.
static void shard_alloc(DpLayer *d, int c, uint64_t seed) {
    GPT2 *m = d->m[c];
    const ZeroLayout *z = &d->z[c];
    ZeroShard *b = &d->b[c];
    *b = zero_shard_of(m, m->plist, m->nplist);
    const size_t e = dist_dtype_size(b->dt);
    const int bf16 = m->dtype == GPT2_BF16;
    char *whole = bf16 ? (char *)m->params_bf16 : (char *)m->params;
    b->params = mem_alloc(z->shard_n * e, MEM_PARAMS, m->dev);
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        mem_copy((char *)b->params + p->local * e, whole + (p->unit_offset + p->begin) * e, p->count * e);
    }
    b->grads = train_grads(m);
    b->grads_full = 1;
    if (bf16) {  // my pieces of the fp32 master: the initial weights, unrounded
        b->master = zero_master_pieces(z, m, seed);
    } else {  // the weights' pieces themselves
        b->master = b->params;
    }
    b->opt_m = mem_alloc(z->shard_n * sizeof(float), MEM_OPT_M, m->dev);
    b->opt_v = mem_alloc(z->shard_n * sizeof(float), MEM_OPT_V, m->dev);
    mem_free(whole);
    m->params = NULL, m->params_bf16 = NULL;
    d->U[c] = lab_xcalloc((size_t)m->nunits, sizeof(ZeroUnit));
    d->st[c] = lab_xcalloc((size_t)m->nunits, 1);
    d->defer[c] = m->has_embed != m->has_head ? wte_unit(m) : -1;
}

static void unit_start(DpLayer *d, int c, int u) {
    if (d->st[c][u]) return;
    const ZeroShard *b = &d->b[c];
    int tok = trace_begin("dp all-gather", TRACE_COMM);
    zero_unit_gather_direct(&d->z[c], u, &d->U[c][u], b->params, b->dt, d->m[c]->dev, d->grid->dpg);
    trace_end(tok);
    d->st[c][u] = 1;
}

static const void *unit_ready(DpLayer *d, int c, int u) {
    unit_start(d, c, u);
    if (d->st[c][u] == 1) zero_unit_wait(&d->U[c][u], u);
    d->st[c][u] = 2;
    return d->U[c][u].w;
}

static void unit_release(DpLayer *d, int c, int u) {
    if (!d->st[c][u]) return;
    if (d->st[c][u] == 1) zero_unit_wait(&d->U[c][u], u);
    zero_unit_free(&d->U[c][u]);
    d->st[c][u] = 0;
}

static void release_all(DpLayer *d) {
    for (int c = 0; d->sharded && c < d->v; c++)
        for (int u = 0; u < d->m[c]->nunits; u++) unit_release(d, c, u);
}

// One piece a micro-batch runs on chunk m and the units whose whole weights it reads.
typedef struct UnitOp {
    int kind;     // 0 the embedding, 1 block l, 2 the head
    int l;
    int need[2], nneed;
} UnitOp;

// The pieces of a forward (embedding, blocks, head) or a backward (head, blocks down, the
// embedding, which reads no weights) in order; returns the count.
static int unit_ops(const GPT2 *m, int backward, UnitOp *ops) {
    int n = 0;
    const UnitOp head = {2, -1, {head_unit(m), wte_unit(m)}, 2};
    if (backward && m->has_head) ops[n++] = head;
    if (!backward && m->has_embed) ops[n++] = (UnitOp){0, -1, {0, 0}, 1};
    for (int i = 0; i < m->l1 - m->l0; i++) {
        const int l = backward ? m->l1 - 1 - i : m->l0 + i;
        ops[n++] = (UnitOp){1, l, {m->has_embed + (l - m->l0), 0}, 1};
    }
    if (!backward && m->has_head) ops[n++] = head;
    if (backward && m->has_embed) ops[n++] = (UnitOp){0, -1, {0, 0}, 0};
    return n;
}

static int op_needs(const UnitOp *o, int u) {
    for (int i = 0; i < o->nneed; i++)
        if (o->need[i] == u) return 1;
    return 0;
}

// Chunk c's pieces of one micro-batch, forward or backward: before piece k the gathers of the
// units pieces k .. k + prefetch read are started (the later ones overlap piece k's compute),
// piece k's waited for; after it the units the next piece does not read are freed (a forward's
// only with reshard). Every gather started here is waited here: none is in flight when the DP
// group's other collectives run.
static float walk_units(DpLayer *d, int c, GPT2Acts *a, TpComm *comm, int backward, float dloss) {
    GPT2 *m = d->m[c];
    UnitOp *ops = lab_xcalloc((size_t)(m->l1 - m->l0 + 2), sizeof(UnitOp));
    const int n = unit_ops(m, backward, ops);
    float loss = 0;
    for (int k = 0; k < n; k++) {
        for (int j = k; j < n && j <= k + d->prefetch; j++)
            for (int i = 0; i < ops[j].nneed; i++) unit_start(d, c, ops[j].need[i]);
        const UnitOp *o = &ops[k];
        const void *w0 = o->nneed > 0 ? unit_ready(d, c, o->need[0]) : NULL;
        const void *w1 = o->nneed > 1 ? unit_ready(d, c, o->need[1]) : NULL;
        if (!backward) {
            if (o->kind == 0) tp_embed_forward_w(m, a, comm, w0);
            else if (o->kind == 1) tp_block_forward(m, a, comm, o->l, w0);
            else loss = tp_head_forward_w(m, a, comm, w1, w0);
        } else {
            if (o->kind == 2) tp_head_backward_w(m, a, comm, dloss, w1, w0);
            else if (o->kind == 1) tp_block_backward(m, a, comm, o->l, w0, NULL);
            else tp_embed_backward(m, a, comm);
        }
        if (!d->reshard) continue;  // FSDP's --reshard-after-forward 0: kept to the update
        for (int i = 0; i < o->nneed; i++)
            if (k + 1 >= n || !op_needs(&ops[k + 1], o->need[i])) unit_release(d, c, o->need[i]);
    }
    free(ops);
    return loss;
}

float dpl_forward(DpLayer *d, int c, GPT2Acts *a, TpComm *comm) {
    if (!d->sharded) return tp_forward(d->m[c], a, comm);
    return walk_units(d, c, a, comm, 0, 0);
}

void dpl_backward(DpLayer *d, int c, GPT2Acts *a, TpComm *comm, float dloss) {
    if (!d->sharded) {
        tp_backward(d->m[c], a, comm, dloss);
        return;
    }
    walk_units(d, c, a, comm, 1, dloss);
}

// Every replica's pieces of chunk c's buffer `mine` (my pieces, dt) all-gathered into `whole`
// (the chunk's layout), unit by unit: the pieces of either layout.
static void gather_units(const DpLayer *d, int c, const void *mine, void *whole, DistDtype dt) {
    const ZeroLayout *z = &d->z[c];
    const size_t e = dist_dtype_size(dt);
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        zero_unit_all_gather(z, u, (const char *)mine + p->local * e, (char *)whole + p->unit_offset * e,
                             dt, 0, d->grid->dpg);
    }
}

void dpl_weights_to_host(DpLayer *d, int c, float *host) {
    GPT2 *m = d->m[c];
    if (!d->sharded) {
        gpt2_weights_to_host(m, host);
        return;
    }
    const ZeroShard *b = &d->b[c];
    const size_t n = m->num_params, e = dist_dtype_size(b->dt);
    void *whole = mem_alloc(n * e, MEM_OTHER, m->dev);
    gather_units(d, c, b->params, whole, b->dt);
    if (b->dt == DIST_F32) {
        mem_copy(host, whole, n * sizeof(float));
    } else {
        uint16_t *h = lab_xmalloc(n * 2);
        mem_copy(h, whole, n * 2);
        for (size_t i = 0; i < n; i++) host[i] = bf16_to_f32(h[i]);
        free(h);
    }
    mem_free(whole);
}

void dpl_init(DpLayer *d, const DplOpts *o, GPT2 **m, int v, const Grid *g, uint64_t seed) {
    memset(d, 0, sizeof *d);
    const int zero = o->zero;
    d->zero = zero, d->v = v, d->m = m, d->grid = g;
    d->fsdp = o->fsdp;
    d->sharded = zero == 3 || o->fsdp;
    d->prefetch = o->fsdp && o->prefetch >= 0 ? o->prefetch : 1;
    d->reshard = o->fsdp && o->reshard >= 0 ? o->reshard : 1;
    d->U = lab_xcalloc((size_t)v, sizeof(ZeroUnit *));
    d->st = lab_xcalloc((size_t)v, sizeof(unsigned char *));
    d->defer = lab_xcalloc((size_t)v, sizeof(int));
    d->z = lab_xcalloc((size_t)v, sizeof(ZeroLayout));
    d->b = lab_xcalloc((size_t)v, sizeof(ZeroShard));
    d->tied_lo = lab_xcalloc((size_t)v, sizeof(size_t));
    d->tied_hi = lab_xcalloc((size_t)v, sizeof(size_t));
    for (int c = 0; c < v; c++) {
        if (d->sharded) {  // the chunk's units cut over the replicas: 05's flat way, or FSDP's
            if (o->fsdp) zero_layout_init(&d->z[c], m[c], g->dp, g->c.d);
            else zero_layout_init_flat(&d->z[c], m[c], g->dp, g->c.d);
            shard_alloc(d, c, seed);
            continue;
        }
        // my piece of the chunk's flat buffer: shard_range(n, dp, d) (--zero 0: all of it)
        zero_layout_init_buffer(&d->z[c], m[c]->num_params, zero ? g->dp : 1, zero ? g->c.d : 0);
        zero_shard_alloc(&d->b[c], &d->z[c], m[c], seed);
        // one end of the tied wte (the embedding's chunk without the head, or the head's
        // without the embedding): its span waits for the ends' sum
        if (m[c]->has_embed != m[c]->has_head) {
            d->tied_lo[c] = m[c]->wte_offset;
            d->tied_hi[c] = m[c]->wte_offset + gpt2_wte_elems(m[c]);
        }
    }
}

void dpl_free(DpLayer *d) {
    release_all(d);
    for (int c = 0; c < d->v; c++) {
        if (d->sharded) {
            ZeroShard *b = &d->b[c];
            if (b->master != b->params) mem_free(b->master);
            mem_free(b->params), mem_free(b->opt_m), mem_free(b->opt_v);
            free(d->U[c]), free(d->st[c]);
        } else {
            zero_shard_free(&d->b[c]);
        }
        zero_layout_free(&d->z[c]);
    }
    free(d->b), free(d->z), free(d->tied_lo), free(d->tied_hi);
    free(d->U), free(d->st), free(d->defer);
    memset(d, 0, sizeof *d);
}

int dpl_loss_divisor(const DpLayer *d) { return d->zero == 2 || d->sharded ? d->grid->dp : 1; }

// Zeroes [lo, hi) of g (e bytes an element) but my piece [a, b).
static void zero_but(char *g, size_t e, size_t lo, size_t hi, size_t a, size_t b) {
    const size_t x = a < lo ? lo : a > hi ? hi : a, y = b < x ? x : b > hi ? hi : b;
    mem_zero(g + lo * e, (x - lo) * e);
    mem_zero(g + y * e, (hi - y) * e);
}

// Sharded: unit u's gradient summed over the replicas, my piece landing in place on its running
// sum, the rest of the unit zeroed for the next micro-batch (ZeRO-2's rule, unit by unit).
static void unit_reduce_scatter(DpLayer *d, int c, int u) {
    const ZeroLayout *z = &d->z[c];
    const ZeroPiece *p = &z->p[u];
    const DistDtype dt = d->b[c].dt;
    const size_t e = dist_dtype_size(dt);
    char *unit = (char *)d->b[c].grads + p->unit_offset * e;
    zero_unit_reduce_scatter(z, u, unit, unit + p->begin * e, dt, DIST_SUM, 0, d->grid->dpg);
    if (z->N == 1) return;
    zero_but(unit, e, 0, p->unit_size, p->begin, p->begin + p->count);
}

void dpl_after_backward(DpLayer *d, int c) {
    if (d->sharded) {
        int tok = trace_begin("dp reduce-scatter", TRACE_COMM);
        for (int u = 0; u < d->z[c].nunits; u++)
            if (u != d->defer[c]) unit_reduce_scatter(d, c, u);
        trace_end(tok);
        return;
    }
    if (d->zero != 2) return;
    GPT2 *m = d->m[c];
    const ZeroLayout *z = &d->z[c];
    const DistDtype dt = train_dtype(m);  // bf16: half the bytes, as 03
    const size_t e = dist_dtype_size(dt), n = m->num_params, t0 = d->tied_lo[c], t1 = d->tied_hi[c];
    char *g = train_grads(m);
    // this micro-batch's gradient outside the tied span summed over the replicas: my part lands
    // on my piece's running sum (the backward added to it), the rest is zeroed for the next one
    int tok = trace_begin("dp reduce-scatter", TRACE_COMM);
    zero_range_reduce_scatter(z, 0, t0, g, dt, DIST_SUM, d->grid->dpg);
    zero_range_reduce_scatter(z, t1, n, g, dt, DIST_SUM, d->grid->dpg);
    trace_end(tok);
    if (z->N == 1) return;
    const size_t a = z->shard_begin, b = a + z->shard_n;
    zero_but(g, e, 0, t0, a, b);
    zero_but(g, e, t1, n, a, b);
}

// Sharded: the deferred units reduced (the tied ends summed by now), the norm from my pieces,
// AdamW on them; the weights stay in pieces (the next step gathers them again).
static double sharded_step(DpLayer *d, const AdamW *h, int step) {
    release_all(d);  // --reshard-after-forward 0: the step's units, stale after the update
    int tok = trace_begin("dp reduce-scatter", TRACE_COMM);
    for (int c = 0; c < d->v; c++)
        if (d->defer[c] >= 0) unit_reduce_scatter(d, c, d->defer[c]);
    trace_end(tok);
    double sq[2] = {0, 0};
    for (int c = 0; c < d->v; c++) {
        GPT2 *m = d->m[c];
        const size_t e = dist_dtype_size(d->b[c].dt);
        for (int u = 0; u < d->z[c].nunits; u++) {
            const ZeroPiece *p = &d->z[c].p[u];
            const size_t lo = p->unit_offset + p->begin;
            double part[2];
            tp_norm_parts(m, lo, lo + p->count, (const char *)d->b[c].grads + lo * e, part);
            sq[0] += part[0], sq[1] += part[1];
        }
    }
    dist_all_reduce(sq, sq, 2, DIST_F64, DIST_SUM, d->grid->dpg);
    const double norm_sq = grid_clip_norm_sq(d->grid, sq);
    const float scale = adamw_clip_scale(h, norm_sq, step);
    for (int c = 0; c < d->v; c++) zero_adamw(&d->z[c], &d->b[c], h, step, scale);
    return norm_sq;
}

double dpl_step(DpLayer *d, const AdamW *h, int step) {
    if (d->sharded) return sharded_step(d, h, step);
    const Grid *grid = d->grid;
    // 1. DP: average every chunk's gradients over the replicas holding the same slice, or
    //    (ZeRO-1) reduce-scatter them, each replica keeping the average of its piece only (in
    //    place), or (ZeRO-2) reduce-scatter what is left: the tied span
    int tok = trace_begin(d->zero ? "dp reduce-scatter" : "dp all-reduce", TRACE_COMM);
    for (int c = 0; c < d->v; c++) {
        GPT2 *m = d->m[c];
        char *g = train_grads(m);
        const DistDtype dt = train_dtype(m);
        const size_t lo = d->z[c].shard_begin, n = m->num_params;
        if (d->zero == 0 && grid->dp > 1) dist_all_reduce(g, g, n, dt, DIST_AVG, grid->dpg);
        if (d->zero == 1) dist_reduce_scatter_n(g, g + lo * dist_dtype_size(dt), n, dt, DIST_AVG, grid->dpg);
        if (d->zero == 2)
            zero_range_reduce_scatter(&d->z[c], d->tied_lo[c], d->tied_hi[c], g, dt, DIST_SUM, grid->dpg);
    }
    trace_end(tok);
    // 2. The global norm over TP x PP (replicated tensors once; ZeRO: over the pieces, summed
    //    over DP too: they are disjoint), then AdamW on what this rank updates
    double sq[2] = {0, 0};
    for (int c = 0; c < d->v; c++) {
        GPT2 *m = d->m[c];
        const size_t lo = d->z[c].shard_begin, hi = lo + d->z[c].shard_n;
        double part[2];
        tp_norm_parts(m, lo, hi, (const char *)train_grads(m) + lo * dist_dtype_size(train_dtype(m)), part);
        sq[0] += part[0], sq[1] += part[1];
    }
    if (d->zero) dist_all_reduce(sq, sq, 2, DIST_F64, DIST_SUM, grid->dpg);
    const double norm_sq = grid_clip_norm_sq(grid, sq);
    const float scale = adamw_clip_scale(h, norm_sq, step);
    for (int c = 0; c < d->v; c++) {
        zero_adamw(&d->z[c], &d->b[c], h, step, scale);
        // 3. ZeRO: every replica's updated piece all-gathered into the whole chunk's weights,
        //    in place: fp32 the weights themselves, bf16 the bf16 weights the forward reads
        //    (half the bytes; the master exists for the piece only)
        if (!d->zero) continue;
        tok = trace_begin("dp all-gather", TRACE_COMM);
        zero_gather_params(&d->z[c], &d->b[c], grid->dpg);
        trace_end(tok);
    }
    return norm_sq;
}

void *dpl_grad_first(const DpLayer *d) {
    GPT2 *m = d->m[0];
    size_t at = d->zero == 2 ? d->z[0].shard_begin : 0;
    for (int u = 0; d->sharded && u < d->z[0].nunits; u++)  // my first piece's first element
        if (d->z[0].p[u].count) {
            at = d->z[0].p[u].unit_offset + d->z[0].p[u].begin;
            break;
        }
    return (char *)train_grads(m) + at * dist_dtype_size(train_dtype(m));
}

const float *dpl_whole_state(const DpLayer *d, int c, DplState which, float **owned) {
    const GPT2 *m = d->m[c];
    const ZeroShard *b = &d->b[c];
    *owned = NULL;
    if (which == DPL_MASTER && b->master_full) return b->master;  // fp32: the weights, whole
    const float *buf = which == DPL_MASTER ? b->master : which == DPL_ADAM_M ? b->opt_m : b->opt_v;
    if (!d->zero && !d->sharded) return buf;
    *owned = mem_alloc(m->num_params * sizeof(float), MEM_OTHER, m->dev);
    if (d->sharded) {
        gather_units(d, c, buf, *owned, DIST_F32);
        return *owned;
    }
    dist_all_gather_n(buf, *owned, m->num_params, DIST_F32, d->grid->dpg);
    return *owned;
}

void dpl_my_pieces(const DpLayer *d, int c, float *p, float *m, float *v, float *held) {
    const ZeroShard *b = &d->b[c];
    const ZeroLayout *z = &d->z[c];
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *q = &z->p[u];
        const size_t at = q->unit_offset + q->begin, bytes = q->count * sizeof(float);
        if (!q->count) continue;
        mem_copy(p + at, b->master + (b->master_full ? at : q->local), bytes);
        mem_copy(m + at, b->opt_m + q->local, bytes);
        mem_copy(v + at, b->opt_v + q->local, bytes);
        for (size_t i = 0; i < q->count; i++) held[at + i] = 1.0f;
    }
}

void dpl_take_state(DpLayer *d, int c, const float *w, const float *fm, const float *fv) {
    GPT2 *m = d->m[c];
    const ZeroShard *b = &d->b[c];
    const ZeroLayout *z = &d->z[c];
    float *whole = lab_xmalloc(m->num_params * sizeof(float));
    // the master: fp32 the whole weights; bf16 my piece, rounded into the weights the forward
    // reads, every replica's piece all-gathered
    gpt2_shard(m, w, whole);
    release_all(d);  // gathered units of the old weights
    if (d->sharded) {  // my pieces of the master; bf16 rounded into my pieces of the weights
        zero_take_pieces(z, whole, b->master, 0);
        if (b->dt == DIST_BF16) m->k->f32_to_bf16(b->params, b->master, z->shard_n);
    } else if (b->master_full) {  // fp32: the weights themselves, whole on every replica
        mem_copy(b->master, whole, m->num_params * sizeof(float));
    } else {
        zero_take_pieces(z, whole, b->master, 0);
        zero_shard_master_to_params(z, b);
        zero_gather_params(z, b, d->grid->dpg);  // (one part: nothing to gather)
    }
    if (fm) {
        gpt2_shard(m, fm, whole);
        zero_take_pieces(z, whole, b->opt_m, 0);
        gpt2_shard(m, fv, whole);
        zero_take_pieces(z, whole, b->opt_v, 0);
    }
    free(whole);
}
