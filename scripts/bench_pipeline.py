"""The gateway's CPU cost per message, without sockets: publish -> route -> deliver -> ack.

One producer and one consumer connection (the real AMQPConnection, Session and Broker) are fed
bytes in-process through a fake transport, in rounds of --batch publishes, each followed by the
acks of what was delivered. The result is microseconds of gateway CPU per message for the
scenario-1 traffic (16 B, default exchange, prefetch 1000, ack each), with the audit log on or
off. On the shared 2-core machine this is far steadier than `cmq-gateway perf` against a
listening gateway, so it is what the before/after numbers of the hot-path commits use.

    .venv/bin/python scripts/bench_pipeline.py [--messages 200000] [--audit] [--metrics] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import struct
import tempfile
import time
from typing import Any

from pamqp import commands as C
from pamqp import frame

from gateway.config import GatewayConfig
from gateway.perf.frames import basic_ack, encode_properties, publish_template
from gateway.server import GC_THRESHOLDS, Gateway
from gateway.transport import AMQPConnection

_HEAD = struct.Struct(">BHI")
_U64 = struct.Struct(">Q")


class FakeTransport:
    """Collects what the gateway writes; reading pauses are recorded, not acted on."""

    def __init__(self, port: int) -> None:
        self.out: list[bytes] = []
        self.port = port
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self.port) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data


def _method(channel: int, method: Any) -> bytes:
    return bytes(frame.marshal(method, channel))


def _handshake() -> bytes:
    return (b"AMQP\x00\x00\x09\x01"
            + _method(0, C.Connection.StartOk(client_properties={"capabilities": {}}, mechanism="PLAIN",
                                              response="\0guest\0guest"))
            + _method(0, C.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
            + _method(0, C.Connection.Open(virtual_host="/"))
            + _method(1, C.Channel.Open()))


def delivery_tags(data: bytes) -> list[int]:
    """The delivery tags of the basic.deliver frames in ``data`` (whole frames only)."""
    tags = []
    pos, end = 0, len(data)
    while end - pos >= 8:
        ftype, _, size = _HEAD.unpack_from(data, pos)
        if ftype == 1 and data[pos + 7:pos + 11] == b"\x00\x3c\x00\x3c":
            n = data[pos + 11]
            tags.append(_U64.unpack_from(data, pos + 12 + n)[0])
        pos += 8 + size
    return tags


async def run(messages: int, batch: int, audit: bool, metrics: bool = False) -> float:
    config = GatewayConfig(data_dir=None)
    gw = Gateway(config)
    tmp = tempfile.mkdtemp(prefix="bench-pipeline-")
    if audit:
        from gateway.audit import AuditLog
        gw.audit = AuditLog(tmp)
    from gateway.broker import Broker
    gw.broker = await Broker.open(None, audit=gw.audit, config=config)
    if metrics:  # the /metrics counting tee in front of the audit sink, as `serve` installs it
        from gateway.metrics import attach
        attach(gw)
    producer, consumer = AMQPConnection(gw), AMQPConnection(gw)
    pt, ct = FakeTransport(1), FakeTransport(2)
    producer.connection_made(pt)  # type: ignore[arg-type]
    consumer.connection_made(ct)  # type: ignore[arg-type]
    consumer.data_received(_handshake() + _method(1, C.Queue.Declare(queue="perf-q"))
                           + _method(1, C.Basic.Qos(prefetch_count=1000))
                           + _method(1, C.Basic.Consume(queue="perf-q", consumer_tag="c")))
    producer.data_received(_handshake())
    await asyncio.sleep(0)
    pt.take(), ct.take()
    tmpl = publish_template(1, "", "perf-q", 16, encode_properties(delivery_mode=1), 131072)
    one = tmpl.render(0)
    chunk = one * batch
    received = 0
    gc0 = [g["collections"] for g in gc.get_stats()]
    c0 = time.thread_time()
    t0 = time.perf_counter()
    sent = 0
    while received < messages:
        if sent < messages:
            producer.data_received(chunk)
            sent += batch
        for _ in range(4):  # the call_soon turns: the rest of the batch, flushes
            await asyncio.sleep(0)
        tags = delivery_tags(ct.take())
        received += len(tags)
        if tags:
            consumer.data_received(b"".join(basic_ack(1, t, False) for t in tags))
            await asyncio.sleep(0)
        elif sent >= messages:
            await asyncio.sleep(0)
    elapsed = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    gcs = [g["collections"] - c for g, c in zip(gc.get_stats(), gc0, strict=True)]
    print(f"  loop thread CPU {cpu / received * 1e6:.2f} us/message, wall {elapsed / received * 1e6:.2f}; gc collections by generation {gcs}")
    if audit:
        gw.audit.close()
    await gw.broker.close()
    return elapsed / received * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--audit", action="store_true", help="the audit log on (its writer thread included)")
    ap.add_argument("--metrics", action="store_true", help="the /metrics counting tee on (gateway.metrics.attach)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="pyinstrument the first run")
    args = ap.parse_args()
    # The collector as `serve` sets it: with the interpreter's default the audit log's queued
    # records alone made ~2,300 gen-0 collections a run, 1-2 us a message that serve never pays.
    gc.set_threshold(*GC_THRESHOLDS)
    import uvloop
    results = []
    for i in range(args.repeat):
        if args.profile and i == 0:
            from pyinstrument import Profiler
            with Profiler() as prof:
                results.append(uvloop.run(run(args.messages, args.batch, args.audit, args.metrics)))
            prof.print(show_all=False)
        else:
            results.append(uvloop.run(run(args.messages, args.batch, args.audit, args.metrics)))
    print(f"audit {'on ' if args.audit else 'off'} metrics {'on ' if args.metrics else 'off'}  {min(results):.2f} us/message (best of {args.repeat}; "
          f"all: {', '.join(f'{r:.2f}' for r in results)}) = {1e6 / min(results):,.0f} msg/s of one core")


if __name__ == "__main__":
    main()
