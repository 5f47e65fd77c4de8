#!/usr/bin/env bash
# same_text.sh: the same text from every layout. Trains the same small GPT on the lab's corpus
# (--data text) under chapter 00 (one device) and under five layouts, then prints each layout's
# sample (the same seed), how many of its characters agree with 00's, and how far its final
# weights are from 00's (tools/dump_compare.py --distance).
#
#   bash tools/same_text.sh [EXTRA FLAGS...]      (build first: make 00_memory_budget 05_zero
#                                                  06_fsdp 07_tensor_parallel 08_pipeline 09_3d)
#   STEPS=100 bash tools/same_text.sh             shorter (the tour's; default 300 steps)
#
# Every sample is drawn on rank 0 from the whole model its layout gathered (common/text.h), so a
# difference in the text is a difference in the weights. A layout that adds in 00's order is bit
# exact and writes 00's text, character for character; one that sums in another order (ZeRO-3's
# and FSDP's reduce-scatter, TP's split matrix products) ends with weights ~1e-6 away, and once
# a draw falls on the other side of a boundary the two texts go their own ways (the sampler feeds
# each byte back in).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# shellcheck disable=SC2054  # "self,vader" is one argument
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1)
FLAGS=(--layers 2 --channels 64 --heads 4 --seq 64 --batch 16 --data text --steps "${STEPS:-300}" --lr 3e-3
       --sample 160 --temperature 0.7 --sample-seed 7 --val-every "${STEPS:-300}" --log-every 0 "$@")
for ch in 00_memory_budget 05_zero 06_fsdp 07_tensor_parallel 08_pipeline 09_3d; do
    [ -x "$ch/run" ] || { echo "same_text: build first (make $ch)" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/lab-same-text.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# name | ranks | program and its own flags
LAYOUTS=(
    "00 one device|1|./00_memory_budget/run --train"
    "09 (2,2,2) --zero 1|8|./09_3d/run --tp 2 --pp 2 --zero 1"
    "05 --zero 3|2|./05_zero/run --zero 3"
    "06 FSDP|2|./06_fsdp/run"
    "07 --tp 2|2|./07_tensor_parallel/run --tp 2"
    "08 --schedule zb|2|./08_pipeline/run --schedule zb"
)

# the sample of a run's output: the lines between the rules text_print_sample writes
sample_of() { awk '/^----- sample -----$/ {on = 1; next} /^----- end of sample -----$/ {on = 0} on' "$1"; }

failed=0
for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r name np cmd <<<"${LAYOUTS[$i]}"
    out=$dir/$i.out
    # shellcheck disable=SC2086  # cmd is a program and its flags
    if ! timeout 600 "${MPIRUN[@]}" -np "$np" $cmd "${FLAGS[@]}" --dump "$dir/$i.dump" >"$out" 2>&1; then
        echo "!! $name failed:"; tail -5 "$out"; failed=1; continue
    fi
    sample_of "$out" >"$dir/$i.txt"
    printf '\n\033[1m── %s ──\033[0m  %s\n' "$name" "$(grep '^sample:' "$out" | sed 's/^sample: //')"
    grep '^val ' "$out" | tail -n 1 | sed 's/^val  */   validation loss after step /'
    cat "$dir/$i.txt"
    [ "$i" = 0 ] && continue
    python3 - "$dir/0.txt" "$dir/$i.txt" <<'PY'
import sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
same = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
agree = sum(x == y for x, y in zip(a, b))
if a == b:
    print(f"   = 00's text, all {len(a)} characters (bit-exact weights draw the same bytes)")
else:
    print(f"   agrees with 00's text on its first {same} characters ({agree} of {len(a)} in place):"
          " the weights differ by reduction order (below), and from the first byte drawn"
          " otherwise the two texts continue from different contexts")
PY
    python3 tools/dump_compare.py --distance "$dir/$i.dump" "$dir/0.dump" | sed 's/^/   /'
done
exit $failed
