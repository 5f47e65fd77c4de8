// pipe_exec.c: the pipeline executor (pipe_exec.h).
#include "pipe_exec.h"

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "trace.h"

static int tag_of(const PipeExec *x, int dir, int vs, int mb) {
    return (dir * x->s->p * x->s->v + vs) * x->s->m + mb;
}

// The stage (rank in the pipeline group) holding virtual stage vs.
static int stage_of(const PipeExec *x, int vs) { return vs % x->s->p; }

static size_t slot_of(const PipeExec *x, int dir, int chunk, int mb) {
    return ((size_t)dir * x->s->v + chunk) * x->s->m + mb;
}

void pipe_exec_init(PipeExec *x, const Schedule *s, PipeWork w, DistGroup *g, int stage,
                    size_t msg, int bf16, const Kernels *k, Device dev) {
    // a bad table would hang in a receive (under --quiet nothing else simulates it): refuse it
    char err[512];
    if (sched_validate(s, err, sizeof err) != 0) lab_fail_collective("schedule %s: %s", s->name, err);
    *x = (PipeExec){.s = s, .w = w, .g = g, .stage = stage, .msg = msg, .bf16 = bf16, .k = k};
    LAB_CHECK(tag_of(x, 1, s->p * s->v - 1, s->m - 1) < 30000,
              "too many micro-batches x stages for MPI tags");
    const int n = 2 * s->v * s->m;
    x->sendbuf = lab_xcalloc((size_t)n, sizeof(float *));
    for (int i = 0; i < n; i++) x->sendbuf[i] = mem_alloc(msg * sizeof(float), MEM_COMM, dev);
    if (bf16) {
        x->wire = lab_xcalloc((size_t)n, sizeof(uint16_t *));
        for (int i = 0; i < n; i++) x->wire[i] = mem_alloc(msg * 2, MEM_COMM, dev);
        x->rwire = mem_alloc(msg * 2, MEM_COMM, dev);
    }
    x->works = lab_xcalloc((size_t)n + 1, sizeof(DistWork));
    x->state = lab_xcalloc((size_t)s->v * s->m, 1);
    x->op_start = lab_xcalloc((size_t)s->nops[stage] + 1, sizeof(double));
    x->op_end = lab_xcalloc((size_t)s->nops[stage] + 1, sizeof(double));
}

void pipe_exec_free(PipeExec *x) {
    const int n = 2 * x->s->v * x->s->m;
    for (int i = 0; i < n; i++) mem_free(x->sendbuf[i]);
    for (int i = 0; x->wire && i < n; i++) mem_free(x->wire[i]);
    free(x->wire), mem_free(x->rwire);
    free(x->sendbuf), free(x->works), free(x->state), free(x->op_start), free(x->op_end);
}

// Receives micro-batch mb's message for virtual stage vs into dst: dir 0 the activation from
// vs-1, dir 1 the gradient from vs+1 (a chunk on this same rank: a copy).
static void recv_msg(PipeExec *x, int dir, int vs, int mb, float *dst) {
    const int from = dir == 0 ? vs - 1 : vs + 1, p = x->s->p;
    if (stage_of(x, from) == x->stage) {  // rounded as a message would be: the same bits on any p
        const float *src = x->sendbuf[slot_of(x, dir, from / p, mb)];
        if (x->bf16) {
            x->k->f32_to_bf16(x->rwire, src, x->msg);
            x->k->bf16_to_f32(dst, x->rwire, x->msg);
        } else {
            mem_copy(dst, src, x->msg * sizeof(float));
        }
        return;
    }
    double t0 = lab_now();
    int tok = trace_begin(dir == 0 ? "recv activation" : "recv gradient", TRACE_COMM);
    dist_recv(x->bf16 ? (void *)x->rwire : (void *)dst, x->msg, x->bf16 ? DIST_BF16 : DIST_F32,
              stage_of(x, from), tag_of(x, dir, vs, mb), x->g);
    trace_end(tok);
    x->wait += lab_now() - t0;  // idle: the stage has nothing to compute until it arrives
    if (x->bf16) x->k->bf16_to_f32(dst, x->rwire, x->msg);
}

static void send_msg(PipeExec *x, int dir, int vs, int mb) {
    const int to = dir == 0 ? vs + 1 : vs - 1;
    if (stage_of(x, to) == x->stage) return;  // the receiver copies it from sendbuf
    const size_t slot = slot_of(x, dir, vs / x->s->p, mb);
    const int tag = tag_of(x, dir, to, mb);
    if (x->bf16) {  // the activation is bf16 already (a stored layer, widened); the gradient rounds
        x->k->f32_to_bf16(x->wire[slot], x->sendbuf[slot], x->msg);
        x->works[x->nworks++] = dist_isend(x->wire[slot], x->msg, DIST_BF16, stage_of(x, to), tag, x->g);
    } else {
        x->works[x->nworks++] = dist_isend(x->sendbuf[slot], x->msg, DIST_F32, stage_of(x, to), tag, x->g);
    }
}

static void track(PipeExec *x, int dsets, int dw) {
    x->live += dsets;
    x->wlive += dw;
    if (x->live > x->live_peak) x->live_peak = x->live;
    if (x->wlive > x->wlive_peak) x->wlive_peak = x->wlive;
    size_t now = mem_current(MEM_ACTS) - x->acts_base;
    if (now > x->acts_peak) x->acts_peak = now;
}

double pipe_exec_step(PipeExec *x) {
    const Schedule *s = x->s;
    const int S = s->p * s->v;
    double loss_sum = 0;
    x->nworks = 0;
    x->live = 0;
    x->acts_base = mem_current(MEM_ACTS);
    for (int j = 0; j < s->nops[x->stage]; j++) {
        const PipeOp o = s->ops[x->stage][j];
        const int vs = o.chunk * s->p + x->stage;
        unsigned char *st = &x->state[(size_t)o.chunk * s->m + o.mb];
        char name[32];
        snprintf(name, sizeof name, "%c%d chunk %d", "FBW"[o.kind], o.mb, o.chunk);
        x->op_start[j] = lab_now();
        x->wait = 0;
        if (o.kind == PIPE_F) {
            LAB_CHECK(*st == 0, "F(%d) of chunk %d twice", o.mb, o.chunk);
            float *in = x->w.f_begin(x->w.ctx, o.chunk, o.mb);
            *st = 1;
            track(x, 1, 0);
            if (vs > 0) recv_msg(x, 0, vs, o.mb, in);
            float *out = vs < S - 1 ? x->sendbuf[slot_of(x, 0, o.chunk, o.mb)] : NULL;
            int tok = trace_begin(name, TRACE_COMPUTE);
            loss_sum += x->w.forward(x->w.ctx, o.chunk, o.mb, out);
            trace_end(tok);
            if (out) send_msg(x, 0, vs, o.mb);
        } else if (o.kind == PIPE_B) {
            LAB_CHECK(*st == 1, "B(%d) of chunk %d before its F", o.mb, o.chunk);
            float *dout = x->w.b_begin(x->w.ctx, o.chunk, o.mb);
            if (vs < S - 1) recv_msg(x, 1, vs, o.mb, dout);
            float *din = vs > 0 ? x->sendbuf[slot_of(x, 1, o.chunk, o.mb)] : NULL;
            int tok = trace_begin(name, TRACE_COMPUTE);
            x->w.backward(x->w.ctx, o.chunk, o.mb, din);
            trace_end(tok);
            if (din) send_msg(x, 1, vs, o.mb);
            *st = s->split ? 2 : 0;
            track(x, -1, s->split);
        } else {
            LAB_CHECK(x->w.weights, "a split schedule (W ops) on a stage without a W call");
            LAB_CHECK(*st == 2, "W(%d) of chunk %d before its B", o.mb, o.chunk);
            int tok = trace_begin(name, TRACE_COMPUTE);
            x->w.weights(x->w.ctx, o.chunk, o.mb);
            trace_end(tok);
            *st = 0;
            track(x, 0, -1);
        }
        x->op_end[j] = lab_now();
        x->op_start[j] += x->wait;  // the op's busy time: all but the wait for its message
    }
    dist_wait_all(x->works, x->nworks);
    return loss_sum;
}

void pipe_sum_tied(void *mine, void *local, int peer, size_t n, DistDtype dt, DistGroup *g) {
    const size_t bytes = n * dist_dtype_size(dt);
    char *a = lab_xmalloc(bytes), *b = lab_xmalloc(bytes);
    mem_copy(a, mine, bytes);
    if (local) {
        mem_copy(b, local, bytes);
    } else {
        void *recv = mem_alloc(bytes, MEM_COMM, mem_device_of(mine));
        int tok = trace_begin("sum tied wte gradient", TRACE_COMM);
        dist_sendrecv(mine, n, peer, recv, n, peer, dt, 30000, g);
        trace_end(tok);
        mem_copy(b, recv, bytes);
        mem_free(recv);
    }
    float *fa = (float *)a;
    const float *fb = (const float *)b;
    uint16_t *ha = (uint16_t *)a;
    const uint16_t *hb = (const uint16_t *)b;
    for (size_t i = 0; i < n; i++)
        if (dt == DIST_F32) fa[i] = fa[i] + fb[i];
        else ha[i] = bf16_from_f32(bf16_to_f32(ha[i]) + bf16_to_f32(hb[i]));
    mem_copy(mine, a, bytes);
    if (local) mem_copy(local, a, bytes);
    free(a), free(b);
}
