#!/usr/bin/env bash
# grade.sh: build what the exercises' tests need, run them, print the grade table (make grade).
#
#   tools/grade.sh [--tsv FILE] [--timeout S] [--no-build] BUILD [CHAPTER|ID]...
#
# Exercises come from the // EXERCISE markers in common/ and the chapters (id and title);
# exercise 04.1 is graded by the Criterion suite ex04_1 in tests/test_*.c, run with
# --filter 'ex04_1/*'. Each exercise is worth 10 points, shared equally by its tests. With
# CHAPTER (04_ring_allreduce or 04) or ids (04.1), only those exercises are graded; with none,
# the CHAPTER and EX environment variables (make grade CHAPTER=04, make grade EX=04.1) pick them.
# First, make builds (in BUILD, from the current sources, only what changed) the test binaries
# that hold those suites and the chapters and MPI test programs their sources name: a grade
# never comes from a stale binary. A build that fails grades nothing.
#   --tsv FILE    also write one line per exercise: id TAB passed TAB total TAB status TAB failing
#   --timeout S   seconds one exercise's tests may run (default 300; env GRADE_TIMEOUT)
#   --no-build    grade the binaries in BUILD as they are (for a caller that has just built them)
#   GRADE_JOBS=N  tests run at once by one test binary (default 1)
#   MAKE          the make to run (make grade passes its own, with its variables and -j)
# Exit status 0 when every graded exercise passes all its tests and there is no defect (an
# exercise with no tests, tests with no exercise, a malformed marker), 1 otherwise.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=tools/exercises.sh
. "$here/exercises.sh"

usage() { sed -n '3,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
tsv=; timeout_s=${GRADE_TIMEOUT:-300}; do_build=1
while [ $# -gt 0 ]; do
    case $1 in
        --tsv) [ $# -ge 2 ] || usage; tsv=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; timeout_s=$2; shift 2 ;;
        --no-build) do_build=0; shift ;;
        -h|--help) usage ;;
        -*) echo "grade: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || usage
build=$1; shift
build_arg=$build
cd "$root" || exit 2
case $build in /*) ;; *) build="$root/$build" ;; esac
filters=("$@")
# shellcheck disable=SC2206
[ ${#filters[@]} -eq 0 ] && [ -n "${EX:-}" ] && filters=(${EX//,/ })
[ ${#filters[@]} -eq 0 ] && [ -n "${CHAPTER:-}" ] && filters=("$CHAPTER")

exercises=$(ex_list "$root") || { echo "grade: fix the exercise markers above" >&2; exit 1; }

# Keep the exercises the filters name (a chapter directory, a chapter number, or an id).
wanted() {
    local id=$1 f
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do
        f=${f%/}
        [ "$f" = "$id" ] || [ "${f%%_*}" = "${id%%.*}" ] && return 0
    done
    return 1
}

# The test sources that hold the graded exercises' suites (every ex* suite when grading all).
want_suites=()
while IFS=$'\t' read -r id _; do
    [ -n "$id" ] && [ ${#filters[@]} -gt 0 ] && wanted "$id" && want_suites+=("$(ex_suite "$id")")
done <<<"$exercises"
if [ ${#filters[@]} -gt 0 ] && [ ${#want_suites[@]} -eq 0 ]; then
    sources=
else
    sources=$(ex_test_sources "$root" "${want_suites[@]}")
fi

# Build them and what they launch, from the current sources (make's own dependencies: only
# what changed is rebuilt). Under `make grade`, MAKEFLAGS carries its variables and -j.
if [ $do_build = 1 ] && [ -n "$sources" ]; then
    case $build_arg in "$root"/*) build_arg=${build_arg#"$root"/} ;; esac
    # shellcheck disable=SC2046
    targets=$(ex_test_targets "$root" "$build_arg" $sources)
    jobs=()
    case " ${MAKEFLAGS:-} " in *" -j"*|*--jobserver*) ;; *) jobs=(-j"$(nproc 2>/dev/null || echo 2)") ;; esac
    # shellcheck disable=SC2086
    ${MAKE:-make} -C "$root" --no-print-directory "${jobs[@]}" BUILD="$build_arg" $targets 2>&1 |
        grep -vE "^make(\[[0-9]+\])?: ('.*' is up to date|Nothing to be done for)"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        echo "grade: the build failed (the compiler's messages are above); nothing was graded" >&2
        echo "grade: 0 passed, 1 failed"
        exit 1
    fi
fi

# What those test binaries hold: "suite count binary" for every ex* suite. Only the binaries of
# these sources: another file in BUILD/tests may be stale.
suites=
for src in $sources; do
    bin=$build/tests/$(basename "${src%.c}")
    if [ ! -x "$bin" ]; then
        echo "grade: $bin is missing (make grade builds it); nothing was graded" >&2
        echo "grade: 0 passed, 1 failed"
        exit 1
    fi
    if ! listing=$("$bin" --list 2>&1); then
        echo "grade: $bin --list failed:" >&2; printf '%s\n' "$listing" | tail -n 5 >&2
        continue
    fi
    suites+=$(printf '%s\n' "$listing" |
        awk -v bin="$bin" '$1 ~ /^ex[0-9][0-9]_[0-9]+:$/ && $3 ~ /^tests?$/ {
            sub(/:$/, "", $1); print $1, $2, bin }')$'\n'
done

logdir="$build/grade"
mkdir -p "$logdir"
[ -n "$tsv" ] && : >"$tsv"
# The tests run from the repository root and find the programs they launch in $LAB_BUILD.
export LAB_BUILD="$build" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

# Run one exercise's tests; sets passed, total, status ("pass", "todo", "fail", "timeout",
# "no tests") and failing (the failing tests' names).
grade_one() {
    local id=$1 suite bins bin count log rc n_ok n_bad
    suite=$(ex_suite "$id"); log="$logdir/$suite.log"
    passed=0; total=0; status=pass; failing=
    bins=$(printf '%s\n' "$suites" | awk -v s="$suite" '$1 == s { print $2, $3 }')
    : >"$log"
    if [ -z "$bins" ]; then status="no tests"; return; fi
    while read -r count bin; do
        total=$((total + count))
        echo "\$ $bin --filter '$suite/*'" >>"$log"
        : >"$log.tap"
        # One test at a time, as tools/run_tests.sh does: multi-rank tests launch mpirun themselves.
        timeout -k 10 "$timeout_s" "$bin" -j"${GRADE_JOBS:-1}" --filter "$suite/*" --tap="$log.tap" </dev/null >>"$log" 2>&1
        rc=$?
        # TAP lines: "ok - suite::test (0.01s)", "not ok - suite::test ..."; filtered-out tests
        # are reported as "ok ... # SKIP" and are not ours.
        n_ok=$(grep "^ok - $suite::" "$log.tap" | grep -vc '# SKIP')
        n_bad=$(grep -c "^not ok - $suite::" "$log.tap")
        passed=$((passed + n_ok))
        failing+=$(grep "^not ok - $suite::" "$log.tap" |
                   sed "s/^not ok - $suite::\([^ ]*\).*/ ${bin##*/}::\1/" | tr -d '\n')
        cat "$log.tap" >>"$log" 2>/dev/null; rm -f "$log.tap"
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            status=timeout; failing+=" ${bin##*/} (killed after ${timeout_s} s)"
        elif [ $((n_ok + n_bad)) -lt "$count" ]; then
            failing+=" ${bin##*/} (only $((n_ok + n_bad)) of $count tests reported)"
        fi
    done <<<"$bins"
    if [ "$status" = pass ] && [ "$passed" -lt "$total" ]; then
        # The stub's message (common/check.c) says the exercise was reached but not written.
        if grep -q "exercise $id (.*) is not implemented yet" "$log"; then status=todo; else status=fail; fi
    fi
}

rows=(); n_pass=0; n_fail=0; pts=0; pts_max=0; tests_ok=0; tests_all=0; orphans=0; notes=()
title_w=5
while IFS=$'\t' read -r id title link file first _; do
    [ -n "$id" ] && wanted "$id" || continue
    [ ${#title} -gt $title_w ] && title_w=${#title}
done <<<"$exercises"

while IFS=$'\t' read -r id title link file first _; do
    [ -n "$id" ] && wanted "$id" || continue
    grade_one "$id"
    p=0
    [ "$total" -gt 0 ] && p=$((10 * passed / total))
    pts=$((pts + p)); pts_max=$((pts_max + 10))
    tests_ok=$((tests_ok + passed)); tests_all=$((tests_all + total))
    if [ "$status" = pass ]; then n_pass=$((n_pass + 1)); else n_fail=$((n_fail + 1)); fi
    rows+=("$(printf '%-8s  %-*s  %7s  %7s  %s' "$id" "$title_w" "$title" "$passed/$total" "$p/10" "$status")")
    [ -n "$tsv" ] && printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$passed" "$total" "$status" "${failing# }" >>"$tsv"
    case $status in
        pass) ;;
        "no tests")
            notes+=("$(printf '%s %s: DEFECT, no tests\n    marked in  %s:%s\n    but no     Test(%s, ...) in tests/test_*.c' \
                       "$id" "$title" "$file" "$first" "$(ex_suite "$id")")") ;;
        *)
            notes+=("$(printf '%s %s: %s\n    read     %s\n    failing %s\n    log      %s' "$id" "$title" \
                       "$status" "$link" "$failing" "${logdir#"$root"/}/$(ex_suite "$id").log")") ;;
    esac
done <<<"$exercises"

# Tests for an exercise that has no marker grade nothing: a renamed or deleted exercise.
if [ ${#filters[@]} -eq 0 ]; then
    for suite in $(printf '%s\n' "$suites" | awk 'NF { print $1 }' | sort -u); do
        id=$(printf '%s\n' "$suite" | sed 's/^ex//; s/_/./')
        if ! printf '%s\n' "$exercises" | cut -f1 | grep -qxF -- "$id"; then
            orphans=$((orphans + 1))
            notes+=("$(printf '%s: DEFECT, tests without an exercise\n    suite %s has tests but no source has a // EXERCISE %s marker' \
                       "$id" "$suite" "$id")")
            [ -n "$tsv" ] && printf '%s\t0\t0\torphan\t\n' "$id" >>"$tsv"
        fi
    done
fi

if [ ${#rows[@]} -eq 0 ] && [ $orphans -eq 0 ]; then
    if [ ${#filters[@]} -gt 0 ]; then
        echo "grade: no exercise matches ${filters[*]}"
    else
        echo "grade: no exercises yet (no // EXERCISE markers in common/ or the chapters)"
    fi
    echo "grade: 0 passed, 0 failed"
    exit 0
fi

printf '%-8s  %-*s  %7s  %7s  %s\n' exercise "$title_w" title tests points status
for r in "${rows[@]}"; do printf '%s\n' "$r"; done
printf '%-8s  %-*s  %7s  %7s\n' total "$title_w" "" "$tests_ok/$tests_all" "$pts/$pts_max"
if [ ${#notes[@]} -gt 0 ]; then
    echo
    for n in "${notes[@]}"; do printf '%s\n' "$n"; done
fi
echo
echo "grade: $n_pass passed, $((n_fail + orphans)) failed"
[ $n_fail -eq 0 ] && [ $orphans -eq 0 ]
