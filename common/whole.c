// whole.c: the one gather, save and load of a layout's slices (whole.h).
#include "whole.h"

#include <stdlib.h>

#include "check.h"
#include "ckpt.h"

static size_t whole_n(const WholeView *v) { return gpt2_param_count(&v->slice(v->ctx, 0)->cfg); }

void whole_gather(const WholeView *v, WholeBuf which, float *full) {
    if (!v->group) return;
    const size_t n = whole_n(v);
    float *mine = lab_xcalloc(n, sizeof(float));
    for (int c = 0; c < v->nslices; c++) {
        const GPT2 *m = v->slice(v->ctx, c);
        float *scratch = lab_xmalloc(m->num_params * sizeof(float));
        const float *buf = v->part(v->ctx, c, which, scratch);
        if (buf) gpt2_unshard(m, buf, mine, v->with_replicated);
        free(scratch);
    }
    dist_reduce(mine, full, n, DIST_F32, DIST_SUM, 0, v->group);
    free(mine);
}

// --save-sharded: each rank's part: its slices' elements (ZeRO: its pieces of them).
static void save_sharded(const WholeView *v, const char *path, int step) {
    const LabArgs *a = v->args;
    CkptShard sh;
    ckpt_shard_begin(&sh, whole_n(v));
    for (int c = 0; c < v->nslices; c++) {
        const GPT2 *m = v->slice(v->ctx, c);
        const size_t k = m->num_params;
        float *b[4];
        for (int i = 0; i < 4; i++) b[i] = lab_xcalloc(k, sizeof(float));
        if (v->pieces) {
            v->pieces(v->ctx, c, b[0], b[1], b[2], b[3]);
            ckpt_shard_add_slice(&sh, m, b[0], b[1], b[2], b[3], v->with_replicated);
        } else {
            const float *buf[3];
            for (int i = 0; i < 3; i++) buf[i] = v->part(v->ctx, c, (WholeBuf)(WHOLE_MASTER + i), b[i]);
            if (buf[0])
                ckpt_shard_add_slice(&sh, m, buf[0], buf[1], buf[2], NULL, v->with_replicated);
        }
        for (int i = 0; i < 4; i++) free(b[i]);
    }
    ckpt_shard_write(path, &v->slice(v->ctx, 0)->cfg, step, (uint64_t)a->seed,
                     (uint64_t)a->data_seed, &sh);
}

void whole_save(void *view, const char *path, int step) {
    const WholeView *v = view;
    const LabArgs *a = v->args;
    if (!v->group) return;
    if (ckpt_policy().sharded) {
        save_sharded(v, path, step);
        return;
    }
    const size_t n = whole_n(v);
    const int writer = v->group->rank == 0;
    float *full[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (writer) full[i] = lab_xcalloc(n, sizeof(float));
        whole_gather(v, (WholeBuf)(WHOLE_MASTER + i), full[i]);
    }
    if (writer)
        ckpt_save_training(path, &v->slice(v->ctx, 0)->cfg, step, (uint64_t)a->seed,
                           (uint64_t)a->data_seed, full[0], full[1], full[2], n);
    for (int i = 0; i < 3; i++) free(full[i]);
}

void whole_weights_to_host(void *view, float *full) {
    const WholeView *v = view;
    if (!v->group) return;
    float *mem = v->group->rank == 0 ? lab_xcalloc(whole_n(v), sizeof(float)) : NULL;
    whole_gather(v, WHOLE_WEIGHTS, mem);
    if (full) gpt2_to_llmc(&v->slice(v->ctx, 0)->cfg, mem, full);
    free(mem);
}

int whole_load(void *view, const LabArgs *a) {
    const WholeView *v = view;
    if (!a->resume && !a->load_weights) return 0;
    const GPT2Config cfg = v->slice(v->ctx, 0)->cfg;
    const size_t n = gpt2_param_count(&cfg);
    float *buf[3] = {lab_xcalloc(n, sizeof(float)), lab_xcalloc(n, sizeof(float)),
                     lab_xcalloc(n, sizeof(float))};
    int start = 0;
    if (!v->readers || v->readers->rank == 0) {
        if (a->resume) start = ckpt_resume_training(a->resume, &cfg, buf[0], buf[1], buf[2], n);
        else ckpt_load_weights_into(a->load_weights, &cfg, buf[0], n);
    }
    if (v->readers) {
        dist_broadcast(&start, 1, DIST_I32, 0, v->readers);
        for (int i = 0; i < (a->resume ? 3 : 1); i++)
            dist_broadcast(buf[i], n, DIST_F32, 0, v->readers);
    }
    for (int c = 0; c < v->nslices; c++)
        v->take(v->ctx, c, buf[0], a->resume ? buf[1] : NULL, a->resume ? buf[2] : NULL);
    for (int i = 0; i < 3; i++) free(buf[i]);
    return start;
}
