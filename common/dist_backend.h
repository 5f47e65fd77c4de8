// dist_backend.h: the one interface behind dist.h's API (internal: included by common/dist*.c).
//
// dist.c (the API) checks what every backend shares, counts the bytes, then describes the op
// as one DistCall and hands it to one backend through this table:
//   dist_mpi_backend    host buffers, over MPI (dist_mpi.c)
//   dist_stage_backend  device buffers with the MPI backend: copied through host memory, then
//                       dist_mpi_backend (dist_stage.c)
//   dist_nccl_backend   device buffers with the NCCL backend (dist_nccl.c)
// The communication thread (dist_thread.c) runs queued calls with dist_mpi_backend, blocking.
// A backend finishes the whole op: AVG's division, results moved to where the caller wants
// them, staging buffers freed (blocking: before run returns; non-blocking: in wait / test).
// No backend calls back into dist.c.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "shard.h"

typedef struct DistCall {
    DistOpKind kind;
    const void *send;   // the input (send / sendrecv / broadcast: the buffer is in recv)
    void *recv;         // the output (broadcast: the buffer)
    size_t count;       // elements, as the public function's count argument; for sendrecv the
                        // send count
    const size_t *counts;  // v-ops (reduce_scatter, all_gather, gather): group rank p's block
                        // has counts[p] elements, the blocks contiguous in rank order, and count
                        // is their sum; NULL: even blocks of count each. The _n ops are v-ops
                        // with counts[p] = shard_count(n, N, p) (dist.h, "Uneven ops"). Read
                        // while the op starts only (the communication thread keeps a copy).
    DistDtype dt;
    DistOp op;
    int peer;           // root (broadcast, reduce, scatter, gather), peer (send, recv), dst (sendrecv)
    int tag;            // send, recv, sendrecv
    // dist_sendrecv is kind OP_SEND with recv != NULL: count elements of send go to peer while
    // recvcount elements from src arrive in recv (blocking only).
    size_t recvcount;
    int src;
    uint64_t wd;        // its record in the flight recorder (watchdog.h), 0: none
} DistCall;

typedef struct DistBackendOps {
    const char *name;
    // w == NULL: blocking, finished on return. w != NULL: started; w->backend set to the table
    // that finishes it (wait / test below).
    void (*run)(const DistCall *c, DistGroup *g, DistWork *w);
    void (*wait)(DistWork *w);
    int (*test)(DistWork *w);  // 1 when done (then finished like wait)
} DistBackendOps;

extern const DistBackendOps dist_mpi_backend, dist_stage_backend, dist_nccl_backend;

// --- blocks of an op whose buffer is one block per rank ----------------------------------------
// Even: every block has c->count elements and block p starts at p * count. v-ops: block p has
// counts[p] elements and starts after the blocks of ranks 0..p-1.
static inline size_t call_block_begin(const DistCall *c, int N, int p) {
    (void)N;
    if (!c->counts) return (size_t)p * c->count;
    size_t b = 0;
    for (int q = 0; q < p; q++) b += c->counts[q];
    return b;
}
static inline size_t call_block_len(const DistCall *c, int N, int p) {
    (void)N;
    return c->counts ? c->counts[p] : c->count;
}
static inline size_t call_total(const DistCall *c, int N) {
    return c->counts ? c->count : c->count * (size_t)N;
}
static inline size_t call_max_block(const DistCall *c, int N) {
    size_t m = 0;
    for (int p = 0; p < N; p++) m = call_block_len(c, N, p) > m ? call_block_len(c, N, p) : m;
    return m;
}

// Do [a, a+na) and [b, b+nb) share a byte?
static inline int dist_overlaps(const void *a, size_t na, const void *b, size_t nb) {
    if (!a || !b || na == 0 || nb == 0) return 0;
    const char *x = a, *y = b;
    return x < y + nb && y < x + na;
}

static inline char *dist_at(const void *base, size_t elems, DistDtype dt) {
    return (char *)base + elems * dist_dtype_size(dt);
}

// --- dist_mpi.c: the MPI side of the lifecycle (dist_init / dist_finalize) -------------------
void dist_mpi_init(int *argc, char ***argv, DistGroup *world);
void dist_mpi_finalize(void);
// g's communicator, rank, size and world ranks from a split of parent (with the job's error
// handler)
void dist_mpi_split(DistGroup *parent, int color, int key, DistGroup *g);
void dist_mpi_dup(const DistGroup *g, DistGroup *copy);  // copy = g on a duplicate communicator
void dist_mpi_group_free(DistGroup *g);                   // frees g's communicator
// MPI counts are int: fails naming `what` when count is over INT_MAX.
int dist_mpi_count(size_t count, const char *what);

// --- dist_bf16.c: element-wise work MPI does not do for us ---------------------------------------
// MPI user functions on bf16 (widen to fp32, combine, round back once per pairwise combine).
void dist_bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt);
void dist_bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt);
// AVG: divide a sum by n in place (float types in their own precision, bf16 in fp32 rounded
// once, integers with C's truncating division).
void dist_finish_avg(void *buf, size_t count, DistDtype dt, int n);

// --- dist_thread.c: the communication thread (dist.h) --------------------------------------------
// Queue c (counted and checked by dist.c) for g's thread; w becomes its handle (w->task).
void dist_thread_queue(const DistCall *c, DistGroup *g, DistWork *w);
int dist_thread_finish(DistWork *w, int block);  // 1 when the thread has run it (then finished)
int dist_thread_pending(void);                    // queued ops not yet finished by the caller
void dist_thread_stop_all(void);                  // at dist_finalize

// --- dist_link.c: the virtual links' holds (dist.h) -------------------------------------------------
void dist_link_hold_before(const DistCall *c, const DistGroup *g);  // a send: before MPI gets it
void dist_link_hold_after(const DistCall *c, const DistGroup *g);   // a collective: after it ran
// The same from the communication thread's run of a queued op: comm_thread 1 when the thread ran
// it (its time hidden behind the caller's compute), 0 when the caller ran it in dist_wait.
void dist_link_hold_after_on(const DistCall *c, const DistGroup *g, int comm_thread);
double dist_link_call_seconds(const DistCall *c, const DistGroup *g);  // the hold a collective gets (charged)
void dist_link_sleep(double seconds);
