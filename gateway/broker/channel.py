"""One AMQP channel: consumers, unacked deliveries, qos, confirms and tx (M11-M14, W4)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from gateway.audit.rows import DELIVER, DELIVER_AUTO, DELIVER_MQTT, DELIVER_MQTT_AUTO
from gateway.broker import persistence as P
from gateway.broker.consumers import Consumer, Unacked, new_unacked
from gateway.broker.errors import precondition
from gateway.broker.message import Message
from semantics.queue import Receipt

if TYPE_CHECKING:
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.session import Session

__all__ = ["Channel"]


class Channel:
    def __init__(self, session: Session, number: int) -> None:
        self.session = session
        self.number = number
        self.next_tag = 1
        self.unacked: dict[int, Unacked] = {}   # delivery tag -> delivery, in tag order
        # No tag below this is outstanding (take_tagged); restore_unacked sets it back.
        self.low_tag = 1
        self.consumers: dict[str, Consumer] = {}
        self.consumer_prefetch = 0   # basic.qos global=false: for consumers created after it
        self.channel_prefetch = 0    # basic.qos global=true: the whole channel (W4)
        self.flow_active = True
        self.closing = False
        self.confirm = False
        self.publish_seq = 0
        # (seq, lsn) in seq order (M14); lsn 0: nothing to wait for, -1: a nack.
        self.pending_confirms: deque[tuple[int, int]] = deque()
        # Confirms ready now (nothing to wait for), sent as one basic.ack at the end of the
        # transport's turn: the last ready seq and how many (M14, RabbitMQ's multiple=true).
        self.ready_seq = 0
        self.ready_count = 0
        self.confirmed = 0  # publishes acked to the publisher (the management API's confirm stat)
        self.tx = False
        self.committing = False  # tx.commit running: deliveries it frees go out after commit-ok
        self.reply_key: str | None = None  # direct reply-to: this channel's reply consumer
        self.reply_tag = ""
        self.tx_publishes: list[Any] = []
        # (delivery tag, delivery, None for ack / requeue flag for nack and reject) in the
        # open transaction: applied on tx.commit, back to unacked on tx.rollback.
        self.tx_acks: list[tuple[int, Unacked, bool | None]] = []
        # Q5: a basic.get long-polling (queue, no_ack); while it waits, and until what came
        # after it is replayed, the channel's later events are held here in order.
        self.waiting_get: tuple[BrokerQueue, bool] | None = None
        self.held: list[object] | None = None
        # basic.cancel notices caused by a method of this channel whose reply waits (the
        # JetStream broker's delete-ok waits for its count): they follow that reply.
        self.cancels_after_reply: list[tuple[Channel, str]] = []
        self.draining = False  # closing with held events: they run, but nothing is handed out

    # -- delivery (M11) ----------------------------------------------------------------------

    def deliver(self, consumer: Consumer | None, q: BrokerQueue, receipt: Receipt,
                get_count: int | None = None, no_ack: bool = False) -> None:
        """Send one received message as basic.deliver (consumer) or basic.get-ok (get);
        ``no_ack``: a basic.get with no_ack (a consumer's own flag says it for a delivery).
        A delivery that needs no ack settles its message here and is audited so (auto_ack)."""
        qmsg = receipt.message
        msg: Message = qmsg.payload  # type: ignore[assignment]
        tag = self.next_tag
        self.next_tag = tag + 1
        msg_id = qmsg.msg_id
        rc = qmsg.receive_count
        redelivered = rc > 1
        s = self.session
        conn = s.conn
        properties = msg.properties
        if q.receive_metadata or (consumer is not None and consumer.receive_metadata):
            # M11 (cmq profile, or asked for): message_id = the CMQ ID unless the publisher
            # set one; x-cmq-* headers.
            props = properties.encode_delivery(msg_id, int(qmsg.enqueue_time), rc)
            if consumer is None:
                properties = type(properties)(props)
        else:
            props = properties.raw  # PF5: byte for byte as published
        body = msg.body  # once: a DiskMessage reads it from the store
        if consumer is not None:
            conn.send_deliver(self.number, consumer.tag, tag, redelivered, msg.exchange,
                              msg.routing_key, props, body)
        else:
            conn.send_get_ok(self.number, tag, redelivered, msg.exchange, msg.routing_key, get_count or 0,
                             props, body)
        no_ack = consumer.no_ack if consumer is not None else no_ack or get_count is None
        emit_values = s.broker.emit_values  # (row, vhost, *values): no tuple a record
        if no_ack:  # no ack record will follow: the delivery says it settled the message
            if s.protocol is None:
                emit_values(DELIVER_AUTO, s.vhost_name, s.user, s.peer, q.name, msg_id, rc, len(body), True)
            else:
                emit_values(DELIVER_MQTT_AUTO, s.vhost_name, s.user, s.peer, q.name, msg_id, rc, len(body),
                            s.protocol, True)
        elif s.protocol is None:
            emit_values(DELIVER, s.vhost_name, s.user, s.peer, q.name, msg_id, rc, len(body))
        else:  # MQ7
            emit_values(DELIVER_MQTT, s.vhost_name, s.user, s.peer, q.name, msg_id, rc, len(body), s.protocol)
        if no_ack:
            s.broker.settle_deleted(q, receipt)
            return
        self.unacked[tag] = new_unacked(Unacked, q, receipt, msg_id, consumer)
        if consumer is not None:
            consumer.unacked += 1

    # -- settlement (M12, M13) ---------------------------------------------------------------

    def take(self, tag: int, multiple: bool) -> list[Unacked]:
        return [u for _, u in self.take_tagged(tag, multiple)]

    def take_tagged(self, tag: int, multiple: bool, hold: bool = False) -> list[tuple[int, Unacked]]:
        """Remove and return the deliveries a basic.ack/nack/reject names, with their tags;
        406 for an unknown tag (M12). ``hold``: a transaction takes them, and the consumer's
        credit stays used until the commit (as RabbitMQ)."""
        if not multiple:
            return [(tag, self._take_one(tag, hold))]
        unacked = self.unacked
        if tag == 0 or (unacked and tag >= next(reversed(unacked))):
            # Everything outstanding (a client acking its whole window): the dict is handed
            # over whole instead of popped tag by tag.
            taken = list(unacked.items())
            unacked.clear()
        else:
            # The oldest delivery acked with multiple=true (perf --multi-ack 1, a client acking
            # in order): nothing outstanding below ``tag``, found by lookups from low_tag
            # rather than by iterating the dict, whose front holds a deleted slot for every
            # tag acked since it last grew (CPython does not compact on delete): ~1.2k
            # instructions a step under callgrind, two steps an ack (issue 28).
            low = self.low_tag
            if tag < self.next_tag:  # a tag never delivered leaves low_tag as it is
                while low < tag and low not in unacked:
                    low += 1
                self.low_tag = low
            if low == tag:
                u = unacked.pop(tag, None)
                taken = [] if u is None else [(tag, u)]
                if not hold and u is not None and u.consumer is not None:
                    u.consumer.unacked -= 1
                return taken
            # Tags are in ascending order (restore_unacked keeps them so): the scan stops at
            # the first one past ``tag`` instead of reading every outstanding delivery.
            taken = []
            for t in unacked:
                if t > tag:
                    break
                taken.append((t, unacked[t]))
            for t, _ in taken:
                del unacked[t]
        if not hold:
            for _, u in taken:
                if u.consumer is not None:
                    u.consumer.unacked -= 1
        return taken

    def _take_one(self, tag: int, hold: bool = False) -> Unacked:
        """The delivery ``tag`` names, removed (406 when unknown, M12); see take_tagged."""
        u = self.unacked.pop(tag, None)
        if u is None:
            raise precondition(f"unknown delivery tag {tag}", rule="M12", value=tag)
        if u.consumer is not None and not hold:
            u.consumer.unacked -= 1
        return u

    def restore_unacked(self, settled: list[tuple[int, Unacked, bool | None]]) -> None:
        """tx.rollback: the deliveries are unacked again, under their original tags, in tag
        order (their consumers' credit was held, see take_tagged)."""
        if not settled:
            return
        for tag, u, _ in settled:
            self.unacked[tag] = u
        self.low_tag = 1
        self.unacked = dict(sorted(self.unacked.items()))

    def ack(self, tag: int, multiple: bool) -> None:
        session = self.session
        broker = session.broker
        if multiple:
            for _, u in self.take_tagged(tag, True):
                broker.ack(session, u)
        else:  # one tag, as a consumer acks every message: _take_one inlined (Session.on_acks repeats these steps)
            one = self.unacked.pop(tag, None)
            if one is None:
                raise precondition(f"unknown delivery tag {tag}", rule="M12", value=tag)
            consumer = one.consumer  # once: a NamedTuple field is read unspecialized
            if consumer is not None:
                consumer.unacked -= 1
            broker.ack(session, one)
        if self.channel_prefetch:
            broker.dispatch_channel(self)  # W4: channel credit serves every queue consumed here

    def reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        broker = self.session.broker
        for u in self.take(tag, multiple):
            broker.reject(self.session, u, requeue)
        if self.channel_prefetch:
            broker.dispatch_channel(self)

    def requeue_all(self) -> None:
        """M13: channel closed / basic.recover: every unacked delivery is Active again."""
        broker = self.session.broker
        pending, self.unacked = self.unacked, {}
        for u in pending.values():
            if u.consumer is not None:
                u.consumer.unacked -= 1
            broker.reject(self.session, u, True)

    # -- consumers ---------------------------------------------------------------------------

    def cancel(self, tag: str) -> Consumer | None:
        if self.reply_key is not None and tag == self.reply_tag:
            self.session.broker.replies.cancel(self)
            return None
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
            self.session.broker.consumer_gone(consumer.queue)
        return consumer

    def server_cancel(self, consumer: Consumer) -> None:
        """The queue went away: basic.cancel to a client that can take it (consumer_cancel_notify)."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.session.supports("consumer_cancel_notify") and not self.closing:
            self.session.notify_cancel(self, consumer.tag)

    def close(self) -> None:
        """Forget the channel: consumers cancelled, unacked messages Active again (M13)."""
        if self.waiting_get is not None:
            self.session.broker.cancel_get(self)  # Q5: a waiting get takes nothing now
        self.session.broker.replies.cancel(self)
        self.restore_unacked(self.tx_acks)  # an open transaction's acks never happened
        self.tx_acks = []
        self.tx_publishes = []
        for tag in list(self.consumers):
            self.cancel(tag)
        self.requeue_all()
        self.pending_confirms.clear()
        self.ready_count = 0
        self.session.broker.confirm_waiters.discard(self)

    # -- confirms (M14) ----------------------------------------------------------------------

    def confirm_publish(self, seq: int, lsn: int, nack: bool = False) -> None:
        """M14: basic.ack once the store holds the message durably, basic.nack when it was
        refused; confirms go out in publish order, so a nack waits behind earlier acks."""
        broker = self.session.broker
        if not nack and lsn and lsn > broker.durable_lsn:  # lsn 0: nothing to wait for
            self.pending_confirms.append((seq, lsn))
            broker.wait_durable(self)
        elif self.pending_confirms:
            # Keeps the order; goes out with the batch. A nack is kept as a negative lsn.
            self.pending_confirms.append((seq, -1 if nack else 0))
        elif nack:
            self.send_ready_confirms()  # the acks before it go first
            self.session.conn.send_method(self.number, C.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False))
        else:
            self.ready_seq = seq
            self.ready_count += 1
            if self.ready_count == 1:
                broker.confirm_ready(self)

    def _count_confirmed(self, count: int) -> None:
        """Once per basic.ack frame, not per message: RabbitMQ's confirm stat counts the
        messages a (multiple) ack covers, on the channel and its vhost."""
        self.confirmed += count
        by_vhost = self.session.broker.confirmed
        vhost = self.session.vhost_name
        by_vhost[vhost] = by_vhost.get(vhost, 0) + count

    def send_ready_confirms(self) -> None:
        """The ready confirms as one basic.ack (multiple=true when they are several)."""
        count = self.ready_count
        if count:
            self.ready_count = 0
            if not self.closing:
                self.session.conn.send_ack(self.number, self.ready_seq, count > 1)
                self._count_confirmed(count)

    def fail_pending_confirms(self) -> None:
        """The broker stops while the store still cannot write (StoreFailedError at close):
        what still waits for an fsync will never be durable, so each such confirm is a
        basic.nack, in publish order (M14). While running, a failed write is retried instead
        and its confirms keep waiting (see Broker.read_only)."""
        self.send_ready_confirms()
        pending, self.pending_confirms = self.pending_confirms, deque()
        if self.closing or not pending:
            return
        send = self.session.conn.send_method
        for seq, lsn in pending:
            if lsn == 0:  # had nothing to wait for (a transient message): its ack stands
                send(self.number, C.Basic.Ack(delivery_tag=seq, multiple=False))
                self._count_confirmed(1)
            else:
                send(self.number, C.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False))
        self.session.request_flush()

    def on_durable(self, durable: int) -> bool:
        """The store is durable up to ``durable``: ack the confirms waiting for it, coalesced
        into basic.ack multiple=true, a nack on the way sent on its own in its place.
        Returns True while some still wait."""
        self.send_ready_confirms()
        pending = self.pending_confirms
        send = self.session.conn.send_method
        last = 0
        count = 0
        sent = False
        while pending and pending[0][1] <= durable:
            seq, lsn = pending.popleft()
            if lsn >= 0:
                last = seq
                count += 1
                continue
            if self.closing:
                continue
            if count:
                send(self.number, C.Basic.Ack(delivery_tag=last, multiple=count > 1))
                self._count_confirmed(count)
                count = 0
            send(self.number, C.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False))
            sent = True
        if count and not self.closing:
            send(self.number, C.Basic.Ack(delivery_tag=last, multiple=count > 1))
            self._count_confirmed(count)
            sent = True
        if sent:
            self.session.request_flush()
        return bool(pending)


def py_deliver_run(ch: Channel, c: Consumer, q: BrokerQueue, now: float) -> int:
    """Broker._dispatch_one's loop (its queue's only consumer ``c``, of channel ``ch``): while
    ``c`` has credit (has_credit's tests in its order, W4; read each time, as a delivery may
    fill the connection's buffer, session.paused), one message received from ``q`` goes out
    (Channel.deliver). Returns bit 0 set when one went out, bit 1 when the loop ended for want
    of credit (clear: for want of a message). The reference of the compiled twin
    (gateway/broker/_queue.c deliver_run), which does the common delivery without
    Channel.deliver's and ServerConnection.send_deliver's frames, and calls Channel.deliver
    for any other."""
    receive = q.receive
    deliver = ch.deliver
    delivered = 0
    session = ch.session
    while ch.flow_active and not ch.closing and not ch.committing and not session.paused \
            and (c.no_ack or not c.prefetch or c.unacked < c.prefetch) \
            and (not ch.channel_prefetch or len(ch.unacked) + len(ch.tx_acks) < ch.channel_prefetch):
        receipt = receive(now)
        if receipt is None:
            return delivered
        deliver(c, q, receipt)
        delivered = 1
    return delivered | 2


def compiled_deliver_run() -> Any:
    """deliver_run compiled (gateway/broker/_queue.c), or None under CMQ_GATEWAY_PURE_PYTHON=1
    or where the package was built without a compiler (gateway.broker.queue.COMPILED)."""
    from gateway.broker import queue as broker_queue
    from gateway.protocol import fastpath
    from gateway.protocol.connection import _CHAN_OPEN, _CONN_OPEN, ServerConnection
    from gateway.protocol.properties import Properties

    if broker_queue.COMPILED is None:
        return None
    from gateway.broker import _queue  # type: ignore[attr-defined]

    return _queue.configure_deliver(Consumer, Message, Properties, ServerConnection, Unacked, DELIVER,
                                    fastpath.append_deliver, _CHAN_OPEN, _CONN_OPEN, py_deliver_run)


deliver_run = compiled_deliver_run() or py_deliver_run


def message_key_of(u: Unacked) -> str:
    q = u.queue
    return P.message_key(q.vhost, q.name, u.msg_id)
