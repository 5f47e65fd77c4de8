// mpi_session.c: the loop skeleton (common/session.h) driving a chapter's own state, as 05-09
// give it one (a SessionState over a sharded state), on N ranks.
//
// Launched by tests/test_00_train.c as `mpirun -np N build/tests/mpi_session`. The "state" is
// a shard per rank: save is collective (an all-reduce, then rank 0 records the step) and
// weights_to_host gathers every rank's piece onto rank 0. Checked, with --save-every 3 on 7
// steps and again with --stop-at 5: state.save runs on every rank at steps 3, 6 and the end
// (3 and the end: 5), what it moved is in s.save_cost and not in the loop's counters, the
// final weights reach rank 0 only (NULL elsewhere) in llm.c's order when --dump reads them,
// and are not gathered at all when nothing reads them, the losses are recorded,
// session_nan_due fires on one rank at one step, the progress line reads as every chapter's.
// Prints "mpi_session: OK" on success.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "flags.h"
#include "mpitest.h"
#include "session.h"

typedef struct Shard {
    Session *s;
    size_t lo, count;  // this rank's piece of the whole model's n weights
    int saves[8], nsaves;
    const char *path;  // the path save got last
    int weights_calls;
} Shard;

static void shard_save(void *ctx, const char *path, int step) {
    Shard *sh = ctx;
    int one = 1;
    dist_all_reduce(&one, &one, 1, DIST_I32, DIST_SUM, sh->s->world);  // collective
    mpi_check(one == sh->s->N, "save at step %d: %d ranks took part, not %d", step, one, sh->s->N);
    if (sh->nsaves < 8) sh->saves[sh->nsaves++] = step;
    sh->path = path;
}

// weight i of the whole model is i; rank r holds [lo, lo + count)
static void shard_weights(void *ctx, float *full) {
    Shard *sh = ctx;
    sh->weights_calls++;
    float *mine = lab_xmalloc(sh->count * sizeof(float) + 1);
    for (size_t i = 0; i < sh->count; i++) mine[i] = (float)(sh->lo + i);
    int N = sh->s->N;
    size_t *counts = lab_xcalloc((size_t)N, sizeof(size_t));
    for (int r = 0; r < N; r++)
        counts[r] = sh->s->n / (size_t)N + (r == N - 1 ? sh->s->n % (size_t)N : 0);
    if (sh->s->rank == 0) {
        memcpy(full, mine, sh->count * sizeof(float));
        for (int r = 1, at = 0; r < N; r++) {
            at += (int)counts[r - 1];
            dist_recv(full + at, counts[r], DIST_F32, r, 77, sh->s->world);
        }
    } else {
        mpi_check(full == NULL, "weights_to_host: rank %d got a buffer", sh->s->rank);
        dist_send(mine, sh->count, DIST_F32, 0, 77, sh->s->world);
    }
    free(counts);
    free(mine);
}

static void run(int stop_at, int dump) {
    LabArgs a = lab_args_defaults();
    a.V = 64, a.T = 16, a.L = 2, a.C = 32, a.NH = 2;
    a.steps = 7, a.batch = 4, a.quiet = 1, a.save = "/nonexistent/shard.ckpt", a.save_every = 3;
    a.stop_at = stop_at, a.inject_nan_step = 4;
    a.dump = dump ? "/nonexistent/unused.json" : NULL;  // (the chapter writes it, not the session)
    Session s;
    session_open(&s, &a, 0);
    const int N = s.N, rank = s.rank;
    Shard sh = {.s = &s};
    sh.count = s.n / (size_t)N + (rank == N - 1 ? s.n % (size_t)N : 0);
    sh.lo = (size_t)rank * (s.n / (size_t)N);
    s.state = (SessionState){&sh, shard_save, shard_weights, NULL};
    session_start_at(&s, 0);
    const int end = stop_at >= 0 ? stop_at : 7;
    mpi_check(s.start == 0 && s.end == end, "steps [%d, %d), not [0, %d)", s.start, s.end, end);
    dist_counters_reset();
    int nan_due = 0;
    for (int step = s.start; step < s.end; step++) {
        session_step_begin(&s, step);
        nan_due += session_nan_due(&s, step, N - 1) ? 1 + step * 10 : 0;
        session_step_end(&s, step, 0.5f * (float)step);
    }
    uint64_t loop_sent = dist_bytes_sent();
    session_finish(&s);
    mpi_check(nan_due == (rank == N - 1 && end > 4 ? 41 : 0), "session_nan_due: %d", nan_due);
    int want[3] = {3, 6, 7}, nwant = end == 7 ? 3 : 2;
    if (end == 5) want[1] = 5;
    mpi_check(sh.nsaves == nwant, "%d saves, not %d", sh.nsaves, nwant);
    for (int i = 0; i < nwant && i < sh.nsaves; i++)
        mpi_check(sh.saves[i] == want[i], "save %d at step %d, not %d", i, sh.saves[i], want[i]);
    mpi_check(sh.path && strcmp(sh.path, a.save) == 0, "save got path %s", sh.path);
    // an all-reduce moves bytes only on several ranks; the loop itself moved none
    mpi_check(N == 1 || s.save_cost.sent[OP_ALL_REDUCE] > 0, "save_cost: no all-reduce bytes");
    // the periodic saves ran inside the loop, the final one after it: the loop moved only theirs
    uint64_t periodic = s.save_cost.sent[OP_ALL_REDUCE] * (uint64_t)(nwant - 1) / (uint64_t)nwant;
    mpi_check(loop_sent == periodic, "the loop sent %llu B, its saves %llu",
              (unsigned long long)loop_sent, (unsigned long long)periodic);
    // Mutant: mutants/session-weights-always.patch
    mpi_check(sh.weights_calls == (dump ? 1 : 0), "weights_to_host called %d times%s",
              sh.weights_calls, dump ? "" : " (nothing reads the final weights)");
    if (rank == 0 && dump) {
        mpi_check(s.host_params != NULL, "no final weights on rank 0");
        size_t bad = 0;
        for (size_t i = 0; s.host_params && i < s.n; i++) bad += s.host_params[i] != (float)i;
        mpi_check(bad == 0, "%zu final weights out of place", bad);
    } else {
        mpi_check(s.host_params == NULL, "final weights on rank %d", rank);
    }
    for (int i = 0; i < 7; i++)
        mpi_check(i < end ? s.losses[i] == 0.5f * (float)i : isnan(s.losses[i]),
                  "loss of step %d: %g", i, (double)s.losses[i]);
    mpi_check(session_steps_run(&s) == end, "steps run %d", session_steps_run(&s));
    session_free(&s);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    const int rank = dist_rank();
    run(-1, 1);
    run(5, 1);
    run(-1, 0);
    char line[200];
    HealthRecord hr = {.step = 1, .loss = 2.5, .grad_norm = 1.25, .lr = 1e-3, .tokens_per_s = 1000.4,
                       .mfu = 0.123, .z_loss = NAN, .z_grad_norm = -150.0};
    session_progress_line(line, sizeof line, 7, &hr, 0.04);
    const char *want = "step     1/7  loss 2.5000 z     -  gnorm   1.2500 z -99.9  lr 1.00e-03     "
                       "1000 tok/s  MFU 12.3%  ETA   0.0 s";
    mpi_check(strcmp(line, want) == 0, "progress line \"%s\", not \"%s\"", line, want);
    int bad = mpi_failed();
    dist_all_reduce(&bad, &bad, 1, DIST_I32, DIST_SUM, dist_world());
    if (rank == 0 && bad) printf("mpi_session: %d FAILED checks\n", bad);
    if (rank == 0 && !bad) printf("mpi_session: OK\n");
    dist_finalize();
    return bad ? 1 : 0;
}
