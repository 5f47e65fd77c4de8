#!/usr/bin/env bash
# prove_exercises.sh: prove that the grading is honest (run by CI).
#
#   tools/prove_exercises.sh [--dir DIR] [--timeout S] [ID]...
#
# For the reference and then for each exercise (all, or the ids given):
#   1. the reference passes every exercise's tests;
#   2. a tree where ONLY that exercise is stubbed (make_student.sh --only ID) builds, fails every
#      test of that exercise (a test that passes on the stub hands out free points), and passes
#      every other exercise's tests (an exercise must not need another one's solution);
# and finally the student version with every exercise stubbed builds.
# All trees are mirrored, one after the other, into one work tree DIR/tree (default
# build/prove/tree) with one build directory, so make recompiles only what the stub touched.
# Only the test binaries that hold ex* suites, the MPI test programs and the chapters are built;
# only the ex* suites are run (tools/grade.sh).
#   --dir DIR     where the work tree lives (default build/prove; kept between runs)
#   --timeout S   seconds one exercise's tests may run (default 300)
# Exit status 0 when everything holds, 1 when a defect was found (each one is named).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=tools/exercises.sh
. "$here/exercises.sh"

usage() { sed -n '3,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$root/build/prove; timeout_s=300
while [ $# -gt 0 ]; do
    case $1 in
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
if [ $# -gt 0 ]; then
    ids=
    for id in "$@"; do
        printf '%s\n' "$all_ids" | grep -qxF -- "$id" || { echo "prove: no exercise $id"; exit 2; }
        ids+="$id"$'\n'
    done
else
    ids=$all_ids
fi
if [ -z "$all_ids" ]; then
    echo "prove: no exercises yet (no // EXERCISE markers in common/ or the chapters)"
    echo "prove: 0 passed, 0 failed"
    exit 0
fi

defects=()
field() { printf '%s\n' "$exercises" | awk -F'\t' -v id="$1" -v k="$2" '$1 == id { print $k }'; }

# Every marker's link must lead to an existing README heading.
for id in $all_ids; do
    why=$(ex_check_link "$root" "$(field "$id" 3)")
    [ -n "$why" ] && defects+=("$id: its marker ($(field "$id" 4):$(field "$id" 5)) links to $(field "$id" 3), but $why")
done

work=$dir/tree; gen=$dir/gen
mkdir -p "$work"
log=$dir/log; : >"$log"

# mirror: make the work tree's sources equal to gen's; only files that differ are copied, so
# their new times make make rebuild just what depends on them. The build dir stays.
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

# tree ARGS...: write the tree make_student.sh ARGS... describes and mirror it into the work tree.
tree() {
    bash "$here/make_student.sh" --force "$@" "$gen" >>"$log" 2>&1 && mirror
}

# build: the test binaries that hold ex* suites, the MPI test programs, the chapters.
build() {
    local targets=() f
    for f in "$work"/tests/test_*.c; do
        [ -f "$f" ] && grep -qE '(^|[^A-Za-z0-9_])ex[0-9][0-9]_[0-9]+([^A-Za-z0-9_]|$)' "$f" &&
            targets+=("build/tests/$(basename "${f%.c}")")
    done
    for f in "$work"/tests/mpi_*.c; do [ -f "$f" ] && targets+=("build/tests/$(basename "${f%.c}")"); done
    for f in $(ex_chapters "$work"); do targets+=("$f/run"); done
    echo "\$ make -j$jobs BUILD=build STUDENT=1 ${targets[*]}" >>"$log"
    make -C "$work" -j"$jobs" --no-print-directory BUILD=build STUDENT=1 "${targets[@]}" >"$dir/build.log" 2>&1
    local rc=$?
    cat "$dir/build.log" >>"$log"
    return $rc
}

# grade: run every exercise's tests in the work tree; results in $dir/grade.tsv.
grade() {
    (cd "$work" && bash tools/grade.sh --tsv "$dir/grade.tsv" --timeout "$timeout_s" build) >>"$log" 2>&1
    return 0
}
result() { awk -F'\t' -v id="$1" -v k="$2" '$1 == id { print $k }' "$dir/grade.tsv"; }

# Where a failed build went wrong: the compiler's first errors.
build_errors() {
    { grep -E ': (fatal )?error:|\*\*\*' "$dir/build.log" || tail -n 5 "$dir/build.log"; } |
        head -n 8 | sed 's/^/      /'
}

start=$SECONDS
echo "prove: reference tree in ${work#"$root"/} (log: ${log#"$root"/})"
echo "== tree $(date +%T): reference" >>"$log"
if ! tree none; then echo "prove: could not copy the repository:"; tail -n 5 "$log"; exit 1; fi
if ! build; then
    echo "prove: the reference does not build:"; build_errors
    echo "prove: 0 passed, 1 failed"; exit 1
fi
grade
declare -A ref_ok ref_n
for id in $all_ids; do
    ref_ok[$id]=$(result "$id" 2); ref_n[$id]=$(result "$id" 3)
    case $(result "$id" 4) in
        pass) ;;
        "no tests") defects+=("$id: no tests (no Test($(ex_suite "$id"), ...) in tests/test_*.c)") ;;
        *) defects+=("$id: the reference fails its own tests (${ref_ok[$id]}/${ref_n[$id]} pass)") ;;
    esac
done
for id in $(awk -F'\t' '$4 == "orphan" { print $1 }' "$dir/grade.tsv"); do
    defects+=("$id: suite $(ex_suite "$id") has tests but no source has a // EXERCISE $id marker")
done
echo "prove: reference built and graded in $((SECONDS - start)) s"

title_w=5
for id in $ids; do t=$(field "$id" 2); [ ${#t} -gt $title_w ] && title_w=${#t}; done
row() { printf '%-8s  %-*s  %-9s  %-10s  %-11s  %s\n' "$1" "$title_w" "$2" "$3" "$4" "$5" "$6"; }
echo
row exercise title reference "stub fails" "others pass" time
for id in $ids; do
    t0=$SECONDS
    ref="${ref_ok[$id]}/${ref_n[$id]}"
    echo "== tree $(date +%T): only $id stubbed" >>"$log"
    if ! tree --only "$id" none || ! build; then
        row "$id" "$(field "$id" 2)" "$ref" "NO BUILD" "-" "$((SECONDS - t0)) s"
        defects+=("$id: the tree with only $id stubbed does not build (declare before the region what is used after it):"$'\n'"$(build_errors)")
        continue
    fi
    grade
    own_ok=$(result "$id" 2); own_n=$(result "$id" 3)
    if [ "${own_n:-0}" -gt 0 ] && [ "$own_ok" -gt 0 ]; then
        defects+=("$id: $own_ok of its $own_n tests pass on the stub (they do not test the exercise; see ${dir#"$root"/}/tree/build/grade/$(ex_suite "$id").log)")
    fi
    others_ok=0; others_n=0; broken=
    for other in $all_ids; do
        [ "$other" = "$id" ] && continue
        o_ok=$(result "$other" 2); o_n=$(result "$other" 3)
        others_ok=$((others_ok + ${o_ok:-0})); others_n=$((others_n + ${o_n:-0}))
        # A test that already fails on the reference is reported there, not here.
        if [ "${o_ok:-0}" -lt "${o_n:-0}" ] && [ "${o_ok:-0}" -lt "${ref_ok[$other]:-0}" ]; then broken+=" $other"; fi
    done
    if [ -n "$broken" ]; then
        defects+=("$id: stubbing it breaks the tests of$broken (they must not need $id's solution)")
    fi
    row "$id" "$(field "$id" 2)" "$ref" "$((own_n - own_ok))/$own_n" "$others_ok/$others_n" "$((SECONDS - t0)) s"
done

echo "== tree $(date +%T): every exercise stubbed" >>"$log"
if tree all && build; then
    echo "student version (every exercise stubbed): builds"
else
    echo "student version (every exercise stubbed): DOES NOT BUILD"
    defects+=("the student version (every exercise stubbed) does not build:"$'\n'"$(build_errors)")
fi
echo "prove: done in $((SECONDS - start)) s"

if [ ${#defects[@]} -gt 0 ]; then
    echo
    echo "Defects:"
    for d in "${defects[@]}"; do printf '  %s\n' "$d"; done
fi
# The closing count: exercises proven without a defect, and the defects' exercises (a defect that
# names no exercise, such as a student version that does not build, counts one).
bad_ids=$(for d in "${defects[@]}"; do echo "${d%%:*}"; done | sort -u)
n_bad=0; n_ok=0
for b in $bad_ids; do
    if printf '%s\n' "$all_ids" | grep -qxF -- "$b"; then n_bad=$((n_bad + 1)); fi
done
n_bad=$((n_bad + $(for d in "${defects[@]}"; do echo "${d%%:*}"; done | grep -vc '^[0-9][0-9]\.[0-9]*$')))
for id in $ids; do printf '%s\n' "$bad_ids" | grep -qxF -- "$id" || n_ok=$((n_ok + 1)); done
echo
echo "prove: $n_ok passed, $n_bad failed"
[ ${#defects[@]} -eq 0 ]
