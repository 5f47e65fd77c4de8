# shellcheck shell=bash
# bench_lib.sh: what every tools/bench_*.sh shares. Sourced, not run:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
#   bench_init NAME HELP_LINES     e.g. bench_init bench_zero 3,14 (the header lines --help shows)
#   ... the script's own option loop, ending in  -h|--help) bench_help ;;  *) bench_bad_option "$1" ;;
#   bench_build CHAPTER...         builds what it runs (or says how to see why it failed)
#   "${MPIRUN[@]}" -np N PROGRAM   the lab's mpirun: oversubscribed, unbound, shared-memory
#                                  transport, waiting ranks yield their core
#
# The machines here are shared and noisy: each script prints ratios of runs it made one after
# the other (best of K alternating rounds), never absolute speeds as a verdict.
# Env: BUILD (build dir for make, default build), MPIRUN_EXTRA (more mpirun flags).

bench_init() {
    BENCH_NAME=$1
    BENCH_HELP=$2
    BENCH_SCRIPT=${BASH_SOURCE[1]}
    cd "$(dirname "$BENCH_SCRIPT")/.." || exit 2
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
    # shellcheck disable=SC2206,SC2054  # MPIRUN_EXTRA splits into words; "self,vader" is one
    MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1
            ${MPIRUN_EXTRA:-})
}

bench_help() {
    sed -n "${BENCH_HELP}p" "$BENCH_SCRIPT" | sed 's/^# \{0,1\}//'
    exit 0
}

bench_bad_option() {
    echo "$BENCH_NAME: unknown option $1 (see --help)" >&2
    exit 2
}

bench_build() {
    make --no-print-directory BUILD="${BUILD:-build}" "$@" >/dev/null || {
        echo "$BENCH_NAME: build failed (run make $* to see why)" >&2
        exit 1
    }
}
