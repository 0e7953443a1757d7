"""Queue messages in JetStream streams: the broker's MessageStorage on NATS (gateway.broker.storage).

Each queue's messages are in its stream (docs/CLUSTER.md, "Queue messages"); the local CMQ
model holds only what this gateway leased from the stream's shared consumer. The CMQ rules a
message meets on the way in are semantics.send_rules, as on the embedded store, applied to the
counts this gateway knows: JetStream's undelivered messages, its own leases and the delayed
messages it naked for the rest of their delay.

The work is done by the parts this class owns, each in a module of its own: :class:`Writes`
(publishes into the streams and their PubAcks), :class:`Pulls` (pulls, leases, acks and naks),
:class:`Streams` (each queue's stream from declaration to deletion, and its counts), the
:class:`Sweeper` (TTLs that fall due in a stream nobody pulls) and :class:`Bodies` (large
bodies in the object store). The broker sees only the MessageStorage contract; which gateway
owns what (presence, exclusive queues, topic retries) is the cluster broker's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Coroutine
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from gateway.audit.rows import ENQUEUE
from gateway.jetstream.api_receive import ReceiveDemand, queue_counts
from gateway.jetstream.bodies import BODY_HEADER, Bodies
from gateway.jetstream.direct import LOCAL_AHEAD, plain_queue, room, stream_clear
from gateway.jetstream.maxlength import trim_after_publish
from gateway.jetstream.nonces import KvLedger
from gateway.jetstream.pulls import PULL_WAIT, Pulls
from gateway.jetstream.queues import QueueStream
from gateway.jetstream.streams import Streams
from gateway.jetstream.sweeper import Sweeper, settle_once
from gateway.jetstream.writes import Writes
from semantics import queue as Q
from semantics.errors import CMQError
from semantics.jetstream.names import queue_token
from semantics.send_rules import check_heap, check_room, check_size, send_delay, send_expiry

if TYPE_CHECKING:
    from gateway.broker.channel import Channel
    from gateway.broker.message import Message
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.vhost import VHost
    from gateway.jetstream.broker import ClusterBroker
    from semantics.queue_attrs import QueueAttributes

__all__ = ["JetStreamMessages"]

# Publisher flow control on delivery lag (backlog): recounted at most this often; a queue that
# got nothing from JetStream this long is not counted; the weight of one message.
LAG_EVERY = 0.002
LAG_STALE = 1.0
LAG_WEIGHT = 3
GET_WAIT = 10.0  # a plain basic.get waits at most this long (NATS away) before get-empty


def held(q: BrokerQueue, s: QueueStream) -> int:
    """L8's count on JetStream: undelivered in the stream, leased here (Active, received,
    delayed) and naked here for the rest of a delay. Leases other gateways hold are not in it;
    for those the stream's own max_msgs refuses (a basic.nack, M14)."""
    cmq = q.cmq
    # the counts' fields, not their properties (active, inactive, delayed): a Python call each,
    # ~1.6k instructions a publish together (callgrind, issue 28)
    held = q.remote_ready + cmq._n_active + cmq._n_inactive + cmq._n_delayed + cmq._n_parked
    return held + sum(naked for _, naked in s.delays.values()) if s.delays else held


class JetStreamMessages:
    """See the module docstring. Each queue's own state here is its QueueStream (``q.stored``,
    made by :meth:`made`)."""

    settles_transient = True  # every queue's acks reach its stream (issue 28)

    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self.bodies = Bodies(broker.link)
        self.pulls = Pulls(broker, self.bodies)
        self.writes = Writes(broker, self.bodies, self.pulls)
        self.streams = Streams(broker, self.pulls, self.writes)
        self.sweeper = Sweeper(broker)
        # MQTT session records go beside the messages, in order with them (ORDERED_KINDS).
        broker.store.publisher = self.writes.publisher
        self.writes.publisher.settles = broker.store.settles
        self._lag = 0
        self._lag_at = 0.0
        self._watched: list[dict[int, bool]] = []  # CMQ API sends awaiting their writes (watch_refusals)
        # Direct delivery (gateway.jetstream.direct), on unless configured off; how many
        # messages took it.
        self.direct_on = bool(getattr(broker.config, "direct_delivery", True))
        self.direct_count = 0
        self._holding: set[QueueStream] = set()  # queues with direct messages waiting for credit
        self.pulls.hand_back = self.hand_back

    # -- the JetStream side's own life, around the broker's (gateway.jetstream.broker) -------

    async def open(self) -> None:
        """Before the broker recovers: the publishing connection's reader runs."""
        await self.writes.publisher.start()

    async def streams_ready(self) -> None:
        """The streams of the queues recovered at start are there (a declare-ok counts them)."""
        await self.streams.ready()

    def run(self) -> None:
        """The gateway serves: counts follow other gateways, and due TTLs are swept."""
        self.broker.spawn(self.streams.count_loop())
        self.broker.spawn(self.sweeper.run())

    async def stop(self) -> None:
        await self.writes.publisher.stop()

    # -- MessageStorage (gateway.broker.storage) ---------------------------------------------

    def enqueue(self, vh: VHost, q: BrokerQueue, msg: Message, now: float, delay: float | None,
                expires_at: float | None, out_lsn: int, via: str | None, subscription: str | None) -> int:
        """M10/CL3: one JetStream publish to the queue's stream; the confirm waits for its
        PubAck (the LSN). L8 is checked here before the message is routed, so SendMessage is
        answered 4410 and a topic keeps the message for the subscription whose queue is full
        (D2), rather than learning it from JetStream's nack after the fact."""
        s: QueueStream = q.stored
        broker = self.broker
        attrs = q.attrs
        size = len(msg.body)
        # Each rule called when its queue attribute can make it act (a check with no limit to
        # meet, no delay or TTL to apply, answers as without it): the common message makes no
        # call for them (issue 28: CPU a message).
        if size > attrs.max_msg_size:
            check_size(q.name, size, attrs.max_msg_size, q.cmq.refuse_size)
        n, heap_num = held(q, s), int(attrs.max_msg_heap_num)
        if n >= heap_num:
            check_heap(q.name, n, heap_num)  # L8's refusal (called only when it refuses)
        delay = float(attrs.delay_seconds) if delay is None else send_delay(delay, float(attrs.delay_seconds))
        if attrs.max_length is not None:
            # x-max-length on JetStream's count of ready messages (gateway.jetstream.maxlength).
            check_room(q.name, delay, q.remote_ready + q.cmq.active, attrs.max_length, attrs.overflow)
        # message_ttl_ms, not the message_ttl property made of it: no call a publish
        if attrs.message_ttl_ms is not None:
            expires_at = send_expiry(now, delay, attrs.message_ttl, expires_at)
        if expires_at is not None and attrs.message_ttl_ms is None:
            self.sweeper.note_expiring(q)  # a message's own TTL: the sweeper looks at this queue
        elif self.direct_on and expires_at is None and not msg.persistent and not delay and size <= self.bodies.limit and msg.msg_id:
            # A transient message on a non-durable queue: straight to a consumer here when one
            # can take it and order allows (gateway.jetstream.direct), kept in memory only.
            if s.plain_of[0] is not attrs or s.plain_of[1] is not q.qargs:
                s.plain_of = (attrs, q.qargs)
                s.plain = plain_queue(q)
            if s.plain and stream_clear(s) and q.waiters is None and (room(q) or self._wait_here(q, s)):
                try:
                    qmsg = q.cmq.send(msg, size, now, None, msg.msg_id, None)  # by position: cheaper
                except CMQError as e:
                    if e.rule != "Q3":
                        raise
                    qmsg = None  # its ID is here already (a resend): the stream keeps it once
                if qmsg is not None:
                    s.direct.add(qmsg.msg_id)
                    self.direct_count += 1
                    broker.emit_row(ENQUEUE, vh.name, (q.name, msg.msg_id, size, via, subscription))
                    broker.after_queue_change(vh, q)
                    return out_lsn  # nothing to store: a confirm at once, as RabbitMQ's for such a message
        broker.emit_row(ENQUEUE, vh.name, (q.name, msg.msg_id, size, via, subscription))
        lsn = self.writes.publish(s, msg, now, delay or None, expires_at)
        hold = trim_after_publish(broker, s) if attrs.max_length is not None else 0  # drop-head only
        store = broker.store
        if hold:
            store.fanout_next[lsn] = hold  # a refusal still nacks
            lsn = hold
        if lsn <= out_lsn:
            return out_lsn
        if out_lsn:
            # Routed to several queues: the confirm waits for the last write, and a refusal
            # of an earlier one must still make it a nack (M14).
            store.fanout_next[out_lsn] = lsn
        return lsn

    def _wait_here(self, q: BrokerQueue, s: QueueStream) -> bool:
        """No consumer here has credit for it now, but a direct message may wait for them (as
        on the embedded store) behind fewer than LOCAL_AHEAD others, when no other gateway
        consumes the queue; the publishers pause before that many wait (backlog)."""
        if (not q.consumers or q.cmq._n_active >= LOCAL_AHEAD
                or self.broker.presence.others_consume(q)):
            return False
        self._holding.add(s)
        return True

    def settle(self, q: BrokerQueue, m: Q.QueueMessage, body_needed: bool = True) -> None:
        """Deleted here (ack, no-ack delivery, reject, expiry, dead-letter): acked there,
        the queue durable or not (a transient queue's acks must reach its stream too)."""
        s: QueueStream = q.stored
        lease = s.leases.pop(m.msg_id, None)
        if lease is not None:
            headers = lease.headers
            if headers and BODY_HEADER in headers:
                self.pulls.ack_lease(lease)  # its large body deleted with it
            else:
                # ack_lease, without its call (issue 28: CPU a message)
                pulls = self.pulls
                replies = pulls._replies
                replies.append((lease.reply, b"+ACK"))
                if len(replies) == 1:
                    pulls._loop.call_soon(pulls._send_replies)
            s.last_ack = lease.reply  # a count confirms it first (gateway.jetstream.api_receive)
        elif s.direct:
            s.direct.discard(m.msg_id)  # delivered directly: in no stream, nothing to tell JetStream

    def release(self, q: BrokerQueue, receipt: Q.Receipt, now: float) -> bool:
        """M13 requeue: Active again for every gateway (a nak), not only here. A message at
        its maxReceiveCount is released into the local model, which dead-letters it (Q8)."""
        s: QueueStream = q.stored
        limit = q.attrs.max_receive_count
        if limit is not None and receipt.message.receive_count >= limit:
            return q.cmq.release(receipt, now)
        m = q.cmq.drop(receipt, now)
        if m is None:
            return False
        lease = s.leases.pop(m.msg_id, None)
        if lease is not None:
            self.pulls.nak(s, lease)
        elif m.msg_id in s.direct:
            self.hand_back(s, m, m.receive_count)
        return True

    def others_consume_now(self, token: str) -> None:
        """Presence: another live gateway has a consumer on the queue of ``token`` now. The
        direct messages waiting here for this gateway's credit (_wait_here) go into the stream,
        in their order, receives and IDs kept, so that its consumers take them too (RabbitMQ
        round-robins a queue's messages over all its consumers); none waits here from now on
        (_wait_here asks presence), and the FIFO rule holds: a hand-back is an own publish
        (stream_clear false until this gateway pulled it back)."""
        for s in list(self._holding):
            q = s.q
            if q.deleted or not s.direct:
                self._holding.discard(s)
                continue
            if queue_token(q.vhost, q.name) != token:
                continue
            now = self.broker.now()
            if s.requested and now - s.asked_at < 2 * PULL_WAIT:
                # A pull of this gateway is still waiting at the server (asked when its
                # consumers had credit that direct messages used since): it would take the
                # first ones handed back, to wait here again. No credit, no new pull: it
                # ends within PULL_WAIT; then they go.
                self.pulls._loop.call_later(PULL_WAIT, self.others_consume_now, token)
                continue
            self._holding.discard(s)
            cmq = q.cmq
            waiting = [m for i in s.direct if (m := cmq.get(i)) is not None and m.state is Q.ACTIVE]
            if not waiting:
                continue
            waiting.sort(key=attrgetter("pos"))  # the Active order: who takes it first here
            for m in waiting:
                if cmq.delete(Q.Receipt(m, m.handle), now):
                    self.hand_back(s, m, m.receive_count)
            self.broker.after_queue_change(self.broker.vhosts[q.vhost], q)

    def hand_back(self, s: QueueStream, m: Q.QueueMessage, receives: int) -> None:
        """A direct message (gateway.jetstream.direct) would be Active again: it goes into the
        stream instead, for every gateway, with the receives it had (a redelivery when it was
        received), its ID and enqueue time."""
        s.direct.discard(m.msg_id)
        self.writes.publish(s, m.payload, self.broker.clock.now(), None, None,  # type: ignore[arg-type]
                            receives, m.enqueue_time)

    def new_model(self, name: str, attrs: QueueAttributes, refuse_size: bool) -> Q.CmqQueue:
        # Leased: x-max-length is applied on JetStream's count (gateway.jetstream.maxlength) and
        # Q6's deleted messages are kept by the stream; a rewind moves the shared consumer (made).
        return Q.CmqQueue(name, attrs, refuse_size=refuse_size, leased=True)

    def made(self, vh: VHost, q: BrokerQueue) -> None:
        q.stored = s = QueueStream(q)
        self.streams.made(s)

    def queue_streams(self) -> list[QueueStream]:
        """The state here of every queue this gateway knows."""
        return [q.stored for vh in self.broker.vhosts.values() for q in vh.queues.values()]

    def backlog(self) -> int:
        """JetStream's unanswered writes, and the messages JetStream holds for consumers of
        this gateway that have credit for them. Reading publishers while those wait would give
        the loop to input and leave the deliveries behind (issue 28: 3,000 of 28,000 msg/s);
        paused, the loop delivers, as RabbitMQ's credit flow blocks a publisher while its queue
        cannot keep up. Such a message counts as LAG_WEIGHT writes: the pause starts below a
        second of deliveries."""
        now = time.monotonic()
        if now - self._lag_at >= LAG_EVERY:
            self._lag_at = now
            self._lag = self._delivery_lag(now)
        return self.writes.publisher.pending + self._lag * LAG_WEIGHT

    def _delivery_lag(self, now: float) -> int:
        pulls = self.pulls
        taking = pulls.taking
        lag = 0
        for s in list(self._holding):
            # direct messages waiting here for credit (_wait_here): as many as JetStream's
            n = s.q.cmq._n_active
            if n and s.direct and not s.q.deleted:
                lag += n
            else:
                self._holding.discard(s)
        for s in list(taking):
            q = s.q
            if q.deleted or now - s.took_at > LAG_STALE:
                taking.discard(s)  # nothing came for a while (NATS away?): no pause for it
            elif q.remote_ready > 0 and any(c.has_credit() for c in pulls.pullers(s)):
                lag += q.remote_ready
        return lag

    def nonce_ledger(self, ttl: float) -> KvLedger:
        """The CMQ API's used nonces (SE6), shared with every gateway of the cluster: a KV
        bucket whose entries JetStream expires after ``ttl`` (gateway.jetstream.nonces)."""
        return KvLedger(self.broker.link, ttl)

    def want(self, q: BrokerQueue) -> None:
        self.pulls.want_soon(q.stored)

    def readers_left(self, q: BrokerQueue) -> None:
        self.pulls.readers_left(q.stored)

    def timed(self, vh: VHost, q: BrokerQueue, events: list[Q.QueueEvent]) -> list[Q.QueueEvent]:
        """Q1: a visibility timeout that ends here hands the message back to JetStream (nak),
        so that any gateway receives it next, instead of keeping it Active here; a TTL or
        maxTimeToLive ends a leased message once across gateways (the sweeper's too)."""
        s: QueueStream = q.stored
        broker = self.broker
        now = broker.clock.now()
        for e in events:
            if isinstance(e, Q.VisibilityExpired):
                m = e.message
                lease = s.leases.pop(m.msg_id, None)
                if lease is not None:
                    if q.cmq.delete(Q.Receipt(m, m.handle), now):
                        self.pulls.nak(s, lease)
                elif m.msg_id in s.direct and q.cmq.delete(Q.Receipt(m, m.handle), now):
                    self.hand_back(s, m, m.receive_count)
        return settle_once(broker, vh, s, events)

    def drop(self, vh: VHost, q: BrokerQueue) -> None:
        """The queue was deleted: here, its stream goes too; by another gateway (a change
        applied from the bucket), that gateway deletes it."""
        s: QueueStream = q.stored
        s.leases.clear()
        s.direct.clear()
        if not self.broker.store.applying:
            self.streams.drop(s)

    def demand(self, q: BrokerQueue, count: int, long_poll: bool) -> ReceiveDemand:
        return ReceiveDemand(self.broker, q.stored, count, long_poll)

    async def counts(self, q: BrokerQueue) -> tuple[int, int, int, int] | None:
        return await queue_counts(self.broker, q.stored)

    def purge(self, vh: VHost, q: BrokerQueue) -> int:
        """What is leased here and ready goes at once; the stream's purge removes the rest
        (counted: the -ok's count is JetStream's, gateway.jetstream.streams)."""
        s: QueueStream = q.stored
        purged = q.cmq.purge(self.broker.now())
        if s.direct:
            s.direct.difference_update(m.msg_id for m in purged)
        count = len(purged) + q.remote_ready
        self.streams.purge(s)
        return count

    def message_count(self, q: BrokerQueue, count: int) -> Coroutine[Any, Any, int]:
        """The -ok waits for JetStream's count of undelivered messages, which replaces this
        gateway's estimate of them in ``count`` (after a purge or delete: the count read
        before the stream's purge or deletion)."""
        s: QueueStream = q.stored
        done, s.count_done = s.count_done, None
        local = max(0, count - (s.stale_remote if done is not None else q.remote_ready))
        return self.streams.counted(s, local, done)

    def getting(self, q: BrokerQueue, now: float) -> float:
        """A use on any gateway counts (x-expires); with nothing leased here the get waits
        for one pull (answered get-empty by the first that finds nothing, get_waits)."""
        self.broker.presence.note_use(q, now)
        return 0.0 if q.cmq.active else GET_WAIT

    def get_waits(self, q: BrokerQueue, ch: Channel, plain: bool) -> None:
        self.pulls.get_waits(ch, q.stored, plain)

    # -- confirms (M14): JetStream acknowledges each write as it comes (no group commit) --

    def start(self) -> None:
        self.broker.store.on_durable = self.writes.durable_soon

    def sync(self) -> int:
        return self.broker.store.durable_lsn

    async def flush(self) -> int:
        return await self.broker.store.settled()

    def refused(self, durable: int) -> set[int]:
        """The writes JetStream refused (L8 max_msgs): a message routed to several queues is
        nacked when any of its writes was (the chain of fanout_next leads to the LSN its
        confirm waits for); the links of writes now durable are forgotten."""
        store = self.broker.store
        refused = store.refused
        links = store.fanout_next
        last: set[int] = set()
        if refused:
            for watched in self._watched:
                for lsn in refused:
                    if lsn in watched:
                        watched[lsn] = True
            for lsn in refused:
                while lsn in links:
                    lsn = links[lsn]
                last.add(lsn)
            refused.clear()
        while links:
            first = next(iter(links))
            if first > durable:
                break
            del links[first]
        return last

    def watch_refusals(self, lsns: list[int]) -> dict[int, bool]:
        """L8 max_msgs seen by JetStream only, when other gateways' leases fill the queue."""
        watched = dict.fromkeys(lsns, False)
        self._watched.append(watched)
        return watched

    def refusals_seen(self, watched: dict[int, bool]) -> bool:
        with contextlib.suppress(ValueError):
            self._watched.remove(watched)
        return any(watched.values())

    def batch_end(self) -> None:
        """The read's publishes, acks and naks handed to the connections together, to leave
        with this turn's other writes (gateway.jetstream.wire.send), not a loop turn later
        (issue 28: each turn a message waits for is latency)."""
        self.writes.publisher.flush()
        self.pulls.send_replies()
