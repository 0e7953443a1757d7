"""A run of pulled deliveries of the common case taken into the local model in one call
(``Pulls._take``, issue 28: CPU a message).

Most deliveries of a pull are a queue message's first delivery with its Nats-Msg-Id header
alone, whose record's names and properties the queue's earlier messages brought already.
``Pulls._take`` reads each delivery in a Python loop body; for a run of such deliveries
_wire.c's ``take_plains`` does that body's steps for the lot in one call (the body, the
ack_numbers call and stored_message's frame were ~5k instructions a delivery), and stops at
the first delivery that is anything else, which the loop body takes. :func:`take_plains` here
is its reference, step for step (tests/unit/jetstream/test_plain_takes.py holds them equal);
the gateway without the C module leaves every delivery to the loop body, which takes these
the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from gateway.jetstream.wire import Delivery, compiled

__all__ = ["compiled_take_plains", "plain_head", "plain_numbers", "take_plains"]

_HEAD = struct.Struct(">BdHHHHI")  # persistence.encode_message's record head
_MAX_DIGITS = 18
_MISSING = object()


def plain_numbers(reply: str) -> tuple[int, int, int] | None:
    """(delivered, consumer seq, pending) of a reply subject as _wire.c's ack_numbers reads
    them: 9 tokens or 11 and more, each number 1 to 18 ASCII digits; else None."""
    try:
        reply.encode()
    except UnicodeEncodeError:
        return None
    t = reply.split(".")
    if len(t) == 9:
        at = 4
    elif len(t) >= 11:
        at = 6
    else:
        return None
    nums = []
    for tok in (t[at], t[at + 2], t[at + 4]):
        if not (0 < len(tok) <= _MAX_DIGITS and tok.isascii() and tok.isdigit()):
            return None
        nums.append(int(tok))
    return nums[0], nums[1], nums[2]


def plain_head(raw: bytes) -> tuple[float, bytes, bytes, int] | None:
    """(enqueue time, the names with their lengths, the properties, where the body starts) of
    a record, as _wire.c's message_head reads it (an ASCII message ID), else None."""
    if len(raw) < _HEAD.size:
        return None
    _, enq, lv, lq, le, lr, lp = _HEAD.unpack_from(raw)
    end = _HEAD.size + lv + lq + le + lr
    if end > len(raw):
        return None
    nul = raw.find(b"\x00", end)
    if nul < 0 or not raw[end:nul].isascii() or nul + 1 + lp > len(raw):
        return None
    return enq, raw[9:end], raw[nul + 1:nul + 1 + lp], nul + 1 + lp


def take_plains(msgs: list[Any], i: int, s: Any, now: float, leases: dict[str, Any], delays: dict[str, Any],
                restore_plain: Callable[..., Any], names: dict[bytes, tuple[str, str, str, str]],
                props: dict[bytes, Any], new_message: Callable[[type], Any], init_message: Callable[..., Any],
                message_cls: type, cmq_error: type[Exception], key: str) -> tuple[int, int | None]:
    """msgs[i:] taken while each is the common case (see the module docstring and _wire.c's
    take_plains); (the index of the first one not taken, the pending count of the delivery
    that last raised ``s.last_delivery``, or None)."""
    last_delivery = s.last_delivery
    if type(last_delivery) is not int or not -(1 << 63) <= last_delivery < 1 << 63:
        return i, None  # as C declines it
    last = None
    try:
        while i < len(msgs):
            m = msgs[i]
            if type(m) is not Delivery:
                break
            reply, data, headers = m.reply, m.data, m.headers
            if type(reply) is not str or type(data) is not bytes or type(headers) is not dict or len(headers) != 1:
                break
            (k, msg_id), = headers.items()
            if type(k) is not str or type(msg_id) is not str or k != key:
                break
            nums = plain_numbers(reply)
            if nums is None or nums[0] > 1:
                break  # a redelivery (a receive count), or numbers the loop body reads
            head = plain_head(data)
            if head is None:
                break
            enq, name_key, prop_key, start = head
            four = names.get(name_key)
            if type(four) is not tuple or len(four) != 4:
                break  # names not seen yet: stored_message reads and keeps them
            properties = props.get(prop_key, _MISSING)
            if properties is _MISSING:
                break
            # taken from here on: the loop body's steps, in its order
            if nums[1] > last_delivery:
                last_delivery = nums[1]
                last = nums[2]
            if delays:
                delays.pop(msg_id, None)
            body = data[start:]
            msg = new_message(message_cls)
            init_message(msg, body, properties, four[2], four[3], enq, (), msg_id)
            leases[msg_id] = m
            try:
                restore_plain(msg, len(body), now, msg_id, enq)
            except cmq_error as e:
                if getattr(e, "rule", None) != "Q3":
                    raise
                # JetStream's delivery of a message leased here already: the newer lease
            i += 1
    finally:
        s.last_delivery = last_delivery
    return i, last


# _wire.c's take_plains, or None (CMQ_GATEWAY_PURE_PYTHON=1, no compiler): the loop body then
# takes every delivery itself.
compiled_take_plains: Callable[..., tuple[int, int | None]] | None = getattr(compiled(), "take_plains", None)
