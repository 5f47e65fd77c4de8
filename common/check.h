// check.h: errors that end the whole job, on every rank, with one clear message.
//
// Two kinds of failure:
//   lab_fail(...)      a user error (bad flag, bad file, NaN in training): prints
//                      "error: <message>" once and ends the job (MPI_Abort when MPI is up,
//                      a plain end for a process started without mpirun).
//   LAB_CHECK(c, ...)  an internal invariant; adds file:line so a developer can find it.
// Errors that every rank detects identically (e.g. a bad flag, parsed on every rank) use
// lab_fail_collective(): only rank 0 prints, so the student sees the message once.
#pragma once
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus  // callable from the CUDA .cu files
extern "C" {
#endif

#if defined(__GNUC__)
#define LAB_NORETURN __attribute__((noreturn))
#define LAB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LAB_NORETURN
#define LAB_PRINTF(a, b)
#endif

// Prints "error: <msg>" (prefixed "[rank r] " when world > 1) to stderr and ends the job.
LAB_NORETURN void lab_fail(const char *fmt, ...) LAB_PRINTF(1, 2);
// Same, but only rank 0 prints (the error is the same on every rank). Safe when only some
// ranks meet it: a rank other than 0 that is still alive after a few seconds (rank 0 did not
// abort the job) prints it with its rank prefix, then ends the job.
LAB_NORETURN void lab_fail_collective(const char *fmt, ...) LAB_PRINTF(1, 2);
// Internal error with file:line.
LAB_NORETURN void lab_fail_at(const char *file, int line, const char *fmt, ...) LAB_PRINTF(3, 4);

#define LAB_CHECK(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond)) lab_fail_at(__FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)

// malloc/calloc that never return NULL (for small host bookkeeping; tensors use mem_alloc).
void *lab_xmalloc(size_t bytes);
void *lab_xcalloc(size_t n, size_t size);

// Rank used to prefix messages; set by dist_init (0 before).
extern int lab_log_rank;
extern int lab_log_world;
// Hook called by lab_fail before exiting (dist_mpi.c sets it: MPI_Abort, or _exit for a process
// started without mpirun). NULL -> exit(1).
extern void (*lab_abort_hook)(int code);

// Monotonic wall clock in seconds.
double lab_now(void);

// The stub that replaces an exercise's solution in the student version: it says which
// exercise to implement and where to read, then ends the job.
LAB_NORETURN void lab_exercise_todo(const char *id, const char *title, const char *readme);

#ifdef __cplusplus
}
#endif
