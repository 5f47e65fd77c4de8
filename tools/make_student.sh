#!/usr/bin/env bash
# make_student.sh: write the student version of the lab, with exercise solutions replaced by stubs.
#
#   tools/make_student.sh [--force] [--only ID]... [--except ID]... <all|CHAPTER|none> <dest>
#
#   all         stub every exercise                     (make student)
#   CHAPTER     stub that chapter's exercises only,     (make student CHAPTER=04_ring_allreduce)
#               e.g. 04_ring_allreduce or just 04; an exercise belongs to the chapter named by
#               its id (04.x), whether its region is in 04_ring_allreduce/ or in common/
#   none        stub nothing (a plain copy; with --only, just the listed exercises)
#   --only ID   stub exercise ID (repeatable); the selection is then exactly the listed ids
#   --except ID leave exercise ID as the reference (repeatable), stub the rest of the selection
#   --force     replace <dest> if it exists (it may hold a student's work: off by default)
#
# <dest> gets a copy of the repository (tracked files and untracked files git does not ignore;
# no .git, no build outputs) in which each chosen region's lines between its two markers become
#     lab_exercise_todo("<id>", "<title>", "<readme>#<anchor>");
# and whose Makefile builds with STUDENT=1 (unused-parameter warnings relaxed) by default.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=tools/exercises.sh
. "$here/exercises.sh"

usage() { sed -n '3,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "make_student: $*" >&2; exit 1; }

force=0; only=(); except=(); args=()
while [ $# -gt 0 ]; do
    case $1 in
        --force) force=1; shift ;;
        --only) [ $# -ge 2 ] || usage; only+=("$2"); shift 2 ;;
        --only=*) only+=("${1#--only=}"); shift ;;
        --except) [ $# -ge 2 ] || usage; except+=("$2"); shift 2 ;;
        -h|--help) usage ;;
        -*) echo "make_student: unknown option $1" >&2; usage ;;
        *) args+=("$1"); shift ;;
    esac
done
[ ${#args[@]} -eq 2 ] || usage
what=${args[0]}; dest=${args[1]}

# Which regions to stub.
exercises=$(ex_list "$root") || die "fix the exercise markers above first"
ids=$(printf '%s\n' "$exercises" | cut -f1 | grep -v '^$' || true)
for id in "${only[@]}" "${except[@]}"; do
    printf '%s\n' "$ids" | grep -qxF -- "$id" || die "no exercise $id; the exercises are: ${ids//$'\n'/ }"
done
if [ ${#only[@]} -gt 0 ]; then
    [ "$what" = none ] || [ "$what" = all ] || die "--only goes with 'none' (or 'all'), not with a chapter"
    sel="ids ${only[*]}"
elif [ "$what" = all ] || [ "$what" = none ]; then
    sel=$what
else
    chapters=$(ex_chapters "$root")
    chapter=$(printf '%s\n' "$chapters" | grep -xF -- "${what%/}" ||
              printf '%s\n' "$chapters" | grep -E "^${what%%_*}_" || true)
    [ -n "$chapter" ] && [ "$(printf '%s\n' "$chapter" | wc -l)" -eq 1 ] ||
        die "no chapter '$what'; the chapters are: ${chapters//$'\n'/ } (or 'all')"
    sel="chapter ${chapter%%_*}"
    printf '%s\n' "$ids" | grep -q "^${chapter%%_*}\." ||
        echo "make_student: note: chapter $chapter has no exercises yet" >&2
fi

# --except: the same selection less those ids.
if [ ${#except[@]} -gt 0 ]; then
    keep=
    for id in $ids; do
        case $sel in
            all) ;;
            none) continue ;;
            "chapter "*) [ "${id%%.*}" = "${sel#chapter }" ] || continue ;;
            "ids "*) [[ " ${sel#ids } " == *" $id "* ]] || continue ;;
        esac
        [[ " ${except[*]} " == *" $id "* ]] || keep+=" $id"
    done
    if [ -n "$keep" ]; then sel="ids${keep}"; else sel=none; fi
fi

# Where to write it.
case $dest in /*) ;; *) dest="$PWD/$dest" ;; esac
dest=${dest%/}
if [ -e "$dest" ]; then
    [ $force = 1 ] || die "$dest already exists and may hold your work; move it away (or pass --force to replace it)"
    rm -rf "$dest"
fi
case "$dest/" in "$root"/*) inside=${dest#"$root"/} ;; *) inside= ;; esac
case "$root/" in "$dest"/*) die "$dest contains the repository itself" ;; esac

# The files to copy: what git would commit, or, outside a git checkout, every file that is not
# a build output.
list_files() {
    if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$root" ls-files --cached --others --exclude-standard
    else
        (cd "$root" && find . \( -name .git -o -name 'build' -o -name 'build-*' -o -name student \
                                 -o -name out \) -prune -o \( -type f -o -type l \) -print |
            sed 's|^\./||' | grep -v -E '(^|/)run$|\.o$|\.a$')
    fi
}
mkdir -p "$dest"
list_files | grep -v -E '^build[^/]*/' |
    { if [ -n "$inside" ]; then grep -v -F -- "$inside/" ; else cat; fi; } |
    while IFS= read -r f; do
        if [ -e "$root/$f" ] || [ -L "$root/$f" ]; then printf '%s\n' "$f"; fi   # skip deleted files
    done |
    tar -C "$root" -cf - --no-recursion -T - | tar -C "$dest" -xf -

# Stub the chosen regions.
if [ "$sel" != none ]; then
    ex_source_files "$dest" | while IFS= read -r f; do
        grep -q 'EXERCISE' "$dest/$f" || continue
        (cd "$dest" && ex_stub_file "$f" "$sel") || exit 1
    done || die "stubbing failed"
fi

# The student Makefile builds with STUDENT=1 unless told otherwise: two lines go in right after
# the Makefile's opening comment block, so that block still comes first.
if [ -f "$dest/Makefile" ] && ! grep -q '^STUDENT ?= 1' "$dest/Makefile"; then
    awk '!done && !/^#/ {
             if ($0 == "") print ""
             print "# The student version (tools/make_student.sh): stubs leave parameters unused."
             print "STUDENT ?= 1"
             print ""
             done = 1
             if ($0 == "") next
         }
         { print }' "$dest/Makefile" >"$dest/Makefile.new"
    cat "$dest/Makefile.new" >"$dest/Makefile" && rm -f "$dest/Makefile.new"
fi

stubbed=$(ex_source_files "$dest" | (cd "$dest" && xargs -r grep -ho 'lab_exercise_todo("[0-9.]*"' || true) |
          sed 's/.*("//; s/"$//' | sort -t. -k1,1n -k2,2n | tr '\n' ' ' | sed 's/ $//')
echo "make_student: wrote $dest (stubbed: ${stubbed:-nothing})"
