"""The hand-written hot paths, byte for byte against pamqp on random inputs."""

from __future__ import annotations

import struct

import pytest
from amqp_pipe import content_frames
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as C
from pamqp import frame

from gateway.protocol import codec

names = st.text(max_size=60).filter(lambda s: len(s.encode("utf-8")) <= 255)
# pamqp refuses exchange names outside RabbitMQ's pattern, so the reference needs these.
exchanges = st.from_regex(r"\A[a-zA-Z0-9_.:-]{0,60}\Z")
tags = st.integers(min_value=0, max_value=2**63 - 1)  # pamqp packs longlong signed
channels = st.integers(min_value=1, max_value=65535)
bodies = st.binary(max_size=3000)
frame_maxes = st.sampled_from([4096, 4104, 131072, 0])
property_sets = st.fixed_dictionaries({}, optional={
    "content_type": names, "delivery_mode": st.sampled_from([1, 2]), "priority": st.integers(0, 9),
    "message_id": names, "correlation_id": names, "expiration": st.integers(0, 10**9).map(str),
    "timestamp": st.integers(0, 2**32 - 1), "app_id": names, "user_id": names, "reply_to": names,
    "headers": st.dictionaries(names, st.one_of(st.text(max_size=20), st.booleans(),
                                                st.integers(-2**63, 2**63 - 1)), max_size=5),
})


def _pamqp_props(values: dict) -> C.Basic.Properties:
    import datetime
    values = dict(values)
    if "timestamp" in values:
        values["timestamp"] = datetime.datetime.fromtimestamp(values["timestamp"], tz=datetime.UTC)
    return C.Basic.Properties(**values)


@settings(max_examples=100, deadline=None)
@given(channels, names, tags, st.booleans(), exchanges, names, property_sets, bodies, frame_maxes)
def test_encode_deliver_matches_pamqp(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                      routing_key, props, body, frame_max) -> None:
    raw_props = _pamqp_props(props).marshal()
    out = bytearray()
    codec.encode_deliver(out, channel, codec.shortstr(consumer_tag), delivery_tag, redelivered,
                         codec.shortstr(exchange), codec.shortstr(routing_key), raw_props, body, frame_max)
    expected = frame.marshal(C.Basic.Deliver(consumer_tag=consumer_tag, delivery_tag=delivery_tag,
                                             redelivered=redelivered, exchange=exchange,
                                             routing_key=routing_key), channel)
    expected += content_frames(channel, body, _pamqp_props(props), frame_max or 1 << 40)
    assert bytes(out) == expected


@settings(max_examples=100, deadline=None)
@given(channels, tags, st.booleans(), exchanges, names, st.integers(0, 2**32 - 1), property_sets, bodies,
       frame_maxes)
def test_encode_get_ok_matches_pamqp(channel, delivery_tag, redelivered, exchange, routing_key, count,
                                     props, body, frame_max) -> None:
    raw_props = _pamqp_props(props).marshal()
    out = bytearray()
    codec.encode_get_ok(out, channel, delivery_tag, redelivered, codec.shortstr(exchange),
                        codec.shortstr(routing_key), count, raw_props, body, frame_max)
    expected = frame.marshal(C.Basic.GetOk(delivery_tag=delivery_tag, redelivered=redelivered, exchange=exchange,
                                           routing_key=routing_key, message_count=count), channel)
    expected += content_frames(channel, body, _pamqp_props(props), frame_max or 1 << 40)
    assert bytes(out) == expected


@settings(max_examples=100, deadline=None)
@given(channels, tags, st.booleans())
def test_ack_encode_and_decode_match_pamqp(channel, delivery_tag, multiple) -> None:
    expected = frame.marshal(C.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple), channel)
    assert codec.encode_ack(channel, delivery_tag, multiple) == expected
    assert codec.encode_method(channel, C.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple)) == expected
    ack = codec.decode_method(expected, 7, len(expected) - 1)
    assert isinstance(ack, C.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (delivery_tag, multiple)


@settings(max_examples=150, deadline=None)
@given(st.just(0), exchanges, names, st.booleans(), st.booleans(), st.binary(max_size=8))
def test_publish_decode_matches_pamqp(ticket, exchange, routing_key, mandatory, immediate, trailing) -> None:
    """Whole input, and with unrelated bytes after the frame (they are never read)."""
    data = frame.marshal(C.Basic.Publish(ticket=ticket, exchange=exchange, routing_key=routing_key,
                                         mandatory=mandatory, immediate=immediate), 1)
    buf = data + trailing
    ours = codec.decode_method(buf, 7, len(data) - 1)
    _, _, ref = frame.unmarshal(data)
    assert isinstance(ours, C.Basic.Publish)
    assert dict(ours) == dict(ref)


@settings(max_examples=100, deadline=None)
@given(property_sets, st.integers(0, 2**40))
def test_content_header_encode_and_decode_match_pamqp(props, body_size) -> None:
    from pamqp import header
    raw = _pamqp_props(props).marshal()
    expected = frame.marshal(header.ContentHeader(0, body_size, _pamqp_props(props)), 3)
    assert codec.encode_content_header(3, body_size, raw) == expected
    assert codec.decode_content_header(expected, 7, len(expected) - 1) == (60, 0, body_size, raw)


def test_body_is_split_by_frame_max() -> None:
    out = bytearray()
    codec.encode_body(out, 1, b"x" * 10000, 4096)
    sizes = []
    pos = 0
    while pos < len(out):
        ftype, channel, size = struct.unpack_from(">BHI", out, pos)
        assert (ftype, channel, out[pos + 7 + size]) == (3, 1, 0xCE)
        sizes.append(size)
        pos += 8 + size
    assert sizes == [4088, 4088, 1824]


@pytest.mark.parametrize("payload", [
    b"\x00\x3c\x00\x28\x00\x00\x05abc",          # exchange shortstr says 5, only 3 follow
    b"\x00\x3c\x00\x28\x00\x00\x00\x00\x00\x00",  # a byte too many after the bits
    b"\x00\x3c\x00\x28\x00",                      # cut in the ticket
])
def test_malformed_publish_is_a_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError):
        codec.decode_method(payload, 0, len(payload))


def test_rare_method_with_trailing_bytes_is_a_value_error() -> None:
    data = frame.marshal(C.Basic.Qos(prefetch_count=5), 1)[7:-1] + b"\x00"
    with pytest.raises(ValueError, match="trailing"):
        codec.decode_method(data, 0, len(data))


def test_unknown_method_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        codec.decode_method(b"\x00\x63\x00\x01", 0, 4)


def test_shortstr_over_255_bytes_is_refused() -> None:
    assert codec.shortstr("a" * 255)[:1] == b"\xff"
    with pytest.raises(ValueError):
        codec.shortstr("a" * 256)
