"""What CMQ SendMessage checks and derives before a message enters a queue: L6 (size), L8
(maxMsgHeapNum, delay range), Q4 (the queue's default delay), x-message-ttl and M7
(x-max-length with x-overflow reject-publish).

One place for every message store: the embedded model (``CmqQueue.send``) and the JetStream
store (``gateway.jetstream.messages``) call these, each with its own count of what the queue
holds, so the two cannot drift apart (issue 28: the JetStream side had its own copies).
Each check raises before anything changed; none of them keeps state.
"""

from __future__ import annotations

from semantics import limits
from semantics.errors import CMQError, LimitError
from semantics.queue_attrs import OVERFLOW_DROP_HEAD

__all__ = ["MaxLengthRejected", "check_heap", "check_room", "check_size", "message_expiry", "send_delay",
           "send_expiry"]


class MaxLengthRejected(CMQError):
    """x-max-length with overflow reject-publish: the message was refused, nothing changed.

    Not a channel error in RabbitMQ: the gateway answers basic.nack to a confirming publisher
    (and dead-letters it for reject-publish-dlx).
    """


def check_size(queue: str, size: int, max_size: int, refuse: bool) -> None:
    """L6: a body above the queue's maxMsgSize is refused (``refuse``: the profile enforces it)."""
    if size > max_size and refuse:
        raise LimitError("L6", f"message of {size:,} bytes is larger than queue '{queue}' "
                         f"max_msg_size {max_size:,} bytes", value=size, limit=max_size)


def check_heap(queue: str, held: int, heap_num: int) -> None:
    """L8: a queue holding ``heap_num`` messages (maxMsgHeapNum) takes no more."""
    if held >= heap_num:
        raise LimitError("L8", f"queue '{queue}' already retains {heap_num:,} messages "
                         f"(max_msg_heap_num)", value=heap_num + 1, limit=heap_num)


def send_delay(delay: float | None, default: float) -> float:
    """Q4: the message's delay, the queue's DelaySeconds when it asks for none; L8: in range."""
    if delay is None:
        return default
    if not 0 <= delay <= limits.DELAY_SECONDS_MAX:
        raise LimitError("L8", f"delay_seconds={delay!r} is out of range 0-{limits.DELAY_SECONDS_MAX:,} s "
                         "(Q4)", value=delay, limit=(0, limits.DELAY_SECONDS_MAX))
    return delay


def message_expiry(now: float, delay: float | None, ttl: float | None) -> float | None:
    """The message's own expiration (per-message TTL, M7), counted from the end of the delay
    the publisher asked for (not the queue's default delay)."""
    return None if ttl is None else now + (delay or 0.0) + ttl


def send_expiry(now: float, delay: float, queue_ttl: float | None, expires_at: float | None) -> float | None:
    """When the message expires: its own expiration or the queue's x-message-ttl, whichever
    comes first; x-message-ttl counts from when the message is in the queue, after any delay."""
    if queue_ttl is not None:
        ttl_end = now + delay + queue_ttl
        if expires_at is None or ttl_end < expires_at:
            return ttl_end
    return expires_at


def check_room(queue: str, delay: float, ready: int, max_length: int | None, overflow: str) -> None:
    """M7: x-max-length with x-overflow reject-publish(-dlx) refuses a message for which the
    queue's ``ready`` messages leave no room; a delayed one is not ready, so it has room
    (drop-head takes every message and drops the oldest instead)."""
    if not delay and max_length is not None and overflow != OVERFLOW_DROP_HEAD and ready >= max_length:
        raise MaxLengthRejected("M7", f"queue '{queue}' is full (x-max-length {max_length}, "
                                f"x-overflow {overflow})", value=max_length)
