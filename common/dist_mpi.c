// dist_mpi.c: the MPI backend of dist.h (host buffers), and MPI's part of the lifecycle.
//
// One op per case of mpi_run. Blocking ops are finished on return; a non-blocking op leaves an
// MPI request in w->req and, when MPI cannot finish it alone, an MpiAux in w->aux: AVG divides
// the sum by N after MPI is done, some in-place forms leave the result where MPI put it and
// move it at the end, and the v-collectives' count arrays must live until the op completes.
//
// In place (dist.c's top comment lists the forms; here is how each maps onto MPI):
//   all_reduce, reduce    MPI_IN_PLACE.
//   reduce_scatter        input in recv: MPI_IN_PLACE, the result lands at recv's start.
//                         recv == send + begin_r (NCCL's form): MPI_IN_PLACE on send, and the
//                         result moves from send's start to block r afterwards.
//   all_gather, gather    this rank's block at its place in recv: MPI_IN_PLACE; at recv's start
//                         (send == recv): moved to its place first.
//   scatter (root)        MPI_IN_PLACE; recv == send: root's block moves to the start after.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dist_backend.h"

static MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
static MPI_Op bf16_sum_op = MPI_OP_NULL, bf16_max_op = MPI_OP_NULL;
static MPI_Errhandler errhandler = MPI_ERRHANDLER_NULL;

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

// A process started without mpirun (a singleton: `./00_memory_budget/run`) has no other
// process to stop, and MPI_Abort would print Open MPI's six-line banner under the lab's
// one-line error: it just ends, with the code, and (as MPI_Abort) without exit handlers.
// Under mpirun (which sets OMPI_COMM_WORLD_SIZE), even at -np 1, MPI_Abort is the shorter end:
// a plain exit there adds mpirun's two banners about a non-zero exit.
static int singleton;

static void abort_job(int code) {
    if (singleton) _exit(code);
    MPI_Abort(MPI_COMM_WORLD, code);
}

void dist_mpi_init(int *argc, char ***argv, DistGroup *world) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        // SERIALIZED: the communication thread (dist_thread.c) calls MPI too, never at the
        // same time as the main thread (dist.h says why not MULTIPLE).
        MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    }
    MPI_Comm_create_errhandler(mpi_error_handler, &errhandler);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, errhandler);
    lab_abort_hook = abort_job;
    world->comm = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &world->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world->size);
    singleton = world->size == 1 && !getenv("OMPI_COMM_WORLD_SIZE");
    world->world_ranks = lab_xmalloc((size_t)world->size * sizeof(int));
    for (int p = 0; p < world->size; p++) world->world_ranks[p] = p;
    MPI_Type_contiguous(2, MPI_BYTE, &bf16_type);
    MPI_Type_commit(&bf16_type);
    MPI_Op_create(dist_bf16_sum_fn, 1, &bf16_sum_op);
    MPI_Op_create(dist_bf16_max_fn, 1, &bf16_max_op);
}

void dist_mpi_finalize(void) {
    MPI_Op_free(&bf16_sum_op);
    MPI_Op_free(&bf16_max_op);
    MPI_Type_free(&bf16_type);
    MPI_Errhandler_free(&errhandler);
    lab_abort_hook = NULL;  // after MPI_Finalize, MPI_Abort may no longer be called
    MPI_Finalize();
}

void dist_mpi_split(DistGroup *parent, int color, int key, DistGroup *g) {
    MPI_Comm_split(parent->comm, color, key, &g->comm);
    MPI_Comm_set_errhandler(g->comm, errhandler);
    MPI_Comm_rank(g->comm, &g->rank);
    MPI_Comm_size(g->comm, &g->size);
    // the world rank of each group rank (local: MPI knows both groups' members)
    MPI_Group mine, all;
    MPI_Comm_group(g->comm, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    int *ranks = lab_xmalloc((size_t)g->size * sizeof(int));
    g->world_ranks = lab_xmalloc((size_t)g->size * sizeof(int));
    for (int p = 0; p < g->size; p++) ranks[p] = p;
    MPI_Group_translate_ranks(mine, g->size, ranks, all, g->world_ranks);
    free(ranks);
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
}

void dist_mpi_dup(const DistGroup *g, DistGroup *copy) {
    *copy = *g;
    copy->thread = NULL;
    MPI_Comm_dup(g->comm, &copy->comm);
}

void dist_mpi_group_free(DistGroup *g) { MPI_Comm_free(&g->comm); }

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

// AVG is reduced as SUM, then divided by N (dist_finish_avg).
static MPI_Op mpi_op(DistOp op, DistDtype dt) {
    LAB_CHECK(op == DIST_SUM || op == DIST_AVG || op == DIST_MAX, "bad DistOp %d", (int)op);
    if (dt == DIST_BF16) return op == DIST_MAX ? bf16_max_op : bf16_sum_op;
    return op == DIST_MAX ? MPI_MAX : MPI_SUM;
}

int dist_mpi_count(size_t count, const char *what) {
    LAB_CHECK(count <= (size_t)INT_MAX, "%s: count %zu is over MPI's limit of %d elements", what, count,
              INT_MAX);
    return (int)count;
}

// What a non-blocking op leaves for its finish (w->aux).
typedef struct MpiAux {
    void *result;   // where MPI leaves the result (NULL: w->buf)
    void *dst;      // where it belongs (NULL: nothing to move)
    size_t bytes;
    int *counts, *displs;  // the v-collectives' arrays (freed at the finish)
} MpiAux;

static MpiAux *aux_of(DistWork *w) {
    if (!w->aux) w->aux = lab_xcalloc(1, sizeof(MpiAux));
    return w->aux;
}

// Per-rank counts and displacements of an op's blocks (c->counts), for MPI's v-forms.
static void block_arrays(const DistCall *c, int N, int **counts, int **displs, const char *what) {
    dist_mpi_count(call_total(c, N), what);
    *counts = lab_xmalloc((size_t)N * sizeof(int));
    *displs = lab_xmalloc((size_t)N * sizeof(int));
    for (int p = 0; p < N; p++) {
        (*counts)[p] = (int)call_block_len(c, N, p);
        (*displs)[p] = (int)call_block_begin(c, N, p);
    }
}

// ---------------------------------------------------------------------------------------------
// the ops

static void all_reduce(const DistCall *c, DistGroup *g, DistWork *w) {
    int n = dist_mpi_count(c->count, "dist_all_reduce");
    size_t bytes = c->count * dist_dtype_size(c->dt);
    const void *s = (c->send == NULL || c->send == c->recv) ? MPI_IN_PLACE : c->send;
    LAB_CHECK(s == MPI_IN_PLACE || !dist_overlaps(c->send, bytes, c->recv, bytes),
              "dist_all_reduce: send and recv overlap without being the same buffer");
    if (w) {
        MPI_Iallreduce(s, c->recv, n, mpi_type(c->dt), mpi_op(c->op, c->dt), g->comm, &w->req);
        return;
    }
    MPI_Allreduce(s, c->recv, n, mpi_type(c->dt), mpi_op(c->op, c->dt), g->comm);
    if (c->op == DIST_AVG) dist_finish_avg(c->recv, c->count, c->dt, g->size);
}

static void broadcast(const DistCall *c, DistGroup *g, DistWork *w) {
    int n = dist_mpi_count(c->count, "dist_broadcast");
    if (w) MPI_Ibcast(c->recv, n, mpi_type(c->dt), c->peer, g->comm, &w->req);
    else MPI_Bcast(c->recv, n, mpi_type(c->dt), c->peer, g->comm);
}

static void reduce(const DistCall *c, DistGroup *g) {
    int n = dist_mpi_count(c->count, "dist_reduce");
    size_t bytes = c->count * dist_dtype_size(c->dt);
    int in_place = (c->send == NULL || c->send == c->recv);
    if (g->rank == c->peer) {
        LAB_CHECK(in_place || !dist_overlaps(c->send, bytes, c->recv, bytes), "dist_reduce: send and recv overlap");
        MPI_Reduce(in_place ? MPI_IN_PLACE : c->send, c->recv, n, mpi_type(c->dt), mpi_op(c->op, c->dt), c->peer,
                   g->comm);
        if (c->op == DIST_AVG) dist_finish_avg(c->recv, c->count, c->dt, g->size);
    } else {
        // Non-roots only send; their recv is not written (it may be NULL).
        MPI_Reduce(in_place ? c->recv : c->send, NULL, n, mpi_type(c->dt), mpi_op(c->op, c->dt), c->peer, g->comm);
    }
}

static void reduce_scatter(const DistCall *c, DistGroup *g, DistWork *w) {
    int N = g->size, r = g->rank;
    size_t es = dist_dtype_size(c->dt), mine = call_block_len(c, N, r);
    int n = dist_mpi_count(mine, "dist_reduce_scatter");
    dist_mpi_count(call_total(c, N), "dist_reduce_scatter (whole input)");
    void *out = c->recv;  // where MPI leaves block r of the result
    const void *s = c->send;
    if (c->send == NULL || c->send == c->recv) {
        s = MPI_IN_PLACE;  // input in recv, result at its start
    } else if (c->recv == dist_at(c->send, call_block_begin(c, N, r), c->dt)) {
        s = MPI_IN_PLACE;  // NCCL's form: input is send, result belongs at block r of it
        out = (void *)c->send;
    } else {
        LAB_CHECK(!dist_overlaps(c->send, call_total(c, N) * es, c->recv, mine * es),
                  "dist_reduce_scatter: recv overlaps send but is neither send nor send + its block's start");
    }
    MPI_Datatype t = mpi_type(c->dt);
    MPI_Op op = mpi_op(c->op, c->dt);
    int *counts = NULL, *displs = NULL;
    if (c->counts) block_arrays(c, N, &counts, &displs, "dist_reduce_scatter_v");
    if (w) {
        if (c->counts) MPI_Ireduce_scatter(s, out, counts, t, op, g->comm, &w->req);
        else MPI_Ireduce_scatter_block(s, out, n, t, op, g->comm, &w->req);
        if (out != c->recv || counts) {
            MpiAux *a = aux_of(w);
            *a = (MpiAux){out, out != c->recv ? c->recv : NULL, mine * es, counts, displs};
        }
        return;
    }
    if (c->counts) MPI_Reduce_scatter(s, out, counts, t, op, g->comm);
    else MPI_Reduce_scatter_block(s, out, n, t, op, g->comm);
    free(counts);
    free(displs);
    if (c->op == DIST_AVG) dist_finish_avg(out, mine, c->dt, N);
    if (out != c->recv) memmove(c->recv, out, mine * es);
}

// all_gather and gather (root >= 0): this rank's block to its place in every rank's (the
// root's) recv.
static void gather_blocks(const DistCall *c, DistGroup *g, DistWork *w, int root) {
    int N = g->size, r = g->rank;
    size_t es = dist_dtype_size(c->dt), mine = call_block_len(c, N, r);
    const char *what = root < 0 ? "dist_all_gather" : "dist_gather";
    int n = dist_mpi_count(mine, what);
    dist_mpi_count(call_total(c, N), what);
    MPI_Datatype t = mpi_type(c->dt);
    int writes = root < 0 || r == root;  // this rank's recv receives the blocks
    const void *s = c->send;
    if (writes) {
        char *at = dist_at(c->recv, call_block_begin(c, N, r), c->dt);
        if (c->send == NULL || c->send == at) {
            s = MPI_IN_PLACE;
        } else if (c->send == c->recv) {
            memmove(at, c->recv, mine * es);  // this rank's block sits at the start: put it in place
            s = MPI_IN_PLACE;
        } else {
            LAB_CHECK(!dist_overlaps(c->send, mine * es, c->recv, call_total(c, N) * es),
                      "%s: send overlaps recv but is neither recv nor recv + its block's start", what);
        }
    }
    int *counts = NULL, *displs = NULL;
    if (c->counts && writes) block_arrays(c, N, &counts, &displs, what);
    if (root < 0 && w) {
        if (c->counts) MPI_Iallgatherv(s, n, t, c->recv, counts, displs, t, g->comm, &w->req);
        else MPI_Iallgather(s, n, t, c->recv, n, t, g->comm, &w->req);
        if (counts) *aux_of(w) = (MpiAux){NULL, NULL, 0, counts, displs};
        return;
    }
    LAB_CHECK(root < 0 || !w, "dist_gather has no non-blocking form");
    if (root < 0) {
        if (c->counts) MPI_Allgatherv(s, n, t, c->recv, counts, displs, t, g->comm);
        else MPI_Allgather(s, n, t, c->recv, n, t, g->comm);
    } else if (c->counts) {
        MPI_Gatherv(s, n, t, writes ? c->recv : NULL, counts, displs, t, root, g->comm);
    } else {
        MPI_Gather(s, n, t, writes ? c->recv : NULL, n, t, root, g->comm);
    }
    free(counts);
    free(displs);
}

static void scatter(const DistCall *c, DistGroup *g) {
    size_t es = dist_dtype_size(c->dt), block = c->count * es;
    int n = dist_mpi_count(c->count, "dist_scatter");
    dist_mpi_count(c->count * (size_t)g->size, "dist_scatter (whole input)");
    int root = c->peer;
    if (g->rank != root) {
        MPI_Scatter(NULL, n, mpi_type(c->dt), c->recv, n, mpi_type(c->dt), root, g->comm);
        return;
    }
    char *mine = dist_at(c->send, (size_t)root * c->count, c->dt);
    if (c->recv == NULL || c->recv == mine || c->recv == c->send) {
        MPI_Scatter(c->send, n, mpi_type(c->dt), MPI_IN_PLACE, n, mpi_type(c->dt), root, g->comm);
        if (c->recv == c->send) memmove(c->recv, mine, block);  // root's block to the start, as asked
    } else {
        LAB_CHECK(!dist_overlaps(c->send, block * (size_t)g->size, c->recv, block),
                  "dist_scatter: recv overlaps send but is neither send nor send + root * count");
        MPI_Scatter(c->send, n, mpi_type(c->dt), c->recv, n, mpi_type(c->dt), root, g->comm);
    }
}

static void mpi_run(const DistCall *c, DistGroup *g, DistWork *w) {
    if (w) w->backend = &dist_mpi_backend;
    MPI_Datatype t = mpi_type(c->dt);
    switch (c->kind) {
    case OP_ALL_REDUCE: all_reduce(c, g, w); break;
    case OP_BROADCAST: broadcast(c, g, w); break;
    case OP_REDUCE: reduce(c, g); break;
    case OP_REDUCE_SCATTER: reduce_scatter(c, g, w); break;
    case OP_ALL_GATHER: gather_blocks(c, g, w, -1); break;
    case OP_GATHER: gather_blocks(c, g, NULL, c->peer); break;
    case OP_SCATTER: scatter(c, g); break;
    case OP_SEND: {
        int n = dist_mpi_count(c->count, "dist_send");
        if (c->recv) {  // dist_sendrecv
            int nr = dist_mpi_count(c->recvcount, "dist_sendrecv (recv)");
            LAB_CHECK(!w, "dist_sendrecv has no non-blocking form");
            MPI_Sendrecv(c->send, n, t, c->peer, c->tag, c->recv, nr, t, c->src, c->tag, g->comm, MPI_STATUS_IGNORE);
            break;
        }
        if (w) MPI_Isend(c->send, n, t, c->peer, c->tag, g->comm, &w->req);
        else MPI_Send(c->send, n, t, c->peer, c->tag, g->comm);
    } break;
    case OP_RECV: {
        int n = dist_mpi_count(c->count, "dist_recv");
        if (w) MPI_Irecv(c->recv, n, t, c->peer, c->tag, g->comm, &w->req);
        else MPI_Recv(c->recv, n, t, c->peer, c->tag, g->comm, MPI_STATUS_IGNORE);
    } break;
    case OP_BARRIER: MPI_Barrier(g->comm); break;
    default: lab_fail_at(__FILE__, __LINE__, "dist MPI backend: op kind %d has no case", (int)c->kind);
    }
}

// ---------------------------------------------------------------------------------------------
// finishing non-blocking ops

static void finish(DistWork *w) {
    w->active = 0;
    MpiAux *a = w->aux;
    void *res = (a && a->result) ? a->result : w->buf;
    if (w->op == DIST_AVG) dist_finish_avg(res, w->count, w->dtype, w->group_size);
    if (!a) return;
    if (a->dst && a->bytes && a->dst != res) memmove(a->dst, res, a->bytes);
    free(a->counts);
    free(a->displs);
    free(a);
    w->aux = NULL;
}

static void mpi_wait(DistWork *w) {
    MPI_Wait(&w->req, MPI_STATUS_IGNORE);
    finish(w);
}

static int mpi_test(DistWork *w) {
    int done = 0;
    MPI_Test(&w->req, &done, MPI_STATUS_IGNORE);
    if (done) finish(w);
    return done;
}

const DistBackendOps dist_mpi_backend = {"mpi", mpi_run, mpi_wait, mpi_test};
