"""Frame codec: the frame layout, the hot methods by hand, everything else through pamqp.

Frame: type (octet), channel (short), size (long), payload, 0xCE.

pamqp (``frame.marshal``/``unmarshal``) costs tens of µs per publish + deliver round: it
slices the payload per field and validates through generic per-attribute loops. The few
frames of every message (basic.publish in, content header, body, basic.deliver and
basic.get-ok out, basic.ack both ways) are hand-written with ``struct`` here; the tests
check them byte for byte against pamqp on random inputs. Everything else goes through pamqp.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, frame

__all__ = [
    "BasicGetOk",
    "BasicReturn",
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_MIN_SIZE",
    "HEARTBEAT_FRAME",
    "PROTOCOL_HEADER",
    "QueueDeclareOk",
    "decode_ack",
    "decode_content_header",
    "decode_method",
    "decode_publish",
    "encode_ack",
    "encode_body",
    "encode_content_header",
    "encode_deliver",
    "encode_get_ok",
    "encode_method",
    "method_ids",
    "shortstr",
]



def _any_name(cls: Any) -> Any:
    """``cls`` without its validate(): pamqp checks queue and exchange names against its own
    pattern ([a-zA-Z0-9-_.:@#,/+ ]), but RabbitMQ takes any UTF-8 name ("*.b", "队列") and
    the gateway checks its own rules (L1/L2) when a name comes in. The methods the server
    sends with a client's name in them are built from these, lest such a name end in 541."""
    return type(cls.__name__, (cls,), {"validate": lambda self: None})


QueueDeclareOk = _any_name(commands.Queue.DeclareOk)
BasicGetOk = _any_name(commands.Basic.GetOk)
BasicReturn = _any_name(commands.Basic.Return)

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_MIN_SIZE = 4096  # AMQP 0-9-1: the smallest frame_max a peer may ask for
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

FRAME_HEAD = struct.Struct(">BHI")
_INDEX = struct.Struct(">I")
_PUBLISH_INDEX = commands.Basic.Publish.index
_ACK_INDEX = commands.Basic.Ack.index
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
# method frame head + class/method: type, channel, size, class, method
_METHOD_HEAD = struct.Struct(">BHIHH")
# content header frame head: type, channel, size, class, weight, body size
_CONTENT_HEAD = struct.Struct(">BHIHHQ")
_ACK = struct.Struct(">BHIHHQB")
_DELIVER_TAIL = struct.Struct(">QB")
_GET_OK_TAIL = struct.Struct(">I")
_END = b"\xce"
_Publish = commands.Basic.Publish


# shortstr() of the names every delivery repeats (consumer tag, exchange, routing key):
# a bounded memo, cleared when full, because send_deliver encodes three per message.
_SHORTSTR_MEMO: dict[str, bytes] = {}
_SHORTSTR_MEMO_MAX = 4096


def shortstr(value: str | bytes) -> bytes:
    """A length-prefixed short string; ValueError above 255 bytes."""
    if type(value) is str:
        cached = _SHORTSTR_MEMO.get(value)
        if cached is not None:
            return cached
        data = value.encode("utf-8")
    else:
        data = value  # type: ignore[assignment]
    n = len(data)
    if n > 255:
        raise ValueError(f"short string of {n} bytes (max 255)")
    out = bytes((n,)) + data
    if type(value) is str:
        if len(_SHORTSTR_MEMO) >= _SHORTSTR_MEMO_MAX:
            _SHORTSTR_MEMO.clear()
        _SHORTSTR_MEMO[value] = out
    return out


def method_ids(method: Any) -> tuple[int, int]:
    """(class_id, method_id) of a pamqp method object."""
    index: int = method.index
    return index >> 16, index & 0xFFFF


def encode_method(channel: int, method: Any) -> bytes:
    """One method frame. basic.ack is hand-written; the rest is pamqp's."""
    if method.index == _ACK_INDEX:
        return encode_ack(channel, method.delivery_tag, method.multiple)
    return frame.marshal(method, channel)


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """basic.ack (60, 80): delivery-tag longlong, multiple bit."""
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0) + _END


def decode_ack(buf: bytes | bytearray, start: int, end: int) -> commands.Basic.Ack:
    """basic.ack arguments (after the class/method IDs) -> a pamqp Basic.Ack."""
    if end - start != 9:
        raise ValueError("basic.ack arguments are 9 bytes")
    tag, bits = _DELIVER_TAIL.unpack_from(buf, start)
    ack = commands.Basic.Ack.__new__(commands.Basic.Ack)  # slots set below, no validate()
    ack.delivery_tag = tag
    ack.multiple = bool(bits & 1)
    return ack


# Exchange names and routing keys repeat from publish to publish: one str per distinct name
# (a retained message keeps its routing key: 51 B each otherwise). Bounded, cleared when full.
_NAMES: dict[bytes, str] = {}
_NAMES_MAX = 4096


def _name(raw: bytes) -> str:
    name = _NAMES.get(raw)
    if name is None:
        name = str(raw, "utf-8")
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        _NAMES[raw] = name
    return name


def decode_publish(buf: bytes | bytearray, start: int, end: int) -> commands.Basic.Publish:
    """basic.publish arguments -> a pamqp Basic.Publish, without pamqp's per-field slicing."""
    # ticket (short), exchange (shortstr), routing-key (shortstr), mandatory+immediate bits
    pos = start + 2
    n = buf[pos]
    exchange = _name(bytes(buf[pos + 1:pos + 1 + n]))
    pos += 1 + n
    n = buf[pos]
    routing_key = _name(bytes(buf[pos + 1:pos + 1 + n]))
    pos += 1 + n
    if pos + 1 != end:
        raise ValueError("basic.publish arguments have the wrong length")
    bits = buf[pos]
    publish = _Publish.__new__(_Publish)
    publish.ticket = _U16.unpack_from(buf, start)[0]
    publish.exchange = exchange
    publish.routing_key = routing_key
    publish.mandatory = bool(bits & 1)
    publish.immediate = bool(bits & 2)
    return publish


def decode_method(buf: bytes | bytearray, start: int, end: int) -> Any:
    """A method frame payload -> a pamqp method object.

    Raises KeyError for an unknown class/method and ValueError for malformed arguments.
    """
    if end - start < 4:
        raise ValueError("method frame shorter than its class and method IDs")
    (index,) = _INDEX.unpack_from(buf, start)
    try:
        if index == _PUBLISH_INDEX:
            return decode_publish(buf, start + 4, end)
        if index == _ACK_INDEX:
            return decode_ack(buf, start + 4, end)
    except IndexError as exc:
        raise ValueError(str(exc)) from exc
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise KeyError(index)
    method = cls()
    try:
        # pamqp neither reports how much it read nor notices a short string cut short:
        # measure the arguments first, as RabbitMQ's exact binary match does.
        if _arguments_end(method, buf, start + 4, end) != end:
            raise ValueError("trailing bytes after the method arguments")
        method.unmarshal(bytes(buf[start + 4:end]))
    except (struct.error, IndexError, TypeError, KeyError) as exc:
        raise ValueError(str(exc)) from exc
    return method


_WIDTH = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}


def _arguments_end(method: Any, buf: bytes | bytearray, pos: int, end: int) -> int:
    """Where the arguments of ``method`` end in ``buf`` (ValueError if past ``end``)."""
    in_bits = 0
    for name in method.__slots__:
        kind = method.amqp_type(name)
        if kind == "bit":
            if in_bits == 0 or in_bits == 8:
                pos += 1
                in_bits = 0
            in_bits += 1
            continue
        in_bits = 0
        if kind == "shortstr":
            pos += 1 + buf[pos]
        elif kind in ("longstr", "table"):
            pos += 4 + _INDEX.unpack_from(buf, pos)[0]
        else:
            pos += _WIDTH[kind]
        if pos > end:
            raise ValueError("method arguments run past the frame")
    if pos > end:
        raise ValueError("method arguments run past the frame")
    return pos


def decode_content_header(buf: bytes | bytearray, start: int, end: int) -> tuple[int, int, int, bytes]:
    """Content header payload -> (class_id, weight, body_size, raw property bytes)."""
    if end - start < 14:
        raise ValueError("content header shorter than 14 bytes")
    class_id, weight = struct.unpack_from(">HH", buf, start)
    (body_size,) = _U64.unpack_from(buf, start + 4)
    return class_id, weight, body_size, bytes(buf[start + 12:end])


def encode_content_header(channel: int, body_size: int, properties: bytes) -> bytes:
    """A content header frame for class basic (60)."""
    return (_CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), 60, 0, body_size)
            + properties + _END)


def encode_body(out: bytearray, channel: int, body: bytes, frame_max: int) -> None:
    """Append the body frames of ``body`` to ``out``, each payload at most frame_max - 8."""
    n = len(body)
    if not n:
        return
    chunk = frame_max - 8 if frame_max else n
    if n <= chunk:
        out += FRAME_HEAD.pack(FRAME_BODY, channel, n)
        out += body
        out += _END
        return
    view = memoryview(body)
    for pos in range(0, n, chunk):
        piece = view[pos:pos + chunk]
        out += FRAME_HEAD.pack(FRAME_BODY, channel, len(piece))
        out += piece
        out += _END


def encode_deliver(out: bytearray, channel: int, consumer_tag: bytes, delivery_tag: int,
                   redelivered: bool, exchange: bytes, routing_key: bytes, properties: bytes,
                   body: bytes, frame_max: int) -> None:
    """Append basic.deliver (60, 60) + content header + body frames to ``out``.

    ``consumer_tag``, ``exchange`` and ``routing_key`` are already length-prefixed
    (see :func:`shortstr`).
    """
    size = 4 + len(consumer_tag) + 9 + len(exchange) + len(routing_key)
    out += _METHOD_HEAD.pack(FRAME_METHOD, channel, size, 60, 60)
    out += consumer_tag
    out += _DELIVER_TAIL.pack(delivery_tag, 1 if redelivered else 0)
    out += exchange
    out += routing_key
    out += _END
    out += _CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), 60, 0, len(body))
    out += properties
    out += _END
    encode_body(out, channel, body, frame_max)


def encode_get_ok(out: bytearray, channel: int, delivery_tag: int, redelivered: bool,
                  exchange: bytes, routing_key: bytes, message_count: int, properties: bytes,
                  body: bytes, frame_max: int) -> None:
    """Append basic.get-ok (60, 71) + content header + body frames to ``out``."""
    size = 4 + 9 + len(exchange) + len(routing_key) + 4
    out += _METHOD_HEAD.pack(FRAME_METHOD, channel, size, 60, 71)
    out += _DELIVER_TAIL.pack(delivery_tag, 1 if redelivered else 0)
    out += exchange
    out += routing_key
    out += _GET_OK_TAIL.pack(message_count)
    out += _END
    out += _CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), 60, 0, len(body))
    out += properties
    out += _END
    encode_body(out, channel, body, frame_max)
