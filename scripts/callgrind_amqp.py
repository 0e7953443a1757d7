"""Instructions a scenario-1 AMQP message of the gateway (issue 31 aims 1, 4), independent of load.

Scenario 1's path: a transient 16-byte message published to the default exchange, routed to one
queue, delivered to one consumer (prefetch 1,000) and acked one by one (multiple=false), with the
audit log on (``serve``'s default) and /metrics on a port of its own.

A fresh ``cmq-gateway serve`` (the code in ``--code``, default this checkout) runs under
``valgrind --tool=callgrind --instr-atstart=no``. The perf generator's lean client
(``gateway.perf.client``: raw frames) publishes in lockstep batches of ``--batch`` messages
and acks every delivery (see ``Pair``); it first sends ``--warmup`` messages with counting
off (imports, caches, the queue's first messages), then counting is switched on
(``callgrind_control -i on``) for exactly ``--count`` messages (the publisher's first of them to
the consumer's last ack written, then the gateway given a moment to read it) and off again; the
process's instructions over those messages are the figure. ``--children``: the audit writer
process is counted alongside (its own line). Several codes alternate per round:

    .venv/bin/python scripts/callgrind_amqp.py --code /tmp/before --code . --rounds 2

``--profile``: no valgrind; the gateway runs under cProfile switched on for the measured
messages only (signals), and the Python calls a message are printed, most called first.

Each read turn finds a whole batch waiting (the lockstep), so per-turn costs are spread over
``--batch`` messages, as on a busy machine, the same way in every run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from pamqp import commands

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.perf.client import AmqpClient, BrokerAddress  # noqa: E402
from gateway.perf.frames import basic_ack, encode_properties, publish_template  # noqa: E402
from scripts.callgrind_common import PROFILED, child_pids, count_off, count_on, counted  # noqa: E402

# The gateway's entry with the transport's turn clock slowed by SLOW (``python -c SLOWED SLOW serve
# ...``): under valgrind a message takes ~50-100x its time, so a 5 ms turn ended after a handful
# of events, at points that moved with the machine's load (+-3 % between runs of one code);
# slowed, a turn ends where it would natively (its batch or EVENTS_PER_TURN), and a connection
# is light or busy as it would be at full speed.
SLOWED = """import runpy, sys
from gateway import transport as t
slow = float(sys.argv.pop(1))
t.TURN_SECONDS *= slow
t.LIGHT_CHECK_SECONDS *= slow
t.LIGHT_EVENTS_PER_SECOND /= slow
sys.argv[0] = "cmq-gateway"
runpy.run_module("gateway", run_name="__main__")
"""
SLOW = 100.0


def start(code: str, work: Path, mode: str, children: bool) -> tuple[subprocess.Popen[str], int]:
    """``serve`` of the code in ``code`` with a data dir in ``work``; (process, its AMQP port)."""
    data = work / "data"
    data.mkdir()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(code)}
    if mode == "profile":
        command: tuple[str, ...] = (sys.executable, "-c", PROFILED, str(work / "profile.out"))
    else:
        command = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "-q",
                   f"--callgrind-out-file={work}/callgrind.out.%p",
                   *(["--trace-children=yes"] if children else []), sys.executable, "-c", SLOWED, str(SLOW))
    proc = subprocess.Popen([*command, "serve", "--host", "127.0.0.1", "--port", "0", "--management-port", "off",
                             "--metrics-port", "0", "--mqtt-port", "off", "--cmq-api-port", "off",
                             "--data-dir", str(data)], cwd=os.path.abspath(code), stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    raise RuntimeError("the gateway did not start its AMQP listener")


class Pair:
    """One publisher and one acking consumer of one queue (scenario 1's traffic), in lockstep
    batches so that every count sees the same reads: once a batch's last delivery is in, its
    acks (one frame each, multiple=false) and the next batch's publishes are written together,
    the two sockets' reads meeting in the gateway as a flood and its consumer's do."""

    def __init__(self, pub: AmqpClient, sub: AmqpClient, queue: str, batch: int) -> None:
        self.pub, self.sub, self.batch = pub, sub, batch
        t = publish_template(1, "", queue, 16, encode_properties(delivery_mode=1), pub.frame_max)
        self.publishes = (t.head + bytes(8) + t.tail) * batch
        self.acks = bytearray()
        self.received = 0
        self.target = 0
        self.done: asyncio.Future[None] | None = None
        sub.on_delivery = self._delivered

    def _delivered(self, channel: int, tag: int, latency_ns: int) -> None:
        self.acks += basic_ack(1, tag, False)
        self.received += 1
        if self.received % self.batch:
            return
        self.sub.write(self.acks)
        self.acks = bytearray()
        if self.received < self.target:
            self.pub.write(self.publishes)
        elif self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def run(self, count: int) -> None:
        """``count`` more messages (a multiple of the batch), until the last is acked."""
        self.target = self.received + count
        self.done = asyncio.get_running_loop().create_future()
        self.pub.write(self.publishes)
        await asyncio.wait_for(self.done, 600)


async def drive(port: int, count: int, warmup: int, batch: int, on: object, off: object) -> int:
    address = BrokerAddress("127.0.0.1", port, "guest", "guest", "/")
    queue = f"cg-{uuid.uuid4().hex[:10]}"
    pub = await AmqpClient.connect(address, timeout=600)
    sub = await AmqpClient.connect(address, timeout=600)
    try:
        for c in (pub, sub):
            await c.open_channel(1)
        await sub.rpc(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk, timeout=600)
        await sub.rpc(1, commands.Basic.Qos(prefetch_count=1000), commands.Basic.QosOk, timeout=600)
        await sub.rpc(1, commands.Basic.Consume(queue=queue, consumer_tag="cg"), commands.Basic.ConsumeOk,
                      timeout=600)
        pair = Pair(pub, sub, queue, batch)
        await pair.run(warmup)
        await asyncio.sleep(1.0)  # the warm-up's last acks read before counting starts
        on()  # type: ignore[operator]
        before = pair.received
        await pair.run(count)
        await asyncio.sleep(0.5)  # the last acks read
        off()  # type: ignore[operator]
        return pair.received - before
    finally:
        await asyncio.gather(pub.close(timeout=60), sub.close(timeout=60), return_exceptions=True)


def measure(code: str, work: Path, count: int, warmup: int, batch: int, children: bool,
            keep: str) -> dict[str, float]:
    proc, port = start(code, work, "callgrind", children)
    pids: list[str] = []

    def on() -> None:
        pids[:] = [str(proc.pid), *(str(c) for c in child_pids(proc.pid) if children)]
        for p in pids:
            count_on(p)

    def off() -> None:
        for p in pids:
            count_off(p)

    try:
        received = asyncio.run(drive(port, count, warmup, batch, on, off))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    return {"received": received, **counted(str(work), pids, code, keep)}


def profile(code: str, work: Path, count: int, warmup: int, batch: int, top: int) -> None:
    """cProfile's calls a message over the measured messages, by function, most called first."""
    import pstats

    proc, port = start(code, work, "profile", False)
    try:
        received = asyncio.run(drive(port, count, warmup, batch, lambda: proc.send_signal(signal.SIGUSR1),
                                     lambda: proc.send_signal(signal.SIGUSR2)))
        time.sleep(2.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    stats = pstats.Stats(str(work / "profile.out")).stats  # type: ignore[attr-defined]
    calls = sorted(((nc, f"{os.path.basename(file)}:{line}:{fn}") for (file, line, fn), (_cc, nc, *_rest)
                    in stats.items()), reverse=True)
    python = sum(nc for nc, name in calls if not name.startswith("~"))
    print(f"{code}: {received} received, {sum(nc for nc, _ in calls) / received:.1f} calls a message, "
          f"{python / received:.1f} of them Python functions")
    for nc, name in calls[:top]:
        print(f"  {nc / received:7.2f}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", action="append", help="a checkout to measure (repeatable; default this one)")
    ap.add_argument("--count", type=int, default=5120, help="messages counted (rounded up to a whole batch)")
    ap.add_argument("--warmup", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="messages a batch (published together, acked together)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--children", action="store_true", help="count the audit writer process too")
    ap.add_argument("--profile", action="store_true", help="cProfile call counts instead of valgrind")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--keep", default=os.path.join(tempfile.gettempdir(), "callgrind-amqp"),
                    help="where the measured run's callgrind file is kept (for callgrind_annotate)")
    args = ap.parse_args()
    codes = args.code or [str(ROOT)]
    batch = max(args.batch, 1)
    count = -(-args.count // batch) * batch
    warmup = -(-args.warmup // batch) * batch
    for r in range(args.rounds):
        for code in codes:
            with tempfile.TemporaryDirectory(prefix="callgrind-amqp-", ignore_cleanup_errors=True) as tmp:
                if args.profile:
                    profile(code, Path(tmp), count, warmup, batch, args.top)
                    continue
                res = measure(code, Path(tmp), count, warmup, batch, args.children, args.keep)
            n = res["received"] or float("nan")
            line = (f"round {r + 1} {code}: {res['main']:,.0f} Ir main, {res['received']:,.0f} received, "
                    f"{res['main'] / n:,.0f} a message")
            if "child" in res:
                line += f"; audit child {res['child'] / n:,.0f} a message"
            print(line, flush=True)


if __name__ == "__main__":
    main()
