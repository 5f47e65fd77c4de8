#!/usr/bin/env python3
"""dump_compare.py: compare two --dump files (common/results.h) bit for bit.

  tools/dump_compare.py OLD NEW [--ignore KEY ...]
  tools/dump_compare.py --dirs OLD_DIR NEW_DIR [--ignore KEY ...]   every *.dump of OLD_DIR

Losses and final parameters are compared as raw float32 bits; each named figure by value
(a key missing on one side is reported). --ignore leaves out figures that are timings
(KEY* leaves out every key that starts with KEY).
Exit status 0 when everything compared is identical, 1 otherwise, 2 on a bad file.
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


def main(argv):
    ignore = set()
    args = []
    it = iter(argv)
    for a in it:
        if a == "--ignore":
            ignore.add(next(it))
        else:
            args.append(a)
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
