"""A process that writes to a store until it is killed; run by test_store_crash.py.

    python store_crash_child.py DIR SEED [--compact-min BYTES] [--die-before N]

It prints, and flushes, one line per operation *before* syncing it (``P lsn key size`` or
``D lsn key``), then ``S lsn`` after each ``sync()`` returned (that LSN is confirmed), ``K``
before and ``k`` after a compaction. A value is a function of its LSN and size, so the parent
can tell an intact value from a mixed-up one.

``--die-before N`` makes the process ``os._exit`` just before the N-th file-system call
(fsync, replace, unlink) of its first compaction, as a crash at that step would.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from semantics.store import Store  # noqa: E402


def value_for(lsn: int, size: int) -> bytes:
    return (lsn.to_bytes(8, "little") * (size // 8 + 1))[:size]


def _die_before(n: int, compacting: list[bool]) -> None:
    calls = [0]

    def wrap(real):  # type: ignore[no-untyped-def]
        def fs_call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if compacting[0]:
                calls[0] += 1
                if calls[0] == n:
                    os._exit(86)
            return real(*args, **kwargs)
        return fs_call

    os.fsync = wrap(os.fsync)
    os.replace = wrap(os.replace)
    os.unlink = wrap(os.unlink)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("seed", type=int)
    parser.add_argument("--compact-min", type=int, default=256 << 10)
    parser.add_argument("--die-before", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    compacting = [False]
    if args.die_before:
        _die_before(args.die_before, compacting)
    out = sys.stdout
    store = Store.open(args.directory, compact_min_bytes=args.compact_min)
    keys = [f"m/v/q{i % 3}/{i}" for i in range(200)]
    while True:
        for _ in range(rng.randint(1, 20)):
            key = rng.choice(keys)
            if rng.random() < 0.2:
                out.write(f"D {store.delete(key)} {key}\n")
            else:
                size = rng.randint(20_000, 200_000) if rng.random() < 0.05 else rng.randint(0, 300)
                lsn = store.put(key, value_for(store.last_lsn + 1, size))
                out.write(f"P {lsn} {key} {size}\n")
        out.flush()  # every operation is known to the parent before it can reach the disk
        out.write(f"S {store.sync()}\n")
        out.flush()
        if store.compaction_due:
            out.write("K\n")
            out.flush()
            compacting[0] = True
            store.maybe_compact()
            compacting[0] = False
            out.write("k\n")
            out.flush()
            if args.die_before:  # the step number was past the end of the compaction
                os._exit(0)


if __name__ == "__main__":
    main()
