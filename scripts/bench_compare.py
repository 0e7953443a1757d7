"""One command for the RabbitMQ comparison table of docs/BENCHMARKS.md.

    .venv/bin/python scripts/bench_compare.py [--duration 10] [--backlog 100000] [--repeat 3] [--out FILE]

For each scenario of `cmq-gateway perf compare` it starts a fresh gateway (`cmq-gateway serve
--host 127.0.0.1 --port 5699`, a new data dir, management API off because RabbitMQ's
management plugin holds 15672 on the bench machine; audit and metrics as `serve` defaults),
runs the scenario against the RabbitMQ on 127.0.0.1:5672 and the gateway back to back
(`--rabbitmqctl-a` and `--broker-pid-b` for scenario 6's memory), stops the gateway, and
writes one Markdown table with the ratios. A fresh gateway per scenario keeps one scenario's
backlog (or its heap) out of the next one's figures.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from gateway.perf.client import parse_uri

__all__ = ["main"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def _drain(proc: subprocess.Popen[bytes], lines: list[bytes]) -> threading.Thread:
    """Keep reading the gateway's log (a full pipe would stall it) into ``lines``."""
    assert proc.stderr is not None
    t = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, b"")),  # type: ignore[union-attr]
                         daemon=True)
    t.start()
    return t


def _shed(lines: list[bytes]) -> int:
    """Audit records the gateway shed (its 'audit log overloaded: N records dropped' warnings)."""
    found = (re.search(rb"audit log overloaded: (\d+) records dropped", line) for line in lines)
    return sum(int(m.group(1)) for m in found if m)


def _start_gateway(port: int, data_dir: str, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [PY, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir,
           "--management-port", "off", "--cmq-api-port", "off", "--mqtt-port", "off", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # "cmq-gateway: listening on ..." once it serves
        line = proc.stderr.readline()
        if b"listening on" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the gateway did not start: {' '.join(cmd)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--port", type=int, default=5699, help="the gateway's port (never 5672)")
    ap.add_argument("--scenarios", default="1,2,3,4,5,6,7")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per scenario and broker, alternating; the table shows medians")
    ap.add_argument("--gateway-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    ap.add_argument("--out", default=None, help="Markdown file (default: stdout)")
    args = ap.parse_args()
    if args.port == 5672 or parse_uri(args.rabbitmq).host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the gateway never takes 5672, and the brokers are local only")
    header: list[str] = []
    body: list[str] = []
    notes: list[str] = []
    for number in [int(s) for s in args.scenarios.split(",")]:
        data_dir = tempfile.mkdtemp(prefix="bench-compare-")
        gw = _start_gateway(args.port, data_dir, args.gateway_arg)
        log_lines: list[bytes] = []
        reader = _drain(gw, log_lines)
        md = os.path.join(data_dir, "table.md")
        try:
            cmd = [PY, "-m", "gateway.perf", "compare", "--uri-a", args.rabbitmq,
                   "--uri-b", f"amqp://guest:guest@127.0.0.1:{args.port}/", "--name-a", "rabbitmq",
                   "--name-b", "gateway", "--scenarios", str(number), "--duration", str(args.duration),
                   "--repeat", str(args.repeat),
                   "--backlog", str(args.backlog), "--rabbitmqctl-a", "--broker-pid-b", str(gw.pid),
                   "--markdown", md]
            print(f"== scenario {number}", file=sys.stderr, flush=True)
            subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=1800, check=False)
            with open(md) as f:
                lines = [line.rstrip("\n") for line in f]
        finally:
            _stop(gw)
            reader.join(timeout=10)
            shutil.rmtree(data_dir, ignore_errors=True)
        # The audit log is on (serve's default): a figure bought by shedding records would not count.
        notes.append(f"- scenario {number}: the gateway's audit log shed {_shed(log_lines):,} records")
        table = [line for line in lines if line.startswith("|")]
        header = table[:2]
        body += table[2:]
        notes += [line for line in lines if line.startswith("- ")]
    out = "\n".join(header + body + [""] + notes) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(out)
    else:
        sys.stdout.write(out)


if __name__ == "__main__":
    main()
