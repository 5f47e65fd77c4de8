// ddp_buckets.c: gradient buckets, launched as soon as they are full (see ddp_buckets.h).
#include "ddp_buckets.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"
#include "trace.h"
#include "train.h"

int ddp_module_order(const GPT2Config *cfg, GPT2Param *out) {
    int n = gpt2_params(cfg, NULL);
    GPT2Param *flat = lab_xcalloc((size_t)n, sizeof(GPT2Param));
    gpt2_params(cfg, flat);  // memory order (block-major), which is already module order
    int k = 0;
    // embeddings, then each block's twelve tensors, then the final LayerNorm
    for (int i = 0; i < n; i++)
        if (flat[i].tensor == GPT2_WTE || flat[i].tensor == GPT2_WPE) out[k++] = flat[i];
    for (int l = 0; l < cfg->L; l++)
        for (int t = 0; t < GPT2_NUM_TENSORS; t++)
            for (int i = 0; i < n; i++)
                if (flat[i].layer == l && flat[i].tensor == t) out[k++] = flat[i];
    for (int i = 0; i < n; i++)
        if (flat[i].tensor == GPT2_LNFW || flat[i].tensor == GPT2_LNFB) out[k++] = flat[i];
    LAB_CHECK(k == n, "ddp_module_order: placed %d of %d parameters", k, n);
    free(flat);
    return n;
}

int ddp_num_pieces(const GPT2Config *cfg) { return cfg->L + 2; }

int ddp_ready_piece(const GPT2Param *p, int L) {
    if (p->layer >= 0) return 1 + (L - 1 - p->layer);  // block l's backward
    if (p->tensor == GPT2_LNFW || p->tensor == GPT2_LNFB) return 0;  // the head's backward
    return L + 1;  // wte, wpe: the embedding's backward (wte also gets the head's share first)
}

int ddp_assign_buckets(const size_t *bytes, int n, size_t first_cap, size_t cap, int *bucket_of) {
    int nbuckets = 0;
    // EXERCISE 03.1 Bucket assignment -> 03_ddp/README.md#exercise-031-bucket-assignment
    size_t size = 0;  // bytes in the bucket being filled
    for (int i = 0; i < n; i++) {
        bucket_of[i] = nbuckets;
        size += bytes[i];
        size_t limit = nbuckets == 0 ? first_cap : cap;
        if (size >= limit) {  // full: close it, the next parameter opens a new one
            nbuckets++;
            size = 0;
        }
    }
    if (size > 0) nbuckets++;  // the last bucket, not full
    // END EXERCISE 03.1
    return nbuckets;
}

void ddp_init(Ddp *d, GPT2 *m, const GPT2Param *params, int nparams, const int *bucket_of,
              DistGroup *g) {
    memset(d, 0, sizeof *d);
    d->model = m;
    d->group = g;
    d->grads = train_grads(m);  // fp32 or bf16 (mixed precision): all-reduced in that type
    d->dtype = train_dtype(m);
    d->esize = dist_dtype_size(d->dtype);
    d->nparams = nparams;
    d->params = lab_xcalloc((size_t)nparams, sizeof(GPT2Param));
    memcpy(d->params, params, (size_t)nparams * sizeof(GPT2Param));
    d->bucket_of = lab_xcalloc((size_t)nparams, sizeof(int));
    d->ready_piece = lab_xcalloc((size_t)nparams, sizeof(int));
    for (int i = 0; i < nparams; i++) {
        LAB_CHECK(bucket_of[i] == (i ? bucket_of[i - 1] : 0) || bucket_of[i] == bucket_of[i - 1] + 1,
                  "bucket assignment: parameter %d (%s) is in bucket %d, after bucket %d: buckets "
                  "must be runs of consecutive parameters numbered 0, 1, 2, ...",
                  i, params[i].name, bucket_of[i], i ? bucket_of[i - 1] : 0);
        d->bucket_of[i] = bucket_of[i];
        d->ready_piece[i] = ddp_ready_piece(&params[i], m->cfg.L);
    }
    d->nbuckets = nparams ? bucket_of[nparams - 1] + 1 : 0;
    d->buckets = lab_xcalloc((size_t)d->nbuckets, sizeof(DdpBucket));
    for (int i = 0; i < nparams; i++) {
        DdpBucket *b = &d->buckets[bucket_of[i]];
        if (b->count == 0) b->first = i;
        b->count++;
        b->numel += params[i].size;
    }
    // (the bucket buffers are allocated at the first launch: none with views)
    for (int b = 0; b < d->nbuckets; b++)
        d->buckets[b].work = lab_xcalloc((size_t)d->buckets[b].count, sizeof(DistWork));
    ddp_wait(d);  // nothing in flight: this just resets the per-step state
}

void ddp_use_views(Ddp *d) {
    for (int b = 0; b < d->nbuckets; b++)
        LAB_CHECK(!d->buckets[b].buf, "ddp_use_views: call it before the first launch");
    d->views = 1;
}

void ddp_free(Ddp *d) {
    for (int b = 0; b < d->nbuckets; b++) {
        mem_free(d->buckets[b].buf);
        free(d->buckets[b].work);
    }
    free(d->buckets);
    free(d->params);
    free(d->bucket_of);
    free(d->ready_piece);
    memset(d, 0, sizeof *d);
}

void ddp_launch(Ddp *d, int b) {
    DdpBucket *bk = &d->buckets[b];
    LAB_CHECK(!bk->launched, "bucket %d launched twice in one step", b);
    bk->t_launch = lab_now();
    if (d->views) {
        // views: each gradient slice is averaged where it lies, one all-reduce per parameter
        for (int i = bk->first; i < bk->first + bk->count; i++) {
            char *g = (char *)d->grads + d->params[i].offset * d->esize;
            bk->work[i - bk->first] =
                dist_iall_reduce(g, g, d->params[i].size, d->dtype, DIST_AVG, d->group);
        }
        bk->nwork = bk->count;
    } else {
        // pack: the bucket's gradient slices, one after the other
        if (!bk->buf) bk->buf = mem_alloc(bk->numel * d->esize, MEM_COMM, d->model->dev);
        size_t at = 0;  // bytes
        for (int i = bk->first; i < bk->first + bk->count; i++) {
            const GPT2Param *p = &d->params[i];
            mem_copy((char *)bk->buf + at, (char *)d->grads + p->offset * d->esize,
                     p->size * d->esize);
            at += p->size * d->esize;
        }
        bk->work[0] = dist_iall_reduce(bk->buf, bk->buf, bk->numel, d->dtype, DIST_AVG, d->group);
        bk->nwork = 1;
    }
    bk->launched = 1;
    bk->launch_seq = d->nlaunched++;
}

void ddp_piece_done(Ddp *d, int piece) {
    // EXERCISE 03.2 Launch on ready -> 03_ddp/README.md#exercise-032-launch-on-ready
    for (int i = 0; i < d->nparams; i++)  // the hook of every parameter this piece finished
        if (d->ready_piece[i] == piece) d->buckets[d->bucket_of[i]].pending--;
    // Start every complete bucket, in bucket order: all ranks must issue the same collectives
    // in the same order, so a complete bucket waits for the ones before it.
    while (d->next_launch < d->nbuckets && d->buckets[d->next_launch].pending == 0) {
        d->buckets[d->next_launch].launch_piece = piece;
        ddp_launch(d, d->next_launch);
        d->next_launch++;
    }
    // END EXERCISE 03.2
    ddp_poke(d);
}

void ddp_poke(Ddp *d) {
    for (int b = 0; b < d->nbuckets; b++) {
        DdpBucket *bk = &d->buckets[b];
        if (!bk->launched || bk->done) continue;
        int all = 1;
        for (int w = 0; w < bk->nwork; w++) all &= dist_test(&bk->work[w]);
        if (all) {
            bk->done = 1;
            bk->t_done = lab_now();
        }
    }
}

void ddp_wait(Ddp *d) {
    for (int b = 0; b < d->nbuckets; b++) {
        DdpBucket *bk = &d->buckets[b];
        LAB_CHECK(bk->launched || d->nlaunched == 0,
                  "bucket %d was never launched this step (is every parameter's hook counted?)", b);
        if (bk->launched) {
            if (!bk->done) {
                dist_wait_all(bk->work, bk->nwork);
                bk->t_done = lab_now();
            }
            // unpack: the averaged gradients back where the optimizer reads them
            size_t at = 0;  // bytes
            for (int i = bk->first; !d->views && i < bk->first + bk->count; i++) {
                const GPT2Param *p = &d->params[i];
                mem_copy((char *)d->grads + p->offset * d->esize, (char *)bk->buf + at,
                         p->size * d->esize);
                at += p->size * d->esize;
            }
            char name[48], sz[32];
            snprintf(name, sizeof name, "all-reduce bucket %d (%s)", b,
                     mem_format(sz, sizeof sz, (double)(bk->numel * d->esize)));
            trace_span(name, TRACE_COMM, bk->t_launch, bk->t_done);
        }
        // ready for the next step
        bk->pending = bk->count;
        bk->launched = bk->done = 0;
        bk->nwork = 0;
        bk->launch_piece = -1;
        bk->launch_seq = -1;
    }
    d->next_launch = 0;
    d->nlaunched = 0;
}

void ddp_all_buckets_now(Ddp *d) {
    for (int b = 0; b < d->nbuckets; b++) ddp_launch(d, b);
    ddp_wait(d);
}

void ddp_print_buckets(const Ddp *d, FILE *out) {
    int L = d->model->cfg.L;
    char sz[32];
    fprintf(out, "  %-6s %-34s %6s %12s  %s\n", "bucket", "parameters (in bucket order)", "count",
            "size", "complete after backward of");
    for (int b = 0; b < d->nbuckets; b++) {
        const DdpBucket *bk = &d->buckets[b];
        const GPT2Param *p0 = &d->params[bk->first], *p1 = &d->params[bk->first + bk->count - 1];
        char span[80];
        if (bk->count == 1) snprintf(span, sizeof span, "%s", p0->name);
        else snprintf(span, sizeof span, "%s .. %s", p0->name, p1->name);
        int ready = 0;
        for (int i = bk->first; i < bk->first + bk->count; i++)
            if (d->ready_piece[i] > ready) ready = d->ready_piece[i];
        char when[32];
        if (ready == 0) snprintf(when, sizeof when, "head");
        else if (ready == L + 1) snprintf(when, sizeof when, "embedding");
        else snprintf(when, sizeof when, "block %d", L - ready);
        fprintf(out, "  %-6d %-34s %6d %12s  %s\n", b, span, bk->count,
                mem_format(sz, sizeof sz, (double)(bk->numel * d->esize)), when);
    }
}
