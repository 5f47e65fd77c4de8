// session.c: the setup and reporting every training chapter repeats (see session.h).
#include "session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "mem.h"
#include "trace.h"
#include "train.h"

void session_init(Session *s, const LabArgs *args, int rows, int has_optimizer) {
    memset(s, 0, sizeof *s);
    s->args = args;
    s->cfg = lab_args_config(args);
    s->dev = lab_args_device(args);
    s->bf16 = strcmp(args->dtype, "bf16") == 0;
    // NCCL (GPU buffers; flags.c checks --device cuda) picks this rank's GPU: before allocating
    if (strcmp(args->backend, "nccl") == 0) dist_set_backend(DIST_BACKEND_NCCL);
    s->world = dist_world();
    s->rank = s->world->rank;
    s->N = s->world->size;
    s->rows = rows;
    s->T = s->cfg.T;
    trace_init(args->trace);

    gpt2_build_dtype(&s->model, s->cfg, s->dev, s->bf16 ? GPT2_BF16 : GPT2_FP32);
    gpt2_alloc_grads(&s->model);
    gpt2_alloc_acts(&s->model, rows, s->T);
    s->n = s->model.num_params;
    s->dt = train_dtype(&s->model);
    s->e = dist_dtype_size(s->dt);
    s->plist = lab_xcalloc((size_t)gpt2_params(&s->cfg, NULL), sizeof(GPT2Param));
    s->nplist = gpt2_params(&s->cfg, s->plist);

    if (has_optimizer) {
        s->master = train_master_alloc(&s->model);
        s->opt_m = mem_alloc(s->n * sizeof(float), MEM_OPT_M, s->dev);
        s->opt_v = mem_alloc(s->n * sizeof(float), MEM_OPT_V, s->dev);
    }
    s->opt = lab_args_adamw(args);

    lab_args_data(args, &s->data);
    s->inputs = mem_alloc((size_t)rows * s->T * sizeof(int), MEM_OTHER, DEV_CPU);
    s->targets = mem_alloc((size_t)rows * s->T * sizeof(int), MEM_OTHER, DEV_CPU);

    s->end = lab_args_end_step(args);
    s->losses = lab_xcalloc((size_t)args->steps, sizeof(float));
    for (int i = 0; i < args->steps; i++) s->losses[i] = NAN;  // NaN: not run here
}

int session_load_or_init(Session *s, uint64_t seed) {
    const LabArgs *a = s->args;
    LAB_CHECK(s->master, "session_load_or_init on a rank without an optimizer");
    s->start = 0;
    if (a->resume) {
        s->start = ckpt_resume_training(a->resume, &s->cfg, s->master, s->opt_m, s->opt_v, s->n);
        if (!a->quiet) printf("resumed from %s at step %d\n", a->resume, s->start);
    } else if (a->load_weights) {
        ckpt_load_weights_into(a->load_weights, &s->cfg, s->master, s->n);
    } else {
        train_master_init(&s->model, s->master, seed);
    }
    // bf16: the weights the forward pass reads are the master rounded to nearest even
    train_master_to_model(&s->model, s->master);
    return s->start;
}

void session_step_begin(Session *s, int step) {
    if (step == s->args->kill_step && s->rank == s->args->kill_rank) {
        fprintf(stderr, "[rank %d] --kill-rank: exiting abruptly at step %d\n", s->rank, step);
        fflush(stderr);
        _exit(1);
    }
    if (step == s->start) s->t_start = s->t_last = lab_now();  // the loop's clock starts
}

void session_inject_nan(Session *s, int step, int who) {
    if (step == s->args->inject_nan_step && s->rank == who) train_inject_nan(&s->model);
}

static void save_state(const Session *s, int step) {
    const LabArgs *a = s->args;
    ckpt_save_training(a->save, &s->cfg, step, (uint64_t)a->seed, (uint64_t)a->data_seed,
                       s->master, s->opt_m, s->opt_v, s->n);
}

void session_step_end(Session *s, int step, float loss) {
    const LabArgs *a = s->args;
    s->losses[step] = loss;
    double now = lab_now();
    int last = step == s->end - 1;
    if (!a->quiet && s->rank == 0 && a->log_every > 0 && (step % a->log_every == 0 || last)) {
        double per_step = (now - s->t_start) / (step - s->start + 1);
        printf("step %5d/%d  loss %.4f  lr %.2e  %8.0f tok/s  ETA %5.1f s\n", step + 1, a->steps,
               loss, adamw_lr(&s->opt, step), (double)a->batch * s->T / (now - s->t_last),
               per_step * (a->steps - step - 1));
        fflush(stdout);
    }
    s->t_last = now;
    // periodic checkpoint (the final one: session_finish); bf16: the state holds the fp32
    // master weights, so a resume is exact
    if (s->rank == 0 && a->save && a->save_every > 0 && (step + 1) % a->save_every == 0 && !last)
        save_state(s, step + 1);
}

double session_elapsed(const Session *s) { return s->end > s->start ? s->t_last - s->t_start : 0; }
int session_steps_run(const Session *s) { return s->end > s->start ? s->end - s->start : 0; }

void session_finish(Session *s) {
    const LabArgs *a = s->args;
    if (s->rank == 0) {
        if (a->save) {
            save_state(s, s->end);
            if (!a->quiet) printf("saved training state (step %d) to %s\n", s->end, a->save);
        }
        // the weights the forward pass reads (bf16: widened; the training state keeps the master)
        s->host_params = lab_xmalloc(s->n * sizeof(float));
        train_params_to_host(&s->model, s->host_params);
        if (a->save_weights) ckpt_save_weights(a->save_weights, &s->cfg, s->host_params);
    }
    trace_finish();
}

void session_dump_open(const Session *s, RunResults *out) {
    LAB_CHECK(s->host_params, "session_dump_open before session_finish, or not on rank 0");
    results_init(out, s->end, s->n);
    memcpy(out->losses, s->losses, (size_t)s->end * sizeof(float));
    memcpy(out->params, s->host_params, s->n * sizeof(float));
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

void session_free(Session *s) {
    free(s->host_params);
    free(s->losses);
    free(s->plist);
    data_free(&s->data);
    if (s->master) train_master_free(&s->model, s->master);  // before gpt2_free (fp32: params)
    gpt2_free(&s->model);
    mem_free(s->opt_m);
    mem_free(s->opt_v);
    mem_free(s->inputs);
    mem_free(s->targets);
    memset(s, 0, sizeof *s);
}
