// mpi_ddp_launch.c: DDP's launch-on-ready hook (exercise 03.2), checked on real backward pieces.
//
// Launched by tests/test_03_ddp.c as `mpirun -np N build/tests/mpi_ddp_launch`. A small GPT-2,
// the same weights on every rank, a different slice of the batch per rank. The buckets are a
// hand-made grouping of the parameters in reverse module order (not exercise 03.1's), with
// bucket edges inside blocks, so a bucket may need two backward pieces to complete.
// After every backward piece it checks, for every bucket: launched iff all its gradients are
// final (not earlier: stale gradients; not later: no overlap), in bucket order. After ddp_wait
// the gradients must equal the plain all-reduce (average) of the ranks' full gradients.
// Two steps, so the per-step reset is checked too. Prints "mpi_ddp_launch: OK" on success.
// With --thread-views: the buckets are views all-reduced on the communication thread (03_ddp's
// default); without: packed buckets, non-blocking MPI polled by the hook.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "ddp_buckets.h"
#include "dist.h"
#include "mpitest.h"
#include "gpt2.h"

// When backward has made p's gradient final, worked out here from the model's structure:
// the head (piece 0) finishes lnfw/lnfb, piece 1 + (L-1-l) finishes block l, the embedding
// (piece L+1) finishes wpe and wte (wte also feeds the tied output layer in the head).
static int final_after(const GPT2Param *p, int L) {
    if (p->layer >= 0) return 1 + (L - 1 - p->layer);
    if (strcmp(p->name, "lnfw") == 0 || strcmp(p->name, "lnfb") == 0) return 0;
    return L + 1;
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    DistGroup *world = dist_world();
    const int N = world->size, rank = world->rank;
    GPT2Config cfg = {.V = 64, .T = 16, .L = 3, .C = 32, .NH = 2};
    const int L = cfg.L, Bl = 2, T = cfg.T;

    GPT2 model;
    gpt2_build(&model, cfg, DEV_CPU);
    gpt2_init_params(&model, 7);
    gpt2_alloc_grads(&model);
    gpt2_alloc_acts(&model, Bl, T);
    const size_t n = model.num_params;
    DataSource data;
    data_init_synthetic(&data, cfg.V, 3);
    int *inputs = lab_xmalloc((size_t)Bl * T * sizeof(int));
    int *targets = lab_xmalloc((size_t)Bl * T * sizeof(int));

    // reverse module order, grouped by hand into 6 buckets of 1, 3, 5, 12, 6, 13 parameters
    int np = 4 + 12 * L;
    GPT2Param *order = lab_xcalloc((size_t)np, sizeof(GPT2Param));
    GPT2Param *tmp = lab_xcalloc((size_t)np, sizeof(GPT2Param));
    ddp_module_order(&cfg, tmp);
    for (int i = 0; i < np; i++) order[i] = tmp[np - 1 - i];
    const int lens[6] = {1, 3, 5, 12, 6, 13};
    int *bucket_of = lab_xcalloc((size_t)np, sizeof(int));
    int *complete_after = lab_xcalloc(6, sizeof(int));  // per bucket: the piece that completes it
    for (int b = 0, i = 0; b < 6; b++)
        for (int j = 0; j < lens[b]; j++, i++) {
            bucket_of[i] = b;
            int f = final_after(&order[i], L);
            if (f > complete_after[b]) complete_after[b] = f;
        }
    Ddp ddp;
    ddp_init(&ddp, &model, order, np, bucket_of, world);
    mpi_check(ddp.nbuckets == 6, "ddp_init made %d buckets from the 6-bucket layout", ddp.nbuckets);
    if (argc > 1 && strcmp(argv[1], "--thread-views") == 0) {
        dist_comm_thread_start(world);
        ddp_use_views(&ddp);
    }

    float *ref = lab_xmalloc(n * sizeof(float));
    for (int step = 0; step < 2; step++) {
        data_batch(&data, (uint64_t)step, Bl * N, T, rank * Bl, Bl, inputs, targets);
        float dloss = 1.0f / (float)(Bl * T);
        // the reference: full local backward, then one plain all-reduce (average)
        gpt2_zero_grad(&model);
        gpt2_forward(&model, inputs, targets);
        gpt2_backward(&model, dloss);
        memcpy(ref, model.grads, n * sizeof(float));
        dist_all_reduce(ref, ref, n, DIST_F32, DIST_AVG, world);

        // the same backward in pieces, with the hook after each
        gpt2_zero_grad(&model);
        gpt2_forward(&model, inputs, targets);
        for (int piece = 0; piece <= L + 1; piece++) {
            if (piece == 0) gpt2_head_backward(&model, dloss);
            else if (piece <= L) gpt2_block_backward(&model, L - piece);
            else gpt2_embed_backward(&model);
            ddp_piece_done(&ddp, piece);
            for (int b = 0; b < 6; b++) {
                const DdpBucket *bk = &ddp.buckets[b];
                int should = complete_after[b] <= piece;
                mpi_check(bk->launched == should,
                      "step %d, after backward piece %d: bucket %d (complete after piece %d) is %s, "
                      "want %s", step, piece, b, complete_after[b], bk->launched ? "launched" : "not launched",
                      should ? "launched" : "not launched yet");
                if (bk->launched) {
                    mpi_check(bk->launch_piece == complete_after[b],
                          "step %d: bucket %d launched after piece %d, but it was complete after "
                          "piece %d", step, b, bk->launch_piece, complete_after[b]);
                    mpi_check(bk->launch_seq == b, "step %d: bucket %d was launched as number %d, want "
                          "%d: buckets must start in order", step, b, bk->launch_seq, b);
                }
            }
        }
        ddp_wait(&ddp);
        // 2 ranks: a+b is exact whatever the order. More ranks: the bucketed all-reduce may sum
        // in another order than the whole-buffer one; rounding is ~1e-7 of the summands, so
        // allow 1e-6 of the largest gradient. A stale or missing gradient is off by its size.
        double scale = 0;
        for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)ref[i]));
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)model.grads[i] - (double)ref[i]);
            double tol = N == 2 ? 0.0 : 1e-6 * scale;
            if (!(d <= tol)) worst = isnan(d) ? INFINITY : fmax(worst, d);
        }
        mpi_check(worst == 0, "step %d: averaged gradients differ from the plain all-reduce by up to "
              "%g (stale or missing gradients in a bucket?)", step, worst);
    }

    int bad = mpi_failed();
    dist_all_reduce(&bad, &bad, 1, DIST_I32, DIST_SUM, world);
    if (rank == 0 && bad) printf("mpi_ddp_launch: %d FAILED checks\n", bad);
    if (rank == 0 && !bad) printf("mpi_ddp_launch: OK\n");
    ddp_free(&ddp);
    gpt2_free(&model);
    data_free(&data);
    free(order); free(tmp); free(bucket_of); free(complete_after); free(ref);
    free(inputs); free(targets);
    dist_finalize();
    return bad ? 1 : 0;
}
