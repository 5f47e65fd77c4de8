// ckpt.c: checkpoints (see ckpt.h for the two formats) and the atomic file writer.
//
// Writing: everything goes to "<path>.tmp", which is flushed, fsync'ed and then renamed over
// <path>. rename() is atomic on POSIX file systems, so <path> is always either the complete
// old file or the complete new one, even if the job dies in the middle of a write.
//
// Reading: a file is checked before anything in it is trusted: magic, an exact size, CRC32,
// version, then the config against the run's. A refused load is said once for the job
// (lab_fail_collective): chapters that load on every rank meet the same error on every rank.
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "mem.h"
#include "trace.h"

static CkptPolicy g_policy;  // (the policy: the end of this file)

// ---- CRC32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib and PNG) ------------------

static uint32_t crc_table[256];
static int crc_table_ready;

static void crc_make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    crc_table_ready = 1;
}

uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
    if (!crc_table_ready) crc_make_table();
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t crc32_of(const void *data, size_t n) { return crc32_update(0, data, n); }

// ---- atomic writes --------------------------------------------------------------------------

typedef struct AtomicFile {
    const char *path;
    char *tmp;   // "<path>.tmp"
    FILE *f;
    uint32_t crc; // CRC32 of everything written so far
} AtomicFile;

LAB_NORETURN static void atomic_fail(AtomicFile *af, const char *what, int err) {
    if (af->f) {
        fclose(af->f);
        remove(af->tmp);  // never leave a half-written tmp behind; <path> is untouched
    }
    char msg[1024];
    snprintf(msg, sizeof(msg), "cannot write %s: %s %s failed: %s (the previous %s, if any, is "
             "intact)", af->path, what, af->tmp, strerror(err), af->path);
    free(af->tmp);
    lab_fail("%s", msg);
}

static void atomic_open(AtomicFile *af, const char *path) {
    // Past a file-size limit (ulimit -f) the kernel sends SIGXFSZ, whose default action kills
    // the process with a core and leaves a partial tmp. Ignored, write() fails with EFBIG
    // instead, and the clean path below runs: message, tmp removed, old <path> intact.
    signal(SIGXFSZ, SIG_IGN);
    af->path = path;
    af->tmp = lab_xmalloc(strlen(path) + 5);
    sprintf(af->tmp, "%s.tmp", path);
    af->crc = 0;
    // A tmp left by a save that was killed: removed, and said. (Anything else in its place,
    // a directory say, is left to fopen below to refuse with its own reason.)
    struct stat st;
    if (lstat(af->tmp, &st) == 0 && S_ISREG(st.st_mode) && remove(af->tmp) == 0)
        fprintf(stderr, "note: removed %s, left by an earlier save of %s that did not finish\n",
                af->tmp, path);
    af->f = fopen(af->tmp, "wb");
    if (!af->f) atomic_fail(af, "creating", errno);
}

static void atomic_write(AtomicFile *af, const void *buf, size_t n) {
    if (n == 0) return;
    if (fwrite(buf, 1, n, af->f) != n) atomic_fail(af, "writing", errno ? errno : EIO);
    af->crc = crc32_update(af->crc, buf, n);
}

// Fault injection for the tests: LAB_SAVE_STALL_S=N makes every save stop for N seconds with
// its tmp written but not yet renamed, after saying on stderr which process is inside the save,
// so that a test can send it a signal there (tests/harness.h, harness_save_signal_is_safe).
static void stall_if_asked(const AtomicFile *af) {
    const char *s = getenv("LAB_SAVE_STALL_S");
    if (!s || atoi(s) <= 0) return;
    fflush(af->f);
    fprintf(stderr, "[pid %d] LAB_SAVE_STALL_S: stalling in the save of %s (%s written)\n",
            (int)getpid(), af->path, af->tmp);
    fflush(stderr);
    sleep((unsigned)atoi(s));
}

static void atomic_commit(AtomicFile *af) {
    stall_if_asked(af);
    if (fflush(af->f) != 0) atomic_fail(af, "flushing", errno);
    if (fsync(fileno(af->f)) != 0) atomic_fail(af, "fsync of", errno);
    FILE *f = af->f;
    af->f = NULL;
    if (fclose(f) != 0) {
        int err = errno;
        remove(af->tmp);
        lab_fail("cannot write %s: closing %s failed: %s", af->path, af->tmp, strerror(err));
    }
    if (rename(af->tmp, af->path) != 0) {
        int err = errno;
        remove(af->tmp);
        lab_fail("cannot write %s: renaming %s over it failed: %s (the previous %s, if any, is "
                 "intact)", af->path, af->tmp, strerror(err), af->path);
    }
    free(af->tmp);
    af->tmp = NULL;
}

void file_write_atomic(const char *path, const void *buf, size_t n) {
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, buf, n);
    atomic_commit(&af);
}

// ---- reading helpers ------------------------------------------------------------------------

static void read_exact(FILE *f, void *buf, size_t n, const char *path) {
    if (n && fread(buf, 1, n, f) != n)
        lab_fail_collective("cannot read %s: %s", path, ferror(f) ? strerror(errno) : "unexpected end of file");
}

// CRC32 of n bytes from the current position (the position moves past them) into *crc; -1 on
// a read error or an early end.
static int crc_of_stream(FILE *f, size_t n, uint32_t *crc) {
    size_t chunk = (size_t)1 << 20;
    uint8_t *buf = lab_xmalloc(chunk);
    *crc = 0;
    while (n > 0) {
        size_t k = n < chunk ? n : chunk;
        if (fread(buf, 1, k, f) != k) {
            free(buf);
            return -1;
        }
        *crc = crc32_update(*crc, buf, k);
        n -= k;
    }
    free(buf);
    return 0;
}

// The flag that sets each config field, to make a mismatch message actionable.
static void check_config(const char *path, const GPT2Config *have, const GPT2Config *want) {
    const char *names[5] = {"V (--vocab)", "T (--seq)", "L (--layers)", "NH (--heads)", "C (--channels)"};
    int h[5] = {have->V, have->T, have->L, have->NH, have->C};
    int w[5] = {want->V, want->T, want->L, want->NH, want->C};
    for (int i = 0; i < 5; i++)
        if (h[i] != w[i])
            lab_fail_collective("config mismatch in %s: the file has %s = %d, this run has %d; run with the "
                     "file's config or use another file", path, names[i], h[i], w[i]);
}

// ---- weights: llm.c's gpt2_*.bin ------------------------------------------------------------

#define WEIGHTS_MAGIC 20240326
#define WEIGHTS_FP32 3
#define WEIGHTS_BF16 5
#define WEIGHTS_HEADER_INTS 256
#define CRC_MARKER 0x4C414221  // "LAB!": header[10] holds a CRC32 of the tensor bytes
#define HDR_CRC_MARKER 0x4C414248  // "LABH": header[11] holds a CRC32 of the header (with [11] = 0)

// CRC32 of a weights header, its own CRC field taken as 0.
static uint32_t header_crc(const int32_t *header) {
    int32_t h[WEIGHTS_HEADER_INTS];
    memcpy(h, header, sizeof(h));
    h[11] = 0;
    return crc32_of(h, sizeof(h));
}

void ckpt_save_weights(const char *path, const GPT2Config *cfg, const float *params) {
    size_t n = gpt2_param_count(cfg);
    int32_t header[WEIGHTS_HEADER_INTS] = {0};
    header[0] = WEIGHTS_MAGIC;
    header[1] = WEIGHTS_FP32;
    header[2] = cfg->T;
    header[3] = cfg->V;
    header[4] = cfg->L;
    header[5] = cfg->NH;
    header[6] = cfg->C;
    header[7] = cfg->V;  // padded V: no padding here
    header[9] = CRC_MARKER;
    uint32_t crc = crc32_of(params, n * sizeof(float));
    memcpy(&header[10], &crc, sizeof(crc));
    header[12] = HDR_CRC_MARKER;  // the tensor CRC does not cover the config: this one does
    uint32_t hcrc = header_crc(header);
    memcpy(&header[11], &hcrc, sizeof(hcrc));
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, header, sizeof(header));
    atomic_write(&af, params, n * sizeof(float));
    atomic_commit(&af);
}

// The whole file checked before anything in it is used: magic and version, an exact size for
// the config it holds (a byte short or appended is refused), then the CRC32 of the tensors when
// the lab wrote it. 0 and the open file positioned at the first tensor; -1 and the reason in err.
static FILE *weights_verify(const char *path, GPT2Config *cfg, int *version, int *Vp, char *err,
                            size_t errlen) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f) {
        snprintf(err, errlen, "%s", strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "not a regular file");
        fclose(f);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    int32_t header[WEIGHTS_HEADER_INTS];
#define WFAIL(...) do { snprintf(err, errlen, __VA_ARGS__); fclose(f); return NULL; } while (0)
    if (size < sizeof(header))
        WFAIL("truncated: %zu bytes, shorter than the %zu-byte header", size, sizeof(header));
    if (fread(header, 1, sizeof(header), f) != sizeof(header))
        WFAIL("cannot read the header: %s", ferror(f) ? strerror(errno) : "unexpected end of file");
    if (header[0] != WEIGHTS_MAGIC)
        WFAIL("wrong magic number %d (expected %d): not a GPT-2 weights file in llm.c's format",
              header[0], WEIGHTS_MAGIC);
    if (header[12] == HDR_CRC_MARKER) {  // files the lab wrote: the header is checked first
        uint32_t stored, crc = header_crc(header);
        memcpy(&stored, &header[11], sizeof(stored));
        if (crc != stored)
            WFAIL("corrupted: CRC32 mismatch in the header (stored %08x, computed %08x); the "
                  "file was damaged after it was written", stored, crc);
    }
    if (header[1] != WEIGHTS_FP32 && header[1] != WEIGHTS_BF16)
        WFAIL("unsupported version %d (this lab reads 3 = fp32 and 5 = bf16)", header[1]);
    cfg->T = header[2];
    cfg->V = header[3];
    cfg->L = header[4];
    cfg->NH = header[5];
    cfg->C = header[6];
    *version = header[1];
    *Vp = header[7];
    if (cfg->T < 1 || cfg->V < 1 || cfg->L < 1 || cfg->NH < 1 || cfg->C < 1 || *Vp < cfg->V)
        WFAIL("damaged: the header holds an impossible config (V=%d padded V=%d T=%d L=%d NH=%d "
              "C=%d)", cfg->V, *Vp, cfg->T, cfg->L, cfg->NH, cfg->C);
    // The size the header's config needs, with wte padded to Vp rows; counted in double first so
    // that a damaged header with huge fields cannot overflow the count. It must match exactly.
    size_t elem = *version == WEIGHTS_FP32 ? 4 : 2;
    double C = cfg->C;
    double want = (double)sizeof(header) + (double)elem * ((double)*Vp * C + cfg->T * C +
                                                           cfg->L * (12.0 * C * C + 13.0 * C) + 2.0 * C);
    if ((double)size < want)
        WFAIL("truncated or damaged: %zu bytes, where the header's config needs %.0f", size, want);
    if ((double)size > want)
        WFAIL("damaged: %zu bytes, %.0f more than the header's config needs (%.0f): something "
              "was appended, or the header was damaged", size, (double)size - want, want);
    size_t count = gpt2_param_count(cfg) + (size_t)(*Vp - cfg->V) * (size_t)cfg->C;
    if (header[9] == CRC_MARKER) {
        uint32_t stored;
        memcpy(&stored, &header[10], sizeof(stored));
        uint32_t crc;
        if (crc_of_stream(f, count * elem, &crc) != 0)
            WFAIL("cannot read it: %s", ferror(f) ? strerror(errno) : "unexpected end of file");
        if (crc != stored)
            WFAIL("corrupted: CRC32 mismatch (stored %08x, computed %08x); the file was damaged "
                  "after it was written", stored, crc);
        if (fseek(f, (long)sizeof(header), SEEK_SET) != 0) WFAIL("cannot read it: %s", strerror(errno));
    }
#undef WFAIL
    return f;
}

// Header read and the whole file validated; returns the open file positioned at the first tensor.
static FILE *weights_open(const char *path, GPT2Config *cfg, int *version, int *Vp) {
    char why[512];
    FILE *f = weights_verify(path, cfg, version, Vp, why, sizeof why);
    if (!f) lab_fail_collective("cannot load the weights file %s: %s", path, why);
    return f;
}

int ckpt_weights_peek(const char *path, GPT2Config *cfg, char *err, size_t errlen) {
    int version, Vp;
    FILE *f = weights_verify(path, cfg, &version, &Vp, err, errlen);
    if (!f) return -1;
    fclose(f);
    return 0;
}

GPT2Config ckpt_load_weights_config(const char *path) {
    GPT2Config cfg;
    int version, Vp;
    FILE *f = weights_open(path, &cfg, &version, &Vp);
    fclose(f);
    return cfg;
}

// Reads n elements of the file's dtype into out as fp32.
static void read_tensor(FILE *f, int version, float *out, size_t n, const char *path) {
    if (version == WEIGHTS_FP32) {
        read_exact(f, out, n * sizeof(float), path);
        return;
    }
    // bf16: the upper 16 bits of an fp32, so widening is exact.
    uint16_t *tmp = lab_xmalloc(n * sizeof(uint16_t) + 1);
    read_exact(f, tmp, n * sizeof(uint16_t), path);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)tmp[i] << 16;
        memcpy(&out[i], &bits, sizeof(bits));
    }
    free(tmp);
}

void ckpt_load_weights(const char *path, const GPT2Config *expect, float *params) {
    GPT2Config cfg;
    int version, Vp;
    FILE *f = weights_open(path, &cfg, &version, &Vp);
    if (expect) check_config(path, &cfg, expect);
    size_t sizes[GPT2_NUM_TENSORS];
    gpt2_param_sizes(&cfg, sizes);
    // wte: the first V of Vp rows (llm.c pads the vocabulary to a multiple of 128).
    size_t C = (size_t)cfg.C;
    read_tensor(f, version, params, sizes[0], path);
    size_t skip = (size_t)(Vp - cfg.V) * C * (version == WEIGHTS_FP32 ? 4 : 2);
    if (skip && fseek(f, (long)skip, SEEK_CUR) != 0) lab_fail_collective("cannot read %s: %s", path, strerror(errno));
    size_t rest = gpt2_param_count(&cfg) - sizes[0];
    read_tensor(f, version, params + sizes[0], rest, path);
    fclose(f);
}

// ---- training state: our format -------------------------------------------------------------
//
//   offset  field
//        0  char magic[8] = "LABSTATE"
//        8  int32 version = 1
//       12  int32 V, T, L, NH, C
//       32  int32 step                     (steps completed)
//       36  uint64 seed, data_seed
//       52  float lr, beta1, beta2, eps, weight_decay, grad_clip
//       76  int32 warmup_steps, total_steps
//       84  uint64 n                       (elements of each array)
//   versions 2 and 3, the run's identity (RunIdentity, ckpt.h):
//       92  int32 steps, warmup, batch, has_data
//      108  uint64 seed, data_seed
//      124  float lr, weight_decay, grad_clip
//      136  uint32 data_crc
//      140  uint64 data_size
//      148  char data[256]                 (the --data path, NUL-padded)
//   version 3 only, the loop's guard record (CkptGuard, ckpt.h):
//      404  int32 nan_skips, spike_skips, window_skips, rollbacks, cap
//      424  int32 nloss, loss_head, ngnorm, gnorm_head, lr_low_until, nwin
//      448  int32 win_lo[16], win_hi[16]
//      576  double loss[256], gnorm[256]   (oldest first; unused slots 0)
//    H = 92 (version 1), 404 (version 2) or 4672 (version 3)
//        H  float params[n], m[n], v[n]
//   H+12n  uint32 CRC32 of bytes [0, H+12n)
// All little-endian (the byte order of every machine this lab targets).

#define STATE_MAGIC "LABSTATE"
#define STATE_VERSION 3
#define STATE_V1_HEADER 92
#define STATE_V2_HEADER 404
#define STATE_GUARD_BYTES (4 * (11 + 2 * CKPT_GUARD_ROLLBACKS) + 16 * CKPT_GUARD_WINDOW)
#define STATE_HEADER_BYTES (STATE_V2_HEADER + STATE_GUARD_BYTES)  // the largest (version 3)

static int state_header_bytes(int32_t version) {
    return version == 1 ? STATE_V1_HEADER : version == 3 ? STATE_HEADER_BYTES : STATE_V2_HEADER;
}

typedef struct Packer { uint8_t *p; size_t off; } Packer;
static void put(Packer *k, const void *v, size_t n) { memcpy(k->p + k->off, v, n); k->off += n; }
static void get(Packer *k, void *v, size_t n) { memcpy(v, k->p + k->off, n); k->off += n; }

// The identity of this process's run (flags.c sets it), written into every state it saves.
static RunIdentity g_identity;
static int g_identity_set;

int ckpt_identity(RunIdentity *id) {
    if (g_identity_set) *id = g_identity;
    return g_identity_set;
}

void ckpt_set_identity(const RunIdentity *id) {
    if (id) g_identity = *id;
    g_identity_set = id != NULL;
}

int ckpt_file_crc(const char *path, uint64_t *size, uint32_t *crc, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        snprintf(err, errlen, "cannot read it: %s", strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    int rc = crc_of_stream(f, (size_t)st.st_size, crc);
    if (rc != 0) snprintf(err, errlen, "cannot read it: %s", ferror(f) ? strerror(errno) : "it shrank");
    fclose(f);
    return rc;
}

static void put_identity(uint8_t *p, const RunIdentity *id) {
    Packer k = {p, 0};
    int32_t ints[4] = {id->steps, id->warmup, id->batch, id->has_data};
    float hyper[3] = {id->lr, id->weight_decay, id->grad_clip};
    char data[256] = {0};
    snprintf(data, sizeof data, "%s", id->has_data ? id->data : "");
    put(&k, ints, sizeof ints);
    put(&k, &id->seed, 8);
    put(&k, &id->data_seed, 8);
    put(&k, hyper, sizeof hyper);
    put(&k, &id->data_crc, 4);
    put(&k, &id->data_size, 8);
    put(&k, data, sizeof data);
    LAB_CHECK(k.off == STATE_V2_HEADER - STATE_V1_HEADER, "identity is %zu bytes", k.off);
}

static void get_identity(uint8_t *p, RunIdentity *id) {
    Packer k = {p, 0};
    int32_t ints[4];
    float hyper[3];
    get(&k, ints, sizeof ints);
    get(&k, &id->seed, 8);
    get(&k, &id->data_seed, 8);
    get(&k, hyper, sizeof hyper);
    get(&k, &id->data_crc, 4);
    get(&k, &id->data_size, 8);
    get(&k, id->data, sizeof id->data);
    id->data[sizeof id->data - 1] = '\0';
    id->steps = ints[0], id->warmup = ints[1], id->batch = ints[2], id->has_data = ints[3];
    id->lr = hyper[0], id->weight_decay = hyper[1], id->grad_clip = hyper[2];
}

// ---- the guard record (format 3) ----

static CkptGuard g_guard, g_loaded;  // the one the next save writes; the last one loaded
static int g_guard_set, g_loaded_set;

void ckpt_set_guard(const CkptGuard *g) {
    if (g) g_guard = *g;
    g_guard_set = g != NULL;
}

int ckpt_guard(CkptGuard *g) {
    if (g_guard_set) *g = g_guard;
    return g_guard_set;
}

void ckpt_note_loaded_guard(const CkptGuard *g) {
    if (g) g_loaded = *g;
    g_loaded_set = g != NULL;
}

int ckpt_loaded_guard(CkptGuard *g) {
    if (g_loaded_set) *g = g_loaded;
    return g_loaded_set;
}

int ckpt_guard_why(const CkptGuard *g, char *err, size_t errlen) {
    int bad = g->cap < 1 || g->cap > CKPT_GUARD_WINDOW || g->nloss < 0 || g->nloss > g->cap ||
              g->ngnorm < 0 || g->ngnorm > g->cap || g->loss_head < 0 || g->loss_head >= g->cap ||
              g->gnorm_head < 0 || g->gnorm_head >= g->cap || g->nwin < 0 ||
              g->nwin > CKPT_GUARD_ROLLBACKS || g->nan_skips < 0 || g->spike_skips < 0 ||
              g->window_skips < 0 || g->rollbacks < 0;
    if (bad)
        snprintf(err, errlen, "its guard record is damaged (window of %d with %d and %d values, "
                 "%d rollbacks): not written by this lab", g->cap, g->nloss, g->ngnorm, g->nwin);
    return bad ? -1 : 0;
}

static void put_guard(uint8_t *p, const CkptGuard *g) {
    Packer k = {p, 0};
    int32_t ints[11] = {g->nan_skips, g->spike_skips, g->window_skips, g->rollbacks, g->cap,
                        g->nloss, g->loss_head, g->ngnorm, g->gnorm_head, g->lr_low_until, g->nwin};
    put(&k, ints, sizeof ints);
    put(&k, g->win_lo, sizeof g->win_lo);
    put(&k, g->win_hi, sizeof g->win_hi);
    put(&k, g->loss, sizeof g->loss);
    put(&k, g->gnorm, sizeof g->gnorm);
    LAB_CHECK(k.off == STATE_GUARD_BYTES, "guard record is %zu bytes", k.off);
}

static void get_guard(uint8_t *p, CkptGuard *g) {
    Packer k = {p, 0};
    int32_t ints[11];
    get(&k, ints, sizeof ints);
    get(&k, g->win_lo, sizeof g->win_lo);
    get(&k, g->win_hi, sizeof g->win_hi);
    get(&k, g->loss, sizeof g->loss);
    get(&k, g->gnorm, sizeof g->gnorm);
    g->nan_skips = ints[0], g->spike_skips = ints[1], g->window_skips = ints[2];
    g->rollbacks = ints[3], g->cap = ints[4], g->nloss = ints[5], g->loss_head = ints[6];
    g->ngnorm = ints[7], g->gnorm_head = ints[8], g->lr_low_until = ints[9], g->nwin = ints[10];
}

static void describe_data(char *buf, size_t n, const RunIdentity *id) {
    if (!id->has_data) snprintf(buf, n, "synthetic");
    else snprintf(buf, n, "%.200s (%llu bytes, crc32 %08x)", id->data,
                  (unsigned long long)id->data_size, id->data_crc);
}

int ckpt_identity_diff(const RunIdentity *was, const RunIdentity *now, char lines[][160],
                       const char *names[], int max) {
    int k = 0;
#define CHANGED(name, ...) do { if (k < max) { names[k] = name; \
        snprintf(lines[k], 160, __VA_ARGS__); } k++; } while (0)
    if (was->has_data != now->has_data || (was->has_data && (was->data_size != now->data_size ||
                                                            was->data_crc != now->data_crc))) {
        char a[256], b[256];
        describe_data(a, sizeof a, was);
        describe_data(b, sizeof b, now);
        CHANGED("data", "data %.70s -> %.70s", a, b);
    }
    if (was->data_seed != now->data_seed)
        CHANGED("data-seed", "data-seed %llu -> %llu", (unsigned long long)was->data_seed,
                (unsigned long long)now->data_seed);
    if (was->steps != now->steps)
        CHANGED("steps", "steps %d -> %d (the lr schedule's length)", was->steps, now->steps);
    if (memcmp(&was->lr, &now->lr, sizeof(float)) != 0)
        CHANGED("lr", "lr %g -> %g", (double)was->lr, (double)now->lr);
    if (was->warmup != now->warmup) CHANGED("warmup", "warmup %d -> %d", was->warmup, now->warmup);
    if (memcmp(&was->weight_decay, &now->weight_decay, sizeof(float)) != 0)
        CHANGED("weight-decay", "weight-decay %g -> %g", (double)was->weight_decay,
                (double)now->weight_decay);
    if (memcmp(&was->grad_clip, &now->grad_clip, sizeof(float)) != 0)
        CHANGED("grad-clip", "grad-clip %g -> %g", (double)was->grad_clip, (double)now->grad_clip);
    if (was->batch != now->batch) CHANGED("batch", "batch %d -> %d", was->batch, now->batch);
    if (was->seed != now->seed)
        CHANGED("seed", "seed %llu -> %llu", (unsigned long long)was->seed,
                (unsigned long long)now->seed);
#undef CHANGED
    return k;
}


// guard: the record to write (format 3), or NULL
static void save_state(const char *path, const TrainState *s, const CkptGuard *guard) {
    uint8_t hdr[STATE_HEADER_BYTES];
    Packer k = {hdr, 0};
    // no identity known: the old format; no guard record: format 2, as before there was one
    int32_t version = !g_identity_set ? 1 : guard ? 3 : 2;
    int32_t cfg[5] = {s->cfg.V, s->cfg.T, s->cfg.L, s->cfg.NH, s->cfg.C};
    int32_t total = s->total_steps == 0 && g_identity_set ? g_identity.steps : s->total_steps;
    int32_t step = s->step, sched[2] = {s->warmup_steps, total};
    float hyper[6] = {s->lr, s->beta1, s->beta2, s->eps, s->weight_decay, s->grad_clip};
    uint64_t n = s->n;
    put(&k, STATE_MAGIC, 8);
    put(&k, &version, 4);
    put(&k, cfg, sizeof(cfg));
    put(&k, &step, 4);
    put(&k, &s->seed, 8);
    put(&k, &s->data_seed, 8);
    put(&k, hyper, sizeof(hyper));
    put(&k, sched, sizeof(sched));
    put(&k, &n, 8);
    LAB_CHECK(k.off == STATE_V1_HEADER, "state header is %zu bytes", k.off);
    if (version >= 2) put_identity(hdr + STATE_V1_HEADER, &g_identity);
    if (version == 3) put_guard(hdr + STATE_V2_HEADER, guard);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, hdr, (size_t)state_header_bytes(version));
    atomic_write(&af, s->params, s->n * sizeof(float));
    atomic_write(&af, s->m, s->n * sizeof(float));
    atomic_write(&af, s->v, s->n * sizeof(float));
    uint32_t crc = af.crc;
    atomic_write(&af, &crc, 4);
    atomic_commit(&af);
}

void ckpt_save_state(const char *path, const TrainState *s) {
    save_state(path, s, g_guard_set ? &g_guard : NULL);
}

// The steps a state file may say: step in [0, STATE_MAX_STEPS] (the most --steps accepts), and
// not past total_steps when the file records it (0: unknown, as in format-1 states of 00..09).
// Anything else is a damaged file, or one not written by this lab: refused, not trained from.
#define STATE_MAX_STEPS 1000000000
static int state_steps_why(int32_t step, int32_t total, char *err, size_t errlen) {
    if (step < 0 || step > STATE_MAX_STEPS) {
        snprintf(err, errlen, "the state says step %d, which no run reaches (valid: 0 .. %d, the "
                 "range of --steps): damaged, or not written by this lab", step, STATE_MAX_STEPS);
        return -1;
    }
    if (total < 0 || total > STATE_MAX_STEPS || (total > 0 && step > total)) {
        snprintf(err, errlen, "the state says step %d of a %d-step run, which cannot be: "
                 "damaged, or not written by this lab", step, total);
        return -1;
    }
    return 0;
}

// The whole file checked before any field past the magic is used or reported: an exact size for
// the n it records (a byte short or appended is refused), the CRC32 over everything, then the
// version (before the CRC it only picks the header size to demand: a damaged version field ends
// in a size or CRC mismatch). 0 with the header in hdr and its size in *hbytes; -1 with the
// reason in err.
static int state_verify(const char *path, uint8_t hdr[STATE_HEADER_BYTES], size_t *hbytes,
                        char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f) {
        snprintf(err, errlen, "cannot open it: %s", strerror(errno));
        return -1;
    }
#define SFAIL(...) do { snprintf(err, errlen, __VA_ARGS__); fclose(f); return -1; } while (0)
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) SFAIL("not a regular file");
    size_t size = (size_t)st.st_size, got = fread(hdr, 1, STATE_HEADER_BYTES, f);
    if (got < 8 || memcmp(hdr, STATE_MAGIC, 8) != 0)
        SFAIL("wrong magic (expected \"%s\"): not a training-state checkpoint (weights files go "
              "to --load-weights)", STATE_MAGIC);
    if (got < STATE_V1_HEADER || size < STATE_V1_HEADER + 4)
        SFAIL("truncated: %zu bytes, shorter than the %d-byte header", size, STATE_V1_HEADER + 4);
    uint64_t n;
    int32_t version;
    memcpy(&n, hdr + 84, 8);
    memcpy(&version, hdr + 8, 4);
    size_t hb = (size_t)state_header_bytes(version);
    size_t want = hb + 12 * (size_t)n + 4;
    if (n > ((uint64_t)1 << 40) || size < want)
        SFAIL("truncated or damaged: %zu bytes, where the %llu parameters its header records need "
              "%zu", size, (unsigned long long)n, n > ((uint64_t)1 << 40) ? 0 : want);
    if (size > want)
        SFAIL("damaged: %zu bytes, %zu more than the %zu its header records: something was "
              "appended, or the header was damaged", size, size - want, want);
    uint32_t crc, stored;
    rewind(f);
    if (crc_of_stream(f, want - 4, &crc) != 0 || fread(&stored, 1, 4, f) != 4)
        SFAIL("cannot read it: %s", ferror(f) ? strerror(errno) : "unexpected end of file");
    if (crc != stored)
        SFAIL("corrupted: CRC32 mismatch (stored %08x, computed %08x); the file was damaged after "
              "it was written", stored, crc);
    if (version < 1 || version > STATE_VERSION)
        SFAIL("unsupported version %d (this lab reads versions 1 to %d)", version, STATE_VERSION);
#undef SFAIL
    fclose(f);
    *hbytes = hb;
    return 0;
}

// What a state says of itself, sharded (its manifest) or one file (its header, the file checked
// whole first: state_verify).
typedef struct StateHead {
    int step, total_steps;  // total: the run's --steps (0: unknown)
    GPT2Config cfg;
    RunIdentity id;         // (not in a format-1 file)
} StateHead;

// 1 with the identity, 0 without it (format 1), -1 with the reason in err.
static int state_head(const char *path, StateHead *h, char *err, size_t errlen) {
    if (ckpt_is_sharded(path)) {
        CkptManifest mf;
        if (ckpt_shard_verify(path, &mf, err, errlen) != 0) return -1;
        *h = (StateHead){.step = mf.step, .total_steps = mf.id.steps, .cfg = mf.cfg, .id = mf.id};
        return 1;
    }
    uint8_t hdr[STATE_HEADER_BYTES];
    size_t hb;
    if (state_verify(path, hdr, &hb, err, errlen) != 0) return -1;
    int32_t c[5], st, sched[2];
    memcpy(c, hdr + 12, sizeof c);  // after the magic (8) and the version (4): V, T, L, NH, C
    memcpy(&st, hdr + 32, 4);
    memcpy(sched, hdr + 76, 8);
    *h = (StateHead){.step = st, .total_steps = sched[1],
                     .cfg = {.V = c[0], .T = c[1], .L = c[2], .NH = c[3], .C = c[4]}};
    if (hb == STATE_V1_HEADER) return 0;
    get_identity(hdr + STATE_V1_HEADER, &h->id);
    return 1;
}

int ckpt_state_peek(const char *path, int *step, int *total_steps, char *err, size_t errlen) {
    StateHead h;
    if (state_head(path, &h, err, errlen) < 0) return -1;
    if (state_steps_why(h.step, h.total_steps, err, errlen) != 0) return -1;
    *step = h.step;
    *total_steps = h.total_steps;
    return 0;
}

int ckpt_state_config(const char *path, GPT2Config *cfg, char *err, size_t errlen) {
    StateHead h;
    if (state_head(path, &h, err, errlen) < 0) return -1;
    *cfg = h.cfg;
    return 0;
}

int ckpt_state_identity(const char *path, RunIdentity *id, char *err, size_t errlen) {
    StateHead h;
    const int got = state_head(path, &h, err, errlen);
    if (got == 1) *id = h.id;
    return got;
}

void ckpt_load_state(const char *path, const GPT2Config *expect, TrainState *s) {
    double t0 = lab_now();
    uint8_t hdr[STATE_HEADER_BYTES];
    size_t hb;
    char why[512];
    if (state_verify(path, hdr, &hb, why, sizeof why) != 0) lab_fail_collective("cannot load %s: %s", path, why);
    Packer k = {hdr, 8};
    int32_t version, cfg[5], step, sched[2];
    float hyper[6];
    uint64_t n;
    get(&k, &version, 4);
    get(&k, cfg, sizeof(cfg));
    get(&k, &step, 4);
    get(&k, &s->seed, 8);
    get(&k, &s->data_seed, 8);
    get(&k, hyper, sizeof(hyper));
    get(&k, sched, sizeof(sched));
    get(&k, &n, 8);
    GPT2Config have = {.V = cfg[0], .T = cfg[1], .L = cfg[2], .NH = cfg[3], .C = cfg[4]};
    check_config(path, &have, expect);
    if (state_steps_why(step, sched[1], why, sizeof why) != 0)
        lab_fail_collective("cannot load %s: %s", path, why);
    size_t expect_n = gpt2_param_count(expect);
    if ((size_t)n != expect_n)
        lab_fail_collective("cannot load %s: it holds %llu parameters, this run expects %zu", path,
                 (unsigned long long)n, expect_n);
    s->cfg = have;
    s->step = step;
    s->lr = hyper[0]; s->beta1 = hyper[1]; s->beta2 = hyper[2];
    s->eps = hyper[3]; s->weight_decay = hyper[4]; s->grad_clip = hyper[5];
    s->warmup_steps = sched[0];
    s->total_steps = sched[1];
    s->n = (size_t)n;
    if (hb == STATE_HEADER_BYTES) {  // format 3: the guard record (session_guard.c takes it)
        CkptGuard g;
        get_guard(hdr + STATE_V2_HEADER, &g);
        if (ckpt_guard_why(&g, why, sizeof why) != 0)
            lab_fail_collective("cannot load %s: %s", path, why);
        ckpt_note_loaded_guard(&g);
    } else {
        ckpt_note_loaded_guard(NULL);
    }
    FILE *f = fopen(path, "rb");
    if (!f || fseek(f, (long)hb, SEEK_SET) != 0)
        lab_fail_collective("cannot read %s: %s", path, strerror(errno));
    read_exact(f, s->params, s->n * sizeof(float), path);
    read_exact(f, s->m, s->n * sizeof(float), path);
    read_exact(f, s->v, s->n * sizeof(float), path);
    fclose(f);
    if (lab_log_rank == 0) {  // 08 and 09 read it on every rank: said once
        printf("restored step %d from %s in %.0f ms\n", step, path, (lab_now() - t0) * 1e3);
        fflush(stdout);
    }
}

// The three functions below take the model's buffers (memory order: block-major, gpt2.h);
// every file holds llm.c's order, so a file does not depend on the memory layout.
static float *to_file_order(const GPT2Config *cfg, const float *dev, size_t n) {
    LAB_CHECK(n == gpt2_param_count(cfg), "checkpoint of %zu elements, the full model has %zu", n,
              gpt2_param_count(cfg));
    float *mem = lab_xmalloc(n * sizeof(float)), *file = lab_xmalloc(n * sizeof(float));
    mem_copy(mem, dev, n * sizeof(float));
    gpt2_to_llmc(cfg, mem, file);
    free(mem);
    return file;
}

static void from_file_order(const GPT2Config *cfg, const float *file, float *dev, size_t n) {
    LAB_CHECK(n == gpt2_param_count(cfg), "checkpoint of %zu elements, the full model has %zu", n,
              gpt2_param_count(cfg));
    float *mem = lab_xmalloc(n * sizeof(float));
    gpt2_from_llmc(cfg, file, mem);
    mem_copy(dev, mem, n * sizeof(float));
    free(mem);
}

void ckpt_save_training(const char *path, const GPT2Config *cfg, int step, uint64_t seed,
                        uint64_t data_seed, const float *params, const float *m, const float *v,
                        size_t n) {
    if (g_policy.sharded) {  // a chapter whose one writer holds the whole state: one shard
        CkptShard sh;
        ckpt_shard_begin(&sh, n);
        ckpt_shard_add(&sh, 0, n, params, m, v);
        ckpt_shard_write(path, cfg, step, seed, data_seed, &sh);
        return;
    }
    // the host snapshot: copies in the file's order (the write, maybe in the background, owns them)
    TrainState st = {.cfg = *cfg, .step = step, .seed = seed, .data_seed = data_seed, .n = n};
    st.params = to_file_order(cfg, params, n);
    st.m = to_file_order(cfg, m, n);
    st.v = to_file_order(cfg, v, n);
    ckpt_write_state_owned(path, &st);
}

int ckpt_resume_training(const char *path, const GPT2Config *cfg, float *params, float *m,
                         float *v, size_t n) {
    ckpt_wait();  // a background write of this process first
    if (ckpt_is_sharded(path)) {  // memory order already: every shard's pieces into the whole
        float *buf[3] = {lab_xmalloc(n * sizeof(float)), lab_xmalloc(n * sizeof(float)),
                         lab_xmalloc(n * sizeof(float))};
        int step = ckpt_shard_load(path, cfg, buf[0], buf[1], buf[2], n);
        mem_copy(params, buf[0], n * sizeof(float));
        mem_copy(m, buf[1], n * sizeof(float));
        mem_copy(v, buf[2], n * sizeof(float));
        for (int i = 0; i < 3; i++) free(buf[i]);
        return step;
    }
    TrainState st = {.params = lab_xmalloc(n * sizeof(float)), .m = lab_xmalloc(n * sizeof(float)),
                     .v = lab_xmalloc(n * sizeof(float))};
    ckpt_load_state(path, cfg, &st);
    LAB_CHECK(st.n == n, "%s holds %zu parameters, the model has %zu", path, st.n, n);
    from_file_order(cfg, st.params, params, n);
    from_file_order(cfg, st.m, m, n);
    from_file_order(cfg, st.v, v, n);
    free(st.params);
    free(st.m);
    free(st.v);
    return st.step;
}

void ckpt_load_weights_into(const char *path, const GPT2Config *cfg, float *params, size_t n) {
    float *w = lab_xmalloc(n * sizeof(float));
    ckpt_load_weights(path, cfg, w);
    from_file_order(cfg, w, params, n);
    free(w);
}

// ---- the policy: background writes, rotation (ckpt.h) ------------------------------------------

static char g_command[1024];
static CkptStats g_stats;

void ckpt_set_policy(const CkptPolicy *p) { g_policy = *p; }
CkptPolicy ckpt_policy(void) { return g_policy; }

void ckpt_set_command(int argc, char **argv) {
    size_t k = 0;
    g_command[0] = '\0';
    for (int i = 0; i < argc && k + 2 < sizeof g_command; i++) {
        int w = snprintf(g_command + k, sizeof g_command - k, "%s%s", i ? " " : "", argv[i]);
        if (w < 0) break;
        k += (size_t)w;
        if (k >= sizeof g_command) k = sizeof g_command - 1;
    }
    for (char *c = g_command; *c; c++)
        if (*c == '\n') *c = ' ';
}
const char *ckpt_command(void) { return g_command; }

CkptStats ckpt_stats(void) { return g_stats; }

void ckpt_note_write(double t0, double t1) {
    g_stats.writes++;
    g_stats.write_s += t1 - t0;
}

const char *ckpt_step_path(char *buf, size_t len, const char *path, int step) {
    int w = g_policy.keep_last > 0 || g_policy.sharded ? snprintf(buf, len, "%s.step-%d", path, step)
                                                        : snprintf(buf, len, "%s", path);
    LAB_CHECK(w >= 0 && (size_t)w < len, "checkpoint path too long: %s", path);
    return buf;
}

int ckpt_is_sharded(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// a file, or a directory of files (a sharded checkpoint), removed
static void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[4200];
            int n = snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            if (n > 0 && (size_t)n < sizeof sub) remove(sub);  // (a path too long was never ours)
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        remove(path);
    }
}

typedef struct Kept { char name[4800]; double mtime; int step; } Kept;

static int newer_first(const void *a, const void *b) {
    const Kept *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? 1 : -1;
    return y->step - x->step;
}

void ckpt_rotate(const char *path, int step) {
    if (g_policy.keep_last <= 0 && !g_policy.sharded) return;
    char target[4200], link_tmp[4200], dir[4200];
    ckpt_step_path(target, sizeof target, path, step);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    const char *tbase = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else snprintf(dir, sizeof dir, ".");
    // <path> -> <path>.step-N: a new link renamed over the old one (atomic)
    snprintf(link_tmp, sizeof link_tmp, "%s.link-tmp", path);
    remove(link_tmp);
    if (symlink(tbase, link_tmp) != 0 || rename(link_tmp, path) != 0) {
        int err = errno;
        remove(link_tmp);
        lab_fail("cannot point %s at %s: %s (the checkpoint itself is complete in %s)", path,
                 target, strerror(err), target);
    }
    // the newest K (by time written; the one just written always) kept, the older removed
    int keep = g_policy.keep_last > 0 ? g_policy.keep_last : 1;
    DIR *d = opendir(dir);
    if (!d) return;
    Kept *list = NULL;
    int nk = 0, cap = 0;
    size_t blen = strlen(base);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, base, blen) != 0 || strncmp(nm + blen, ".step-", 6) != 0) continue;
        char *end = NULL;
        long st_no = strtol(nm + blen + 6, &end, 10);
        if (end == nm + blen + 6 || *end != '\0') continue;  // its .tmp and others: not ours
        if (!strcmp(nm, tbase)) continue;
        char full[4800];
        struct stat st;
        snprintf(full, sizeof full, "%s/%s", dir, nm);
        if (lstat(full, &st) != 0) continue;
        if (nk == cap) list = realloc(list, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(Kept));
        LAB_CHECK(list, "out of memory listing %s", dir);
        snprintf(list[nk].name, sizeof list[nk].name, "%s", full);
        list[nk].mtime = (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
        list[nk++].step = (int)st_no;
    }
    closedir(d);
    if (nk > 1) qsort(list, (size_t)nk, sizeof(Kept), newer_first);  // (none yet: list is NULL)
    for (int i = keep - 1; i < nk; i++)
        if (i >= 0) remove_tree(list[i].name);
    free(list);
}

// One background write at a time.
typedef struct AsyncJob {
    char path[4200];
    TrainState st;           // owned arrays (state), with the guard record as it was, or:
    CkptGuard guard;
    int has_guard;
    void *buf;               // owned bytes (a shard)
    size_t nbytes;
    void (*after)(void *);   // (shards) called in the thread after the write
    void *after_arg;
    double t0, t1;
} AsyncJob;

static pthread_t g_thread;
static int g_running;
static AsyncJob g_job;
static int g_atexit;

static void run_job(AsyncJob *j) {
    j->t0 = lab_now();
    if (j->buf) {
        file_write_atomic(j->path, j->buf, j->nbytes);
        free(j->buf);
        j->buf = NULL;
    } else {
        char final[4200];
        ckpt_step_path(final, sizeof final, j->path, j->st.step);
        save_state(final, &j->st, j->has_guard ? &j->guard : NULL);
        ckpt_rotate(j->path, j->st.step);
        free(j->st.params), free(j->st.m), free(j->st.v);
    }
    if (j->after) j->after(j->after_arg);
    j->t1 = lab_now();
}

static void *job_thread(void *arg) {
    run_job(arg);
    return NULL;
}

void ckpt_wait(void) {
    if (!g_running) return;
    if (pthread_equal(pthread_self(), g_thread)) return;  // (an exit from the writer itself)
    pthread_join(g_thread, NULL);
    g_running = 0;
    ckpt_note_write(g_job.t0, g_job.t1);
    if (trace_enabled()) trace_span("checkpoint write (background)", TRACE_OTHER, g_job.t0, g_job.t1);
}

static void wait_at_exit(void) { ckpt_wait(); }

static void start_job(void) {
    ckpt_wait();
    if (!g_policy.async) {
        run_job(&g_job);
        ckpt_note_write(g_job.t0, g_job.t1);
        return;
    }
    if (!g_atexit) {  // an exit (the end, or an error elsewhere) lets the write finish first
        atexit(wait_at_exit);
        g_atexit = 1;
    }
    LAB_CHECK(pthread_create(&g_thread, NULL, job_thread, &g_job) == 0,
              "--async-save: cannot start the writer thread");
    g_running = 1;
}

void ckpt_write_state_owned(const char *path, TrainState *st) {
    ckpt_wait();
    memset(&g_job, 0, sizeof g_job);
    snprintf(g_job.path, sizeof g_job.path, "%s", path);
    g_job.st = *st;
    g_job.has_guard = ckpt_guard(&g_job.guard);  // (the record now: an --async-save writes later)
    start_job();
}

void ckpt_write_bytes_owned(const char *path, void *buf, size_t n, void (*after)(void *),
                            void *arg) {
    ckpt_wait();
    memset(&g_job, 0, sizeof g_job);
    snprintf(g_job.path, sizeof g_job.path, "%s", path);
    g_job.buf = buf;
    g_job.nbytes = n;
    g_job.after = after;
    g_job.after_arg = arg;
    start_job();
}
