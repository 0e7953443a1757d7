"""Hand-encoded AMQP 0-9-1 frames for the load generator's hot path.

pamqp builds a method object and marshals it field by field (about 5 µs for a basic.publish);
the generator sends and receives hundreds of thousands of these per second, so the few frames
on the hot path (basic.publish + content header + body, basic.ack, and the basic.deliver /
basic.ack / basic.nack the broker sends back) are written here with `struct`. Everything else
(handshake, declarations) goes through pamqp. tests/unit/perf/test_frames.py checks every
function here byte for byte against pamqp.

A published message is a `PublishTemplate`: all bytes before the 8-byte send timestamp that
opens the body, and all bytes after it, so that a message costs one concatenation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pamqp import commands

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "HEARTBEAT",
    "TIMESTAMP_BYTES",
    "PublishTemplate",
    "basic_ack",
    "content_header",
    "encode_properties",
    "method_frame",
    "parse_deliver",
    "parse_publisher_ack",
    "publish_method",
    "publish_template",
]

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"
# The body of every generated message starts with the sender's time.monotonic_ns(), big-endian:
# CLOCK_MONOTONIC is one clock for all processes of a Linux host, so consumers in other worker
# processes can subtract it.
TIMESTAMP_BYTES = 8

_FRAME_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_ACK = struct.Struct(">BHIHHQB")  # frame head, class, method, delivery tag, bits, then 0xCE
_HEADER_PREFIX = struct.Struct(">HHQ")  # class 60, weight 0, body size
_PUBLISH_HEAD = struct.Struct(">HHH")  # class 60, method 40, reserved-1 (ticket)


def method_frame(channel: int, payload: bytes) -> bytes:
    """Wrap a method (or any) payload in a type-1 frame."""
    return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END


def _shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


def publish_method(channel: int, exchange: str, routing_key: str, mandatory: bool = False) -> bytes:
    """basic.publish method frame (class 60, method 40)."""
    payload = (
        _PUBLISH_HEAD.pack(60, 40, 0)
        + _shortstr(exchange)
        + _shortstr(routing_key)
        + bytes((1 if mandatory else 0,))
    )
    return method_frame(channel, payload)


def encode_properties(delivery_mode: int | None = None, headers: dict[str, object] | None = None) -> bytes:
    """Property flags and list of a content header. Not hot: computed once per template."""
    props = commands.Basic.Properties(delivery_mode=delivery_mode, headers=headers)  # type: ignore[arg-type]
    return bytes(props.marshal())


def content_header(channel: int, body_size: int, properties: bytes) -> bytes:
    """Content header frame for class basic, with pre-encoded properties."""
    payload = _HEADER_PREFIX.pack(60, 0, body_size) + properties
    return _FRAME_HEAD.pack(FRAME_HEADER, channel, len(payload)) + payload + FRAME_END


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """basic.ack (class 60, method 80) as one frame."""
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0) + FRAME_END


@dataclass(frozen=True, slots=True)
class PublishTemplate:
    """One message = head + 8-byte timestamp + tail (see the module docstring)."""

    head: bytes
    tail: bytes

    def render(self, timestamp_ns: int) -> bytes:
        return self.head + timestamp_ns.to_bytes(8, "big") + self.tail


def publish_template(
    channel: int,
    exchange: str,
    routing_key: str,
    body_size: int,
    properties: bytes,
    frame_max: int,
    mandatory: bool = False,
) -> PublishTemplate:
    """Frames of one publish, split at the timestamp. The body is split into frames of at most
    frame_max bytes (7 bytes of frame head and 1 of frame end included), as the spec requires."""
    if body_size < TIMESTAMP_BYTES:
        raise ValueError(f"body size must be at least {TIMESTAMP_BYTES} bytes (it carries the send time)")
    chunk = frame_max - 8
    body_frames: list[bytes] = []
    remaining = body_size
    while remaining > 0:
        n = min(chunk, remaining)
        body_frames.append(_FRAME_HEAD.pack(FRAME_BODY, channel, n) + bytes(n) + FRAME_END)
        remaining -= n
    first = body_frames[0]
    # The timestamp replaces the first 8 zero bytes after the first body frame's 7-byte head.
    head = (
        publish_method(channel, exchange, routing_key, mandatory)
        + content_header(channel, body_size, properties)
        + first[:7]
    )
    tail = first[7 + TIMESTAMP_BYTES :] + b"".join(body_frames[1:])
    return PublishTemplate(head, tail)


def parse_deliver(payload: bytes | memoryview, offset: int = 0) -> tuple[str, int, bool, str, str]:
    """basic.deliver arguments from a method payload (starting at its class id):
    consumer tag, delivery tag, redelivered, exchange, routing key."""
    pos = offset + 4
    n = payload[pos]
    consumer_tag = bytes(payload[pos + 1 : pos + 1 + n]).decode()
    pos += 1 + n
    (delivery_tag,) = struct.unpack_from(">Q", payload, pos)
    redelivered = bool(payload[pos + 8] & 1)
    pos += 9
    n = payload[pos]
    exchange = bytes(payload[pos + 1 : pos + 1 + n]).decode()
    pos += 1 + n
    n = payload[pos]
    routing_key = bytes(payload[pos + 1 : pos + 1 + n]).decode()
    return consumer_tag, delivery_tag, redelivered, exchange, routing_key


def parse_publisher_ack(payload: bytes | memoryview, offset: int = 0) -> tuple[int, bool]:
    """basic.ack / basic.nack from the broker (confirms): delivery tag and the multiple bit."""
    (delivery_tag,) = struct.unpack_from(">Q", payload, offset + 4)
    return delivery_tag, bool(payload[offset + 12] & 1)
