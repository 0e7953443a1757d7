"""CMQ API receives and counts on a JetStream queue (SPEC CA2, CA4).

On JetStream a queue's messages stay in its stream until a gateway pulls them for someone
who takes them (gateway.jetstream.pulls: its consumers' credit, its basic.gets). A CMQ API
``ReceiveMessage`` has neither a channel nor a consumer, so without a word of its own no pull
is made for it and the local model, which holds only what was pulled, has nothing to give:
:class:`ReceiveDemand` is that word. While it lasts the queue asks JetStream for the
receive's count (a ``no_wait`` pull when the receive does not long-poll, so that "no message"
is JetStream's answer and not a timer's; a long poll makes waiting pulls once that found
nothing), and what comes is kept here for the receive instead of being handed back as surplus.
A receive is answered once its pull is complete (the batch came, or JetStream said there is
no more), not at its first message, so that what it asked for is not pulled for nothing and
handed back: every such return counts as a delivery in JetStream (the dequeueCount, Q8).

:func:`counts` reads the queue's numbers as GetQueueAttributes reports them: what JetStream
has not delivered yet is Active wherever it is, what a gateway holds Inactive (received and
not deleted, or delayed there) is JetStream's ack-pending less what is Active here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from gateway.jetstream.direct import direct_counts
from gateway.jetstream.head import undelivered

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker
    from gateway.jetstream.queues import QueueStream

__all__ = ["ReceiveDemand", "counts", "demand_for", "queue_counts"]

log = logging.getLogger("cmq_gateway.jetstream")

COUNT_WAIT = 5.0  # hang protection of one consumer_info read (the local estimate answers then)
ACK_WAIT = 2.0  # hang protection of the confirmation of the latest ack


class ReceiveDemand:
    """One CMQ API receive of up to ``count`` messages from a JetStream queue, from its first
    look to its answer. Use as a context manager; :meth:`pulled` waits for JetStream."""

    def __init__(self, broker: ClusterBroker, s: QueueStream, count: int, long_poll: bool) -> None:
        self.broker = broker
        self.s = s
        self.count = count
        self.long_poll = long_poll
        self.polling = False  # a long poll whose first (no_wait) pull found nothing

    def __enter__(self) -> ReceiveDemand:
        self.s.api_demand += self.count
        return self

    def __exit__(self, *exc: object) -> None:
        s = self.s
        s.api_demand -= self.count
        s.api_polls -= self.polling
        if not s.api_demand and not s.q.deleted:
            self.broker.messages.pulls.api_demand_ended(s)

    async def pulled(self, timeout: float) -> bool:
        """Ask JetStream for what the receive still lacks, and wait until a pull answered
        (messages came, or none was there: True) or ``timeout`` seconds passed (False)."""
        s = self.s
        if s.q.deleted or timeout <= 0:
            return False
        signal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        s.api_signals.append(signal)
        try:
            self.broker.messages.pulls.want(s)
            await asyncio.wait_for(signal, timeout)
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                s.api_signals.remove(signal)
        if self.long_poll and not self.polling:
            self.polling = True  # nothing there now: from here on, pulls that wait at the server
            s.api_polls += 1
        return True


def demand_for(broker: Any, q: Any, count: int, long_poll: bool) -> ReceiveDemand | None:
    """The demand of a receive from ``q`` (MessageStorage.demand): None on the embedded
    store, which holds every message in the local model."""
    demand: ReceiveDemand | None = broker.messages.demand(q, count, long_poll)
    return demand


def answer_receives(s: QueueStream, *, status: bool) -> None:
    """Deliveries were taken (``status`` False) or a pull ended (True): the receives waiting
    look again once their pull is complete, or at once for a long poll's waiting pulls."""
    q = s.q
    if not s.api_signals:
        return
    if not status and s.requested and q.cmq.active < s.api_demand and not s.api_polls:
        return  # more of the batch is on its way (JetStream sends it message by message)
    signals, s.api_signals = s.api_signals, []
    for signal in signals:
        if not signal.done():
            signal.set_result(None)


async def _acks_applied(broker: ClusterBroker, s: QueueStream) -> None:
    """The acks this gateway sent for the queue are applied by JetStream: they go without waiting
    for an answer (gateway.jetstream.pulls), and JetStream applies them apart from its API
    requests, so a count right after a delete could still show it Inactive. The latest one is
    sent again as a request, which JetStream answers once it applied it, and the acks of one
    consumer are applied in order. A second ack of a message changes nothing."""
    reply, s.last_ack = s.last_ack, None
    if reply is not None:
        with contextlib.suppress(Exception):
            await broker.link.nc.request(reply, b"+ACK", timeout=ACK_WAIT)


async def counts(broker: Any, q: Any) -> tuple[int, int, int, int] | None:
    """MessageStorage.counts of ``q``, whichever store holds it."""
    found: tuple[int, int, int, int] | None = await broker.messages.counts(q)
    return found


async def queue_counts(broker: ClusterBroker, s: QueueStream) -> tuple[int, int, int, int] | None:
    """(Active, Inactive, Delayed, rewindable) of a JetStream queue from its consumer and
    stream, after this gateway's own publishes landed; None when
    JetStream does not answer. Delayed messages are those this gateway sent or pulled (a
    delayed message another gateway sent and nobody pulled yet counts as Active until a
    gateway pulls it). Rewindable (Q6): what a queue with rewind keeps after its deletion, i.e.
    the stream's messages neither undelivered nor leased (all of them, not only those of the
    last rewindSeconds: the stream keeps them for the retention)."""
    q = s.q
    js = broker.link.js
    try:
        await asyncio.wait_for(s.ready.wait(), COUNT_WAIT)
        await broker.messages.writes.landed(s)
        await _acks_applied(broker, s)
        rewinds = q.attrs.rewind_seconds > 0
        info = await asyncio.wait_for(undelivered(js, s.stream, not rewinds), COUNT_WAIT)
        stored = (await asyncio.wait_for(js.stream_info(s.stream), COUNT_WAIT)).state.messages if rewinds else 0
    except Exception as e:  # noqa: BLE001 - NATS away: the local estimate answers
        log.info("count of %s not read: %r", s.stream, e)
        return None
    q.remote_ready = pending = info.num_pending or 0
    leased = info.num_ack_pending or 0
    now = broker.clock.now()
    for msg_id in [m for m, (at, _) in s.delays.items() if at <= now]:
        del s.delays[msg_id]
    naked = sum(pulled for _, pulled in s.delays.values())
    direct_active, direct_inactive = direct_counts(q, s)  # in no stream (gateway.jetstream.direct)
    held_here = q.cmq.active - direct_active  # pulled (ack-pending there) but Active here
    return (max(0, pending - (len(s.delays) - naked)) + held_here + direct_active,
            max(0, leased - held_here - naked) + direct_inactive, len(s.delays), max(0, (stored or 0) - pending - leased))
