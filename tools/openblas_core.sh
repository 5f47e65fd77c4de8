# Sourced by the benchmark and tour scripts (never by the tests or CI, which keep the
# environment as the machine gives it).
#
# OpenBLAS picks its kernels from the CPU model. An old OpenBLAS on a newer CPU (or under a
# hypervisor) may not recognize it and fall back to its generic SSE3 "Prescott" kernels, 5-10x
# slower than the AVX-512/AVX2 ones the CPU can run. Then choose the right ones ourselves.
# Usage: lab_openblas_core <a program linked with OpenBLAS that accepts --help>
lab_openblas_core() {
  [ -z "${OPENBLAS_CORETYPE:-}" ] || return 0
  local core
  core=$(OPENBLAS_VERBOSE=2 "$1" --help 2>&1 >/dev/null | sed -n 's/^Core: *//p' | head -n 1)
  [ "$core" = "Prescott" ] || return 0
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
  fi
  if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    echo "note: OpenBLAS did not recognize this CPU (generic Prescott kernels); using OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
  fi
}
