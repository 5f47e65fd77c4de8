// mpi_tp.c: the tensor-parallel pieces of common/tp.h, on a TP slice (a GPT2: tp_build), against
// the full model of common/gpt2.h.
//
// Launched by tests/test_tp.c as
//   mpirun -np N build/tests/mpi_tp <what>...
// and run (mpitest.h) on the world and on a split group: with N = 4, tp = 4 and tp = 2. Every
// rank also runs the full GPT-2 (gpt2_forward / gpt2_backward, one device): the truth. <what>:
//   equiv     the slice's step (tp_forward, tp_backward: the vocab-parallel embedding, L TP
//             blocks, the head's matmul on the local wte rows, the vocab-parallel loss) == the
//             full model: every block's output, the per-position losses, and every gradient,
//             both on each rank's own units and gathered back into the full layout
//             (gpt2_unshard, summed over the group). V = 250 (tp = 2 divides it, tp = 4 pads it
//             to 252) and V = 251 (padded on both). Also: a slice initialized alone (tp_build)
//             holds the slice of the full init (gpt2_shard), bit for bit, and the padded wte
//             rows get exactly zero gradient.
//   count     exactly three all-reduces in the loss, each of B·T floats (the TpComm counters,
//             and dist's call and byte counters against 2(t-1)/t · 4·B·T per all-reduce); a
//             whole step makes 2 (forward) + 2 (backward) all-reduces of B·T·C per block, one
//             for the embedding and one for f at the head's input.
//   stages    the slice cut into two pipeline stages, blocks [0, 1) and [1, L), the first's
//             output handed to the second and the second's input gradient back, computes
//             exactly what the slice of every block computes (the same pieces, kernels and
//             rounding points): the loss and every gradient but wte's bit for bit (the whole
//             slice adds the head's and the embedding's parts into one buffer, the stages keep
//             one part each), fp32 and bf16. In bf16 that checks that a stage's output is the
//             stored, rounded value (what the next block reads). Seen failing (by hand, in the
//             TP model before tp.c): a stage's output taken from the working layer's unrounded fp32
//             values ("bf16: loss 4.16345072 (whole) vs 4.16349554 (stages)").
//   mutants   the bugs tp.h is built to avoid, each made on purpose here, must be seen (the
//             comparison of `equiv` must fail): f's backward all-reduce missing; the loss's
//             sum of exp not reduced (the softmax normalised by the local vocab); heads of the
//             wrong rank (the q, k, v rows of rank r+1 with rank r's projection columns); the
//             padded wte rows treated as vocabulary (leaking into the softmax).
// Tolerance (equiv): fp32; a row-parallel layer sums tp partial dot products of C/tp (or 4C/tp)
// terms, and the all-reduce adds them in another order than one long dot product; the loss's
// sum of exp is likewise split. Each output then differs by a few ulps of the terms summed,
// not of the result: we allow 1e-4 of the largest |value| of each compared tensor (measured:
// below 1e-6; each mutant below moves them by 0.4 or more, and padding columns counted in
// the CPU kernel's sum of exp moved the loss by 1.4e-3).
// Seen failing (each break made in common/ by hand, then restored):
//   equiv    f's all-reduce at the attention half removed from tp_block_backward (block 0's
//            gradients off by ~1); the loss's sum-of-exp all-reduce removed (losses off by 0.25);
//            the CPU vocab_ce_sums summing the padded columns too (losses off by 1.4e-3 on
//            tp = 4); the qkv shard taking rank r+1's rows (block 0's output off by 0.2).
//   count    one extra (numerically harmless) all-reduce of the max in the loss: 4 calls, 384
//            bytes instead of 3 and 288, while equiv still passed.
//   mutants  each mutant is such a break, made at run time; the test fails if it goes unseen.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "gpt2.h"
#include "kernels.h"
#include "mem.h"
#include "mpitest.h"
#include "tp.h"

#define TOL 1e-4f   // of the largest |value| of the tensor compared (see the top)
#define B_ 2
#define T_ 8
static const uint64_t SEED = 1234;

static GPT2Config config(int V) { return (GPT2Config){.V = V, .T = T_, .L = 2, .C = 32, .NH = 4}; }

// ---- the comm, with one bug switchable ------------------------------------------------------------

static int skip_site[TP_NSITES];   // 1: that all-reduce is "forgotten" (a mutant)
static void maybe_all_reduce(TpComm *c, float *buf, size_t n, TpOp op, TpSite site) {
    if (skip_site[site]) return;
    dist_all_reduce(buf, buf, n, DIST_F32, op == TP_MAX ? DIST_MAX : DIST_SUM, (DistGroup *)c->ctx);
}
static TpComm comm(DistGroup *g) {
    TpComm c = tp_comm_group(g);
    c.all_reduce = maybe_all_reduce;
    return c;
}

// ---- the full model (the truth) -----------------------------------------------------------------------

typedef struct { GPT2 m; float loss; int inp[B_ * T_], tgt[B_ * T_]; } Full;

static void full_run(Full *f, GPT2Config cfg) {
    // tokens all over the vocabulary, its first and last entries included
    uint32_t s = 12345;
    for (int i = 0; i < B_ * T_; i++) {
        s = s * 1664525u + 1013904223u;
        f->inp[i] = (int)((s >> 8) % (uint32_t)cfg.V);
        s = s * 1664525u + 1013904223u;
        f->tgt[i] = (int)((s >> 8) % (uint32_t)cfg.V);
    }
    f->inp[0] = cfg.V - 1, f->tgt[1] = cfg.V - 1, f->inp[2] = 0, f->tgt[3] = 0;
    gpt2_build(&f->m, cfg, DEV_CPU);
    gpt2_init_params(&f->m, SEED);
    gpt2_alloc_grads(&f->m);
    gpt2_alloc_acts(&f->m, B_, T_);
    f->loss = gpt2_forward(&f->m, f->inp, f->tgt);
    gpt2_zero_grad(&f->m);
    gpt2_backward(&f->m, 1.0f / (B_ * T_));
}

// ---- one rank's slice ----------------------------------------------------------------------------------

// The slice of every block (as_if_V: the vocabulary it believes in; the full model's V, or a
// mutant's padded one), its set, and one step on the truth's batch.
typedef struct { GPT2 m; GPT2Acts a; } Slice;

static void slice_build(Slice *s, const Full *f, DistGroup *g, int as_if_V) {
    GPT2Config cfg = f->m.cfg;
    cfg.V = as_if_V;
    const TpShape sh = {.l0 = 0, .l1 = cfg.L, .tp = g->size, .r = g->rank, .sp = 0, .B = B_, .T = T_};
    tp_build(&s->m, cfg, DEV_CPU, GPT2_FP32, sh, SEED);
    tp_acts_alloc(&s->a, &s->m);
    if (as_if_V != f->m.cfg.V) {  // the full model's weights, the vocabulary padded with zero rows
        const size_t C = (size_t)cfg.C, n = gpt2_param_count(&cfg);
        float *padded = lab_xcalloc(n, sizeof(float));
        memcpy(padded, f->m.params, (size_t)f->m.cfg.V * C * sizeof(float));
        memcpy(padded + (size_t)as_if_V * C, f->m.params + (size_t)f->m.cfg.V * C,
               (f->m.num_params - (size_t)f->m.cfg.V * C) * sizeof(float));
        gpt2_shard(&s->m, padded, s->m.params);
        free(padded);
        return;
    }
    float *want = lab_xcalloc(s->m.num_params, sizeof(float));
    gpt2_shard(&s->m, f->m.params, want);
    mpi_check(memcmp(want, s->m.params, s->m.num_params * sizeof(float)) == 0,
              "tp=%d rank %d: the slice initialized alone != the slice of the full init", g->size, g->rank);
    free(want);
}

static void slice_free(Slice *s) {
    gpt2_acts_free(&s->a);
    gpt2_free(&s->m);
}

static void slice_step(Slice *s, TpComm *c, const Full *f) {
    gpt2_acts_set_batch(&s->m, &s->a, f->inp, f->tgt);
    gpt2_zero_grad(&s->m);
    tp_forward(&s->m, &s->a, c);
    tp_backward(&s->m, &s->a, c, 1.0f / (B_ * T_));
}

// The worst relative difference of the slice from the full model, over everything compared
// (block outputs, losses, every gradient; unit by unit and gathered back).
static float slice_worst(Slice *s, const Full *f, DistGroup *g, int report) {
    const GPT2 *m = &s->m, *full = &f->m;
    const int C = m->cfg.C, N = B_ * T_, tp = g->size, r = g->rank;
    float worst = 0.0f;
#define SEE(name, err)                                                                           \
    do {                                                                                         \
        float e_ = (err);                                                                        \
        if (report) mpi_check(e_ <= TOL, "tp=%d rank %d V=%d: %s differs by %.3g (tolerance %g)", \
                              tp, r, full->cfg.V, name, (double)e_, (double)TOL);                \
        if (!(e_ <= worst)) worst = e_;                                                          \
    } while (0)
    char name[96];
    for (int l = 0; l < m->cfg.L; l++) {
        snprintf(name, sizeof name, "block %d's output", l);
        SEE(name, mpi_rel_err(gpt2_layer_acts(m, &s->a, l).residual3,
                              full->act.a.residual3 + (size_t)l * N * C, (size_t)N * C));
    }
    SEE("the per-position losses", mpi_rel_err(s->a.a.losses, full->act.host_losses, N));
    float mean = gpt2_acts_mean_loss(&s->a);
    SEE("the mean loss", mpi_rel_err(&mean, &f->loss, 1));

    // Gradients on this rank's units, against the same slices of the full gradients: the
    // block shards, wte's real rows, wpe, lnfw, lnfb.
    const size_t nb = tp_block_count(C, tp);
    size_t sizes[GPT2_BLOCK_TENSORS];
    tp_block_sizes(C, tp, sizes);
    float *ref = lab_xcalloc(nb, sizeof(float));
    for (int l = 0; l < m->cfg.L; l++) {
        GPT2BlockWeights fb = gpt2_full_block(&full->cfg, full->grads, l), vref = tp_block_views(ref, C, tp);
        tp_block_shard(&vref, &fb, C, tp, r);
        const float *mine = m->grads + gpt2_block_unit(m, l)->offset;
        size_t off = 0;
        for (int i = 0; i < GPT2_BLOCK_TENSORS; i++) {
            snprintf(name, sizeof name, "block %d's gradient tensor %d (shard)", l, i);
            SEE(name, mpi_rel_err(mine + off, ref + off, sizes[i]));
            off += sizes[i];
        }
    }
    free(ref);
    const TpVocab real = tp_vocab(full->cfg.V, tp, r);
    const size_t Vl = (size_t)real.Vl;
    float *wref = lab_xcalloc(Vl * C, sizeof(float));
    tp_wte_shard(wref, full->grads, &real, C);
    const float *dwte = m->grads, *dwpe = m->grads + Vl * C;  // the EMBED unit: wte's rows, wpe
    SEE("the wte gradient (shard)", mpi_rel_err(dwte, wref, (size_t)real.nvalid * C));
    free(wref);
    int pad_clean = 1;
    for (size_t i = (size_t)real.nvalid * C; i < Vl * C; i++) pad_clean &= dwte[i] == 0.0f;
    if (report) mpi_check(pad_clean, "tp=%d rank %d V=%d: a padded wte row got a gradient", tp, r, full->cfg.V);
    if (!pad_clean) worst = INFINITY;
    SEE("the wpe gradient", mpi_rel_err(dwpe, full->grads + (size_t)full->cfg.V * C, (size_t)T_ * C));
    const float *dlnf = m->grads + m->units[m->nunits - 1].offset;  // the HEAD unit: lnfw, lnfb
    SEE("the lnfw, lnfb gradients", mpi_rel_err(dlnf, full->grads + full->units[full->nunits - 1].offset, 2 * (size_t)C));

    // Gathered back (the slice's vocabulary is the truth's): every rank writes its slices into
    // a zeroed full-size buffer (the replicated tensors from rank 0 only), the group sums them.
    if (m->cfg.V == full->cfg.V) {
        float *all = lab_xcalloc(full->num_params, sizeof(float));
        gpt2_unshard(m, m->grads, all, r == 0);
        dist_all_reduce(all, all, full->num_params, DIST_F32, DIST_SUM, g);
        for (int j = 0; j < full->nplist; j++) {
            snprintf(name, sizeof name, "the gathered gradient of %.31s", full->plist[j].name);
            SEE(name, mpi_rel_err(all + full->plist[j].offset, full->grads + full->plist[j].offset,
                                  full->plist[j].size));
        }
        free(all);
    }
#undef SEE
    return worst;
}

// ---- the kinds -----------------------------------------------------------------------------------------

static int splits(DistGroup *g) { return config(250).NH % g->size == 0; }

static void run_equiv(DistGroup *g) {
    int Vs[2] = {250, 251};
    for (int i = 0; i < 2; i++) {
        Full f;
        full_run(&f, config(Vs[i]));
        TpComm c = comm(g);
        Slice s;
        slice_build(&s, &f, g, Vs[i]);
        slice_step(&s, &c, &f);
        float worst = slice_worst(&s, &f, g, 1);
        if (g->rank == 0)
            printf("mpi_tp: equiv tp=%d V=%d (padded to %d): worst relative difference %.3g\n", g->size,
                   Vs[i], tp_vocab(Vs[i], g->size, 0).Vp, (double)worst);
        slice_free(&s);
        gpt2_free(&f.m);
    }
}

static void run_count(DistGroup *g) {
    Full f;
    full_run(&f, config(250));
    TpComm c = comm(g);
    Slice s;
    slice_build(&s, &f, g, 250);
    const int N = B_ * T_, C = s.m.cfg.C, L = s.m.cfg.L, tp = g->size;
    // the loss alone: the TpComm counters and dist's
    slice_step(&s, &c, &f);
    TpComm c2 = comm(g);
    dist_counters_reset();
    const TpVocab tv = tp_vocab(250, tp, g->rank);
    TpLossStats st = {s.a.ce_max, s.a.ce_sum, s.a.ce_target};
    tp_crossentropy_forward(s.m.k, &c2, &tv, s.a.a.losses, &st, s.a.a.logits, f.tgt, N);
    uint64_t total_calls = 0, total_floats = 0;
    for (int i = 0; i < TP_NSITES; i++) total_calls += c2.calls[i], total_floats += c2.floats[i];
    mpi_check(total_calls == 3 && c2.calls[TP_SITE_CE_MAX] == 1 && c2.calls[TP_SITE_CE_SUMEXP] == 1 &&
                  c2.calls[TP_SITE_CE_TARGET] == 1 && total_floats == 3 * (uint64_t)N,
              "tp=%d: the loss made %llu all-reduces of %llu floats in all, want 3 of %d (max, sumexp, target)",
              tp, (unsigned long long)total_calls, (unsigned long long)total_floats, N);
    const DistCounters *dc = dist_counters();
    uint64_t S = (uint64_t)N * sizeof(float), want = 3 * (2 * (uint64_t)(tp - 1) * S / (uint64_t)tp);
    mpi_check(dc->calls[OP_ALL_REDUCE] == 3 && dc->sent[OP_ALL_REDUCE] == want && dc->recv[OP_ALL_REDUCE] == want,
              "tp=%d: dist saw %llu all-reduces sending %llu bytes in the loss, want 3 sending 3 x 2(t-1)/t x %llu = %llu",
              tp, (unsigned long long)dc->calls[OP_ALL_REDUCE], (unsigned long long)dc->sent[OP_ALL_REDUCE],
              (unsigned long long)S, (unsigned long long)want);
    // the whole step (slice_step above on c): per block 2 forward (g) + 2 backward (f)
    TpSite block_sites[4] = {TP_SITE_ATTN_G, TP_SITE_MLP_G, TP_SITE_ATTN_F, TP_SITE_MLP_F};
    for (int i = 0; i < 4; i++)
        mpi_check(c.calls[block_sites[i]] == (uint64_t)L && c.floats[block_sites[i]] == (uint64_t)L * N * C,
                  "tp=%d: %s: %llu all-reduces of %llu floats, want %d of %d", tp, tp_site_name(block_sites[i]),
                  (unsigned long long)c.calls[block_sites[i]], (unsigned long long)c.floats[block_sites[i]], L,
                  L * N * C);
    mpi_check(c.calls[TP_SITE_HEAD_F] == 1 && c.floats[TP_SITE_HEAD_F] == (uint64_t)N * C,
              "tp=%d: f at the head's input made %llu all-reduces, want 1 of B*T*C", tp,
              (unsigned long long)c.calls[TP_SITE_HEAD_F]);
    mpi_check(c.calls[TP_SITE_EMBED] == 1 && c.floats[TP_SITE_EMBED] == (uint64_t)N * C,
              "tp=%d: the embedding made %llu all-reduces, want 1 of B*T*C", tp,
              (unsigned long long)c.calls[TP_SITE_EMBED]);
    slice_free(&s);
    gpt2_free(&f.m);
}

// The gradient of parameter i of m, as fp32 on the host.
static void grad_of(const GPT2 *m, int i, float *out) {
    const GPT2Param *p = &m->plist[i];
    if (m->dtype == GPT2_FP32) {
        memcpy(out, m->grads + p->offset, p->size * sizeof(float));
        return;
    }
    for (size_t j = 0; j < p->size; j++) out[j] = bf16_to_f32(m->grads_bf16[p->offset + j]);
}

static void run_stages(DistGroup *g) {
    const GPT2Config cfg = {.V = 64, .T = T_, .L = 3, .C = 32, .NH = 4};
    const int N = B_ * T_, tp = g->size, r = g->rank;
    int in[B_ * T_], tg[B_ * T_];
    for (int i = 0; i < N; i++) in[i] = (i * 7 + 3) % cfg.V, tg[i] = (i * 5 + 1) % cfg.V;
    for (int d = 0; d < 2; d++) {
        const GPT2Dtype dt = d ? GPT2_BF16 : GPT2_FP32;
        TpComm c = tp_comm_group(g);
        GPT2 whole, st[2];
        GPT2Acts wa, sa[2];
        tp_build(&whole, cfg, DEV_CPU, dt, (TpShape){0, cfg.L, tp, r, 0, B_, T_, GPT2_RECOMPUTE_NONE}, 42);
        tp_acts_alloc(&wa, &whole);
        gpt2_acts_set_batch(&whole, &wa, in, tg);
        gpt2_zero_grad(&whole);
        float lw = tp_forward(&whole, &wa, &c);
        tp_backward(&whole, &wa, &c, 1.0f / N);
        const int cut[3] = {0, 1, cfg.L};
        for (int k = 0; k < 2; k++) {
            tp_build(&st[k], cfg, DEV_CPU, dt, (TpShape){cut[k], cut[k + 1], tp, r, 0, B_, T_, GPT2_RECOMPUTE_NONE}, 42);
            tp_acts_alloc(&sa[k], &st[k]);
            gpt2_acts_set_batch(&st[k], &sa[k], in, k == 1 ? tg : NULL);
            gpt2_zero_grad(&st[k]);
        }
        tp_forward(&st[0], &sa[0], &c);
        gpt2_acts_output(&st[0], &sa[0], gpt2_acts_input(&sa[1]));
        float ls = tp_forward(&st[1], &sa[1], &c);
        tp_backward(&st[1], &sa[1], &c, 1.0f / N);
        memcpy(gpt2_acts_doutput(&sa[0]), gpt2_acts_dinput(&sa[1]), (size_t)N * cfg.C * sizeof(float));
        tp_backward(&st[0], &sa[0], &c, 1.0f / N);
        mpi_check(memcmp(&lw, &ls, sizeof lw) == 0, "tp=%d %s: loss %.9g (whole) vs %.9g (stages)", tp,
                  d ? "bf16" : "fp32", (double)lw, (double)ls);
        // every tensor but wte, found by name in the stage that holds it
        float *a = lab_xmalloc(tp_block_count(cfg.C, 1) * sizeof(float)), *b = lab_xmalloc(tp_block_count(cfg.C, 1) * sizeof(float));
        int compared = 0;
        for (int i = 1; i < whole.nplist; i++)
            for (int k = 0; k < 2; k++)
                for (int j = 0; j < st[k].nplist; j++) {
                    if (strcmp(st[k].plist[j].name, whole.plist[i].name) != 0) continue;
                    grad_of(&whole, i, a);
                    grad_of(&st[k], j, b);
                    mpi_check(memcmp(a, b, whole.plist[i].size * sizeof(float)) == 0, "tp=%d %s: the "
                              "gradient of %s differs between the whole slice and stage %d", tp,
                              d ? "bf16" : "fp32", whole.plist[i].name, k);
                    compared++;
                }
        mpi_check(compared == whole.nplist - 1, "tp=%d: compared %d tensors of %d", tp, compared, whole.nplist - 1);
        free(a), free(b);
        for (int k = 0; k < 2; k++) gpt2_acts_free(&sa[k]), gpt2_free(&st[k]);
        gpt2_acts_free(&wa), gpt2_free(&whole);
    }
    if (r == 0) printf("mpi_tp: stages tp=%d: two stages == the whole slice, fp32 and bf16\n", tp);
}

// A mutant must move the results well past the tolerance (10x) to count as caught.
static void expect_caught(const char *bug, float worst, int tp) {
    mpi_check(worst > 10 * TOL, "tp=%d: the bug \"%s\" went unseen (worst difference %.3g)", tp, bug, (double)worst);
    if (dist_rank() == 0) printf("mpi_tp: mutant tp=%d \"%s\": worst difference %.3g\n", tp, bug, (double)worst);
}

static float run_mutant(DistGroup *g, int V, int as_if_V, const TpSite *skip, int nskip, int wrong_heads) {
    Full f;
    full_run(&f, config(V));
    TpComm c = comm(g);
    Slice s;
    slice_build(&s, &f, g, as_if_V);
    if (wrong_heads) {  // q, k, v rows of the next rank's heads, with this rank's projection columns
        GPT2 other;
        const TpShape sh = {0, s.m.cfg.L, g->size, (g->rank + 1) % g->size, 0, B_, T_, GPT2_RECOMPUTE_NONE};
        tp_build(&other, s.m.cfg, DEV_CPU, GPT2_FP32, sh, SEED);
        const GPT2BlockDims d = tp_block_dims(s.m.cfg.C, s.m.cfg.NH, g->size);
        for (int l = 0; l < s.m.cfg.L; l++) {
            GPT2BlockWeights mine = gpt2_block_weights(&d, s.m.params + gpt2_block_unit(&s.m, l)->offset);
            GPT2BlockWeights next = gpt2_block_weights(&d, other.params + gpt2_block_unit(&other, l)->offset);
            memcpy(mine.qkvw, next.qkvw, (size_t)3 * d.ATT * d.C * sizeof(float));
            memcpy(mine.qkvb, next.qkvb, (size_t)3 * d.ATT * sizeof(float));
        }
        gpt2_free(&other);
    }
    for (int i = 0; i < nskip; i++) skip_site[skip[i]] = 1;
    slice_step(&s, &c, &f);
    memset(skip_site, 0, sizeof skip_site);
    float worst = slice_worst(&s, &f, g, 0);
    // every rank must agree that the bug was seen: the worst over the group
    dist_all_reduce(&worst, &worst, 1, DIST_F32, DIST_MAX, g);
    slice_free(&s);
    gpt2_free(&f.m);
    return worst;
}

static void run_mutants(DistGroup *g) {
    int tp = g->size;
    if (tp == 1) return;  // one rank: no all-reduce to forget, no other rank's heads
    TpSite f_sites[2] = {TP_SITE_ATTN_F, TP_SITE_MLP_F};
    expect_caught("f's backward all-reduce missing (attention and MLP)", run_mutant(g, 250, 250, f_sites, 2, 0), tp);
    expect_caught("f's backward all-reduce missing (attention only)", run_mutant(g, 250, 250, f_sites, 1, 0), tp);
    TpSite sumexp = TP_SITE_CE_SUMEXP;
    expect_caught("cross-entropy normalised by the local vocab", run_mutant(g, 250, 250, &sumexp, 1, 0), tp);
    expect_caught("heads assigned to the wrong rank", run_mutant(g, 250, 250, NULL, 0, 1), tp);
    int V = 251, Vp = tp_vocab(V, tp, 0).Vp;  // padded on tp = 2 and 4
    expect_caught("padded vocab rows leaking into the softmax", run_mutant(g, V, Vp, NULL, 0, 0), tp);
}

// The split backward (tp.h, ZB-H1's B and W): on the whole slice, fp32 and bf16, without and
// with SP, B (tp_backward_input, the set kept: tp_acts_keep_for_w) then W (tp_backward_weights)
// gives tp_backward's bits: every gradient, the loss; B makes exactly tp_backward's collectives
// (the same calls and floats per site) and W none.
static void run_split(DistGroup *g) {
    const GPT2Config cfg = {.V = 64, .T = T_, .L = 2, .C = 32, .NH = 4};
    const int N = B_ * T_, tp = g->size, r = g->rank;
    int in[B_ * T_], tg[B_ * T_];
    for (int i = 0; i < N; i++) in[i] = (i * 7 + 3) % cfg.V, tg[i] = (i * 5 + 1) % cfg.V;
    for (int d = 0; d < 2; d++)
        for (int sp = 0; sp < 2; sp++) {
            if (sp && (tp == 1 || T_ % tp != 0)) continue;
            const GPT2Dtype dt = d ? GPT2_BF16 : GPT2_FP32;
            GPT2 m[2];
            GPT2Acts a[2];
            TpComm c[2] = {tp_comm_group(g), tp_comm_group(g)};
            float loss[2];
            for (int k = 0; k < 2; k++) {  // 0: tp_backward, 1: B then W
                tp_build(&m[k], cfg, DEV_CPU, dt, (TpShape){0, cfg.L, tp, r, sp, B_, T_, GPT2_RECOMPUTE_NONE}, 42);
                tp_acts_alloc(&a[k], &m[k]);
                if (k == 1) tp_acts_alloc_split(&a[k], &m[k]);
                gpt2_acts_set_batch(&m[k], &a[k], in, tg);
                gpt2_zero_grad(&m[k]);
                loss[k] = tp_forward(&m[k], &a[k], &c[k]);
                if (k == 0) {
                    tp_backward(&m[k], &a[k], &c[k], 1.0f / N);
                    continue;
                }
                tp_backward_input(&m[k], &a[k], &c[k], 1.0f / N);
                tp_acts_keep_for_w(&a[k], &m[k]);
                const TpComm after_b = c[k];
                tp_backward_weights(&m[k], &a[k]);
                mpi_check(memcmp(after_b.calls, c[k].calls, sizeof after_b.calls) == 0,
                          "tp=%d sp=%d: W communicated", tp, sp);
            }
            const char *dn = d ? "bf16" : "fp32";
            mpi_check(memcmp(c[0].calls, c[1].calls, sizeof c[0].calls) == 0 &&
                          memcmp(c[0].floats, c[1].floats, sizeof c[0].floats) == 0,
                      "tp=%d %s sp=%d: B's collectives are not tp_backward's", tp, dn, sp);
            mpi_check(memcmp(&loss[0], &loss[1], sizeof(float)) == 0, "tp=%d %s sp=%d: the losses differ",
                      tp, dn, sp);
            float *x = lab_xmalloc(tp_block_count(cfg.C, 1) * sizeof(float));
            float *y = lab_xmalloc(tp_block_count(cfg.C, 1) * sizeof(float));
            for (int i = 0; i < m[0].nplist; i++) {  // every tensor, by name in both
                grad_of(&m[0], i, x);
                grad_of(&m[1], i, y);
                mpi_check(memcmp(x, y, m[0].plist[i].size * sizeof(float)) == 0, "tp=%d %s sp=%d: the "
                          "gradient of %s differs between tp_backward and B then W", tp, dn, sp,
                          m[0].plist[i].name);
            }
            free(x), free(y);
            for (int k = 0; k < 2; k++) gpt2_acts_free(&a[k]), gpt2_free(&m[k]);
        }
    if (r == 0) printf("mpi_tp: split tp=%d: B then W == the backward, fp32 and bf16, with and without SP\n", tp);
}

static const char *const kinds[] = {"equiv", "count", "stages", "mutants", "split"};

static void run(int kind, DistGroup *g) {
    if (!splits(g)) return;  // 3 ranks do not split 4 heads
    if (kind == 0) run_equiv(g);
    if (kind == 1) run_count(g);
    if (kind == 2) run_stages(g);
    if (kind == 3) run_mutants(g);
    if (kind == 4) run_split(g);
}

int main(int argc, char **argv) {
    return mpi_test_main(argc, argv, "mpi_tp", "usage: mpi_tp equiv|count|stages|mutants|split...", kinds, 5, run);
}
