// dist.h: a torch.distributed-shaped communication API in C.
//
// Backends: MPI (host buffers; the default and the one tested on CPU) and, when built with
// CUDA, NCCL (one GPU per rank). Every call counts the bytes this rank sends and receives,
// per op kind, so tests can check communication volume against the formulas in the notes.
//
// Byte counting model (per rank; S = count * element size of the op's full buffer, N = group
// size). Library collectives are counted as the bandwidth-optimal algorithm moves them:
//   all_reduce       sent = recv = 2(N-1)/N * S          (ring: reduce-scatter + all-gather)
//   reduce_scatter   sent = recv = (N-1)/N * S            (S = the whole input, N * recvcount)
//   all_gather       sent = recv = (N-1)/N * S            (S = the whole output, N * sendcount)
//   broadcast        root sent S; every other rank recv S
//   reduce           every non-root sent S; root recv (N-1) * S   (direct, as a naive master)
//   scatter          root sent (N-1) * count; others recv count   (count = per-rank block)
//   gather           others sent count; root recv (N-1) * count
//   send / recv      exactly the bytes passed (so algorithms built from send/recv are counted
//                    as they really move data)
// Integer division rounds down: 2(N-1)/N * S is computed as 2*(N-1)*S / N.
#pragma once
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { DIST_F32 = 0, DIST_BF16, DIST_F64, DIST_I32, DIST_U8, DIST_NDTYPES } DistDtype;
typedef enum { DIST_SUM = 0, DIST_AVG, DIST_MAX } DistOp;
typedef enum { DIST_BACKEND_MPI = 0, DIST_BACKEND_NCCL } DistBackend;

typedef enum {
    OP_BROADCAST = 0, OP_ALL_REDUCE, OP_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER,
    OP_SCATTER, OP_GATHER, OP_SEND, OP_RECV, OP_BARRIER, OP_NKINDS
} DistOpKind;

typedef struct DistGroup {
    MPI_Comm comm;     // MPI communicator of the group
    int rank, size;    // this rank's place in the group, group size
    const char *name;  // "world", "dp", "tp", "pp", ... (for messages and traces)
    void *nccl;        // ncclComm_t when the NCCL backend is active, else NULL
    void *thread;      // its communication thread (dist_comm_thread_start), else NULL
} DistGroup;

// A pending non-blocking operation. Value type: keep it, then dist_wait(&w).
typedef struct DistWork {
    MPI_Request req;
    void *buf;          // result buffer (for AVG post-division and bf16 unpacking)
    size_t count;
    DistDtype dtype;
    DistOp op;
    int group_size;
    int active;         // 1 while pending
    void *event;        // NCCL backend: cudaEvent_t recorded after the op on the comm stream, else NULL
    void *task;         // run by the group's communication thread (see below), else NULL
} DistWork;

typedef struct DistCounters {
    uint64_t calls[OP_NKINDS];
    uint64_t sent[OP_NKINDS];   // bytes this rank sent, per op kind (model above)
    uint64_t recv[OP_NKINDS];   // bytes this rank received
} DistCounters;

// Lifecycle. dist_init calls MPI_Init (thread level SERIALIZED: one thread in MPI at a time,
// see the communication thread below) and sets up error handling so that any failure on any
// rank aborts the whole job.
void dist_init(int *argc, char ***argv);
void dist_finalize(void);
int dist_rank(void);                 // world rank
int dist_size(void);                 // world size
DistGroup *dist_world(void);
// Split `parent` into groups by color (ranks with equal color form a group, ordered by key).
DistGroup *dist_split(DistGroup *parent, int color, int key, const char *name);
void dist_group_free(DistGroup *g);
// Select the backend for subsequent calls on device buffers (NCCL needs CUDA build).
// Choosing NCCL is collective over the world and selects this rank's GPU (local rank on its
// node): call it before allocating device memory.
void dist_set_backend(DistBackend b);
DistBackend dist_backend(void);

size_t dist_dtype_size(DistDtype dt);
const char *dist_op_kind_name(DistOpKind k);

// Collectives. `send == recv` (or send == NULL) means in place where it makes sense.
void dist_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g);
void dist_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g);
void dist_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int root, DistGroup *g);
// send holds N * recvcount elements; rank r receives the reduced block r.
void dist_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op, DistGroup *g);
// recv receives N * sendcount elements, block r from rank r.
void dist_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g);
// root's send holds N * count elements; rank r receives block r (count elements).
void dist_scatter(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g);
// every rank sends count elements; root's recv gets N * count, block r from rank r.
void dist_gather(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g);
void dist_send(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g);
void dist_recv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g);
// Send to `dst` and receive from `src` at once (deadlock-free ring step). Counted as send+recv.
void dist_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount,
                   int src, DistDtype dt, int tag, DistGroup *g);
void dist_barrier(DistGroup *g);

// Non-blocking variants: start now, finish at dist_wait (which also applies AVG's division).
DistWork dist_iall_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g);
DistWork dist_ibroadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g);
DistWork dist_ireduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op, DistGroup *g);
DistWork dist_iall_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g);
DistWork dist_isend(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g);
DistWork dist_irecv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g);
void dist_wait(DistWork *w);
int dist_test(DistWork *w);          // 1 when complete (then it is finished like dist_wait)
void dist_wait_all(DistWork *w, int n);

// The communication thread: a CPU stand-in for a GPU's communication stream. After
// dist_comm_thread_start(g) (collective over g), dist_iall_reduce on g with host buffers only
// counts its bytes and queues the op: a thread of this process runs the queued all-reduces one
// after the other, in the order they were started, as BLOCKING MPI_Allreduce calls on its own
// duplicate of g's communicator (Open MPI's blocking algorithms are faster than its
// non-blocking ones, and they progress without the caller polling). dist_test and dist_wait on
// such a DistWork look at a flag / sleep on a condition variable; they make no MPI call.
// MPI runs at thread level SERIALIZED, so while any queued op is unfinished (not yet returned
// by dist_wait or a dist_test that said 1) the calling thread must make no other dist_* call
// that communicates: it is refused with a message. Device buffers are not affected.
void dist_comm_thread_start(DistGroup *g);
void dist_comm_thread_stop(DistGroup *g);   // waits for queued ops; also done by group free/finalize
// Since the start: seconds the thread spent in all-reduces (wall clock), and of those the
// seconds it ran on a core (its CPU time); the rest it waited for the peers or for a core.
void dist_comm_thread_times(DistGroup *g, double *busy_s, double *cpu_s);

// Byte counters of this rank since the last reset.
const DistCounters *dist_counters(void);
void dist_counters_reset(void);
uint64_t dist_bytes_sent(void);      // total over op kinds
uint64_t dist_bytes_recv(void);
