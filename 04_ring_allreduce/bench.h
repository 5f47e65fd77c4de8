// bench.h: the all-reduce benchmark of chapter 04, in the format of nccl-tests.
#pragma once
#include <stddef.h>

#include "dist.h"

typedef struct RingBenchOpts {
    size_t min_bytes, max_bytes;  // message sizes S from min to max, times step_factor each row
    int step_factor;
    int warmup, iters;            // untimed and timed calls per row
    int repeats;                  // timed turns per row, the algorithms in turn; the fastest counts
    size_t seg_bytes;             // segment of the pipelined ring
} RingBenchOpts;

// Runs the table on every rank of g (rank 0 prints). Every row is checked: returns the number
// of wrong elements over all rows and ranks (0 when all is well), the same on every rank.
long ring_bench(const RingBenchOpts *o, DistGroup *g);

// Bytes each rank sends and receives in one all-reduce of `bytes`, measured with the dist
// counters for the ring, the pipelined ring and the naive root, printed next to the formulas.
// Returns 1 when every measurement matches its formula (the same on every rank).
int ring_bytes_table(size_t bytes, size_t seg_bytes, DistGroup *g);

// "1K" -> 1024, "256M", "1G", "4096"; 0 when `s` is not such a size.
size_t ring_parse_size(const char *s);
