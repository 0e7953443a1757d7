"""Frame codec: the frame layout, the hot methods by hand, everything else through pamqp.

Frame: type (octet), channel (short), size (long), payload, 0xCE.

pamqp (``frame.marshal``/``unmarshal``) costs tens of µs per publish + deliver round: it
slices the payload per field and validates through generic per-attribute loops. The few
frames of every message (basic.publish in, content header, body, basic.deliver and
basic.get-ok out, basic.ack both ways) are hand-written with ``struct`` here; the tests
check them byte for byte against pamqp on random inputs. Everything else goes through pamqp.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from pamqp import commands, encode

from gateway.protocol import fieldtable

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_MIN_SIZE",
    "HEARTBEAT_FRAME",
    "PROTOCOL_HEADER",
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
    "fit_reply_text",
    "method",
    "method_ids",
    "shortstr",
]

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
    """One method frame. basic.ack is hand-written; the rest is encoded with pamqp's field
    encoders, but not through ``Frame.marshal``: that validates as a client library would,
    refusing the non-ASCII queue and exchange names AMQP allows (a shortstr is any UTF-8) and
    RabbitMQ echoes back in declare-ok or basic.return."""
    index = method.index
    if index == _ACK_INDEX:
        return encode_ack(channel, method.delivery_tag, method.multiple)
    args = _encode_arguments(method)
    return FRAME_HEAD.pack(FRAME_METHOD, channel, 4 + len(args)) + _INDEX.pack(index) + args + _END


def method(cls: Any, **fields: Any) -> Any:
    """A method to send, built without pamqp's validation (its constructor runs it): names
    echoed back to a client (declare-ok's queue, basic.return's exchange) may hold any UTF-8
    up to 255 bytes, where pamqp allows ASCII and 127-character exchange names."""
    m = cls()
    for name, value in fields.items():
        setattr(m, name, value)
    return m


# Short strings of ours that may outgrow 255 bytes: a reply text quotes names of up to 255.
_REPLY_TEXT = "reply_text"
_TRUNCATED = b"..."


# The rule a gateway refusal names, at the end of its text: "... (CMQ limit L3)".
_RULE_SUFFIX = re.compile(r" \(CMQ (?:limit|rule) [A-Z]+[0-9]+\)$")


def fit_reply_text(text: str) -> str:
    """A reply text cut to a shortstr as RabbitMQ cuts it (the first 252 bytes and "...",
    rabbit_binary_generator), but on a UTF-8 character boundary so that it still decodes;
    a CMQ rule named at the end is kept (cut from the middle instead), since the rule is what
    the client needs to read."""
    data = text.encode("utf-8")
    if len(data) <= 255:
        return text
    m = _RULE_SUFFIX.search(text)
    suffix = m.group(0).encode() if m else b""
    head = data[:255 - len(_TRUNCATED) - len(suffix)].decode("utf-8", "ignore")
    return head + _TRUNCATED.decode() + suffix.decode()


def _encode_arguments(method: Any) -> bytes:
    """pamqp's ``Frame.marshal`` without its ``validate()``; a long reply text is cut to fit.
    Consecutive bits pack into one octet, as AMQP 0-9-1 requires."""
    out: list[bytes] = []
    bits = -1  # the octet being packed, or -1 outside a run of bits
    offset = 0
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value = getattr(method, name, 0)
        if kind == "bit":
            if bits < 0:
                bits, offset = 0, 0
            bits = encode.bit(value, bits, offset)
            offset += 1
            if offset == 8:
                out.append(encode.octet(bits))
                bits = -1
            continue
        if bits >= 0:
            out.append(encode.octet(bits))
            bits = -1
        if name == _REPLY_TEXT and isinstance(value, str):
            value = fit_reply_text(value)
        out.append(encode.by_type(value, kind))
    if bits >= 0:
        out.append(encode.octet(bits))
    return b"".join(out)


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
        _unmarshal(method, buf, start + 4, end)
    except (struct.error, IndexError, TypeError, KeyError) as exc:
        raise ValueError(str(exc)) from exc
    return method


_FIXED = {"octet": struct.Struct(">B"), "short": struct.Struct(">H"), "long": _INDEX,
          "longlong": _U64, "timestamp": _U64}


def _unmarshal(method: Any, buf: bytes | bytearray, pos: int, end: int) -> None:
    """Set the arguments of ``method`` from ``buf[pos:end]`` (ValueError unless they fill it
    exactly, as RabbitMQ's binary match requires). Not pamqp's ``unmarshal``: it neither
    notices a short string cut short nor reads every table RabbitMQ reads (a timestamp past
    year 9999, a key that is not UTF-8); tables go through our own field-table decoder."""
    bits = -1  # the octet of the current run of bits, -1 outside one
    nbits = 0
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value: Any
        if kind == "bit":
            if bits < 0 or nbits == 8:
                bits, nbits = buf[pos], 0
                pos += 1
            value = bool(bits >> nbits & 1)
            nbits += 1
        else:
            bits = -1
            if kind == "shortstr":
                n = buf[pos]
                value = bytes(buf[pos + 1:pos + 1 + n]).decode("utf-8")
                pos += 1 + n
            elif kind == "longstr":
                (n,) = _INDEX.unpack_from(buf, pos)
                raw = bytes(buf[pos + 4:pos + 4 + n])
                pos += 4 + n
                try:
                    value = raw.decode("utf-8")  # as pamqp: text when it is UTF-8
                except UnicodeDecodeError:
                    value = raw
            elif kind == "table":
                value, pos = fieldtable.decode_table(buf, pos)
            else:
                fixed = _FIXED[kind]
                (value,) = fixed.unpack_from(buf, pos)
                pos += fixed.size
        if pos > end:
            raise ValueError("method arguments run past the frame")
        setattr(method, name, value)
    if pos != end:
        raise ValueError("trailing bytes after the method arguments")


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
