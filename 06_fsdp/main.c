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

#include "calc.h"
#include "check.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "fsdp.h"
#include "gpt2.h"
#include "fsdp6_report.h"
#include "mem.h"
#include "mem_predict.h"
#include "session.h"
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

// The categories of the per-phase table (gathered weights are MEM_COMM; unit gradient buffers
// and my gradient pieces MEM_GRADS).
static const MemCategory CAT[C_N - 1] = {MEM_PARAMS, MEM_COMM, MEM_GRADS, MEM_MASTER,
                                         MEM_OPT_M, MEM_OPT_V, MEM_ACTS};

// ---------------------------------------------------------------------------------------------
// One micro-batch: the plan's ops, forward then backward

static void phase_begin(void) { mem_reset_peaks(); }
static void phase_end(FsdpRun *r, int ph) {
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

static float forward(FsdpRun *r) {
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
static void backward(FsdpRun *r, float dloss, int sync) {
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
// they are over different groups: the loss over the world, Σ g² over the shard group. Then,
// unless the loss spiked (--on-spike: the same answer on every rank), clip and AdamW.
static void optimizer_step(FsdpRun *r, int step, float *loss) {
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
    if (!session_may_update(s, step, *loss)) return;  // a loss spike (--on-spike): no update
    session_grad_norm_sq(s, sq);  // the health line's grad norm (before clipping)
    float scale = adamw_clip_scale(&s->opt, sq, step);
    int tok = trace_begin("optimizer (my pieces)", TRACE_COMPUTE);
    zero_adamw(&r->z, &b, &s->opt, step, scale);
    trace_end(tok);
}

// ---------------------------------------------------------------------------------------------
// Setup

static void shard_model(FsdpRun *r, Session *s, const FsdpFlags *f) {
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
static void params_from_master(FsdpRun *r) {
    if (r->s->bf16) r->m->k->f32_to_bf16(r->param_shard, r->master, r->z.shard_n);
}

// --resume, --load-weights (every rank takes its pieces of the whole state) or fresh; also
// state.load: a rollback (--on-spike) is a --resume of the last checkpoint.
static int load_or_init(void *ctx, const LabArgs *args) {
    FsdpRun *r = ctx;
    Session *s = r->s;
    int start = 0;
    if (args->resume || args->load_weights)
        start = zero_load_training(&r->z, &s->cfg, args->resume, args->load_weights, r->master,
                                   0, r->opt_m, r->opt_v, s->world);
    else zero_init_pieces(&r->z, &s->cfg, (uint64_t)args->seed, r->master, 0);
    params_from_master(r);
    return start;
}

// The sharded state as the session's loop sees it (SessionState). Its checkpoint: the first
// shard group gathers one copy of the pieces to rank 0 (the lab's format: any layout resumes it).
static void state_save(void *ctx, const char *path, int step) {
    FsdpRun *r = ctx;
    const Session *s = r->s;
    if (s->rank >= r->G) return;
    zero_save_training(&r->z, path, &s->cfg, step, (uint64_t)s->args->seed,
                       (uint64_t)s->args->data_seed, r->master, 0, r->opt_m, r->opt_v, r->shard);
}

// The weights (rank 0, fp32): the whole parameters gathered into a buffer copied from
// (train_params_to_host_from), then freed (tagged MEM_OTHER; at the end after every figure is
// taken; --val-every calls it mid-run).
static void state_weights(void *ctx, float *full) {
    FsdpRun *r = ctx;
    Session *s = r->s;
    void *all = mem_alloc(s->n * s->e, MEM_OTHER, s->dev);
    for (int u = 0; u < r->z.nunits; u++) {
        const ZeroPiece *p = &r->z.p[u];
        dist_all_gather_n((char *)r->param_shard + p->local * s->e,
                          (char *)all + p->unit_offset * s->e, p->unit_size, s->dt, r->shard);
    }
    if (s->rank == 0) train_params_to_host_from(r->m, all, full);
    mem_free(all);
}

static void free_run(FsdpRun *r) {
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
// training

// The memory rank `rank` will need for a global batch of `batch` (mem_predict.h), the larger of
// two moments. Setup: session_init's whole model without an optimizer (params, grads, the
// activations and buffers of one micro-batch), before shard_model frees it. A step: my pieces of
// every unit (params and grads in the model's type, bf16's fp32 master, Adam's m and v: the
// calculator's calc_unit_shard), the activations, and the whole units alive: gathered (the
// embedding, kept for the tied head, the unit computing and --prefetch more; every unit with
// --reshard-after-forward 0) and their gradients (the embedding's, the unit's in backward and the
// one reduce-scattering; every unit's with --no-sync), or the whole parameters gathered back at
// the end.
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const FsdpFlags *f = ctx;
    const int N = dist_size(), G = f->shard_group ? f->shard_group : N;
    const int bf16 = strcmp(args->dtype, "bf16") == 0;
    GPT2Config cfg = lab_args_config(args);
    CalcModel cm = calc_model_from_gpt2(&cfg);
    int64_t *units = lab_xcalloc((size_t)cfg.L + 2, sizeof(int64_t));
    const int nunits = calc_gpt2_units(&cm, units);
    const double n = (double)gpt2_param_count(&cfg), e = bf16 ? 2.0 : 4.0;
    const double sn = (double)calc_unit_shard(units, nunits, G, rank % G);
    const double embed = (double)units[0], largest = mem_predict_largest_piece(&cfg);
    free(units);
    MemPrediction setup = mem_predict_replica(&cfg, batch / N / f->grad_accum, bf16, 0);
    MemPrediction step = setup;
    step.state = sn * (e + e + (bf16 ? 4.0 : 0.0) + 4.0 + 4.0);
    const double gathered = f->reshard ? embed + (1.0 + f->prefetch) * largest : n;
    const double grads = f->no_sync ? n : embed + 2.0 * largest;
    step.buffers += fmax(e * (gathered + grads), n * e);
    return mem_prediction_total(setup) >= mem_prediction_total(step) ? setup : step;
}

// The flags checked, the session, the model sharded (its checkpoints and final weights:
// state_save, state_weights), initialized or loaded, the communication thread, the banner; my
// rows from row0.
static void setup(FsdpRun *r, Session *s, const LabArgs *args, const FsdpFlags *f, int *row0) {
    const int rank = dist_rank(), N = dist_size(), K = f->grad_accum;
    if (f->shard_group && N % f->shard_group != 0)
        lab_fail_collective("--shard-group %d does not divide the %d ranks: HSDP needs equal shard "
                            "groups; use a divisor of %d (or 0 for one group of all)",
                            f->shard_group, N, N);
    if (f->no_sync && K < 2)
        lab_fail_collective("--no-sync needs --grad-accum K >= 2 (it skips the reduce-scatters "
                            "of the first K-1 micro-batches; with K = 1 there are none)");
    int Bl;
    data_slice(args->batch, rank, N, row0, &Bl);
    if (Bl == 0 || Bl % K != 0)
        lab_fail_collective("--batch %d over %d ranks gives rank %d %d sequences, which do not "
                            "split into %d equal micro-batches (--grad-accum); use a --batch "
                            "that is a multiple of %d (ranks x micro-batches)", args->batch, N,
                            N - 1, Bl, K, N * K);
    mem_refuse_if_it_cannot_fit(args, predict_memory, f, N * K);  // before the first allocation
    memset(r, 0, sizeof *r);
    r->K = K;
    r->Bm = Bl / K;
    session_init(s, args, r->Bm, 0);  // its model, without an optimizer: the pieces have theirs
    shard_model(r, s, f);
    s->state = (SessionState){r, state_save, state_weights, load_or_init};
    session_start_at(s, load_or_init(r, args));
    if (N > 1) {  // the communication thread serves the shard and the replicate groups
        dist_comm_thread_start(r->shard);
        if (r->rep) dist_comm_thread_start(r->rep);
    }
    fsdp6_banner(r, args);
    mem_reset_peaks();
    dist_counters_reset();
    session_watch_links(s, NULL, r->shard, NULL);  // --links: DP's link time (report.c)
}

// One micro-batch of a step: forward and backward over the plan, each phase's peaks kept (and
// the first one's all-gathers, in order); returns its loss.
static float micro_batch(FsdpRun *r, int step, int micro, int row0, int sync,
                         const LabArgs *args) {
    Session *s = r->s;
    const float dloss = 1.0f / ((float)r->Bm * (float)s->T * (float)r->K);
    const int first = step == s->start && micro == 0;
    data_batch(&s->data, (uint64_t)step, args->batch, s->T, row0 + micro * r->Bm, r->Bm,
               s->inputs, s->targets);
    fsdp_begin_micro(&r->F);
    phase_begin();
    float loss = forward(r);
    phase_end(r, PH_FWD);
    int nfwd = r->F.nlog;
    if (first) keep_log(&r->F, r->fwd_log, &r->nfwd_log, 0);
    phase_begin();
    backward(r, dloss, sync);
    fsdp_end_micro(&r->F);  // every piece averaged (and, HSDP, all-reduced)
    phase_end(r, PH_BWD);
    if (first) keep_log(&r->F, r->bwd_log, &r->nbwd_log, nfwd);
    return loss;
}

// Every rank's figures to rank 0 (less the checkpoints' collectives), the session's end (the
// final --save, the weights), rank 0's tables and --dump (report.c).
static void finish(FsdpRun *r) {
    Session *s = r->s;
    if (s->N > 1) {
        if (r->rep) dist_comm_thread_stop(r->rep);
        dist_comm_thread_stop(r->shard);
    }
    double mine[F_NFIELDS] = {0};
    fsdp6_figures(r, mine, &s->save_cost, session_steps_run(s));
    double *all = session_gather_report(s, mine, F_NFIELDS);
    session_finish(s);
    if (s->rank == 0) fsdp6_report(r, all, s->args);
    fsdp6_print_links(r);  // --links only (collective)
    free(all);
    free_run(r);
    session_free(s);
}

static void train(const LabArgs *args, const FsdpFlags *f) {
    Session s;
    FsdpRun r;
    int row0;
    setup(&r, &s, args, f, &row0);  // s.state: the pieces; s.start: resumed or 0
    const int K = r.K;
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (--kill-rank, --kill-step)
        mem_zero(r.grad_shard, r.z.shard_n * s.e);
        // --inject-nan-step: a NaN in one rank's unit gradient, before its reduce-scatter
        r.F.poison = session_nan_due(&s, step, s.N - 1);
        float loss = 0.0f;
        for (int micro = 0; micro < K; micro++) {
            const int last = micro == K - 1;
            // no_sync: the first K-1 micro-batches keep the whole unit gradients
            int sync = f->no_sync ? last : 1;
            loss += micro_batch(&r, step, micro, row0, sync, args) / (float)K;
        }
        phase_begin();
        optimizer_step(&r, step, &loss);  // the loss averaged there, with the norm
        params_from_master(&r);
        phase_end(&r, PH_OPT);
        session_step_end(&s, step, loss);  // the progress line, the --save-every checkpoint
    }
    finish(&r);
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
