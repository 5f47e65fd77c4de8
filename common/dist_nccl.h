// dist_nccl.h: the NCCL backend of dist.h, called only by dist.c (not part of the public API).
//
// dist.c counts the bytes and checks the arguments it shares with the MPI backend, then calls
// one of these when the backend is NCCL and a buffer is on the device. Each op here:
//   1. makes the communication stream wait for the compute stream (an event recorded on the
//      legacy default stream, where the kernels run), so the op sees the data they wrote;
//   2. enqueues the NCCL call on the communication stream;
//   3. blocking (w == NULL): waits for the communication stream before returning;
//      non-blocking (w != NULL): records an event after the op into w->event; dist_wait then
//      makes the compute stream wait for it (the host does not block), dist_test queries it.
// NCCL does AVG (ncclAvg) and MAX itself, so nothing is left to do at dist_wait.
//
// In a build without CUDA (or in the CPU emulator of tests/cuda_emu) these are stubs that fail:
// dist_set_backend refuses NCCL there, so they are never reached.
#pragma once
#include "dist.h"

// Lifecycle. dist_nccl_start: once, at dist_set_backend(DIST_BACKEND_NCCL): picks this rank's
// GPU (local rank on its node % GPUs) and creates the world's communicator.
void dist_nccl_start(DistGroup *world);
void dist_nccl_group_init(DistGroup *g);   // communicator of a new group (collective over g)
void dist_nccl_group_free(DistGroup *g);   // destroys g's communicator, if it has one
void dist_nccl_finalize(void);             // destroys every communicator still alive

// Ops. w == NULL: blocking. w != NULL: non-blocking, w->event set (dist.c made w).
// The in-place forms are those of dist.c (see its top comment).
void dist_nccl_broadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g, DistWork *w);
void dist_nccl_all_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g,
                          DistWork *w);
void dist_nccl_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, int root,
                      DistGroup *g);
void dist_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op,
                              DistGroup *g, DistWork *w);
void dist_nccl_all_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g,
                          DistWork *w);
void dist_nccl_scatter(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g);
void dist_nccl_gather(const void *send, void *recv, size_t count, DistDtype dt, int root, DistGroup *g);
// NCCL has no tags: messages between two ranks match in the order they were issued. A send
// and a recv that must progress together (a ring step) go through dist_nccl_sendrecv: a lone
// ncclSend waits for its receiver like MPI_Ssend.
void dist_nccl_send(const void *buf, size_t count, DistDtype dt, int peer, DistGroup *g, DistWork *w);
void dist_nccl_recv(void *buf, size_t count, DistDtype dt, int peer, DistGroup *g, DistWork *w);
void dist_nccl_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf, size_t recvcount,
                        int src, DistDtype dt, DistGroup *g);

// Completion of a non-blocking op (w->event != NULL).
void dist_nccl_wait(DistWork *w);
int dist_nccl_test(DistWork *w);   // 1 when done (then finished like dist_nccl_wait)
