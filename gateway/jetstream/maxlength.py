"""x-max-length and x-overflow on a JetStream queue (docs/CLUSTER.md, "x-max-length").

RabbitMQ counts a queue's *ready* messages only: neither those delivered and not yet acked
nor (here) delayed ones. A stream limit cannot say that: ``max_msgs`` counts every message the
stream holds, delivered or not; its ``discard: old`` removes the oldest silently (no
dead-letter with reason ``maxlen``, no audit row) and may remove a message a consumer is
processing; and the stream's one ``max_msgs`` already holds CMQ's maxMsgHeapNum (L8). So the
gateway applies the limit itself, on JetStream's count of undelivered messages:

* ``reject-publish`` / ``reject-publish-dlx``: the publish is refused (basic.nack under
  confirms; dead-lettered with reason maxlen for ``-dlx``) when the ready count this gateway
  knows (JetStream's ``num_pending``, counted up by its own publishes and read again every
  second, plus what it pulled and has not delivered yet) is at the limit.
* ``drop-head``: once the publishes to the queue have landed, one trim reads JetStream's exact
  count and deletes the oldest undelivered messages above the limit from the stream, one by
  one (a stream delete succeeds once, so two gateways trimming at once drop each message once),
  dead-lettering each with reason ``maxlen`` or auditing it as discarded. This gateway pulls
  nothing while it trims, so a basic.get right after a publish sees the trimmed queue, and
  the publish's confirm waits for the trim, so a count after the confirm sees it too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gateway.jetstream.head import count, end, first_undelivered, removed
from semantics import queue as Q
from semantics.queue_attrs import OVERFLOW_DROP_HEAD

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker
    from gateway.jetstream.queues import QueueStream

__all__ = ["trim_after_publish"]

log = logging.getLogger("cmq_gateway.jetstream")

LANDED_WAIT = 5.0


def trim_after_publish(broker: ClusterBroker, s: QueueStream) -> int:
    """drop-head: a trim once this publish has landed (one at a time per queue; a publish during
    a trim has it count again). Pulls wait for it as they wait for a rewind.

    The publish is confirmed only once a trim that counted it is done, as RabbitMQ confirms a
    message after the queue has dropped what it pushed over the limit: the first publish of a
    trim's window takes a hold on the store's confirms (returned, 0 when the window already
    has one; its confirm waits for it, and every later publish is behind it), released when
    the trim that covers the window ends."""
    q = s.q
    if q.attrs.max_length is None or q.attrs.overflow != OVERFLOW_DROP_HEAD:
        return 0
    hold = 0
    if not s.trim_hold:
        s.trim_hold = hold = broker.store.hold()
    if s.trimming:
        s.trim_again = True
        return hold
    s.trimming = True
    s.rewinding += 1
    s.in_flight += 1  # counts (declare-ok, purge-ok) and basic.gets wait for it as for a publish
    broker.spawn(_trim(broker, s))
    return hold


async def _trim(broker: ClusterBroker, s: QueueStream) -> None:
    q = s.q
    js = broker.link.js
    covered = 0
    try:
        again = True
        while again and not q.deleted:
            s.trim_again = False
            covered, s.trim_hold = s.trim_hold, 0
            await _landed(broker, s)
            refused = None
            info = await count(js, s)
            while not q.deleted and _over(s):
                info, raw = await first_undelivered(js, s, info)
                if raw is None or not _over(s) or raw.seq == refused:
                    break
                if await removed(js, s, raw.seq):
                    await end(broker, s, raw, Q.MaxLengthDropped)
                else:
                    refused = raw.seq  # another gateway dropped it (count again), unless it stays
            broker.store.release(covered)
            again = s.trim_again
    except Exception as e:  # noqa: BLE001 - NATS away: the next publish trims again
        log.warning("x-max-length trim of queue %r failed: %r", q.name, e)
    finally:
        # The messages are stored: a trim that failed (or a queue deleted) holds no confirm.
        for hold in (covered, s.trim_hold):
            if hold:
                broker.store.release(hold)
        s.trim_hold = 0
        s.trimming = False
        s.rewinding -= 1
        broker.messages.writes.published(s)
        broker.dispatch(q)


def _over(s: QueueStream) -> bool:
    q = s.q
    limit = q.attrs.max_length
    return limit is not None and q.remote_ready + q.cmq.active > limit


async def _landed(broker: ClusterBroker, s: QueueStream) -> None:
    """The publishes before this trim acknowledged by JetStream (the trim is one in_flight):
    woken by ``Writes.published`` (gateway.jetstream.writes) as the last one lands."""
    q = s.q
    if s.in_flight > 1:
        s.landed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(s.landed, LANDED_WAIT)
        except TimeoutError:
            log.warning("x-max-length trim of queue %r: publishes not acknowledged after %.0f s, "
                        "counting anyway", q.name, LANDED_WAIT)
        finally:
            s.landed = None
