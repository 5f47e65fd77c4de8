// report.c: what chapter 08 prints and measures around its training loop (pipe_report.h): the
// schedules side by side, the run's header and table, each step's op times, and the report
// after training, its formula columns from the calculator (common/calc.h, "pipeline").
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "mem.h"
#include "pipe_report.h"
#include "results.h"

static const SchedTimes UNIT_TIMES = {1.0, 1.0, 1.0, 0.0, 0.0, 0.0};  // tf = tb = tw

// ---------------------------------------------------------------------------------------------
// the four schedules side by side (simulated)

// unit: the time of one column of the picture.
static void print_schedule(const Schedule *s, const SchedTimes *t, double unit, int cols,
                           int picture) {
    SimResult r;
    char err[256];
    if (sched_check(s, err, sizeof err) != 0) lab_fail("schedule %s: %s", s->name, err);
    if (sched_simulate(s, t, &r) != 0) lab_fail("schedule %s: %s", s->name, r.err);
    if (picture) sched_print(stdout, s, r.start, r.end, unit, cols);
    double worst = 0;
    int peak = 0;
    for (int k = 0; k < s->p; k++) worst = fmax(worst, r.bubble[k]), peak = peak > r.peak_inflight[k] ? peak : r.peak_inflight[k];
    printf("  %-12s v=%d  makespan %6.2f  bubble %6.2f %%  theory %6.2f %%  peak sets (stage 0) %d, "
           "most on any stage %d", s->name, s->v, r.makespan, 100 * worst,
           100 * sched_theory_bubble(s, t), r.peak_inflight[0], peak);
    int wpeak = 0;
    for (int k = 0; k < s->p; k++) wpeak = wpeak > sched_peak_wstores(s, k) ? wpeak : sched_peak_wstores(s, k);
    if (s->split) printf("; W stores: most on any stage %d", wpeak);
    printf("\n");
    sim_free(&r);
}

void pipe8_compare(int p, int m, int v, int max_w, int cols) {
    const char *names[4] = {"gpipe", "1f1b", "interleaved", "zb"};
    // one time scale for the four pictures, so that their widths compare as their makespans
    // do: a column is half an op of the finest schedule (interleaved's chunk, 1/vi of a layer
    // set's forward), every label still fits its op
    const int vi = v > 1 ? v : 2, inter = m % p == 0;
    const double unit = UNIT_TIMES.tf / (inter ? vi : 1) / 2.0;
    printf("the four schedules, p = %d stages, m = %d micro-batches, simulated with tf = tb = tw "
           "(1F1B's B = tb + tw), free communication; one column = tf/%d in every picture:\n",
           p, m, inter ? 2 * vi : 2);
    for (int i = 0; i < 4; i++) {
        Schedule s;
        if (i == 2 && m % p != 0) {
            printf("  %-12s (skipped: m = %d is not a multiple of p = %d)\n", names[i], m, p);
            continue;
        }
        if (i == 3 && max_w > 0) sched_zb_h1_capped(&s, p, m, max_w);
        else sched_make(&s, names[i], p, i == 2 ? (v > 1 ? v : 2) : 1, m);
        printf("\n");
        print_schedule(&s, &UNIT_TIMES, unit, cols, 1);
        sched_free(&s);
    }
}

void pipe8_print_setup(const Schedule *s, const GPT2Config *cfg, int B, int Bm, const char *dtype,
                       const char *device, int cols) {
    const int p = s->p, v = s->v, S = p * v, per = cfg->L / S, m = s->m;
    printf("pipeline: %d stage%s x %d chunk%s = %d virtual stages of %d block%s; GPT-2 V=%d "
           "T=%d L=%d C=%d NH=%d, %s, device %s\n", p, p > 1 ? "s" : "", v, v > 1 ? "s" : "",
           S, per, per > 1 ? "s" : "", cfg->V, cfg->T, cfg->L, cfg->C, cfg->NH, dtype, device);
    printf("schedule %s, %d micro-batches of %d x %d (batch %d); each micro-batch's loss "
           "counts 1/%d\n", s->name, m, Bm, cfg->T, B, m);
    printf("\nthe table, simulated with tf = tb = tw (unit: half a chunk's forward):\n");
    SimResult sim;
    LAB_CHECK(sched_simulate(s, &UNIT_TIMES, &sim) == 0, "%s", sim.err);  // (validated)
    sched_print(stdout, s, sim.start, sim.end, UNIT_TIMES.tf / v / 2.0, cols);
    sim_free(&sim);
}

// ---------------------------------------------------------------------------------------------
// the clock: each step's op times

void pipe8_clock_init(PipeClock *c, const Schedule *s, DistGroup *g, int start, int end) {
    *c = (PipeClock){.s = s, .g = g, .rank = g->rank, .start = start, .end = end};
    // --links: the clock's barrier and span on a copy of the group, so that dist holds them
    // apart from the pipeline's messages (the link table counts the training's traffic)
    if (dist_links_enabled()) c->g = dist_split(g, 0, g->rank, "clock"), c->own_g = 1;
    for (int k = 0; k < 3; k++) c->op[k] = lab_xcalloc((size_t)end + 1, sizeof(double));
    c->span = lab_xcalloc((size_t)end + 1, sizeof(double));
    dist_counters_reset();
}

void pipe8_clock_begin(PipeClock *c) {
    dist_barrier(c->g);  // the stages start the step together: the timeline's zero
    c->t0 = lab_now();
    c->sent0 = dist_counters()->sent[OP_SEND];
}

void pipe8_clock_end(PipeClock *c, const PipeExec *x, int step) {
    const Schedule *s = c->s;
    const int rank = c->rank;
    c->sent_sum += (double)(dist_counters()->sent[OP_SEND] - c->sent0);
    // this step's times: the ops' (waits left out), and the span from the first stage's
    // start to the last stage's end (all ranks share one monotonic clock on one machine)
    double opsum[3] = {0, 0, 0}, tend = x->op_end[s->nops[rank] - 1];
    for (int j = 0; j < s->nops[rank]; j++) opsum[s->ops[rank][j].kind] += x->op_end[j] - x->op_start[j];
    double span[2] = {-c->t0, tend};  // the max of -t0 is -(the earliest start)
    dist_all_reduce(span, span, 2, DIST_F64, DIST_MAX, c->g);
    double tmin = -span[0], tmax = span[1];
    if (step > c->start || c->end - c->start == 1) {  // the first step warms caches and allocators
        // a slot per step (a step run again after a rollback, --on-spike, takes its slot back)
        const int i = step - c->start - (c->end - c->start > 1);
        for (int k = 0; k < 3; k++) c->op[k][i] = opsum[k];
        c->span[i] = tmax - tmin;
        if (i >= c->n) c->n = i + 1;
    }
    if (step == c->end - 1) {
        c->pic_start = lab_xcalloc((size_t)s->nops[rank] + 1, sizeof(double));
        c->pic_end = lab_xcalloc((size_t)s->nops[rank] + 1, sizeof(double));
        for (int j = 0; j < s->nops[rank]; j++)
            c->pic_start[j] = x->op_start[j] - tmin, c->pic_end[j] = x->op_end[j] - tmin;
    }
}

double pipe8_clock_step_time(PipeClock *c, int step) {
    double t = lab_now() - c->t0;
    if (step > c->start) c->t_steps += t;
    return t;
}

void pipe8_clock_free(PipeClock *c) {
    for (int k = 0; k < 3; k++) free(c->op[k]);
    free(c->span), free(c->pic_start), free(c->pic_end);
    if (c->own_g) dist_group_free(c->g);
}

// ---------------------------------------------------------------------------------------------
// the report

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of x[0 .. n) (x is left as it is): a step disturbed by another process on the
// machine moves the mean of the steps' times, hardly their median.
static double median(const double *x, int n) {
    if (n == 0) return 0;
    double *y = lab_xmalloc((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    qsort(y, (size_t)n, sizeof *y, cmp_double);
    double med = n % 2 ? y[n / 2] : 0.5 * (y[n / 2 - 1] + y[n / 2]);
    free(y);
    return med;
}

enum { F_BUBBLE, F_TF, F_TB, F_TW, F_BUSY, F_PEAK_SETS, F_PEAK_SETS_SCHED, F_PEAK_BYTES,
       F_PEAK_BYTES_FORMULA, F_SENT, F_SENT_FORMULA, F_L0, F_L1, F_PEAK_W, F_PEAK_W_SCHED,
       F_NFIELDS };

// The bubble, measured and simulated, on rank 0, every figure from the medians the table
// prints: per stage, its median op times per step and busy = their sum (F_*), its idle share
// 1 - busy / step of the median step (span: each step's), and the simulator's prediction from
// those op times (free links: what the table alone makes of them). Then the split of schedule.h
// (sched_bubble_split) of the same medians: the bottleneck (the busiest stage), its idle share
// (the schedule's bubble, which (p-1)/(m+p-1) predicts) and the load imbalance 1 - busy_min /
// busy_max. (Medians, not means: a step disturbed by another process moves the mean; and the
// split of the medians, not the median of each step's split, so that every derived figure
// follows from the printed ones.) all: the F_* fields of every stage; F_BUBBLE is set here.
typedef struct TimeReport {
    double sim_bubble[SCHED_MAX_STAGES];
    BubbleSplit meas, sim;
    double step, sim_step;  // median span; simulated makespan (s)
} TimeReport;

static TimeReport time_report(const Schedule *s, double *all, const double *span, int n) {
    const int p = s->p;
    TimeReport rep = {.step = median(span, n)};
    SchedTimes t[SCHED_MAX_STAGES];
    double busy[SCHED_MAX_STAGES];
    for (int r = 0; r < p; r++) {  // op times per micro-batch of the whole stage
        double *a = all + (size_t)r * F_NFIELDS;
        t[r] = (SchedTimes){.tf = a[F_TF] / s->m, .tb = a[F_TB] / s->m, .tw = a[F_TW] / s->m};
        busy[r] = a[F_BUSY];
        a[F_BUBBLE] = rep.step > 0 ? 1.0 - busy[r] / rep.step : 0;  // the "idle" column
    }
    SimResult sim;
    if (sched_simulate_stages(s, t, &sim) == 0) {
        for (int r = 0; r < p; r++) rep.sim_bubble[r] = sim.bubble[r];
        rep.sim = sim.split;
        rep.sim_step = sim.makespan;
    }
    sim_free(&sim);
    rep.meas = sched_bubble_split(busy, p, rep.step);
    return rep;
}

static void print_time_report(const Schedule *s, const double *all, const TimeReport *rep,
                              double theory) {
    printf("\n  time per step, ms (medians over the steps after the first):\n");
    printf("  %-6s %-8s %8s %8s %8s %8s %9s %9s %9s\n", "stage", "blocks", "F", "B", "W",
           "busy", "idle", "simulated", "theory");
    for (int r = 0; r < s->p; r++) {
        const double *a = all + (size_t)r * F_NFIELDS;
        char blk[16], w[16] = "-";
        snprintf(blk, sizeof blk, "[%d,%d)", (int)a[F_L0], (int)a[F_L1]);
        if (s->split) snprintf(w, sizeof w, "%.2f", 1e3 * a[F_TW]);
        printf("  %-6d %-8s %8.2f %8.2f %8s %8.2f %8.1f%% %8.1f%% %8.1f%%\n", r,
               s->v > 1 ? "chunks" : blk, 1e3 * a[F_TF], 1e3 * a[F_TB], w, 1e3 * a[F_BUSY],
               100 * a[F_BUBBLE], 100 * rep->sim_bubble[r], 100 * theory);
    }
    printf("  step %.2f ms (simulated from the op times above, free links: %.2f ms)\n",
           1e3 * rep->step, 1e3 * rep->sim_step);
    printf("  bottleneck stage %d: bubble %.2f %% (simulated %.2f %%, theory %.2f %%), "
           "imbalance %.2f %% (simulated %.2f %%)\n", rep->meas.bottleneck,
           100 * rep->meas.bubble, 100 * rep->sim.bubble, 100 * theory,
           100 * rep->meas.imbalance, 100 * rep->sim.imbalance);
    printf("  idle = 1 - busy / step, per stage. The step lasts as long as the busiest stage (the\n"
           "  bottleneck) works, plus its own idle time, the schedule's bubble: that is what the\n"
           "  theory predicts for equal stages. Any other stage r idles 1 - (busy_r / busy_max)\n"
           "  (1 - bubble): more, from the load imbalance (1 - busy_r / busy_max, at most 1 -\n"
           "  busy_min / busy_max), which a balanced split of the work would remove. Every figure\n"
           "  here follows from the medians above (bubble = the bottleneck's idle, imbalance = 1 -\n"
           "  busy_min / busy_max). simulated: the table run on each stage's measured op times,\n"
           "  messages free; theory: %s\n",
           s->split ? "ZB-H1's formula, tf = tb = tw" : "(p-1)/(v m + p-1)");
}

// The last step's measured timeline (tl_all: per stage, maxops starts then maxops ends).
static void print_last_step(const Schedule *s, double *tl_all, int maxops, int cols) {
    double *st[SCHED_MAX_STAGES], *en[SCHED_MAX_STAGES], fsum = 0;
    int fn = 0;
    for (int r = 0; r < s->p; r++) {
        st[r] = tl_all + (size_t)r * 2 * maxops;
        en[r] = st[r] + maxops;
        for (int j = 0; j < s->nops[r]; j++)
            if (s->ops[r][j].kind == PIPE_F) fsum += en[r][j] - st[r][j], fn++;
    }
    printf("\nthe last step as it ran (unit: half the mean forward, %.2f ms):\n",
           1e3 * fsum / fn / 2);
    sched_print(stdout, s, st, en, fsum / fn / 2, cols);
}

// Per stage: sets and W stores alive, measured / from the table; the activation bytes and the
// bytes sent, measured and by the calculator's formulas.
static void print_memory_report(const Schedule *s, const double *all) {
    printf("\n  memory and messages:\n");
    printf("  %-6s %-8s %11s %11s %12s %12s %12s %12s\n", "stage", "blocks",
           "sets sched", "W st sched", "acts peak", "formula", "sent/step", "formula");
    for (int r = 0; r < s->p; r++) {
        const double *a = all + (size_t)r * F_NFIELDS;
        char b1[32], b2[32], b3[32], b4[32], blk[16], wst[24] = "-";
        snprintf(blk, sizeof blk, "[%d,%d)", (int)a[F_L0], (int)a[F_L1]);
        if (s->split)
            snprintf(wst, sizeof wst, "%d/%d", (int)a[F_PEAK_W], (int)a[F_PEAK_W_SCHED]);
        printf("  %-6d %-8s %5d/%-5d %11s %12s %12s %12s %12s\n", r,
               s->v > 1 ? "chunks" : blk, (int)a[F_PEAK_SETS], (int)a[F_PEAK_SETS_SCHED], wst,
               mem_format(b1, sizeof b1, a[F_PEAK_BYTES]),
               a[F_PEAK_BYTES_FORMULA] >= 0 ? mem_format(b2, sizeof b2, a[F_PEAK_BYTES_FORMULA]) : "-",
               mem_format(b3, sizeof b3, a[F_SENT]), mem_format(b4, sizeof b4, a[F_SENT_FORMULA]));
    }
    printf("  sets: activation sets alive at once (F .. B), measured / from the table; W st: "
           "ZB-H1's W stores (what W reads, B .. W);\n"
           "  acts peak: MEM_ACTS above the step's start, at op boundaries\n");
}

// --dump: losses, final weights (session_dump_open), and the figures (stages 0..3: results.c
// holds 64). Not session_dump_close: its 8 memory figures, rank 0's alone, would not fit with
// 4 stages' figures.
static void write_dump(const PipeRun *run, const double *all, const TimeReport *tr,
                       double theory) {
    const Schedule *s = run->s;
    RunResults out;
    session_dump_open(run->ses, &out);
    results_set(&out, "stages", s->p);
    results_set(&out, "chunks", s->v);
    results_set(&out, "micro_batches", s->m);
    results_set(&out, "bubble_theory", theory);
    results_set(&out, "bottleneck", tr->meas.bottleneck);
    results_set(&out, "bubble_bottleneck", tr->meas.bubble);
    results_set(&out, "imbalance", tr->meas.imbalance);
    results_set(&out, "bubble_bottleneck_sim", tr->sim.bubble);
    results_set(&out, "imbalance_sim", tr->sim.imbalance);
    // (the op times per stage stay out: results.c holds 64 figures, 4 stages' worth)
    static const char *keys[F_NFIELDS] = {"bubble", NULL, NULL, NULL, NULL,
        "peak_sets", "peak_sets_sched", "peak_act_bytes", "peak_act_bytes_formula",
        "sent_per_step", "sent_per_step_formula", "l0", "l1", "peak_wstores",
        "peak_wstores_sched"};
    for (int r = 0; r < s->p && r < 4; r++) {
        for (int k = 0; k < F_NFIELDS; k++)
            if (keys[k]) results_setf(&out, all[(size_t)r * F_NFIELDS + k], "%s_r%d", keys[k], r);
        results_setf(&out, tr->sim_bubble[r], "bubble_sim_r%d", r);
    }
    results_set_peak(&out);  // rank 0's peak memory, measured and predicted (mem_predict.h)
    results_write(run->ses->args->dump, &out);
    results_free(&out);
}

// --links: the pipeline's link time per step against chapter 00's calculator and the planner
// (session_print_links): 08's layout is PP p x v chunks, m micro-batches of Bm, one replica.
static void print_links(const PipeRun *run, const PipeClock *c) {
    const Schedule *s = run->s;
    const Session *ses = run->ses;
    CalcSetup cs = calc_setup_lab(1, 1, s->p, s->v, s->m, run->B, run->T, 0,
                                  run->dtype == GPT2_BF16 ? CALC_BF16 : CALC_FP32);
    cs.split = s->split;
    session_print_links(ses, &cs, c->rank, 0);
}

void pipe8_report(const PipeRun *run, const PipeClock *c) {
    const Schedule *s = run->s;
    const PipeExec *x = run->x;
    DistGroup *g = c->g;
    const int rank = c->rank, p = s->p, v = s->v, m = s->m, start = c->start, end = c->end;
    const int B = run->B, Bm = run->Bm, T = run->T;
    // the figures of every rank, to rank 0
    double mine[F_NFIELDS] = {0};  // (F_BUBBLE: rank 0's time_report, from the medians)
    mine[F_TF] = median(c->op[PIPE_F], c->n);
    mine[F_TB] = median(c->op[PIPE_B], c->n);
    mine[F_TW] = median(c->op[PIPE_W], c->n);
    mine[F_BUSY] = mine[F_TF] + mine[F_TB] + mine[F_TW];  // "their sum", as printed
    mine[F_PEAK_SETS] = x->live_peak;
    mine[F_PEAK_SETS_SCHED] = sched_peak_inflight(s, rank);
    mine[F_PEAK_BYTES] = (double)x->acts_peak;
    mine[F_PEAK_BYTES_FORMULA] = calc_pipe_peak_bytes_recompute(&run->ses->cfg, s, rank, Bm, T,
                                                                run->dtype, run->recompute);
    mine[F_SENT] = end > start ? c->sent_sum / (end - start) : 0;
    mine[F_SENT_FORMULA] = calc_pipe_sent_bytes(p, v, m, rank, (double)x->msg,
                                                run->dtype == GPT2_BF16 ? 2 : 4);
    mine[F_L0] = run->l0;
    mine[F_L1] = run->l1;
    mine[F_PEAK_W] = x->wlive_peak;
    mine[F_PEAK_W_SCHED] = sched_peak_wstores(s, rank);
    double *all = rank == 0 ? lab_xcalloc((size_t)p * F_NFIELDS, sizeof(double)) : NULL;
    dist_gather(mine, all, F_NFIELDS, DIST_F64, 0, g);
    // the measured timeline of the last step, for the picture
    int maxops = 0;
    for (int r = 0; r < p; r++) maxops = s->nops[r] > maxops ? s->nops[r] : maxops;
    double *tl = lab_xcalloc((size_t)2 * maxops, sizeof(double)), *tl_all = NULL;
    if (c->pic_start) {  // (no step run here: resumed at the end)
        memcpy(tl, c->pic_start, (size_t)s->nops[rank] * sizeof(double));
        memcpy(tl + maxops, c->pic_end, (size_t)s->nops[rank] * sizeof(double));
    }
    if (rank == 0) tl_all = lab_xcalloc((size_t)p * 2 * maxops, sizeof(double));
    dist_gather(tl, tl_all, (size_t)2 * maxops, DIST_F64, 0, g);
    print_links(run, c);  // --links only (collective)

    if (rank == 0) {
        const double theory = sched_theory_bubble(s, &UNIT_TIMES);
        const TimeReport tr = time_report(s, all, c->span, c->n);  // (the span: every rank's)
        const int quiet = run->ses->args->quiet;
        session_print_throughput(run->ses, 0);  // every chapter's line
        if (!quiet && end - start > 1)  // (the first step warms caches and allocators)
            printf("%d steps after the first in %.3f s: %.0f tokens/s\n", end - start - 1,
                   c->t_steps, (double)B * T * (end - start - 1) / c->t_steps);
        if (!quiet && end > start) {
            print_last_step(s, tl_all, maxops, run->cols);
            print_time_report(s, all, &tr, theory);
            session_print_cores_note(run->ses, "the op times, idle, bubble and imbalance (and "
                                               "the simulated bubble, made of those op times)");
            print_memory_report(s, all);
        }
        if (run->ses->args->dump) write_dump(run, all, &tr, theory);
    }
    free(all), free(tl), free(tl_all);
}
