// mpi_ddp_comm_thread.c: the communication thread of common/dist.h, which 03_ddp's buckets use.
//
// Launched by tests/test_03_ddp.c as `mpirun -np N build/tests/mpi_ddp_comm_thread [--misuse]`.
// With the thread started, dist_iall_reduce on host buffers is queued and run by the thread.
// Checked against the blocking dist_all_reduce of the same data on the same ranks:
//   - every dtype and op DDP-like code uses (f32 sum/avg, bf16 sum/avg, f64 max, i32 sum), in
//     place and out of place, sizes from 0 to 300,000 elements, results bit-identical (the same
//     MPI algorithm on a communicator of the same size);
//   - many ops in flight at once, finished in another order than they were started (dist_wait
//     of the last first, dist_test polling of the others);
//   - the byte counters: the same as the blocking calls;
//   - the thread's time accounting moves; stop and start again work.
// Prints "mpi_ddp_comm_thread: OK". With --misuse it calls dist_barrier while an all-reduce is
// queued: that must end the job with a message naming the rule (the test checks the message).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "mpitest.h"
#include "kernels.h"

typedef struct Case {
    DistDtype dt;
    DistOp op;
    size_t count;
    int in_place;
} Case;

// Rank- and index-dependent values, not exactly representable sums (rounding order matters).
static void fill(void *buf, DistDtype dt, size_t count, int rank, int c) {
    for (size_t i = 0; i < count; i++) {
        double v = sin(0.001 * (double)i + 0.7 * rank + c) * (1.0 + (double)(i % 7));
        switch (dt) {
        case DIST_F32: ((float *)buf)[i] = (float)v; break;
        case DIST_BF16: ((uint16_t *)buf)[i] = bf16_from_f32((float)v); break;
        case DIST_F64: ((double *)buf)[i] = v; break;
        case DIST_I32: ((int32_t *)buf)[i] = (int32_t)(v * 1000); break;
        default: break;
        }
    }
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    DistGroup *world = dist_world();
    const int rank = world->rank;
    const int misuse = argc > 1 && strcmp(argv[1], "--misuse") == 0;

    dist_comm_thread_start(world);
    if (misuse) {
        float x[4] = {1, 2, 3, 4};
        DistWork w = dist_iall_reduce(x, x, 4, DIST_F32, DIST_SUM, world);
        dist_barrier(world);  // refused: an all-reduce is queued on the thread
        dist_wait(&w);
        printf("mpi_ddp_comm_thread: the barrier was NOT refused\n");
        dist_finalize();
        return 0;
    }

    const Case cases[] = {
        {DIST_F32, DIST_SUM, 300000, 1}, {DIST_F32, DIST_AVG, 1000, 0}, {DIST_F32, DIST_AVG, 0, 1},
        {DIST_BF16, DIST_SUM, 70001, 1}, {DIST_BF16, DIST_AVG, 513, 0}, {DIST_F64, DIST_MAX, 33, 1},
        {DIST_I32, DIST_SUM, 4097, 0},   {DIST_F32, DIST_AVG, 1, 1},
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    void *in[8], *got[8], *want[8];
    for (int round = 0; round < 2; round++) {  // round 1: after a stop and a new start
        // the reference: blocking all-reduces (no op queued, so they are allowed)
        dist_counters_reset();
        for (int c = 0; c < nc; c++) {
            size_t bytes = cases[c].count * dist_dtype_size(cases[c].dt);
            in[c] = lab_xmalloc(bytes + 1);
            got[c] = lab_xmalloc(bytes + 1);
            want[c] = lab_xmalloc(bytes + 1);
            fill(in[c], cases[c].dt, cases[c].count, rank, c);
            memcpy(want[c], in[c], bytes);
            dist_all_reduce(want[c], want[c], cases[c].count, cases[c].dt, cases[c].op, world);
        }
        DistCounters blocking = *dist_counters();

        // the same on the thread, all in flight at once
        dist_counters_reset();
        double busy0, cpu0;
        dist_comm_thread_times(world, &busy0, &cpu0);
        DistWork w[8];
        for (int c = 0; c < nc; c++) {
            size_t bytes = cases[c].count * dist_dtype_size(cases[c].dt);
            if (cases[c].in_place) {
                memcpy(got[c], in[c], bytes);
                w[c] = dist_iall_reduce(got[c], got[c], cases[c].count, cases[c].dt, cases[c].op,
                                        world);
            } else {
                w[c] = dist_iall_reduce(in[c], got[c], cases[c].count, cases[c].dt, cases[c].op,
                                        world);
            }
            mpi_check(w[c].active && w[c].task != NULL, "case %d: not queued on the thread", c);
        }
        dist_wait(&w[nc - 1]);  // the last one first: the earlier ones ran before it
        mpi_check(!w[nc - 1].active, "dist_wait left the op active");
        for (int left = nc - 1; left > 0;) {  // the others by polling
            left = 0;
            for (int c = 0; c < nc - 1; c++) left += !dist_test(&w[c]);
        }
        for (int c = 0; c < nc; c++) {
            size_t bytes = cases[c].count * dist_dtype_size(cases[c].dt);
            mpi_check(memcmp(got[c], want[c], bytes) == 0,
                  "round %d case %d (dtype %d, op %d, %zu elements, %s): the thread's result "
                  "differs from the blocking all-reduce", round, c, (int)cases[c].dt,
                  (int)cases[c].op, cases[c].count, cases[c].in_place ? "in place" : "out of place");
            if (!cases[c].in_place) {
                void *again = lab_xmalloc(bytes + 1);
                fill(again, cases[c].dt, cases[c].count, rank, c);
                mpi_check(memcmp(again, in[c], bytes) == 0, "case %d: the send buffer was changed", c);
                free(again);
            }
            free(in[c]); free(got[c]); free(want[c]);
        }
        const DistCounters *q = dist_counters();
        mpi_check(q->calls[OP_ALL_REDUCE] == blocking.calls[OP_ALL_REDUCE] &&
                  q->sent[OP_ALL_REDUCE] == blocking.sent[OP_ALL_REDUCE] &&
                  q->recv[OP_ALL_REDUCE] == blocking.recv[OP_ALL_REDUCE],
              "counters: %llu calls, %llu B sent, %llu B recv on the thread; blocking %llu, %llu, "
              "%llu", (unsigned long long)q->calls[OP_ALL_REDUCE],
              (unsigned long long)q->sent[OP_ALL_REDUCE], (unsigned long long)q->recv[OP_ALL_REDUCE],
              (unsigned long long)blocking.calls[OP_ALL_REDUCE],
              (unsigned long long)blocking.sent[OP_ALL_REDUCE],
              (unsigned long long)blocking.recv[OP_ALL_REDUCE]);
        double busy1, cpu1;
        dist_comm_thread_times(world, &busy1, &cpu1);
        mpi_check(busy1 > busy0 && cpu1 >= cpu0 && cpu1 - cpu0 <= (busy1 - busy0) * 1.5 + 1e-3,
              "thread times: busy %g -> %g s, cpu %g -> %g s", busy0, busy1, cpu0, cpu1);
        dist_comm_thread_stop(world);
        mpi_check(world->thread == NULL, "dist_comm_thread_stop left the thread");
        // without the thread: the ordinary non-blocking path
        float x = 1.0f;
        DistWork plain = dist_iall_reduce(&x, &x, 1, DIST_F32, DIST_SUM, world);
        mpi_check(plain.task == NULL, "after stop an all-reduce was still queued on a thread");
        dist_wait(&plain);
        mpi_check(x == (float)world->size, "plain all-reduce after stop gave %g", (double)x);
        dist_comm_thread_start(world);
    }

    int bad = mpi_failed();
    dist_all_reduce(&bad, &bad, 1, DIST_I32, DIST_SUM, world);
    if (rank == 0 && bad) printf("mpi_ddp_comm_thread: %d FAILED checks\n", bad);
    if (rank == 0 && !bad) printf("mpi_ddp_comm_thread: OK\n");
    dist_finalize();  // stops the thread
    return bad ? 1 : 0;
}
