// 05_zero: ZeRO stages 1, 2 and 3 (and 0 = DDP), the way DeepSpeed shards the model state.
//
//   make 05_zero && mpirun -np 4 ./05_zero/run --zero 1|2|3
//
// DDP (chapter 03) keeps the whole model state on every rank: for Ψ parameters in mixed
// precision 2Ψ + 2Ψ + 12Ψ bytes, most of it redundant. ZeRO cuts the state into N pieces
// (zero.h's flat layout: the whole flat buffer in N contiguous shards, shard_range(Ψ, N, r), as
// DeepSpeed partitions its flat buffer) and keeps on each rank only its shard:
//   --zero 0  nothing sharded (DDP): all-reduce the gradients, every rank steps everything
//   --zero 1  optimizer state sharded: reduce-scatter the gradients after backward (average),
//             AdamW on my pieces only, all-gather the updated parameters          2Ψ on the wire
//   --zero 2  + gradients sharded: backward's gradients are copied into fixed-size buckets of
//             the flat gradient (--bucket-kb; contiguous ranges, in backward order, a bucket may
//             span units), each reduce-scattered as soon as it is full (on the communication
//             thread, overlapping the rest of backward); the rank keeps only its shard and
//             the buckets in flight                                                      2Ψ
//   --zero 3  + parameters sharded: each unit is all-gathered just before its forward (the
//             next one prefetched), freed after, gathered again for its backward, its gradient
//             reduce-scattered and freed                                               3Ψ
// Every stage runs the same global clipping (Σ g² over my pieces, all-reduced: each element
// counted once) and the same AdamW, so every stage trains the same model as one device.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "mem.h"
#include "mem_predict.h"
#include "zero5_report.h"
#include "session.h"
#include "shard.h"
#include "trace.h"
#include "train.h"
#include "zero.h"

static const char *USAGE =
    "05_zero: ZeRO. Each rank keeps only its piece of the optimizer state (stage 1), of the\n"
    "gradients too (stage 2), of the parameters too (stage 3); the same training as one device.\n"
    "\n"
    "  mpirun -np 4 ./05_zero/run --zero 0        DDP inside this chapter: the baseline\n"
    "  mpirun -np 4 ./05_zero/run --zero 1        shard Adam m, v (and bf16's fp32 master): 2Ψ\n"
    "  mpirun -np 4 ./05_zero/run --zero 2        shard the gradients too, reduce-scattered\n"
    "                                             bucket by bucket during backward: 2Ψ wire\n"
    "  mpirun -np 4 ./05_zero/run --zero 2 --bucket-kb 16 --in-flight 2\n"
    "                                             small buckets: grads + comm buffers fall to\n"
    "                                             Ψ/N + 2 buckets (+ the unit being written)\n"
    "  mpirun -np 4 ./05_zero/run --zero 3        shard the parameters too, gathered unit by\n"
    "                                             unit for forward and again for backward: 3Ψ\n"
    "  mpirun -np 3 ./05_zero/run --zero 3 --batch 18\n"
    "                                             uneven pieces (834,304 parameters on 3 ranks;\n"
    "                                             the batch must split evenly over the ranks)\n"
    "  mpirun -np 4 ./05_zero/run --zero 2 --dtype bf16\n"
    "                                             bf16 params and grads on the wire, fp32 master\n"
    "                                             and Adam sharded: the notes' 2 + 2 + 12 bytes\n"
    "  mpirun -np 4 ./05_zero/run --zero 3 --save z.ckpt; mpirun -np 2 ./05_zero/run --zero 1\n"
    "      --resume z.ckpt                        checkpoints hold the model, not the layout\n"
    "  mpirun -np 4 ./05_zero/run --zero 3 --trace zero3.json   gathers and reduce-scatters\n"
    "                                             on the timeline (open at ui.perfetto.dev)\n";

typedef struct ZeroFlags {
    int stage;       // 0..3
    int in_flight;   // ZeRO-2: bucket buffers alive; ZeRO-3: unit gradients in flight
    int bucket_kb;   // ZeRO-2: bucket size (KiB of the gradient's dtype)
} ZeroFlags;

// ---------------------------------------------------------------------------------------------
// The state of one rank

typedef struct Zero {
    int stage;
    Session *s;
    GPT2 *m;
    ZeroLayout z;
    int L, nunits;
    size_t e;             // bytes per element of params/grads (4 fp32, 2 bf16)
    // fp32 pieces the optimizer updates (master), Adam m, v: z.shard_n floats each, except
    // fp32 with stage < 3, where the master IS the full parameter buffer (master_full)
    float *master, *opt_m, *opt_v;
    int master_full;
    void *param_shard;    // stage 3: my pieces of the parameters (model dtype), else NULL
    void *grad_shard;     // stage >= 2: my pieces of the averaged gradients, else NULL
    // stage >= 2: each unit's gradient buffer backward writes into (MEM_COMM; stage 3: its
    // reduce-scatter in flight); stage 3: its gathered weights (MEM_COMM) and their all-gather
    ZeroUnit *unit;       // (nunits)
    int *ag_live;         // stage 3: 0 none, 1 issued, 2 ready
    int *rs_order, nrs, rs_done;  // stage 3: reduce-scatter launch order, launched, waited
    int in_flight;
    // stage 2: buckets of the flat gradient: bucket k = [n - (k+1)B, n - kB) (clipped at 0),
    // numbered in backward order; a buffer (MEM_COMM) from its first copy until its
    // reduce-scatter is done
    size_t bucket;        // B, elements
    int nbuckets;
    void **bbuf;          // (nbuckets)
    DistWork *bw;         // (nbuckets)
    int b_launched, b_done;  // buckets launched (in order), waited
    double *b_t0;
} Zero;

static void *piece_ptr(const Zero *zz, void *shard, int u) {
    return (char *)shard + zz->z.p[u].local * zz->e;
}

// Stage 3: start the all-gather of unit u (if not yet), into a fresh buffer.
static void gather_issue(Zero *zz, int u) {
    if (zz->stage < 3 || zz->ag_live[u]) return;
    zero_unit_gather(&zz->z, u, &zz->unit[u], zz->param_shard, zz->s->dt, zz->s->dev,
                     zz->s->world);
    zz->ag_live[u] = 1;
}

// The weights of unit u for the piece about to run: stage < 3 NULL (the model's own, full);
// stage 3 the gathered unit (waits for its all-gather), with unit `next` prefetched first.
static const void *unit_weights(Zero *zz, int u, int next) {
    if (zz->stage < 3) return NULL;
    gather_issue(zz, u);
    if (next >= 0) gather_issue(zz, next);  // in flight while unit u computes
    if (zz->ag_live[u] == 1) {
        zero_unit_wait(&zz->unit[u], u);
        zz->ag_live[u] = 2;
    }
    return zz->unit[u].w;
}

// Stage 3: the unit's gathered weights are freed after use: only the pieces stay.
static void unit_release(Zero *zz, int u) {
    if (zz->stage < 3) return;
    LAB_CHECK(zz->ag_live[u] == 2, "unit %d released before it was gathered", u);
    zero_unit_free(&zz->unit[u]);
    zz->ag_live[u] = 0;
}

// The gradient buffer unit u's backward accumulates into: stage < 2 NULL (the model's full
// gradient); stage >= 2 a fresh zeroed unit buffer (in flight until its reduce-scatter is done).
static void *unit_grads(Zero *zz, int u) {
    if (zz->stage < 2) return NULL;
    return zero_unit_grad(&zz->z, u, &zz->unit[u], zz->e, MEM_COMM, zz->s->dev);
}

static void rs_wait_oldest(Zero *zz) {
    int u = zz->rs_order[zz->rs_done++];
    zero_unit_grad_wait(&zz->unit[u], u);
    zero_unit_grad_free(&zz->unit[u]);
}

// Stage 2: bucket k's range of the flat gradient.
static void bucket_range(const Zero *zz, int k, size_t *lo, size_t *hi) {
    const size_t n = zz->z.n, top = (size_t)k * zz->bucket;
    *hi = n - top;
    *lo = n - top > zz->bucket ? n - top - zz->bucket : 0;
}

static void bucket_wait_oldest(Zero *zz) {
    int k = zz->b_done++;
    int tok = trace_begin("wait reduce-scatter", TRACE_COMPUTE);
    dist_wait(&zz->bw[k]);
    trace_end(tok);
    if (trace_enabled()) {
        char name[48];
        snprintf(name, sizeof name, "reduce-scatter bucket %d", k);
        trace_span(name, TRACE_COMM, zz->b_t0[k], lab_now());
    }
    mem_free(zz->bbuf[k]);
    zz->bbuf[k] = NULL;
}

// Stage 2: bucket k is complete: reduce-scatter it (average) on the communication thread; rank q's
// block is the bucket's intersection with q's shard, mine lands at its place in my shard.
static void bucket_launch(Zero *zz, int k) {
    size_t lo, hi, at;
    bucket_range(zz, k, &lo, &hi);
    size_t *counts = lab_xmalloc((size_t)zz->z.N * sizeof(size_t));
    size_t local = zero_range_counts(&zz->z, lo, hi, counts, &at);
    zz->b_t0[k] = lab_now();
    zz->bw[k] = dist_ireduce_scatter_v(zz->bbuf[k], (char *)zz->grad_shard + local * zz->e, counts,
                                       zz->s->dt, DIST_AVG,
                                       zz->s->world);
    free(counts);
    zz->b_launched = k + 1;
}

// Stage 2: unit u's gradient is complete (and so is every unit above it in memory: backward
// finishes them top down). Copy it into the buckets that cover it, top down; a bucket's buffer
// is made when it is first written (waiting first for the oldest reduce-scatter while in_flight
// buffers are alive) and launched once its lowest element is in (the units below it come later).
static void unit_into_buckets(Zero *zz, int u) {
    const ZeroPiece *p = &zz->z.p[u];
    const size_t ub = p->unit_offset, ue = ub + p->unit_size;
    int tok = trace_begin("copy into buckets", TRACE_COMPUTE);
    for (int k = zz->b_launched; k < zz->nbuckets; k++) {
        size_t lo, hi;
        bucket_range(zz, k, &lo, &hi);
        if (hi <= ub) break;  // below this unit
        if (!zz->bbuf[k]) {
            while (k - zz->b_done >= zz->in_flight) bucket_wait_oldest(zz);
            zz->bbuf[k] = mem_alloc((hi - lo) * zz->e, MEM_COMM, zz->s->dev);
        }
        size_t a = lo > ub ? lo : ub, b = hi < ue ? hi : ue;  // the unit's part of the bucket
        mem_copy((char *)zz->bbuf[k] + (a - lo) * zz->e, (char *)zz->unit[u].g + (a - ub) * zz->e,
                 (b - a) * zz->e);
        if (lo >= ub) bucket_launch(zz, k);  // complete once its lowest element is in
        if (lo < ub) break;  // the rest of this bucket is the next unit's
    }
    trace_end(tok);
    zero_unit_grad_free(&zz->unit[u]);
}

// Stage >= 2: unit u's gradient is complete. Stage 2: into the buckets. Stage 3: reduce-scatter
// the unit (average) into my piece, on the communication thread; keep at most in_flight unit
// buffers alive.
static void unit_grads_done(Zero *zz, int u) {
    if (zz->stage < 2) return;
    if (zz->stage == 2) {
        unit_into_buckets(zz, u);
        return;
    }
    zero_unit_grad_scatter(&zz->z, u, &zz->unit[u], piece_ptr(zz, zz->grad_shard, u), zz->s->dt,
                           zz->s->world);
    zz->rs_order[zz->nrs++] = u;
    while (zz->nrs - zz->rs_done > zz->in_flight) rs_wait_oldest(zz);
}

// ---------------------------------------------------------------------------------------------
// Forward and backward, unit by unit

// Units: 0 = embedding (wte, wpe), 1 + l = block l, L + 1 = head (lnfw, lnfb); the head reads
// wte from unit 0. Gather order (stage 3): forward 0, 1..L, then 0 and L+1 for the head, which
// stay for the head's backward; backward L..1.
static float forward(Zero *zz) {
    GPT2 *m = zz->m;
    const int L = zz->L, H = L + 1;
    gpt2_set_batch(m, zz->s->inputs, zz->s->targets);
    int tok = trace_begin("forward embedding", TRACE_COMPUTE);
    gpt2_embed_forward_w(m, NULL, unit_weights(zz, 0, 1));
    trace_end(tok);
    unit_release(zz, 0);
    for (int l = 0; l < L; l++) {
        char name[32];
        snprintf(name, sizeof name, "forward block %d", l);
        const void *w = unit_weights(zz, 1 + l, l + 1 < L ? 2 + l : 0);
        tok = trace_begin(name, TRACE_COMPUTE);
        gpt2_block_forward_w(m, NULL, l, w);
        trace_end(tok);
        unit_release(zz, 1 + l);
    }
    const void *wte = unit_weights(zz, 0, H), *wh = unit_weights(zz, H, -1);
    tok = trace_begin("forward head", TRACE_COMPUTE);
    float loss = gpt2_head_forward_w(m, NULL, wte, wh);
    trace_end(tok);
    return loss;
}

static void backward(Zero *zz, float dloss) {
    GPT2 *m = zz->m;
    const int L = zz->L, H = L + 1;
    zz->nrs = zz->rs_done = 0;
    zz->b_launched = zz->b_done = 0;
    const void *wte = unit_weights(zz, 0, -1), *wh = unit_weights(zz, H, -1);
    if (L > 0) gather_issue(zz, L);  // the last block's weights arrive during the head
    void *dembed = unit_grads(zz, 0), *dhead = unit_grads(zz, H);
    int tok = trace_begin("backward head", TRACE_COMPUTE);
    gpt2_head_backward_w(m, NULL, dloss, wte, wh, dembed, dhead);
    trace_end(tok);
    unit_release(zz, 0);
    unit_release(zz, H);
    unit_grads_done(zz, H);
    for (int l = L - 1; l >= 0; l--) {
        char name[32];
        snprintf(name, sizeof name, "backward block %d", l);
        const void *w = unit_weights(zz, 1 + l, l > 0 ? l : -1);
        void *dw = unit_grads(zz, 1 + l);
        tok = trace_begin(name, TRACE_COMPUTE);
        gpt2_block_backward_w(m, NULL, l, w, dw);
        trace_end(tok);
        unit_release(zz, 1 + l);
        unit_grads_done(zz, 1 + l);
    }
    tok = trace_begin("backward embedding", TRACE_COMPUTE);
    gpt2_embed_backward_w(m, NULL, dembed);
    trace_end(tok);
    unit_grads_done(zz, 0);
    while (zz->rs_done < zz->nrs) rs_wait_oldest(zz);  // every piece averaged
    while (zz->b_done < zz->b_launched) bucket_wait_oldest(zz);
}

// ---------------------------------------------------------------------------------------------
// The step after backward

// Stage 0: the whole gradient averaged on every rank (DDP). Stage 1 reduce-scatters in its step
// (zero_step), stages 2 and 3 during backward.
static void average_gradients(Zero *zz) {
    Session *s = zz->s;
    if (zz->stage != 0 || s->N == 1) return;
    void *g = train_grads(zz->m);
    int tok = trace_begin("all-reduce grads", TRACE_COMM);
    dist_all_reduce(g, g, s->n, s->dt, DIST_AVG, s->world);
    trace_end(tok);
}

// My buffers as the step sees them: the gradient whole (stages 0, 1) or my averaged pieces
// (2, 3); the parameters whole (0-2) or my pieces (3); the master whole (fp32, 0-2) or pieces.
static ZeroShard shard_bufs(Zero *zz) {
    ZeroShard b = zero_shard_of(zz->m, zz->s->plist, zz->s->nplist);
    b.grads_full = zz->stage < 2;
    b.grads = b.grads_full ? train_grads(zz->m) : zz->grad_shard;
    b.params_full = zz->stage < 3;
    b.params = b.params_full ? train_params(zz->m) : zz->param_shard;
    b.master = zz->master;
    b.master_full = zz->master_full;
    b.opt_m = zz->opt_m;
    b.opt_v = zz->opt_v;
    return b;
}

// Every stage is zero.c's one step: stage 1 reduce-scatters there, stage 0 all-reduced before
// it, stages 2 and 3 during backward; stages 1 and 2 all-gather the parameters after it.
static void optimizer_step(Zero *zz, int step) {
    ZeroShard b = shard_bufs(zz);
    int tok = trace_begin("ZeRO step: (reduce-scatter,) clip, update my pieces, (all-gather)",
                          TRACE_COMM);
    session_grad_norm_sq(zz->s, zero_step(&zz->z, &b, &zz->s->opt, step, zz->s->world));
    trace_end(tok);
}

// ---------------------------------------------------------------------------------------------
// Setup: the sharded state, initialized, loaded or resumed

static void alloc_state(Zero *zz, const ZeroFlags *f) {
    Session *s = zz->s;
    GPT2 *m = zz->m;
    const int N = s->N;
    zz->stage = f->stage;
    zz->in_flight = f->in_flight;
    zz->bucket = (size_t)f->bucket_kb * 1024 / s->e;
    zz->L = s->cfg.L;
    zz->nunits = m->nunits;
    zz->e = s->e;
    // stage 0 is the layout of one part: every rank owns everything
    zero_layout_init_flat(&zz->z, m, f->stage == 0 ? 1 : N, f->stage == 0 ? 0 : s->rank);
    const size_t sn = zz->z.shard_n;
    zz->master_full = !s->bf16 && zz->stage < 3;
    if (zz->master_full) zz->master = m->params;
    else if (s->bf16) zz->master = mem_alloc(sn * sizeof(float), MEM_MASTER, s->dev);
    zz->opt_m = mem_alloc(sn * sizeof(float), MEM_OPT_M, s->dev);
    zz->opt_v = mem_alloc(sn * sizeof(float), MEM_OPT_V, s->dev);
    if (zz->stage >= 2) {  // the full gradient goes; my pieces stay
        if (s->bf16) { mem_free(m->grads_bf16); m->grads_bf16 = NULL; }
        else { mem_free(m->grads); m->grads = NULL; }
        zz->grad_shard = mem_alloc(sn * zz->e, MEM_GRADS, s->dev);
    }
    if (zz->stage == 3) {  // the full parameters go too
        if (s->bf16) { mem_free(m->params_bf16); m->params_bf16 = NULL; }
        else { mem_free(m->params); m->params = NULL; }
        zz->param_shard = mem_alloc(sn * zz->e, MEM_PARAMS, s->dev);
        if (!s->bf16) zz->master = zz->param_shard;  // fp32: the pieces ARE the master
    }
    zz->unit = lab_xcalloc((size_t)zz->nunits, sizeof(ZeroUnit));
    zz->rs_order = lab_xcalloc((size_t)zz->nunits, sizeof(int));
    zz->ag_live = lab_xcalloc((size_t)zz->nunits, sizeof(int));
    zz->nbuckets = zz->stage == 2 ? (int)((s->n + zz->bucket - 1) / zz->bucket) : 0;
    zz->bbuf = lab_xcalloc((size_t)zz->nbuckets + 1, sizeof(void *));
    zz->bw = lab_xcalloc((size_t)zz->nbuckets + 1, sizeof(DistWork));
    zz->b_t0 = lab_xcalloc((size_t)zz->nbuckets + 1, sizeof(double));
}

// The weights the forward pass reads, from my master pieces: bf16 rounds them; then stages 1, 2
// all-gather the whole parameters (stage 0 holds them all, stage 3 only ever its pieces).
static void params_from_master(Zero *zz) {
    ZeroShard b = shard_bufs(zz);
    if (zz->s->bf16) {
        for (int u = 0; u < zz->nunits; u++) {
            const ZeroPiece *q = &zz->z.p[u];
            size_t at = b.params_full ? q->unit_offset + q->begin : q->local;
            zz->m->k->f32_to_bf16((uint16_t *)b.params + at, zz->master + q->local, q->count);
        }
    }
    zero_gather_params(&zz->z, &b, zz->s->world);
}

// --resume (rank 0 reads the whole state and every rank takes its pieces: any stage and world
// size resumes any other's checkpoint), --load-weights, or fresh: each rank initializes only its
// own pieces (gpt2_init_slice: a piece is exactly that slice of the full initialization).
// Also state.load: a rollback (--on-spike) is a --resume of the last checkpoint.
static int load_or_init(void *ctx, const LabArgs *args) {
    Zero *zz = ctx;
    Session *s = zz->s;
    int start = 0;
    if (args->resume || args->load_weights) {
        start = zero_load_training(&zz->z, &s->cfg, args->resume, args->load_weights, zz->master,
                                   zz->master_full, zz->opt_m, zz->opt_v, s->world);
    } else {
        zero_init_pieces(&zz->z, &s->cfg, (uint64_t)args->seed, zz->master, zz->master_full);
    }
    params_from_master(zz);
    return start;
}

// The sharded state as the session's loop sees it (SessionState). Its checkpoint: rank 0 writes
// the WHOLE state, gathered from the pieces, in the lab's usual format (any layout resumes it).
static void state_save(void *ctx, const char *path, int step) {
    Zero *zz = ctx;
    const Session *s = zz->s;
    zero_save_training(&zz->z, path, &s->cfg, step, (uint64_t)s->args->seed,
                       (uint64_t)s->args->data_seed, zz->master, zz->master_full, zz->opt_m,
                       zz->opt_v, s->world);
}

// The weights (rank 0, fp32): stage 3 gathers the whole parameters into a buffer copied from
// (train_params_to_host_from), then frees it (tagged MEM_OTHER; at the end after every figure is
// taken; --val-every calls it mid-run).
static void state_weights(void *ctx, float *full) {
    Zero *zz = ctx;
    Session *s = zz->s;
    if (zz->stage != 3) {
        if (s->rank == 0) train_params_to_host(zz->m, full);
        return;
    }
    void *all = mem_alloc(s->n * zz->e, MEM_OTHER, s->dev);
    dist_all_gather_n(zz->param_shard, all, s->n, s->dt, s->world);
    if (s->rank == 0) train_params_to_host_from(zz->m, all, full);
    mem_free(all);
}

static void free_state(Zero *zz) {
    Session *s = zz->s;
    if (!zz->master_full && zz->master != zz->param_shard) mem_free(zz->master);
    mem_free(zz->opt_m);
    mem_free(zz->opt_v);
    mem_free(zz->grad_shard);
    mem_free(zz->param_shard);
    (void)s;
    free(zz->unit); free(zz->rs_order); free(zz->ag_live);
    free(zz->bbuf); free(zz->bw); free(zz->b_t0);
    zero_layout_free(&zz->z);
}

// ---------------------------------------------------------------------------------------------
// training

// The memory rank `rank` will need for a global batch of `batch` (mem_predict.h), the larger of
// two moments. Setup: session_init's whole model without an optimizer (params, grads,
// activations and buffers of its rows) plus my pieces of the master and Adam's m, v, before
// stages 2 and 3 free the whole gradients and parameters. A step: the parameters (stage 3: my
// piece), the gradients (stage 2: calc_zero2_grad_bytes, my piece, the buckets alive and the
// unit gradients the kernels write; stage 3: my piece), the sharded state; stage 3 also holds
// gathered units (the one computing, the next, the embedding kept for the tied head) and up to
// in_flight + 1 unit gradients during backward, and the whole parameters gathered back at the
// end.
static MemPrediction predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const ZeroFlags *f = ctx;
    const int N = dist_size(), bf16 = strcmp(args->dtype, "bf16") == 0;
    GPT2Config cfg = lab_args_config(args);
    const double n = (double)gpt2_param_count(&cfg), e = bf16 ? 2.0 : 4.0;
    const double sn = (double)calc_piece((int64_t)n, f->stage == 0 ? 1 : N, f->stage == 0 ? 0 : rank);
    const double embed = (double)cfg.V * cfg.C + (double)cfg.T * cfg.C;  // unit 0: wte, wpe
    const double largest = mem_predict_largest_piece(&cfg);             // a unit, at most
    MemPrediction whole = mem_predict_replica(&cfg, (batch + N - 1) / N, bf16, 0);
    // my pieces of the optimizer state: the fp32 master (bf16, or stage 3's fp32 pieces, which are
    // the parameters themselves), Adam's m and v
    const double opt = sn * ((bf16 ? 4.0 : 0.0) + 8.0);
    MemPrediction setup = whole, step = whole;
    setup.state += opt;
    step.state = (f->stage == 3 ? sn : n) * e + (f->stage >= 2 ? sn : n) * e + opt;
    if (f->stage == 2) {
        const double bucket = (double)f->bucket_kb * 1024 / e;
        step.buffers += calc_zero2_grad_bytes((int64_t)n, (int64_t)sn, (int64_t)bucket,
                                              f->in_flight, (int64_t)embed, (int64_t)largest, e) - sn * e;
    }
    if (f->stage == 3)  // the units during backward, or the whole parameters at the end
        step.buffers += fmax(e * (embed + 2.0 * largest + (f->in_flight + 1.0) * largest), n * e);
    return mem_prediction_total(setup) >= mem_prediction_total(step) ? setup : step;
}

// The session, the sharded state (its checkpoints and final weights: state_save,
// state_weights), initialized or loaded, the communication thread (stages 2, 3), the banner;
// rank r's rows [row0, row0 + Bl).
static void setup(Zero *zz, Session *s, const LabArgs *args, const ZeroFlags *f, int *row0,
                  int *Bl) {
    const int rank = dist_rank(), N = dist_size();
    data_slice(args->batch, rank, N, row0, Bl);
    if (*Bl == 0)
        lab_fail_collective("--batch %d over %d ranks leaves rank %d without rows; use --batch "
                            ">= %d (one sequence per rank at least)", args->batch, N, N - 1, N);
    mem_refuse_if_it_cannot_fit(args, predict_memory, f, N);  // before the first allocation
    memset(zz, 0, sizeof *zz);
    session_init(s, args, *Bl, 0);  // its model, without an optimizer: the pieces have theirs
    zz->s = s;
    zz->m = &s->model;
    alloc_state(zz, f);
    s->state = (SessionState){zz, state_save, state_weights, load_or_init};
    session_start_at(s, load_or_init(zz, args));
    if (f->stage >= 2 && N > 1) dist_comm_thread_start(s->world);
    zero5_banner(&(Zero5View){s, &zz->z, zz->stage, zz->in_flight, zz->nbuckets, zz->bucket},
                 args);
    mem_reset_peaks();  // the session built a whole model first; what a stage holds from here on
    dist_counters_reset();
    session_watch_links(s, NULL, s->world, NULL);  // --links: DP's link time (report.c)
}

// Every rank's figures to rank 0 (less the checkpoints' collectives), the session's end (the
// final --save, the weights), rank 0's tables and --dump (report.c).
static void finish(Zero *zz) {
    Session *s = zz->s;
    if (zz->stage >= 2 && s->N > 1) dist_comm_thread_stop(s->world);
    Zero5View v = {s, &zz->z, zz->stage, zz->in_flight, zz->nbuckets, zz->bucket};
    double mine[Z5_NFIELDS] = {0};
    zero5_figures(&v, mine, &s->save_cost);
    double *all = session_gather_report(s, mine, Z5_NFIELDS);
    session_finish(s);
    if (s->rank == 0) zero5_report(&v, all, s->args);
    zero5_print_links(&v);  // --links only (collective)
    free(all);
    free_state(zz);
    session_free(s);
}

static void train(const LabArgs *args, const ZeroFlags *f) {
    Session s;
    Zero zz;
    int row0, Bl;
    setup(&zz, &s, args, f, &row0, &Bl);  // s.state: the pieces; s.start: resumed or 0
    const float dloss = 1.0f / ((float)Bl * (float)s.T);
    for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
        session_step_begin(&s, step);  // (--kill-rank, --kill-step)
        if (zz.stage < 2) gpt2_zero_grad(zz.m);
        data_batch(&s.data, (uint64_t)step, args->batch, s.T, row0, Bl, s.inputs, s.targets);
        float loss = forward(&zz);
        backward(&zz, dloss);  // stages 2, 3 reduce-scatter during it
        // --inject-nan-step: a NaN in one rank's gradient (stages 2, 3: its averaged piece)
        if (session_nan_due(&s, step, s.N - 1) && zz.z.shard_n)
            session_poison(shard_bufs(&zz).grads, s.bf16);
        average_gradients(&zz);  // stage 0; stage 1 reduce-scatters in its step
        dist_all_reduce(&loss, &loss, 1, DIST_F32, DIST_AVG, s.world);
        if (session_may_update(&s, step, loss)) optimizer_step(&zz, step);  // (--on-spike)
        session_step_end(&s, step, loss);  // the progress line, the --save-every checkpoint
    }
    finish(&zz);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    ZeroFlags f = {.stage = 1, .in_flight = 2, .bucket_kb = 256};
    FlagSpec extra[] = {
        {"--zero", FLAG_INT, &f.stage, 0, 3, NULL,
         "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 + gradients, 3 + parameters"},
        {"--in-flight", FLAG_INT, &f.in_flight, 1, 1000, NULL,
         "ZeRO-2: bucket buffers alive at once (filling + reducing); ZeRO-3: unit gradients "
         "whose reduce-scatter may still be in flight"},
        {"--bucket-kb", FLAG_INT, &f.bucket_kb, 1, 1 << 20, NULL,
         "ZeRO-2: bucket size in KiB of the gradient (fp32 4 B, bf16 2 B an element)"},
    };
    lab_parse_args(argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]), "05_zero/run",
                   USAGE);
    // a flag that does nothing at this stage is refused, not ignored
    if (lab_flag_given(argc, argv, "--bucket-kb") && f.stage != 2)
        lab_fail_collective("--bucket-kb sizes ZeRO-2's gradient buckets: it needs --zero 2 "
                            "(with --zero %d it would do nothing)", f.stage);
    if (lab_flag_given(argc, argv, "--in-flight") && f.stage < 2)
        lab_fail_collective("--in-flight bounds ZeRO-2's buckets and ZeRO-3's unit gradients in "
                            "flight: it needs --zero 2 or 3 (with --zero %d it would do nothing)",
                            f.stage);
    train(&args, &f);
    dist_finalize();
    return 0;
}
