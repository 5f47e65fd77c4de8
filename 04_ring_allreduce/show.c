// show.c: the notes' picture of the ring, drawn from the real buffers (--show).
//
// Rank r starts with the value 2^r in every element, so any sum says exactly which ranks went
// into it (bit r set = rank r's values are in). After each step rank 0 gathers the first element
// of every chunk from every rank and draws the grid: chunk c of rank r is written a0+a1+...,
// letter = chunk, digit = contributing rank. Nothing here knows the algorithm: what moved is
// read off the buffers (a chunk that changed since the last picture arrived from the left).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ring.h"

#define MAX_PICTURE_RANKS 8  // letters a..h; sums of 2^r stay exact in fp32
#define CELL 32

struct RingPicture {
    int N;
    float *prev;  // (N, N) rank 0 only: [rank][chunk] first value of the chunk at the last picture
    float *now;   // (N, N)
};

void ring_picture_fill(float *buf, size_t count, DistGroup *g) {
    for (size_t i = 0; i < count; i++) buf[i] = (float)(1u << g->rank);
}

// "a0+a1+a2" for chunk c holding the sum of the ranks in mask, in the order the ring adds them:
// from rank c onwards (chunk c starts its trip at rank c). A complete sum is put in brackets,
// in rank order. More than 4 terms are shortened to first+..+last.
static void cell_text(char *out, size_t n, int c, unsigned mask, int N) {
    int terms[MAX_PICTURE_RANKS], k = 0;
    unsigned all = (1u << N) - 1;
    int first = mask == all ? 0 : c;
    for (int i = 0; i < N; i++) {
        int rr = (first + i) % N;
        if (mask & (1u << rr)) terms[k++] = rr;
    }
    char letter = (char)('a' + c);
    size_t w = 0;
    if (mask == all) w += (size_t)snprintf(out + w, n - w, "[");
    for (int i = 0; i < k; i++) {
        if (k > 4 && i > 0 && i < k - 1) {
            if (i == 1) w += (size_t)snprintf(out + w, n - w, "+..");
            continue;
        }
        w += (size_t)snprintf(out + w, n - w, "%s%c%d", i ? "+" : "", letter, terms[i]);
    }
    if (mask == all) snprintf(out + w, n - w, "]");
}

// Gather the first value of every chunk of every rank into pic->now on rank 0.
static void gather_grid(RingPicture *pic, const float *buf, size_t count, DistGroup *g) {
    int N = g->size;
    float mine[MAX_PICTURE_RANKS];
    for (int c = 0; c < N; c++) mine[c] = buf[ring_chunk_start(count, N, c)];
    dist_gather(mine, pic->now, (size_t)N, DIST_F32, 0, g);
}

static void draw(const RingPicture *pic, int mark_changes) {
    int N = pic->N;
    char cells[MAX_PICTURE_RANKS][MAX_PICTURE_RANKS][CELL];
    int width = 7;  // "chunk a"
    for (int r = 0; r < N; r++)
        for (int c = 0; c < N; c++) {
            unsigned mask = (unsigned)pic->now[r * N + c];
            cell_text(cells[r][c], CELL, c, mask, N);
            if (mark_changes && pic->now[r * N + c] != pic->prev[r * N + c])
                strncat(cells[r][c], " *", CELL - strlen(cells[r][c]) - 1);
            int w = (int)strlen(cells[r][c]);
            if (w > width) width = w;
        }
    printf("  %-7s", "");
    for (int c = 0; c < N; c++) printf("  chunk %c%*s", 'a' + c, c < N - 1 ? width - 7 : 0, "");
    printf("\n");
    for (int r = 0; r < N; r++) {
        printf("  GPU %-3d", r);
        for (int c = 0; c < N; c++) printf("  %-*s", c < N - 1 ? width : 0, cells[r][c]);
        printf("\n");
    }
}

RingPicture *ring_picture_begin(const float *buf, size_t count, DistGroup *g) {
    int N = g->size;
    LAB_CHECK(N <= MAX_PICTURE_RANKS, "the ring picture draws at most %d ranks, got %d", MAX_PICTURE_RANKS, N);
    LAB_CHECK(count >= (size_t)N, "the ring picture needs every chunk non-empty: count %zu < N = %d", count, N);
    RingPicture *pic = lab_xcalloc(1, sizeof *pic);
    pic->N = N;
    pic->prev = lab_xcalloc((size_t)N * (size_t)N, sizeof(float));
    pic->now = lab_xcalloc((size_t)N * (size_t)N, sizeof(float));
    gather_grid(pic, buf, count, g);
    if (g->rank == 0) {
        printf("initial state: each GPU holds %d chunks of its gradient (chunk a = its first 1/%d, ...)\n", N, N);
        draw(pic, 0);
        memcpy(pic->prev, pic->now, (size_t)N * (size_t)N * sizeof(float));
    }
    return pic;
}

void ring_picture_step(RingPicture *pic, const char *phase, int step, const float *buf, size_t count, DistGroup *g) {
    int N = g->size;
    gather_grid(pic, buf, count, g);
    if (g->rank != 0) return;
    int adds = strcmp(phase, "scatter-reduce") == 0;
    printf("\n%s step %d/%d: every GPU sends one chunk to its right neighbour, which %s\n", phase, step + 1, N - 1,
           adds ? "adds it to its own copy" : "stores it (a finished sum)");
    // what moved, read off the buffers: a changed chunk on rank r came from rank r-1
    printf("  moves:");
    for (int r = 0; r < N; r++)
        for (int c = 0; c < N; c++)
            if (pic->now[r * N + c] != pic->prev[r * N + c])
                printf("  GPU %d -> GPU %d: %c", (r - 1 + N) % N, r, 'a' + c);
    printf("\n");
    draw(pic, 1);
    memcpy(pic->prev, pic->now, (size_t)N * (size_t)N * sizeof(float));
}

void ring_picture_end(RingPicture *pic) {
    if (!pic) return;
    free(pic->prev);
    free(pic->now);
    free(pic);
}
