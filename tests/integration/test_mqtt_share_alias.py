"""MQTT 5 topic aliases and shared subscriptions (SPEC MQ2, MQ7), differential against the
Mosquitto on 127.0.0.1:1883 where MQTT defines the outcome: the same client code (paho-mqtt,
aiomqtt, or the raw client for exact reason codes) gives the same deliveries and codes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import paho.mqtt.client as paho
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.mqtt import codec as P
from gateway.server import gateway_in_thread
from tests.integration.mqtt_client import RawClient
from tests.integration.mqtt_fixtures import VERSIONS, gw_fixture, port_fixture, topic_fixture  # noqa: F401
from tests.integration.mqtt_fixtures import client as _client
from tests.integration.mqtt_fixtures import next_publish as _next_publish
from tests.integration.mqtt_fixtures import take as _take

# -- topic aliases, client to server (MQTT 5 3.3.2.3.4) ---------------------------------------


def _alias(n: int) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.TopicAlias = n
    return props


async def test_MQ2_topic_aliases_from_paho_reach_subscribers(port: int, topic: str) -> None:
    """CONNACK offers aliases; paho sets two, then publishes by alias alone (empty topic): the
    subscriber gets every message under its full topic name."""
    async with _client(port, 5) as sub:
        await sub.subscribe(f"{topic}/#", qos=1)
        connected = threading.Event()
        maximum: list[int] = []
        pub = paho.Client(CallbackAPIVersion.VERSION2, protocol=VERSIONS[5])
        pub.username_pw_set("guest", "guest")

        def on_connect(_c: Any, _u: Any, _f: Any, _rc: Any, props: Any) -> None:
            maximum.append(getattr(props, "TopicAliasMaximum", 0))
            connected.set()

        pub.on_connect = on_connect
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        try:
            assert await asyncio.to_thread(connected.wait, 10)
            assert maximum[0] >= 2  # Mosquitto offers 10, the gateway 16 (RabbitMQ's default)
            sent = [(f"{topic}/a", b"1", _alias(1)), (f"{topic}/b/c", b"2", _alias(2)), ("", b"3", _alias(1)),
                    ("", b"4", _alias(2)), (f"{topic}/d", b"5", _alias(1)), ("", b"6", _alias(1))]
            for name, payload, props in sent:
                info = pub.publish(name, payload, qos=1, properties=props)
                await asyncio.to_thread(info.wait_for_publish, 10)
            got = await _take(sub, len(sent))
        finally:
            pub.disconnect()
            pub.loop_stop()
    assert [(str(m.topic), m.payload) for m in got] == [
        (f"{topic}/a", b"1"), (f"{topic}/b/c", b"2"), (f"{topic}/a", b"3"), (f"{topic}/b/c", b"4"),
        (f"{topic}/d", b"5"), (f"{topic}/d", b"6")]


def test_MQ2_topic_aliases_are_per_connection(port: int, topic: str) -> None:
    """An alias set on one connection means nothing on the next one of the same client: an
    empty topic name with it is a protocol error (0x82) there."""
    c = RawClient(port, 5)
    c.connect(f"{topic}-a", clean=False, session_expiry=60)
    c.send(P.Publish(f"{topic}/x", b"set", 1, packet_id=1, properties={"topic_alias": 3}))
    assert (lambda a: (a.kind, a.packet_id))(c.recv()) == (P.PUBACK, 1)
    c.close()
    c = RawClient(port, 5)
    assert c.connect(f"{topic}-a", clean=False, session_expiry=60).session_present  # the session, not its aliases
    c.send(P.Publish("", b"stale", 1, packet_id=2, properties={"topic_alias": 3}))
    bye = c.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == P.PROTOCOL_ERROR
    assert c.recv() is None
    c = RawClient(port, 5)
    c.connect(f"{topic}-a")  # a clean start ends the persistent session
    c.close()


@pytest.mark.parametrize("case", ["above maximum", "unknown alias", "empty topic"])
def test_MQ7_bad_topic_alias_closes_with_the_specs_code(port: int, topic: str, case: str) -> None:
    """An alias above the CONNACK's Topic Alias Maximum: DISCONNECT 0x94 (Topic Alias invalid);
    an empty topic name with an alias never set, or without an alias: 0x82 (protocol error)."""
    c = RawClient(port, 5)
    maximum = c.connect(f"{topic}-bad").properties["topic_alias_maximum"]
    packet, code = {"above maximum": (P.Publish(topic, b"x", properties={"topic_alias": maximum + 1}), 0x94),
                    "unknown alias": (P.Publish("", b"x", properties={"topic_alias": 1}), 0x82),
                    "empty topic": (P.Publish("", b"x"), 0x82)}[case]
    c.send(packet)
    bye = c.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == code
    assert c.recv() is None


def test_MQ7_topic_alias_zero_is_topic_alias_invalid(gw: Any, topic: str) -> None:
    """Alias 0 is out of range (MQTT-3.3.2-8): the gateway answers 0x94 as for one above the
    maximum. Mosquitto answers 0x81 (malformed) here; the specification names no code."""
    c = RawClient(gw.mqtt.port, 5)
    c.connect(f"{topic}-zero")
    c.send(P.Publish(topic, b"x", properties={"topic_alias": 0}))
    bye = c.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == 0x94


# -- shared subscriptions (MQTT 5 4.8.2; Mosquitto offers them to 3.1.1 clients too) ------------

N = 30


@pytest.mark.parametrize("level", [4, 5])
async def test_MQ3_shared_subscription_gives_each_message_to_one_member(port: int, level: int, topic: str) -> None:
    """Three members of $share/g/<filter> and one plain subscriber: the plain one gets every
    message, the group each message once, spread over its members."""
    got: dict[str, list[bytes]] = {}

    async def member(name: str, c: Any, ready: asyncio.Event, done: asyncio.Event) -> None:
        got[name] = []
        ready.set()
        try:
            async with asyncio.timeout(15):
                async for m in c.messages:
                    got[name].append(m.payload)
                    if sum(len(v) for k, v in got.items() if k != "plain") >= N and len(got["plain"]) >= N:
                        done.set()
        except TimeoutError:
            pass

    async with _client(port, level) as a, _client(port, level) as b, _client(port, level) as c, \
            _client(port, level) as plain, _client(port, level) as pub:
        for m in (a, b, c):
            await m.subscribe(f"$share/g{topic}/{topic}/+", qos=1)
        await plain.subscribe(f"{topic}/+", qos=1)
        done = asyncio.Event()
        readies = [asyncio.Event() for _ in range(4)]
        tasks = [asyncio.create_task(member(n, cl, r, done))
                 for n, cl, r in zip(("a", "b", "c", "plain"), (a, b, c, plain), readies, strict=True)]
        for r in readies:
            await r.wait()
        for i in range(N):
            await pub.publish(f"{topic}/k{i % 3}", f"m{i}".encode(), qos=1)
        async with asyncio.timeout(15):
            await done.wait()
        await asyncio.sleep(0.3)  # a message delivered twice would arrive now
        for t in tasks:
            t.cancel()
    members = [got[k] for k in ("a", "b", "c")]
    assert sorted(x for m in members for x in m) == sorted(f"m{i}".encode() for i in range(N))  # each once
    assert sum(1 for m in members if m) >= 2, got  # spread, not all to one member
    assert sorted(got["plain"]) == sorted(f"m{i}".encode() for i in range(N))


@pytest.mark.parametrize("level", [4, 5])
def test_MQ3_shared_unsubscribe_leaves_the_rest_to_the_others(port: int, level: int, topic: str) -> None:
    shared = f"$share/u{topic}/{topic}"
    a, b = RawClient(port, level), RawClient(port, level)
    a.connect(f"{topic}-a")
    b.connect(f"{topic}-b")
    for m in (a, b):
        m.send(P.Subscribe(1, [(shared, 0)]))
        assert m.recv().reason_codes == [0]
    a.send(P.Unsubscribe(2, [shared]))
    assert isinstance(a.recv(), P.UnsubAck)
    pub = RawClient(port, level)
    pub.connect(f"{topic}-p")
    for i in range(6):
        pub.send(P.Publish(topic, f"m{i}".encode()))
    got = [_next_publish(b) for _ in range(6)]
    assert [p.payload for p in got if p is not None] == [f"m{i}".encode() for i in range(6)]
    with pytest.raises(TimeoutError):  # nothing more for the member that left the group
        _next_publish(a, timeout=0.5)
    for m in (a, b, pub):
        m.close()


@pytest.mark.parametrize("level, refused", [(4, 0x80), (5, 0x8F)])
def test_MQ3_malformed_share_filters_are_refused_in_suback(gw: Any, level: int, refused: int, topic: str) -> None:
    """A share name with a wildcard, or a filter that is not one: refused in SUBACK, as the
    gateway refuses any invalid filter (0x8F, Topic Filter invalid), the others granted.
    Mosquitto closes the connection instead (0x81 in MQTT 5) for any invalid filter."""
    c = RawClient(gw.mqtt.port, level)
    c.connect(f"{topic}-m")
    c.send(P.Subscribe(1, [("$share/g+/x", 1), (f"$share/ok/{topic}/+", 1), ("$share/g/x/#/y", 1)]))
    assert c.recv().reason_codes == [refused, 1, refused]
    c.close()


def test_MQ7_no_local_on_a_shared_subscription_is_a_protocol_error(gw: Any, topic: str) -> None:
    """MQTT-3.8.3-4: DISCONNECT 0x82. (Mosquitto grants the subscription and ignores the bit.)"""
    c = RawClient(gw.mqtt.port, 5)
    c.connect(f"{topic}-nl")
    c.send(P.Subscribe(1, [(f"$share/g/{topic}", 1 | 0x04)]))
    bye = c.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == P.PROTOCOL_ERROR


@pytest.mark.parametrize("level", [4, 5])
def test_MQ3_shared_subscription_takes_amqp_publishes_and_redelivers_a_members_unacked(gw: Any, level: int,
                                                                                       topic: str) -> None:
    """The group is a CMQ subscription like any other (MQ2: an AMQP publish reaches one
    member); a QoS 1 message a member never acknowledged goes to another member once it leaves
    (MQ6)."""
    shared = f"$share/r{topic}/{topic}/#"
    a = RawClient(gw.mqtt.port, level)
    a.connect(f"{topic}-a")
    a.send(P.Subscribe(1, [(shared, 1)]))
    assert a.recv().reason_codes == [1]
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", gw.port, credentials=pika.PlainCredentials("guest", "guest")))
    conn.channel().basic_publish("amq.topic", f"{topic}.x", b"from-amqp", pika.BasicProperties(delivery_mode=2))
    conn.close()
    first = _next_publish(a)
    assert first is not None and (first.topic, first.payload, first.qos) == (f"{topic}/x", b"from-amqp", 1)
    b = RawClient(gw.mqtt.port, level)
    b.connect(f"{topic}-b")
    b.send(P.Subscribe(1, [(shared, 1)]))
    assert b.recv().reason_codes == [1]
    a.drop()  # never acknowledged
    again = _next_publish(b)
    assert again is not None and (again.topic, again.payload, again.dup) == (f"{topic}/x", b"from-amqp", True)
    b.send(P.Ack(P.PUBACK, again.packet_id))
    b.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ3_persistent_shared_subscription_keeps_its_messages_across_a_restart(tmp_path: Any, level: int,
                                                                               topic: str) -> None:
    """A persistent session's shared subscription is part of the session (MQ3): QoS 1 messages
    published while its only member is away wait in the group's durable queue, through a
    gateway restart, and reach the member when it resumes."""
    shared = f"$share/p{topic}/{topic}/#"
    persistent: dict[str, Any] = {"clean": False} if level == 4 else {"clean": False, "session_expiry": 300}
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), mqtt_port=0, data_dir=str(tmp_path)) as g:
        m = RawClient(g.mqtt.port, level)
        m.connect(f"{topic}-m", **persistent)
        m.send(P.Subscribe(1, [(shared, 1)]))
        assert m.recv().reason_codes == [1]
        m.close()
        pub = RawClient(g.mqtt.port, level)
        pub.connect(f"{topic}-p")
        for i in range(3):
            pub.send(P.Publish(f"{topic}/k", f"m{i}".encode(), 1, packet_id=i + 1))
            assert pub.recv().kind == P.PUBACK
        pub.close()
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), mqtt_port=0, data_dir=str(tmp_path)) as g:
        m = RawClient(g.mqtt.port, level)
        assert m.connect(f"{topic}-m", **persistent).session_present
        got = [_next_publish(m) for _ in range(3)]
        assert [(p.topic, p.payload, p.qos) for p in got if p is not None] == [
            (f"{topic}/k", f"m{i}".encode(), 1) for i in range(3)]
        m.close()


def test_MQ5_no_retained_message_on_a_shared_subscription(gw: Any, topic: str) -> None:
    """MQTT 5 3.3.1.3 sends the retained message on a new non-shared subscription only: a
    shared one gets the messages published after it. (Mosquitto sends the retained one to the
    shared subscriber as well.)"""
    p = RawClient(gw.mqtt.port, 5)
    p.connect(f"{topic}-p")
    p.send(P.Publish(topic, b"kept", 1, retain=True, packet_id=1))
    assert p.recv().kind == P.PUBACK
    c = RawClient(gw.mqtt.port, 5)
    c.connect(f"{topic}-c")
    c.send(P.Subscribe(1, [(f"$share/g/{topic}", 1)]))
    assert c.recv().reason_codes == [1]
    p.send(P.Publish(topic, b"after", 1, packet_id=2))
    assert p.recv().kind == P.PUBACK
    got = _next_publish(c)
    assert got is not None and (got.payload, got.retain) == (b"after", False)
    p.send(P.Publish(topic, b"", 1, retain=True, packet_id=3))  # clears the retained message
    p.recv()
    for x in (c, p):
        x.close()


def test_MQ3_a_shared_groups_queue_goes_with_its_last_holder(gw: Any, topic: str) -> None:
    """The group's queue stays while a session holds the subscription, even a persistent one
    that is away; once none does (unsubscribed, a clean session gone, a persistent session
    discarded by a clean start) and nobody consumes it, it is deleted rather than filling up."""
    from gateway.mqtt.session import shared_queue_name

    shared = f"$share/h{topic}/{topic}"
    queue = shared_queue_name(f"h{topic}", topic)
    queues = gw.broker.vhost("/").queues
    away = RawClient(gw.mqtt.port, 4)
    away.connect(f"{topic}-away", clean=False)
    away.send(P.Subscribe(1, [(shared, 1)]))
    assert away.recv().reason_codes == [1]
    away.close()
    clean = RawClient(gw.mqtt.port, 5)
    clean.connect(f"{topic}-clean")
    clean.send(P.Subscribe(1, [(shared, 1)]))
    assert clean.recv().reason_codes == [1]
    clean.send(P.Unsubscribe(2, [shared]))
    assert isinstance(clean.recv(), P.UnsubAck)
    assert queue in queues  # the persistent session away still holds it
    clean.close()
    back = RawClient(gw.mqtt.port, 4)
    assert not back.connect(f"{topic}-away", clean=True).session_present  # discards that session
    back.close()
    time.sleep(0.2)
    assert queue not in queues
    last = RawClient(gw.mqtt.port, 5)
    last.connect(f"{topic}-last")
    last.send(P.Subscribe(1, [(shared, 0)]))
    assert last.recv().reason_codes == [0] and queue in queues
    last.close()  # a clean session gone: its group with it
    time.sleep(0.2)
    assert queue not in queues
