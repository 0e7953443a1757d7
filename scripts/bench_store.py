"""Measure the durable store: committed records per second with fsync at several batch sizes,
and recovery time of a journal of many records (with and without a snapshot).

    .venv/bin/python scripts/bench_store.py [--dir DIR] [--records 1000000] [--value-bytes 100]

DIR should be on the file system the gateway will use (fsync cost is the whole story).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from semantics.store import Store  # noqa: E402


def commit_rate(directory: str, batch: int, value: bytes, seconds: float) -> tuple[float, float]:
    """(records/s, syncs/s) putting ``batch`` records then one sync(), for about ``seconds``."""
    shutil.rmtree(directory, ignore_errors=True)
    with Store.open(directory, compact_min_bytes=1 << 40) as s:
        n = syncs = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            for _ in range(batch):
                s.put(f"m/v/q/{n}", value)
                n += 1
            s.sync()
            syncs += 1
        elapsed = time.perf_counter() - started
    return n / elapsed, syncs / elapsed


def build_journal(directory: str, records: int, value: bytes, batch: int = 1000) -> int:
    shutil.rmtree(directory, ignore_errors=True)
    with Store.open(directory, fsync=False, compact_min_bytes=1 << 40) as s:
        for i in range(records):
            s.put(f"m/v/q/{i}", value)
            if i % batch == batch - 1:
                s.sync()
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


def recovery_time(directory: str) -> tuple[float, int]:
    with Store.open(directory) as s:
        return s.recovery.seconds, s.recovery.records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=2.0, help="per commit-rate measurement")
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench_store_")
    os.makedirs(base, exist_ok=True)
    directory = os.path.join(base, "store")
    value = os.urandom(args.value_bytes)
    print(f"dir={base} value={args.value_bytes} B")
    for batch in (1, 10, 100, 1000):
        rate, syncs = commit_rate(directory, batch, value, args.seconds)
        print(f"commit, fsync, batch {batch:>4}: {rate:>10,.0f} records/s  ({syncs:,.0f} syncs/s)")

    started = time.perf_counter()
    size = build_journal(directory, args.records, value)
    print(f"journal of {args.records:,} records: {size / 1e6:.1f} MB written in {time.perf_counter() - started:.1f} s")
    seconds, records = recovery_time(directory)
    print(f"recovery, journal only:   {seconds:.2f} s for {records:,} records")
    started = time.perf_counter()
    with Store.open(directory, compact_min_bytes=1 << 40) as s:
        s.maybe_compact(force=True)
    print(f"snapshot of {args.records:,} keys written in {time.perf_counter() - started:.2f} s (including the open)")
    seconds, records = recovery_time(directory)
    print(f"recovery, snapshot only:  {seconds:.2f} s for {records:,} records")
    if not args.dir:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
