"""Instructions a message of a gateway on the JetStream store (issue 28), independent of load.

One gateway (the code in ``--code``, default this checkout) runs under
``valgrind --tool=callgrind --instr-atstart=no`` on a one-node nats-server of its own (free
ports); counting is switched on (``callgrind_control -i on``) only around the measured work,
and the whole gateway process's instructions are divided by the messages. Two ways:

* ``--backlog N`` (use this one): scenario 1's two halves in bulk, each counted on its own,
  less the instructions of as long an idle time after it (the gateway's own timers): N
  transient 16 B messages published into a queue nobody consumes until JetStream's count has
  them all, then consumed with prefetch 1000, each acked. Deliveries come in pulled batches
  as in the flood (the same ~200 function calls a message under cProfile). The gateway's
  turn clock and JetStream timers are slowed ``--slow`` times (see SLOWED).
* a fixed-rate ``cmq-gateway perf`` run of scenario 1's shape (``--rate``, ``--duration``,
  after a warm-up with counting off; ``--idle`` subtracts an idle time's count). At 300 msg/s
  the same code measured 313k-389k instructions a message in one session: how many loop turns
  a message takes, and the timers' share, move with the machine's load.

``--profile DIR`` runs cProfile instead of valgrind (switched on and written by signals) and
prints function calls a message; ``--embedded`` measures ``--backlog`` on the embedded store.
Several codes in one call are measured one after the other, alternating per round:

    .venv/bin/python scripts/callgrind_jetstream.py --code /tmp/before --code . --backlog 2000 --rounds 3

Needs valgrind (callgrind_control). The nats-server's instructions are not counted; with
``--backlog``, its CPU time a message in each half (less an idle time's) is printed, a rough
figure (a time, moved by what else runs; the gateway under valgrind is slow, so it sees other
batch sizes than in a flood).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.callgrind_common import PROFILED, count_off, count_on, totals  # noqa: E402
from tests.support.gateway_procs import GatewayProcess  # noqa: E402
from tests.support.natsd import NatsCluster  # noqa: E402

VALGRIND_START_SECONDS = 600.0  # a gateway's start under valgrind is ~50x slower

# The gateway's entry with its clocks slowed by SLOW (``python -c SLOWED SLOW serve ...``), as
# in scripts/callgrind_amqp.py: under valgrind a message takes ~50-100x its time, so the
# transport's 5 ms turn ended after a handful of events at load-dependent points, and the
# JetStream side's timers (counts of queues in use, TTL sweeps, the publisher's resend sweep:
# each second or half) ran 50-100x as often a message as natively; the idle time subtracted
# for them moved from 6k to 60k instructions a message with the machine's load (2026-11-30).
# Slowed, they run about as often a message as at full speed. Presence heartbeats are left as
# they are (a gateway without them is taken for dead by its own membership).
SLOWED = """import runpy, sys
from gateway import transport as t
from gateway.jetstream import publisher, streams, sweeper
slow = float(sys.argv.pop(1))
t.TURN_SECONDS *= slow
t.LIGHT_CHECK_SECONDS *= slow
t.LIGHT_EVENTS_PER_SECOND /= slow
streams.COUNT_EVERY *= slow
sweeper.SWEEP_EVERY *= slow
publisher.SWEEP_EVERY *= slow
sys.argv[0] = "cmq-gateway"
runpy.run_module("gateway", run_name="__main__")
"""
SLOW = 100.0


class CallgrindGateway(GatewayProcess):
    """A gateway of the code in ``code`` under callgrind, counting off until switched on (or
    under cProfile when ``profile``)."""

    def __init__(self, code: str, out: Path, profile: bool, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.code = os.path.abspath(code)
        self.out = out
        self.profile = profile
        self.slow = SLOW

    def command(self) -> list[str]:
        cmd = super().command()
        if self.profile:
            return ["env", f"PYTHONPATH={self.code}", cmd[0], "-P", "-c", PROFILED, str(self.out), *cmd[3:]]
        if self.slow == 1.0:
            return ["env", f"PYTHONPATH={self.code}", "valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={self.out}", cmd[0], "-P", *cmd[1:]]
        return ["env", f"PYTHONPATH={self.code}", "valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={self.out}", cmd[0], "-P", "-c", SLOWED, str(self.slow), *cmd[3:]]


def _perf(url: str, rate: float, duration: float) -> dict:
    cmd = [sys.executable, "-m", "gateway", "perf", "--uri", url, "--size", "16", "--producers", "1",
           "--consumers", "1", "--prefetch", "1000", "--multi-ack", "1", "--rate", str(rate),
           "--duration", str(duration), "--json", "--quiet"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])


def _backlog(url: str, count: int, counting: list[Any]) -> dict[str, Any]:
    """Scenario 1's two halves in bulk, each counted on its own (``counting``: the calls that
    switch counting on and off and dump): ``count`` transient 16 B messages published into a
    queue nobody consumes until JetStream's count has them all, then consumed with prefetch
    1000, each acked (multiple=true, as ``perf --multi-ack 1``). Deliveries then come in
    pulled batches, as in the flood, at any speed of the gateway."""
    import pika
    on, off = counting
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    queue = f"cg-{os.getpid()}-{time.monotonic_ns()}"
    ch.queue_declare(queue, durable=False)
    body = b"x" * 16
    props = pika.BasicProperties(delivery_mode=1)
    took = {}
    started = time.monotonic()
    on()
    for _ in range(count):
        ch.basic_publish("", queue, body, props)
    while ch.queue_declare(queue, passive=True).method.message_count < count:
        time.sleep(0.2)
    off()
    took["publish"] = time.monotonic() - started
    ch.basic_qos(prefetch_count=1000)
    got = 0
    started = time.monotonic()
    on()
    for method, _, _ in ch.consume(queue, inactivity_timeout=60):
        if method is None:
            break
        ch.basic_ack(method.delivery_tag, multiple=True)
        got += 1
        if got == count:
            break
    off()
    took["consume"] = time.monotonic() - started
    ch.cancel()
    ch.queue_delete(queue)
    conn.close()
    return {"received": got, "took": took}


def measure(code: str, root: Path, rate: float, duration: float, warmup: float,
            profile: Path | None = None, idle: bool = False) -> tuple[int, int]:
    """(instructions, messages received) of one measured run of ``code``'s gateway; with
    ``profile``, (function calls, received), its cProfile stats written there. ``idle``: less
    the instructions of as long a time with no client right after."""
    nats = NatsCluster(root / "nats", size=1).start()
    out = profile or root / "callgrind.out"
    gw = CallgrindGateway(code, out, profile is not None, root, "gw", nats.store_url, management=False)
    gw.slow = 1.0  # this mode's figures have always been of the clocks as they are
    try:
        gw.start(timeout=VALGRIND_START_SECONDS)
        assert gw.proc is not None
        pid = gw.proc.pid
        _perf(gw.url, rate, warmup)  # the code paths' first use (imports, caches) not counted
        if profile is not None:
            os.kill(pid, signal.SIGUSR1)
            result = _perf(gw.url, rate, duration)
            os.kill(pid, signal.SIGUSR2)
            time.sleep(2.0)
        else:
            count_on(pid)
            started = time.monotonic()
            result = _perf(gw.url, rate, duration)
            took = time.monotonic() - started
            count_off(pid)
            if idle:
                # The same time with no client: the gateway's own timers (counts, heartbeats,
                # sweeps), which at a low rate are a large and varying share of the run's count.
                count_on(pid, zero=False)
                time.sleep(took)
                count_off(pid)
            time.sleep(1.0)
        received = int(result["received"])
        if profile is not None:
            return pstats.Stats(str(profile)).total_calls, received  # type: ignore[attr-defined]
        runs = totals(f"{out}.*")
        return runs[0] - (runs[1] if idle else 0), received
    finally:
        gw.stop()
        nats.stop()


def nats_cpu_ns(nats: NatsCluster) -> int:
    """CPU time the nats-servers have used so far, every thread (schedstat, ns): what their
    side of a message costs is not in the gateway's instructions. A time, not a count: other
    processes on the machine move it (caches, frequency), so a rough figure."""
    total = 0
    for server in nats.servers:
        if server.proc is None:
            continue
        for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


def measure_backlog(code: str, root: Path, count: int, warmup: int, profile: Path | None = None,
                    embedded: bool = False, slow: float = SLOW) -> dict[str, float]:
    """Instructions a message of each half of :func:`_backlog` (publish, consume), less
    those of as long an idle time after each (the gateway's own timers). With ``profile``:
    cProfile stats of both halves written there. ``embedded``: the gateway on its embedded
    store, for the comparison."""
    nats = NatsCluster(root / "nats", size=1).start()
    out = root / "callgrind.out"
    gw = CallgrindGateway(code, profile or out, profile is not None, root, "gw",
                          None if embedded else nats.store_url, management=False)
    gw.slow = slow
    try:
        gw.start(timeout=VALGRIND_START_SECONDS)
        assert gw.proc is not None
        pid = str(gw.proc.pid)
        _backlog(gw.url, warmup, [lambda: None, lambda: None])
        if profile is not None:
            n = _backlog(gw.url, count, [lambda: os.kill(int(pid), signal.SIGUSR1),
                                         lambda: os.kill(int(pid), signal.SIGUSR2)])["received"]
            time.sleep(2.0)
            calls = pstats.Stats(str(profile)).total_calls  # type: ignore[attr-defined]
            return {"publish": 0.0, "consume": calls / n, "idle": 0.0, "received": n}

        cpu: list[int] = []  # the nats-servers' CPU time at each switch of counting

        def on() -> None:
            count_on(pid)
            cpu.append(nats_cpu_ns(nats))

        def off() -> None:
            cpu.append(nats_cpu_ns(nats))
            count_off(pid)

        result = _backlog(gw.url, count, [on, off])
        for phase in ("publish", "consume"):
            on()
            time.sleep(result["took"][phase])
            off()
        time.sleep(1.0)
        pub, con, idle_pub, idle_con = totals(f"{out}.*")
        n = result["received"]
        spans = [b - a for a, b in zip(cpu[::2], cpu[1::2], strict=True)]
        return {"publish": (pub - idle_pub) / n, "consume": (con - idle_con) / n,
                "idle": (idle_pub + idle_con) / n, "received": n,
                "nats_publish": (spans[0] - spans[2]) / n, "nats_consume": (spans[1] - spans[3]) / n}
    finally:
        gw.stop()
        nats.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", action="append", help="a checkout to measure (repeatable; default .)")
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--idle", action="store_true",
                    help="subtract the instructions of as long an idle time after the run")
    ap.add_argument("--profile", metavar="DIR",
                    help="cProfile instead of callgrind: function calls a message, stats kept in DIR")
    ap.add_argument("--embedded", action="store_true", help="--backlog on the embedded store instead")
    ap.add_argument("--keep", metavar="DIR",
                    help="--backlog: keep each run's callgrind dumps in DIR/round<R>-<code> (callgrind_annotate)")
    ap.add_argument("--slow", type=float, default=SLOW,
                    help=f"--backlog: the gateway's turn clock and JetStream timers slowed this many times "
                         f"(default {SLOW:g}; 1: as they are)")
    ap.add_argument("--backlog", type=int, default=0, metavar="N",
                    help="publish N messages into a queue, then consume them: each half counted on its own")
    args = ap.parse_args()
    codes = args.code or [str(ROOT)]
    if args.backlog:
        for r in range(args.rounds):
            for code in codes:
                with tempfile.TemporaryDirectory(prefix="callgrind-js-", ignore_cleanup_errors=True) as tmp:
                    profile = Path(args.profile, f"round{r + 1}-{Path(code).name}.pstats").resolve() \
                        if args.profile else None
                    root = Path(tmp)
                    if args.keep:
                        root = Path(args.keep, f"round{r + 1}-{Path(code).name}").resolve()
                        root.mkdir(parents=True, exist_ok=True)
                    m = measure_backlog(code, root, args.backlog, min(args.backlog, 500), profile,
                                        args.embedded, args.slow)
                if profile is not None:
                    print(f"round {r + 1} {code}: {m['consume']:,.1f} function calls a message (both halves), "
                          f"{profile}", flush=True)
                    continue
                print(f"round {r + 1} {code}: {m['received']:,} messages; a message: publish {m['publish']:,.0f}, "
                      f"consume {m['consume']:,.0f}, total {m['publish'] + m['consume']:,.0f} instructions "
                      f"(idle time's {m['idle']:,.0f}, subtracted); nats-server CPU a message "
                      f"{m.get('nats_publish', 0.0) / 1000:.1f} + {m.get('nats_consume', 0.0) / 1000:.1f} us "
                      f"(a time: rough)", flush=True)
        return
    for r in range(args.rounds):
        for i, code in enumerate(codes):
            profile = Path(args.profile, f"round{r + 1}-code{i + 1}.pstats").resolve() if args.profile else None
            with tempfile.TemporaryDirectory(prefix="callgrind-js-", ignore_cleanup_errors=True) as tmp:
                n, received = measure(code, Path(tmp), args.rate, args.duration, args.warmup, profile, args.idle)
            per = n / received if received else float("nan")
            what = "function calls" if profile else "instructions"
            print(f"round {r + 1} {code}: {n:,} {what}, {received:,} received, {per:,.0f} a message"
                  + (f" ({profile})" if profile else ""), flush=True)


if __name__ == "__main__":
    main()
