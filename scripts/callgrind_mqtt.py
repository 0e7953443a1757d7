"""Instructions a QoS 1 MQTT message of the gateway (issue 31 aim 2), independent of load.

A fresh ``cmq-gateway serve`` (audit log on, as ``serve`` defaults; the code in ``--code``,
default this checkout) runs under ``valgrind --tool=callgrind --instr-atstart=no``. The lean
client of ``gateway/perf/mqtt.py`` (one publisher, one clean-session subscriber, one topic,
64-byte messages) first sends ``--warmup`` messages with counting off (imports, caches, the
topic's first route), then counting is switched on (``callgrind_control -i on``) for exactly
``--count`` QoS 1 messages at window ``--window`` and off again; the process's instructions
over those messages are the figure. ``--children``: the audit writer process is run under
callgrind too and counted alongside (its own line). Several codes alternate per round:

    .venv/bin/python scripts/callgrind_mqtt.py --code /tmp/before --code . --rounds 2

``--profile``: no valgrind; the gateway runs under cProfile switched on for the measured
messages only (signals), and the Python calls a message are printed per module and the top
functions (``--top``).

Under valgrind the gateway is ~50x slower than the client, so every loop turn finds the whole
window waiting: per-turn costs are spread over ~window messages, as on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.mqtt import codec as P  # noqa: E402
from gateway.perf.mqtt import Target, _Client, _measure  # noqa: E402
from scripts.bench_mqtt import start_gateway  # noqa: E402
from scripts.callgrind_common import (  # noqa: E402
    PROFILED,
    add_run_arguments,
    print_counted,
    print_profile,
    run_counted,
    run_profiled,
)


def start(code: str, work: Path, mode: str, children: bool) -> tuple[subprocess.Popen[str], int]:
    data = work / "data"
    data.mkdir()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(code)}
    if mode == "profile":
        command: tuple[str, ...] = (sys.executable, "-c", PROFILED, str(work / "profile.out"))
    else:
        command = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "-q",
                   f"--callgrind-out-file={work}/callgrind.out.%p", *(["--trace-children=yes"] if children else []),
                   sys.executable, "-m", "gateway")
    return start_gateway(str(data), root=os.path.abspath(code), command=command, env=env)


async def drive(port: int, count: int, warmup: int, window: int, on: object, off: object) -> int:
    t = Target("gateway", "127.0.0.1", port, "guest", "guest")
    tag = uuid.uuid4().hex[:10]
    topic = f"perf/{tag}/1"
    sub = await _Client.open(t, f"cg-sub-{tag}")
    sub.writer.write(P.encode(P.Subscribe(1, [(topic, 1)]), 4))
    if not isinstance(await asyncio.wait_for(sub.recv(), 600), P.SubAck):
        raise ConnectionError("no SUBACK")
    pub = await _Client.open(t, f"cg-pub-{tag}")
    try:
        await _measure(t, sub, pub, topic, 1, warmup, 64, window, 120.0)
        on()  # type: ignore[operator]
        r = await _measure(t, sub, pub, topic, 1, count, 64, window, 120.0)
        off()  # type: ignore[operator]
        return int(r["received"])
    finally:
        sub.close()
        pub.close()


def measure(code: str, work: Path, count: int, warmup: int, window: int, children: bool,
            keep: str) -> dict[str, float]:
    proc, port = start(code, work, "callgrind", children)
    return run_counted(proc, lambda on, off: asyncio.run(drive(port, count, warmup, window, on, off)), children,
                       str(work), code, keep, settle=1.0)


def profile(code: str, work: Path, count: int, warmup: int, window: int, top: int) -> None:
    proc, port = start(code, work, "profile", False)
    received, stats = run_profiled(proc, lambda on, off: asyncio.run(drive(port, count, warmup, window, on, off)),
                                   str(work / "profile.out"))
    print_profile(code, received, stats, top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, "mqtt", 30)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--window", type=int, default=100)
    args = ap.parse_args()
    codes = args.code or [str(ROOT)]
    for r in range(args.rounds):
        for code in codes:
            with tempfile.TemporaryDirectory(prefix="callgrind-mqtt-", ignore_cleanup_errors=True) as tmp:
                if args.profile:
                    profile(code, Path(tmp), args.count, args.warmup, args.window, args.top)
                    continue
                res = measure(code, Path(tmp), args.count, args.warmup, args.window, args.children, args.keep)
            print_counted(r, code, res)


if __name__ == "__main__":
    main()
