"""Where a queue's messages are kept: the broker's one message-storage seam (issue 28, aim 4).

``StoreBackend`` (semantics.store.backend) is the seam for records (declarations, accounts, the
journal of the embedded store). :class:`MessageStorage` is the seam for queue messages: the
broker and its vhosts run one code path for every store, and what differs (a message written
to the local journal, or published to a JetStream stream and pulled back by whichever gateway
has a reader for it) lives behind these operations. The embedded implementation is
:class:`EmbeddedMessages` here; the JetStream one is ``gateway.jetstream.messages``.
tests/contract/ runs one suite of tests against both.

Besides where messages are, the contract says what confirms follow (M14): ``start`` (the
embedded store's group commit; JetStream's acknowledgements), ``sync``/``flush``, ``refused``
(a write taken and later refused is a basic.nack) and ``batch_end`` (what one client read made
leaves together); and what a channel sees of the store: ``getting``/``get_waits`` (basic.get)
and ``message_count`` (the -ok counts). Which gateway owns what (presence, exclusive queues,
topic retries) is not message storage: what a vhost asks of the other gateways is the
``Membership`` seam (gateway.broker.membership), and the rest the cluster broker keeps
(gateway.jetstream.broker).

The CMQ rules a message meets on its way in (L6, L8, Q4, x-message-ttl, M7) are
semantics.send_rules, called by each implementation on its own counts.
"""

from __future__ import annotations

from collections.abc import Collection, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from gateway.audit.rows import ENQUEUE
from gateway.broker import persistence as P
from gateway.broker.folding import DiskPayloads, give_back_memory_soon
from gateway.broker.message import DISK_BODY_MIN, DiskMessage, Message
from semantics import queue as Q

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.broker.channel import Channel
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.vhost import VHost
    from semantics.queue_attrs import QueueAttributes

__all__ = ["EmbeddedMessages", "MessageStorage"]


class MessageStorage(Protocol):
    """The operations the broker needs of a queue's message store, and what each guarantees.

    Calls come from the event loop's thread; none blocks. A queue's local CMQ model
    (``q.cmq``) holds what this gateway may deliver now; the storage decides what else exists.
    """

    # Whether settle() has work for a non-durable queue's message; when False the broker's
    # ack skips the call (a frame on every transient message's ack).
    settles_transient: bool

    def enqueue(self, vh: VHost, q: BrokerQueue, msg: Message, now: float, delay: float | None,
                expires_at: float | None, out_lsn: int, via: str | None, subscription: str | None) -> int:
        """Take ``msg`` into ``q`` (M10), ``delay`` seconds from now (None: the queue's
        default, Q4), expiring at ``expires_at`` at the latest (its own TTL; the queue's
        x-message-ttl is applied here).

        Refusals raise before anything changed and before any record: LimitError (L6 too
        large, L8 full or delay out of range) or MaxLengthRejected (M7 reject-publish).
        Accepted: the ``enqueue`` audit record is emitted before any reader can receive it.
        Returns the LSN the publish's confirm waits for from now on, given it waited for
        ``out_lsn`` for the queues it was routed to before (M14): never less than
        ``out_lsn``, and once :attr:`Broker.durable_lsn` passes it the message is kept by
        every store this one promises (a crash loses no confirmed message). A write the
        store refuses later makes the confirm a basic.nack, never an ack (the PubAck rule).
        """
        ...

    def settle(self, q: BrokerQueue, m: Q.QueueMessage, body_needed: bool = True) -> None:
        """``m`` has left ``q`` for good (acked, delivered without ack, rejected, expired,
        dead-lettered, dropped; M12/M13): no reader of ``q``, on this gateway or any other,
        receives it again, whether ``q`` is durable or not. ``body_needed``: the caller
        still reads the body (dead-lettering), so it must stay readable."""
        ...

    def release(self, q: BrokerQueue, receipt: Q.Receipt, now: float) -> bool:
        """basic.reject/nack with requeue (M13): the received message is Active again for
        every reader of ``q`` (Q8's maxReceiveCount still counts). False: the receipt is
        stale (Q3), nothing changed."""
        ...

    def new_model(self, name: str, attrs: QueueAttributes, refuse_size: bool) -> Q.CmqQueue:
        """The local CMQ model of a new queue (``refuse_size``: L6 refuses, PF2)."""
        ...

    def made(self, vh: VHost, q: BrokerQueue) -> None:
        """``q`` was declared here, or learnt of from another gateway: its storage is made
        (or found) before any message is stored; enqueue may be called at once after this."""
        ...

    def timed(self, vh: VHost, q: BrokerQueue, events: list[Q.QueueEvent]) -> list[Q.QueueEvent]:
        """The local model's events (visibility timeouts, TTLs, maxTimeToLive, Q1/Q8) seen
        by the store before the broker handles them: it may hand a message back to every
        reader, or end it once across gateways itself. Returns the events the broker still
        handles (audit, dead-lettering, settle)."""
        ...

    def drop(self, vh: VHost, q: BrokerQueue) -> None:
        """``q`` was deleted: its messages go with it, wherever they are stored."""
        ...

    def readers_left(self, q: BrokerQueue) -> None:
        """A consumer of ``q`` left: what was brought in for readers who are gone goes back
        to the others (a store whose messages are all local does nothing)."""
        ...

    def nonce_ledger(self, ttl: float) -> Any:
        """Where the CMQ API keeps the nonces it was sent (SE6, gateway.cmqapi.nonces) when
        this storage has a place of its own for them, shared by every gateway using it and
        expired after ``ttl``; None: as records beside the broker's (RecordLedger)."""
        ...

    def want(self, q: BrokerQueue) -> None:
        """The demand of ``q``'s readers here changed (a consumer's credit, a get): messages
        this gateway can take are brought into ``q.cmq``, at once or soon. A store whose
        messages are all local already does nothing."""
        ...

    def backlog(self) -> int:
        """Writes taken and not yet acknowledged by the store, and messages it holds for
        readers here that have credit for them (weighted): the transport stops reading
        publishers while this is high (gateway.transport's flow control). Cheap: called on
        every read of a publishing connection."""
        ...

    def purge(self, vh: VHost, q: BrokerQueue) -> int:
        """queue.purge (M7): every ready message of ``q`` goes, on every gateway; the
        messages received and not yet settled stay. Returns how many went (those another
        gateway's stream held included, as far as this gateway knows them)."""
        ...

    def demand(self, q: BrokerQueue, count: int, long_poll: bool) -> Any:
        """A reader with neither channel nor consumer (a CMQ API ReceiveMessage, the
        management API's get) wants ``count`` messages of ``q``: a context manager held
        while it receives, whose ``await pulled(timeout)`` returns once the store answered
        (messages brought into ``q.cmq``, or none there: True) or ``timeout`` passed (False).
        None: every message is in ``q.cmq`` already, so the reader just looks again."""
        ...

    async def counts(self, q: BrokerQueue) -> tuple[int, int, int, int] | None:
        """(Active, Inactive, Delayed, rewindable) of ``q`` as CMQ's GetQueueAttributes
        reports them, on every gateway, after this gateway's own publishes to it; None when
        the store cannot say now (the local model's numbers answer then)."""
        ...

    def message_count(self, q: BrokerQueue, count: int) -> Coroutine[Any, Any, int] | None:
        """queue.declare-ok, purge-ok or delete-ok is about to report ``count``, the local
        model's count (after a purge or delete, what it removed). None: ``count`` stands and
        is sent at once. Else the count to report comes from this coroutine (the stream's
        count on every gateway); the broker holds the channel's later frames until then."""
        ...

    def getting(self, q: BrokerQueue, now: float) -> float:
        """A basic.get of ``q`` at ``now`` (M11; a use of ``q``, x-expires, wherever it is
        counted). Returns how long the get waits for the store to bring a message when
        nothing is Active here (the reply is get-empty once the store finds none; Q5's
        polling wait, when longer, still applies): 0 means every message is in ``q.cmq``,
        so the get is answered from it at once."""
        ...

    def get_waits(self, q: BrokerQueue, ch: Channel, plain: bool) -> None:
        """``ch``'s basic.get waits on ``q.waiters`` for the store (``plain``: it has no Q5
        polling wait, so the store's "none" answers it get-empty): bring a message for it."""
        ...

    # -- confirms (M14): what the broker's confirms follow ------------------------------------

    def start(self) -> None:
        """The broker is open and recovered: confirms follow the store from now on (the
        embedded store's group commit starts; JetStream's acknowledgements release them)."""
        ...

    def sync(self) -> int:
        """What was written so far made durable now, on the calling thread, as far as the
        store can (tests, close): returns the store's durable LSN. Never awaits."""
        ...

    async def flush(self) -> int:
        """Every write made so far is durable, or refused, when this returns (SE4: a change
        answered once it survives a crash); returns the store's durable LSN."""
        ...

    def refused(self, durable: int) -> Collection[int]:
        """Confirms go out up to ``durable``: the LSNs of confirms that must be basic.nack,
        their write refused by the store after it was taken (the PubAck rule: a confirm only
        for a stored message). Each is reported once. The embedded store refuses none (a
        failing disk keeps confirms waiting, W5)."""
        ...

    def watch_refusals(self, lsns: list[int]) -> dict[int, bool]:
        """The writes of one CMQ API send: marked True as :meth:`refused` reports them, so
        the send is answered 4410, not 0. Call before awaiting them; end with
        :meth:`refusals_seen`."""
        ...

    def refusals_seen(self, watched: dict[int, bool]) -> bool:
        """Ends :meth:`watch_refusals`: whether any of those writes was refused."""
        ...

    def batch_end(self) -> None:
        """The events of one read of a client are handled (Broker.end_batch): the writes,
        acks and pulls they made leave now, together, not a loop turn later."""
        ...


class EmbeddedMessages:
    """Messages in this process's CMQ model, persistent ones also in the local journal."""

    settles_transient = False  # nothing on disk for a transient queue (settle returns at once)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def enqueue(self, vh: VHost, q: BrokerQueue, msg: Message, now: float, delay: float | None,
                expires_at: float | None, out_lsn: int, via: str | None, subscription: str | None) -> int:
        broker = self.broker
        # The CMQ model's send itself, not BrokerQueue.send around it: a frame on every publish.
        qmsg = q.cmq.send(msg, len(msg.body), now, delay, msg.msg_id or None, expires_at)  # by position: cheaper
        msg_id = qmsg.msg_id
        emit_values = broker.emit_values  # an instance attribute: called through a local, specialized
        emit_values(ENQUEUE, vh.name, q.name, msg_id, len(msg.body), via, subscription)
        if q.durable and msg.persistent:
            key = P.message_key(vh.name, q.name, msg_id)
            body = msg.body
            lsn = broker.persist(key, P.encode_message(vh.name, q.name, msg_id, now, msg.exchange,
                                                       msg.routing_key, msg.properties.raw, body))
            if lsn > out_lsn:
                out_lsn = lsn
            # Its body is left in the store once durable, if this record is its only holder.
            if msg.key is None and len(body) >= DISK_BODY_MIN:
                msg.key = key
                broker.body_stored(lsn, qmsg)
            else:
                msg.key = ""
        else:
            msg.key = ""
        if broker._batch_depth and q.consumers and q.on_tick is not None and q.waiters is None \
                and not q.cmq.outbox and not q.deleted:
            broker._to_dispatch[q] = None  # after_queue_change's case in a read's publishes, without its frame
        else:
            broker.after_queue_change(vh, q)
        return out_lsn

    def settle(self, q: BrokerQueue, m: Q.QueueMessage, body_needed: bool = True) -> None:
        # Nothing on disk for a transient queue or message: the common ack ends here.
        if not q.durable:
            return
        msg = m.payload
        if isinstance(msg, Message) and msg.persistent:
            # A body left in the record comes back into memory first unless the caller no
            # longer needs it (an ack): a message dead-lettered, or kept for a rewind (Q6),
            # is read again later.
            if type(msg) is DiskMessage and (body_needed or m.state is not Q.REMOVED):
                msg.to_memory()
            self.broker.unpersist(P.message_key(q.vhost, q.name, m.msg_id), missing_ok=True)

    def release(self, q: BrokerQueue, receipt: Q.Receipt, now: float) -> bool:
        return q.cmq.release(receipt, now)

    def new_model(self, name: str, attrs: QueueAttributes, refuse_size: bool) -> Q.CmqQueue:
        return Q.CmqQueue(name, attrs, refuse_size=refuse_size)

    def made(self, vh: VHost, q: BrokerQueue) -> None:
        if q.durable:
            # Issue 15: a long backlog of persistent messages is folded into compact records.
            q.cmq.fold_with(DiskPayloads(self.broker.store, vh.name, q.name))
            q.cmq.on_drained = give_back_memory_soon

    def timed(self, vh: VHost, q: BrokerQueue, events: list[Q.QueueEvent]) -> list[Q.QueueEvent]:
        return events

    def drop(self, vh: VHost, q: BrokerQueue) -> None:
        if q.durable:
            broker = self.broker
            for key in broker.store.keys(P.queue_messages_prefix(vh.name, q.name)):
                broker.unpersist(key)

    def readers_left(self, q: BrokerQueue) -> None:
        return None

    def nonce_ledger(self, ttl: float) -> None:
        return None  # records beside the broker's, in this store (gateway.cmqapi.nonces.RecordLedger)

    def want(self, q: BrokerQueue) -> None:
        return None

    def backlog(self) -> int:
        return 0  # the embedded store acknowledges a write in the turn that made it

    def demand(self, q: BrokerQueue, count: int, long_poll: bool) -> None:
        return None

    async def counts(self, q: BrokerQueue) -> tuple[int, int, int, int] | None:
        cmq = q.cmq
        return cmq.active, cmq.inactive, cmq.delayed, cmq.rewindable

    def message_count(self, q: BrokerQueue, count: int) -> None:
        return None

    def getting(self, q: BrokerQueue, now: float) -> float:
        return 0.0

    def get_waits(self, q: BrokerQueue, ch: Channel, plain: bool) -> None:
        return None

    def start(self) -> None:
        broker = self.broker
        assert broker._loop is not None
        broker._flusher = broker._loop.create_task(broker._flush_loop())

    def sync(self) -> int:
        broker = self.broker
        lsn_mark = broker._last_lsn()
        durable = broker._sync(broker.audit.sync_mark() if broker._audit_sync else 0)
        broker.audit_synced(lsn_mark)
        return durable

    async def flush(self) -> int:
        """On the group commit's thread, so that the two never sync at once."""
        broker = self.broker
        if broker._loop is None:
            return self.sync()
        lsn_mark = broker._last_lsn()
        audit_mark = broker.audit.sync_mark() if broker._audit_sync else 0
        durable = await broker._loop.run_in_executor(broker._executor, broker._sync, audit_mark)
        broker.audit_synced(lsn_mark)
        return durable

    def refused(self, durable: int) -> tuple[int, ...]:
        return ()

    def watch_refusals(self, lsns: list[int]) -> dict[int, bool]:
        return {}

    def refusals_seen(self, watched: dict[int, bool]) -> bool:
        return False

    def batch_end(self) -> None:
        return None

    def purge(self, vh: VHost, q: BrokerQueue) -> int:
        ids = [m.msg_id for m in q.cmq.purge(self.broker.now())]
        if q.durable:
            for msg_id in ids:
                self.broker.unpersist(P.message_key(vh.name, q.name, msg_id), missing_ok=True)
        return len(ids)
