// report.c: chapter 09's setup lines, per-rank table and --dump figures (report3d.h); every
// formula column from chapter 00's calculator (common/calc.h).
#include "report3d.h"

#include <stdio.h>

#include "calc.h"
#include "mem.h"
#include "results.h"

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
    CalcSetup cs = calc_setup_lab(v->dp, v->tp, v->pp, v->v, v->m, s->args->batch, s->T,
                                        v->zero, s->bf16 ? CALC_BF16 : CALC_FP32);
    cs.sp = v->sp;
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
    // (results hold 64 figures: 7 per rank for ranks 0..7; not session_dump_close, whose 8
    // memory figures, rank 0's alone, would not fit)
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
    results_write(s->args->dump, &out);
    results_free(&out);
}
