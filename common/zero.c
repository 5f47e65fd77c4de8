// zero.c: the ZeRO partition (one piece of every unit per rank) and the sharded AdamW step.
#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt.h"
#include "mem.h"
#include "shard.h"
#include "train.h"

void zero_layout_init(ZeroLayout *z, const GPT2 *m, int N, int r) {
    LAB_CHECK(m->l0 == 0 && m->l1 == m->cfg.L, "ZeRO partitions the full model");
    memset(z, 0, sizeof *z);
    z->N = N;
    z->r = r;
    z->n = m->num_params;
    z->nunits = m->nunits;
    z->p = lab_xcalloc((size_t)m->nunits, sizeof(ZeroPiece));
    size_t local = 0;
    for (int u = 0; u < m->nunits; u++) {
        ZeroPiece *p = &z->p[u];
        p->unit_offset = m->units[u].offset;
        p->unit_size = m->units[u].size;
        // EXERCISE 05.1 Shard ranges -> 05_zero/README.md#exercise-051-shard-ranges
        // rank r's piece of the unit: the first size % N pieces are one element longer
        shard_range(p->unit_size, N, r, &p->begin, &p->count);
        // END EXERCISE 05.1
        p->local = local;
        local += p->count;
    }
    z->shard_n = local;
}

void zero_layout_free(ZeroLayout *z) {
    free(z->p);
    memset(z, 0, sizeof *z);
}

size_t zero_shard_elems(const ZeroLayout *z, int q) {
    size_t s = 0;
    for (int u = 0; u < z->nunits; u++) s += shard_count(z->p[u].unit_size, z->N, q);
    return s;
}

// Element i of this rank's piece u: global index unit_offset + begin + i, shard index local + i.
static size_t piece_global(const ZeroPiece *p) { return p->unit_offset + p->begin; }

double zero_local_sum_squares(const ZeroLayout *z, const GPT2 *m, const void *g, int full) {
    const size_t e = m->dtype == GPT2_BF16 ? 2 : 4;
    double sum = 0.0;
    for (int u = 0; u < z->nunits;) {
        // one run: pieces u.. that follow each other in g
        size_t at = full ? piece_global(&z->p[u]) : z->p[u].local, len = z->p[u].count;
        int v = u + 1;
        while (v < z->nunits && (full ? piece_global(&z->p[v]) : z->p[v].local) == at + len) {
            len += z->p[v].count;
            v++;
        }
        const char *run = (const char *)g + at * e;
        if (len > 0) {
            if (m->dtype == GPT2_BF16)
                sum += bf16_sum_squares(m->k, (const uint16_t *)run, len, m->work_grads,
                                        m->work_size);
            else
                sum += m->k->sum_squares((const float *)run, len);
        }
        u = v;
    }
    return sum;
}

void zero_adamw_step(const ZeroLayout *z, const AdamW *h, GPT2 *m, int step, float *master,
                     int master_full, void *param, int params_full, const void *grad,
                     int grads_full, float *opt_m, float *opt_v, const GPT2Param *plist,
                     int nplist, float scale) {
    const size_t e = m->dtype == GPT2_BF16 ? 2 : 4;
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        if (p->count == 0) continue;
        // lo, hi: global indices (weight decay is looked up by them); pointers at element lo
        size_t lo = piece_global(p), hi = lo + p->count, loc = p->local;
        float *w = master + (master_full ? lo : loc);
        const void *gp = (const char *)grad + (grads_full ? lo : loc) * e;
        if (m->dtype == GPT2_FP32) {
            adamw_step(h, m->k, step, w, gp, opt_m + loc, opt_v + loc, lo, hi, plist, nplist,
                       scale);
        } else {
            uint16_t *pb = (uint16_t *)param + (params_full ? lo : loc);
            adamw_step_bf16(h, m->k, step, w, pb, gp, opt_m + loc, opt_v + loc, lo, hi, plist,
                            nplist, scale, m->work_grads, m->work_size);
        }
    }
}

void zero1_step(const ZeroLayout *z, GPT2 *m, const AdamW *h, int step, float *master,
                int master_full, float *opt_m, float *opt_v, const GPT2Param *plist, int nplist,
                DistGroup *g) {
    char *grads = train_grads(m), *params = train_params(m);
    const DistDtype dt = train_dtype(m);
    const size_t e = dist_dtype_size(dt);
    float scale = 1.0f;
    // EXERCISE 05.2 ZeRO-1 reduce-scatter, shard update, all-gather -> 05_zero/README.md#exercise-052-zero-1-reduce-scatter-shard-update-all-gather
    // 1. every unit's gradient summed over the ranks and divided by N; my piece lands in place
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        char *unit = grads + p->unit_offset * e;
        dist_reduce_scatter_n(unit, unit + p->begin * e, p->unit_size, dt, DIST_AVG, g);
    }
    // 2. the global norm from the pieces (each element is in exactly one rank's pieces), then
    //    AdamW on my pieces only
    double sq = zero_local_sum_squares(z, m, grads, 1);
    if (z->N > 1) dist_all_reduce(&sq, &sq, 1, DIST_F64, DIST_SUM, g);
    scale = adamw_clip_scale(h, sq, step);
    zero_adamw_step(z, h, m, step, master, master_full, params, 1, grads, 1, opt_m, opt_v, plist,
                    nplist, scale);
    // 3. every rank's updated piece to every rank: the whole parameters, in place
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        char *unit = params + p->unit_offset * e;
        if (z->N > 1) dist_all_gather_n(unit + p->begin * e, unit, p->unit_size, dt, g);
    }
    // END EXERCISE 05.2
    (void)scale;
}

DistWork zero_gather_unit(const ZeroLayout *z, int u, const void *shard, void *out, DistDtype dt,
                          DistGroup *g) {
    DistWork w;
    memset(&w, 0, sizeof w);
    // EXERCISE 05.3 ZeRO-3 gather of a unit -> 05_zero/README.md#exercise-053-zero-3-gather-of-a-unit
    // every rank sends its piece of unit u; the whole unit lands in out, each piece at its place
    const ZeroPiece *p = &z->p[u];
    w = dist_iall_gather_n((const char *)shard + p->local * dist_dtype_size(dt), out, p->unit_size,
                           dt, g);
    // END EXERCISE 05.3
    return w;
}

void zero_gather_full(const ZeroLayout *z, const float *shard, float *full, DistGroup *g) {
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        float *dst = full ? full + p->unit_offset : NULL;
        if (z->N == 1) mem_copy(dst, shard + p->local, p->count * sizeof(float));
        else dist_gather_n(shard + p->local, dst, p->unit_size, DIST_F32, 0, g);
    }
}

void zero_take_pieces(const ZeroLayout *z, const float *full, float *shard) {
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        mem_copy(shard + p->local, full + piece_global(p), p->count * sizeof(float));
    }
}

void zero_save_training(const ZeroLayout *z, const char *path, const GPT2Config *cfg, int step,
                        uint64_t seed, uint64_t data_seed, const float *master,
                        const float *opt_m, const float *opt_v, DistGroup *g) {
    const size_t n = z->n;
    const int root = g->rank == 0;
    float *w = root ? lab_xcalloc(n, sizeof(float)) : NULL;
    float *mm = root ? lab_xcalloc(n, sizeof(float)) : NULL;
    float *vv = root ? lab_xcalloc(n, sizeof(float)) : NULL;
    zero_gather_full(z, master, w, g);
    zero_gather_full(z, opt_m, mm, g);
    zero_gather_full(z, opt_v, vv, g);
    if (root) ckpt_save_training(path, cfg, step, seed, data_seed, w, mm, vv, n);
    free(w);
    free(mm);
    free(vv);
}

int zero_load_training(const ZeroLayout *z, const GPT2Config *cfg, const char *resume,
                       const char *load_weights, float *master, float *opt_m, float *opt_v,
                       DistGroup *world) {
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
    zero_take_pieces(z, w, master);
    if (resume) {
        dist_broadcast(mm, n, DIST_F32, 0, world);
        dist_broadcast(vv, n, DIST_F32, 0, world);
        dist_broadcast(&start, 1, DIST_I32, 0, world);
        zero_take_pieces(z, mm, opt_m);
        zero_take_pieces(z, vv, opt_v);
    }
    free(w);
    free(mm);
    free(vv);
    return start;
}

void zero_init_pieces(const ZeroLayout *z, const GPT2Config *cfg, uint64_t seed, float *master) {
    for (int u = 0; u < z->nunits; u++) {
        const ZeroPiece *p = &z->p[u];
        size_t at = piece_global(p);
        float *piece = lab_xcalloc(p->count ? p->count : 1, sizeof(float));
        gpt2_init_slice(cfg, seed, at, at + p->count, piece);
        mem_copy(master + p->local, piece, p->count * sizeof(float));
        free(piece);
    }
}
