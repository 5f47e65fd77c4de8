// harness_expect.h: failure messages that teach, for the exercise tests (suites ex<NN>_<n>, see
// docs/EXERCISES.md). Each message says what was checked, the value expected, the value that
// came out, and the README section to read:
//
//   exercise 08.1: the ops of stage 0 in order, 1f1b p 3 m 5
//     expected  F0 F1 F2 B0 F3 B1 F4 B2 B3 B4
//     got       F0 F1 F2 F3 B0 F4 B1 B2 B3 B4
//     read      08_pipeline/README.md#exercise-081-the-1f1b-table
//
// The section is the link of the exercise's marker (`// EXERCISE 08.1 <title> -> <link>`), read
// from the sources (tests run from the repository root) when a check fails, so it is the one
// the stub prints. Outside an ex* suite (a helper shared with other tests) the message has no
// "exercise" prefix and no "read" line.
//
//   expect(cond, want, got, what...)      cond must hold; want and got are shown, each a value
//                                         of any integer, floating or string type (a string
//                                         `want` may say a range: "in (3.98, 4]")
//   expect_eq(got, want, what...)         got == want
//   expect_str_eq(got, want, what...)     strcmp(got, want) == 0
//   expect_near(got, want, tol, what...)  fabs(got - want) < tol          (in double)
//   expect_rel(got, want, rtol, what...)  fabs(got - want) <= rtol * fabs(want)
//
// what: a printf format and its arguments naming the quantity ("the bubble of stage %d", k).
// The conditions are the plain C expressions given: only the message differs from cr_assert's.
// got and want are evaluated again, for the message, only when the check fails.
#pragma once
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "check.h"

// "exercise NN.n: " in an ex* suite, "" elsewhere.
const char *expect_prefix(void);
// "\n  read      <link>" in an ex* suite (the marker's link), "" elsewhere.
const char *expect_read(void);
// The message: "<prefix><what>\n  expected  <want>\n  got       <got><read>" (malloc'd; built
// only when a check fails, so never freed).
char *expect_msg(const char *want, const char *got, const char *fmt, ...) LAB_PRINTF(3, 4);
// The same with a program's output after it ("\n  its output:\n<log>"; NULL: "(no output)").
char *expect_msg_log(const char *want, const char *got, const char *log, const char *fmt, ...)
    LAB_PRINTF(4, 5);

// The message of an MPI test program (tests/mpi_*.c, mpitest.h) that did not pass:
// `mpirun -np <np> <prog> <what>` was to exit 0 with the summary "on <np> ranks: C checks, 0
// failed", C > 0; rc, ranks, checks, failed: what came out (-1: no summary line); out: its
// output, of which the last `tail` characters are shown (0: all). Its FAIL lines say which
// value differed from which.
char *expect_mpi_msg(const char *prog, const char *what, int np, int rc, int ranks, int checks,
                     int failed, const char *out, size_t tail);

// One value as text (malloc'd): integers, and whole floating values below 1e17, in decimal;
// other floating values with the fewest digits that read back as the same value; strings as
// they are.
char *expect_fmt_ll(long long x);
char *expect_fmt_ull(unsigned long long x);
char *expect_fmt_f(float x);
char *expect_fmt_d(double x);
char *expect_fmt_s(const char *x);
#define expect_fmt_(x)                                                                             \
    _Generic((x),                                                                                  \
        char *: expect_fmt_s, const char *: expect_fmt_s,                                          \
        float: expect_fmt_f, double: expect_fmt_d, long double: expect_fmt_d,                      \
        _Bool: expect_fmt_ll, char: expect_fmt_ll, signed char: expect_fmt_ll, short: expect_fmt_ll, \
        int: expect_fmt_ll, long: expect_fmt_ll, long long: expect_fmt_ll,                         \
        unsigned char: expect_fmt_ull, unsigned short: expect_fmt_ull, unsigned: expect_fmt_ull,   \
        unsigned long: expect_fmt_ull, unsigned long long: expect_fmt_ull)(x)

#define expect(cond, want, got, ...) expect_or(cr_assert, cond, want, got, __VA_ARGS__)
// The same with another Criterion assertion: expect_or(cr_expect, ...) lets the test go on.
#define expect_or(check_, cond, want, got, ...)                                                    \
    check_((cond), "%s", expect_msg(expect_fmt_(want), expect_fmt_(got), __VA_ARGS__))
#define expect_eq(got, want, ...) expect((got) == (want), (want), (got), __VA_ARGS__)
#define expect_str_eq(got, want, ...) expect(strcmp((got), (want)) == 0, (want), (got), __VA_ARGS__)
#define expect_near(got, want, tol, ...)                                                           \
    expect(fabs((double)(got) - (double)(want)) < (tol), expect_within_((want), (tol)), (got), __VA_ARGS__)
#define expect_rel(got, want, rtol, ...)                                                           \
    expect(fabs((double)(got) - (double)(want)) <= (rtol) * fabs((double)(want)), expect_within_rel_((want), (rtol)), (got),  \
           __VA_ARGS__)
// "<want> (within <tol>)" and "<want> (within <100 rtol> %)" for expect_near's and expect_rel's
// messages.
char *expect_within_(double want, double tol);
char *expect_within_rel_(double want, double rtol);
