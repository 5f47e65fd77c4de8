// mpi_tp.c: the tensor-parallel pieces of common/tp.h against the full model of common/gpt2.h.
//
// Launched by tests/test_tp.c as
//   mpirun -np N build/tests/mpi_tp <what>...
// and run (mpitest.h) on the world and on a split group: with N = 4, tp = 4 and tp = 2. Every
// rank also runs the full GPT-2 (gpt2_forward / gpt2_backward, one device): the truth. <what>:
//   equiv     a whole model (vocab-parallel embedding, L TP blocks, final LayerNorm, the head's
//             matmul on the local wte rows, vocab-parallel loss) == the full model: every block's
//             output, the per-position losses, and every gradient, both on each rank's own shard
//             and gathered back into the full layout (tp_block_unshard / tp_wte_unshard, summed
//             over the group). V = 250 (tp = 2 divides it, tp = 4 pads it to 252) and V = 251
//             (padded on both). Also: a shard's init alone == the slice of the full init, bit
//             for bit, and the padded wte rows get exactly zero gradient.
//   count     exactly three all-reduces in the loss, each of B·T floats (the TpComm counters,
//             and dist's call and byte counters against 2(t-1)/t · 4·B·T per all-reduce); a
//             whole step makes 2 (forward) + 2 (backward) all-reduces of B·T·C per block, one
//             for the embedding and one for f at the head's input.
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

// The full model's non-block tensors (wte, wpe, lnfw, lnfb), weights and gradients.
static size_t off(const GPT2 *m, int tensor) { return gpt2_tensor_offset(m, tensor, -1); }
static float *W(const GPT2 *m, int tensor) { return m->params + off(m, tensor); }
static float *G(const GPT2 *m, int tensor) { return m->grads + off(m, tensor); }

// ---- one rank's TP model ------------------------------------------------------------------------------

typedef struct {
    GPT2Config cfg;
    TpVocab tv;
    float *blocks[8], *dblocks[8];   // shards, tp_block_count floats each
    TpBlock w[8], dw[8];
    float *wte, *dwte;               // (Vl, C)
    float *wpe, *dwpe;               // (T, C)
    float *lnfw, *lnfb, *dlnfw, *dlnfb;
    TpBlockActs a[8];
    TpScratch s;
    TpHeadActs h;
    float *enc, *dx;                 // (N, C)
} TpModel;

static float *zeros(size_t n) { return lab_xcalloc(n ? n : 1, sizeof(float)); }

// Weights from the full model's (so a mutant can alter a shard before it runs); checks on the
// way that a shard initialized alone equals the slice of the full init.
static void tp_model_build(TpModel *t, const Full *f, TpComm *c, int vocab_as_if) {
    GPT2Config cfg = f->m.cfg;
    int C = cfg.C, N = B_ * T_;
    memset(t, 0, sizeof *t);
    t->cfg = cfg;
    t->tv = tp_vocab(vocab_as_if, c->tp, c->rank);
    size_t nb = tp_block_count(C, c->tp), Vl = (size_t)t->tv.Vl;
    for (int l = 0; l < cfg.L; l++) {
        t->blocks[l] = zeros(nb), t->dblocks[l] = zeros(nb);
        tp_block_views(&t->w[l], t->blocks[l], C, c->tp);
        tp_block_views(&t->dw[l], t->dblocks[l], C, c->tp);
        TpBlock full;
        tp_block_of_model(&full, &cfg, f->m.params, l);
        tp_block_shard(&t->w[l], &full, C, c->tp, c->rank);
        float *alone = zeros(nb);
        TpBlock va;
        tp_block_views(&va, alone, C, c->tp);
        tp_block_init(&va, &cfg, SEED, l, c->tp, c->rank);
        mpi_check(memcmp(alone, t->blocks[l], nb * sizeof(float)) == 0,
                  "tp=%d rank %d block %d: the shard initialized alone != the slice of the full init",
                  c->tp, c->rank, l);
        free(alone);
    }
    t->wte = zeros(Vl * C), t->dwte = zeros(Vl * C);
    TpVocab real = tp_vocab(cfg.V, c->tp, c->rank);  // the padded rows are zero in any case
    tp_wte_shard(t->wte, W(&f->m, GPT2_WTE), &real, C);
    float *alone = zeros(Vl * C);
    tp_wte_init(alone, &cfg, SEED, &real);
    mpi_check(memcmp(alone, t->wte, Vl * C * sizeof(float)) == 0,
              "tp=%d rank %d: wte rows initialized alone != the slice of the full init", c->tp, c->rank);
    free(alone);
    t->wpe = zeros((size_t)T_ * C), t->dwpe = zeros((size_t)T_ * C);
    memcpy(t->wpe, W(&f->m, GPT2_WPE), (size_t)T_ * C * sizeof(float));
    t->lnfw = zeros(C), t->lnfb = zeros(C), t->dlnfw = zeros(C), t->dlnfb = zeros(C);
    memcpy(t->lnfw, W(&f->m, GPT2_LNFW), C * sizeof(float));
    memcpy(t->lnfb, W(&f->m, GPT2_LNFB), C * sizeof(float));
    for (int l = 0; l < cfg.L; l++) tp_block_acts_alloc(&t->a[l], B_, T_, C, cfg.NH, c->tp, DEV_CPU);
    tp_scratch_alloc(&t->s, B_, T_, C, cfg.NH, c->tp, DEV_CPU);
    tp_head_acts_alloc(&t->h, N, C, &t->tv, DEV_CPU);
    t->enc = zeros((size_t)N * C), t->dx = zeros((size_t)N * C);
}

static void tp_model_free(TpModel *t) {
    for (int l = 0; l < t->cfg.L; l++) {
        free(t->blocks[l]), free(t->dblocks[l]);
        tp_block_acts_free(&t->a[l]);
    }
    tp_scratch_free(&t->s);
    tp_head_acts_free(&t->h);
    void *p[] = {t->wte, t->dwte, t->wpe, t->dwpe, t->lnfw, t->lnfb, t->dlnfw, t->dlnfb, t->enc, t->dx};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

// One forward and backward of the TP model, composed of tp.h's pieces as chapter 07 will.
static void tp_model_step(TpModel *t, TpComm *c, const int *inp, const int *tgt) {
    const Kernels *k = kernels_get(DEV_CPU);
    int C = t->cfg.C, L = t->cfg.L, N = B_ * T_;
    tp_embed_forward(k, c, &t->tv, t->enc, inp, t->wte, t->wpe, B_, T_, C);
    const float *x = t->enc;
    for (int l = 0; l < L; l++) {
        tp_block_forward(k, c, &t->w[l], &t->a[l], x);
        x = t->a[l].out;
    }
    tp_head_forward(k, c, &t->tv, &t->h, x, t->lnfw, t->lnfb, t->wte, tgt);
    tp_head_backward(k, c, &t->tv, &t->h, x, t->lnfw, t->wte, t->dlnfw, t->dlnfb, t->dwte, tgt, 1.0f / N, t->dx);
    for (int l = L - 1; l >= 0; l--)
        tp_block_backward(k, c, &t->w[l], &t->dw[l], &t->a[l], &t->s, l ? t->a[l - 1].out : t->enc,
                          t->dx, t->dx);
    tp_embed_backward(k, &t->tv, t->dwte, t->dwpe, t->dx, inp, B_, T_, C);
}

// The worst relative difference of the TP model from the full one, over everything compared
// (block outputs, losses, every gradient; shard by shard and gathered back). what: for messages.
static float tp_model_worst(const TpModel *t, const Full *f, DistGroup *g, int report) {
    const GPT2 *m = &f->m;
    int C = t->cfg.C, N = B_ * T_, tp = g->size, r = g->rank;
    float worst = 0.0f;
#define SEE(name, err)                                                                           \
    do {                                                                                         \
        float e_ = (err);                                                                        \
        if (report) mpi_check(e_ <= TOL, "tp=%d rank %d V=%d: %s differs by %.3g (tolerance %g)", \
                              tp, r, t->cfg.V, name, (double)e_, (double)TOL);                   \
        if (!(e_ <= worst)) worst = e_;                                                          \
    } while (0)
    char name[96];
    for (int l = 0; l < t->cfg.L; l++) {
        snprintf(name, sizeof name, "block %d's output", l);
        SEE(name, mpi_rel_err(t->a[l].out, m->act.a.residual3 + (size_t)l * N * C, (size_t)N * C));
    }
    SEE("the per-position losses", mpi_rel_err(t->h.losses, m->act.host_losses, N));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += t->h.losses[i];
    float mean = (float)(sum / N);
    SEE("the mean loss", mpi_rel_err(&mean, &f->loss, 1));

    // Gradients on this rank's shard, against the same shard of the full gradients.
    size_t nb = tp_block_count(C, tp), sizes[TP_BLOCK_TENSORS];
    tp_block_sizes(C, tp, sizes);
    float *ref = zeros(nb);
    for (int l = 0; l < t->cfg.L; l++) {
        TpBlock full, vref;
        tp_block_of_model(&full, &t->cfg, m->grads, l);
        tp_block_views(&vref, ref, C, tp);
        tp_block_shard(&vref, &full, C, tp, r);
        size_t off = 0;
        for (int i = 0; i < TP_BLOCK_TENSORS; i++) {
            snprintf(name, sizeof name, "block %d's gradient tensor %d (shard)", l, i);
            SEE(name, mpi_rel_err(t->dblocks[l] + off, ref + off, sizes[i]));
            off += sizes[i];
        }
    }
    free(ref);
    TpVocab real = tp_vocab(t->cfg.V, tp, r);
    size_t Vl = (size_t)t->tv.Vl;
    float *wref = zeros(Vl * C);
    tp_wte_shard(wref, G(m, GPT2_WTE), &real, C);
    SEE("the wte gradient (shard)", mpi_rel_err(t->dwte, wref, Vl * C));
    free(wref);
    int pad_clean = 1;
    for (size_t i = (size_t)real.nvalid * C; i < Vl * C; i++) pad_clean &= t->dwte[i] == 0.0f;
    if (report) mpi_check(pad_clean, "tp=%d rank %d V=%d: a padded wte row got a gradient", tp, r, t->cfg.V);
    if (!pad_clean) worst = INFINITY;
    SEE("the wpe gradient", mpi_rel_err(t->dwpe, G(m, GPT2_WPE), (size_t)T_ * C));
    SEE("the lnfw gradient", mpi_rel_err(t->dlnfw, G(m, GPT2_LNFW), C));
    SEE("the lnfb gradient", mpi_rel_err(t->dlnfb, G(m, GPT2_LNFB), C));

    // Gathered back: every rank writes its slices into a zeroed full-size buffer (the
    // replicated tensors from rank 0 only), the group sums them: the whole gradient.
    float *all = zeros(m->num_params);
    for (int l = 0; l < t->cfg.L; l++) {
        TpBlock full;
        tp_block_of_model(&full, &t->cfg, all, l);
        tp_block_unshard(&full, &t->dw[l], C, tp, r, r == 0);
    }
    float *wte_all = all + (off(m, GPT2_WTE));
    tp_wte_unshard(wte_all, t->dwte, &real, C);
    if (r == 0) {
        memcpy(all + (off(m, GPT2_WPE)), t->dwpe, (size_t)T_ * C * sizeof(float));
        memcpy(all + (off(m, GPT2_LNFW)), t->dlnfw, C * sizeof(float));
        memcpy(all + (off(m, GPT2_LNFB)), t->dlnfb, C * sizeof(float));
    }
    dist_all_reduce(all, all, m->num_params, DIST_F32, DIST_SUM, g);
    GPT2Param list[64];
    int np = gpt2_params(&t->cfg, list);
    for (int j = 0; j < np; j++) {
        snprintf(name, sizeof name, "the gathered gradient of %.31s", list[j].name);
        SEE(name, mpi_rel_err(all + list[j].offset, m->grads + list[j].offset, list[j].size));
    }
    free(all);
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
        TpModel t;
        tp_model_build(&t, &f, &c, Vs[i]);
        tp_model_step(&t, &c, f.inp, f.tgt);
        float worst = tp_model_worst(&t, &f, g, 1);
        if (g->rank == 0)
            printf("mpi_tp: equiv tp=%d V=%d (padded to %d): worst relative difference %.3g\n", g->size,
                   Vs[i], t.tv.Vp, (double)worst);
        tp_model_free(&t);
        gpt2_free(&f.m);
    }
}

static void run_count(DistGroup *g) {
    Full f;
    full_run(&f, config(250));
    TpComm c = comm(g);
    TpModel t;
    tp_model_build(&t, &f, &c, 250);
    int N = B_ * T_, C = t.cfg.C, L = t.cfg.L, tp = g->size;
    const Kernels *k = kernels_get(DEV_CPU);
    // the loss alone: the TpComm counters and dist's
    tp_model_step(&t, &c, f.inp, f.tgt);
    TpComm c2 = comm(g);
    dist_counters_reset();
    tp_crossentropy_forward(k, &c2, &t.tv, t.h.losses, &t.h.st, t.h.logits, f.tgt, N);
    uint64_t total_calls = 0, total_floats = 0;
    for (int s = 0; s < TP_NSITES; s++) total_calls += c2.calls[s], total_floats += c2.floats[s];
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
    // the whole step (run by tp_model_step above on c): per block 2 forward (g) + 2 backward (f)
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
    tp_model_free(&t);
    gpt2_free(&f.m);
}

// A mutant must move the results well past the tolerance (10x) to count as caught.
static void expect_caught(const char *bug, float worst, int tp) {
    mpi_check(worst > 10 * TOL, "tp=%d: the bug \"%s\" went unseen (worst difference %.3g)", tp, bug, (double)worst);
    if (dist_rank() == 0) printf("mpi_tp: mutant tp=%d \"%s\": worst difference %.3g\n", tp, bug, (double)worst);
}

static float run_mutant(DistGroup *g, int V, int vocab_as_if, const TpSite *skip, int nskip, int wrong_heads) {
    Full f;
    full_run(&f, config(V));
    TpComm c = comm(g);
    TpModel t;
    tp_model_build(&t, &f, &c, vocab_as_if);
    if (wrong_heads) {  // q, k, v rows of the next rank's heads, with this rank's projection columns
        int C = t.cfg.C, tp = g->size;
        float *other = zeros(tp_block_count(C, tp));
        for (int l = 0; l < t.cfg.L; l++) {
            TpBlock full, vo;
            tp_block_of_model(&full, &t.cfg, f.m.params, l);
            tp_block_views(&vo, other, C, tp);
            tp_block_shard(&vo, &full, C, tp, (g->rank + 1) % tp);
            memcpy(t.w[l].qkvw, vo.qkvw, (size_t)3 * C / tp * C * sizeof(float));
            memcpy(t.w[l].qkvb, vo.qkvb, (size_t)3 * C / tp * sizeof(float));
        }
        free(other);
    }
    for (int i = 0; i < nskip; i++) skip_site[skip[i]] = 1;
    tp_model_step(&t, &c, f.inp, f.tgt);
    memset(skip_site, 0, sizeof skip_site);
    float worst = tp_model_worst(&t, &f, g, 0);
    // every rank must agree that the bug was seen: the worst over the group
    dist_all_reduce(&worst, &worst, 1, DIST_F32, DIST_MAX, g);
    tp_model_free(&t);
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

static const char *const kinds[] = {"equiv", "count", "mutants"};

static void run(int kind, DistGroup *g) {
    if (!splits(g)) return;  // 3 ranks do not split 4 heads
    if (kind == 0) run_equiv(g);
    if (kind == 1) run_count(g);
    if (kind == 2) run_mutants(g);
}

int main(int argc, char **argv) {
    return mpi_test_main(argc, argv, "mpi_tp", "usage: mpi_tp equiv|count|mutants...", kinds, 3, run);
}
