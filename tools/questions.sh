#!/usr/bin/env bash
# questions.sh [--file F] [--show] [N...]: runs every command quoted in docs/QUESTIONS.md (or F)
# and checks that the page still says what they print. `make questions` runs it; the Criterion
# test tests/test_questions.c runs it question by question.
#
# The page's format (docs/QUESTIONS.md says it for its readers too):
#   - a question is a heading "## N. ...";
#   - its commands are in ```console blocks: a line "$ CMD" (continued by a trailing backslash)
#     is a command, the lines after it, up to the next "$ " or the block's end, are what it
#     prints: every one of them must be a line of its output (stdout and stderr together),
#     consecutive lines consecutive and in order; a line "..." stands for lines left out;
#   - its answer is the paragraph that starts with "**Answer.**": every `code span` in it with a
#     digit is a figure, and must be in the output of one of the question's commands.
# Commands run with bash in a scratch directory where each chapter's directory is linked, so
# `./05_zero/run` works and files they write (checkpoints) land there; `mpirun` gets the root
# README's flags (--oversubscribe --bind-to none --mca mpi_yield_when_idle 1; root allowed).
#
# --show: print each command's whole output instead of checking (to re-quote the page after a
# change). N...: only these questions. Exit status 0 when every quoted line and figure holds.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
file=docs/QUESTIONS.md
show=0
only=()
while [ $# -gt 0 ]; do
  case $1 in
    --file) file=$2; shift 2 ;;
    --show) show=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) only+=("$1"); shift ;;
    *) echo "questions.sh: unknown argument '$1' (valid: --file F, --show, question numbers)" >&2; exit 2 ;;
  esac
done
if [ ! -f "$file" ]; then
  echo "questions.sh: no file $file" >&2
  exit 2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d /tmp/lab-questions-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cmd" "$tmp/work"
for d in "$root"/[0-9][0-9]_*/; do ln -s "${d%/}" "$tmp/work/$(basename "$d")"; done
ln -s "$root/tools" "$tmp/work/tools"

# Split the page: cmd/K.sh (command K), cmd/K.exp (its quoted lines), cmd/K.q (its question),
# cmd/aN (the figures of question N's answer, one a line).
awk -v dir="$tmp/cmd" '
  function trim(s) { sub(/[ \t\r]+$/, "", s); return s }
  /^## [0-9]+\./ { q = $2; sub(/\.$/, "", q); inans = 0 }
  inblock && /^```/ { inblock = 0; cont = 0; next }
  /^```console/ { inblock = 1; cont = 0; next }
  inblock {
    if (cont) { print $0 > (dir "/" k ".sh"); cont = ($0 ~ /\\$/); next }
    if ($0 ~ /^\$ /) {
      k++
      print q > (dir "/" k ".q")
      print substr($0, 3) > (dir "/" k ".sh")
      printf "" > (dir "/" k ".exp")
      cont = ($0 ~ /\\$/)
      next
    }
    if (k) print trim($0) > (dir "/" k ".exp")
    next
  }
  /^\*\*Answer\.\*\*/ { inans = 1 }
  inans && /^[ \t]*$/ { inans = 0 }
  inans {
    s = $0
    while (match(s, /`[^`]*`/)) {
      span = substr(s, RSTART + 1, RLENGTH - 2)
      if (span ~ /[0-9]/) print span > (dir "/a" q)
      s = substr(s, RSTART + RLENGTH)
    }
  }
' "$file"

n_cmds=$(ls "$tmp/cmd" | grep -c '\.sh$')
if [ "$n_cmds" -eq 0 ]; then
  echo "questions.sh: no commands found in $file" >&2
  exit 2
fi

wanted() {
  [ ${#only[@]} -eq 0 ] && return 0
  local n
  for n in "${only[@]}"; do [ "$n" = "$1" ] && return 0; done
  return 1
}

# check OUT EXP: every quoted segment (lines between "..." markers) occurs in OUT as consecutive
# lines, the segments in order. Prints the first quoted line that does not hold and returns 1.
check() {
  awk -v out="$1" '
    function trim(s) { sub(/[ \t\r]+$/, "", s); return s }
    BEGIN { while ((getline l < out) > 0) o[++no] = trim(l) }
    { if ($0 == "...") { nseg++ } else { seg[nseg, ++len[nseg]] = $0 } }
    END {
      pos = 1
      for (s = 0; s <= nseg; s++) {
        if (!len[s]) continue
        found = 0; best = 0
        for (i = pos; i + len[s] - 1 <= no && !found; i++) {
          for (j = 1; j <= len[s] && o[i + j - 1] == seg[s, j]; j++) ;
          if (j > len[s]) { found = 1; pos = i + len[s] }
          else if (j - 1 > best) best = j - 1
        }
        if (!found) {
          printf "    this quoted line is not what the command prints now (after %d line(s) of the same block that match):\n      %s\n", best, seg[s, best + 1]
          exit 1
        }
      }
    }' "$2"
}

fails=0
ran=0
declare -A qout
for k in $(seq 1 "$n_cmds"); do
  q=$(cat "$tmp/cmd/$k.q")
  wanted "$q" || continue
  ran=$((ran + 1))
  cmd=$(cat "$tmp/cmd/$k.sh")
  shown=$(head -n 1 "$tmp/cmd/$k.sh")
  out="$tmp/cmd/$k.out"
  t0=$(date +%s.%N)
  (cd "$tmp/work" && timeout -k 5 300 bash -c "mpirun() { command mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \"\$@\"; }
$cmd") > "$out" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  qout[$q]="${qout[$q]:-} $out"
  if [ "$show" = 1 ]; then
    echo "=== question $q: \$ $shown  (exit $rc, $secs s)"
    cat "$out"
    continue
  fi
  if [ "$rc" -ne 0 ]; then
    echo "FAIL question $q: \$ $shown  (exit $rc, $secs s); its last lines:"
    tail -n 5 "$out" | sed 's/^/      /'
    fails=$((fails + 1))
  elif msg=$(check "$out" "$tmp/cmd/$k.exp"); then
    echo "ok   question $q: \$ $shown  ($(grep -cv '^\.\.\.$' "$tmp/cmd/$k.exp") lines quoted, $secs s)"
  else
    echo "FAIL question $q: \$ $shown  ($secs s)"
    echo "$msg"
    fails=$((fails + 1))
  fi
done
if [ "$ran" -eq 0 ]; then
  echo "questions.sh: no commands for question(s) ${only[*]} in $file" >&2
  exit 2
fi
[ "$show" = 1 ] && exit 0

# The answers' figures.
for a in "$tmp"/cmd/a*; do
  [ -e "$a" ] || continue
  q=${a##*/a}
  wanted "$q" || continue
  while IFS= read -r fig; do
    # shellcheck disable=SC2086
    if ! grep -qF -- "$fig" ${qout[$q]:-/dev/null}; then
      echo "FAIL question $q: the answer quotes \`$fig\`, which none of its commands prints now"
      fails=$((fails + 1))
    fi
  done < "$a"
done

echo "questions: $ran command(s) run, $fails failure(s) (bash tools/questions.sh --show N prints what they print now)"
[ "$fails" -eq 0 ]
