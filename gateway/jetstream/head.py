"""The undelivered head of a queue's stream, ended by a gateway without pulling it: x-max-length
drop-head (gateway.jetstream.maxlength) and due TTLs (gateway.jetstream.sweeper).

A stream delete of one sequence succeeds once, so the gateway whose delete succeeded owns the
message's end (dead-letter, audit) and two gateways ending messages at once end each once. The
end itself is the embedded broker's handling of the local model's event (``_queue_events``:
MaxLengthDropped, Expired, DeadLettered), so audit rows and dead-lettering are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from nats.js.errors import APIError, NotFoundError

from gateway.broker import persistence as P
from gateway.broker.message import Message, init_message, new_message
from gateway.jetstream.bodies import BODY_HEADER
from gateway.jetstream.wire import compiled
from gateway.protocol.properties import Properties
from semantics import queue as Q
from semantics.jetstream.names import CONSUMER

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker
    from gateway.jetstream.queues import QueueStream

__all__ = ["EXPIRES_AT", "MSG_ID", "VISIBLE_AT", "count", "end", "first_undelivered", "removed", "stored_message",
           "undelivered"]

MSG_ID = "Nats-Msg-Id"
EXPIRES_AT = "Cmq-Expires-At"  # RabbitMQ TTL (x-message-ttl, expiration), absolute epoch seconds
VISIBLE_AT = "Cmq-Visible-At"  # Q4: not before (epoch seconds), honoured by the puller


RECHECK = 0.02  # seconds between the two readings that tell the server's miscount from traffic


async def undelivered(js: Any, stream: str, workqueue: bool) -> Any:
    """The queue consumer's info, its ``num_pending`` (JetStream's count of undelivered
    messages) made good against a nats-server race (2.11 onwards, still in 2.15.1; not in
    2.10): a consumer info answered while a message delete is being applied counts the deleted
    message out twice, and the count then stays one short until the consumer drains the
    stream. Deletes are how a gateway ends a queue's head (due TTLs, x-max-length), and every
    gateway reads counts, so the race is one of ordinary use (tests/unit/jetstream/
    test_count_after_delete.py provokes it).

    On a work-queue stream (every queue's but a rewindable one's) each stored message is
    undelivered or leased (ack pending, naked ones included: max_deliver is unlimited), so the
    stream's count less the leases bounds the undelivered from below. Traffic between the two
    requests moves that bound either way for a moment; the miscount stays. So a count below
    the bound in two readings RECHECK apart is raised by the smaller shortfall."""
    info = await js.consumer_info(stream, CONSUMER)
    if not workqueue:
        return info
    short = await _shortfall(js, stream, info)
    if short > 0:
        await asyncio.sleep(RECHECK)
        info = await js.consumer_info(stream, CONSUMER)
        short = min(short, await _shortfall(js, stream, info))
        if short > 0:
            info.num_pending = (info.num_pending or 0) + short
    return info


async def _shortfall(js: Any, stream: str, info: Any) -> int:
    stored = (await js.stream_info(stream)).state.messages or 0
    return stored - (info.num_ack_pending or 0) - (info.num_pending or 0)


async def count(js: Any, s: QueueStream) -> Any:
    """The consumer's info (``undelivered``); the queue's estimate of undelivered messages
    follows it."""
    q = s.q
    info = await undelivered(js, s.stream, q.attrs.rewind_seconds <= 0)
    q.remote_ready = info.num_pending or 0
    return info


async def first_undelivered(js: Any, s: QueueStream, info: Any) -> tuple[Any, Any]:
    """(a fresh count, the oldest message JetStream had not delivered at that count or None),
    from ``info``, an earlier count. The head is read first and the count after it, so that
    the count says how many are over a limit *with* that head still there: read the other
    way, a head removed meanwhile by another gateway would make the next one look like it.
    """
    while info.num_pending:
        try:
            raw = await js.get_msg(s.stream, seq=info.delivered.stream_seq + 1, subject=s.subject, next=True)
        except NotFoundError:
            return await count(js, s), None
        info = await count(js, s)
        if info.delivered.stream_seq < raw.seq:
            return info, raw
        # pulled meanwhile (now a delivery of some gateway): the next one is the head
    return info, None


async def removed(js: Any, s: QueueStream, seq: int | None) -> bool:
    """The message at ``seq`` deleted from the stream by this call (False: by someone else)."""
    if seq is None:
        return False
    try:
        await js.delete_msg(s.stream, seq)
    except APIError:
        return False
    return True


# The four names of a stored record (vhost, queue, exchange, routing key) by their lengths and
# bytes (the record's bytes 9 to the names' end, as decode_message_head keys its cache and C's
# message_head gives them): a queue's messages share a few, decoded once rather than four
# decodes per message pulled. By the bytes alone, exchange "logs" with routing key ".a" and
# exchange "" with routing key "logs.a" would be one entry.
_NAMES: dict[bytes, tuple[str, str, str, str]] = {}
_NAMES_MAX = 1024
# Likewise a queue's messages share a few property lists: one Properties (read-only: raw
# bytes and what is decoded from them) serves every message pulled with the same bytes, as
# one serves every queue a published message is routed to (not one made a message pulled).
_PROPERTIES: dict[bytes, Properties] = {}
# decode_message_head's reading in C, or None (CMQ_GATEWAY_PURE_PYTHON=1, no compiler)
_message_head = getattr(compiled(), "message_head", None)


def _read_head(raw: bytes) -> tuple[float, tuple[str, str, str, str], str, bytes, int]:
    """The reference reading of a record's head, its names kept in (and taken from) _NAMES."""
    if len(_NAMES) >= _NAMES_MAX:
        _NAMES.clear()
    read = P.decode_message_head(raw, _NAMES)
    if read is None:
        raise ValueError("a queue stream's record shorter than its head")
    return read


def stored_message(raw: bytes, msg_id: str, body: bytes | None = None) -> Message:
    """The gateway's message of a queue stream's record (``P.encode_message``), its body
    the record's own unless ``body`` is given (a large one, read back): what a pull takes
    into the local model and what the head's end reports. Read with the record's head
    (``P.decode_message_head``), not the dict of every field (issue 28: CPU a message)."""
    # read in C (_wire.c's message_head) where it can, its names decoded once (_NAMES);
    # else, and for names not seen yet, by decode_message_head, the reference
    head = _message_head(raw) if _message_head is not None else None
    if head is not None:
        enqueue_time, key, properties, start = head
        four = _NAMES.get(key)
        if four is None:
            four = _read_head(raw)[1]
        _, _, exchange, routing_key = four
    else:
        enqueue_time, (_, _, exchange, routing_key), _, properties, start = _read_head(raw)
    props = _PROPERTIES.get(properties)
    if props is None:
        if len(_PROPERTIES) >= _NAMES_MAX:
            _PROPERTIES.clear()
        props = _PROPERTIES[properties] = Properties(properties)
    # made as the publish path makes its Message (new_message, init_message): the class's call
    # ran __init__ from C (type_call, slot_tp_init), ~1k instructions a pulled message more
    msg = new_message(Message)
    init_message(msg, raw[start:] if body is None else body, props, exchange, routing_key, enqueue_time, (), msg_id)
    return msg


async def end(broker: ClusterBroker, s: QueueStream, raw: Any, event: Any, *args: Any) -> None:
    """``raw`` (deleted from the stream by this gateway) ends as ``event(message, *args)``
    would end a message of the local model."""
    q = s.q
    headers = raw.headers or {}
    body = None
    big = headers.get(BODY_HEADER)
    if big is not None:
        with contextlib.suppress(Exception):
            body = await broker.messages.bodies.get(big)
        broker.spawn(broker.messages.bodies.delete(big))
    msg = stored_message(raw.data, headers.get(MSG_ID, ""), body)
    exp = headers.get(EXPIRES_AT)
    m = Q.QueueMessage(msg.msg_id, msg, len(msg.body), msg.published_at, 0, None if exp is None else float(exp))
    m.state = Q.REMOVED
    vh = broker.vhosts.get(q.vhost)
    if vh is not None and not q.deleted:
        broker._queue_events(vh, q, [event(m, *args)])
