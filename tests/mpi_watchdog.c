// mpi_watchdog.c: hangs with a known history, for tests/test_watchdog.c.
//
//   mpirun -np N build/tests/mpi_watchdog <case> <S>
//
// starts the watchdog with --collective-timeout S (watchdog_start) and runs one case. Each case
// ends in a hang that the watchdog must end with a diagnosis whose every number the
// test knows from the ops below (not from the code under test):
//   coll    (3 ranks) 5 all-reduces on the world; a group "sub" of world ranks {1,2} (rank 0
//           alone in its own) makes 3 barriers; step 5 begins; ranks 0 and 1 enter the world's
//           all-reduce #6, rank 2 stops without dying:
//             world group {0,1,2}: ranks 0,1 wait in all-reduce #6 (...); rank 2 has not reached
//             it: it is outside communication (..., in step 5, last op: sub barrier #3)
//   p2p     (2 ranks) rank 0 sends 3 messages to rank 1, rank 1 receives them; then rank 1
//           waits (irecv + dist_wait) for a 4th while rank 0, a second later, enters a barrier
//           (a deadlock: each waits for the other):
//             world group {0,1}: rank 1 waits in recv #4 from rank 0 for ...; rank 0 is in
//             world barrier #1
//   order   (2 ranks) two all-reduces; then rank 0 enters a barrier, rank 1 (a second later) a
//           broadcast: the same place in the world's sequence, different collectives:
//             world group {0,1}: rank 0 waits in barrier #3 ...; rank 1 has not reached it: it is
//             in world broadcast #3 (...): a different collective at the same place ...
//   early   (2 ranks) rank 1 makes one all-reduce and leaves (dist_finalize, return); rank 0
//           waits in its second:
//             world group {0,1}: rank 0 waits in all-reduce #2 ...; rank 1 has not reached it: it
//             has finished: it called dist_finalize ...
//   thread  (2 ranks) the communication thread attached to the world; rank 0 queues 3
//           all-reduces and waits for them; rank 1 queues and waits for 2, then stops:
//             world group {0,1}: rank 0... waits in all-reduce #3 ...; rank 1 has not reached it
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dist.h"
#include "watchdog.h"

static void all_reduce_one(DistGroup *g) {
    float x = 1.0f;
    dist_all_reduce(&x, &x, 1, DIST_F32, DIST_SUM, g);
}

static void coll(DistGroup *w) {
    for (int i = 0; i < 5; i++) all_reduce_one(w);  // world #1 .. #5
    DistGroup *sub = dist_split(w, w->rank > 0, w->rank, "sub");
    for (int i = 0; i < 3; i++) dist_barrier(sub);  // sub #1 .. #3 (rank 0's sub is its own)
    watchdog_note_step(4);                          // "step 5"
    if (w->rank == 2) watchdog_inject_hang(4, 0);
    all_reduce_one(w);  // world #6: never completes
}

static void p2p(DistGroup *w) {
    int x = 0;
    for (int i = 0; i < 3; i++) {
        if (w->rank == 0) dist_send(&x, 1, DIST_I32, 1, 5, w);  // send #1 .. #3 to rank 1
        else dist_recv(&x, 1, DIST_I32, 0, 5, w);               // recv #1 .. #3 from rank 0
    }
    if (w->rank == 1) {
        DistWork r = dist_irecv(&x, 1, DIST_I32, 0, 5, w);  // recv #4 from rank 0: never sent
        dist_wait(&r);
    } else {
        sleep(1);  // so rank 1 has waited longest: it times out first and diagnoses
        dist_barrier(w);  // world barrier #1 (collectives count apart from sends)
    }
}

static void order(DistGroup *w) {
    all_reduce_one(w);  // #1
    all_reduce_one(w);  // #2
    int x = 0;
    if (w->rank == 0) {
        dist_barrier(w);  // #3 on rank 0
    } else {
        sleep(1);  // so rank 0 has waited longest: it times out first and diagnoses
        dist_broadcast(&x, 1, DIST_I32, 0, w);  // #3 on rank 1: a bug, never matched
    }
}

// returns 1 on the rank that left
static int early(DistGroup *w) {
    all_reduce_one(w);  // #1
    if (w->rank == 1) return 1;  // a bug: this rank thinks the run is over
    all_reduce_one(w);  // #2: rank 1 never comes
    return 0;
}

static void thread(DistGroup *w) {
    dist_comm_thread_start(w);
    float x[3] = {1, 2, 3};
    DistWork q[3];
    const int n = w->rank == 0 ? 3 : 2;
    for (int i = 0; i < n; i++) q[i] = dist_iall_reduce(&x[i], &x[i], 1, DIST_F32, DIST_SUM, w);
    dist_wait_all(q, n);  // rank 0: #3 never completes
    watchdog_inject_hang(0, 0);  // rank 1
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    const char *what = argc > 1 ? argv[1] : "";
    const double S = argc > 2 ? atof(argv[2]) : 2.0;
    DistGroup *w = dist_world();
    watchdog_start(S);
    if (strcmp(what, "coll") == 0 && w->size == 3) coll(w);
    else if (strcmp(what, "p2p") == 0 && w->size == 2) p2p(w);
    else if (strcmp(what, "order") == 0 && w->size == 2) order(w);
    else if (strcmp(what, "early") == 0 && w->size == 2) {
        if (early(w)) {
            dist_finalize();
            return 0;
        }
    }
    else if (strcmp(what, "thread") == 0 && w->size == 2) thread(w);
    else lab_fail_collective("usage: mpirun -np 3 mpi_watchdog coll S, or -np 2 with p2p, order, early or thread (got "
                             "'%s' on %d ranks)", what, w->size);
    lab_fail("mpi_watchdog %s: the hang ended without the watchdog", what);  // not reached
    return 0;
}
