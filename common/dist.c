// dist.c: the communication API of dist.h over MPI, with byte counters.
//
// Each collective does three things, in this order: count the bytes the op moves (the model in
// dist.h), call MPI, then finish what MPI cannot do for us (DIST_AVG divides the sum by N).
//
// In place. `send == recv` or `send == NULL` means the data is already in `recv`:
//   all_reduce, reduce    the input is in recv and the result replaces it.
//   reduce_scatter        recv holds the whole input (N * recvcount); block r of the result
//                         lands at the start of recv. NCCL's form is accepted too:
//                         recv == send + r * recvcount puts the result where block r was.
//   all_gather            send == NULL or send == recv + r * sendcount (NCCL's form): this
//                         rank's block is already in place. send == recv: it is at the start.
//   scatter (root)        recv == NULL or recv == send + root * count: root keeps its block
//                         in place; recv == send: root's block is moved to the start.
//   gather (root)         send == NULL or send == recv + root * count: already in place;
//                         send == recv: root's block is at the start of recv.
// Any other overlap of send and recv is a bug in the caller and fails with file:line.
//
// Device buffers (a CUDA build, pointers from mem_alloc(..., DEV_CUDA)):
//   backend MPI   staged through host memory (so several ranks can share one GPU, like gloo):
//                 copied to a host buffer, communicated, copied back at the end (for the
//                 non-blocking variants, at dist_wait).
//   backend NCCL  each op counts its bytes here, then `if (use_nccl(...))` hands it to
//                 common/dist_nccl.c (dist_nccl.h says how: one GPU per rank, a comm stream
//                 ordered against compute with events, g->nccl the group's ncclComm_t).
//                 A non-blocking op's DistWork then holds a CUDA event instead of an MPI request.
//                 Host buffers still go over MPI; an op mixing host and device buffers fails.
#include "dist.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "dist_nccl.h"
#include "kernels.h"
#include "mem.h"

// Ops queued on a communication thread and not yet finished by dist_wait / dist_test (only the
// calling thread changes it). While it is not 0 that thread makes no MPI call (SERIALIZED).
static int queued_ops = 0;

static void need_no_queued_ops(const char *what) {
    if (queued_ops > 0)
        lab_fail("dist %s: %d all-reduce%s queued on the communication thread %s not finished: "
                 "dist_wait for %s first (MPI runs at thread level SERIALIZED, one thread at a time)",
                 what, queued_ops, queued_ops > 1 ? "s" : "", queued_ops > 1 ? "are" : "is",
                 queued_ops > 1 ? "them" : "it");
}

static DistGroup world;
static int world_ready = 0;
static DistBackend backend = DIST_BACKEND_MPI;
static DistCounters counters;
static MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
static MPI_Op bf16_sum_op = MPI_OP_NULL, bf16_max_op = MPI_OP_NULL;
static MPI_Errhandler errhandler = MPI_ERRHANDLER_NULL;

// ---------------------------------------------------------------------------------------------
// bf16 (conversions from kernels.h: round to nearest even, NaN stays NaN)

// MPI user ops on bf16: widen to fp32, combine, round back (once per pairwise combine).
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static void bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
}

// ---------------------------------------------------------------------------------------------
// lifecycle

// Any MPI error: one message naming the MPI error, then the whole job ends.
static void mpi_error_handler(MPI_Comm *comm, int *code, ...) {
    (void)comm;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(*code, msg, &len);
    lab_fail("MPI call failed: %s", msg);
}

static void abort_job(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
}

void dist_init(int *argc, char ***argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        // SERIALIZED: the communication thread (dist_comm_thread_start) calls MPI too, never
        // at the same time as the main thread.
        MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    }
    MPI_Comm_create_errhandler(mpi_error_handler, &errhandler);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, errhandler);
    lab_abort_hook = abort_job;

    world.comm = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    world.name = "world";
    world.nccl = NULL;
    world_ready = 1;
    lab_log_rank = world.rank;
    lab_log_world = world.size;

    MPI_Type_contiguous(2, MPI_BYTE, &bf16_type);
    MPI_Type_commit(&bf16_type);
    MPI_Op_create(bf16_sum_fn, 1, &bf16_sum_op);
    MPI_Op_create(bf16_max_fn, 1, &bf16_max_op);
    dist_counters_reset();
}

void dist_finalize(void) {
    if (!world_ready) return;
    need_no_queued_ops("finalize");
    dist_comm_thread_stop(&world);  // (other groups' threads stop in dist_group_free)
    dist_nccl_finalize();  // the NCCL communicators, if any
    MPI_Op_free(&bf16_sum_op);
    MPI_Op_free(&bf16_max_op);
    MPI_Type_free(&bf16_type);
    MPI_Errhandler_free(&errhandler);
    world_ready = 0;
    lab_abort_hook = NULL;  // after MPI_Finalize, MPI_Abort may no longer be called
    MPI_Finalize();
}

static void need_init(void) {
    if (!world_ready) lab_fail_at(__FILE__, __LINE__, "dist_init() must be called before any dist_* call");
}

int dist_rank(void) { need_init(); return world.rank; }
int dist_size(void) { need_init(); return world.size; }
DistGroup *dist_world(void) { need_init(); return &world; }

DistGroup *dist_split(DistGroup *parent, int color, int key, const char *name) {
    need_init();
    LAB_CHECK(color >= 0, "dist_split(%s): color must be >= 0, got %d", name, color);
    need_no_queued_ops("split");
    DistGroup *g = lab_xcalloc(1, sizeof(DistGroup));
    MPI_Comm_split(parent->comm, color, key, &g->comm);
    MPI_Comm_set_errhandler(g->comm, errhandler);
    MPI_Comm_rank(g->comm, &g->rank);
    MPI_Comm_size(g->comm, &g->size);
    size_t n = strlen(name ? name : "group") + 1;
    char *copy = lab_xmalloc(n);
    memcpy(copy, name ? name : "group", n);
    g->name = copy;
    g->nccl = NULL;
    if (backend == DIST_BACKEND_NCCL) dist_nccl_group_init(g);  // collective over g, like the split
    return g;
}

void dist_group_free(DistGroup *g) {
    if (!g) return;
    need_no_queued_ops("group_free");
    dist_comm_thread_stop(g);
    if (g == &world) return;
    dist_nccl_group_free(g);
    MPI_Comm_free(&g->comm);
    free((void *)g->name);
    free(g);
}

void dist_set_backend(DistBackend b) {
    if (b == DIST_BACKEND_NCCL) {
        need_init();
        // This rank's GPU, the comm stream, the world's communicator (in a build without CUDA:
        // fails, saying how to rebuild).
        dist_nccl_start(&world);
    }
    backend = b;
}

DistBackend dist_backend(void) { return backend; }

size_t dist_dtype_size(DistDtype dt) {
    switch (dt) {
    case DIST_F32: return 4;
    case DIST_BF16: return 2;
    case DIST_F64: return 8;
    case DIST_I32: return 4;
    case DIST_U8: return 1;
    default: lab_fail_at(__FILE__, __LINE__, "bad DistDtype %d", (int)dt);
    }
}

const char *dist_op_kind_name(DistOpKind k) {
    static const char *names[OP_NKINDS] = {
        "broadcast", "all_reduce", "reduce", "reduce_scatter", "all_gather",
        "scatter",   "gather",     "send",   "recv",   "barrier",
    };
    if ((int)k < 0 || k >= OP_NKINDS) return "?";
    return names[k];
}

// ---------------------------------------------------------------------------------------------
// helpers

static MPI_Datatype mpi_type(DistDtype dt) {
    switch (dt) {
    case DIST_F32: return MPI_FLOAT;
    case DIST_BF16: return bf16_type;
    case DIST_F64: return MPI_DOUBLE;
    case DIST_I32: return MPI_INT;
    case DIST_U8: return MPI_UINT8_T;
    default: lab_fail_at(__FILE__, __LINE__, "bad DistDtype %d", (int)dt);
    }
}

// AVG is reduced as SUM, then divided by N in finish_avg.
static MPI_Op mpi_op(DistOp op, DistDtype dt) {
    LAB_CHECK(op == DIST_SUM || op == DIST_AVG || op == DIST_MAX, "bad DistOp %d", (int)op);
    if (dt == DIST_BF16) return op == DIST_MAX ? bf16_max_op : bf16_sum_op;
    return op == DIST_MAX ? MPI_MAX : MPI_SUM;
}

// MPI counts are int.
static int mpi_count(size_t count, const char *what) {
    LAB_CHECK(count <= (size_t)INT_MAX, "%s: count %zu is over MPI's limit of %d elements", what, count,
              INT_MAX);
    return (int)count;
}

// Divide a sum by n: float types in their own precision (bf16: in fp32, rounded once), integers
// with C's truncating division.
static void finish_avg(void *buf, size_t count, DistDtype dt, int n) {
    if (n == 1 || count == 0) return;
    switch (dt) {
    case DIST_F32: {
        float *x = buf;
        for (size_t i = 0; i < count; i++) x[i] = x[i] / (float)n;
    } break;
    case DIST_BF16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < count; i++) x[i] = bf16_from_f32(bf16_to_f32(x[i]) / (float)n);
    } break;
    case DIST_F64: {
        double *x = buf;
        for (size_t i = 0; i < count; i++) x[i] = x[i] / (double)n;
    } break;
    case DIST_I32: {
        int32_t *x = buf;
        for (size_t i = 0; i < count; i++) x[i] = x[i] / n;
    } break;
    case DIST_U8: {
        uint8_t *x = buf;
        for (size_t i = 0; i < count; i++) x[i] = (uint8_t)(x[i] / n);
    } break;
    default: break;
    }
}

static void count_bytes(DistOpKind k, uint64_t sent, uint64_t recv) {
    counters.calls[k] += 1;
    counters.sent[k] += sent;
    counters.recv[k] += recv;
}

// Every op that communicates starts here.
static void count_op(DistOpKind k, uint64_t sent, uint64_t recv) {
    need_no_queued_ops(dist_op_kind_name(k));
    count_bytes(k, sent, recv);
}

// Do [a, a+na) and [b, b+nb) share a byte?
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    if (!a || !b || na == 0 || nb == 0) return 0;
    const char *x = a, *y = b;
    return x < y + nb && y < x + na;
}

static char *at_block(const void *base, int block, size_t count, DistDtype dt) {
    return (char *)base + (size_t)block * count * dist_dtype_size(dt);
}

// --- device buffers ---------------------------------------------------------------------------

static int on_device(const void *p) { return p != NULL && mem_device_of(p) == DEV_CUDA; }

// NCCL backend and a device buffer: the op goes to dist_nccl.c (which fails if one of its
// buffers is on the host). Host buffers go over MPI whatever the backend.
static int use_nccl(const void *a, const void *b) {
    return backend == DIST_BACKEND_NCCL && (on_device(a) || on_device(b));
}


// ---------------------------------------------------------------------------------------------
// the MPI calls on host buffers (counted by the public functions below)

static void host_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g,
                            MPI_Request *req) {
    int n = mpi_count(count, "dist_all_reduce");
    const void *s = (send == NULL || send == recv) ? MPI_IN_PLACE : send;
    LAB_CHECK(s == MPI_IN_PLACE || !overlaps(send, count * dist_dtype_size(dt), recv, count * dist_dtype_size(dt)),
              "dist_all_reduce: send and recv overlap without being the same buffer");
    if (req) MPI_Iallreduce(s, recv, n, mpi_type(dt), mpi_op(op, dt), g->comm, req);
    else MPI_Allreduce(s, recv, n, mpi_type(dt), mpi_op(op, dt), g->comm);
}

static void host_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g, MPI_Request *req) {
    int n = mpi_count(count, "dist_broadcast");
    if (req) MPI_Ibcast(buf, n, mpi_type(dt), root, g->comm, req);
    else MPI_Bcast(buf, n, mpi_type(dt), root, g->comm);
}

// Returns where the result block ended up (start of recv for MPI's in place, else recv), so
// the caller can move it to recv when NCCL's in-place form was used.
static void *host_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op,
                                 DistGroup *g, MPI_Request *req) {
    int n = mpi_count(recvcount, "dist_reduce_scatter");
    mpi_count(recvcount * (size_t)g->size, "dist_reduce_scatter (whole input)");
    size_t es = dist_dtype_size(dt);
    void *out = recv;
    const void *s = send;
    if (send == NULL || send == recv) {
        s = MPI_IN_PLACE;  // input in recv, result at its start
    } else if (recv == at_block(send, g->rank, recvcount, dt)) {
        s = MPI_IN_PLACE;  // NCCL's form: input is send, result belongs at block r of it
        out = (void *)send;
    } else {
        LAB_CHECK(!overlaps(send, recvcount * (size_t)g->size * es, recv, recvcount * es),
                  "dist_reduce_scatter: recv overlaps send but is neither send nor send + rank * recvcount");
    }
    if (req) MPI_Ireduce_scatter_block(s, out, n, mpi_type(dt), mpi_op(op, dt), g->comm, req);
    else MPI_Reduce_scatter_block(s, out, n, mpi_type(dt), mpi_op(op, dt), g->comm);
    return out;
}

static void host_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g,
                            MPI_Request *req) {
    int n = mpi_count(sendcount, "dist_all_gather");
    mpi_count(sendcount * (size_t)g->size, "dist_all_gather (whole output)");
    size_t es = dist_dtype_size(dt);
    char *mine = at_block(recv, g->rank, sendcount, dt);
    const void *s = send;
    if (send == NULL || send == mine) {
        s = MPI_IN_PLACE;
    } else if (send == recv) {
        memmove(mine, recv, sendcount * es);  // this rank's block sits at the start: put it in place
        s = MPI_IN_PLACE;
    } else {
        LAB_CHECK(!overlaps(send, sendcount * es, recv, sendcount * (size_t)g->size * es),
                  "dist_all_gather: send overlaps recv but is neither recv nor recv + rank * sendcount");
    }
    if (req) MPI_Iallgather(s, n, mpi_type(dt), recv, n, mpi_type(dt), g->comm, req);
    else MPI_Allgather(s, n, mpi_type(dt), recv, n, mpi_type(dt), g->comm);
}

// ---------------------------------------------------------------------------------------------
// finishing non-blocking ops
//
// Some ops need work after MPI completes: AVG divides (DistWork has what it needs), and two
// cases move data: NCCL's in-place reduce-scatter form (MPI leaves the result at the start of
// the input), and device buffers on the MPI backend (the op runs on a host staging buffer that
// is copied to the device and freed). DistWork has no field for that, so such ops leave an
// entry here, found again by the op's MPI request and result buffer.

typedef struct Pending {
    MPI_Request req;   // key, with buf (the DistWork's)
    void *buf;
    void *result;      // where MPI leaves the result
    void *dst;         // where it belongs (NULL: nothing to move)
    size_t bytes;
    void *host;        // staging buffer to free, or NULL
    int used;
} Pending;

#define MAX_PENDING 1024
static Pending pending[MAX_PENDING];

static void pending_add(MPI_Request req, void *buf, void *result, void *dst, size_t bytes, void *host) {
    for (int i = 0; i < MAX_PENDING; i++) {
        if (!pending[i].used) {
            pending[i] = (Pending){req, buf, result, dst, bytes, host, 1};
            return;
        }
    }
    lab_fail_at(__FILE__, __LINE__, "more than %d staged or moved non-blocking ops in flight: wait for some",
                MAX_PENDING);
}

static void finish_work(DistWork *w, MPI_Request key) {
    w->active = 0;
    Pending *e = NULL;
    for (int i = 0; i < MAX_PENDING && !e; i++)
        if (pending[i].used && pending[i].req == key && pending[i].buf == w->buf) e = &pending[i];
    void *res = e ? e->result : w->buf;
    if (w->op == DIST_AVG) finish_avg(res, w->count, w->dtype, w->group_size);
    if (!e) return;
    if (e->dst && e->bytes && e->dst != e->result) mem_copy(e->dst, e->result, e->bytes);
    free(e->host);
    e->used = 0;
}

// ---------------------------------------------------------------------------------------------
// the communication thread (dist.h): a queue of all-reduces, run in order by one thread

typedef struct CommTask {
    const void *send;
    void *recv;
    size_t count;
    DistDtype dt;
    DistOp op;
    int done;                // set by the thread (under the mutex) when recv holds the result
    struct CommTask *next;   // the queue, in launch order
    struct CommThread *owner;
} CommTask;

typedef struct CommThread {
    DistGroup group;         // a copy of the group with the thread's own communicator
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t work;     // signalled when a task is queued or the thread must stop
    pthread_cond_t done;     // broadcast when a task is done
    CommTask *head, *tail;   // queued, not yet run (head: running now)
    int stop;
    double busy_s, cpu_s;    // inside MPI_Allreduce: wall-clock time, and CPU time of the thread
} CommThread;

static double thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *comm_thread_main(void *arg) {
    CommThread *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->head && !t->stop) pthread_cond_wait(&t->work, &t->mu);
        if (!t->head) break;  // stop, and nothing left
        CommTask *task = t->head;
        pthread_mutex_unlock(&t->mu);
        // The blocking all-reduce, on this thread's communicator; the caller's thread meanwhile
        // computes (and makes no MPI call: need_no_queued_ops).
        double w0 = lab_now(), c0 = thread_cpu_now();
        host_all_reduce(task->send, task->recv, task->count, task->dt, task->op, &t->group, NULL);
        if (task->op == DIST_AVG) finish_avg(task->recv, task->count, task->dt, t->group.size);
        double w1 = lab_now(), c1 = thread_cpu_now();
        pthread_mutex_lock(&t->mu);
        t->busy_s += w1 - w0;
        t->cpu_s += c1 - c0;
        t->head = task->next;
        if (!t->head) t->tail = NULL;
        task->done = 1;
        pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

void dist_comm_thread_start(DistGroup *g) {
    need_init();
    need_no_queued_ops("comm_thread_start");
    if (g->thread) return;
    int level = 0;
    MPI_Query_thread(&level);
    LAB_CHECK(level >= MPI_THREAD_SERIALIZED, "dist_comm_thread_start: MPI was initialized at a "
              "thread level below MPI_THREAD_SERIALIZED (%d); a communication thread needs it", level);
    CommThread *t = lab_xcalloc(1, sizeof(CommThread));
    t->group = *g;
    t->group.thread = NULL;
    MPI_Comm_dup(g->comm, &t->group.comm);  // its collectives never meet the caller's
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work, NULL);
    pthread_cond_init(&t->done, NULL);
    LAB_CHECK(pthread_create(&t->tid, NULL, comm_thread_main, t) == 0,
              "dist_comm_thread_start: pthread_create failed");
    g->thread = t;
}

void dist_comm_thread_stop(DistGroup *g) {
    CommThread *t = g->thread;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->work);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->tid, NULL);  // it runs what is queued first
    g->thread = NULL;
    MPI_Comm_free(&t->group.comm);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->work);
    pthread_cond_destroy(&t->done);
    free(t);
}

void dist_comm_thread_times(DistGroup *g, double *busy_s, double *cpu_s) {
    CommThread *t = g->thread;
    *busy_s = *cpu_s = 0.0;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    *busy_s = t->busy_s;
    *cpu_s = t->cpu_s;
    pthread_mutex_unlock(&t->mu);
}

static void comm_thread_queue(CommThread *t, DistWork *w, const void *send, void *recv) {
    CommTask *task = lab_xcalloc(1, sizeof(CommTask));
    *task = (CommTask){send, recv, w->count, w->dtype, w->op, 0, NULL, t};
    pthread_mutex_lock(&t->mu);
    if (t->tail) t->tail->next = task;
    else t->head = task;
    t->tail = task;
    pthread_cond_signal(&t->work);
    pthread_mutex_unlock(&t->mu);
    w->task = task;
    queued_ops++;
}

// Finish a queued op: wait (or only look, when !block) for the thread to have run it.
static int comm_thread_finish(DistWork *w, int block) {
    CommTask *task = w->task;
    CommThread *t = task->owner;
    pthread_mutex_lock(&t->mu);
    while (block && !task->done) pthread_cond_wait(&t->done, &t->mu);
    int done = task->done;
    pthread_mutex_unlock(&t->mu);
    if (!done) return 0;
    free(task);
    w->task = NULL;
    w->active = 0;
    queued_ops--;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// non-blocking collectives (and, for device buffers, the blocking ones: start + wait)

static DistWork work_new(void *buf, size_t count, DistDtype dt, DistOp op, DistGroup *g) {
    DistWork w;
    memset(&w, 0, sizeof w);
    w.req = MPI_REQUEST_NULL;
    w.buf = buf;
    w.count = count;
    w.dtype = dt;
    w.op = op;
    w.group_size = g->size;
    w.active = 1;
    return w;
}

// Device buffers on the MPI backend? (NCCL with device buffers goes to dist_nccl.c.)
static int staged(const void *a, const void *b) {
#ifdef LAB_CUDA
    return backend == DIST_BACKEND_MPI && (on_device(a) || on_device(b));
#else
    (void)a;
    (void)b;
    return 0;
#endif
}

// A host copy of [p, p+bytes) (copied in when copy), for the MPI backend with device buffers.
static void *stage_in(const void *p, size_t bytes, int copy) {
    void *h = lab_xmalloc(bytes ? bytes : 1);
    if (copy && bytes) mem_copy(h, p, bytes);
    return h;
}

DistWork dist_iall_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt), N = (uint64_t)g->size;
    if (g->thread && !use_nccl(send, recv) && !staged(send, recv)) {
        // host buffers on a group with a communication thread: queue it there
        mpi_count(count, "dist_iall_reduce");
        LAB_CHECK(send == NULL || send == recv || !overlaps(send, S, recv, S),
                  "dist_iall_reduce: send and recv overlap without being the same buffer");
        count_bytes(OP_ALL_REDUCE, 2 * (N - 1) * S / N, 2 * (N - 1) * S / N);
        DistWork w = work_new(recv, count, dt, op, g);
        comm_thread_queue(g->thread, &w, send, recv);
        return w;
    }
    count_op(OP_ALL_REDUCE, 2 * (N - 1) * S / N, 2 * (N - 1) * S / N);
    DistWork w = work_new(recv, count, dt, op, g);
    if (use_nccl(send, recv)) {
        dist_nccl_all_reduce(send, recv, count, dt, op, g, &w);
        return w;
    }
    if (staged(send, recv)) {
        void *h = stage_in((send == NULL || send == recv) ? recv : send, S, 1);
        host_all_reduce(NULL, h, count, dt, op, g, &w.req);
        pending_add(w.req, recv, h, recv, S, h);
        return w;
    }
    host_all_reduce(send, recv, count, dt, op, g, &w.req);
    return w;
}

DistWork dist_ibroadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    // A group of one moves nothing.
    if (g->rank == root) count_op(OP_BROADCAST, g->size > 1 ? S : 0, 0);
    else count_op(OP_BROADCAST, 0, S);
    DistWork w = work_new(buf, count, dt, DIST_SUM, g);
    if (use_nccl(buf, NULL)) {
        dist_nccl_broadcast(buf, count, dt, root, g, &w);
        return w;
    }
    if (staged(buf, NULL)) {
        void *h = stage_in(buf, S, g->rank == root);
        host_broadcast(h, count, dt, root, g, &w.req);
        pending_add(w.req, buf, h, g->rank == root ? NULL : buf, S, h);
        return w;
    }
    host_broadcast(buf, count, dt, root, g, &w.req);
    return w;
}

DistWork dist_ireduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op,
                              DistGroup *g) {
    size_t es = dist_dtype_size(dt);
    uint64_t N = (uint64_t)g->size, S = N * recvcount * es;
    count_op(OP_REDUCE_SCATTER, (N - 1) * S / N, (N - 1) * S / N);
    DistWork w = work_new(recv, recvcount, dt, op, g);
    if (use_nccl(send, recv)) {
        dist_nccl_reduce_scatter(send, recv, recvcount, dt, op, g, &w);
        return w;
    }
    if (staged(send, recv)) {
        // the whole input to host; block r of the result comes back to recv
        void *h = stage_in((send == NULL || send == recv) ? recv : send, S, 1);
        host_reduce_scatter(h, h, recvcount, dt, op, g, &w.req);
        pending_add(w.req, recv, h, recv, recvcount * es, h);
        return w;
    }
    void *out = host_reduce_scatter(send, recv, recvcount, dt, op, g, &w.req);
    if (out != recv) pending_add(w.req, recv, out, recv, recvcount * es, NULL);
    return w;
}

DistWork dist_iall_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g) {
    size_t es = dist_dtype_size(dt);
    uint64_t N = (uint64_t)g->size, S = N * sendcount * es;
    count_op(OP_ALL_GATHER, (N - 1) * S / N, (N - 1) * S / N);
    DistWork w = work_new(recv, sendcount * (size_t)g->size, dt, DIST_SUM, g);
    if (use_nccl(send, recv)) {
        dist_nccl_all_gather(send, recv, sendcount, dt, g, &w);
        return w;
    }
    if (staged(send, recv)) {
        // this rank's block goes to its place in a host copy of the whole output
        void *h = stage_in(NULL, S, 0);
        const void *mine = send ? send : at_block(recv, g->rank, sendcount, dt);
        mem_copy(at_block(h, g->rank, sendcount, dt), mine, sendcount * es);
        host_all_gather(NULL, h, sendcount, dt, g, &w.req);
        pending_add(w.req, recv, h, recv, S, h);
        return w;
    }
    host_all_gather(send, recv, sendcount, dt, g, &w.req);
    return w;
}

DistWork dist_isend(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    count_op(OP_SEND, S, 0);
    DistWork w = work_new((void *)buf, count, dt, DIST_SUM, g);
    if (use_nccl(buf, NULL)) {
        dist_nccl_send(buf, count, dt, peer, g, &w);
        return w;
    }
    int n = mpi_count(count, "dist_isend");
    if (staged(buf, NULL)) {
        void *h = stage_in(buf, S, 1);
        MPI_Isend(h, n, mpi_type(dt), peer, tag, g->comm, &w.req);
        pending_add(w.req, (void *)buf, h, NULL, 0, h);
        return w;
    }
    MPI_Isend(buf, n, mpi_type(dt), peer, tag, g->comm, &w.req);
    return w;
}

DistWork dist_irecv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    count_op(OP_RECV, 0, S);
    DistWork w = work_new(buf, count, dt, DIST_SUM, g);
    if (use_nccl(buf, NULL)) {
        dist_nccl_recv(buf, count, dt, peer, g, &w);
        return w;
    }
    int n = mpi_count(count, "dist_irecv");
    if (staged(buf, NULL)) {
        void *h = stage_in(NULL, S, 0);
        MPI_Irecv(h, n, mpi_type(dt), peer, tag, g->comm, &w.req);
        pending_add(w.req, buf, h, buf, S, h);
        return w;
    }
    MPI_Irecv(buf, n, mpi_type(dt), peer, tag, g->comm, &w.req);
    return w;
}

void dist_wait(DistWork *w) {
    if (!w->active) return;
    if (w->task) {  // queued on a communication thread: sleep until it has run it
        comm_thread_finish(w, 1);
        return;
    }
    need_no_queued_ops("wait");
    if (w->event) {  // NCCL: the compute stream waits for the op
        dist_nccl_wait(w);
        return;
    }
    MPI_Request key = w->req;  // MPI_Wait resets w->req
    MPI_Wait(&w->req, MPI_STATUS_IGNORE);
    finish_work(w, key);
}

int dist_test(DistWork *w) {
    if (!w->active) return 1;
    if (w->task) return comm_thread_finish(w, 0);
    need_no_queued_ops("test");
    if (w->event) return dist_nccl_test(w);
    MPI_Request key = w->req;
    int done = 0;
    MPI_Test(&w->req, &done, MPI_STATUS_IGNORE);
    if (done) finish_work(w, key);
    return done;
}

void dist_wait_all(DistWork *w, int n) {
    for (int i = 0; i < n; i++) dist_wait(&w[i]);
}

// ---------------------------------------------------------------------------------------------
// blocking collectives

void dist_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g) {
    if (staged(buf, NULL)) {
        DistWork w = dist_ibroadcast(buf, count, dt, root, g);
        dist_wait(&w);
        return;
    }
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    if (g->rank == root) count_op(OP_BROADCAST, g->size > 1 ? S : 0, 0);
    else count_op(OP_BROADCAST, 0, S);
    if (use_nccl(buf, NULL)) {
        dist_nccl_broadcast(buf, count, dt, root, g, NULL);
        return;
    }
    host_broadcast(buf, count, dt, root, g, NULL);
}

void dist_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g) {
    if (staged(send, recv)) {
        DistWork w = dist_iall_reduce(send, recv, count, dt, op, g);
        dist_wait(&w);
        return;
    }
    uint64_t S = (uint64_t)count * dist_dtype_size(dt), N = (uint64_t)g->size;
    count_op(OP_ALL_REDUCE, 2 * (N - 1) * S / N, 2 * (N - 1) * S / N);
    if (use_nccl(send, recv)) {
        dist_nccl_all_reduce(send, recv, count, dt, op, g, NULL);
        return;
    }
    host_all_reduce(send, recv, count, dt, op, g, NULL);
    if (op == DIST_AVG) finish_avg(recv, count, dt, g->size);
}

void dist_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op, DistGroup *g) {
    if (staged(send, recv)) {
        DistWork w = dist_ireduce_scatter(send, recv, recvcount, dt, op, g);
        dist_wait(&w);
        return;
    }
    size_t es = dist_dtype_size(dt);
    uint64_t N = (uint64_t)g->size, S = N * recvcount * es;
    count_op(OP_REDUCE_SCATTER, (N - 1) * S / N, (N - 1) * S / N);
    if (use_nccl(send, recv)) {
        dist_nccl_reduce_scatter(send, recv, recvcount, dt, op, g, NULL);
        return;
    }
    void *out = host_reduce_scatter(send, recv, recvcount, dt, op, g, NULL);
    if (op == DIST_AVG) finish_avg(out, recvcount, dt, g->size);
    if (out != recv) memmove(recv, out, recvcount * es);
}

void dist_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g) {
    if (staged(send, recv)) {
        DistWork w = dist_iall_gather(send, recv, sendcount, dt, g);
        dist_wait(&w);
        return;
    }
    size_t es = dist_dtype_size(dt);
    uint64_t N = (uint64_t)g->size, S = N * sendcount * es;
    count_op(OP_ALL_GATHER, (N - 1) * S / N, (N - 1) * S / N);
    if (use_nccl(send, recv)) {
        dist_nccl_all_gather(send, recv, sendcount, dt, g, NULL);
        return;
    }
    host_all_gather(send, recv, sendcount, dt, g, NULL);
}

void dist_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int root, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    int is_root = g->rank == root;
    if (is_root) count_op(OP_REDUCE, 0, (uint64_t)(g->size - 1) * S);
    else count_op(OP_REDUCE, S, 0);
    if (use_nccl(send, recv)) {
        dist_nccl_reduce(send, recv, count, dt, op, root, g);
        return;
    }
    int n = mpi_count(count, "dist_reduce");
    int in_place = (send == NULL || send == recv);
    if (staged(send, recv)) {
        void *hs = stage_in(in_place ? recv : send, S, 1);
        void *hr = is_root ? stage_in(NULL, S, 0) : NULL;
        MPI_Reduce(hs, hr, n, mpi_type(dt), mpi_op(op, dt), root, g->comm);
        if (is_root) {
            if (op == DIST_AVG) finish_avg(hr, count, dt, g->size);
            mem_copy(recv, hr, S);
        }
        free(hs);
        free(hr);
        return;
    }
    if (is_root) {
        const void *s = in_place ? MPI_IN_PLACE : send;
        LAB_CHECK(in_place || !overlaps(send, S, recv, S), "dist_reduce: send and recv overlap");
        MPI_Reduce(s, recv, n, mpi_type(dt), mpi_op(op, dt), root, g->comm);
        if (op == DIST_AVG) finish_avg(recv, count, dt, g->size);
    } else {
        // Non-roots only send; their recv is not written (it may be NULL).
        MPI_Reduce(in_place ? recv : send, NULL, n, mpi_type(dt), mpi_op(op, dt), root, g->comm);
    }
}

void dist_scatter(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    size_t es = dist_dtype_size(dt);
    uint64_t block = (uint64_t)count * es;
    int is_root = g->rank == root;
    if (is_root) count_op(OP_SCATTER, (uint64_t)(g->size - 1) * block, 0);
    else count_op(OP_SCATTER, 0, block);
    if (use_nccl(send, recv)) {
        dist_nccl_scatter(send, recv, count, dt, root, g);
        return;
    }
    int n = mpi_count(count, "dist_scatter");
    mpi_count(count * (size_t)g->size, "dist_scatter (whole input)");
    if (staged(send, recv)) {
        void *hs = is_root ? stage_in(send, block * (size_t)g->size, 1) : NULL;
        void *hr = stage_in(NULL, block, 0);
        MPI_Scatter(hs, n, mpi_type(dt), hr, n, mpi_type(dt), root, g->comm);
        if (recv) mem_copy(recv, hr, block);
        free(hs);
        free(hr);
        return;
    }
    if (!is_root) {
        MPI_Scatter(NULL, n, mpi_type(dt), recv, n, mpi_type(dt), root, g->comm);
        return;
    }
    char *mine = at_block(send, root, count, dt);
    if (recv == NULL || recv == mine || recv == send) {
        MPI_Scatter(send, n, mpi_type(dt), MPI_IN_PLACE, n, mpi_type(dt), root, g->comm);
        if (recv == send) memmove(recv, mine, block);  // root's block to the start, as asked
    } else {
        LAB_CHECK(!overlaps(send, block * (size_t)g->size, recv, block),
                  "dist_scatter: recv overlaps send but is neither send nor send + root * count");
        MPI_Scatter(send, n, mpi_type(dt), recv, n, mpi_type(dt), root, g->comm);
    }
}

void dist_gather(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    size_t es = dist_dtype_size(dt);
    uint64_t block = (uint64_t)count * es;
    int is_root = g->rank == root;
    if (is_root) count_op(OP_GATHER, 0, (uint64_t)(g->size - 1) * block);
    else count_op(OP_GATHER, block, 0);
    if (use_nccl(send, recv)) {
        dist_nccl_gather(send, recv, count, dt, root, g);
        return;
    }
    int n = mpi_count(count, "dist_gather");
    mpi_count(count * (size_t)g->size, "dist_gather (whole output)");
    if (staged(send, recv)) {
        const void *src = (is_root && send == NULL) ? at_block(recv, root, count, dt) : send;
        void *hs = stage_in(src, block, 1);
        void *hr = is_root ? stage_in(NULL, block * (size_t)g->size, 0) : NULL;
        MPI_Gather(hs, n, mpi_type(dt), hr, n, mpi_type(dt), root, g->comm);
        if (is_root) mem_copy(recv, hr, block * (size_t)g->size);
        free(hs);
        free(hr);
        return;
    }
    if (!is_root) {
        MPI_Gather(send, n, mpi_type(dt), NULL, n, mpi_type(dt), root, g->comm);
        return;
    }
    char *mine = at_block(recv, root, count, dt);
    if (send == NULL || send == mine || send == recv) {
        if (send == recv) memmove(mine, recv, block);  // root's block from the start into place
        MPI_Gather(MPI_IN_PLACE, n, mpi_type(dt), recv, n, mpi_type(dt), root, g->comm);
    } else {
        LAB_CHECK(!overlaps(send, block, recv, block * (size_t)g->size),
                  "dist_gather: send overlaps recv but is neither recv nor recv + root * count");
        MPI_Gather(send, n, mpi_type(dt), recv, n, mpi_type(dt), root, g->comm);
    }
}

void dist_send(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    count_op(OP_SEND, S, 0);
    if (use_nccl(buf, NULL)) {
        dist_nccl_send(buf, count, dt, peer, g, NULL);
        return;
    }
    int n = mpi_count(count, "dist_send");
    if (staged(buf, NULL)) {
        void *h = stage_in(buf, S, 1);
        MPI_Send(h, n, mpi_type(dt), peer, tag, g->comm);
        free(h);
        return;
    }
    MPI_Send(buf, n, mpi_type(dt), peer, tag, g->comm);
}

void dist_recv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g) {
    uint64_t S = (uint64_t)count * dist_dtype_size(dt);
    count_op(OP_RECV, 0, S);
    if (use_nccl(buf, NULL)) {
        dist_nccl_recv(buf, count, dt, peer, g, NULL);
        return;
    }
    int n = mpi_count(count, "dist_recv");
    if (staged(buf, NULL)) {
        void *h = stage_in(NULL, S, 0);
        MPI_Recv(h, n, mpi_type(dt), peer, tag, g->comm, MPI_STATUS_IGNORE);
        mem_copy(buf, h, S);
        free(h);
        return;
    }
    MPI_Recv(buf, n, mpi_type(dt), peer, tag, g->comm, MPI_STATUS_IGNORE);
}

void dist_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount, int src,
                   DistDtype dt, int tag, DistGroup *g) {
    size_t es = dist_dtype_size(dt);
    count_op(OP_SEND, (uint64_t)sendcount * es, 0);
    count_op(OP_RECV, 0, (uint64_t)recvcount * es);
    LAB_CHECK(!overlaps(sendbuf, sendcount * es, recvbuf, recvcount * es), "dist_sendrecv: buffers overlap");
    if (use_nccl(sendbuf, recvbuf)) {
        dist_nccl_sendrecv(sendbuf, sendcount, dst, recvbuf, recvcount, src, dt, g);  // one NCCL group
        return;
    }
    int ns = mpi_count(sendcount, "dist_sendrecv (send)");
    int nr = mpi_count(recvcount, "dist_sendrecv (recv)");
    if (staged(sendbuf, recvbuf)) {
        void *hs = stage_in(sendbuf, sendcount * es, 1);
        void *hr = stage_in(NULL, recvcount * es, 0);
        MPI_Sendrecv(hs, ns, mpi_type(dt), dst, tag, hr, nr, mpi_type(dt), src, tag, g->comm, MPI_STATUS_IGNORE);
        mem_copy(recvbuf, hr, recvcount * es);
        free(hs);
        free(hr);
        return;
    }
    MPI_Sendrecv(sendbuf, ns, mpi_type(dt), dst, tag, recvbuf, nr, mpi_type(dt), src, tag, g->comm,
                 MPI_STATUS_IGNORE);
}

void dist_barrier(DistGroup *g) {
    count_op(OP_BARRIER, 0, 0);
    MPI_Barrier(g->comm);
}

// ---------------------------------------------------------------------------------------------
// counters

const DistCounters *dist_counters(void) { return &counters; }

void dist_counters_reset(void) { memset(&counters, 0, sizeof counters); }

uint64_t dist_bytes_sent(void) {
    uint64_t s = 0;
    for (int k = 0; k < OP_NKINDS; k++) s += counters.sent[k];
    return s;
}

uint64_t dist_bytes_recv(void) {
    uint64_t s = 0;
    for (int k = 0; k < OP_NKINDS; k++) s += counters.recv[k];
    return s;
}
