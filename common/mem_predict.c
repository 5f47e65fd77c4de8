// mem_predict.c: a run's peak host bytes per rank, predicted, and the refusal (mem_predict.h).
#include "mem_predict.h"

#include <stdio.h>
#include <string.h>

#include "calc.h"
#include "check.h"
#include "dist.h"
#include "mem.h"
#include "schedule.h"
#include "tp.h"

double mem_prediction_total(MemPrediction p) { return p.state + p.acts + p.buffers; }

double mem_predict_largest_piece(const GPT2Config *cfg) {
    const double V = cfg->V, T = cfg->T, C = cfg->C;
    // a block: ln1 (2C), qkv (3C x C + 3C), attproj (C x C + C), ln2 (2C), fc (4C x C + 4C),
    // fcproj (C x 4C + C) = 12 C^2 + 13 C; the embedding wte + wpe; the head lnf + (tied) wte
    const double block = 12.0 * C * C + 13.0 * C, embed = V * C + T * C, head = V * C + 2.0 * C;
    double most = embed > head ? embed : head;
    return most > block ? most : block;
}

double mem_predict_scratch(const GPT2Config *cfg, int rows, int bf16, double nparams_piece) {
    const double BT = (double)rows * cfg->T, T = cfg->T, hs = (double)cfg->C / cfg->NH;
    double bytes = 2.0 * BT * sizeof(int)       // the session's inputs and targets
                   + 2.0 * BT * sizeof(int)     // the model's (gpt2_acts_alloc)
                   + BT * sizeof(float)         // the per-position losses
                   + 4.0 * (T * hs + 2.0 * T * T);  // kernels_cpu: one head's kᵀ, datt, dpreatt
    if (bf16) bytes += 2.0 * 4.0 * nparams_piece;   // work and work_grads: fp32, one piece each
    return bytes;
}

MemPrediction mem_predict_replica(const GPT2Config *cfg, int rows, int bf16, int has_optimizer) {
    return mem_predict_replica_recompute(cfg, rows, bf16, has_optimizer, GPT2_RECOMPUTE_NONE);
}

MemPrediction mem_predict_replica_recompute(const GPT2Config *cfg, int rows, int bf16,
                                            int has_optimizer, GPT2Recompute r) {
    const double n = (double)gpt2_param_count(cfg), w = bf16 ? 2.0 : 4.0;
    MemPrediction p;
    p.state = n * (w + w) + (has_optimizer ? n * ((bf16 ? 4.0 : 0.0) + 4.0 + 4.0) : 0.0);
    p.acts = calc_activation_bytes_recompute(cfg, rows, cfg->T, bf16 ? GPT2_BF16 : GPT2_FP32, r);
    p.buffers = mem_predict_scratch(cfg, rows, bf16, bf16 ? mem_predict_largest_piece(cfg) : 0);
    return p;
}

MemPrediction mem_predict_pipeline_recompute(const GPT2Config *cfg, const Schedule *s, int rank,
                                             int Bm, int bf16, GPT2Recompute r) {
    const int S = s->p * s->v;
    const double w = bf16 ? 2.0 : 4.0, BT = (double)Bm * cfg->T, msg = BT * cfg->C;
    const double sets = (double)s->m * s->v;  // activation sets alive, at most
    CalcModel cm = calc_model_from_gpt2(cfg);
    MemPrediction p = {0, 0, 0};
    for (int c = 0; c < s->v; c++)
        p.state += (double)calc_stage_params(&cm, 1, S, c * s->p + rank) *
                   (w + w + (bf16 ? 4.0 : 0.0) + 4.0 + 4.0);
    const GPT2Dtype dt = bf16 ? GPT2_BF16 : GPT2_FP32;
    p.acts = calc_pipe_peak_bytes_recompute(cfg, s, rank, Bm, cfg->T, dt, r) +
             s->v * calc_recompute_scratch_bytes(cfg, Bm, cfg->T, r);  // each chunk's scratch
    // calc_pipe_peak_bytes counts at op boundaries. Inside a split B, what W keeps is allocated
    // (gpt2_acts_keep_for_w) before the set is freed: W's bytes but the wsave the set already
    // holds (10 C fp32 a block and position), on top of the sets alive before it, at most.
    const int nb = cfg->L / S;
    if (s->split) p.acts += calc_pipe_w_bytes(cfg, nb, Bm, cfg->T, dt) - 40.0 * nb * msg;
    p.buffers = mem_predict_scratch(cfg, Bm, bf16, s->v * mem_predict_largest_piece(cfg)) +
                (sets - 1.0) * 3.0 * BT * 4.0  // the other sets' inputs, targets, losses
                + 2.0 * sets * msg * 4.0 + (bf16 ? (2.0 * sets + 1.0) * msg * 2.0 : 0.0);
    return p;
}

MemPrediction mem_predict_tp_recompute(const GPT2Config *cfg, int tp, int r, int sp, int rows, int bf16,
                                       GPT2Recompute rc) {
    // t = 1 without SP: gpt2's own sets (tp.h), a single replica's memory
    if (tp == 1 && !sp) return mem_predict_replica_recompute(cfg, rows, bf16, 1, rc);
    const double w = bf16 ? 2.0 : 4.0;
    CalcModel cm = calc_model_from_gpt2(cfg);
    MemPrediction p;
    p.state = (double)calc_stage_params(&cm, tp, 1, 0) * (w + w + (bf16 ? 4.0 : 0.0) + 4.0 + 4.0);
    // the slice's set and what its pieces share (tp.c's, from the shape: nothing allocated)
    const TpShape s = {.l0 = 0, .l1 = cfg->L, .tp = tp, .r = r, .sp = sp, .B = rows, .T = cfg->T,
                       .recompute = rc};
    const GPT2Dtype dt = bf16 ? GPT2_BF16 : GPT2_FP32;
    p.acts = (double)tp_acts_bytes(cfg, s, dt) + (double)tp_shared_bytes(cfg, s, dt);
    p.buffers = mem_predict_scratch(cfg, rows, bf16, bf16 ? mem_predict_largest_piece(cfg) : 0) -
                3.0 * rows * cfg->T * 4.0;  // (the slice reads the session's batch in place: no copies)
    return p;
}

MemPrediction mem_predict_largest_rank(MemPredictFn fn, const void *ctx, const LabArgs *args,
                                       int batch, int world) {
    MemPrediction most = {0, 0, 0};
    for (int r = 0; r < world; r++) {
        MemPrediction p = fn(ctx, args, batch, r);
        if (r == 0 || mem_prediction_total(p) > mem_prediction_total(most)) most = p;
    }
    return most;
}

void mem_refuse_if_it_cannot_fit(const LabArgs *args, MemPredictFn fn, const void *ctx,
                                 int batch_step) {
    if (strcmp(args->device, "cpu") != 0) return;  // a GPU's memory: the runtime reports it
    LAB_CHECK(batch_step >= 1, "mem_refuse_if_it_cannot_fit: batch step %d", batch_step);
    const int world = dist_size(), here = mem_ranks_on_this_machine();
    mem_set_predicted_peak(mem_prediction_total(fn(ctx, args, args->batch, dist_rank())));
    const int ranks = here < world ? here : world;
    const double limit = args->mem_limit_mib > 0 ? args->mem_limit_mib * 1048576.0
                                                 : mem_host_available();
    if (limit <= 0) return;  // no /proc/meminfo: nothing to compare with
    MemPrediction p = mem_predict_largest_rank(fn, ctx, args, args->batch, world);
    const double each = mem_prediction_total(p), need = each * ranks;
    if (need <= limit) return;
    // The largest --batch (a multiple of batch_step) that fits: the prediction grows with it.
    int fit = 0;
    for (int lo = 1, hi = args->batch / batch_step; lo <= hi;) {
        int mid = lo + (hi - lo) / 2;
        MemPrediction q = mem_predict_largest_rank(fn, ctx, args, mid * batch_step, world);
        if (mem_prediction_total(q) * ranks <= limit) fit = mid * batch_step, lo = mid + 1;
        else hi = mid - 1;
    }
    char x[32], st[32], ac[32], bu[32], y[32], z[32], hint[160];
    if (fit > 0 && fit < args->batch)
        snprintf(hint, sizeof hint, "use --batch %d or less (or --mem-limit MiB to override)", fit);
    else
        snprintf(hint, sizeof hint, "even --batch %d does not fit: use a smaller model or more "
                 "machines (or --mem-limit MiB to override)", batch_step);
    lab_fail_collective(
        "--batch %d: predicted memory %s per rank (model state %s + activations %s + buffers %s) "
        "x %d rank%s on this machine = %s exceeds the %s available (%s); %s", args->batch,
        mem_format(x, sizeof x, each), mem_format(st, sizeof st, p.state),
        mem_format(ac, sizeof ac, p.acts), mem_format(bu, sizeof bu, p.buffers), ranks,
        ranks == 1 ? "" : "s", mem_format(y, sizeof y, need), mem_format(z, sizeof z, limit),
        args->mem_limit_mib > 0 ? "--mem-limit" : "MemAvailable in /proc/meminfo", hint);
}
