"""Queue messages published into their streams, and the PubAcks that release confirms (M10, M14, CL3).

Part of the broker's message storage on JetStream (gateway.jetstream.messages). Each message is
one publish to its queue's stream under the store's LSN (``JetStreamStore.track_message``); a
confirm waits for its PubAck, and a write JetStream refuses makes it a basic.nack (the PubAck
rule). Most publishes are pipelined on the publisher's connection (gateway.jetstream.publisher);
a large body (gateway.jetstream.bodies), a queue whose stream is not there yet, and whatever
follows those in the same queue go one request each, in the queue's chain, so their order holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import TYPE_CHECKING

from nats.errors import MaxPayloadError
from nats.js.errors import APIError

from gateway.broker import persistence as P
from gateway.jetstream.bodies import BODY_HEADER, Bodies
from gateway.jetstream.direct import RECEIVED
from gateway.jetstream.head import EXPIRES_AT, MSG_ID, VISIBLE_AT
from gateway.jetstream.publisher import Publisher

if TYPE_CHECKING:
    from gateway.broker.message import Message
    from gateway.jetstream.broker import ClusterBroker
    from gateway.jetstream.pulls import Pulls
    from gateway.jetstream.queues import QueueStream

__all__ = ["NotStoredYet", "Writes"]

LANDED_WAIT = 5.0  # a count waits at most this long for the publishes before it


class NotStoredYet(Exception):
    """JetStream's answer does not say the message is stored (retried, never confirmed)."""


class Writes:
    """See the module docstring: one per broker, owned by its JetStreamMessages."""

    def __init__(self, broker: ClusterBroker, bodies: Bodies, pulls: Pulls) -> None:
        self.broker = broker
        self.bodies = bodies
        self.pulls = pulls
        link = broker.link
        self.publisher = Publisher(link.publishing, asyncio.get_running_loop())
        self.pub_js = link.publishing.jetstream(timeout=5.0)
        self._durable_scheduled = False

    def publish(self, s: QueueStream, msg: Message, now: float, delay: float | None, expires_at: float | None,
                received: int = 0, enqueued: float | None = None) -> int:
        """``received``, ``enqueued``: a direct message going into the stream (gateway.jetstream.
        direct), its receives so far and its enqueue time."""
        q = s.q
        big = len(msg.body) > self.bodies.limit
        payload = P.encode_message(q.vhost, q.name, msg.msg_id, now if enqueued is None else enqueued, msg.exchange,
                                   msg.routing_key, msg.properties.raw, b"" if big else msg.body)
        headers = {MSG_ID: msg.msg_id}
        if received:
            headers[RECEIVED] = str(received)
        if big:
            headers[BODY_HEADER] = f"{s.stream or q.name}.{msg.msg_id}"
        if delay:
            headers[VISIBLE_AT] = repr(now + delay)
            s.delays[msg.msg_id] = (now + delay, False)  # delayMsgNum (gateway.jetstream.api_receive)
        else:
            # Direct delivery waits until this gateway pulled it (gateway.jetstream.direct:
            # FIFO per publisher); a delayed message is in no order.
            s.last_own = msg.msg_id
            s.own_taken = False
        if expires_at is not None:
            headers[EXPIRES_AT] = repr(expires_at)
        q.remote_ready += 1
        s.in_flight += 1
        s.published_at = now  # counted (COUNT_RECENT), but not a use: x-expires ignores publishes
        done = s.on_published  # made at the first pipelined write, once ready (never cleared)
        if big or s.slow_writes or s.chain.waiting or (done is None and not s.ready.is_set()):
            # One request each, in the queue's chain: a large body goes to the object store
            # first, a queue not ready waits for its stream; and while any of these is under
            # way, the queue's later messages follow them there, so their order holds.
            s.slow_writes += 1
            # Each waits for the one before it to be stored before its own record goes
            # (_publish): the store runs them side by side (its chain orders retries only),
            # and a large body's upload would let a later message's record overtake it.
            mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            before, s.slow_tail = s.slow_tail, mine
            return self.broker.store.track(self._publish, s, payload, headers, msg.body if big else None,
                                           before, mine, chain=s.chain)
        if done is None:
            done = s.on_published = partial(self.published, s)
        return self.broker.store.track_message(self.publisher, s.subject, payload, headers, done, s.is_gone)

    async def _publish(self, s: QueueStream, payload: bytes, headers: dict[str, str], body: bytes | None,
                       before: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        """One slow write (Writes.publish), retried by the store until JetStream takes it or
        refuses it; ``mine`` is done once it is over for good, and the queue's next slow write
        (M11: a queue's order) waits for that (``before``) to send its record."""
        q = s.q
        while not s.ready.is_set() and not q.deleted:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(s.ready.wait(), 1.0)
        if q.deleted:
            # Deleted since it was routed there (here, or through another gateway, which deleted
            # its stream): the message goes with the queue, as on one broker. Retried, a publish
            # to a stream that is gone would hold every later confirm of this gateway.
            self._over(s, mine)
            return
        try:
            if body is not None:
                await self.bodies.put(headers[BODY_HEADER], body)
            if before is not None and not before.done():
                await before
            # On the publisher's connection: behind the queue's pipelined messages sent before it.
            ack = await self.pub_js.publish(s.subject, payload, headers=headers)
        except (APIError, MaxPayloadError):
            self._over(s, mine)  # refused for good (the store nacks it)
            raise
        if not ack.seq:
            # CL3: a duplicate whose first attempt is staged, not stored (gateway.jetstream.
            # publisher): not an acknowledgement; the store sends it again.
            raise NotStoredYet(f"{s.stream}: duplicate of a publish not yet stored")
        self._over(s, mine)

    def _over(self, s: QueueStream, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        s.slow_writes -= 1
        self.published(s)

    def published(self, s: QueueStream) -> None:
        s.in_flight -= 1
        if s.in_flight == 1 and s.landed is not None and not s.landed.done():
            s.landed.set_result(None)  # only the trim's own count is left (gateway.jetstream.maxlength)
        if not s.in_flight and s.plain_gets:
            self.pulls.want(s)

    def durable_soon(self, durable: int) -> None:
        """JetStream acknowledges each write on its own: the confirms they release go out
        once per loop turn, after every acknowledgement that arrived with this one, so that a
        burst is confirmed as RabbitMQ confirms it (basic.ack multiple=true), not frame by frame."""
        if not self._durable_scheduled:
            self._durable_scheduled = True
            asyncio.get_running_loop().call_soon(self._durable_now)

    def _durable_now(self) -> None:
        self._durable_scheduled = False
        self.broker._on_durable(self.broker.store.durable_lsn)

    async def landed(self, s: QueueStream) -> None:
        """A count follows the publishes before it on this gateway (as on one broker)."""
        deadline = self.broker.clock.now() + LANDED_WAIT
        while s.in_flight and self.broker.clock.now() < deadline:
            await asyncio.sleep(0.005)
