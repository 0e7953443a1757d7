"""Memory of a backlog published to a running gateway, and after it drains (issue 15, target 3).

bench_restart measures a backlog across restarts; this one never restarts: it starts a
gateway (as bench_restart does, a new data dir), reads its idle RSS, publishes --count
persistent messages of --size bytes to a durable queue (gateway.perf.backlog's publisher,
confirms), reads the RSS (bytes per retained message over idle), drains the queue with one
consumer (prefetch 1000, an ack per 100) and reads the RSS after the drain and 2 s later,
against the idle RSS. The peak RSS of each phase is sampled every 50 ms (a compaction
that runs meanwhile maps the segment files it copies, and mapped pages count in RSS).

    .venv/bin/python scripts/bench_live_backlog.py [--count 200000] [--size 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_compare import _stop  # noqa: E402
from bench_restart import _drain, _free_port, _start_gateway  # noqa: E402

from gateway.perf.backlog import _publish, broker_rss  # noqa: E402


class _Peak:
    """The highest RSS of ``pid`` seen since the last ``take`` (a thread polls it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.peak = max(self.peak, broker_rss(self.pid, False) or 0)
            except OSError:
                return

    def take(self) -> float:
        peak, self.peak = self.peak, 0
        return peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    port = _free_port()
    uri = f"amqp://guest:guest@127.0.0.1:{port}/"
    data_dir = tempfile.mkdtemp(prefix="bench-live-backlog-")
    try:
        gw = _start_gateway(port, data_dir, ["--metrics-port", "0"])
        try:
            time.sleep(1.0)
            idle = broker_rss(gw.pid, False) or 0
            peak = _Peak(gw.pid)
            t0 = time.monotonic()
            asyncio.run(_publish(uri, "perf-live-backlog", args.count, args.size))
            secs = time.monotonic() - t0
            time.sleep(1.0)
            full = broker_rss(gw.pid, False) or 0
            print(f"published {args.count:,} x {args.size} B persistent in {secs:.1f} s; idle RSS "
                  f"{idle / 2**20:.1f} MiB, after publishing {full / 2**20:.1f} MiB: "
                  f"{(full - idle) / args.count:.0f} B per retained message; peak {peak.take():.1f} MiB")
            secs = asyncio.run(_drain(uri, "perf-live-backlog", args.count))
            after = broker_rss(gw.pid, False) or 0
            drain_peak = peak.take()
            time.sleep(2.0)
            later = broker_rss(gw.pid, False) or 0
            time.sleep(8.0)
            last = broker_rss(gw.pid, False) or 0
            print(f"drained in {secs:.1f} s; RSS after drain {after / 2**20:.1f} MiB, 2 s later "
                  f"{later / 2**20:.1f} MiB = {later / idle:.2f}x idle, 10 s later {last / 2**20:.1f} MiB = "
                  f"{last / idle:.2f}x; peak while draining {drain_peak:.1f} MiB")
            peak.stop.set()
        finally:
            _stop(gw)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
