// train.c: the optimizer step and weight copies in the model's precision (see train.h).
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"

float *train_master_alloc(GPT2 *m) {
    if (m->dtype == GPT2_FP32) return m->params;
    return mem_alloc(m->num_params * sizeof(float), MEM_MASTER, m->dev);
}

void train_master_free(GPT2 *m, float *master) {
    LAB_CHECK(m->num_params > 0, "train_master_free after gpt2_free: free the master first");
    if (master && master != m->params) mem_free(master);
}

void train_master_to_model(GPT2 *m, const float *master) {
    if (m->dtype == GPT2_BF16) m->k->f32_to_bf16(m->params_bf16, master, m->num_params);
    else LAB_CHECK(master == m->params, "train_master_to_model: fp32 master must be the params");
}

void train_master_init(GPT2 *m, float *master, uint64_t seed) {
    float *w = lab_xmalloc(m->num_params * sizeof(float));
    gpt2_init_local(m, seed, w);
    mem_copy(master, w, m->num_params * sizeof(float));
    free(w);
    train_master_to_model(m, master);
}

AdamWRange train_adamw_whole(GPT2 *m, float *master, float *opt_m, float *opt_v) {
    AdamWRange r = {.lo = 0, .hi = m->num_params, .master = master, .grad = train_grads(m),
                    .m = opt_m, .v = opt_v};
    if (m->dtype == GPT2_BF16) {  // the weights rounded from the master; grads widened in chunks
        r.bf16 = m->params_bf16;
        r.scratch = m->work_grads;
        r.chunk = m->work_size;
    }
    return r;
}

double train_grad_sum_squares(const GPT2 *m, const void *g, size_t n) {
    if (m->dtype == GPT2_BF16) return bf16_sum_squares(m->k, g, n, m->work_grads, m->work_size);
    return m->k->sum_squares(g, n);
}

double train_adamw_step(const AdamW *h, GPT2 *m, int step, float *master, float *opt_m,
                        float *opt_v, const GPT2Param *plist, int nplist) {
    const Kernels *k = m->k;
    const size_t n = m->num_params;
    double norm_sq = train_grad_sum_squares(
        m, m->dtype == GPT2_FP32 ? (const void *)m->grads : (const void *)m->grads_bf16, n);
    AdamWRange r = train_adamw_whole(m, master, opt_m, opt_v);
    adamw_update(h, k, step, &r, plist, nplist, adamw_clip_scale(h, norm_sq, step));
    return norm_sq;
}

// n values of the model's precision (fp32 or bf16 storage) -> fp32 on the host, in llm.c's
// order for the full model (a stage: its own memory order)
static void to_host_f32(const GPT2 *m, float *host, const float *f32, const uint16_t *b16) {
    const size_t n = m->num_params;
    float *mem = lab_xmalloc(n * sizeof(float));
    if (m->dtype == GPT2_FP32) {
        mem_copy(mem, f32, n * sizeof(float));
    } else {
        uint16_t *h16 = lab_xmalloc(n * sizeof(uint16_t));
        mem_copy(h16, b16, n * sizeof(uint16_t));
        kernels_cpu.bf16_to_f32(mem, h16, n);
        free(h16);
    }
    if (m->l0 == 0 && m->l1 == m->cfg.L && m->tp == 1) gpt2_to_llmc(&m->cfg, mem, host);
    else memcpy(host, mem, n * sizeof(float));
    free(mem);
}

void train_params_to_host(const GPT2 *m, float *host) {
    to_host_f32(m, host, m->params, m->params_bf16);
}

void train_params_to_host_from(const GPT2 *m, const void *params, float *host) {
    to_host_f32(m, host, params, params);
}

void train_grads_to_host(const GPT2 *m, float *host) {
    to_host_f32(m, host, m->grads, m->grads_bf16);
}

void *train_grads(GPT2 *m) {
    return m->dtype == GPT2_BF16 ? (void *)m->grads_bf16 : (void *)m->grads;
}

void *train_params(GPT2 *m) {
    return m->dtype == GPT2_BF16 ? (void *)m->params_bf16 : (void *)m->params;
}

DistDtype train_dtype(const GPT2 *m) { return m->dtype == GPT2_BF16 ? DIST_BF16 : DIST_F32; }

void train_inject_nan(GPT2 *m) {
    float nan = NAN;
    uint16_t nan16 = bf16_from_f32(NAN);
    if (m->dtype == GPT2_BF16) mem_copy(m->grads_bf16, &nan16, sizeof nan16);
    else mem_copy(m->grads, &nan, sizeof nan);
}
