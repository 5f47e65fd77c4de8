// 06_fsdp: Fully Sharded Data Parallel, unit by unit, with prefetch (PyTorch's FSDP).
//
//   make 06_fsdp && mpirun -np 4 ./06_fsdp/run [--reshard-after-forward 0|1] [--prefetch N]
//        [--grad-accum K [--no-sync]] [--shard-group G] [--dtype bf16]
//
// Chapter 05's ZeRO-3 shards the model state; FSDP is how that is run fast. Every unit (the
// embedding, each block, the head: FSDP's FlatParameter per wrapped module) is sharded over the
// shard group as ZeRO-3 shards it (common/zero.h: rank r owns piece r of every unit), and goes
// through its own state machine (fsdp.h): SHARDED -> GATHERING -> GATHERED -> FREED. One
// micro-batch is a plan of ops (fsdp_plan_build): forward embed, blocks, head; backward head,
// blocks in reverse, embed. Walking it:
//   before an op   issue the all-gathers of the prefetch queue up to the op's own and --prefetch
//                  more (forward order in forward, backward order in backward), on the
//                  communication thread; wait for the op's units
//   the op         reads the gathered units (gpt2's *_w pieces), backward accumulates into
//                  unit gradient buffers
//   after the op   free what the reshard rule says (--reshard-after-forward 1: each unit after
//                  its forward, gathered again for its backward; 0: kept until its backward,
//                  a third less all-gather traffic for the memory of the whole model)
//   after a unit's backward   the hook: reduce-scatter its gradient (average) into my piece,
//                  its buffer freed once that is done (HSDP: then all-reduced over the replicas)
// Gradient accumulation over K micro-batches in both of FSDP's modes: reduce-scatter after
// every micro-batch (sharded gradients: little memory, K times the reduce-scatters), or
// --no-sync (the unit gradients stay whole until the last micro-batch: Ψ more gradient memory,
// one reduce-scatter). --shard-group G: HSDP, sharded within groups of G consecutive ranks and
// replicated across them. The step: global clipping from my pieces, AdamW on my pieces (fp32
// master and Adam state; bf16 weights and gradients on the wire with --dtype bf16).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "fsdp.h"
#include "gpt2.h"
#include "mem.h"
#include "optim.h"
#include "results.h"
#include "session.h"
#include "shard.h"
#include "trace.h"
#include "train.h"
#include "zero.h"

static const char *USAGE =
    "06_fsdp: Fully Sharded Data Parallel. Each unit (embedding, block, head) is sharded over the\n"
    "ranks, gathered just before it runs (the next ones prefetched), freed after, gathered again\n"
    "for its backward, its gradient reduce-scattered by a hook when its backward is done.\n"
    "\n"
    "  mpirun -np 4 ./06_fsdp/run                  FSDP: reshard after forward, prefetch 1\n"
    "  mpirun -np 4 ./06_fsdp/run --prefetch 0     no prefetch: every all-gather waited for\n"
    "                                              in the open (compare the ms per step)\n"
    "  mpirun -np 4 ./06_fsdp/run --reshard-after-forward 0\n"
    "                                              keep the gathered units until backward:\n"
    "                                              L+2 all-gathers instead of 2L+3, the whole\n"
    "                                              model gathered at the forward's end\n"
    "  mpirun -np 4 ./06_fsdp/run --batch 32 --grad-accum 4\n"
    "                                              reduce-scatter after every micro-batch\n"
    "  mpirun -np 4 ./06_fsdp/run --batch 32 --grad-accum 4 --no-sync\n"
    "                                              whole unit gradients until the last one\n"
    "  mpirun -np 4 ./06_fsdp/run --shard-group 2  HSDP: 2 shard groups of 2, the pieces'\n"
    "                                              gradients all-reduced across them\n"
    "  mpirun -np 4 ./06_fsdp/run --dtype bf16     bf16 gathers and reduce-scatters, fp32\n"
    "                                              sharded master and Adam state\n"
    "  mpirun -np 4 ./06_fsdp/run --save f.ckpt; mpirun -np 2 ./03_ddp/run --resume f.ckpt\n"
    "                                              the checkpoint holds the model, not the layout\n"
    "  mpirun -np 2 ./06_fsdp/run --trace fsdp.json  the prefetched all-gathers under the\n"
    "                                              compute (open at ui.perfetto.dev)\n";

typedef struct FsdpFlags {
    int reshard;          // --reshard-after-forward
    int prefetch;         // --prefetch
    int grad_accum;       // --grad-accum
    int no_sync;          // --no-sync
    int shard_group;      // --shard-group (0: the whole world)
} FsdpFlags;

enum { PH_FWD, PH_BWD, PH_OPT, PH_N };
static const char *PHASE[PH_N] = {"forward", "backward", "optimizer"};

// The categories the per-phase table shows (gathered weights are MEM_COMM; unit gradient
// buffers and my gradient pieces MEM_GRADS).
enum { C_PARAMS, C_GATHERED, C_GRADS, C_MASTER, C_OPT_M, C_OPT_V, C_ACTS, C_TOTAL, C_N };
static const MemCategory CAT[C_N - 1] = {MEM_PARAMS, MEM_COMM, MEM_GRADS, MEM_MASTER,
                                         MEM_OPT_M, MEM_OPT_V, MEM_ACTS};

typedef struct Run {
    Session *s;
    GPT2 *m;
    const FsdpFlags *f;
    int G, R;                 // shard group size, replicas
    DistGroup *shard, *rep;
    ZeroLayout z;
    FsdpPlan plan;
    Fsdp F;
    void *param_shard, *grad_shard;
    float *master, *opt_m, *opt_v;  // fp32 master: the parameter pieces themselves
    int K, Bm;
    double peak[PH_N][C_N];   // measured, the largest over the run's steps
    int fwd_log[64], nfwd_log, bwd_log[64], nbwd_log;  // step 1's all-gathers, in order
} Run;

// ---------------------------------------------------------------------------------------------
// One micro-batch: the plan's ops, forward then backward

static void phase_begin(void) { mem_reset_peaks(); }
static void phase_end(Run *r, int ph) {
    for (int c = 0; c < C_N - 1; c++)
        if ((double)mem_peak(CAT[c]) > r->peak[ph][c]) r->peak[ph][c] = (double)mem_peak(CAT[c]);
    if ((double)mem_total_peak() > r->peak[ph][C_TOTAL]) r->peak[ph][C_TOTAL] = (double)mem_total_peak();
}

static const char *op_name(const FsdpOp *o, char *buf, size_t len) {
    const char *dir = o->backward ? "backward" : "forward";
    if (o->piece == FSDP_BLOCK) snprintf(buf, len, "%s block %d", dir, o->layer);
    else snprintf(buf, len, "%s %s", dir, o->piece == FSDP_EMBED ? "embedding" : "head");
    return buf;
}

static float forward(Run *r) {
    Fsdp *F = &r->F;
    GPT2 *m = r->m;
    const int H = r->s->cfg.L + 1;
    float loss = 0.0f;
    gpt2_set_batch(m, r->s->inputs, r->s->targets);
    for (int k = 0; k < r->plan.nfwd; k++) {
        const FsdpOp *o = &r->plan.ops[k];
        char name[48];
        fsdp_before_op(F, &r->plan, k);  // prefetch window issued, this op's units gathered
        int tok = trace_begin(op_name(o, name, sizeof name), TRACE_COMPUTE);
        if (o->piece == FSDP_EMBED) gpt2_embed_forward_w(m, NULL, fsdp_weights(F, 0));
        else if (o->piece == FSDP_BLOCK)
            gpt2_block_forward_w(m, NULL, o->layer, fsdp_weights(F, 1 + o->layer));
        else loss = gpt2_head_forward_w(m, NULL, fsdp_weights(F, 0), fsdp_weights(F, H));
        trace_end(tok);
        fsdp_after_op(F, &r->plan, k);  // reshard-after-forward frees
    }
    return loss;
}

// sync: this micro-batch's hooks reduce-scatter (always, except inside no_sync).
static void backward(Run *r, float dloss, int sync) {
    Fsdp *F = &r->F;
    GPT2 *m = r->m;
    const int H = r->s->cfg.L + 1;
    for (int k = r->plan.nfwd; k < r->plan.nops; k++) {
        const FsdpOp *o = &r->plan.ops[k];
        char name[48];
        fsdp_before_op(F, &r->plan, k);
        int tok = trace_begin(op_name(o, name, sizeof name), TRACE_COMPUTE);
        if (o->piece == FSDP_HEAD)
            gpt2_head_backward_w(m, NULL, dloss, fsdp_weights(F, 0), fsdp_weights(F, H),
                                 fsdp_unit_grads(F, 0), fsdp_unit_grads(F, H));
        else if (o->piece == FSDP_BLOCK)
            gpt2_block_backward_w(m, NULL, o->layer, fsdp_weights(F, 1 + o->layer),
                                  fsdp_unit_grads(F, 1 + o->layer));
        else gpt2_embed_backward_w(m, NULL, fsdp_unit_grads(F, 0));
        trace_end(tok);
        fsdp_after_op(F, &r->plan, k);       // units no later op reads: freed
        fsdp_grads_done(F, o->done, sync);   // the hook: this unit's gradient is complete
    }
}

static void keep_log(const Fsdp *F, int *dst, int *n, int from) {
    *n = 0;
    for (int i = from; i < F->nlog && *n < 64; i++) dst[(*n)++] = F->log[i];
}

// ---------------------------------------------------------------------------------------------
// The step after backward: global clipping from my pieces, AdamW on my pieces

// The step's one sync point for the loss and the norm: without HSDP the shard group is the
// world, so the loss (averaged over the world) rides along the Σ g² all-reduce as a second
// double (its sum in double, then / N: on 2 ranks the same float as an fp32 average). With HSDP
// they are over different groups: the loss over the world, Σ g² over the shard group.
static void optimizer_step(Run *r, int step, float *loss) {
    Session *s = r->s;
    ZeroShard b = zero_shard_of(r->m, s->plist, s->nplist);
    b.params = r->param_shard;
    b.grads = r->grad_shard;
    b.master = r->master;
    b.opt_m = r->opt_m;
    b.opt_v = r->opt_v;
    double sq = zero_sum_squares(&r->z, &b);
    // each element lives in one piece of the shard group (the replicas hold the same pieces)
    if (r->R == 1 && r->G > 1) {
        double v[2] = {sq, (double)*loss};
        dist_all_reduce(v, v, 2, DIST_F64, DIST_SUM, r->shard);
        sq = v[0];
        *loss = (float)(v[1] / r->G);
    } else {
        dist_all_reduce(loss, loss, 1, DIST_F32, DIST_AVG, s->world);
        if (r->G > 1) dist_all_reduce(&sq, &sq, 1, DIST_F64, DIST_SUM, r->shard);
    }
    float scale = adamw_clip_scale(&s->opt, sq, step);
    int tok = trace_begin("optimizer (my pieces)", TRACE_COMPUTE);
    zero_adamw(&r->z, &b, &s->opt, step, scale);
    trace_end(tok);
}

// ---------------------------------------------------------------------------------------------
// Setup

static void setup(Run *r, Session *s, const FsdpFlags *f) {
    GPT2 *m = &s->model;
    const int N = s->N;
    r->s = s;
    r->m = m;
    r->f = f;
    r->G = f->shard_group ? f->shard_group : N;
    r->R = N / r->G;
    // HSDP: shard groups of G consecutive ranks; the replicate group is the same place in each
    r->shard = r->G == N ? s->world : dist_split(s->world, s->rank / r->G, s->rank, "shard");
    r->rep = r->R == 1 ? NULL : dist_split(s->world, s->rank % r->G, s->rank, "replicate");
    zero_layout_init(&r->z, m, r->G, s->rank % r->G);
    fsdp_plan_build(&r->plan, s->cfg.L, f->reshard);
    // the whole model the session built goes: only my pieces stay
    if (s->bf16) {
        mem_free(m->params_bf16); m->params_bf16 = NULL;
        mem_free(m->grads_bf16); m->grads_bf16 = NULL;
    } else {
        mem_free(m->params); m->params = NULL;
        mem_free(m->grads); m->grads = NULL;
    }
    const size_t sn = r->z.shard_n;
    r->param_shard = mem_alloc(sn * s->e, MEM_PARAMS, s->dev);
    r->grad_shard = mem_alloc(sn * s->e, MEM_GRADS, s->dev);
    r->master = s->bf16 ? mem_alloc(sn * sizeof(float), MEM_MASTER, s->dev) : r->param_shard;
    r->opt_m = mem_alloc(sn * sizeof(float), MEM_OPT_M, s->dev);
    r->opt_v = mem_alloc(sn * sizeof(float), MEM_OPT_V, s->dev);
    fsdp_init(&r->F, &r->z, r->shard, r->rep ? r->rep : NULL, s->dt, s->dev, m->k,
              s->bf16 ? m->work_grads : NULL, s->bf16 ? m->work_size : 0, r->param_shard,
              r->grad_shard);
    r->F.prefetch = f->prefetch;
}

// bf16: the weights the forward reads, rounded from my master pieces.
static void params_from_master(Run *r) {
    if (r->s->bf16) r->m->k->f32_to_bf16(r->param_shard, r->master, r->z.shard_n);
}

static int load_or_init(Run *r, const LabArgs *args) {
    Session *s = r->s;
    int start = 0;
    if (args->resume || args->load_weights) {
        start = zero_load_training(&r->z, &s->cfg, args->resume, args->load_weights, r->master,
                                   0, r->opt_m, r->opt_v, s->world);
        if (args->resume && !args->quiet && s->rank == 0)
            printf("resumed from %s at step %d\n", args->resume, start);
    } else {
        zero_init_pieces(&r->z, &s->cfg, (uint64_t)args->seed, r->master, 0);
    }
    params_from_master(r);
    s->start = start;
    return start;
}

// --save: the first shard group gathers one copy of the pieces to rank 0 (the lab's format).
static void save_state(Run *r, const LabArgs *args, int step) {
    if (r->s->rank >= r->G) return;
    zero_save_training(&r->z, args->save, &r->s->cfg, step, (uint64_t)args->seed,
                       (uint64_t)args->data_seed, r->master, 0, r->opt_m, r->opt_v, r->shard);
}

// At the end the session reports the final weights from the model's own buffer: the whole
// parameters come back once, after every figure is taken (tagged MEM_OTHER).
static void unshard_for_report(Run *r) {
    Session *s = r->s;
    void *full = mem_alloc(s->n * s->e, MEM_OTHER, s->dev);
    for (int u = 0; u < r->z.nunits; u++) {
        const ZeroPiece *p = &r->z.p[u];
        dist_all_gather_n((char *)r->param_shard + p->local * s->e,
                          (char *)full + p->unit_offset * s->e, p->unit_size, s->dt, r->shard);
    }
    if (s->bf16) r->m->params_bf16 = full;
    else r->m->params = full;
}

static void free_run(Run *r) {
    fsdp_free(&r->F);
    fsdp_plan_free(&r->plan);
    if (r->master != r->param_shard) mem_free(r->master);
    mem_free(r->param_shard);
    mem_free(r->grad_shard);
    mem_free(r->opt_m);
    mem_free(r->opt_v);
    if (r->shard != r->s->world) dist_group_free(r->shard);
    if (r->rep) dist_group_free(r->rep);
    zero_layout_free(&r->z);
}

// ---------------------------------------------------------------------------------------------
// The formulas this run's figures are compared with (the tests compute their own)

// Gathered bytes alive at most during each phase: the plan walked as the runtime walks it (the
// queue issued up to each op's own entries + prefetch, the reshard rule's frees).
static void gathered_formula(const Run *r, double out[PH_N]) {
    const FsdpPlan *p = &r->plan;
    int *alive = lab_xcalloc((size_t)p->nunits, sizeof(int));
    int next = 0;
    out[PH_FWD] = out[PH_BWD] = out[PH_OPT] = 0;
    for (int k = 0; k < p->nops; k++) {
        const FsdpOp *o = &p->ops[k];
        int begin = o->backward ? p->nfwd_entries : 0, end = o->backward ? p->nentries : p->nfwd_entries;
        int last = begin - 1;
        for (int j = begin; j < end && p->entry_op[j] <= k; j++) last = j;
        while (next < end && next <= last + r->f->prefetch) {
            if (alive[p->entry_unit[next]] && p->entry_op[next] > k) break;
            alive[p->entry_unit[next++]] = 1;
        }
        double bytes = 0;
        for (int u = 0; u < p->nunits; u++) bytes += alive[u] ? (double)r->z.p[u].unit_size : 0;
        double *ph = &out[o->backward ? PH_BWD : PH_FWD];
        if (bytes * (double)r->s->e > *ph) *ph = bytes * (double)r->s->e;
        for (int i = 0; i < o->nfree; i++) alive[o->free[i]] = 0;
        if (k == p->nfwd - 1) {  // backward starts with what forward kept
            double kept = 0;
            for (int u = 0; u < p->nunits; u++) kept += alive[u] ? (double)r->z.p[u].unit_size : 0;
            out[PH_BWD] = kept * (double)r->s->e;
        }
    }
    free(alive);
}

// Gradient bytes alive at most during each phase: my pieces, plus the unit buffers: sync, the
// units backward writes now (the embedding's from the head on) and one reduce-scatter pending;
// no_sync (K > 1), every unit's from the first micro-batch to the last one's hooks.
static void grads_formula(const Run *r, double out[PH_N]) {
    const FsdpPlan *p = &r->plan;
    const double e = (double)r->s->e, shard = e * (double)r->z.shard_n, psi = e * (double)r->s->n;
    const int whole = r->f->no_sync && r->K > 1;
    out[PH_FWD] = shard + (whole ? psi : 0);
    out[PH_OPT] = shard;
    if (whole) { out[PH_BWD] = shard + psi; return; }
    int *alive = lab_xcalloc((size_t)p->nunits, sizeof(int));
    int pending = -1;
    double peak = 0;
    for (int k = p->nfwd; k < p->nops; k++) {
        const FsdpOp *o = &p->ops[k];
        if (o->piece == FSDP_HEAD) alive[0] = alive[p->nunits - 1] = 1;
        else if (o->piece == FSDP_BLOCK) alive[1 + o->layer] = 1;
        else alive[0] = 1;
        double bytes = 0;
        for (int u = 0; u < p->nunits; u++) bytes += alive[u] ? (double)r->z.p[u].unit_size : 0;
        if (bytes > peak) peak = bytes;
        if (pending >= 0) alive[pending] = 0;  // in_flight 1: the older one is reaped
        pending = o->done;
    }
    free(alive);
    out[PH_BWD] = shard + e * peak;
}

// ---------------------------------------------------------------------------------------------
// What each rank reports

enum { F_PEAK = 0,                                   // PH_N x C_N measured peaks
       F_XGATH = F_PEAK + PH_N * C_N, F_XGRADS = F_XGATH + PH_N,  // the formulas per phase
       F_XSTATE = F_XGRADS + PH_N,                   // params, master, m, v formulas
       F_CALLS = F_XSTATE + 4,                       // ag, rs, ar calls per step
       F_BYTES = F_CALLS + 3,                        // ag, rs, ar sent, recv per step
       F_XCALLS = F_BYTES + 6,                       // the formulas for ag, rs calls
       F_SENT = F_XCALLS + 2, F_RECV, F_STEP, F_NFIELDS };

static void per_rank_figures(Run *r, double *mine, const DistCounters *cost, int nrun) {
    const Session *s = r->s;
    for (int ph = 0; ph < PH_N; ph++)
        for (int c = 0; c < C_N; c++) mine[F_PEAK + ph * C_N + c] = r->peak[ph][c];
    gathered_formula(r, mine + F_XGATH);
    grads_formula(r, mine + F_XGRADS);
    const double sn = (double)r->z.shard_n, e = (double)s->e;
    mine[F_XSTATE + 0] = e * sn;
    mine[F_XSTATE + 1] = s->bf16 ? 4 * sn : 0;
    mine[F_XSTATE + 2] = mine[F_XSTATE + 3] = 4 * sn;
    const double d = nrun > 0 ? nrun : 1;
    static const DistOpKind kinds[3] = {OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE};
    const DistCounters *c = dist_counters();
    for (int i = 0; i < 3; i++) {
        DistOpKind k = kinds[i];
        mine[F_CALLS + i] = ((double)c->calls[k] - (double)cost->calls[k]) / d;
        mine[F_BYTES + 2 * i] = ((double)c->sent[k] - (double)cost->sent[k]) / d;
        mine[F_BYTES + 2 * i + 1] = ((double)c->recv[k] - (double)cost->recv[k]) / d;
    }
    mine[F_XCALLS + 0] = (double)r->K * r->plan.nentries;
    mine[F_XCALLS + 1] = (double)(r->f->no_sync ? 1 : r->K) * r->z.nunits;
    for (int k = 0; k < OP_NKINDS; k++) {
        mine[F_SENT] += ((double)c->sent[k] - (double)cost->sent[k]) / d;
        mine[F_RECV] += ((double)c->recv[k] - (double)cost->recv[k]) / d;
    }
    mine[F_STEP] = nrun ? session_elapsed(s) / nrun : 0;
}

static const char *eq(double a, double b) { return a == b ? "=" : "!"; }

static void print_log(const char *what, const int *log, int n, int L) {
    printf("  %-9s", what);
    for (int i = 0; i < n; i++) {
        char b[24];
        printf("%s%s", i ? ", " : "", fsdp_unit_name(log[i], L, b, sizeof b));
    }
    printf("%s\n", n ? "" : "(none)");
}

static void print_tables(Run *r, const double *all, const LabArgs *args) {
    Session *s = r->s;
    const int N = s->N, L = s->cfg.L;
    const int nrun = session_steps_run(s);
    double elapsed = session_elapsed(s);
    printf("%d steps in %.2f s: %.0f tokens/s (all ranks), %.1f ms per step\n", nrun, elapsed,
           (double)args->batch * s->T * nrun / elapsed, 1e3 * elapsed / nrun);
    printf("\nAll-gathers of step %d, in order (the prefetch queue as it ran):\n", s->start + 1);
    print_log("forward", r->fwd_log, r->nfwd_log, L);
    print_log("backward", r->bwd_log, r->nbwd_log, L);
    if (r->F.unplanned || r->F.wasted)
        printf("  (%d all-gathers were not in the plan, %d gathered units were never read)\n",
               r->F.unplanned, r->F.wasted);

    printf("\nPeak memory per rank and phase (mem.h), '=' where it equals the formula "
           "(sharded state + gathered units alive at once + unit gradients alive at once):\n");
    printf("  %-4s %-9s %12s %12s %12s %12s %12s %12s %11s\n", "rank", "phase", "params piece",
           "gathered", "grads", "master", "adam m+v", "acts", "peak total");
    for (int q = 0; q < N; q++) {
        const double *a = all + (size_t)q * F_NFIELDS;
        for (int ph = 0; ph < PH_N; ph++) {
            const double *pk = a + F_PEAK + ph * C_N;
            char b[8][32], cell[8][48];
            snprintf(cell[0], 48, "%s %s", mem_format(b[0], 32, pk[C_PARAMS]), eq(pk[C_PARAMS], a[F_XSTATE]));
            snprintf(cell[1], 48, "%s %s", mem_format(b[1], 32, pk[C_GATHERED]), eq(pk[C_GATHERED], a[F_XGATH + ph]));
            snprintf(cell[2], 48, "%s %s", mem_format(b[2], 32, pk[C_GRADS]), eq(pk[C_GRADS], a[F_XGRADS + ph]));
            snprintf(cell[3], 48, "%s %s", mem_format(b[3], 32, pk[C_MASTER]), eq(pk[C_MASTER], a[F_XSTATE + 1]));
            double mv = pk[C_OPT_M] + pk[C_OPT_V];
            snprintf(cell[4], 48, "%s %s", mem_format(b[4], 32, mv), eq(mv, a[F_XSTATE + 2] + a[F_XSTATE + 3]));
            printf("  %-4d %-9s %12s %12s %12s %12s %12s %12s %11s\n", q, PHASE[ph], cell[0],
                   cell[1], cell[2], cell[3], cell[4], mem_format(b[5], 32, pk[C_ACTS]),
                   mem_format(b[6], 32, pk[C_TOTAL]));
        }
    }
    {
        const double *a = all;
        char b1[32], b2[32], b3[32];
        printf("  formula (rank 0): params piece e*s = %s; gathered forward %s, backward %s "
               "(units of the prefetch window, reshard %d, prefetch %d)\n",
               mem_format(b1, 32, a[F_XSTATE]), mem_format(b2, 32, a[F_XGATH + PH_FWD]),
               mem_format(b3, 32, a[F_XGATH + PH_BWD]), r->f->reshard, r->f->prefetch);
    }
    // one bar per phase (rank 0's peak total), 1/40 of the largest
    double top = 0;
    for (int ph = 0; ph < PH_N; ph++) top = fmax(top, all[F_PEAK + ph * C_N + C_TOTAL]);
    for (int ph = 0; ph < PH_N; ph++) {
        double v = all[F_PEAK + ph * C_N + C_TOTAL];
        int bars = top > 0 ? (int)lround(40.0 * v / top) : 0;
        char b[32];
        printf("  %-10s |", PHASE[ph]);
        for (int i = 0; i < 40; i++) putchar(i < bars ? '#' : ' ');
        printf("| %s (rank 0)\n", mem_format(b, 32, v));
    }
    {
        char b[32];
        printf("  peak memory of rank 0 (its largest phase): %s\n", mem_format(b, 32, top));
    }

    printf("\nCollectives per step and rank (dist counters), '=' where the count is the formula:\n");
    printf("  %-4s %14s %14s %10s %13s %13s %13s %13s\n", "rank", "all-gathers", "red-scatters",
           "all-red.", "ag sent", "rs sent", "ar sent", "sent total");
    for (int q = 0; q < N; q++) {
        const double *a = all + (size_t)q * F_NFIELDS;
        char c0[32], c1[32], b[4][32];
        snprintf(c0, 32, "%.0f %s", a[F_CALLS], eq(a[F_CALLS], a[F_XCALLS]));
        snprintf(c1, 32, "%.0f %s", a[F_CALLS + 1], eq(a[F_CALLS + 1], a[F_XCALLS + 1]));
        printf("  %-4d %14s %14s %10.0f %13s %13s %13s %13s\n", q, c0, c1, a[F_CALLS + 2],
               c1[0] ? mem_format(b[0], 32, a[F_BYTES]) : "", mem_format(b[1], 32, a[F_BYTES + 2]),
               mem_format(b[2], 32, a[F_BYTES + 4]), mem_format(b[3], 32, a[F_SENT]));
    }
    const int K = r->K, nu = r->z.nunits;
    printf("  formula: all-gathers K x %s = %d x %d; reduce-scatters %s x (L+2) = %d x %d\n",
           r->f->reshard ? "(2L+3)" : "(L+2)", K, r->plan.nentries, r->f->no_sync ? "1" : "K",
           r->f->no_sync ? 1 : K, nu);
    {
        // bytes by the ring formulas of dist.h: each gather of unit u sends n_u - c_(r+1) elements
        const double e = (double)s->e, G = r->G, psi = (double)s->n;
        char b1[32], b2[32];
        double ag = K * (r->f->reshard ? 2 * psi - (double)r->z.p[nu - 1].unit_size : psi) *
                    (G - 1) / G * e;
        double rs = (r->f->no_sync ? 1 : K) * psi * (G - 1) / G * e;
        printf("  about (N dividing every unit): all-gather %s, reduce-scatter %s per rank and "
               "step%s\n", mem_format(b1, 32, ag), mem_format(b2, 32, rs),
               r->R > 1 ? "; + the replicas' all-reduce of every piece (HSDP)" : "");
    }
    if (K > 1) {
        // FSDP's two accumulation modes side by side: this run's figures and the other's formula
        const double e = (double)s->e, psi = (double)s->n, sn = (double)r->z.shard_n;
        const double rs1 = psi * (r->G - 1) / r->G * e;
        char b1[32], b2[32];
        printf("\nGradient accumulation over %d micro-batches, rank 0 (the other mode by formula):\n", K);
        printf("  %-34s %18s %16s\n", "mode", "reduce-scatter/st", "grads peak");
        double meas_rs = all[F_BYTES + 2], meas_g = all[F_PEAK + PH_BWD * C_N + C_GRADS];
        double sync_rs = K * rs1, nosync_rs = rs1, nosync_g = e * (sn + psi);
        printf("  %-34s %18s %16s%s\n", "reduce-scatter every micro-batch",
               mem_format(b1, 32, r->f->no_sync ? sync_rs : meas_rs),
               r->f->no_sync ? "~2 units + piece" : mem_format(b2, 32, meas_g),
               r->f->no_sync ? "" : "   <- this run");
        printf("  %-34s %18s %16s%s\n", "no_sync until the last (--no-sync)",
               mem_format(b1, 32, r->f->no_sync ? meas_rs : nosync_rs),
               mem_format(b2, 32, r->f->no_sync ? meas_g : nosync_g),
               r->f->no_sync ? "   <- this run" : "");
    }
}

static void report(Run *r, double *mine, const LabArgs *args) {
    Session *s = r->s;
    const int N = s->N;
    double *all = session_gather_report(s, mine, F_NFIELDS);
    unshard_for_report(r);
    session_finish(s);
    if (s->rank != 0) { free(all); return; }
    if (!args->quiet && session_steps_run(s) > 0) print_tables(r, all, args);
    if (args->dump) {
        RunResults out;
        session_dump_open(s, &out);
        results_set(&out, "world_size", N);
        results_set(&out, "shard_group", r->G);
        const int who[2] = {0, N - 1};
        static const char *ck[3] = {"gathered", "grads", "total"};
        static const int cc[3] = {C_GATHERED, C_GRADS, C_TOTAL};
        static const char *pk[PH_N] = {"fwd", "bwd", "opt"};
        for (int i = 0; i < 2; i++) {
            const double *a = all + (size_t)who[i] * F_NFIELDS;
            const char *tag = i == 0 ? "first" : "last";
            char key[48];
            for (int ph = 0; ph < PH_N; ph++)
                for (int c = 0; c < 2; c++) {
                    snprintf(key, sizeof key, "%s_%s_%s", tag, pk[ph], ck[c]);
                    results_set(&out, key, a[F_PEAK + ph * C_N + cc[c]]);
                }
            static const char *sk[4] = {"params", "master", "opt_m", "opt_v"};
            static const int sc[4] = {C_PARAMS, C_MASTER, C_OPT_M, C_OPT_V};
            for (int c = 0; c < 4; c++) {
                snprintf(key, sizeof key, "%s_%s", tag, sk[c]);
                results_set(&out, key, a[F_PEAK + PH_BWD * C_N + sc[c]]);
            }
            static const char *nk[9] = {"ag_calls", "rs_calls", "ar_calls", "ag_sent", "ag_recv",
                                        "rs_sent", "rs_recv", "ar_sent", "ar_recv"};
            for (int c = 0; c < 9; c++) {
                snprintf(key, sizeof key, "%s_%s", tag, nk[c]);
                results_set(&out, key, a[F_CALLS + c]);
            }
        }
        (void)ck[2];
        // step 1's all-gathers as digits (unit + 1), in order: the tests read the queue's order
        double fo = 0, bo = 0;
        for (int i = 0; i < r->nfwd_log && i < 15; i++) fo = fo * 10 + (r->fwd_log[i] + 1) % 10;
        for (int i = 0; i < r->nbwd_log && i < 15; i++) bo = bo * 10 + (r->bwd_log[i] + 1) % 10;
        results_set(&out, "fwd_gathers", fo);
        results_set(&out, "bwd_gathers", bo);
        results_set(&out, "unplanned", r->F.unplanned);
        results_set(&out, "wasted", r->F.wasted);
        session_dump_close(s, &out);
    }
    free(all);
}

// ---------------------------------------------------------------------------------------------
// training

static void train(const LabArgs *args, const FsdpFlags *f) {
    const int rank = dist_rank(), N = dist_size(), K = f->grad_accum;
    if (f->shard_group && N % f->shard_group != 0)
        lab_fail_collective("--shard-group %d does not divide the %d ranks: HSDP needs equal shard "
                            "groups; use a divisor of %d (or 0 for one group of all)",
                            f->shard_group, N, N);
    if (f->no_sync && K < 2)
        lab_fail_collective("--no-sync needs --grad-accum K >= 2 (it skips the reduce-scatters "
                            "of the first K-1 micro-batches; with K = 1 there are none)");
    int row0, Bl;
    data_slice(args->batch, rank, N, &row0, &Bl);
    if (Bl == 0 || Bl % K != 0)
        lab_fail_collective("--batch %d over %d ranks gives rank %d %d sequences, which do not "
                            "split into %d equal micro-batches (--grad-accum); use a --batch "
                            "that is a multiple of %d (ranks x micro-batches)", args->batch, N,
                            N - 1, Bl, K, N * K);
    const int Bm = Bl / K;
    LabArgs sargs = *args;
    sargs.save = NULL;  // this chapter saves its pieces itself (save_state)
    Session s;
    session_init(&s, &sargs, Bm, 0);
    Run r;
    memset(&r, 0, sizeof r);
    r.K = K;
    r.Bm = Bm;
    setup(&r, &s, f);
    const int start = load_or_init(&r, args);
    if (N > 1) {  // the communication thread serves the shard and the replicate groups
        dist_comm_thread_start(r.shard);
        if (r.rep) dist_comm_thread_start(r.rep);
    }
    if (!args->quiet && rank == 0) {
        char model[128], b1[32];
        printf("FSDP on %d rank%s: %s (%s), device %s\n", N, N > 1 ? "s" : "",
               session_model_line(&s, model, sizeof model), s.bf16 ? "bf16" : "fp32",
               s.model.k->name);
        printf("units: embedding, %d blocks, head, each cut in %d pieces (%s on rank 0); "
               "reshard after forward %d, prefetch %d", s.cfg.L, r.G,
               mem_format(b1, sizeof b1, (double)r.z.shard_n * (double)s.e), f->reshard,
               f->prefetch);
        if (r.R > 1) printf("; HSDP: %d shard groups of %d", r.R, r.G);
        if (K > 1) printf("; %d micro-batches of %d%s", K, Bm, f->no_sync ? " (no_sync)" : "");
        printf("\n");
    }
    mem_reset_peaks();
    dist_counters_reset();
    const float dloss = 1.0f / ((float)Bm * (float)s.T * (float)K);
    DistCounters save_cost;
    memset(&save_cost, 0, sizeof save_cost);
    for (int step = start; step < s.end; step++) {
        session_step_begin(&s, step);
        mem_zero(r.grad_shard, r.z.shard_n * s.e);
        float loss = 0.0f;
        for (int micro = 0; micro < K; micro++) {
            const int last = micro == K - 1;
            // no_sync: the first K-1 micro-batches keep the whole unit gradients
            int sync = f->no_sync ? last : 1;
            data_batch(&s.data, (uint64_t)step, args->batch, s.T, row0 + micro * Bm, Bm,
                       s.inputs, s.targets);
            fsdp_begin_micro(&r.F);
            phase_begin();
            loss += forward(&r) / (float)K;
            phase_end(&r, PH_FWD);
            int nfwd = r.F.nlog;
            if (step == start && micro == 0) keep_log(&r.F, r.fwd_log, &r.nfwd_log, 0);
            phase_begin();
            backward(&r, dloss, sync);
            fsdp_end_micro(&r.F);  // every piece averaged (and, HSDP, all-reduced)
            phase_end(&r, PH_BWD);
            if (step == start && micro == 0) keep_log(&r.F, r.bwd_log, &r.nbwd_log, nfwd);
        }
        if (step == args->inject_nan_step && rank == N - 1 && r.z.shard_n) {
            float nan = NAN;  // a NaN into my averaged gradient piece
            if (s.bf16) { uint16_t h = 0x7fc0; mem_copy(r.grad_shard, &h, 2); }
            else mem_copy(r.grad_shard, &nan, 4);
        }
        phase_begin();
        optimizer_step(&r, step, &loss);  // the loss averaged there, with the norm
        params_from_master(&r);
        phase_end(&r, PH_OPT);
        session_step_end(&s, step, loss);
        int last = step == s.end - 1;
        if (args->save && (last || (args->save_every > 0 && (step + 1) % args->save_every == 0))) {
            DistCounters before = *dist_counters();
            save_state(&r, args, step + 1);
            const DistCounters *after = dist_counters();
            for (int k = 0; k < OP_NKINDS; k++) {
                save_cost.calls[k] += after->calls[k] - before.calls[k];
                save_cost.sent[k] += after->sent[k] - before.sent[k];
                save_cost.recv[k] += after->recv[k] - before.recv[k];
            }
            if (last && !args->quiet && rank == 0)
                printf("saved training state (step %d) to %s\n", step + 1, args->save);
        }
    }
    if (N > 1) {
        if (r.rep) dist_comm_thread_stop(r.rep);
        dist_comm_thread_stop(r.shard);
    }
    double mine[F_NFIELDS] = {0};
    per_rank_figures(&r, mine, &save_cost, session_steps_run(&s));
    report(&r, mine, args);
    free_run(&r);
    session_free(&s);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    FsdpFlags f = {.reshard = 1, .prefetch = 1, .grad_accum = 1, .no_sync = 0, .shard_group = 0};
    FlagSpec extra[] = {
        {"--reshard-after-forward", FLAG_INT, &f.reshard, 0, 1, NULL,
         "1: free each unit after its forward, gather it again for backward; 0: keep it"},
        {"--prefetch", FLAG_INT, &f.prefetch, 0, 8, NULL,
         "all-gathers issued ahead of the op that needs them (0: off)"},
        {"--grad-accum", FLAG_INT, &f.grad_accum, 1, 1e6, NULL, "micro-batches per step"},
        {"--no-sync", FLAG_BOOL, &f.no_sync, 0, 1, NULL,
         "accumulate whole unit gradients, reduce-scatter only on the last micro-batch"},
        {"--shard-group", FLAG_INT, &f.shard_group, 0, 1e6, NULL,
         "HSDP: shard within groups of this many consecutive ranks (0: all ranks)"},
    };
    lab_parse_args(argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]), "06_fsdp/run",
                   USAGE);
    train(&args, &f);
    dist_finalize();
    return 0;
}
