#!/usr/bin/env bash
# drill.sh: a fire drill for the notes' 10.8 and 10.9 (`make drill`). A short run of chapter 09 on
# 4 ranks ((tp, pp) = (2, 2)) under a chaos schedule, kept alive by a small supervisor (this
# script) that restarts it from the last checkpoint after each failure:
#
#   attempt 1   rank 3 dies after step 12 (--kill-rank 3 --kill-step 12)      -> restart
#   attempt 2   a NaN in step 24's gradients (--on-nan skip), handled in the run;
#               rank 1 stops without dying at step 28 (--inject-hang 1:28);
#               the watchdog ends the job (--collective-timeout 5)           -> restart
#   attempt 3   from step 25: a corrupted batch at step 30 (--on-spike skip), handled in the
#               run, which ends at step 40
#
# Checkpoints every 5 steps (--async-save, --keep-last 2). It prints goodput (steps whose update
# landed / wall time, against a clean run's), the time each fault cost, the save stall and the
# restore times, and the Young/Daly interval sqrt(2 x save cost x MTBF) for what it measured, next
# to the notes' "every 30 minutes, restore < 5 minutes"; then it checks that the final weights
# equal, bit for bit, those of one uninterrupted run making the same skip decisions (--dump,
# tools/dump_compare.py). Exit status 0 when they do.
#
# Environment: NP_CMD (default "mpirun --oversubscribe --allow-run-as-root"), DRILL_DIR (scratch
# directory, default a new one under /tmp, removed at the end unless DRILL_KEEP=1).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
MPI=${NP_CMD:-mpirun --oversubscribe --allow-run-as-root}
dir=${DRILL_DIR:-$(mktemp -d /tmp/lab-drill-XXXXXX)}
mkdir -p "$dir"
[ "${DRILL_KEEP:-0}" = 1 ] || trap 'rm -rf "$dir"' EXIT
for b in 09_3d/run tools/dump_compare.py; do
  [ -e "$b" ] || { echo "drill: $b is missing (make 09_3d/run)" >&2; exit 2; }
done

STEPS=40
MODEL="--layers 2 --channels 32 --heads 2 --seq 16 --batch 8 --vocab 64"
RUN="./09_3d/run --tp 2 --pp 2 $MODEL --steps $STEPS --log-every 0"
# The spike at step 30 comes 5 steps after the last restart (from step 25), before a window
# started empty would hold the 5 losses a z-score needs: it is seen because the checkpoint holds
# the detector's window (rank 0's last 20 losses) and the counts (the NaN skip of attempt 2).
# With a vocabulary of 64 the corrupted batch's loss is about ln 64, 4.4 standard deviations
# above the window's mean: --spike-z 4 (the other steps stay below 0.1).
SKIPS="--on-nan skip --on-spike skip --spike-z 4 --inject-spike-step 30"
NAN="--inject-nan-step 24"  # (the attempts that reach step 24)
CKPT="--save $dir/ck --save-every 5 --keep-last 2 --async-save"
now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.${2:-2}f\", $1 }"; }

# the reference: one uninterrupted run with the same skip decisions
t0=$(now)
$MPI -np 4 $RUN $SKIPS $NAN --dump "$dir/ref.dump" >"$dir/ref.log" 2>&1 || {
  echo "drill: the reference run failed:" >&2; cat "$dir/ref.log" >&2; exit 1; }
t_ref=$(calc "$(now) - $t0" 3)
per_step=$(calc "$t_ref / $STEPS" 4)
echo "drill: chapter 09 on 4 ranks, (tp, pp) = (2, 2), $STEPS steps; a clean run takes $t_ref s (with start-up)"

# the supervised run
faults=("$NAN --kill-rank 3 --kill-step 12" "$NAN --inject-hang 1:28 --collective-timeout 5" "")
names=("rank 3 killed after step 12" "rank 1 hangs at step 28" "")
wall=0 restarts=0 start=0 lost_lines=() restore_lines=()
for i in 0 1 2; do
  resume=""
  [ -e "$dir/ck" ] && resume="--resume $dir/ck"
  extra=${faults[$i]}
  [ $i = 2 ] && extra="--dump $dir/drill.dump"
  t0=$(now)
  $MPI -np 4 $RUN $SKIPS $CKPT $resume $extra >"$dir/attempt$i.log" 2>&1
  rc=$?
  dt=$(calc "$(now) - $t0" 3)
  wall=$(calc "$wall + $dt" 3)
  r=$(grep -o "restored step [0-9]* from [^ ]* in [0-9]* ms" "$dir/attempt$i.log" | head -1)
  [ -n "$r" ] && restore_lines+=("attempt $((i + 1)): $r")
  if [ $i -lt 2 ]; then
    if [ $rc = 0 ]; then echo "drill: attempt $((i + 1)) should have failed (${names[$i]})" >&2; exit 1; fi
    ck=$(readlink "$dir/ck" | sed 's/.*\.step-//')
    kept=$((ck - start))
    lost=$(calc "$dt - $kept * $per_step" 2)
    lost_lines+=("${names[$i]}: the attempt ran $dt s, its checkpoint kept $kept steps (to step $ck): $lost s lost")
    restarts=$((restarts + 1))
    start=$ck
  elif [ $rc != 0 ]; then
    echo "drill: the last attempt failed:" >&2; cat "$dir/attempt$i.log" >&2; exit 1
  fi
done
lost_lines+=("a NaN at step 24 and a spike at step 30, skipped in the runs: one step's work each, about $per_step s")

useful=$((STEPS - 2))
good=$(calc "$useful / $wall" 2)
good_ref=$(calc "$useful / $t_ref" 2)
echo "drill: $restarts restarts, $wall s in all; goodput $good useful steps/s against $good_ref for the clean run ($(calc "100 * $t_ref / $wall" 0) %)"
for l in "${lost_lines[@]}"; do echo "  fault: $l"; done
for l in "${restore_lines[@]}"; do echo "  restore: $l"; done
line=$(grep "^checkpoints:" "$dir/attempt2.log")
echo "  save: ${line:-no save line}"
stall=$(echo "$line" | sed -n 's/.*blocked \([0-9.]*\) ms.*/\1/p')
whole=$(echo "$line" | sed -n 's/.*the whole save \([0-9.]*\) ms.*/\1/p')
mtbf=$(calc "$wall / ($restarts + 2)" 2)
if [ -n "$stall" ]; then
  yd=$(calc "sqrt(2 * $stall / 1000 * $mtbf)" 2)
  echo "  Young/Daly: a failure every $mtbf s here (4 faults in $wall s) and a stall of $stall ms per save (whole save $whole ms): checkpoint every sqrt(2 x $(calc "$stall / 1000" 3) x $mtbf) = $yd s"
fi
echo "  the notes: every 30 minutes, restore < 5 minutes. With this run's stall a 30-minute interval"
echo "  is right for a failure every $(calc "1800 * 1800 / (2 * ${stall:-1} / 1000) / 86400" 0) days; a day's MTBF wants every $(calc "sqrt(2 * ${stall:-1} / 1000 * 86400)" 0) s"

# the final weights against the uninterrupted run's
cmp_out=$(python3 tools/dump_compare.py --distance "$dir/drill.dump" "$dir/ref.dump")
echo "$cmp_out" | sed 's/^/  /'
n=$(echo "$cmp_out" | sed -n 's/.*weights: *\([0-9]*\) in both, \([0-9]*\) equal bit for bit.*/\1 \2/p')
nl=$(echo "$cmp_out" | sed -n 's/.*losses: *\([0-9]*\) steps in both, \([0-9]*\) equal bit for bit.*/\1 \2/p')
read -r nw sw <<<"$n"
read -r nls sls <<<"$nl"
if [ -n "${nw:-}" ] && [ "$nw" = "$sw" ] && [ "$nw" -gt 0 ] && [ "${nls:-0}" = "${sls:-x}" ]; then
  echo "drill: PASS: the final weights ($nw) and the last attempt's losses ($nls steps) equal the uninterrupted run's, bit for bit"
  exit 0
fi
echo "drill: FAIL: the final weights differ from the uninterrupted run's" >&2
exit 1
