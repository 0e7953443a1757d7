"""RabbitMQ's direct reply-to (``amq.rabbitmq.reply-to``): RPC replies without a reply queue.

CMQ has no such thing; RPC clients (pika, aio-pika, kombu) use it as RabbitMQ defines it:

* ``basic.consume`` on the pseudo-queue ``amq.rabbitmq.reply-to`` with ``no_ack`` makes the
  channel a reply consumer (406 "reply consumer cannot acknowledge" otherwise, 406 "reply
  consumer already set" for a second one);
* a publish on that channel with ``reply_to = amq.rabbitmq.reply-to`` has its ``reply_to``
  rewritten to ``amq.rabbitmq.reply-to.<key>``, the key naming the channel (406 "fast reply
  consumer does not exist" without a reply consumer);
* a publish to the default exchange with that routing key goes straight to the consumer, with
  the properties as published: no queue, no CMQ message (no M11 headers), nothing stored.
  Once the channel is gone the reply is unroutable (312 NO_ROUTE under mandatory).
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

from gateway.broker.deadletter import set_shortstr
from gateway.broker.errors import precondition

if TYPE_CHECKING:
    from gateway.broker.channel import Channel

__all__ = ["REPLY_QUEUE", "REPLY_PREFIX", "ReplyRouter"]

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."
_REPLY_TO = 6  # field index of ``reply_to`` in the basic property list


class ReplyRouter:
    """The reply consumers of one broker, by the key in their reply-to names."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[Channel, str]] = {}

    def consume(self, ch: Channel, tag: str, no_ack: bool) -> None:
        if not no_ack:
            raise precondition("reply consumer cannot acknowledge")
        if ch.reply_key is not None:
            raise precondition("reply consumer already set")
        key = base64.urlsafe_b64encode(os.urandom(18)).decode()
        ch.reply_key = key
        self._by_key[key] = (ch, tag)

    def cancel(self, ch: Channel) -> None:
        if ch.reply_key is not None:
            self._by_key.pop(ch.reply_key, None)
            ch.reply_key = None

    def rewrite(self, ch: Channel, properties: Any) -> Any:
        """A request's properties with ``reply_to`` naming this channel's reply consumer."""
        if ch.reply_key is None:
            raise precondition("fast reply consumer does not exist")
        return type(properties)(set_shortstr(properties.raw, _REPLY_TO, REPLY_PREFIX + ch.reply_key))

    def deliver(self, routing_key: str, properties: Any, body: bytes) -> bool:
        """A reply published to ``amq.rabbitmq.reply-to.<key>``: False when nobody waits for it."""
        target = self._by_key.get(routing_key[len(REPLY_PREFIX):])
        if target is None:
            return False
        ch, tag = target
        if ch.closing:
            return False
        tag_no = ch.next_tag
        ch.next_tag = tag_no + 1
        session = ch.session
        session.conn.send_deliver(ch.number, tag, tag_no, False, "", routing_key, properties.raw, body)
        session.request_flush()
        return True
