// calc.c: where one GPU's memory goes, and what training costs.
//
// Models (presets, explicit dims, or a raw parameter count), parameter counts per pipeline
// stage and tensor-parallel rank, bytes per rank for each category of memory, activation
// formulas (Korthikanti et al. 2022, and the exact bytes of this lab's own runtime), the cost
// formula, and the printers. The layout planner that uses all this lives in planner.c.
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "calc.h"
#include "check.h"
#include "schedule.h"

int calc_micro_batches(const CalcSetup *s) { return s->micro_batches > 0 ? s->micro_batches : s->pp; }

#define GIB (1024.0 * 1024.0 * 1024.0)

// Messages returned by the *_check functions live here until the next call.
static char msg_buf[1024];

const char *calc_msg(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg_buf, sizeof msg_buf, fmt, ap);
    va_end(ap);
    return msg_buf;
}

// ------------------------------------------------------------------------------------------
// Models

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Parameters of one layer: the part Megatron splits across TP ranks (the weight matrices and
// the biases of column-parallel layers) and the part every TP rank replicates (norms and the
// biases of row-parallel layers, which are added after the all-reduce).
static void layer_params(const CalcModel *m, int64_t *split, int64_t *repl) {
    int64_t C = m->C, F = m->FFN;
    int64_t kv = (int64_t)m->KV * (m->C / m->NH);   // width of K (and of V)
    int64_t mlp_in = m->gated ? 2 : 1;              // SwiGLU: gate and up matrices
    if (m->arch == CALC_ARCH_GPT2) {
        *split = (C + 2 * kv) * C + (C + 2 * kv)    // qkvw, qkvb (column parallel)
               + C * C                              // attprojw (row parallel)
               + mlp_in * (F * C + F)               // fcw, fcb (column parallel)
               + C * F;                             // fcprojw (row parallel)
        *repl = 2 * C + 2 * C                       // ln1 w,b and ln2 w,b
              + C + C;                              // attprojb, fcprojb
    } else {
        *split = (C + 2 * kv) * C + C * C + (mlp_in + 1) * C * F;  // wq wk wv, wo, MLP
        *repl = 2 * C;                                             // two RMSNorm weights
    }
}

static int64_t final_norm_params(const CalcModel *m) {
    return m->arch == CALC_ARCH_GPT2 ? 2 * (int64_t)m->C : m->C;
}

int64_t calc_param_count(const CalcModel *m) {
    if (m->arch == CALC_ARCH_RAW) return m->nparams;
    int64_t split, repl;
    layer_params(m, &split, &repl);
    int64_t V = m->V, C = m->C;
    int64_t n = V * C;                                      // wte
    if (m->arch == CALC_ARCH_GPT2) n += (int64_t)m->T * C;  // wpe
    n += (int64_t)m->L * (split + repl);
    n += final_norm_params(m);
    if (!m->tied) n += V * C;                               // separate output layer
    return n;
}

static int dims_in_range(const CalcModel *m) {
    return m->V >= 1 && m->V <= (1 << 24) && m->T >= 1 && m->T <= (1 << 24) && m->L >= 1 &&
           m->L <= (1 << 16) && m->C >= 1 && m->C <= (1 << 20) && m->NH >= 1 && m->NH <= m->C &&
           m->KV >= 1 && m->KV <= m->NH && m->FFN >= 1 && m->FFN <= (1 << 22) &&
           m->C % m->NH == 0 && m->NH % m->KV == 0;
}

CalcModel calc_model_dims(const char *name, CalcArch arch, int V, int T, int L, int C, int NH,
                          int KV, int FFN) {
    CalcModel m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "%s", name ? name : "custom");
    m.arch = arch;
    m.V = V; m.T = T; m.L = L; m.C = C; m.NH = NH;
    m.KV = KV > 0 ? KV : NH;
    if (FFN > 0) m.FFN = FFN;
    else if (arch == CALC_ARCH_LLAMA) m.FFN = 256 * (int)ceil_div((8 * (int64_t)C) / 3, 256);
    else m.FFN = 4 * C;
    m.gated = arch == CALC_ARCH_LLAMA;
    m.tied = arch == CALC_ARCH_GPT2;
    m.about = "explicit dimensions";
    m.alias = "";
    m.nparams = dims_in_range(&m) ? calc_param_count(&m) : 0;
    return m;
}

CalcModel calc_model_from_gpt2(const GPT2Config *cfg) {
    CalcModel m = calc_model_dims("lab", CALC_ARCH_GPT2, cfg->V, cfg->T, cfg->L, cfg->C, cfg->NH,
                                  0, 0);
    m.about = "the lab's GPT-2 (--vocab --seq --layers --channels --heads)";
    return m;
}

CalcModel calc_model_raw(int64_t nparams) {
    CalcModel m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "params");
    m.arch = CALC_ARCH_RAW;
    m.nparams = nparams;
    m.about = "a parameter count only (--params)";
    m.alias = "";
    return m;
}

// The presets. Dims are the published configurations; `published` is the size the model is
// known by (the test checks our count against it to 1 %).
typedef struct PresetDims {
    const char *name, *alias;
    CalcArch arch;
    int V, T, L, C, NH, KV, FFN;
    double published;
    const char *about;
} PresetDims;

static const PresetDims preset_dims[] = {
    {"tiny", "tiny", CALC_ARCH_GPT2, 256, 64, 4, 128, 4, 4, 512, 834304,
     "the lab's default GPT-2 (docs/ARCHITECTURE.md): V=256 T=64 L=4 C=128 NH=4"},
    {"gpt2-124m", "124m", CALC_ARCH_GPT2, 50257, 1024, 12, 768, 12, 12, 3072, 124439808,
     "GPT-2 small: L=12 C=768 NH=12, V=50257 (llm.c pads V to 50304: 124,475,904)"},
    {"gpt2-350m", "350m", CALC_ARCH_GPT2, 50257, 1024, 24, 1024, 16, 16, 4096, 355e6,
     "GPT-2 medium (355M): L=24 C=1024 NH=16"},
    {"gpt2-774m", "774m", CALC_ARCH_GPT2, 50257, 1024, 36, 1280, 20, 20, 5120, 774e6,
     "GPT-2 large (774M): L=36 C=1280 NH=20"},
    {"gpt2-1.5b", "1.5b", CALC_ARCH_GPT2, 50257, 1024, 48, 1600, 25, 25, 6400, 1558e6,
     "GPT-2 XL (1558M): L=48 C=1600 NH=25"},
    {"llama2-7b", "7b", CALC_ARCH_LLAMA, 32000, 4096, 32, 4096, 32, 32, 11008, 6.74e9,
     "Llama 2 7B (6.74B): L=32 C=4096 NH=32 FFN=11008 V=32000, SwiGLU, untied"},
    {"llama2-13b", "13b", CALC_ARCH_LLAMA, 32000, 4096, 40, 5120, 40, 40, 13824, 13.0e9,
     "Llama 2 13B (13.0B): L=40 C=5120 NH=40 FFN=13824 V=32000"},
    {"llama3-70b", "70b", CALC_ARCH_LLAMA, 128256, 8192, 80, 8192, 64, 8, 28672, 70.6e9,
     "Llama 3 70B (70.6B): L=80 C=8192 NH=64 KV=8 FFN=28672 V=128256"},
    {"llama3-405b", "405b", CALC_ARCH_LLAMA, 128256, 8192, 126, 16384, 128, 8, 53248, 405e9,
     "Llama 3.1 405B: L=126 C=16384 NH=128 KV=8 FFN=53248 V=128256 (pretraining T=8192)"},
};
#define NPRESETS ((int)(sizeof preset_dims / sizeof preset_dims[0]))
static CalcModel presets[NPRESETS];
static int presets_ready;

static void presets_init(void) {
    if (presets_ready) return;
    for (int i = 0; i < NPRESETS; i++) {
        const PresetDims *d = &preset_dims[i];
        presets[i] = calc_model_dims(d->name, d->arch, d->V, d->T, d->L, d->C, d->NH, d->KV,
                                     d->FFN);
        presets[i].published = d->published;
        presets[i].about = d->about;
        presets[i].alias = d->alias;
    }
    presets_ready = 1;
}

int calc_model_preset_count(void) { return NPRESETS; }

const CalcModel *calc_model_preset_at(int i) {
    presets_init();
    return (i >= 0 && i < NPRESETS) ? &presets[i] : NULL;
}

const CalcModel *calc_model_preset(const char *name) {
    presets_init();
    for (int i = 0; name && i < NPRESETS; i++)
        if (strcmp(name, preset_dims[i].name) == 0 || strcmp(name, preset_dims[i].alias) == 0)
            return &presets[i];
    return NULL;
}

const char *calc_model_preset_error(const char *name) {
    char list[320] = "";
    for (int i = 0; i < NPRESETS; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s (%s)", i ? ", " : "", preset_dims[i].name,
                 preset_dims[i].alias);
    }
    return calc_msg("unknown --model '%s': valid presets are %s (or 'lab' for the shared model "
                    "flags, --dims for explicit dimensions, --params for a raw count)",
                    name ? name : "(null)", list);
}

const char *calc_model_check(const CalcModel *m) {
    if (m->arch == CALC_ARCH_RAW) {
        if (m->nparams < 1) return calc_msg("--params %lld: the parameter count must be positive",
                                            (long long)m->nparams);
        return NULL;
    }
    if (m->arch != CALC_ARCH_GPT2 && m->arch != CALC_ARCH_LLAMA)
        return calc_msg("model '%s': unknown architecture %d (valid: gpt2, llama)", m->name, m->arch);
    struct { const char *key; int val, max; } f[] = {
        {"V", m->V, 1 << 24}, {"T", m->T, 1 << 24}, {"L", m->L, 1 << 16}, {"C", m->C, 1 << 20},
        {"NH", m->NH, m->C}, {"KV", m->KV, m->NH}, {"FFN", m->FFN, 1 << 22},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].val < 1 || f[i].val > f[i].max)
            return calc_msg("model '%s': %s=%d is out of range (valid: 1..%d)", m->name, f[i].key,
                            f[i].val, f[i].max < 1 ? 1 : f[i].max);
    if (m->C % m->NH != 0)
        return calc_msg("model '%s': C=%d is not divisible by NH=%d (the head size C/NH must be a "
                        "whole number)", m->name, m->C, m->NH);
    if (m->NH % m->KV != 0)
        return calc_msg("model '%s': NH=%d is not divisible by KV=%d (each key/value head serves a "
                        "whole group of query heads)", m->name, m->NH, m->KV);
    if ((m->gated != 0 && m->gated != 1) || (m->tied != 0 && m->tied != 1))
        return calc_msg("model '%s': gated and tied must be 0 or 1", m->name);
    return NULL;
}

// ------------------------------------------------------------------------------------------
// Parsing helpers for the command line (and tests)

const char *calc_parse_count(const char *s, const char *flag, double *out) {
    if (!s || !*s) return calc_msg("%s: expected a number such as 7B, 124M, 15T or 7e9", flag);
    char *end;
    double x = strtod(s, &end);
    if (end == s)
        return calc_msg("%s '%s': expected a positive number with an optional suffix K, M, B, T "
                        "(e.g. 7B, 124M, 15T, 7e9)", flag, s);
    double unit = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': unit = 1e3; end++; break;
    case 'M': unit = 1e6; end++; break;
    case 'B': case 'G': unit = 1e9; end++; break;
    case 'T': unit = 1e12; end++; break;
    default: break;
    }
    if (*end != '\0')
        return calc_msg("%s '%s': unexpected '%s' after the number (valid suffixes: K, M, B, T)",
                        flag, s, end);
    x *= unit;
    if (!isfinite(x) || x <= 0 || x > 1e18)
        return calc_msg("%s '%s': must be a positive count up to 1e18", flag, s);
    *out = x;
    return NULL;
}

static int parse_int_strict(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < -2147483647L || v > 2147483647L) return -1;
    *out = (int)v;
    return 0;
}

const char *calc_parse_dims(const char *s, CalcModel *out) {
    // Defaults: the tiny config, GPT-2 architecture; 0 = the architecture's default.
    int V = 256, T = 64, L = 4, C = 128, NH = 4, KV = 0, FFN = 0, tied = -1, gated = -1;
    CalcArch arch = CALC_ARCH_GPT2;
    char buf[512];
    if (!s || strlen(s) >= sizeof buf) return calc_msg("--dims: missing or too long");
    strcpy(buf, s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return calc_msg("--dims '%s': '%s' is not key=value (e.g. L=12,C=768,NH=12)", s, tok);
        *eq = '\0';
        const char *key = tok, *val = eq + 1;
        if (strcasecmp(key, "arch") == 0) {
            if (strcasecmp(val, "gpt2") == 0) arch = CALC_ARCH_GPT2;
            else if (strcasecmp(val, "llama") == 0) arch = CALC_ARCH_LLAMA;
            else return calc_msg("--dims: arch=%s is unknown (valid: gpt2, llama)", val);
            continue;
        }
        int *dst = strcasecmp(key, "V") == 0     ? &V
                 : strcasecmp(key, "T") == 0     ? &T
                 : strcasecmp(key, "L") == 0     ? &L
                 : strcasecmp(key, "C") == 0     ? &C
                 : strcasecmp(key, "NH") == 0    ? &NH
                 : strcasecmp(key, "KV") == 0    ? &KV
                 : strcasecmp(key, "FFN") == 0   ? &FFN
                 : strcasecmp(key, "tied") == 0  ? &tied
                 : strcasecmp(key, "gated") == 0 ? &gated
                                                 : NULL;
        if (!dst)
            return calc_msg("--dims: unknown key '%s' (valid: V, T, L, C, NH, KV, FFN, arch, tied, "
                            "gated)", key);
        if (parse_int_strict(val, dst) != 0 || *dst < 0)
            return calc_msg("--dims: %s=%s is not a non-negative integer", key, val);
    }
    CalcModel m = calc_model_dims("custom", arch, V, T, L, C, NH, KV, FFN);
    if (tied >= 0) m.tied = tied;
    if (gated >= 0) m.gated = gated;
    const char *err = calc_model_check(&m);
    if (err) return err;
    m.nparams = calc_param_count(&m);
    *out = m;
    return NULL;
}

// ------------------------------------------------------------------------------------------
// GPUs. Bandwidths are nominal per GPU per direction: NVLink 3 (A100) 300 GB/s, NVLink 4
// (H100/H200) 450 GB/s; one InfiniBand NIC per GPU: HDR 200 Gb/s = 25 GB/s (DGX A100), NDR
// 400 Gb/s = 50 GB/s (DGX H100/H200). Peaks are dense bf16 tensor-core FLOP/s (no sparsity).

static const CalcGpu gpus[] = {
    {"a100-40", "A100 40GB", 40 * GIB, 312e12, 300e9, 25e9},
    {"a100-80", "A100 80GB", 80 * GIB, 312e12, 300e9, 25e9},
    {"h100", "H100 80GB", 80 * GIB, 989e12, 450e9, 50e9},
    {"h200", "H200 141GB", 141 * GIB, 989e12, 450e9, 50e9},
};
#define NGPUS ((int)(sizeof gpus / sizeof gpus[0]))

int calc_gpu_preset_count(void) { return NGPUS; }
const CalcGpu *calc_gpu_preset_at(int i) { return (i >= 0 && i < NGPUS) ? &gpus[i] : NULL; }

const CalcGpu *calc_gpu_preset(const char *name) {
    for (int i = 0; name && i < NGPUS; i++)
        if (strcmp(name, gpus[i].name) == 0) return &gpus[i];
    return NULL;
}

const char *calc_gpu_preset_error(const char *name) {
    return calc_msg("unknown --gpu '%s': valid presets are a100-40, a100-80, h100, h200 (or give "
                    "a capacity with --gpu-mem GB)", name ? name : "(null)");
}

// ------------------------------------------------------------------------------------------
// Setup

CalcSetup calc_setup_default(void) {
    CalcSetup s;
    memset(&s, 0, sizeof s);
    s.dtype = CALC_FP32;
    s.optim = CALC_ADAM;
    s.zero = 0;
    s.dp = s.tp = s.pp = 1;
    s.micro_batch = 1;
    s.recompute = CALC_RECOMPUTE_NONE;
    s.chunks = 1;
    s.acts = CALC_ACTS_PAPER;
    return s;
}

CalcSetup calc_setup_lab(int dp, int tp, int pp, int v, int m, int batch, int T, int zero,
                         CalcDtype dtype) {
    CalcSetup s = calc_setup_default();
    s.dtype = dtype;
    s.dp = dp, s.tp = tp, s.pp = pp, s.chunks = v, s.micro_batches = m, s.zero = zero;
    s.micro_batch = dp > 0 && m > 0 ? batch / (dp * m) : 0;  // chapter 09 refuses a remainder
    s.seq_len = T;
    s.acts = CALC_ACTS_LAB;
    s.tp_fp32 = 1;
    s.grads_whole = 1;
    return s;
}

const char *calc_recompute_name(CalcRecompute r) {
    return r == CALC_RECOMPUTE_FULL ? "full" : r == CALC_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

int calc_parse_dtype(const char *s, CalcDtype *out) {
    if (s && strcmp(s, "fp32") == 0) { *out = CALC_FP32; return 0; }
    if (s && strcmp(s, "bf16") == 0) { *out = CALC_BF16; return 0; }
    return -1;
}

int calc_parse_optim(const char *s, CalcOptim *out) {
    if (s && strcmp(s, "adam") == 0) { *out = CALC_ADAM; return 0; }
    if (s && strcmp(s, "sgd") == 0) { *out = CALC_SGD; return 0; }
    return -1;
}

int calc_parse_recompute(const char *s, CalcRecompute *out) {
    if (s && strcmp(s, "none") == 0) { *out = CALC_RECOMPUTE_NONE; return 0; }
    if (s && strcmp(s, "selective") == 0) { *out = CALC_RECOMPUTE_SELECTIVE; return 0; }
    if (s && strcmp(s, "full") == 0) { *out = CALC_RECOMPUTE_FULL; return 0; }
    return -1;
}

int calc_stage_layers(int L, int pp, int stage) {
    if (pp < 1 || stage < 0 || stage >= pp || pp > L) return -1;
    if (L % pp == 0) return L / pp;
    // Llama 3's split: one layer fewer on the first and the last stage, which also hold the
    // embedding and the output layer. Needs at least one layer on those stages.
    if (pp >= 3 && (L + 2) % pp == 0 && (L + 2) / pp >= 2) {
        int k = (L + 2) / pp;
        return (stage == 0 || stage == pp - 1) ? k - 1 : k;
    }
    return -1;
}

// "1, 2, 4, 8" : the values 1..max for which ok(x) holds.
static void list_valid(char *buf, size_t n, int max, int (*ok)(const CalcModel *, int),
                       const CalcModel *m) {
    buf[0] = '\0';
    size_t used = 0;
    for (int x = 1; x <= max && used + 16 < n; x++)
        if (ok(m, x)) used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? ", " : "", x);
}
static int tp_ok(const CalcModel *m, int t) {
    return m->NH % t == 0 && m->KV % t == 0 && m->FFN % t == 0;
}
static int pp_ok(const CalcModel *m, int p) { return calc_stage_layers(m->L, p, 0) > 0; }

const char *calc_setup_check(const CalcModel *m, const CalcSetup *s) {
    const char *err = calc_model_check(m);
    if (err) return err;
    if (s->dtype != CALC_FP32 && s->dtype != CALC_BF16)
        return calc_msg("--dtype: unknown precision %d (valid: fp32, bf16)", s->dtype);
    if (s->optim != CALC_ADAM && s->optim != CALC_SGD)
        return calc_msg("--optimizer: unknown optimizer %d (valid: adam, sgd)", s->optim);
    if (s->recompute < CALC_RECOMPUTE_NONE || s->recompute > CALC_RECOMPUTE_FULL)
        return calc_msg("--recompute: unknown mode %d (valid: none, selective, full)", s->recompute);
    if (s->zero < 0 || s->zero > 3)
        return calc_msg("--zero %d: the ZeRO stage must be 0, 1, 2 or 3", s->zero);
    if (s->dp < 1) return calc_msg("--dp %d: must be a positive integer (1 = no data parallelism)", s->dp);
    if (s->tp < 1) return calc_msg("--tp %d: must be a positive integer (1 = no tensor parallelism)", s->tp);
    if (s->pp < 1) return calc_msg("--pp %d: must be a positive integer (1 = no pipeline)", s->pp);
    if (s->micro_batch < 1) return calc_msg("--micro-batch %d: must be at least 1", s->micro_batch);
    if (s->micro_batches < 0)
        return calc_msg("micro_batches %d: must be 0 (a full pipeline) or positive", s->micro_batches);
    if (s->seq_len < 0) return calc_msg("--seq-len %d: must be positive (0 = the model's T)", s->seq_len);
    if (s->sp != 0 && s->sp != 1) return calc_msg("--seq-parallel: must be 0 or 1");
    if (s->chunks < 0) return calc_msg("--chunks %d: must be 0 or more (chunks per pipeline rank; 0 and 1: one)", s->chunks);
    if (s->acts != CALC_ACTS_PAPER && s->acts != CALC_ACTS_LAB)
        return calc_msg("activation model %d: unknown (valid: paper, lab)", s->acts);
    if (s->split && s->chunks > 1)
        return calc_msg("ZB-H1 (the split backward) runs one chunk per pipeline rank: drop --chunks %d",
                        s->chunks);
    if (s->max_w < 0) return calc_msg("max W stores %d: must be 0 (no cap) or more", s->max_w);
    if (s->acts == CALC_ACTS_LAB && s->recompute != CALC_RECOMPUTE_NONE && s->split)
        return calc_msg("the lab's runs recompute without a split backward (chapters 07, 08 and 09): "
                        "drop --recompute, or use another schedule");
    if (m->arch == CALC_ARCH_RAW) {
        if (s->tp > 1 || s->pp > 1 || s->chunks > 1)
            return calc_msg("--tp %d --pp %d --chunks %d: splitting a model across TP/PP ranks needs "
                            "its dimensions (use --model or --dims, not --params)", s->tp, s->pp,
                            s->chunks > 1 ? s->chunks : 1);
        return NULL;
    }
    char valid[256];
    if (m->NH % s->tp != 0 || m->KV % s->tp != 0 || m->FFN % s->tp != 0) {
        list_valid(valid, sizeof valid, m->NH, tp_ok, m);
        return calc_msg("--tp %d does not divide the model (%s: NH=%d heads, KV=%d key/value heads, "
                        "FFN=%d; each TP rank takes whole heads and an equal MLP slice): valid --tp: %s",
                        s->tp, m->name, m->NH, m->KV, m->FFN, valid);
    }
    const int v = s->chunks > 1 ? s->chunks : 1;
    if (v > 1 && (s->pp > SCHED_MAX_STAGES || calc_micro_batches(s) % s->pp != 0))
        return calc_msg("--chunks %d: interleaved 1F1B runs the micro-batches in groups of pp: "
                        "--micro-batches %d must be a multiple of --pp %d (valid: %d, %d, ...), pp at "
                        "most %d", v, calc_micro_batches(s), s->pp, s->pp, 2 * s->pp, SCHED_MAX_STAGES);
    if (v > 1 && calc_stage_layers(m->L, s->pp * v, 0) < 0)
        return calc_msg("--pp %d x --chunks %d = %d virtual stages do not split the %d layers of %s "
                        "(L %% (pp v) must be 0)", s->pp, v, s->pp * v, m->L, m->name);
    if (calc_stage_layers(m->L, s->pp, 0) < 0) {
        list_valid(valid, sizeof valid, m->L, pp_ok, m);
        return calc_msg("--pp %d does not split the %d layers of %s into stages (L %% pp must be 0, "
                        "or (L+2) %% pp for Llama 3's split with one layer fewer on the first and "
                        "last stage): valid --pp: %s", s->pp, m->L, m->name, valid);
    }
    if (s->seq_len > m->T && m->arch == CALC_ARCH_GPT2)
        return calc_msg("--seq-len %d exceeds the context length T=%d of %s (its position table wpe "
                        "has T rows)", s->seq_len, m->T, m->name);
    return NULL;
}

// ------------------------------------------------------------------------------------------
// Memory per rank

CalcBytesPerParam calc_bytes_per_param(CalcDtype dtype, CalcOptim optim) {
    CalcBytesPerParam b = {0, 0, 0, 0, 0};
    // EXERCISE 00.1 Bytes per parameter -> 00_memory_budget/README.md#exercise-001-bytes-per-parameter
    if (dtype == CALC_BF16) {
        b.params = 2;   // bf16 weights the forward pass reads
        b.grads = 2;    // bf16 gradients from the backward pass
        b.master = 4;   // fp32 copy the optimizer updates (small updates survive)
    } else {
        b.params = 4;   // fp32 weights are their own master copy
        b.grads = 4;
        b.master = 0;
    }
    b.m = 4;                                 // fp32 first moment (SGD: the momentum buffer)
    b.v = optim == CALC_ADAM ? 4 : 0;        // fp32 second moment, Adam only
    // END EXERCISE 00.1
    return b;
}

int64_t calc_stage_params(const CalcModel *m, int tp, int pp, int stage) {
    if (m->arch == CALC_ARCH_RAW) return m->nparams;
    int64_t split, repl;
    layer_params(m, &split, &repl);
    int64_t C = m->C;
    int64_t vocab_rows = ceil_div(m->V, tp);   // vocab-parallel embedding / output layer
    int64_t n = (int64_t)calc_stage_layers(m->L, pp, stage) * (split / tp + repl);
    if (stage == 0) {
        n += vocab_rows * C;                                // wte
        if (m->arch == CALC_ARCH_GPT2) n += (int64_t)m->T * C;  // wpe, replicated
    }
    if (stage == pp - 1) {
        n += final_norm_params(m);
        // The output layer: its own matrix when untied; when tied and the pipeline splits
        // the embedding from the head, the last stage keeps a copy of wte (as Megatron does).
        if (!m->tied || pp > 1) n += vocab_rows * C;
    }
    return n;
}

int calc_chunk_units(const CalcModel *m, int tp, int S, int vs, int64_t *sizes) {
    LAB_CHECK(m->arch == CALC_ARCH_GPT2, "calc_chunk_units: GPT-2's units only");
    int64_t split, repl;
    layer_params(m, &split, &repl);
    const int64_t C = m->C, vocab_rows = ceil_div(m->V, tp);
    int n = 0;
    if (vs == 0) sizes[n++] = vocab_rows * C + (int64_t)m->T * C;  // wte's rows, wpe
    for (int l = 0; l < calc_stage_layers(m->L, S, vs); l++) sizes[n++] = split / tp + repl;
    if (vs == S - 1) {
        sizes[n++] = final_norm_params(m);
        if (!m->tied || S > 1) sizes[n++] = vocab_rows * C;  // the output layer's (tied) copy
    }
    return n;
}

int64_t calc_unit_piece(const int64_t *sizes, int nunits, int u, int fsdp, int dp, int d) {
    if (fsdp) return calc_piece(sizes[u], dp, d);
    int64_t n = 0, at = 0;
    for (int i = 0; i < nunits; i++) n += sizes[i];
    for (int i = 0; i < u; i++) at += sizes[i];
    return calc_range_piece(n, dp, d, at, at + sizes[u]);
}

int64_t calc_stage_replicated_params(const CalcModel *m, int S, int vs) {
    if (m->arch == CALC_ARCH_RAW) return 0;
    int64_t split, repl;
    layer_params(m, &split, &repl);
    return (int64_t)calc_stage_layers(m->L, S, vs) * repl + (vs == S - 1 ? final_norm_params(m) : 0);
}

int64_t calc_piece(int64_t n, int dp, int d) { return n / dp + (d < n % dp ? 1 : 0); }

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

int64_t calc_range_piece(int64_t n, int dp, int d, int64_t lo, int64_t hi) {
    // piece d starts after the d pieces before it, the first n % dp of them one longer
    const int64_t begin = d * (n / dp) + (d < n % dp ? d : n % dp), end = begin + calc_piece(n, dp, d);
    return clamp64(end, lo, hi) - clamp64(begin, lo, hi);
}

static double act_width(CalcDtype d) { return d == CALC_BF16 ? 2.0 : 4.0; }

double calc_layer_activation_bytes(const CalcModel *m, const CalcSetup *cs) {
    if (m->arch == CALC_ARCH_RAW) return 0;
    double s = cs->seq_len > 0 ? cs->seq_len : m->T;
    double b = cs->micro_batch, h = m->C, a = m->NH, t = cs->tp;
    double w = act_width(cs->dtype);   // bytes per stored activation value
    double bytes = 0;
    if (cs->acts == CALC_ACTS_LAB) {
        // common/tp.c's block of a TP slice (and at t = 1 gpt2's own stored layer: the same
        // tensors), N = b*s tokens: ln1, ln2 outputs, the attention output
        // before proj, the two residuals, fcproj's output (6 N*h, replicated over TP); q, k, v,
        // the heads' output, fc and GELU's 4h (12 N*h / t, split by heads and columns); ln1's
        // and ln2's mean and rstd (4 N); the pre-softmax scores and the softmax, (b, a/t, s, s).
        // Sequence parallel (tp.c's SP block): ln1's and ln2's outputs are kept gathered (2 N*h),
        // the residuals and the LayerNorms' statistics on the rank's N/t rows, and the partial
        // sums of proj and fcproj are not kept (they live in the model's scratch).
        // Recomputing (t > 1 or SP: tp.c's sets; t = 1 is gpt2's, chunk_set_bytes), a block
        // keeps all but the scores and softmax (selective) or its output only, N*h (SP: N*h/t)
        // (full); the one layer of what they drop is the slice's (calc_tp_recompute_scratch_bytes).
        double N = b * s, att = 2 * b * (a / t) * s * s;
        const int rc = t > 1 || cs->sp ? cs->recompute : CALC_RECOMPUTE_NONE;
        if (rc == CALC_RECOMPUTE_FULL) return w * (cs->sp ? N * h / t : N * h);
        if (rc == CALC_RECOMPUTE_SELECTIVE) att = 0;
        if (cs->sp) return w * (2 * N * h + 2 * N * h / t + 4 * N / t + 12 * N * h / t + att);
        return w * (6 * N * h + 4 * N + 12 * N * h / t + att);
    }
    // EXERCISE 00.2 Activation memory -> 00_memory_budget/README.md#exercise-002-activation-memory
    if (cs->recompute == CALC_RECOMPUTE_FULL) {
        bytes = w * s * b * h;                        // only the layer's input is kept
        if (cs->sp) bytes /= t;
    } else {
        double repl = s * b * h * (4 * w + 2);        // LayerNorm inputs, QKV and MLP inputs, 2 masks
        double split = s * b * h * 12 * w;            // Q, K, V, attention out, MLP 4h twice, ...
        double att = a * s * s * b * (2 * w + 1);     // softmax out, its dropout mask and output
        if (cs->recompute == CALC_RECOMPUTE_SELECTIVE) att = 0;  // recomputed in backward
        bytes = cs->sp ? (repl + split + att) / t : repl + (split + att) / t;
    }
    // END EXERCISE 00.2
    return bytes;
}

// One micro-batch's activations on chunk c of `stage` (virtual stage c*pp + stage of S): its
// layers, and on the last virtual stage the head (the final norm and the logits).
static double chunk_set_bytes(const CalcModel *m, const CalcSetup *s, int stage, int c) {
    const int v = s->chunks > 1 ? s->chunks : 1, S = s->pp * v, vs = c * s->pp + stage;
    const double N = (double)s->micro_batch * (s->seq_len > 0 ? s->seq_len : m->T), h = m->C;
    const double w = act_width(s->dtype), t = s->tp;
    if (s->acts == CALC_ACTS_LAB && s->tp == 1) {
        // t = 1: the stage runs gpt2's own pieces and sets (common/tp.h): chapter 08's set
        const GPT2Config cfg = {.V = m->V, .T = m->T, .L = m->L, .C = m->C, .NH = m->NH};
        // (GPT2Recompute numbers its modes as CalcRecompute does; each chunk's scratch layer is
        // allocated before the first step, outside this: calc_recompute_scratch_bytes)
        return calc_pipe_set_bytes_recompute(&cfg, calc_stage_layers(m->L, S, vs), vs == S - 1,
                                             s->micro_batch, s->seq_len > 0 ? s->seq_len : m->T,
                                             s->dtype == CALC_BF16 ? GPT2_BF16 : GPT2_FP32, 0,
                                             (GPT2Recompute)s->recompute);
    }
    double acts = calc_stage_layers(m->L, S, vs) * calc_layer_activation_bytes(m, s);
    if (s->acts == CALC_ACTS_LAB) {
        // the chunk's input and the input's gradient (2 N*h); the head: lnf's output and the
        // gradient into it (2 N*h), lnf's mean and rstd, the cross-entropy's max, sum of exp,
        // target logit and loss (6 N), the logits and their softmax over the rank's
        // vocabulary rows (2 N V/t)
        // (kept in fp32 also in a bf16 run: only the blocks' saved sets are stored in bf16)
        // SP: the stream (input and gradient) on the rank's N/t rows; the head adds lnf's
        // output on those rows (N*h/t) and keeps lnf's statistics for them only
        const double Vl = (double)((m->V + s->tp - 1) / s->tp), r = s->sp ? N / t : N;
        acts += 4 * 2 * r * h;
        if (vs == S - 1) acts += 4 * (2 * N * h + (s->sp ? r * h : 0) + 2 * r + 4 * N + 2 * N * Vl);
    } else if (vs == S - 1) {
        double norm = 2 * w * N * h;                // final norm input and output
        double logits = 4.0 * N * m->V;             // fp32 logits for the loss
        acts += (s->sp ? norm / t : norm) + logits / t;
    }
    return acts;
}

// ZB-H1 on a TP stage of the lab (tp.c's split backward): one micro-batch's set (chunk_set_bytes)
// stays whole from its F to its W, with what W reads from B (fp32, per layer and N = b*s
// positions, r of them on this rank's stream: N, or N/t under SP): the gradients of the
// block's output, ln2's and ln1's output (whole) and residual2 (4 r*h), of fch (4N*h/t) and qkv
// (3N*h/t), and under SP the two all-gathered gradients of the row-parallel layers (2 N*h).
// At t = 1 the stage runs gpt2's own split sets (chapter 08's W stores: calc_pipe_peak_bytes).
static double split_activation_bytes(const CalcModel *m, const CalcSetup *s, int stage, int *inflight_out) {
    const int M = calc_micro_batches(s), T = s->seq_len > 0 ? s->seq_len : m->T;
    Schedule sc;
    if (s->max_w > 0) sched_zb_h1_capped(&sc, s->pp, M, s->max_w);
    else sched_zb_h1(&sc, s->pp, M);
    double acts = 0, cur = 0;
    int sets = 0;
    *inflight_out = 0;
    if (s->tp == 1) {
        const GPT2Config cfg = {.V = m->V, .T = m->T, .L = m->L, .C = m->C, .NH = m->NH};
        acts = calc_pipe_peak_bytes(&cfg, &sc, stage, s->micro_batch, T,
                                    s->dtype == CALC_BF16 ? GPT2_BF16 : GPT2_FP32);
    }
    const double N = (double)s->micro_batch * T, h = m->C, t = s->tp, r = s->sp ? N / t : N;
    const double wsave = 4.0 * calc_stage_layers(m->L, s->pp, stage) *
                         (4 * r * h + 7 * N * h / t + (s->sp ? 2 * N * h : 0));
    const double set = chunk_set_bytes(m, s, stage, 0) + wsave;
    for (int i = 0; i < sc.nops[stage]; i++) {
        const PipeOpKind k = sc.ops[stage][i].kind;
        if (k == PIPE_B) continue;
        sets += k == PIPE_F ? 1 : -1;
        cur += k == PIPE_F ? set : -set;
        if (s->tp > 1 && cur > acts) acts = cur;
        if (sets > *inflight_out) *inflight_out = sets;
    }
    sched_free(&sc);
    return acts;
}

// Activations of stage `stage` at their peak. 1F1B (one chunk) keeps min(pp - stage,
// micro-batches) micro-batches alive. Interleaved 1F1B (v > 1 chunks) is walked op by op on the
// schedule table chapters 08 and 09 execute (common/schedule.h): a forward of chunk c adds its
// set, a backward frees it. Recomputation needs one layer's worth of working memory while it
// recomputes. *inflight_out: the most micro-batch sets (v > 1: chunk sets) alive at once.
static double stage_activation_bytes(const CalcModel *m, const CalcSetup *s, int stage,
                                     int *inflight_out) {
    if (m->arch == CALC_ARCH_RAW) { *inflight_out = 0; return 0; }
    const int v = s->chunks > 1 ? s->chunks : 1;
    double acts = 0;
    if (s->split && s->acts == CALC_ACTS_LAB) {
        acts = split_activation_bytes(m, s, stage, inflight_out);
    } else if (v == 1) {
        int inflight = s->pp - stage;
        if (s->micro_batches > 0 && s->micro_batches < inflight) inflight = s->micro_batches;
        *inflight_out = inflight;
        acts = inflight * chunk_set_bytes(m, s, stage, 0);
    } else {
        Schedule sc;
        sched_interleaved(&sc, s->pp, v, calc_micro_batches(s));  // calc_setup_check: m % pp == 0
        double cur = 0;
        int sets = 0;
        *inflight_out = 0;
        for (int i = 0; i < sc.nops[stage]; i++) {
            const PipeOp *op = &sc.ops[stage][i];
            const double set = chunk_set_bytes(m, s, stage, op->chunk);
            cur += op->kind == PIPE_F ? set : -set;
            sets += op->kind == PIPE_F ? 1 : -1;
            if (cur > acts) acts = cur;
            if (sets > *inflight_out) *inflight_out = sets;
        }
        sched_free(&sc);
    }
    // (the lab's stages hold their one recompute layer from their build, outside the walk:
    // calc_recompute_scratch_bytes, calc_tp_recompute_scratch_bytes)
    if (s->recompute != CALC_RECOMPUTE_NONE && s->acts != CALC_ACTS_LAB) {
        CalcSetup none = *s;
        none.recompute = CALC_RECOMPUTE_NONE;
        double full = calc_layer_activation_bytes(m, &none);
        acts += full - calc_layer_activation_bytes(m, s);   // one layer being recomputed
    }
    return acts;
}

CalcShard calc_zero_shard(int64_t psi, int zero, int dp) {
    CalcShard sh = {psi, psi, psi};
    if (zero == 0) return sh;   // plain data parallelism: every rank keeps everything
    // EXERCISE 00.4 ZeRO sharding -> 00_memory_budget/README.md#exercise-004-zero-sharding
    // Each stage shards one more kind of model state over the DP group; the last shard is
    // padded, so a rank keeps ceil(psi / dp) elements.
    sh.opt = ceil_div(psi, dp);                          // stage 1: master weights, m, v
    if (zero >= 2) sh.grads = ceil_div(psi, dp);         // stage 2: + gradients
    if (zero >= 3) sh.params = ceil_div(psi, dp);        // stage 3: + parameters
    // END EXERCISE 00.4
    return sh;
}

// Says which activation formula calc_memory used, with the coefficients for this precision
// (w = bytes per value: the paper's 34 and 5 are for w = 2).
static void act_formula(char *buf, size_t n, const CalcModel *m, const CalcSetup *s) {
    double w = act_width(s->dtype);
    int tp = s->tp > 1;
    const char *src = "Korthikanti et al. 2022 (GPT-3 block, 1-byte dropout masks)";
    if (m->arch == CALC_ARCH_RAW) {
        snprintf(buf, n, "not computed: --params gives no dimensions (use --model or --dims)");
    } else if (s->acts == CALC_ACTS_LAB && !tp) {
        snprintf(buf, n, "the lab's stage at t = 1 (chapter 09 runs gpt2's own sets, chapter 08's): "
                 "%g-byte stored layers, fp32 input, head and one layer of gradients%s", w,
                 s->recompute == CALC_RECOMPUTE_FULL ? "; full recomputation: a block keeps its "
                 "input (each chunk's scratch layer comes on top)"
                 : s->recompute == CALC_RECOMPUTE_SELECTIVE ? "; selective: no scores kept (each "
                 "chunk's scratch layer comes on top)" : "");
    } else if (s->acts == CALC_ACTS_LAB && s->recompute == CALC_RECOMPUTE_FULL) {
        snprintf(buf, n, "the lab's %sTP stage (chapter 09), full recomputation, %g-byte values, "
                 "N = b*s: N*h%s per layer (its output); per chunk 2*N*h%s; the head as without "
                 "it (the stage's one recompute layer comes on top)", s->sp ? "SP " : "", w,
                 s->sp ? "/t" : "", s->sp ? "/t" : "");
    } else if (s->acts == CALC_ACTS_LAB && s->sp) {
        snprintf(buf, n, "the lab's SP TP stage (chapter 09), %g-byte values, N = b*s: "
                 "N*h*(2 + 14/t) + 4N/t%s per layer; per chunk 2*N*h/t; the head "
                 "N*h*(2 + 1/t) + 2N/t + 4N + 2*N*V/t%s", w,
                 s->recompute == CALC_RECOMPUTE_SELECTIVE ? "" : " + 2*b*(a/t)*s^2",
                 s->recompute == CALC_RECOMPUTE_SELECTIVE ? "; selective: no scores kept (the "
                 "stage's one recompute layer comes on top)" : "");
    } else if (s->acts == CALC_ACTS_LAB) {
        snprintf(buf, n, "the lab's TP stage (chapter 09), %g-byte values, N = b*s: N*h*(6 + 12/t)"
                 " + 4N%s per layer; per chunk its input and gradient 2*N*h; the "
                 "head 2*N*h + 6N + 2*N*V/t%s", w,
                 s->recompute == CALC_RECOMPUTE_SELECTIVE ? "" : " + 2*b*(a/t)*s^2",
                 s->recompute == CALC_RECOMPUTE_SELECTIVE ? "; selective: no scores kept (the "
                 "stage's one recompute layer comes on top)" : "");
    } else if (s->recompute == CALC_RECOMPUTE_FULL) {
        snprintf(buf, n, "%s, full recomputation: %g*s*b*h per layer%s (its input), plus one "
                 "layer's activations while it is recomputed", src, w, s->sp && tp ? " / t" : "");
    } else if (!tp || s->sp) {
        char att[32] = "";
        if (s->recompute == CALC_RECOMPUTE_NONE) snprintf(att, sizeof att, " + %g*a*s/h", 2 * w + 1);
        snprintf(buf, n, "%s: s*b*h*(%g%s) per layer%s%s", src, 16 * w + 2, att,
                 tp ? " / t (sequence parallel)" : "",
                 s->recompute == CALC_RECOMPUTE_SELECTIVE ? ", attention core recomputed" : "");
    } else {
        char att[32] = "";
        if (s->recompute == CALC_RECOMPUTE_NONE)
            snprintf(att, sizeof att, " + %g*a*s/(h*t)", 2 * w + 1);
        snprintf(buf, n, "%s, TP without SP: s*b*h*(%g + %g/t%s) per layer%s", src, 4 * w + 2,
                 12 * w, att,
                 s->recompute == CALC_RECOMPUTE_SELECTIVE ? ", attention core recomputed" : "");
    }
}

CalcBreakdown calc_rank_memory(const CalcModel *m, const CalcSetup *s, int stage, int replica) {
    const char *err = calc_setup_check(m, s);
    LAB_CHECK(err == NULL, "calc_rank_memory: %s", err);
    LAB_CHECK(stage >= 0 && stage < s->pp && replica >= 0 && replica < s->dp,
              "calc_rank_memory: stage %d of %d, replica %d of %d", stage, s->pp, replica, s->dp);
    CalcBytesPerParam bpp = calc_bytes_per_param(s->dtype, s->optim);
    const int v = s->chunks > 1 ? s->chunks : 1, S = s->pp * v;
    CalcBreakdown b;
    memset(&b, 0, sizeof b);
    // The rank's parameters: one flat buffer per chunk (virtual stage c*pp + stage of S), and
    // of each the piece this replica keeps when ZeRO shards it.
    int64_t psi = 0, piece = 0;
    for (int c = 0; c < v; c++) {
        int64_t n = m->arch == CALC_ARCH_RAW ? m->nparams : calc_stage_params(m, s->tp, S, c * s->pp + stage);
        psi += n;
        if (s->fsdp && s->zero == 3 && m->arch == CALC_ARCH_GPT2) {  // piece d of every unit
            int64_t *u = calloc((size_t)m->L + 3, sizeof(int64_t));
            const int nu = calc_chunk_units(m, s->tp, S, c * s->pp + stage, u);
            for (int i = 0; i < nu; i++) piece += calc_piece(u[i], s->dp, replica);
            free(u);
        } else {
            piece += calc_piece(n, s->dp, replica);
        }
    }
    // Which states are sharded is exercise 00.4's answer (it pads: ceil(psi / dp)); the runtime
    // cuts each chunk unevenly, so a sharded state holds this replica's pieces exactly.
    CalcShard sh = calc_zero_shard(psi, s->zero, s->dp);
    if (sh.params != psi) sh.params = piece;
    if (sh.grads != psi) sh.grads = s->grads_whole ? psi : piece;
    if (sh.opt != psi) sh.opt = piece;
    b.params = (double)sh.params * bpp.params;
    b.grads = (double)sh.grads * bpp.grads;
    b.master = (double)sh.opt * bpp.master;
    b.m = (double)sh.opt * bpp.m;
    b.v = (double)sh.opt * bpp.v;
    b.acts = stage_activation_bytes(m, s, stage, &b.inflight);
    b.total = b.params + b.grads + b.master + b.m + b.v + b.acts;
    b.rank_params = psi;
    b.stage = stage;
    b.nstages = s->pp;
    for (int c = 0; c < v && m->arch != CALC_ARCH_RAW; c++)
        b.layers += calc_stage_layers(m->L, S, c * s->pp + stage);
    act_formula(b.act_formula, sizeof b.act_formula, m, s);
    return b;
}

CalcBreakdown calc_memory(const CalcModel *m, const CalcSetup *s) {
    CalcBreakdown best;
    memset(&best, 0, sizeof best);
    best.total = -1;
    for (int r = 0; r < s->pp; r++) {
        CalcBreakdown b = calc_rank_memory(m, s, r, 0);
        if (b.total > best.total) best = b;
    }
    return best;
}

// One block's ActTensors (gpt2.h), in elements: ln1, atty, attproj, residual2, ln2, fcproj,
// residual3 (1 each), qkv (3), fch, fch_gelu (4 each) = 18 B*T*C; ln1's and ln2's mean and rstd
// (4 B*T); preatt and att (2 B*NH*T*T).
static double lab_layer_elems(const GPT2Config *cfg, int B, int T) {
    return (double)B * T * cfg->C * 18 + (double)B * T * 4 + 2.0 * B * cfg->NH * (double)T * T;
}

// What a block keeps of them under recomputation r, and the one layer of recomputed tensors the
// model's sets share (gpt2.h's GPT2Recompute), in elements.
static double lab_kept_elems(const GPT2Config *cfg, int B, int T, GPT2Recompute r) {
    const double scores = 2.0 * B * cfg->NH * (double)T * T;  // preatt and att
    if (r == GPT2_RECOMPUTE_FULL) return (double)B * T * cfg->C;  // its output (the next input)
    return lab_layer_elems(cfg, B, T) - (r == GPT2_RECOMPUTE_SELECTIVE ? scores : 0);
}

double calc_tp_recompute_scratch_bytes(const CalcModel *m, const CalcSetup *s) {
    LAB_CHECK(s->acts == CALC_ACTS_LAB && (s->tp > 1 || s->sp), "calc_tp_recompute_scratch_bytes: "
              "the lab's TP stage (t > 1 or SP)");
    // bf16: the slice's fp32 working layer (tp_shared_bytes) holds the recomputed tensors beside
    // the kept ones' widened copy: one block's set, as without recomputation; nothing more
    if (s->dtype == CALC_BF16) return 0;
    CalcSetup none = *s;
    none.recompute = CALC_RECOMPUTE_NONE;
    return calc_layer_activation_bytes(m, &none) - calc_layer_activation_bytes(m, s);
}

double calc_recompute_scratch_bytes(const GPT2Config *cfg, int B, int T, GPT2Recompute r) {
    if (r == GPT2_RECOMPUTE_NONE) return 0;
    return 4.0 * (lab_layer_elems(cfg, B, T) - lab_kept_elems(cfg, B, T, r));
}

double calc_activation_bytes_lab(const GPT2Config *cfg, int B, int T, GPT2Dtype dtype) {
    return calc_activation_bytes_recompute(cfg, B, T, dtype, GPT2_RECOMPUTE_NONE);
}

double calc_activation_bytes_recompute(const GPT2Config *cfg, int B, int T, GPT2Dtype dtype,
                                       GPT2Recompute r) {
    double L = cfg->L, C = cfg->C, NH = cfg->NH, V = cfg->V;
    double BT = (double)B * T;
    // The embedding's and the head's: encoded, lnf (1 each); lnf mean, rstd, losses; logits, probs.
    double outer = BT * C * 2 + BT * 3 + 2 * BT * V;
    // Their gradients (gpt2_dact_sizes): one layer of scratch, shared by all blocks, plus the
    // gradient of every block's output.
    double dacts = BT * C * (L + 17)           // residual3 (L layers); encoded, lnf (1 each);
                                               // one layer of ln1, atty, residual2, ln2 (1),
                                               // qkv (3), fch, fch_gelu (4 each) = 15
                   + 2 * B * NH * (double)T * T  // one layer of preatt and att
                   + BT * V;                   // logits
    // what a block keeps of its ActTensors (without recomputation: all of them)
    const double kept = lab_kept_elems(cfg, B, T, r);
    // recomputing, each block keeps part of its layer, and the model one layer of what they do
    // not keep, in fp32 (bf16: rounded through the gradients' scratch, no more bytes)
    const double scratch = calc_recompute_scratch_bytes(cfg, B, T, r);
    if (dtype == GPT2_BF16)
        // the L stored layers (what they keep) in bf16; in fp32 one layer of them (where a block
        // computes), the embedding's and head's, the widened input of a block (B,T,C), and the
        // gradients
        return 2 * L * kept + 4 * (kept + outer + BT * C + dacts) + scratch;
    // fp32: 4 bytes each
    return 4 * (L * kept + outer + dacts) + scratch;
}

int calc_fits(const CalcBreakdown *b, double mem_bytes) { return b->total <= mem_bytes; }

// ------------------------------------------------------------------------------------------
// Cost

const char *calc_cost_check(const CalcCostSpec *c) {
    if (!(c->nparams > 0)) return calc_msg("--params: the parameter count must be positive");
    if (!(c->tokens > 0)) return calc_msg("--tokens: the number of training tokens must be positive "
                                          "(e.g. --tokens 15T)");
    if (!(c->peak_flops > 0))
        return calc_msg("--peak-tflops: the GPU's peak must be positive (or pick a --gpu preset)");
    if (!(c->mfu >= CALC_MFU_MIN && c->mfu <= 1))
        return calc_msg("--mfu %g: model FLOPs utilization must be in [%g, 1] (40-55%% is excellent, "
                        "e.g. --mfu 0.45)", c->mfu, CALC_MFU_MIN);
    if (c->gpus < 1) return calc_msg("--gpus %d: must be a positive number of GPUs", c->gpus);
    if (!(c->price >= 0)) return calc_msg("--price %g: dollars per GPU-hour must be >= 0", c->price);
    return NULL;
}

CalcCost calc_cost(const CalcCostSpec *c) {
    const char *err = calc_cost_check(c);
    LAB_CHECK(err == NULL, "calc_cost: %s", err);
    CalcCost r = {0, 0, 0, 0, 0, 0};
    // EXERCISE 00.3 Cost estimate -> 00_memory_budget/README.md#exercise-003-cost-estimate
    r.flops = 6 * c->nparams * c->tokens;             // forward 2N + backward 4N per token
    r.gpu_seconds = r.flops / (c->peak_flops * c->mfu);
    r.gpu_hours = r.gpu_seconds / 3600;
    r.gpu_years = r.gpu_hours / (24 * 365);
    r.wall_days = r.gpu_seconds / c->gpus / 86400;
    r.dollars = r.gpu_hours * c->price;
    // END EXERCISE 00.3
    return r;
}

// ------------------------------------------------------------------------------------------
// Printing

char *calc_fmt_count(char *buf, size_t n, double x) {
    const char *unit[] = {"", " K", " M", " B", " T"};
    int u = 0;
    while (fabs(x) >= 1000 && u < 4) { x /= 1000; u++; }
    snprintf(buf, n, u ? "%.2f%s" : "%.0f%s", x, unit[u]);
    return buf;
}

char *calc_fmt_commas(char *buf, size_t n, int64_t x) {
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", (long long)(x < 0 ? -x : x));
    size_t len = strlen(digits), o = 0;
    if (x < 0 && o + 1 < n) buf[o++] = '-';
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

// Decimal and binary units that suit `bytes`: GB and GiB for big models, MB and MiB, KB and KiB.
typedef struct Unit { double dec, bin; const char *dname, *bname; } Unit;
static Unit pick_unit(double bytes) {
    if (bytes >= 1e9) return (Unit){1e9, GIB, "GB", "GiB"};
    if (bytes >= 1e6) return (Unit){1e6, 1024.0 * 1024, "MB", "MiB"};
    return (Unit){1e3, 1024.0, "KB", "KiB"};
}

static const char *optim_name(CalcOptim o) { return o == CALC_ADAM ? "Adam" : "SGD+momentum"; }

void calc_print_memory(FILE *out, const CalcModel *m, const CalcSetup *s, const CalcBreakdown *b) {
    char cnt[32], commas[32];
    CalcBytesPerParam bpp = calc_bytes_per_param(s->dtype, s->optim);
    fprintf(out, "Memory per GPU: %s (%s parameters; %s)\n", m->name,
            calc_fmt_count(cnt, sizeof cnt, (double)m->nparams), m->about);
    fprintf(out, "  setup: %s, %s, ZeRO-%d, DP=%d TP=%d PP=%d%s, micro-batch b=%d",
            s->dtype == CALC_BF16 ? "bf16 mixed precision" : "fp32", optim_name(s->optim),
            s->zero, s->dp, s->tp, s->pp, s->sp && s->tp > 1 ? " (sequence parallel)" : "",
            s->micro_batch);
    if (m->arch != CALC_ARCH_RAW)
        fprintf(out, ", seq s=%d, recompute %s", s->seq_len > 0 ? s->seq_len : m->T,
                calc_recompute_name(s->recompute));
    fprintf(out, "\n");
    if (s->pp > 1)
        fprintf(out, "  heaviest pipeline stage: %d of %d (%d layers, %d micro-batch%s in "
                "flight under 1F1B)\n", b->stage, b->nstages, b->layers, b->inflight,
                b->inflight == 1 ? "" : "es");
    fprintf(out, "  this rank's share of the model after the TP/PP split: Ψ = %s parameters\n\n",
            calc_fmt_commas(commas, sizeof commas, b->rank_params));
    const char *pd = s->dtype == CALC_BF16 ? "bf16" : "fp32";
    struct { const char *name, *dtype; double bytes, bpp; } rows[] = {
        {"params", pd, b->params, bpp.params},
        {"grads", pd, b->grads, bpp.grads},
        {"master weights", bpp.master > 0 ? "fp32" : "-", b->master, bpp.master},
        {s->optim == CALC_ADAM ? "Adam m" : "momentum", "fp32", b->m, bpp.m},
        {"Adam v", bpp.v > 0 ? "fp32" : "-", b->v, bpp.v},
        {"activations", pd, b->acts, -1},
    };
    Unit u = pick_unit(b->total);
    char dec[24], bin[24];
    snprintf(dec, sizeof dec, "%s (%s)", u.dname, u.dec == 1e9 ? "1e9" : u.dec == 1e6 ? "1e6" : "1e3");
    snprintf(bin, sizeof bin, "%s (%s)", u.bname, u.dec == 1e9 ? "2^30" : u.dec == 1e6 ? "2^20" : "2^10");
    fprintf(out, "  %-16s %-5s %9s %18s %12s %12s %7s\n", "category", "dtype", "bytes/Ψ",
            "bytes", dec, bin, "share");
    double psi = (double)b->rank_params;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char per[16];
        if (rows[i].bpp < 0) snprintf(per, sizeof per, "-");
        else snprintf(per, sizeof per, "%.3g", psi > 0 ? rows[i].bytes / psi : 0);
        fprintf(out, "  %-16s %-5s %9s %18s %12.3f %12.3f %6.1f%%\n", rows[i].name,
                rows[i].dtype, per, calc_fmt_commas(commas, sizeof commas, (int64_t)rows[i].bytes),
                rows[i].bytes / u.dec, rows[i].bytes / u.bin,
                b->total > 0 ? 100 * rows[i].bytes / b->total : 0);
    }
    double states = b->total - b->acts;
    fprintf(out, "  %-16s %-5s %9.3g %18s %12.3f %12.3f %6.1f%%\n", "model states", "",
            psi > 0 ? states / psi : 0, calc_fmt_commas(commas, sizeof commas, (int64_t)states),
            states / u.dec, states / u.bin, b->total > 0 ? 100 * states / b->total : 0);
    fprintf(out, "  %-16s %-5s %9s %18s %12.3f %12.3f %6.1f%%\n", "total", "", "",
            calc_fmt_commas(commas, sizeof commas, (int64_t)b->total), b->total / u.dec,
            b->total / u.bin, 100.0);
    fprintf(out, "  activations: %s\n", b->act_formula);
}

// One bar: '#' up to the value, '!' where it passes the capacity marker '|'.
static void bar(FILE *out, const char *label, double bytes, double scale, int capcol, int width,
                Unit u, const char *note) {
    int n = (int)(bytes / scale + 0.5);
    fprintf(out, "  %-12s ", label);
    for (int col = 0; col < width; col++) {
        char c = ' ';
        if (col < n) c = (capcol >= 0 && col > capcol) ? '!' : '#';
        if (col == capcol) c = '|';
        fputc(c, out);
    }
    fprintf(out, " %9.2f %s = %.2f %s%s\n", bytes / u.dec, u.dname, bytes / u.bin, u.bname,
            note ? note : "");
}

void calc_print_bars(FILE *out, const CalcBreakdown *b, const char *gpu_label, double mem_bytes) {
    const int width = 60;
    double top = b->total > mem_bytes ? b->total : mem_bytes;
    if (top <= 0) top = 1;
    double scale = top / (width - 1);
    int capcol = mem_bytes > 0 ? (int)(mem_bytes / scale + 0.5) : -1;
    if (capcol >= width) capcol = width - 1;
    Unit u = pick_unit(top);
    fprintf(out, "\nTraining memory per GPU   (# = %.3g %s", scale / u.dec, u.dname);
    if (mem_bytes > 0)
        fprintf(out, "; '|' = %s, %.2f GB = %.2f GiB", gpu_label ? gpu_label : "GPU",
                mem_bytes / 1e9, mem_bytes / GIB);
    fprintf(out, ")\n  (%s = %s bytes, as the notes count; %s = %s bytes, as the runs print)\n",
            u.dname, u.dec == 1e9 ? "1e9" : u.dec == 1e6 ? "1e6" : "1e3", u.bname,
            u.dec == 1e9 ? "2^30" : u.dec == 1e6 ? "2^20" : "2^10");
    char opt_note[96];
    snprintf(opt_note, sizeof opt_note, "   (master %.2f + m %.2f + v %.2f)", b->master / u.dec,
             b->m / u.dec, b->v / u.dec);
    bar(out, "optimizer", b->master + b->m + b->v, scale, capcol, width, u, opt_note);
    bar(out, "gradients", b->grads, scale, capcol, width, u, NULL);
    bar(out, "parameters", b->params, scale, capcol, width, u, NULL);
    bar(out, "activations", b->acts, scale, capcol, width, u, NULL);
    char verdict[96] = "";
    if (mem_bytes > 0)
        snprintf(verdict, sizeof verdict, "   %s (%.0f%% of the GPU)",
                 calc_fits(b, mem_bytes) ? "fits" : "does NOT fit", 100 * b->total / mem_bytes);
    bar(out, "total", b->total, scale, capcol, width, u, verdict);
}

void calc_print_cost(FILE *out, const CalcCostSpec *c, const CalcCost *r, const char *gpu_label) {
    char n1[32], n2[32];
    fprintf(out, "\nTraining cost: GPU-seconds = 6 * N * tokens / (peak FLOP/s * MFU)\n");
    fprintf(out, "  %-24s %s\n", "parameters N", calc_fmt_count(n1, sizeof n1, c->nparams));
    fprintf(out, "  %-24s %s\n", "tokens", calc_fmt_count(n2, sizeof n2, c->tokens));
    fprintf(out, "  %-24s %.3e FLOP\n", "training compute", r->flops);
    fprintf(out, "  %-24s %s, peak %.0f TFLOP/s bf16, MFU %.2f -> %.0f TFLOP/s achieved\n", "GPU",
            gpu_label ? gpu_label : "custom", c->peak_flops / 1e12, c->mfu,
            c->peak_flops * c->mfu / 1e12);
    fprintf(out, "  %-24s %.3e s\n", "GPU-seconds", r->gpu_seconds);
    fprintf(out, "  %-24s %.3e h  (%.0f GPU-years)\n", "GPU-hours", r->gpu_hours, r->gpu_years);
    fprintf(out, "  %-24s %.1f days on %d GPUs\n", "wall clock", r->wall_days, c->gpus);
    char dollars[32];
    calc_fmt_commas(dollars, sizeof dollars, (int64_t)(r->dollars + 0.5));
    fprintf(out, "  %-24s $%s at $%.2f per GPU-hour\n", "cost", dollars, c->price);
}
