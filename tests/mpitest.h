// mpitest.h: what the MPI test programs (tests/mpi_*.c) share: a check counter, and the main()
// of those that run named tests on the world and on a split group (mpi_collectives, mpi_ring).
//
// Such a program is launched by a Criterion test as
//   mpirun -np N build/tests/<prog> <what>...
// runs each <what> (one of its kinds) on the world and on a split group (odd and even world
// ranks apart, in reverse order, so group rank != world rank), and prints one summary line
//   <prog>: <what>... on N ranks: C checks, F failed
// (summed over all ranks), which the Criterion test parses; it exits 1 when F > 0.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "dist.h"

// Counts one check; when !ok prints "[rank r] FAIL: <message>" to stderr (the first 20 only).
void mpi_check(int ok, const char *fmt, ...) LAB_PRINTF(2, 3);
// Checks that failed on this rank so far.
int mpi_failed(void);
// Checks made on this rank so far.
int mpi_checks(void);

// Byte counters against a formula: mpi_bytes_mark() remembers this rank's OP_SEND / OP_RECV
// bytes; mpi_check_bytes checks what was sent and received since then (`what` and `count` name
// the case in the message).
void mpi_bytes_mark(void);
void mpi_check_bytes(const char *what, size_t count, uint64_t want_sent, uint64_t want_recv,
                     DistGroup *g);

// The whole main(): dist_init, then run(kind, world) and run(kind, half) for every argument,
// where kind is its index in kinds[0..nkinds); an unknown name, or none, fails on every rank
// with `usage`. Returns the exit status (0: no check failed).
int mpi_test_main(int argc, char **argv, const char *prog, const char *usage, const char *const *kinds, int nkinds,
                  void (*run)(int kind, DistGroup *g));

// Device twins of host buffers (tests that run the dist ops on device memory: --device).
// While mpi_use_device is 0 these do nothing and mpi_dev(p) is p. mpi_mirror(host, bytes) makes
// a device copy of host[0, bytes) (pass the buffer's guard bytes too: they are compared after
// the op); mpi_dev(p) maps a host pointer, or one inside a mirrored buffer, to its twin;
// mpi_unmirror() copies every twin back to its host buffer and frees it.
extern int mpi_use_device;
// The leading --device / --nccl arguments of a test program, taken out of argv: --device sets
// mpi_use_device; returns 1 for --nccl (select the NCCL backend once dist_init has run:
// mpi_select_backend).
int mpi_take_device_flags(int *argc, char ***argv);
// Selects the NCCL backend the first time it is called with nccl = 1 (call it from run).
void mpi_select_backend(int nccl);
void mpi_mirror(void *host, size_t bytes);
void *mpi_dev(const void *p);
void mpi_unmirror(void);

// max |a - b| / max |b| over n floats (the absolute difference when b is all zero); NaN counts
// as the worst. The tensor-parallel tests compare gathered shards with the full model by it.
float mpi_rel_err(const float *a, const float *b, size_t n);
