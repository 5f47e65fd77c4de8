// report.c: chapter 06's figures, tables and --dump (fsdp6_report.h). The sharded state's
// formulas and the collectives' counts and bytes come from the calculator (common/calc.h,
// calc_shard.c); what is gathered and what gradients are alive in each phase is FSDP's own
// formula: the plan walked with the prefetch window and the reshard rule, as the runtime walks it.
#include "fsdp6_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "calc.h"
#include "check.h"
#include "mem.h"
#include "results.h"

static const char *PHASE[PH_N] = {"forward", "backward", "optimizer"};

void fsdp6_banner(const FsdpRun *r, const LabArgs *args) {
    Session *s = r->s;
    const int N = s->N, K = r->K;
    if (args->quiet || s->rank != 0) return;
    char model[128], b1[32];
    printf("FSDP on %d rank%s: %s (%s), device %s\n", N, N > 1 ? "s" : "",
           session_model_line(s, model, sizeof model), s->bf16 ? "bf16" : "fp32",
           s->model.k->name);
    printf("units: embedding, %d blocks, head, each cut in %d pieces (%s on rank 0); "
           "reshard after forward %d, prefetch %d", s->cfg.L, r->G,
           mem_format(b1, sizeof b1, (double)r->z.shard_n * (double)s->e), r->f->reshard,
           r->f->prefetch);
    if (r->R > 1) printf("; HSDP: %d shard groups of %d", r->R, r->G);
    if (K > 1) printf("; %d micro-batches of %d%s", K, r->Bm, r->f->no_sync ? " (no_sync)" : "");
    printf("\n");
}

// Gathered bytes alive at most during each phase: the plan walked as the runtime walks it (the
// queue issued up to each op's own entries + prefetch, the reshard rule's frees).
static void gathered_formula(const FsdpRun *r, double out[PH_N]) {
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
static void grads_formula(const FsdpRun *r, double out[PH_N]) {
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

void fsdp6_figures(const FsdpRun *r, double *mine, const DistCounters *cost, int nrun) {
    const Session *s = r->s;
    for (int ph = 0; ph < PH_N; ph++)
        for (int c = 0; c < C_N; c++) mine[F_PEAK + ph * C_N + c] = r->peak[ph][c];
    gathered_formula(r, mine + F_XGATH);
    grads_formula(r, mine + F_XGRADS);
    // the sharded state (ZeRO-3's: every state sharded) of my by-unit shard
    const CalcModel cm = calc_model_from_gpt2(&s->cfg);
    int64_t *units = lab_xmalloc((size_t)(cm.L + 2) * sizeof(int64_t));
    const int nu = calc_gpt2_units(&cm, units);
    const int64_t mine_n = calc_unit_shard(units, nu, r->G, s->rank % r->G);
    free(units);
    CalcBreakdown x = calc_shard_state(calc_param_count(&cm), mine_n, 3,
                                       s->bf16 ? CALC_BF16 : CALC_FP32);
    mine[F_XSTATE + 0] = x.params;
    mine[F_XSTATE + 1] = x.master;
    mine[F_XSTATE + 2] = x.m;
    mine[F_XSTATE + 3] = x.v;
    const DistPerStep p = dist_counters_per_step(cost, nrun > 0 ? nrun : 1);
    static const DistOpKind kinds[3] = {OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE};
    for (int i = 0; i < 3; i++) {
        mine[F_CALLS + i] = p.calls[kinds[i]];
        mine[F_BYTES + 2 * i] = p.sent[kinds[i]];
        mine[F_BYTES + 2 * i + 1] = p.recv[kinds[i]];
    }
    mine[F_XCALLS + 0] = calc_fsdp_all_gathers(s->cfg.L, r->f->reshard, r->K);
    mine[F_XCALLS + 1] = calc_fsdp_reduce_scatters(s->cfg.L, r->K, r->f->no_sync);
    mine[F_SENT] = p.sent_all;
    mine[F_RECV] = p.recv_all;
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

static void print_tables(const FsdpRun *r, const double *all) {
    Session *s = r->s;
    const int N = s->N, L = s->cfg.L;
    session_print_throughput(s, 1);
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
           r->f->reshard ? "(2L+3)" : "(L+2)", K, calc_fsdp_all_gathers(L, r->f->reshard, 1),
           r->f->no_sync ? "1" : "K", r->f->no_sync ? 1 : K,
           calc_fsdp_reduce_scatters(L, 1, 0));
    const int64_t psi = (int64_t)s->n, head = (int64_t)r->z.p[nu - 1].unit_size;
    {
        // bytes by the ring formulas of dist.h: each gather of unit u sends n_u - c_(r+1) elements
        char b1[32], b2[32];
        double ag, rs;
        calc_fsdp_wire_bytes(psi, head, r->G, K, r->f->reshard, r->f->no_sync, (double)s->e, &ag,
                             &rs);
        printf("  about (N dividing every unit): all-gather %s, reduce-scatter %s per rank and "
               "step%s\n", mem_format(b1, 32, ag), mem_format(b2, 32, rs),
               r->R > 1 ? "; + the replicas' all-reduce of every piece (HSDP)" : "");
    }
    if (K > 1) {
        // FSDP's two accumulation modes side by side: this run's figures and the other's formula
        const double e = (double)s->e, sn = (double)r->z.shard_n;
        double ag, sync_rs, nosync_rs;
        calc_fsdp_wire_bytes(psi, head, r->G, K, r->f->reshard, 0, e, &ag, &sync_rs);
        calc_fsdp_wire_bytes(psi, head, r->G, K, r->f->reshard, 1, e, &ag, &nosync_rs);
        char b1[32], b2[32];
        printf("\nGradient accumulation over %d micro-batches, rank 0 (the other mode by formula):\n", K);
        printf("  %-34s %18s %16s\n", "mode", "reduce-scatter/st", "grads peak");
        double meas_rs = all[F_BYTES + 2], meas_g = all[F_PEAK + PH_BWD * C_N + C_GRADS];
        double nosync_g = e * (sn + (double)psi);
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

void fsdp6_report(const FsdpRun *r, const double *all, const LabArgs *args) {
    Session *s = r->s;
    const int N = s->N;
    if (!args->quiet && session_steps_run(s) > 0) print_tables(r, all);
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
            for (int ph = 0; ph < PH_N; ph++)
                for (int c = 0; c < 2; c++)
                    results_setf(&out, a[F_PEAK + ph * C_N + cc[c]], "%s_%s_%s", tag, pk[ph], ck[c]);
            static const char *sk[4] = {"params", "master", "opt_m", "opt_v"};
            static const int sc[4] = {C_PARAMS, C_MASTER, C_OPT_M, C_OPT_V};
            for (int c = 0; c < 4; c++) results_setf(&out, a[F_PEAK + PH_BWD * C_N + sc[c]], "%s_%s", tag, sk[c]);
            static const char *nk[9] = {"ag_calls", "rs_calls", "ar_calls", "ag_sent", "ag_recv",
                                        "rs_sent", "rs_recv", "ar_sent", "ar_recv"};
            for (int c = 0; c < 9; c++) results_setf(&out, a[F_CALLS + c], "%s_%s", tag, nk[c]);
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
}


void fsdp6_print_links(const FsdpRun *r) {
    const Session *s = r->s;
    if (!dist_links_enabled()) return;
    if (r->R > 1) {  // (HSDP: two DP groups, which the calculator does not describe)
        if (s->rank == 0 && !s->args->quiet)
            printf("\nlink time per step: not tabulated with --shard-group (HSDP's shard and "
                   "replicate groups are not chapter 00's layouts)\n");
        return;
    }
    // 06's layout as chapter 00's calculator sees it: FSDP's pieces of every unit over every
    // rank, --grad-accum micro-batches, each unit gathered around its uses (twice, or once with
    // --reshard-after-forward 0) and reduce-scattered after every micro-batch (--no-sync: the
    // last); the loss rides in the norm's all-reduce
    CalcSetup cs = calc_setup_lab(s->N, 1, 1, 1, r->K, s->args->batch, s->T, 3,
                                  s->bf16 ? CALC_BF16 : CALC_FP32);
    cs.grads_whole = 0, cs.fsdp = 1, cs.unit_shards = r->f->no_sync ? 2 : 1, cs.loss_in_norm = 1;
    cs.keep_gathered = !r->f->reshard;
    session_print_links(s, &cs, 0, s->rank);
}
