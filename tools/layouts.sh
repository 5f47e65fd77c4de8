#!/usr/bin/env bash
# layouts.sh: every training chapter on every layout it offers today, fp32 and bf16, writing
# each run's --dump (losses, final weights, byte and memory figures) and --save checkpoint into
# one folder; and a save-at-step-2-then-resume pass for each. The proof of a refactor: record
# with the old binaries, record with the new ones, compare bit for bit.
#
#   bash tools/layouts.sh record DIR [FILTER]   run the layouts (names matching FILTER, a regex)
#   bash tools/layouts.sh compare OLD NEW       every dump and checkpoint of OLD against NEW
#   bash tools/layouts.sh list                  the layouts, one per line
#
# Uses the binaries in <chapter>/run as they are (build first). Timings (the pipeline's
# measured bubbles, bottleneck and imbalance, 03's overlap) are left out of the comparison; everything else,
# losses and weights as raw float bits, checkpoints byte for byte, must be identical.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1)
STEPS=4

# name | ranks | chapter | flags   (each is run in fp32 and in bf16)
LAYOUTS=(
  "00|1|00_memory_budget|--train"
  "02_np1|1|02_data_parallel|"
  "02_np3|3|02_data_parallel|--batch 12"
  "03_np2|2|03_ddp|"
  "03_np3|3|03_ddp|--batch 12 --bucket-mb 0"
  "03_np4_accum|4|03_ddp|--grad-accum 2 --batch 16"
  "03_np2_nooverlap|2|03_ddp|--no-overlap"
  "05_z0|2|05_zero|--zero 0"
  "05_z1|2|05_zero|--zero 1"
  "05_z2|2|05_zero|--zero 2"
  "05_z2_small|4|05_zero|--zero 2 --bucket-kb 16"
  "05_z3|2|05_zero|--zero 3"
  "05_z3_np3|3|05_zero|--zero 3 --batch 18"
  "05_z1_np3|3|05_zero|--zero 1 --batch 18"
  "06_np2|2|06_fsdp|"
  "06_np3|3|06_fsdp|--batch 18"
  "06_accum|2|06_fsdp|--grad-accum 2"
  "06_nosync|2|06_fsdp|--grad-accum 2 --no-sync"
  "06_keep|2|06_fsdp|--reshard-after-forward 0 --prefetch 0"
  "06_hsdp|4|06_fsdp|--shard-group 2"
  "07_tp1|1|07_tensor_parallel|--tp 1"
  "07_tp2|2|07_tensor_parallel|--tp 2"
  "07_tp4|4|07_tensor_parallel|--tp 4"
  "07_tp2_sp|2|07_tensor_parallel|--tp 2 --sequence-parallel"
  "07_tp4_sp|4|07_tensor_parallel|--tp 4 --sequence-parallel"
  "07_tp2_v251|2|07_tensor_parallel|--tp 2 --vocab 251"
  "07_dp2_tp2|4|07_tensor_parallel|--tp 2"
  "08_gpipe|2|08_pipeline|--schedule gpipe"
  "08_1f1b|2|08_pipeline|--schedule 1f1b"
  "08_1f1b_np4|4|08_pipeline|--schedule 1f1b --micro-batches 8"
  "08_zb|2|08_pipeline|--schedule zb"
  "08_zb_cap|2|08_pipeline|--schedule zb --micro-batches 8 --max-w-stores 1"
  "08_inter|2|08_pipeline|--schedule interleaved --chunks 2"
  "08_inter_np1|1|08_pipeline|--schedule interleaved --chunks 2"
  "09_1x1x1|1|09_3d|"
  "09_2x2x2|8|09_3d|--tp 2 --pp 2"
  "09_1x2x2_inter|4|09_3d|--tp 2 --pp 2 --schedule interleaved --chunks 2"
  "09_2x1x2_gpipe_z1|4|09_3d|--pp 2 --schedule gpipe --zero 1"
  "09_2x2x1_z1|4|09_3d|--tp 2 --zero 1"
  "09_2x2x2_z1|8|09_3d|--tp 2 --pp 2 --zero 1"
  "09_2x2x2_z2|8|09_3d|--tp 2 --pp 2 --zero 2"
  "09_3x1x2_z2|6|09_3d|--dp 3 --pp 2 --zero 2 --batch 24"
  "09_3x2x1_z2|6|09_3d|--dp 3 --tp 2 --zero 2 --batch 24"
)

run() {  # ranks chapter out-prefix flags...
  local np=$1 ch=$2 out=$3; shift 3
  "${MPIRUN[@]}" -np "$np" "./$ch/run" --quiet --steps "$STEPS" "$@" >"$out.log" 2>&1
}

record() {
  local dir=$1 filter=${2:-.} fails=0 n=0
  mkdir -p "$dir"
  for row in "${LAYOUTS[@]}"; do
    IFS='|' read -r name np ch flags <<<"$row"
    for dt in fp32 bf16; do
      local id="${name}_$dt"
      [[ "$id" =~ $filter ]] || continue
      n=$((n + 1))
      # shellcheck disable=SC2086
      if ! run "$np" "$ch" "$dir/$id" $flags --dtype "$dt" --dump "$dir/$id.dump" --save "$dir/$id.ckpt" ||
         ! run "$np" "$ch" "$dir/$id.k2" $flags --dtype "$dt" --stop-at 2 --save "$dir/$id.k2.ckpt" ||
         ! run "$np" "$ch" "$dir/$id.resumed" $flags --dtype "$dt" --resume "$dir/$id.k2.ckpt" \
               --dump "$dir/$id.resumed.dump"; then
        echo "FAILED $id (see $dir/$id*.log)"; fails=$((fails + 1))
      else
        echo "ok     $id"
      fi
    done
  done
  echo "$((n - fails)) passed, $fails failed"
  [ "$fails" -eq 0 ]
}

compare() {
  local old=$1 new=$2 bad=0 n=0
  python3 tools/dump_compare.py --dirs "$old" "$new" --ignore bottleneck --ignore 'bubble_bottleneck*' \
    --ignore 'bubble_r*' --ignore 'bubble_sim_r*' --ignore 'imbalance*' --ignore overlap_pct || bad=1
  for f in "$old"/*.ckpt; do
    n=$((n + 1))
    if ! cmp -s "$f" "$new/$(basename "$f")"; then
      echo "checkpoint differs: $(basename "$f")"; bad=1
    fi
  done
  echo "checkpoints compared: $n"
  [ "$bad" -eq 0 ] && echo "IDENTICAL" || echo "DIFFERENT"
  [ "$bad" -eq 0 ]
}

case "${1:-}" in
  record) [ $# -ge 2 ] || { echo "usage: $0 record DIR [FILTER]" >&2; exit 2; }; record "$2" "${3:-.}" ;;
  compare) [ $# -eq 3 ] || { echo "usage: $0 compare OLD NEW" >&2; exit 2; }; compare "$2" "$3" ;;
  list) for row in "${LAYOUTS[@]}"; do echo "$row"; done ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
