"""Where one message's time goes on the JetStream store: per-hop monotonic timestamps (issue 28 aim 1).

    .venv/bin/python scripts/trace_jetstream_hops.py serve <cmq-gateway serve arguments> --store nats://...
    .venv/bin/python scripts/trace_jetstream_hops.py report /tmp/trace-PID.jsonl
    .venv/bin/python scripts/trace_jetstream_hops.py floor nats://127.0.0.1:PORT [core|js ...]

``serve`` runs the gateway with its JetStream path wrapped at run time (nothing in gateway/
changes; a plain gateway pays nothing) and stamps every H5_SAMPLE-th queue message (default
20) at each hop: ``amqp_in`` (the client read that carried the publish began), ``routed``
(handed to the publisher), ``queued`` (PUB queued for the socket), ``written`` (on the socket),
``puback``, ``read`` (the pulled delivery parsed off the NATS socket), ``taken`` (leased and
dispatched), ``amqp_out`` (the next AMQP write after that). With H5_TICK=1 it also counts loop
turns between hops: a call_soon chain runs while a stamped message is in flight, which keeps
the loop spinning (CPU), so take times from runs without it. Records are appended to
/tmp/trace-PID.jsonl, 200 at a time. Load-independent reading: the turn counts.

``floor``: publish -> receive through nats-server alone at 3,000 msg/s, 16 B (core pub/sub, and
a stream with a waiting pull request): what no gateway can go below on this machine now.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

HOPS = ["amqp_in", "routed", "queued", "written", "read", "taken", "amqp_out"]


def serve(argv: list[str]) -> int:
    from gateway import transport as TR
    from gateway.jetstream import publisher as PUBM
    from gateway.jetstream import pulls as PL
    from gateway.jetstream import wire as W
    from gateway.jetstream.head import MSG_ID

    mono = time.monotonic
    sample = int(os.environ.get("H5_SAMPLE", "20"))
    ticking = os.environ.get("H5_TICK") == "1"
    out = f"/tmp/trace-{os.getpid()}.jsonl"
    live: dict[str, dict[str, tuple[float, int]]] = {}
    finished: list[dict[str, tuple[float, int]]] = []
    to_write: list[dict[str, tuple[float, int]]] = []
    in_pending: list[str] = []
    by_lsn: dict[int, str] = {}
    state = {"turn": 0, "active": 0, "n": 0, "read_at": 0.0}

    def tick() -> None:
        state["turn"] += 1
        if state["active"] > 0:
            asyncio.get_running_loop().call_soon(tick)

    def mark(mid: str | None, hop: str) -> None:
        r = live.get(mid or "")
        if r is not None and hop not in r:
            r[hop] = (mono(), state["turn"])

    def wrap(cls: Any, name: str, before: Any = None, after: Any = None) -> None:
        original = getattr(cls, name)

        def wrapped(*args: Any) -> Any:
            if before is not None:
                before(*args)
            result = original(*args)
            if after is not None:
                after(*args)
            return result
        setattr(cls, name, wrapped)

    def on_publish(_self: Any, lsn: int, _subject: str, _payload: bytes, headers: dict[str, str], *_: Any) -> None:
        state["n"] += 1
        mid = headers.get(MSG_ID)
        if mid and state["n"] % sample == 0:
            live[mid] = {"amqp_in": (state["read_at"], 0), "routed": (mono(), state["turn"])}
            by_lsn[lsn] = mid
            if ticking:
                state["active"] += 1
                if state["active"] == 1:
                    asyncio.get_running_loop().call_soon(tick)

    def on_send(_nc: Any, commands: list[Any]) -> None:
        for c in commands:
            mid = c[4].get(MSG_ID) if c[4] else None
            if mid in live:
                mark(mid, "queued")
                in_pending.append(mid)

    def on_flush(nc: Any) -> None:
        if not nc._pending_data_size:
            for mid in in_pending:
                mark(mid, "written")
            in_pending.clear()

    def on_reply(_self: Any, msg: Any) -> None:
        lsn = msg.subject.rpartition(".")[2]
        if lsn.isdigit():
            mark(by_lsn.pop(int(lsn), None), "puback")

    def on_pulled(_self: Any, _s: Any, m: Any) -> None:
        if m.headers:
            mark(m.headers.get(MSG_ID), "read")

    def on_take(_self: Any, _s: Any, msgs: list[Any]) -> None:
        for m in msgs:
            r = live.pop((m.headers or {}).get(MSG_ID, ""), None)
            if r is not None:
                r["taken"] = (mono(), state["turn"])
                state["active"] -= ticking
                finished.append(r)

    def on_amqp_write(_self: Any) -> None:
        if finished:
            t = (mono(), state["turn"])
            for r in finished:
                r["amqp_out"] = t
            to_write.extend(finished)
            finished.clear()
            if len(to_write) >= 200:
                with open(out, "a") as f:
                    f.write("".join(json.dumps(x) + "\n" for x in to_write))
                to_write.clear()

    def on_amqp_read(_self: Any, _data: bytes) -> None:
        state["read_at"] = mono()

    wrap(PUBM.Publisher, "publish", before=on_publish)
    wrap(PUBM.Publisher, "_replied", before=on_reply)
    wrap(PL.Pulls, "pulled", before=on_pulled)
    wrap(PL.Pulls, "_take", after=on_take)
    wrap(W, "send", after=on_send)  # a False return queued nothing: no command is marked then
    wrap(W, "_flush", after=on_flush)
    wrap(TR.AMQPConnection, "data_received", before=on_amqp_read)
    wrap(TR.ClientProtocol, "_flush", after=on_amqp_write)
    print(f"trace_jetstream_hops: records to {out}", file=sys.stderr, flush=True)
    from gateway.cli import main
    return main(["serve", *argv])


def report(paths: list[str]) -> int:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f]

    def pct(v: list[float], p: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(p * len(v)))]
    print(f"{len(rows)} messages")
    pairs = list(zip(HOPS, HOPS[1:], strict=False)) + [("written", "puback"), ("amqp_in", "amqp_out")]
    for a, b in pairs:
        both = [r for r in rows if a in r and b in r]
        if not both:
            continue
        ms = [(r[b][0] - r[a][0]) * 1e3 for r in both]
        turns = [r[b][1] - r[a][1] for r in both]
        print(f"{a:>8} -> {b:<8} n={len(ms):5d}  ms p25 {pct(ms, .25):6.3f} p50 {pct(ms, .5):6.3f} "
              f"p90 {pct(ms, .9):7.3f}  turns p50 {pct(turns, .5)} p90 {pct(turns, .9)}")
    return 0


async def _floor(url: str, kind: str, secs: float = 4.0, rate: int = 3000) -> tuple[int, float, float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    lat: list[float] = []
    subject = f"trace_floor.{kind}.{os.getpid()}"
    stream = f"TRACE_FLOOR_{os.getpid()}"

    def took(data: bytes, now: float) -> None:
        lat.append(now - struct.unpack("d", data[:8])[0])

    if kind == "js":
        await js.add_stream(name=stream, subjects=[subject])
        psub = await js.pull_subscribe(subject, durable="c", stream=stream,
                                       config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=100000))

        async def receive() -> None:
            while True:
                try:
                    msgs = await psub.fetch(1000, timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                now = time.monotonic()
                for m in msgs:
                    took(m.data, now)
                    await m.ack()
        task = asyncio.create_task(receive())
    else:
        async def cb(m: Any) -> None:
            took(m.data, time.monotonic())
        await nc.subscribe(subject, cb=cb)
        task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0.3)
    start, n = time.monotonic(), 0
    while (now := time.monotonic()) - start < secs:
        while n < int((now - start) * rate):
            await nc.publish(subject, struct.pack("d", time.monotonic()) + b"x" * 8)
            n += 1
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.5)
    task.cancel()
    if kind == "js":
        await js.delete_stream(stream)
    await nc.close()
    lat.sort()
    return len(lat), lat[len(lat) // 2] * 1e3, lat[int(len(lat) * .9)] * 1e3


def floor(url: str, kinds: list[str]) -> int:
    for kind in kinds or ["core", "js", "core", "js"]:
        load = os.getloadavg()[0]
        n, p50, p90 = asyncio.run(_floor(url, kind))
        print(f"{kind:5} load {load:.1f} n={n} p50 {p50:.3f} ms p90 {p90:.3f} ms")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("serve", "report", "floor"):
        sys.exit(__doc__)
    cmd, rest = sys.argv[1], sys.argv[2:]
    sys.exit(serve(rest) if cmd == "serve" else report(rest) if cmd == "report" else floor(rest[0], rest[1:]))
