// dist_thread.c: the communication thread of dist.h: one thread per process, one FIFO of ops
// of every attached group, each run as a blocking MPI call on the group's own duplicate
// communicator (dist_mpi_backend), in launch order, after a sleeping barrier (run_op).
//
// Only the calling thread queues and finishes ops. The head of the queue is run by the
// communication thread, or, when the caller waits for an op the thread has not started, by
// the caller (dist_thread_finish): whoever claims it first; only the head runs, so the ops
// stay in launch order and one thread at a time is in MPI.
// The mutex guards the queue, the tasks' claimed and done flags and the time sums.
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#include "check.h"
#include "dist_backend.h"
#include "watchdog.h"

typedef struct Attached {  // DistGroup.thread of an attached group
    DistGroup group;       // the group on its own communicator (the thread's ops never meet the caller's)
    double busy_s, cpu_s;  // in its ops: wall-clock time, and CPU time of the thread
} Attached;

typedef struct CommTask {
    DistCall call;
    size_t *counts;         // the v-ops' counts (call.counts points here): the caller's may go
    Attached *on;
    int claimed;            // being run (by the thread, or by the caller in dist_wait)
    int done;               // set by the thread (under the mutex) when the op has finished
    struct CommTask *next;  // the queue, in launch order
} CommTask;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;  // a task was queued, or stop
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;  // a task is done
static CommTask *head, *tail;  // queued, not yet run (head: running now)
static pthread_t tid;
static int running = 0, stop = 0, nattached = 0;
static int pending = 0;  // queued and not yet finished by the caller (caller's thread only)
static _Thread_local int on_comm_thread = 0;  // 1 on the communication thread

static double thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Runs one queued op on the group's own communicator. First a non-blocking barrier, tested
// with short sleeps between tests once it has waited 20 us: the peers are late. Then the op as a
// blocking MPI call, with every peer already there. A blocking call made at once would spin
// (yielding) for the whole time the peers are late and take a core from the compute the op
// should hide behind: on a machine with no core to spare (2 ranks on 2 cores) that made
// prefetching slower than not prefetching. The blocking call itself keeps Open MPI's blocking
// algorithms (faster here than the non-blocking ones, and the same sums, bit for bit). Sleeps
// grow from 2 us to 64 us: a late peer is seen at most ~64 us late.
static void run_op(CommTask *task) {
    DistGroup *g = &task->on->group;
    if (g->size > 1) {
        MPI_Request req;
        MPI_Ibarrier(g->comm, &req);
        const double t0 = lab_now();
        long ns = 2000;
        for (int done = 0;;) {
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (done) break;
            if (lab_now() - t0 < 20e-6) continue;
            struct timespec ts = {0, ns};
            nanosleep(&ts, NULL);
            if (ns < 64000) ns *= 2;
        }
    }
    dist_mpi_backend.run(&task->call, g, NULL);
    dist_link_hold_after_on(&task->call, g, on_comm_thread);   // virtual links: the stream is busy
}

// Runs the head of the queue, claimed under the mutex (held on entry and on return), and
// marks it done: the time sums count it whichever thread ran it. The watchdog times it in the
// wait slot of the thread that runs it.
static void run_head(CommTask *task) {
    pthread_mutex_unlock(&mu);
    // The blocking op; the caller's thread meanwhile computes (and makes no MPI call), or it is
    // the caller's thread itself, in dist_wait, with the communication thread idle.
    const uint64_t wd = task->call.wd;
    const int slot = on_comm_thread ? WD_COMM_THREAD : WD_CALLER_RUNS;
    if (wd) watchdog_wait_begin(wd, slot);
    double w0 = lab_now(), c0 = thread_cpu_now();
    run_op(task);
    double w1 = lab_now(), c1 = thread_cpu_now();
    if (wd) watchdog_op_end(wd, slot);
    pthread_mutex_lock(&mu);
    task->on->busy_s += w1 - w0;
    task->on->cpu_s += c1 - c0;
    head = task->next;
    if (!head) tail = NULL;
    task->done = 1;
    pthread_cond_broadcast(&done_cv);
    pthread_cond_signal(&work_cv);  // the next one, for the thread
}

static void *thread_main(void *arg) {
    (void)arg;
    on_comm_thread = 1;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // its sleeps end on time (1 us slack, not 50)
    pthread_mutex_lock(&mu);
    for (;;) {
        // the head, unless the caller has claimed it (dist_wait runs it itself)
        while ((!head || head->claimed) && !(stop && !head)) pthread_cond_wait(&work_cv, &mu);
        if (!head) break;  // stop, and nothing left
        head->claimed = 1;
        run_head(head);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

void dist_comm_thread_start(DistGroup *g) {
    int inited = 0;
    MPI_Initialized(&inited);
    LAB_CHECK(inited, "dist_init() must be called before dist_comm_thread_start");
    if (g->thread) return;
    // Attaching duplicates g's communicator: an MPI call, so only while the thread is idle.
    if (pending > 0)
        lab_fail("dist comm_thread_start(%s): %d op%s queued on the communication thread not finished: "
                 "dist_wait for %s first (MPI runs at thread level SERIALIZED, one thread at a time)",
                 g->name, pending, pending > 1 ? "s" : "", pending > 1 ? "them" : "it");
    int level = 0;
    MPI_Query_thread(&level);
    LAB_CHECK(level >= MPI_THREAD_SERIALIZED, "dist_comm_thread_start: MPI was initialized at a "
              "thread level below MPI_THREAD_SERIALIZED (%d); a communication thread needs it", level);
    Attached *a = lab_xcalloc(1, sizeof(Attached));
    dist_mpi_dup(g, &a->group);  // collective over g, made while the thread is idle
    if (!running) {
        stop = 0;
        LAB_CHECK(pthread_create(&tid, NULL, thread_main, NULL) == 0, "dist_comm_thread_start: pthread_create failed");
        running = 1;
    }
    nattached++;
    g->thread = a;
    // the caller may run queued ops itself in dist_wait (dist_thread_finish): its sleeps there
    // end on time too
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

// Waits until the queue is empty (then the thread is idle and MPI is the caller's again).
static void drain(void) {
    pthread_mutex_lock(&mu);
    while (head) pthread_cond_wait(&done_cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void join_thread(void) {
    if (!running) return;
    pthread_mutex_lock(&mu);
    stop = 1;
    pthread_cond_signal(&work_cv);
    pthread_mutex_unlock(&mu);
    pthread_join(tid, NULL);  // it runs what is queued first
    running = 0;
}

void dist_comm_thread_stop(DistGroup *g) {
    Attached *a = g->thread;
    if (!a) return;
    drain();
    g->thread = NULL;
    dist_mpi_group_free(&a->group);
    free(a);
    if (--nattached == 0) join_thread();
}

void dist_thread_stop_all(void) {
    drain();
    join_thread();
}

void dist_comm_thread_times(DistGroup *g, double *busy_s, double *cpu_s) {
    Attached *a = g->thread;
    *busy_s = *cpu_s = 0.0;
    if (!a) return;
    pthread_mutex_lock(&mu);
    *busy_s = a->busy_s;
    *cpu_s = a->cpu_s;
    pthread_mutex_unlock(&mu);
}

void dist_thread_queue(const DistCall *c, DistGroup *g, DistWork *w) {
    CommTask *task = lab_xcalloc(1, sizeof(CommTask));
    task->call = *c;
    if (c->counts) {
        int N = g->size;
        task->counts = lab_xmalloc((size_t)N * sizeof(size_t));
        for (int p = 0; p < N; p++) task->counts[p] = c->counts[p];
        task->call.counts = task->counts;
    }
    task->on = g->thread;
    pthread_mutex_lock(&mu);
    if (tail) tail->next = task;
    else head = task;
    tail = task;
    pthread_cond_signal(&work_cv);
    pthread_mutex_unlock(&mu);
    w->task = task;
    pending++;
}

int dist_thread_finish(DistWork *w, int block) {
    CommTask *task = w->task;
    pthread_mutex_lock(&mu);
    while (block && !task->done) {
        // Ops the thread has not started yet, up to this one, the caller runs itself: it would
        // only sleep meanwhile, and it saves the hand-off to a thread that may wait for a core
        // (the thread is idle then, so MPI stays one thread at a time).
        if (head && !head->claimed) {
            head->claimed = 1;
            run_head(head);
        } else {
            pthread_cond_wait(&done_cv, &mu);
        }
    }
    int done = task->done;
    pthread_mutex_unlock(&mu);
    if (!done) return 0;
    free(task->counts);
    free(task);
    w->task = NULL;
    w->active = 0;
    pending--;
    return 1;
}

int dist_thread_pending(void) { return pending; }
