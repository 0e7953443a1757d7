"""Publishers with confirms and consumers that ack, through several gateways at once, keeping a
ledger of every message id: what was published, confirmed, delivered and acked. After the
load (and whatever fault happened during it) ``drain`` collects what is left and ``verdict``
counts confirmed messages that are neither acked nor back (lost), copies seen twice in the
final drain (duplicates) and ids never published (phantoms).

Shared by tests/cluster/test_cluster_faults.py and scripts/cluster_trials.py (aio-pika, real
sockets). A client whose gateway dies reconnects (to the same URL: a restarted gateway keeps
its port) and records the error; a publish whose confirm never came is unconfirmed, not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import aio_pika
import aio_pika.abc
import aiormq.exceptions

# How long one publish may wait for its confirm before the publisher counts it unconfirmed and
# goes on (a confirm that takes longer is a stall, which ``slowest_confirm`` shows).
CONFIRM_TIMEOUT = 30.0


@dataclass
class Ledger:
    published: set[str] = field(default_factory=set)
    confirmed: dict[str, str] = field(default_factory=dict)  # id -> queue
    nacked: set[str] = field(default_factory=set)
    delivered: Counter[str] = field(default_factory=Counter)
    acked: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)  # connection-level failures seen by clients
    confirmed_at: dict[str, float] = field(default_factory=dict)
    slowest_confirm: float = 0.0

    def confirmed_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.confirmed_at.values() if start <= t < end)


@dataclass
class Verdict:
    published: int
    confirmed: int
    acked: int
    recovered: int
    lost: int
    duplicates: int
    phantoms: int
    lost_ids: list[str]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.phantoms == 0

    def line(self) -> str:
        return (f"published {self.published}, confirmed {self.confirmed}, acked {self.acked}, "
                f"recovered {self.recovered}, lost {self.lost}, duplicates {self.duplicates}, "
                f"phantoms {self.phantoms}")


CONNECTION_ERRORS = (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError,
                     ConnectionError, OSError, asyncio.TimeoutError, RuntimeError)


async def _connect(url: str, ledger: Ledger, stop: asyncio.Event) -> aio_pika.abc.AbstractConnection | None:
    while not stop.is_set():
        try:
            return await aio_pika.connect(url, timeout=5)
        except CONNECTION_ERRORS as e:
            ledger.errors.append(f"connect {url}: {e!r}")
            await asyncio.sleep(0.3)
    return None


async def publisher(url: str, queues: list[str], ledger: Ledger, stop: asyncio.Event, prefix: str,
                    window: int = 10) -> None:
    """Persistent messages with unique ids (the body), ``window`` confirms in flight."""
    n = 0
    while not stop.is_set():
        conn = await _connect(url, ledger, stop)
        if conn is None:
            return
        try:
            ch = await conn.channel(publisher_confirms=True)
            exchange = ch.default_exchange
            while not stop.is_set():
                batch = []
                for _ in range(window):
                    mid = f"{prefix}-{n}"
                    queue = queues[n % len(queues)]
                    n += 1
                    ledger.published.add(mid)
                    batch.append((mid, queue))

                async def one(mid: str, queue: str, exchange: aio_pika.abc.AbstractExchange = exchange) -> None:
                    t0 = time.monotonic()
                    try:
                        await asyncio.wait_for(exchange.publish(
                            aio_pika.Message(mid.encode(), message_id=mid,
                                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                            routing_key=queue), CONFIRM_TIMEOUT)
                    except aio_pika.exceptions.DeliveryError:
                        ledger.nacked.add(mid)
                        return
                    now = time.monotonic()
                    ledger.confirmed[mid] = queue
                    ledger.confirmed_at[mid] = now
                    ledger.slowest_confirm = max(ledger.slowest_confirm, now - t0)

                results = await asyncio.gather(*(one(m, q) for m, q in batch), return_exceptions=True)
                failures = [r for r in results if isinstance(r, BaseException)]
                if failures:
                    raise failures[0]
        except CONNECTION_ERRORS as e:
            ledger.errors.append(f"publish {url}: {e!r}")
            await asyncio.sleep(0.2)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)


async def consumer(url: str, queue: str, ledger: Ledger, stop: asyncio.Event, prefetch: int = 20) -> None:
    """Acks every delivery (the ack is counted when sent: it may be lost with the gateway)."""
    while not stop.is_set():
        conn = await _connect(url, ledger, stop)
        if conn is None:
            return
        try:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=prefetch)
            q = await ch.get_queue(queue, ensure=False)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                mid = message.body.decode()
                ledger.delivered[mid] += 1
                await message.ack()
                ledger.acked.add(mid)

            await q.consume(on_message)
            while not stop.is_set() and not conn.is_closed:
                await asyncio.sleep(0.1)
            if conn.is_closed:
                ledger.errors.append(f"consume {url}: connection closed")
        except CONNECTION_ERRORS as e:
            ledger.errors.append(f"consume {url}: {e!r}")
            await asyncio.sleep(0.2)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)


async def declare(url: str, queues: list[str], visibility_timeout: int) -> None:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        for q in queues:
            await ch.declare_queue(q, durable=True, arguments={"x-cmq-visibility-timeout": visibility_timeout})
    finally:
        await conn.close()


async def wait_seen(url: str, queues: list[str], timeout: float = 15.0) -> None:
    """Until every queue is known to the gateway at ``url`` (declared through another)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await aio_pika.connect(url)
            try:
                for q in queues:
                    ch = await conn.channel()
                    await ch.declare_queue(q, passive=True)
                    await ch.close()
                return
            finally:
                await conn.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def drain(urls: list[str], queues: list[str], idle: float, timeout: float = 120.0,
                ledger: Ledger | None = None) -> Counter[str]:
    """Every message left in ``queues``, consumed (and acked) through ``urls`` in turn, until
    ``idle`` seconds pass with nothing new (longer than the visibility timeout, so deliveries a
    killed gateway held are back by then).

    With ``ledger``, the drain also goes on (up to ``timeout``) while a confirmed message that
    no consumer acked is still missing: after a NATS server is killed, nats-server 2.9 may hold
    a queue's deliveries for longer than ``idle`` while the consumer's new leader catches up
    with the stream (seen: pending messages, no waiting pull, for 5-30 s). Such a message is
    late, not lost; only one still missing after ``timeout`` counts as lost."""
    found: Counter[str] = Counter()
    conns = [await aio_pika.connect(u) for u in urls]
    last = time.monotonic()
    try:
        for i, q in enumerate(queues):
            ch = await conns[i % len(conns)].channel()
            await ch.set_qos(prefetch_count=100)
            queue = await ch.get_queue(q, ensure=False)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                nonlocal last
                found[message.body.decode()] += 1
                last = time.monotonic()
                await message.ack()

            await queue.consume(on_message)
        start = time.monotonic()
        owed = set() if ledger is None else {m for m in ledger.confirmed if m not in ledger.acked}
        while time.monotonic() - start < timeout:
            if time.monotonic() - last >= idle:
                owed -= found.keys()
                if not owed:
                    break
            await asyncio.sleep(0.1)
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)
    return found


def verdict(ledger: Ledger, found: Counter[str]) -> Verdict:
    lost = sorted(mid for mid in ledger.confirmed if mid not in ledger.acked and mid not in found)
    return Verdict(published=len(ledger.published), confirmed=len(ledger.confirmed), acked=len(ledger.acked),
                   recovered=sum(1 for mid in ledger.confirmed if mid in found),
                   lost=len(lost), duplicates=sum(c - 1 for c in found.values() if c > 1),
                   phantoms=sum(1 for mid in found if mid not in ledger.published), lost_ids=lost[:20])


async def run_load(publish_urls: list[str], consume_urls: list[str], queues: list[str], ledger: Ledger,
                   seconds: float, prefix: str, during=None) -> None:  # type: ignore[no-untyped-def]
    """Publishers on every ``publish_urls`` (all queues), a consumer per (url, queue) in
    ``consume_urls`` for ``seconds``; ``during`` (a coroutine function) runs alongside, e.g. the
    fault. Consumers stop with the publishers."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(publisher(u, queues, ledger, stop, f"{prefix}-p{i}"))
             for i, u in enumerate(publish_urls)]
    tasks += [asyncio.create_task(consumer(u, q, ledger, stop)) for u in consume_urls for q in queues]
    try:
        if during is not None:
            await asyncio.gather(asyncio.sleep(seconds), during())
        else:
            await asyncio.sleep(seconds)
    finally:
        stop.set()
        await asyncio.wait(tasks, timeout=CONFIRM_TIMEOUT + 30)
        for t in tasks:
            if not t.done():
                t.cancel()
