"""One AMQP connection's view of the broker: its channels and the methods they carry."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from gateway.auth import Access
from gateway.broker.arguments import receive_metadata, rewind_to
from gateway.broker.channel import Channel
from gateway.broker.consumers import Consumer
from gateway.broker.errors import NO_ROUTE, NOT_IMPLEMENTED, ConnectionFault, access_refused, precondition
from gateway.broker.message import NO_CYCLE
from gateway.broker.reply_to import REPLY_QUEUE
from gateway.broker.vhost import new_name
from gateway.protocol.codec import method as method_of
from gateway.protocol.events import ChannelClose, ChannelCloseOk, ChannelFlow, ChannelOpen, Content, Method
from gateway.protocol.properties import REPLY_TO_FLAG, Properties
from semantics.errors import REPLY_NAMES, CMQError

if TYPE_CHECKING:
    from gateway.broker.broker import Broker

__all__ = ["Session"]


class Session:
    """Created by the transport after the handshake, one per connection.

    The transport feeds channel events to :meth:`on_event`; the session answers through
    ``conn`` (send_method / send_content / send_deliver / close_channel / close) and calls
    ``request_flush()`` whenever it wrote outside of ``on_event`` (deliveries caused by
    another connection, confirms after fsync, timers).
    """

    def __init__(self, broker: Broker, conn: Any, vhost: str, user: str, peer: str,
                 request_flush: Callable[[], None]) -> None:
        self.broker = broker
        self.conn = conn
        self.vhost_name = vhost
        self.vhost = broker.vhost(vhost)
        self.user = user
        self.peer = peer
        self.request_flush = request_flush
        self.channels: dict[int, Channel] = {}
        self.paused = False
        self.closed = False
        # W2: the user's configure/write/read patterns on this vhost, checked as RabbitMQ
        # checks them. A broker without a user database (embedded, tests) checks nothing.
        users = getattr(broker.config, "users", None)
        self.check_access = users is not None
        self._users = users
        self._writable: dict[str, bool] = {}  # basic.publish: write permission per exchange
        # W2 checks these resources under another name: an MQTT session's internal queues
        # (amq.mqtt-..., which no client may declare) under the names RabbitMQ's MQTT plugin
        # gives them, mqtt-subscription-<client id>, that users' permission patterns name.
        self.permission_names: dict[str, str] = {}
        self._in_method = False  # a method's handler runs: the cancels it causes wait for it
        self._cancels: list[tuple[Channel, str]] = []
        # MQ7: set to "mqtt" by an MQTT client's session; its publish, deliver and ack
        # records then say so (None: AMQP, the records as before).
        self.protocol: str | None = None
        broker.sessions.add(self)

    def emit(self, event: str, **fields: Any) -> None:
        """An audit record caused by this connection: its user and peer (A2)."""
        self.broker.emit_fields(event, self.vhost_name, {"user": self.user, "peer": self.peer, **fields})

    def authorize(self, access: Access, kind: str, name: str) -> None:
        """W2: 403 ACCESS_REFUSED (a channel error, as RabbitMQ) unless the user's ``access``
        pattern on this vhost matches the resource name (the default exchange is
        ``amq.default``)."""
        if self._users is None:
            return
        name = self.permission_names.get(name, name)
        # Looked up at each check (a dict lookup), so permissions an administrator changes
        # over the management API bind open connections too (SE1); publish keeps a cache,
        # which permissions_changed empties.
        perm = self._users.vhost_permission(self.user, self.vhost_name)
        if perm is None or not perm.allows(access, name):
            text = (f"access to {kind} '{name or 'amq.default'}' in vhost '{self.vhost_name}' "
                    f"refused for user '{self.user}'")
            if self.protocol is None:  # A1: audited as the HTTP and MQTT refusals are (MQTT audits its own)
                self.emit("auth_failure", reason=f"{access}: {text}"[:512], protocol="amqp")
            raise access_refused(text, "W2")

    def permissions_changed(self) -> None:
        """SE1: the user's permissions on this vhost were changed (management API, definitions
        import): publishes are authorized again from the next one on, on AMQP and MQTT alike
        (the MQTT Bridge keeps a cache of its own)."""
        self._writable.clear()
        forget = getattr(self.conn, "permissions_changed", None)
        if forget is not None:
            forget()

    def supports(self, capability: str) -> bool:
        props = getattr(self.conn, "client_properties", None) or {}
        caps = props.get("capabilities") if isinstance(props, dict) else None
        # Without the client's properties, assume what every current client advertises.
        return True if not isinstance(caps, dict) else bool(caps.get(capability))

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: object) -> None:
        """ChannelOpen / ChannelClose / ChannelCloseOk / ChannelFlow / Method / Content."""
        cls = type(event)  # told apart by class: a name's string tests cost every message
        # Each class's fields are read at sites of their own: one attribute site that sees a
        # Content and a Method in turn (a publish, an ack) is never specialized by CPython 3.11.
        if cls is Content:
            number: int = event.channel  # type: ignore[attr-defined]
            method = event.method  # type: ignore[attr-defined]
        elif cls is Method:
            number = event.channel  # type: ignore[attr-defined]
            method = event.method  # type: ignore[attr-defined]
        elif cls is ChannelFlow:
            number = event.channel  # type: ignore[attr-defined]
        else:
            self._open_or_close(cls, event)
            return
        ch = self.channels.get(number)
        if ch is None or ch.closing:
            return  # the core drops frames for a channel we are closing
        if ch.held is not None:
            ch.held.append(event)  # Q5: a basic.get waits; what follows on its channel waits too
            return
        if cls is ChannelFlow:
            ch.flow_active = bool(event.active)  # type: ignore[attr-defined]
            try:
                if ch.flow_active:
                    self.broker.dispatch_channel(ch)
            except CMQError as e:
                self.channel_error(ch, e)
            return
        try:
            if cls is Content:
                if self.check_access and not self._writable.get(method.exchange, False):
                    self.authorize("write", "exchange", method.exchange)  # W2; raises when refused
                    self._writable[method.exchange] = True
                properties = event.properties  # type: ignore[attr-defined]
                if ch.tx:
                    ch.tx_publishes.append((method, properties, event.body))  # type: ignore[attr-defined]
                elif ch.confirm or method.mandatory or type(properties) is not Properties \
                        or properties._flags & REPLY_TO_FLAG:
                    self.publish_now(ch, method, properties, event.body)  # type: ignore[attr-defined]
                else:  # publish_now with nothing for it to do after: no confirm, return or reply-to
                    # By position (immediate, user, peer, cycle, protocol): cheaper than by keyword.
                    self.vhost.publish(method.exchange, method.routing_key, properties, event.body,  # type: ignore[attr-defined]
                                       method.immediate, self.user, self.peer, NO_CYCLE, self.protocol)
            elif type(method) is _ACK and not ch.tx:
                # Every delivery's ack: it causes no basic.cancel to hold back (see _method),
                # so it skips that bookkeeping. Told by its class: ``method.name`` is a class
                # attribute of pamqp's, read unspecialized.
                ch.ack(method.delivery_tag, method.multiple)
            else:
                self._method(ch, method)
        except ConnectionFault as e:
            cls_id, mid = _ids(method)
            self.conn.close(e.reply_code, e.reply_text, cls_id, mid)
        except CMQError as e:
            self.channel_error(ch, e, method)

    def on_acks(self, number: int, tags: list[int]) -> int:
        """basic.ack (multiple=false) of each of ``tags`` on channel ``number``, as on_event
        takes such a Method event one by one (the transport's run of a consumer's acks,
        fastpath.ack_run, read after an ack on_event took). Returns how many it took: it
        stops before the first that on_event would not hand to ``Channel.ack`` (the channel
        gone, closing, in a transaction or holding events), and after one that failed (its
        reply sent as on_event sends it), so the rest go through on_event."""
        ch = self.channels.get(number)
        if ch is None or ch.closing or ch.held is not None or ch.tx:
            return 0
        taken = 0
        broker = self.broker
        ack = broker.ack
        for tag in tags:
            if ch.closing:
                break
            taken += 1
            try:
                # Channel.ack's one-tag steps, without its frame
                one = ch.unacked.pop(tag, None)
                if one is None:
                    raise precondition(f"unknown delivery tag {tag}", rule="M12", value=tag)
                consumer = one.consumer
                if consumer is not None:
                    consumer.unacked -= 1
                ack(self, one)
                if ch.channel_prefetch:
                    broker.dispatch_channel(ch)
            except ConnectionFault as e:
                cls_id, mid = _ids(_ACK)
                self.conn.close(e.reply_code, e.reply_text, cls_id, mid)
                break
            except CMQError as e:
                self.channel_error(ch, e, _ACK(delivery_tag=tag, multiple=False))
                break
        return taken

    def _open_or_close(self, cls: type, event: object) -> None:
        """on_event's channel.open, channel.close and channel.close-ok."""
        number: int = event.channel  # type: ignore[attr-defined]
        if cls is ChannelOpen:
            self.channels[number] = Channel(self, number)
            return
        if cls is ChannelClose or cls is ChannelCloseOk:
            ch = self.channels.get(number)
            if ch is not None and ch.held is not None:
                self.end_wait(ch)
            ch = self.channels.pop(number, None)
            if ch is not None:
                ch.close()

    def _method(self, ch: Channel, method: Any) -> None:
        """A method's handler; the basic.cancel notices it causes follow its reply."""
        handler = _HANDLERS.get(method.name)
        if handler is None:
            raise ConnectionFault("M16", f"method {method.name} is not implemented", reply_code=540)
        self._in_method = True
        try:
            handler(self, ch, method)
        finally:
            self._in_method = False
            if self._cancels:
                if ch.held is not None:  # the reply waits: the notices follow it
                    ch.cancels_after_reply += self._cancels
                    self._cancels = []
                else:
                    self._send_cancels()

    def notify_cancel(self, ch: Channel, tag: str) -> None:
        """basic.cancel for a consumer whose queue went away. Caused by a method of this
        connection (queue.delete), it follows that method's reply, as RabbitMQ's does: a
        client waiting for delete-ok must not see its own consumer cancelled first."""
        if self._in_method:
            self._cancels.append((ch, tag))
            return
        self.conn.send_method(ch.number, C.Basic.Cancel(consumer_tag=tag, nowait=True))
        self.request_flush()

    def _send_cancels(self) -> None:
        cancels, self._cancels = self._cancels, []
        for ch, tag in cancels:
            if not ch.closing:
                self.conn.send_method(ch.number, C.Basic.Cancel(consumer_tag=tag, nowait=True))
        self.request_flush()

    def replay_held(self, ch: Channel) -> None:
        """Q5: the channel's long-polling basic.get was answered; the events that arrived on
        the channel meanwhile run now, in order (a replayed basic.get may wait again: the
        rest is then held anew by on_event)."""
        held = ch.held
        if held is None or ch.waiting_get is not None:
            return
        ch.held = None
        self._cancels_after_reply(ch)
        for event in held:
            self.on_event(event)
        self.request_flush()

    def _cancels_after_reply(self, ch: Channel) -> None:
        if ch.cancels_after_reply:
            self._cancels, ch.cancels_after_reply = ch.cancels_after_reply, []
            if not self.closed:  # a lost connection takes no notice
                self._send_cancels()

    def end_wait(self, ch: Channel) -> None:
        """Q5: the channel closes while its basic.get waits (or before what waited behind it
        ran): the waiter is cancelled, having taken no message. What the client sent after
        the get still counts (its publishes are routed, its acks applied), but the closing
        channel is handed no message: a basic.get answers get-empty, consumers get nothing."""
        self.broker.cancel_get(ch)
        held, ch.held = ch.held or [], None
        self._cancels_after_reply(ch)  # other channels' consumers are gone all the same
        ch.draining = True
        ch.flow_active = False
        for event in held:
            if type(event).__name__ != "ChannelFlow":
                self.on_event(event)

    def channel_error(self, ch: Channel, e: CMQError, method: Any = None) -> None:
        """M16: close the channel with the code RabbitMQ would use and a text naming the rule."""
        cls, mid = _ids(method)
        text = e.reply_text if e.reply_code in REPLY_NAMES else str(e)
        ch.close()
        ch.closing = True
        self.conn.close_channel(ch.number, e.reply_code, text, cls, mid)

    def pause_delivery(self) -> None:
        """Transport write buffer above high water: stop pushing deliveries (slow consumer)."""
        self.paused = True

    def resume_delivery(self) -> None:
        """Write buffer drained below low water: deliver again."""
        self.paused = False
        for ch in list(self.channels.values()):
            self.broker.dispatch_channel(ch)

    def on_connection_lost(self) -> None:
        """Unacked deliveries become Active again (M13); exclusive queues are dropped."""
        if self.closed:
            return
        self.closed = True
        for ch in list(self.channels.values()):
            if ch.held is not None:
                self.end_wait(ch)
            ch.closing = True
            ch.close()
        self.channels.clear()
        self.vhost.drop_exclusive(self)
        self.broker.sessions.discard(self)

    # -- publish (M9, M10, M14) --------------------------------------------------------------

    def publish_now(self, ch: Channel, method: Any, properties: Any, body: bytes,
                    msg_id: str | None = None) -> None:
        """``msg_id``: the CMQ message ID to route it under (an MQTT QoS 2 resend's, MQ8)."""
        if (type(properties) is not Properties or properties._flags & REPLY_TO_FLAG) \
                and properties.reply_to == REPLY_QUEUE:
            properties = self.broker.replies.rewrite(ch, properties)  # direct reply-to
        seq = 0
        if ch.confirm:
            ch.publish_seq += 1
            seq = ch.publish_seq
        try:
            out = self.vhost.publish(method.exchange, method.routing_key, properties, body,
                                     immediate=method.immediate, user=self.user, peer=self.peer,
                                     protocol=self.protocol, msg_id=msg_id)
        except CMQError:
            raise
        except Exception:  # the store refused it (M14: basic.nack)
            if seq:
                ch.confirm_publish(seq, 0, nack=True)
                return
            raise
        if not out.routed and method.mandatory:
            self.conn.send_content(ch.number, method_of(
                C.Basic.Return, reply_code=NO_ROUTE, reply_text="NO_ROUTE", exchange=method.exchange,
                routing_key=method.routing_key), properties, body)
        if seq:
            ch.confirm_publish(seq, out.lsn, out.rejected)

    # -- exchange / queue methods ------------------------------------------------------------

    def _exchange_declare(self, ch: Channel, m: Any) -> None:
        if not m.passive:
            self.authorize("configure", "exchange", m.exchange)
        self.vhost.declare_exchange(m.exchange, m.exchange_type, passive=m.passive, durable=m.durable,
                                    auto_delete=m.auto_delete, internal=m.internal,
                                    arguments=m.arguments, user=self.user, peer=self.peer)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Exchange.DeclareOk())

    def _exchange_delete(self, ch: Channel, m: Any) -> None:
        self.authorize("configure", "exchange", m.exchange)
        self.vhost.delete_exchange(m.exchange, if_unused=m.if_unused, user=self.user)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Exchange.DeleteOk())

    def _exchange_bind(self, ch: Channel, m: Any) -> None:
        self.authorize("write", "exchange", m.destination)
        self.authorize("read", "exchange", m.source)
        self.vhost.bind(self, m.source, ("x", m.destination), m.routing_key, m.arguments, self.user, self.peer)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Exchange.BindOk())

    def _exchange_unbind(self, ch: Channel, m: Any) -> None:
        self.authorize("write", "exchange", m.destination)
        self.authorize("read", "exchange", m.source)
        self.vhost.unbind(self, m.source, ("x", m.destination), m.routing_key, self.user)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Exchange.UnbindOk())

    def _queue_declare(self, ch: Channel, m: Any) -> None:
        if m.queue == REPLY_QUEUE and m.passive:
            # RabbitMQ answers for the direct reply-to pseudo-queue as if it had one consumer.
            if not m.nowait:
                self.conn.send_method(ch.number, method_of(C.Queue.DeclareOk, queue=REPLY_QUEUE, message_count=0,
                                                                    consumer_count=1))
            return
        server_name = None
        name = m.queue
        if not m.passive:
            # W2: configure on the queue; a server-named queue is checked under its new name.
            # An MQTT session's own queue (amq.mqtt-..., MQ8) is named by the server too.
            if name in self.permission_names:
                server_name, name = name, ""
            elif not name:
                server_name = new_name("amq.gen-")
            self.authorize("configure", "queue", server_name or name)
        q = self.vhost.declare_queue(self, name, passive=m.passive, durable=m.durable,
                                     exclusive=m.exclusive, auto_delete=m.auto_delete,
                                     arguments=m.arguments, user=self.user, server_name=server_name,
                                     peer=self.peer)
        if not m.nowait:
            self.broker.answer_count(ch, q, q.message_count, lambda n: method_of(
                C.Queue.DeclareOk, queue=q.name, message_count=n, consumer_count=len(q.consumers)))

    def _queue_delete(self, ch: Channel, m: Any) -> None:
        self.authorize("configure", "queue", m.queue)
        q = self.vhost.queues.get(m.queue)
        count = self.vhost.delete_queue(self, m.queue, if_unused=m.if_unused, if_empty=m.if_empty,
                                        user=self.user)
        if not m.nowait:
            self.broker.answer_count(ch, q, count, lambda n: C.Queue.DeleteOk(message_count=n))

    def _queue_purge(self, ch: Channel, m: Any) -> None:
        self.authorize("read", "queue", m.queue)
        count = self.vhost.purge_queue(self, m.queue, self.user)
        if not m.nowait:
            self.broker.answer_count(ch, self.vhost.queues.get(m.queue), count,
                                     lambda n: C.Queue.PurgeOk(message_count=n))

    def _queue_bind(self, ch: Channel, m: Any) -> None:
        self.authorize("write", "queue", m.queue)
        self.authorize("read", "exchange", m.exchange)
        self.vhost.bind(self, m.exchange, ("q", m.queue), m.routing_key, m.arguments, self.user, self.peer)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Queue.BindOk())

    def _queue_unbind(self, ch: Channel, m: Any) -> None:
        self.authorize("write", "queue", m.queue)
        self.authorize("read", "exchange", m.exchange)
        self.vhost.unbind(self, m.exchange, ("q", m.queue), m.routing_key, self.user)
        self.conn.send_method(ch.number, C.Queue.UnbindOk())

    # -- basic -------------------------------------------------------------------------------

    def _basic_qos(self, ch: Channel, m: Any) -> None:
        # W4, as RabbitMQ: global=false limits each consumer created afterwards,
        # global=true the channel as a whole; a byte window is not implemented (540).
        if m.prefetch_size:
            raise ConnectionFault("M16", f"prefetch_size!=0 ({m.prefetch_size})", reply_code=NOT_IMPLEMENTED)
        if m.global_:
            ch.channel_prefetch = m.prefetch_count
        else:
            ch.consumer_prefetch = m.prefetch_count
            for c in ch.consumers.values():
                c.prefetch = m.prefetch_count
        self.conn.send_method(ch.number, C.Basic.QosOk())
        self.broker.dispatch_channel(ch)

    def _basic_consume(self, ch: Channel, m: Any) -> None:
        tag = m.consumer_tag or new_name("amq.ctag-")
        if tag in ch.consumers or (ch.reply_key is not None and tag == ch.reply_tag):
            raise ConnectionFault("M16", f"attempt to reuse consumer tag '{tag}'", reply_code=530)
        if m.queue == REPLY_QUEUE:
            self.broker.replies.consume(ch, tag, m.no_ack)  # direct reply-to
            ch.reply_tag = tag
            if not m.nowait:
                self.conn.send_method(ch.number, C.Basic.ConsumeOk(consumer_tag=tag))
            return
        self.authorize("read", "queue", m.queue)
        q = self.vhost.queue(m.queue, self)
        if any(c.exclusive for c in q.consumers) or (m.exclusive and q.consumers):
            raise access_refused(f"queue '{q.name}' in vhost '{self.vhost_name}' in exclusive use")
        target = rewind_to(m.arguments)
        if target is not None:
            # M15 / Q6: rewind before the consumer starts receiving.
            count = q.cmq.rewind(target, self.broker.now())
            self.emit("rewind", queue=q.name, next_at=target, size=count)
            self.broker.after_queue_change(self.vhost, q, dispatch=False)
        consumer = Consumer(tag, ch, q, no_ack=m.no_ack, exclusive=m.exclusive,
                            prefetch=ch.consumer_prefetch, arguments=m.arguments)
        consumer.receive_metadata = receive_metadata(m.arguments)  # M11, PF5
        ch.consumers[tag] = consumer
        q.add_consumer(consumer)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Basic.ConsumeOk(consumer_tag=tag))
        self.broker.dispatch(q)

    def _basic_cancel(self, ch: Channel, m: Any) -> None:
        ch.cancel(m.consumer_tag)
        if not m.nowait:
            self.conn.send_method(ch.number, C.Basic.CancelOk(consumer_tag=m.consumer_tag))

    def _basic_get(self, ch: Channel, m: Any) -> None:
        self.authorize("read", "queue", m.queue)
        q = self.vhost.queue(m.queue, self)
        self.broker.get(ch, q, m.no_ack)

    def _basic_recover(self, ch: Channel, m: Any) -> None:
        if not m.requeue:
            # As RabbitMQ 3.x: redelivering to the same consumer is not supported.
            raise ConnectionFault("M16", "requeue=false", reply_code=NOT_IMPLEMENTED)
        if m.name == "Basic.Recover":
            # recover-ok before the redeliveries it causes, as RabbitMQ's ordering gives them.
            self.conn.send_method(ch.number, C.Basic.RecoverOk())
        ch.requeue_all()

    # -- confirms and tx ---------------------------------------------------------------------

    def _confirm_select(self, ch: Channel, m: Any) -> None:
        if ch.tx:
            raise precondition("cannot switch from tx to confirm mode", rule="M14")
        ch.confirm = True
        if not m.nowait:
            self.conn.send_method(ch.number, C.Confirm.SelectOk())

    def _tx_select(self, ch: Channel, m: Any) -> None:
        if ch.confirm:
            raise precondition("cannot switch from confirm to tx mode", rule="M14")
        ch.tx = True
        self.conn.send_method(ch.number, C.Tx.SelectOk())

    def _tx_commit(self, ch: Channel, m: Any) -> None:
        if not ch.tx:
            raise precondition("channel is not transactional", rule="M16")
        publishes, ch.tx_publishes = ch.tx_publishes, []
        settles, ch.tx_acks = ch.tx_acks, []
        broker = self.broker
        ch.committing = True
        try:
            for method, properties, body in publishes:
                self.publish_now(ch, method, properties, body)
            for _tag, u, action in settles:
                if u.consumer is not None:
                    u.consumer.unacked -= 1  # the credit held since the ack comes back now (W4)
                if action is None:
                    broker.ack(self, u)
                else:
                    broker.reject(self, u, action)
        finally:
            ch.committing = False
        self.conn.send_method(ch.number, C.Tx.CommitOk())
        broker.dispatch_channel(ch)  # what the commit made deliverable, after commit-ok

    def _tx_rollback(self, ch: Channel, m: Any) -> None:
        if not ch.tx:
            raise precondition("channel is not transactional", rule="M16")
        ch.tx_publishes = []
        # As RabbitMQ: the acks and rejects of the transaction are forgotten; the deliveries
        # stay unacked under their original delivery tags.
        ch.restore_unacked(ch.tx_acks)
        ch.tx_acks = []
        self.conn.send_method(ch.number, C.Tx.RollbackOk())


def _tx_ack(self: Session, ch: Channel, m: Any) -> None:
    if ch.tx:
        ch.tx_acks.extend((tag, u, None) for tag, u in ch.take_tagged(m.delivery_tag, m.multiple, hold=True))
        return
    ch.ack(m.delivery_tag, m.multiple)


def _tx_nack(self: Session, ch: Channel, m: Any) -> None:
    if ch.tx:
        ch.tx_acks.extend((tag, u, m.requeue) for tag, u in ch.take_tagged(m.delivery_tag, m.multiple, hold=True))
        return
    ch.reject(m.delivery_tag, m.multiple, m.requeue)


def _tx_reject(self: Session, ch: Channel, m: Any) -> None:
    if ch.tx:
        ch.tx_acks.extend((tag, u, m.requeue) for tag, u in ch.take_tagged(m.delivery_tag, False, hold=True))
        return
    ch.reject(m.delivery_tag, False, m.requeue)


def _ids(method: Any) -> tuple[int, int]:
    index = getattr(method, "index", 0) or 0
    return index >> 16, index & 0xFFFF


_ACK = C.Basic.Ack
_HANDLERS: dict[str, Callable[[Session, Channel, Any], None]] = {
    "Exchange.Declare": Session._exchange_declare,
    "Exchange.Delete": Session._exchange_delete,
    "Exchange.Bind": Session._exchange_bind,
    "Exchange.Unbind": Session._exchange_unbind,
    "Queue.Declare": Session._queue_declare,
    "Queue.Delete": Session._queue_delete,
    "Queue.Purge": Session._queue_purge,
    "Queue.Bind": Session._queue_bind,
    "Queue.Unbind": Session._queue_unbind,
    "Basic.Qos": Session._basic_qos,
    "Basic.Consume": Session._basic_consume,
    "Basic.Cancel": Session._basic_cancel,
    "Basic.Get": Session._basic_get,
    "Basic.Ack": _tx_ack,
    "Basic.Nack": _tx_nack,
    "Basic.Reject": _tx_reject,
    "Basic.Recover": Session._basic_recover,
    "Basic.RecoverAsync": Session._basic_recover,
    "Confirm.Select": Session._confirm_select,
    "Tx.Select": Session._tx_select,
    "Tx.Commit": Session._tx_commit,
    "Tx.Rollback": Session._tx_rollback,
}
