// ckpt_shard.c: sharded checkpoints (--save-sharded; the format is in ckpt.h), and ckpt_settle,
// the point where every rank's writes are known complete.
//
// A save: every rank that holds a part of the state writes shard-RRRRR.bin into
// "<path>.step-N/" (atomic, like every file; in the background with --async-save) and keeps
// what it wrote (elements, bytes, CRC32) as pending. At ckpt_settle the ranks' pending shards
// are gathered to rank 0, which writes the manifest (the checkpoint exists from then on), then
// points <path> at the directory and removes the old ones beyond --keep-last. A job killed before
// the manifest leaves the previous checkpoint in place: <path> still points at it.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "dist.h"
#include "mem.h"

#define SHARD_MAGIC "LABSHARD"
#define SHARD_HEADER 40  // magic 8, version, rank, step, pad (4 each), n, nranges (8 each)
#define MANIFEST_HEAD "lab sharded checkpoint, version 1"

// ---- building a shard ----------------------------------------------------------------------

void ckpt_shard_begin(CkptShard *sh, size_t n) {
    memset(sh, 0, sizeof *sh);
    sh->n = n;
}

static void shard_grow(CkptShard *sh, size_t more) {
    if (sh->nr == sh->cap) {
        sh->cap = sh->cap ? 2 * sh->cap : 64;
        sh->ranges = realloc(sh->ranges, sh->cap * 2 * sizeof(uint64_t));
        LAB_CHECK(sh->ranges, "out of memory building a checkpoint shard");
    }
    if (sh->k + more > sh->kcap) {
        size_t c = sh->kcap ? sh->kcap : 1024;
        while (c < sh->k + more) c *= 2;
        sh->kcap = c;
        float **a[3] = {&sh->p, &sh->m, &sh->v};
        for (int i = 0; i < 3; i++) {
            *a[i] = realloc(*a[i], c * sizeof(float));
            LAB_CHECK(*a[i], "out of memory building a checkpoint shard");
        }
    }
}

void ckpt_shard_add(CkptShard *sh, size_t at, size_t count, const float *p, const float *m,
                    const float *v) {
    if (count == 0) return;
    LAB_CHECK(at + count <= sh->n, "shard range %zu + %zu past the model's %zu", at, count, sh->n);
    shard_grow(sh, count);
    mem_copy(sh->p + sh->k, p, count * sizeof(float));
    mem_copy(sh->m + sh->k, m, count * sizeof(float));
    mem_copy(sh->v + sh->k, v, count * sizeof(float));
    sh->k += count;
    uint64_t *last = sh->nr ? &sh->ranges[2 * (sh->nr - 1)] : NULL;
    if (last && last[0] + last[1] == at) {  // continues the last range
        last[1] += count;
        return;
    }
    sh->ranges[2 * sh->nr] = at;
    sh->ranges[2 * sh->nr + 1] = count;
    sh->nr++;
}

void ckpt_shard_add_slice(CkptShard *sh, const GPT2 *slice, const float *p, const float *m,
                          const float *v, const float *mine, int with_replicated) {
    const size_t n = sh->n, k = slice->num_params;
    float *whole[3], *held = lab_xcalloc(n, sizeof(float)), *ones = lab_xmalloc(k * sizeof(float));
    const float *src[3] = {p, m, v};
    for (size_t i = 0; i < k; i++) ones[i] = !mine || mine[i] != 0.0f ? 1.0f : 0.0f;
    gpt2_unshard(slice, ones, held, with_replicated);  // 1 where this rank's elements go
    for (int i = 0; i < 3; i++) {
        whole[i] = lab_xcalloc(n, sizeof(float));
        gpt2_unshard(slice, src[i], whole[i], with_replicated);
    }
    for (size_t i = 0; i < n;) {
        if (held[i] == 0.0f) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && held[j] != 0.0f) j++;
        ckpt_shard_add(sh, i, j - i, whole[0] + i, whole[1] + i, whole[2] + i);
        i = j;
    }
    for (int i = 0; i < 3; i++) free(whole[i]);
    free(held), free(ones);
}

// ---- the pending save of this rank -----------------------------------------------------------

typedef struct Pending {
    int has_save, has_shard;  // a sharded save not yet settled; this rank wrote a shard in it
    char path[4096];
    int step;
    GPT2Config cfg;
    uint64_t seed, data_seed, n;
    uint64_t elements, bytes;
    uint32_t crc;
    int has_guard;            // the loop's guard record when the save was called (rank 0's goes
    CkptGuard guard;          // into the manifest)
} Pending;
static Pending g_pending;

static void shard_name(char *buf, size_t len, const char *dir, int rank) {
    snprintf(buf, len, "%s/shard-%05d.bin", dir, rank);
}

void ckpt_shard_write(const char *path, const GPT2Config *cfg, int step, uint64_t seed,
                      uint64_t data_seed, CkptShard *sh) {
    ckpt_wait();
    const int rank = dist_rank();
    char dir[4200], file[4300];
    ckpt_step_path(dir, sizeof dir, path, step);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        lab_fail("cannot write the sharded checkpoint %s: mkdir %s: %s (the previous one, if any, "
                 "is intact)", path, dir, strerror(errno));
    if (rank == 0) {  // a manifest left there by a run killed later than this save: not valid now
        char mf[4300];
        snprintf(mf, sizeof mf, "%s/manifest", dir);
        remove(mf);
    }
    g_pending = (Pending){.has_save = 1, .step = step, .cfg = *cfg, .seed = seed,
                          .data_seed = data_seed, .n = sh->n};
    snprintf(g_pending.path, sizeof g_pending.path, "%s", path);
    g_pending.has_guard = ckpt_guard(&g_pending.guard);
    if (sh->k > 0) {
        // the host snapshot: header, ranges, p, m, v, CRC32 (taken now: the manifest needs it)
        size_t nb = SHARD_HEADER + sh->nr * 16 + sh->k * 12 + 4;
        uint8_t *buf = lab_xmalloc(nb), *q = buf;
        int32_t ints[4] = {1, rank, step, 0};
        uint64_t n = sh->n, nr = sh->nr;
        memcpy(q, SHARD_MAGIC, 8), q += 8;
        memcpy(q, ints, 16), q += 16;
        memcpy(q, &n, 8), q += 8;
        memcpy(q, &nr, 8), q += 8;
        memcpy(q, sh->ranges, sh->nr * 16), q += sh->nr * 16;
        memcpy(q, sh->p, sh->k * 4), q += sh->k * 4;
        memcpy(q, sh->m, sh->k * 4), q += sh->k * 4;
        memcpy(q, sh->v, sh->k * 4), q += sh->k * 4;
        uint32_t crc = crc32_of(buf, nb - 4);
        memcpy(q, &crc, 4);
        g_pending.has_shard = 1;
        g_pending.elements = sh->k;
        g_pending.bytes = nb;
        g_pending.crc = crc;
        shard_name(file, sizeof file, dir, rank);
        ckpt_write_bytes_owned(file, buf, nb, NULL, NULL);
    }
    free(sh->ranges), free(sh->p), free(sh->m), free(sh->v);
    memset(sh, 0, sizeof *sh);
}

// ---- the manifest ----------------------------------------------------------------------------

// The program's size and CRC32 (the code that wrote a checkpoint), once per process.
static const char *code_version(void) {
    static char v[160];
    if (v[0]) return v;
    uint64_t size = 0;
    uint32_t crc = 0;
    char why[256];
    if (ckpt_file_crc("/proc/self/exe", &size, &crc, why, sizeof why) == 0)
        snprintf(v, sizeof v, "program %llu bytes crc32 %08x", (unsigned long long)size, crc);
    else
        snprintf(v, sizeof v, "program unknown (%.100s)", why);
    return v;
}

typedef struct ShardRow { int32_t has, rank; uint64_t elements, bytes; uint32_t crc, pad; } ShardRow;

static void write_manifest(const Pending *pd, const ShardRow *rows, int nranks) {
    char dir[4200], path[4300];
    ckpt_step_path(dir, sizeof dir, pd->path, pd->step);
    snprintf(path, sizeof path, "%s/manifest", dir);
    RunIdentity id;
    memset(&id, 0, sizeof id);
    if (!ckpt_identity(&id)) {
        id.seed = pd->seed;
        id.data_seed = pd->data_seed;
    }
    size_t cap = 8192 + (size_t)nranks * 128 + (pd->has_guard ? 32768 : 0), k = 0;
    char *t = lab_xmalloc(cap);
#define OUT(...) k += (size_t)snprintf(t + k, cap - k, __VA_ARGS__)
    OUT("%s\n", MANIFEST_HEAD);
    OUT("step %d\n", pd->step);
    OUT("config V %d T %d L %d NH %d C %d\n", pd->cfg.V, pd->cfg.T, pd->cfg.L, pd->cfg.NH, pd->cfg.C);
    OUT("elements %llu (the whole model; shards hold ranges of its memory order, gpt2.h)\n",
        (unsigned long long)pd->n);
    OUT("layout %d ranks: %s\n", nranks, ckpt_command());
    OUT("hyperparameters steps %d warmup %d batch %d lr %a weight_decay %a grad_clip %a seed "
        "%llu data_seed %llu\n", id.steps, id.warmup, id.batch, (double)id.lr,
        (double)id.weight_decay, (double)id.grad_clip, (unsigned long long)id.seed,
        (unsigned long long)id.data_seed);
    if (id.has_data)
        OUT("data file %llu bytes crc32 %08x %s\n", (unsigned long long)id.data_size, id.data_crc,
            id.data);
    else
        OUT("data synthetic\n");
    OUT("code %s\n", code_version());
    if (pd->has_guard) {  // the loop's guard record (ckpt.h, CkptGuard): values as exact hex floats
        const CkptGuard *g = &pd->guard;
        OUT("guard counts nan_skips %d spike_skips %d window_skips %d rollbacks %d window %d "
            "lr_low_until %d\n", g->nan_skips, g->spike_skips, g->window_skips, g->rollbacks,
            g->cap, g->lr_low_until);
        OUT("guard rollback-skips %d", g->nwin);
        for (int i = 0; i < g->nwin; i++) OUT(" %d %d", g->win_lo[i], g->win_hi[i]);
        OUT("\n");
        const char *name[2] = {"loss", "grad-norm"};
        const double *x[2] = {g->loss, g->gnorm};
        const int n[2] = {g->nloss, g->ngnorm}, head[2] = {g->loss_head, g->gnorm_head};
        for (int w = 0; w < 2; w++) {
            OUT("guard %s-window %d head %d", name[w], n[w], head[w]);
            for (int i = 0; i < n[w]; i++) OUT(" %a", x[w][i]);
            OUT("\n");
        }
    }
    int nsh = 0;
    for (int r = 0; r < nranks; r++) nsh += rows[r].has != 0;
    OUT("shards %d\n", nsh);
    for (int r = 0; r < nranks; r++)
        if (rows[r].has)
            OUT("shard %d shard-%05d.bin elements %llu bytes %llu crc32 %08x\n", rows[r].rank,
                rows[r].rank, (unsigned long long)rows[r].elements,
                (unsigned long long)rows[r].bytes, rows[r].crc);
    OUT("manifest-crc32 %08x\n", crc32_of(t, k));
#undef OUT
    LAB_CHECK(k < cap, "manifest too long");
    double t0 = lab_now();
    file_write_atomic(path, t, k);
    ckpt_note_write(t0, lab_now());
    free(t);
}

void ckpt_settle(void) {
    CkptPolicy pol = ckpt_policy();
    ckpt_wait();
    if (!pol.async && !pol.sharded) return;
    DistGroup *w = dist_world();
    if (pol.sharded) {
        // rank 0's pending save says whether there is one (every rank saves at the same steps)
        ShardRow mine = {.has = g_pending.has_shard, .rank = w->rank,
                         .elements = g_pending.elements, .bytes = g_pending.bytes,
                         .crc = g_pending.crc};
        ShardRow *rows = w->rank == 0 ? lab_xcalloc((size_t)w->size, sizeof(ShardRow)) : NULL;
        dist_gather(&mine, rows, sizeof(ShardRow), DIST_U8, 0, w);
        if (w->rank == 0 && g_pending.has_save) {
            write_manifest(&g_pending, rows, w->size);
            ckpt_rotate(g_pending.path, g_pending.step);
        }
        free(rows);
        memset(&g_pending, 0, sizeof g_pending);
    }
    if (w->size > 1) dist_barrier(w);  // rank 0's file (or manifest) complete for every rank
}

// ---- reading ---------------------------------------------------------------------------------

typedef struct ShardEntry { int rank; char file[64]; uint64_t elements, bytes; uint32_t crc; } ShardEntry;

static int read_whole(const char *path, char **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f) return -1;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        errno = EINVAL;
        return -1;
    }
    *n = (size_t)st.st_size;
    *buf = lab_xmalloc(*n + 1);
    size_t got = fread(*buf, 1, *n, f);
    fclose(f);
    (*buf)[*n] = '\0';
    if (got != *n) {
        free(*buf);
        errno = EIO;
        return -1;
    }
    return 0;
}

// One "guard ..." line of a manifest (its text after "guard ") into g: 0, or -1 when it does
// not parse.
static int parse_guard(const char *t, CkptGuard *g) {
    int off = 0;
    if (sscanf(t, "counts nan_skips %d spike_skips %d window_skips %d rollbacks %d window %d "
               "lr_low_until %d", &g->nan_skips, &g->spike_skips, &g->window_skips,
               &g->rollbacks, &g->cap, &g->lr_low_until) == 6)
        return 0;
    if (sscanf(t, "rollback-skips %d%n", &g->nwin, &off) == 1) {
        if (g->nwin < 0 || g->nwin > CKPT_GUARD_ROLLBACKS) return -1;
        const char *c = t + off;
        for (int i = 0; i < g->nwin; i++) {
            int a, b, k = 0;
            if (sscanf(c, " %d %d%n", &a, &b, &k) != 2) return -1;
            g->win_lo[i] = a, g->win_hi[i] = b;
            c += k;
        }
        return 0;
    }
    int n = 0, head = 0, w = -1;
    if (sscanf(t, "loss-window %d head %d%n", &n, &head, &off) == 2) w = 0;
    else if (sscanf(t, "grad-norm-window %d head %d%n", &n, &head, &off) == 2) w = 1;
    if (w < 0 || n < 0 || n > CKPT_GUARD_WINDOW) return -1;
    double *x = w == 0 ? g->loss : g->gnorm;
    const char *c = t + off;
    for (int i = 0; i < n; i++) {
        char *end;
        x[i] = strtod(c, &end);
        if (end == c) return -1;
        c = end;
    }
    if (w == 0) g->nloss = n, g->loss_head = head;
    else g->ngnorm = n, g->gnorm_head = head;
    return 0;
}

typedef struct Span { uint64_t at, count; int shard; } Span;
static int by_start(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

// The manifest parsed and checked, then every shard (size, CRC32, header) and the coverage of
// the whole (every element exactly once). sh (may be NULL): the entries, nsh of them.
static int verify(const char *dir, CkptManifest *mf, ShardEntry **out, char *err, size_t errlen) {
    char path[4300], *t = NULL;
    size_t tn;
    memset(mf, 0, sizeof *mf);
#define VFAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)
    ShardEntry *sh = NULL;
    Span *spans = NULL;
    size_t nspans = 0, capspans = 0;
    snprintf(path, sizeof path, "%s/manifest", dir);
    if (read_whole(path, &t, &tn) != 0)
        VFAIL("a sharded checkpoint without its manifest (%s: %s): its save did not finish, or it "
              "is not a checkpoint", path, strerror(errno));
    char *last = NULL;
    for (char *c = t; c < t + tn; c++)
        if (*c == '\n' && c + 1 < t + tn) last = c + 1;
    unsigned stored = 0;
    if (strncmp(t, MANIFEST_HEAD "\n", strlen(MANIFEST_HEAD) + 1) != 0 || !last ||
        sscanf(last, "manifest-crc32 %8x", &stored) != 1)
        VFAIL("%s is not a manifest this lab wrote (or it was cut short)", path);
    if (crc32_of(t, (size_t)(last - t)) != stored)
        VFAIL("%s is corrupted: CRC32 mismatch (stored %08x, computed %08x)", path, stored,
              crc32_of(t, (size_t)(last - t)));
    int nsh = -1, got = 0;
    char *save = NULL;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        RunIdentity *id = &mf->id;
        double lr, wd, gc;
        unsigned long long a, b, c;
        unsigned crc;
        int r;
        char fname[64];
        if (sscanf(line, "step %d", &mf->step) == 1) continue;
        if (sscanf(line, "config V %d T %d L %d NH %d C %d", &mf->cfg.V, &mf->cfg.T, &mf->cfg.L,
                   &mf->cfg.NH, &mf->cfg.C) == 5) continue;
        if (sscanf(line, "elements %llu", &a) == 1) { mf->n = a; continue; }
        if (sscanf(line, "layout %d ranks:", &mf->nranks) == 1) {
            snprintf(mf->layout, sizeof mf->layout, "%s", line + 7);
            continue;
        }
        if (sscanf(line, "hyperparameters steps %d warmup %d batch %d lr %la weight_decay %la "
                   "grad_clip %la seed %llu data_seed %llu", &id->steps, &id->warmup, &id->batch,
                   &lr, &wd, &gc, &a, &b) == 8) {
            id->lr = (float)lr, id->weight_decay = (float)wd, id->grad_clip = (float)gc;
            id->seed = a, id->data_seed = b;
            continue;
        }
        int off = 0;
        if (sscanf(line, "data file %llu bytes crc32 %8x %n", &a, &crc, &off) == 2 && off > 0) {
            id->has_data = 1, id->data_size = a, id->data_crc = crc;
            snprintf(id->data, sizeof id->data, "%s", line + off);
            continue;
        }
        if (strncmp(line, "guard ", 6) == 0) {
            if (parse_guard(line + 6, &mf->guard) != 0)
                VFAIL("%s is damaged: its guard line \"%.60s\" does not parse", path, line);
            mf->has_guard |= strncmp(line + 6, "counts", 6) == 0;
            continue;
        }
        if (sscanf(line, "shards %d", &nsh) == 1) {
            if (nsh < 1 || nsh > 1 << 20) VFAIL("%s is damaged: %d shards", path, nsh);
            sh = lab_xcalloc((size_t)nsh, sizeof(ShardEntry));
            continue;
        }
        if (sscanf(line, "shard %d %63s elements %llu bytes %llu crc32 %8x", &r, fname, &a, &c,
                   &crc) == 5) {
            if (!sh || got >= nsh) VFAIL("%s is damaged: more shard lines than its count", path);
            sh[got] = (ShardEntry){.rank = r, .elements = a, .bytes = c, .crc = crc};
            snprintf(sh[got].file, sizeof sh[got].file, "%s", fname);
            got++;
        }
    }
    if (mf->cfg.V < 1 || mf->n == 0 || nsh < 1 || got != nsh)
        VFAIL("%s is damaged: it lacks the config, the size or its shards (%d of %d listed)", path,
              got, nsh);
    mf->nshards = nsh;
    if (mf->has_guard && ckpt_guard_why(&mf->guard, err, errlen) != 0) goto fail;
    if (mf->n != gpt2_param_count(&mf->cfg))
        VFAIL("%s is damaged: %llu elements for a config of %zu", path,
              (unsigned long long)mf->n, gpt2_param_count(&mf->cfg));
    // every shard: present, its size and CRC32 as the manifest says, its ranges inside the whole
    for (int i = 0; i < nsh; i++) {
        char sp[4400], *b = NULL;
        size_t bn;
        snprintf(sp, sizeof sp, "%s/%s", dir, sh[i].file);
        if (read_whole(sp, &b, &bn) != 0)
            VFAIL("shard %s (rank %d's of %d) is missing or unreadable: %s; the checkpoint is "
                  "incomplete, resume from another one", sp, sh[i].rank, mf->nranks, strerror(errno));
        uint32_t crc = bn >= 4 ? crc32_of(b, bn - 4) : 0, st = 0;
        if (bn >= 4) memcpy(&st, b + bn - 4, 4);
        if (bn != sh[i].bytes || crc != sh[i].crc || st != sh[i].crc) {
            free(b);
            VFAIL("shard %s (rank %d's) is corrupted: %zu bytes crc32 %08x, the manifest says %llu "
                  "bytes crc32 %08x; resume from another checkpoint", sp, sh[i].rank, bn, crc,
                  (unsigned long long)sh[i].bytes, sh[i].crc);
        }
        uint64_t n, nr;
        memcpy(&n, b + 24, 8);
        memcpy(&nr, b + 32, 8);
        uint64_t k = 0;
        int bad = memcmp(b, SHARD_MAGIC, 8) != 0 || n != mf->n ||
                  bn != SHARD_HEADER + nr * 16 + sh[i].elements * 12 + 4;
        for (uint64_t j = 0; !bad && j < nr; j++) {
            uint64_t at, cnt;
            memcpy(&at, b + SHARD_HEADER + 16 * j, 8);
            memcpy(&cnt, b + SHARD_HEADER + 16 * j + 8, 8);
            if (at + cnt > n || cnt == 0) bad = 1;
            k += cnt;
            if (nspans == capspans) spans = realloc(spans, (capspans = capspans ? 2 * capspans : 256) * sizeof(Span));
            spans[nspans++] = (Span){at, cnt, i};
        }
        free(b);
        if (bad || k != sh[i].elements)
            VFAIL("shard %s is damaged: its header or ranges do not match the manifest", sp);
    }
    qsort(spans, nspans, sizeof(Span), by_start);
    uint64_t at = 0;
    for (size_t j = 0; j < nspans; j++) {
        if (spans[j].at != at)
            VFAIL("the shards of %s %s element %llu of %llu: a shard is missing or two overlap",
                  dir, spans[j].at > at ? "lack" : "repeat", (unsigned long long)at,
                  (unsigned long long)mf->n);
        at += spans[j].count;
    }
    if (at != mf->n)
        VFAIL("the shards of %s hold %llu of the %llu elements: a shard is missing", dir,
              (unsigned long long)at, (unsigned long long)mf->n);
#undef VFAIL
    free(spans);
    free(t);
    if (out) *out = sh;
    else free(sh);
    return 0;
fail:
    free(spans);
    free(t);
    free(sh);
    return -1;
}

int ckpt_shard_verify(const char *dir, CkptManifest *mf, char *err, size_t errlen) {
    return verify(dir, mf, NULL, err, errlen);
}

int ckpt_shard_load(const char *dir, const GPT2Config *expect, float *p, float *m, float *v,
                    size_t n) {
    double t0 = lab_now();
    CkptManifest mf;
    ShardEntry *sh = NULL;
    char why[1024];
    if (verify(dir, &mf, &sh, why, sizeof why) != 0)
        lab_fail_collective("cannot load %s: %s", dir, why);
    if (mf.cfg.V != expect->V || mf.cfg.T != expect->T || mf.cfg.L != expect->L ||
        mf.cfg.NH != expect->NH || mf.cfg.C != expect->C || mf.n != n)
        lab_fail_collective("config mismatch in %s: the checkpoint has V=%d T=%d L=%d NH=%d C=%d, "
                            "this run V=%d T=%d L=%d NH=%d C=%d; run with the checkpoint's config",
                            dir, mf.cfg.V, mf.cfg.T, mf.cfg.L, mf.cfg.NH, mf.cfg.C, expect->V,
                            expect->T, expect->L, expect->NH, expect->C);
    for (int i = 0; i < mf.nshards; i++) {
        char sp[4400], *b = NULL;
        size_t bn;
        snprintf(sp, sizeof sp, "%s/%s", dir, sh[i].file);
        if (read_whole(sp, &b, &bn) != 0 || crc32_of(b, bn - 4) != sh[i].crc)
            lab_fail_collective("cannot load %s: shard %s changed while it was read", dir, sp);
        uint64_t nr;
        memcpy(&nr, b + 32, 8);
        const size_t k = sh[i].elements;
        const float *vals = (const float *)(b + SHARD_HEADER + nr * 16);
        size_t off = 0;
        for (uint64_t j = 0; j < nr; j++) {
            uint64_t at, cnt;
            memcpy(&at, b + SHARD_HEADER + 16 * j, 8);
            memcpy(&cnt, b + SHARD_HEADER + 16 * j + 8, 8);
            memcpy(p + at, vals + off, cnt * 4);
            memcpy(m + at, vals + k + off, cnt * 4);
            memcpy(v + at, vals + 2 * k + off, cnt * 4);
            off += cnt;
        }
        free(b);
    }
    free(sh);
    ckpt_note_loaded_guard(mf.has_guard ? &mf.guard : NULL);  // (session_guard.c takes it)
    if (lab_log_rank == 0) {
        printf("restored step %d from %s (%d shard%s, written on %d rank%s) in %.0f ms\n",
               mf.step, dir, mf.nshards, mf.nshards == 1 ? "" : "s", mf.nranks,
               mf.nranks == 1 ? "" : "s", (lab_now() - t0) * 1e3);
        fflush(stdout);
    }
    return mf.step;
}
