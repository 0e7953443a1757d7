"""One worker process of the load generator: several producer or several consumer connections
on one event loop (uvloop), reporting cumulative counters to the main process over a pipe.

Control over the pipe (tuples): main -> worker `("go", start_ns, duration_ns)`, `("stop",)`;
worker -> main `("ready", id)`, `("tick", id, Snapshot)`, `("done", id, Snapshot)`,
`("error", id, text)`. All processes share CLOCK_MONOTONIC, so each worker ends its own
measurement window at start_ns + duration_ns without asking the main process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from pamqp import commands

from gateway.perf.client import AmqpClient, parse_uri
from gateway.perf.frames import PublishTemplate, basic_ack, encode_properties, publish_template
from gateway.perf.stats import ConfirmTracker, LatencyHistogram
from gateway.perf.topology import Route

__all__ = ["Snapshot", "WorkerSpec", "worker_main"]

# Messages written per loop turn when the rate is not capped: large enough to amortise the
# loop overhead, small enough that the confirm window and flow control stay responsive.
_BATCH = 64
_TICK_S = 0.5
_AT_END: list[Callable[[], None]] = []  # run as the worker ends (CMQ_PERF_TRACE's dump)


@dataclass
class WorkerSpec:
    worker_id: int
    role: str  # "producer" or "consumer"
    uris: list[str]  # per connection (routes, then queues): the runner deals them over the gateways
    routes: list[list[Route]] = field(default_factory=list)  # per producer connection
    queues: list[list[str]] = field(default_factory=list)  # per consumer connection
    size: int = 16
    persistent: bool = False
    confirm: int = 0
    rate: float = 0.0
    prefetch: int = 1000
    multi_ack: int = 1
    ack_delay: float = 0.0  # role "slow": seconds from a delivery to its ack (prefetch 1)
    sndbuf: int = 0  # producers: their sockets' kernel send buffer (RunConfig.sndbuf)


@dataclass
class Snapshot:
    """Cumulative since "go"; the *_window fields are frozen at the end of the window."""

    sent: int = 0
    confirmed: int = 0
    nacked: int = 0
    received: int = 0
    sent_window: int = 0
    confirmed_window: int = 0
    received_window: int = 0
    cpu_window: float = 0.0
    cpu_total: float = 0.0
    latency: dict[int, int] = field(default_factory=dict)  # cumulative counts of changed buckets
    latency_max_us: int = 0
    # The largest latency of the deliveries since the previous snapshot (not cumulative): in a
    # flood, how far this consumer is behind the producer now, for the runner's per-second lag.
    recent_max_us: int = 0
    error: str | None = None


class _Worker:
    def __init__(self, spec: WorkerSpec, pipe: Connection) -> None:
        self.spec = spec
        self.pipe = pipe
        self.snap = Snapshot()
        self.hist = LatencyHistogram()
        self.clients: list[AmqpClient] = []
        self.go = asyncio.Event()
        self.stop = asyncio.Event()  # main says: wind down (after the window, and drain)
        self.window_over = asyncio.Event()
        self.start_ns = 0
        self.deadline_ns = 0
        self.cpu0 = 0.0

    # ---------------------------------------------------------------- control

    def _on_pipe(self) -> None:
        try:
            self._read_pipe()
        except (EOFError, OSError):
            # The main process is gone (killed): wind down now, or the closed pipe, always
            # readable, would spin this process on a core for as long as it lives.
            asyncio.get_running_loop().remove_reader(self.pipe.fileno())
            if not self.go.is_set():
                self.start_ns = self.deadline_ns = time.monotonic_ns()
                self.go.set()
            self.stop.set()

    def _read_pipe(self) -> None:
        while self.pipe.poll():
            msg = self.pipe.recv()
            if msg[0] == "go":
                self.start_ns, duration_ns = msg[1], msg[2]
                self.deadline_ns = self.start_ns + duration_ns
                self.go.set()
            elif msg[0] == "stop":
                self.stop.set()

    def _send(self, kind: str) -> None:
        self.snap.cpu_total = time.process_time() - self.cpu0
        self.snap.latency = self.hist.take_delta()
        self.snap.latency_max_us = self.hist.max_us
        self.snap.recent_max_us = self.hist.take_recent_max()
        self.pipe.send((kind, self.spec.worker_id, self.snap))

    async def _ticker(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), _TICK_S)
            self._send("tick")

    async def _window(self) -> None:
        # A stop before the deadline (the main process gone) ends the window with it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), max(0.0, (self.deadline_ns - time.monotonic_ns()) / 1e9))
        s = self.snap
        s.sent_window, s.confirmed_window, s.received_window = s.sent, s.confirmed, s.received
        s.cpu_window = time.process_time() - self.cpu0
        self.window_over.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.pipe.fileno(), self._on_pipe)
        sndbuf = self.spec.sndbuf if self.spec.role == "producer" else 0
        self.clients = list(await asyncio.gather(*(AmqpClient.connect(parse_uri(u), sndbuf=sndbuf)
                                                   for u in self.spec.uris)))
        if self.spec.role == "producer":
            starters = [
                self._setup_producer(c, r) for c, r in zip(self.clients, self.spec.routes, strict=True)
            ]
        else:
            setup = self._setup_slow if self.spec.role == "slow" else self._setup_consumer
            starters = [setup(c, q) for c, q in zip(self.clients, self.spec.queues, strict=True)]
        runners = await asyncio.gather(*starters)
        self.pipe.send(("ready", self.spec.worker_id))
        await self.go.wait()
        self.cpu0 = time.process_time()
        tasks = [asyncio.create_task(r) for r in runners]
        tasks.append(asyncio.create_task(self._window()))
        ticker = asyncio.create_task(self._ticker())
        try:
            await asyncio.gather(*tasks)
            await self.stop.wait()
        finally:
            self.stop.set()
            await ticker
            # The broker reads a connection in order, so close-ok means it has read every
            # publish before it; a broker applying flow control may take a while.
            await asyncio.gather(*(c.close(timeout=15.0) for c in self.clients), return_exceptions=True)
        errors = [str(c.error) for c in self.clients if c.error is not None]
        if errors:
            self.snap.error = errors[0]
        self._send("done")

    # ---------------------------------------------------------------- producers

    async def _setup_producer(self, client: AmqpClient, routes: list[Route]) -> Coroutine[Any, Any, None]:
        spec = self.spec
        await client.open_channel(1)
        tracker = ConfirmTracker()
        room = asyncio.Event()
        room.set()
        if spec.confirm:
            await client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        templates = [
            publish_template(
                1,
                r.exchange,
                r.routing_key,
                spec.size,
                encode_properties(delivery_mode=2 if spec.persistent else 1, headers=r.headers),
                client.frame_max,
            )
            for r in routes
        ]
        snap = self.snap

        def on_confirm(tag: int, multiple: bool, ok: bool) -> None:
            n = tracker.confirm(tag, multiple, ok)
            if ok:
                snap.confirmed += n
            else:
                snap.nacked += n
            room.set()

        client.on_confirm = on_confirm
        return self._produce(client, templates, tracker, room)

    async def _produce(
        self,
        client: AmqpClient,
        templates: list[PublishTemplate],
        tracker: ConfirmTracker,
        room: asyncio.Event,
    ) -> None:
        spec = self.spec
        snap = self.snap
        window = spec.confirm
        rate = spec.rate
        n_tpl = len(templates)
        sent = 0  # this connection's count: the confirm window and the rate cap are per producer
        deadline = self.deadline_ns
        start = self.start_ns
        while not self.stop.is_set():
            now = time.monotonic_ns()
            if now >= deadline:
                break
            n = _BATCH
            if rate:
                due = int((now - start) * rate / 1e9) + 1 - sent
                if due <= 0:
                    # Sleep until the next message is due (asyncio's timer resolution is ~1 ms,
                    # which smooths rather than bursts at the rates where it matters).
                    await asyncio.sleep((sent - (now - start) * rate / 1e9) / rate)
                    continue
                n = min(n, due)
            if window:
                free = window - (sent - tracker.acked - tracker.nacked)
                if free <= 0:
                    room.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(room.wait(), 0.1)
                    continue
                n = min(n, free)
            await client.writable()
            # Stamped once the socket takes it: a wait for room (the broker's flow control)
            # is not time the message spent in the broker, nor lag of its consumer.
            tsb = time.monotonic_ns().to_bytes(8, "big")
            if n_tpl == 1:
                t = templates[0]
                client.write((t.head + tsb + t.tail) * n)
            else:
                client.write(
                    b"".join(
                        templates[(sent + i) % n_tpl].head + tsb + templates[(sent + i) % n_tpl].tail
                        for i in range(n)
                    )
                )
            sent += n
            snap.sent += n
            # Let the loop run the socket and the confirms between batches.
            await asyncio.sleep(0)
        if window:
            # Wait (bounded) for the confirms still in flight, so that confirmed is complete.
            end = time.monotonic() + 10.0
            while sent - tracker.acked - tracker.nacked > 0 and time.monotonic() < end and client.is_open:
                room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room.wait(), 0.2)

    # ---------------------------------------------------------------- consumers

    async def _setup_consumer(self, client: AmqpClient, queues: list[str]) -> Coroutine[Any, Any, None]:
        spec = self.spec
        await client.open_channel(1)
        no_ack = spec.multi_ack == 0
        if not no_ack and spec.prefetch:
            await client.rpc(
                1, commands.Basic.Qos(prefetch_count=min(spec.prefetch, 65535)), commands.Basic.QosOk
            )
        # Acking every N with prefetch below N would stall: never wait for more than the prefetch.
        every = max(1, min(spec.multi_ack, spec.prefetch) if spec.prefetch else spec.multi_ack)
        multiple = every > 1
        snap = self.snap
        hist = self.hist
        record = hist.record_ns
        pending = 0
        last_tag = 0

        def on_delivery(channel: int, tag: int, latency_ns: int) -> None:
            nonlocal pending, last_tag
            snap.received += 1
            if latency_ns >= 0:
                record(latency_ns)
            if no_ack:
                return
            pending += 1
            last_tag = tag
            if pending >= every:
                client.write(basic_ack(1, tag, multiple))
                pending = 0

        def flush() -> None:
            nonlocal pending
            if pending and client.is_open:
                client.write(basic_ack(1, last_tag, True))
                pending = 0

        client.on_delivery = _traced(client, on_delivery)
        for i, q in enumerate(queues):
            await client.rpc(
                1,
                commands.Basic.Consume(queue=q, consumer_tag=f"perf-{i}", no_ack=no_ack),
                commands.Basic.ConsumeOk,
            )

        async def consume() -> None:
            # Deliveries are handled in data_received; this only flushes a partial ack batch
            # now and then, so a slow trickle (or the drain) is acked too.
            while not self.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.1)
                flush()

        return consume()


    async def _setup_slow(self, client: AmqpClient, queues: list[str]) -> Coroutine[Any, Any, None]:
        """A consumer that works on each message for ``ack_delay`` before acking it, with
        prefetch 1: it can only go as fast as the broker turns its ack into the next delivery.
        Its histogram holds that turnaround (ack written -> next delivery read), not latency."""
        await client.open_channel(1)
        await client.rpc(1, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
        loop = asyncio.get_running_loop()
        delay = self.spec.ack_delay
        snap = self.snap
        record = self.hist.record_ns
        acked_ns = 0

        def ack(tag: int) -> None:
            nonlocal acked_ns
            if client.is_open:
                client.write(basic_ack(1, tag, False))
                acked_ns = time.monotonic_ns()

        def on_delivery(channel: int, tag: int, latency_ns: int) -> None:
            nonlocal acked_ns
            if self.go.is_set():  # the backlog's first delivery can come before "go"
                snap.received += 1
                if acked_ns:
                    record(time.monotonic_ns() - acked_ns)
            acked_ns = 0
            loop.call_later(delay, ack, tag)

        client.on_delivery = on_delivery
        for i, q in enumerate(queues):
            await client.rpc(
                1, commands.Basic.Consume(queue=q, consumer_tag=f"perf-slow-{i}"), commands.Basic.ConsumeOk
            )

        async def consume() -> None:
            await self.stop.wait()

        return consume()


def _traced(client: AmqpClient, on_delivery: Callable[[int, int, int], None]) -> Callable[[int, int, int], None]:
    """With CMQ_PERF_TRACE=FILE, the consumer notes (send stamp, latency) of every delivery
    and writes them to FILE (JSON) at exit, for gateway.perf.trace's report; without it
    ``on_delivery`` itself, so an untraced run pays nothing."""
    path = os.environ.get("CMQ_PERF_TRACE")
    if not path:
        return on_delivery
    noted: list[tuple[int, int]] = []
    append = noted.append

    def traced(channel: int, tag: int, latency_ns: int) -> None:
        append((client._content_sent_ns, latency_ns))
        on_delivery(channel, tag, latency_ns)

    def dump() -> None:
        with open(path, "w") as f:
            json.dump(noted, f)

    _AT_END.append(dump)
    return traced


def worker_main(spec: WorkerSpec, pipe: Connection) -> None:
    """Process entry point (multiprocessing, spawn)."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run  # type: ignore[assignment]
    try:
        runner(_Worker(spec, pipe).run())
    except BaseException as exc:  # report, never hang the main process
        with contextlib.suppress(Exception):
            pipe.send(("error", spec.worker_id, f"{exc!r}\n{traceback.format_exc()}"))
    finally:
        for at_end in _AT_END:
            at_end()
