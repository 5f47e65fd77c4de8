// 04_ring_allreduce: the ring all-reduce, step by step and against the library.
//
//   mpirun -np 4 ./04_ring_allreduce/run --show     the notes' picture, 4 GPUs x 4 chunks a0..d3
//   mpirun -np 4 ./04_ring_allreduce/run            bytes per rank, then the bandwidth table
//   mpirun -np 2 ./04_ring_allreduce/run --min-bytes 1M --max-bytes 256M --step-factor 2
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "check.h"
#include "dist.h"
#include "flags.h"
#include "mem.h"
#include "ring.h"

// --show: run the ring of ring.c on N chunks of one float each and draw every step.
static int show_ring(DistGroup *g) {
    int N = g->size, r = g->rank;
    size_t count = (size_t)N;  // one float per chunk: a0, b0, ... on rank 0
    float buf[8], want[8];
    ring_picture_fill(buf, count, g);
    memcpy(want, buf, count * sizeof(float));
    dist_all_reduce(NULL, want, count, DIST_F32, DIST_SUM, g);

    if (r == 0)
        printf("ring all-reduce on %d GPUs: GPU r sends only to GPU r+1 and receives only from GPU r-1 (mod %d)\n"
               "chunk c of GPU r is written as letter c + digit r, sums as a0+a1; [..] = the complete sum,\n"
               "* = the chunk that just arrived\n\n", N, N);
    RingPicture *pic = ring_picture_begin(buf, count, g);
    const DistCounters *c = dist_counters();
    uint64_t s0 = c->sent[OP_SEND], r0 = c->recv[OP_RECV];
    float tmp[8];
    ring_scatter_reduce(buf, count, tmp, g, pic);
    if (r == 0)
        printf("\nafter %d scatter-reduce steps every GPU holds one complete chunk: now pass them around\n", N - 1);
    ring_all_gather(buf, count, g, pic);
    ring_picture_end(pic);
    uint64_t sent = c->sent[OP_SEND] - s0, recv = c->recv[OP_RECV] - r0;

    int bad = memcmp(buf, want, count * sizeof(float)) != 0;
    dist_all_reduce(NULL, &bad, 1, DIST_I32, DIST_MAX, g);
    if (r == 0) {
        printf("\nafter %d all-gather steps every GPU holds every complete chunk\n", N - 1);
        printf("same as dist_all_reduce on every GPU: %s\n", bad ? "NO" : "yes");
        printf("each GPU sent %llu B and received %llu B: 2(N-1) = %d chunks of S/N = %zu B each,\n"
               "that is 2(N-1)/N * S with S = %zu B (N = %d)\n",
               (unsigned long long)sent, (unsigned long long)recv, 2 * (N - 1), sizeof(float),
               count * sizeof(float), N);
    }
    return !bad;
}

static const char *USAGE =
    "The ring all-reduce of the notes, built from send/recv: scatter-reduce (N-1 steps) then\n"
    "all-gather (N-1 steps), 2(N-1)/N * S bytes per rank whatever N is.\n"
    "\n"
    "  make 04_ring_allreduce && mpirun -np 4 ./04_ring_allreduce/run --show\n"
    "      draws the ring step by step (4 GPUs x 4 chunks a0..d3), from the real buffers\n"
    "  mpirun -np 4 ./04_ring_allreduce/run [--min-bytes 1K --max-bytes 16M --step-factor 4]\n"
    "      bytes per rank (ring vs naive root), then a bandwidth table like nccl-tests'\n"
    "      all_reduce_perf (-b/-e/-f there are --min-bytes/--max-bytes/--step-factor here):\n"
    "      the ring, the pipelined ring, MPI_Allreduce and the naive root, every row checked\n"
    "  (as root add --allow-run-as-root; more ranks than cores: --oversubscribe\n"
    "   --mca mpi_yield_when_idle 1)\n"
    "\n"
    "Only the chapter flags below: nothing is trained here, so the shared model and training\n"
    "flags are refused.";

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    int show = 0, step_factor = 4, warmup = 5, iters = 20, repeats = 1, segment_kib = 256;
    const char *min_bytes = "1K", *max_bytes = "16M";
    FlagSpec extra[] = {
        {"--show", FLAG_BOOL, &show, 0, 1, NULL, "draw the ring step by step (2..8 ranks) instead of the benchmark"},
        {"--min-bytes", FLAG_STRING, &min_bytes, 0, 0, NULL, "smallest message size S, e.g. 4096, 1K, 1M (nccl-tests -b)"},
        {"--max-bytes", FLAG_STRING, &max_bytes, 0, 0, NULL, "largest message size, at most 1G (nccl-tests -e)"},
        {"--step-factor", FLAG_INT, &step_factor, 2, 1024, NULL, "multiply the size by this each row (nccl-tests -f)"},
        {"--warmup-iters", FLAG_INT, &warmup, 1, 10000, NULL, "untimed calls per row; the first is checked (nccl-tests -w)"},
        {"--iters", FLAG_INT, &iters, 1, 100000, NULL, "timed calls per row (nccl-tests -n)"},
        {"--repeats", FLAG_INT, &repeats, 1, 1000, NULL, "timed turns per row, algorithms in turn; the fastest counts"},
        {"--segment-kib", FLAG_INT, &segment_kib, 1, 1048576, NULL, "segment of the pipelined ring, in KiB"},
    };
    lab_parse_args_for(LAB_FLAGS_NONE, argc, argv, &args, extra, (int)(sizeof extra / sizeof extra[0]),
                   "04_ring_allreduce: ring all-reduce from send/recv", USAGE);
    DistGroup *g = dist_world();

    int ok = 1;
    if (show) {
        if (g->size > 8)
            lab_fail_collective("--show draws at most 8 ranks (chunks a..h), this job has %d; run with -np 2..8, "
                                "or drop --show for the benchmark", g->size);
        ok = show_ring(g);
    } else {
        RingBenchOpts o;
        o.min_bytes = ring_parse_size(min_bytes);
        o.max_bytes = ring_parse_size(max_bytes);
        if (o.min_bytes < sizeof(float) || o.min_bytes > (1u << 30))
            lab_fail_collective("--min-bytes '%s' is not a size from 4 to 1G (a number of bytes, optionally "
                                "followed by K, M or G, e.g. 1K)", min_bytes);
        if (o.max_bytes < o.min_bytes || o.max_bytes > (1u << 30))
            lab_fail_collective("--max-bytes '%s' is not a size from --min-bytes (%s) to 1G (e.g. 256M)", max_bytes,
                                min_bytes);
        o.step_factor = step_factor;
        o.warmup = warmup;
        o.iters = iters;
        o.repeats = repeats;
        o.seg_bytes = (size_t)segment_kib * 1024;
        size_t table_bytes = o.max_bytes < (4u << 20) ? o.max_bytes : (4u << 20);
        ok = ring_bytes_table(table_bytes, o.seg_bytes, g);
        if (g->rank == 0) printf("\n");
        ok = ring_bench(&o, g) == 0 && ok;
    }
    dist_finalize();
    return ok ? 0 : 1;
}
