// mpi_ddp_tree.c: chapter 02's reductions to the master (exercise 02.2: the tree), checked.
//
// Launched by tests/test_02_data_parallel.c as `mpirun -np N build/tests/mpi_ddp_tree`. Every
// rank fills a buffer with small integers that depend on (rank, index); their sum over ranks is
// exact in fp32 whatever the order, so rank 0's result is compared bit for bit with the sum
// computed locally. The byte counters must show the tree's shape:
//   rank 0 received ceil(log2 N) buffers (linear: N-1); every other rank sent exactly one;
//   all ranks together received N-1 buffers (each rank's partial sum travels once).
// Runs the tree, then the linear reduce, on a count that is not a multiple of anything, in fp32
// and in bf16 (mixed precision; the values and their sums are small integers, exact in bf16).
// Prints "mpi_ddp_tree: OK" on success.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "mpitest.h"
#include "dp_master.h"
#include "kernels.h"

static float value(int rank, size_t i, int salt) {
    return (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)salt) % 17) - 8);
}

static void run(DpReduce how, DistDtype dt, const char *name, int salt) {
    DistGroup *g = dist_world();
    const int N = g->size, rank = g->rank;
    const size_t n = 10007;
    const int bf16 = dt == DIST_BF16;
    float *grads = lab_xmalloc(n * sizeof(float)), *scratch = lab_xmalloc(n * sizeof(float));
    uint16_t *grads16 = lab_xmalloc(n * sizeof(uint16_t));
    uint16_t *scratch16 = lab_xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) grads[i] = value(rank, i, salt);
    if (bf16) kernels_cpu.f32_to_bf16(grads16, grads, n);
    dist_counters_reset();
    dp_reduce_grads(bf16 ? (void *)grads16 : grads, bf16 ? (void *)scratch16 : scratch, n, dt, how,
                    kernels_get(DEV_CPU), g);
    if (bf16) kernels_cpu.bf16_to_f32(grads, grads16, n);
    const DistCounters *c = dist_counters();
    uint64_t S = n * (bf16 ? sizeof(uint16_t) : sizeof(float));
    uint64_t sent = c->sent[OP_SEND], recv = c->recv[OP_RECV];
    if (rank == 0) {
        size_t bad = 0, first = 0;
        float first_want = 0;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < N; r++) want += value(r, i, salt);
            if (grads[i] != want && !bad++) first = i, first_want = want;
        }
        mpi_check(bad == 0, "%s: %zu of %zu elements of rank 0's sum are wrong; the first, element %zu, "
                  "is %g, want %g (the sum over the %d ranks)", name, bad, n, first,
                  bad ? (double)grads[first] : 0.0, (double)first_want, N);
        int rounds = 0;  // ceil(log2 N)
        while ((1 << rounds) < N) rounds++;
        uint64_t want_recv = how == DP_REDUCE_TREE ? (uint64_t)rounds * S : (uint64_t)(N - 1) * S;
        mpi_check(recv == want_recv, "%s: rank 0 received %llu bytes, expected %llu (%s)", name,
              (unsigned long long)recv, (unsigned long long)want_recv,
              how == DP_REDUCE_TREE ? "ceil(log2 N) buffers" : "N-1 buffers");
        mpi_check(sent == 0, "%s: rank 0 sent %llu bytes; the root only receives", name,
              (unsigned long long)sent);
    } else {
        mpi_check(sent == S && c->calls[OP_SEND] == 1, "%s: rank %d sent %llu bytes in %llu sends, "
              "expected one buffer of %llu", name, rank, (unsigned long long)sent,
              (unsigned long long)c->calls[OP_SEND], (unsigned long long)S);
    }
    double total_recv = (double)recv;  // every partial sum travels once: N-1 buffers in all
    dist_all_reduce(&total_recv, &total_recv, 1, DIST_F64, DIST_SUM, g);
    mpi_check(total_recv == (double)(N - 1) * (double)S, "%s: all ranks together received %.0f bytes, "
          "expected N-1 = %d buffers of %llu", name, total_recv, N - 1, (unsigned long long)S);
    free(grads);
    free(scratch);
    free(grads16);
    free(scratch16);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    run(DP_REDUCE_TREE, DIST_F32, "tree", 1);
    run(DP_REDUCE_LINEAR, DIST_F32, "linear", 2);
    run(DP_REDUCE_TREE, DIST_BF16, "tree bf16", 3);
    run(DP_REDUCE_LINEAR, DIST_BF16, "linear bf16", 4);
    int bad = mpi_failed();
    dist_all_reduce(&bad, &bad, 1, DIST_I32, DIST_SUM, dist_world());
    if (dist_rank() == 0 && bad) printf("mpi_ddp_tree: %d FAILED checks\n", bad);
    if (dist_rank() == 0 && !bad) printf("mpi_ddp_tree: OK\n");
    dist_finalize();
    return bad ? 1 : 0;
}
