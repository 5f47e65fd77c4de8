#!/usr/bin/env bash
# deps.sh <debian packages...>: make sure the lab's build tools are installed.
#
# Checks for an MPI compiler (and its mpi.h) and launcher, Criterion, CBLAS from OpenBLAS, pkg-config
# and the fortune files the text corpus is built from (--data text: fortunes-min, fortunes).
# Quiet when all are present. Otherwise installs the given packages with apt-get (as root, or
# through passwordless sudo), or says what to run and fails.
set -uo pipefail

missing=()
if command -v mpicc >/dev/null 2>&1; then
  # mpicc can outlive the headers (openmpi-bin without libopenmpi-dev): look for mpi.h too
  mpi_h=0
  for d in $(mpicc -showme:incdirs 2>/dev/null); do [ -f "$d/mpi.h" ] && mpi_h=1; done
  [ $mpi_h = 1 ] || missing+=("mpi.h")
else
  missing+=("mpicc")
fi
command -v mpirun >/dev/null 2>&1 || missing+=("mpirun")
command -v pkg-config >/dev/null 2>&1 || missing+=("pkg-config")
[ -f /usr/include/criterion/criterion.h ] || missing+=("criterion/criterion.h")
# cblas.h from OpenBLAS: found through pkg-config, or where Debian puts it
cblas_found=0
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openblas 2>/dev/null; then
  for d in $(pkg-config --cflags-only-I openblas | sed 's/-I//g') /usr/include; do
    [ -f "$d/cblas.h" ] && cblas_found=1
  done
fi
[ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] && cblas_found=1
[ $cblas_found = 1 ] || missing+=("cblas.h (OpenBLAS)")
# the corpus (common/text.c): one file of each package
[ -f /usr/share/games/fortunes/literature ] || missing+=("fortunes-min")
[ -f /usr/share/games/fortunes/zippy ] || missing+=("fortunes")

[ ${#missing[@]} -eq 0 ] && exit 0

if [ $# -eq 0 ]; then
  echo "missing: ${missing[*]} (usage: tools/deps.sh <debian packages...>)" >&2
  exit 1
fi
install=(apt-get install -y "$@")
if [ "$(id -u)" = 0 ]; then
  echo "missing: ${missing[*]}; installing: $*" >&2
  apt-get update && DEBIAN_FRONTEND=noninteractive "${install[@]}" || exit 1
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  echo "missing: ${missing[*]}; installing with sudo: $*" >&2
  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive "${install[@]}" || exit 1
else
  echo "missing: ${missing[*]}; run: sudo apt-get install -y $*" >&2
  exit 1
fi
