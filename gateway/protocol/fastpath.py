"""The two frames of every message: taken out of the buffer (publish, ack) and put in (deliver).

``fast_event(buf, pos, frame_max, max_message_size, channels)``: the basic.publish at ``pos``
with its content header and its one body frame, or the basic.ack there, as ``(event,
next_pos)``, when all of it is buffered, well-formed and on a channel that is open and not
in the middle of another content; otherwise None, and the connection's general path takes
the frame (with every error reply that path has).

``append_deliver(out, channel, consumer_tag, delivery_tag, redelivered, exchange,
routing_key, properties, body, frame_max)``: basic.deliver, its content header and its body
frames (split at ``frame_max``) appended to the bytearray ``out``.

``ack_run(buf, pos, channel, frame_max, limit)``: the delivery tags of the basic.ack frames
with multiple=false at ``pos`` and after it, back to back on ``channel``, each whole and
well-ended (what fast_event takes as an ack; ``ACK_FRAME`` octets each), at most ``limit``,
as a list; None when there is none. A consumer acks in runs, one per delivery it read: the
transport takes a run in one call instead of a read-loop turn and an event each.

``tuple_of(cls, *items)``: ``tuple.__new__(cls, items)`` (the broker's Unacked, one a
delivery: the C one makes one tuple where tuple.__new__ made four).

``tuple_new(cls, items)`` and ``object_new(cls)``: ``tuple.__new__`` and ``object.__new__``
themselves in Python; compiled, called without tp_new_wrapper's argument tuples and checks
(semantics' CmqQueue makes a Receipt a delivery and a QueueMessage a message a queue with
them once the broker hands them over: ``semantics.queue.use_makers``). ``object_new`` takes
only a class whose instances object.__new__ makes (TypeError otherwise).
``slots_new(cls, names, *values)``: ``object.__new__(cls)`` with ``setattr(obj, name, value)``
for each name in order, for a class whose names are plain slots (TypeError otherwise):
CmqQueue's QueueMessage without its ``__init__`` frame.

All of them are compiled (``gateway/protocol/_frames.c``) where the package was built with a C
compiler, and are these Python functions otherwise, or when ``CMQ_GATEWAY_PURE_PYTHON=1`` is
set; ``COMPILED`` says which. Why C: scenario 1's event loop spent a fifth of its time in
them (docs/BENCHMARKS.md). The tests hold the two to the same results.
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar

from pamqp import commands

from gateway.protocol import codec
from gateway.protocol.channel import ChannelState
from gateway.protocol.events import Content, Method
from gateway.protocol.properties import _SCANNED, Properties
from gateway.purepython import pure_python

__all__ = ["ACK_FRAME", "Ack", "COMPILED", "ack_run", "append_deliver", "cut", "fast_event", "py_ack_run", "py_append_deliver", "py_fast_event", "py_object_new", "py_slots_new", "py_tuple_new", "py_tuple_of",
           "object_new", "slots_new", "tuple_new", "tuple_of"]

_T = TypeVar("_T", bound=tuple[Any, ...])

_U32 = struct.Struct(">I")
_CONTENT_HEAD = struct.Struct(">HHQ")  # class, weight, body size
_PUBLISH = commands.Basic.Publish.index
_ACK = commands.Basic.Ack.index
Ack = commands.Basic.Ack
_OPEN = ChannelState.OPEN
_FRAME_HEAD = codec.FRAME_HEAD
_METHOD, _HEADER, _BODY, _END = codec.FRAME_METHOD, codec.FRAME_HEADER, codec.FRAME_BODY, codec.FRAME_END
ACK_FRAME = 21  # a basic.ack frame: head 7, payload 13 (index, tag, bits), end 1
_ACK_HEAD = struct.Struct(">BHII")  # type, channel, size, class and method
_TAG_BITS = struct.Struct(">QBB")  # delivery tag, bits, frame end


def _takes(channels: dict[int, Any], channel: int) -> bool:
    chan = channels.get(channel)
    return chan is not None and chan.state is _OPEN and chan.publish is None


def py_fast_event(buf: bytes | bytearray, pos: int, frame_max: int, max_message_size: int,
                  channels: dict[int, Any]) -> tuple[Content | Method, int] | None:
    """``fast_event`` in Python (see the module's doc)."""
    n = len(buf)
    if n - pos < 11:
        return None
    ftype, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
    if ftype != _METHOD or not channel or size < 4 or (frame_max and size > frame_max) or n - pos < size + 8:
        return None
    start = pos + 7
    end = start + size
    index = _U32.unpack_from(buf, start)[0]
    if index == _PUBLISH:
        return _take_publish(buf, n, channel, start, end, frame_max, max_message_size, channels)
    if index == _ACK and size == 13 and buf[end] == _END and _takes(channels, channel):
        return Method(channel, codec.decode_ack(buf, start + 4, end)), end + 1
    return None


def _take_publish(buf: bytes | bytearray, n: int, channel: int, start: int, end: int, frame_max: int,
                  max_message_size: int, channels: dict[int, Any]) -> tuple[Content, int] | None:
    if buf[end] != _END:
        return None
    header = _frame_at(buf, n, end + 1, _HEADER, channel, frame_max)
    if header is None or header[1] - header[0] < 14:
        return None
    hstart, hend = header
    class_id, weight, body_size = _CONTENT_HEAD.unpack_from(buf, hstart)
    if class_id != 60 or weight != 0 or body_size > max_message_size:
        return None
    bstart = bend = hend
    if body_size:
        body = _frame_at(buf, n, hend + 1, _BODY, channel, frame_max)
        if body is None or body[1] - body[0] != body_size:
            return None
        bstart, bend = body
    if not _takes(channels, channel):
        return None
    try:
        method = codec.decode_publish(buf, start + 4, end)
        props = Properties(bytes(buf[hstart + 12:hend]))
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    return Content(channel, method, props, cut(buf, bstart, bend)), bend + 1


def cut(buf: bytes | bytearray, start: int, end: int) -> bytes:
    """buf[start:end] as bytes. Slicing a bytearray copies twice, which is still cheaper than
    a memoryview's set-up below 64 KiB (0.15 vs 0.38 us for 16 B or 1 KiB)."""
    if type(buf) is bytes or end - start < 65536:
        return bytes(buf[start:end])
    with memoryview(buf) as view:  # released at once: the buffer grows and shrinks later
        return bytes(view[start:end])


def _frame_at(buf: bytes | bytearray, n: int, pos: int, ftype: int, channel: int,
              frame_max: int) -> tuple[int, int] | None:
    """(start, end) of the payload of the frame of this type and channel at ``pos``, when it is
    all buffered, within frame_max and well-ended."""
    if n - pos < 7:
        return None
    got_type, got_channel, size = _FRAME_HEAD.unpack_from(buf, pos)
    start = pos + 7
    end = start + size
    if (got_type != ftype or got_channel != channel or end >= n or (frame_max and size > frame_max)
            or buf[end] != _END):
        return None
    return start, end


def py_append_deliver(out: bytearray, channel: int, consumer_tag: str | bytes, delivery_tag: int,
                      redelivered: bool, exchange: str | bytes, routing_key: str | bytes, properties: bytes,
                      body: bytes, frame_max: int) -> None:
    """``append_deliver`` in Python (see the module's doc)."""
    codec.encode_deliver(out, channel, codec.shortstr(consumer_tag), delivery_tag, redelivered,
                         codec.shortstr(exchange), codec.shortstr(routing_key), properties, body, frame_max)


def py_ack_run(buf: bytes | bytearray, pos: int, channel: int, frame_max: int, limit: int) -> list[int] | None:
    """``ack_run`` in Python (see the module's doc)."""
    if type(buf) is not bytes and type(buf) is not bytearray:
        return None
    if pos < 0 or not 0 < channel <= 0xFFFF or (frame_max and frame_max < 13):
        return None
    tags: list[int] = []
    n = len(buf)
    while len(tags) < limit and n - pos >= ACK_FRAME:
        ftype, chan, size, index = _ACK_HEAD.unpack_from(buf, pos)
        tag, bits, end = _TAG_BITS.unpack_from(buf, pos + 11)
        if ftype != _METHOD or chan != channel or size != 13 or index != _ACK or bits & 1 or end != _END:
            break
        tags.append(tag)
        pos += ACK_FRAME
    return tags or None


def py_tuple_of(cls: type[_T], *items: Any) -> _T:
    """``tuple.__new__(cls, items)``: a tuple class's instance (a NamedTuple's without its
    __new__ frame)."""
    return tuple.__new__(cls, items)  # type: ignore[type-var, no-any-return]


fast_event = py_fast_event
append_deliver = py_append_deliver
ack_run = py_ack_run
py_tuple_new = tuple.__new__
py_object_new = object.__new__


def py_slots_new(cls: type[_T], names: tuple[str, ...], *values: Any) -> _T:
    """``object.__new__(cls)`` with each of ``names`` set to its value, in order."""
    if type(names) is not tuple or len(names) != len(values):
        raise TypeError("slots_new(cls, names, *values): a class, a tuple, a value a name")
    out: Any = object.__new__(cls)
    for name, value in zip(names, values, strict=True):
        setattr(out, name, value)
    return out  # type: ignore[no-any-return]


tuple_of = py_tuple_of
tuple_new: Any = py_tuple_new
object_new: Any = py_object_new
slots_new: Any = None  # pure Python: the model makes its messages itself (use_makers)
COMPILED = False
if not pure_python():
    try:
        from gateway.protocol import _frames  # type: ignore[attr-defined]
    except ImportError:  # built without a C compiler: the Python path, same results
        pass
    else:
        _frames.configure(Content, Method, commands.Basic.Publish, commands.Basic.Ack, Properties,
                          codec._NAMES, _SCANNED, _OPEN)
        fast_event = _frames.fast_event
        append_deliver = _frames.append_deliver
        ack_run = _frames.ack_run
        tuple_of = _frames.tuple_of
        tuple_new = _frames.tuple_new
        object_new = _frames.object_new
        slots_new = _frames.slots_new
        COMPILED = True
