// planner.c: which DP x TP x PP layout trains this model on these GPUs?
//
// Enumerate the layouts the notes' rules allow (TP inside a node; PP and DP across nodes), with
// every ZeRO stage, micro-batch size and recomputation mode; keep the ones whose memory per
// GPU fits (calc_memory); rank them by an estimated step time.
//
// The step-time model (alpha-beta, nothing overlapped, so it is pessimistic; the ranking is the
// point, not the seconds):
//   compute   one micro-batch on one stage: 6 * N * b * s / (tp * pp) FLOPs at peak * MFU;
//             x 4/3 with full recomputation (the forward runs twice); selective recomputation
//             adds the attention core's forward, 4 * b * s^2 * C per layer / tp; 1F1B runs
//             m + pp - 1 such slots (the bubble is the pp - 1).
//   TP        per layer and micro-batch, 4 all-reduces of b*s*C values (2 forward, 2 backward;
//             6 with full recomputation), over NVLink (TP stays inside a node).
//   PP        per micro-batch slot, one send forward and one backward of b*s*C/tp values.
//   DP        once per step after the pipeline drains: ZeRO-0/1 all-reduce the gradients (ZeRO-1:
//             reduce-scatter + all-gather, the same volume); ZeRO-2 reduce-scatters after every
//             micro-batch; ZeRO-3 also all-gathers the parameters twice per micro-batch.
//   ring      all-reduce(S, n) = 2(n-1) * alpha + 2(n-1)/n * S / bw; reduce-scatter and
//             all-gather half of that. bw is the NVLink bandwidth when the group fits in one
//             node, else the InfiniBand bandwidth per GPU.
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "calc.h"
#include "check.h"

static char plan_msg[512];

static double ring_all_reduce(double bytes, int n, double bw, double alpha) {
    if (n <= 1) return 0;
    return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / bw;
}

// reduce-scatter or all-gather of a buffer of `bytes` (the full, unsharded size)
static double ring_half(double bytes, int n, double bw, double alpha) {
    if (n <= 1) return 0;
    return (double)(n - 1) * alpha + (double)(n - 1) / n * bytes / bw;
}

LAB_PRINTF(1, 2) static const char *plan_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(plan_msg, sizeof plan_msg, fmt, ap);
    va_end(ap);
    return plan_msg;
}

const char *calc_plan_check(const CalcModel *m, const CalcPlanSpec *p) {
    const char *err = calc_model_check(m);
    if (err) return err;
    if (m->arch == CALC_ARCH_RAW)
        return plan_error("--plan needs the model's dimensions to split it (use --model or "
                          "--dims, not --params)");
    if (p->gpus < 1) return plan_error("--gpus %d: must be a positive number of GPUs", p->gpus);
    if (p->gpus_per_node < 1)
        return plan_error("--gpus-per-node %d: must be at least 1", p->gpus_per_node);
    if (p->gpus > p->gpus_per_node && p->gpus % p->gpus_per_node != 0)
        return plan_error("--gpus %d is not a whole number of nodes of --gpus-per-node %d "
                          "(valid: %d, %d, %d, ...)", p->gpus, p->gpus_per_node,
                          p->gpus_per_node, 2 * p->gpus_per_node, 3 * p->gpus_per_node);
    if (p->global_batch < 1)
        return plan_error("--global-batch %d: must be at least 1 sequence per step",
                          p->global_batch);
    if (p->seq_len < 0)
        return plan_error("--seq-len %d: must be positive (0 = the model's T)", p->seq_len);
    if (p->seq_len > m->T && m->arch == CALC_ARCH_GPT2)
        return plan_error("--seq-len %d exceeds the context length T=%d of %s", p->seq_len,
                          m->T, m->name);
    if (p->dtype != CALC_FP32 && p->dtype != CALC_BF16)
        return plan_error("--dtype: unknown precision (valid: fp32, bf16)");
    if (p->optim != CALC_ADAM && p->optim != CALC_SGD)
        return plan_error("--optimizer: unknown optimizer (valid: adam, sgd)");
    if (!(p->mem_bytes > 0))
        return plan_error("--gpu-mem %g: the GPU's memory must be positive (GB)", p->mem_bytes / 1e9);
    if (!(p->peak_flops > 0))
        return plan_error("--peak-tflops %g: must be positive", p->peak_flops / 1e12);
    if (!(p->mfu >= CALC_MFU_MIN && p->mfu <= 1))
        return plan_error("--mfu %g: model FLOPs utilization must be in [%g, 1] (e.g. --mfu 0.45)",
                          p->mfu, CALC_MFU_MIN);
    if (!(p->bw_intra > 0)) return plan_error("--bw-intra %g GB/s: must be positive", p->bw_intra / 1e9);
    if (!(p->bw_inter > 0)) return plan_error("--bw-inter %g GB/s: must be positive", p->bw_inter / 1e9);
    if (!(p->latency >= 0)) return plan_error("--latency-us %g: must be >= 0", p->latency * 1e6);
    return NULL;
}

void calc_plan_time(const CalcModel *m, const CalcPlanSpec *p, CalcPlan *c) {
    const CalcSetup *s = &c->setup;
    double N = (double)m->nparams;
    double seq = s->seq_len > 0 ? s->seq_len : m->T;
    double w = s->dtype == CALC_BF16 ? 2 : 4;               // bytes per activation/param value
    CalcBytesPerParam bpp = calc_bytes_per_param(s->dtype, s->optim);
    int G = s->dp * s->tp * s->pp, nmb = s->micro_batches;
    int layers = 0;                                         // the slowest stage sets the pace
    for (int r = 0; r < s->pp; r++) {
        int l = calc_stage_layers(m->L, s->pp, r);
        if (l > layers) layers = l;
    }
    double recompute = s->recompute == CALC_RECOMPUTE_FULL ? 4.0 / 3.0 : 1.0;

    double slot_flops = 6 * N * s->micro_batch * seq / ((double)s->tp * s->pp) * recompute;
    if (s->recompute == CALC_RECOMPUTE_SELECTIVE)   // QK^T and AV run again in backward
        slot_flops += layers * 4.0 * s->micro_batch * seq * seq * m->C / s->tp;
    double slot_compute = slot_flops / (p->peak_flops * p->mfu);
    double act = s->micro_batch * seq * m->C * w;           // one micro-batch's hidden states
    double ar_per_layer = s->recompute == CALC_RECOMPUTE_FULL ? 6 : 4;
    double slot_tp = layers * ar_per_layer * ring_all_reduce(act, s->tp, p->bw_intra, p->latency);
    double bw_pp = G <= p->gpus_per_node ? p->bw_intra : p->bw_inter;
    double slot_pp = s->pp > 1 ? 2 * (p->latency + act / s->tp / bw_pp) : 0;
    double slots = nmb + s->pp - 1;
    c->t_compute = slots * slot_compute;
    c->t_tp = slots * slot_tp;
    c->t_pp = slots * slot_pp;

    // Data parallel: the heaviest stage's parameters on one TP rank.
    double psi = (double)c->mem.rank_params;
    double bw_dp = s->tp * s->dp <= p->gpus_per_node ? p->bw_intra : p->bw_inter;
    double grads = psi * bpp.grads, params = psi * bpp.params;
    double t_dp = 0;
    if (s->zero <= 1)      // all-reduce (ZeRO-1: reduce-scatter grads + all-gather params)
        t_dp = ring_half(grads, s->dp, bw_dp, p->latency) + ring_half(params, s->dp, bw_dp, p->latency);
    else if (s->zero == 2) // every micro-batch's gradients leave at once; params gathered once
        t_dp = nmb * ring_half(grads, s->dp, bw_dp, p->latency) +
               ring_half(params, s->dp, bw_dp, p->latency);
    else                   // gather params for forward and backward, scatter grads, per micro-batch
        t_dp = nmb * (2 * ring_half(params, s->dp, bw_dp, p->latency) +
                      ring_half(grads, s->dp, bw_dp, p->latency));
    c->t_dp = t_dp;
    c->t_step = c->t_compute + c->t_tp + c->t_pp + c->t_dp;
    c->mfu = 6 * N * (double)p->global_batch * seq / ((double)G * p->peak_flops * c->t_step);
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
    for (int tp = 1; tp <= gpn && tp <= G; tp++) {
        if (gpn % tp || G % tp) continue;                         // TP inside a node
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
                        c.mem = calc_memory(m, s);
                        c.fits = calc_fits(&c.mem, p->mem_bytes);
                        calc_plan_time(m, p, &c);
                        plan_push(out, &c);
                    }
                }
        }
    }
}

// Fitting first; then faster; then smaller; then the simpler ZeRO stage.
static int plan_cmp(const void *a, const void *b) {
    const CalcPlan *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
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
    fprintf(out, "  %4d  %-14s %4d %4d %5d  %-9s %9.2f %5.0f%% %9.3f %8.3f %8.3f %8.3f %9.3f %5.1f%%\n",
            rank, layout, s->zero, s->micro_batch, s->micro_batches,
            calc_recompute_name(s->recompute), c->mem.total / 1e9, 100 * c->mem.total / mem_bytes,
            c->t_compute, c->t_tp, c->t_pp, c->t_dp, c->t_step, 100 * c->mfu);
}

static void print_header(FILE *out) {
    fprintf(out, "  %4s  %-14s %4s %4s %5s  %-9s %9s %6s %9s %8s %8s %8s %9s %6s\n", "rank",
            "DP x TP x PP", "ZeRO", "mb", "m", "recompute", "mem GB", "of GPU", "compute s",
            "TP s", "PP s", "DP s", "step s", "MFU");
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
    fprintf(out, "  step time: alpha-beta ring model, no overlap; compute at MFU %.2f of %.0f "
            "TFLOP/s; NVLink %.0f GB/s, InfiniBand %.0f GB/s per GPU, alpha %.1f us\n", p->mfu,
            p->peak_flops / 1e12, p->bw_intra / 1e9, p->bw_inter / 1e9, p->latency * 1e6);
    fprintf(out, "  rules: TP inside a node (tp divides %d), PP and DP across nodes; SP on with "
            "TP; 1F1B; mb = micro-batch, m = micro-batches per step\n", p->gpus_per_node);
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
