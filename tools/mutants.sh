#!/usr/bin/env bash
# mutants.sh [NAME...]: proves that every deliberate bug in mutants/*.patch is caught by the tests
# that name it (mutants/README.md). For each mutant (all of them, or only NAME...): apply the
# patch to a scratch copy of the tree, build only what its Caught-by tests need, run only those
# tests, and require that each one FAILS. Prints one table (mutant, test, caught, seconds, the
# test's failure line) and one closing line "N passed, N failed" (mutants caught / not caught);
# exits non-zero when a mutant survives, no longer applies, does not build or names a missing test.
#
# One scratch copy per worker serves all its mutants: the tracked (and untracked, not ignored)
# files and the build directory, copied with their timestamps, so that make rebuilds only what a
# patch touches; after a mutant the patch is reverted (git apply -R) and its files are rebuilt by
# the next one. Two workers by default: the tests are mostly mpirun start-up and small ranks
# waiting on each other, so two mutants at a time overlap on two cores.
#
# Environment: BUILD (default build: the build directory to copy and to build in),
# MUTANTS_WORKERS (mutants at a time, default 2), MUTANTS_JOBS (make -j per worker, default 2),
# MUTANTS_TEST_TIMEOUT (seconds per test binary, default 600), MUTANTS_KEEP=1 (keep the scratch
# copies and print where they are).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD:-build}
jobs=${MUTANTS_JOBS:-2}
workers=${MUTANTS_WORKERS:-2}
test_timeout=${MUTANTS_TEST_TIMEOUT:-600}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

# --- which mutants ------------------------------------------------------------------------------
patches=()
if [ $# -eq 0 ]; then
  for p in mutants/*.patch; do [ -e "$p" ] && patches+=("$root/$p"); done
else
  for a in "$@"; do
    n=$(basename "$a" .patch)
    if [ ! -f "mutants/$n.patch" ]; then
      echo "mutants.sh: no mutant '$n' (mutants/$n.patch)" >&2
      exit 2
    fi
    patches+=("$root/mutants/$n.patch")
  done
fi
if [ ${#patches[@]} -eq 0 ]; then
  echo "mutants.sh: no mutants/*.patch" >&2
  exit 2
fi

# --- the scratch copies --------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/lab-mutants-XXXXXX)
if [ "${MUTANTS_KEEP:-0}" = 1 ]; then
  echo "scratch copies under $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
[ "$workers" -gt ${#patches[@]} ] && workers=${#patches[@]}
t_copy=$(date +%s.%N)
for w in $(seq 0 $((workers - 1))); do
  mkdir -p "$tmp/w$w"
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    xargs -0 cp -a --parents -t "$tmp/w$w"
  [ -d "$build" ] && cp -a "$build" "$tmp/w$w/$build"
done
echo "$workers scratch copies of the tree and $build/ in $(awk -v a="$t_copy" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

# Programs a test binary launches: the chapters and tests/mpi_* programs its source names.
targets_of() {
  local bin=$1 src="$scratch/tests/$1.c" t
  echo "$build/tests/$bin"
  [ -f "$src" ] || return 0
  for t in $(grep -oE '\b[0-9]{2}_[a-z0-9_]+' "$src" | sort -u); do
    [ -f "$scratch/$t/main.c" ] && echo "$t/run"
  done
  for t in $(grep -oE '\bmpi_[a-z0-9_]+' "$src" | sort -u); do
    [ -f "$scratch/tests/$t.c" ] && echo "$build/tests/$t"
  done
}

# The test's failure line: the first "FAIL:" line of an MPI test program (measured against
# expected), else the first line of Criterion's assertion message, else Criterion's verdict.
failure_line() {
  local log=$1 l
  l=$(grep -m1 -E '^\[rank [0-9]+\] FAIL: ' "$log")
  if [ -z "$l" ]; then
    l=$(awk '/Assertion Failed/ { on = 1; next }
             on && /^\[----\]/ { sub(/^\[----\] */, ""); if ($0 != "") { print; exit } next }
             on { on = 0 }' "$log")
  fi
  [ -z "$l" ] && l=$(grep -m1 -E '^\[(FAIL|----)\].*(Timed out|CRASH|signal|Assertion)' "$log")
  [ -z "$l" ] && l=$(grep -m1 -E 'Synthesis' "$log")
  printf '%s' "${l:0:240}"
}

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# One mutant in the scratch copy $3: its table rows into $2.rows, pass/fail into $2.status.
row() { printf '%-34s %-56s %-6s %7s %7s  %s\n' "$1" "$2" "$3" "$4" "$5" "$6" >>"$out.rows"; }
run_mutant() {
  local patch=$1 out=$2 scratch=$3 name ok head declared c b t rest suite test exe rc t0 t_build t_test
  local log=$out.log synth failing crashing files
  local -a caught_by bins targets
  : >"$out.rows"
  name=$(basename "$patch" .patch)
  echo "── $name"
  ok=1
  head=$(sed '/^diff --git /,$d' "$patch")
  declared=$(sed -n 's/^Mutant: *//p' <<<"$head" | head -n 1)
  mapfile -t caught_by < <(sed -n 's/^Caught-by: *//p' <<<"$head")
  if [ "$declared" != "$name" ] || ! grep -q '^Breaks: .' <<<"$head" || [ ${#caught_by[@]} -eq 0 ]; then
    row "$name" "-" "no" - - "bad header: needs 'Mutant: $name', 'Breaks: ...', 'Caught-by: <binary> <suite>/<test>'"
    echo fail >"$out.status"
    return
  fi
  # every Caught-by is "<binary> <suite>/<test>"
  bins=()
  for c in "${caught_by[@]}"; do
    read -r b t rest <<<"$c"
    if [ -z "$b" ] || [[ "$t" != */* ]] || [ -n "${rest:-}" ]; then
      row "$name" "$c" "no" - - "bad Caught-by line: want '<binary> <suite>/<test>'"
      ok=0
    else
      bins+=("$b")
    fi
  done
  if [ $ok = 0 ]; then echo fail >"$out.status"; return; fi

  if ! (cd "$scratch" && git apply --check "$patch" 2>"$log"); then
    files=$(grep -E '^diff --git ' "$patch" | awk '{ sub(/^b\//, "", $4); print $4 }' | paste -sd, -)
    row "$name" "-" "no" - - "mutant $name no longer applies to $files: $(head -n 1 "$log")"
    echo fail >"$out.status"
    return
  fi
  (cd "$scratch" && git apply "$patch")

  # build what the named tests need
  mapfile -t targets < <(for b in $(printf '%s\n' "${bins[@]}" | sort -u); do targets_of "$b"; done | sort -u)
  t0=$(date +%s.%N)
  if ! (cd "$scratch" && make -j"$jobs" BUILD="$build" "${targets[@]}" >"$log" 2>&1); then
    row "$name" "-" "no" "$(secs "$t0" "$(date +%s.%N)")" - "does not build: $(grep -m1 -E ': (fatal )?error:|\*\*\*' "$log")"
    (cd "$scratch" && git apply -R "$patch")
    echo fail >"$out.status"
    return
  fi
  t_build=$(secs "$t0" "$(date +%s.%N)")

  for c in "${caught_by[@]}"; do
    read -r b t <<<"$c"
    suite=${t%%/*}
    test=${t#*/}
    exe="$scratch/$build/tests/$b"
    # the named test exists (Criterion's --list: "suite: N tests" then "├── test" lines)
    if [ ! -x "$exe" ] || ! "$exe" --list 2>/dev/null | awk -v s="$suite" -v t="$test" '
          /^[^ ├└│]/ { cur = $1; sub(/:$/, "", cur); next }
          { n = $NF } cur == s && n == t { found = 1 } END { exit !found }'; then
      row "$name" "$b $t" "no" "$t_build" - "no such test: $b has no $suite/$test"
      ok=0
      continue
    fi
    t0=$(date +%s.%N)
    (cd "$scratch" && LAB_BUILD="$build" timeout -k 10 "$test_timeout" "./$build/tests/$b" -j1 \
       --filter "$suite/$test" >"$log" 2>&1)
    rc=$?
    t_test=$(secs "$t0" "$(date +%s.%N)")
    sed -i 's/\x1b\[[0-9;]*m//g' "$log"
    synth=$(grep -E 'Synthesis: Tested: [0-9]+' "$log" | tail -n 1)
    failing=$(sed -nE 's/.*Failing: ([0-9]+).*/\1/p' <<<"$synth")
    crashing=$(sed -nE 's/.*Crashing: ([0-9]+).*/\1/p' <<<"$synth")
    if [ -n "$synth" ] && [ "$rc" -ne 0 ] && [ $((${failing:-0} + ${crashing:-0})) -gt 0 ]; then
      row "$name" "$b $t" "yes" "$t_build" "$t_test" "$(failure_line "$log")"
    elif [ -z "$synth" ]; then
      row "$name" "$b $t" "no" "$t_build" "$t_test" "no Criterion summary (exit $rc): $(tail -n 1 "$log")"
      ok=0
    else
      row "$name" "$b $t" "no" "$t_build" "$t_test" "SURVIVED: the test passed with the mutant applied"
      ok=0
    fi
    t_build=0.0  # built once per mutant
  done
  if ! (cd "$scratch" && git apply -R "$patch" 2>"$log"); then
    echo "mutants.sh: cannot revert $name in the scratch copy: $(head -n 1 "$log")" >&2
    echo fatal >"$out.status"
    return
  fi
  if [ $ok = 1 ]; then echo pass >"$out.status"; else echo fail >"$out.status"; fi
}

# The workers: worker w takes mutants w, w + W, w + 2W, ... in its own scratch copy.
t_all=$(date +%s.%N)
for w in $(seq 0 $((workers - 1))); do
  (
    i=$w
    while [ "$i" -lt ${#patches[@]} ]; do
      run_mutant "${patches[$i]}" "$tmp/m$i" "$tmp/w$w"
      [ "$(cat "$tmp/m$i.status")" = fatal ] && break
      i=$((i + workers))
    done
  ) &
done
wait
npass=0
nfail=0
rows=()
for i in "${!patches[@]}"; do
  st=$(cat "$tmp/m$i.status" 2>/dev/null || echo fail)
  if [ "$st" = pass ]; then npass=$((npass + 1)); else nfail=$((nfail + 1)); fi
  if [ -s "$tmp/m$i.rows" ]; then
    mapfile -t -O ${#rows[@]} rows <"$tmp/m$i.rows"
  else
    rows+=("$(printf '%-34s %-56s %-6s %7s %7s  %s' "$(basename "${patches[$i]}" .patch)" - no - - "not run (a worker stopped)")")
  fi
done

echo
printf '%-34s %-56s %-6s %7s %7s  %s\n' "mutant" "caught by (binary suite/test)" "caught" "build s" "test s" "the test's failure line"
printf '%s\n' "${rows[@]}"
echo
echo "mutants: ${#patches[@]} in $(secs "$t_all" "$(date +%s.%N)") s"
echo "$npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
