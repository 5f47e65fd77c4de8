// shard.h: how the lab cuts n elements into `parts` contiguous shards (one convention for all).
//
// Shard i is [begin, begin + count): the shards tile [0, n) in order, and the first n % parts
// of them are one element longer than the rest:
//   count_i = n / parts + (i < n % parts)
//   begin_i = i * (n / parts) + min(i, n % parts)
// Any n works: n = 0, or n < parts (the last parts - n shards are then empty). This is what
// 01's blocks (prim_block_start) and 04's ring chunks (ring_chunk_start) are, and what rank r of
// an uneven dist op (dist_reduce_scatter_n, dist_all_gather_n, dist_gather_n) owns:
// shard_range(n, N, r).
#pragma once
#include <stddef.h>

// parts >= 1, 0 <= i < parts (checked: a bad call fails with the values).
void shard_range(size_t n, int parts, int i, size_t *begin, size_t *count);
size_t shard_begin(size_t n, int parts, int i);
size_t shard_count(size_t n, int parts, int i);
