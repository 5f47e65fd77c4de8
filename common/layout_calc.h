// layout_calc.h: what one rank of the lab's own GPT-2 costs under a DP x TP x PP layout, from the
// shapes alone: the bytes it sends per step in each of its three groups and the bytes of one
// micro-batch's activation set on its stage. Chapter 09 prints these next to what it measured;
// test_09_3d checks them against the 8-rank CPU run to the byte. (Chapter 00's calculator,
// calc.h, does the same accounting for the large models, with its own activation model.)
#pragma once
#include "gpt2.h"

typedef struct LabLayout {
    int dp, tp, pp;     // the grid
    int v, m;           // chunks per stage, micro-batches per step per replica
    int batch;          // sequences per step, all replicas (dp·m divides it)
    int zero;           // 1: ZeRO-1 over DP (reduce-scatter + all-gather instead of all-reduce)
} LabLayout;

// Elements of TP rank's share of virtual stage vs of S = pp·v (its fp32 flat buffer): the
// blocks' sliced matrices / tp, the replicated LayerNorms and biases, the embedding's wte rows and
// wpe on vs 0, the final LayerNorm and (vs > 0) the tied copy of wte on vs S-1.
double lab_chunk_elems(const GPT2Config *c, int tp, int vs, int S);

// --zero 1: piece d of n elements over dp (shard.h's convention: the first n % dp one longer).
double lab_piece_elems(double n, int dp, int d);

// Bytes the rank at pipeline coordinate p, replica d sends per step in its TP, DP and PP group
// (out[0..2]), in dist's counting model: an all-reduce of S bytes on n ranks sends 2(n-1)S/n
// (integer division), a send S, a broadcast's root S; ZeRO-1's uneven ring reduce-scatter sends
// every piece but its own, the all-gather every piece but the next replica's.
void lab_bytes_per_step(const GPT2Config *c, const LabLayout *l, int p, int d, double out[3]);

// Bytes of one micro-batch's saved activations (fp32) on stage p of pp with one chunk, N = Bm·T
// tokens: per block 6NC + 4N + 12NC/tp + 2·Bm·(NH/tp)·T², the head 2NC + 6N + 2N·Vl, the stage's
// input and its gradient 2NC.
double lab_act_set_bytes(const GPT2Config *c, const LabLayout *l, int p);
