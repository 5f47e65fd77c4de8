#!/usr/bin/env bash
# prove_exercises.sh: prove that the grading is honest (run by CI).
#
#   tools/prove_exercises.sh [--literal] [--dir DIR] [--build DIR] [--timeout S] [ID]...
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
# What makes it cheap:
#   - the reference is graded in the repository's own build directory (--build, default build),
#     which make first brings up to date (in CI, where `make tests` ran just before, it is);
#   - the stubbed trees start from a copy of that built tree, file times kept, so make recompiles
#     only the files whose regions are stubbed. (They build with STUDENT=1, whose flags only turn
#     warnings off: the reference's objects are valid there, and its flags stamp is carried over.)
#     Each later tree is mirrored into the same work tree: only the files that differ are copied;
#   - a tree builds and runs only what the suites it grades need: their test binaries and the
#     chapters and MPI programs those test sources name (tools/exercises.sh ex_test_targets);
#   - PROVE_LANES jobs at once (default 2, one per core): the reference's and the student
#     version's suites are graded two at a time, and the per-exercise trees go through two work
#     trees (DIR/tree1, DIR/tree2).
#   --dir DIR       where the work trees live (default build/prove; kept between runs)
#   --build DIR     the reference's build directory, relative to the repository (default build)
#   --timeout S     seconds one exercise's tests may run (default 300)
#   PROVE_LANES=N   jobs at once (default 2); PROVE_JOBS=N  make -j N (default: cores / lanes)
# Exit status 0 when everything holds, 1 when a defect was found (each one is named).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=tools/exercises.sh
. "$here/exercises.sh"

usage() { sed -n '3,39p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir=$root/build/prove; timeout_s=300; literal=0; refbuild=build
while [ $# -gt 0 ]; do
    case $1 in
        --literal) literal=1; shift ;;
        --dir) [ $# -ge 2 ] || usage; dir=$2; shift 2 ;;
        --build) [ $# -ge 2 ] || usage; refbuild=${2%/}; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; timeout_s=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "prove: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
case $dir in /*) ;; *) dir="$PWD/$dir" ;; esac
ncpu=$(nproc 2>/dev/null || echo 2)
lanes=${PROVE_LANES:-2}
[ "$lanes" -ge 1 ] 2>/dev/null || lanes=1
command -v flock >/dev/null || lanes=1     # the job queue needs flock
jobs=${PROVE_JOBS:-$(( ncpu / lanes > 0 ? ncpu / lanes : 1 ))}

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

# Tests for an exercise that has no marker: a renamed or deleted exercise.
for suite in $(cd "$root" && cat tests/test_*.c 2>/dev/null |
               grep -oE 'Test\([ \t]*ex[0-9][0-9]_[0-9]+[ \t]*,' | grep -oE 'ex[0-9][0-9]_[0-9]+' | sort -u); do
    id=$(printf '%s\n' "$suite" | sed 's/^ex//; s/_/./')
    printf '%s\n' "$all_ids" | grep -qxF -- "$id" ||
        defects+=("$id: suite $suite has tests but no source has a // EXERCISE $id marker")
done

mkdir -p "$dir"
# Two proofs in one directory would mix their trees: the second waits for none, it stops.
exec 9>"$dir/lock"
if command -v flock >/dev/null && ! flock -n 9; then
    echo "prove: another proof is running in $dir (pass --dir to use another directory)"; exit 2
fi
log=$dir/log; res=$dir/results
rm -rf "$res" "$dir/tree" "$dir/gen" "$dir"/lane*.log    # (tree and gen: an older layout)
mkdir -p "$res"
: >"$log"

# Lane W works in DIR/treeW; make_student.sh writes each tree's sources into DIR/genW first.
# lane_log W: where lane W's commands write (the lanes run at once; joined into DIR/log at the end)
lane_log() { echo "$dir/lane$1.log"; }

# mirror W: make treeW's sources equal to genW's. Only files that differ are copied, so their
# new times make make rebuild just what depends on them; the build directory stays.
mirror() {
    local work=$dir/tree$1 gen=$dir/gen$1 f
    (cd "$gen" && find . \( -type f -o -type l \) -print) | while IFS= read -r f; do
        if ! cmp -s "$gen/$f" "$work/$f"; then
            mkdir -p "$work/$(dirname "$f")" && rm -f "$work/$f" && cp -P "$gen/$f" "$work/$f"
        fi
    done
    (cd "$work" && find . -path ./build -prune -o \( -type f -o -type l \) -print) | while IFS= read -r f; do
        [ -e "$gen/$f" ] || [ -L "$gen/$f" ] || rm -f "$work/$f"
    done
}

# tree W ARGS...: the tree `make_student.sh ARGS...` writes, mirrored into treeW.
tree() {
    local w=$1; shift
    echo "== $(date +%T) tree$w: $*" >>"$(lane_log "$w")"
    bash "$here/make_student.sh" --force "$@" "$dir/gen$w" >>"$(lane_log "$w")" 2>&1 && mirror "$w"
}

# targets ROOT BUILD [ID]: the make targets the suite of ID (every ex* suite with none) needs.
targets() {
    local r=$1 b=$2 suites=()
    [ $# -ge 3 ] && suites=("$(ex_suite "$3")")
    # shellcheck disable=SC2046
    ex_test_targets "$r" "$b" $(ex_test_sources "$r" "${suites[@]}")
}

# build W J TARGETS...: make those in treeW (STUDENT=1: stubs leave parameters unused), -jJ.
build() {
    local w=$1 j=$2; shift 2
    echo "\$ make -j$j BUILD=build STUDENT=1 $*" >>"$(lane_log "$w")"
    make -C "$dir/tree$w" -j"$j" --no-print-directory BUILD=build STUDENT=1 "$@" >"$dir/build$w.log" 2>&1
    local rc=$?
    cat "$dir/build$w.log" >>"$(lane_log "$w")"
    return $rc
}
build_errors() {
    { grep -E ': (fatal )?error:|\*\*\*' "$dir/build$1.log" || tail -n 5 "$dir/build$1.log"; } |
        head -n 8 | sed 's/^/      /'
}

# grade_in ROOT BUILD TSV LOGW [ID]...: run those exercises' tests (all with none) with ROOT's
# grade.sh on what is built in BUILD (nothing is rebuilt); the results in TSV.
grade_in() {
    local r=$1 b=$2 tsv=$3 w=$4; shift 4
    (cd "$r" && CHAPTER='' EX='' bash tools/grade.sh --no-build --tsv "$tsv" --timeout "$timeout_s" "$b" "$@") \
        >>"$(lane_log "$w")" 2>&1
    return 0
}
# result TSV ID K: field K of ID's line (2 passed, 3 total, 4 status, 5 failing).
result() { awk -F'\t' -v id="$2" -v k="$3" '$1 == id { print $k }' "$1" 2>/dev/null; }
# The stubs treeW's log of ID's tests shows were reached, other than ID's: "04.1 04.2".
stubs_hit() {
    grep -o 'exercise [0-9][0-9]\.[0-9]* (' "$dir/tree$1/build/grade/$(ex_suite "$2").log" 2>/dev/null |
        awk -v me="$2" '$2 != me { print $2 }' | sort -u | tr '\n' ' ' | sed 's/ $//'
}

# run_jobs FUNC ARG...: FUNC W ARG for every ARG, PROVE_LANES at a time; W is the lane (1, 2,
# ...) that runs it, each lane taking the next ARG when it is free.
run_jobs() {
    local fn=$1 n w; shift
    n=$#
    if [ "$lanes" -le 1 ] || [ "$n" -le 1 ]; then
        for a in "$@"; do "$fn" 1 "$a"; done
        return
    fi
    printf '%s\n' "$@" >"$dir/queue"
    echo 1 >"$dir/queue.next"
    for ((w = 1; w <= lanes; w++)); do
        (
            exec 8>"$dir/queue.lock"
            while :; do
                flock 8; read -r i <"$dir/queue.next"; echo $((i + 1)) >"$dir/queue.next"; flock -u 8
                [ "$i" -le "$n" ] || break
                "$fn" "$w" "$(sed -n "${i}p" "$dir/queue")"
            done
        ) &
    done
    wait
}

title_w=5
for id in $ids; do t=$(field "$id" 2); [ ${#t} -gt $title_w ] && title_w=${#t}; done
row() { printf '%-8s  %-*s  %-9s  %-10s  %-14s  %s\n' "$1" "$title_w" "$2" "$3" "$4" "$5" "$6"; }
start=$SECONDS
echo "prove: reference in ${refbuild}, work trees ${dir#"$root"/}/tree1..$lanes, log ${log#"$root"/}"

# --- the reference, in the repository's own build ------------------------------------------------
# shellcheck disable=SC2046
ref_targets=$(targets "$root" "$refbuild")
echo "\$ make -j$ncpu BUILD=$refbuild" $ref_targets >>"$log"
# shellcheck disable=SC2086
if ! make -C "$root" -j"$ncpu" --no-print-directory BUILD="$refbuild" $ref_targets >"$dir/build0.log" 2>&1; then
    cat "$dir/build0.log" >>"$log"
    echo "prove: the reference does not build:"
    { grep -E ': (fatal )?error:|\*\*\*' "$dir/build0.log" || tail -n 5 "$dir/build0.log"; } | head -n 8 | sed 's/^/      /'
    echo "prove: 0 passed, 1 failed"; exit 1
fi
cat "$dir/build0.log" >>"$log"

# --- the student version: every exercise stubbed, built from a copy of the reference's build ------
t0=$SECONDS
rm -rf "$dir/tree1" "$dir/gen1" "$dir/tree2" "$dir/gen2"
if ! bash "$here/make_student.sh" --force none "$dir/tree1" >>"$log" 2>&1; then
    echo "prove: could not copy the repository:"; tail -n 5 "$log"; exit 1
fi
mkdir -p "$dir/tree1/build"
for f in common chapters tests bin libcommon.a; do
    [ -e "$root/$refbuild/$f" ] && cp -a "$root/$refbuild/$f" "$dir/tree1/build/"
done
# The flags stamp of the STUDENT=1 build, older than every object: they stay up to date.
stamp=$(make -C "$dir/tree1" -pn BUILD=build STUDENT=1 help 2>/dev/null | awk '$1 == "FLAGS_STAMP" { print $3; exit }')
if [ -n "$stamp" ]; then
    rm -f "$dir/tree1/build/.flags-"* && touch -d @1 "$dir/tree1/$stamp"
fi
declare -A ref_ok ref_n stu_ok
# shellcheck disable=SC2046
if ! { tree 1 all && build 1 "$ncpu" $(targets "$dir/tree1" build); }; then
    echo "prove: the student version (every exercise stubbed) DOES NOT BUILD; the stubs that break it:"
    for id in $ids; do
        # shellcheck disable=SC2046
        if ! { tree 1 --only "$id" none && build 1 "$ncpu" $(targets "$dir/tree1" build "$id"); }; then
            defects+=("$id: the tree with only $id stubbed does not build (declare before the region what is used after it):"$'\n'"$(build_errors 1)")
        fi
    done
    [ ${#defects[@]} -gt 0 ] || defects+=("the student version does not build, though each stub alone does")
    literal=-1
fi
echo "prove: student version built in $((SECONDS - t0)) s"

# Grade the reference (every exercise: --literal compares with it) and the student version, one
# exercise a job.
t0=$SECONDS
job_grade() {
    local w=$1 kind=${2%% *} id=${2#* }
    if [ "$kind" = ref ]; then grade_in "$root" "$refbuild" "$res/ref.$id" "$w" "$id"
    else grade_in "$dir/tree1" build "$res/stu.$id" "$w" "$id"; fi
}
grade_jobs=()
for id in $all_ids; do grade_jobs+=("ref $id"); done
if [ $literal -ge 0 ]; then for id in $all_ids; do grade_jobs+=("stu $id"); done; fi
run_jobs job_grade "${grade_jobs[@]}"
for id in $all_ids; do
    ref_ok[$id]=$(result "$res/ref.$id" "$id" 2); ref_n[$id]=$(result "$res/ref.$id" "$id" 3)
    stu_ok[$id]=$(result "$res/stu.$id" "$id" 2)
    printf '%s\n' "$ids" | grep -qxF -- "$id" || continue
    case $(result "$res/ref.$id" "$id" 4) in
        pass) ;;
        "no tests") defects+=("$id: no tests (no Test($(ex_suite "$id"), ...) in tests/test_*.c)") ;;
        *) defects+=("$id: the reference fails its tests ($(result "$res/ref.$id" "$id" 5))") ;;
    esac
done
echo "prove: reference and student version graded in $((SECONDS - t0)) s"

# The second lane's work tree: a copy of the first, built, times kept.
if [ $literal -ge 0 ] && [ "$lanes" -ge 2 ]; then
    for ((w = 2; w <= lanes; w++)); do cp -a "$dir/tree1" "$dir/tree$w"; done
fi

# --- default: for each exercise, every other one stubbed ---------------------------------------
job_except() {
    local w=$1 id=$2 t0=$SECONDS
    # shellcheck disable=SC2046
    if ! { tree "$w" --except "$id" all && build "$w" "$jobs" $(targets "$dir/tree$w" build "$id"); }; then
        build_errors "$w" >"$res/exc.$id.nobuild"
    else
        grade_in "$dir/tree$w" build "$res/exc.$id" "$w" "$id"
        stubs_hit "$w" "$id" >"$res/exc.$id.hit"
    fi
    echo $((SECONDS - t0)) >"$res/exc.$id.time"
}
if [ $literal -eq 0 ]; then
    todo=()
    for id in $ids; do [ "${ref_n[$id]:-0}" -gt 0 ] && todo+=("$id"); done
    run_jobs job_except "${todo[@]}"
    echo
    row exercise title reference "stub fails" "others stubbed" time
    for id in $ids; do
        n=${ref_n[$id]:-0}
        if [ "$n" -eq 0 ]; then row "$id" "$(field "$id" 2)" "0/0" "-" "-" "-"; continue; fi
        stub_fails="$((n - ${stu_ok[$id]:-0}))/$n"
        if [ "${stu_ok[$id]:-0}" -gt 0 ]; then
            defects+=("$id: ${stu_ok[$id]} of its $n tests pass on the stub, in the student version (they do not reach the exercise)")
        fi
        secs="$(cat "$res/exc.$id.time" 2>/dev/null) s"
        if [ -e "$res/exc.$id.nobuild" ]; then
            row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/$n" "$stub_fails" "NO BUILD" "$secs"
            defects+=("$id: the tree with every other exercise stubbed does not build:"$'\n'"$(cat "$res/exc.$id.nobuild")")
            continue
        fi
        ok=$(result "$res/exc.$id" "$id" 2)
        if [ "${ok:-0}" -lt "$n" ]; then
            hit=$(cat "$res/exc.$id.hit" 2>/dev/null)
            defects+=("$id: its tests need another exercise's solution; with every other exercise stubbed these fail: $(result "$res/exc.$id" "$id" 5)${hit:+ (they reached the stub of $hit)}")
        fi
        row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/$n" "$stub_fails" "${ok:-0}/$n" "$secs"
    done
fi

# --- --literal: for each exercise, only it stubbed -----------------------------------------------
job_only() {
    local w=$1 id=$2 t0=$SECONDS
    # shellcheck disable=SC2046
    if ! { tree "$w" --only "$id" none && build "$w" "$jobs" $(targets "$dir/tree$w" build); }; then
        build_errors "$w" >"$res/only.$id.nobuild"
    else
        grade_in "$dir/tree$w" build "$res/only.$id" "$w"
    fi
    echo $((SECONDS - t0)) >"$res/only.$id.time"
}
if [ $literal -eq 1 ]; then
    # shellcheck disable=SC2086
    run_jobs job_only $ids
    echo
    row exercise title reference "stub fails" "others pass" time
    for id in $ids; do
        secs="$(cat "$res/only.$id.time" 2>/dev/null) s"
        if [ -e "$res/only.$id.nobuild" ]; then
            row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/${ref_n[$id]}" "NO BUILD" "-" "$secs"
            defects+=("$id: the tree with only $id stubbed does not build:"$'\n'"$(cat "$res/only.$id.nobuild")")
            continue
        fi
        tsv=$res/only.$id
        own_ok=$(result "$tsv" "$id" 2); own_n=$(result "$tsv" "$id" 3)
        if [ "${own_n:-0}" -gt 0 ] && [ "$own_ok" -gt 0 ]; then
            defects+=("$id: $own_ok of its $own_n tests pass on the stub (they do not reach the exercise)")
        fi
        others_ok=0; others_n=0; broken=
        for other in $all_ids; do
            [ "$other" = "$id" ] && continue
            o_ok=$(result "$tsv" "$other" 2); o_n=$(result "$tsv" "$other" 3)
            others_ok=$((others_ok + ${o_ok:-0})); others_n=$((others_n + ${o_n:-0}))
            # A test that already fails on the reference is reported there, not here.
            if [ "${o_ok:-0}" -lt "${ref_ok[$other]:-0}" ]; then broken+=" $other"; fi
        done
        if [ -n "$broken" ]; then
            defects+=("$id: stubbing it breaks the tests of$broken (they must not need $id's solution)")
        fi
        row "$id" "$(field "$id" 2)" "${ref_ok[$id]}/$own_n" "$((own_n - own_ok))/$own_n" "$others_ok/$others_n" "$secs"
    done
fi
for ((w = 1; w <= lanes; w++)); do
    [ -f "$(lane_log "$w")" ] && { echo "=== lane $w"; cat "$(lane_log "$w")"; } >>"$log"
done
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
