// results.c: the --dump file that the test harness compares runs with (see results.h).
//
// Layout (little-endian, as every machine this lab runs on):
//   "LABDUMP1" | int32 nsteps | float losses[nsteps] | uint64 nparams | float params[nparams]
//   | int32 nkv | nkv x (char key[48], double value) | uint32 crc32 of everything before
#include "results.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt.h"
#include "mem.h"

#define RESULTS_MAGIC "LABDUMP1"
#define KEY_LEN 48

void results_init(RunResults *r, int nsteps, size_t nparams) {
    LAB_CHECK(nsteps >= 0, "results_init: nsteps %d < 0", nsteps);
    memset(r, 0, sizeof *r);
    r->nsteps = nsteps;
    r->losses = lab_xcalloc((size_t)nsteps, sizeof(float));
    r->nparams = nparams;
    r->params = nparams ? lab_xcalloc(nparams, sizeof(float)) : NULL;
}

static int find_key(const RunResults *r, const char *key) {
    for (int i = 0; i < r->nkv; i++)
        if (strncmp(r->keys[i], key, KEY_LEN) == 0) return i;
    return -1;
}

void results_set(RunResults *r, const char *key, double val) {
    LAB_CHECK(strlen(key) < KEY_LEN, "results_set: key \"%s\" is longer than %d characters", key, KEY_LEN - 1);
    int i = find_key(r, key);
    if (i < 0) {
        LAB_CHECK(r->nkv < RESULTS_MAX_KV, "results_set: more than %d keys (adding \"%s\")", RESULTS_MAX_KV, key);
        i = r->nkv++;
        memset(r->keys[i], 0, KEY_LEN);
        memcpy(r->keys[i], key, strlen(key));
    }
    r->vals[i] = val;
}

void results_setf(RunResults *r, double val, const char *fmt, ...) {
    char key[2 * KEY_LEN];  // longer than a key may be: results_set refuses one too long
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    results_set(r, key, val);
}

double results_get(const RunResults *r, const char *key, double missing) {
    int i = find_key(r, key);
    return i < 0 ? missing : r->vals[i];
}

int results_has(const RunResults *r, const char *key) { return find_key(r, key) >= 0; }

// Appends n bytes at *pos.
static void put(char *buf, size_t *pos, const void *src, size_t n) {
    if (n) memcpy(buf + *pos, src, n);
    *pos += n;
}

void results_write(const char *path, const RunResults *r) {
    size_t total = 8 + 4 + (size_t)r->nsteps * 4 + 8 + r->nparams * 4 + 4 + (size_t)r->nkv * (KEY_LEN + 8) + 4;
    char *buf = lab_xmalloc(total);
    size_t pos = 0;
    int32_t nsteps = r->nsteps, nkv = r->nkv;
    uint64_t nparams = r->nparams;
    put(buf, &pos, RESULTS_MAGIC, 8);
    put(buf, &pos, &nsteps, 4);
    put(buf, &pos, r->losses, (size_t)r->nsteps * 4);
    put(buf, &pos, &nparams, 8);
    put(buf, &pos, r->params, r->nparams * 4);
    put(buf, &pos, &nkv, 4);
    for (int i = 0; i < r->nkv; i++) {
        put(buf, &pos, r->keys[i], KEY_LEN);
        put(buf, &pos, &r->vals[i], 8);
    }
    uint32_t crc = crc32_of(buf, pos);
    put(buf, &pos, &crc, 4);
    LAB_CHECK(pos == total, "results_write: wrote %zu bytes, expected %zu", pos, total);
    file_write_atomic(path, buf, total);
    free(buf);
}

// Reads n bytes at *pos of a file of size len; 0 when the file ends first.
static int take(const char *buf, size_t len, size_t *pos, void *dst, size_t n) {
    if (n > len - *pos) return 0;
    if (n) memcpy(dst, buf + *pos, n);
    *pos += n;
    return 1;
}

int results_read(const char *path, RunResults *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open (was the run given --dump %s?)", path, path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long flen = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (flen < 0) {
        fclose(f);
        snprintf(err, errlen, "%s: cannot read its size", path);
        return -1;
    }
    size_t len = (size_t)flen;
    char *buf = malloc(len ? len : 1);
    if (!buf || fread(buf, 1, len, f) != len) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "%s: read failed", path);
        return -1;
    }
    fclose(f);

    size_t pos = 0;
    char magic[8];
    int32_t nsteps = 0, nkv = 0;
    uint64_t nparams = 0;
    const char *why = NULL;
    if (!take(buf, len, &pos, magic, 8) || memcmp(magic, RESULTS_MAGIC, 8) != 0) why = "not a results file (bad magic)";
    else if (len < 8 + 4 + 8 + 4 + 4) why = "truncated";
    else {
        uint32_t stored, crc = crc32_of(buf, len - 4);
        memcpy(&stored, buf + len - 4, 4);
        if (stored != crc) why = "CRC mismatch (file corrupted or truncated)";
    }
    // The CRC held, so the sizes below can be trusted only if they also fit the file.
    if (!why && (!take(buf, len, &pos, &nsteps, 4) || nsteps < 0 || (size_t)nsteps > (len - pos) / 4))
        why = "bad step count";
    if (!why) {
        r->nsteps = nsteps;
        r->losses = lab_xcalloc((size_t)nsteps, sizeof(float));
        take(buf, len, &pos, r->losses, (size_t)nsteps * 4);
        if (!take(buf, len, &pos, &nparams, 8) || nparams > (len - pos) / 4) why = "bad parameter count";
    }
    if (!why) {
        r->nparams = (size_t)nparams;
        r->params = nparams ? lab_xcalloc((size_t)nparams, sizeof(float)) : NULL;
        take(buf, len, &pos, r->params, (size_t)nparams * 4);
        if (!take(buf, len, &pos, &nkv, 4) || nkv < 0 || nkv > RESULTS_MAX_KV) why = "bad key count";
    }
    for (int i = 0; !why && i < nkv; i++) {
        if (!take(buf, len, &pos, r->keys[i], KEY_LEN) || !take(buf, len, &pos, &r->vals[i], 8)) why = "truncated keys";
        else r->keys[i][KEY_LEN - 1] = '\0';
    }
    if (!why) {
        r->nkv = nkv;
        if (pos + 4 != len) why = "unexpected size";
    }
    free(buf);
    if (why) {
        snprintf(err, errlen, "%s: %s", path, why);
        results_free(r);
        return -1;
    }
    return 0;
}

void results_free(RunResults *r) {
    free(r->losses);
    free(r->params);
    r->losses = NULL;
    r->params = NULL;
    r->nsteps = 0;
    r->nparams = 0;
    r->nkv = 0;
}

void results_set_memory(RunResults *r) {
    static const char *keys[MEM_NCATS] = {"mem_params", "mem_grads", "mem_master", "mem_opt_m",
                                          "mem_opt_v", "mem_acts", "mem_comm", "mem_other"};
    for (int c = 0; c < MEM_NCATS; c++) results_set(r, keys[c], (double)mem_peak((MemCategory)c));
    results_set_peak(r);
}

void results_set_peak(RunResults *r) {
    results_set(r, "mem_peak", (double)mem_process_peak());
    if (mem_predicted_peak() > 0) results_set(r, "mem_predicted", mem_predicted_peak());
}
