// mpi_06_fsdp.c: 06_fsdp's unit state machine and reduce-scatter hook, each alone, on units
// sharded here (the pieces by shard_range; not by zero_layout_init, exercise 05.1), against
// values every rank can compute.
//
// Launched by tests/test_06_fsdp.c as
//   mpirun -np N build/tests/mpi_06_fsdp <what>...
// with <what> among
//   unit-step   fsdp_unit_step (exercise 06.1) on units of 0, 1, N-1, N+1, 37 and 3N+2
//               elements: SHARDED -> GATHERING -> GATHERED gives every rank the whole unit (each
//               piece at its place, in fp32 and in bf16), GATHERED -> FREED releases the buffer
//               (MEM_COMM back to what it was); a FREED unit gathers again
//   rs-hook     fsdp_grads_done + fsdp_grads_reap (exercise 06.3): unit gradients that differ
//               per rank end as the average over the group in my piece of the gradient shard,
//               added to what the piece held, every unit buffer freed; and as HSDP with shard
//               groups of one (each rank its own group, the group's ranks its replicas): the
//               average then comes from the all-reduce over the replicas
// on the world and on a split group. Prints "mpi_06_fsdp: <what> on N ranks: C checks, F failed".
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "fsdp.h"
#include "kernels.h"
#include "mem.h"
#include "mpitest.h"
#include "shard.h"
#include "zero.h"

// Units of these sizes, one after the other, split over g by shard_range.
static void layout(ZeroLayout *z, const size_t *size, int nunits, DistGroup *g) {
    memset(z, 0, sizeof *z);
    z->N = g->size;
    z->r = g->rank;
    z->nunits = nunits;
    z->p = lab_xcalloc((size_t)nunits, sizeof(ZeroPiece));
    size_t off = 0, local = 0;
    for (int u = 0; u < nunits; u++) {
        ZeroPiece *p = &z->p[u];
        p->unit_offset = off;
        p->unit_size = size[u];
        shard_range(size[u], g->size, g->rank, &p->begin, &p->count);
        p->local = local;
        local += p->count;
        off += size[u];
    }
    z->n = off;
    z->shard_n = local;
}

// Element i of unit u (its value does not depend on the rank: every rank holds its piece).
static const char *state_name(FsdpState s) {
    static const char *const names[] = {"SHARDED", "GATHERING", "GATHERED", "FREED"};
    return (unsigned)s < 4 ? names[s] : "(not a state)";
}

// The rank whose piece holds element i of unit u (the pieces lie in rank order).
static int owner_of(const ZeroLayout *z, int u, size_t i) {
    size_t counts[64], at = 0;
    if (z->N > 64) return -1;
    zero_unit_counts(z, u, counts);
    for (int r = 0; r < z->N && r < 64; r++)
        if (i < (at += counts[r])) return r;
    return -1;
}

static float value_of(int u, size_t i) { return (float)((int)((i * 13 + (size_t)u * 7) % 29) - 14) / 8.0f; }

static void test_unit_step(DistGroup *g, int bf16) {
    const int N = g->size;
    const size_t size[6] = {0, 1, (size_t)(N > 1 ? N - 1 : 0), (size_t)N + 1, 37, 3 * (size_t)N + 2};
    const int nu = 6;
    const DistDtype dt = bf16 ? DIST_BF16 : DIST_F32;
    const size_t e = dist_dtype_size(dt);
    ZeroLayout z;
    layout(&z, size, nu, g);
    char *shard = lab_xcalloc(z.shard_n ? z.shard_n : 1, e);
    for (int u = 0; u < nu; u++)
        for (size_t i = 0; i < z.p[u].count; i++) {
            float v = value_of(u, z.p[u].begin + i);
            if (bf16) ((uint16_t *)shard)[z.p[u].local + i] = bf16_from_f32(v);
            else ((float *)shard)[z.p[u].local + i] = v;
        }
    Fsdp F;
    fsdp_init(&F, &z, g, NULL, dt, DEV_CPU, kernels_get(DEV_CPU), NULL, 0, shard, NULL);
    const size_t comm0 = mem_current(MEM_COMM);
    for (int round = 0; round < 2; round++) {  // the second round starts from FREED
        for (int u = 0; u < nu; u++) {
            mpi_check(F.u[u].state == (round ? FSDP_FREED : FSDP_SHARDED), "unit %d starts in "
                      "state %s, want %s", u, state_name(F.u[u].state), round ? "FREED" : "SHARDED");
            fsdp_unit_step(&F, u);
            mpi_check(F.u[u].state == FSDP_GATHERING, "unit %d: after the first step state %s, "
                      "want GATHERING", u, state_name(F.u[u].state));
        }
        for (int u = 0; u < nu; u++) {
            fsdp_unit_step(&F, u);
            mpi_check(F.u[u].state == FSDP_GATHERED, "unit %d: after the wait state %s, want "
                      "GATHERED", u, state_name(F.u[u].state));
            size_t bad = 0, first = 0;
            float first_got = 0, first_want = 0;
            for (size_t i = 0; i < size[u] && F.u[u].buf.w; i++) {
                float want = bf16 ? bf16_to_f32(bf16_from_f32(value_of(u, i))) : value_of(u, i);
                float got = bf16 ? bf16_to_f32(((uint16_t *)F.u[u].buf.w)[i]) : ((float *)F.u[u].buf.w)[i];
                if (got != want && !bad++) first = i, first_got = got, first_want = want;
            }
            mpi_check(F.u[u].buf.w != NULL || size[u] == 0, "unit %d: gathered without a buffer", u);
            mpi_check(bad == 0, "%s rank %d of %d, %s: unit %d of %zu elements, %zu wrong after "
                      "the gather; the first, element %zu, is %g, want %g (rank %d's piece)", g->name,
                      g->rank, N, bf16 ? "bf16" : "fp32", u, size[u], bad, first, (double)first_got,
                      (double)first_want, owner_of(&z, u, first));
        }
        size_t held = mem_current(MEM_COMM) - comm0, want = 0;
        for (int u = 0; u < nu; u++) want += size[u] * e;
        mpi_check(held == want, "gathered units hold %zu B of MEM_COMM, want %zu", held, want);
        for (int u = 0; u < nu; u++) {
            fsdp_unit_step(&F, u);
            mpi_check(F.u[u].state == FSDP_FREED && F.u[u].buf.w == NULL, "unit %d: after the free "
                      "state %s, buffer %p, want FREED and no buffer", u, state_name(F.u[u].state),
                      F.u[u].buf.w);
        }
        mpi_check(mem_current(MEM_COMM) == comm0, "freed units still hold %zu B of MEM_COMM",
                  mem_current(MEM_COMM) - comm0);
    }
    fsdp_free(&F);
    free(shard);
    zero_layout_free(&z);
}

// Gradient element i of unit u on group rank r: multiples of 1/64 (sums over ranks exact).
static float grad_of(int u, int r, size_t i) {
    return (float)((int)((i * 5 + (size_t)u * 3 + (size_t)r * 11) % 23) - 11) / 64.0f;
}

// fsdp_grads_done on every unit (the hook), then the reaps; the world's ranks as a shard group
// (rep NULL), or, when `replicas`, each rank a shard group of one and g the replicate group.
static void test_rs_hook(DistGroup *g, int replicas) {
    const int N = g->size;
    const size_t size[5] = {1, (size_t)N + 1, 37, 3 * (size_t)N + 2, 64};
    const int nu = 5;
    DistGroup *self = replicas ? dist_split(g, g->rank, 0, "self") : g;
    ZeroLayout z;
    layout(&z, size, nu, self);
    float *gshard = lab_xcalloc(z.shard_n ? z.shard_n : 1, sizeof(float));
    for (size_t i = 0; i < z.shard_n; i++) gshard[i] = 0.5f;  // the hook adds to what is there
    float scratch[8];
    Fsdp F;
    fsdp_init(&F, &z, self, replicas ? g : NULL, DIST_F32, DEV_CPU, kernels_get(DEV_CPU), scratch,
              8, NULL, gshard);
    fsdp_begin_micro(&F);
    for (int u = 0; u < nu; u++) {
        float *gu = fsdp_unit_grads(&F, u);
        for (size_t i = 0; i < size[u]; i++) gu[i] = grad_of(u, g->rank, i);
        fsdp_grads_done(&F, u, 1);
    }
    fsdp_end_micro(&F);
    size_t bad = 0, first = 0;
    float first_got = 0, first_want = 0;
    for (int u = 0; u < nu; u++) {
        for (size_t i = 0; i < z.p[u].count; i++) {
            size_t at = z.p[u].begin + i;
            double sum = 0;
            for (int q = 0; q < N; q++) sum += grad_of(u, q, at);
            float want = 0.5f + (float)(sum / N);
            if (fabsf(gshard[z.p[u].local + i] - want) > 1e-6f && !bad++)
                first = z.p[u].local + i, first_got = gshard[z.p[u].local + i], first_want = want;
        }
        mpi_check(F.u[u].buf.g == NULL, "unit %d's gradient buffer not freed after its reduce-scatter", u);
    }
    mpi_check(bad == 0, "%s rank %d of %d (%s): %zu elements of my gradient pieces are not 0.5 "
              "+ the average over the ranks; the first, shard element %zu, is %g, want %g", g->name,
              g->rank, N, replicas ? "replicas" : "shard group", bad, first, (double)first_got,
              (double)first_want);
    fsdp_free(&F);
    free(gshard);
    zero_layout_free(&z);
    if (replicas) dist_group_free(self);
}

static void run(int kind, DistGroup *g) {
    if (kind == 0) {
        test_unit_step(g, 0);
        test_unit_step(g, 1);
    } else {
        test_rs_hook(g, 0);
        test_rs_hook(g, 1);
    }
}

int main(int argc, char **argv) {
    static const char *const kinds[] = {"unit-step", "rs-hook"};
    return mpi_test_main(argc, argv, "mpi_06_fsdp", "usage: mpi_06_fsdp <what>... (unit-step rs-hook)",
                         kinds, 2, run);
}
