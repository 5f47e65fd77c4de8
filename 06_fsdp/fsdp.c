// fsdp.c: FSDP's unit state machine, the plan of a micro-batch and the reduce-scatter hook.
#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "session.h"
#include "trace.h"

// ---------------------------------------------------------------------------------------------
// The plan

static FsdpOp op_of(int backward, FsdpPiece piece, int layer, int need0, int need1, int done) {
    FsdpOp o;
    memset(&o, 0, sizeof o);
    o.backward = backward;
    o.piece = piece;
    o.layer = layer;
    o.need[0] = need0;
    o.need[1] = need1;
    o.nneed = (need0 >= 0) + (need1 >= 0);
    if (need0 < 0) o.need[0] = need1;
    o.done = done;
    return o;
}

static int op_reads(const FsdpOp *o, int u) {
    for (int i = 0; i < o->nneed; i++)
        if (o->need[i] == u) return 1;
    return 0;
}

void fsdp_plan_build(FsdpPlan *p, int L, int reshard) {
    memset(p, 0, sizeof *p);
    const int H = L + 1;
    p->L = L;
    p->nunits = L + 2;
    p->reshard = reshard;
    p->ops = lab_xcalloc((size_t)(2 * L + 4), sizeof(FsdpOp));
    int n = 0;
    // forward: the embedding, the blocks in order, the head (which reads wte from unit 0)
    p->ops[n++] = op_of(0, FSDP_EMBED, -1, 0, -1, -1);
    for (int l = 0; l < L; l++) p->ops[n++] = op_of(0, FSDP_BLOCK, l, 1 + l, -1, -1);
    p->ops[n++] = op_of(0, FSDP_HEAD, -1, 0, H, -1);
    p->nfwd = n;
    // EXERCISE 06.2 Backward order -> 06_fsdp/README.md#exercise-062-backward-order
    // backward runs the pieces in reverse: the head (its gradient, and wte's share of unit 0's),
    // the blocks from the last to the first, the embedding (it reads no weights; after it unit
    // 0's gradient is complete). This order is the backward prefetch queue's.
    p->ops[n++] = op_of(1, FSDP_HEAD, -1, 0, H, H);
    for (int l = L - 1; l >= 0; l--) p->ops[n++] = op_of(1, FSDP_BLOCK, l, 1 + l, -1, 1 + l);
    p->ops[n++] = op_of(1, FSDP_EMBED, -1, -1, -1, 0);
    // END EXERCISE 06.2
    p->nops = n;
    // Walk the ops with the reshard rule: every read of a unit that is not gathered at that
    // point is an entry of the queue; the rule says what goes after each op.
    p->entry_unit = lab_xcalloc((size_t)(4 * (L + 2)), sizeof(int));
    p->entry_op = lab_xcalloc((size_t)(4 * (L + 2)), sizeof(int));
    int *alive = lab_xcalloc((size_t)p->nunits, sizeof(int));
    for (int k = 0; k < p->nops; k++) {
        FsdpOp *o = &p->ops[k];
        if (k == p->nfwd) p->nfwd_entries = p->nentries;
        for (int i = 0; i < o->nneed; i++) {
            int u = o->need[i];
            LAB_CHECK(u >= 0 && u < p->nunits, "plan: op %d reads unit %d of %d", k, u, p->nunits);
            if (alive[u]) continue;
            p->entry_unit[p->nentries] = u;
            p->entry_op[p->nentries++] = k;
            alive[u] = 1;
        }
        for (int i = 0; i < o->nneed; i++) {
            int u = o->need[i], later = 0;
            int next = k + 1 < p->nops && op_reads(&p->ops[k + 1], u);
            for (int j = k + 1; j < p->nops; j++) later |= op_reads(&p->ops[j], u);
            int go = o->backward ? !later : (reshard && !next);
            if (!go) continue;
            o->free[o->nfree++] = u;
            alive[u] = 0;
        }
    }
    for (int u = 0; u < p->nunits; u++) LAB_CHECK(!alive[u], "plan: unit %d never freed", u);
    free(alive);
}

void fsdp_plan_free(FsdpPlan *p) {
    free(p->ops);
    free(p->entry_unit);
    free(p->entry_op);
    memset(p, 0, sizeof *p);
}

const char *fsdp_unit_name(int u, int L, char *buf, size_t len) {
    if (u == 0) snprintf(buf, len, "embed");
    else if (u == L + 1) snprintf(buf, len, "head");
    else snprintf(buf, len, "block %d", u - 1);
    return buf;
}

// ---------------------------------------------------------------------------------------------
// The state machine of a unit

void fsdp_init(Fsdp *F, const ZeroLayout *z, DistGroup *shard, DistGroup *rep, DistDtype dt,
               Device dev, const Kernels *k, float *scratch, size_t scratch_n, void *param_shard,
               void *grad_shard) {
    memset(F, 0, sizeof *F);
    LAB_CHECK(z->N == shard->size && z->r == shard->rank, "FSDP: the layout is not the shard "
              "group's (%d parts, part %d; group of %d, rank %d)", z->N, z->r, shard->size,
              shard->rank);
    F->z = z;
    F->shard = shard;
    F->rep = rep;
    F->dt = dt;
    F->e = dist_dtype_size(dt);
    F->dev = dev;
    F->k = k;
    F->scratch = scratch;
    F->scratch_n = scratch_n;
    F->param_shard = param_shard;
    F->grad_shard = grad_shard;
    F->nunits = z->nunits;
    F->u = lab_xcalloc((size_t)z->nunits, sizeof(FsdpUnit));
    F->rsq = lab_xcalloc((size_t)z->nunits, sizeof(int));
    F->log_cap = 4 * z->nunits + 4;
    F->log = lab_xcalloc((size_t)F->log_cap, sizeof(int));
    F->in_flight = 1;
}

void fsdp_free(Fsdp *F) {
    for (int u = 0; u < F->nunits; u++) {
        zero_unit_free(&F->u[u].buf);
        zero_unit_grad_free(&F->u[u].buf);
    }
    free(F->u);
    free(F->rsq);
    free(F->log);
    memset(F, 0, sizeof *F);
}

static void *piece_in(const Fsdp *F, void *shard, int u) {
    return (char *)shard + F->z->p[u].local * F->e;
}

void fsdp_unit_step(Fsdp *F, int u) {
    FsdpUnit *U = &F->u[u];
    // EXERCISE 06.1 Unit gather and free -> 06_fsdp/README.md#exercise-061-unit-gather-and-free
    switch (U->state) {
    case FSDP_SHARDED:
    case FSDP_FREED:  // room for the whole unit; every rank's piece lands at its place
        zero_unit_gather_direct(F->z, u, &U->buf, F->param_shard, F->dt, F->dev, F->shard);
        U->state = FSDP_GATHERING;
        break;
    case FSDP_GATHERING:  // the whole unit is here once its all-gather is done
        zero_unit_wait(&U->buf, u);
        U->state = FSDP_GATHERED;
        break;
    case FSDP_GATHERED:  // only my piece stays
        zero_unit_free(&U->buf);
        U->state = FSDP_FREED;
        break;
    }
    // END EXERCISE 06.1
}

// ---------------------------------------------------------------------------------------------
// The walk over the plan

void fsdp_begin_micro(Fsdp *F) {
    F->next = 0;
    F->nlog = 0;
    F->rs_head = F->rs_tail = 0;
}

static int alive(const FsdpUnit *U) {
    return U->state == FSDP_GATHERING || U->state == FSDP_GATHERED;
}

static void issue(Fsdp *F, int u) {
    fsdp_unit_step(F, u);  // -> GATHERING
    if (F->nlog < F->log_cap) F->log[F->nlog++] = u;
}

void fsdp_before_op(Fsdp *F, const FsdpPlan *p, int k) {
    const FsdpOp *o = &p->ops[k];
    // the queue of this op's phase: entries up to the last one op k needs, and `prefetch` more
    // (last: the last entry of the ops up to k, issued or not; the window counts from it)
    int begin = o->backward ? p->nfwd_entries : 0, end = o->backward ? p->nentries : p->nfwd_entries;
    int last = begin - 1;
    for (int j = begin; j < end && p->entry_op[j] <= k; j++) last = j;
    int limit = last + F->prefetch;
    while (F->next < end && F->next <= limit) {
        int j = F->next, u = p->entry_unit[j];
        if (alive(&F->u[u])) {
            if (p->entry_op[j] > k) break;  // still in use from before: issue it later, in order
            F->next++;                      // needed now and (the state says) here already
            continue;
        }
        issue(F, u);
        F->next++;
    }
    for (int i = 0; i < o->nneed; i++) {
        int u = o->need[i];
        if (!alive(&F->u[u])) {  // not in the plan (or not yet issued): gather it now
            issue(F, u);
            F->unplanned++;
        }
        if (F->u[u].state == FSDP_GATHERING) fsdp_unit_step(F, u);
        LAB_CHECK(F->u[u].state == FSDP_GATHERED, "unit %d read while %d", u, (int)F->u[u].state);
    }
}

const void *fsdp_weights(const Fsdp *F, int u) {
    LAB_CHECK(F->u[u].state == FSDP_GATHERED, "unit %d's weights read while not gathered", u);
    return F->u[u].buf.w;
}

void fsdp_after_op(Fsdp *F, const FsdpPlan *p, int k) {
    const FsdpOp *o = &p->ops[k];
    for (int i = 0; i < o->nfree; i++) {
        fsdp_unit_step(F, o->free[i]);  // GATHERED -> FREED
    }
}

void fsdp_end_micro(Fsdp *F) {
    for (int u = 0; u < F->nunits; u++) {
        FsdpUnit *U = &F->u[u];
        if (U->state == FSDP_GATHERING) fsdp_unit_step(F, u);
        if (U->state == FSDP_GATHERED) {  // gathered and never read: a wrong prefetch
            fsdp_unit_step(F, u);
            F->wasted++;
        }
    }
    while (F->rs_head < F->rs_tail) fsdp_grads_reap(F);
}

// ---------------------------------------------------------------------------------------------
// Gradients: the unit buffers and the reduce-scatter hook

void *fsdp_unit_grads(Fsdp *F, int u) {
    return zero_unit_grad(F->z, u, &F->u[u].buf, F->e, MEM_GRADS, F->dev);
}

void fsdp_grads_done(Fsdp *F, int u, int sync) {
    FsdpUnit *U = &F->u[u];
    if (!sync) return;  // no_sync: the whole unit gradient stays, the next micro-batch adds to it
    const ZeroPiece *p = &F->z->p[u];
    // a NaN before the reduce-scatter travels as a real one would: to the piece's owner, its
    // replicas (HSDP) and, through the norm, every rank
    if (F->poison) session_poison(U->buf.g, F->dt == DIST_BF16);
    F->poison = 0;
    // EXERCISE 06.3 The reduce-scatter hook -> 06_fsdp/README.md#exercise-063-the-reduce-scatter-hook
    // the unit's gradient summed over the shard group and divided by its size; my piece lands
    // in place, where it sits inside the unit buffer, on the communication thread
    zero_unit_grad_scatter(F->z, u, &U->buf, (char *)U->buf.g + p->begin * F->e, F->dt, F->shard);
    F->rsq[F->rs_tail++] = u;
    // END EXERCISE 06.3
    while (F->rs_tail - F->rs_head > F->in_flight) fsdp_grads_reap(F);
}

// dst += src over n elements of the model's dtype (bf16: widened in chunks through scratch).
static void add_into(Fsdp *F, void *dst, const void *src, size_t n) {
    if (F->dt == DIST_F32) {
        F->k->residual_forward(dst, dst, src, n);
        return;
    }
    const size_t half = F->scratch_n / 2;
    LAB_CHECK(half > 0, "FSDP bf16: no scratch to add gradient pieces in");
    float *a = F->scratch, *b = F->scratch + half;
    for (size_t at = 0; at < n; at += half) {
        size_t c = n - at < half ? n - at : half;
        uint16_t *d = (uint16_t *)dst + at;
        F->k->bf16_to_f32(a, d, c);
        F->k->bf16_to_f32(b, (const uint16_t *)src + at, c);
        F->k->residual_forward(a, a, b, c);
        F->k->f32_to_bf16(d, a, c);
    }
}

void fsdp_grads_reap(Fsdp *F) {
    LAB_CHECK(F->rs_head < F->rs_tail, "no reduce-scatter pending");
    int u = F->rsq[F->rs_head++];
    FsdpUnit *U = &F->u[u];
    const ZeroPiece *p = &F->z->p[u];
    zero_unit_grad_wait(&U->buf, u);
    char *mine = (char *)U->buf.g + p->begin * F->e;
    if (F->rep && F->rep->size > 1) {
        // HSDP: the replicas of my piece (same position in every shard group) averaged
        double t0 = lab_now();
        DistWork w = dist_iall_reduce(mine, mine, p->count, F->dt, DIST_AVG, F->rep);
        dist_wait(&w);
        if (trace_enabled()) {
            char name[48];
            snprintf(name, sizeof name, "all-reduce (replicas) unit %d", u);
            trace_span(name, TRACE_COMM, t0, lab_now());
        }
    }
    add_into(F, piece_in(F, F->grad_shard, u), mine, p->count);
    zero_unit_grad_free(&U->buf);
}
