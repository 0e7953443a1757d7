"""The MQTT 5 rules the codec enforces on what a client sends (SPEC MQ7, issue 26 item 7):
a property in a packet type it does not belong to is malformed (0x81), a value the
specification forbids is a protocol error (0x82), a subscription identifier the CONNACK said
is not supported is 0xA1, and a PINGREQ flood is answered without recursion. And topic
matching's shortcut for many filters against one topic (MQ2, MQ8)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt import codec as P
from gateway.mqtt.connection import MQTTServerConnection, ProtocolError
from gateway.mqtt.topics import matches


def _connected() -> MQTTServerConnection:
    conn = MQTTServerConnection()
    conn.receive_data(P.encode(P.Connect(level=5, client_id="c", username="u", password=b"p"), 5))
    assert isinstance(conn.next_event(), P.Connect)
    conn.accept(P.ConnAck(0))
    conn.data_to_send()
    return conn


def _events(conn: MQTTServerConnection) -> list[Any]:
    out = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def _refused(conn: MQTTServerConnection, data: bytes) -> int:
    """The reason code of the DISCONNECT that ``data`` gets on a connected session."""
    conn.receive_data(data)
    errors = [e for e in _events(conn) if isinstance(e, ProtocolError)]
    assert len(errors) == 1 and conn.closed
    sent = P.Decoder()
    sent.level = 5
    sent.feed(conn.data_to_send())
    bye = sent.next_packet()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == errors[0].reason_code
    return errors[0].reason_code


@pytest.mark.parametrize("packet", [
    P.Publish("t", b"x", properties={"session_expiry": 5}),
    P.Publish("t", b"x", properties={"receive_maximum": 5}),
    P.Subscribe(1, [("t", 0)], {"topic_alias": 3}),
    P.Unsubscribe(1, ["t"], {"content_type": "text/plain"}),
    P.Ack(P.PUBACK, 1, 0x10, {"topic_alias": 1}),
    P.Disconnect(0, {"maximum_qos": 1}),
], ids=["publish-session-expiry", "publish-receive-maximum", "subscribe-topic-alias",
        "unsubscribe-content-type", "puback-topic-alias", "disconnect-maximum-qos"])
def test_MQ7_a_property_in_a_packet_type_it_does_not_belong_to_is_malformed(packet: Any) -> None:
    """MQTT 5 2.2.2.2: such a packet is a Malformed Packet (0x81)."""
    assert _refused(_connected(), P.encode(packet, 5)) == P.MALFORMED


def test_MQ7_the_user_property_goes_in_any_packet() -> None:
    conn = _connected()
    conn.receive_data(P.encode(P.Unsubscribe(1, ["t"], {"user_property": [("k", "v")]}), 5))
    (got,) = _events(conn)
    assert isinstance(got, P.Unsubscribe) and got.properties["user_property"] == [("k", "v")]


@pytest.mark.parametrize("props", [{"request_problem_info": 2}, {"request_response_info": 7},
                                   {"receive_maximum": 0}, {"maximum_packet_size": 0}])
def test_MQ7_a_connect_property_value_the_specification_forbids_is_a_protocol_error(props: dict[str, Any]) -> None:
    conn = MQTTServerConnection()
    conn.receive_data(P.encode(P.Connect(level=5, client_id="c", username="u", password=b"p",
                                         properties=props), 5))
    (err,) = _events(conn)
    assert isinstance(err, ProtocolError) and err.reason_code == P.PROTOCOL_ERROR


def test_MQ7_a_payload_format_above_1_is_a_protocol_error() -> None:
    assert _refused(_connected(), P.encode(P.Publish("t", b"x", properties={"payload_format": 2}), 5)) == \
        P.PROTOCOL_ERROR


def test_MQ7_a_clients_publish_with_a_subscription_identifier_is_a_protocol_error() -> None:
    """MQTT-3.3.4-6: only the server puts one in a PUBLISH."""
    publish = P.encode(P.Publish("t", b"x", properties={"subscription_id": [3]}), 5)
    assert _refused(_connected(), publish) == P.PROTOCOL_ERROR
    client_side = P.Decoder()  # a client decoding the server's PUBLISH takes it
    client_side.level = 5
    client_side.feed(publish)
    got = client_side.next_packet()
    assert isinstance(got, P.Publish) and got.properties["subscription_id"] == [3]


def test_MQ7_a_subscription_identifier_in_subscribe_is_0xA1() -> None:
    """The CONNACK says Subscription Identifier Available 0 (MQTT 5 3.2.2.3.12): a SUBSCRIBE
    with one is refused with 0xA1, not accepted silently (issue 26 item 7)."""
    subscribe = P.encode(P.Subscribe(1, [("t", 1)], {"subscription_id": [7]}), 5)
    assert _refused(_connected(), subscribe) == P.SUBSCRIPTION_IDS_NOT_SUPPORTED == 0xA1


def test_MQ7_a_subscription_identifier_of_0_is_a_protocol_error() -> None:
    subscribe = P.encode(P.Subscribe(1, [("t", 1)], {"subscription_id": [0]}), 5)
    assert _refused(_connected(), subscribe) == P.PROTOCOL_ERROR


def test_MQ7_ten_thousand_pingreqs_in_one_read_are_answered_without_recursion() -> None:
    """Before: next_event answered a PINGREQ and called itself for the next packet, so
    10,000 in one read raised RecursionError after 986."""
    conn = _connected()
    conn.receive_data(bytes((P.PINGREQ << 4, 0)) * 10_000)
    events = _events(conn)
    assert len(events) == 10_000 and not conn.closed
    assert conn.data_to_send() == bytes((P.PINGRESP << 4, 0)) * 10_000


def _reference_matches(topic_filter: str, topic: str) -> bool:
    """MQTT 4.7 matching as written before the first-level shortcut (one split per call)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)


_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "é", "a.b"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "", "+", "$SYS", "é"]), min_size=1, max_size=5), st.booleans(),
       st.lists(_LEVELS, min_size=1, max_size=6))
def test_MQ2_matching_with_the_first_level_shortcut_agrees_with_mqtt_4_7(
        levels: list[str], hash_end: bool, topic_levels: list[str]) -> None:
    """matches() splits a topic once for many filters and refuses a filter whose first level
    is neither a wildcard nor the topic's before splitting it (long topics are matched
    against every session's filters, MQ8); the results are MQTT's."""
    topic_filter = "/".join([*levels, "#"] if hash_end else levels)
    topic = "/".join(topic_levels)
    assert matches(topic_filter, topic) == _reference_matches(topic_filter, topic)
    assert matches(topic_filter, topic) == _reference_matches(topic_filter, topic)  # the split kept
