// gpt2_layout.c: the shapes of GPT-2 and of its TP slices (see gpt2_layout.h).
#include "gpt2_layout.h"

#include <stdio.h>
#include <string.h>

#include "check.h"

GPT2BlockDims gpt2_block_dims(const GPT2Config *cfg) {
    GPT2BlockDims d = {.C = cfg->C, .NH = cfg->NH, .ATT = cfg->C, .FC = 4 * cfg->C};
    return d;
}

size_t gpt2_block_layout(const GPT2BlockDims *d, size_t offset[GPT2_BLOCK_TENSORS],
                         size_t size[GPT2_BLOCK_TENSORS]) {
    size_t C = (size_t)d->C, A = (size_t)d->ATT, F = (size_t)d->FC;
    size_t s[GPT2_BLOCK_TENSORS] = {C, C, 3 * A * C, 3 * A, C * A, C, C, C, F * C, F, C * F, C};
    size_t at = 0;
    for (int i = 0; i < GPT2_BLOCK_TENSORS; i++) {
        if (offset) offset[i] = at;
        if (size) size[i] = s[i];
        at += s[i];
    }
    return at;
}

GPT2BlockWeights gpt2_block_weights(const GPT2BlockDims *d, float *unit) {
    size_t o[GPT2_BLOCK_TENSORS];
    gpt2_block_layout(d, o, NULL);
    GPT2BlockWeights w = {unit + o[0], unit + o[1], unit + o[2],  unit + o[3],
                          unit + o[4], unit + o[5], unit + o[6],  unit + o[7],
                          unit + o[8], unit + o[9], unit + o[10], unit + o[11]};
    return w;
}

GPT2BlockWeights gpt2_full_block(const GPT2Config *cfg, float *full_mem, int l) {
    LAB_CHECK(l >= 0 && l < cfg->L, "gpt2_full_block: block %d of %d", l, cfg->L);
    const GPT2BlockDims d = gpt2_block_dims(cfg);
    const size_t embed = ((size_t)cfg->V + (size_t)cfg->T) * (size_t)cfg->C;  // wte, wpe
    return gpt2_block_weights(&d, full_mem + embed + (size_t)l * gpt2_block_layout(&d, NULL, NULL));
}

// ---- a TP slice ------------------------------------------------------------------------------------

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

void tp_block_sizes(int C, int tp, size_t sizes[GPT2_BLOCK_TENSORS]) {
    GPT2BlockDims d = layout_dims(C, tp);
    gpt2_block_layout(&d, NULL, sizes);
}

size_t tp_block_count(int C, int tp) {
    GPT2BlockDims d = layout_dims(C, tp);
    return gpt2_block_layout(&d, NULL, NULL);
}

GPT2BlockWeights tp_block_views(float *base, int C, int tp) {
    GPT2BlockDims d = layout_dims(C, tp);
    return gpt2_block_weights(&d, base);
}

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

// Block tensor i (GPT2BlockWeights' field order) is gpt2's tensor kind GPT2_LN1W + i; the sliced:
enum {
    QKVW = GPT2_QKVW - GPT2_LN1W, QKVB = GPT2_QKVB - GPT2_LN1W, ATTPROJW = GPT2_ATTPROJW - GPT2_LN1W,
    FCW = GPT2_FCW - GPT2_LN1W, FCB = GPT2_FCB - GPT2_LN1W, FCPROJW = GPT2_FCPROJW - GPT2_LN1W,
};
static float *field(const GPT2BlockWeights *v, int i) { return (&v->ln1w)[i]; }

int tp_block_sliced(int i) {
    return i == QKVW || i == QKVB || i == ATTPROJW || i == FCW || i == FCB || i == FCPROJW;
}

// The sliced tensors are one of two kinds, and each kind is a set of contiguous runs:
//   row slices (column-parallel): rows [lo, lo + rows) of a (R, in) matrix or an (R) bias;
//     qkvw / qkvb have three (Q, K, V), fcw / fcb one;
//   column slices (row-parallel): columns [r·w, (r+1)·w) of each of the C rows of a (C, tp·w)
//     matrix: attprojw (w = Cl), fcprojw (w = Hl).
int tp_slice_run(int i, size_t j, int C, int tp, int r, TpRun *out) {
    size_t c = (size_t)C, cl = c / (size_t)tp, hl = 4 * c / (size_t)tp, rr = (size_t)r;
    switch (i) {
    case QKVW: case QKVB: {  // qkvw (3C, C) / qkvb (3C): rows j·C + [r·Cl, (r+1)·Cl), j = Q, K, V
        size_t in = i == QKVW ? c : 1;
        if (j >= 3) return 0;
        *out = (TpRun){(j * c + rr * cl) * in, j * cl * in, cl * in};
        return 1;
    }
    case FCW: case FCB: {  // fcw (4C, C) / fcb (4C): rows [r·Hl, (r+1)·Hl)
        size_t in = i == FCW ? c : 1;
        if (j >= 1) return 0;
        *out = (TpRun){rr * hl * in, 0, hl * in};
        return 1;
    }
    case ATTPROJW: case FCPROJW: {  // attprojw (C, C) / fcprojw (C, 4C): row j's columns of rank r
        size_t w = i == ATTPROJW ? cl : hl;
        if (j >= c) return 0;
        *out = (TpRun){j * w * (size_t)tp + rr * w, j * w, w};
        return 1;
    }
    default:  // replicated (C)
        if (j >= 1) return 0;
        *out = (TpRun){0, 0, c};
        return 1;
    }
}

void tp_block_shard(GPT2BlockWeights *shard, const GPT2BlockWeights *full, int C, int tp, int r) {
    LAB_CHECK(r >= 0 && r < tp, "tp_block_shard: rank %d outside [0, %d)", r, tp);
    TpRun u;
    for (int i = 0; i < GPT2_BLOCK_TENSORS; i++)
        for (size_t j = 0; tp_slice_run(i, j, C, tp, r, &u); j++)
            memcpy(field(shard, i) + u.shard, field(full, i) + u.full, u.n * sizeof(float));
}

void tp_block_unshard(GPT2BlockWeights *full, const GPT2BlockWeights *shard, int C, int tp, int r,
                      int with_replicated) {
    LAB_CHECK(r >= 0 && r < tp, "tp_block_unshard: rank %d outside [0, %d)", r, tp);
    TpRun u;
    for (int i = 0; i < GPT2_BLOCK_TENSORS; i++) {
        if (!tp_block_sliced(i) && !with_replicated) continue;
        for (size_t j = 0; tp_slice_run(i, j, C, tp, r, &u); j++)
            memcpy(field(full, i) + u.full, field(shard, i) + u.shard, u.n * sizeof(float));
    }
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
