// whole.h: a rank's slices of the one model, and the whole state back: the one gather, save and
// load every layer-cut or sliced layout (07's TP slices, 08's stages, 09's grid) goes through.
//
// A training state on disk is the WHOLE model (ckpt.h). A layout says what this rank holds as a
// WholeView: its slices (GPT2 views of blocks [l0, l1) of TP slice r of t), how to read a
// buffer of each (the weights the forward reads, the fp32 master, Adam's m or v, in the
// slice's memory order) and how to take a slice of a whole state back. This file does the rest
// with gpt2_unshard / gpt2_shard (gpt2.h): the slices summed into the whole on the group's rank
// 0 (x + 0 == x: exact; the replicated tensors from one rank per TP group), written by it in the
// lab's format (or each rank's part of a --save-sharded checkpoint); a --resume read whole and
// sliced. The same file for every layout: any layout resumes any other, bit for bit.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "flags.h"
#include "gpt2.h"

typedef enum { WHOLE_WEIGHTS, WHOLE_MASTER, WHOLE_ADAM_M, WHOLE_ADAM_V } WholeBuf;

typedef struct WholeView {
    void *ctx;               // the chapter's
    int nslices;             // the slices this rank holds (08, 09: its chunks)
    const GPT2 *(*slice)(void *ctx, int c);
    // Slice c's buffer `which`, num_params floats in the slice's memory order, host or device:
    // its own, or `scratch` (host, num_params floats) filled; NULL: this rank adds none of it
    // to the whole. Called on every rank of `group`, slice by slice (collective where the
    // layout's reading is, as 09's ZeRO gather over DP).
    const float *(*part)(void *ctx, int c, WholeBuf which, float *scratch);
    // Slice c's part of a whole state (host, memory order; m and v NULL for --load-weights)
    // into this rank's buffers.
    void (*take)(void *ctx, int c, const float *p, const float *m, const float *v);
    // (NULL unless ZeRO shards the slices) --save-sharded: this rank's pieces of slice c (host,
    // num_params floats each, zeroed): the master, m, v, and held nonzero where it holds one.
    void (*pieces)(void *ctx, int c, float *p, float *m, float *v, float *held);
    DistGroup *group;        // the ranks whose slices sum to the whole (its rank 0 writes the
                             // file); NULL: this rank has no part in a save
    int with_replicated;     // this rank adds the replicated tensors (TP rank 0 of its group)
    DistGroup *readers;      // --resume: read by rank 0 of it and broadcast over it; NULL: every
                             // rank reads the file
    const LabArgs *args;     // the run's (the seeds a state records)
} WholeView;

// The whole model's `which` (memory order) into full on group rank 0 (n floats; NULL
// elsewhere). Collective over v->group; nothing on a rank without one.
void whole_gather(const WholeView *v, WholeBuf which, float *full);

// The three below are a SessionState's (session.h) for a WholeView:
//     s.state = (SessionState){&view, whole_save, whole_weights_to_host, whole_load};
// state.save: the training state after `step` steps (the master, m, v) in the lab's format, or
// with --save-sharded each rank's part (ckpt.h). Collective over the view's group.
void whole_save(void *view, const char *path, int step);
// state.weights_to_host: the weights the forward reads, whole, in llm.c's order, into full
// (world rank 0; NULL elsewhere). Collective over the view's group.
void whole_weights_to_host(void *view, float *full);
// state.load, and --resume or --load-weights at the start (neither: 0, nothing read): the
// whole state read, every slice taken (take). Returns the step to continue from. Collective
// over the view's readers.
int whole_load(void *view, const LabArgs *args);
