// watchdog.h: the collective watchdog and flight recorder. A rank that stops without dying (a
// SIGSTOP, a stuck kernel, a deadlock) would leave every other rank waiting in a collective
// forever; with the watchdog the job ends after --collective-timeout S seconds with ONE
// diagnosis that names the group, the op, its sequence number, which ranks reached it and what
// the others were last doing:
//
//   [rank 3] error: collective timeout (--collective-timeout 2): pp group {1,3}: rank 3 waits
//   in recv #7 from rank 1 for 2.0 s; rank 1 is outside communication for 2.0 s (in step 4,
//   last op: dp all-reduce #9)
//
// How it knows (the notes' "NCCL flight recorder", in C):
//   - every dist op has a sequence number per group (dist.c): collectives count per group, so
//     all-reduce #9 is the same op on every rank of the group; point-to-point ops count per
//     group, peer and direction, so recv #7 from rank 1 matches rank 1's send #7 to this rank;
//   - every rank records each op (group, op, sequence number, peer, bytes, start and end time,
//     state) in a ring of its last WD_RING ops, and publishes what each of its threads is
//     waiting in right now (the caller's thread; the communication thread; the caller running a
//     queued op itself), with the step it is in (watchdog_note_step);
//   - the records live in one small POSIX shared-memory segment per machine and job, so the
//     ranks of a machine read each other's without the other's cooperation: a rank that is
//     stopped (SIGSTOP), hung or busy cannot answer, but its last record is there;
//   - a watchdog thread per rank wakes a few times a second and looks at its own rank's waits;
//     one older than S: it reads the records of the other ranks on its machine (and, for each,
//     /proc's process state: "stopped"), prints the diagnosis, and ends the job (MPI_Abort).
//     The first rank of a machine to time out prints; the others stay quiet.
//
// Across machines: the segment is per machine, so a rank sees the records of the ranks on its
// own machine only; a rank elsewhere is named as "on another machine". Every machine whose
// ranks wait times out on its own and prints its own diagnosis (one per machine, not one per
// job); MPI_Abort ends the ranks everywhere.
//
// The cost when on: per op two clock reads and a record of ~100 bytes written to memory (no
// system call, no lock); tools/bench_watchdog measures it. Off (--collective-timeout 0, or one
// rank): nothing is recorded and no thread runs.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "dist.h"

#define WATCHDOG_DEFAULT_S 300.0  // --collective-timeout's default: a hang ends after 5 minutes
#define WD_RING 256               // ops each rank's flight recorder keeps

// Collective over the world, after dist_init: S > 0 and more than one rank starts recording and
// the watchdog thread; S = 0 (or one rank) leaves it off. Once. lab_parse_args calls it when
// MPI is up (a program that parses its flags before dist_init calls it itself afterwards).
void watchdog_start(double timeout_s);
// Stops the thread and unmaps the segment (dist_finalize).
void watchdog_stop(void);

// The step this rank is in (counted from 0; the diagnosis prints it from 1, as the progress
// lines do). The loop calls it at the top of every step.
void watchdog_note_step(int step);
// --inject-hang: this rank stops without dying (it sleeps; seconds <= 0: forever, the others
// see a hang; seconds > 0: a rank that is only slow). Says so on stderr with its pid.
void watchdog_inject_hang(int step, double seconds);

// ---- internal: dist.c and dist_thread.c record through these ----------------------------------
extern int watchdog_on;  // recording: read before every call below (off: none is made)
// The threads of a rank that wait in ops, one wait slot each: the caller's thread (a blocking
// op, dist_wait), the communication thread (a queued op it runs), the caller's thread running
// a queued op itself inside dist_wait (dist_thread.c).
enum { WD_CALLER = 0, WD_COMM_THREAD = 1, WD_CALLER_RUNS = 2, WD_SLOTS = 3 };
#define WD_SENDRECV 100  // the kind of a dist_sendrecv's record (beside DistOpKind's)
// Records an op that starts now (peer, peer2: group ranks or -1; seq: its number, dist.c);
// returns its ticket (its place in the ring). Blocking (nonblocking = 0): the caller's thread
// waits in it from now; non-blocking: nobody waits yet (dist_wait will).
uint64_t watchdog_op_begin(const DistGroup *g, int kind, int peer, uint64_t seq, int peer2,
                           uint64_t seq2, uint64_t bytes, int nonblocking);
void watchdog_op_queued(uint64_t ticket);           // it went to the communication thread's queue
void watchdog_wait_begin(uint64_t ticket, int slot); // thread `slot` waits in it from now
void watchdog_wait_end(int slot);                    // ... no longer (the op is not done yet)
void watchdog_op_end(uint64_t ticket, int slot);     // it finished; slot >= 0: that wait ends
// The groups of this process (dist_split, dist_group_free): the diagnosis lists a group's ranks.
void watchdog_group_add(const DistGroup *g);
void watchdog_group_remove(const DistGroup *g);
