// dist_nccl.c: the NCCL backend of dist.h (one GPU per rank): dist_nccl_backend of
// dist_backend.h, and its communicators. The protocol every op follows is in dist_nccl.h.
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
#include "dist_backend.h"

#if defined(LAB_CUDA) && !defined(LAB_CUDA_EMU)

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <time.h>

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
static cudaEvent_t op_done;          // recorded on the comm stream after a blocking op

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
    cudaCheck(cudaEventCreateWithFlags(&op_done, cudaEventDisableTiming));
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
    cudaCheck(cudaEventDestroy(op_done));
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

// The host waits until `ev` has completed, testing it and sleeping between tests (from 2 us,
// doubling to 100 us once it has waited 50 us): a test-and-sleep loop, never a blocking CUDA
// call. Every wait for an NCCL op is made here, inside dist's op or dist_wait, so the watchdog
// (common/watchdog.h) times it like an MPI wait: a hung NCCL kernel never completes its event,
// and the rank is seen waiting in that op, not frozen later in some synchronization outside
// dist where nobody looks. The sleeping thread also leaves its core to the others.
static void host_wait(cudaEvent_t ev) {
    const double t0 = lab_now();
    long ns = 2000;
    for (;;) {
        cudaError_t err = cudaEventQuery(ev);
        if (err == cudaSuccess) return;
        if (err != cudaErrorNotReady) cudaCheck(err);
        (void)cudaGetLastError();  // "not ready" is an answer, not an error: do not leave it behind
        if (lab_now() - t0 < 50e-6) continue;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 100000) ns *= 2;
    }
}

// After an op: blocking (w == NULL) waits for it; non-blocking leaves an event in w.
static void end_op(DistWork *w) {
    if (w == NULL) {
        cudaCheck(cudaEventRecord(op_done, comm_stream));
        host_wait(op_done);
        return;
    }
    cudaEvent_t done;
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(done, comm_stream));
    w->event = done;
    w->backend = &dist_nccl_backend;
}

// A device-to-device copy on the comm stream, in order with the NCCL calls around it.
static void copy_on_comm_stream(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, comm_stream));
}

// ---------------------------------------------------------------------------------------------
// collectives

static void broadcast(const DistCall *c, DistGroup *g) {
    need_device(c->recv, "buf", "dist_broadcast");
    ncclComm_t comm = coll_comm(g);
    begin_op();
    ncclCheck(ncclBroadcast(c->recv, c->recv, c->count, nccl_type(c->dt), c->peer, comm, comm_stream));
}

static void all_reduce(const DistCall *c, DistGroup *g) {
    size_t bytes = c->count * dist_dtype_size(c->dt);
    const void *in = (c->send == NULL || c->send == c->recv) ? c->recv : c->send;
    need_device(in, "send", "dist_all_reduce");
    need_device(c->recv, "recv", "dist_all_reduce");
    LAB_CHECK(in == c->recv || !dist_overlaps(c->send, bytes, c->recv, bytes),
              "dist_all_reduce: send and recv overlap without being the same buffer");
    ncclComm_t comm = coll_comm(g);
    begin_op();
    ncclCheck(ncclAllReduce(in, c->recv, c->count, nccl_type(c->dt), nccl_op(c->op), comm, comm_stream));
}

static void reduce(const DistCall *c, DistGroup *g) {
    size_t bytes = c->count * dist_dtype_size(c->dt);
    int is_root = g->rank == c->peer;
    const void *in = (c->send == NULL || c->send == c->recv) ? c->recv : c->send;
    need_device(in, "send", "dist_reduce");
    if (is_root) {
        need_device(c->recv, "recv (at the root)", "dist_reduce");
        LAB_CHECK(in == c->recv || !dist_overlaps(c->send, bytes, c->recv, bytes), "dist_reduce: send and recv overlap");
    }
    ncclComm_t comm = coll_comm(g);
    begin_op();
    // Non-roots only send; NCCL ignores their receive buffer (as MPI does, it may be NULL).
    ncclCheck(ncclReduce(in, is_root ? c->recv : NULL, c->count, nccl_type(c->dt), nccl_op(c->op), c->peer, comm,
                         comm_stream));
}

// v-ops (the _n ops too): NCCL's reduce-scatter needs N equal blocks, so we PAD (rather than
// N grouped ncclReduce calls, one per block, which would each move the whole block through a
// tree and cost N launches): the input is copied to a buffer of N blocks of the longest
// (each block p at p * maxlen, zero padding behind it), reduced into a maxlen temporary, and
// this rank's counts[r] elements copied out. (The all-gather side needs no padding: grouped
// ncclSend / ncclRecv of each block, gather_blocks below.) The temporaries are allocated
// and freed in order on the comm stream (cudaMallocAsync / cudaFreeAsync).
static void reduce_scatter_uneven(const DistCall *c, DistGroup *g, const void *in, void *out) {
    int N = g->size, r = g->rank;
    size_t es = dist_dtype_size(c->dt), maxlen = call_max_block(c, N);
    ncclComm_t comm = coll_comm(g);
    begin_op();
    void *padded = NULL, *block = NULL;
    cudaCheck(cudaMallocAsync(&padded, maxlen * (size_t)N * es + 1, comm_stream));
    cudaCheck(cudaMallocAsync(&block, maxlen * es + 1, comm_stream));
    cudaCheck(cudaMemsetAsync(padded, 0, maxlen * (size_t)N * es, comm_stream));
    for (int p = 0; p < N; p++)
        copy_on_comm_stream(dist_at(padded, (size_t)p * maxlen, c->dt), dist_at(in, call_block_begin(c, N, p), c->dt),
                            call_block_len(c, N, p) * es);
    ncclCheck(ncclReduceScatter(padded, block, maxlen, nccl_type(c->dt), nccl_op(c->op), comm, comm_stream));
    copy_on_comm_stream(out, block, call_block_len(c, N, r) * es);
    cudaCheck(cudaFreeAsync(padded, comm_stream));
    cudaCheck(cudaFreeAsync(block, comm_stream));
}

static void reduce_scatter(const DistCall *c, DistGroup *g) {
    int N = g->size, r = g->rank;
    size_t es = dist_dtype_size(c->dt), mine = call_block_len(c, N, r), total = call_total(c, N);
    const void *send = c->send;
    void *recv = c->recv;
    int in_place = send == NULL || send == recv;
    const void *in = in_place ? recv : send;  // the whole input
    need_device(in, in_place ? "recv" : "send", "dist_reduce_scatter");
    need_device(recv, "recv", "dist_reduce_scatter");
    char *at_r = dist_at(in, call_block_begin(c, N, r), c->dt);
    LAB_CHECK(in_place || recv == at_r || !dist_overlaps(send, total * es, recv, mine * es),
              "dist_reduce_scatter: recv overlaps send but is neither send nor send + its block's start");
    if (c->counts) {
        // copies the input before reducing, so any of the in-place forms is safe
        reduce_scatter_uneven(c, g, in, recv);
        return;
    }
    ncclComm_t comm = coll_comm(g);
    begin_op();
    if (in_place) {
        // Block r of the result belongs at recv's start. NCCL's in-place form leaves it at block
        // r; then it moves to the start (block r and block 0 do not overlap for r > 0; for r = 0
        // there is nothing to move).
        ncclCheck(ncclReduceScatter(recv, at_r, c->count, nccl_type(c->dt), nccl_op(c->op), comm, comm_stream));
        copy_on_comm_stream(recv, at_r, mine * es);
    } else {
        // recv == send + r * count is NCCL's own in-place form
        ncclCheck(ncclReduceScatter(send, recv, c->count, nccl_type(c->dt), nccl_op(c->op), comm, comm_stream));
    }
}

// all_gather (root < 0) and gather: this rank's block to its place in every rank's (the
// root's) recv; NCCL's all-gather for even blocks, grouped send/recv otherwise (NCCL has no
// gather, and no v-collectives).
static void gather_blocks(const DistCall *c, DistGroup *g, int root) {
    int N = g->size, r = g->rank;
    size_t es = dist_dtype_size(c->dt), mine = call_block_len(c, N, r), total = call_total(c, N);
    const char *what = root < 0 ? "dist_all_gather" : "dist_gather";
    int writes = root < 0 || r == root;
    ncclComm_t comm = coll_comm(g);
    const void *in = c->send;
    begin_op();
    if (writes) {
        need_device(c->recv, root < 0 ? "recv" : "recv (at the root)", what);
        char *at = dist_at(c->recv, call_block_begin(c, N, r), c->dt);
        if (c->send == NULL || c->send == at) {
            in = at;  // already in place
        } else if (c->send == c->recv) {
            in = at;  // this rank's block sits at the start: move it to its place first
            copy_on_comm_stream(at, c->recv, mine * es);
        } else {
            need_device(c->send, "send", what);
            LAB_CHECK(!dist_overlaps(c->send, mine * es, c->recv, total * es),
                      "%s: send overlaps recv but is neither recv nor recv + its block's start", what);
            if (root >= 0 || c->counts) copy_on_comm_stream(at, c->send, mine * es);  // the own block, placed here
        }
    } else {
        need_device(c->send, "send", what);
    }
    if (root < 0 && !c->counts) {
        ncclCheck(ncclAllGather(in, c->recv, c->count, nccl_type(c->dt), comm, comm_stream));
        return;
    }
    ncclCheck(ncclGroupStart());
    for (int p = 0; p < N; p++) {
        if (p == r) continue;
        size_t len_p = call_block_len(c, N, p);
        if (root < 0 || p == root) ncclCheck(ncclSend(in, mine, nccl_type(c->dt), p, comm, comm_stream));
        if (writes)
            ncclCheck(ncclRecv(dist_at(c->recv, call_block_begin(c, N, p), c->dt), len_p, nccl_type(c->dt), p, comm,
                               comm_stream));
    }
    ncclCheck(ncclGroupEnd());
}

// NCCL has no scatter: the root sends block p to each rank p, in one group.
static void scatter(const DistCall *c, DistGroup *g) {
    int root = c->peer;
    size_t block = c->count * dist_dtype_size(c->dt);
    ncclComm_t comm = coll_comm(g);
    if (g->rank != root) {
        need_device(c->recv, "recv", "dist_scatter");
        begin_op();
        ncclCheck(ncclRecv(c->recv, c->count, nccl_type(c->dt), root, comm, comm_stream));
        return;
    }
    need_device(c->send, "send (at the root)", "dist_scatter");
    char *mine = dist_at(c->send, (size_t)root * c->count, c->dt);
    begin_op();
    ncclCheck(ncclGroupStart());
    for (int p = 0; p < g->size; p++)
        if (p != root)
            ncclCheck(ncclSend(dist_at(c->send, (size_t)p * c->count, c->dt), c->count, nccl_type(c->dt), p, comm,
                               comm_stream));
    ncclCheck(ncclGroupEnd());
    // The root's own block: in place (recv NULL or mine), to the start (recv == send; after the
    // sends, which read block 0), or to a separate recv.
    if (c->recv != NULL && c->recv != mine) {
        need_device(c->recv, "recv", "dist_scatter");
        LAB_CHECK(c->recv == c->send || !dist_overlaps(c->send, block * (size_t)g->size, c->recv, block),
                  "dist_scatter: recv overlaps send but is neither send nor send + root * count");
        copy_on_comm_stream(c->recv, mine, block);
    }
}

// ---------------------------------------------------------------------------------------------
// point to point. NCCL has no tags: messages between two ranks match in the order they were
// issued. A sendrecv is one NCCL group (a lone ncclSend waits for its receiver like MPI_Ssend).

static void send_recv(const DistCall *c, DistGroup *g) {
    const char *what = c->kind == OP_RECV ? "dist_recv" : c->recv ? "dist_sendrecv" : "dist_send";
    if (c->send) need_device(c->send, c->recv ? "sendbuf" : "buf", what);
    if (c->recv && (c->kind == OP_RECV || c->recvcount)) need_device(c->recv, c->kind == OP_RECV ? "buf" : "recvbuf", what);
    ncclComm_t comm = p2p_comm(g, what);
    begin_op();
    if (c->kind == OP_RECV) {
        ncclCheck(ncclRecv(c->recv, c->count, nccl_type(c->dt), c->peer, comm, comm_stream));
        return;
    }
    if (!c->recv) {
        ncclCheck(ncclSend(c->send, c->count, nccl_type(c->dt), c->peer, comm, comm_stream));
        return;
    }
    // One group: NCCL starts both together, so a ring of these cannot deadlock.
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclSend(c->send, c->count, nccl_type(c->dt), c->peer, comm, comm_stream));
    ncclCheck(ncclRecv(c->recv, c->recvcount, nccl_type(c->dt), c->src, comm, comm_stream));
    ncclCheck(ncclGroupEnd());
}

static void nccl_run(const DistCall *c, DistGroup *g, DistWork *w) {
    switch (c->kind) {
    case OP_BROADCAST: broadcast(c, g); break;
    case OP_ALL_REDUCE: all_reduce(c, g); break;
    case OP_REDUCE: reduce(c, g); break;
    case OP_REDUCE_SCATTER: reduce_scatter(c, g); break;
    case OP_ALL_GATHER: gather_blocks(c, g, -1); break;
    case OP_GATHER: gather_blocks(c, g, c->peer); break;
    case OP_SCATTER: scatter(c, g); break;
    case OP_SEND:
    case OP_RECV: send_recv(c, g); break;
    default: lab_fail_at(__FILE__, __LINE__, "dist NCCL backend: op kind %s has no case", dist_op_kind_name(c->kind));
    }
    end_op(w);
}

// ---------------------------------------------------------------------------------------------
// completion of non-blocking ops

static void nccl_wait(DistWork *w) {
    // The host waits (test and sleep, so the watchdog times it), then the compute stream: the
    // kernels launched from now on see the result.
    host_wait((cudaEvent_t)w->event);
    cudaCheck(cudaStreamWaitEvent(COMPUTE_STREAM, (cudaEvent_t)w->event, 0));
    cudaCheck(cudaEventDestroy((cudaEvent_t)w->event));  // freed once it has completed
    w->event = NULL;
    w->active = 0;
}

static int nccl_test(DistWork *w) {
    cudaError_t err = cudaEventQuery((cudaEvent_t)w->event);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();  // "not ready" is an answer, not an error: do not leave it behind
        return 0;
    }
    cudaCheck(err);
    nccl_wait(w);
    return 1;
}

const DistBackendOps dist_nccl_backend = {"nccl", nccl_run, nccl_wait, nccl_test};

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
static void nccl_run(const DistCall *c, DistGroup *g, DistWork *w) {
    (void)c, (void)g, (void)w;
    no_nccl();
}
static void nccl_wait(DistWork *w) { (void)w; no_nccl(); }
static int nccl_test(DistWork *w) { (void)w; no_nccl(); }
const DistBackendOps dist_nccl_backend = {"nccl", nccl_run, nccl_wait, nccl_test};

#endif
