#!/usr/bin/env bash
# plot.sh RUN.jsonl [OUT.png]: a picture of a run from its --log file (one JSON line per step,
# common/health.h): loss, grad norm (before clipping; the clipped steps marked), lr and
# tokens/s over the steps, four panels, as a PNG (default: RUN.png). Needs gnuplot (Debian:
# gnuplot-nox).
#
#   ./00_memory_budget/run --train --steps 200 --log run.jsonl && tools/plot.sh run.jsonl
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  echo "usage: $0 RUN.jsonl [OUT.png]   (RUN.jsonl: a run's --log FILE)" >&2
  exit 2
fi
in=$1
out=${2:-${in%.jsonl}.png}
[ "$out" = "$in" ] && out=$in.png
[ -r "$in" ] || { echo "error: $in: no such file (write it with a chapter's --log $in)" >&2; exit 1; }
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "error: gnuplot is not installed; on Debian/Ubuntu: sudo apt-get install gnuplot-nox" >&2
  exit 1
fi

# the top-level numbers of each line, as columns: step loss grad_norm clipped lr tokens_per_s
# (null, a step without a value, becomes NaN: gnuplot leaves it out)
dat=$(mktemp)
trap 'rm -f "$dat"' EXIT
awk '
function field(k,   v) {
  if (!match($0, "\"" k "\":[^,}]*")) return "NaN"
  v = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
  if (v == "null") return "NaN"
  if (v == "true") return 1
  if (v == "false") return 0
  return v
}
/^\{/ { print field("step"), field("loss"), field("grad_norm"), field("clipped"), field("lr"),
        field("tokens_per_s") }' "$in" > "$dat"
[ -s "$dat" ] || { echo "error: $in has no step lines" >&2; exit 1; }

gnuplot <<GP
set terminal pngcairo size 1200,800 font "sans,10"
set output "$out"
set multiplot layout 2,2 title "$(basename "$in")"
set grid
set xlabel "step"
set key top right
set title "loss"
plot "$dat" using 1:2 with lines lw 2 lc rgb "#1f77b4" notitle
set title "grad norm (before clipping)"
plot "$dat" using 1:3 with lines lw 2 lc rgb "#d62728" title "norm", \
     "$dat" using 1:(\$4 > 0 ? \$3 : NaN) with points pt 7 ps 0.5 lc rgb "#000000" title "clipped"
set title "learning rate"
set format y "%.1e"
plot "$dat" using 1:5 with lines lw 2 lc rgb "#2ca02c" notitle
set title "tokens/s"
set format y "%g"
plot "$dat" using 1:6 with lines lw 2 lc rgb "#9467bd" notitle
unset multiplot
GP
echo "wrote $out"
