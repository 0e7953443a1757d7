"""What MQTT itself defines, differential against the Mosquitto on 127.0.0.1:1883 (SPEC
MQ2-MQ7): the same client code (aiomqtt, or the raw client where a library hides what is
tested: DUP resends, a dropped socket, reason codes) gives the same deliveries, retained
messages, wills, session resumes, QoS 2 exactly once, on both protocol versions. Where the
gateway rightly differs the test says so. The gateway's own rules are in test_mqtt_gateway.py."""

from __future__ import annotations

import time

import pytest

from gateway.mqtt import codec as P
from tests.integration.mqtt_client import RawClient
from tests.integration.mqtt_fixtures import MOSQUITTO, gw_fixture, port_fixture, topic_fixture  # noqa: F401
from tests.integration.mqtt_fixtures import client as _client
from tests.integration.mqtt_fixtures import next_publish as _next_publish
from tests.integration.mqtt_fixtures import take as _take

# -- deliveries, both versions, differential (MQ2, MQ4) --------------------------------------


@pytest.mark.parametrize("level", [4, 5])
async def test_MQ4_qos_0_1_2_delivered_at_min_qos(port: int, level: int, topic: str) -> None:
    async with _client(port, level) as sub, _client(port, level) as pub:
        await sub.subscribe(f"{topic}/+/temp", qos=2)
        await sub.subscribe(f"{topic}/low/#", qos=0)
        for qos in (0, 1, 2):
            await pub.publish(f"{topic}/k{qos}/temp", f"m{qos}".encode(), qos=qos)
        await pub.publish(f"{topic}/low/x", b"low", qos=2)
        got = await _take(sub, 4)
    assert sorted((str(m.topic), m.payload, m.qos) for m in got) == [
        (f"{topic}/k0/temp", b"m0", 0), (f"{topic}/k1/temp", b"m1", 1), (f"{topic}/k2/temp", b"m2", 2),
        (f"{topic}/low/x", b"low", 0)]


def test_MQ2_dollar_topics_are_not_matched_by_wildcards(port: int, topic: str) -> None:
    sub = RawClient(port)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [("#", 0), (f"${topic}/#", 0)]))
    assert isinstance(sub.recv(), P.SubAck)
    pub = RawClient(port)
    pub.connect(f"{topic}-p")
    pub.send(P.Publish(f"${topic}/x", b"dollar"))
    got = _next_publish(sub)
    assert got is not None and got.topic == f"${topic}/x"
    # Only the $-filter matched: one copy, not two (a wildcard filter does not match it).
    pub.send(P.Publish(f"{topic}/after", b"marker"))
    while (p := _next_publish(sub)) is not None and p.topic != f"{topic}/after":
        assert p.topic != f"${topic}/x", "a wildcard filter matched a $-topic"
    sub.close()
    pub.close()


def test_MQ4_qos2_resent_publish_is_delivered_exactly_once(port: int, topic: str) -> None:
    sub = RawClient(port)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(topic, 2)]))
    assert sub.recv().reason_codes == [2]
    pub = RawClient(port)
    pub.connect(f"{topic}-p")
    pub.send(P.Publish(topic, b"once", 2, packet_id=7))
    pub.send(P.Publish(topic, b"once", 2, dup=True, packet_id=7))
    recs = [pub.recv(), pub.recv()]
    assert [(r.kind, r.packet_id) for r in recs] == [(P.PUBREC, 7), (P.PUBREC, 7)]
    pub.send(P.Ack(P.PUBREL, 7))
    assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBCOMP, 7)
    pub.send(P.Publish(topic, b"marker", 0))
    first = _next_publish(sub)
    assert first is not None and first.payload == b"once" and first.qos == 2
    sub.send(P.Ack(P.PUBREC, first.packet_id))
    later = []
    while not isinstance(rel := sub.recv(), P.Ack):
        later.append(rel)  # the marker may come before the PUBREL
    assert rel.kind == P.PUBREL and rel.packet_id == first.packet_id
    sub.send(P.Ack(P.PUBCOMP, first.packet_id))
    second = later[0] if later else _next_publish(sub)
    assert second is not None and second.payload == b"marker"
    sub.close()
    pub.close()


# -- retained, will, sessions, takeover (MQ3, MQ5) --------------------------------------------


@pytest.mark.parametrize("level", [4, 5])
async def test_MQ5_retained_one_per_topic_and_empty_clears(port: int, level: int, topic: str) -> None:
    async with _client(port, level) as pub:
        await pub.publish(f"{topic}/a", b"old", qos=1, retain=True)
        await pub.publish(f"{topic}/a", b"new", qos=1, retain=True)
        await pub.publish(f"{topic}/b", b"b", qos=1, retain=True)
        async with _client(port, level) as sub:
            await sub.subscribe(f"{topic}/+", qos=1)
            got = await _take(sub, 2)
        assert sorted((str(m.topic), m.payload, m.retain) for m in got) == [
            (f"{topic}/a", b"new", True), (f"{topic}/b", b"b", True)]
        await pub.publish(f"{topic}/a", b"", qos=1, retain=True)
        await pub.publish(f"{topic}/b", b"", qos=1, retain=True)
        async with _client(port, level) as sub:
            await sub.subscribe(f"{topic}/+", qos=1)
            await pub.publish(f"{topic}/c", b"live", qos=1)
            got = await _take(sub, 1)
        assert [(str(m.topic), m.payload, m.retain) for m in got] == [(f"{topic}/c", b"live", False)]


@pytest.mark.parametrize("level", [4, 5])
def test_MQ5_will_on_ungraceful_end_not_on_disconnect(port: int, level: int, topic: str) -> None:
    sub = RawClient(port, level)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(f"{topic}/#", 1)]))
    sub.recv()
    polite = RawClient(port, level)
    polite.connect(f"{topic}-polite", will=P.Will(f"{topic}/polite", b"gone", 1))
    polite.close()
    rude = RawClient(port, level)
    rude.connect(f"{topic}-rude", will=P.Will(f"{topic}/rude", b"lost", 1))
    rude.drop()
    got = _next_publish(sub)
    assert got is not None and (got.topic, got.payload) == (f"{topic}/rude", b"lost")
    sub.send(P.Ack(P.PUBACK, got.packet_id))
    sub.send(P.Publish(f"{topic}/marker", b"m"))
    nxt = _next_publish(sub)
    assert nxt is not None and nxt.topic == f"{topic}/marker"
    sub.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ3_persistent_session_keeps_qos1_while_away(port: int, level: int, topic: str) -> None:
    props = {"session_expiry": 300} if level == 5 else {}
    c = RawClient(port, level)
    assert c.connect(f"{topic}-p", clean=True, **props).session_present is False
    c.close()
    c = RawClient(port, level)
    c.connect(f"{topic}-p", clean=False, **props)
    c.send(P.Subscribe(1, [(f"{topic}/q", 1)]))
    c.recv()
    c.close()
    pub = RawClient(port, level)
    pub.connect(f"{topic}-pub")
    pub.send(P.Publish(f"{topic}/q", b"while-away", 1, packet_id=1))
    assert pub.recv().kind == P.PUBACK
    pub.close()
    c = RawClient(port, level)
    assert c.connect(f"{topic}-p", clean=False, **props).session_present is True
    got = _next_publish(c)
    assert got is not None and (got.payload, got.qos) == (b"while-away", 1)
    c.send(P.Ack(P.PUBACK, got.packet_id))
    c.close()
    # A clean start ends it: nothing is kept.
    c = RawClient(port, level)
    assert c.connect(f"{topic}-p", clean=True).session_present is False
    c.close()


def test_MQ6_unacked_qos1_comes_again_with_dup_on_reconnect(port: int, topic: str) -> None:
    c = RawClient(port, 4)
    c.connect(f"{topic}-r", clean=False)
    c.send(P.Subscribe(1, [(topic, 1)]))
    c.recv()
    pub = RawClient(port, 4)
    pub.connect(f"{topic}-pub")
    pub.send(P.Publish(topic, b"again", 1, packet_id=1))
    pub.recv()
    first = _next_publish(c)
    assert first is not None and not first.dup
    c.drop()  # never acknowledged
    c = RawClient(port, 4)
    assert c.connect(f"{topic}-r", clean=False).session_present
    again = _next_publish(c)
    assert again is not None and again.payload == b"again" and again.dup
    c.send(P.Ack(P.PUBACK, again.packet_id))
    c.close()
    c = RawClient(port, 4)
    c.connect(f"{topic}-r", clean=True)
    c.close()


def test_MQ5_second_connection_takes_the_client_id_over(port: int, topic: str) -> None:
    first = RawClient(port, 5)
    first.connect(f"{topic}-same")
    second = RawClient(port, 5)
    second.connect(f"{topic}-same")
    gone = first.recv()
    if port == MOSQUITTO:
        # Difference: Mosquitto 2.0.11 closes the socket without DISCONNECT 0x8E, which the
        # MQTT 5 text (3.1.4-3) asks for and the gateway sends.
        assert gone is None or (isinstance(gone, P.Disconnect) and gone.reason_code == 0x8E)
    else:
        assert isinstance(gone, P.Disconnect) and gone.reason_code == 0x8E
        assert first.recv() is None
    second.send(P.PingReq())
    assert isinstance(second.recv(), P.PingResp)
    second.close()


def test_MQ5_keep_alive_one_and_a_half_intervals_then_will(port: int, topic: str) -> None:
    sub = RawClient(port, 5)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(f"{topic}/will", 0)]))
    sub.recv()
    quiet = RawClient(port, 5)
    quiet.connect(f"{topic}-quiet", keep_alive=1, will=P.Will(f"{topic}/will", b"silent", 0))
    started = time.monotonic()
    end = quiet.recv(timeout=15)  # nothing sent: the server ends it
    # Mosquitto keeps its clock in whole seconds and computes keep-alive * 3 / 2 in integers
    # (1 s here): it closes after 1 to 2 s (1.2 s seen in CI). The gateway keeps the spec's 1.5.
    assert time.monotonic() - started >= (1.0 if port == MOSQUITTO else 1.5)
    if port != MOSQUITTO:  # Mosquitto 2.0.11 closes without a reason code
        assert isinstance(end, P.Disconnect) and end.reason_code == 0x8D
        end = quiet.recv()
    assert end is None
    got = _next_publish(sub, timeout=15)
    assert got is not None and got.payload == b"silent"
    sub.close()


def test_MQ7_unsupported_protocol_level_is_connack_1(port: int) -> None:
    c = RawClient(port, 4)
    c.send_raw(b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00")  # level 6
    ack = c.recv()
    assert isinstance(ack, P.ConnAck) and ack.reason_code in (0x01, 0x84)
    assert c.recv() is None


def test_MQ4_qos2_identifier_state_survives_a_reconnect(port: int, topic: str) -> None:
    """A QoS 2 PUBLISH whose PUBREC was lost with the connection is resent on the resumed
    session: routed once, not twice (MQ4)."""
    sub = RawClient(port, 4)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(topic, 0)]))
    sub.recv()
    pub = RawClient(port, 4)
    pub.connect(f"{topic}-p", clean=False)
    pub.send(P.Publish(topic, b"exactly-once", 2, packet_id=11))
    assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBREC, 11)
    pub.drop()
    pub = RawClient(port, 4)
    assert pub.connect(f"{topic}-p", clean=False).session_present
    pub.send(P.Publish(topic, b"exactly-once", 2, dup=True, packet_id=11))
    assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBREC, 11)
    pub.send(P.Ack(P.PUBREL, 11))
    assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBCOMP, 11)
    pub.send(P.Publish(topic, b"marker", 0))
    got = [_next_publish(sub), _next_publish(sub)]
    assert [g.payload for g in got if g is not None] == [b"exactly-once", b"marker"]
    pub.close()
    RawClient(port, 4).connect(f"{topic}-p", clean=True)
    sub.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ5_takeover_publishes_the_first_connections_will(port: int, level: int, topic: str) -> None:
    sub = RawClient(port, level)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(f"{topic}/#", 0)]))
    sub.recv()
    first = RawClient(port, level)
    first.connect(f"{topic}-dup", will=P.Will(f"{topic}/will", b"taken", 0))
    second = RawClient(port, level)
    second.connect(f"{topic}-dup")
    second.send(P.Publish(f"{topic}/marker", b"m"))
    got = [_next_publish(sub), _next_publish(sub)]
    assert [(g.topic, g.payload) for g in got if g is not None] == [(f"{topic}/will", b"taken"),
                                                                   (f"{topic}/marker", b"m")]
    second.close()
    sub.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ3_session_present_for_a_persistent_session_without_subscriptions(port: int, level: int,
                                                                            topic: str) -> None:
    props = {"session_expiry": 60} if level == 5 else {}
    c = RawClient(port, level)
    assert not c.connect(f"{topic}-e", clean=False, **props).session_present
    c.close()
    c = RawClient(port, level)
    assert c.connect(f"{topic}-e", clean=False, **props).session_present
    c.close()
    c = RawClient(port, level)
    assert not c.connect(f"{topic}-e", clean=True).session_present
    c.close()


def test_MQ7_nothing_larger_than_the_clients_maximum_packet_size_is_sent(port: int, topic: str) -> None:
    sub = RawClient(port, 5)
    sub.connect(f"{topic}-small", maximum_packet_size=100)
    sub.send(P.Subscribe(1, [(topic, 1)]))
    sub.recv()
    pub = RawClient(port, 5)
    pub.connect(f"{topic}-p")
    pub.send(P.Publish(topic, b"x" * 200, 1, packet_id=1))
    pub.send(P.Publish(topic, b"fits", 1, packet_id=2))
    got = _next_publish(sub)
    assert got is not None and got.payload == b"fits"
    sub.send(P.Ack(P.PUBACK, got.packet_id))
    sub.close()
    pub.close()


def test_MQ2_no_local_and_retain_as_published(port: int, topic: str) -> None:
    """MQTT 5 subscription options: "no local" keeps a client's own messages from it,
    "retain as published" keeps the retain flag on live deliveries."""
    c = RawClient(port, 5)
    c.connect(f"{topic}-self")
    c.send(P.Subscribe(1, [(f"{topic}/own", 1 | 0x04), (f"{topic}/rap", 1 | 0x08 | 0x20)]))
    assert c.recv().reason_codes == [1, 1]
    c.send(P.Publish(f"{topic}/own", b"mine", 1, packet_id=2))
    c.send(P.Publish(f"{topic}/rap", b"kept", 1, retain=True, packet_id=3))
    seen = []
    while len(seen) < 1:
        p = c.recv()
        assert p is not None
        if isinstance(p, P.Publish):
            seen.append((p.topic, p.payload, p.retain))
            c.send(P.Ack(P.PUBACK, p.packet_id))
    assert seen == [(f"{topic}/rap", b"kept", True)]
    c.send(P.Publish(f"{topic}/rap", b"", 1, retain=True, packet_id=4))  # clear it
    other = RawClient(port, 5)
    other.connect(f"{topic}-other")
    other.send(P.Publish(f"{topic}/own", b"theirs", 0))
    while True:  # skips acks and the (empty) clearing publish
        p = c.recv()
        assert p is not None
        if isinstance(p, P.Publish):
            if p.qos:
                c.send(P.Ack(P.PUBACK, p.packet_id))
            if p.payload:
                break
    assert p.payload == b"theirs"
    c.close()
    other.close()


def test_MQ5_will_delay_resumed_session_sends_no_will(port: int, topic: str) -> None:
    """MQTT 5 will delay: a client back within the delay sends no will; one that stays away
    does, once the delay is over."""
    sub = RawClient(port, 5)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(f"{topic}/#", 0)]))
    sub.recv()
    will = P.Will(f"{topic}/will", b"delayed", 0, properties={"will_delay": 2})
    c = RawClient(port, 5)
    c.connect(f"{topic}-d", clean=False, will=will, session_expiry=60)
    c.drop()
    c = RawClient(port, 5)
    assert c.connect(f"{topic}-d", clean=False, session_expiry=60).session_present
    time.sleep(3)  # past the will delay: had the will been kept, it would have gone out
    c.send(P.Publish(f"{topic}/marker", b"m"))
    got = _next_publish(sub)
    assert got is not None and got.topic == f"{topic}/marker"
    c.close()
    c = RawClient(port, 5)
    c.connect(f"{topic}-d2", clean=False, will=P.Will(f"{topic}/will", b"gone", 0, properties={"will_delay": 1}),
              session_expiry=60)
    c.drop()
    got = _next_publish(sub, timeout=15)
    assert got is not None and (got.topic, got.payload) == (f"{topic}/will", b"gone")
    for cid in (f"{topic}-d", f"{topic}-d2"):
        RawClient(port, 5).connect(cid, clean=True)
    sub.close()


def test_MQ4_qos1_filter_added_to_a_qos0_session_is_acknowledged(port: int, topic: str) -> None:
    """A session first with QoS 0 filters only, then a QoS 1 one: the QoS 1 delivery is kept
    until its PUBACK (it comes again after a reconnect), the QoS 0 ones are not."""
    c = RawClient(port, 4)
    c.connect(f"{topic}-mix", clean=False)
    c.send(P.Subscribe(1, [(f"{topic}/zero", 0)]))
    c.recv()
    pub = RawClient(port, 4)
    pub.connect(f"{topic}-p")
    pub.send(P.Publish(f"{topic}/zero", b"z", 1, packet_id=1))
    pub.recv()
    got = _next_publish(c)
    assert got is not None and (got.payload, got.qos) == (b"z", 0)
    c.send(P.Subscribe(2, [(f"{topic}/one", 1)]))
    c.recv()
    pub.send(P.Publish(f"{topic}/one", b"o", 1, packet_id=2))
    pub.recv()
    got = _next_publish(c)
    assert got is not None and (got.payload, got.qos) == (b"o", 1)
    c.drop()  # no PUBACK
    c = RawClient(port, 4)
    assert c.connect(f"{topic}-mix", clean=False).session_present
    again = _next_publish(c)
    assert again is not None and (again.payload, again.dup) == (b"o", True)
    c.send(P.Ack(P.PUBACK, again.packet_id))
    c.close()
    RawClient(port, 4).connect(f"{topic}-mix", clean=True)
    pub.close()


def test_MQ3_resume_with_another_session_expiry(port: int, topic: str) -> None:
    c = RawClient(port, 5)
    c.connect(f"{topic}-x", clean=False, session_expiry=100)
    c.send(P.Subscribe(1, [(topic, 1)]))
    c.recv()
    c.close()
    c = RawClient(port, 5)
    assert c.connect(f"{topic}-x", clean=False, session_expiry=200).session_present
    c.send(P.Publish(topic, b"still mine", 1, packet_id=1))
    got = _next_publish(c)
    assert got is not None and got.payload == b"still mine"
    c.send(P.Ack(P.PUBACK, got.packet_id))
    c.close()
    RawClient(port, 5).connect(f"{topic}-x", clean=True)
