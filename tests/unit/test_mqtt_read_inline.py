"""The MQTT transport's read loop calls the decoder itself once CONNECT was read (a call less a
packet, gateway/mqtt/transport.py) and gives what is not a PUBLISH or an acknowledgement to
``vet`` and a MalformedPacket to ``malformed``: that must be the events ``next_event`` gives
(MQ7: CONNECT first and once, no server-only packet, PINGREQ answered, malformed packets close),
for any stream of packets, the malformed and the out-of-order included. And the delivery's
inline PUBLISH bytes (the cached head) are publish_bytes' (MQ2)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt import codec as P
from gateway.mqtt.connection import MQTTServerConnection
from gateway.mqtt.session import _PUBLISH_HEADS, _U16, publish_bytes

CONNECT = P.encode(P.Connect(level=4, client_id="c", username="u", password=b"p"), 4)
PACKETS = [
    CONNECT,
    P.encode(P.Publish("a/b", b"x" * 5, 1, packet_id=7), 4),
    P.encode(P.Publish("a/b", b"", 0), 4),
    P.encode(P.Publish("t", b"y", 2, packet_id=9, dup=True), 4),
    bytes((0x40, 2, 0, 7)),  # PUBACK
    bytes((0x50, 2, 0, 8)),  # PUBREC
    bytes((0x62, 2, 0, 8)),  # PUBREL
    bytes((0x70, 2, 0, 8)),  # PUBCOMP
    bytes((0xC0, 0)),  # PINGREQ
    bytes((0xD0, 0)),  # PINGRESP: server-only
    bytes((0x20, 2, 0, 0)),  # CONNACK: server-only
    P.encode(P.Subscribe(1, [("a/#", 1)]), 4),
    P.encode(P.Unsubscribe(2, ["a/#"]), 4),
    bytes((0x32, 4, 0, 1, 0x61, 0)),  # PUBLISH QoS 1, packet id 0: malformed
    bytes((0x36, 3, 0, 1, 0x61)),  # PUBLISH QoS 3: malformed
    bytes((0x00, 0)),  # reserved type 0
    bytes((0x40, 3, 0, 7, 0)),  # PUBACK with a byte too many (3.1.1)
    bytes((0xE0, 0)),  # DISCONNECT
]


def _describe(event: object) -> Any:
    return (type(event).__name__, repr(event))


def _by_next_event(stream: bytes, chunks: list[int]) -> list[Any]:
    core = MQTTServerConnection()
    out: list[Any] = []
    for data in _split(stream, chunks):
        core.receive_data(data)
        while (event := core.next_event()) is not None:
            out.append(_describe(event))
    return out + [core.closed, core.data_to_send()]


def _by_inline_read(stream: bytes, chunks: list[int]) -> list[Any]:
    """As MQTTConnection._process reads."""
    core = MQTTServerConnection()
    next_packet = core.decoder.next_packet
    out: list[Any] = []
    for data in _split(stream, chunks):
        core.receive_data(data)
        while True:
            event: object
            if core._got_connect and not core.closed:
                try:
                    event = next_packet()
                except P.MalformedPacket as e:
                    event = core.malformed(e)
                else:
                    if event is None:
                        break
                    if type(event) is not P.Publish and type(event) is not P.Ack:
                        event = core.vet(event)  # type: ignore[arg-type]
            else:
                event = core.next_event()
                if event is None:
                    break
            out.append(_describe(event))
    return out + [core.closed, core.data_to_send()]


def _split(stream: bytes, chunks: list[int]) -> list[bytes]:
    parts, i = [], 0
    for n in chunks:
        parts.append(stream[i:i + n])
        i += n
    parts.append(stream[i:])
    return parts


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(range(len(PACKETS))), max_size=12), st.booleans(),
       st.lists(st.integers(1, 40), max_size=6))
def test_MQ7_inline_read_gives_what_next_event_gives(picks: list[int], connect_first: bool,
                                                     chunks: list[int]) -> None:
    stream = (CONNECT if connect_first else b"") + b"".join(PACKETS[i] for i in picks)
    assert _by_inline_read(stream, chunks) == _by_next_event(stream, chunks)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=20).filter(lambda t: "\0" not in t), st.binary(max_size=200),
       st.integers(1, 2), st.integers(1, 65535), st.booleans(), st.booleans())
def test_MQ2_inline_delivery_bytes_are_publish_bytes(topic: str, body: bytes, qos: int, pid: int, dup: bool,
                                                     retain: bool) -> None:
    """session.deliver's cache hit for MQTT 3.1.1, rebuilt as it is there."""
    _PUBLISH_HEADS.clear()
    expected = publish_bytes(topic, body, qos, pid, dup, 4, retain)  # fills the cache
    head = _PUBLISH_HEADS.get((topic, 0x30 | (8 if dup else 0) | (qos << 1) | retain, len(body), 4))
    assert head is not None
    assert b"".join((head, _U16.pack(pid), body)) == expected == \
        P.encode(P.Publish(topic, body, qos, retain, dup=dup, packet_id=pid), 4)
