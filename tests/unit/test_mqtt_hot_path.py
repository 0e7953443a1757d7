"""The MQTT session's hot-path shortcuts give what the general code gives: the direct read of
a delivery's M11 headers (msg id, publish QoS; MQ6: the msg id keeps a redelivery's packet
identifier) agrees with decoding the whole property table and declines what it cannot read;
a delivery's PUBLISH bytes, from cached heads, are the codec's encoding of the packet."""

from __future__ import annotations

import pytest

from gateway.mqtt import codec as P
from gateway.mqtt.session import (
    _UNREADABLE,
    QOS_HEADER,
    _delivery_headers,
    message_properties,
    publish_bytes,
    publish_qos,
)
from gateway.protocol.properties import Properties

MSG_ID = "msg-8dd00331e7d20000000000000001"


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("mprops", [{}, {"user_property": [("k", "v")], "content_type": "a/b",
                                         "response_topic": "r/t", "correlation_data": b"c"}])
def test_fast_read_equals_the_decoded_table(qos: int, retain: bool, mprops: dict[str, object]) -> None:
    raw = message_properties(qos, retain, "publisher-é", mprops).encode_delivery(MSG_ID, 1_700_000_000, 3)
    headers = Properties(raw).headers or {}
    assert _delivery_headers(raw) == (headers["x-cmq-msg-id"], headers[QOS_HEADER]) == (MSG_ID, qos)


def test_an_amqp_publish_has_no_qos_header() -> None:
    raw = Properties.build(headers={"a": 1}).encode_delivery(MSG_ID, 1, 1)
    assert _delivery_headers(raw) == (MSG_ID, None)


def test_what_it_cannot_read_is_left_to_the_full_decoder() -> None:
    assert _delivery_headers(b"") is None
    assert _delivery_headers(b"\x0cx-cmq-msg-id") is None  # truncated: no IndexError
    text_qos = Properties.build(headers={QOS_HEADER: "1"}).encode_delivery(MSG_ID, 1, 1)
    assert _delivery_headers(text_qos) is None  # not a long: decoded as a table instead


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("mprops", [{}, {"user_property": [("k", "v")], "content_type": "a/b",
                                         "response_topic": "r/t", "correlation_data": b"c"}])
def test_publish_qos_of_undecorated_properties_is_the_decoded_header(qos: int, retain: bool,
                                                                   mprops: dict[str, object]) -> None:
    """The session's own queue is consumed without M11 headers: its deliveries carry the
    properties as published, whose QoS header is read directly (the second time from the
    cache) and must be what decoding the table gives."""
    raw = message_properties(qos, retain, "publisher-é", mprops).raw
    for _ in range(2):
        assert publish_qos(raw) == (Properties(raw).headers or {})[QOS_HEADER] == qos


def test_publish_qos_without_the_header_or_unreadable() -> None:
    assert publish_qos(Properties.build(headers={"a": 1}).raw) is None  # an AMQP publisher's
    assert publish_qos(Properties.build().raw) is None
    text_qos = Properties.build(headers={QOS_HEADER: "1"}).raw
    assert publish_qos(text_qos) is _UNREADABLE and publish_qos(text_qos) is _UNREADABLE  # never cached


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("size", [0, 64, 200, 20_000])
def test_publish_bytes_are_the_codecs_encoding(level: int, qos: int, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
    for topic in ("a", "sensors/k1/temp", "dév/ü" * 30):
        for pid, dup, retain in ((1, False, False), (65535, qos > 0, True), (300, qos > 0, False)):
            pid = pid if qos else 0
            for _ in range(2):  # the second time from the cached head
                assert publish_bytes(topic, payload, qos, pid, dup, level, retain) == P.encode(
                    P.Publish(topic, payload, qos, retain, dup, pid), level)
