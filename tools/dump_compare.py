#!/usr/bin/env python3
"""dump_compare.py: compare two --dump files (common/results.h) bit for bit, or measure how far
one run is from another.

  tools/dump_compare.py OLD NEW [--ignore KEY ...]
  tools/dump_compare.py --dirs OLD_DIR NEW_DIR [--ignore KEY ...]   every *.dump of OLD_DIR
  tools/dump_compare.py --distance RUN REFERENCE                    how far RUN is from REFERENCE

Losses and final parameters are compared as raw float32 bits; each named figure by value
(a key missing on one side is reported). --ignore leaves out figures that are timings
(KEY* leaves out every key that starts with KEY).
--distance (tools/compare.sh): the largest relative difference of a loss, |run - ref| / |ref|
over the steps both ran (a step not run is NaN in a dump), and the largest absolute difference
of a final weight, as the tests measure them (tests/harness.c), with where they are and how
many are equal bit for bit.
Exit status 0 when everything compared is identical (--distance: when the two could be
compared), 1 otherwise, 2 on a bad file.
"""
import os
import struct
import sys
import zlib


def read_dump(path):
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < 12 or b[:8] != b"LABDUMP1":
        raise ValueError(f"{path}: not a LABDUMP1 file")
    if struct.unpack_from("<I", b, len(b) - 4)[0] != zlib.crc32(b[:-4]) & 0xFFFFFFFF:
        raise ValueError(f"{path}: CRC mismatch")
    at = 8
    (nsteps,) = struct.unpack_from("<i", b, at); at += 4
    losses = b[at:at + 4 * nsteps]; at += 4 * nsteps
    (nparams,) = struct.unpack_from("<Q", b, at); at += 8
    params = b[at:at + 4 * nparams]; at += 4 * nparams
    (nkv,) = struct.unpack_from("<i", b, at); at += 4
    kv = {}
    for _ in range(nkv):
        key = b[at:at + 48].split(b"\0", 1)[0].decode(); at += 48
        (val,) = struct.unpack_from("<d", b, at); at += 8
        kv[key] = val
    return nsteps, losses, nparams, params, kv


def first_diff(a, b):
    """index of the first differing float32, and the two values"""
    for i in range(0, min(len(a), len(b)), 4):
        if a[i:i + 4] != b[i:i + 4]:
            return i // 4, struct.unpack("<f", a[i:i + 4])[0], struct.unpack("<f", b[i:i + 4])[0]
    return None


def compare(old, new, ignore):
    o, n = read_dump(old), read_dump(new)
    problems = []
    for what, i in (("losses", 1), ("params", 3)):
        if o[i] != n[i]:
            d = first_diff(o[i], n[i])
            count = sum(o[i][j:j + 4] != n[i][j:j + 4] for j in range(0, min(len(o[i]), len(n[i])), 4))
            problems.append(f"{what}: {count} of {len(o[i]) // 4} differ (lengths {len(o[i])}, "
                            f"{len(n[i])})" + (f"; first [{d[0]}] {d[1]!r} vs {d[2]!r}" if d else ""))
    for k in sorted(set(o[4]) | set(n[4])):
        if k in ignore or any(k.startswith(x[:-1]) for x in ignore if x.endswith("*")):
            continue
        if k not in o[4] or k not in n[4]:
            problems.append(f"figure {k}: only in {'new' if k in n[4] else 'old'}")
        elif o[4][k] != n[4][k]:
            problems.append(f"figure {k}: {o[4][k]!r} vs {n[4][k]!r}")
    return o, problems


def floats(raw):
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def distance(run, ref):
    """prints the distances of run from ref; returns 0, or 1 when they cannot be compared"""
    r, f = read_dump(run), read_dump(ref)
    if r[0] != f[0] or r[2] != f[2]:
        print(f"cannot compare: {r[0]} steps and {r[2]} weights in {run}, {f[0]} and {f[2]} in "
              f"{ref} (another model, or another --steps)")
        return 1
    rl, fl, rw, fw = floats(r[1]), floats(f[1]), floats(r[3]), floats(f[3])
    steps = [s for s in range(r[0]) if rl[s] == rl[s] and fl[s] == fl[s]]  # both ran (not NaN)
    if not steps:
        print("cannot compare: no step ran in both")
        return 1
    rel = [abs(rl[s] - fl[s]) / max(abs(fl[s]), 1e-30) for s in steps]
    ws = max(range(len(steps)), key=lambda k: rel[k])
    same = sum(r[1][4 * s:4 * s + 4] == f[1][4 * s:4 * s + 4] for s in steps)
    s = steps[ws]
    print(f"  losses:  {len(steps)} steps in both, {same} equal bit for bit; largest relative "
          f"difference {rel[ws]:.3g}" + ("" if rel[ws] == 0 else
          f" at step {s + 1} ({rl[s]:.9g} against {fl[s]:.9g})"))
    absd = [abs(a - b) if a == a and b == b else float("inf") for a, b in zip(rw, fw)]
    wi = max(range(len(absd)), key=lambda i: absd[i]) if absd else 0
    same = sum(r[3][4 * i:4 * i + 4] == f[3][4 * i:4 * i + 4] for i in range(len(rw)))
    print(f"  weights: {len(rw)} in both, {same} equal bit for bit; largest absolute difference "
          f"{absd[wi] if absd else 0:.3g}" + ("" if not absd or absd[wi] == 0 else
          f" at weight {wi} ({rw[wi]:.9g} against {fw[wi]:.9g})"))
    return 0


def main(argv):
    ignore = set()
    args = []
    it = iter(argv)
    for a in it:
        if a == "--ignore":
            ignore.add(next(it))
        else:
            args.append(a)
    if len(args) == 3 and args[0] == "--distance":
        try:
            return distance(args[1], args[2])
        except (OSError, ValueError, struct.error) as e:
            print(f"cannot compare: {e}")
            return 2
    if len(args) == 3 and args[0] == "--dirs":
        pairs = [(os.path.join(args[1], f), os.path.join(args[2], f))
                 for f in sorted(os.listdir(args[1])) if f.endswith(".dump")]
    elif len(args) == 2:
        pairs = [tuple(args)]
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bad = 0
    for old, new in pairs:
        try:
            o, problems = compare(old, new, ignore)
        except (OSError, ValueError, struct.error) as e:
            print(f"{os.path.basename(old)}: cannot compare: {e}")
            bad = 2
            continue
        name = os.path.basename(new)
        if problems:
            bad = max(bad, 1)
            print(f"{name}: DIFFERENT")
            for p in problems:
                print(f"    {p}")
        else:
            print(f"{name}: identical ({o[0]} losses, {o[2]} parameters bit for bit, "
                  f"{len(o[4]) - len(ignore & set(o[4]))} figures)")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
