// planner.c: which DP x TP x PP layout trains this model on these GPUs?
//
// Enumerate the layouts (TP inside a node, or over whole nodes, ranked after; PP and DP anywhere), with
// every ZeRO stage, micro-batch size and recomputation mode; keep the ones whose memory per
// GPU fits (calc_memory); rank them by an estimated step time.
//
// The step-time model (alpha-beta, nothing overlapped, so it is pessimistic; the ranking is the
// point, not the seconds):
//   compute   one micro-batch on one stage: 6 * N * b * s / (tp * pp) FLOPs at peak * MFU;
//             x 4/3 with full recomputation (the forward runs twice); selective recomputation
//             adds the attention core's forward, 4 * b * s^2 * C per layer / tp; 1F1B runs
//             m + pp - 1 such slots (the bubble is the pp - 1), m + (pp - 1) / v with v chunks
//             per rank (interleaved 1F1B: each warm-up op is a chunk, 1/v of a slot).
//   TP, PP, DP the bytes and message hops one rank sends per micro-batch and per step in each
//             group, from calc_rank_comm (common/calc_comm.c: the same count chapter 09's run is checked
//             against to the byte), timed as bytes / bw + hops * alpha on the slowest link the
//             group crosses (calc_group_nodes: NVLink when every group of that dimension stays
//             inside a node, else InfiniBand): TP and PP once per micro-batch slot; DP once per
//             step (ZeRO-2/3 also per micro-batch).
//   ring      all-reduce(S, n) = 2(n-1) hops, 2(n-1)/n * S bytes; reduce-scatter and
//             all-gather half of that.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "calc.h"
#include "check.h"

const char *calc_plan_check(const CalcModel *m, const CalcPlanSpec *p) {
    const char *err = calc_model_check(m);
    if (err) return err;
    if (m->arch == CALC_ARCH_RAW)
        return calc_msg("--plan needs the model's dimensions to split it (use --model or "
                        "--dims, not --params)");
    if (p->gpus < 1) return calc_msg("--gpus %d: must be a positive number of GPUs", p->gpus);
    if (p->gpus_per_node < 1)
        return calc_msg("--gpus-per-node %d: must be at least 1", p->gpus_per_node);
    if (p->gpus > p->gpus_per_node && p->gpus % p->gpus_per_node != 0)
        return calc_msg("--gpus %d is not a whole number of nodes of --gpus-per-node %d "
                        "(valid: %d, %d, %d, ...)", p->gpus, p->gpus_per_node,
                        p->gpus_per_node, 2 * p->gpus_per_node, 3 * p->gpus_per_node);
    if (p->global_batch < 1)
        return calc_msg("--global-batch %d: must be at least 1 sequence per step",
                        p->global_batch);
    if (p->seq_len < 0)
        return calc_msg("--seq-len %d: must be positive (0 = the model's T)", p->seq_len);
    if (p->seq_len > m->T && m->arch == CALC_ARCH_GPT2)
        return calc_msg("--seq-len %d exceeds the context length T=%d of %s", p->seq_len,
                        m->T, m->name);
    if (p->dtype != CALC_FP32 && p->dtype != CALC_BF16)
        return calc_msg("--dtype: unknown precision (valid: fp32, bf16)");
    if (p->optim != CALC_ADAM && p->optim != CALC_SGD)
        return calc_msg("--optimizer: unknown optimizer (valid: adam, sgd)");
    if (!(p->mem_bytes > 0))
        return calc_msg("--gpu-mem %g: the GPU's memory must be positive (GB)", p->mem_bytes / 1e9);
    if (!(p->peak_flops > 0))
        return calc_msg("--peak-tflops %g: must be positive", p->peak_flops / 1e12);
    if (!(p->mfu >= CALC_MFU_MIN && p->mfu <= 1))
        return calc_msg("--mfu %g: model FLOPs utilization must be in [%g, 1] (e.g. --mfu 0.45)",
                        p->mfu, CALC_MFU_MIN);
    if (!(p->bw_intra > 0)) return calc_msg("--bw-intra %g GB/s: must be positive", p->bw_intra / 1e9);
    if (!(p->bw_inter > 0)) return calc_msg("--bw-inter %g GB/s: must be positive", p->bw_inter / 1e9);
    if (!(p->latency >= 0)) return calc_msg("--latency-us %g: must be >= 0", p->latency * 1e6);
    return NULL;
}

double calc_plan_link_bw(const CalcPlanSpec *p, const CalcSetup *s, int dim) {
    return calc_group_nodes(s, dim, p->gpus_per_node) > 1 ? p->bw_inter : p->bw_intra;
}

double calc_plan_link_lat(const CalcPlanSpec *p, const CalcSetup *s, int dim) {
    if (p->latency_inter > 0 && calc_group_nodes(s, dim, p->gpus_per_node) > 1) return p->latency_inter;
    return p->latency;
}

// Seconds of one group's traffic: bytes / bandwidth + hops * alpha (the alpha-beta model).
static double traffic_s(double bytes, double hops, double bw, double alpha) {
    return bytes / bw + hops * alpha;
}

void calc_plan_time(const CalcModel *m, const CalcPlanSpec *p, CalcPlan *c) {
    const CalcSetup *s = &c->setup;
    double N = (double)m->nparams;
    double seq = s->seq_len > 0 ? s->seq_len : m->T;
    const int G = s->dp * s->tp * s->pp, nmb = calc_micro_batches(s);
    const int v = s->chunks > 1 ? s->chunks : 1;
    int layers = 0;                                         // the slowest stage sets the pace
    for (int r = 0; r < s->pp; r++) {
        int l = 0;
        for (int ch = 0; ch < v; ch++) l += calc_stage_layers(m->L, s->pp * v, ch * s->pp + r);
        if (l > layers) layers = l;
    }
    double recompute = s->recompute == CALC_RECOMPUTE_FULL ? 4.0 / 3.0 : 1.0;

    double slot_flops = 6 * N * s->micro_batch * seq / ((double)s->tp * s->pp) * recompute;
    if (s->recompute == CALC_RECOMPUTE_SELECTIVE)   // QK^T and AV run again in backward
        slot_flops += layers * 4.0 * s->micro_batch * seq * seq * m->C / s->tp;
    double slot_compute = slot_flops / (p->peak_flops * p->mfu);
    double slots = nmb + (double)(s->pp - 1) / v;  // interleaved: a chunk's warm-up is 1/v of a slot
    c->t_compute = slots * slot_compute;

    // Communication: calc_rank_comm's bytes of every stage (replica 0), timed on the link its
    // group crosses; each dimension's time is its busiest stage's (a pessimistic sum when
    // different stages are the busiest for different dimensions).
    double bw_tp = calc_plan_link_bw(p, s, CALC_DIM_TP);
    double bw_pp = calc_plan_link_bw(p, s, CALC_DIM_PP);
    double bw_dp = calc_plan_link_bw(p, s, CALC_DIM_DP);
    c->t_tp = c->t_pp = c->t_dp = c->b_tp = c->b_pp = c->b_dp = 0;
    for (int r = 0; r < s->pp; r++) {
        CalcComm k = calc_rank_comm(m, s, r, 0);
        const CalcTraffic *tp = &k.tp, *pq = &k.pp, *dq = &k.dp;
        double t_tp = calc_traffic_slot_seconds(tp, slots, nmb, bw_tp, calc_plan_link_lat(p, s, CALC_DIM_TP));
        double t_pp = calc_traffic_slot_seconds(pq, slots, nmb, bw_pp, calc_plan_link_lat(p, s, CALC_DIM_PP));
        // DP: after the pipeline drains (ZeRO-2/3: per micro-batch too, counted in step_*)
        double t_dp = traffic_s(dq->step_bytes, dq->step_hops, bw_dp, calc_plan_link_lat(p, s, CALC_DIM_DP));
        if (t_tp > c->t_tp) c->t_tp = t_tp;
        if (t_pp > c->t_pp) c->t_pp = t_pp;
        if (t_dp > c->t_dp) c->t_dp = t_dp;
        if (tp->step_bytes > c->b_tp) c->b_tp = tp->step_bytes;
        if (pq->step_bytes > c->b_pp) c->b_pp = pq->step_bytes;
        if (dq->step_bytes > c->b_dp) c->b_dp = dq->step_bytes;
    }
    c->t_step = c->t_compute + c->t_tp + c->t_pp + c->t_dp;
    c->mfu = 6 * N * (double)p->global_batch * seq / ((double)G * p->peak_flops * c->t_step);
}

// "450 GB/s", "12.5 GB/s", "0.0391 GB/s": a bandwidth with the digits it needs.
static const char *fmt_bw(char *buf, size_t len, double bytes_per_s) {
    double gb = bytes_per_s / 1e9;
    if (gb >= 100) snprintf(buf, len, "%.0f GB/s", gb);
    else snprintf(buf, len, "%.3g GB/s", gb);
    return buf;
}

// Growable array of candidates.
typedef struct PlanList {
    CalcPlan *v;
    int n, cap;
} PlanList;

static void plan_push(PlanList *l, const CalcPlan *c) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, (size_t)l->cap * sizeof(CalcPlan));
        LAB_CHECK(l->v != NULL, "out of host memory for %d plans", l->cap);
    }
    l->v[l->n++] = *c;
}

// All valid candidates on G GPUs.
static void enumerate(const CalcModel *m, const CalcPlanSpec *p, int G, PlanList *out) {
    int gpn = p->gpus_per_node;
    for (int tp = 1; tp <= G; tp++) {
        if (G % tp || (gpn % tp && tp % gpn)) continue;   // TP inside a node, or whole nodes
        if (m->NH % tp || m->KV % tp || m->FFN % tp) continue;    // whole heads per rank
        for (int pp = 1; pp <= G / tp && pp <= m->L; pp++) {
            if ((G / tp) % pp || calc_stage_layers(m->L, pp, 0) < 0) continue;
            int dp = G / (tp * pp);
            if (p->global_batch % dp) continue;                   // equal share per DP rank
            int per_dp = p->global_batch / dp;
            for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++)
                for (int mb = 1; mb <= 64 && mb <= per_dp; mb *= 2) {
                    if (per_dp % mb) continue;
                    for (int rc = CALC_RECOMPUTE_NONE; rc <= CALC_RECOMPUTE_FULL; rc++) {
                        CalcPlan c;
                        memset(&c, 0, sizeof c);
                        CalcSetup *s = &c.setup;
                        *s = calc_setup_default();
                        s->dtype = p->dtype;
                        s->optim = p->optim;
                        s->zero = zero;
                        s->dp = dp; s->tp = tp; s->pp = pp;
                        s->sp = tp > 1;   // Megatron practice: SP costs no extra communication
                        s->micro_batch = mb;
                        s->micro_batches = per_dp / mb;
                        s->seq_len = p->seq_len;
                        s->recompute = (CalcRecompute)rc;
                        c.tp_nodes = calc_group_nodes(s, CALC_DIM_TP, gpn);
                        c.mem = calc_memory(m, s);
                        c.fits = calc_fits(&c.mem, p->mem_bytes);
                        calc_plan_time(m, p, &c);
                        plan_push(out, &c);
                    }
                }
        }
    }
}

// Fitting first; then TP inside a node (question 5: a TP group across nodes runs its
// all-reduces on the slow link, and they sit inside every layer's forward and backward, where no
// overlap can hide them); then faster; then smaller; then the simpler ZeRO stage.
static int plan_cmp(const void *a, const void *b) {
    const CalcPlan *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if ((x->tp_nodes > 1) != (y->tp_nodes > 1)) return (x->tp_nodes > 1) - (y->tp_nodes > 1);
    if (x->t_step != y->t_step) return x->t_step < y->t_step ? -1 : 1;
    if (x->mem.total != y->mem.total) return x->mem.total < y->mem.total ? -1 : 1;
    return x->setup.zero - y->setup.zero;
}

CalcPlanResult calc_plan(const CalcModel *m, const CalcPlanSpec *p) {
    const char *err = calc_plan_check(m, p);
    LAB_CHECK(err == NULL, "calc_plan: %s", err);
    CalcPlanResult r;
    memset(&r, 0, sizeof r);
    CalcBytesPerParam bpp = calc_bytes_per_param(p->dtype, p->optim);
    r.state_bytes = (double)m->nparams * (bpp.params + bpp.grads + bpp.master + bpp.m + bpp.v);

    PlanList l = {NULL, 0, 0};
    enumerate(m, p, p->gpus, &l);
    if (l.n > 0) qsort(l.v, (size_t)l.n, sizeof(CalcPlan), plan_cmp);
    r.plans = l.v;
    r.nplans = l.n;
    for (int i = 0; i < l.n; i++) r.nfit += l.v[i].fits;

    // Nothing fits: the fewest whole nodes that do. Fully sharded model states need at least
    // state_bytes / G per GPU, which skips hopeless counts quickly.
    if (r.nfit == 0) {
        int gpn = p->gpus_per_node;
        int first = p->gpus < gpn ? gpn : (p->gpus / gpn + 1) * gpn;
        for (int G = first; G <= 4096 * gpn && r.min_gpus == 0; G += gpn) {
            if (r.state_bytes / G > p->mem_bytes) continue;
            PlanList more = {NULL, 0, 0};
            enumerate(m, p, G, &more);
            for (int i = 0; i < more.n; i++)
                if (more.v[i].fits && (r.min_gpus == 0 || plan_cmp(&more.v[i], &r.best_at_min) < 0)) {
                    r.min_gpus = G;
                    r.best_at_min = more.v[i];
                }
            free(more.v);
        }
    }
    return r;
}

void calc_plan_free(CalcPlanResult *r) {
    free(r->plans);
    r->plans = NULL;
    r->nplans = r->nfit = 0;
}

const CalcPlan *calc_plan_find(const CalcPlanResult *r, int dp, int tp, int pp) {
    for (int i = 0; i < r->nplans; i++) {
        const CalcSetup *s = &r->plans[i].setup;
        if (r->plans[i].fits && s->dp == dp && s->tp == tp && s->pp == pp) return &r->plans[i];
    }
    return NULL;
}

static void print_row(FILE *out, int rank, const CalcPlan *c, double mem_bytes) {
    const CalcSetup *s = &c->setup;
    char layout[32];
    snprintf(layout, sizeof layout, "%d x %d x %d", s->dp, s->tp, s->pp);
    fprintf(out, "  %4d  %-14s %4d %4d %5d  %-9s %9.2f %5.0f%% %8.2f %8.2f %8.2f %9.3f %8.3f "
            "%8.3f %8.3f %9.3f %5.1f%%\n", rank, layout, s->zero, s->micro_batch, s->micro_batches,
            calc_recompute_name(s->recompute), c->mem.total / 1e9, 100 * c->mem.total / mem_bytes,
            c->b_tp / 1e9, c->b_pp / 1e9, c->b_dp / 1e9, c->t_compute, c->t_tp, c->t_pp, c->t_dp,
            c->t_step, 100 * c->mfu);
}

static void print_header(FILE *out) {
    fprintf(out, "  %4s  %-14s %4s %4s %5s  %-9s %9s %6s %8s %8s %8s %9s %8s %8s %8s %9s %6s\n",
            "rank", "DP x TP x PP", "ZeRO", "mb", "m", "recompute", "mem GB", "of GPU", "TP GB",
            "PP GB", "DP GB", "compute s", "TP s", "PP s", "DP s", "step s", "MFU");
}

void calc_print_plan(FILE *out, const CalcModel *m, const CalcPlanSpec *p,
                     const CalcPlanResult *r, int top, const char *gpu_label) {
    char cnt[32];
    int seq = p->seq_len > 0 ? p->seq_len : m->T;
    int nodes = p->gpus <= p->gpus_per_node ? 1 : p->gpus / p->gpus_per_node;
    fprintf(out, "\nPlan: %s (%s parameters) on %d x %s (%d node%s of %d), global batch %d x %d "
            "tokens, %s, %s\n", m->name, calc_fmt_count(cnt, sizeof cnt, (double)m->nparams),
            p->gpus, gpu_label, nodes, nodes == 1 ? "" : "s", p->gpus_per_node, p->global_batch,
            seq, p->dtype == CALC_BF16 ? "bf16 mixed precision" : "fp32",
            p->optim == CALC_ADAM ? "Adam" : "SGD+momentum");
    fprintf(out, "  GPU memory %.2f GB (%.2f GiB); model states of all ranks together %.1f GB\n",
            p->mem_bytes / 1e9, p->mem_bytes / (1024.0 * 1024 * 1024), r->state_bytes / 1e9);
    char bi[32], be[32];
    fprintf(out, "  step time: alpha-beta ring model, no overlap; compute at MFU %.2f of %.0f "
            "TFLOP/s; NVLink %s, InfiniBand %s per GPU, alpha %.1f us\n", p->mfu,
            p->peak_flops / 1e12, fmt_bw(bi, sizeof bi, p->bw_intra),
            fmt_bw(be, sizeof be, p->bw_inter), p->latency * 1e6);
    fprintf(out, "  rules: TP inside a node (tp divides %d) first, TP over whole nodes after; each "
            "group timed on the slowest link it crosses; SP on with TP; 1F1B; mb = micro-batch, "
            "m = micro-batches per step\n", p->gpus_per_node);
    fprintf(out, "  TP/PP/DP GB: bytes one GPU sends per step in that group (its busiest stage; "
            "--layout DPxTPxPP details one layout)\n");
    fprintf(out, "  %d candidate setups, %d fit; best setup of each DP x TP x PP layout, fastest "
            "first:\n\n", r->nplans, r->nfit);
    if (r->nfit > 0) {
        print_header(out);
        int shown = 0;
        for (int i = 0; i < r->nplans && r->plans[i].fits && shown < top; i++) {
            const CalcSetup *s = &r->plans[i].setup;
            // only the first (best) setup of each layout
            if (calc_plan_find(r, s->dp, s->tp, s->pp) != &r->plans[i]) continue;
            print_row(out, ++shown, &r->plans[i], p->mem_bytes);
        }
        return;
    }
    fprintf(out, "  No layout fits: the model states alone need %.1f GB, %.1f GB per GPU even "
            "fully sharded over %d GPUs (capacity %.1f GB), before any activation.\n",
            r->state_bytes / 1e9, r->state_bytes / p->gpus / 1e9, p->gpus, p->mem_bytes / 1e9);
    if (r->min_gpus > 0) {
        const CalcSetup *b = &r->best_at_min.setup;
        fprintf(out, "  The fewest GPUs (whole nodes of %d) with a layout that fits: %d; the best "
                "there is DP %d x TP %d x PP %d, ZeRO-%d, recompute %s, %.2f GB per GPU.\n",
                p->gpus_per_node, r->min_gpus, b->dp, b->tp, b->pp, b->zero,
                calc_recompute_name(b->recompute), r->best_at_min.mem.total / 1e9);
    } else {
        fprintf(out, "  No layout fits on up to %d GPUs either: shorten --seq-len, lower "
                "--global-batch, or use GPUs with more memory.\n", 4096 * p->gpus_per_node);
    }
}

// ------------------------------------------------------------------------------------------
// --layout: one layout in detail, every pipeline stage's memory and traffic.

// The exact byte count and the same in binary units, as the chapters' runs print them
// (mem_format: KiB, MiB, GiB): the layout is what chapter 09's run will measure.
static void print_bytes(FILE *out, double bytes) {
    char buf[32];
    fprintf(out, " %16.0f %10s", bytes, mem_format(buf, sizeof buf, bytes));
}

void calc_print_layout(FILE *out, const CalcModel *m, const CalcSetup *s, const CalcPlanSpec *p,
                       const char *gpu_label) {
    const int v = s->chunks > 1 ? s->chunks : 1, M = calc_micro_batches(s);
    const int seq = s->seq_len > 0 ? s->seq_len : m->T;
    char cnt[32];
    fprintf(out, "\nLayout DP %d x TP %d x PP %d = %d GPUs: %s (%s parameters), %s, ZeRO-%d%s\n",
            s->dp, s->tp, s->pp, s->dp * s->tp * s->pp, m->name,
            calc_fmt_count(cnt, sizeof cnt, (double)m->nparams),
            s->dtype == CALC_BF16 ? "bf16 mixed precision" : "fp32", s->zero,
            s->sp && s->tp > 1 ? ", sequence parallel" : "");
    fprintf(out, "  per step: %d micro-batch%s of b=%d x s=%d tokens per replica (global batch %d "
            "sequences), 1F1B%s, recompute %s\n", M, M == 1 ? "" : "es", s->micro_batch, seq,
            s->dp * M * s->micro_batch, v > 1 ? " interleaved" : "", calc_recompute_name(s->recompute));
    if (v > 1) fprintf(out, "  %d chunks per rank: virtual stage c*%d + stage of %d\n", v, s->pp, s->pp * v);
    fprintf(out, "  activations: %s\n", s->acts == CALC_ACTS_LAB ? "the lab's TP stage (chapter 09's "
            "run, exact)" : "Korthikanti et al. 2022");
    // Memory per GPU by category, one row per stage (replica 0: the longest ZeRO pieces)
    fprintf(out, "\nMemory per GPU (bytes; replica 0 of each stage)\n");
    fprintf(out, "  %5s %6s %14s %14s %14s %14s %14s %14s %14s %10s %5s %14s\n", "stage", "layers",
            "Ψ rank", "params", "grads", "master", "Adam m", "Adam v", "activations",
            "in flight", "", "total");
    for (int r = 0; r < s->pp; r++) {
        CalcBreakdown b = calc_rank_memory(m, s, r, 0);
        char tot[32];
        fprintf(out, "  %5d %6d %14lld %14.0f %14.0f %14.0f %14.0f %14.0f %14.0f %10d %5s %14.0f  "
                "(%s)\n", r, b.layers, (long long)b.rank_params, b.params, b.grads, b.master,
                b.m, b.v, b.acts, b.inflight, v > 1 ? "chunk" : "mb", b.total,
                mem_format(tot, sizeof tot, b.total));
    }
    // Bytes per step per dimension
    fprintf(out, "\nBytes one GPU sends per step in its groups (replica 0; dist's count: ring "
            "all-reduce 2(n-1)/n)\n");
    fprintf(out, "  %5s %-4s %27s %27s\n", "stage", "dim", "per step", "per micro-batch");
    static const char *dims[3] = {"TP", "DP", "PP"};
    for (int r = 0; r < s->pp; r++) {
        CalcComm k = calc_rank_comm(m, s, r, 0);
        const CalcTraffic *t[3] = {&k.tp, &k.dp, &k.pp};
        for (int i = 0; i < 3; i++) {
            fprintf(out, "  %5d %-4s", r, dims[i]);
            print_bytes(out, t[i]->step_bytes);
            print_bytes(out, t[i]->mb_bytes);
            fprintf(out, "\n");
        }
    }
    // Step time and MFU
    CalcPlan c;
    memset(&c, 0, sizeof c);
    c.setup = *s;
    c.setup.micro_batches = M;
    c.mem = calc_memory(m, s);
    calc_plan_time(m, p, &c);
    char bi[32], be[32];
    fprintf(out, "\nStep time on %s (alpha-beta, no overlap; peak %.0f TFLOP/s at MFU %.2f, NVLink "
            "%s, InfiniBand %s, alpha %.1f us)\n", gpu_label, p->peak_flops / 1e12,
            p->mfu, fmt_bw(bi, sizeof bi, p->bw_intra), fmt_bw(be, sizeof be, p->bw_inter),
            p->latency * 1e6);
    fprintf(out, "  compute %.4g s + TP %.4g s + PP %.4g s + DP %.4g s = step %.4g s; MFU %.1f %% "
            "(6 N x %d x %d tokens / (%d GPUs x peak x step))\n", c.t_compute, c.t_tp, c.t_pp,
            c.t_dp, c.t_step, 100 * c.mfu, p->global_batch, seq, p->gpus);
    // the link each group crosses (nodes of --gpus-per-node GPUs, ranks numbered TP fastest)
    static const int dim_of[3] = {CALC_DIM_TP, CALC_DIM_PP, CALC_DIM_DP};
    static const char *dim_name[3] = {"TP", "PP", "DP"};
    fprintf(out, "  links (nodes of %d GPUs):", p->gpus_per_node);
    for (int i = 0; i < 3; i++) {
        int nodes = calc_group_nodes(s, dim_of[i], p->gpus_per_node);
        int degree = dim_of[i] == CALC_DIM_TP ? s->tp : dim_of[i] == CALC_DIM_PP ? s->pp : s->dp;
        fprintf(out, "%s %s %s", i ? ";" : "", dim_name[i], degree == 1 ? "none (degree 1)"
                : nodes > 1 ? "between nodes" : "inside a node");
    }
    fprintf(out, "\n");
    int tp_nodes = calc_group_nodes(s, CALC_DIM_TP, p->gpus_per_node);
    if (tp_nodes > 1 && s->tp > 1) {
        CalcPlanSpec inside = *p;
        inside.bw_inter = p->bw_intra;   // the same layout with every link as fast as a node's
        CalcPlan in;
        memset(&in, 0, sizeof in);
        in.setup = c.setup;
        calc_plan_time(m, &inside, &in);
        fprintf(out, "  WARNING: TP %d spans %d nodes: its all-reduces cross the %s link, x%.3g "
                "slower than inside a node (TP %.4g s per step instead of %.4g s); keep TP inside "
                "a node (tp dividing %d) and put PP or DP across nodes\n", s->tp, tp_nodes,
                fmt_bw(be, sizeof be, p->bw_inter), p->bw_intra / p->bw_inter, c.t_tp, in.t_tp,
                p->gpus_per_node);
    }
    char tot[32];
    fprintf(out, "  heaviest GPU %s of %.2f GiB (%.2f GB): %s\n",
            mem_format(tot, sizeof tot, c.mem.total), p->mem_bytes / (1024.0 * 1024 * 1024),
            p->mem_bytes / 1e9,
            calc_fits(&c.mem, p->mem_bytes) ? "fits" : "does NOT fit");
}
