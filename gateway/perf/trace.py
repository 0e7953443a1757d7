"""Where a message's end-to-end latency goes: the gateway's side of a per-message trace.

    python -m gateway.perf.trace [--detail] [--no-audit] OUT.json serve --port 5712 --data-dir D ...  # traced
    CMQ_PERF_TRACE=OUT2.json python -m gateway.perf run --uri ... --rate 1000  # the consumer's side
    python -m gateway.perf.trace --report OUT.json OUT2.json                   # the split

The first form runs ``cmq-gateway serve`` with the AMQP transport's socket reads and writes
wrapped: every read is noted with the send stamps (the generator's first 8 body bytes,
gateway.perf.worker) of the publishes whose body it holds, every write with the stamps of the
deliveries in it, and each audit hand-off (A5) with its start and end. Nothing of this is in
the gateway itself: without this launcher nothing is wrapped, so tracing costs a served
gateway nothing. The second form makes the generator's consumers note (send stamp, latency)
of every delivery (gateway.perf.worker). All three processes read CLOCK_MONOTONIC, so the
report joins them by stamp and gives, per message, the medians of:

* publish written by the producer -> the gateway's read of it (the kernel, and the gateway's
  wake-up);
* that read -> the start of the write of its delivery (the gateway's residence; the audit
  hand-off is inside it and shown apart);
* that write -> the consumer's read (the kernel, and the consumer's wake-up);
* end to end, as the generator's histogram has it.

The wrappers cost a few microseconds a call, which shows in the residence: compare traced
runs with traced runs.
"""

from __future__ import annotations

import atexit
import json
import statistics
import struct
import sys
import time
from typing import Any

__all__ = ["install", "main", "report"]

_HEAD = struct.Struct(">BHI")
_STAMP = struct.Struct(">Q")
_BODY = 3


class _Frames:
    """The send stamps of the content bodies in a byte stream given in pieces (a body's first
    frame starts with the generator's 8-byte stamp; messages of one frame each here)."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def stamps(self, data: bytes | bytearray | memoryview) -> list[int]:
        buf = self.buf
        buf += data
        out: list[int] = []
        pos, end = 0, len(buf)
        if buf[:4] == b"AMQP":  # a client's protocol header, before any frame
            pos = 8
        while end - pos >= 7:
            ftype, _, size = _HEAD.unpack_from(buf, pos)
            fend = pos + 8 + size
            if fend > end:
                break
            if ftype == _BODY and size >= 8:
                out.append(_STAMP.unpack_from(buf, pos + 7)[0])
            pos = fend
        del buf[:pos]
        return out


class _Writes:
    """A transport's stand-in that notes each write's time and delivered stamps."""

    def __init__(self, transport: Any, conn_id: int, events: list[tuple[Any, ...]]) -> None:
        self._t = transport
        self._id = conn_id
        self._events = events
        self._frames = _Frames()

    def write(self, data: bytes) -> None:
        t0 = time.monotonic_ns()
        self._t.write(data)
        t1 = time.monotonic_ns()
        self._events.append(("w", self._id, t0, t1, self._frames.stamps(data)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def _time_steps(events: list[tuple[Any, ...]]) -> None:
    """Time the steps of a read turn (``--detail``): each call is an event named after it."""
    from gateway import transport as tr
    from gateway.broker import broker as br
    from gateway.broker import session as se

    def timed(owner: Any, name: str) -> None:
        fn = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}"

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((label, -1, t0, time.monotonic_ns(), []))

        setattr(owner, name, wrapper)

    for owner, name in ((tr.AMQPConnection, "_process"), (tr.ClientProtocol, "_flush"),
                        (se.Session, "on_event"), (br.Broker, "end_batch"), (br.Broker, "dispatch"),
                        (tr.AMQPConnection, "_measure"), (tr.LightPeers, "waiting")):
        timed(owner, name)


def install(path: str, detail: bool = False) -> list[tuple[Any, ...]]:
    """Wrap the AMQP transport's reads, writes and audit hand-offs; dump the events to
    ``path`` (JSON) at exit. ``detail``: time the steps of a read turn too."""
    from gateway import transport as tr

    events: list[tuple[Any, ...]] = []
    ids: dict[int, int] = {}
    cls = tr.AMQPConnection
    take, received = cls._take, cls.data_received

    def _take(self: Any, transport: Any) -> None:
        take(self, transport)
        ids[id(self)] = conn_id = len(ids)
        self.transport = _Writes(self.transport, conn_id, events)
        self._trace_frames = _Frames()
        broker = self.gw.broker
        if not getattr(broker, "_traced", False):
            broker._traced = True
            handoff = broker.audit_handoff

            def audit_handoff() -> bool:
                t0 = time.monotonic_ns()
                ok = handoff()
                events.append(("h", -1, t0, time.monotonic_ns(), []))
                return bool(ok)

            broker.audit_handoff = audit_handoff

    def data_received(self: Any, data: bytes) -> None:
        t0 = time.monotonic_ns()
        stamps = self._trace_frames.stamps(data)
        received(self, data)
        events.append(("r", ids.get(id(self), -1), t0, time.monotonic_ns(), stamps))

    cls._take = _take  # type: ignore[method-assign]
    cls.data_received = data_received  # type: ignore[method-assign]
    if detail:
        _time_steps(events)

    def dump() -> None:
        with open(path, "w") as f:
            json.dump(events, f)

    atexit.register(dump)
    return events


def _median_us(values: list[int]) -> float:
    return statistics.median(values) / 1000 if values else float("nan")


def report(gateway_path: str, consumer_path: str | None) -> dict[str, Any]:
    """Per message: producer -> gateway read -> delivery write -> consumer; medians in µs."""
    with open(gateway_path) as f:
        events = json.load(f)
    read_at: dict[int, tuple[int, int]] = {}  # stamp -> (read start, read end)
    write_at: dict[int, tuple[int, int]] = {}  # stamp -> (write start, write end)
    handoffs: list[tuple[int, int]] = []
    steps: dict[str, list[int]] = {}
    reads = writes = 0
    for kind, _, t0, t1, stamps in events:
        if kind == "r":
            reads += 1
            for s in stamps:
                read_at.setdefault(s, (t0, t1))
        elif kind == "w":
            writes += 1
            for s in stamps:
                write_at.setdefault(s, (t0, t1))
        elif kind == "h":
            handoffs.append((t0, t1))
        else:
            steps.setdefault(kind, []).append(t1 - t0)
    latency: dict[int, int] = {}
    if consumer_path:
        with open(consumer_path) as f:
            latency = {s: lat for s, lat in json.load(f)}
    both = sorted(s for s in read_at if s in write_at)
    out: dict[str, Any] = {"messages": len(both), "reads": reads, "writes": writes, "handoffs": len(handoffs)}
    out["producer_to_gateway_read_us"] = _median_us([read_at[s][0] - s for s in both])
    out["gateway_read_to_write_us"] = _median_us([write_at[s][0] - read_at[s][0] for s in both])
    out["gateway_read_call_us"] = _median_us([read_at[s][1] - read_at[s][0] for s in both])
    out["gateway_write_call_us"] = _median_us([write_at[s][1] - write_at[s][0] for s in both])
    out["audit_handoff_call_us"] = _median_us([b - a for a, b in handoffs])
    # The steps (and hand-offs) inside the reads that brought a publish, summed per read.
    publish_reads = [(t0, t1) for kind, _, t0, t1, stamps in events if kind == "r" and stamps]
    inner = sorted((t0, t1, kind) for kind, _, t0, t1, _ in events if kind not in ("r", "w"))
    per_step: dict[str, list[int]] = {}
    i = 0
    for r0, r1 in publish_reads:
        while i < len(inner) and inner[i][0] < r0:
            i += 1
        sums: dict[str, int] = {}
        j = i
        while j < len(inner) and inner[j][0] <= r1:
            t0, t1, kind = inner[j]
            sums[kind] = sums.get(kind, 0) + t1 - t0
            j += 1
        for name in steps.keys() | {"h"}:
            per_step.setdefault(name, []).append(sums.get(name, 0))
    for name, spans in sorted(per_step.items()):
        out[f"in a publish read: {'audit_handoff' if name == 'h' else name}_us"] = _median_us(spans)
    if latency:
        joined = [s for s in both if s in latency]
        out["consumer_matched"] = len(joined)
        out["write_to_consumer_us"] = _median_us([s + latency[s] - write_at[s][0] for s in joined])
        out["end_to_end_us"] = _median_us([latency[s] for s in joined])
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--report":
        result = report(argv[1], argv[2] if len(argv) > 2 else None)
        print(json.dumps(result, indent=1))
        return 0
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    flags = {"--detail", "--no-audit", "--no-handoff"}
    given = set()
    while argv and argv[0] in flags:
        given.add(argv.pop(0))
    detail = "--detail" in given
    no_audit = "--no-audit" in given
    if "--no-handoff" in given:  # an experiment only: breaks A5 (records left to the writer's cycle)
        from gateway.audit import writer

        writer.AuditLog.handoff = lambda self: True  # type: ignore[method-assign]
    if no_audit:  # an experiment: what the audit log's share is (A1 wants it on in service)
        from gateway import audit, server

        server._open_audit = lambda config, lock=None: audit.NullAudit()  # type: ignore[assignment]
    install(argv[0], detail)
    from gateway.cli import main as cli_main

    return cli_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
