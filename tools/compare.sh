#!/usr/bin/env bash
# compare.sh: does a run still train like one device? Its --dump against chapter 00's
# single-device run of the same model, data and training flags (the lab's oracle), as distances:
# the largest relative difference of a loss and the largest absolute difference of a final weight
# (tools/dump_compare.py --distance, measured as the tests measure them).
#
#   bash tools/compare.sh [--np N] CHAPTER [FLAGS...]   run CHAPTER on N ranks (default 2) with
#                                                       FLAGS and --dump, then 00 with the same
#                                                       shared flags; print the distances
#   bash tools/compare.sh FILE.dump [FLAGS...]          a dump you made, and the flags it ran with
#   make compare ARGS="--np 4 05_zero --zero 2"         the same through make (builds first)
#
# Of FLAGS, 00 gets the shared model, training and hardware flags (those 00's --help lists under
# model, training and hardware, but --backend) and --stop-at and --load-weights; a chapter's own
# flags (--zero 2, --tp 2, --schedule zb ...) and the output and checkpoint flags are left out.
# A resumed run compares on the steps it ran, and by its final weights. Exit status: 0 when the
# two were compared, 1 when a run failed or the dumps do not match in shape, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# shellcheck disable=SC2054  # "self,vader" is one argument
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1)

usage() { sed -n '2,17p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage

np=2
if [ "$1" = --np ]; then
    [ $# -ge 3 ] || usage
    np=$2; shift 2
fi
target=$1; shift
if [ ! -x ./00_memory_budget/run ]; then
    echo "compare: build first (make 00_memory_budget)" >&2; exit 1
fi

# The flags 00 takes from the run: its shared model/training/hardware groups (from its --help,
# so a shared flag added later is passed on too), --stop-at and --load-weights.
keep=" $(./00_memory_budget/run --help | awk '
    /^(model|training|hardware)$/ { on = 1; next }
    /^[a-z]+$/ { on = 0 }
    on && $1 ~ /^--/ && $1 != "--backend" { printf "%s ", $1 }')--stop-at --load-weights "
oracle=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[i]}
    name=${a%%=*}
    case "$a" in --*) ;; *) continue ;; esac  # a value: taken with its flag below
    has_value=0
    if [ "$name" = "$a" ] && [ $((i + 1)) -lt ${#args[@]} ] && [[ "${args[i + 1]}" != --* ]]; then
        has_value=1
    fi
    case "$keep" in
        *" $name "*) oracle+=("$a"); [ $has_value = 1 ] && oracle+=("${args[i + 1]}") ;;
    esac
    [ $has_value = 1 ] && i=$((i + 1))
done

tmp=$(mktemp -d /tmp/lab-compare-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if [ -f "$target" ]; then
    run_dump=$target
    what="$target"
else
    if [ ! -x "./$target/run" ]; then
        echo "compare: no ./$target/run (give a chapter directory, e.g. 05_zero, or a dump file)" >&2
        exit 2
    fi
    run_dump=$tmp/run.dump
    what="mpirun -np $np ./$target/run $*"
    if ! "${MPIRUN[@]}" -np "$np" "./$target/run" "$@" --quiet --dump "$run_dump" \
            >"$tmp/run.log" 2>&1; then
        echo "compare: the run failed:"; cat "$tmp/run.log"; exit 1
    fi
fi
if ! ./00_memory_budget/run --train "${oracle[@]}" --quiet --dump "$tmp/00.dump" \
        >"$tmp/00.log" 2>&1; then
    echo "compare: chapter 00's run failed:"; cat "$tmp/00.log"; exit 1
fi
echo "compare: $what"
echo "against: ./00_memory_budget/run --train ${oracle[*]} (one device, the lab's oracle)"
python3 tools/dump_compare.py --distance "$run_dump" "$tmp/00.dump" || exit 1
echo "  (0 and 0: bit for bit one device. Where the reduction order differs, the tests accept over"
echo "   their few steps at most 1e-6 relative on losses and 2e-4 absolute on weights in fp32, 2e-4"
echo "   and 8e-3 in bf16; a bug usually shows as far more, from the first steps on.)"
