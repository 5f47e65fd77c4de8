// trace.c: per-rank spans in memory, merged on rank 0 into one Chrome trace JSON (see trace.h).
//
// Format (the "Trace Event Format" that Perfetto and chrome://tracing read):
//   {"traceEvents":[ {"name":..,"ph":"X","pid":rank,"tid":track,"ts":us,"dur":us}, ... ]}
// plus "M" (metadata) events that name each process row "rank r" and each track.
// Times are microseconds from a t0 that every rank takes right after a barrier, so the rows
// line up (on one node all ranks read the same monotonic clock anyway).
#include "trace.h"
#include <errno.h>

#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define TRACE_NAME_MAX 48

typedef struct Span {
    char name[TRACE_NAME_MAX];
    int track;
    double t0, t1;   // seconds since trace t0; t1 < 0 while open
} Span;

static int enabled = 0;
static char *out_path = NULL;
static double trace_t0 = 0.0;
static Span *spans = NULL;
static size_t nspans = 0, cap_spans = 0;

static int mpi_up(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    return inited && !finalized;
}

void trace_init(const char *path) {
    int on = path != NULL && path[0] != '\0';
    if (mpi_up()) {
        // rank 0 decides, so every rank agrees on whether trace_finish is a collective
        MPI_Bcast(&on, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    trace_t0 = lab_now();
    enabled = on;
    nspans = 0;
    free(out_path);
    out_path = NULL;
    if (on && path) {
        size_t n = strlen(path) + 1;
        out_path = lab_xmalloc(n);
        memcpy(out_path, path, n);
    }
}

int trace_enabled(void) { return enabled; }

static int add_span(const char *name, TraceTrack track, double t0, double t1) {
    if (nspans == cap_spans) {
        cap_spans = cap_spans ? 2 * cap_spans : 1024;
        Span *grown = realloc(spans, cap_spans * sizeof(Span));
        if (!grown) lab_fail("out of host memory: growing the trace to %zu spans", cap_spans);
        spans = grown;
    }
    Span *s = &spans[nspans];
    snprintf(s->name, sizeof s->name, "%s", name ? name : "?");
    s->track = (int)track;
    s->t0 = t0;
    s->t1 = t1;
    return (int)nspans++;
}

int trace_begin(const char *name, TraceTrack track) {
    if (!enabled) return -1;
    return add_span(name, track, lab_now() - trace_t0, -1.0);
}

void trace_end(int token) {
    if (!enabled || token < 0 || (size_t)token >= nspans) return;
    spans[token].t1 = lab_now() - trace_t0;
}

void trace_span(const char *name, TraceTrack track, double t0, double t1) {
    if (!enabled) return;
    add_span(name, track, t0 - trace_t0, t1 - trace_t0);
}

// A JSON string body: quotes, backslashes and control characters escaped.
static void write_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void write_json(const char *path, const Span *all, const int *counts, int world) {
    static const char *track_names[3] = {"compute", "communication", "other"};
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    // Past `ulimit -f` a write gets EFBIG (and the message below) instead of a SIGXFSZ kill.
    signal(SIGXFSZ, SIG_IGN);
    FILE *f = fopen(tmp, "w");
    if (!f) lab_fail("--trace %s: cannot create %s: %s", path, tmp, strerror(errno));
    fprintf(f, "{\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < world; r++) {
        fprintf(f, "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                first ? "" : ",\n", r, r);
        first = 0;
        fprintf(f, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", r, r);
        for (int t = 0; t < 3; t++)
            fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                    r, t, track_names[t]);
    }
    size_t k = 0;
    for (int r = 0; r < world; r++) {
        for (int i = 0; i < counts[r]; i++, k++) {
            const Span *s = &all[k];
            double t1 = s->t1 < 0 ? s->t0 : s->t1;  // a span never ended shows as an instant
            fprintf(f, ",\n{\"name\":");
            write_json_string(f, s->name);
            fprintf(f, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", r, s->track, s->t0 * 1e6,
                    (t1 - s->t0) * 1e6);
        }
    }
    fprintf(f, "\n]}\n");
    // tmp + fsync + rename: a reader never sees half a file
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0)
        lab_fail("--trace %s: writing %s failed (disk full?)", path, tmp);
    if (rename(tmp, path) != 0) lab_fail("--trace %s: cannot rename %s to it", path, tmp);
}

void trace_finish(void) {
    if (!enabled) return;
    int rank = 0, world = 1;
    int have_mpi = mpi_up();
    if (have_mpi) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    }
    // Spans travel as bytes: every rank runs the same binary, so the struct layout agrees.
    LAB_CHECK(nspans <= (size_t)(0x7fffffff / sizeof(Span)), "trace: too many spans (%zu)", nspans);
    int mine = (int)nspans;
    int *counts = rank == 0 ? lab_xcalloc((size_t)world, sizeof(int)) : NULL;
    Span *all = NULL;
    if (have_mpi) {
        MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
        int *bytes = NULL, *displs = NULL;
        if (rank == 0) {
            size_t total = 0;
            bytes = lab_xcalloc((size_t)world, sizeof(int));
            displs = lab_xcalloc((size_t)world, sizeof(int));
            for (int r = 0; r < world; r++) {
                LAB_CHECK(total + (size_t)counts[r] <= (size_t)(0x7fffffff / sizeof(Span)),
                          "trace: too many spans in total to gather");
                displs[r] = (int)(total * sizeof(Span));
                bytes[r] = (int)((size_t)counts[r] * sizeof(Span));
                total += (size_t)counts[r];
            }
            all = lab_xmalloc(total * sizeof(Span) + 1);
        }
        MPI_Gatherv(spans, (int)(nspans * sizeof(Span)), MPI_BYTE, all, bytes, displs, MPI_BYTE, 0,
                    MPI_COMM_WORLD);
        free(bytes);
        free(displs);
    } else {
        counts[0] = mine;
        all = lab_xmalloc(nspans * sizeof(Span) + 1);
        if (nspans) memcpy(all, spans, nspans * sizeof(Span));
    }
    if (rank == 0) write_json(out_path, all, counts, world);
    free(all);
    free(counts);
    free(spans);
    spans = NULL;
    nspans = cap_spans = 0;
    enabled = 0;
    free(out_path);
    out_path = NULL;
}
