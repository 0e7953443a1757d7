"""Message TTLs that fall due while no gateway pulls the queue (CL4; docs/CLUSTER.md, "Timers
firing once").

One gateway, the holder of the lease ``sweep`` in ``CMQ_LEASE`` (gateway.jetstream.presence:
taken with ``create``, rewritten every heartbeat, taken over once its holder has been silent
for 5 s), looks at the undelivered head of each queue that may hold due messages, at the
second the head falls due (and at least every SWEEP_EVERY seconds), and ends it there:

* RabbitMQ TTL (x-message-ttl, the ``expiration`` property; header ``Cmq-Expires-At``):
  Expired, i.e. dead-lettered through x-dead-letter-exchange with reason ``expired`` or
  audited as a discard with reason ``expired``;
* CMQ maxTimeToLive (Q8): DeadLettered to the queue's dead-letter queue.

As RabbitMQ does with per-message TTLs, only the head is judged: a message behind one that
falls due later waits for it (with one x-message-ttl per queue the head is the first due).

Looked at: queues with x-message-ttl or maxTimeToLive, and queues any gateway published a
message with an expiration to (``e.<token>`` in CMQ_LEASE, written at most every NOTE_EVERY
seconds per queue). The gateway that pulls a message still judges it as before; the sweeper
and the puller end a message only after their own delete of it from the stream succeeded
(gateway.jetstream.head), so a message falling due while it is being pulled ends once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.broker import persistence as P
from gateway.jetstream.bodies import BODY_HEADER
from gateway.jetstream.head import EXPIRES_AT, count, end, first_undelivered, removed
from semantics import queue as Q
from semantics.jetstream.names import queue_token

if TYPE_CHECKING:
    from gateway.broker.queue import BrokerQueue
    from gateway.jetstream.broker import ClusterBroker
    from gateway.jetstream.queues import QueueStream

__all__ = ["Sweeper"]

log = logging.getLogger("cmq_gateway.jetstream")

SWEEP_EVERY = 1.0  # the longest wait between two looks (new heads, new queues)
MIN_WAIT = 0.01
NOTE_EVERY = 10.0  # e.<token> rewritten at most this often per queue
FORGET_AFTER = 60.0  # a queue no longer noted for expiring messages, and empty, is no longer looked at


class Sweeper:
    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self.expiring: dict[str, float] = {}  # queue token -> monotonic time last noted by any gateway
        self._noted: dict[str, float] = {}  # queue token -> monotonic time this gateway wrote e.<token>

    # -- which queues --------------------------------------------------------------------

    def note_expiring(self, q: BrokerQueue) -> None:
        """A message with its own expiration was published to ``q`` (no x-message-ttl)."""
        token = queue_token(q.vhost, q.name)
        now = time.monotonic()
        self.expiring[token] = now
        if now - self._noted.get(token, -NOTE_EVERY) >= NOTE_EVERY:
            self._noted[token] = now
            self.broker.spawn(self._put(token))

    async def _put(self, token: str) -> None:
        with contextlib.suppress(Exception):
            await self.broker.presence.kv.put(f"e.{token}", b"1")

    def noted(self, token: str) -> None:
        """Another gateway published a message with an expiration to the queue ``token``."""
        self.expiring[token] = time.monotonic()

    def looks_at(self, q: BrokerQueue) -> bool:
        a = q.attrs
        if a.message_ttl is not None or (a.dead_letter_queue is not None and a.max_time_to_live is not None):
            return True
        return queue_token(q.vhost, q.name) in self.expiring

    # -- the sweep, on the lease holder -------------------------------------------------------

    async def run(self) -> None:
        while True:
            wait = SWEEP_EVERY
            if self.broker.presence.holds_sweep():
                try:
                    due = await self._sweep()
                except Exception as e:  # noqa: BLE001 - NATS away: next round
                    log.info("TTL sweep failed: %r", e)
                    due = None
                if due is not None:
                    wait = min(SWEEP_EVERY, max(MIN_WAIT, due - self.broker.clock.now()))
            await asyncio.sleep(wait)

    async def _sweep(self) -> float | None:
        soonest: float | None = None
        for s in self.broker.messages.queue_streams():
            q = s.q
            if q.deleted or not s.ready.is_set() or not self.looks_at(q):
                continue
            try:
                due = await self._sweep_queue(s)
            except Exception as e:  # noqa: BLE001 - its stream just deleted, or NATS away: the others go on
                log.info("TTL sweep of queue %r failed: %r", q.name, e)
                continue
            if due is not None and (soonest is None or due < soonest):
                soonest = due
        return soonest

    async def _sweep_queue(self, s: QueueStream) -> float | None:
        """End the queue's due heads; the time the next head falls due (None: never)."""
        q = s.q
        js = self.broker.link.js
        refused = None
        info = await count(js, s)
        while not q.deleted:
            info, raw = await first_undelivered(js, s, info)
            if raw is None:
                token = queue_token(q.vhost, q.name)
                if time.monotonic() - self.expiring.get(token, 0.0) > FORGET_AFTER:
                    self.expiring.pop(token, None)
                return None
            if raw.seq == refused:
                return None  # not removable now: the next round tries again
            due, event = _due(q, raw)
            if due is None or due > self.broker.clock.now():
                return due
            if await removed(js, s, raw.seq):
                await end(self.broker, s, raw, *event)
            else:
                refused = raw.seq  # ended by its puller (the next head), unless it stays
        return None


def _due(q: BrokerQueue, raw: Any) -> tuple[float | None, tuple[Any, ...]]:
    """When the stored message ``raw`` falls due, and the local model's event that ends it
    (the TTL first, as CmqQueue judges it)."""
    exp = (raw.headers or {}).get(EXPIRES_AT)
    expires = None if exp is None else float(exp)
    a = q.attrs
    if a.dead_letter_queue is not None and a.max_time_to_live is not None:
        to_live = P.decode_message(raw.data)["enqueue_time"] + a.max_time_to_live
        if expires is None or to_live < expires:
            return to_live, (Q.DeadLettered, a.dead_letter_queue, "max_time_to_live")
    return expires, (Q.Expired, "ttl")


def settle_once(broker: ClusterBroker, vh: Any, s: QueueStream, events: list[Q.QueueEvent]) -> list[Q.QueueEvent]:
    """The pulling gateway's side: a leased message that its TTL or maxTimeToLive ended is
    ended only once its delete from the stream succeeded (the sweeper may have ended it)."""
    keep: list[Q.QueueEvent] = []
    for e in events:
        timed = (isinstance(e, Q.Expired) and e.reason == "ttl") or (
            isinstance(e, Q.DeadLettered) and e.reason == "max_time_to_live")
        lease = s.leases.pop(e.message.msg_id, None) if timed else None
        if lease is None:
            keep.append(e)
        else:
            broker.spawn(_end_pulled(broker, vh, s, e, lease))
    return keep


async def _end_pulled(broker: ClusterBroker, vh: Any, s: QueueStream, e: Q.QueueEvent, lease: Any) -> None:
    try:
        mine = await removed(broker.link.js, s, lease.metadata.sequence.stream)
    except Exception:  # noqa: BLE001 - NATS away: ended here, at least once
        mine = True
    broker.messages.pulls.reply(lease, b"+ACK")  # the consumer forgets its delivery (not held until ack_wait)
    if mine:
        name = (lease.headers or {}).get(BODY_HEADER)
        if name is not None:
            broker.spawn(broker.messages.bodies.delete(name))
        broker._queue_events(vh, s.q, [e])
