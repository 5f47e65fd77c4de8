// report.c: chapter 07's picture, communication table and memory table (see report.h).
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "mem.h"
#include "session.h"

// One row of the picture: `n` items drawn as `width` characters, each the digit of the rank
// that holds the item under it (items split in tp equal contiguous blocks; a '.' marks padding).
static void picture_row(const char *label, int n, int nvalid, int tp, int width) {
    printf("  %-28s ", label);
    for (int i = 0; i < width; i++) {
        int item = (int)((long)i * n / width);
        int r = item / (n / tp);
        putchar(item >= nvalid ? '.' : (char)('0' + r % 10));
    }
    printf("\n");
}

void tp7_print_layout(const GPT2 *m, int world, int dp) {
    const GPT2Config *c = &m->cfg;
    const int tp = m->tp, Cl = c->C / tp, Hl = 4 * c->C / tp;
    const TpVocab tv = tp_vocab(c->V, tp, m->tp_rank);
    char b[32];
    printf("Tensor parallel: %d rank%s = %d TP group%s of %d%s; GPT-2 V=%d T=%d L=%d C=%d NH=%d, "
           "%zu parameters\n", world, world > 1 ? "s" : "", dp, dp > 1 ? "s" : "", tp,
           dp > 1 ? " (data-parallel replicas of each other)" : "", c->V, c->T, c->L, c->C, c->NH,
           gpt2_param_count(c));
    printf("\nWho holds what in every block (a digit = the rank of the group holding it):\n");
    char label[64];
    int w = c->NH <= 64 ? c->NH : 64;
    snprintf(label, sizeof label, "attention heads (NH=%d)", c->NH);
    picture_row(label, c->NH, c->NH, tp, w);
    snprintf(label, sizeof label, "  q, k, v rows (C=%d each)", c->C);
    picture_row(label, c->C, c->C, tp, 64);
    snprintf(label, sizeof label, "  attproj columns (C=%d)", c->C);
    picture_row(label, c->C, c->C, tp, 64);
    snprintf(label, sizeof label, "MLP hidden units (4C=%d)", 4 * c->C);
    picture_row(label, 4 * c->C, 4 * c->C, tp, 64);
    printf("  %-28s %s\n", "  = fc rows, fcproj columns", "(the same split)");
    snprintf(label, sizeof label, "wte rows (V=%d, padded %d)", c->V, tv.Vp);
    picture_row(label, tv.Vp, c->V, tp, 64);
    printf("  %-28s every rank (replicated)\n", "ln1, ln2, lnf, wpe, biases*");
    printf("  * of the row-parallel layers (attprojb, fcprojb), added once after the all-reduce;"
           " qkvb and fcb\n    are split with their rows\n");
    printf("per rank: %d head%s = %d of C's channels, %d hidden units, %d vocabulary rows "
           "(%d real); weights %s\n\n", c->NH / tp, c->NH / tp > 1 ? "s" : "", Cl, Hl, tv.Vl,
           tv.nvalid, mem_format(b, sizeof b, (double)m->num_params * 4));
}

void tp7_measure(Tp7Figures *f, const GPT2 *m, const TpComm *comm, DistGroup *tpg, int steps,
                 double elapsed, int global_batch) {
    memset(f, 0, sizeof *f);
    const GPT2Config *c = &m->cfg;
    const int tp = m->tp, L = c->L, B = m->tp_B;
    const TpVocab tv = tp_vocab(c->V, tp, m->tp_rank);
    // one rank without SP: no group, gpt2's own pieces (tp.h): no all-reduce at all
    const int own = tp == 1 && !m->sp;
    const double N = (double)B * m->tp_T, NC = N * c->C, s = steps > 0 ? steps : 1;
    f->tp = tp, f->steps = steps;
    for (int i = 0; i < TP_NSITES; i++)
        f->calls[i] = (double)comm->calls[i] / s, f->floats[i] = (double)comm->floats[i] / s;
    // The formula: per block 2 forward (g) + 2 backward (f) all-reduces of B·T·C; one for the
    // embedding, one for f at the head's input; three of B·T in the loss. Sequence parallel:
    // each all-reduce of B·T·C becomes a reduce-scatter and an all-gather of it (g: RS forward,
    // AG backward; f: AG forward, RS backward; the embedding: RS forward, AG backward; the
    // head's f: AG forward, RS backward), plus the replicated tensors' partial gradients.
    // kind: 2 = all-reduce (2(t-1)/t of its bytes on the wire), 1 = reduce-scatter or all-gather
    // ((t-1)/t), made as B calls of one sequence each (rounded per call).
    // Full recomputation runs every block's forward twice, its collectives included: g (and
    // under SP f's all-gather) twice per block, 6 instead of 4 of a block's tensors per step.
    // bf16 selective under SP reruns ln1's all-gather (f) as well, for qkv (tp.h).
    const int sp = m->sp, full = m->recompute == GPT2_RECOMPUTE_FULL;
    const int sel_ag = sp && m->dtype == GPT2_BF16 && m->recompute == GPT2_RECOMPUTE_SELECTIVE;
    const double nsp = sp ? NC : 0, Lsp = sp ? L : 0, Lg = L * (1 + full), Lspf = Lsp * (1 + full);
    const double Lattf = Lsp * (1 + full + sel_ag);
    f->recompute = m->recompute;
    const double want[TP_NSITES][3] = {
        [TP_SITE_EMBED] = {1, NC, sp ? 1 : 2}, [TP_SITE_ATTN_G] = {Lg, Lg * NC, sp ? 1 : 2},
        [TP_SITE_MLP_G] = {Lg, Lg * NC, sp ? 1 : 2}, [TP_SITE_ATTN_F] = {L, L * NC, sp ? 1 : 2},
        [TP_SITE_MLP_F] = {L, L * NC, sp ? 1 : 2},
        [TP_SITE_CE_MAX] = {1, N, 2}, [TP_SITE_CE_SUMEXP] = {1, N, 2}, [TP_SITE_CE_TARGET] = {1, N, 2},
        [TP_SITE_HEAD_F] = {1, NC, sp ? 1 : 2}, [TP_SITE_OTHER] = {0, 0, 2},
        [TP_SITE_ATTN_F_FWD] = {Lattf, Lattf * NC, 1}, [TP_SITE_MLP_F_FWD] = {Lspf, Lspf * NC, 1},
        [TP_SITE_ATTN_G_BWD] = {Lsp, Lsp * NC, 1}, [TP_SITE_MLP_G_BWD] = {Lsp, Lsp * NC, 1},
        [TP_SITE_HEAD_F_FWD] = {sp, nsp, 1}, [TP_SITE_EMBED_BWD] = {sp, nsp, 1},
        [TP_SITE_SP_GRADS] = {sp, sp ? (6.0 * L + 2) * c->C : 0, 2}};
    // On the wire (dist's model of a ring): per call, rounded down; plus the clip's one
    // all-reduce of a double (the norm over the group).
    const uint64_t t1 = (uint64_t)(tp - 1), ut = (uint64_t)tp;
    f->sp = sp;
    f->want_tp_sent = 0;
    for (int i = 0; i < TP_NSITES && !own; i++) {
        f->want_calls[i] = want[i][0], f->want_floats[i] = want[i][1];
        if (want[i][0] <= 0) continue;
        uint64_t S = (uint64_t)(want[i][1] / want[i][0]) * sizeof(float);
        if (want[i][2] == 2) f->want_tp_sent += want[i][0] * (double)(2 * t1 * S / ut);
        else f->want_tp_sent += want[i][0] * (double)B * (double)(t1 * (S / (uint64_t)B) / ut);
    }
    f->want_tp_sent += (double)(2 * t1 * 8 / ut);
    const DistCounters *g = dist_group_counters(tpg);
    for (int k = 0; k < OP_NKINDS; k++)
        f->tp_sent += (double)g->sent[k] / s, f->tp_recv += (double)g->recv[k] / s;
    const uint64_t S = (uint64_t)NC * sizeof(float);
    // one block: 4 all-reduces of N·C, or (SP) 4 reduce-scatters + 4 all-gathers of N·C: the same
    f->want_layer_sent = (4.0 + 2.0 * full) * (double)(2 * t1 * S / ut) + sel_ag * (double)(t1 * S / ut);
    double per_block = (f->calls[TP_SITE_ATTN_G] + f->calls[TP_SITE_MLP_G] + f->calls[TP_SITE_ATTN_F] +
                        f->calls[TP_SITE_MLP_F]) / (L ? L : 1);
    f->layer_sent = sp ? (per_block + (f->calls[TP_SITE_ATTN_F_FWD] + f->calls[TP_SITE_MLP_F_FWD] +
                                       f->calls[TP_SITE_ATTN_G_BWD] + f->calls[TP_SITE_MLP_G_BWD]) / (L ? L : 1)) *
                             (double)B * (double)(t1 * (S / (uint64_t)B) / ut)
                       : per_block * (double)(2 * t1 * S / ut);

    // Memory. Weights: the sliced tensors of the full model over t (the vocabulary padded to a
    // multiple of t), the rest whole. Counted from the full model's shapes, not from our layout.
    size_t sh = 0, rep = 0;  // (the tied copy left out: none on the whole model)
    for (int i = 0; i < m->nplist; i++)
        if (!m->plist[i].tied_copy) *(m->plist[i].sliced ? &sh : &rep) += m->plist[i].size;
    // bytes per stored element: the weights and gradients the pieces read / write, and every
    // block's saved activations (bf16: 2; the fp32 master, Adam m and v stay 4)
    const double eb = m->dtype == GPT2_BF16 ? 2.0 : 4.0;
    f->bf16 = m->dtype == GPT2_BF16;
    f->sharded = eb * (double)sh, f->replicated = eb * (double)rep;
    const double C = c->C, V = tv.Vp, T = c->T;
    double full_sharded = V * C + L * (3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C);
    double full_replicated = T * C + 2 * C + L * 6 * C;
    f->params = (double)mem_peak(MEM_PARAMS);
    f->want_params = eb * (full_sharded / tp + full_replicated);
    f->grads = (double)mem_peak(MEM_GRADS), f->want_grads = f->want_params;
    f->master = (double)mem_peak(MEM_MASTER);
    f->want_master = f->bf16 ? 4.0 * (full_sharded / tp + full_replicated) : 0.0;
    // Activations: per block (tp.c's set) ln1, attproj, residual2, ln2, fcproj, out (N·C
    // each, replicated), 4 LayerNorm statistics (N), qkv and atty (4N·C/t), preatt and att
    // (2·B·NH/t·T²), fch and fch_gelu (8N·C/t); the backward's scratch (one block's worth:
    // 2N·C + 12N·C/t + 2·B·NH/t·T²); the head (lnf, dlnf: 2N·C; 3N statistics; logits and
    // dlogits 2N·Vl; the loss's 3N); the embedding's output and the gradient flowing down (2N·C).
    // Sequence parallel (tp.h): per block ln1, ln2 gathered (2N·C), residual2, out (2N·C/t),
    // 4N/t statistics, the rest as above; attproj and fcproj move to the scratch's one partial
    // (N·C), which also holds a gathered gradient (N·C) and a scattered one (N·C/t) and keeps
    // dresidual2 on N/t rows: 3N·C + 2N·C/t + 12N·C/t + 2·B·NH/t·T²; the head adds lnf's local
    // part (N·C/t) and keeps 2N/t statistics; the embedding's output and d x: 2N·C/t.
    // bf16 (tp.h): every block's set stored at 2 bytes per element, plus ONE fp32 working
    // set of a block and the widened input of the running piece (N·C, SP: N·C/t); the scratch
    // (gradients), the head and the embedding stay fp32.
    const double att = (double)B * (c->NH / tp) * T * T, Vl = tv.Vl;
    double block, scratch, head, embed;
    if (sp) {
        block = 2 * NC + 2 * NC / tp + 4 * N / tp + 12 * NC / tp + 2 * att;
        scratch = 3 * NC + 2 * NC / tp + 12 * NC / tp + 2 * att;
        head = 2 * NC + NC / tp + 2 * N / tp + N + 2 * N * Vl + 3 * N;
        embed = 2 * NC / tp;
    } else {
        block = 6 * NC + 4 * N + 12 * NC / tp + 2 * att;
        scratch = 2 * NC + 12 * NC / tp + 2 * att;
        head = 2 * NC + 3 * N + 2 * N * Vl + 3 * N;
        embed = 2 * NC;
    }
    // Recomputation (tp.h): a block keeps all but preatt and att (selective) or only its
    // output (full: N·C, SP N·C/t); the slice holds one fp32 layer of what they drop, which each
    // block's backward recomputes into (bf16: beside the kept tensors' fp32 working layer, the
    // two one block's set, as without recomputation).
    const double kept = m->recompute == GPT2_RECOMPUTE_FULL        ? (sp ? NC / tp : NC)
                        : m->recompute == GPT2_RECOMPUTE_SELECTIVE ? block - 2 * att
                                                                   : block;
    f->rc_layer = 4.0 * (block - kept);
    f->block_acts = eb * kept;
    const double work = f->bf16 ? 4.0 * (kept + (sp ? NC / tp : NC)) : 0.0;
    f->want_acts = eb * L * kept + f->rc_layer + work + 4.0 * (scratch + head + embed);
    // one rank without SP: chapter 00's sets (gpt2.h; its one block saves the same tensors)
    if (own) {
        f->want_acts = calc_activation_bytes_recompute(c, B, m->tp_T, m->dtype, m->recompute);
        f->rc_layer = calc_recompute_scratch_bytes(c, B, m->tp_T, m->recompute);
    }
    f->acts = (double)mem_peak(MEM_ACTS);
    // Megatron (Korthikanti et al. 2022, fp16 activations, 1-byte dropout masks), bytes per
    // layer: s·b·h·(10 + 24/t + 5·a·s/(h·t)) without SP, s·b·h·(34/t + 5·a·s/(h·t)) with it.
    // Adjusted for what this model stores (README "Sequence parallelism"): no dropout (the two
    // masks sbh and the attention mask as²b go), fp32 (x2), preatt kept beside att (the
    // softmax's 2as²b stays 2 tensors), attproj and fcproj kept per block without SP (2sbh
    // fp32 = 8sbh), the 4 LayerNorm statistics (16sb bytes, /t with SP), and with SP the
    // LayerNorm outputs kept gathered (8sbh, not 8sbh/t: no second all-gather in backward):
    //   without SP: sbh(24 + 48/t + 8as/(ht)) + 16sb      with SP: sbh(8 + 56/t + 8as/(ht)) + 16sb/t
    const double sbh = T * B * C, as_ht = c->NH * T / (C * tp), sb = T * B;
    f->megatron_block_acts = sp ? sbh * (34.0 / tp + 5.0 * as_ht) : sbh * (10.0 + 24.0 / tp + 5.0 * as_ht);
    f->adjusted_block_acts = sp ? sbh * (8.0 + 56.0 / tp + 8.0 * as_ht) + 16.0 * sb / tp
                                : sbh * (24.0 + 48.0 / tp + 8.0 * as_ht) + 16.0 * sb;
    f->adjusted_block_acts *= eb / 4.0;  // bf16 stores 2 bytes per element, as Megatron's fp16
                                         // (the printed coefficients halve with it)
    // Recomputation (fp32): selective drops the as/(ht) term of both, full keeps the input only
    // (Megatron: 2sbh in fp16; here 4sbh; SP: / t)
    if (m->recompute == GPT2_RECOMPUTE_SELECTIVE) {
        f->megatron_block_acts -= sbh * 5.0 * as_ht;
        f->adjusted_block_acts -= sbh * 8.0 * as_ht;
    } else if (m->recompute == GPT2_RECOMPUTE_FULL) {
        f->megatron_block_acts = 2.0 * sbh / (sp ? tp : 1);
        f->adjusted_block_acts = 4.0 * sbh / (sp ? tp : 1);
    }
    f->peak = (double)mem_total_peak();
    f->tokens_per_s = elapsed > 0 ? (double)global_batch * T * steps / elapsed : 0;
}

enum { F_SENT, F_RECV, F_PARAMS, F_ACTS, F_OPT, F_PEAK, F_N };

void tp7_print_report(const Tp7Figures *f, const GPT2 *m, DistGroup *tpg, int world) {
    double mine[F_N] = {f->tp_sent, f->tp_recv, f->params, f->acts,
                        (double)(mem_peak(MEM_OPT_M) + mem_peak(MEM_OPT_V)), f->peak};
    double all[F_N * 64];
    LAB_CHECK(world <= 64, "the report gathers at most 64 ranks");
    dist_gather(mine, all, F_N, DIST_F64, 0, dist_world());
    if (dist_rank() != 0) return;
    char a[32], b[32], d[32], e[32];
    const int L = m->cfg.L, tp = m->tp;
    printf("%d steps: %.0f tokens/s (all ranks)\n", f->steps, f->tokens_per_s);
    printf("\nAll-reduces in the TP group per step (N = B·T = %d positions of this group, C = %d):\n",
           m->tp_B * m->tp_T, m->cfg.C);
    printf("  %-14s %8s %8s %14s %14s\n", "site", "calls", "formula", "floats each", "formula");
    for (int i = 0; i < TP_NSITES; i++) {
        if (i == TP_SITE_OTHER || (f->calls[i] == 0 && f->want_calls[i] == 0)) continue;
        double each = f->calls[i] > 0 ? f->floats[i] / f->calls[i] : 0;
        double want_each = f->want_calls[i] > 0 ? f->want_floats[i] / f->want_calls[i] : 0;
        printf("  %-14s %8.0f %8.0f %14.0f %14.0f%s\n", tp_site_name((TpSite)i), f->calls[i],
               f->want_calls[i], each, want_each,
               f->calls[i] == f->want_calls[i] && f->floats[i] == f->want_floats[i] ? "" : "  <-- differs");
    }
    if (f->sp)
        printf("  sequence parallel: g = reduce-scatter forward / all-gather backward, f = all-gather"
               " forward /\n  reduce-scatter backward (each B calls, one per sequence); \"sp grads\": "
               "the LayerNorms' and biases' partial gradients\n");
    const int full = f->recompute == GPT2_RECOMPUTE_FULL;
    const int sel_ag = f->sp && f->bf16 && f->recompute == GPT2_RECOMPUTE_SELECTIVE;
    printf("  per block: %s%s of N·C floats = %g x 2(t-1)/t x %s = %s "
           "on the wire per rank (measured %s)\n",
           f->sp ? (full ? "6 reduce-scatters + 6 all-gathers, each (t-1)/t," : "4 reduce-scatters + 4 all-gathers, each (t-1)/t,")
                 : "2 forward (g) + 2 backward (f)",
           full && !f->sp ? " + 2 again (full recomputation reruns the forward's g)"
           : sel_ag ? " + ln1's all-gather again (bf16 selective)" : "", (full ? 6 : 4) + 0.5 * sel_ag,
           mem_format(a, sizeof a, 4.0 * m->tp_B * m->tp_T * m->cfg.C),
           mem_format(b, sizeof b, f->want_layer_sent), mem_format(d, sizeof d, f->layer_sent));
    printf("  whole step, TP group: sent %s per rank, formula %s (the above, each 2(t-1)/t of "
           "its bytes, + the clip's norm)\n", mem_format(a, sizeof a, f->tp_sent),
           mem_format(b, sizeof b, f->want_tp_sent));
    static const SessionColumn cols[] = {
        {"tp sent", F_SENT, COL_BYTES}, {"tp recv", F_RECV, COL_BYTES},
        {"weights", F_PARAMS, COL_BYTES}, {"adam m+v", F_OPT, COL_BYTES},
        {"acts", F_ACTS, COL_BYTES}, {"peak mem", F_PEAK, COL_BYTES}};
    session_print_rank_table("Per rank (communication per step; memory peaks)", cols, 6, all,
                             world, F_N, NULL);
    printf("\nMemory of rank 0 against the formulas (%s):\n", f->bf16 ? "bf16 mixed precision" : "fp32");
    printf("  weights       %10s  formula %10s = sliced %s / %d + replicated %s\n",
           mem_format(a, sizeof a, f->params), mem_format(b, sizeof b, f->want_params),
           mem_format(d, sizeof d, f->sharded * tp), tp, mem_format(e, sizeof e, f->replicated));
    if (f->bf16)
        printf("  fp32 master   %10s  formula %10s (4 bytes per weight: the bf16 ones are 2)\n",
               mem_format(a, sizeof a, f->master), mem_format(b, sizeof b, f->want_master));
    char rc[64] = "";
    if (f->recompute)
        snprintf(rc, sizeof rc, "recompute layer %s + ", mem_format(e, sizeof e, f->rc_layer));
    printf("  activations   %10s  formula %10s = %d blocks x %s + %s%sbackward scratch + head + "
           "embedding\n", mem_format(a, sizeof a, f->acts), mem_format(b, sizeof b, f->want_acts), L,
           mem_format(d, sizeof d, f->block_acts), rc, f->bf16 ? "one fp32 block working set + input + " : "");
    const int sel = f->recompute == GPT2_RECOMPUTE_SELECTIVE;
    printf("  one block saves %s here (%s, no dropout%s); Megatron's %s for this shape: %s "
           "(fp16),\n  adjusted for what this model stores (README): %s = %s\n",
           mem_format(a, sizeof a, f->block_acts), f->bf16 ? "bf16" : "fp32",
           full ? ", full recomputation" : sel ? ", selective recomputation" : "",
           full ? (f->sp ? "2sbh/t" : "2sbh")
           : f->sp ? (sel ? "sbh(34/t)" : "sbh(34/t + 5as/(ht))")
                   : (sel ? "sbh(10 + 24/t)" : "sbh(10 + 24/t + 5as/(ht))"),
           mem_format(b, sizeof b, f->megatron_block_acts),
           full ? (f->sp ? "4sbh/t" : "4sbh")
           : sel ? (f->sp ? "sbh(8 + 56/t) + 16sb/t" : "sbh(24 + 48/t) + 16sb")
           : f->bf16 ? (f->sp ? "sbh(4 + 28/t + 4as/(ht)) + 8sb/t" : "sbh(12 + 24/t + 4as/(ht)) + 8sb")
                   : (f->sp ? "sbh(8 + 56/t + 8as/(ht)) + 16sb/t" : "sbh(24 + 48/t + 8as/(ht)) + 16sb"),
           mem_format(d, sizeof d, f->adjusted_block_acts));
    (void)tpg;
}

static void tp7_results(const Tp7Figures *f, RunResults *out) {
    static const char *const keys[TP_NSITES] = {
        "embed", "attn_g", "mlp_g", "attn_f", "mlp_f", "ce_max", "ce_sumexp", "ce_target",
        "head_f", "other", "attn_f_fwd", "mlp_f_fwd", "attn_g_bwd", "mlp_g_bwd", "head_f_fwd",
        "embed_bwd", "sp_grads"};
    char k[48];
    for (int i = 0; i < TP_NSITES; i++) {
        snprintf(k, sizeof k, "calls_%s", keys[i]);
        results_set(out, k, f->calls[i]);
        snprintf(k, sizeof k, "floats_%s", keys[i]);
        results_set(out, k, f->floats[i]);
    }
    results_set(out, "tp_sent_per_step", f->tp_sent);
    results_set(out, "tp_recv_per_step", f->tp_recv);
    results_set(out, "want_tp_sent_per_step", f->want_tp_sent);
    results_set(out, "mem_params", f->params);
    results_set(out, "want_mem_params", f->want_params);
    results_set(out, "mem_grads", f->grads);
    results_set(out, "want_mem_grads", f->want_grads);
    results_set(out, "mem_master", f->master);
    results_set(out, "want_mem_master", f->want_master);
    results_set(out, "mem_acts", f->acts);
    results_set(out, "want_mem_acts", f->want_acts);
    results_set(out, "block_acts", f->block_acts);
    results_set(out, "adjusted_block_acts", f->adjusted_block_acts);
    results_set(out, "sequence_parallel", f->sp);
    if (f->recompute) results_set(out, "recompute_layer", f->rc_layer);  // (none: absent, as before)
}

void tp7_write_dump(const Session *s, const Tp7Figures *f, int dp, double replicated_max_diff) {
    RunResults out;
    session_dump_open(s, &out);  // the losses, the final weights
    tp7_results(f, &out);
    results_set(&out, "world_size", s->N);
    results_set(&out, "tp", f->tp);
    results_set(&out, "dp", dp);
    results_set(&out, "replicated_max_diff", replicated_max_diff);
    // (not session_dump_close: tp7_results gives the memory figures with their formulas)
    results_set_peak(&out);  // rank 0's peak memory, measured and predicted (mem_predict.h)
    results_write(s->args->dump, &out);
    results_free(&out);
}

double tp7_replicated_max_diff(const GPT2 *m, const float *master, DistGroup *g) {
    double worst = 0.0;
    float *params = lab_xmalloc(m->num_params * sizeof(float));
    mem_copy(params, master, m->num_params * sizeof(float));  // (host or device)
    for (int i = 0; i < m->nplist; i++) {
        if (m->plist[i].sliced) continue;
        const size_t n = m->plist[i].size;
        const float *mine = params + m->plist[i].offset;
        float *ref = lab_xmalloc(n * sizeof(float));
        memcpy(ref, mine, n * sizeof(float));
        dist_broadcast(ref, n, DIST_F32, 0, g);
        for (size_t j = 0; j < n; j++) {
            double d = fabs((double)mine[j] - (double)ref[j]);
            if (!(d <= worst)) worst = d;  // NaN counts as the worst
        }
        free(ref);
    }
    free(params);
    dist_all_reduce(&worst, &worst, 1, DIST_F64, DIST_MAX, g);
    return worst;
}

void tp7_print_links(const Session *s, int tp, int sp, GPT2Recompute recompute) {
    // 07's layout as chapter 00's calculator sees it: DP x TP (TP = consecutive ranks), one stage,
    // one micro-batch, no ZeRO; TP reduces fp32 (calc_setup_lab), with or without SP
    const int dp = s->N / tp;
    CalcSetup cs = calc_setup_lab(dp, tp, 1, 1, 1, s->args->batch, s->T, 0,
                                  s->bf16 ? CALC_BF16 : CALC_FP32);
    cs.sp = sp, cs.sp_seq_calls = 1;  // (tp.c: one call per sequence)
    cs.recompute = (CalcRecompute)recompute;  // (full: each block's f and g once more)
    session_print_links(s, &cs, 0, s->rank / tp);
}
