// report.c: chapter 09's setup lines, per-rank table and --dump figures (report3d.h); every
// formula column from chapter 00's calculator (common/calc.h).
#include "report3d.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "dist.h"
#include "mem.h"
#include "results.h"
#include "tp.h"

void r3d_print_setup(const GPT2Config *cfg, const Schedule *s, int B, int dp, int tp, int Bm) {
    const int pp = s->p, v = s->v, m = s->m, per = cfg->L / (pp * v);
    printf("\nGPT-2 V=%d T=%d L=%d C=%d NH=%d; %d stage%s x %d chunk%s of %d block%s; TP %d "
           "(%d heads per rank); batch %d = %d replica%s x %d micro-batch%s x %d\n", cfg->V, cfg->T,
           cfg->L, cfg->C, cfg->NH, pp, pp > 1 ? "s" : "", v, v > 1 ? "s" : "", per,
           per > 1 ? "s" : "", tp, cfg->NH / tp, B, dp, dp > 1 ? "s" : "", m, m > 1 ? "es" : "", Bm);
    SimResult sim;
    static const SchedTimes unit = {1.0, 1.0, 1.0, 0.0, 0.0, 0.0};
    if (sched_simulate(s, &unit, &sim) == 0) {
        printf("schedule %s over the stages (simulated, tf = tb):\n", s->name);
        sched_print(stdout, s, sim.start, sim.end, unit.tf / v / 2.0, 120);
    }
    sim_free(&sim);
    printf("\n");
}

// Chapter 00's calculator's setup of the layout this run is (calc_setup_lab, and the DP
// layer's and TP's choices): what every formula column of 09 is computed from.
static CalcSetup view_setup(const Session *s, const R3dView *v) {
    CalcSetup cs = calc_setup_lab(v->dp, v->tp, v->pp, v->v, v->m, s->args->batch, s->T, v->zero,
                                  s->bf16 ? CALC_BF16 : CALC_FP32);
    cs.fsdp = v->fsdp, cs.keep_gathered = v->keep_gathered;
    cs.sp = v->sp;
    cs.recompute = (CalcRecompute)v->recompute;  // (full: the TP group's g's twice per block)
    return cs;
}

void r3d_figures(const Session *s, const R3dView *v, double mine[R3D_NFIELDS]) {
    const Grid *g = v->g;
    const int run = session_steps_run(s);
    const double nsteps = run > 0 ? run : 1;
    // the formula: chapter 00's calculator for this layout (calc_rank_comm, 00_memory_budget/
    // comm.c), from the shapes alone: TP 4 all-reduces of (Bm·T, C) per block per micro-batch,
    // 1 for the embedding, 1 + 3 of (Bm·T) for the head and loss, 1 double for the norm; DP
    // every chunk's gradients and the loss (--zero 1: the ring reduce-scatter and all-gather,
    // the norm's parts); PP an activation forward and a gradient back per micro-batch and
    // boundary, the tied wte's gradient, the norm, the loss
    const CalcModel cm = calc_model_from_gpt2(&s->cfg);
    const CalcSetup cs = view_setup(s, v);
    const CalcComm k = calc_rank_comm(&cm, &cs, g->c.p, g->c.d);
    mine[R3D_TP_SENT] = (double)dist_group_bytes_sent(g->tpg) / nsteps;
    mine[R3D_DP_SENT] = (double)dist_group_bytes_sent(g->dpg) / nsteps;
    mine[R3D_PP_SENT] = (double)dist_group_bytes_sent(g->ppg) / nsteps;
    mine[R3D_PARAMS] = (double)mem_peak(MEM_PARAMS);
    mine[R3D_ACTS_PEAK] = (double)v->acts_peak;
    mine[R3D_OPT_M] = (double)mem_peak(MEM_OPT_M);
    mine[R3D_COORD] = (double)g->c.t + 100.0 * g->c.d + 10000.0 * g->c.p;
    mine[R3D_BLOCKS] = (double)(v->l0 + 100 * v->l1);
    mine[R3D_TP_FORMULA] = k.tp.step_bytes;
    mine[R3D_DP_FORMULA] = k.dp.step_bytes;
    mine[R3D_PP_FORMULA] = k.pp.step_bytes;
    mine[R3D_MASTER] = (double)mem_peak(MEM_MASTER);
}

void r3d_print_table(const double *all, int world, int v, int bf16) {
    printf("\n  %-5s %-9s %-8s %21s %21s %21s %11s %11s %11s\n", "rank", "(t,d,p)", "blocks",
           "TP sent/step (formula)", "DP sent/step (formula)", "PP sent/step (formula)",
           "weights", "master", "acts peak");
    for (int r = 0; r < world; r++) {
        const double *a = all + (size_t)r * R3D_NFIELDS;
        char b[8][32], co[24], blk[16], col[3][48];
        for (int i = 0; i < 3; i++)  // measured (formula), '=' when equal to the byte
            snprintf(col[i], sizeof col[i], "%s (%s%s)", mem_format(b[i], 32, a[R3D_TP_SENT + i]),
                     a[R3D_TP_SENT + i] == a[R3D_TP_FORMULA + i] ? "=" : "",
                     mem_format(b[5 + i], 32, a[R3D_TP_FORMULA + i]));
        int c = (int)a[R3D_COORD];
        snprintf(co, sizeof co, "(%d,%d,%d)", c % 100, (c / 100) % 100, c / 10000);
        snprintf(blk, sizeof blk, "[%d,%d)", (int)a[R3D_BLOCKS] % 100, (int)a[R3D_BLOCKS] / 100);
        char mb[32];
        printf("  %-5d %-9s %-8s %21s %21s %21s %11s %11s %11s\n", r, co, v > 1 ? "chunks" : blk,
               col[0], col[1], col[2], mem_format(b[3], 32, a[R3D_PARAMS]),
               a[R3D_MASTER] > 0 ? mem_format(mb, sizeof mb, a[R3D_MASTER]) : "-",
               mem_format(b[4], 32, a[R3D_ACTS_PEAK]));
    }
    printf("  sent/step: bytes this rank sent in its TP, DP and PP group per step (dist's "
           "counters); '=' when equal to the formula to the byte\n");
    if (bf16)
        printf("  bf16: weights 2 B and master 4 B per element, the blocks' saved activations "
               "2 B; TP reduces fp32, DP and PP carry bf16\n  gradients and activations (the "
               "loss and norms stay fp32): the formula is chapter 00's with dtype bf16, tp_fp32\n");
}

void r3d_write_dump(const Session *s, const double *all) {
    // (8 figures per rank for ranks 0..7, and rank 0's measured and predicted peak; not
    // session_dump_close, whose 8 memory figures, rank 0's alone, would not fit)
    static const char *keys[R3D_NFIELDS] = {
        [R3D_TP_SENT] = "tp_sent", [R3D_DP_SENT] = "dp_sent", [R3D_PP_SENT] = "pp_sent",
        [R3D_PARAMS] = "mem_params", [R3D_ACTS_PEAK] = "acts_peak", [R3D_OPT_M] = "mem_opt_m",
        [R3D_COORD] = "coord", [R3D_MASTER] = "mem_master"};
    RunResults out;
    session_dump_open(s, &out);  // the losses, the final weights
    for (int r = 0; r < s->N && r < 8; r++)
        for (int k = 0; k < R3D_NFIELDS; k++) {
            if (!keys[k]) continue;
            char key[32];
            snprintf(key, sizeof key, "%s_r%d", keys[k], r);
            results_set(&out, key, all[(size_t)r * R3D_NFIELDS + k]);
        }
    results_set_peak(&out);
    results_write(s->args->dump, &out);
    results_free(&out);
}

void r3d_print_links(const Session *s, const R3dView *v, int pp_first) {
    // the table is the loop's (session_print_links): this layout as chapter 00's calculator sees
    // it, where the ranks sit, and this rank's place in the grid
    CalcSetup cs = view_setup(s, v);
    cs.grid_order = pp_first ? CALC_ORDER_PP_FIRST : CALC_ORDER_TP_FIRST;
    cs.sp_seq_calls = 1;  // (tp.c: SP's collectives one call per sequence)
    session_print_links(s, &cs, v->g->c.p, v->g->c.d);
}

MemPrediction r3d_predict_memory(const void *ctx, const LabArgs *args, int batch, int rank) {
    const R3dLayout *L = ctx;
    const GPT2Config cfg = lab_args_config(args);
    const int bf16 = strcmp(args->dtype, "bf16") == 0;
    const GPT2Dtype dt = bf16 ? GPT2_BF16 : GPT2_FP32;
    const double w = bf16 ? 2.0 : 4.0;
    const int d = (rank / L->tp) % L->dp, p = rank / (L->tp * L->dp), t = rank % L->tp;
    const int Bm = batch / (L->dp * L->m), S = L->pp * L->v, per = cfg.L / S;
    // the model state: the calculator's, to the byte (the pieces ZeRO and FSDP keep)
    const CalcModel cm = calc_model_from_gpt2(&cfg);
    CalcSetup cs = calc_setup_lab(L->dp, L->tp, L->pp, L->v, L->m, batch, cfg.T, L->zero,
                                  bf16 ? CALC_BF16 : CALC_FP32);
    cs.fsdp = L->fsdp, cs.keep_gathered = L->keep_gathered;
    const CalcBreakdown b = calc_rank_memory(&cm, &cs, p, d);
    MemPrediction step = {b.params + b.grads + b.master + b.m + b.v, 0, 0};
    // the activations: the most the table keeps at once (tp 1: gpt2's sets, 08's count), and
    // what a TP slice's sets share (tp_build)
    double shared = 0, whole = 0, unit_max = 0, units_all = 0;
    double *set = calloc((size_t)L->v, sizeof(double));
    int64_t *u = calloc((size_t)per + 3, sizeof(int64_t));
    for (int c = 0; c < L->v; c++) {
        const int vs = c * L->pp + p;
        const TpShape sh = {.l0 = vs * per, .l1 = (vs + 1) * per, .tp = L->tp, .r = t, .sp = L->sp, .B = Bm,
                            .T = cfg.T, .recompute = L->recompute};  // (shared: + its recompute layer)
        if (L->tp > 1) {
            set[c] = (double)tp_acts_bytes(&cfg, sh, dt) + (L->s->split ? (double)tp_wsave_bytes(&cfg, sh) : 0);
            shared += (double)tp_shared_bytes(&cfg, sh, dt);
        }
        whole += (double)calc_stage_params(&cm, L->tp, S, vs);
        const int nu = calc_chunk_units(&cm, L->tp, S, vs, u);
        for (int i = 0; i < nu; i++) {
            units_all += (double)u[i];
            if ((double)u[i] > unit_max) unit_max = (double)u[i];
        }
    }
    if (L->tp == 1) {
        step.acts = calc_pipe_peak_bytes_recompute(&cfg, L->s, p, Bm, cfg.T, dt, L->recompute) +
                    L->v * calc_recompute_scratch_bytes(&cfg, Bm, cfg.T, L->recompute);
    } else {
        double cur = 0, most = 0;
        for (int j = 0; j < L->s->nops[p]; j++) {
            const PipeOp o = L->s->ops[p][j];
            // (a split table's set lives from its F to its W, with what W reads from B)
            const int frees = L->s->split ? o.kind == PIPE_W : o.kind == PIPE_B;
            cur += o.kind == PIPE_F ? set[o.chunk] : frees ? -set[o.chunk] : 0;
            if (cur > most) most = cur;
        }
        step.acts = most + shared;
    }
    // a bf16 chunk's fp32 work buffers hold its largest piece (gpt2.c: the slice's embedding,
    // one block, or the head with wte's rows), whichever chunk it is
    int64_t *all = calloc((size_t)cfg.L + 3, sizeof(int64_t));
    calc_chunk_units(&cm, L->tp, 1, 0, all);
    const double head_piece = (double)((cfg.V + L->tp - 1) / L->tp) * cfg.C + 2.0 * cfg.C;
    double piece = (double)(all[0] > all[1] ? all[0] : all[1]);
    if (head_piece > piece) piece = head_piece;
    free(set), free(u), free(all);
    // the buffers: the batch, losses and kernels' scratch (a slice reads the batch in place; gpt2's
    // sets copy it, every set alive), bf16's work buffers of each chunk, the executor's messages
    // (2 v m of Bm·T·C floats, bf16 their wire copies), ZeRO-3 / FSDP's gathered units (the
    // ops in the prefetch window: one more unit than ops, the head reading two; or every unit)
    const double BT = (double)Bm * cfg.T, msg = BT * cfg.C, sets = (double)L->m * L->v;
    step.buffers = mem_predict_scratch(&cfg, Bm, bf16, L->v * piece) +
                   (L->tp == 1 ? (sets - 1.0) * 3.0 * BT * 4.0 : -3.0 * BT * 4.0) +
                   2.0 * sets * msg * 4.0 + (bf16 ? (2.0 * sets + 1.0) * msg * 2.0 : 0.0);
    if (L->zero == 3)
        step.buffers += (L->keep_gathered ? units_all : (L->prefetch + 2.0) * unit_max) * w;
    if (L->zero != 3) return step;  // (the setup allocates what the step holds, less)
    // the setup: every chunk built whole (weights, gradients) before ZeRO-3 / FSDP cut it, its
    // pieces, master and Adam's state allocated next to it
    // (and, at tp 1, each chunk's recompute scratch: gpt2_set_recompute comes before the cut)
    const double rc_scratch =
        L->tp == 1 ? L->v * calc_recompute_scratch_bytes(&cfg, Bm, cfg.T, L->recompute) : 0;
    MemPrediction setup = {whole * 2.0 * w + b.params + b.master + b.m + b.v, shared + rc_scratch, 0};
    return mem_prediction_total(setup) > mem_prediction_total(step) ? setup : step;
}
