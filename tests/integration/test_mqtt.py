"""MQTT clients on the CMQ topics (SPEC MQ1-MQ7): aiomqtt and paho-mqtt over real sockets,
both protocol versions, mixed with pika AMQP clients, and differential against the Mosquitto
on 127.0.0.1:1883 for what MQTT itself defines (the same client code, the same results).

Where CMQ rules differ from Mosquitto (and are therefore tested on the gateway only): login
is required (Mosquitto here allows anonymous clients), publish permissions (W2), AMQP
interplay (MQ2), the CMQ queue behind a session (MQ3) and the audit log (MQ7)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.mqtt import codec as P
from gateway.server import gateway_in_thread
from tests.integration.mqtt_client import RawClient

MOSQUITTO = 1883
VERSIONS = {4: MQTTProtocolVersion.MQTTv311, 5: MQTTProtocolVersion.MQTTv5}


def _mosquitto_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", MOSQUITTO), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    users = UserDB({"guest": User("guest", hash_password("guest"), ("administrator",)),
                    "reader": User("reader", hash_password("pw"), ()),
                    "blind": User("blind", hash_password("pw"), ())},
                   {("guest", "/"): Permission(), ("guest", "iot"): Permission(),
                    ("reader", "/"): Permission("^mqtt-subscription-.*", "^mqtt-subscription-.*", ".*"),
                    ("blind", "/"): Permission(".*", ".*", "^mqtt-subscription-.*")},
                   ["/", "iot"])
    audit = tmp_path_factory.mktemp("mqtt-audit")
    from gateway.config import AuditSettings
    settings = AuditSettings(dir=str(audit))
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), data_dir=str(tmp_path_factory.mktemp("mqtt-data")),
                           mqtt_port=0, mqtt_host="127.0.0.1", mqtt_max_packet_size=4096, users=users,
                           audit=settings) as g:
        g.audit_dir = audit
        yield g


@pytest.fixture(params=["gateway", "mosquitto"])
def port(request: pytest.FixtureRequest) -> int:
    """Differential: the same test against the gateway and against Mosquitto."""
    if request.param == "mosquitto":
        assert _mosquitto_up(), "Mosquitto is expected on 127.0.0.1:1883"
        return MOSQUITTO
    return int(request.getfixturevalue("gw").mqtt.port)


@pytest.fixture
def topic() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _client(port: int, level: int, client_id: str = "", **kw: Any) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, username="guest", password="guest", protocol=VERSIONS[level],
                          identifier=client_id or None, **kw)


async def _take(client: aiomqtt.Client, n: int, timeout: float = 10) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []
    async with asyncio.timeout(timeout):
        async for m in client.messages:
            got.append(m)
            if len(got) == n:
                break
    return got


def _next_publish(c: RawClient, timeout: float = 10) -> P.Publish | None:
    while True:
        p = c.recv(timeout)
        if p is None or isinstance(p, P.Publish):
            return p


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


def test_MQ7_oversize_and_malformed_close_only_that_connection(gw: Any, topic: str) -> None:
    port = gw.mqtt.port
    ok = RawClient(port, 5)
    ok.connect(f"{topic}-ok")
    ok.send(P.Subscribe(1, [(topic, 0)]))
    ok.recv()
    big = RawClient(port, 5)
    big.connect(f"{topic}-big")
    big.send(P.Publish(topic, b"x" * 5000))
    bye = big.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == 0x95  # packet too large
    bad = RawClient(port, 5)
    bad.connect(f"{topic}-bad")
    bad.send_raw(b"\x30\x03\x00\x05a")  # topic length beyond the packet
    bye = bad.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == 0x81  # malformed
    order = RawClient(port, 5)
    order.send(P.Subscribe(1, [(topic, 0)]))  # before CONNECT
    assert order.recv() is None
    pub = RawClient(port, 5)
    pub.connect(f"{topic}-pub")
    pub.send(P.Publish(topic, b"still here"))
    got = _next_publish(ok)
    assert got is not None and got.payload == b"still here"
    ok.close()
    pub.close()


# -- the gateway's own rules: AMQP interplay, login, permissions, audit (MQ1, MQ2, MQ7) ---------


def _pika(gw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))


@pytest.mark.parametrize("level", [4, 5])
def test_MQ2_amqp_consumer_bound_with_star_gets_mqtt_publish(gw: Any, level: int, topic: str) -> None:
    conn = _pika(gw)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", f"{topic}.*.temp")
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=VERSIONS[level])
    c.username_pw_set("guest", "guest")
    c.connect("127.0.0.1", gw.mqtt.port)
    c.loop_start()
    c.publish(f"{topic}/k1/temp", b"21.5", qos=1).wait_for_publish(10)
    c.loop_stop()
    c.disconnect()
    method, props, body = next(ch.consume(q, inactivity_timeout=10))
    assert method is not None and (method.routing_key, body) == (f"{topic}.k1.temp", b"21.5")
    assert props.delivery_mode == 2 and props.headers["x-mqtt-publish-qos"] == 1
    conn.close()


@pytest.mark.parametrize("level", [4, 5])
async def test_MQ2_mqtt_subscriber_gets_amqp_publish(gw: Any, level: int, topic: str) -> None:
    async with _client(gw.mqtt.port, level) as sub:
        await sub.subscribe(f"{topic}/+/temp", qos=1)

        def amqp_publish() -> None:
            conn = _pika(gw)
            conn.channel().basic_publish("amq.topic", f"{topic}.k1.temp", b"from-amqp",
                                         pika.BasicProperties(delivery_mode=2, content_type="text/plain"))
            conn.close()

        await asyncio.to_thread(amqp_publish)
        [m] = await _take(sub, 1)
    assert (str(m.topic), m.payload, m.qos) == (f"{topic}/k1/temp", b"from-amqp", 1)


@pytest.mark.parametrize("level, refused", [(4, 4), (5, 0x86)])
def test_MQ1_bad_password_is_refused_with_the_versions_code(gw: Any, level: int, refused: int) -> None:
    c = RawClient(gw.mqtt.port, level)
    assert c.connect("bad", password=b"nope").reason_code == refused
    assert c.recv() is None


def test_MQ1_vhost_colon_user_chooses_the_vhost(gw: Any, topic: str) -> None:
    sub = RawClient(gw.mqtt.port)
    assert sub.connect(f"{topic}-v", user="iot:guest").reason_code == 0
    sub.send(P.Subscribe(1, [(topic, 0)]))
    sub.recv()
    other = RawClient(gw.mqtt.port)
    other.connect(f"{topic}-o")  # vhost "/"
    other.send(P.Publish(topic, b"wrong vhost"))
    right = RawClient(gw.mqtt.port)
    right.connect(f"{topic}-r", user="iot:guest")
    right.send(P.Publish(topic, b"iot"))
    got = _next_publish(sub)
    assert got is not None and got.payload == b"iot"
    assert "iot" in gw.broker.vhosts and gw.broker.vhost("iot").queues.get(f"mqtt-subscription-{topic}-v")
    for c in (sub, other, right):
        c.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ6_publish_without_write_permission(gw: Any, level: int, topic: str) -> None:
    """W2 as RabbitMQ's plugin: publishing needs write on amq.topic; refused is PUBACK 0x87
    (MQTT 5) or a disconnect (3.1.1), never silence."""
    c = RawClient(gw.mqtt.port, level)
    assert c.connect(f"{topic}-w", user="reader", password=b"pw").reason_code == 0
    c.send(P.Subscribe(1, [(topic, 1)]))
    assert c.recv().reason_codes == [1]  # configure/write on its queue, read on amq.topic
    c.send(P.Publish(topic, b"x", 1, packet_id=3))
    answer = c.recv()
    if level == 5:
        assert isinstance(answer, P.Ack) and (answer.kind, answer.packet_id, answer.reason_code) == (P.PUBACK, 3, 0x87)
    else:
        assert answer is None


def test_MQ7_audit_records_say_mqtt(gw: Any, topic: str) -> None:
    c = RawClient(gw.mqtt.port)
    c.connect(f"{topic}-audit")
    c.send(P.Subscribe(1, [(topic, 1)]))
    c.recv()
    c.send(P.Publish(topic, b"audited", 1, packet_id=2))
    while not isinstance(got := c.recv(), P.Publish):
        pass
    c.send(P.Ack(P.PUBACK, got.packet_id))
    c.close()
    RawClient(gw.mqtt.port).connect(f"{topic}-x", password=b"wrong")
    queue = f"mqtt-subscription-{topic}-audit"
    want = {"connection_open", "connection_close", "auth_failure", "publish", "deliver", "ack"}
    deadline = time.monotonic() + 10
    seen: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and set(seen) != want:
        gw.audit.flush(5)
        for path in Path(gw.audit_dir).rglob("*audit-*.jsonl*"):
            for line in path.read_text().splitlines():
                r = json.loads(line)
                if r.get("protocol") == "mqtt" and (r.get("conn") == f"{topic}-audit" or r.get("queue") == queue
                                                    or r.get("routing_key") == topic or r["event"] == "auth_failure"):
                    seen[r["event"]] = r
        time.sleep(0.1)
    assert set(seen) == want
    assert seen["publish"]["topic"] == "amq.topic" and seen["deliver"]["msg_id"] == seen["publish"]["msg_id"]
    assert seen["ack"]["msg_id"] == seen["publish"]["msg_id"] and seen["publish"]["user"] == "guest"


def test_MQ1_management_lists_mqtt_connections(tmp_path: Path, topic: str) -> None:
    import requests

    with gateway_in_thread(port=0, hosts=("127.0.0.1",), mqtt_port=0, mqtt_host="127.0.0.1", management_port=0,
                           management_host="127.0.0.1") as g:
        mgmt = dict(g.operator_addresses())["management API"]
        c = RawClient(g.mqtt.port, 5)
        c.connect(f"{topic}-m")
        amqp = _pika(g)
        listed = requests.get(f"http://{mgmt}/api/connections", auth=("guest", "guest"), timeout=10).json()
        amqp.close()
        c.close()
    protocols = sorted(x["protocol"] for x in listed)
    assert protocols == ["AMQP 0-9-1", "MQTT 5-0"]
    mine = next(x for x in listed if x["protocol"] == "MQTT 5-0")
    assert mine["user"] == "guest" and mine["client_properties"]["client_id"] == f"{topic}-m"


def test_MQ5_keep_alive_one_and_a_half_intervals_then_will(port: int, topic: str) -> None:
    sub = RawClient(port, 5)
    sub.connect(f"{topic}-s")
    sub.send(P.Subscribe(1, [(f"{topic}/will", 0)]))
    sub.recv()
    quiet = RawClient(port, 5)
    quiet.connect(f"{topic}-quiet", keep_alive=1, will=P.Will(f"{topic}/will", b"silent", 0))
    started = time.monotonic()
    end = quiet.recv(timeout=15)  # nothing sent: the server ends it
    assert time.monotonic() - started >= 1.5
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


@pytest.mark.parametrize("level", [4, 5])
def test_MQ6_a_limit_breach_is_a_reason_code_or_a_disconnect(level: int, topic: str, tmp_path: Path) -> None:
    """L6 (the topic's MaximumMessageSize) refuses a too large PUBLISH: PUBACK 0x97 quota
    exceeded in MQTT 5, a disconnect in 3.1.1; never silence, and the session goes on (5)."""
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), mqtt_port=0, mqtt_host="127.0.0.1",
                           mqtt_max_packet_size=1 << 24) as g:
        limit = g.broker.vhost("/").exchange("amq.topic").max_message_size
        if limit > 1 << 23:
            pytest.skip(f"amq.topic has no CMQ size limit under this profile ({limit} bytes)")
        c = RawClient(g.mqtt.port, level)
        c.connect(f"{topic}-big")
        c.send(P.Publish(topic, b"x" * (limit + 1), 1, packet_id=5))
        answer = c.recv()
        if level == 5:
            assert isinstance(answer, P.Ack) and (answer.packet_id, answer.reason_code) == (5, 0x97)
            c.send(P.Publish(topic, b"small", 1, packet_id=6))
            assert (c.recv().packet_id, 0) == (6, 0)
        else:
            assert answer is None


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


@pytest.mark.parametrize("packet, code", [
    (P.Publish("", b"x", properties={"topic_alias": 1}), 0x94),
    (P.Publish("a/+/b", b"x"), 0x90)])
def test_MQ7_topic_alias_and_wildcard_topic_names_close_with_their_code(gw: Any, packet: P.Publish,
                                                                        code: int) -> None:
    c = RawClient(gw.mqtt.port, 5)
    c.connect("alias")
    c.send(packet)
    bye = c.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == code
    assert c.recv() is None


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


@pytest.mark.parametrize("level, refused", [(4, 0x80), (5, 0x87)])
def test_MQ1_subscribe_needs_read_on_amq_topic(gw: Any, level: int, refused: int, topic: str) -> None:
    """As RabbitMQ's plugin: a subscription is a queue.bind from amq.topic (read on the
    exchange, W2); refused, that filter's SUBACK code says so and the connection goes on."""
    c = RawClient(gw.mqtt.port, level)
    assert c.connect(f"{topic}-blind", user="blind", password=b"pw").reason_code == 0
    c.send(P.Subscribe(1, [(topic, 1)]))
    assert c.recv().reason_codes == [refused]
    c.send(P.Publish(topic, b"allowed", 1, packet_id=2))  # write on amq.topic it has
    ack = c.recv()
    assert isinstance(ack, P.Ack) and (ack.kind, ack.packet_id, ack.reason_code) == (P.PUBACK, 2, 0)
    c.close()


def test_MQ7_fuzzed_connections_never_disturb_another_client(gw: Any, topic: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Random bytes after a good CONNECT, over real sockets: each such connection is closed
    or answered, the gateway never fails, and a bystander keeps publishing and receiving."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    port = gw.mqtt.port
    bystander = RawClient(port, 5)
    bystander.connect(f"{topic}-by")
    bystander.send(P.Subscribe(1, [(topic, 1)]))
    bystander.recv()
    connect = P.encode(P.Connect(level=5, client_id="", username="guest", password=b"guest"), 5)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(min_size=1, max_size=200))
    def fuzz(garbage: bytes) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(connect + garbage)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            while s.recv(65536):
                pass  # the server closes it, whatever it made of the bytes

    fuzz()
    for i in range(3):
        bystander.send(P.Publish(topic, f"alive{i}".encode(), 1, packet_id=10 + i))
    payloads = []
    while len(payloads) < 3:
        p = bystander.recv()
        assert p is not None
        if isinstance(p, P.Publish):
            payloads.append(p.payload)
            bystander.send(P.Ack(P.PUBACK, p.packet_id))
    assert sorted(payloads) == [b"alive0", b"alive1", b"alive2"]
    bystander.close()
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]


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
