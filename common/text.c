// text.c: the lab's corpus, the validation loss and the sampler (see text.h).
#include "text.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem.h"

// The corpus: these files, in this order (fortunes-min: fortunes, literature, riddles; the rest:
// fortunes). art and ascii-art are left out: pictures, not sentences.
static const char *const TEXT_CORPUS_FILES[] = {
    "fortunes", "literature", "riddles",  // fortunes-min
    "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education", "ethnic",
    "food", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie", "love",
    "magic", "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people", "perl",
    "pets", "platitudes", "politics", "pratchett", "science", "songs-poems", "sports",
    "startrek", "tao", "translate-me", "wisdom", "work", "zippy",
};
#define NFILES (sizeof TEXT_CORPUS_FILES / sizeof TEXT_CORPUS_FILES[0])

// One fortune file's bytes appended to out (the rules of text.h: "%" lines become empty ones,
// overstrikes keep the second byte, other control bytes but '\n' and '\t' dropped).
static size_t append_clean(uint8_t *out, const uint8_t *in, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const int line_start = i == 0 || in[i - 1] == '\n';
        if (line_start && in[i] == '%' && (i + 1 == n || in[i + 1] == '\n')) continue;  // "%" line
        if (i + 1 < n && in[i + 1] == '\b') { i++; continue; }  // X backspace: keep what follows
        if (in[i] < 0x20 && in[i] != '\n' && in[i] != '\t') continue;
        out[o++] = in[i];
    }
    return o;
}

uint8_t *text_corpus_bytes(const char *dir, size_t *n) {
    uint8_t *all = NULL;
    size_t len = 0;
    for (size_t f = 0; f < NFILES; f++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, TEXT_CORPUS_FILES[f]);
        FILE *fp = fopen(path, "rb");
        if (!fp)
            lab_fail_collective("--data text: cannot open %s (%s); the corpus is built from "
                                "Debian's fortunes-min and fortunes packages: `make deps`, or "
                                "sudo apt-get install fortunes-min fortunes", path,
                                strerror(errno));
        fseek(fp, 0, SEEK_END);
        long size = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        uint8_t *raw = lab_xmalloc(size > 0 ? (size_t)size : 1);
        size_t got = size > 0 ? fread(raw, 1, (size_t)size, fp) : 0;
        fclose(fp);
        if (memchr(raw, 0, got))
            lab_fail_collective("--data text: %s looks binary (a NUL byte): the corpus takes "
                                "text files", path);
        uint8_t *grown = realloc(all, len + got + 1);
        if (!grown) lab_fail("out of host memory building the text corpus");
        all = grown;
        len += append_clean(all + len, raw, got);
        free(raw);
    }
    *n = len;
    return all;
}

void text_corpus_init(DataSource *d, int T, uint64_t seed) {
    const char *dir = getenv("LAB_FORTUNES_DIR");
    if (!dir || !*dir) dir = TEXT_CORPUS_DIR;
    memset(d, 0, sizeof *d);
    size_t n = 0;
    uint8_t *bytes = text_corpus_bytes(dir, &n);
    if (n < 2 * ((size_t)T + 1))
        lab_fail_collective("--data text: the corpus built from %s has %zu bytes (empty or "
                            "nearly): it needs at least %d for --seq %d", dir, n, 2 * (T + 1), T);
    d->V = 256;
    d->seed = seed;
    d->is_file = 1;
    d->path = strdup("text");
    d->bytes = bytes;
    d->nbytes = n;
    data_split_validation(d, T);
}

// ---- the whole model on the host ----------------------------------------------------------------

// A host fp32 model of cfg with activations for (B, T), its weights from llmc (llm.c's order).
static void host_model(GPT2 *m, const GPT2Config *cfg, const float *llmc, int B, int T) {
    gpt2_build(m, *cfg, DEV_CPU);
    gpt2_alloc_acts(m, B, T);
    gpt2_from_llmc(cfg, llmc, m->params);
}

double text_val_loss(const GPT2Config *cfg, const float *llmc, const DataSource *d, int B, int T) {
    MemPeaks peaks = mem_peaks_save();  // an aside: not the run's memory
    GPT2 m;
    host_model(&m, cfg, llmc, B, T);
    int *in = lab_xmalloc((size_t)B * T * sizeof(int)), *tg = lab_xmalloc((size_t)B * T * sizeof(int));
    double sum = 0;
    for (int i = 0; i < TEXT_VAL_BATCHES; i++) {
        data_val_batch(d, i, B, T, in, tg);
        sum += gpt2_forward(&m, in, tg);
    }
    free(in), free(tg);
    gpt2_free(&m);
    mem_peaks_restore(&peaks);
    return sum / TEXT_VAL_BATCHES;
}

static int descending(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

// One byte from the logits of a position: softmax(logits / temperature) over the top_k most
// likely (all if 0), inverted at the uniform u. In double, in byte order: the same everywhere.
static int draw(const float *logits, int V, const TextSampling *sp, double u) {
    double p[256];
    LAB_CHECK(V <= 256, "sampling a vocabulary of %d (bytes: 256)", V);
    double cut = -INFINITY;  // the k-th largest logit: below it, left out
    if (sp->top_k > 0 && sp->top_k < V) {
        float sorted[256];
        memcpy(sorted, logits, (size_t)V * sizeof(float));
        qsort(sorted, (size_t)V, sizeof(float), descending);
        cut = sorted[sp->top_k - 1];  // (ties with it stay in)
    }
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++) if (logits[v] > mx) mx = logits[v];
    for (int v = 0; v < V; v++) {
        p[v] = logits[v] >= cut ? exp(((double)logits[v] - mx) / sp->temperature) : 0.0;
        sum += p[v];
    }
    double c = 0, target = u * sum;
    int last = 0;
    for (int v = 0; v < V; v++) {
        if (p[v] == 0) continue;
        c += p[v];
        last = v;
        if (target < c) return v;
    }
    return last;
}

double text_sample(const GPT2Config *cfg, const float *llmc, const TextSampling *sp, uint8_t *out) {
    const int T = cfg->T, V = cfg->V;
    MemPeaks peaks = mem_peaks_save();
    GPT2 m;
    host_model(&m, cfg, llmc, 1, T);
    int *ctx = lab_xcalloc((size_t)T, sizeof(int));
    double t0 = lab_now();
    int len = 1;
    ctx[0] = '\n';  // the prompt: the start of a quote
    for (int i = 0; i < sp->n; i++) {
        // causal: position len-1 sees only the len bytes before it; the rest of ctx is padding
        gpt2_forward(&m, ctx, NULL);
        const float *logits = m.act.a.logits + (size_t)(len - 1) * V;
        // draw i of seed s: mix(mix(s) ^ i)
        double u = (double)(data_mix64(data_mix64(sp->seed) ^ (uint64_t)i) >> 11) * (1.0 / 9007199254740992.0);
        int b = draw(logits, V, sp, u);
        out[i] = (uint8_t)b;
        if (len == T) {  // the window slides: keep the last T - 1 bytes
            memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof(int));
            len--;
        }
        ctx[len++] = b;
    }
    double seconds = lab_now() - t0;
    free(ctx);
    gpt2_free(&m);
    mem_peaks_restore(&peaks);
    return seconds;
}

void text_print_sample(const TextSampling *sp, const uint8_t *out, double seconds,
                       const char *where) {
    printf("sample: %d bytes, temperature %g, top-k %d, seed %llu; generated %s, %.0f tokens/s\n",
           sp->n, sp->temperature, sp->top_k, (unsigned long long)sp->seed, where,
           seconds > 0 ? sp->n / seconds : 0.0);
    printf("----- sample -----\n");
    for (int i = 0; i < sp->n; i++) putchar(text_shown(out[i]));
    printf("\n----- end of sample -----\n");
    fflush(stdout);
}
