// trace.h: a per-rank timeline of named compute and communication spans, merged into one
// Chrome trace JSON (open it at ui.perfetto.dev or chrome://tracing). Off unless --trace.
//
// Each rank is a process row ("rank 0", "rank 1", ...), with one track for compute and one for
// communication, so overlap is visible as spans stacked in time.
#pragma once

typedef enum { TRACE_COMPUTE = 0, TRACE_COMM = 1, TRACE_OTHER = 2 } TraceTrack;

// Start recording (all ranks call it; path is only used by rank 0). NULL path = off.
void trace_init(const char *path);
int trace_enabled(void);
// A span that starts now; returns a token for trace_end.
int trace_begin(const char *name, TraceTrack track);
void trace_end(int token);
// A span with explicit times (seconds from lab_now()).
void trace_span(const char *name, TraceTrack track, double t0, double t1);
// Gather every rank's spans to rank 0 and write the JSON file (collective on the world).
void trace_finish(void);
