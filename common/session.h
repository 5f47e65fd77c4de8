// session.h: the one training loop skeleton every training chapter runs its step inside, so
// that a chapter's train() shows only its own idea (who computes, who communicates, who steps).
//
// Two parts:
//   the loop (every chapter: session_open): the arguments, the world, the data source and this
//     rank's (rows, T) batch buffers, the losses, the clock, the progress line, the fault hooks
//     (--kill-rank/--kill-step, --inject-nan-step, --inject-spike-step, --inject-oom-step,
//     --stop-at), the NaN and loss-spike policies (--on-nan, --on-spike: session_guard.c), the
//     checkpoint cadence (every --save-every steps or --save-every-min minutes, the final --save,
//     --save-weights; how each is written, ckpt.h's policy: --async-save, --save-sharded,
//     --keep-last; ckpt_settle before each save, a rollback's load and at the end), the --dump
//     and the per-rank table; --val-every and --sample (common/text.h: on world rank 0, from the
//     whole model state.weights_to_host gathers);
//   the state (the chapter's): what a checkpoint holds and where the final weights come from,
//     given to the loop as a SessionState (save, weights_to_host, load). A single replica (00,
//     02, 03) takes session_init, which adds the model, gradients, activations, the optimizer
//     (fp32 or a bf16 master, Adam m and v) and fills the SessionState for it.
//
// How a chapter adopts it (its per-step loop stays in the first screen of its train()):
//
//     Session s;
//     session_open(&s, args, rows);            // or session_init(&s, args, rows, 1): 00/02/03
//     ... build the chapter's state (a shard, a TP slice, stages) ...
//     s.state = (SessionState){&mine, my_save, my_weights_to_host, my_load};
//     session_start_at(&s, my_load_or_init(&mine));  // --resume, --load-weights or fresh
//     for (int step = s.start; step < s.end; step = session_next_step(&s, step)) {
//         session_step_begin(&s, step);        // --kill-rank/--kill-step, --inject-oom-step; the clock
//         ... batch, forward, backward, communication ...
//         if (session_nan_due(&s, step, who)) session_poison(grad, s.bf16);  // --inject-nan-step
//         if (session_may_update(&s, step, loss)) {  // --on-spike: the same answer on every rank
//             ... clip (NaN/Inf: adamw_clip_scale stops, or skips: --on-nan), AdamW ...
//             session_grad_norm_sq(&s, norm_sq);  // the global squared norm clipping was given
//         }
//         session_phase(&s, "comm", t);        // (optional) the step's phases, for --log
//         session_step_end(&s, step, loss);    // loss, progress line, checkpoint, a rollback
//     }
//     session_finish(&s);                      // final checkpoint, final weights, --trace
//     ... the chapter's per-rank figures: session_gather_report, session_print_rank_table ...
//     if (args->dump) { session_dump_open(&s, &out); results_set(...); session_dump_close(...); }
//     ... free the chapter's state ...
//     session_free(&s);
//
// The progress line is the health line (health.h): loss, the grad norm before clipping, each
// with its z-score over the last HEALTH_WINDOW steps, lr, tokens/s, MFU; --log writes the same
// and more (phases, the bytes this rank sent) as one JSON line per step.
//
// World rank 0 is the writer: it prints the progress line, writes --log, owns s.host_params and
// the --dump file; state.save runs on EVERY rank (a sharded state gathers collectively) and the chapter
// decides who writes the file. The step's loss passed to session_step_end must be the global
// one on rank 0.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "dist.h"
#include "flags.h"
#include "gpt2.h"
#include "health.h"
#include "optim.h"
#include "results.h"

// The chapter's training state, as the loop sees it. ctx is the chapter's.
typedef struct SessionState {
    void *ctx;
    // Write the training state after `step` steps (weights, Adam m and v, the step) to path.
    // Called on every rank, at the same steps; collective where the state is sharded.
    void (*save)(void *ctx, const char *path, int step);
    // The final weights the forward reads, fp32, in llm.c's order (cfg's n parameters), into
    // full on world rank 0. Called on every rank (collective); full is NULL elsewhere.
    void (*weights_to_host)(void *ctx, float *full);
    // Read the training state a --resume of args names (what save wrote) back into this rank's
    // part: the chapter's --resume code. The loop calls it mid-run for a rollback (--on-spike
    // rollback) with the run's arguments as a --resume of the last checkpoint. Called on every
    // rank (collective); returns the state's step, on world rank 0 at least. NULL: the chapter
    // cannot roll back.
    int (*load)(void *ctx, const LabArgs *args);
} SessionState;

// Why a step's update was skipped (Session.skipped; --log's "skipped").
typedef enum { SKIP_NONE, SKIP_NAN, SKIP_SPIKE, SKIP_ROLLBACK } SessionSkip;
#define SESSION_MAX_ROLLBACKS 16

typedef struct Session {
    // --- the loop (session_open) ---
    const LabArgs *args;
    GPT2Config cfg;
    Device dev;
    int bf16;              // --dtype bf16: mixed precision (common/train.h)
    DistGroup *world;
    int rank, N;
    size_t n;              // parameters of the whole model
    AdamW opt;             // the schedule (the progress line's lr; the chapters' AdamW)
    DataSource data;       // the global batch of step s is a pure function of (data seed, s)
    int rows, T;           // this rank's batch buffers are (rows, T) (none when rows = 0)
    int *inputs, *targets;
    int start, end;        // steps [start, end) run here (resume, --steps, --stop-at)
    float *losses;         // (--steps) the loss of every step; NaN where not run here
    double t_start, t_last;  // wall clock at the loop's start / at the last step's end
    double link_held0, link_hidden0;  // --links: this process's held link time when the loop began
    DistGroup *link_group[3];  // --links: the chapter's TP, DP, PP groups (session_watch_links)
    double link_mark[3][2];    // their held and hidden seconds at the loop's first step
    double link_loop[3][2];    // and over the loop (to its last step's end)
    double link_total_loop[2]; // this process's held and hidden seconds over the loop
    SessionState state;    // the chapter's (session_init: the single replica's)
    DistCounters save_cost;  // what the checkpoints (and a rollback's load) moved: leave it out
                             // of per-step figures
    float *host_params;    // (n) final weights as fp32 on rank 0 (session_finish, when --dump,
                           // --save-weights or --sample reads them), else NULL
    int saves;             // checkpoints written (state.save), and the time training was blocked
    double save_stall_s;   // in them (with --async-save the write itself goes on in the background)
    double last_save_t;    // wall clock of the last checkpoint (--save-every-min), or the start
    float *val_weights;    // (n) --val-every: the whole model gathered for validation (rank 0)
    int val_done;          // --val-every: validations so far; val_last the latest loss (rank 0;
    double val_last;       // the --dump's "val_loss")
    // --- health (rank 0 computes it; health.h) ---
    FILE *log;             // --log, on rank 0
    int health;            // rank 0 prints progress lines or writes --log
    double peak;           // one device's FLOP/s (0: unknown), taken at session_start_at
    double flops;          // model FLOPs of one step of the global batch
    HealthWindow win_loss, win_gnorm;
    double gnorm_sq;       // this step's (session_grad_norm_sq); NaN until given
    HealthRecord rec;      // this step's phases so far
    uint64_t sent0;        // bytes this rank had sent at the step's start
    // --- the guard (session_guard.c): NaN/Inf and loss-spike policies, rollbacks ---
    SessionSkip skipped;   // this step's update was skipped, and why (SKIP_NONE: it ran)
    int nan_skips, spike_skips, window_skips, rollbacks;  // over the run (window: after a rollback)
    int ckpt_step;         // the step of the state --save holds (-1: none written yet)
    HealthWindow ckpt_win_loss, ckpt_win_gnorm;  // the windows as they were at ckpt_step
    int rollback_due;      // this step found a spike under --on-spike rollback
    int next;              // the step after this one when it is not step + 1 (a rollback), or -1
    int nwin;              // rollbacks' skipped steps: [win_lo[i], win_hi[i])
    int win_lo[SESSION_MAX_ROLLBACKS], win_hi[SESSION_MAX_ROLLBACKS];
    int lr_low_until;      // steps before it replay at --lr x --rollback-lr-scale (-1: none)
    float lr;              // --lr (s->opt.lr is lowered while a rollback replays)
    int step_now;          // the step between session_step_begin and session_step_end
    // --- the single replica (session_init; zero after session_open alone) ---
    GPT2 model;            // parameters, gradients, activations for (rows, T)
    DistDtype dt;          // the gradients' (and the forward weights') type: DIST_F32/DIST_BF16
    size_t e;              // bytes per element of dt: 4, or 2 in bf16
    GPT2Param *plist;      // the named parameter tensors (clipping and weight decay)
    int nplist;
    // The optimizer, where this rank has one (else all NULL): the weights AdamW updates (fp32:
    // the parameters themselves; bf16: an fp32 master copy), Adam's m and v.
    float *master, *opt_m, *opt_v;
} Session;

// ---- the loop ----

// The loop's part: selects the NCCL backend first when --backend nccl (it picks the rank's
// GPU), the world, the --trace file, the data, (rows, T) batch buffers, the losses. s->state
// is empty: the chapter sets it before the first step.
void session_open(Session *s, const LabArgs *args, int rows);
// The first step, the same on every rank, once the chapter has resumed, loaded or initialized
// its state; rank 0 says where it resumed, and a guarded run takes the state's guard record back
// (guard_resume: collective, every rank calls it).
void session_start_at(Session *s, int start);

// Top of a step: the fault hooks (--kill-rank R --kill-step S: rank R exits abruptly;
// --inject-hang R:S: rank R stops without dying, common/watchdog.h; --inject-oom-step R:S: an
// allocation fails on rank R); at the first step the loop's clock starts (progress line,
// session_elapsed).
void session_step_begin(Session *s, int step);
// The global squared gradient norm of this step, before clipping (what adamw_clip_scale was
// given): the health line shows its square root. On rank 0 at least.
void session_grad_norm_sq(Session *s, double norm_sq);
// `seconds` of this step spent in phase `name` (a string literal), for --log's time_s;
// repeated names add up. "step" (the whole step) is always there.
void session_phase(Session *s, const char *name, double seconds);
// --inject-nan-step: is this the step, and is this rank `who` (a rank of the world)?
int session_nan_due(const Session *s, int step, int who);
// A NaN into the first element of buf (fp32, or bf16 where bf16; host or device memory).
void session_poison(void *buf, int bf16);
// The end of a step: records the loss, prints the progress line (rank 0, every --log-every
// steps and the last), writes the periodic checkpoint (state.save, every --save-every), or,
// when the step found a spike under --on-spike rollback, rolls back (state.load).
void session_step_end(Session *s, int step, float loss);

// ---- the guard (session_guard.c): what a loss spike or a NaN does (the notes' 10.8) ----

// Whether this step may update the weights, the same answer on every rank (call it on every
// rank, after the step's loss is known, before the optimizer; loss: the step's global loss, on
// world rank 0 at least). World rank 0 holds the losses of the last --spike-window steps: a
// loss more than --spike-z standard deviations above their mean is a spike, and --on-spike
// says what follows: warn (1: update anyway), skip (0: no update on any rank; weights and Adam
// state untouched), rollback (0, and session_step_end goes back to the last checkpoint), or stop
// (the job ends with one message). Rank 0 decides once and broadcasts its verdict over the world
// (not with warn, which changes nothing). 0 also for the steps a rollback skips.
int session_may_update(Session *s, int step, float loss);
// The step the loop runs after `step`: step + 1, or after a rollback the checkpoint's.
int session_next_step(Session *s, int step);

// (the loop's side of the guard: session.c calls these at its own points)
void guard_open(Session *s);                  // session_open: nothing skipped, no checkpoint yet
void guard_start(Session *s);                 // session_start_at: rollback's first checkpoint
void guard_step_begin(Session *s, int step);  // --inject-oom-step; the lr after a replay
void guard_norm(Session *s, double norm_sq);  // session_grad_norm_sq: a NaN/Inf skip (--on-nan)
int guard_step_end(Session *s, int step, float loss);  // the windows; 1: rolled back
void guard_saved(Session *s, int step);       // --save now holds the state at step
void guard_to_ckpt(const Session *s);         // before a save: the record it writes (ckpt.h)
void guard_resume(Session *s);                // session_start_at: a --resume's record taken back
void guard_report(const Session *s);          // the run's skips, at the end (rank 0)
void session_links_note(Session *s, int end); // the watched groups' link time: 0 at the loop's
                                              // start, 1 at its last step's end

// The progress line, the same in every chapter, without the newline:
//   "step     i/N  loss L z Z  gnorm G z Z  lr LR  tok/s  MFU M%  ETA E s"
// from r (its step is 1-based); a z not yet known, a grad norm not given, an unknown MFU: "-".
int session_progress_line(char *buf, size_t len, int steps, const HealthRecord *r, double eta_s);

// After the loop: the final checkpoint (state.save, when --save; then every write finished and,
// with --async-save, --save-sharded, --keep-last or --save-every-min, the "checkpoints:" line:
// the time training was blocked per save against the whole save), the "learned:" line (rank 0,
// not --quiet: the last loss between ln V and the data's floor, and how far along it is), the
// final weights as fp32 on rank 0 (s->host_params; state.weights_to_host) when --dump,
// --save-weights or --sample reads them (a plain run skips that collective), the --trace file. All collective: read the run's byte counters before (or subtract s->save_cost).
void session_finish(Session *s);
double session_elapsed(const Session *s);  // seconds of the loop
int session_steps_run(const Session *s);   // end - start (0 when resuming at the end)

// --dump (rank 0): open fills the losses and final weights; add the chapter's figures with
// results_set; close adds the memory figures, writes the file and frees it.
void session_dump_open(const Session *s, RunResults *out);
void session_dump_close(const Session *s, RunResults *out);

// The per-rank report: every rank's `nfields` doubles gathered to rank 0 (rank-major; NULL on
// the other ranks; free it), and a table of chosen fields, one row per rank.
double *session_gather_report(const Session *s, const double *mine, int nfields);
typedef enum { COL_MS, COL_BYTES } SessionColumnKind;  // seconds shown as ms; bytes as KiB...
typedef struct SessionColumn {
    const char *title;
    int field;             // index into each rank's fields
    SessionColumnKind kind;
} SessionColumn;
// rank0_note: appended to rank 0's label ("master"), or NULL.
void session_print_rank_table(const char *title, const SessionColumn *cols, int ncols,
                              const double *all, int nranks, int nfields, const char *rank0_note);
// "N steps in T s: X tokens/s" after the loop (rank 0, not --quiet, when steps ran here);
// all_ranks: the data-parallel chapters' form, "(all ranks), Y ms per step" added. Then the
// note when the ranks share cores (session_print_cores_note).
void session_print_throughput(const Session *s, int all_ranks);

// ---- --links: where the link time goes (session_links.c; docs/CLUSTER.md) ----

// The chapter's group along each dimension (NULL: none; 03, 05, 06 give only DP, 07 TP and DP,
// 08 PP, 09 all three). The loop notes each group's held and hidden link time
// (dist_link_held_seconds, dist_link_hidden_seconds) at its first step's start and at its last
// step's end, so that neither the setup's nor the report's collectives count. Any time before
// the first step; nothing happens without --links.
void session_watch_links(Session *s, DistGroup *tp, DistGroup *dp, DistGroup *pp);
// The table "link time per step on the virtual cluster", one row per watched dimension: its
// degree, inside a node or between nodes (calc_group_nodes of cs), held and hidden (the busiest
// rank's, a MAX all-reduce over the world; held - hidden is exposed), model (calc_rank_comm(cs,
// stage, replica)'s bytes and hops of this rank on that link: chapter 00's figure for the same
// traffic) and planner (the planner's estimate: TP and PP once per 1F1B slot, DP once per step,
// calc_traffic_slot_seconds); then the measured step (session_elapsed over the steps run). cs:
// the chapter's layout as chapter 00's calculator sees it. Collective over the world; prints on
// rank 0 unless --quiet; nothing (and no collective) without --links.
struct CalcSetup;
void session_print_links(const Session *s, const struct CalcSetup *cs, int stage, int replica);

// When this job's ranks share the machine's cores (health_cores_shared): the note that says
// so, naming the timing figures it makes meaningless (`figures`), on rank 0, not --quiet;
// nothing when every rank has its cores. The loop says it over the first progress line (its
// tok/s and MFU) and after session_print_throughput's line; a chapter says it under its own
// timing figures (08's idle and imbalance, 03's overlap, 02's per-rank times).
void session_print_cores_note(const Session *s, const char *figures);

// "GPT-2 V=.. T=.. L=.. C=.. NH=.., n parameters" for the chapters' first line.
const char *session_model_line(const Session *s, char *buf, size_t len);

// Frees what session_open/session_init allocated (the chapter frees its own state first).
void session_free(Session *s);

// ---- the single replica (00, 02, 03; 05 and 06 borrow its model) ----

// session_open, then the model (with gradients and activations for `rows` rows), optimizer
// state if has_optimizer (0: this rank has none, like 02's workers, or the chapter allocates
// its own, e.g. a shard), and s->state: rank 0 saves its master, m and v; rank 0's model gives
// the final weights.
void session_init(Session *s, const LabArgs *args, int rows, int has_optimizer);
// The starting weights into s->master (then into the model): --resume (weights, Adam state and
// step), --load-weights, or fresh from `seed`. Returns the first step (also s->start; say it
// with session_start_at).
int session_load_or_init(Session *s, uint64_t seed);
// state.load of the replica (session_init sets it): the holder of the optimizer reads args'
// --resume (weights, Adam m and v); returns the state's step there, 0 elsewhere.
int session_replica_load(void *ctx, const LabArgs *args);
// --inject-nan-step into the replica's gradient, if this rank is `who`.
void session_inject_nan(Session *s, int step, int who);
