"""The store alone, the way a restarted backlog uses it (issue 15, target 3a): open a store
of --count message records (keys as the broker makes them, values left on disk) from its
checkpoint, close it after one write (a new checkpoint), reopen it, publish --publish new
records while the backlog is there (put, a sync per 1000), then drain the backlog (get +
delete of every key in order, a sync per 1000). Prints the open's seconds and RSS over the
interpreter's, the close's seconds, and the CPU microseconds per published and per drained
record.

Run it from two trees on one built directory for an A/B (each run works on a copy):

    PYTHONPATH=TREE .venv/bin/python scripts/bench_store_tiers.py --dir DIR [--count 1000000]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time

from semantics.store import Store

STEM = "m/%2F/perf-q/msg-0123456789ab"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build(directory: str, count: int, size: int) -> None:
    value = os.urandom(size)
    with Store.open(directory, fsync=False) as s:
        s.put("q/%2F/perf-q", b"queue")
        for i in range(count):
            s.put(f"{STEM}{i:016x}", value)
            if i % 1000 == 999:
                s.sync()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="the built store (made if absent)")
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--publish", type=int, default=200_000)
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        build(args.dir, args.count, args.size)
    work = tempfile.mkdtemp(prefix="bench-tiers-")
    try:
        shutil.copytree(args.dir, work, dirs_exist_ok=True)
        gc.collect()
        base = _rss()
        t0 = time.perf_counter()
        s = Store.open(work, fsync=False)
        opened = time.perf_counter() - t0
        gc.collect()
        rss = _rss() - base
        n = len(s)
        s.put("q/%2F/other", b"queue")  # one write: the close writes a new checkpoint
        s.sync()
        t0 = time.perf_counter()
        s.close()
        closed = time.perf_counter() - t0
        s = Store.open(work, fsync=False)
        value = os.urandom(args.size)
        c0 = time.process_time()
        for i in range(args.publish):  # while the restored backlog is there
            s.put(f"m/%2F/perf-q/msg-ba9876543210{i:016x}", value)
            if i % 1000 == 999:
                s.sync()
        s.sync()
        publish = time.process_time() - c0
        keys = (f"{STEM}{i:016x}" for i in range(args.count))
        c0 = time.process_time()
        for i, key in enumerate(keys):
            s.get(key)
            s.delete(key)
            if i % 1000 == 999:
                s.sync()
        s.sync()
        drain = time.process_time() - c0
        s.close()
        tree = os.environ.get("PYTHONPATH", "")
        print(f"{tree}: open {opened:.2f} s, close {closed:.2f} s, "
              f"RSS {rss / n:.0f} B per record over {n:,}; drain {drain / args.count * 1e6:.2f} us, "
              f"publish {publish / args.publish * 1e6:.2f} us CPU per record")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
