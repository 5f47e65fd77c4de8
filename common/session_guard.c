// session_guard.c: the loop's guard (the notes' 10.8, "training stability"): what a NaN/Inf
// gradient, a loss spike and an out-of-memory do to a run, and the faults that test them
// (session.h, "the guard").
//
//   NaN/Inf   the global gradient norm is not finite. --on-nan stop (the default) ends the run
//             (adamw_clip_scale, one message); skip: adamw_clip_scale answers ADAMW_SKIP and
//             adamw_update changes nothing, on every rank that steps (the norm is global: they
//             all find it). Counted here, from the norm the chapter gives the loop.
//   spike     the step's loss is more than --spike-z standard deviations above the mean of the
//             last --spike-window steps' (world rank 0 keeps them: the health line's window).
//             Found before the update (session_may_update), decided once, on rank 0, and
//             broadcast: warn, skip, rollback or stop. A spike never enters the window (it
//             would widen it and hide the next one).
//   rollback  at the step's end every rank reads the last checkpoint back (state.load: the
//             chapter's --resume code), the loop goes on from its step, replaying the steps up
//             to the spike's (at lr x --rollback-lr-scale), and the updates of --rollback-skip
//             steps from the spike's are skipped: their data is not trained on. The batch of a
//             step is a pure function of (seed, step), so the replay is exact: with a scale of
//             1 a rollback ends where --on-spike skip does, bit for bit. A checkpoint is always
//             there: the run writes its starting state first.
//   OOM       --inject-oom-step R:S: an allocation fails on rank R at the top of step S
//             (mem_fail_next_alloc), through mem.c's out-of-memory message; the job ends, and
//             the last checkpoint is as it was.
//   resume    a run whose updates depend on the guard (--on-spike skip|rollback|stop, --on-nan
//             skip) hands ckpt.c its record before each save (guard_to_ckpt: the windows, the
//             counts, a rollback's skipped steps; format 3, ckpt.h), and a --resume takes it
//             back (guard_resume): the resumed run sees a spike as soon after the restart as
//             the uninterrupted run does, with the same z-scores, and makes the same decisions.
//             A rollback's load does not take it: the windows go back to those kept in memory
//             at that checkpoint (the same values), the counts go on.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ckpt.h"
#include "mem.h"
#include "session.h"

typedef enum { ON_SPIKE_WARN, ON_SPIKE_SKIP, ON_SPIKE_ROLLBACK, ON_SPIKE_STOP } OnSpike;

static OnSpike on_spike(const LabArgs *a) {
    if (strcmp(a->on_spike, "skip") == 0) return ON_SPIKE_SKIP;
    if (strcmp(a->on_spike, "rollback") == 0) return ON_SPIKE_ROLLBACK;
    if (strcmp(a->on_spike, "stop") == 0) return ON_SPIKE_STOP;
    return ON_SPIKE_WARN;
}

static int says(const Session *s) { return s->rank == 0 && !s->args->quiet; }

// Does this run's trajectory depend on the guard's state (its checkpoints then carry it)?
static int guarded(const Session *s) { return on_spike(s->args) != ON_SPIKE_WARN || s->opt.skip_nan; }

_Static_assert(CKPT_GUARD_WINDOW == HEALTH_WINDOW_MAX, "ckpt.h's window size is health.h's");
_Static_assert(CKPT_GUARD_ROLLBACKS == SESSION_MAX_ROLLBACKS, "ckpt.h's rollbacks are session.h's");

// A window's values, oldest first, and the slot its next value goes to.
static void window_out(const HealthWindow *w, double *x, int32_t *n, int32_t *head) {
    for (int i = 0; i < w->n; i++) x[i] = w->x[(w->head - w->n + i + w->cap) % w->cap];
    *n = w->n;
    *head = w->head;
}

// Back into w (its size: this run's --spike-window). The same size: the same ring, slot for slot
// (its sums then add in the same order: the same z-scores, bit for bit). Another: the newest
// min(n, size) values, in order.
static void window_in(HealthWindow *w, const double *x, int n, int head, int cap) {
    if (cap == w->cap) {
        for (int i = 0; i < n; i++) w->x[(head - n + i + cap) % cap] = x[i];
        w->n = n;
        w->head = head;
        return;
    }
    for (int i = 0; i < n; i++) health_window_push(w, x[i]);
}

void guard_to_ckpt(const Session *s) {
    if (!guarded(s)) return;  // (format 2, as every other run's)
    CkptGuard g;
    memset(&g, 0, sizeof g);
    g.nan_skips = s->nan_skips, g.spike_skips = s->spike_skips;
    g.window_skips = s->window_skips, g.rollbacks = s->rollbacks;
    g.cap = s->win_loss.cap;
    window_out(&s->win_loss, g.loss, &g.nloss, &g.loss_head);
    window_out(&s->win_gnorm, g.gnorm, &g.ngnorm, &g.gnorm_head);
    g.lr_low_until = s->lr_low_until;
    g.nwin = s->nwin;
    for (int i = 0; i < s->nwin; i++) g.win_lo[i] = s->win_lo[i], g.win_hi[i] = s->win_hi[i];
    ckpt_set_guard(&g);
}

void guard_resume(Session *s) {
    // (a run that only warns goes on as before: its updates never depend on the record)
    if (!s->args->resume || !guarded(s)) return;
    // rank 0 read the state (some chapters read it there alone): its record goes to every rank
    // (the counts and a rollback's skipped steps are every rank's)
    struct { int32_t has; CkptGuard g; } r;
    memset(&r, 0, sizeof r);
    r.has = ckpt_loaded_guard(&r.g);
    // (before the loop: the chapters reset their byte counters after session_start_at)
    if (s->N > 1) dist_broadcast(&r, sizeof r, DIST_U8, 0, s->world);
    if (!r.has) {
        if (says(s))
            printf("note: %s holds no spike-detector window (a state of format 1 or 2): the "
                   "resumed run's starts empty, and sees spikes again after %d steps\n",
                   s->args->resume, HEALTH_Z_MIN);
        return;
    }
    const CkptGuard *g = &r.g;
    window_in(&s->win_loss, g->loss, g->nloss, g->loss_head, g->cap);
    window_in(&s->win_gnorm, g->gnorm, g->ngnorm, g->gnorm_head, g->cap);
    s->nan_skips = g->nan_skips, s->spike_skips = g->spike_skips;
    s->window_skips = g->window_skips, s->rollbacks = g->rollbacks;
    s->nwin = g->nwin;
    for (int i = 0; i < g->nwin; i++) s->win_lo[i] = g->win_lo[i], s->win_hi[i] = g->win_hi[i];
    if (g->lr_low_until > s->start && s->args->rollback_lr_scale != 1.0f) {  // mid-replay
        s->lr_low_until = g->lr_low_until;
        s->opt.lr = s->lr * s->args->rollback_lr_scale;
    }
}

void guard_open(Session *s) {
    s->skipped = SKIP_NONE;
    s->ckpt_step = -1;
    s->next = -1;
    s->lr_low_until = -1;
    s->lr = s->opt.lr;
}

void guard_start(Session *s) {
    // a spike before the first --save-every checkpoint goes back to where the run started (the
    // chapters reset their byte counters after this: not counted in save_cost)
    if (on_spike(s->args) != ON_SPIKE_ROLLBACK) return;
    LAB_CHECK(s->state.save, "--on-spike rollback: the chapter gave the loop no way to save its state");
    guard_to_ckpt(s);
    s->state.save(s->state.ctx, s->args->save, s->start);
    ckpt_settle();  // (--save-sharded: its manifest; --async-save: the write done)
    guard_saved(s, s->start);
}

void guard_step_begin(Session *s, int step) {
    const LabArgs *a = s->args;
    s->skipped = SKIP_NONE;
    if (s->lr_low_until >= 0 && step >= s->lr_low_until) {  // the replay is over: --lr again
        s->opt.lr = s->lr;
        s->lr_low_until = -1;
    }
    if (step == a->oom_step && s->rank == a->oom_rank) {
        // what a step that no longer fits meets: its next allocation fails (one activation of
        // this rank's batch, rows x T x C floats), with mem.c's own message
        static char why[128];
        snprintf(why, sizeof why, "injected by --inject-oom-step %s, at step %d", a->inject_oom,
                 step + 1);
        mem_fail_next_alloc(why);
        mem_free(mem_alloc((size_t)s->rows * (size_t)s->T * (size_t)s->cfg.C * sizeof(float),
                           MEM_ACTS, s->dev));
    }
}

void guard_norm(Session *s, double norm_sq) {
    if (isfinite(norm_sq) || !s->opt.skip_nan) return;  // (--on-nan stop ended the run)
    s->skipped = SKIP_NAN;
    s->nan_skips++;
    if (says(s))
        printf("step %5d: NaN/Inf in the gradients (global norm^2 = %g): the update is skipped on "
               "every rank (--on-nan skip)\n", s->step_now + 1, norm_sq);
}

int session_may_update(Session *s, int step, float loss) {
    const LabArgs *a = s->args;
    const OnSpike policy = on_spike(a);
    // the steps a rollback skips (every rank keeps the same list)
    for (int i = 0; i < s->nwin; i++)
        if (step >= s->win_lo[i] && step < s->win_hi[i]) {
            s->skipped = SKIP_ROLLBACK;
            s->window_skips++;
            if (says(s))
                printf("step %5d: the update is skipped: a rollback skips the data of steps %d .. "
                       "%d\n", step + 1, s->win_lo[i] + 1, s->win_hi[i]);
            return 0;
        }
    // the verdict: rank 0's, from its window, the same on every rank (warn changes nothing)
    int spike = 0;
    double z = NAN, mean = NAN, sd = NAN;
    if (s->rank == 0) {
        z = health_z(&s->win_loss, loss);
        spike = z > a->spike_z;
        if (spike) health_window_stats(&s->win_loss, &mean, &sd);
    }
    if (policy != ON_SPIKE_WARN && s->N > 1) dist_broadcast(&spike, 1, DIST_I32, 0, s->world);
    if (!spike) return 1;
    char what[256];
    snprintf(what, sizeof what, "loss spike at step %d: the loss %.4f is %.1f standard deviations "
             "above the mean of the last %d steps (%.4f, sd %.4f)", step + 1, loss, z,
             s->win_loss.n, mean, sd);
    if (policy == ON_SPIKE_STOP) {
        char ckpt[160] = "";
        if (s->ckpt_step >= 0)
            snprintf(ckpt, sizeof ckpt, "; the last checkpoint (step %d) is in %s", s->ckpt_step,
                     a->save);
        lab_fail_collective("%s: training stops before the update (--on-spike stop)%s", what, ckpt);
    }
    if (policy == ON_SPIKE_WARN) {
        if (says(s)) printf("warning: %s (--on-spike warn: the update goes on)\n", what);
        return 1;
    }
    s->skipped = SKIP_SPIKE;
    s->spike_skips++;
    s->rollback_due = policy == ON_SPIKE_ROLLBACK;
    if (says(s))
        printf("%s: %s\n", what, policy == ON_SPIKE_SKIP
                                     ? "the update is skipped on every rank (--on-spike skip)"
                                     : "no update; rolling back (--on-spike rollback)");
    return 0;
}

// The run's arguments as a --resume of path (no --load-weights): state.load reads a rollback's
// checkpoint with them.
static LabArgs resume_args(const Session *s, const char *path) {
    LabArgs a = *s->args;
    a.resume = path;
    a.load_weights = NULL;
    return a;
}

// Every rank reads the last checkpoint back; the loop goes on from its step (session_next_step).
static void rollback(Session *s, int step) {
    const LabArgs *a = s->args;
    const int to = s->ckpt_step;
    LAB_CHECK(s->state.load, "--on-spike rollback: the chapter gave the loop no way to read its "
              "state back (SessionState.load)");
    LAB_CHECK(to >= 0, "--on-spike rollback: no checkpoint was written");
    if (s->nwin == SESSION_MAX_ROLLBACKS)
        lab_fail_collective("loss spike at step %d after %d rollbacks: the spikes keep coming, so "
                            "training stops; the last checkpoint (step %d) is in %s. Look at the "
                            "data of these steps and at the learning rate", step + 1, s->nwin, to,
                            a->save);
    double t0 = lab_now();
    DistCounters before = *dist_counters();  // what the load moves is checkpoint traffic
    ckpt_settle();  // the last checkpoint complete on every rank (--async-save, --save-sharded)
    const LabArgs ra = resume_args(s, a->save);
    int got = s->state.load(s->state.ctx, &ra);
    dist_counters_add_since(&s->save_cost, &before);
    LAB_CHECK(s->rank != 0 || got == to, "rollback: %s holds the state of step %d, not of the last "
              "checkpoint's step %d", a->save, got, to);
    s->win_lo[s->nwin] = step;  // the spike's data, and --rollback-skip - 1 batches after it
    s->win_hi[s->nwin++] = step + a->rollback_skip;
    s->win_loss = s->ckpt_win_loss;  // the detector as it was at the checkpoint
    s->win_gnorm = s->ckpt_win_gnorm;
    if (a->rollback_lr_scale != 1.0f && to < step) {
        s->opt.lr = s->lr * a->rollback_lr_scale;
        s->lr_low_until = step;
    }
    s->next = to;
    s->rollbacks++;
    if (says(s)) {
        char replay[96] = "";
        if (to < step)
            snprintf(replay, sizeof replay, "; steps %d .. %d run again%s", to + 1, step,
                     a->rollback_lr_scale != 1.0f ? " at a lower lr (--rollback-lr-scale)" : "");
        printf("rolled back to the checkpoint of step %d (%s, read in %.0f ms)%s; the updates of "
               "steps %d .. %d are skipped (--rollback-skip %d)\n", to, a->save,
               1e3 * (lab_now() - t0), replay, step + 1, step + a->rollback_skip,
               a->rollback_skip);
        fflush(stdout);
    }
}

int guard_step_end(Session *s, int step, float loss) {
    // the windows (rank 0): this step's loss and grad norm, unless the step was a spike or a
    // rollback's skipped data (a NaN skip's loss is a true reading of the weights: kept)
    if (s->rank == 0 && (s->skipped == SKIP_NONE || s->skipped == SKIP_NAN)) {
        health_window_push(&s->win_loss, loss);
        health_window_push(&s->win_gnorm, sqrt(s->gnorm_sq));
    }
    if (!s->rollback_due) return 0;
    s->rollback_due = 0;
    rollback(s, step);
    return 1;
}

void guard_saved(Session *s, int step) {
    s->ckpt_step = step;
    s->ckpt_win_loss = s->win_loss;
    s->ckpt_win_gnorm = s->win_gnorm;
}

int session_next_step(Session *s, int step) {
    if (s->next < 0) return step + 1;
    int next = s->next;
    s->next = -1;
    return next;
}

void guard_report(const Session *s) {
    const int skips = s->nan_skips + s->spike_skips + s->window_skips;
    if (!says(s) || skips + s->rollbacks == 0) return;
    printf("skipped updates: %d (NaN/Inf %d, loss spikes %d, skipped by rollbacks %d); rollbacks: "
           "%d\n", skips, s->nan_skips, s->spike_skips, s->window_skips, s->rollbacks);
}
