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
# The course in one picture: the same small GPT trained on English under 00 and five layouts,
# and the text each writes with the same seed (09_3d/README.md, "The same text from every layout")
all=1
for ch in 00_memory_budget 05_zero 06_fsdp 07_tensor_parallel 08_pipeline 09_3d; do
  [ -x "$ch/run" ] || all=0
done
if [ $all = 1 ]; then
  bold "── the same text from every layout ──────────────────────────────────"
  echo "\$ STEPS=150 bash tools/same_text.sh"
  STEPS=150 bash "$(dirname "$0")/same_text.sh" || { echo "!! same_text failed"; failed=1; }
fi
bold "Tour done. Next: read a chapter's README.md, then 'make grade'."
exit $failed
