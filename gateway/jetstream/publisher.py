"""Queue messages to JetStream, pipelined (docs/CLUSTER.md, "What limits one gateway").

nats-py's ``js.publish`` makes a request per message (a future, a timer and a random reply
token each), measured as most of a gateway's cost per message. Here every message of a loop
turn is written in one task, each with the reply subject ``<inbox>.<its LSN>``, and one
subscription on ``<inbox>.*`` takes the PubAcks: the LSN in the subject says which write
JetStream took. A write without an answer after RESEND_AFTER seconds, or answered "no
responders" (a stream not reachable for the moment), is sent again, in LSN order, with the
same ``Nats-Msg-Id``, so JetStream stores it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Publisher"]

log = logging.getLogger("cmq_gateway.jetstream")

RESEND_AFTER = 5.0
SWEEP_EVERY = 0.5


class _Write:
    __slots__ = ("subject", "payload", "headers", "sent_at", "done")

    def __init__(self, subject: str, payload: bytes, headers: dict[str, str],
                 done: Callable[[bool], None]) -> None:
        self.subject = subject
        self.payload = payload
        self.headers = headers
        self.sent_at = 0.0  # 0: not sent yet; -1: to send again at the next sweep
        self.done = done  # called with True when JetStream refused it for good


class Publisher:
    def __init__(self, nc: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.nc = nc
        self._loop = loop
        self.prefix = nc.new_inbox()
        self._writes: dict[int, _Write] = {}
        self._outbox: list[int] = []
        self._sub: Any = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        async def on_ack(msg: Any) -> None:
            self._acked(msg)

        self._sub = await self.nc.subscribe(self.prefix + ".*", cb=on_ack)
        self._sweeper = self._loop.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def publish(self, lsn: int, subject: str, payload: bytes, headers: dict[str, str],
                done: Callable[[bool], None]) -> None:
        self._writes[lsn] = _Write(subject, payload, headers, done)
        self._queue(lsn)

    def _queue(self, lsn: int) -> None:
        self._outbox.append(lsn)
        if len(self._outbox) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._outbox = self._outbox, []
        if batch:
            self._loop.create_task(self._send(batch))

    async def _send(self, batch: list[int]) -> None:
        now = time.monotonic()
        publish = self.nc.publish
        prefix = self.prefix
        for lsn in batch:
            w = self._writes.get(lsn)
            if w is None:
                continue
            w.sent_at = now
            try:
                await publish(w.subject, w.payload, reply=f"{prefix}.{lsn}", headers=w.headers)
            except Exception as e:  # noqa: BLE001 - NATS away: the sweep sends it again
                log.info("publish to JetStream not sent: %r", e)
                w.sent_at = -1.0

    def _acked(self, msg: Any) -> None:
        try:
            lsn = int(msg.subject.rpartition(".")[2])
        except ValueError:
            return
        w = self._writes.get(lsn)
        if w is None:
            return
        if msg.headers and msg.headers.get("Status"):  # 503 no responders: not stored
            w.sent_at = -1.0
            return
        try:
            refused = "error" in json.loads(msg.data)
        except ValueError:
            refused = False
        if refused:
            log.warning("jetstream refused a message (lsn %d): %s", lsn, msg.data[:200])
        del self._writes[lsn]
        w.done(refused)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            now = time.monotonic()
            again = sorted(lsn for lsn, w in self._writes.items()
                           if w.sent_at < 0 or (w.sent_at and now - w.sent_at > RESEND_AFTER))
            for lsn in again:
                self._writes[lsn].sent_at = 0.0
                self._queue(lsn)
