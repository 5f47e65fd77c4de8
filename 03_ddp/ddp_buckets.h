// ddp_buckets.h: DDP's gradient buckets, the part of PyTorch's Reducer that makes overlap work.
//
// PyTorch DDP packs the parameters' gradients into buckets (25 MiB each, the first one 1 MiB),
// filled in REVERSE parameter order because that is roughly the order in which backward
// produces the gradients. An autograd hook per parameter counts down its bucket; the moment
// every gradient of a bucket is final, that bucket's all-reduce starts (non-blocking) while
// backward goes on with the earlier layers. The optimizer waits for all of them.
//
// Here backward runs in pieces (the head, block L-1, ..., block 0, the embedding) and main.c
// calls ddp_piece_done() after each one: that is our autograd hook. The flat gradient buffer has
// llm.c's layout (all layers' qkvw together, ...), so a block's gradients are NOT contiguous:
// a bucket is a list of slices. By default (ddp_use_views) each slice is all-reduced in place,
// like PyTorch's gradient_as_bucket_view=True; otherwise the slices are packed into the
// bucket's own contiguous buffer (MEM_COMM) before the all-reduce and copied back after it.
// The gradients are fp32, or bf16 in mixed precision: they travel in the model's type.
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "dist.h"
#include "gpt2.h"

// The parameters in the order PyTorch's model.parameters() lists them for GPT-2: wte, wpe,
// then block 0's (ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
// fcprojb), block 1's, ..., then lnfw, lnfb. Fills out (4 + 12 L entries), returns the count.
int ddp_module_order(const GPT2Config *cfg, GPT2Param *out);

// Backward runs in L + 2 pieces, numbered in the order they run:
//   0 = head (final LayerNorm and the tied output layer), 1 + (L-1-l) = block l, L + 1 = embedding.
int ddp_num_pieces(const GPT2Config *cfg);
// The piece after which parameter p's gradient is final. wte is used twice (embedding and the
// tied output layer): its gradient is only final after the embedding's backward.
int ddp_ready_piece(const GPT2Param *p, int L);

// Bucket assignment, PyTorch's compute_bucket_assignment_by_size: walk the parameters in the
// given order (bytes[i] each) and add each to the current bucket; a bucket is closed as soon as
// its size reaches its cap (>=): first_cap for the first bucket, cap for every later one. So a
// bucket may exceed its cap by less than one parameter, and cap 0 means one bucket per
// parameter. Writes bucket_of[i] (0, 1, 2, ... in order) and returns the number of buckets.
int ddp_assign_buckets(const size_t *bytes, int n, size_t first_cap, size_t cap, int *bucket_of);

typedef struct DdpBucket {
    int first, count;    // its parameters: Ddp.params[first .. first + count)
    size_t numel;        // elements of its packed buffer
    void *buf;           // (numel,) the packed gradients, on the model's device (MEM_COMM),
                         // allocated at the first launch; NULL with views (ddp_use_views)
    int pending;         // parameters whose gradient is not final yet (this step)
    int launched, done;  // this step
    int launch_piece;    // the backward piece after which it was launched (-1: not yet)
    int launch_seq;      // 0 for the first bucket launched this step, 1 for the next, ...
    DistWork *work;      // its all-reduces: 1 (packed), or one per parameter (views)
    int nwork;
    double t_launch, t_done;  // lab_now() when launched / when seen complete
} DdpBucket;

typedef struct Ddp {
    GPT2 *model;
    DistGroup *group;
    void *grads;         // the model's gradient buffer: fp32, or bf16 in mixed precision
    DistDtype dtype;     // its type on the wire (DIST_F32 or DIST_BF16)
    size_t esize;        // bytes per element (4 or 2)
    int nparams;
    GPT2Param *params;   // every parameter, in bucket order (reverse module order)
    int *bucket_of;      // (nparams,) bucket of params[i]
    int *ready_piece;    // (nparams,) ddp_ready_piece of params[i]
    int nbuckets;
    DdpBucket *buckets;
    int next_launch;     // buckets start strictly in order: the next one to start
    int nlaunched;       // buckets started this step
    int views;           // ddp_use_views: all-reduce in place, no bucket buffers
} Ddp;

// Buckets for model m from an assignment (params in bucket order, bucket_of from
// ddp_assign_buckets or any other grouping of consecutive parameters).
void ddp_init(Ddp *d, GPT2 *m, const GPT2Param *params, int nparams, const int *bucket_of,
              DistGroup *g);
void ddp_free(Ddp *d);
// Views instead of packing (PyTorch's gradient_as_bucket_view): a bucket's all-reduce becomes
// one in-place all-reduce per parameter slice of the model's gradient buffer, started together
// and in order; no bucket buffers, no pack and unpack copies. Call after ddp_init.
void ddp_use_views(Ddp *d);

// The hook: backward piece `piece` just finished. Counts down the buckets of the parameters it
// made final and starts, in bucket order, every bucket that is complete. Then pokes progress.
void ddp_piece_done(Ddp *d, int piece);
// Start bucket b's all-reduce (average) now: pack its gradients, dist_iall_reduce.
void ddp_launch(Ddp *d, int b);
// Let MPI progress the all-reduces in flight (dist_test on each); see README "progress".
void ddp_poke(Ddp *d);
// Wait for every bucket, copy the averaged gradients back into the model's gradient buffer,
// record trace spans, and reset the buckets for the next step.
void ddp_wait(Ddp *d);
// Communication only (to measure overlap): start every bucket at once, then ddp_wait.
void ddp_all_buckets_now(Ddp *d);

// The bucket table (index, parameters, size, ready after which piece), for the student.
void ddp_print_buckets(const Ddp *d, FILE *out);
