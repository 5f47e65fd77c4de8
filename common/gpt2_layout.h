// gpt2_layout.h: the shapes of GPT-2 and of its TP slices, below the model (gpt2.h) and the
// tensor-parallel pieces (tp.h), which both read them: the config, the tensor order of a block
// unit and its widths, and which elements of the full model a TP slice r of t holds (the
// heads, hidden units and vocabulary rows of docs/ARCHITECTURE.md's table). Pure arithmetic on
// host memory: no model, no device, no communication.
//
// A TP group of t ranks; rank r holds, of every block (C channels, NH heads, Cl = C/t, Hl = 4C/t):
//   qkvw (3Cl, C), qkvb (3Cl)  rows [Q_r; K_r; V_r]: heads [r·NH/t, (r+1)·NH/t) of Q, of K and of V
//   attprojw (C, Cl)           columns [r·Cl, (r+1)·Cl) (row-parallel: a partial sum of the output)
//   fcw (Hl, C), fcb (Hl)      hidden units [r·Hl, (r+1)·Hl) (column-parallel)
//   fcprojw (C, Hl)            the same units' columns (row-parallel)
//   ln1w ln1b attprojb ln2w ln2b fcprojb   replicated: every rank holds all C
// in a block unit of the slice's widths (tp_block_dims: gpt2_block_layout's 12 tensors, llm.c's
// tensor order); and of the tied wte the rows [r·Vl, (r+1)·Vl) of V padded to Vp = t·ceil(V/t)
// (the padded rows, index >= V, are zero). t = 1: the whole tensors.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Tensor kinds, in llm.c's order (the order of files, and of the tensors inside a block unit).
enum {
    GPT2_WTE, GPT2_WPE,
    GPT2_LN1W, GPT2_LN1B, GPT2_QKVW, GPT2_QKVB, GPT2_ATTPROJW, GPT2_ATTPROJB,
    GPT2_LN2W, GPT2_LN2B, GPT2_FCW, GPT2_FCB, GPT2_FCPROJW, GPT2_FCPROJB,
    GPT2_LNFW, GPT2_LNFB,
    GPT2_NUM_TENSORS
};
#define GPT2_BLOCK_TENSORS 12  // GPT2_LN1W .. GPT2_FCPROJB: block tensor i is kind GPT2_LN1W + i

typedef struct GPT2Config {
    int V;   // vocabulary size (256 = bytes)
    int T;   // maximum sequence length
    int L;   // number of blocks (of the FULL model, also in a partial one)
    int C;   // channels
    int NH;  // heads (C % NH == 0)
} GPT2Config;

// The widths inside one block, from ONE place: every block kernel call takes its shapes from
// here, so a tensor-parallel shard (fewer heads, fewer hidden units) can shrink them.
typedef struct GPT2BlockDims {
    int C;    // residual stream width (in and out of the block)
    int NH;   // attention heads computed here
    int ATT;  // attention width NH * (C / cfg.NH): qkv rows are 3*ATT, attproj's input ATT
    int FC;   // MLP hidden units (4C in the full block)
} GPT2BlockDims;
GPT2BlockDims gpt2_block_dims(const GPT2Config *cfg);  // the full block: {C, NH, C, 4C}
// Element offsets and sizes of the 12 tensors inside a block unit of these widths; returns the
// unit's size. (ln1w C, ln1b C, qkvw 3ATT*C, qkvb 3ATT, attprojw C*ATT, attprojb C, ln2w C,
// ln2b C, fcw FC*C, fcb FC, fcprojw C*FC, fcprojb C)
size_t gpt2_block_layout(const GPT2BlockDims *d, size_t offset[GPT2_BLOCK_TENSORS],
                         size_t size[GPT2_BLOCK_TENSORS]);

// One block's weights (or weight gradients) by name: views into one block unit.
typedef struct GPT2BlockWeights {
    float *ln1w, *ln1b;          // (C)
    float *qkvw, *qkvb;          // (3ATT, C), (3ATT)   rows [Q; K; V]
    float *attprojw, *attprojb;  // (C, ATT), (C)
    float *ln2w, *ln2b;          // (C)
    float *fcw, *fcb;            // (FC, C), (FC)
    float *fcprojw, *fcprojb;    // (C, FC), (C)
} GPT2BlockWeights;
GPT2BlockWeights gpt2_block_weights(const GPT2BlockDims *d, float *unit);
// Block l of the FULL model, in its flat buffer full_mem (memory order: [wte wpe] [block 0] ...).
GPT2BlockWeights gpt2_full_block(const GPT2Config *cfg, float *full_mem, int l);

// ---- a TP slice's shapes ------------------------------------------------------------------------

// Checks that a (C, NH, V) model splits over tp ranks: NH % tp == 0 (whole heads per rank; so
// C % tp == 0 too). Fails the job naming what would be valid (lab_fail_collective: every rank
// sees the same arguments).
void tp_check_config(const GPT2Config *cfg, int tp);
// The widths of rank r's block: {C, NH/tp, C/tp, 4C/tp} (the same for every rank).
GPT2BlockDims tp_block_dims(int C, int NH, int tp);
// Element counts of the 12 tensors of one rank's block unit, and their sum; the views of one.
void tp_block_sizes(int C, int tp, size_t sizes[GPT2_BLOCK_TENSORS]);
size_t tp_block_count(int C, int tp);
GPT2BlockWeights tp_block_views(float *base, int C, int tp);

// This rank's rows: [v0, v0 + Vl) of the padded vocabulary, of which the first nvalid are real.
typedef struct TpVocab { int V, Vp, Vl, v0, nvalid; } TpVocab;
TpVocab tp_vocab(int V, int tp, int r);

// The slicing, on host memory. A sliced block tensor is a set of contiguous runs (a replicated
// one is one run, all of it): tp_slice_run gives the j-th run of block tensor i of rank r as
// (offset in the full tensor, offset in the slice's, length), and 0 when there is none.
typedef struct TpRun { size_t full, shard, n; } TpRun;
int tp_slice_run(int i, size_t j, int C, int tp, int r, TpRun *out);
int tp_block_sliced(int i);  // block tensor i (0 .. 11) is split over the group
// shard := rank r's slices of full (a t = 1 view), replicated tensors copied.
void tp_block_shard(GPT2BlockWeights *shard, const GPT2BlockWeights *full, int C, int tp, int r);
// The reverse: writes shard's slices into rank r's places of full; the replicated tensors only
// when with_replicated (so zeroed fulls from every rank, one of them with_replicated, sum to
// the whole).
void tp_block_unshard(GPT2BlockWeights *full, const GPT2BlockWeights *shard, int C, int tp, int r,
                      int with_replicated);
// wte_local (Vl,C) := rows [v0, v0+Vl) of wte (V,C), padded rows zero; and back (rows
// [v0, v0+nvalid) := wte_local's, the padding dropped).
void tp_wte_shard(float *wte_local, const float *wte, const TpVocab *tv, int C);
void tp_wte_unshard(float *wte, const float *wte_local, const TpVocab *tv, int C);
