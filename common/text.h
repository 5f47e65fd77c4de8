// text.h: real text in, text out. The lab's corpus (--data text), the validation loss
// (--val-every) and sampling (--sample, --generate).
//
// The corpus is built at run time from the fortune files Debian's `fortunes-min` and `fortunes`
// packages install in /usr/share/games/fortunes (Makefile's DEB_PKGS installs them): the files
// of TEXT_CORPUS_FILES, in that order, as one byte stream, about 2.5 MB of English quotes. Each
// fortune ends with a line "%" in the files; here that line becomes an empty one, so a blank
// line separates the quotes. Overstrike sequences (X, backspace, Y: old terminals' bold and
// underline) keep Y; other control bytes but newline and tab are dropped; UTF-8 stays as bytes.
// Byte-level (V = 256); the last 10 % is the validation split (data_split_validation).
//
// Validation and sampling run on world rank 0 on the WHOLE model: the chapter's
// state.weights_to_host gathers it (every layout's one whole <-> slice path: gpt2_unshard,
// zero_gather_full), and a host fp32 GPT2 of the same config computes from it. So the held-out
// batches, the forward that scores them and the sampler are the same code in every layout; a
// layout differs only in the weights it trained. What the aside allocates is left out of the
// run's memory figures (mem_peaks_save/restore) and what the gather moves out of its per-step
// byte figures (Session.save_cost).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "gpt2.h"

#define TEXT_CORPUS_DIR "/usr/share/games/fortunes"
#define TEXT_VAL_BATCHES 4  // --val-every: the loss is the mean over these held-out batches

// The corpus into d (byte-level, the validation split kept apart). The directory is
// $LAB_FORTUNES_DIR when set (tests), else TEXT_CORPUS_DIR. Fails with one clear message
// (every rank meets it) when a file is missing (naming the packages) or the result is empty.
void text_corpus_init(DataSource *d, int T, uint64_t seed);
// The corpus as text_corpus_init builds it (malloc'd; *n its bytes), for tools and tests.
uint8_t *text_corpus_bytes(const char *dir, size_t *n);

// Mean loss over the TEXT_VAL_BATCHES validation batches of (B, T) of data_val_batch, of the
// whole model `llmc` (fp32, llm.c's order, as state.weights_to_host gives it), on the host.
double text_val_loss(const GPT2Config *cfg, const float *llmc, const DataSource *d, int B, int T);

typedef struct TextSampling {
    int n;               // bytes to generate
    float temperature;   // > 0: logits / temperature before the softmax
    int top_k;           // 0: every byte; else only the k most likely
    uint64_t seed;       // draw i uses a hash of (seed, i): no generator state
} TextSampling;

// Generate sp->n bytes after the prompt (a newline: the start of a quote) with the whole model
// `llmc`, on the host, one forward of the last T bytes per new byte; out gets sp->n bytes.
// Returns the seconds it took.
double text_sample(const GPT2Config *cfg, const float *llmc, const TextSampling *sp, uint8_t *out);
// The sample as the runs print it: a header (bytes, temperature, top-k, seed, where it ran,
// tokens/s) and the text between two rules, each byte as text_shown gives it.
// A byte as a sample shows it: itself, but a control byte other than newline and tab (an
// untrained model draws them) as '?', so the text stays one printable string.
static inline uint8_t text_shown(uint8_t b) {
    return (b < 0x20 && b != '\n' && b != '\t') || b == 0x7f ? (uint8_t)'?' : b;
}
void text_print_sample(const TextSampling *sp, const uint8_t *out, double seconds,
                       const char *where);
