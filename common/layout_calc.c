// layout_calc.c: a rank's bytes per step and activation set under a DP x TP x PP layout
// (layout_calc.h), from the shapes.
#include "layout_calc.h"

#include <math.h>

double lab_chunk_elems(const GPT2Config *c, int tp, int vs, int S) {
    const double C = c->C, Vl = (c->V + tp - 1) / tp, per = (double)c->L / S;
    const double sliced = 3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C;  // qkv, proj, fc, fcproj
    const double repl = 6 * C;  // ln1, ln2 (w, b), attprojb, fcprojb
    double n = per * (sliced / tp + repl);
    if (vs == 0) n += Vl * C + (double)c->T * C;  // wte rows, wpe
    if (vs == S - 1) n += 2 * C + (vs == 0 ? 0 : Vl * C);  // lnf; the tied copy
    return n;
}

double lab_piece_elems(double n, int dp, int d) { return floor(n / dp) + (d < fmod(n, dp) ? 1 : 0); }

void lab_bytes_per_step(const GPT2Config *c, const LabLayout *l, int p, int d, double out[3]) {
    const int dp = l->dp, tp = l->tp, pp = l->pp, v = l->v, m = l->m, S = pp * v, per = c->L / S;
    const unsigned long long Bm = (unsigned long long)l->batch / dp / m, N = Bm * c->T, NC = N * c->C;
    const unsigned long long Vl = (c->V + tp - 1) / tp;
#define AR(bytes, n) ((double)(2ull * ((n) - 1) * (unsigned long long)(bytes) / (n)))
    double *tp_b = &out[0], *dp_b = &out[1], *pp_b = &out[2];
    *tp_b = *dp_b = *pp_b = 0;
    for (int ch = 0; ch < v; ch++) {
        const int vs = ch * pp + p;
        // TP, per micro-batch: 2 g's + 2 f's per block of N·C floats; the embedding's sum; the
        // head's f (N·C) and the loss's max, sum of exp and target logit (N each)
        double calls_nc = 4.0 * per + (vs == 0) + (vs == S - 1), calls_n = vs == S - 1 ? 3 : 0;
        *tp_b += m * (calls_nc * AR(4 * NC, tp) + calls_n * AR(4 * N, tp));
        // DP: the chunk's gradients averaged; ZeRO-1: a ring reduce-scatter sends every piece
        // but mine, the all-gather every piece but the next replica's
        const double n = lab_chunk_elems(c, tp, vs, S);
        if (!l->zero) *dp_b += AR(4 * n, dp);
        else *dp_b += 4 * (2 * n - lab_piece_elems(n, dp, d) - lab_piece_elems(n, dp, (d + 1) % dp));
        // PP: one activation per micro-batch to the next stage, one gradient back
        if (pp > 1) *pp_b += (double)m * 4 * NC * ((vs < S - 1) + (vs > 0));
    }
    *tp_b += AR(8, tp);   // the clip norm: the slices' Σ g² (one double)
    *dp_b += AR(4, dp);   // the loss (one float)
    if (l->zero) *dp_b += AR(16, dp);  // the pieces' two norm parts
    if (pp > 1) {
        *pp_b += AR(8, pp);                                       // the clip norm over stages
        if (p == 0 || p == pp - 1) *pp_b += 4.0 * Vl * c->C;       // the tied wte's gradient
        if (p == pp - 1) *pp_b += 4;                              // the loss, from the last stage
    }
#undef AR
}

double lab_act_set_bytes(const GPT2Config *c, const LabLayout *l, int p) {
    const int tp = l->tp, pp = l->pp;
    const double Bm = l->batch / l->dp / l->m, N = Bm * c->T, NC = N * c->C, Vl = (c->V + tp - 1) / tp;
    const double att = Bm * (c->NH / tp) * c->T * c->T;
    double f = (double)c->L / pp * (6 * NC + 4 * N + 12 * NC / tp + 2 * att) + 2 * NC;
    if (p == pp - 1) f += 2 * NC + 6 * N + 2 * N * Vl;
    return 4 * f;
}
