# shellcheck shell=bash
# exercises.sh: helpers shared by make_student.sh, grade.sh and prove_exercises.sh.
# Sourced, not run. Plain bash + awk (mawk is enough) + sed; no python.
#
# An exercise is a region inside a function body, in common/*.{c,h,cu} or <chapter>/*.{c,h,cu}:
#
#     // EXERCISE 04.1 Scatter-reduce phase -> 04_ring_allreduce/README.md#exercise-041-scatter-reduce-phase
#     ...reference solution statements...
#     // END EXERCISE 04.1
#
# The id is <chapter number>.<n>; the exercise belongs to the chapter whose directory starts with
# that number, wherever its region lives. Its Criterion tests are in suite ex<chapter>_<n>
# (04.1 -> ex04_1). The student version keeps both marker lines and replaces the lines between
# them by one call:  lab_exercise_todo("04.1", "Scatter-reduce phase", "04_ring_allreduce/README.md#...");

# The awk program that reads markers. One file per run.
#   mode=list  prints one line per region: id TAB title TAB readme#anchor TAB file TAB first TAB last
#   mode=stub  prints the file with the regions chosen by sel replaced by the stub call
#   sel        all | none | chapter NN | ids <id> <id> ...
# Any malformed marker is reported as file:line and makes awk exit 1.
EX_AWK='
function fail(msg) { printf "%s:%d: %s\n", FILENAME, FNR, msg > "/dev/stderr"; bad = 1 }
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
function chosen(id) {
    if (sel == "all") return 1
    if (sel == "none") return 0
    if (substr(sel, 1, 8) == "chapter ") return substr(id, 1, 2) == substr(sel, 9)
    if (substr(sel, 1, 4) == "ids ") return index(" " substr(sel, 5) " ", " " id " ") > 0
    return 0
}
# "// EXERCISE <id> <title> -> <readme>#<anchor>"
/^[ \t]*\/\/ EXERCISE / {
    if (open != "") { fail("EXERCISE " open " (line " start ") has no END EXERCISE before this new EXERCISE marker"); open = "" }
    line = $0; sub(/^[ \t]+/, "", line)
    indent = substr($0, 1, length($0) - length(line))
    rest = trim(substr(line, 13))
    sp = index(rest, " ")
    id = sp ? substr(rest, 1, sp - 1) : rest
    rest = sp ? trim(substr(rest, sp + 1)) : ""
    arrow = 0; p = 0
    while ((q = index(substr(rest, p + 1), " -> ")) > 0) { p += q; arrow = p }
    title = arrow ? trim(substr(rest, 1, arrow - 1)) : ""
    link = arrow ? trim(substr(rest, arrow + 4)) : ""
    if (id !~ /^[0-9][0-9]\.[0-9]+$/) { fail("exercise id \"" id "\" is not <chapter>.<n>, e.g. 04.1"); next }
    if (title == "" || link == "") { fail("marker is not \"// EXERCISE " id " <title> -> <readme>#<anchor>\""); next }
    if (title ~ /["\\]/) { fail("exercise title may not contain \" or \\ (it becomes a C string)"); next }
    if (link !~ /^[^ #"\\]+#[^ #"\\]+$/) { fail("link \"" link "\" is not <readme path>#<anchor>"); next }
    open = id; start = FNR; body = 0
    print_stub = (mode == "stub" && chosen(id))
    if (mode == "stub") {
        print
        if (print_stub) printf "%slab_exercise_todo(\"%s\", \"%s\", \"%s\");\n", indent, id, title, link
    }
    next
}
/^[ \t]*\/\/ END EXERCISE / {
    line = $0; sub(/^[ \t]+/, "", line)
    id = trim(substr(line, 17))
    if (open == "") { fail("END EXERCISE " id " without an opening EXERCISE marker"); next }
    if (id != open) { fail("END EXERCISE " id " closes EXERCISE " open " (line " start ")"); open = ""; next }
    if (body == 0) fail("EXERCISE " id " has no reference solution between its markers")
    if (mode == "list") printf "%s\t%s\t%s\t%s\t%d\t%d\n", id, title, link, FILENAME, start, FNR
    if (mode == "stub") print
    open = ""
    next
}
# Anything else that looks like a marker is a typo that would silently drop an exercise.
/^[ \t]*\/\/[ \t]*(END[ \t]+)?EXERCISE([ \t]|$)/ {
    fail("malformed exercise marker (expected \"// EXERCISE <id> <title> -> <readme>#<anchor>\" or \"// END EXERCISE <id>\")")
}
{
    if (open != "" && $0 !~ /^[ \t]*$/) body = 1
    if (mode == "stub" && !(open != "" && print_stub)) print
}
END {
    if (open != "") { FNR = start; fail("EXERCISE " open " has no END EXERCISE " open) }
    exit bad
}'

# The source files that may hold exercise regions, relative to $1 (the repo root), one a line.
ex_source_files() {
    (cd "$1" && shopt -s nullglob &&
        for f in common/*.c common/*.h common/*.cu [0-9][0-9]_*/*.c [0-9][0-9]_*/*.h [0-9][0-9]_*/*.cu; do
            [ -f "$f" ] && printf '%s\n' "$f"
        done)
}

# ex_list ROOT: every exercise region under ROOT, sorted by id:
#   id TAB title TAB readme#anchor TAB file TAB first-line TAB last-line
# Returns 1 (after printing every problem) on a malformed marker or a duplicate id.
ex_list() {
    local root=$1 f out status=0 dups
    out=$(cd "$root" && ex_source_files . | while IFS= read -r f; do
        grep -q 'EXERCISE' "$f" || continue
        LC_ALL=C awk -v mode=list "$EX_AWK" "$f" || echo "__bad__"
    done) || status=1
    case $out in *__bad__*) status=1 ;; esac
    out=$(printf '%s\n' "$out" | grep -v '^__bad__$' | grep -v '^$' | sort -t. -k1,1n -k2,2n)
    dups=$(printf '%s\n' "$out" | cut -f1 | grep -v '^$' | uniq -d)
    if [ -n "$dups" ]; then
        for id in $dups; do
            echo "exercise $id is marked more than once:" \
                 "$(printf '%s\n' "$out" | awk -F'\t' -v id="$id" '$1 == id { printf " %s:%s", $4, $5 }')" >&2
        done
        status=1
    fi
    [ -n "$out" ] && printf '%s\n' "$out"
    return $status
}

# ex_stub_file FILE SEL: rewrite FILE in place with the chosen regions stubbed (see EX_AWK).
ex_stub_file() {
    local f=$1 sel=$2 tmp
    tmp=$(mktemp) || return 1
    if ! LC_ALL=C awk -v mode=stub -v sel="$sel" "$EX_AWK" "$f" >"$tmp"; then
        rm -f "$tmp"; return 1
    fi
    cat "$tmp" >"$f" && rm -f "$tmp"    # cat keeps the file's mode
}

# ex_suite ID: the Criterion suite that grades exercise ID (04.1 -> ex04_1).
ex_suite() { printf 'ex%s\n' "${1/./_}"; }

# ex_anchors README: the anchors of README's headings, as GitHub makes them (lower case,
# punctuation dropped, each space a hyphen, "-1", "-2" added to repeats).
ex_anchors() {
    LC_ALL=C awk '
        /^(```|~~~)/ { fence = !fence; next }
        fence || !/^#+[ \t]/ { next }
        {
            h = $0; sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#+[ \t]*$/, "", h); sub(/[ \t\r]+$/, "", h)
            h = tolower(h); s = ""
            for (i = 1; i <= length(h); i++) {
                c = substr(h, i, 1)
                if (index("abcdefghijklmnopqrstuvwxyz0123456789 _-", c) || c > "~") s = s c
            }
            gsub(/ /, "-", s)
            if (s in seen) { seen[s]++; print s "-" seen[s] } else { seen[s] = 0; print s }
        }' "$1"
}

# ex_check_link ROOT LINK: empty when ROOT/<readme> exists and has the heading #<anchor>,
# otherwise the reason.
ex_check_link() {
    local root=$1 link=$2 readme anchor
    readme=${link%%#*}; anchor=${link#*#}
    if [ ! -f "$root/$readme" ]; then
        echo "$readme does not exist"
    elif ! ex_anchors "$root/$readme" | grep -qxF -- "$anchor"; then
        echo "$readme has no heading whose anchor is #$anchor"
    fi
}

# ex_chapters ROOT: the chapter directories (those with a main.c), one a line.
ex_chapters() {
    (cd "$1" && shopt -s nullglob && for d in [0-9][0-9]_*/main.c; do printf '%s\n' "${d%/main.c}"; done)
}

# ex_test_sources ROOT [SUITE]...: the test sources (tests/test_*.c, relative to ROOT) that hold
# those Criterion suites (any ex* suite with none), one a line.
ex_test_sources() {
    local root=$1 pat='ex[0-9][0-9]_[0-9]+' f; shift
    [ $# -gt 0 ] && pat="($(IFS='|'; echo "$*"))"
    (cd "$root" && for f in tests/test_*.c; do
        [ -f "$f" ] && grep -qE "(^|[^A-Za-z0-9_])$pat([^A-Za-z0-9_]|$)" "$f" && printf '%s\n' "$f"
    done)
}

# ex_test_targets ROOT BUILD SOURCE...: the make targets that running those test sources needs:
# their test binaries, and the programs they launch: every chapter (./<chapter>/run) and every
# MPI test program (BUILD/tests/mpi_*) whose name the source mentions. A superset is harmless:
# make rebuilds only what is out of date.
ex_test_targets() {
    local root=$1 build=$2 src name; shift 2
    for src in "$@"; do
        printf '%s/tests/%s\n' "$build" "$(basename "${src%.c}")"
        for name in $(grep -oE '[0-9][0-9]_[A-Za-z0-9_]+|mpi_[A-Za-z0-9_]+' "$root/$src" | sort -u); do
            if [ -f "$root/$name/main.c" ]; then printf '%s/run\n' "$name"
            elif [ -f "$root/tests/$name.c" ]; then printf '%s/tests/%s\n' "$build" "$name"; fi
        done
    done | awk '!seen[$0]++'
}
