// zero.c: the ZeRO partitions (flat, and by unit) and the sharded AdamW step.
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt.h"
#include "mem.h"
#include "shard.h"
#include "trace.h"

static void fill_counts(ZeroLayout *z);

// What both layouts share: the model's units, in memory order, and no pieces yet. m may be a
// part of the model (09's chunks: a TP slice of some blocks): its own units, its own offsets.
static void layout_begin(ZeroLayout *z, const GPT2 *m, int N, int r, int flat) {
    LAB_CHECK(m->nunits > 0 && m->units, "ZeRO partitions a model's units: none here");
    memset(z, 0, sizeof *z);
    z->N = N;
    z->r = r;
    z->n = m->num_params;
    z->nunits = m->nunits;
    z->flat = flat;
    z->p = lab_xcalloc((size_t)m->nunits, sizeof(ZeroPiece));
    for (int u = 0; u < m->nunits; u++) {
        z->p[u].unit_offset = m->units[u].offset;
        z->p[u].unit_size = m->units[u].size;
    }
}

void zero_layout_init(ZeroLayout *z, const GPT2 *m, int N, int r) {
    layout_begin(z, m, N, r, 0);
    size_t local = 0;
    for (int u = 0; u < m->nunits; u++) {
        ZeroPiece *p = &z->p[u];
        // rank r's piece of the unit: the first size % N pieces are one element longer
        shard_range(p->unit_size, N, r, &p->begin, &p->count);
        p->local = local;
        local += p->count;
    }
    z->shard_n = local;
    fill_counts(z);
}

static size_t clamp(size_t x, size_t lo, size_t hi) { return x < lo ? lo : x > hi ? hi : x; }

// Rank q's piece of unit u: by unit shard_count(size_u, N, q); flat: u ∩ shard q of the buffer.
static size_t piece_count(const ZeroLayout *z, int u, int q) {
    const ZeroPiece *p = &z->p[u];
    if (!z->flat) return shard_count(p->unit_size, z->N, q);
    size_t qb, qc;
    shard_range(z->n, z->N, q, &qb, &qc);
    const size_t ub = p->unit_offset, ue = ub + p->unit_size;
    return clamp(qb + qc, ub, ue) - clamp(qb, ub, ue);
}

static void fill_counts(ZeroLayout *z) {
    const int N = z->N;
    z->counts = lab_xcalloc((size_t)z->nunits * (size_t)N, sizeof(size_t));
    for (int u = 0; u < z->nunits; u++)
        for (int q = 0; q < N; q++) z->counts[(size_t)u * N + q] = piece_count(z, u, q);
}

void zero_layout_init_flat(ZeroLayout *z, const GPT2 *m, int N, int r) {
    layout_begin(z, m, N, r, 1);
    size_t sb = 0, sc = 0;
    // EXERCISE 05.1 Shard ranges -> 05_zero/README.md#exercise-051-shard-ranges
    // my shard of the whole flat buffer: the first n % N shards are one element longer
    shard_range(z->n, N, r, &sb, &sc);
    for (int u = 0; u < m->nunits; u++) {
        ZeroPiece *p = &z->p[u];
        const size_t ub = p->unit_offset, ue = ub + p->unit_size;
        // my piece of the unit: its intersection with my shard (an empty one sits where it
        // would begin: after the pieces of the ranks before me)
        size_t lo = clamp(sb, ub, ue), hi = clamp(sb + sc, ub, ue);
        p->begin = lo - ub;
        p->count = hi - lo;
        p->local = clamp(lo, sb, sb + sc) - sb;
    }
    // END EXERCISE 05.1
    z->shard_begin = sb;
    z->shard_n = sc;
    fill_counts(z);
}

void zero_layout_init_buffer(ZeroLayout *z, size_t n, int N, int r) {
    memset(z, 0, sizeof *z);
    z->N = N;
    z->r = r;
    z->n = n;
    z->nunits = 1;
    z->flat = 1;
    z->p = lab_xcalloc(1, sizeof(ZeroPiece));
    z->p[0].unit_size = n;
    shard_range(n, N, r, &z->shard_begin, &z->shard_n);
    z->p[0].begin = z->shard_begin;
    z->p[0].count = z->shard_n;
    fill_counts(z);
}

void zero_layout_free(ZeroLayout *z) {
    free(z->p);
    free(z->counts);
    memset(z, 0, sizeof *z);
}

void zero_unit_counts(const ZeroLayout *z, int u, size_t *counts) {
    for (int q = 0; q < z->N; q++)
        counts[q] = z->counts ? z->counts[(size_t)u * z->N + q] : piece_count(z, u, q);
}

size_t zero_range_counts(const ZeroLayout *z, size_t lo, size_t hi, size_t *counts, size_t *at) {
    LAB_CHECK(z->flat && lo <= hi && hi <= z->n, "zero_range_counts: a range [%zu, %zu) of the flat "
              "layout's buffer (of %zu elements) only", lo, hi, z->n);
    for (int q = 0; q < z->N; q++) {
        size_t qb, qc;
        shard_range(z->n, z->N, q, &qb, &qc);
        counts[q] = clamp(qb + qc, lo, hi) - clamp(qb, lo, hi);
    }
    const size_t sb = z->shard_begin, se = sb + z->shard_n;
    *at = clamp(sb, lo, hi) - lo;
    return clamp(lo, sb, se) - sb;
}

void zero_range_reduce_scatter(const ZeroLayout *z, size_t lo, size_t hi, void *buf, DistDtype dt,
                               DistOp op, DistGroup *g) {
    if (z->N == 1 || lo == hi) return;
    size_t *counts = lab_xmalloc((size_t)z->N * sizeof(size_t)), at;
    zero_range_counts(z, lo, hi, counts, &at);
    const size_t e = dist_dtype_size(dt);
    char *range = (char *)buf + lo * e;
    dist_reduce_scatter_v(range, range + at * e, counts, dt, op, g);  // in place: at = Σ counts[< r]
    free(counts);
}

// One v-op per unit (a fresh counts array: the ops read it while they start).
static DistWork unit_op(const ZeroLayout *z, int u, int gather, const void *send, void *recv,
                        DistDtype dt, DistOp op, int nonblocking, DistGroup *g) {
    size_t *counts = lab_xmalloc((size_t)z->N * sizeof(size_t));
    zero_unit_counts(z, u, counts);
    DistWork w;
    memset(&w, 0, sizeof w);
    if (gather && nonblocking) w = dist_iall_gather_v(send, recv, counts, dt, g);
    else if (gather) dist_all_gather_v(send, recv, counts, dt, g);
    else if (nonblocking) w = dist_ireduce_scatter_v(send, recv, counts, dt, op, g);
    else dist_reduce_scatter_v(send, recv, counts, dt, op, g);
    free(counts);
    return w;
}

DistWork zero_unit_reduce_scatter(const ZeroLayout *z, int u, const void *unit_grad, void *piece,
                                  DistDtype dt, DistOp op, int nonblocking, DistGroup *g) {
    return unit_op(z, u, 0, unit_grad, piece, dt, op, nonblocking, g);
}
DistWork zero_unit_all_gather(const ZeroLayout *z, int u, const void *piece, void *unit,
                              DistDtype dt, int nonblocking, DistGroup *g) {
    return unit_op(z, u, 1, piece, unit, dt, DIST_SUM, nonblocking, g);
}

// Element i of this rank's piece u: global index unit_offset + begin + i, shard index local + i.
static size_t piece_global(const ZeroPiece *p) { return p->unit_offset + p->begin; }

ZeroShard zero_shard_of(const GPT2 *m, const GPT2Param *plist, int nplist) {
    ZeroShard b;
    memset(&b, 0, sizeof b);
    b.k = m->k;
    b.dt = m->dtype == GPT2_BF16 ? DIST_BF16 : DIST_F32;
    b.scratch = m->work_grads;
    b.chunk = m->work_size;
    b.plist = plist;
    b.nplist = nplist;
    return b;
}

void zero_shard_alloc(ZeroShard *b, const ZeroLayout *z, GPT2 *m, uint64_t seed) {
    LAB_CHECK(z->n == m->num_params, "zero_shard_alloc: a layout of %zu elements for a model of %zu",
              z->n, m->num_params);
    *b = zero_shard_of(m, m->plist, m->nplist);
    const int bf16 = m->dtype == GPT2_BF16;
    b->params = bf16 ? (void *)m->params_bf16 : (void *)m->params;
    b->grads = bf16 ? (void *)m->grads_bf16 : (void *)m->grads;
    b->params_full = b->grads_full = 1;
    if (bf16) {  // my pieces of the fp32 master: the initial weights, unrounded
        b->master = zero_master_pieces(z, m, seed);
    } else {  // the weights themselves
        b->master = m->params;
        b->master_full = 1;
    }
    b->opt_m = mem_alloc(z->shard_n * sizeof(float), MEM_OPT_M, m->dev);
    b->opt_v = mem_alloc(z->shard_n * sizeof(float), MEM_OPT_V, m->dev);
}

void zero_shard_free(ZeroShard *b) {
    if (!b->master_full) mem_free(b->master);
    mem_free(b->opt_m), mem_free(b->opt_v);
    memset(b, 0, sizeof *b);
}

void zero_shard_master_to_params(const ZeroLayout *z, const ZeroShard *b) {
    if (b->dt != DIST_BF16) return;  // fp32: the master is the weights
    LAB_CHECK(b->params_full && !b->master_full, "zero_shard_master_to_params: whole bf16 weights, "
              "a master of my pieces");
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        if (p->count) b->k->f32_to_bf16((uint16_t *)b->params + piece_global(p), b->master + p->local, p->count);
    }
}

double zero_sum_squares(const ZeroLayout *z, const ZeroShard *b) {
    const size_t e = dist_dtype_size(b->dt);
    const int full = b->grads_full;
    double sum = 0.0;
    for (int u = 0; u < z->nunits;) {
        // one run: pieces u.. that follow each other in the gradient buffer
        size_t at = full ? piece_global(&z->p[u]) : z->p[u].local, len = z->p[u].count;
        int v = u + 1;
        while (v < z->nunits && (full ? piece_global(&z->p[v]) : z->p[v].local) == at + len) {
            len += z->p[v].count;
            v++;
        }
        const char *run = (const char *)b->grads + at * e;
        if (len > 0) {
            if (b->dt == DIST_BF16)
                sum += bf16_sum_squares(b->k, (const uint16_t *)run, len, b->scratch, b->chunk);
            else
                sum += b->k->sum_squares((const float *)run, len);
        }
        u = v;
    }
    return sum;
}

void zero_adamw(const ZeroLayout *z, const ZeroShard *b, const AdamW *h, int step, float scale) {
    const size_t e = dist_dtype_size(b->dt);
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        if (p->count == 0) continue;
        // lo, hi: global indices (weight decay is looked up by them); pointers at element lo
        const size_t lo = piece_global(p), loc = p->local;
        AdamWRange r = {.lo = lo, .hi = lo + p->count, .m = b->opt_m + loc, .v = b->opt_v + loc};
        r.master = b->master + (b->master_full ? lo : loc);
        r.grad = (const char *)b->grads + (b->grads_full ? lo : loc) * e;
        if (b->dt == DIST_BF16) {
            r.bf16 = (uint16_t *)b->params + (b->params_full ? lo : loc);
            r.scratch = b->scratch;
            r.chunk = b->chunk;
        }
        adamw_update(h, b->k, step, &r, b->plist, b->nplist, scale);
    }
}

void zero_gather_params(const ZeroLayout *z, const ZeroShard *b, DistGroup *g) {
    if (z->N == 1 || !b->params_full) return;
    char *params = b->params;
    const size_t e = dist_dtype_size(b->dt);
    if (z->flat) {
        dist_all_gather_n(params + z->shard_begin * e, params, z->n, b->dt, g);
        return;
    }
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        char *unit = params + p->unit_offset * e;
        zero_unit_all_gather(z, u, unit + p->begin * e, unit, b->dt, 0, g);
    }
}

double zero_step(const ZeroLayout *z, const ZeroShard *b, const AdamW *h, int step, DistGroup *g) {
    char *grads = b->grads;
    const size_t e = dist_dtype_size(b->dt);
    double sq = 0;  // the global squared norm of the gradient (returned: the health line's)
    // EXERCISE 05.2 ZeRO-1 reduce-scatter, shard update, all-gather -> 05_zero/README.md#exercise-052-zero-1-reduce-scatter-shard-update-all-gather
    // 1. the gradient summed over the ranks and divided by N, my pieces landing in place: flat,
    //    the whole buffer is one reduce-scatter (my shard is shard_range(Ψ, N, r): the _n op);
    //    by unit, one per unit (my piece of each)
    if (b->grads_full && z->N > 1 && z->flat) {
        dist_reduce_scatter_n(grads, grads + z->shard_begin * e, z->n, b->dt, DIST_AVG, g);
    } else if (b->grads_full && z->N > 1) {
        for (int u = 0; u < z->nunits; u++) {
            const ZeroPiece *p = &z->p[u];
            char *unit = grads + p->unit_offset * e;
            zero_unit_reduce_scatter(z, u, unit, unit + p->begin * e, b->dt, DIST_AVG, 0, g);
        }
    }
    // 2. the global norm from the pieces (each element is in exactly one rank's pieces), then
    //    AdamW on my pieces only
    sq = zero_sum_squares(z, b);
    if (z->N > 1) dist_all_reduce(&sq, &sq, 1, DIST_F64, DIST_SUM, g);
    zero_adamw(z, b, h, step, adamw_clip_scale(h, sq, step));
    // 3. every rank's updated pieces to every rank: the whole parameters, in place
    zero_gather_params(z, b, g);
    // END EXERCISE 05.2
    return sq;
}

DistWork zero_gather_unit(const ZeroLayout *z, int u, const void *shard, void *out, DistDtype dt,
                          DistGroup *g) {
    DistWork w;
    memset(&w, 0, sizeof w);
    // EXERCISE 05.3 ZeRO-3 gather of a unit -> 05_zero/README.md#exercise-053-zero-3-gather-of-a-unit
    // every rank sends its piece of unit u (maybe empty); the whole unit lands in out, each
    // piece at its place
    const ZeroPiece *p = &z->p[u];
    w = zero_unit_all_gather(z, u, (const char *)shard + p->local * dist_dtype_size(dt), out, dt, 1,
                             g);
    // END EXERCISE 05.3
    return w;
}

static void unit_alloc(const ZeroLayout *z, int u, ZeroUnit *U, DistDtype dt, Device dev) {
    U->w = mem_alloc(z->p[u].unit_size * dist_dtype_size(dt), MEM_COMM, dev);
    U->ag_t0 = lab_now();
}

void zero_unit_gather(const ZeroLayout *z, int u, ZeroUnit *U, const void *shard, DistDtype dt,
                      Device dev, DistGroup *g) {
    unit_alloc(z, u, U, dt, dev);
    U->ag = zero_gather_unit(z, u, shard, U->w, dt, g);
}

void zero_unit_gather_direct(const ZeroLayout *z, int u, ZeroUnit *U, const void *shard,
                             DistDtype dt, Device dev, DistGroup *g) {
    unit_alloc(z, u, U, dt, dev);
    const ZeroPiece *p = &z->p[u];
    U->ag = zero_unit_all_gather(z, u, (const char *)shard + p->local * dist_dtype_size(dt), U->w,
                                 dt, 1, g);
}

// --trace: a collective as a span on the communication track, from its start to the moment its
// wait returned (it ran on the communication thread somewhere in between).
static void trace_in_flight(const char *what, int u, double t0) {
    if (!trace_enabled()) return;
    char name[48];
    snprintf(name, sizeof name, "%s unit %d", what, u);
    trace_span(name, TRACE_COMM, t0, lab_now());
}

void zero_unit_wait(ZeroUnit *U, int u) {
    int tok = trace_begin("wait all-gather", TRACE_COMPUTE);
    dist_wait(&U->ag);
    trace_end(tok);
    trace_in_flight("all-gather", u, U->ag_t0);
}

void zero_unit_free(ZeroUnit *U) {
    mem_free(U->w);
    U->w = NULL;
}

void *zero_unit_grad(const ZeroLayout *z, int u, ZeroUnit *U, size_t e, MemCategory cat,
                     Device dev) {
    if (!U->g) U->g = mem_alloc(z->p[u].unit_size * e, cat, dev);
    return U->g;
}

void zero_unit_grad_scatter(const ZeroLayout *z, int u, ZeroUnit *U, void *piece, DistDtype dt,
                            DistGroup *g) {
    LAB_CHECK(U->g, "unit %d's gradient reduce-scattered before its backward", u);
    U->rs_t0 = lab_now();
    U->rs = zero_unit_reduce_scatter(z, u, U->g, piece, dt, DIST_AVG, 1, g);
}

void zero_unit_grad_wait(ZeroUnit *U, int u) {
    int tok = trace_begin("wait reduce-scatter", TRACE_COMPUTE);
    dist_wait(&U->rs);
    trace_end(tok);
    trace_in_flight("reduce-scatter", u, U->rs_t0);
}

void zero_unit_grad_free(ZeroUnit *U) {
    mem_free(U->g);
    U->g = NULL;
}

void zero_gather_full(const ZeroLayout *z, const float *shard, float *full, DistGroup *g) {
    if (z->N == 1) {
        if (full) mem_copy(full, shard, z->n * sizeof(float));
        return;
    }
    if (z->flat) {  // my shard is shard_range(n, N, r) of the whole buffer: one uneven gather
        dist_gather_n(shard, full, z->n, DIST_F32, 0, g);
        return;
    }
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        float *dst = full ? full + p->unit_offset : NULL;
        dist_gather_n(shard + p->local, dst, p->unit_size, DIST_F32, 0, g);
    }
}

float *zero_master_pieces(const ZeroLayout *z, const GPT2 *m, uint64_t seed) {
    float *master = mem_alloc(z->shard_n * sizeof(float), MEM_MASTER, m->dev);
    float *init = lab_xcalloc(m->num_params, sizeof(float));
    gpt2_init_local(m, seed, init);
    zero_take_pieces(z, init, master, 0);
    free(init);
    return master;
}

void zero_take_pieces(const ZeroLayout *z, const float *full, float *dst, int dst_full) {
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        const size_t at = piece_global(p);
        mem_copy(dst + (dst_full ? at : p->local), full + at, p->count * sizeof(float));
    }
}

void zero_save_training(const ZeroLayout *z, const char *path, const GPT2Config *cfg, int step,
                        uint64_t seed, uint64_t data_seed, const float *master, int master_full,
                        const float *opt_m, const float *opt_v, DistGroup *g) {
    const size_t n = z->n;
    const int root = g->rank == 0;
    if (ckpt_policy().sharded) {  // --save-sharded: each rank writes its own pieces
        CkptShard sh;
        ckpt_shard_begin(&sh, n);
        for (int u = 0; u < z->nunits && (z->N > 1 || root); u++) {  // (one part: g's rank 0)
            const ZeroPiece *p = &z->p[u];
            const size_t at = piece_global(p);
            ckpt_shard_add(&sh, at, p->count, master + (master_full ? at : p->local),
                           opt_m + p->local, opt_v + p->local);
        }
        ckpt_shard_write(path, cfg, step, seed, data_seed, &sh);
        return;
    }
    float *w = root ? lab_xcalloc(n, sizeof(float)) : NULL;
    float *mm = root ? lab_xcalloc(n, sizeof(float)) : NULL;
    float *vv = root ? lab_xcalloc(n, sizeof(float)) : NULL;
    if (master_full) {  // every rank holds the whole weights: rank 0's are the model's
        if (root) mem_copy(w, master, n * sizeof(float));
    } else {
        zero_gather_full(z, master, w, g);
    }
    zero_gather_full(z, opt_m, mm, g);
    zero_gather_full(z, opt_v, vv, g);
    if (root) ckpt_save_training(path, cfg, step, seed, data_seed, w, mm, vv, n);
    free(w);
    free(mm);
    free(vv);
}

int zero_load_training(const ZeroLayout *z, const GPT2Config *cfg, const char *resume,
                       const char *load_weights, float *master, int master_full, float *opt_m,
                       float *opt_v, DistGroup *world) {
    const size_t n = z->n;
    int start = 0;
    float *w = lab_xcalloc(n, sizeof(float));
    float *mm = resume ? lab_xcalloc(n, sizeof(float)) : NULL;
    float *vv = resume ? lab_xcalloc(n, sizeof(float)) : NULL;
    if (world->rank == 0) {
        if (resume) start = ckpt_resume_training(resume, cfg, w, mm, vv, n);
        else ckpt_load_weights_into(load_weights, cfg, w, n);
    }
    dist_broadcast(w, n, DIST_F32, 0, world);
    zero_take_pieces(z, w, master, master_full);
    if (resume) {
        dist_broadcast(mm, n, DIST_F32, 0, world);
        dist_broadcast(vv, n, DIST_F32, 0, world);
        dist_broadcast(&start, 1, DIST_I32, 0, world);
        zero_take_pieces(z, mm, opt_m, 0);
        zero_take_pieces(z, vv, opt_v, 0);
    }
    free(w);
    free(mm);
    free(vv);
    return start;
}

void zero_init_pieces(const ZeroLayout *z, const GPT2Config *cfg, uint64_t seed, float *master,
                      int master_full) {
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        size_t at = piece_global(p);
        float *piece = lab_xcalloc(p->count ? p->count : 1, sizeof(float));
        gpt2_init_slice(cfg, seed, at, at + p->count, piece);
        mem_copy(master + (master_full ? at : p->local), piece, p->count * sizeof(float));
        free(piece);
    }
}
