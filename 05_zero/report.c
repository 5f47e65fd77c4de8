// report.c: chapter 05's tables and --dump figures (report.h); every formula column from the
// calculator (common/calc.h: calc_shard_state, calc_zero_wire_bytes, calc_zero2_grad_bytes).
#include "zero5_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "calc.h"
#include "check.h"
#include "mem.h"
#include "results.h"

const char *const ZERO5_STAGE_NAME[4] = {"ZeRO-0 (DDP)", "ZeRO-1", "ZeRO-2", "ZeRO-3"};

// Elements rank q owns (stage 0: everything; else its flat piece of Ψ, calc_piece).
static int64_t my_shard(const Zero5View *v, int q) {
    const int64_t psi = (int64_t)v->z->n;
    return v->stage == 0 ? psi : calc_piece(psi, v->z->N, q);
}

void zero5_banner(const Zero5View *v, const LabArgs *args) {
    Session *s = v->s;
    if (args->quiet || s->rank != 0) return;
    char model[128], b1[32];
    printf("%s on %d rank%s: %s (%s), device %s\n", ZERO5_STAGE_NAME[v->stage], s->N,
           s->N > 1 ? "s" : "", session_model_line(s, model, sizeof model),
           s->bf16 ? "bf16" : "fp32", s->model.k->name);
    printf("partition: the flat buffer (embedding, %d blocks, head) cut in %d shards by "
           "shard_range(Ψ, N, r): %zu elements on rank 0 (%s of fp32)", s->cfg.L, v->z->N,
           v->z->shard_n, mem_format(b1, sizeof b1, 4.0 * (double)v->z->shard_n));
    if (v->stage == 2)
        printf("; %d buckets of %zu elements, %d alive at most", v->nbuckets, v->bucket,
               v->in_flight);
    printf("\n");
}

void zero5_figures(const Zero5View *v, double *mine, const DistCounters *save_cost) {
    const Session *s = v->s;
    const int nrun = session_steps_run(s);
    const DistPerStep p = dist_counters_per_step(save_cost, nrun > 0 ? nrun : 1);
    mine[Z5_RS_SENT] = p.sent[OP_REDUCE_SCATTER];
    mine[Z5_RS_RECV] = p.recv[OP_REDUCE_SCATTER];
    mine[Z5_AG_SENT] = p.sent[OP_ALL_GATHER];
    mine[Z5_AG_RECV] = p.recv[OP_ALL_GATHER];
    mine[Z5_AR_SENT] = p.sent[OP_ALL_REDUCE];
    mine[Z5_AR_RECV] = p.recv[OP_ALL_REDUCE];
    mine[Z5_SENT] = p.sent_all;
    mine[Z5_RECV] = p.recv_all;
    mine[Z5_STEP] = nrun ? session_elapsed(s) / nrun : 0;
    static const MemCategory cats[] = {MEM_PARAMS, MEM_GRADS, MEM_MASTER, MEM_OPT_M, MEM_OPT_V,
                                       MEM_ACTS, MEM_COMM};
    for (int i = 0; i < 7; i++) mine[Z5_PARAMS + i] = (double)mem_peak(cats[i]);
    mine[Z5_TOTAL] = (double)mem_total_peak();
    // the formulas: the model states of my shard at this stage
    CalcBreakdown x = calc_shard_state((int64_t)v->z->n, my_shard(v, s->rank), v->stage,
                                       s->bf16 ? CALC_BF16 : CALC_FP32);
    mine[Z5_XPARAMS] = x.params;
    mine[Z5_XGRADS] = x.grads;
    mine[Z5_XMASTER] = x.master;
    mine[Z5_XOPT_M] = x.m;
    mine[Z5_XOPT_V] = x.v;
}

// DDP's model state over each stage's: on this run's N, and as N grows without end (the shard
// Ψ/N -> 0: what is left is what the stage does not shard), in this run's dtype and in the
// notes' (bf16 mixed precision, K = 12: 2 + 2 + 12 bytes per parameter). The notes' "4x" and
// "8x" are ZeRO-1's and ZeRO-2's limits there; a run on a few ranks is far from them, because
// the unsharded part (ZeRO-1: params and grads, 4 of 16 bytes; ZeRO-2: params, 2 of 16) is all
// that remains only when N is large. ddp_at_n: calc_shard_state's totals of rank 0's piece.
static void print_savings(int64_t psi, int N, CalcDtype dtype, const double *at_n) {
    const int bf16 = dtype == CALC_BF16;
    const char *dt = bf16 ? "bf16" : "fp32";
    char h1[32], h2[32];
    snprintf(h1, sizeof h1, "N = %d (%s)", N, dt);
    snprintf(h2, sizeof h2, "N -> inf (%s)", dt);
    printf("\nSaving: DDP's model state / the stage's (calculator, rank 0's piece):\n");
    printf("  %-12s %14s %16s%s\n", "", h1, h2, bf16 ? "" : "  N -> inf (bf16, K = 12)");
    for (int st = 1; st < 4; st++) {
        char cell[3][32];
        const CalcDtype dts[2] = {dtype, CALC_BF16};
        snprintf(cell[0], sizeof cell[0], "%.2fx", at_n[0] / at_n[st]);
        for (int k = 0; k < 2; k++) {  // the shard Ψ/N -> 0: what the stage does not shard
            const double lim = calc_shard_state(psi, 0, st, dts[k]).total;
            if (lim > 0)
                snprintf(cell[1 + k], sizeof cell[1 + k], "%.2fx",
                         calc_shard_state(psi, 0, 0, dts[k]).total / lim);
            else snprintf(cell[1 + k], sizeof cell[1 + k], "N x");
        }
        printf("  %-12s %14s %16s", ZERO5_STAGE_NAME[st], cell[0], cell[1]);
        if (!bf16) printf("  %23s", cell[2]);
        printf("\n");
    }
    printf("  the notes' 4x (ZeRO-1) and 8x (ZeRO-2) are the limits in bf16 with K = 12: what a "
           "stage does not shard\n  (ZeRO-1: params and grads, 2 + 2 of 16 B; ZeRO-2: params, 2 B) "
           "is all that is left only when N is large\n");
}

void zero5_report(const Zero5View *v, const double *all, const LabArgs *args) {
    Session *s = v->s;
    const int N = s->N;
    const CalcDtype dtype = s->bf16 ? CALC_BF16 : CALC_FP32;
    const CalcModel cm = calc_model_from_gpt2(&s->cfg);
    const int64_t psi = calc_param_count(&cm);
    int64_t *units = lab_xmalloc((size_t)(cm.L + 2) * sizeof(int64_t)), umax = 0;
    const int nu = calc_gpt2_units(&cm, units);
    for (int u = 1; u < nu; u++) umax = units[u] > umax ? units[u] : umax;
    const double e = (double)s->e;
    const int nrun = session_steps_run(s);
    if (!args->quiet && nrun > 0) {
        session_print_throughput(s, 1);
        static const char *names[] = {"params", "grads", "master", "adam m", "adam v"};
        printf("\nMemory per rank: measured peak (mem.h), '=' where it equals the formula, %s:\n"
               "  %-8s", ZERO5_STAGE_NAME[v->stage], "rank");
        for (int c = 0; c < 5; c++) printf(" %13s", names[c]);
        printf(" %11s %11s %11s\n", "acts", "comm bufs", "peak total");
        for (int r = 0; r < N; r++) {
            const double *a = all + (size_t)r * Z5_NFIELDS;
            printf("  %-8d", r);
            for (int c = 0; c < 5; c++) {
                char b1[32], cell[48];
                snprintf(cell, sizeof cell, "%s %s", mem_format(b1, sizeof b1, a[Z5_PARAMS + c]),
                         a[Z5_PARAMS + c] == a[Z5_XPARAMS + c] ? "=" : "!=");
                printf(" %13s", cell);
            }
            char b1[32], b2[32], b3[32];
            printf(" %11s %11s %11s\n", mem_format(b1, sizeof b1, a[Z5_ACTS]),
                   mem_format(b2, sizeof b2, a[Z5_COMM]), mem_format(b3, sizeof b3, a[Z5_TOTAL]));
        }
        printf("  %-8s", "formula");
        for (int c = 0; c < 5; c++) {
            char b1[32], cell[48];
            snprintf(cell, sizeof cell, "%s  ", mem_format(b1, sizeof b1, all[Z5_XPARAMS + c]));
            printf(" %13s", cell);
        }
        printf("   (rank 0's)\n");
        if (v->stage == 2) {
            // what backward holds of the gradient: my shard, the bucket buffers alive, and the
            // unit gradients the kernels write (calc_zero2_grad_bytes)
            char b1[32], b2[32], b3[32];
            printf("  grads + comm bufs, ZeRO-2: formula Ψ/N + in_flight·bucket + (embedding + "
                   "largest other unit) = %s + %d x %s + %s\n",
                   mem_format(b1, sizeof b1, all[Z5_XGRADS]), v->in_flight,
                   mem_format(b2, sizeof b2, e * (double)v->bucket),
                   mem_format(b3, sizeof b3, e * (double)(units[0] + umax)));
            for (int r = 0; r < N; r++) {
                const double *a = all + (size_t)r * Z5_NFIELDS;
                const double want = calc_zero2_grad_bytes(psi, my_shard(v, r), (int64_t)v->bucket,
                                                          v->in_flight, units[0], umax, e);
                const double got = a[Z5_GRADS] + a[Z5_COMM];
                printf("    rank %-3d measured %s %s formula %s\n", r,
                       mem_format(b1, sizeof b1, got), got == want ? "=" : "!=",
                       mem_format(b2, sizeof b2, want));
            }
        }
        const char *K = s->bf16 ? "2+2+12" : "4+4+8";
        static const char *fm[4][2] = {
            {"(2+2+K)Ψ", "(4+4+8)Ψ"}, {"2Ψ+2Ψ+KΨ/N", "4Ψ+4Ψ+8Ψ/N"},
            {"2Ψ+(2+K)Ψ/N", "4Ψ+(4+8)Ψ/N"}, {"(2+2+K)Ψ/N", "(4+4+8)Ψ/N"}};
        printf("  formula %s with bytes %s per parameter (N = %d; Ψ/N = shard_range(Ψ, N, r), "
               "uneven when N does not divide Ψ)\n", fm[v->stage][s->bf16 ? 0 : 1], K, v->stage ? N : 1);

        printf("\nBytes on the wire per rank per step (dist counters), %s:\n", ZERO5_STAGE_NAME[v->stage]);
        printf("  %-6s %13s %13s %13s %13s %13s\n", "rank", "reduce-scat", "all-gather",
               "all-reduce", "sent", "received");
        for (int r = 0; r < N; r++) {
            const double *a = all + (size_t)r * Z5_NFIELDS;
            char b[5][32];
            printf("  %-6d %13s %13s %13s %13s %13s\n", r, mem_format(b[0], 32, a[Z5_RS_SENT]),
                   mem_format(b[1], 32, a[Z5_AG_SENT]), mem_format(b[2], 32, a[Z5_AR_SENT]),
                   mem_format(b[3], 32, a[Z5_SENT]), mem_format(b[4], 32, a[Z5_RECV]));
        }
        char b1[32];
        printf("  formula: %gΨ(N-1)/N x %g B = %s per rank (+ the loss and the clipping norm, "
               "all-reduced%s)\n", v->stage == 3 ? 3.0 : 2.0, e,
               mem_format(b1, sizeof b1, calc_zero_wire_bytes(psi, v->stage, N, e)),
               v->stage == 3 ? "; the head is gathered once, its forward and backward run back "
                               "to back" : "");
        // the four stages side by side: the formula for this model on N ranks (rank 0's
        // pieces), one bar each, and this run's measured figure beside its own
        double per_stage[4];
        for (int st = 0; st < 4; st++)
            per_stage[st] = calc_shard_state(psi, calc_piece(psi, N, 0), st, dtype).total;
        const double *a0 = all;
        double held = a0[Z5_PARAMS] + a0[Z5_GRADS] + a0[Z5_MASTER] + a0[Z5_OPT_M] + a0[Z5_OPT_V];
        printf("\nModel state per rank (params + grads + master + Adam m, v) on %d ranks, rank 0; "
               "one # = 1/40 of DDP's:\n", N);
        for (int st = 0; st < 4; st++) {
            int bars = (int)lround(40.0 * per_stage[st] / per_stage[0]);
            printf("  %-12s |", ZERO5_STAGE_NAME[st]);
            for (int i = 0; i < 40; i++) putchar(i < bars ? '#' : ' ');
            char b2[32];
            printf("| %10s formula", mem_format(b1, sizeof b1, per_stage[st]));
            if (st == v->stage) printf("   <- this run: %s measured", mem_format(b2, sizeof b2, held));
            printf("\n");
        }
        printf("  (activations, %s per rank here, are not sharded by ZeRO: every rank runs its own "
               "rows through the whole model)\n", mem_format(b1, sizeof b1, a0[Z5_ACTS]));
        print_savings(psi, N, dtype, per_stage);
    }
    if (args->dump) {
        RunResults out;
        session_dump_open(s, &out);
        results_set(&out, "world_size", N);
        results_set(&out, "stage", v->stage);
        static const char *keys[] = {"params", "grads", "master", "opt_m", "opt_v", "acts", "comm"};
        const int who[2] = {0, N - 1};
        for (int i = 0; i < 2; i++) {
            const double *a = all + (size_t)who[i] * Z5_NFIELDS;
            const char *tag = i == 0 ? "first" : "last";
            for (int c = 0; c < 7; c++) results_setf(&out, a[Z5_PARAMS + c], "%s_%s", tag, keys[c]);
            static const char *bk[] = {"rs_sent", "rs_recv", "ag_sent", "ag_recv", "ar_sent",
                                       "ar_recv", "sent", "recv"};
            for (int c = 0; c < 8; c++) results_setf(&out, a[Z5_RS_SENT + c], "%s_%s", tag, bk[c]);
        }
        session_dump_close(s, &out);
    }
    free(units);
}

void zero5_print_links(const Zero5View *v) {
    const Session *s = v->s;
    // 05's layout as chapter 00's calculator sees it: ZeRO stage over every rank, one
    // micro-batch; stage 2's gradients in its buckets' reduce-scatters, stage 3's unit by unit
    // on the flat buffer's pieces (CalcSetup.unit_shards)
    CalcSetup cs = calc_setup_lab(s->N, 1, 1, 1, 1, s->args->batch, s->T, v->stage,
                                  s->bf16 ? CALC_BF16 : CALC_FP32);
    cs.grads_whole = 0;
    cs.dp_buckets = v->stage == 2 ? v->nbuckets : 0;
    cs.unit_shards = v->stage == 3;
    session_print_links(s, &cs, 0, s->rank);
}
