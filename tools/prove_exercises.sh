#!/usr/bin/env bash
# prove_exercises.sh: prove that the grading is honest (run by CI).
#
#   tools/prove_exercises.sh [--literal] [--dir DIR] [--timeout S] [ID]...
#
# Grading is honest when, for every exercise X:
#   (a) the reference passes all of X's tests;
#   (b) with only X stubbed, every test of X fails (a test that passes on the stub hands out
#       free points), and every other exercise's tests pass (no test needs another exercise's
#       solution).
# Default: (b) is proven with two tree kinds whose test runs cost one pass over the ex* suites
# each, instead of one pass per exercise:
#   the student version (every exercise stubbed)       every test of every exercise fails;
#   every exercise stubbed except X, for each X        all of X's tests pass.
# A test of X that passes with every other exercise stubbed reaches no other exercise's code, so
# it behaves as in the reference in every tree where only another exercise is stubbed; and as it
# fails in the student version, what made it fail is reaching X's stub. (The tests are
# deterministic.) Together: (b) for every X.
# --literal: (b) exactly as stated, one tree per exercise with only X stubbed (make_student.sh
# --only X), every ex* suite run in each: the same verdicts, at one pass over the suites per
# exercise.
#
# Every tree is mirrored, one after the other, into one work tree DIR/tree (default
# build/prove/tree) with one build directory: only the files that differ are copied, so make
# recompiles only what they touch. Only the test binaries that hold the ex* suites needed, the MPI
# test programs and the chapters are built; only ex* suites run (tools/grade.sh).
#   --dir DIR     where the work tree lives (default build/prove; kept between runs)
#   --timeout S   seconds one exercise's tests may run (default 300)
#   PROVE_JOBS=N  make -j N (default: the number of cores)
# Exit status 0 when everything holds, 1 when a defect was found (each one is named).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=tools/exercises.sh
. "$here/exercises.sh"

usage() { sed -n '3,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$root/build/prove; timeout_s=300; literal=0
while [ $# -gt 0 ]; do
    case $1 in
        --literal) literal=1; shift ;;
        --dir) [ $# -ge 2 ] || usage; dir=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; timeout_s=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "prove: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
case $dir in /*) ;; *) dir="$PWD/$dir" ;; esac
jobs=${PROVE_JOBS:-$(nproc 2>/dev/null || echo 2)}

exercises=$(ex_list "$root") || { echo "prove: fix the exercise markers above"; exit 1; }
all_ids=$(printf '%s\n' "$exercises" | cut -f1 | grep -v '^$')
if [ -z "$all_ids" ]; then
    echo "prove: no exercises yet (no // EXERCISE markers in common/ or the chapters)"
    echo "prove: 0 passed, 0 failed"
    exit 0
fi
ids=$all_ids
if [ $# -gt 0 ]; then
    ids=
    for id in "$@"; do
        printf '%s\n' "$all_ids" | grep -qxF -- "$id" || { echo "prove: no exercise $id"; exit 2; }
        ids+="$id"$'\n'
    done
fi

defects=()
field() { printf '%s\n' "$exercises" | awk -F'\t' -v id="$1" -v k="$2" '$1 == id { print $k }'; }

# Every marker's link must lead to an existing README heading.
for id in $ids; do
    why=$(ex_check_link "$root" "$(field "$id" 3)")
    [ -n "$why" ] && defects+=("$id: its marker ($(field "$id" 4):$(field "$id" 5)) links to $(field "$id" 3), but $why")
done

work=$dir/tree; gen=$dir/gen; log=$dir/log
mkdir -p "$work"
# Two proofs in one work tree would mix their trees: the second waits for none, it stops.
exec 9>"$dir/lock"
if command -v flock >/dev/null && ! flock -n 9; then
    echo "prove: another proof is running in $dir (pass --dir to use another directory)"; exit 2
fi
: >"$log"

# mirror: make the work tree's sources equal to gen's. Only files that differ are copied, so
# their new times make make rebuild just what depends on them; the build directory stays.
mirror() {
    local f
    (cd "$gen" && find . \( -type f -o -type l \) -print) | while IFS= read -r f; do
        if ! cmp -s "$gen/$f" "$work/$f"; then
            mkdir -p "$work/$(dirname "$f")" && rm -f "$work/$f" && cp -P "$gen/$f" "$work/$f"
        fi
    done
    (cd "$work" && find . -path ./build -prune -o \( -type f -o -type l \) -print) | while IFS= read -r f; do
        [ -e "$gen/$f" ] || [ -L "$gen/$f" ] || rm -f "$work/$f"
    done
}

# tree ARGS...: the tree `make_student.sh ARGS...` writes, mirrored into the work tree.
tree() {
    echo "== $(date +%T) tree: $*" >>"$log"
    bash "$here/make_student.sh" --force "$@" "$gen" >>"$log" 2>&1 && mirror
}

# test_bins [ID]: the test binaries (make targets) that hold the ex* suites, or ID's suite.
test_bins() {
    local pat='ex[0-9][0-9]_[0-9]+' f
    [ $# -gt 0 ] && pat=$(ex_suite "$1")
    for f in "$work"/tests/test_*.c; do
        [ -f "$f" ] && grep -qE "(^|[^A-Za-z0-9_])$pat([^A-Za-z0-9_]|$)" "$f" &&
            echo "build/tests/$(basename "${f%.c}")"
    done
}

# build TARGETS...: those, the MPI test programs and the chapters (the tests may launch them).
build() {
    local targets=("$@") f
    for f in "$work"/tests/mpi_*.c; do [ -f "$f" ] && targets+=("build/tests/$(basename "${f%.c}")"); done
    for f in $(ex_chapters "$work"); do targets+=("$f/run"); done
    echo "\$ make -j$jobs BUILD=build STUDENT=1 ${targets[*]}" >>"$log"
    make -C "$work" -j"$jobs" --no-print-directory BUILD=build STUDENT=1 "${targets[@]}" >"$dir/build.log" 2>&1
    local rc=$?
    cat "$dir/build.log" >>"$log"
    return $rc
}
build_errors() {
    { grep -E ': (fatal )?error:|\*\*\*' "$dir/build.log" || tail -n 5 "$dir/build.log"; } |
        head -n 8 | sed 's/^/      /'
}

# grade [ID]...: run those exercises' tests (all with none) in the work tree; results in $tsv.
tsv=$dir/grade.tsv
grade() {
    (cd "$work" && CHAPTER='' bash tools/grade.sh --tsv "$tsv" --timeout "$timeout_s" build "$@") >>"$log" 2>&1
    return 0
}
result() { awk -F'\t' -v id="$1" -v k="$2" '$1 == id { print $k }' "$tsv"; }
# The stubs a test log shows were reached, other than $2's: "04.1 04.2".
stubs_hit() {
    grep -o 'exercise [0-9][0-9]\.[0-9]* (' "$work/build/grade/$(ex_suite "$1").log" 2>/dev/null |
        awk -v me="$1" '$2 != me { print $2 }' | sort -u | tr '\n' ' ' | sed 's/ $//'
}

title_w=5
for id in $ids; do t=$(field "$id" 2); [ ${#t} -gt $title_w ] && title_w=${#t}; done
row() { printf '%-8s  %-*s  %-9s  %-10s  %-14s  %s\n' "$1" "$title_w" "$2" "$3" "$4" "$5" "$6"; }
start=$SECONDS

# --- the reference ------------------------------------------------------------------------------
echo "prove: work tree ${work#"$root"/}, log ${log#"$root"/}"
if ! tree none; then echo "prove: could not copy the repository:"; tail -n 5 "$log"; exit 1; fi
# shellcheck disable=SC2046
if ! build $(test_bins); then
    echo "prove: the reference does not build:"; build_errors
    echo "prove: 0 passed, 1 failed"; exit 1
fi
grade
declare -A ref_ok ref_n
for id in $all_ids; do
    ref_ok[$id]=$(result "$id" 2); ref_n[$id]=$(result "$id" 3)
    printf '%s\n' "$ids" | grep -qxF -- "$id" || continue
    case $(result "$id" 4) in
        pass) ;;
        "no tests") defects+=("$id: no tests (no Test($(ex_suite "$id"), ...) in tests/test_*.c)") ;;
        *) defects+=("$id: the reference fails its tests ($(result "$id" 5))") ;;
    esac
done
for id in $(awk -F'\t' '$4 == "orphan" { print $1 }' "$tsv"); do
    defects+=("$id: suite $(ex_suite "$id") has tests but no source has a // EXERCISE $id marker")
done
echo "prove: reference built and graded in $((SECONDS - start)) s"

# --- the student version: every exercise stubbed -----------------------------------------------
t0=$SECONDS
# shellcheck disable=SC2046
if ! { tree all && build $(test_bins); }; then
    echo "prove: the student version (every exercise stubbed) DOES NOT BUILD; the stubs that break it:"
    for id in $ids; do
        # shellcheck disable=SC2046
        if ! { tree --only "$id" none && build $(test_bins "$id"); }; then
            defects+=("$id: the tree with only $id stubbed does not build (declare before the region what is used after it):"$'\n'"$(build_errors)")
        fi
    done
    [ ${#defects[@]} -gt 0 ] || defects+=("the student version does not build, though each stub alone does")
    literal=-1
else
    grade
    declare -A stu_ok
    for id in $all_ids; do stu_ok[$id]=$(result "$id" 2); done
    echo "prove: student version built and graded in $((SECONDS - t0)) s"
fi

# --- default: for each exercise, every other one stubbed ---------------------------------------
if [ $literal -eq 0 ]; then
    echo
    row exercise title reference "stub fails" "others stubbed" time
    for id in $ids; do
        t0=$SECONDS
        n=${ref_n[$id]:-0}
        if [ "$n" -eq 0 ]; then row "$id" "$(field "$id" 2)" "0/0" "-" "-" "-"; continue; fi
        stub_fails="$((n - ${stu_ok[$id]:-0}))/$n"
        if [ "${stu_ok[$id]:-0}" -gt 0 ]; then
            defects+=("$id: ${stu_ok[$id]} of its $n tests pass on the stub, in the student version (they do not reach the exercise)")
        fi
        # shellcheck disable=SC2046
        if ! { tree --except "$id" all && build $(test_bins "$id"); }; then
            row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/$n" "$stub_fails" "NO BUILD" "$((SECONDS - t0)) s"
            defects+=("$id: the tree with every other exercise stubbed does not build:"$'\n'"$(build_errors)")
            continue
        fi
        grade "$id"
        ok=$(result "$id" 2)
        if [ "${ok:-0}" -lt "$n" ]; then
            hit=$(stubs_hit "$id")
            defects+=("$id: its tests need another exercise's solution; with every other exercise stubbed these fail: $(result "$id" 5)${hit:+ (they reached the stub of $hit)}")
        fi
        row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/$n" "$stub_fails" "${ok:-0}/$n" "$((SECONDS - t0)) s"
    done
fi

# --- --literal: for each exercise, only it stubbed -----------------------------------------------
if [ $literal -eq 1 ]; then
    echo
    row exercise title reference "stub fails" "others pass" time
    for id in $ids; do
        t0=$SECONDS
        # shellcheck disable=SC2046
        if ! { tree --only "$id" none && build $(test_bins); }; then
            row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/${ref_n[$id]}" "NO BUILD" "-" "$((SECONDS - t0)) s"
            defects+=("$id: the tree with only $id stubbed does not build:"$'\n'"$(build_errors)")
            continue
        fi
        grade
        own_ok=$(result "$id" 2); own_n=$(result "$id" 3)
        if [ "${own_n:-0}" -gt 0 ] && [ "$own_ok" -gt 0 ]; then
            defects+=("$id: $own_ok of its $own_n tests pass on the stub (they do not reach the exercise)")
        fi
        others_ok=0; others_n=0; broken=
        for other in $all_ids; do
            [ "$other" = "$id" ] && continue
            o_ok=$(result "$other" 2); o_n=$(result "$other" 3)
            others_ok=$((others_ok + ${o_ok:-0})); others_n=$((others_n + ${o_n:-0}))
            # A test that already fails on the reference is reported there, not here.
            if [ "${o_ok:-0}" -lt "${ref_ok[$other]:-0}" ]; then broken+=" $other"; fi
        done
        if [ -n "$broken" ]; then
            defects+=("$id: stubbing it breaks the tests of$broken (they must not need $id's solution)")
        fi
        row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/$own_n" "$((own_n - own_ok))/$own_n" "$others_ok/$others_n" "$((SECONDS - t0)) s"
    done
fi
echo "prove: done in $((SECONDS - start)) s"

if [ ${#defects[@]} -gt 0 ]; then
    echo
    echo "Defects:"
    for d in "${defects[@]}"; do printf '  %s\n' "$d"; done
fi
# The closing count: exercises proven without a defect, and failed ones (the exercises that have
# a defect, and one more for each defect that names no exercise).
n_ok=0; n_bad=0
for id in $ids; do
    if printf '%s\n' "${defects[@]}" | grep -q "^$id:"; then n_bad=$((n_bad + 1)); else n_ok=$((n_ok + 1)); fi
done
for d in "${defects[@]}"; do [[ $d =~ ^[0-9][0-9]\.[0-9]+: ]] || n_bad=$((n_bad + 1)); done
echo
echo "prove: $n_ok passed, $n_bad failed"
[ ${#defects[@]} -eq 0 ]
