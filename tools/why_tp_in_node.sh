#!/usr/bin/env bash
# Question 5 as an experiment: why does TP stay inside a node?
#
# The same model and the same TP 4 x PP 2 layout on 8 ranks in 2 virtual nodes of 4 (--links:
# the dist layer holds every message for its alpha-beta time on the link it crosses,
# docs/CLUSTER.md), with the ranks in two orders (09's --grid-order):
#   tp-first  each TP group is one node's 4 ranks; the 2 pipeline stages talk across the nodes
#   pp-first  each TP group spans both nodes; each pipeline pair sits inside one node
# The losses are the same bits; only the time differs. Prints each run's measured step time, its
# split (link time per dimension, what dist held, next to the planner's model of the same bytes
# on the same links), and the answer. Extra arguments go to both runs (e.g. --steps 8).
#
#   bash tools/why_tp_in_node.sh                 (needs ./09_3d/run: make 09_3d/run)
#   LINKS=4:450,2:50,5 bash tools/why_tp_in_node.sh   the H100 cluster's own numbers
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=./09_3d/run
[ -x "$RUN" ] || { echo "error: $RUN is missing: run 'make 09_3d/run'" >&2; exit 1; }
# slow links, so that communication stands well above the noise of 8 ranks sharing a few cores:
# inside a node 0.05 GB/s and 0.5 ms, between nodes 5 MB/s and 5 ms (the same 10x gap as
# NVLink against InfiniBand)
LINKS=${LINKS:-4:0.05,500:0.005,5000}
MODEL="--layers 2 --channels 32 --heads 4 --seq 16 --batch 8 --micro-batches 2 --steps 3"
export OPENBLAS_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for order in tp-first pp-first; do
    mpirun --oversubscribe --allow-run-as-root -np 8 "$RUN" $MODEL --tp 4 --pp 2 \
        --grid-order "$order" --links "$LINKS" "$@" > "$out/$order.txt" 2>&1 ||
        { cat "$out/$order.txt" >&2; echo "error: the $order run failed" >&2; exit 1; }
done

# fields of the run's "link time per step" block
field() {  # field FILE DIM held|model|planner|link
    awk -v dim="$2" -v what="$3" '
        $1 == dim && $3 ~ /^rank/ {
            link = ($4 == "-") ? "-" : ($4 == "between") ? "between" : "inside"
            for (i = 1; i <= NF; i++) if ($i == what) v = $(i + 1)
            print (what == "link") ? link : v
        }' "$1"
}
step_ms() { awk '$1 == "step" && $3 == "ms" && $4 == "measured" { print $2 }' "$1"; }
planner_ms() { awk '/the planner.s communication/ { for (i = 1; i <= NF; i++) if ($i == "communication") print $(i + 1) }' "$1"; }

echo "Question 5: why TP inside a node? 09_3d, TP 4 x PP 2 on 2 virtual nodes of 4 ranks"
grep -m1 "^virtual cluster" "$out/tp-first.txt"
echo
printf "  %-9s %-22s %9s %11s %11s %13s %13s %13s\n" "order" "TP / PP links" "step ms" \
    "TP held ms" "PP held ms" "planner TP" "planner PP" "planner comm"
for order in tp-first pp-first; do
    f="$out/$order.txt"
    printf "  %-9s %-22s %9s %11s %11s %13s %13s %13s\n" "$order" \
        "TP $(field "$f" TP link), PP $(field "$f" PP link)" "$(step_ms "$f")" \
        "$(field "$f" TP held)" "$(field "$f" PP held)" "$(field "$f" TP planner)" \
        "$(field "$f" PP planner)" "$(planner_ms "$f")"
done
echo "  (held: the link time dist held the busiest rank for, per step; planner: chapter 00's"
echo "   alpha-beta estimate for the same layout and links, TP and PP paid once per 1F1B slot)"
a=$(step_ms "$out/tp-first.txt"); b=$(step_ms "$out/pp-first.txt")
pa=$(planner_ms "$out/tp-first.txt"); pb=$(planner_ms "$out/pp-first.txt")
echo
awk -v a="$a" -v b="$b" -v pa="$pa" -v pb="$pb" 'BEGIN {
    printf "  measured: %.1f ms per step with TP across the nodes, %.1f ms with TP inside: x%.2f, "\
"+%.1f ms (the compute is the same)\n", b, a, b / a, b - a
    printf "  planner:  +%.1f ms of communication per step (%.1f against %.1f ms)\n", pb - pa, pb, pa
    # the compute is the same in both orders, so the planner predicts the step with TP across as
    # the measured step with TP inside plus its extra communication
    r = (a + pb - pa) / a
    printf "  ratio:    the planner predicts x%.2f ((%.1f + %.1f) / %.1f), measured x%.2f: %+.1f %%\n",
        r, a, pb - pa, a, b / a, 100 * (b / a) / r - 100
    printf "\nAnswer: TP all-reduces activations several times in every layer of every micro-batch "\
"while PP sends one activation per stage boundary, so TP has far more bytes and hops to pay on "\
"whatever link its group crosses: across the slow link between nodes they cost %.0f ms more per "\
"step here (the planner: %.0f ms), which is why TP stays inside the node and PP crosses nodes.\n",
        b - a, pb - pa
}'
