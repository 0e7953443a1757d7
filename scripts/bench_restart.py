"""Scenario 6's restart recovery for the gateway: how long `cmq-gateway serve` takes, from its
start, until a passive queue.declare shows every message of a backlog back.

It starts a gateway (`serve --host 127.0.0.1 --port 5699 --management-port off`, a new data dir,
the audit log and /metrics as `serve` has them by default), publishes --count persistent 1 KB
messages to a durable queue with gateway.perf.backlog's publisher (confirms), stops the gateway
(SIGTERM, a clean shutdown), starts it again on the same data dir and polls a passive
queue.declare every 50 ms until message_count reaches --count. Prints the time to the
"listening on" line and the time to the full count, both from the second process's start.

    .venv/bin/python scripts/bench_restart.py [--count 100000] [--size 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_compare import _start_gateway, _stop  # noqa: E402

from gateway.perf.backlog import _message_count, _publish  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--port", type=int, default=5699)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    uri = f"amqp://guest:guest@127.0.0.1:{args.port}/"
    queue = "perf-restart-backlog"
    data_dir = tempfile.mkdtemp(prefix="bench-restart-")
    try:
        gw = _start_gateway(args.port, data_dir, [])
        try:
            t0 = time.monotonic()
            asyncio.run(_publish(uri, queue, args.count, args.size))
            print(f"published {args.count:,} x {args.size} B persistent in {time.monotonic() - t0:.1f} s")
        finally:
            _stop(gw)
        t1 = time.monotonic()
        gw = _start_gateway(args.port, data_dir, [])  # returns at "listening on"
        listening = time.monotonic() - t1
        try:
            recovered = 0
            while time.monotonic() - t1 < args.timeout:
                try:
                    recovered = asyncio.run(_message_count(uri, queue))
                except Exception:
                    recovered = 0
                if recovered >= args.count:
                    break
                time.sleep(0.05)
            total = time.monotonic() - t1
            print(f"restart: listening after {listening:.2f} s, all {recovered:,} messages back after "
                  f"{total:.2f} s (from the start of `serve`)")
        finally:
            _stop(gw)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
