"""Consumers and unacked deliveries (SPEC M11-M13, W4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.protocol.fastpath import tuple_of

if TYPE_CHECKING:
    from gateway.broker.channel import Channel
    from gateway.broker.queue import BrokerQueue

__all__ = ["Consumer", "Unacked", "new_unacked"]


class Consumer:
    """One basic.consume. ``prefetch`` is the per-consumer limit (basic.qos global=false at
    the time of the consume, as RabbitMQ applies it); 0 means unlimited."""

    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked", "arguments",
                 "receive_metadata")

    def __init__(self, tag: str, channel: Channel, queue: BrokerQueue, *, no_ack: bool,
                 exclusive: bool, prefetch: int, arguments: dict[str, Any] | None = None) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments or {}
        # M11 / PF5: basic.consume's x-cmq-receive-metadata asks for the CMQ receive metadata.
        self.receive_metadata = False

    def has_credit(self) -> bool:
        """W4: per consumer (global=false) and per channel (global=true), both may apply; and
        the channel must take deliveries at all (flow, closing, a commit running, the
        connection's write buffer full). One function, the channel's tests inlined: it runs
        before every delivery of every queue."""
        ch = self.channel
        if not ch.flow_active or ch.closing or ch.committing or ch.session.paused:
            return False
        if not self.no_ack and self.prefetch and self.unacked >= self.prefetch:
            return False
        # Settlements held by an open transaction keep their credit until the commit (W4).
        limit = ch.channel_prefetch
        return not limit or len(ch.unacked) + len(ch.tx_acks) < limit


class Unacked(NamedTuple):
    """A delivery waiting for basic.ack/nack/reject: the receipt handle is the CMQ one of
    this receive (Q3: only the latest handle deletes). Made with ``new_unacked`` on the hot
    path (one a delivery): no Python frame (a class's __init__ was one), and in C one tuple
    where tuple.__new__ made four (gateway.protocol.fastpath.tuple_of)."""

    queue: BrokerQueue
    handle: Any
    msg_id: str
    consumer: Consumer | None


new_unacked = tuple_of  # new_unacked(Unacked, queue, handle, msg_id, consumer)
