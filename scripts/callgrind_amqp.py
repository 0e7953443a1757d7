"""Instructions a scenario-1 (or scenario-3) AMQP message of the gateway (issue 31 aims 1, 4),
independent of load.

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

``--fanout N``: scenario 3's path instead (N = 50 there): one publisher to a fanout exchange
bound to N queues (declared with the longest visibility timeout, so that a slow batch under
valgrind is not delivered again), the queues consumed by two connections (prefetch 1,000 each
consumer, every delivery acked), a batch complete when its N deliveries a message are in;
printed a message and a delivery:

    .venv/bin/python scripts/callgrind_amqp.py --fanout 50 --count 640 --warmup 128 --code /tmp/before --code .

``--profile``: no valgrind; the gateway runs under cProfile switched on for the measured
messages only (signals), and the Python calls a message are printed, most called first.

Each read turn finds a whole batch waiting (the lockstep), so per-turn costs are spread over
``--batch`` messages, as on a busy machine, the same way in every run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from pamqp import commands

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.perf.client import AmqpClient, BrokerAddress  # noqa: E402
from gateway.perf.frames import basic_ack, encode_properties, publish_template  # noqa: E402
from scripts.callgrind_common import (  # noqa: E402
    PROFILED,
    add_run_arguments,
    print_counted,
    print_profile,
    run_counted,
    run_profiled,
    wait_listening,
)

# The gateway's entry with the transport's turn clock slowed by SLOW (``python -c SLOWED SLOW serve
# ...``): under valgrind a message takes ~50-100x its time, so a 5 ms turn ended after a handful
# of events, at points that moved with the machine's load (+-3 % between runs of one code);
# slowed, a turn ends where it would natively (its batch or EVENTS_PER_TURN), and a connection
# is light or busy as it would be at full speed.
# --profile runs the same slowed clock, so that its calls a message are those of the counted run.
SLOW_PATCH = """import sys
from gateway import transport as t
slow = float(sys.argv.pop(1))
t.TURN_SECONDS *= slow
t.LIGHT_CHECK_SECONDS *= slow
t.LIGHT_EVENTS_PER_SECOND /= slow
"""
SLOWED = SLOW_PATCH + """import runpy
sys.argv[0] = "cmq-gateway"
runpy.run_module("gateway", run_name="__main__")
"""
SLOW = 100.0
# Fanout: a batch of 64 messages is 3,200 enqueues and deliveries, seconds under valgrind, so at
# 100x its publisher's turn still ended at wall-clock points (the turn's end, the light-peer
# checks), and the count moved with the machine's load (50.3k-66.1k a delivery, one code). At
# 10^6 a turn ends only at its event budget or when the input runs out.
SLOW_FANOUT = 1e6


def start(code: str, work: Path, mode: str, children: bool, slow: float = SLOW) -> tuple[subprocess.Popen[str], int]:
    """``serve`` of the code in ``code`` with a data dir in ``work``; (process, its AMQP port)."""
    data = work / "data"
    data.mkdir()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(code)}
    if mode == "profile":
        command: tuple[str, ...] = (sys.executable, "-c", SLOW_PATCH + PROFILED, str(slow), str(work / "profile.out"))
    else:
        command = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "-q",
                   f"--callgrind-out-file={work}/callgrind.out.%p",
                   *(["--trace-children=yes"] if children else []), sys.executable, "-c", SLOWED, str(slow))
    proc = subprocess.Popen([*command, "serve", "--host", "127.0.0.1", "--port", "0", "--management-port", "off",
                             "--metrics-port", "0", "--mqtt-port", "off", "--cmq-api-port", "off",
                             "--data-dir", str(data)], cwd=os.path.abspath(code), stderr=subprocess.PIPE,
                            text=True, env=env)
    return wait_listening(proc, r"listening on 127\.0\.0\.1:(\d+)", "AMQP")


class Lockstep:
    """One publisher and acking consumers (one channel each, prefetch 1,000), in lockstep batches
    so that every count sees the same reads: once a batch's last delivery is in (``fanout`` a
    message), each consumer's acks (one frame a delivery, multiple=false) and the next batch's
    publishes are written together, the sockets' reads meeting in the gateway as a flood and its
    consumers' do."""

    def __init__(self, pub: AmqpClient, subs: list[AmqpClient], exchange: str, key: str, batch: int,
                 fanout: int) -> None:
        self.pub, self.subs, self.batch = pub, subs, batch
        t = publish_template(1, exchange, key, 16, encode_properties(delivery_mode=1), pub.frame_max)
        self.publishes = (t.head + bytes(8) + t.tail) * batch
        self.per_batch = batch * fanout
        self.acks = [bytearray() for _ in subs]
        self.delivered = 0
        self.target = 0
        self.done: asyncio.Future[None] | None = None
        for i, sub in enumerate(subs):
            sub.on_delivery = self._on_delivery(i)

    def _on_delivery(self, i: int) -> Callable[[int, int, int], None]:
        acks = self.acks[i]

        def delivered(channel: int, tag: int, latency_ns: int) -> None:
            acks.extend(basic_ack(1, tag, False))
            self.delivered += 1
            if self.delivered % self.per_batch:
                return
            for sub, pending in zip(self.subs, self.acks, strict=True):
                if pending:
                    sub.write(bytes(pending))
                    pending.clear()
            if self.delivered < self.target:
                self.pub.write(self.publishes)
            elif self.done is not None and not self.done.done():
                self.done.set_result(None)

        return delivered

    async def run(self, count: int) -> None:
        """``count`` more messages (a multiple of the batch), until the last delivery is acked."""
        self.target = self.delivered + count // self.batch * self.per_batch
        self.done = asyncio.get_running_loop().create_future()
        self.pub.write(self.publishes)
        await asyncio.wait_for(self.done, 1800)


async def drive(port: int, count: int, warmup: int, batch: int, fanout: int, on: Callable[[], None],
                off: Callable[[], None]) -> int:
    """Messages published and every delivery acked: with ``fanout`` 0 scenario 1 (the default
    exchange, one queue, one consumer), else scenario 3 (a fanout exchange bound to ``fanout``
    queues, consumed by two connections, the queues dealt round-robin as the perf runner deals
    them). The messages counted."""
    address = BrokerAddress("127.0.0.1", port, "guest", "guest", "/")
    tag = uuid.uuid4().hex[:10]
    queues = [f"cg-{tag}-q{i}" for i in range(max(fanout, 1))]
    pub = await AmqpClient.connect(address, timeout=600)
    subs = [await AmqpClient.connect(address, timeout=600) for _ in range(2 if fanout else 1)]
    try:
        for c in (pub, *subs):
            await c.open_channel(1)
        # Fanout: the longest visibility timeout (L8), as a batch of 3,200 deliveries under
        # valgrind on a loaded machine could outlast the default 30 s and come again (Q1).
        args = {"x-cmq-visibility-timeout": 43_200} if fanout else None
        for q in queues:
            await pub.rpc(1, commands.Queue.Declare(queue=q, arguments=args), commands.Queue.DeclareOk, timeout=600)
        exchange, key = "", queues[0]
        if fanout:
            exchange = f"cg-{tag}-fanout"
            await pub.rpc(1, commands.Exchange.Declare(exchange=exchange, exchange_type="fanout"),
                          commands.Exchange.DeclareOk, timeout=600)
            for q in queues:
                await pub.rpc(1, commands.Queue.Bind(queue=q, exchange=exchange), commands.Queue.BindOk, timeout=600)
        for i, sub in enumerate(subs):
            await sub.rpc(1, commands.Basic.Qos(prefetch_count=1000), commands.Basic.QosOk, timeout=600)
            for j, q in enumerate(queues):
                if j % len(subs) == i:
                    await sub.rpc(1, commands.Basic.Consume(queue=q, consumer_tag=f"cg-{j}"),
                                  commands.Basic.ConsumeOk, timeout=600)
        async def acks_read() -> None:
            """Every ack written is handled: a basic.qos round trip behind them on each consumer
            channel (the same prefetch, for consumers made after it: none). A sleep was not
            enough: at fanout 50 the gateway reads a batch's publishes before the last one's
            acks, and up to two batches' acks were still unread when counting stopped."""
            for sub in subs:
                await sub.rpc(1, commands.Basic.Qos(prefetch_count=1000), commands.Basic.QosOk, timeout=600)
            await asyncio.sleep(0.5)  # their audit hand-off and writes

        traffic = Lockstep(pub, subs, exchange, key, batch, max(fanout, 1))
        await traffic.run(warmup)
        await acks_read()  # the warm-up's before counting starts
        on()
        before = traffic.delivered
        await traffic.run(count)
        await acks_read()
        off()
        return (traffic.delivered - before) // max(fanout, 1)
    finally:
        await asyncio.gather(pub.close(timeout=60), *(s.close(timeout=60) for s in subs), return_exceptions=True)


def measure(code: str, work: Path, count: int, warmup: int, batch: int, fanout: int, children: bool,
            keep: str) -> dict[str, float]:
    proc, port = start(code, work, "callgrind", children, SLOW_FANOUT if fanout else SLOW)
    return run_counted(proc, lambda on, off: asyncio.run(drive(port, count, warmup, batch, fanout, on, off)),
                       children, str(work), code, keep)


def profile(code: str, work: Path, count: int, warmup: int, batch: int, fanout: int, top: int) -> None:
    """cProfile's calls a message (a delivery with ``fanout``) over the measured messages."""
    proc, port = start(code, work, "profile", False, SLOW_FANOUT if fanout else SLOW)
    received, stats = run_profiled(
        proc, lambda on, off: asyncio.run(drive(port, count, warmup, batch, fanout, on, off)),
        str(work / "profile.out"))
    print_profile(code, received * max(fanout, 1), stats, top, "delivery" if fanout else "message")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, "amqp", 40)
    ap.add_argument("--count", type=int, default=5120, help="messages counted (rounded up to a whole batch)")
    ap.add_argument("--warmup", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="messages a batch (published together, acked together)")
    ap.add_argument("--fanout", type=int, default=0, metavar="N",
                    help="scenario 3: a fanout exchange to N queues (scenario 3: 50), two consumer connections")
    args = ap.parse_args()
    codes = args.code or [str(ROOT)]
    batch = max(args.batch, 1)
    count = -(-args.count // batch) * batch
    warmup = -(-args.warmup // batch) * batch
    for r in range(args.rounds):
        for code in codes:
            with tempfile.TemporaryDirectory(prefix="callgrind-amqp-", ignore_cleanup_errors=True) as tmp:
                if args.profile:
                    profile(code, Path(tmp), count, warmup, batch, args.fanout, args.top)
                    continue
                res = measure(code, Path(tmp), count, warmup, batch, args.fanout, args.children, args.keep)
            print_counted(r, code, res, args.fanout)


if __name__ == "__main__":
    main()
