// session_links.c: where the link time goes on the virtual cluster (--links; session.h,
// docs/CLUSTER.md). One table for every chapter: for each of the chapter's groups (TP, DP, PP),
// what dist held this rank for over the loop (dist_link_held_seconds; hidden: the part the
// communication thread was held while the caller computed), against chapter 00's calculator
// for the same layout (calc_rank_comm: the bytes and hops of this rank, timed on the link the
// group crosses) and the planner's estimate of it (calc_traffic_slot_seconds).
#include <stdio.h>

#include "calc.h"
#include "dist.h"
#include "session.h"

void session_watch_links(Session *s, DistGroup *tp, DistGroup *dp, DistGroup *pp) {
    s->link_group[0] = tp, s->link_group[1] = dp, s->link_group[2] = pp;
}

void session_links_note(Session *s, int end) {
    if (!dist_links_enabled()) return;
    for (int i = 0; i < 3; i++) {
        const DistGroup *g = s->link_group[i];
        const double held = g ? dist_link_held_seconds(g) : 0, hidden = g ? dist_link_hidden_seconds(g) : 0;
        if (!end) s->link_mark[i][0] = held, s->link_mark[i][1] = hidden;
        else s->link_loop[i][0] = held - s->link_mark[i][0], s->link_loop[i][1] = hidden - s->link_mark[i][1];
    }
    if (end) {  // every group's: the summary line (session_print_throughput)
        dist_link_totals(&s->link_total_loop[0], &s->link_total_loop[1]);
        s->link_total_loop[0] -= s->link_held0, s->link_total_loop[1] -= s->link_hidden0;
    }
}

void session_print_links(const Session *s, const CalcSetup *cs, int stage, int replica) {
    const DistLinks *l = dist_links();
    if (!l) return;
    const int run = session_steps_run(s);
    const double nsteps = run > 0 ? run : 1;
    const CalcModel cm = calc_model_from_gpt2(&s->cfg);
    const CalcComm k = calc_rank_comm(&cm, cs, stage, replica);
    const CalcTraffic *t[3] = {&k.tp, &k.dp, &k.pp};
    static const int dims[3] = {CALC_DIM_TP, CALC_DIM_DP, CALC_DIM_PP};
    const int deg[3] = {cs->tp, cs->dp, cs->pp}, v = cs->chunks > 1 ? cs->chunks : 1;
    // the planner's pace (00_memory_budget/planner.c): TP and PP once per 1F1B slot, m + (pp-1)/v
    // slots per step; DP once per step
    const int m = calc_micro_batches(cs);
    const double slots = m + (double)(cs->pp - 1) / v;
    double mine[13] = {0}, most[13];  // held, model, planner (3 each), the step, hidden (3)
    int across[3];
    for (int i = 0; i < 3; i++) {
        across[i] = calc_group_nodes(cs, dims[i], l->ranks_per_node) > 1;
        const DistLink *link = across[i] ? &l->inter : &l->intra;
        mine[i] = s->link_loop[i][0] / nsteps;
        mine[10 + i] = s->link_loop[i][1] / nsteps;
        mine[3 + i] = t[i]->step_bytes / link->bw + t[i]->step_hops * link->lat;
        mine[6 + i] = dims[i] == CALC_DIM_DP ? mine[3 + i]
                    : calc_traffic_slot_seconds(t[i], slots, m, link->bw, link->lat);
    }
    mine[9] = run > 0 ? session_elapsed(s) / run : 0;  // the step
    dist_all_reduce(mine, most, 13, DIST_F64, DIST_MAX, dist_world());
    if (s->rank != 0 || s->args->quiet) return;
    static const char *names[3] = {"TP", "DP", "PP"};
    const int sliced = s->link_group[0] || s->link_group[2];  // TP or PP: the slots matter
    printf("\nlink time per step on the virtual cluster (the busiest rank of each dimension)\n");
    printf("  held: what dist held this rank's ops for (hidden: the part the communication thread "
           "waited behind compute; the rest is exposed);\n  model: chapter 00's bytes and hops of "
           "the rank on the same link (the two agree);\n  planner: the planner's step estimate");
    if (sliced)
        printf(", which pays TP and PP once per 1F1B slot (%.3g slots: the bubble waits at the same "
               "pace)\n", slots);
    else
        printf(" (DP once per step: the same bytes and hops)\n");
    double planned = 0;
    for (int i = 0; i < 3; i++) {
        if (!s->link_group[i]) continue;
        printf("  %-3s %2d rank%s %-14s held %9.3f ms (hidden %7.3f)   model %9.3f ms   planner "
               "%9.3f ms\n", names[i], deg[i], deg[i] == 1 ? " " : "s",
               deg[i] == 1 ? "-" : across[i] ? "between nodes" : "inside a node", 1e3 * most[i],
               1e3 * most[10 + i], 1e3 * most[3 + i], 1e3 * most[6 + i]);
        planned += most[6 + i];
    }
    printf("  step %.3f ms measured (wall clock, all ranks); the planner's communication %.3f ms "
           "per step\n", 1e3 * most[9], 1e3 * planned);
}
