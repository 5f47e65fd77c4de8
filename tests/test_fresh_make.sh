#!/usr/bin/env bash
# test_fresh_make.sh: the first `make` on a machine without Open MPI installs it BEFORE the
# Makefile asks mpicc for its flags (issue 12: the old Makefile read `mpicc -showme` while it
# was parsed, so the first `make test` installed the packages and then failed on mpi.h).
#
# A scripted fresh machine, no root needed, nothing really removed: a fake mpicc that knows no
# headers until a fake apt-get "installs" them, first on PATH. `make -n` then prints the compile
# lines it would run: they must carry Open MPI's include directory.
# Seen to catch: the old Makefile (flags computed before the install): the compile line has no
# -I.../openmpi/include.
set -euo pipefail
cd "$(dirname "$0")/.."
real_mpicc=$(command -v mpicc) || { echo "test_fresh_make: needs a real mpicc (run tools/deps.sh)"; exit 1; }
want=$("$real_mpicc" -showme:incdirs | awk '{print $1}')
fake=$(mktemp -d /tmp/lab-fresh-XXXXXX)
trap 'rm -rf "$fake"' EXIT
cat >"$fake/mpicc" <<FAKE
#!/bin/bash
[ -f "$fake/installed" ] && exec "$real_mpicc" "\$@"
exit 1
FAKE
cat >"$fake/apt-get" <<FAKE
#!/bin/bash
[ "\$1" = install ] && touch "$fake/installed"
exit 0
FAKE
# deps.sh installs with apt-get as root, with sudo otherwise: fake both
cat >"$fake/sudo" <<FAKE
#!/bin/bash
[ "\$1" = -n ] && [ "\$2" = true ] && exit 0
exec "\$@"
FAKE
chmod +x "$fake"/*
out=$(PATH="$fake:$PATH" make -n BUILD="$fake/build" CUDA=0 01_primitives 2>&1) || {
  echo "$out"; echo "FAIL: make -n on the scripted fresh machine failed"; exit 1; }
[ -f "$fake/installed" ] || { echo "$out"; echo "FAIL: make did not install the packages"; exit 1; }
line=$(grep -m1 -- '-c common/check.c' <<<"$out" || true)
if ! grep -q -- "-I$want" <<<"$line"; then
  echo "$out" | tail -n 5
  echo "FAIL: the first compile line has no -I$want: flags were computed before the install"
  exit 1
fi
echo "test_fresh_make: ok (installed first, then compiled with -I$want)"
