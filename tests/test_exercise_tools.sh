#!/usr/bin/env bash
# test_exercise_tools.sh: checks tools/make_student.sh, tools/grade.sh and
# tools/prove_exercises.sh on the miniature lab in tests/fixtures/exercises (three exercises,
# one of them in common/), copied with the real Makefile and tools/ into a temporary directory.
# Among them: a solved exercise edited back into a wrong one makes the grade drop, with no
# rebuild asked for (grading builds from the current sources first).
#
#   bash tests/test_exercise_tools.sh        (about a minute and a half on 2 cores)
#
# Ends with the line "test_exercise_tools: N passed, N failed"; exit status 1 when a check fails.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/exercise-tools.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n_pass=0; n_fail=0

# ok DESCRIPTION COMMAND...: one check; its output is then in $tmp/last for the next check.
ok() {
    local what=$1; shift
    if "$@" >"$tmp/cur" 2>&1; then
        n_pass=$((n_pass + 1)); echo "ok    $what"
    else
        n_fail=$((n_fail + 1)); echo "FAIL  $what"; sed 's/^/      | /' "$tmp/cur" | tail -n 25
    fi
    mv "$tmp/cur" "$tmp/last"    # the next check may look at this one's output
}
# Helpers for checks: run CMD, expect exit status zero / non-zero, and grep its output.
fails() { ! "$@"; }
has() { grep -qF -- "$1" "$2"; }
has_not() { ! grep -qF -- "$1" "$2"; }
out_has() { local out=$1; shift; for s in "$@"; do grep -qF -- "$s" "$out" || { echo "missing: $s"; cat "$out"; return 1; }; done; }

# fresh NAME: a new copy of the fixture lab in $tmp/NAME, as a git work tree (files staged, not
# committed) so make_student.sh takes the path a real checkout takes.
fresh() {
    local d=$tmp/$1
    mkdir -p "$d/tools"
    cp -R "$repo/tests/fixtures/exercises/." "$d/"
    cp "$repo/Makefile" "$d/"
    cp "$repo"/tools/*.sh "$d/tools/"
    printf '#!/bin/sh\nexit 0\n' >"$d/tools/deps.sh"   # the fixture needs no packages
    printf 'build/\n*/run\n*.o\n/student/\n' >"$d/.gitignore"
    (cd "$d" && git init -q . && git add -A) || return 1
    echo "$d"
}

lab=$(fresh lab) || { echo "cannot set up the fixture"; exit 1; }
cd "$lab" || exit 1

# --- the markers ------------------------------------------------------------------------------
ok "markers: three exercises found, one in common/" bash -c '
    . tools/exercises.sh && ex_list . >list &&
    [ "$(cut -f1 list | tr "\n" " ")" = "98.1 99.1 99.2 " ] &&
    grep -q "^98.1	Clamp a value	98_other/README.md#exercise-981-clamp-a-value	common/clamp.c	7	10$" list'
ok "markers: README anchors computed as GitHub does" bash -c '
    . tools/exercises.sh && ex_anchors 99_fixture/README.md | grep -qx exercise-991-sum-a-vector &&
    [ -z "$(ex_check_link . 99_fixture/README.md#exercise-992-maximum-of-a-vector)" ] &&
    [ -n "$(ex_check_link . 99_fixture/README.md#no-such-heading)" ]'

# --- grading the reference --------------------------------------------------------------------
ok "reference: make grade passes every exercise" make -s grade
ok "reference: table rows, points and closing line" out_has "$tmp/last" \
    "98.1      Clamp a value            1/1    10/10  pass" "total                              6/6    30/30" \
    "grade: 3 passed, 0 failed"

# --- grading is never stale: it builds from the current sources first ----------------------------
# The issue this guards: a solved exercise broken again still graded as passed, because grade ran
# the binaries of the last build. Every edit below is followed by a grade and nothing else.
cp 99_fixture/calc.c "$tmp/calc.c.good"; cp 99_fixture/main.c "$tmp/main.c.good"
sleep 1                                     # the edits are newer than the build, as any real one
sed -i 's/s += x\[i\];/s -= x[i];/' 99_fixture/calc.c          # 99.1 edited back into a wrong one
ok "stale: 99.1 broken again: bash tools/grade.sh build 99.1 drops, no rebuild asked for" \
    fails bash tools/grade.sh build 99.1
cp "$tmp/last" "$tmp/stale"
ok "stale: ... to 0 of 2, only 99.1 graded" out_has "$tmp/stale" \
    "99.1      Sum a vector      0/2     0/10  fail" "grade: 0 passed, 1 failed"
ok "stale: ... only what changed was rebuilt (calc.c, not clamp.c)" bash -c '
    ! grep -q "clamp.c" "$0" && grep -q "99_fixture/calc.c" "$0"' "$tmp/stale"
cp "$tmp/calc.c.good" 99_fixture/calc.c
ok "stale: fixed again, it passes again (make grade EX=\"99.1 99.2\": two exercises)" make -s grade EX="99.1 99.2"
ok "stale: ... both graded" out_has "$tmp/last" "99.1      Sum a vector             2/2    10/10  pass" \
    "99.2      Maximum of a vector      3/3    10/10  pass" "grade: 2 passed, 0 failed"
sed -i 's/if (x\[i\] > m) m = x\[i\];/if (x[i] < m) m = x[i];/' 99_fixture/calc.c     # 99.2 broken
ok "stale: 99.2 broken: make grade EX=99.2 drops" fails make -s grade EX=99.2
ok "stale: ... to 0 of 3" out_has "$tmp/last" "99.2      Maximum of a vector      0/3     0/10  fail"
cp "$tmp/calc.c.good" 99_fixture/calc.c
sed -i 's/"max %.2f\\n"/"max %.1f\\n"/' 99_fixture/main.c   # only the program a 99.2 test runs
ok "stale: a program the tests launch is rebuilt too (make grade CHAPTER=99)" fails make -s grade CHAPTER=99
ok "stale: ... its test fails, the others pass" out_has "$tmp/last" \
    "99.2      Maximum of a vector      2/3     6/10  fail" "failing  test_fixture::the_program_prints_the_maximum"
cp "$tmp/main.c.good" 99_fixture/main.c
printf 'float calc_sum(const float *x, size_t n) { return x[n] }\n' >>99_fixture/calc.c
ok "stale: code that does not compile grades nothing" fails make -s grade EX=99.1
ok "stale: ... and says so" out_has "$tmp/last" "grade: the build failed" "grade: 0 passed, 1 failed"
cp "$tmp/calc.c.good" 99_fixture/calc.c
ok "stale: back to the reference, everything passes" make -s grade

# --- the student version ----------------------------------------------------------------------
echo "scratch" >untracked_note.txt            # untracked, not ignored: copied
mkdir -p build && echo x >build/junk.o        # ignored build output: not copied
ok "student: make student writes ./student" make -s student
ok "student: no solution code or comment survives" bash -c '
    ! grep -rq -e "s += x\[i\]" -e "if (y < lo)" -e "if (x\[i\] > m)" -e "Plain left-to-right" student'
ok "student: each region is the stub call, markers kept" bash -c '
    grep -qxF "    lab_exercise_todo(\"99.1\", \"Sum a vector\", \"99_fixture/README.md#exercise-991-sum-a-vector\");" student/99_fixture/calc.c &&
    grep -qxF "    lab_exercise_todo(\"98.1\", \"Clamp a value\", \"98_other/README.md#exercise-981-clamp-a-value\");" student/common/clamp.c &&
    [ "$(grep -c "// EXERCISE 99" student/99_fixture/calc.c)" = 2 ] &&
    [ "$(grep -c "// END EXERCISE 99" student/99_fixture/calc.c)" = 2 ]'
ok "student: only the regions differ from the reference" bash -c '
    diff -ru 99_fixture student/99_fixture >d; [ "$(grep -c "^-[^-]" d)" = 5 ] && [ "$(grep -c "^+[^+]" d)" = 2 ]'
ok "student: copy holds tracked + untracked files, no .git, no build output" bash -c '
    [ -f student/untracked_note.txt ] && [ -f student/tests/test_fixture.c ] && [ ! -e student/.git ] &&
    [ ! -e student/build ] && [ ! -e student/student ]'
ok "student: Makefile builds with STUDENT=1 by default" bash -c '
    grep -qx "STUDENT ?= 1" student/Makefile && head -n 1 student/Makefile | grep -q "^# The lab" &&
    diff <(grep -vx "STUDENT ?= 1" student/Makefile | grep -vF "# The student version (tools/make_student.sh)" | grep -v "^$") \
         <(grep -v "^$" Makefile)'
ok "student: make grade fails, every exercise 0 points, stub message seen" fails make -s -C student grade
ok "student: grade table for the stubs" out_has "$tmp/last" \
    "99.1      Sum a vector             0/2     0/10  todo" "total                              0/6     0/30" \
    "read     99_fixture/README.md#exercise-991-sum-a-vector" "grade: 0 passed, 3 failed"
ok "student: builds with clang too" make -s -C student BUILD=build-clang CC=clang tests
ok "student: make student refuses to overwrite a student's work" fails make -s student
ok "student: ... and says why" has "already exists" "$tmp/last"
cp 99_fixture/calc.c student/99_fixture/calc.c     # the student "solves" 99.1 and 99.2
ok "student: solved exercises pass (make grade CHAPTER=99)" make -s -C student grade CHAPTER=99
ok "student: grade.sh by id" bash student/tools/grade.sh build 99.2
ok "student: ... grades only that exercise" out_has "$tmp/last" "99.2      Maximum of a vector      3/3    10/10  pass" "grade: 1 passed, 0 failed"
sed -i 's/if (x\[i\] > m) m = x\[i\];/if (x[i] < m) m = x[i];/' student/99_fixture/calc.c   # solved, then broken again
ok "student: 99.2 broken again: make grade EX=99.2 drops (in the student tree too)" fails make -s -C student grade EX=99.2
ok "student: ... to 0 of 3, the program's test too" out_has "$tmp/last" "99.2      Maximum of a vector      0/3     0/10  fail"
rm -rf student

# --- one chapter --------------------------------------------------------------------------------
ok "chapter: CHAPTER=99_fixture stubs 99.x only" bash -c '
    make -s student CHAPTER=99_fixture &&
    grep -q "lab_exercise_todo(\"99.1\"" student/99_fixture/calc.c && grep -q "if (y < lo)" student/common/clamp.c'
rm -rf student
ok "chapter: CHAPTER=98 stubs 98.1, which lives in common/" bash -c '
    make -s student CHAPTER=98 &&
    grep -q "lab_exercise_todo(\"98.1\"" student/common/clamp.c && grep -q "s += x\[i\]" student/99_fixture/calc.c'
rm -rf student
ok "chapter: an unknown chapter is refused, naming the valid ones" bash -c '
    ! bash tools/make_student.sh 42_nope student 2>err && grep -q "98_other 99_fixture" err && [ ! -e student ]'
ok "only: --only 99.2 stubs exactly that exercise" bash -c '
    bash tools/make_student.sh --only 99.2 none "$0/only" && grep -q "lab_exercise_todo(\"99.2\"" "$0/only/99_fixture/calc.c" &&
    ! grep -q "lab_exercise_todo(\"99.1\"" "$0/only/99_fixture/calc.c" && grep -q "if (y < lo)" "$0/only/common/clamp.c"' "$tmp"
ok "only: an unknown id is refused" fails bash tools/make_student.sh --only 99.9 none "$tmp/only9"

# --- malformed markers --------------------------------------------------------------------------
bad=$(fresh bad)
sed -i '/END EXERCISE 99.2/d' "$bad/99_fixture/calc.c"
ok "markers: a missing END is refused with file:line" bash -c '
    ! bash "$0/tools/make_student.sh" all "$0/student" 2>err && grep -q "99_fixture/calc.c:18: EXERCISE 99.2 has no END" err' "$bad"
ok "markers: ... and grade refuses too" fails bash "$bad/tools/grade.sh" build
bad=$(fresh bad2)
sed -i 's/EXERCISE 99.2 Maximum/EXERCISE 99.1 Maximum/; s/END EXERCISE 99.2/END EXERCISE 99.1/' "$bad/99_fixture/calc.c"
ok "markers: a duplicate id is refused" bash -c '
    ! bash "$0/tools/make_student.sh" all "$0/student" 2>err && grep -q "exercise 99.1 is marked more than once" err' "$bad"
bad=$(fresh bad3)
sed -i 's|// EXERCISE 99.2 Maximum of a vector ->|// EXERCISE 9.2 Maximum of a vector ->|; s|// END EXERCISE 99.1|//END EXERCISE 99.1|' "$bad/99_fixture/calc.c"
ok "markers: a bad id and a misspelt marker are refused" bash -c '
    ! bash "$0/tools/make_student.sh" all "$0/student" 2>err &&
    grep -q "calc.c:18: exercise id \"9.2\"" err && grep -q "calc.c:11: malformed exercise marker" err' "$bad"

# --- defects grade must flag ------------------------------------------------------------------------
odd=$(fresh odd)
cat >>"$odd/99_fixture/calc.c" <<'EOF'

float calc_first(const float *x) {
    float f = 0.0f;
    // EXERCISE 99.3 First element -> 99_fixture/README.md#exercise-991-sum-a-vector
    f = x[0];
    // END EXERCISE 99.3
    return f;
}
EOF
printf '\nTest(ex99_7, orphan) { cr_assert(1); }\n' >>"$odd/tests/test_fixture.c"
ok "grade: an exercise without tests and tests without an exercise fail" fails make -s -C "$odd" grade
ok "grade: ... and both are named" out_has "$tmp/last" "99.3 First element: DEFECT, no tests" \
    "99.7: DEFECT, tests without an exercise" "grade: 3 passed, 2 failed"

# --- the proof --------------------------------------------------------------------------------------
ok "prove: the fixture's grading is honest" bash tools/prove_exercises.sh
ok "prove: table and closing line" out_has "$tmp/last" \
    "99.1      Sum a vector         2/2        2/2         2/2" \
    "prove: 3 passed, 0 failed"
ok "prove --literal: the same verdict" bash tools/prove_exercises.sh --literal
ok "prove --literal: table and closing line" out_has "$tmp/last" \
    "99.1      Sum a vector         2/2        2/2         4/4" "prove: 3 passed, 0 failed"

# Three defects at once: a test that passes on its stub (99.2), a test that needs another
# exercise's solution (ex99_2 calls calc_sum, 99.1), a link to a heading that does not exist (99.1).
dis=$(fresh dishonest)
cat >>"$dis/tests/test_fixture.c" <<'EOF'

Test(ex99_2, free_point) { cr_assert_eq(2 * 2, 4); }

Test(ex99_2, needs_the_sum) {
    float x[2] = {1.0f, 2.0f};
    cr_assert_float_eq(calc_max(x, 2) + calc_sum(x, 2), 5.0f, 1e-6f);
}
EOF
sed -i 's|^## Exercise 99.1: Sum a vector|## Exercise 99.1: Sum up a vector|' "$dis/99_fixture/README.md"
ok "prove: finds the defects (non-zero exit)" fails bash "$dis/tools/prove_exercises.sh"
ok "prove: ... names each one" out_has "$tmp/last" \
    "99.2: 1 of its 5 tests pass on the stub" \
    "99.2: its tests need another exercise's solution; with every other exercise stubbed these fail: test_fixture::needs_the_sum (they reached the stub of 99.1)" \
    "99.1: its marker (99_fixture/calc.c:8) links to 99_fixture/README.md#exercise-991-sum-a-vector, but 99_fixture/README.md has no heading" \
    "prove: 1 passed, 2 failed"
ok "prove --literal: finds them too" fails bash "$dis/tools/prove_exercises.sh" --literal
ok "prove --literal: ... and names them" out_has "$tmp/last" \
    "99.2: 1 of its 5 tests pass on the stub" "99.1: stubbing it breaks the tests of 99.2" \
    "prove: 1 passed, 2 failed"

# A stub that does not compile: 98.1's variable is declared inside its region.
nob=$(fresh nobuild)
sed -i 's|^    float y = x;$||; s|^    if (y < lo) y = lo;$|    float y = x;\n    if (y < lo) y = lo;|' "$nob/common/clamp.c"
ok "prove: a stub that does not compile is a defect" fails bash "$nob/tools/prove_exercises.sh"
ok "prove: ... named" out_has "$tmp/last" "DOES NOT BUILD" \
    "98.1: the tree with only 98.1 stubbed does not build" "prove: 2 passed, 1 failed"

echo
echo "test_exercise_tools: $n_pass passed, $n_fail failed"
[ $n_fail -eq 0 ]
