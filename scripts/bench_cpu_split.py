"""Where scenario 1's CPU goes, per message, for RabbitMQ and the gateway in one run (issue 15).

    .venv/bin/python scripts/bench_cpu_split.py [--duration 8] [--repeat 3] [--size 16] [--before TREE]

A throughput ratio on this 2-core machine is a CPU budget shared by the broker and the load
generator. This runs `cmq-gateway perf` (1 producer, 1 consumer, --rate 0, transient
messages: scenario 1) against the machine's RabbitMQ and against a gateway started as `serve`
runs it (audit log and /metrics on), alternating, and reads utime + stime from /proc for:

* the broker: RabbitMQ's beam.smp; the gateway's event-loop thread, its other threads (the
  audit writer thread, the store's sync thread) and its child processes (the audit writer
  process);
* the generator: the `perf` process and its worker processes.

It prints messages received per second and CPU microseconds per message of each, both over the
steady part of the window (from its 1 s tick to its last), so the ratio can be
read as arithmetic: what the generator costs is paid on both sides, what the broker costs
decides how many messages the two cores carry, and the gateway's event loop is one thread.

``--before TREE``: a second gateway started from another source tree (a ``git worktree`` of
the commit before a change, with its compiled modules built or copied in), on the next port,
run in the same rounds (RabbitMQ, before, this tree, each round), so that a change's
before/after is read in one run beside RabbitMQ.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_compare  # noqa: E402
from bench_compare import PY, ROOT, _start_gateway, _stop  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(path: str) -> float:
    """utime + stime in seconds from a /proc/.../stat file (0 if it is gone)."""
    try:
        with open(path) as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def _gateway_parts(pid: int) -> dict[str, float]:
    threads = {int(t): _cpu(f"/proc/{pid}/task/{t}/stat") for t in os.listdir(f"/proc/{pid}/task")}
    return {"event loop": threads.get(pid, 0.0),
            "other threads": sum(v for t, v in threads.items() if t != pid),
            "audit process": sum(_cpu(f"/proc/{c}/stat") for c in _children(pid))}


def _beam_pid() -> int:
    out = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True, check=False).stdout.split()
    if not out:
        raise SystemExit("no beam.smp process: is RabbitMQ running on this machine?")
    return int(out[0])


def _run(uri: str, duration: float, size: int, parts: Callable[[], dict[str, float]],
         extra: list[str] | None = None) -> dict[str, float]:
    """One perf run; CPU per message over the steady part of the window: from its first
    progress tick (t = 1 s) to its last (t = duration), read as each tick is printed."""
    cmd = [PY, "-m", "gateway.perf", "--uri", uri, "--rate", "0", "--duration", str(duration),
           "--size", str(size), "--json", *(extra or [])]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None

    def reading() -> dict[str, float]:
        generator = sum(_cpu(f"/proc/{p}/stat") for p in [proc.pid, *_children(proc.pid)])
        return {**parts(), "generator": generator}

    ticks: dict[float, dict[str, float]] = {}

    def follow() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            m = re.match(r"time\s+([\d.]+)s", line)
            if m:
                ticks[float(m.group(1))] = reading()
    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert proc.stdout is not None
    out = proc.stdout.read()  # stderr is the follower's alone
    proc.wait(timeout=120)
    follower.join()
    result = json.loads(out)
    first, last = 1.0, float(int(duration))
    if first not in ticks or last not in ticks or last <= first:
        raise SystemExit(f"no progress ticks at {first} and {last} s (got {sorted(ticks)}): use --duration >= 3")
    received = sum(row["received"] for row in result["per_second"] if first < row["t"] <= last)
    row = {"msg/s": received / (last - first)}
    for k, v in ticks[last].items():
        row[k] = (v - ticks[first][k]) / received * 1e6
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--port", type=int, default=5699, help="the gateway's port (never 5672)")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--before", default=None, help="a source tree whose gateway runs beside this one's")
    ap.add_argument("--slow-ack-ms", type=float, default=0.0,
                    help="add scenario 8's slow consumer (prefetch 1, acks after MS) beside the flood; "
                         "CPU a message is then per flood message")
    args = ap.parse_args()
    extra = ["--slow-ack-ms", str(args.slow_ack_ms)] if args.slow_ack_ms else []
    if args.port == 5672 or args.port + 1 == 5672:
        raise SystemExit("the gateway never takes 5672")
    gateways = {"gateway": (ROOT, args.port)}
    if args.before:
        gateways = {"before": (os.path.abspath(args.before), args.port + 1), "gateway": (ROOT, args.port)}
    procs = {}
    try:
        for name, (tree, port) in gateways.items():
            bench_compare.ROOT = tree  # _start_gateway runs `serve` from this tree
            procs[name] = _start_gateway(port, tempfile.mkdtemp(prefix="bench-cpu-"), ["--metrics-port", "0"])
    finally:
        bench_compare.ROOT = ROOT
    beam = _beam_pid()
    rows: dict[str, list[dict[str, float]]] = {"rabbitmq": [], **{name: [] for name in gateways}}
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    try:
        for _ in range(args.repeat):
            rows["rabbitmq"].append(_run(args.rabbitmq, args.duration, args.size,
                                         lambda: {"broker": _cpu(f"/proc/{beam}/stat")}, extra))
            for name, (_, port) in gateways.items():
                pid = procs[name].pid
                rows[name].append(_run(f"amqp://guest:guest@127.0.0.1:{port}/", args.duration, args.size,
                                       lambda pid=pid: _gateway_parts(pid), extra))  # type: ignore[misc]
    finally:
        for proc in procs.values():
            _stop(proc)
    print(f"load after: {os.getloadavg()}", file=sys.stderr)
    print("| broker | msg/s | " + "CPU us/msg: parts | total broker | generator | all |")
    print("|---|---:|---|---:|---:|---:|")
    for name, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        broker_parts = {k: v for k, v in med.items() if k not in ("msg/s", "generator")}
        broker = sum(broker_parts.values())
        text = ", ".join(f"{k} {v:.1f}" for k, v in broker_parts.items())
        print(f"| {name} | {med['msg/s']:,.0f} | {text} | {broker:.1f} | {med['generator']:.1f} | "
              f"{broker + med['generator']:.1f} |")
    rabbit = statistics.median(r["msg/s"] for r in rows["rabbitmq"])
    for name in gateways:
        ratios = [g["msg/s"] / r["msg/s"] for g, r in zip(rows[name], rows["rabbitmq"], strict=True)]
        print(f"\n{name} / rabbitmq msg/s (medians of {args.repeat}): "
              f"{statistics.median(r['msg/s'] for r in rows[name]) / rabbit:.2f}; "
              f"each round: {', '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
    main()
