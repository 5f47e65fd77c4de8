// ckpt.h: weights in llm.c's format, training state in ours; every write is atomic.
//
// Weights: header of 256 int32 (magic 20240326, version 3 = fp32 / 5 = bf16, maxT, V, L, NH,
// C, padded V), then the 16 tensors in llm.c's order. We also store a CRC32 of the tensor bytes
// in header[10] (with header[9] = 0x4C414221 "LAB!" to say it is there), and a CRC32 of the
// header itself in header[11] (header[12] = 0x4C414248 "LABH"); llm.c ignores them, and files
// written by llm.c (no markers) load without the checks.
//
// Training state (our format, little-endian): magic "LABSTATE", version, the config, step,
// seeds, AdamW hyperparameters, (version 2) the run's identity, (version 3) the loop's guard
// record, params, Adam m, v, and a CRC32 of everything before it. Versions 1 (no identity) and
// 2 (no guard record) still load; a run writes version 3 only when its guard decides updates.
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

// The loop's guard record (session_guard.c): what its spike detector and skip policies have
// seen, so that a --resume goes on deciding as the uninterrupted run would. World rank 0's
// windows of recent losses and grad norms (the values in order, oldest first, and where the
// ring's next value goes), the run's counts, and the steps a rollback skips. Only a run whose
// updates depend on it (--on-spike skip|rollback|stop, --on-nan skip) hands it over; its
// states are then written in format 3, every other run's in format 2 as before.
#define CKPT_GUARD_WINDOW 256     // = HEALTH_WINDOW_MAX (health.h)
#define CKPT_GUARD_ROLLBACKS 16   // = SESSION_MAX_ROLLBACKS (session.h)
typedef struct CkptGuard {
    int32_t nan_skips, spike_skips, window_skips, rollbacks;  // the run's counts so far
    int32_t cap;                  // the windows' size when saved (--spike-window)
    int32_t nloss, loss_head, ngnorm, gnorm_head;  // values held; the ring's next slot
    int32_t lr_low_until;         // a rollback's replay at a lower lr ends there (-1: none)
    int32_t nwin;                 // rollbacks so far: their skipped steps [win_lo, win_hi)
    int32_t win_lo[CKPT_GUARD_ROLLBACKS], win_hi[CKPT_GUARD_ROLLBACKS];
    double loss[CKPT_GUARD_WINDOW], gnorm[CKPT_GUARD_WINDOW];  // oldest first
} CkptGuard;
// The record the next save writes (the loop calls it before each save; process-global, like the
// identity). NULL: none (states saved in format 2). A save takes its copy when it is called
// (--async-save writes that copy later).
void ckpt_set_guard(const CkptGuard *g);
// The record of the last state this process loaded (a file or a sharded manifest): 1 and *g,
// or 0 when it held none (format 1 or 2).
int ckpt_loaded_guard(CkptGuard *g);

// Writes the state in format 2 with the process's identity when ckpt_set_identity was called
// (the header's total_steps, left 0, then taken from it), format 3 when a guard record was also
// set (ckpt_set_guard), else in format 1.
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

// ---- how a run writes its checkpoints (the notes' 10.9; flags.c sets it from the flags) ------
//
// --async-save: ckpt_save_training (and a sharded save) takes a host snapshot of the state, in
//   the file's order, and returns; a background thread writes it (tmp, fsync, rename: the same
//   bytes as a synchronous save) while training goes on. One write at a time: the next save,
//   a rollback and the run's end wait for it (ckpt_settle), and so does an exit.
// --keep-last K: each save goes to "<path>.step-N" and <path> becomes a symbolic link to it
//   (swapped by a rename: atomic); the newest K are kept, older ones removed after the new one is
//   complete.
// --save-sharded: <path> is a directory (a link to "<path>.step-N/"): each rank writes the part
//   of the state it holds, shard-RRRRR.bin, and rank 0 a manifest once every shard is complete
//   (ckpt_shard.c). Any layout resumes it.
typedef struct CkptPolicy {
    int async;       // --async-save
    int keep_last;   // --keep-last K (0: one file, replaced)
    int sharded;     // --save-sharded
} CkptPolicy;
void ckpt_set_policy(const CkptPolicy *p);
CkptPolicy ckpt_policy(void);
// The command line that runs the job (recorded as the layout in a sharded manifest).
void ckpt_set_command(int argc, char **argv);
const char *ckpt_command(void);

// What this process's writes took (for the stall line: session.c).
typedef struct CkptStats {
    int writes;           // files written (or shards)
    double write_s;       // seconds inside the writes (background ones included)
} CkptStats;
CkptStats ckpt_stats(void);
// Waits for this process's background write, if any (its span goes into the --trace
// timeline). Not collective.
void ckpt_wait(void);
// Every rank at the same point (collective over the world when --async-save or
// --save-sharded): the background writes finished on every rank, and a sharded save whose
// shards are all written gets its manifest (rank 0): the checkpoint is complete on return.
void ckpt_settle(void);

// Writes (in this thread, or the background's with --async-save) the state st to path under
// the policy (keep-last rotation); takes ownership of st's arrays (freed after the write).
void ckpt_write_state_owned(const char *path, TrainState *st);
// The final path a state of `step` goes to under the policy ("<path>.step-N" with
// --keep-last/--save-sharded, else path), into buf.
const char *ckpt_step_path(char *buf, size_t len, const char *path, int step);
// After the file (or directory) of `step` is complete: <path> -> it (a link swapped by a
// rename), and the ones beyond the newest K removed. Nothing without --keep-last/--save-sharded.
void ckpt_rotate(const char *path, int step);
// Is path a sharded checkpoint (a directory, or a link to one)?
int ckpt_is_sharded(const char *path);

// ---- sharded checkpoints (ckpt_shard.c; --save-sharded) ----------------------------------------
//
// A directory: shard-RRRRR.bin from each rank that holds a part of the state, and a manifest
// (text) written by rank 0 once every shard is complete. A shard holds ranges of the WHOLE
// model's memory order (gpt2.h: block-major) and, for them, the fp32 weights (bf16: the master),
// Adam's m and v, and a CRC32 of all of it. The manifest: the step, the config, each shard's
// file, elements, bytes and CRC32, the layout (the command line that wrote it, on how many
// ranks), the run's identity (hyperparameters, data seed, the data file's size and CRC32), the
// code (the program's size and CRC32), the guard record when the run has one ("guard" lines,
// the windows' values as exact hex floats), and its own CRC32. A resume reads every shard into the
// whole state (every element exactly once, else refused), then takes this layout's part the
// way a file is taken: any layout resumes any other, exactly.
typedef struct CkptShard {
    size_t n;              // elements of the whole model
    size_t nr, cap, k;     // ranges, their capacity, elements held
    uint64_t *ranges;      // (nr x 2) start, count in the whole's memory order
    float *p, *m, *v;      // (k) the held elements, in range order (host)
    size_t kcap;
} CkptShard;
void ckpt_shard_begin(CkptShard *sh, size_t n);
// Elements [at, at + count) of the whole, from p, m, v (count floats each; host or device).
void ckpt_shard_add(CkptShard *sh, size_t at, size_t count, const float *p, const float *m,
                    const float *v);
// A slice's buffers (a GPT2 of a TP slice and/or a stage: its master, m, v; host or device):
// the elements gpt2_unshard puts into the whole (the replicated tensors only when
// with_replicated, as the chapters' gathers). held (host, the slice's size, or NULL: all of it):
// nonzero where this rank holds the element (a ZeRO piece of the slice).
void ckpt_shard_add_slice(CkptShard *sh, const GPT2 *slice, const float *p, const float *m,
                          const float *v, const float *held, int with_replicated);
// Writes this rank's shard of the state after `step` steps into "<path>.step-N/" (in the
// background with --async-save) and frees sh; the manifest follows at ckpt_settle. Every rank
// that saves calls it (one that holds nothing: an empty sh, and no file).
void ckpt_shard_write(const char *path, const GPT2Config *cfg, int step, uint64_t seed,
                      uint64_t data_seed, CkptShard *sh);
// What a valid sharded checkpoint's manifest says, after the whole directory is checked
// (manifest CRC, every shard's size and CRC32, every element exactly once): 0; -1 and why.
typedef struct CkptManifest {
    int step, nshards, nranks;
    GPT2Config cfg;
    uint64_t n;
    RunIdentity id;
    char layout[1100];
    int has_guard;         // the manifest's "guard" lines (the run's guard record) were there
    CkptGuard guard;
} CkptManifest;
int ckpt_shard_verify(const char *dir, CkptManifest *mf, char *err, size_t errlen);
// The whole state (memory order, host arrays of n) from the shards; the config must be
// *expect's. Rank 0 prints the restore time. Returns the step.
int ckpt_shard_load(const char *dir, const GPT2Config *expect, float *p, float *m, float *v,
                    size_t n);

// (ckpt.c, for ckpt_shard.c) a background-capable write of owned bytes; after(arg) follows it
void ckpt_write_bytes_owned(const char *path, void *buf, size_t n, void (*after)(void *), void *arg);
void ckpt_note_write(double t0, double t1);
int ckpt_identity(RunIdentity *id);  // the process's (ckpt_set_identity): 1, or 0 if none
int ckpt_guard(CkptGuard *g);        // the process's (ckpt_set_guard): 1, or 0 if none
void ckpt_note_loaded_guard(const CkptGuard *g);  // what ckpt_loaded_guard says (NULL: none)
// A record's fields in range (window sizes, heads, counts): 0; -1 with the reason in err.
int ckpt_guard_why(const CkptGuard *g, char *err, size_t errlen);
