"""Latency of the management API and of a /metrics scrape with many queues (issue 12, item 9).

    .venv/bin/python scripts/bench_management.py [--queues 1000] [--requests 300]

Starts `cmq-gateway serve` (loopback, free ports, a new data dir, audit on as `serve` has it),
declares --queues queues with one message each over AMQP, then times --requests sequential
requests per endpoint over one keep-alive HTTP connection (after 20 unmeasured ones) and
prints p50 and p99 in milliseconds. ``/api/queues`` lists every queue, so it grows with
--queues by nature; the other calls should not.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
import requests

ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
OPERATOR = re.compile(r"(management API|metrics) on http://127\.0\.0\.1:(\d+)/")

ENDPOINTS = [
    ("management", "/api/whoami"),
    ("management", "/api/overview"),
    ("management", "/api/vhosts"),
    ("management", "/api/queues/%2F/bench-0"),
    ("management", "/api/cmq/queues/%2F/bench-0"),
    ("metrics", "/metrics"),
    ("management", "/api/queues"),
]


def start(data_dir: str, root: Path) -> tuple[subprocess.Popen[str], int, dict[str, int]]:
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--management-port", "0", "--metrics-port", "0", "--cmq-api-port", "off",
                             "--mqtt-port", "off", "--data-dir", data_dir],
                            cwd=root, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    port, operator = None, {}
    for line in proc.stderr:
        if m := LISTENING.search(line):
            port = int(m.group(1))
        elif m := OPERATOR.search(line):
            operator["management" if m.group(1) == "management API" else "metrics"] = int(m.group(2))
        if port is not None and len(operator) == 2:
            break
    if port is None or len(operator) != 2:
        proc.kill()
        raise SystemExit("the gateway did not start")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, port, operator


def declare(port: int, queues: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
    ch = conn.channel()
    for i in range(queues):
        ch.queue_declare(f"bench-{i}")
        ch.basic_publish("", f"bench-{i}", b"x")
    conn.close()


def measure(session: requests.Session, url: str, n: int) -> tuple[float, float]:
    for _ in range(20):
        session.get(url, timeout=60).raise_for_status()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        session.get(url, timeout=60).raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    p99 = statistics.quantiles(times, n=100)[98]
    return statistics.median(times), p99


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the checkout whose gateway runs (default: this one; another commit's to compare)")
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="bench-management-")
    proc, port, operator = start(data_dir, args.root)
    try:
        declare(port, args.queues)
        session = requests.Session()
        session.auth = ("guest", "guest")
        print(f"{args.queues} queues, {args.requests} requests per endpoint, one keep-alive connection")
        print(f"{'endpoint':<32} {'p50 ms':>8} {'p99 ms':>8}")
        for which, path in ENDPOINTS:
            p50, p99 = measure(session, f"http://127.0.0.1:{operator[which]}{path}", args.requests)
            print(f"{path:<32} {p50:>8.2f} {p99:>8.2f}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
