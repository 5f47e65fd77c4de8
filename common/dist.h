// dist.h: a torch.distributed-shaped communication API in C.
//
// Backends: MPI (host buffers; the default and the one tested on CPU) and, when built with
// CUDA, NCCL (one GPU per rank). Every call counts the bytes this rank sends and receives,
// per op kind, so tests can check communication volume against the formulas in the notes.
// Files: dist.c (this API, counting), dist_mpi.c, dist_stage.c (device buffers over MPI) and
// dist_nccl.c (the backends, behind dist_backend.h), dist_thread.c (the communication
// thread), dist_bf16.c (bf16 sum/max and AVG's division).
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
//
// Uneven ops (the _n and _v forms below; n = the whole buffer's elements, e = element size,
// and c_p the block of group rank p: shard_count(n, N, p) for _n (common/shard.h), counts[p]
// for _v). Counted as a ring
// moves them: in a ring reduce-scatter rank r sends every block but its own and receives every
// block but its left neighbour's; in a ring all-gather it sends every block but its right
// neighbour's and receives every block but its own:
//   reduce_scatter_n  sent = (n - c_r) * e              recv = (n - c_{(r-1) mod N}) * e
//   all_gather_n      sent = (n - c_{(r+1) mod N}) * e  recv = (n - c_r) * e
//   gather_n          others sent c_r * e; root recv (n - c_root) * e
// (N = 1: nothing. When N divides n these are the even formulas above.) Summed over the ranks,
// sent == recv == (N-1) * n * e for both ring ops.
//
// Every count is kept twice: per process (dist_counters) and per group (dist_group_counters:
// the ops issued on that group), so a run with TP, DP and PP groups can report each one's
// traffic; the process counters are the sum over all groups.
//
// Every op also has a sequence number in its group (DistGroup.seq, .p2p_seq) and, while the
// collective watchdog is on (common/watchdog.h, --collective-timeout), a record in this rank's
// flight recorder; a wait longer than the timeout ends the job with a diagnosis.
#pragma once
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

typedef enum { DIST_F32 = 0, DIST_BF16, DIST_F64, DIST_I32, DIST_U8, DIST_NDTYPES } DistDtype;
typedef enum { DIST_SUM = 0, DIST_AVG, DIST_MAX } DistOp;
typedef enum { DIST_BACKEND_MPI = 0, DIST_BACKEND_NCCL } DistBackend;

typedef enum {
    OP_BROADCAST = 0, OP_ALL_REDUCE, OP_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER,
    OP_SCATTER, OP_GATHER, OP_SEND, OP_RECV, OP_BARRIER, OP_NKINDS
} DistOpKind;

typedef struct DistCounters {
    uint64_t calls[OP_NKINDS];
    uint64_t sent[OP_NKINDS];   // bytes this rank sent, per op kind (model above)
    uint64_t recv[OP_NKINDS];   // bytes this rank received
} DistCounters;

typedef struct DistGroup {
    MPI_Comm comm;     // MPI communicator of the group
    int rank, size;    // this rank's place in the group, group size
    const char *name;  // "world", "dp", "tp", "pp", ... (for messages and traces)
    void *nccl;        // ncclComm_t when the NCCL backend is active, else NULL
    void *thread;      // attached to the communication thread (dist_comm_thread_start), else NULL
    DistCounters counters;  // this group's ops only (dist_group_counters)
    // Sequence numbers (common/watchdog.h names a hung op by them): collectives count per
    // group, so all-reduce #9 is the same op on every rank of the group; send and recv count
    // per peer and direction, so recv #7 from p matches p's send #7 to this rank.
    uint64_t seq;           // collectives issued on the group so far (the next one is #seq + 1)
    uint64_t *p2p_seq;      // (2 * size): [2p] sends to group rank p, [2p + 1] receives from p
    int *world_ranks;       // (size) the world rank of each group rank
    uint64_t gid;           // the group's identity, the same on each of its ranks (name, ranks)
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
    void *task;         // queued on the communication thread (see below), else NULL
    const void *backend;  // internal: the backend that finishes it (dist_backend.h)
    void *aux;          // internal: that backend's state for finishing it, else NULL
    uint64_t wd;        // internal: its record in the flight recorder (watchdog.h), 0: none
    double link_s;      // internal: virtual links on, a collective: seconds held after it finishes
} DistWork;

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

// Uneven ops: n is the whole buffer, and group rank r's block is shard_range(n, N, r)
// (common/shard.h: contiguous, the first n % N blocks one element longer; n < N leaves empty
// blocks). Any n works, e.g. 834,304 parameters on 3 ranks. c_r = shard_count(n, N, r) below.
//   reduce_scatter_n  send: (n,) on every rank; recv: (c_r,) the reduced block r. In place:
//                     send == NULL or send == recv (the input in recv, block r lands at its
//                     start), or recv == send + shard_begin(n, N, r) (it lands in place).
//   all_gather_n      send: (c_r,) this rank's block; recv: (n,) every block at its place. In
//                     place: send == NULL or send == recv + shard_begin(n, N, r).
//   gather_n          like all_gather_n, but only root's recv (n,) is written (others' may be NULL).
void dist_reduce_scatter_n(const void *send, void *recv, size_t n, DistDtype dt, DistOp op, DistGroup *g);
void dist_all_gather_n(const void *send, void *recv, size_t n, DistDtype dt, DistGroup *g);
void dist_gather_n(const void *send, void *recv, size_t n, DistDtype dt, int root, DistGroup *g);

// v-ops (MPI's Reduce_scatter / Allgatherv): group rank p's block has counts[p] elements (any,
// 0 included), the blocks contiguous in rank order, n = Σ counts[p] the whole buffer; counts has
// one entry per group rank, the same on every rank, and is read only while the call starts (the
// non-blocking forms do not keep it). The in-place forms are the _n ones' with begin_r =
// counts[0] + ... + counts[r-1]; the bytes are counted by the _n formulas above with c_p =
// counts[p]. The _n ops are exactly these with counts[p] = shard_count(n, N, p): one mechanism.
//   reduce_scatter_v  send: (n,); recv: (counts[r],) the reduced block r (AVG divides by N).
//   all_gather_v      send: (counts[r],); recv: (n,) every block at its place.
// ZeRO's flat partition uses them (common/zero.h): a unit's or a bucket's intersection with each
// rank's shard of the flat buffer is that rank's block, often empty.
void dist_reduce_scatter_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistOp op,
                           DistGroup *g);
void dist_all_gather_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistGroup *g);

// Non-blocking variants: start now, finish at dist_wait (which also applies AVG's division).
DistWork dist_iall_reduce(const void *send, void *recv, size_t count, DistDtype dt, DistOp op, DistGroup *g);
DistWork dist_ibroadcast(void *buf, size_t count, DistDtype dt, int root, DistGroup *g);
DistWork dist_ireduce_scatter(const void *send, void *recv, size_t recvcount, DistDtype dt, DistOp op, DistGroup *g);
DistWork dist_iall_gather(const void *send, void *recv, size_t sendcount, DistDtype dt, DistGroup *g);
DistWork dist_ireduce_scatter_n(const void *send, void *recv, size_t n, DistDtype dt, DistOp op, DistGroup *g);
DistWork dist_iall_gather_n(const void *send, void *recv, size_t n, DistDtype dt, DistGroup *g);
DistWork dist_ireduce_scatter_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistOp op,
                                DistGroup *g);
DistWork dist_iall_gather_v(const void *send, void *recv, const size_t *counts, DistDtype dt, DistGroup *g);
DistWork dist_isend(const void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g);
DistWork dist_irecv(void *buf, size_t count, DistDtype dt, int peer, int tag, DistGroup *g);
void dist_wait(DistWork *w);
int dist_test(DistWork *w);          // 1 when complete (then it is finished like dist_wait)
void dist_wait_all(DistWork *w, int n);

// The communication thread: a CPU stand-in for a GPU's communication stream. One thread per
// process serves every group attached to it by dist_comm_thread_start(g) (collective over g;
// g gets its own duplicate of its communicator there, so the thread's ops never meet the
// caller's). Afterwards the non-blocking ops on g with host buffers (dist_iall_reduce,
// dist_ibroadcast, dist_ireduce_scatter, dist_iall_gather and their _n and _v forms) only count
// their bytes and queue the op: the thread runs the queued ops of all attached groups one
// after the other, in the order they were started, as BLOCKING MPI calls (Open MPI's blocking
// algorithms are faster than its non-blocking ones, and they progress without the caller
// polling), each made once a non-blocking barrier, tested with short sleeps, says the peers
// have reached it (a late peer costs no spinning core). So an all-gather started there (FSDP's
// prefetch) goes on while the caller computes.
// Every rank must start the ops of groups it shares in the same order (as for blocking calls).
// dist_test on such a DistWork looks at a flag. dist_wait runs the queued ops the thread has
// not started yet, up to its own, itself (the thread is idle then: still one thread in MPI),
// and otherwise sleeps on a condition variable. dist_isend / dist_irecv are not queued (a queue of blocking sends and
// receives could deadlock a ring); they run as MPI non-blocking calls from the caller.
// The rule: MPI runs at thread level SERIALIZED, so while any queued op is unfinished (not yet
// returned by dist_wait or a dist_test that said 1) the calling thread must make no other
// dist_* call that communicates (queueing more on an attached group is fine): it is refused
// with a message. Open MPI here offers MPI_THREAD_MULTIPLE too, but the lab keeps SERIALIZED:
// one thread in MPI at a time is the model of a GPU's single communication stream, and it
// costs nothing on the caller's path. Device buffers are not affected.
void dist_comm_thread_start(DistGroup *g);
// Detaches g (after waiting for its queued ops); the thread ends with its last group. Also done
// by dist_group_free / dist_finalize.
void dist_comm_thread_stop(DistGroup *g);
// Since g was attached: seconds the thread spent in g's ops (wall clock), and of those the
// seconds it ran on a core (its CPU time); the rest it waited for the peers or for a core.
// Ops that dist_wait ran on the caller's thread count too (the caller's wall and CPU time).
void dist_comm_thread_times(DistGroup *g, double *busy_s, double *cpu_s);

// Byte counters of this rank since the last reset.
const DistCounters *dist_counters(void);
void dist_counters_reset(void);
uint64_t dist_bytes_sent(void);      // total over op kinds
uint64_t dist_bytes_recv(void);
// What the counters grew by since `before` (a copy taken then), added to *into: the traffic of
// something that is not a training step (a checkpoint, say), kept apart.
void dist_counters_add_since(DistCounters *into, const DistCounters *before);
// Per step: (the counters now - `minus`, the traffic kept apart) / steps, each op kind's and
// the sum over op kinds.
typedef struct DistPerStep {
    double calls[OP_NKINDS], sent[OP_NKINDS], recv[OP_NKINDS];
    double sent_all, recv_all;
} DistPerStep;
DistPerStep dist_counters_per_step(const DistCounters *minus, double steps);
// The same for the ops issued on g only (each op counts in its group and in the process total).
const DistCounters *dist_group_counters(const DistGroup *g);
void dist_group_counters_reset(DistGroup *g);
uint64_t dist_group_bytes_sent(const DistGroup *g);

// ---- Virtual nodes and links (dist_link.c; docs/CLUSTER.md) --------------------------------
// A cluster this machine does not have: world rank r sits on virtual node r / ranks_per_node,
// and every op is held until the alpha-beta time of its bytes on the link it crosses has passed
// (bytes / bw + hops x latency, the bytes and hops of common/calc_comm.c, the planner's model):
// a send holds the message T before MPI gets it; a collective, timed on the slowest link its
// group crosses, holds every rank T after the real op. The data and the byte counters are
// untouched; off (the default) nothing is held and nothing is measured.
typedef struct DistLink {
    double bw;    // bytes/s per rank per direction
    double lat;   // seconds per message hop
} DistLink;
typedef struct DistLinks {
    int ranks_per_node;      // 0: off
    DistLink intra, inter;   // inside a node, between nodes
    const char *preset;      // "h100", ... or NULL (given numbers)
    double scale;            // the preset's links x scale (1: as the GPUs have them)
    double gpu_peak, cpu_peak;  // FLOP/s of the preset's GPU and of this machine (scale = cpu / gpu)
} DistLinks;
// Parses --links: "G:BW,LAT:BW,LAT" (GB/s, microseconds) or "PRESET:G[:cpu]" (cpu: scaled by
// cpu_peak, this machine's FLOP/s, against the GPU's). NULL, or a message naming the valid forms.
const char *dist_links_parse(const char *spec, DistLinks *out, double cpu_peak);
void dist_links_set(const DistLinks *l);   // NULL or ranks_per_node 0: off
const DistLinks *dist_links(void);         // NULL when off
int dist_links_enabled(void);
double dist_links_cpu_peak(void);          // this rank's measured SGEMM FLOP/s (health.h)
// Nodes g's ranks sit on (1 when off).
int dist_group_nodes(const DistGroup *g);
// The model: seconds of one op of kind k moving `bytes` (this rank's, as dist counts them) in a
// group of n over link l: bytes / l->bw + hops x l->lat; hops: all-reduce 2(n-1), reduce-scatter,
// all-gather and barrier n-1, anything else 1.
double dist_link_seconds(DistOpKind k, double bytes, int n, const DistLink *l);
// Seconds this rank was held in g's ops since the start or the last reset, and of those the
// seconds the communication thread was held (hidden behind the caller's compute; the rest
// were on the caller's path: exposed).
double dist_link_held_seconds(const DistGroup *g);
double dist_link_hidden_seconds(const DistGroup *g);
// The same summed over every group of this process since it started.
void dist_link_totals(double *held_s, double *hidden_s);
void dist_link_held_reset(const DistGroup *g);
// One line (two with a scaled preset) describing the virtual cluster; nothing when off.
void dist_links_print(FILE *out);
