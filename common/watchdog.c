// watchdog.c: the collective watchdog and flight recorder of watchdog.h.
//
// The segment (one per machine and job, POSIX shared memory, unlinked as soon as every rank of
// the machine has mapped it, so a killed job leaves nothing behind):
//
//   WdShared { claimed, nlocal, rank[nlocal] }    rank[i]: the record of local rank i
//   WdRank   { world rank, pid, step, t_last_end, wait[WD_SLOTS], nops, ring[WD_RING] }
//   WdWait   { gen (seqlock), active, since, op }: what one thread of the rank waits in now
//   WdOp     { tag, gid, group, kind, state, peer(s), seq(s), bytes, t_start, t_end }
//
// Writers: a rank writes only its own record; each wait slot has one writer thread (the
// caller's thread: WD_CALLER, WD_CALLER_RUNS; the communication thread: WD_COMM_THREAD), so a
// seqlock (gen odd while written) lets a reader in another process take a consistent copy
// without a lock the writer could hold while stopped. The ring is written by the caller's
// thread (the op begins) and by whoever finishes the op (its end): different entries, and a
// reader only prints them. Every time is CLOCK_MONOTONIC (lab_now), the same clock in every
// process of a machine.
#include "watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum { WD_QUEUED = 1, WD_STARTED, WD_RUNNING, WD_DONE };

typedef struct WdOp {
    uint64_t tag;          // its place in the ring (1-based), 0 while being written
    uint64_t gid;          // the group's identity (dist.c: the same on every rank of the group)
    char group[16];        // the group's name
    int32_t kind;          // DistOpKind, or WD_SENDRECV
    int32_t state;         // WD_QUEUED (on the communication thread) .. WD_DONE
    int32_t peer, peer2;   // world ranks: send/recv's peer; sendrecv: to (peer), from (peer2)
    uint64_t seq, seq2;    // #k (sendrecv: the send's, the receive's)
    uint64_t bytes;        // the op's buffer (count x element size)
    double t_start, t_end; // lab_now() when it began and ended (0: not yet)
} WdOp;

typedef struct WdWait {
    uint32_t gen;          // seqlock: odd while the writer is in the middle of an update
    int32_t active;        // the thread waits in `op` now
    double since;          // ... since then
    WdOp op;
} WdWait;

typedef struct WdRank {
    int32_t alive;         // 1 once the fields below are set (a reader skips the rest)
    int32_t world_rank, pid;
    int32_t step;          // the step it is in (watchdog_note_step), -1 before the first
    int32_t finished;      // 1 once it left the job's communication (dist_finalize)
    double t_last_end;     // when its last op ended: "outside communication since"
    WdWait wait[WD_SLOTS];
    uint64_t nops;         // ops recorded so far: the newest is ring[(nops - 1) % WD_RING]
    WdOp ring[WD_RING];
} WdRank;

typedef struct WdShared {
    int32_t claimed;       // world rank + 1 of the rank that prints the diagnosis (0: nobody yet)
    int32_t nlocal;        // ranks on this machine
    WdRank rank[];         // by local rank
} WdShared;

int watchdog_on = 0;
static int started = 0;
static double timeout_s = 0.0;
static WdShared *shared;   // this machine's segment (or a private one; NULL: off)
static size_t shared_bytes;
static WdRank *self;       // this rank's record in it

static pthread_t wd_tid;
static int wd_running = 0, wd_stop = 0;
static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv = PTHREAD_COND_INITIALIZER;

// The live groups of this process (dist.c registers them): the diagnosis names a group's ranks.
#define WD_MAX_GROUPS 256
static const DistGroup *groups[WD_MAX_GROUPS];
static pthread_mutex_t groups_mu = PTHREAD_MUTEX_INITIALIZER;

// ---------------------------------------------------------------------------------------------
// recording (the callers' threads)

static void wait_publish(WdWait *w, const WdOp *op, double since, int active) {
    uint32_t g = w->gen;
    __atomic_store_n(&w->gen, g + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    if (op) w->op = *op;
    w->since = since;
    w->active = active;
    __atomic_store_n(&w->gen, g + 2, __ATOMIC_RELEASE);
}

// A consistent copy of w (a few tries: a writer stopped mid-update leaves gen odd forever; then
// the last copy is taken as it is).
static void wait_read(const WdWait *w, WdWait *out) {
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t g1 = __atomic_load_n(&w->gen, __ATOMIC_ACQUIRE);
        memcpy(out, (const void *)w, sizeof *out);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint32_t g2 = __atomic_load_n(&w->gen, __ATOMIC_RELAXED);
        if (g1 == g2 && !(g1 & 1)) return;
    }
}

static WdOp *entry(uint64_t ticket) {
    WdOp *e = &self->ring[(ticket - 1) % WD_RING];
    return e->tag == ticket ? e : NULL;  // NULL: overwritten by WD_RING newer ops
}

uint64_t watchdog_op_begin(const DistGroup *g, int kind, int peer, uint64_t seq, int peer2,
                           uint64_t seq2, uint64_t bytes, int nonblocking) {
    const uint64_t n = self->nops + 1;
    WdOp *e = &self->ring[(n - 1) % WD_RING];
    const double now = lab_now();
    __atomic_store_n(&e->tag, 0, __ATOMIC_RELAXED);
    e->gid = g->gid;
    size_t i = 0;
    for (; i < sizeof e->group - 1 && g->name[i]; i++) e->group[i] = g->name[i];
    e->group[i] = '\0';
    e->kind = kind;
    e->state = nonblocking ? WD_STARTED : WD_RUNNING;
    e->peer = peer >= 0 ? g->world_ranks[peer] : -1;
    e->peer2 = peer2 >= 0 ? g->world_ranks[peer2] : -1;
    e->seq = seq;
    e->seq2 = seq2;
    e->bytes = bytes;
    e->t_start = now;
    e->t_end = 0.0;
    __atomic_store_n(&e->tag, n, __ATOMIC_RELEASE);
    __atomic_store_n(&self->nops, n, __ATOMIC_RELEASE);
    if (!nonblocking) wait_publish(&self->wait[WD_CALLER], e, now, 1);
    return n;
}

void watchdog_op_queued(uint64_t ticket) {
    WdOp *e = entry(ticket);
    if (e) e->state = WD_QUEUED;
}

void watchdog_wait_begin(uint64_t ticket, int slot) {
    WdOp *e = entry(ticket), unknown;
    if (!e) {  // an op older than the ring: still timed, without its name
        memset(&unknown, 0, sizeof unknown);
        unknown.kind = -1;
        e = &unknown;
    } else if (slot != WD_CALLER) {
        e->state = WD_RUNNING;
    }
    wait_publish(&self->wait[slot], e, lab_now(), 1);
}

void watchdog_wait_end(int slot) { wait_publish(&self->wait[slot], NULL, 0.0, 0); }

void watchdog_op_end(uint64_t ticket, int slot) {
    const double now = lab_now();
    WdOp *e = entry(ticket);
    if (e) {
        e->t_end = now;
        e->state = WD_DONE;
    }
    self->t_last_end = now;
    if (slot >= 0) wait_publish(&self->wait[slot], NULL, 0.0, 0);
}

void watchdog_note_step(int step) {
    if (self) self->step = step;
}

void watchdog_group_add(const DistGroup *g) {
    pthread_mutex_lock(&groups_mu);
    for (int i = 0; i < WD_MAX_GROUPS; i++)
        if (!groups[i]) {
            groups[i] = g;
            break;
        }
    pthread_mutex_unlock(&groups_mu);
}

void watchdog_group_remove(const DistGroup *g) {
    pthread_mutex_lock(&groups_mu);
    for (int i = 0; i < WD_MAX_GROUPS; i++)
        if (groups[i] == g) groups[i] = NULL;
    pthread_mutex_unlock(&groups_mu);
}

// ---------------------------------------------------------------------------------------------
// --inject-hang

void watchdog_inject_hang(int step, double seconds) {
    if (seconds > 0) {
        fprintf(stderr, "[rank %d] --inject-hang: sleeping %.1f s at the start of step %d (pid %d)\n",
                lab_log_rank, seconds, step + 1, (int)getpid());
        fflush(stderr);
        struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        return;
    }
    fprintf(stderr, "[rank %d] --inject-hang: stopping without dying at the start of step %d "
            "(pid %d); the other ranks will wait for it\n", lab_log_rank, step + 1, (int)getpid());
    fflush(stderr);
    for (;;) pause();  // alive, not in any op: a stuck kernel, an endless loop
}

// ---------------------------------------------------------------------------------------------
// the diagnosis (the watchdog thread)

typedef struct Txt {
    char buf[48 * 1024];
    size_t n;
} Txt;

LAB_PRINTF(2, 3) static void tx(Txt *t, const char *fmt, ...) {
    if (t->n >= sizeof t->buf - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->buf + t->n, sizeof t->buf - t->n, fmt, ap);
    va_end(ap);
    if (k > 0) t->n += (size_t)k < sizeof t->buf - t->n ? (size_t)k : sizeof t->buf - t->n - 1;
}

// What one rank of this machine was doing, copied out of the segment.
typedef struct Seen {
    int world_rank, pid, step, finished;
    char pstate;           // /proc's process state: R running, S sleeping, T stopped, ...
    double t_last_end;
    WdWait wait[WD_SLOTS];
    uint64_t nops;
    WdOp ring[WD_RING];
} Seen;

static char proc_state(int pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return '?';
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    const char *p = got ? strrchr(line, ')') : NULL;  // "pid (comm) S ...": comm may hold ')'
    return p && p[1] == ' ' ? p[2] : '?';
}

static void see(const WdRank *r, Seen *s) {
    s->world_rank = r->world_rank;
    s->pid = r->pid;
    s->step = r->step;
    s->finished = r->finished;
    s->t_last_end = r->t_last_end;
    for (int k = 0; k < WD_SLOTS; k++) wait_read(&r->wait[k], &s->wait[k]);
    s->nops = __atomic_load_n(&r->nops, __ATOMIC_ACQUIRE);
    memcpy(s->ring, (const void *)r->ring, sizeof s->ring);
    s->pstate = proc_state(r->pid);
}

// The wait that says most about a rank: the op it runs in MPI (a queued op the caller or the
// communication thread runs) before the caller's wait for it.
static const WdWait *current(const Seen *s) {
    static const int order[WD_SLOTS] = {WD_CALLER_RUNS, WD_COMM_THREAD, WD_CALLER};
    for (int k = 0; k < WD_SLOTS; k++)
        if (s->wait[order[k]].active) return &s->wait[order[k]];
    return NULL;
}

static int is_p2p(int kind) { return kind == OP_SEND || kind == OP_RECV || kind == WD_SENDRECV; }

static const char *kind_name(int kind) {
    switch (kind) {
    case OP_BROADCAST: return "broadcast";
    case OP_ALL_REDUCE: return "all-reduce";
    case OP_REDUCE: return "reduce";
    case OP_REDUCE_SCATTER: return "reduce-scatter";
    case OP_ALL_GATHER: return "all-gather";
    case OP_SCATTER: return "scatter";
    case OP_GATHER: return "gather";
    case OP_SEND: return "send";
    case OP_RECV: return "recv";
    case OP_BARRIER: return "barrier";
    case WD_SENDRECV: return "sendrecv";
    default: return "an op older than the flight recorder";
    }
}

// "all-reduce #9", "recv #7 from rank 1", "sendrecv (send #3 to rank 2, recv #3 from rank 0)";
// with_group: "dp " before it.
static void op_text(Txt *t, const WdOp *o, int with_group) {
    if (o->kind < 0) {
        tx(t, "%s", kind_name(o->kind));
        return;
    }
    if (with_group) tx(t, "%s ", o->group);
    if (o->kind == OP_SEND) tx(t, "send #%llu to rank %d", (unsigned long long)o->seq, o->peer);
    else if (o->kind == OP_RECV) tx(t, "recv #%llu from rank %d", (unsigned long long)o->seq, o->peer);
    else if (o->kind == WD_SENDRECV)
        tx(t, "sendrecv (send #%llu to rank %d, recv #%llu from rank %d)", (unsigned long long)o->seq,
           o->peer, (unsigned long long)o->seq2, o->peer2);
    else tx(t, "%s #%llu", kind_name(o->kind), (unsigned long long)o->seq);
}

static const char *state_word(char st) {
    switch (st) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in the kernel (uninterruptible)";
    case 'T': return "stopped (SIGSTOP or a debugger)";
    case 't': return "stopped by a debugger";
    case 'Z': return "dead (a zombie)";
    default: return "state unknown";
    }
}

// ranks of one machine a diagnosis looks at (a machine has a few GPUs: 8, 16)
#define WD_MAX_LOCAL 128

static int stopped(char st) { return st == 'T' || st == 't'; }

static const Seen *find(const Seen *seen, int n, int world_rank) {
    for (int i = 0; i < n; i++)
        if (seen[i].world_rank == world_rank) return &seen[i];
    return NULL;
}

// The newest op of a rank's ring that has ended, or NULL.
static const WdOp *last_done(const Seen *s) {
    for (uint64_t k = 0; k < WD_RING && k < s->nops; k++) {
        const WdOp *o = &s->ring[(s->nops - 1 - k) % WD_RING];
        if (o->tag == s->nops - k && o->state == WD_DONE) return o;
    }
    return NULL;
}

// What rank s is doing, as seen against the op `ref` the diagnosing rank waits in:
// "is in dp all-reduce #9 for 2.0 s", "is outside communication for 2.0 s (...)", ...
static void describe(Txt *t, const Seen *s, const WdOp *ref, double now) {
    const WdWait *w = current(s);
    if (w) {
        tx(t, "is %s ", stopped(s->pstate) ? "stopped (SIGSTOP or a debugger) in" : "in");
        op_text(t, &w->op, 1);
        tx(t, " (for %.1f s)", now - w->since);
        if (w->op.gid == ref->gid && w->op.seq == ref->seq && w->op.kind != ref->kind && !is_p2p(ref->kind))
            tx(t, ": a different collective at the same place: the ranks called %s's collectives in "
               "different orders", ref->group);
        return;
    }
    if (s->finished) {  // a rank that left while others still needed it: a bug of the program
        tx(t, "has finished: it called dist_finalize and makes no more ops (%s)", state_word(s->pstate));
        return;
    }
    tx(t, "is outside communication");
    if (s->t_last_end > 0) tx(t, " for %.1f s", now - s->t_last_end);
    tx(t, " (%s", state_word(s->pstate));
    if (s->step >= 0) tx(t, ", in step %d", s->step + 1);
    const WdOp *last = last_done(s);
    if (last) {
        tx(t, ", last op: ");
        op_text(t, last, 1);
    }
    tx(t, ")");
}

// Does rank s wait in the op ref (the same group, kind and number) on any of its threads?
static int reached(const Seen *s, const WdOp *ref) {
    for (int k = 0; k < WD_SLOTS; k++) {
        const WdOp *o = &s->wait[k].op;
        if (s->wait[k].active && o->gid == ref->gid && o->kind == ref->kind && o->seq == ref->seq) return 1;
    }
    return 0;
}

// "1,5": the world ranks in list[0..n)
static void rank_list(Txt *t, const int *list, int n) {
    for (int i = 0; i < n; i++) tx(t, "%s%d", i ? "," : "", list[i]);
}

// The summary: the group, the op, who reached it, what the others do.
static void summary(Txt *t, int slot, const WdWait *mine, const Seen *seen, int nseen, double now) {
    const WdOp *o = &mine->op;
    const int me = self->world_rank;
    const char *thread = slot == WD_COMM_THREAD ? "'s communication thread" : "";
    int members[1024], n = 0;
    pthread_mutex_lock(&groups_mu);
    for (int i = 0; i < WD_MAX_GROUPS && o->kind >= 0; i++)
        if (groups[i] && groups[i]->gid == o->gid) {
            n = groups[i]->size < 1024 ? groups[i]->size : 1024;
            for (int p = 0; p < n; p++) members[p] = groups[i]->world_ranks[p];
            break;
        }
    pthread_mutex_unlock(&groups_mu);
    if (o->kind < 0) {
        tx(t, "rank %d%s waits in %s for %.1f s", me, thread, kind_name(o->kind), now - mine->since);
        return;
    }
    tx(t, "%s group {", o->group);
    rank_list(t, members, n);
    tx(t, "}: ");
    if (is_p2p(o->kind)) {
        tx(t, "rank %d%s waits in ", me, thread);
        op_text(t, o, 0);
        tx(t, " for %.1f s", now - mine->since);
        const int peers[2] = {o->peer, o->kind == WD_SENDRECV && o->peer2 != o->peer ? o->peer2 : -1};
        for (int k = 0; k < 2; k++) {
            if (peers[k] < 0) continue;
            const Seen *s = find(seen, nseen, peers[k]);
            tx(t, "; rank %d ", peers[k]);
            if (s) describe(t, s, o, now);
            else tx(t, "is on another machine (its state is not visible from here)");
        }
        return;
    }
    // a collective: who reached it, and what the others do
    int in[1024], nin = 0, remote[1024], nremote = 0;
    for (int p = 0; p < n; p++) {
        const Seen *s = find(seen, nseen, members[p]);
        if (members[p] == me || (s && reached(s, o))) in[nin++] = members[p];
        else if (!s) remote[nremote++] = members[p];
    }
    if (nin > 1) {
        tx(t, "ranks ");
        rank_list(t, in, nin);
        tx(t, " wait in ");
        op_text(t, o, 0);
        tx(t, " (rank %d%s for %.1f s)", me, thread, now - mine->since);
    } else {
        tx(t, "rank %d%s waits in ", me, thread);
        op_text(t, o, 0);
        tx(t, " for %.1f s", now - mine->since);
    }
    for (int p = 0; p < n; p++) {
        const Seen *s = find(seen, nseen, members[p]);
        if (!s || members[p] == me) continue;
        if (reached(s, o)) {
            if (stopped(s->pstate)) tx(t, "; rank %d reached it but is stopped (SIGSTOP or a debugger)", s->world_rank);
            continue;
        }
        tx(t, "; rank %d has not reached it: it ", s->world_rank);
        describe(t, s, o, now);
    }
    if (nremote) {
        tx(t, "; rank%s ", nremote > 1 ? "s" : "");
        rank_list(t, remote, nremote);
        tx(t, " %s on another machine (not visible from here)", nremote > 1 ? "are" : "is");
    }
}

// One line per rank of this machine: what it waits in, and its last ops (the flight recorder).
static void details(Txt *t, const Seen *seen, int nseen, double now) {
    tx(t, "  the ranks on this machine (what each waits in now; its flight recorder, newest last):\n");
    for (int i = 0; i < nseen && i < 64; i++) {
        const Seen *s = &seen[i];
        tx(t, "    rank %d (pid %d, %s", s->world_rank, s->pid, state_word(s->pstate));
        if (s->step >= 0) tx(t, ", step %d", s->step + 1);
        tx(t, "): ");
        const WdWait *w = current(s);
        if (w) {
            tx(t, "waits in ");
            op_text(t, &w->op, 1);
            tx(t, " for %.1f s", now - w->since);
        } else {
            tx(t, s->finished ? "finished (dist_finalize)" : "outside communication");
        }
        // its newest ops that started (up to 4, oldest first), and how many wait in its queue
        uint64_t pick[4];
        int npick = 0, nqueued = 0;
        for (uint64_t k = 0; k < WD_RING && k < s->nops && npick < 4; k++) {
            const uint64_t at = s->nops - k;
            const WdOp *o = &s->ring[(at - 1) % WD_RING];
            if (o->tag != at) continue;
            if (o->state == WD_QUEUED) nqueued++;
            else pick[npick++] = at;
        }
        tx(t, "; last ops:");
        for (int k = npick - 1; k >= 0; k--) {
            const WdOp *o = &s->ring[(pick[k] - 1) % WD_RING];
            tx(t, " ");
            op_text(t, o, 1);
            if (o->state == WD_DONE) tx(t, " [%.2f ms]", 1e3 * (o->t_end - o->t_start));
            else tx(t, " [not finished]");
            if (k) tx(t, ",");
        }
        if (nqueued) tx(t, "; %d more queued for its communication thread", nqueued);
        tx(t, "\n");
    }
    if (nseen > 64) tx(t, "    ... and %d more ranks\n", nseen - 64);
}

LAB_NORETURN static void end_job(void) {
    if (lab_abort_hook) lab_abort_hook(1);  // MPI_Abort: every rank, on every machine
    _exit(1);
}

LAB_NORETURN static void diagnose(int slot, const WdWait *mine, double now) {
    int expect = 0;
    if (!__atomic_compare_exchange_n(&shared->claimed, &expect, self->world_rank + 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        // Another rank of this machine prints the diagnosis and ends the job; should it not
        // (it died meanwhile), say it here after a while.
        sleep(10);
        fprintf(stderr, "[rank %d] error: collective timeout (--collective-timeout %g) in %s; rank %d's "
                "diagnosis did not end the job\n", self->world_rank, timeout_s, mine->op.group, expect - 1);
        end_job();
    }
    Seen *seen = calloc(WD_MAX_LOCAL, sizeof(Seen));
    if (!seen) end_job();
    int nseen = 0;
    for (int i = 0; i < shared->nlocal && nseen < WD_MAX_LOCAL; i++)
        if (__atomic_load_n(&shared->rank[i].alive, __ATOMIC_ACQUIRE)) see(&shared->rank[i], &seen[nseen++]);
    static Txt t;
    t.n = 0;
    if (lab_log_world > 1) tx(&t, "[rank %d] ", self->world_rank);
    tx(&t, "error: collective timeout (--collective-timeout %g): ", timeout_s);
    summary(&t, slot, mine, seen, nseen, now);
    tx(&t, "\n");
    details(&t, seen, nseen, now);
    tx(&t, "  the job ends now; a rank that is only slower than %g s needs a larger --collective-timeout "
        "(0 turns the watchdog off)\n", timeout_s);
    // what the main thread printed first (unless it holds stdout: then it is not waiting to print)
    if (ftrylockfile(stdout) == 0) {
        fflush(stdout);
        funlockfile(stdout);
    }
    for (size_t off = 0; off < t.n;) {
        ssize_t k = write(2, t.buf + off, t.n - off);
        if (k <= 0) break;
        off += (size_t)k;
    }
    end_job();
}

// A wait older than S ends the job. The diagnosis names the op the rank is blocked in: the
// queued op the communication thread (or the caller) runs, before the caller's wait for a
// later one behind it.
static void check_waits(void) {
    static const int order[WD_SLOTS] = {WD_CALLER_RUNS, WD_COMM_THREAD, WD_CALLER};
    const double now = lab_now();
    WdWait w[WD_SLOTS];
    int late = 0;
    for (int k = 0; k < WD_SLOTS; k++) {
        wait_read(&self->wait[k], &w[k]);
        late |= w[k].active && now - w[k].since > timeout_s;
    }
    if (!late) return;
    for (int k = 0; k < WD_SLOTS; k++)
        if (w[order[k]].active) diagnose(order[k], &w[order[k]], now);
}

static void *watchdog_main(void *arg) {
    (void)arg;
    // a few looks per timeout, at most 5 a second: the job ends within S + 0.2 s of the hang
    double period = timeout_s / 10 < 0.2 ? timeout_s / 10 : 0.2;
    if (period < 0.01) period = 0.01;
    pthread_mutex_lock(&wd_mu);
    while (!wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + period;
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&wd_cv, &wd_mu, &ts);
        if (wd_stop) break;
        pthread_mutex_unlock(&wd_mu);
        check_waits();
        pthread_mutex_lock(&wd_mu);
    }
    pthread_mutex_unlock(&wd_mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// lifecycle

// The segment of this machine: local rank 0 creates it, every local rank maps it, then it is
// unlinked (the mappings stay). Returns 0 when shared memory is not available.
static int map_shared(MPI_Comm node, int lrank, int lsize, size_t bytes) {
    uint64_t key[2] = {0, 0};
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) key[0] = (uint64_t)getpid(), key[1] = (uint64_t)(lab_now() * 1e9);
    MPI_Bcast(key, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);  // the job's: the same on every machine
    int leader = rank;
    MPI_Bcast(&leader, 1, MPI_INT, 0, node);
    char name[96];
    snprintf(name, sizeof name, "/lab-watchdog-%llx-%llx-%d", (unsigned long long)key[0],
             (unsigned long long)key[1], leader);
    int ok = 1, fd = -1;
    if (lrank == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        ok = fd >= 0 && ftruncate(fd, (off_t)bytes) == 0;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, node);
    if (ok && lrank != 0) {
        fd = shm_open(name, O_RDWR, 0);
        ok = fd >= 0;
    }
    void *p = MAP_FAILED;
    if (ok) p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    int mine = p != MAP_FAILED, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, node);
    if (lrank == 0 && ok) shm_unlink(name);  // every rank of the machine has mapped it (or failed)
    if (!all) {
        if (p != MAP_FAILED) munmap(p, bytes);
        return 0;
    }
    shared = p;
    shared->nlocal = lsize;
    return 1;
}

void watchdog_start(double s) {
    if (started) return;
    started = 1;
    timeout_s = s;
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (s <= 0 || world < 2) return;  // off: one rank waits for nobody
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int lrank = 0, lsize = 1;
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    shared_bytes = sizeof(WdShared) + (size_t)lsize * sizeof(WdRank);
    if (!map_shared(node, lrank, lsize, shared_bytes)) {
        // each rank still times its own waits; its diagnosis cannot see the others
        if (lrank == 0)
            fprintf(stderr, "note: --collective-timeout: no POSIX shared memory here (/dev/shm): a "
                    "timeout's diagnosis will show only the waiting rank's own state\n");
        shared_bytes = sizeof(WdShared) + sizeof(WdRank);
        shared = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        LAB_CHECK(shared != MAP_FAILED, "watchdog: mmap of %zu bytes failed", shared_bytes);
        shared->nlocal = 1;
        lrank = 0;
    }
    MPI_Comm_free(&node);
    self = &shared->rank[lrank];
    self->world_rank = rank;
    self->pid = (int)getpid();
    self->step = -1;
    __atomic_store_n(&self->alive, 1, __ATOMIC_RELEASE);
    watchdog_on = 1;
    wd_stop = 0;
    LAB_CHECK(pthread_create(&wd_tid, NULL, watchdog_main, NULL) == 0, "watchdog: pthread_create failed");
    wd_running = 1;
}

void watchdog_stop(void) {
    if (wd_running) {
        pthread_mutex_lock(&wd_mu);
        wd_stop = 1;
        pthread_cond_signal(&wd_cv);
        pthread_mutex_unlock(&wd_mu);
        pthread_join(wd_tid, NULL);
        wd_running = 0;
    }
    watchdog_on = 0;
    if (self) __atomic_store_n(&self->finished, 1, __ATOMIC_RELEASE);  // the others may still look
    if (shared) munmap(shared, shared_bytes);
    shared = NULL;
    self = NULL;
}
