#!/usr/bin/env bash
# make tour: run every chapter present, briefly, the way a newcomer first meets it.
set -uo pipefail
NP=${NP:-4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1)
bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
. "$(dirname "$0")/openblas_core.sh"
for ch in "$@"; do [ -x "$ch/run" ] && { lab_openblas_core "./$ch/run"; break; }; done
failed=0
for ch in "$@"; do
  [ -x "$ch/run" ] || continue
  # A chapter README says how the tour runs it, in two HTML comments (invisible when rendered):
  #   <!-- tour-np: 1 -->   <!-- tour-args: --train --steps 40 -->
  args=$(sed -n 's/^<!-- tour-args: *\(.*[^ ]\) *-->.*/\1/p' "$ch/README.md" 2>/dev/null | head -n 1)
  np=$(sed -n 's/^<!-- tour-np: *\([0-9]*\) *-->.*/\1/p' "$ch/README.md" 2>/dev/null | head -n 1)
  np=${np:-$NP}
  bold "── $ch ─────────────────────────────────────────────────────────────"
  echo "\$ mpirun -np $np ./$ch/run $args"
  # shellcheck disable=SC2086
  if ! timeout 300 "${MPIRUN[@]}" -np "$np" "./$ch/run" $args; then
    echo "!! $ch failed"; failed=1
  fi
done
bold "Tour done. Next: read a chapter's README.md, then 'make grade'."
exit $failed
