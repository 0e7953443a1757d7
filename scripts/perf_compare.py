"""Shows that `cmq-gateway perf` drives a broker at least as hard as pika or aio-pika can.

The same load (scenario 1: transient 16 B messages, default exchange, one queue) is driven by
three clients for the same time against the same broker: our generator, a pika
BlockingConnection loop, and an aio-pika loop (each client's fastest plain usage: publish in a
loop, consume with prefetch 1000 and one ack per message). Two shapes: publish only (no
consumer, the client's publish path alone) and publish + consume (one process each).

    .venv/bin/python scripts/perf_compare.py --uri amqp://guest:guest@127.0.0.1:5672/ --duration 10

pika and aio-pika are test dependencies (pyproject `test` extra), not runtime ones.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import secrets
import struct
import sys
import time
from typing import Any

from gateway.perf.config import RunConfig
from gateway.perf.runner import run

_TS = struct.Struct(">Q")


def _body() -> bytes:
    return _TS.pack(time.monotonic_ns()) + bytes(8)


# ------------------------------------------------------------------------------ pika


def _pika_produce(uri: str, queue: str, duration: float, out: Any) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=1)
    n = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        for _ in range(100):
            ch.basic_publish("", queue, _body(), props)
        n += 100
    conn.close()
    out.put(("sent", n))


def _pika_consume(uri: str, queue: str, duration: float, out: Any) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    count = 0
    end = time.monotonic() + duration

    def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
        nonlocal count
        count += 1
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message)
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.1)
    out.put(("received", count))
    conn.close()


# ------------------------------------------------------------------------------ aio-pika


def _aio_produce(uri: str, queue: str, duration: float, out: Any) -> None:
    async def go() -> int:
        import aio_pika

        conn = await aio_pika.connect(uri)
        ch = await conn.channel(publisher_confirms=False)
        n = 0
        end = time.monotonic() + duration
        while time.monotonic() < end:
            await asyncio.gather(
                *(
                    ch.default_exchange.publish(aio_pika.Message(_body()), routing_key=queue)
                    for _ in range(100)
                )
            )
            n += 100
        await conn.close()
        return n

    out.put(("sent", asyncio.run(go())))


def _aio_consume(uri: str, queue: str, duration: float, out: Any) -> None:
    async def go() -> int:
        import aio_pika

        conn = await aio_pika.connect(uri)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=1000)
        q = await ch.get_queue(queue, ensure=True)
        count = 0

        async def on_message(message: Any) -> None:
            nonlocal count
            count += 1
            await message.ack()

        await q.consume(on_message)
        await asyncio.sleep(duration)
        await conn.close()
        return count

    out.put(("received", asyncio.run(go())))


def _library_run(lib: str, uri: str, duration: float, consume: bool) -> dict[str, float]:
    import pika

    queue = f"perf-{secrets.token_hex(4)}-{lib}"
    admin = pika.BlockingConnection(pika.URLParameters(uri))
    admin.channel().queue_declare(queue)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    prod, cons = (_pika_produce, _pika_consume) if lib == "pika" else (_aio_produce, _aio_consume)
    procs = [ctx.Process(target=prod, args=(uri, queue, duration, out))]
    if consume:
        # The consumer runs a little longer to count the same window plus the tail.
        procs.append(ctx.Process(target=cons, args=(uri, queue, duration, out)))
    for p in procs:
        p.start()
    results = dict(out.get(timeout=duration + 60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    admin.channel().queue_delete(queue)
    admin.close()
    return {"sent": results["sent"] / duration, "received": results.get("received", 0) / duration}


def _native_run(uri: str, duration: float, consume: bool) -> dict[str, float]:
    result = run(RunConfig(uri=uri, duration=duration, rate=0.0, consumers=1 if consume else 0, progress=False),
                 None)  # rate 0: as fast as it goes, as the pika and aio-pika loops
    return {
        "sent": result["rates"]["sent"],
        "received": result["rates"]["received"],
        "saturated": result["generator"]["saturated"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args(argv)
    rows = []
    for consume in (False, True):
        shape = "publish + consume" if consume else "publish only"
        for client in ("cmq-gateway perf", "pika", "aio-pika"):
            print(f"running {client}, {shape}, {args.duration:g} s ...", file=sys.stderr, flush=True)
            if client == "cmq-gateway perf":
                r = _native_run(args.uri, args.duration, consume)
            else:
                r = _library_run(client, args.uri, args.duration, consume)
            rows.append((shape, client, r))
    print("| shape | client | sent msg/s | received msg/s |\n|---|---|---:|---:|")
    for shape, client, r in rows:
        recv = f"{r['received']:,.0f}" if shape != "publish only" else "-"
        print(f"| {shape} | {client} | {r['sent']:,.0f} | {recv} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
