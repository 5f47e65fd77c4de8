// dp.c: chapter 09's data-parallel layer (dp.h): DDP's average, ZeRO-1 and ZeRO-2 over the
// replicas of a chunk, on common/zero.h's flat layout of the chunk's buffer.
#include "dp.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"
#include "tp.h"
#include "trace.h"
#include "train.h"

void dpl_check(int zero) {
    if (zero < 0 || zero > 2)
        lab_fail_collective("--zero %d: over DP 09 offers 0 (DDP's average), 1 (ZeRO-1: Adam's "
                            "state sharded over the replicas) or 2 (ZeRO-2: the gradients "
                            "reduce-scattered every micro-batch too); ZeRO-3 is chapter 05's",
                            zero);
}

void dpl_init(DpLayer *d, int zero, GPT2 **m, int v, const Grid *g, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->zero = zero, d->v = v, d->m = m, d->grid = g;
    d->z = lab_xcalloc((size_t)v, sizeof(ZeroLayout));
    d->b = lab_xcalloc((size_t)v, sizeof(ZeroShard));
    d->tied_lo = lab_xcalloc((size_t)v, sizeof(size_t));
    d->tied_hi = lab_xcalloc((size_t)v, sizeof(size_t));
    for (int c = 0; c < v; c++) {
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
    for (int c = 0; c < d->v; c++) {
        zero_shard_free(&d->b[c]);
        zero_layout_free(&d->z[c]);
    }
    free(d->b), free(d->z), free(d->tied_lo), free(d->tied_hi);
    memset(d, 0, sizeof *d);
}

int dpl_loss_divisor(const DpLayer *d) { return d->zero == 2 ? d->grid->dp : 1; }

// Zeroes [lo, hi) of g (e bytes an element) but my piece [a, b).
static void zero_but(char *g, size_t e, size_t lo, size_t hi, size_t a, size_t b) {
    const size_t x = a < lo ? lo : a > hi ? hi : a, y = b < x ? x : b > hi ? hi : b;
    mem_zero(g + lo * e, (x - lo) * e);
    mem_zero(g + y * e, (hi - y) * e);
}

void dpl_after_backward(DpLayer *d, int c) {
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

double dpl_step(DpLayer *d, const AdamW *h, int step) {
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
    const size_t at = d->zero == 2 ? d->z[0].shard_begin : 0;
    return (char *)train_grads(m) + at * dist_dtype_size(train_dtype(m));
}

const float *dpl_whole_state(const DpLayer *d, int c, DplState which, float **owned) {
    const GPT2 *m = d->m[c];
    const ZeroShard *b = &d->b[c];
    *owned = NULL;
    if (which == DPL_MASTER && b->master_full) return b->master;  // fp32: the weights, whole
    const float *buf = which == DPL_MASTER ? b->master : which == DPL_ADAM_M ? b->opt_m : b->opt_v;
    if (!d->zero) return buf;
    *owned = mem_alloc(m->num_params * sizeof(float), MEM_OTHER, m->dev);
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
    if (b->master_full) {  // fp32: the weights themselves, whole on every replica
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
