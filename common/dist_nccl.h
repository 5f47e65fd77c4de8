// dist_nccl.h: the NCCL backend of dist.h (internal: used by dist.c only).
//
// Its ops are dist_nccl_backend (dist_backend.h): dist.c counts the bytes and checks the
// arguments it shares with the MPI backend, then hands an op on device buffers to it when the
// backend is NCCL. Each op:
//   1. makes the communication stream wait for the compute stream (an event recorded on the
//      legacy default stream, where the kernels run), so the op sees the data they wrote;
//   2. enqueues the NCCL call(s) on the communication stream;
//   3. blocking (w == NULL): waits for the op before returning; non-blocking (w != NULL):
//      records an event after the op into w->event; dist_wait waits for it, then makes the
//      compute stream wait for it too, dist_test queries it. Every host wait is a loop that
//      tests the event and sleeps (host_wait), never a blocking CUDA call: the watchdog
//      (common/watchdog.h) times it, so a hung NCCL op is named, not waited on forever.
// NCCL does AVG (ncclAvg) and MAX itself, so nothing is left to do at dist_wait.
// NCCL has no v-collectives: an uneven reduce-scatter runs on a copy padded to the longest
// shard (shard 0's), an uneven all-gather and gather are grouped send/recv.
//
// In a build without CUDA (or in the CPU emulator of tests/cuda_emu) the ops are stubs that
// fail: dist_set_backend refuses NCCL there, so they are never reached.
#pragma once
#include "dist.h"

// Lifecycle. dist_nccl_start: once, at dist_set_backend(DIST_BACKEND_NCCL): picks this rank's
// GPU (local rank on its node % GPUs) and creates the world's communicator.
void dist_nccl_start(DistGroup *world);
void dist_nccl_group_init(DistGroup *g);   // communicator of a new group (collective over g)
void dist_nccl_group_free(DistGroup *g);   // destroys g's communicator, if it has one
void dist_nccl_finalize(void);             // destroys every communicator still alive
