// calc_pipe.c: the pipeline's formulas (calc.h, "pipeline"): a chunk's activation set, ZB-H1's
// W store, the peak of a table's walk, the bytes a stage sends. Chapter 08 prints its formula
// columns from them and its tests hold the measured figures to them, to the byte.
#include <math.h>

#include "calc.h"
#include "schedule.h"

double calc_pipe_set_bytes(const GPT2Config *cfg, int nb, int has_head, int Bm, int T,
                           GPT2Dtype dtype, int split) {
    return calc_pipe_set_bytes_recompute(cfg, nb, has_head, Bm, T, dtype, split, GPT2_RECOMPUTE_NONE);
}

double calc_pipe_set_bytes_recompute(const GPT2Config *cfg, int nb, int has_head, int Bm, int T,
                                     GPT2Dtype dtype, int split, GPT2Recompute r) {
    // recomputing, each block keeps all but what the chunk's one layer of scratch holds (fp32:
    // taken off the stacked layers; bf16: its stored layers and its fp32 layer are what it keeps)
    const int bf16 = dtype == GPT2_BF16;
    const double dropped = bf16 ? 0 : (double)nb * calc_recompute_scratch_bytes(cfg, Bm, T, r);
    size_t a[GPT2_NUM_ACTS], d[GPT2_NUM_ACTS];
    const double BTC = (double)Bm * T * cfg->C;
    gpt2_act_sizes_recompute(cfg, bf16 ? 1 : nb, has_head, Bm, T, bf16 ? r : GPT2_RECOMPUTE_NONE, a);
    gpt2_dact_sizes_range(cfg, nb, has_head, Bm, T, d);
    double floats = 0, layer = 0;
    for (int i = 0; i < GPT2_NUM_ACTS; i++) floats += (double)a[i] + (double)d[i];
    for (int i = 1; i <= 16; i++) layer += (double)a[i];  // ln1 .. residual3: one layer
    if (split) floats += 10.0 * nb * BTC;
    return bf16 ? 4.0 * (floats + BTC) + 2.0 * nb * layer : 4.0 * floats - dropped;
}

double calc_pipe_w_bytes(const GPT2Config *cfg, int nb, int Bm, int T, GPT2Dtype dtype) {
    const double C = cfg->C, BT = (double)Bm * T;
    if (dtype == GPT2_BF16)
        return 2.0 * BT * (nb * (8.0 * C + 4.0) + (nb - 1.0) * C) +
               4.0 * BT * ((9.0 * C + 4.0) + C + nb * 11.0 * C);
    return 4.0 * nb * BT * (20.0 * C + 4.0);
}

double calc_pipe_peak_bytes(const GPT2Config *cfg, const Schedule *s, int rank, int Bm, int T,
                            GPT2Dtype dtype) {
    return calc_pipe_peak_bytes_recompute(cfg, s, rank, Bm, T, dtype, GPT2_RECOMPUTE_NONE);
}

double calc_pipe_peak_bytes_recompute(const GPT2Config *cfg, const Schedule *s, int rank, int Bm,
                                      int T, GPT2Dtype dtype, GPT2Recompute r) {
    const int S = s->p * s->v, nb = cfg->L / S;
    double live = 0, peak = 0;
    for (int j = 0; j < s->nops[rank]; j++) {
        PipeOp o = s->ops[rank][j];
        const int head = o.chunk * s->p + rank == S - 1;
        double b = calc_pipe_set_bytes_recompute(cfg, nb, head, Bm, T, dtype, s->split, r);
        double w = calc_pipe_w_bytes(cfg, nb, Bm, T, dtype);
        if (o.kind == PIPE_F) live += b;
        else if (o.kind == PIPE_B) live += s->split ? w - b : -b;
        else live -= w;
        peak = fmax(peak, live);
    }
    return peak;
}

double calc_pipe_sent_bytes(int p, int v, int m, int rank, double msg_elems, int elem_bytes) {
    const int S = p * v;
    double msgs = 0;
    for (int c = 0; c < v; c++) {
        int vs = c * p + rank;
        if (vs < S - 1 && p > 1) msgs += m;
        if (vs > 0 && p > 1) msgs += m;
    }
    return msgs * msg_elems * elem_bytes;
}
