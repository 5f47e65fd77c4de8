// session.c: the one training loop skeleton, and the single replica 00, 02 and 03 train (see
// session.h).
#include "session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "mem.h"
#include "text.h"
#include "trace.h"
#include "train.h"
#include "watchdog.h"

// ---------------------------------------------------------------------------------------------
// the loop

void session_open(Session *s, const LabArgs *args, int rows) {
    memset(s, 0, sizeof *s);
    s->args = args;
    s->cfg = lab_args_config(args);
    s->dev = lab_args_device(args);
    s->bf16 = strcmp(args->dtype, "bf16") == 0;
    // NCCL (GPU buffers; flags.c checks --device cuda) picks this rank's GPU: before allocating
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);
    if (args->generate)  // (flags.c checked the file: chapter 00 reads it)
        lab_fail_collective("--generate samples from saved weights on one device: run it with "
                            "chapter 00 (./00_memory_budget/run --generate --resume FILE); a state "
                            "saved by any layout is the whole model");
    s->world = dist_world();
    s->rank = s->world->rank;
    s->N = s->world->size;
    s->n = gpt2_param_count(&s->cfg);
    s->rows = rows;
    s->T = s->cfg.T;
    trace_init(args->trace);
    s->opt = lab_args_adamw(args);
    lab_args_data(args, &s->data);
    if (rows > 0) {
        s->inputs = mem_alloc((size_t)rows * s->T * sizeof(int), MEM_OTHER, DEV_CPU);
        s->targets = mem_alloc((size_t)rows * s->T * sizeof(int), MEM_OTHER, DEV_CPU);
    }
    s->end = lab_args_end_step(args);
    s->losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    for (int i = 0; i < args->steps; i++) s->losses[i] = NAN;  // NaN: not run here
    s->health = s->rank == 0 && (args->log || (!args->quiet && args->log_every > 0));
    s->flops = gpt2_flops_per_step(&s->cfg, args->batch, s->T);
    health_window_init(&s->win_loss, args->spike_window);
    health_window_init(&s->win_gnorm, args->spike_window);
    guard_open(s);
    if (s->rank == 0 && args->log) {
        s->log = fopen(args->log, "w");  // a new run truncates it
        LAB_CHECK(s->log, "--log %s: cannot open for writing", args->log);
    }
}

void session_start_at(Session *s, int start) {
    s->start = start;
    // the peak for MFU, before the loop's clock starts (CPU: a few SGEMMs, ~0.1 s)
    if (s->health) s->peak = health_peak_flops(s->dev, s->bf16);
    if (s->args->resume && !s->args->quiet && s->rank == 0)
        printf("resumed from %s at step %d\n", s->args->resume, start);
    guard_resume(s);  // the spike detector's windows and the counts, as the state saved them
    guard_start(s);  // --on-spike rollback: the state to go back to, written now
}

void session_print_cores_note(const Session *s, const char *figures) {
    char note[512];
    if (s->args->quiet || s->rank != 0) return;
    if (*health_cores_note(note, sizeof note, s->args->threads, figures)) {
        printf("%s\n", note);
        fflush(stdout);
    }
}

void session_step_begin(Session *s, int step) {
    if (step == s->args->kill_step && s->rank == s->args->kill_rank) {
        fprintf(stderr, "[rank %d] --kill-rank: exiting abruptly at step %d\n", s->rank, step);
        fflush(stderr);
        _exit(1);
    }
    s->step_now = step;
    guard_step_begin(s, step);  // --inject-oom-step; the lr back to --lr after a replay
    watchdog_note_step(step);  // (a hang's diagnosis says which step each rank is in)
    if (step == s->args->hang_step && s->rank == s->args->hang_rank)
        watchdog_inject_hang(step, s->args->hang_seconds);  // --inject-hang: stops, or is slow
    if (step == s->start) {  // under the chapter's header, over the first progress line
        if (s->args->log_every > 0)
            session_print_cores_note(s, "the tok/s and MFU of the progress lines");
        if (s->rank == 0 && !s->args->quiet) dist_links_print(stdout);  // --links: the cluster
        if (dist_links_enabled()) dist_link_totals(&s->link_held0, &s->link_hidden0);
        session_links_note(s, 0);  // (each watched group's, --links)
        s->t_start = s->t_last = lab_now();  // the loop's clock starts
    }
    s->gnorm_sq = NAN;
    if (!s->health) return;
    s->rec.nphases = 1;  // "step", at the end
    s->sent0 = dist_bytes_sent();
}

void session_grad_norm_sq(Session *s, double norm_sq) {
    s->gnorm_sq = norm_sq;
    guard_norm(s, norm_sq);  // not finite: the update was skipped (--on-nan skip), counted
}

void session_phase(Session *s, const char *name, double seconds) {
    HealthRecord *r = &s->rec;
    if (!s->health) return;
    for (int i = 1; i < r->nphases; i++)
        if (strcmp(r->phase_name[i], name) == 0) {
            r->phase_s[i] += seconds;
            return;
        }
    LAB_CHECK(r->nphases < HEALTH_MAX_PHASES, "session_phase: more than %d phases",
              HEALTH_MAX_PHASES - 1);
    r->phase_name[r->nphases] = name;
    r->phase_s[r->nphases++] = seconds;
}

int session_nan_due(const Session *s, int step, int who) {
    return step == s->args->inject_nan_step && s->rank == who;
}

void session_poison(void *buf, int bf16) {
    float nan = NAN;
    uint16_t nan16 = 0x7fc0;  // bf16's quiet NaN
    if (bf16) mem_copy(buf, &nan16, sizeof nan16);
    else mem_copy(buf, &nan, sizeof nan);
}

// what the world moved since `before` into s->save_cost: not a step's
static void count_aside(Session *s, const DistCounters *before) {
    dist_counters_add_since(&s->save_cost, before);
}

// state.save on every rank; what it moves is counted apart (s->save_cost). The previous save is
// completed first (ckpt_settle: its background write, a sharded save's manifest); without
// --async-save this one is completed now. The time here is what training waited (the stall).
static void save_state(Session *s, int step) {
    LAB_CHECK(s->state.save, "--save: the chapter gave the session no way to save its state");
    const double t0 = lab_now();
    DistCounters before = *dist_counters();
    ckpt_settle();
    guard_to_ckpt(s);  // (the guard's record goes into the state: a resume decides the same)
    s->state.save(s->state.ctx, s->args->save, step);
    if (!ckpt_policy().async) ckpt_settle();
    count_aside(s, &before);
    s->last_save_t = lab_now();
    s->save_stall_s += s->last_save_t - t0;
    s->saves++;
    guard_saved(s, step);
}

// --save-every N, or --save-every-min X: the clock of rank 0 decides, once, for every rank
static int save_due(Session *s, int step) {
    const LabArgs *a = s->args;
    int due = a->save_every > 0 && (step + 1) % a->save_every == 0;
    if (a->save_every_min > 0) {
        if (s->last_save_t == 0) s->last_save_t = s->t_start;
        int late = s->rank == 0 && lab_now() - s->last_save_t >= 60.0 * a->save_every_min;
        DistCounters before = *dist_counters();
        if (s->N > 1) dist_broadcast(&late, 1, DIST_I32, 0, s->world);
        count_aside(s, &before);
        due = due || late;
    }
    return due;
}

// The checkpoints' cost, when the run asked for more than one file replaced (rank 0): the time
// training was blocked per save, against what the whole save took.
static void print_save_cost(const Session *s) {
    const LabArgs *a = s->args;
    const CkptPolicy pol = ckpt_policy();
    if (a->quiet || s->rank != 0 || s->saves == 0 ||
        !(pol.async || pol.sharded || pol.keep_last || a->save_every_min > 0))
        return;
    const CkptStats st = ckpt_stats();
    const double stall = 1e3 * s->save_stall_s / s->saves;
    const double write = st.writes ? 1e3 * st.write_s / s->saves : 0;
    char how[160];
    snprintf(how, sizeof how, "%s%s", pol.sharded ? "sharded: rank 0 wrote its shard and the manifest"
             : "one file from rank 0", pol.async ? ", in a background thread" : "");
    if (pol.async)
        printf("checkpoints: %d saves, training blocked %.1f ms per save (the snapshot); the whole "
               "save %.1f ms (its write %.1f ms went on while training ran; %s)\n", s->saves,
               stall, stall + write, write, how);
    else
        printf("checkpoints: %d saves, training blocked %.1f ms per save: the whole save (%s)\n",
               s->saves, stall, how);
    fflush(stdout);
}

// --val-every (common/text.h): the whole model gathered to world rank 0 by the chapter's
// weights_to_host (collective: every rank calls it), then the held-out batches' loss there.
// What the gather moves is counted apart, like a checkpoint's.
static double validate(Session *s) {
    LAB_CHECK(s->state.weights_to_host, "--val-every: the chapter gave the session no way to "
              "gather its weights");
    if (s->rank == 0 && !s->val_weights) s->val_weights = lab_xmalloc(s->n * sizeof(float));
    DistCounters before = *dist_counters();
    MemPeaks peaks = mem_peaks_save();  // the gather's buffers are not the run's memory either
    s->state.weights_to_host(s->state.ctx, s->rank == 0 ? s->val_weights : NULL);
    mem_peaks_restore(&peaks);
    count_aside(s, &before);
    if (s->rank != 0) return NAN;
    s->val_done++;
    s->val_last = text_val_loss(&s->cfg, s->val_weights, &s->data, s->args->batch, s->T);
    return s->val_last;
}

// a z-score in 5 columns ("-" not yet; clamped so the columns stay aligned)
static const char *fmt_z(char *buf, size_t len, double z) {
    if (isnan(z)) snprintf(buf, len, "%5s", "-");
    else snprintf(buf, len, "%+5.1f", fmax(-99.9, fmin(99.9, z)));
    return buf;
}

int session_progress_line(char *buf, size_t len, int steps, const HealthRecord *r, double eta_s) {
    char zl[16], zg[16], g[16], mfu[16];
    if (isnan(r->grad_norm)) snprintf(g, sizeof g, "%8s", "-");
    else snprintf(g, sizeof g, "%8.4f", r->grad_norm);
    if (isnan(r->mfu)) snprintf(mfu, sizeof mfu, "%5s", "-");
    else snprintf(mfu, sizeof mfu, "%4.1f%%", 100.0 * r->mfu);
    return snprintf(buf, len,
                    "step %5d/%d  loss %.4f z %s  gnorm %s z %s  lr %.2e  %7.0f tok/s  MFU %s  "
                    "ETA %5.1f s",
                    r->step, steps, r->loss, fmt_z(zl, sizeof zl, r->z_loss), g,
                    fmt_z(zg, sizeof zg, r->z_grad_norm), r->lr, r->tokens_per_s, mfu, eta_s);
}

// This step's health record (rank 0): the z-scores against the steps before it (the guard
// pushes this step into the windows after, unless it was skipped as a spike)
static void health_step(Session *s, int step, float loss, double now) {
    static const char *skip_name[] = {NULL, "nan", "spike", "rollback"};
    HealthRecord *r = &s->rec;
    const double dt = now - s->t_last, gnorm = sqrt(s->gnorm_sq);
    r->step = step + 1;
    r->loss = loss;
    r->grad_norm = gnorm;
    r->clipped = s->opt.grad_clip > 0.0f && gnorm > (double)s->opt.grad_clip;  // as adamw_clip_scale
    r->lr = adamw_lr(&s->opt, step);
    r->tokens_per_s = (double)s->args->batch * s->T / dt;
    r->flops = s->flops;
    r->peak_flops = s->peak;
    r->mfu = health_mfu(s->flops, dt, s->peak, s->N);
    r->z_loss = health_z(&s->win_loss, loss);
    r->z_grad_norm = health_z(&s->win_gnorm, gnorm);
    r->skipped = skip_name[s->skipped];
    r->nan_skips = s->nan_skips;
    r->spike_skips = s->spike_skips;
    r->rollback_skips = s->window_skips;
    r->rollbacks = s->rollbacks;
    r->phase_name[0] = "step";
    r->phase_s[0] = dt;
    const uint64_t sent = dist_bytes_sent();  // a counter reset inside the step: count from 0
    r->sent = (double)(sent >= s->sent0 ? sent - s->sent0 : sent);
}

void session_step_end(Session *s, int step, float loss) {
    const LabArgs *a = s->args;
    s->losses[step] = loss;
    double now = lab_now();
    int last = step == s->end - 1;
    if (last) session_links_note(s, 1);  // the loop's link time, before validation
    if (s->health) health_step(s, step, loss, now);
    const int val_due = a->val_every > 0 && ((step + 1) % a->val_every == 0 || last);
    s->rec.has_val = val_due;
    if (val_due) s->rec.val_loss = validate(s);  // (rank 0's; after the step's byte figures)
    if (s->health && s->log) health_log_line(s->log, &s->rec);
    if (!a->quiet && s->rank == 0 && a->log_every > 0 && (step % a->log_every == 0 || last)) {
        double per_step = (now - s->t_start) / (step - s->start + 1);
        char line[200];
        session_progress_line(line, sizeof line, a->steps, &s->rec, per_step * (a->steps - step - 1));
        printf("%s\n", line);
        fflush(stdout);
    }
    if (val_due && !a->quiet && s->rank == 0) {
        printf("val   %5d/%d  loss %.4f  (%d held-out batches of %d x %d)\n", step + 1, a->steps,
               s->rec.val_loss, TEXT_VAL_BATCHES, a->batch, s->T);
        fflush(stdout);
    }
    s->t_last = val_due ? lab_now() : now;  // (the next step's time leaves the validation out)
    if (guard_step_end(s, step, loss)) return;  // the windows; rolled back: no checkpoint now
    // the periodic checkpoint (the final one: session_finish)
    if (a->save && (a->save_every > 0 || a->save_every_min > 0) && !last && save_due(s, step))
        save_state(s, step + 1);
}

double session_elapsed(const Session *s) { return s->end > s->start ? s->t_last - s->t_start : 0; }
int session_steps_run(const Session *s) { return s->end > s->start ? s->end - s->start : 0; }

// Did it learn? The last step's loss between ln V (a uniform guess, the loss at initialization)
// and the floor of the data (the synthetic source's entropy; a text file's is not known), and
// how far along that way the run got. Rank 0 (its loss is the global one), not --quiet.
static void print_learned(const Session *s) {
    if (s->args->quiet || s->rank != 0 || session_steps_run(s) == 0) return;
    const double loss = s->losses[s->end - 1], lnV = log((double)s->cfg.V);
    if (s->data.is_file) {
        printf("learned: loss %.4f at step %d/%d, from ln V = %.4f (a uniform guess); a text "
               "file's floor is not known\n", loss, s->end, s->args->steps, lnV);
        return;
    }
    const double floor = data_loss_floor(&s->data, s->T);
    printf("learned: loss %.4f at step %d/%d, %.1f %% of the way from ln V = %.4f (a uniform "
           "guess) to the data's floor %.4f (T=%d)\n", loss, s->end, s->args->steps,
           100.0 * (lnV - loss) / (lnV - floor), lnV, floor, s->T);
}

void session_finish(Session *s) {
    const LabArgs *a = s->args;
    guard_report(s);  // the updates skipped (NaN/Inf, spikes) and the rollbacks, if any
    if (a->save) {
        save_state(s, s->end);
        if (!a->quiet && s->rank == 0)
            printf("saved training state (step %d) to %s\n", s->end, a->save);
    }
    if (a->save) {  // the last save complete (with --async-save: its write joined)
        DistCounters before = *dist_counters();
        ckpt_settle();
        count_aside(s, &before);
        print_save_cost(s);
    }
    print_learned(s);
    // The whole final weights only when something reads them: gathering them is a collective
    // over every rank (in 09 a sum of the whole model over the world), wasted on a plain run.
    const int weights_wanted = a->dump || a->save_weights || a->sample > 0;
    if (s->state.weights_to_host && weights_wanted) {
        if (s->rank == 0) s->host_params = lab_xmalloc(s->n * sizeof(float));
        s->state.weights_to_host(s->state.ctx, s->host_params);
        if (s->rank == 0 && a->save_weights)
            ckpt_save_weights(a->save_weights, &s->cfg, s->host_params);
        if (s->rank == 0 && a->sample > 0) {  // --sample: on rank 0, from the whole model
            TextSampling sp = {a->sample, a->temperature, a->top_k, (uint64_t)a->sample_seed};
            uint8_t *text = lab_xmalloc((size_t)a->sample);
            double seconds = text_sample(&s->cfg, s->host_params, &sp, text);
            if (!a->quiet)
                text_print_sample(&sp, text, seconds, s->N > 1 ? "on rank 0 from the whole model "
                                  "(gathered by the chapter's whole <-> slice path)" : "on rank 0");
            free(text);
        }
    }
    trace_finish();
}

void session_dump_open(const Session *s, RunResults *out) {
    LAB_CHECK(s->host_params, "session_dump_open before session_finish, or not on rank 0");
    results_init(out, s->end, s->n);
    memcpy(out->losses, s->losses, (size_t)s->end * sizeof(float));
    memcpy(out->params, s->host_params, s->n * sizeof(float));
    if (s->val_done) results_set(out, "val_loss", s->val_last);  // --val-every: the last one
}

void session_dump_close(const Session *s, RunResults *out) {
    results_set_memory(out);
    results_write(s->args->dump, out);
    results_free(out);
}

double *session_gather_report(const Session *s, const double *mine, int nfields) {
    double *all = s->rank == 0 ? lab_xcalloc((size_t)s->N * (size_t)nfields, sizeof(double)) : NULL;
    dist_gather(mine, all, (size_t)nfields, DIST_F64, 0, s->world);
    return all;
}

void session_print_rank_table(const char *title, const SessionColumn *cols, int ncols,
                              const double *all, int nranks, int nfields, const char *rank0_note) {
    printf("\n%s\n  %-10s", title, "rank");
    for (int c = 0; c < ncols; c++) printf(" %11s", cols[c].title);
    printf("\n");
    for (int r = 0; r < nranks; r++) {
        char who[32];
        if (r == 0 && rank0_note) snprintf(who, sizeof who, "0 (%s)", rank0_note);
        else snprintf(who, sizeof who, "%d", r);
        printf("  %-10s", who);
        for (int c = 0; c < ncols; c++) {
            double v = all[(size_t)r * (size_t)nfields + (size_t)cols[c].field];
            char cell[32];
            if (cols[c].kind == COL_MS) snprintf(cell, sizeof cell, "%.1f ms", 1e3 * v);
            else mem_format(cell, sizeof cell, v);
            printf(" %11s", cell);
        }
        printf("\n");
    }
}

const char *session_model_line(const Session *s, char *buf, size_t len) {
    snprintf(buf, len, "GPT-2 V=%d T=%d L=%d C=%d NH=%d, %zu parameters", s->cfg.V, s->cfg.T,
             s->cfg.L, s->cfg.C, s->cfg.NH, s->n);
    return buf;
}

void session_print_throughput(const Session *s, int all_ranks) {
    const int nrun = session_steps_run(s);
    if (s->args->quiet || s->rank != 0 || nrun == 0) return;
    double elapsed = session_elapsed(s);
    printf("%d steps in %.2f s: %.0f tokens/s", nrun, elapsed,
           (double)s->args->batch * s->T * nrun / elapsed);
    if (all_ranks) printf(" (all ranks), %.1f ms per step", 1e3 * elapsed / nrun);
    printf("\n");
    if (dist_links_enabled()) {   // --links: rank 0's link time (docs/CLUSTER.md)
        // (over the loop: to its last step's end, not what the report's collectives add)
        const double held = s->link_total_loop[0], hidden = s->link_total_loop[1];
        printf("virtual links: rank 0 was held %.3f ms per step for its messages' link time, %.3f "
               "ms exposed on its path and %.3f ms hidden behind compute (the communication "
               "thread)\n", 1e3 * held / nrun, 1e3 * (held - hidden) / nrun, 1e3 * hidden / nrun);
    }
    session_print_cores_note(s, all_ranks ? "the tokens/s and ms per step figures"
                                          : "the tokens/s figures");
}

void session_free(Session *s) {
    if (s->log) fclose(s->log);
    free(s->host_params);
    free(s->val_weights);
    free(s->losses);
    free(s->plist);
    data_free(&s->data);
    if (s->master) train_master_free(&s->model, s->master);  // before gpt2_free (fp32: params)
    if (s->model.num_params) gpt2_free(&s->model);
    mem_free(s->opt_m);
    mem_free(s->opt_v);
    mem_free(s->inputs);
    mem_free(s->targets);
    memset(s, 0, sizeof *s);
}

// ---------------------------------------------------------------------------------------------
// the single replica

// Rank 0 holds the state (00, 03: every rank holds the same; 02: the master alone): its fp32
// weights (bf16: the master, so a resume is exact), Adam m and v.
static void replica_save(void *ctx, const char *path, int step) {
    Session *s = ctx;
    if (s->rank != 0) return;
    LAB_CHECK(s->master, "--save: rank 0 holds no optimizer state");
    const LabArgs *a = s->args;
    ckpt_save_training(path, &s->cfg, step, (uint64_t)a->seed, (uint64_t)a->data_seed, s->master,
                       s->opt_m, s->opt_v, s->n);
}

// the weights the forward pass reads (bf16: widened; the training state keeps the master)
static void replica_weights(void *ctx, float *full) {
    Session *s = ctx;
    if (s->rank == 0) train_params_to_host(&s->model, full);
}

void session_init(Session *s, const LabArgs *args, int rows, int has_optimizer) {
    session_open(s, args, rows);
    gpt2_build_dtype(&s->model, s->cfg, s->dev, s->bf16 ? GPT2_BF16 : GPT2_FP32);
    gpt2_alloc_grads(&s->model);
    gpt2_set_recompute(&s->model, lab_args_recompute(args), rows, s->T);  // (none: nothing)
    gpt2_alloc_acts(&s->model, rows, s->T);
    LAB_CHECK(s->model.num_params == s->n, "session_init: the model has %zu parameters, not %zu",
              s->model.num_params, s->n);
    s->dt = train_dtype(&s->model);
    s->e = dist_dtype_size(s->dt);
    s->plist = lab_xcalloc((size_t)gpt2_params(&s->cfg, NULL), sizeof(GPT2Param));
    s->nplist = gpt2_params(&s->cfg, s->plist);
    if (has_optimizer) {
        s->master = train_master_alloc(&s->model);
        s->opt_m = mem_alloc(s->n * sizeof(float), MEM_OPT_M, s->dev);
        s->opt_v = mem_alloc(s->n * sizeof(float), MEM_OPT_V, s->dev);
    }
    s->state = (SessionState){s, replica_save, replica_weights, session_replica_load};
}

// --resume path, --load-weights, or fresh: the master, then the weights the forward reads
static int replica_load_or_init(Session *s, const LabArgs *a, uint64_t seed) {
    LAB_CHECK(s->master, "session_load_or_init on a rank without an optimizer");
    int start = 0;
    if (a->resume) {
        start = ckpt_resume_training(a->resume, &s->cfg, s->master, s->opt_m, s->opt_v, s->n);
    } else if (a->load_weights) {
        ckpt_load_weights_into(a->load_weights, &s->cfg, s->master, s->n);
    } else {
        train_master_init(&s->model, s->master, seed);
    }
    // bf16: the weights the forward pass reads are the master rounded to nearest even
    train_master_to_model(&s->model, s->master);
    return start;
}

int session_load_or_init(Session *s, uint64_t seed) {
    s->start = replica_load_or_init(s, s->args, seed);
    return s->start;
}

int session_replica_load(void *ctx, const LabArgs *args) {
    Session *s = ctx;
    if (!s->master) return 0;  // 02's workers: the master's weights come every step
    return replica_load_or_init(s, args, 0);
}

void session_inject_nan(Session *s, int step, int who) {
    if (session_nan_due(s, step, who)) train_inject_nan(&s->model);
}
