// schedule.c: the pipeline schedule tables, their check, simulator, theory and picture
// (see schedule.h).
#include "schedule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static void sched_alloc(Schedule *s, const char *name, int p, int v, int m, int split) {
    if (p < 1 || p > SCHED_MAX_STAGES)
        lab_fail_collective("pipeline: %d stages; valid: 1 .. %d", p, SCHED_MAX_STAGES);
    if (v < 1) lab_fail_collective("pipeline: --chunks %d; valid: 1 or more", v);
    if (m < 1) lab_fail_collective("pipeline: --micro-batches %d; valid: 1 or more", m);
    memset(s, 0, sizeof *s);
    s->name = name;
    s->p = p, s->v = v, s->m = m, s->split = split;
    for (int r = 0; r < p; r++)
        s->ops[r] = lab_xcalloc((size_t)m * (size_t)v * 3, sizeof(PipeOp));
}

static void push(Schedule *s, int r, PipeOpKind kind, int mb, int chunk) {
    s->ops[r][s->nops[r]++] = (PipeOp){kind, mb, chunk};
}

void sched_free(Schedule *s) {
    for (int r = 0; r < s->p; r++) free(s->ops[r]);
    memset(s, 0, sizeof *s);
}

// GPipe: every forward, then every backward. All m activation sets are alive at the turn.
void sched_gpipe(Schedule *s, int p, int m) {
    sched_alloc(s, "gpipe", p, 1, m, 0);
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < m; i++) push(s, r, PIPE_F, i, 0);
        for (int i = 0; i < m; i++) push(s, r, PIPE_B, i, 0);
    }
}

// 1F1B (PipeDream-Flush): stage r runs p-r-1 warm-up forwards (as many as fit before the first
// backward can come back), then alternates one forward and one backward, then drains the
// remaining backwards. At most p-r activation sets are alive on stage r (min(p-r, m)).
void sched_1f1b(Schedule *s, int p, int m) {
    sched_alloc(s, "1f1b", p, 1, m, 0);
    for (int r = 0; r < p; r++) {
        int warmup = 0;
        // EXERCISE 08.1 The 1F1B table -> 08_pipeline/README.md#exercise-081-the-1f1b-table
        // warm-up: the forwards that run before the last stage can return the first gradient
        warmup = p - r - 1 < m ? p - r - 1 : m;
        for (int i = 0; i < warmup; i++) push(s, r, PIPE_F, i, 0);
        // steady state: one forward, one backward (the oldest micro-batch first)
        for (int i = 0; i < m - warmup; i++) {
            push(s, r, PIPE_F, warmup + i, 0);
            push(s, r, PIPE_B, i, 0);
        }
        // cool-down: the backwards of the warm-up micro-batches
        for (int i = m - warmup; i < m; i++) push(s, r, PIPE_B, i, 0);
        // END EXERCISE 08.1
        (void)warmup;
    }
}

int interleaved_chunk(int k, int p, int v, int forward) {
    int c = 0;
    // EXERCISE 08.2 The interleaved chunk order -> 08_pipeline/README.md#exercise-082-the-interleaved-chunk-order
    // Micro-batches go through in groups of p: the group's p forwards on chunk 0, then on
    // chunk 1, ..., chunk v-1, then the next group. Backwards visit the chunks in reverse.
    c = (k % (p * v)) / p;
    if (!forward) c = v - 1 - c;
    // END EXERCISE 08.2
    return c;
}

int interleaved_mb(int k, int p, int v) { return (k / (p * v)) * p + k % p; }

// Megatron's warm-up: rank r must run (p-r-1) forwards more than the last rank twice over (one
// for the forward to reach the last stage, one for the gradient to come back, each one chunk
// step per rank) plus one whole round of the other v-1 chunks for the first group.
int interleaved_warmup(int r, int p, int v, int m) {
    int w = (p - r - 1) * 2 + (v - 1) * p;
    return w < m * v ? w : m * v;
}

void sched_interleaved(Schedule *s, int p, int v, int m) {
    if (m % p != 0)
        lab_fail_collective("--schedule interleaved: --micro-batches %d is not a multiple of the "
                            "%d stages; interleaved 1F1B sends micro-batches in groups of p: use "
                            "m = %d, %d, %d, ...", m, p, p, 2 * p, 3 * p);
    sched_alloc(s, "interleaved", p, v, m, 0);
    const int total = m * v;
    for (int r = 0; r < p; r++) {
        int w = interleaved_warmup(r, p, v, m);
        for (int k = 0; k < w; k++)
            push(s, r, PIPE_F, interleaved_mb(k, p, v), interleaved_chunk(k, p, v, 1));
        for (int i = 0; i < total - w; i++) {
            int k = w + i;
            push(s, r, PIPE_F, interleaved_mb(k, p, v), interleaved_chunk(k, p, v, 1));
            push(s, r, PIPE_B, interleaved_mb(i, p, v), interleaved_chunk(i, p, v, 0));
        }
        for (int i = total - w; i < total; i++)
            push(s, r, PIPE_B, interleaved_mb(i, p, v), interleaved_chunk(i, p, v, 0));
    }
}

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B's order of F and B, with the
// backward split in two. B (the input gradient) is on the critical path: the stage below waits
// for it. W (the weight gradients) is not: nobody waits for it, so it is deferred into the
// time a stage would otherwise sit idle. The table is built by running the pipeline under unit
// op times (tf = tb = tw = 1) and letting each free stage pick, in order of priority: a B
// whose gradient has arrived; else an F whose input has arrived, if fewer than p-r micro-batches
// are between their F and B (1F1B's limit); else the oldest deferred W; else it idles.
// Memory: at most p-r sets between F and B (1F1B's limit); from B to W a micro-batch keeps only
// what its W reads (gpt2_acts_keep_for_w), and up to m of those wait on a stage. max_w > 0 caps
// them (the paper's memory limit): a stage with max_w W's pending runs the oldest one before
// anything else, so no B makes it max_w + 1; the W's it runs early leave bubbles unfilled.
void sched_zb_h1_capped(Schedule *s, int p, int m, int max_w) {
    if (max_w < 0) lab_fail_collective("--max-w-stores %d; valid: 0 (no cap) or more", max_w);
    sched_alloc(s, "zb", p, 1, m, 1);
    // finish time of F(i) / B(i) on stage r, -1 while not run; unit op times
    int *fin_f = lab_xmalloc((size_t)p * m * sizeof(int)), *fin_b = lab_xmalloc((size_t)p * m * sizeof(int));
    for (int i = 0; i < p * m; i++) fin_f[i] = fin_b[i] = -1;
    int nf[SCHED_MAX_STAGES] = {0}, nb[SCHED_MAX_STAGES] = {0}, nw[SCHED_MAX_STAGES] = {0};
    int done = 0;
    for (int t = 0; done < p; t++) {
        done = 0;
        int pick[SCHED_MAX_STAGES];  // decide every stage from the state at time t, then apply
        for (int r = 0; r < p; r++) {
            pick[r] = -1;
            int b_ready = nb[r] < m && fin_f[r * m + nb[r]] >= 0 && fin_f[r * m + nb[r]] <= t &&
                          (r == p - 1 || (fin_b[(r + 1) * m + nb[r]] >= 0 &&
                                          fin_b[(r + 1) * m + nb[r]] <= t));
            int f_ready = nf[r] < m && nf[r] - nb[r] < p - r &&
                          (r == 0 || (fin_f[(r - 1) * m + nf[r]] >= 0 &&
                                      fin_f[(r - 1) * m + nf[r]] <= t));
            int w_ready = nw[r] < nb[r];
            // EXERCISE 08.3 Deferring W -> 08_pipeline/README.md#exercise-083-deferring-w
            // B first (the stage below waits for it), then F, and W only when nothing else can
            // run: the weight gradients fill the bubbles.
            if (b_ready) pick[r] = PIPE_B;
            else if (f_ready) pick[r] = PIPE_F;
            else if (w_ready) pick[r] = PIPE_W;
            // END EXERCISE 08.3
            if (max_w > 0 && nb[r] - nw[r] >= max_w) pick[r] = PIPE_W;  // the cap: W first
            if (nw[r] == m) done++;
        }
        for (int r = 0; r < p; r++) {
            if (pick[r] == PIPE_B) { fin_b[r * m + nb[r]] = t + 1; push(s, r, PIPE_B, nb[r]++, 0); }
            else if (pick[r] == PIPE_F) { fin_f[r * m + nf[r]] = t + 1; push(s, r, PIPE_F, nf[r]++, 0); }
            else if (pick[r] == PIPE_W) push(s, r, PIPE_W, nw[r]++, 0);
        }
        LAB_CHECK(t < 100 * (m + p) * 3, "sched_zb_h1: no progress (a bug in the generator)");
    }
    free(fin_f), free(fin_b);
}

void sched_zb_h1(Schedule *s, int p, int m) { sched_zb_h1_capped(s, p, m, 0); }

void sched_make(Schedule *s, const char *name, int p, int v, int m) {
    if (strcmp(name, "interleaved") != 0 && v != 1)
        lab_fail_collective("--chunks %d: only --schedule interleaved runs several chunks per "
                            "rank; use --chunks 1 with --schedule %s", v, name);
    if (strcmp(name, "gpipe") == 0) sched_gpipe(s, p, m);
    else if (strcmp(name, "1f1b") == 0) sched_1f1b(s, p, m);
    else if (strcmp(name, "interleaved") == 0) sched_interleaved(s, p, v, m);
    else if (strcmp(name, "zb") == 0) sched_zb_h1(s, p, m);
    else lab_fail_collective("--schedule %s: valid: gpipe|1f1b|interleaved|zb", name);
}

// ---------------------------------------------------------------------------------------------
// check

int sched_check(const Schedule *s, char *err, size_t errlen) {
    const int m = s->m, v = s->v;
    int *seen = lab_xmalloc((size_t)m * v * 3 * sizeof(int));  // position in the list, or -1
    int rc = 0;
    for (int r = 0; r < s->p && rc == 0; r++) {
        for (int i = 0; i < m * v * 3; i++) seen[i] = -1;
        for (int j = 0; j < s->nops[r] && rc == 0; j++) {
            PipeOp o = s->ops[r][j];
            if (o.mb < 0 || o.mb >= m || o.chunk < 0 || o.chunk >= v ||
                (o.kind == PIPE_W && !s->split)) {
                snprintf(err, errlen, "stage %d op %d: %c(mb %d, chunk %d) is not an op of this "
                         "table (m %d, v %d, split %d)", r, j, "FBW"[o.kind], o.mb, o.chunk, m, v,
                         s->split);
                rc = -1;
                break;
            }
            int *at = &seen[((size_t)o.chunk * m + o.mb) * 3 + o.kind];
            if (*at >= 0) {
                snprintf(err, errlen, "stage %d: %c(mb %d, chunk %d) appears twice", r,
                         "FBW"[o.kind], o.mb, o.chunk);
                rc = -1;
            }
            *at = j;
        }
        for (int c = 0; c < v && rc == 0; c++)
            for (int i = 0; i < m && rc == 0; i++) {
                int *k = &seen[((size_t)c * m + i) * 3];
                const char *what = NULL;
                if (k[0] < 0) what = "F is missing";
                else if (k[1] < 0) what = "B is missing";
                else if (s->split && k[2] < 0) what = "W is missing";
                else if (k[1] < k[0]) what = "B comes before its F";
                else if (s->split && k[2] < k[1]) what = "W comes before its B";
                if (what) {
                    snprintf(err, errlen, "stage %d, micro-batch %d, chunk %d: %s", r, i, c, what);
                    rc = -1;
                }
            }
    }
    free(seen);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// simulator

// Sets alive from F to B (what = PIPE_F), or W stores alive from B to W (what = PIPE_W).
static int peak_between(const Schedule *s, int rank, PipeOpKind from, PipeOpKind to) {
    int live = 0, peak = 0;
    for (int j = 0; j < s->nops[rank]; j++) {
        PipeOp o = s->ops[rank][j];
        if (o.kind == from) live++;
        else if (o.kind == to) live--;
        if (live > peak) peak = live;
    }
    return peak;
}

int sched_peak_inflight(const Schedule *s, int rank) { return peak_between(s, rank, PIPE_F, PIPE_B); }

int sched_peak_wstores(const Schedule *s, int rank) {
    return s->split ? peak_between(s, rank, PIPE_B, PIPE_W) : 0;
}

BubbleSplit sched_bubble_split(const double *busy, int p, double span) {
    BubbleSplit b = {0, 0.0, 0.0};
    double lo = busy[0];
    for (int r = 1; r < p; r++) {
        if (busy[r] > busy[b.bottleneck]) b.bottleneck = r;
        lo = fmin(lo, busy[r]);
    }
    const double hi = busy[b.bottleneck];
    if (span > 0) b.bubble = 1.0 - hi / span;
    if (hi > 0) b.imbalance = 1.0 - lo / hi;
    return b;
}

// Runs every op as soon as its stage is free and its inputs are there, until nothing more can
// run. An op's times depend only on the ops it waits for, so the order of discovery does not
// change them. Stage r's times are ts[r * stride] (stride 0: one SchedTimes for every stage).
static int simulate(const Schedule *s, const SchedTimes *ts, size_t stride, SimResult *res) {
    const int p = s->p, v = s->v, m = s->m, S = p * v;
    const SchedTimes *t = ts;  // the link's times
    memset(res, 0, sizeof *res);
    // finish time of F / B of micro-batch i on virtual stage vs: fin[(kind * S + vs) * m + i]
    double *fin = lab_xmalloc((size_t)2 * S * m * sizeof(double));
    for (size_t i = 0; i < (size_t)2 * S * m; i++) fin[i] = -1;
    double free_at[SCHED_MAX_STAGES] = {0};
    int next[SCHED_MAX_STAGES] = {0};
    const double lat = t->alpha + t->beta * t->msg_bytes;
    double dur[SCHED_MAX_STAGES][3];  // stage r's F, B, W of one chunk
    for (int r = 0; r < p; r++) {
        const SchedTimes *q = &ts[(size_t)r * stride];
        dur[r][PIPE_F] = q->tf / v;
        dur[r][PIPE_B] = (s->split ? q->tb : q->tb + q->tw) / v;
        dur[r][PIPE_W] = q->tw / v;
    }
    for (int r = 0; r < p; r++) {
        res->start[r] = lab_xcalloc((size_t)s->nops[r] + 1, sizeof(double));
        res->end[r] = lab_xcalloc((size_t)s->nops[r] + 1, sizeof(double));
    }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++) {
            while (next[r] < s->nops[r]) {
                PipeOp o = s->ops[r][next[r]];
                int vs = o.chunk * p + r;
                double ready = free_at[r];
                if (o.kind == PIPE_F && vs > 0) {
                    double f = fin[(0 * S + vs - 1) * m + o.mb];
                    if (f < 0) break;  // the activation has not been sent yet
                    ready = fmax(ready, f + ((vs - 1) % p != r ? lat : 0));
                }
                if (o.kind == PIPE_B) {
                    if (fin[(0 * S + vs) * m + o.mb] < 0) break;  // (sched_check refuses this)
                    if (vs < S - 1) {
                        double b = fin[(1 * S + vs + 1) * m + o.mb];
                        if (b < 0) break;  // the gradient has not been sent yet
                        ready = fmax(ready, b + ((vs + 1) % p != r ? lat : 0));
                    }
                }
                if (o.kind == PIPE_W && fin[(1 * S + vs) * m + o.mb] < 0) break;
                res->start[r][next[r]] = ready;
                res->end[r][next[r]] = free_at[r] = ready + dur[r][o.kind];
                if (o.kind != PIPE_W) fin[((size_t)o.kind * S + vs) * m + o.mb] = free_at[r];
                res->busy[r] += dur[r][o.kind];
                if (o.kind == PIPE_F && vs < S - 1 && (vs + 1) % p != r) res->sends[r]++;
                if (o.kind == PIPE_F && vs > 0 && (vs - 1) % p != r) res->recvs[r]++;
                if (o.kind == PIPE_B && vs > 0 && (vs - 1) % p != r) res->sends[r]++;
                if (o.kind == PIPE_B && vs < S - 1 && (vs + 1) % p != r) res->recvs[r]++;
                next[r]++;
                progress = 1;
            }
        }
    }
    for (int r = 0; r < p; r++) {
        if (next[r] < s->nops[r] && !res->deadlock) {
            PipeOp o = s->ops[r][next[r]];
            res->deadlock = 1;
            snprintf(res->err, sizeof res->err, "deadlock: stage %d waits at op %d, %c(mb %d, "
                     "chunk %d), for %s that is never sent", r, next[r], "FBW"[o.kind], o.mb,
                     o.chunk, o.kind == PIPE_F ? "an activation" : "a gradient");
        }
        res->makespan = fmax(res->makespan, free_at[r]);
        res->peak_inflight[r] = sched_peak_inflight(s, r);
    }
    for (int r = 0; r < p; r++)
        res->bubble[r] = res->makespan > 0 ? 1.0 - res->busy[r] / res->makespan : 0.0;
    res->split = sched_bubble_split(res->busy, p, res->makespan);
    free(fin);
    return res->deadlock ? -1 : 0;
}

// The one check every table passes before it runs (pipe_exec_init calls it, so 08 and 09 get
// it whether or not they print the table): well formed, and no deadlock under unit op times
// (whether a receive ever gets its message does not depend on the times).
int sched_validate(const Schedule *s, char *err, size_t errlen) {
    static const SchedTimes unit = {1.0, 1.0, 1.0, 0.0, 0.0, 0.0};
    char why[256];
    int rc = sched_check(s, why, sizeof why);
    if (rc == 0) {
        SimResult r;
        rc = sched_simulate(s, &unit, &r);
        if (rc != 0) snprintf(why, sizeof why, "%s", r.err);
        sim_free(&r);
    }
    if (rc != 0)
        snprintf(err, errlen, "%s; valid: a table that runs F and B (and W, split) once per "
                 "micro-batch and chunk, each B after its F, each receive after the op that "
                 "sends its message: what sched_make builds (gpipe, 1f1b, interleaved, zb)", why);
    return rc;
}

int sched_simulate(const Schedule *s, const SchedTimes *t, SimResult *r) {
    return simulate(s, t, 0, r);
}

int sched_simulate_stages(const Schedule *s, const SchedTimes *t, SimResult *r) {
    return simulate(s, t, 1, r);
}

void sim_free(SimResult *r) {
    for (int i = 0; i < SCHED_MAX_STAGES; i++) free(r->start[i]), free(r->end[i]);
    memset(r, 0, sizeof *r);
}

double sched_theory_bubble(const Schedule *s, const SchedTimes *t) {
    const double p = s->p, m = s->m, v = s->v;
    if (s->split) {  // ZB-H1: each stage's bubble shrinks from (p-1)(tf+tb+tw) to (p-1)(tf+tb-tw)
        double idle = (p - 1) * (t->tf + t->tb - t->tw);
        return idle / (m * (t->tf + t->tb + t->tw) + idle);
    }
    return (p - 1) / (v * m + p - 1);
}

// ---------------------------------------------------------------------------------------------
// picture

// Op j of row r in the picture: its label and its columns [*a, *b). An op shorter than its
// label is drawn label-wide; the ops after it on the row move right until an idle gap takes the
// shift up, so every label reads whole. *cursor: the first column after the op drawn last.
static void op_cols(const Schedule *s, int r, int j, double st, double en, double unit,
                    int *cursor, int *a, int *b, char label[16]) {
    PipeOp o = s->ops[r][j];
    char letter = "FBW"[o.kind];
    if (o.chunk % 2) letter = (char)(letter - 'A' + 'a');
    snprintf(label, 16, "%c%d", letter, o.mb);
    *a = (int)floor(st / unit + 0.5), *b = (int)floor(en / unit + 0.5);
    if (*a < *cursor) *b += *cursor - *a, *a = *cursor;
    if (*b < *a + (int)strlen(label)) *b = *a + (int)strlen(label);
    *cursor = *b;
}

int sched_print(FILE *out, const Schedule *s, double *const *start, double *const *end,
                double unit, int max_cols) {
    int cols = 0, a, b;
    char label[16];
    for (int r = 0; r < s->p; r++) {  // the widest row, labels included
        int cursor = 0;
        for (int j = 0; j < s->nops[r]; j++)
            op_cols(s, r, j, start[r][j], end[r][j], unit, &cursor, &a, &b, label);
        if (cursor > cols) cols = cursor;
    }
    const int whole = cols;
    if (cols > max_cols) cols = max_cols;
    char *row = lab_xmalloc((size_t)cols + 1);
    for (int r = 0; r < s->p; r++) {
        memset(row, '.', (size_t)cols);
        row[cols] = 0;
        int cursor = 0;
        for (int j = 0; j < s->nops[r]; j++) {
            op_cols(s, r, j, start[r][j], end[r][j], unit, &cursor, &a, &b, label);
            for (int c = a; c < b && c < cols; c++) {
                size_t li = (size_t)(c - a);
                row[c] = li < strlen(label) ? label[li] : '-';
            }
        }
        fprintf(out, "  stage %-2d |%s|\n", r, row);
    }
    free(row);
    if (whole > cols)  // a cut picture says so (and how wide the whole one is)
        fprintf(out, "  (cut: %d of its %d columns shown)\n", cols, whole);
    return whole;
}
