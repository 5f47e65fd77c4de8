// dist_nccl.c: the NCCL backend of dist.h (one GPU per rank). Called by dist.c only; the
// protocol every op follows is in dist_nccl.h.
//
// Streams. Kernels and cuBLAS run on the legacy default stream (the compute stream). NCCL runs
// on its own stream, created non-blocking so that nothing orders the two streams implicitly:
// the events below are the whole ordering, and a non-blocking op really overlaps compute.
//
// Communicators. One ncclComm per DistGroup, made from an ncclUniqueId that the group's rank 0
// creates and broadcasts over the group's MPI communicator: the world's at
// dist_set_backend(DIST_BACKEND_NCCL), a new group's at dist_split (or, for a group split
// before the backend was chosen, at its first collective). dist_finalize destroys them all.
#include "dist_nccl.h"

#include "check.h"

#if defined(LAB_CUDA) && !defined(LAB_CUDA_EMU)

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>

#include "mem.h"

// Every CUDA and NCCL call is checked: the job ends with file:line and the library's message.
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
#define ncclCheck(call) nccl_check((call), #call, __FILE__, __LINE__)

static void cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err != cudaSuccess) lab_fail_at(file, line, "%s: CUDA error: %s", call, cudaGetErrorString(err));
}

static void nccl_check(ncclResult_t res, const char *call, const char *file, int line) {
    if (res != ncclSuccess) lab_fail_at(file, line, "%s: NCCL error: %s", call, ncclGetErrorString(res));
}

// The compute stream: the legacy default stream, where the kernels are launched.
#define COMPUTE_STREAM cudaStreamLegacy

static int started = 0;
static int local_rank = 0, local_size = 1, ndevices = 0;
static cudaStream_t comm_stream;     // every NCCL op runs here
static cudaEvent_t compute_ready;    // recorded on the compute stream before each op

// Groups that hold a communicator, so that dist_finalize can destroy what is still alive.
#define MAX_NCCL_GROUPS 64
static DistGroup *live[MAX_NCCL_GROUPS];

// ---------------------------------------------------------------------------------------------
// lifecycle

void dist_nccl_start(DistGroup *world) {
    if (started) return;
    // Ranks that share this node's memory are on the same machine: this rank's place among
    // them picks its GPU.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    cudaCheck(cudaGetDeviceCount(&ndevices));
    cudaCheck(cudaSetDevice(local_rank % ndevices));
    cudaCheck(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&compute_ready, cudaEventDisableTiming));
    started = 1;
    dist_nccl_group_init(world);
}

void dist_nccl_group_init(DistGroup *g) {
    LAB_CHECK(started, "dist_nccl_group_init(%s) before dist_nccl_start", g->name);
    if (g->nccl) return;
    int slot = 0;
    while (slot < MAX_NCCL_GROUPS && live[slot]) slot++;
    if (slot == MAX_NCCL_GROUPS)
        lab_fail("more than %d groups with an NCCL communicator: free some with dist_group_free",
                 MAX_NCCL_GROUPS);

    ncclUniqueId id;
    if (g->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm);
    ncclComm_t comm;
    ncclResult_t res = ncclCommInitRank(&comm, g->size, id, g->rank);
    if (res != ncclSuccess)
        lab_fail("ncclCommInitRank for group %s (rank %d of %d, GPU %d) failed: %s. NCCL needs one GPU "
                 "per rank: %d ranks on this node see %d GPU(s); run at most %d ranks per node, or use "
                 "--backend mpi (which can share a GPU)",
                 g->name, g->rank, g->size, local_rank % ndevices, ncclGetErrorString(res), local_size,
                 ndevices, ndevices);
    g->nccl = comm;
    live[slot] = g;
}

void dist_nccl_group_free(DistGroup *g) {
    if (!g->nccl) return;
    cudaCheck(cudaStreamSynchronize(comm_stream));  // nothing of g's may still be running
    ncclCheck(ncclCommDestroy((ncclComm_t)g->nccl));
    g->nccl = NULL;
    for (int i = 0; i < MAX_NCCL_GROUPS; i++)
        if (live[i] == g) live[i] = NULL;
}

void dist_nccl_finalize(void) {
    if (!started) return;
    // In creation order: the same on every rank.
    for (int i = 0; i < MAX_NCCL_GROUPS; i++)
        if (live[i]) dist_nccl_group_free(live[i]);
    cudaCheck(cudaEventDestroy(compute_ready));
    cudaCheck(cudaStreamDestroy(comm_stream));
    started = 0;
}

// ---------------------------------------------------------------------------------------------
// helpers

static ncclDataType_t nccl_type(DistDtype dt) {
    switch (dt) {
    case DIST_F32: return ncclFloat32;
    case DIST_BF16: return ncclBfloat16;
    case DIST_F64: return ncclFloat64;
    case DIST_I32: return ncclInt32;
    case DIST_U8: return ncclUint8;
    default: lab_fail_at(__FILE__, __LINE__, "bad DistDtype %d", (int)dt);
    }
}

static ncclRedOp_t nccl_op(DistOp op) {
    switch (op) {
    case DIST_SUM: return ncclSum;
    case DIST_AVG: return ncclAvg;  // NCCL divides by N itself
    case DIST_MAX: return ncclMax;
    default: lab_fail_at(__FILE__, __LINE__, "bad DistOp %d", (int)op);
    }
}

// NCCL reads and writes GPU memory only, and only this rank's GPU.
static void need_device(const void *p, const char *what, const char *op) {
    if (p == NULL || mem_device_of(p) != DEV_CUDA)
        lab_fail("%s with the NCCL backend: %s is %s, but NCCL moves GPU buffers only: allocate it with "
                 "mem_alloc(..., DEV_CUDA), or use --backend mpi",
                 op, what, p == NULL ? "NULL" : "a host pointer");
    struct cudaPointerAttributes attr;
    cudaCheck(cudaPointerGetAttributes(&attr, p));
    if (attr.device != local_rank % ndevices)
        lab_fail("%s with the NCCL backend: %s is on GPU %d, but this rank uses GPU %d: allocate device "
                 "buffers after dist_set_backend(DIST_BACKEND_NCCL), which selects the GPU",
                 op, what, attr.device, local_rank % ndevices);
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

// g's communicator, made now if g was split before the NCCL backend was chosen. Only for
// collectives: every rank of g is here, so the creation (collective over g) cannot hang.
static ncclComm_t coll_comm(DistGroup *g) {
    LAB_CHECK(started, "NCCL op before dist_set_backend(DIST_BACKEND_NCCL)");
    if (!g->nccl) dist_nccl_group_init(g);
    return (ncclComm_t)g->nccl;
}

// Send/recv involve two ranks of g, not all of them: the communicator must exist already.
static ncclComm_t p2p_comm(DistGroup *g, const char *op) {
    LAB_CHECK(started, "NCCL op before dist_set_backend(DIST_BACKEND_NCCL)");
    if (!g->nccl)
        lab_fail("%s on group %s with the NCCL backend: the group has no NCCL communicator yet, and a "
                 "send/recv (two ranks) cannot create one: call dist_set_backend(DIST_BACKEND_NCCL) "
                 "before dist_split, or run a collective on the group first",
                 op, g->name);
    return (ncclComm_t)g->nccl;
}

// Before an op: the comm stream waits for everything already launched on the compute stream.
static void begin_op(void) {
    cudaCheck(cudaEventRecord(compute_ready, COMPUTE_STREAM));
    cudaCheck(cudaStreamWaitEvent(comm_stream, compute_ready, 0));
}

// After an op: blocking (w == NULL) waits for it; non-blocking leaves an event in w.
static void end_op(DistWork *w) {
    if (w == NULL) {
        cudaCheck(cudaStreamSynchronize(comm_stream));
        return;
    }
    cudaEvent_t done;
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(done, comm_stream));
    w->event = done;
}

// A device-to-device copy on the comm stream, in order with the NCCL calls around it.
static void copy_on_comm_stream(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, comm_stream));
}

// ---------------------------------------------------------------------------------------------
// collectives

void dist_nccl_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g, DistWork *w) {
    need_device(buf, "buf", "dist_broadcast");
    ncclComm_t comm = coll_comm(g);
    begin_op();
    ncclCheck(ncclBroadcast(buf, buf, count, nccl_type(dt), root, comm, comm_stream));
    end_op(w);
}

void dist_nccl_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g,
                          DistWork *w) {
    size_t bytes = count * dist_dtype_size(dt);
    const void *in = (send == NULL || send == recv) ? recv : send;
    need_device(in, "send", "dist_all_reduce");
    need_device(recv, "recv", "dist_all_reduce");
    LAB_CHECK(in == recv || !overlaps(send, bytes, recv, bytes),
              "dist_all_reduce: send and recv overlap without being the same buffer");
    ncclComm_t comm = coll_comm(g);
    begin_op();
    ncclCheck(ncclAllReduce(in, recv, count, nccl_type(dt), nccl_op(op), comm, comm_stream));
    end_op(w);
}

void dist_nccl_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int root,
                      DistGroup *g) {
    size_t bytes = count * dist_dtype_size(dt);
    int is_root = g->rank == root;
    const void *in = (send == NULL || send == recv) ? recv : send;
    need_device(in, "send", "dist_reduce");
    if (is_root) {
        need_device(recv, "recv (at the root)", "dist_reduce");
        LAB_CHECK(in == recv || !overlaps(send, bytes, recv, bytes), "dist_reduce: send and recv overlap");
    }
    ncclComm_t comm = coll_comm(g);
    begin_op();
    // Non-roots only send; NCCL ignores their receive buffer (as MPI does, it may be NULL).
    ncclCheck(ncclReduce(in, is_root ? recv : NULL, count, nccl_type(dt), nccl_op(op), root, comm, comm_stream));
    end_op(NULL);
}

void dist_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op,
                              DistGroup *g, DistWork *w) {
    size_t block = recvcount * dist_dtype_size(dt);
    int r = g->rank;
    ncclComm_t comm = coll_comm(g);
    if (send == NULL || send == recv) {
        // The input is in recv and block r of the result belongs at its start. NCCL's in-place
        // form leaves it at block r; then it moves to the start (block r and block 0 do not
        // overlap for r > 0; for r = 0 there is nothing to move).
        need_device(recv, "recv", "dist_reduce_scatter");
        char *mine = at_block(recv, r, recvcount, dt);
        begin_op();
        ncclCheck(ncclReduceScatter(recv, mine, recvcount, nccl_type(dt), nccl_op(op), comm, comm_stream));
        copy_on_comm_stream(recv, mine, block);
    } else {
        // recv == send + r * recvcount is NCCL's own in-place form; anything else must not overlap.
        need_device(send, "send", "dist_reduce_scatter");
        need_device(recv, "recv", "dist_reduce_scatter");
        LAB_CHECK(recv == at_block(send, r, recvcount, dt) || !overlaps(send, block * (size_t)g->size, recv, block),
                  "dist_reduce_scatter: recv overlaps send but is neither send nor send + rank * recvcount");
        begin_op();
        ncclCheck(ncclReduceScatter(send, recv, recvcount, nccl_type(dt), nccl_op(op), comm, comm_stream));
    }
    end_op(w);
}

void dist_nccl_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g,
                          DistWork *w) {
    size_t block = sendcount * dist_dtype_size(dt);
    need_device(recv, "recv", "dist_all_gather");
    char *mine = at_block(recv, g->rank, sendcount, dt);
    ncclComm_t comm = coll_comm(g);
    const void *in = send;
    if (send == NULL || send == mine) {
        in = mine;  // NCCL's in-place form: this rank's block is already in place
        begin_op();
    } else if (send == recv) {
        in = mine;  // this rank's block sits at the start: move it to its place first
        begin_op();
        copy_on_comm_stream(mine, recv, block);
    } else {
        need_device(send, "send", "dist_all_gather");
        LAB_CHECK(!overlaps(send, block, recv, block * (size_t)g->size),
                  "dist_all_gather: send overlaps recv but is neither recv nor recv + rank * sendcount");
        begin_op();
    }
    ncclCheck(ncclAllGather(in, recv, sendcount, nccl_type(dt), comm, comm_stream));
    end_op(w);
}

// NCCL has no scatter: the root sends block p to each rank p, in one group.
void dist_nccl_scatter(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    size_t block = count * dist_dtype_size(dt);
    ncclComm_t comm = coll_comm(g);
    if (g->rank != root) {
        need_device(recv, "recv", "dist_scatter");
        begin_op();
        ncclCheck(ncclRecv(recv, count, nccl_type(dt), root, comm, comm_stream));
        end_op(NULL);
        return;
    }
    need_device(send, "send (at the root)", "dist_scatter");
    char *mine = at_block(send, root, count, dt);
    begin_op();
    ncclCheck(ncclGroupStart());
    for (int p = 0; p < g->size; p++)
        if (p != root) ncclCheck(ncclSend(at_block(send, p, count, dt), count, nccl_type(dt), p, comm, comm_stream));
    ncclCheck(ncclGroupEnd());
    // The root's own block: in place (recv NULL or mine), to the start (recv == send; after the
    // sends, which read block 0), or to a separate recv.
    if (recv != NULL && recv != mine) {
        need_device(recv, "recv", "dist_scatter");
        LAB_CHECK(recv == send || !overlaps(send, block * (size_t)g->size, recv, block),
                  "dist_scatter: recv overlaps send but is neither send nor send + root * count");
        copy_on_comm_stream(recv, mine, block);
    }
    end_op(NULL);
}

// NCCL has no gather: the root receives block p from each rank p, in one group.
void dist_nccl_gather(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    size_t block = count * dist_dtype_size(dt);
    ncclComm_t comm = coll_comm(g);
    if (g->rank != root) {
        need_device(send, "send", "dist_gather");
        begin_op();
        ncclCheck(ncclSend(send, count, nccl_type(dt), root, comm, comm_stream));
        end_op(NULL);
        return;
    }
    need_device(recv, "recv (at the root)", "dist_gather");
    char *mine = at_block(recv, root, count, dt);
    begin_op();
    // The root's own block goes to its place first (from the start of recv when send == recv:
    // before block 0 is received over it).
    if (send != NULL && send != mine) {
        if (send != recv) {
            need_device(send, "send", "dist_gather");
            LAB_CHECK(!overlaps(send, block, recv, block * (size_t)g->size),
                      "dist_gather: send overlaps recv but is neither recv nor recv + root * count");
        }
        copy_on_comm_stream(mine, send, block);
    }
    ncclCheck(ncclGroupStart());
    for (int p = 0; p < g->size; p++)
        if (p != root) ncclCheck(ncclRecv(at_block(recv, p, count, dt), count, nccl_type(dt), p, comm, comm_stream));
    ncclCheck(ncclGroupEnd());
    end_op(NULL);
}

// ---------------------------------------------------------------------------------------------
// point to point

void dist_nccl_send(const void *buf, size_t count, DistDtype dt, int peer, DistGroup *g, DistWork *w) {
    need_device(buf, "buf", "dist_send");
    ncclComm_t comm = p2p_comm(g, "dist_send");
    begin_op();
    ncclCheck(ncclSend(buf, count, nccl_type(dt), peer, comm, comm_stream));
    end_op(w);
}

void dist_nccl_recv(void *buf, size_t count, DistDtype dt, int peer, DistGroup *g, DistWork *w) {
    need_device(buf, "buf", "dist_recv");
    ncclComm_t comm = p2p_comm(g, "dist_recv");
    begin_op();
    ncclCheck(ncclRecv(buf, count, nccl_type(dt), peer, comm, comm_stream));
    end_op(w);
}

void dist_nccl_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount,
                        int src, DistDtype dt, DistGroup *g) {
    need_device(sendbuf, "sendbuf", "dist_sendrecv");
    need_device(recvbuf, "recvbuf", "dist_sendrecv");
    ncclComm_t comm = p2p_comm(g, "dist_sendrecv");
    begin_op();
    // One group: NCCL starts both together, so a ring of these cannot deadlock.
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclSend(sendbuf, sendcount, nccl_type(dt), dst, comm, comm_stream));
    ncclCheck(ncclRecv(recvbuf, recvcount, nccl_type(dt), src, comm, comm_stream));
    ncclCheck(ncclGroupEnd());
    end_op(NULL);
}

// ---------------------------------------------------------------------------------------------
// completion of non-blocking ops

void dist_nccl_wait(DistWork *w) {
    // The compute stream (not the host) waits: kernels launched from now on see the result.
    cudaCheck(cudaStreamWaitEvent(COMPUTE_STREAM, (cudaEvent_t)w->event, 0));
    cudaCheck(cudaEventDestroy((cudaEvent_t)w->event));  // freed once it has completed
    w->event = NULL;
    w->active = 0;
}

int dist_nccl_test(DistWork *w) {
    cudaError_t err = cudaEventQuery((cudaEvent_t)w->event);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();  // "not ready" is an answer, not an error: do not leave it behind
        return 0;
    }
    cudaCheck(err);
    dist_nccl_wait(w);
    return 1;
}

#else  // no CUDA (or the CPU emulator): dist_set_backend refuses NCCL, so the ops are never reached

#if defined(LAB_CUDA_EMU)
#define NO_NCCL "the NCCL backend is not available in the CUDA emulator (tests/cuda_emu): use --backend mpi"
#else
#define NO_NCCL "--backend nccl needs a CUDA build: rebuild with `make CUDA=1` on a machine with nvcc and " \
                "NCCL, or use --backend mpi"
#endif

LAB_NORETURN static void no_nccl(void) { lab_fail_collective(NO_NCCL); }

void dist_nccl_start(DistGroup *world) { (void)world; no_nccl(); }
void dist_nccl_group_init(DistGroup *g) { (void)g; no_nccl(); }
void dist_nccl_group_free(DistGroup *g) { (void)g; }  // no group has a communicator
void dist_nccl_finalize(void) {}
void dist_nccl_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g, DistWork *w) {
    (void)buf, (void)count, (void)dt, (void)root, (void)g, (void)w;
    no_nccl();
}
void dist_nccl_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g,
                          DistWork *w) {
    (void)send, (void)recv, (void)count, (void)dt, (void)op, (void)g, (void)w;
    no_nccl();
}
void dist_nccl_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int root,
                      DistGroup *g) {
    (void)send, (void)recv, (void)count, (void)dt, (void)op, (void)root, (void)g;
    no_nccl();
}
void dist_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op,
                              DistGroup *g, DistWork *w) {
    (void)send, (void)recv, (void)recvcount, (void)dt, (void)op, (void)g, (void)w;
    no_nccl();
}
void dist_nccl_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g,
                          DistWork *w) {
    (void)send, (void)recv, (void)sendcount, (void)dt, (void)g, (void)w;
    no_nccl();
}
void dist_nccl_scatter(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    (void)send, (void)recv, (void)count, (void)dt, (void)root, (void)g;
    no_nccl();
}
void dist_nccl_gather(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g) {
    (void)send, (void)recv, (void)count, (void)dt, (void)root, (void)g;
    no_nccl();
}
void dist_nccl_send(const void *buf, size_t count, DistDtype dt, int peer, DistGroup *g, DistWork *w) {
    (void)buf, (void)count, (void)dt, (void)peer, (void)g, (void)w;
    no_nccl();
}
void dist_nccl_recv(void *buf, size_t count, DistDtype dt, int peer, DistGroup *g, DistWork *w) {
    (void)buf, (void)count, (void)dt, (void)peer, (void)g, (void)w;
    no_nccl();
}
void dist_nccl_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount,
                        int src, DistDtype dt, DistGroup *g) {
    (void)sendbuf, (void)sendcount, (void)dst, (void)recvbuf, (void)recvcount, (void)src, (void)dt, (void)g;
    no_nccl();
}
void dist_nccl_wait(DistWork *w) { (void)w; no_nccl(); }
int dist_nccl_test(DistWork *w) { (void)w; no_nccl(); }

#endif
