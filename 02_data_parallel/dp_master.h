// dp_master.h: the communication steps of naive single-master DataParallel (nn.DataParallel).
//
// Rank 0 is the master (PyTorch's GPU 0). Every step it
//   replicates   the current weights to every rank,            dp_replicate
//   scatters     the global batch, B/N rows to each rank,      dp_scatter_batch
//   reduces      every rank's gradients into its own buffer,  dp_reduce_grads
// and then runs the optimizer alone. Everything goes through rank 0: its link carries N-1 copies
// of the weights out and (linear) N-1 copies of the gradients in, while the others wait.
// All of it is built from send/recv, so the byte counters show exactly what each rank moved.
#pragma once
#include <stddef.h>

#include "dist.h"
#include "kernels.h"

typedef enum { DP_REDUCE_LINEAR = 0, DP_REDUCE_TREE = 1 } DpReduce;

// The buffers below are fp32 or bf16 (dt = DIST_F32 or DIST_BF16, mixed precision); e is the
// element size (4 or 2 bytes).

// params: (n,) on every rank. Rank 0 sends its values to rank 1, then 2, ..., N-1.
// Bytes: rank 0 sent (N-1) * e*n; every other rank received e*n.
void dp_replicate(void *params, size_t n, DistDtype dt, DistGroup *g);

// all_inputs, all_targets: (N*rows, T) on rank 0 only (NULL elsewhere); inputs, targets:
// (rows, T) on every rank. Rank r receives rows [r*rows, (r+1)*rows) of both; rank 0 copies
// its own rows. Bytes: rank 0 sent (N-1) * 2 * rows*T*4; every other rank received 2*rows*T*4.
void dp_scatter_batch(const int *all_inputs, const int *all_targets, int *inputs, int *targets,
                      int rows, int T, DistGroup *g);

// acc += in over n elements of type dt, on the device of the kernels k. bf16 adds in fp32 and
// rounds the sum once to nearest even.
void dp_accumulate(void *acc, const void *in, size_t n, DistDtype dt, const Kernels *k);
// bf16: dp_accumulate widens this many elements at a time (two fp32 chunks of them, MEM_COMM)
enum { DP_ACCUM_CHUNK = 1 << 14 };

// grads: (n,) on every rank; on return rank 0's holds the SUM over ranks (the others' are
// left partly summed). scratch: (n,) on ranks that receive (rank 0; with the tree, every rank
// that has children), NULL elsewhere. k: the kernels of the device the buffers live on.
//   linear: rank 0 receives from rank 1, then 2, ..., N-1, adding each (dp_accumulate).
//           rank 0 received (N-1) * e*n; every other rank sent e*n.
//   tree:   binomial tree: in round d = 1, 2, 4, ... rank r with r % 2d == d sends its partial
//           sum to r - d and is done; rank r with r % 2d == 0 receives from r + d (if it exists).
//           rank 0 received ceil(log2 N) * e*n; every other rank sent e*n once.
void dp_reduce_grads(void *grads, void *scratch, size_t n, DistDtype dt, DpReduce how,
                     const Kernels *k, DistGroup *g);

// ceil(log2 n) for n >= 1: the rounds of the tree, and how many children rank 0 has.
int dp_tree_rounds(int n);
// Does rank `rank` of n receive anything in the tree (and so need scratch)?
int dp_tree_receives(int rank, int n);
