// dp_master.c: replicate, scatter and reduce through the master (see dp_master.h).
#include "dp_master.h"

#include "check.h"
#include "mem.h"

// Message tags, one per kind, so a message can never be taken for another.
enum { TAG_REPLICATE = 201, TAG_INPUTS = 202, TAG_TARGETS = 203, TAG_GRADS = 204 };

void dp_replicate(void *params, size_t n, DistDtype dt, DistGroup *g) {
    if (g->rank == 0) {
        for (int r = 1; r < g->size; r++) dist_send(params, n, dt, r, TAG_REPLICATE, g);
    } else {
        dist_recv(params, n, dt, 0, TAG_REPLICATE, g);
    }
}

void dp_scatter_batch(const int *all_inputs, const int *all_targets, int *inputs, int *targets,
                      int rows, int T, DistGroup *g) {
    // EXERCISE 02.1 Scatter the batch -> 02_data_parallel/README.md#exercise-021-scatter-the-batch
    size_t count = (size_t)rows * (size_t)T;  // tokens per rank
    if (g->rank == 0) {
        // "give me all the data, I split it": rank r's rows start at row r * rows
        for (int r = 1; r < g->size; r++) {
            dist_send(all_inputs + (size_t)r * count, count, DIST_I32, r, TAG_INPUTS, g);
            dist_send(all_targets + (size_t)r * count, count, DIST_I32, r, TAG_TARGETS, g);
        }
        mem_copy(inputs, all_inputs, count * sizeof(int));  // the master keeps rows [0, rows)
        mem_copy(targets, all_targets, count * sizeof(int));
    } else {
        dist_recv(inputs, count, DIST_I32, 0, TAG_INPUTS, g);
        dist_recv(targets, count, DIST_I32, 0, TAG_TARGETS, g);
    }
    // END EXERCISE 02.1
}

int dp_tree_rounds(int n) {
    int rounds = 0;
    for (int d = 1; d < n; d *= 2) rounds++;
    return rounds;
}

int dp_tree_receives(int rank, int n) {
    // rank receives in round d when rank % 2d == 0 and rank + d < n; the first round is d = 1
    return rank % 2 == 0 && rank + 1 < n;
}

void dp_accumulate(void *acc, const void *in, size_t n, DistDtype dt, const Kernels *k) {
    if (dt == DIST_F32) {
        k->residual_forward(acc, acc, in, n);
        return;
    }
    LAB_CHECK(dt == DIST_BF16, "dp_accumulate: gradients are fp32 or bf16, not dtype %d", (int)dt);
    // bf16: widen both to fp32 a chunk at a time, add, round once (a GPU does this in registers)
    enum { CHUNK = DP_ACCUM_CHUNK };
    Device dev = k == &kernels_cpu ? DEV_CPU : DEV_CUDA;
    float *a = mem_alloc(2 * CHUNK * sizeof(float), MEM_COMM, dev), *b = a + CHUNK;
    uint16_t *acc16 = acc;
    const uint16_t *in16 = in;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t len = n - i < CHUNK ? n - i : CHUNK;
        k->bf16_to_f32(a, acc16 + i, len);
        k->bf16_to_f32(b, in16 + i, len);
        k->residual_forward(a, a, b, len);
        k->f32_to_bf16(acc16 + i, a, len);
    }
    mem_free(a);
}

void dp_reduce_grads(void *grads, void *scratch, size_t n, DistDtype dt, DpReduce how,
                     const Kernels *k, DistGroup *g) {
    const int rank = g->rank, N = g->size;
    if (how == DP_REDUCE_LINEAR) {
        if (rank != 0) {
            dist_send(grads, n, dt, 0, TAG_GRADS, g);
            return;
        }
        for (int r = 1; r < N; r++) {  // one at a time: rank 0's link carries all N-1
            dist_recv(scratch, n, dt, r, TAG_GRADS, g);
            dp_accumulate(grads, scratch, n, dt, k);  // grads += scratch
        }
        return;
    }
    LAB_CHECK(how == DP_REDUCE_TREE, "dp_reduce_grads: unknown reduction %d", (int)how);
    // EXERCISE 02.2 Tree reduce to the master -> 02_data_parallel/README.md#exercise-022-tree-reduce-to-the-master
    for (int d = 1; d < N; d *= 2) {
        if (rank % (2 * d) == d) {  // pass my partial sum up the tree; I am done
            dist_send(grads, n, dt, rank - d, TAG_GRADS, g);
            break;
        }
        if (rank + d < N) {  // rank % 2d == 0 here: add my child's partial sum
            dist_recv(scratch, n, dt, rank + d, TAG_GRADS, g);
            dp_accumulate(grads, scratch, n, dt, k);
        }
    }
    // END EXERCISE 02.2
}
