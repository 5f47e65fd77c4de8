// ckpt.h: weights in llm.c's format, training state in ours; every write is atomic.
//
// Weights: header of 256 int32 (magic 20240326, version 3 = fp32 / 5 = bf16, maxT, V, L, NH,
// C, padded V), then the 16 tensors in llm.c's order. We also store a CRC32 of the tensor bytes
// in header[10] (with header[9] = 0x4C414221 "LAB!" to say it is there), and a CRC32 of the
// header itself in header[11] (header[12] = 0x4C414248 "LABH"); llm.c ignores them, and files
// written by llm.c (no markers) load without the checks.
//
// Training state (our format, little-endian): magic "LABSTATE", version, the config, step,
// seeds, AdamW hyperparameters, (version 2) the run's identity, params, Adam m, v, and a CRC32
// of everything before it. Version 1 files (no identity) still load.
// Every file is written to "<path>.tmp", fsync'ed, then renamed over <path>: a crash never
// leaves a torn file, and the previous checkpoint survives until the new one is complete. A
// write error (ENOSPC, or EFBIG past `ulimit -f`: SIGXFSZ is ignored so that it is an error, not
// a kill) ends the job with a message, the tmp removed; a tmp left by a killed save is removed
// at the next save, with a note on stderr.
// Loads validate the whole file before they use or report a field of its header: magic, an exact
// size (a byte short or appended is refused), the CRC, then version and config.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "gpt2.h"

uint32_t crc32_update(uint32_t crc, const void *data, size_t n);   // start with crc = 0
uint32_t crc32_of(const void *data, size_t n);

// Write all of buf to path atomically (tmp + fsync + rename). Fails the job on error.
void file_write_atomic(const char *path, const void *buf, size_t n);

// Weights (host params, num_params floats, llm.c's order).
void ckpt_save_weights(const char *path, const GPT2Config *cfg, const float *params);
// Reads header and checks it; if expect != NULL the config must match it exactly.
// Returns the config and fills params (allocated by the caller with gpt2_param_count floats).
GPT2Config ckpt_load_weights_config(const char *path);
// The same checks as a load (magic, version, exact size, CRC), the config into *cfg: 0; or -1
// with the reason in err (flag parsing calls it, so that a damaged file is refused before step 1).
int ckpt_weights_peek(const char *path, GPT2Config *cfg, char *err, size_t errlen);
void ckpt_load_weights(const char *path, const GPT2Config *expect, float *params);

typedef struct TrainState {
    GPT2Config cfg;
    int step;              // steps completed
    uint64_t seed, data_seed;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int warmup_steps, total_steps;
    size_t n;              // elements of params, m, v
    float *params, *m, *v; // host arrays of n floats (caller-owned)
} TrainState;

// What decides a run's trajectory besides the model config and the weights: the data (the
// synthetic source, or a file by size and CRC32 of its bytes; the path is only reported), the
// data seed, the schedule length (--steps) and the hyperparameters. Set once per process from
// the parsed flags (flags.c); every training state saved after it records it (format version 2)
// and a --resume that changes a field is refused unless allowed (--allow-changed). The layout,
// the device, the dtype and the backend are free: any layout resumes any other.
typedef struct RunIdentity {
    int steps, warmup, batch;
    uint64_t seed, data_seed;
    float lr, weight_decay, grad_clip;
    int has_data;           // 0: the synthetic source
    uint64_t data_size;
    uint32_t data_crc;
    char data[256];         // the --data path as given (reported, not compared)
} RunIdentity;
void ckpt_set_identity(const RunIdentity *id);   // NULL: none (states then saved in format 1)
// The file's size and CRC32 into *size, *crc: 0; -1 with the reason in err.
int ckpt_file_crc(const char *path, uint64_t *size, uint32_t *crc, char *err, size_t errlen);
// The identity a whole, valid training state records (the load's checks first): 1, and *id; 0
// for a state of format version 1, which records none; -1 with the reason in err.
int ckpt_state_identity(const char *path, RunIdentity *id, char *err, size_t errlen);
// The fields of `now` that differ from `was`, by name ("data-seed", "steps", ...; the names
// --allow-changed takes): returns how many; for each, "name was -> now" into lines[i] (up to max).
#define RUN_IDENTITY_FIELDS "data, data-seed, steps, lr, warmup, weight-decay, grad-clip, batch, seed"
int ckpt_identity_diff(const RunIdentity *was, const RunIdentity *now, char lines[][160],
                       const char *names[], int max);

// Writes the state in format 2 with the process's identity when ckpt_set_identity was called
// (the header's total_steps, left 0, then taken from it), else in format 1.
void ckpt_save_state(const char *path, const TrainState *s);
// The step and the run length (total_steps) a training-state file holds, read only after the
// whole file passed the load's checks (exact size, CRC, version), so that a damaged header is
// never reported as a step (flag parsing calls it on every rank). 0 on success; -1 with the
// reason in err when it is not a whole state file or its steps cannot be (step < 0, beyond
// --steps' range, or past a recorded total_steps).
int ckpt_state_peek(const char *path, int *step, int *total_steps, char *err, size_t errlen);
// The model config (V, T, L, C, NH) a training-state file holds, after the same checks. 0 on
// success; -1 with the reason in err.
int ckpt_state_config(const char *path, GPT2Config *cfg, char *err, size_t errlen);
// Fills s (params/m/v must be allocated for expect's parameter count); checks the config
// against *expect and refuses a mismatch naming the field. Rank 0 prints "restored step N from
// F in X ms" (the identity was checked at flag parsing, before step 1).
void ckpt_load_state(const char *path, const GPT2Config *expect, TrainState *s);

// ckpt_save_weights .. ckpt_load_state work on host arrays in the FILE order (llm.c's stacked
// order, as train_params_to_host gives). The three below take the model's own buffers, in
// memory order (block-major, gpt2.h), and convert.
// The training-state round trip every chapter does, in one place. params, m, v are n floats on
// any device (copied through the host), n = the full model's parameter count. save: the state after `step` completed steps.
// resume: loads the state, checks it against *cfg, fills params/m/v, returns the step to
// continue from.
void ckpt_save_training(const char *path, const GPT2Config *cfg, int step, uint64_t seed,
                        uint64_t data_seed, const float *params, const float *m, const float *v,
                        size_t n);
int ckpt_resume_training(const char *path, const GPT2Config *cfg, float *params, float *m,
                         float *v, size_t n);
// llm.c weights from path into params (n floats on any device, memory order); the config must match.
void ckpt_load_weights_into(const char *path, const GPT2Config *cfg, float *params, size_t n);
