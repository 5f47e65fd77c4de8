// harness_progress.h: what a training chapter prints WITHOUT --quiet, checked against what it
// computed (its --dump). A bug that only shows in the printed lines (a counter reset on the
// wrong group, a line printed by every rank, a cadence off by one) passes every --quiet test.
#pragma once
#include <stddef.h>

#include "results.h"

// The progress lines of a run of steps [start, end) out of `steps` (common/session.c): one line
// on the whole job for each step s with s % log_every == 0 or s == end - 1 (none when
// log_every is 0), in order, reading
// "step s+1/steps  loss L z Z  gnorm G z Z  lr LR  X tok/s  MFU M%  ETA E s", L being r's
// loss of step s as %.4f; G, lr, tok/s positive; M in (0, 100]; the z-scores "-" for the
// first 5 steps run (HEALTH_Z_MIN), numbers after; ETA not negative, and 0.0 at the last of
// `steps`; then "<end - start> steps in". 1 if so; else
// prints why and the output (stderr) and returns 0.
int harness_progress_matches(const char *output, const RunResults *r, int start, int end,
                             int steps, int log_every);

// The text of one cell of a per-rank table (session_print_rank_table) titled `title`: row
// `rank`, column `col` (0 = the first after the rank), spaces trimmed, into buf. 1 if found.
int harness_table_cell(const char *output, const char *title, int rank, int col, char *buf,
                       size_t len);

// The text of the fixed-width cell [at, at + width) of row `row` of the table under `title` (the
// column titles' line skipped), spaces trimmed, into buf (64 bytes): for tables that are not
// session_print_rank_table's (05's wire table, 06's collectives). 1 if found.
int harness_table_cell_at(const char *out, const char *title, int row, size_t at, size_t width,
                          char *buf);
