"""The MQTT codec and topic mapping (MQ2, MQ7): never a crash on any input, a reason code
for every malformed packet, encode/decode agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt import codec as P
from gateway.mqtt.connection import MQTTServerConnection, ProtocolError
from gateway.mqtt.topics import filter_to_binding, matches, routing_key_to_topic, topic_to_routing_key

CONNECT5 = P.encode(P.Connect(level=5, client_id="c1", username="guest", password=b"guest",
                              properties={"session_expiry": 10}), 5)
CONNECT4 = P.encode(P.Connect(level=4, client_id="c1", username="guest", password=b"guest"), 4)


def _drain(conn: MQTTServerConnection) -> list[object]:
    out = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"", CONNECT4, CONNECT5]))
def test_MQ7_decoder_never_crashes_on_garbage(data: bytes, prefix: bytes) -> None:
    conn = MQTTServerConnection(max_packet_size=256)
    conn.receive_data(prefix + data)
    for e in _drain(conn):
        if isinstance(e, ProtocolError):
            assert 0x80 <= e.reason_code <= 0xA2
            assert conn.closed


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=64), st.sampled_from([4, 5]))
def test_MQ7_well_framed_random_bodies_decode_or_are_malformed(first: int, body: bytes, level: int) -> None:
    dec = P.Decoder()
    dec.level = level
    dec.feed(bytes((first, len(body))) + body)
    try:
        dec.next_packet()
    except P.MalformedPacket as e:
        assert e.reason_code in (P.MALFORMED, P.PROTOCOL_ERROR, P.PACKET_TOO_LARGE)


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


@settings(max_examples=500, deadline=None)
@given(_text.filter(bool), st.binary(max_size=50), st.integers(0, 2), st.booleans(), st.integers(1, 65535),
       st.sampled_from([4, 5]))
def test_publish_roundtrip(topic: str, payload: bytes, qos: int, retain: bool, pid: int, level: int) -> None:
    packet = P.Publish(topic, payload, qos, retain, False, pid if qos else 0,
                       {"content_type": "x", "user_property": [("a", "b")]} if level == 5 else {})
    dec = P.Decoder()
    dec.level = level
    dec.feed(P.encode(packet, level))
    assert dec.next_packet() == packet


@pytest.mark.parametrize("level", [4, 5])
def test_client_packets_roundtrip(level: int) -> None:
    packets = [P.Subscribe(7, [("a/+", 1), ("b/#", 2)]), P.Unsubscribe(8, ["a/+"]),
               P.Ack(P.PUBACK, 3), P.Ack(P.PUBREL, 4), P.PingReq(), P.Disconnect()]
    dec = P.Decoder()
    dec.feed(P.encode(P.Connect(level=level, client_id="x", will=P.Will("w", b"bye", 1, True)), level))
    assert dec.next_packet() == P.Connect(level=level, client_id="x", will=P.Will("w", b"bye", 1, True))
    for packet in packets:
        dec.feed(P.encode(packet, level))
        assert dec.next_packet() == packet


def test_MQ7_oversize_packet_is_0x95_after_connack() -> None:
    conn = MQTTServerConnection(max_packet_size=100)
    conn.receive_data(CONNECT5)
    assert isinstance(conn.next_event(), P.Connect)
    conn.accept(P.ConnAck())
    conn.data_to_send()
    conn.receive_data(P.encode(P.Publish("t", b"x" * 200), 5))
    e = conn.next_event()
    assert isinstance(e, ProtocolError) and e.reason_code == P.PACKET_TOO_LARGE
    out = conn.data_to_send()
    assert out[0] == 0xE0 and out[2] == P.PACKET_TOO_LARGE  # DISCONNECT 0x95


@pytest.mark.parametrize("packet", [P.encode(P.Publish("t", b"x"), 4), b"\xc0\x00"])
def test_MQ7_first_packet_must_be_connect(packet: bytes) -> None:
    conn = MQTTServerConnection()
    conn.receive_data(packet)
    e = conn.next_event()
    assert isinstance(e, ProtocolError) and e.reason_code == P.PROTOCOL_ERROR


def test_MQ7_second_connect_is_a_protocol_error() -> None:
    conn = MQTTServerConnection()
    conn.receive_data(CONNECT5 + CONNECT5)
    assert isinstance(conn.next_event(), P.Connect)
    conn.accept(P.ConnAck())
    e = conn.next_event()
    assert isinstance(e, ProtocolError) and e.reason_code == P.PROTOCOL_ERROR


def test_MQ5_keep_alive_is_one_and_a_half_intervals() -> None:
    conn = MQTTServerConnection()
    conn.receive_data(P.encode(P.Connect(level=4, client_id="k", keep_alive=10), 4), now=100.0)
    assert isinstance(conn.next_event(), P.Connect)
    conn.accept(P.ConnAck())
    assert conn.tick(114.9) == []
    assert conn.tick(115.1) and conn.closed


def test_MQ2_topic_mapping_both_ways() -> None:
    assert topic_to_routing_key("sensors/k1/temp") == "sensors.k1.temp"
    assert topic_to_routing_key("a.b/c") == "a/b.c"
    assert routing_key_to_topic("sensors.k1.temp") == "sensors/k1/temp"
    assert filter_to_binding("sensors/+/temp") == "sensors.*.temp"
    assert filter_to_binding("sensors/#") == "sensors.#"
    assert matches("sensors/+/temp", "sensors/k1/temp")
    assert not matches("#", "$SYS/x") and not matches("+/x", "$SYS/x") and matches("$SYS/#", "$SYS/x")
    assert matches("a/#", "a")


@settings(max_examples=2000, deadline=None)
@given(st.integers(0x30, 0x4F), st.binary(max_size=40))
def test_hot_path_decodes_as_the_full_decoder(first: int, body: bytes) -> None:
    """PUBLISH (3.1.1) and PUBACK have a hand-written decoder: same packet, or both refuse."""
    data = bytes((first, len(body))) + body

    def full() -> object:
        d = P.Decoder()
        d.level = 4
        try:
            return d.decode(first, data, 2, len(data))
        except P.MalformedPacket:
            return "malformed"

    expected = full()
    dec = P.Decoder()
    dec.level = 4
    for _ in range(2):  # the second time a valid topic comes from the decoder's cache of topics
        dec.feed(data)
        try:
            fast: object = dec.next_packet()
        except P.MalformedPacket:
            fast = "malformed"
            dec = P.Decoder()
            dec.level = 4
        assert fast == expected
