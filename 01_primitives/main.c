// 01_primitives: the communication primitives of the notes, on the notes' own examples.
//
// For each primitive every rank fills its buffer the way the notes draw it, runs the library's
// collective (dist_*, over MPI) and the version of collectives.c built from send/recv, and rank 0
// prints every rank's buffer before and after, plus the bytes the send/recv version moved.
// Then it shows that reduce-scatter followed by all-gather is the all-reduce.
//
//   make 01_primitives && mpirun -np 4 ./01_primitives/run
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "collectives.h"
#include "dist.h"
#include "flags.h"
#include "mem.h"

#define MAXCOLS 5
#define CELLW 96
#define MAXN 16  // values shown per buffer

// ---------------------------------------------------------------------------------------------
// printing: each rank formats its own row; rank 0 gathers the rows and prints them aligned.

static int show_letters = 0;  // 1: print 1, 2, 3 as A, B, C (the notes' broadcast/all-gather)

// An empty slot (not written yet, or not defined for this rank) is NaN and prints as "—".
static const float EMPTY = NAN;

static void format_buf(char *out, size_t n, const float *v, size_t count) {
    size_t k = (size_t)snprintf(out, n, "[");
    for (size_t i = 0; i < count && i < MAXN && k < n; i++) {
        const char *sep = i ? ", " : "";
        if (isnan(v[i])) k += (size_t)snprintf(out + k, n - k, "%s—", sep);
        else if (show_letters && v[i] >= 1 && v[i] <= 26 && v[i] == floorf(v[i]))
            k += (size_t)snprintf(out + k, n - k, "%s%c", sep, 'A' + (int)v[i] - 1);
        else k += (size_t)snprintf(out + k, n - k, "%s%g", sep, (double)v[i]);
    }
    if (k < n) snprintf(out + k, n - k, "%s]", count > MAXN ? ", ..." : "");
}

// Columns on screen, not bytes: "—" is three bytes of UTF-8 but one column.
static int screen_width(const char *s) {
    int w = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) w++;
    return w;
}

// Left-aligned in `width` columns; the last column of a line is not padded.
static void print_padded(const char *s, int width, int last) {
    printf("%s%*s", s, last ? 0 : width - screen_width(s), "");
}

static void format_bytes(char *out, size_t n, double bytes) {
    if (bytes < 1024) snprintf(out, n, "%.0f B", bytes);
    else mem_format(out, n, bytes);
}

typedef struct {
    const char *title;
    const float *v;  // NULL: nothing to show on this rank
    size_t n;
} Col;

// The bytes this rank has moved with send/recv so far (the dist counters count real bytes).
typedef struct { uint64_t sent, recv; } Mark;
static Mark mark_now(void) {
    const DistCounters *c = dist_counters();
    Mark m = {c->sent[OP_SEND], c->recv[OP_RECV]};
    return m;
}

// Every rank passes its own columns (same titles everywhere) and the mark taken before its
// send/recv version ran: the bytes it moved since then are the last column (NULL: no bytes
// column). Collective over g.
static void show_table(DistGroup *g, const Col *cols, int ncols, const Mark *since) {
    LAB_CHECK(ncols <= MAXCOLS, "show_table: %d columns, at most %d", ncols, MAXCOLS);
    int N = g->size, sent = since != NULL;
    char row[MAXCOLS + 1][CELLW];
    memset(row, 0, sizeof row);
    for (int c = 0; c < ncols; c++) {
        if (cols[c].v) format_buf(row[c], CELLW, cols[c].v, cols[c].n);
    }
    if (sent) {
        Mark e = mark_now();
        char s[32], r[32];
        format_bytes(s, sizeof s, (double)(e.sent - since->sent));
        format_bytes(r, sizeof r, (double)(e.recv - since->recv));
        snprintf(row[ncols], CELLW, "%s / %s", s, r);
    }
    char(*rows)[MAXCOLS + 1][CELLW] = NULL;
    if (g->rank == 0) rows = lab_xmalloc((size_t)N * sizeof *rows);
    dist_gather(row, rows, sizeof row, DIST_U8, 0, g);
    if (g->rank != 0) return;

    int nc = ncols + sent, width[MAXCOLS + 1];
    const char *title[MAXCOLS + 1];
    for (int c = 0; c < ncols; c++) title[c] = cols[c].title;
    if (sent) title[ncols] = "send/recv version: sent / recv";
    for (int c = 0; c < nc; c++) {
        width[c] = screen_width(title[c]);
        for (int r = 0; r < N; r++)
            if (screen_width(rows[r][c]) > width[c]) width[c] = screen_width(rows[r][c]);
    }
    printf("  %-7s", "");
    for (int c = 0; c < nc; c++) { printf("  "); print_padded(title[c], width[c], c == nc - 1); }
    printf("\n");
    for (int r = 0; r < N; r++) {
        printf("  Rank %-2d", r);
        for (int c = 0; c < nc; c++) { printf("  "); print_padded(rows[r][c], width[c], c == nc - 1); }
        printf("\n");
    }
    free(rows);
}

// Do a and b agree on every rank? (NaN == NaN here: both "not written".) Collective.
static int same_everywhere(const float *a, const float *b, size_t n, DistGroup *g) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) bad = 1;
    dist_all_reduce(NULL, &bad, 1, DIST_I32, DIST_MAX, g);
    return !bad;
}

static void heading(DistGroup *g, const char *name, const char *what) {
    if (g->rank == 0) printf("\n== %s ==\n%s\n", name, what);
}

static void footer(DistGroup *g, int same, const char *bytes_formula) {
    if (g->rank != 0) return;
    printf("  send/recv version (collectives.c) == library (dist_*): %s\n", same ? "yes" : "NO");
    if (bytes_formula) printf("  bytes: %s\n", bytes_formula);
}

static void fill(float *v, size_t n, float x) {
    for (size_t i = 0; i < n; i++) v[i] = x;
}

// ---------------------------------------------------------------------------------------------
// the demos

static void demo_broadcast(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "broadcast", "notes: Rank 0 holds [A, B, C, D], the others nothing -> every rank holds [A, B, C, D]\n"
                            "use: make every rank's parameters equal to rank 0's before training");
    enum { n = 4 };
    float before[n], lib[n], p2p[n];
    fill(before, n, EMPTY);
    if (r == 0)
        for (int i = 0; i < n; i++) before[i] = (float)(i + 1);  // A, B, C, D
    memcpy(lib, before, sizeof lib);
    memcpy(p2p, before, sizeof p2p);
    dist_broadcast(lib, n, DIST_F32, 0, g);
    Mark m = mark_now();
    prim_broadcast(p2p, n, 0, g);
    show_letters = 1;
    Col cols[] = {{"before", before, n}, {"after dist_broadcast", lib, n}, {"after prim_broadcast", p2p, n}};
    show_table(g, cols, 3, &m);
    show_letters = 0;
    int same = same_everywhere(lib, p2p, n, g);
    char f[200];
    snprintf(f, sizeof f, "root sends S = %d B to each of the N-1 = %d others: root sent (N-1)*S, others recv S",
             (int)(n * sizeof(float)), N - 1);
    footer(g, same, f);
}

static void demo_reduce(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "reduce (SUM) to rank 0", "every rank sends its buffer to the root, which adds them up\n"
                                         "use: a single master collecting gradients (chapter 02)");
    enum { n = 2 };
    float before[n] = {(float)(2 * r + 1), (float)(2 * r + 2)}, lib[n], p2p[n];
    fill(lib, n, EMPTY);
    fill(p2p, n, EMPTY);
    dist_reduce(before, lib, n, DIST_F32, DIST_SUM, 0, g);
    Mark m = mark_now();
    prim_reduce(before, r == 0 ? p2p : NULL, n, 0, g);
    Col cols[] = {{"before", before, n}, {"after dist_reduce", lib, n}, {"after prim_reduce", p2p, n}};
    show_table(g, cols, 3, &m);
    int same = same_everywhere(lib, p2p, n, g);
    char f[200];
    snprintf(f, sizeof f, "each of the N-1 = %d others sends S = %d B: root recv (N-1)*S; it is the bottleneck",
             N - 1, (int)(n * sizeof(float)));
    footer(g, same, f);
}

static void demo_all_reduce(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "all-reduce (SUM)", "notes: Rank 0: [1, 2]  Rank 1: [3, 4]  Rank 2: [5, 6]  Rank 3: [7, 8] -> all ranks: [16, 20]\n"
                                   "use: average the gradients of data-parallel ranks (chapters 03, 04)");
    enum { n = 2 };
    float before[n] = {(float)(2 * r + 1), (float)(2 * r + 2)}, lib[n], p2p[n];
    memcpy(lib, before, sizeof lib);
    memcpy(p2p, before, sizeof p2p);
    dist_all_reduce(NULL, lib, n, DIST_F32, DIST_SUM, g);
    Mark m = mark_now();
    prim_all_reduce(p2p, n, g);
    Col cols[] = {{"before", before, n}, {"after dist_all_reduce", lib, n}, {"after prim_all_reduce", p2p, n}};
    show_table(g, cols, 3, &m);
    int same = same_everywhere(lib, p2p, n, g);
    char f[240];
    snprintf(f, sizeof f,
             "reduce-scatter + all-gather: 2(N-1)/N * S per rank when N divides the count\n"
             "         (here %d values on %d ranks: blocks of uneven size, see the next two)",
             n, N);
    footer(g, same, f);
}

static void demo_reduce_scatter(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "reduce-scatter (SUM)", "notes: Rank 0: [1, 2]  Rank 1: [3, 4] -> Rank 0: [4]  Rank 1: [6]  (1+3 to rank 0, 2+4 to rank 1)\n"
                                       "use: each rank keeps only its slice of the summed gradients (ZeRO-2, FSDP)");
    size_t n = (size_t)N;  // one block of one value per rank
    float before[MAXN], lib[1], p2p[MAXN];
    for (size_t i = 0; i < n; i++) before[i] = (float)((size_t)r * n + i + 1);
    memcpy(p2p, before, n * sizeof(float));
    dist_reduce_scatter(before, lib, 1, DIST_F32, DIST_SUM, g);
    Mark m = mark_now();
    prim_reduce_scatter(p2p, n, g);
    float *mine = p2p + prim_block_start(n, N, r);  // block r: the result
    Col cols[] = {{"before", before, n}, {"after dist_reduce_scatter", lib, 1}, {"after prim_reduce_scatter (block r)", mine, 1}};
    show_table(g, cols, 3, &m);
    int same = same_everywhere(lib, mine, 1, g);
    char f[200];
    snprintf(f, sizeof f, "each rank sends the N-1 = %d block(s) it does not own to their owners: (N-1)/N * S each way", N - 1);
    footer(g, same, f);
}

static void demo_all_gather(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "all-gather", "notes: Rank 0: [A]  Rank 1: [B]  Rank 2: [C]  Rank 3: [D] -> all ranks: [A, B, C, D]\n"
                             "use: put the full parameters back together from shards (ZeRO-3, FSDP)");
    size_t n = (size_t)N;
    float before[1] = {(float)(r + 1)}, lib[MAXN], p2p[MAXN];
    fill(p2p, n, EMPTY);
    p2p[prim_block_start(n, N, r)] = before[0];
    dist_all_gather(before, lib, 1, DIST_F32, g);
    Mark m = mark_now();
    prim_all_gather(p2p, n, g);
    show_letters = 1;
    Col cols[] = {{"before", before, 1}, {"after dist_all_gather", lib, n}, {"after prim_all_gather", p2p, n}};
    show_table(g, cols, 3, &m);
    show_letters = 0;
    int same = same_everywhere(lib, p2p, n, g);
    footer(g, same, "each rank sends its block to the N-1 others: (N-1)/N * S each way");
}

static void demo_identity(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "All-Reduce = Reduce-Scatter + All-Gather", "the reduce-scatter input again: reduce-scatter, then all-gather the blocks,\n"
                                                           "and compare with one all-reduce of the same input");
    size_t n = (size_t)N;
    float before[MAXN], rs[MAXN], both[MAXN], ar[MAXN];
    for (size_t i = 0; i < n; i++) before[i] = (float)((size_t)r * n + i + 1);
    memcpy(rs, before, n * sizeof(float));
    memcpy(ar, before, n * sizeof(float));
    prim_reduce_scatter(rs, n, g);
    // only block r of rs is the result; show the others as not ours
    for (size_t i = 0; i < n; i++)
        if ((int)i != r) rs[i] = EMPTY;
    memcpy(both, rs, n * sizeof(float));
    prim_all_gather(both, n, g);
    dist_all_reduce(NULL, ar, n, DIST_F32, DIST_SUM, g);
    Col cols[] = {{"before", before, n}, {"reduce-scatter", rs, n}, {"then all-gather", both, n}, {"dist_all_reduce", ar, n}};
    show_table(g, cols, 4, NULL);
    int same = same_everywhere(both, ar, n, g);
    if (r == 0) printf("  reduce-scatter + all-gather == all-reduce on every rank: %s\n", same ? "yes" : "NO");
}

static void demo_scatter(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "scatter from rank 0", "the root holds one block per rank; rank r receives block r\n"
                                      "use: a single master hands out the micro-batches (chapter 02)");
    size_t n = (size_t)N;
    float before[MAXN], lib[1] = {EMPTY}, p2p[1] = {EMPTY};
    fill(before, n, EMPTY);
    if (r == 0)
        for (size_t i = 0; i < n; i++) before[i] = (float)(i + 1);
    dist_scatter(before, lib, 1, DIST_F32, 0, g);
    Mark m = mark_now();
    prim_scatter(before, p2p, 1, 0, g);
    show_letters = 1;
    Col cols[] = {{"before", before, n}, {"after dist_scatter", lib, 1}, {"after prim_scatter", p2p, 1}};
    show_table(g, cols, 3, &m);
    show_letters = 0;
    footer(g, same_everywhere(lib, p2p, 1, g), "root sends block r to rank r: root sent (N-1) blocks, others recv 1");
}

static void demo_gather(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "gather to rank 0", "every rank sends its block to the root, which puts block r at place r\n"
                                   "use: a single master collects outputs or gradients (chapter 02)");
    size_t n = (size_t)N;
    float before[1] = {(float)(r + 1)}, lib[MAXN], p2p[MAXN];
    fill(lib, n, EMPTY);
    fill(p2p, n, EMPTY);
    dist_gather(before, r == 0 ? lib : NULL, 1, DIST_F32, 0, g);
    Mark m = mark_now();
    prim_gather(before, r == 0 ? p2p : NULL, 1, 0, g);
    show_letters = 1;
    Col cols[] = {{"before", before, 1}, {"after dist_gather", lib, n}, {"after prim_gather", p2p, n}};
    show_table(g, cols, 3, &m);
    show_letters = 0;
    footer(g, same_everywhere(lib, p2p, n, g), "others sent 1 block each, root recv (N-1) blocks");
}

static void demo_send_recv(DistGroup *g) {
    int r = g->rank, N = g->size;
    heading(g, "send / recv (point to point)", "rank 0 sends its buffer to rank 1; nobody else takes part\n"
                                               "use: pipeline stages pass activations forward and gradients back (chapter 08)");
    if (N < 2) {
        if (r == 0) printf("  (needs at least 2 ranks: run with mpirun -np 2 or more)\n");
        return;
    }
    enum { n = 2 };
    float before[n], after[n];
    fill(before, n, EMPTY);
    if (r == 0) { before[0] = 1; before[1] = 2; }
    memcpy(after, before, sizeof after);
    Mark m = mark_now();
    if (r == 0) dist_send(after, n, DIST_F32, 1, 7, g);
    if (r == 1) dist_recv(after, n, DIST_F32, 0, 7, g);
    Col cols[] = {{"before", before, n}, {"after", after, n}};
    show_table(g, cols, 2, &m);
    if (r == 0) printf("  bytes: exactly the message, S = %d B, sent by rank 0 and received by rank 1\n",
                       (int)(n * sizeof(float)));
}

// ---------------------------------------------------------------------------------------------

static const char *USAGE =
    "Shows the communication primitives of the notes on their own examples: broadcast, reduce,\n"
    "all-reduce, reduce-scatter, all-gather, All-Reduce = Reduce-Scatter + All-Gather, scatter,\n"
    "gather and send/recv. For each, rank 0 prints every rank's buffer before and after the\n"
    "library collective (dist_*, over MPI) and after the version built from send/recv in\n"
    "01_primitives/collectives.c (the exercises), with the bytes that version moved per rank.\n"
    "\n"
    "  make 01_primitives && mpirun -np 4 ./01_primitives/run [--only all-reduce]\n"
    "  (as root add --allow-run-as-root; more ranks than cores: --oversubscribe)\n"
    "\n"
    "Only --only below: nothing is trained here, so the shared model and training flags are\n"
    "refused.";

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    LabArgs args = lab_args_defaults();
    const char *only = "all";
    FlagSpec extra[] = {
        {"--only", FLAG_CHOICE, &only, 0, 0,
         "all|broadcast|reduce|all-reduce|reduce-scatter|all-gather|identity|scatter|gather|send-recv",
         "show just one primitive"},
    };
    lab_parse_args_for(LAB_FLAGS_NONE, argc, argv, &args, extra, 1, "01_primitives: the communication primitives", USAGE);

    DistGroup *g = dist_world();
    if (g->size > MAXN)
        lab_fail_collective("01_primitives draws at most %d ranks (got %d); run with -np 1..%d", MAXN, g->size, MAXN);
    if (g->rank == 0) printf("01_primitives: %d ranks (each rank is one GPU of the notes' pictures)\n", g->size);

    struct { const char *name; void (*fn)(DistGroup *); } demos[] = {
        {"broadcast", demo_broadcast},   {"reduce", demo_reduce},       {"all-reduce", demo_all_reduce},
        {"reduce-scatter", demo_reduce_scatter}, {"all-gather", demo_all_gather}, {"identity", demo_identity},
        {"scatter", demo_scatter},       {"gather", demo_gather},       {"send-recv", demo_send_recv},
    };
    for (size_t i = 0; i < sizeof demos / sizeof demos[0]; i++)
        if (strcmp(only, "all") == 0 || strcmp(only, demos[i].name) == 0) demos[i].fn(g);

    if (g->rank == 0) printf("\nnext: chapter 04 builds the all-reduce as a ring (mpirun -np 4 ./04_ring_allreduce/run --show)\n");
    dist_finalize();
    return 0;
}
