// mpi_05_zero.c: the pieces of 05_zero's sharded step, each alone, on a partition written here
// (not taken from zero_layout_init, exercise 05.1), against a serial reference.
//
// Launched by tests/test_05_zero.c as
//   mpirun -np N build/tests/mpi_05_zero <what>...
// with <what> among
//   zero1-step    zero_step (exercise 05.2) on a small GPT-2's full gradient buffer: the
//                 parameters every rank ends with and the Adam m, v of its pieces equal one
//                 AdamW step of a single device on the averaged gradient, with clipping that
//                 that bites (so the norm must be the global one) and without clipping (so the
//                 gradient must be the average, not the sum)
//   buffer-step   zero_step on a flat buffer with no GPT-2 (zero_layout_init_buffer: 09's stage)
//   gather-unit   zero_gather_unit (exercise 05.3) on units of 0, 1, N-1, N+1, 37 and 3N+2
//                 elements: every rank ends with the whole unit, each piece at its place
//   v-ops         dist_reduce_scatter_v / dist_all_gather_v (+ dist_i*_v, + on the
//                 communication thread) with empty blocks, in place, and their byte counters
// on the world and on a split group, each on both partitions (by unit, and flat: 05's). Prints "mpi_05_zero: <what> on N ranks: C checks, F failed".
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "gpt2.h"
#include "mem.h"
#include "mpitest.h"
#include "optim.h"
#include "zero.h"

// Written here: piece q of a unit of n elements starts at q*(n/N) + min(q, n%N).
static size_t pstart(size_t n, int N, int q) {
    size_t base = n / (size_t)N, extra = n % (size_t)N;
    return (size_t)q * base + ((size_t)q < extra ? (size_t)q : extra);
}

// The partition of units [offset[u], offset[u] + size[u]) seen by group rank g->rank: by unit
// (piece r of every unit), or flat (the whole buffer in N shards, piece = unit ∩ shard r).
static int flat_mode = 0;
static void hand_layout(ZeroLayout *z, const size_t *offset, const size_t *size, int nunits,
                        DistGroup *g) {
    memset(z, 0, sizeof *z);
    z->N = g->size;
    z->r = g->rank;
    z->nunits = nunits;
    z->p = lab_xcalloc((size_t)nunits, sizeof(ZeroPiece));
    size_t local = 0;
    for (int u = 0; u < nunits; u++) {
        ZeroPiece *p = &z->p[u];
        p->unit_offset = offset[u];
        p->unit_size = size[u];
        p->begin = pstart(size[u], g->size, g->rank);
        p->count = pstart(size[u], g->size, g->rank + 1) - p->begin;
        p->local = local;
        local += p->count;
        z->n = offset[u] + size[u];
    }
    z->shard_n = local;
    if (!flat_mode) return;
    size_t sb = pstart(z->n, g->size, g->rank), se = pstart(z->n, g->size, g->rank + 1);
    z->flat = 1;
    z->shard_begin = sb;
    z->shard_n = se - sb;
    for (int u = 0; u < nunits; u++) {
        ZeroPiece *p = &z->p[u];
        size_t lo = sb, hi = se, ub = offset[u], ue = offset[u] + size[u];
        lo = lo < ub ? ub : lo > ue ? ue : lo;
        hi = hi < ub ? ub : hi > ue ? ue : hi;
        p->begin = lo - ub;
        p->count = hi - lo;
        p->local = lo < sb ? 0 : lo > se ? se - sb : lo - sb;
    }
}

// Gradient element i on rank r: multiples of 1/64, so sums over ranks are exact in fp32.
static float grad_of(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 5) % 17) - 8) / 64.0f; }

static void test_zero_step(DistGroup *g, float grad_clip) {
    const int N = g->size;
    GPT2Config cfg = {.V = 32, .T = 8, .L = 2, .C = 16, .NH = 2};
    GPT2 m;
    gpt2_build(&m, cfg, DEV_CPU);
    gpt2_alloc_grads(&m);
    gpt2_init_params(&m, 11);
    const size_t n = m.num_params;
    size_t offset[64], size[64];
    for (int u = 0; u < m.nunits; u++) { offset[u] = m.units[u].offset; size[u] = m.units[u].size; }
    ZeroLayout z;
    hand_layout(&z, offset, size, m.nunits, g);
    GPT2Param *plist = lab_xcalloc((size_t)gpt2_params(&cfg, NULL), sizeof(GPT2Param));
    int nplist = gpt2_params(&cfg, plist);
    AdamW h = adamw_defaults();
    h.grad_clip = grad_clip;
    h.warmup_steps = 0;
    h.total_steps = 10;

    // the reference: one device, the averaged gradient, the whole buffer
    float *ref_p = lab_xmalloc(n * sizeof(float)), *ref_g = lab_xmalloc(n * sizeof(float));
    float *ref_m = lab_xcalloc(n, sizeof(float)), *ref_v = lab_xcalloc(n, sizeof(float));
    memcpy(ref_p, m.params, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int r = 0; r < N; r++) s += grad_of(r, i);
        ref_g[i] = s / (float)N;
        m.grads[i] = grad_of(g->rank, i);
    }
    double sq = 0.0;
    for (size_t i = 0; i < n; i++) sq += (double)ref_g[i] * (double)ref_g[i];
    float scale = adamw_clip_scale(&h, sq, 0);
    if (grad_clip > 0)
        mpi_check(scale < 0.5f, "the test's clipping does not bite (scale %g)", (double)scale);
    AdamWRange ref = {.lo = 0, .hi = n, .master = ref_p, .grad = ref_g, .m = ref_m, .v = ref_v};
    adamw_update(&h, m.k, 0, &ref, plist, nplist, scale);

    float *opt_m = lab_xcalloc(z.shard_n + 1, sizeof(float));
    float *opt_v = lab_xcalloc(z.shard_n + 1, sizeof(float));
    ZeroShard b = zero_shard_of(&m, plist, nplist);
    b.params = b.master = m.params;
    b.grads = m.grads;
    b.params_full = b.grads_full = b.master_full = 1;
    b.opt_m = opt_m;
    b.opt_v = opt_v;
    zero_step(&z, &b, &h, 0, g);

    // every parameter on every rank; m and v of my pieces
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(m.params[i] - ref_p[i]) <= 1e-6f * fmaxf(1.0f, fabsf(ref_p[i])))) {
            if (!bad) first = i;
            bad++;
        }
    mpi_check(bad == 0, "zero_step on %s (rank %d of %d): %zu parameters differ from one "
              "device's step, first %zu: %g, want %g", g->name, g->rank, N, bad, first,
              bad ? (double)m.params[first] : 0.0, bad ? (double)ref_p[first] : 0.0);
    bad = 0;
    size_t first_i = 0, first_l = 0;
    for (int u = 0; u < z.nunits; u++)
        for (size_t j = 0; j < z.p[u].count; j++) {
            size_t i = z.p[u].unit_offset + z.p[u].begin + j, l = z.p[u].local + j;
            if ((!(fabsf(opt_m[l] - ref_m[i]) <= 1e-7f) || !(fabsf(opt_v[l] - ref_v[i]) <= 1e-9f)) && !bad++)
                first_i = i, first_l = l;
        }
    mpi_check(bad == 0, "zero_step on %s (rank %d of %d): Adam m or v of %zu elements of my "
              "pieces differ from one device's; the first, parameter %zu: m %g v %g, want m %g v %g",
              g->name, g->rank, N, bad, first_i, bad ? (double)opt_m[first_l] : 0.0,
              bad ? (double)opt_v[first_l] : 0.0, bad ? (double)ref_m[first_i] : 0.0,
              bad ? (double)ref_v[first_i] : 0.0);
    free(ref_p); free(ref_g); free(ref_m); free(ref_v);
    free(opt_m); free(opt_v); free(plist);
    zero_layout_free(&z);
    gpt2_free(&m);
}

static void test_gather_unit(DistGroup *g) {
    const int N = g->size;
    size_t size[6] = {0, 1, (size_t)(N > 1 ? N - 1 : 2), (size_t)N + 1, 37, 3 * (size_t)N + 2};
    size_t offset[6], at = 0;
    for (int u = 0; u < 6; u++) { offset[u] = at; at += size[u]; }
    ZeroLayout z;
    hand_layout(&z, offset, size, 6, g);
    float *shard = lab_xcalloc(z.shard_n + 1, sizeof(float));
    for (int u = 0; u < 6; u++)
        for (size_t j = 0; j < z.p[u].count; j++)
            shard[z.p[u].local + j] = (float)(offset[u] + z.p[u].begin + j) + 0.5f;
    for (int u = 0; u < 6; u++) {
        float *out = lab_xcalloc(size[u] + 1, sizeof(float));
        for (size_t i = 0; i < size[u]; i++) out[i] = -1.0f;
        DistWork w = zero_gather_unit(&z, u, shard, out, DIST_F32, g);
        dist_wait(&w);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < size[u]; i++)
            if (out[i] != (float)(offset[u] + i) + 0.5f && !bad++) first = i;
        mpi_check(bad == 0, "zero_gather_unit on %s (rank %d of %d): unit %d of %zu elements, %zu "
                  "wrong; the first, element %zu, is %g, want %g (-1: nothing landed there)", g->name,
                  g->rank, N, u, size[u], bad, first, bad ? (double)out[first] : 0.0,
                  (double)(offset[u] + first) + 0.5);
        free(out);
    }
    free(shard);
    zero_layout_free(&z);
}

// dist.h's v-ops on host buffers: per-rank counts with empty blocks (patterns below), blocking
// and non-blocking, then the same on the communication thread; results against a serial
// reference (values exact in fp32: small integers, sums of them), the in-place forms ZeRO uses,
// and the byte counters against the ring formulas with c_p = counts[p], computed here.
static float val_of(int r, size_t i) { return (float)((int)((i * 3 + (size_t)r * 7) % 11) - 5); }

static void test_v_ops(DistGroup *g) {
    const int N = g->size, r = g->rank;
    size_t counts[64];
    for (int pat = 0; pat < 4; pat++) {
        for (int q = 0; q < N; q++)  // 0: all 5; 1: q's count q (rank 0 empty); 2: only the last
            counts[q] = pat == 0 ? 5 : pat == 1 ? (size_t)q : pat == 2 ? (q == N - 1 ? 9 : 0)
                                   : (size_t)((q * 5 + 3) % 4);  // 3: mixed, some empty
        size_t n = 0, begin = 0;
        for (int q = 0; q < N; q++) { if (q < r) begin += counts[q]; n += counts[q]; }
        const size_t mine = counts[r], left = counts[(r + N - 1) % N], right = counts[(r + 1) % N];
        // blocking, non-blocking, on the comm thread (host buffers only: --device stops at 2)
        for (int mode = 0; mode < (mpi_use_device ? 2 : 3); mode++) {
            if (mode == 2) dist_comm_thread_start(g);
            float *in = lab_xmalloc((n + 1) * sizeof(float)), *out = lab_xmalloc((mine + 1) * sizeof(float));
            for (size_t i = 0; i < n; i++) in[i] = val_of(r, i);
            const DistCounters before = *dist_group_counters(g);
            mpi_mirror(in, (n + 1) * sizeof(float));
            mpi_mirror(out, (mine + 1) * sizeof(float));
            if (mode == 0) dist_reduce_scatter_v(mpi_dev(in), mpi_dev(out), counts, DIST_F32, DIST_SUM, g);
            else { DistWork w = dist_ireduce_scatter_v(mpi_dev(in), mpi_dev(out), counts, DIST_F32, DIST_SUM, g); dist_wait(&w); }
            mpi_unmirror();
            size_t bad = 0;
            for (size_t j = 0; j < mine; j++) {
                float want = 0;
                for (int q = 0; q < N; q++) want += val_of(q, begin + j);
                if (out[j] != want) bad++;
            }
            mpi_check(bad == 0, "reduce_scatter_v pattern %d mode %d on %s (rank %d of %d): %zu of "
                      "%zu wrong", pat, mode, g->name, r, N, bad, mine);
            // in place, NCCL's form (ZeRO's): the block lands where it was, AVG
            for (size_t i = 0; i < n; i++) in[i] = val_of(r, i) * (float)N;
            mpi_mirror(in, (n + 1) * sizeof(float));
            if (mode == 0) dist_reduce_scatter_v(mpi_dev(in), mpi_dev(in + begin), counts, DIST_F32, DIST_AVG, g);
            else { DistWork w = dist_ireduce_scatter_v(mpi_dev(in), mpi_dev(in + begin), counts, DIST_F32, DIST_AVG, g); dist_wait(&w); }
            mpi_unmirror();
            bad = 0;
            for (size_t j = 0; j < mine; j++) {
                float want = 0;
                for (int q = 0; q < N; q++) want += val_of(q, begin + j);
                if (in[begin + j] != want) bad++;
            }
            mpi_check(bad == 0, "reduce_scatter_v in place AVG pattern %d mode %d (rank %d of %d): "
                      "%zu wrong", pat, mode, r, N, bad);
            // all-gather in place (send = recv + begin), then from a separate buffer
            float *all = lab_xmalloc((n + 1) * sizeof(float));
            for (size_t i = 0; i < n; i++) all[i] = -1.0f;
            for (size_t j = 0; j < mine; j++) all[begin + j] = (float)(begin + j);
            mpi_mirror(all, (n + 1) * sizeof(float));
            if (mode == 0) dist_all_gather_v(mpi_dev(all + begin), mpi_dev(all), counts, DIST_F32, g);
            else { DistWork w = dist_iall_gather_v(mpi_dev(all + begin), mpi_dev(all), counts, DIST_F32, g); dist_wait(&w); }
            mpi_unmirror();
            bad = 0;
            for (size_t i = 0; i < n; i++) bad += all[i] != (float)i;
            mpi_check(bad == 0, "all_gather_v in place pattern %d mode %d (rank %d of %d): %zu of %zu "
                      "wrong", pat, mode, r, N, bad, n);
            for (size_t j = 0; j < mine; j++) out[j] = (float)(begin + j) + 0.5f;
            mpi_mirror(out, (mine + 1) * sizeof(float));
            mpi_mirror(all, (n + 1) * sizeof(float));
            if (mode == 0) dist_all_gather_v(mpi_dev(out), mpi_dev(all), counts, DIST_F32, g);
            else { DistWork w = dist_iall_gather_v(mpi_dev(out), mpi_dev(all), counts, DIST_F32, g); dist_wait(&w); }
            mpi_unmirror();
            bad = 0;
            for (size_t i = 0; i < n; i++) bad += all[i] != (float)i + 0.5f;
            mpi_check(bad == 0, "all_gather_v pattern %d mode %d (rank %d of %d): %zu wrong", pat,
                      mode, r, N, bad);
            // bytes: 2 reduce-scatters, 2 all-gathers (ring: rs sent n - c_r, recv n - c_{r-1};
            // ag sent n - c_{r+1}, recv n - c_r), 4 B an element; nothing on one rank
            const DistCounters *after = dist_group_counters(g);
            uint64_t e = 4, one = N > 1;
            uint64_t rs_s = after->sent[OP_REDUCE_SCATTER] - before.sent[OP_REDUCE_SCATTER];
            uint64_t rs_r = after->recv[OP_REDUCE_SCATTER] - before.recv[OP_REDUCE_SCATTER];
            uint64_t ag_s = after->sent[OP_ALL_GATHER] - before.sent[OP_ALL_GATHER];
            uint64_t ag_r = after->recv[OP_ALL_GATHER] - before.recv[OP_ALL_GATHER];
            mpi_check(rs_s == one * 2 * e * (n - mine) && rs_r == one * 2 * e * (n - left) &&
                      ag_s == one * 2 * e * (n - right) && ag_r == one * 2 * e * (n - mine),
                      "v-op bytes pattern %d mode %d (rank %d of %d): rs %llu/%llu ag %llu/%llu, "
                      "want %llu/%llu %llu/%llu", pat, mode, r, N, (unsigned long long)rs_s,
                      (unsigned long long)rs_r, (unsigned long long)ag_s, (unsigned long long)ag_r,
                      (unsigned long long)(one * 2 * e * (n - mine)), (unsigned long long)(one * 2 * e * (n - left)),
                      (unsigned long long)(one * 2 * e * (n - right)), (unsigned long long)(one * 2 * e * (n - mine)));
            free(in); free(out); free(all);
            if (mode == 2) dist_comm_thread_stop(g);
        }
    }
}

// zero_step on a flat buffer that is no GPT-2 (what a pipeline stage of chapter 09 holds): one
// unit (zero_layout_init_buffer), a hand-made parameter list, no model. ZeRO-1 (the whole
// gradient, reduce-scattered by the step) and ZeRO-2 (my averaged piece, reduce-scattered
// before): every rank ends with one device's AdamW step on the averaged gradient.
static void test_buffer_step(DistGroup *g) {
    const int N = g->size;
    const size_t n = 37 * (size_t)N + 5, half = n / 2;
    const GPT2Param pl[3] = {{.name = "w", .offset = 0, .size = half, .decay = 1},
                             {.name = "b", .offset = half, .size = 3, .decay = 0},
                             {.name = "w2", .offset = half + 3, .size = n - half - 3, .decay = 1}};
    const Kernels *k = kernels_get(DEV_CPU);
    AdamW h = adamw_defaults();
    h.grad_clip = 0.05f;
    for (int stage = 1; stage <= 2; stage++) {
        ZeroLayout z;
        zero_layout_init_buffer(&z, n, N, g->rank);
        float *p = lab_xmalloc(n * sizeof(float)), *grad = lab_xmalloc(n * sizeof(float));
        float *ref_p = lab_xmalloc(n * sizeof(float)), *ref_g = lab_xmalloc(n * sizeof(float));
        float *ref_m = lab_xcalloc(n, sizeof(float)), *ref_v = lab_xcalloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++) {
            ref_p[i] = p[i] = (float)((int)((i * 13) % 29) - 14) / 100.0f;
            grad[i] = grad_of(g->rank, i);
            float sum = 0.0f;
            for (int r = 0; r < N; r++) sum += grad_of(r, i);
            ref_g[i] = sum / (float)N;
        }
        double sq = 0.0;
        for (size_t i = 0; i < n; i++) sq += (double)ref_g[i] * (double)ref_g[i];
        AdamWRange ref = {.lo = 0, .hi = n, .master = ref_p, .grad = ref_g, .m = ref_m, .v = ref_v};
        adamw_update(&h, k, 0, &ref, pl, 3, adamw_clip_scale(&h, sq, 0));
        float *opt_m = lab_xcalloc(z.shard_n + 1, sizeof(float));
        float *opt_v = lab_xcalloc(z.shard_n + 1, sizeof(float));
        float *piece = lab_xcalloc(z.shard_n + 1, sizeof(float));
        ZeroShard b = {.k = k, .dt = DIST_F32, .params = p, .params_full = 1, .master = p,
                       .master_full = 1, .opt_m = opt_m, .opt_v = opt_v, .plist = pl, .nplist = 3};
        if (stage == 1) {
            b.grads = grad;
            b.grads_full = 1;
        } else {
            dist_reduce_scatter_n(grad, piece, n, DIST_F32, DIST_AVG, g);
            b.grads = piece;
        }
        zero_step(&z, &b, &h, 0, g);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (!(fabsf(p[i] - ref_p[i]) <= 1e-6f * fmaxf(1.0f, fabsf(ref_p[i])))) bad++;
        for (size_t j = 0; j < z.shard_n; j++) {
            size_t i = z.shard_begin + j;
            if (!(fabsf(opt_m[j] - ref_m[i]) <= 1e-7f) || !(fabsf(opt_v[j] - ref_v[i]) <= 1e-9f)) bad++;
        }
        mpi_check(bad == 0, "zero_step on a flat buffer of %zu, ZeRO-%d (rank %d of %d): %zu "
                  "parameters or Adam states differ from one device's step", n, stage, g->rank,
                  N, bad);
        free(p); free(grad); free(ref_p); free(ref_g); free(ref_m); free(ref_v);
        free(opt_m); free(opt_v); free(piece);
        zero_layout_free(&z);
    }
}

static const char *const KINDS[] = {"zero1-step", "gather-unit", "v-ops", "buffer-step"};

static void run_kind(int kind, DistGroup *g) {
    // clipping that bites (the norm must be global; it hides the average's 1/N, which clipping
    // removes), then none (Adam's m and v see the average itself)
    for (flat_mode = 0; flat_mode <= 1; flat_mode++) {
        if (kind == 0) { test_zero_step(g, 0.05f); test_zero_step(g, 0.0f); }
        else if (kind == 1) test_gather_unit(g);
    }
    if (kind == 2) test_v_ops(g);
    if (kind == 3) test_buffer_step(g);
}

// --device [--nccl] (v-ops only): the ops on device twins of the buffers, staged through host
// memory or over NCCL (tests/cuda_emu/run_nccl.sh's build).
static int want_nccl = 0;
static void run_with_backend(int kind, DistGroup *g) {
    mpi_select_backend(want_nccl);
    LAB_CHECK(!mpi_use_device || kind == 2, "--device runs v-ops only");
    run_kind(kind, g);
}

int main(int argc, char **argv) {
    want_nccl = mpi_take_device_flags(&argc, &argv);
    const char *prog = want_nccl ? "mpi_05_zero (nccl)" : mpi_use_device ? "mpi_05_zero (device, staged)"
                                                                       : "mpi_05_zero";
    return mpi_test_main(argc, argv, prog, "usage: mpi_05_zero [--device [--nccl]] <what>... (zero1-step gather-unit v-ops buffer-step)",
                         KINDS, 4, run_with_backend);
}
