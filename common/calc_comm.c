// calc_comm.c: the bytes one rank sends per step in its TP, DP and PP group (calc.h, "Bytes on the
// wire per rank"), for any model and layout: the planner's communication times are these bytes
// over a bandwidth, and chapter 09's 8-rank run is checked against them to the byte.
//
// Counted as common/dist.c counts: a ring all-reduce of S bytes on n ranks sends 2(n-1)S/n
// (S/n per step of the reduce-scatter half, and again of the all-gather half; integer
// division), a ring reduce-scatter or all-gather of uneven pieces sends every piece but one
// (reduce-scatter: all but its own, all-gather: all but the next rank's), a send its bytes, a
// broadcast's root its bytes once. Latencies: a ring all-reduce is 2(n-1) hops, a
// reduce-scatter or all-gather n-1, a send 1.
#include <stdlib.h>
#include <string.h>
#include "calc.h"
#include "check.h"

double calc_ring_all_reduce_bytes(double bytes, int n) {
    if (n <= 1) return 0;
    // exact integer arithmetic while it fits in 64 bits (it does for any real model: the
    // largest buffer, a stage's gradients, is ~1e11 bytes); dist rounds down the same way
    const double prod = 2.0 * (n - 1) * bytes;
    if (prod < 1.8e19) return (double)(2ull * (unsigned long long)(n - 1) * (unsigned long long)bytes / (unsigned)n);
    return prod / n;
}

// World rank of grid coordinates (t, d, p) in the setup's order.
static int grid_rank_of(const CalcSetup *s, int t, int d, int p) {
    return s->grid_order == CALC_ORDER_PP_FIRST ? p + s->pp * (d + s->dp * t)
                                                : t + s->tp * (d + s->dp * p);
}

int calc_group_nodes(const CalcSetup *s, int dim, int gpus_per_node) {
    const int tp = s->tp, dp = s->dp, pp = s->pp;
    LAB_CHECK(tp > 0 && dp > 0 && pp > 0 && gpus_per_node > 0, "calc_group_nodes: %d x %d x %d, "
              "%d GPUs per node", dp, tp, pp, gpus_per_node);
    const int n = dim == CALC_DIM_TP ? tp : dim == CALC_DIM_DP ? dp : pp;
    // the groups: one per value of the two other coordinates (a, b)
    const int na = dim == CALC_DIM_TP ? dp : tp, nb = dim == CALC_DIM_PP ? dp : pp;
    int most = 1;
    for (int a = 0; a < na; a++)
        for (int b = 0; b < nb; b++) {
            // a member's rank grows with its coordinate along dim: count the node changes
            int nodes = 0, last = -1;
            for (int k = 0; k < n; k++) {
                int t = dim == CALC_DIM_TP ? k : a;
                int d = dim == CALC_DIM_DP ? k : dim == CALC_DIM_TP ? a : b;
                int p = dim == CALC_DIM_PP ? k : b;
                int node = grid_rank_of(s, t, d, p) / gpus_per_node;
                if (node != last) nodes++, last = node;
            }
            if (nodes > most) most = nodes;
        }
    return most;
}

double calc_traffic_slot_seconds(const CalcTraffic *t, double slots, int nmb, double bw, double alpha) {
    return slots * (t->mb_bytes / bw + t->mb_hops * alpha) +
           (t->step_bytes - nmb * t->mb_bytes) / bw + (t->step_hops - nmb * t->mb_hops) * alpha;
}

// Adds one collective to a group's count, once per micro-batch or once per step.
static void add(CalcTraffic *t, int per_mb, double bytes, double hops) {
    if (per_mb) t->mb_bytes += bytes, t->mb_hops += hops;
    else t->step_bytes += bytes, t->step_hops += hops;
}

// A ring all-reduce of `bytes` on n ranks.
static void all_reduce(CalcTraffic *t, int per_mb, double bytes, int n) {
    if (n > 1) add(t, per_mb, calc_ring_all_reduce_bytes(bytes, n), 2.0 * (n - 1));
}

// Chapter 09's ZeRO-3 and FSDP on the chunk of virtual stage vs (dp > 1): every unit
// reduce-scattered after each micro-batch (ZeRO-2's rule, unit by unit), but the one holding an
// end of the tied wte once per step, after the ends' sum; and all-gathered around its uses: per
// micro-batch a block and the head twice (forward, backward), the tied copy twice (the head's
// forward and backward), the embedding once, and twice more on a chunk that is also the head's
// (the head's forward and backward read its wte); keep_gathered: every unit once per step.
static void sharded_units(CalcTraffic *t, const CalcModel *m, const CalcSetup *s, int vs, int replica,
                          double w) {
    const int dp = s->dp, S = s->pp * (s->chunks > 1 ? s->chunks : 1);
    const int first = vs == 0, last = vs == S - 1;
    int64_t *u = calloc((size_t)m->L + 3, sizeof(int64_t));
    const int nu = calc_chunk_units(m, s->tp, S, vs, u);
    const int wte = first ? 0 : nu - 1, tied = m->tied && first != last;
    for (int i = 0; i < nu; i++) {
        const double mine = (double)calc_unit_piece(u, nu, i, s->fsdp, dp, replica);
        const double next = (double)calc_unit_piece(u, nu, i, s->fsdp, dp, (replica + 1) % dp);
        const double rs = ((double)u[i] - mine) * w, ag = ((double)u[i] - next) * w;
        add(t, !(tied && i == wte), rs, dp - 1);
        const int gathers = first && i == 0 ? 1 + 2 * last : 2;
        if (s->keep_gathered) add(t, 0, ag, dp - 1);
        else add(t, 1, gathers * ag, gathers * (dp - 1.0));
    }
    free(u);
}

// Chapters 05 and 06's ZeRO-3 and FSDP on the whole model (calc.h, CalcSetup.unit_shards).
static void whole_model_units(CalcTraffic *t, const CalcModel *m, const CalcSetup *s, int replica,
                              double w) {
    const int dp = s->dp;
    int64_t *u = calloc((size_t)m->L + 3, sizeof(int64_t));
    const int nu = calc_chunk_units(m, 1, 1, 0, u);
    for (int i = 0; i < nu; i++) {
        const double mine = (double)calc_unit_piece(u, nu, i, s->fsdp, dp, replica);
        const double next = (double)calc_unit_piece(u, nu, i, s->fsdp, dp, (replica + 1) % dp);
        const double rs = ((double)u[i] - mine) * w, ag = ((double)u[i] - next) * w;
        const int gathers = s->keep_gathered ? 1 : i == nu - 1 ? 1 : 2;
        add(t, s->unit_shards != 2, rs, dp - 1);  // (2: once per step, 06's --no-sync)
        add(t, 1, gathers * ag, gathers * (dp - 1.0));
    }
    free(u);
}

CalcComm calc_rank_comm(const CalcModel *m, const CalcSetup *s, int stage, int replica) {
    const char *err = calc_setup_check(m, s);
    LAB_CHECK(err == NULL, "calc_rank_comm: %s", err);
    LAB_CHECK(m->arch != CALC_ARCH_RAW, "calc_rank_comm: --params gives no dimensions to split");
    LAB_CHECK(stage >= 0 && stage < s->pp && replica >= 0 && replica < s->dp,
              "calc_rank_comm: stage %d of %d, replica %d of %d", stage, s->pp, replica, s->dp);
    CalcComm k;
    memset(&k, 0, sizeof k);
    const int tp = s->tp, dp = s->dp, pp = s->pp, v = s->chunks > 1 ? s->chunks : 1, S = pp * v;
    const int M = calc_micro_batches(s);
    k.micro_batches = M;
    // w: bytes per value of the model's dtype (activations, their gradients, parameters and
    // gradients all travel in it); the loss, the norms and the cross-entropy's values are fp32/64
    const double w = s->dtype == CALC_BF16 ? 2 : 4;
    const double N = (double)s->micro_batch * (s->seq_len > 0 ? s->seq_len : m->T);  // tokens
    const double act = N * m->C * w;                   // one micro-batch's (b, s, h) tensor
    const double tact = s->tp_fp32 ? N * m->C * 4 : act;  // the same as TP reduces it
    const double Vl = (double)((m->V + tp - 1) / tp);  // vocabulary rows per TP rank
    const int full = s->recompute == CALC_RECOMPUTE_FULL;
    // (the lab's bf16 selective under SP only: Megatron's selective keeps q, k, v and sends nothing)
    const int sel_ag = s->acts == CALC_ACTS_LAB && s->sp && s->dtype == CALC_BF16 &&
                       s->recompute == CALC_RECOMPUTE_SELECTIVE;
    double repl_elems = 0;  // TP-replicated parameters of this rank (their grads, under SP)
    for (int c = 0; c < v; c++) {
        const int vs = c * pp + stage, first = vs == 0, last = vs == S - 1;
        const int layers = calc_stage_layers(m->L, S, vs);
        // TP, per micro-batch: 4 all-reduces per layer (6 with full recomputation), the
        // embedding's sum, the head's f, the cross-entropy's three (b, s) fp32 vectors
        // (sp_seq_calls: the lab's SP runs each as a reduce-scatter and an all-gather per sequence)
        const int calls = layers * (4 + 2 * full) + first + last;
        const double seq = s->sp && s->sp_seq_calls ? s->micro_batch : 1;
        for (int i = 0; i < calls && tp > 1; i++)
            add(&k.tp, 1, calc_ring_all_reduce_bytes(tact, tp), seq * 2.0 * (tp - 1));
        // bf16 selective under SP: each block's ln1 all-gathered once more (f), for qkv again
        for (int i = 0; i < layers * sel_ag && tp > 1; i++)
            add(&k.tp, 1, calc_ring_all_reduce_bytes(tact, tp) / 2, seq * (tp - 1));
        for (int i = 0; last && i < 3; i++) all_reduce(&k.tp, 1, 4 * N, tp);
        // DP: the chunk's flat buffer of n elements, cut into dp pieces (calc_piece)
        const int64_t n = calc_stage_params(m, tp, S, vs);
        const double mine = (double)calc_piece(n, dp, replica);
        const double next = (double)calc_piece(n, dp, (replica + 1) % dp);
        const double rs = ((double)n - mine) * w, ag = ((double)n - next) * w;
        // ZeRO-2: an end of the tied wte reduces its span once per step (after the ends summed
        // it: the first chunk's [0, V/t·h), the last's copy at the end of its buffer), the rest
        // per micro-batch; each sends the range but its own part
        const int64_t tied = m->tied && S > 1 && (first || last) ? (int64_t)Vl * m->C : 0;
        const int64_t t0 = first ? 0 : n - tied;
        const double mine_tied = (double)calc_range_piece(n, dp, replica, t0, t0 + tied);
        const double rs_tied = ((double)tied - mine_tied) * w, rs_rest = rs - rs_tied;
        if (dp > 1) {
            const double nb = s->dp_buckets > 1 ? s->dp_buckets : 1;  // (03's, 05's buckets)
            if (s->zero == 0)
                add(&k.dp, 0, calc_ring_all_reduce_bytes((double)n * w, dp), nb * 2.0 * (dp - 1));
            if (s->zero == 1) add(&k.dp, 0, rs + ag, 2.0 * (dp - 1));
            if (s->zero == 2)
                add(&k.dp, 1, rs_rest, nb * (dp - 1)), add(&k.dp, 0, rs_tied + ag, ((tied > 0) + 1.0) * (dp - 1));
            if (s->zero == 3 && s->unit_shards) whole_model_units(&k.dp, m, s, replica, w);
            else if (s->zero == 3 && !s->grads_whole) add(&k.dp, 1, rs + 2 * ag, 3.0 * (dp - 1));
            else if (s->zero == 3) sharded_units(&k.dp, m, s, vs, replica, w);
        }
        // PP, per micro-batch: the activation to the next virtual stage, the gradient back
        if (pp > 1) {
            const int sends = (vs < S - 1) + (vs > 0);
            add(&k.pp, 1, sends * (s->sp ? act / tp : act), sends);
        }
        repl_elems += (double)calc_stage_replicated_params(m, S, vs);
    }
    // TP once per step: the clip norm's Σ g² of the slices (a double)
    all_reduce(&k.tp, 0, 8, tp);
    // with SP each TP rank's norms (and biases added after a reduce-scatter) see only its
    // sequence shard: their gradients are summed over TP (Megatron's LayerNorm all-reduce)
    if (s->sp) all_reduce(&k.tp, 0, repl_elems * (s->tp_fp32 ? 4 : w), tp);
    // DP once per step: the loss (a float); with ZeRO the norm of the pieces, two doubles
    if (!s->loss_in_norm) all_reduce(&k.dp, 0, 4, dp);
    if (s->zero > 0) all_reduce(&k.dp, 0, 16, dp);
    if (pp > 1) {
        all_reduce(&k.pp, 0, 8, pp);  // the clip norm over the stages (a double)
        // the tied wte's gradient, summed between its copies on the first and the last stage:
        // an exchange (pipe_sum_tied's sendrecv) sends it once, in one hop
        if (m->tied && (stage == 0 || stage == pp - 1)) add(&k.pp, 0, Vl * m->C * w, 1);
        if (stage == pp - 1) add(&k.pp, 0, 4, 1);  // the step's loss, broadcast by the last stage
    }
    CalcTraffic *g[3] = {&k.tp, &k.dp, &k.pp};
    for (int i = 0; i < 3; i++) {
        g[i]->step_bytes += M * g[i]->mb_bytes;
        g[i]->step_hops += M * g[i]->mb_hops;
    }
    return k;
}
