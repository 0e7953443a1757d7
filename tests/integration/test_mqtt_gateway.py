"""The gateway's own MQTT rules, which Mosquitto does not have (SPEC MQ1, MQ2, MQ6, MQ7):
AMQP and MQTT clients on the same topics (pika with paho-mqtt and aiomqtt), login and
permissions from the AMQP user DB, CMQ limits as reason codes, bad packets, the audit log and
the management API. The MQTT-defined behaviour, differential against Mosquitto, is in
test_mqtt.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway.mqtt import codec as P
from gateway.mqtt.session import queue_name
from gateway.server import gateway_in_thread
from tests.integration.mqtt_client import RawClient
from tests.integration.mqtt_fixtures import VERSIONS, gw_fixture, gw_store_fixture, topic_fixture  # noqa: F401
from tests.integration.mqtt_fixtures import client as _client
from tests.integration.mqtt_fixtures import next_publish as _next_publish
from tests.integration.mqtt_fixtures import take as _take


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
def test_MQ1_bad_password_is_refused_with_the_versions_code(gw_store: Any, level: int, refused: int) -> None:
    c = RawClient(gw_store.mqtt.port, level)
    assert c.connect("bad", password=b"nope").reason_code == refused
    assert c.recv() is None


@pytest.mark.parametrize("level, refused", [(4, 5), (5, 0x87)])
def test_MQ1_SE1_a_user_without_the_vhost_is_refused_at_connect(gw_store: Any, level: int, refused: int,
                                                                topic: str) -> None:
    """A user with no permission on the vhost is not authorized (3.1.1's 5, MQTT 5's 0x87), as
    RabbitMQ's plugin refuses it, and no session (queue) of it is made."""
    c = RawClient(gw_store.mqtt.port, level)
    assert c.connect(f"{topic}-nobody", user="nobody", password=b"pw", clean=False).reason_code == refused
    assert c.recv() is None
    assert queue_name("/", f"{topic}-nobody") not in gw_store.broker.vhost("/").queues


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
    assert "iot" in gw.broker.vhosts and gw.broker.vhost("iot").queues.get(queue_name("iot", f"{topic}-v"))
    for c in (sub, other, right):
        c.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ6_publish_without_write_permission(gw_store: Any, level: int, topic: str) -> None:
    """W2 as RabbitMQ's plugin: publishing needs write on amq.topic; refused is PUBACK 0x87
    (MQTT 5) or a disconnect (3.1.1), never silence."""
    c = RawClient(gw_store.mqtt.port, level)
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
    queue = queue_name("/", f"{topic}-audit")
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
        protocols = sorted(x["protocol"] for x in listed)
        assert protocols == ["AMQP 0-9-1", "MQTT 5.0"]
        mine = next(x for x in listed if x["protocol"] == "MQTT 5.0")
        assert mine["user"] == "guest" and mine["client_properties"]["client_id"] == f"{topic}-m"
        # Closed from the management API as an AMQP connection is: DISCONNECT 0x98
        # (administrative action) in MQTT 5.
        from urllib.parse import quote
        r = requests.delete(f"http://{mgmt}/api/connections/{quote(mine['name'], safe='')}",
                            auth=("guest", "guest"), timeout=10)
        assert r.status_code == 204
        bye = c.recv()
        assert isinstance(bye, P.Disconnect) and bye.reason_code == 0x98
        assert c.recv() is None


@pytest.mark.parametrize("level", [4, 5])
def test_MQ6_a_limit_breach_is_a_reason_code_or_a_disconnect(level: int, topic: str, tmp_path: Path) -> None:
    """In the cmq profile, L6 (the topic's MaximumMessageSize) refuses a too large PUBLISH: PUBACK 0x97 quota
    exceeded in MQTT 5, a disconnect in 3.1.1; never silence, and the session goes on (5)."""
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), mqtt_port=0, mqtt_host="127.0.0.1",
                           mqtt_max_packet_size=1 << 24, profile="cmq") as g:  # PF2: L6 refuses
        limit = g.broker.vhost("/").exchange("amq.topic").max_message_size
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


@pytest.mark.parametrize("packet, code", [
    (P.Publish("x", b"x", properties={"topic_alias": 17}), 0x94),  # above CONNACK's maximum, 16
    (P.Publish("a/+/b", b"x"), 0x90)])
def test_MQ7_topic_alias_and_wildcard_topic_names_close_with_their_code(gw: Any, packet: P.Publish,
                                                                        code: int) -> None:
    c = RawClient(gw.mqtt.port, 5)
    c.connect("alias")
    c.send(packet)
    bye = c.recv()
    assert isinstance(bye, P.Disconnect) and bye.reason_code == code
    assert c.recv() is None


@pytest.mark.parametrize("level, refused", [(4, 0x80), (5, 0x87)])
def test_MQ1_subscribe_needs_read_on_amq_topic(gw_store: Any, level: int, refused: int, topic: str) -> None:
    """As RabbitMQ's plugin: a subscription is a queue.bind from amq.topic (read on the
    exchange, W2); refused, that filter's SUBACK code says so and the connection goes on."""
    c = RawClient(gw_store.mqtt.port, level)
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



@pytest.mark.parametrize("level, refused", [(4, 0x80), (5, 0x97)])
def test_MQ6_filters_beyond_L4_binding_keys_are_refused_in_suback(level: int, refused: int, topic: str) -> None:
    """In the cmq profile (PF2) a session's filters are the binding keys of one subscription
    (amq.topic -> its queue), at most MAX_BINDING_KEYS (L4): the filters beyond are refused in
    the SUBACK (0x97 quota exceeded in MQTT 5), the others work. A difference from Mosquitto
    and RabbitMQ."""
    from semantics.limits import MAX_BINDING_KEYS

    with gateway_in_thread(port=0, hosts=("127.0.0.1",), mqtt_port=0, mqtt_host="127.0.0.1", profile="cmq") as g:
        c = RawClient(g.mqtt.port, level)
        c.connect(f"{topic}-many")
        n = MAX_BINDING_KEYS + 2
        c.send(P.Subscribe(1, [(f"{topic}/{i}/#", 1) for i in range(n)]))
        assert c.recv().reason_codes == [1] * MAX_BINDING_KEYS + [refused] * 2
        c.send(P.Publish(f"{topic}/0/x", b"first filter works", 1, packet_id=2))
        got = _next_publish(c)
        assert got is not None and got.payload == b"first filter works"
        c.close()


@pytest.mark.parametrize("level", [4, 5])
def test_PF4_filters_beyond_L4_pass_and_are_reported_in_compatible(gw: Any, level: int, topic: str) -> None:
    """PF3/PF4: in the compatible profile (the default) every filter is granted, as Mosquitto
    and RabbitMQ grant them, and the binding keys past CMQ's five are reported (L4)."""
    from semantics.limits import MAX_BINDING_KEYS

    c = RawClient(gw.mqtt.port, level)
    c.connect(f"{topic}-many{level}")
    n = MAX_BINDING_KEYS + 2
    c.send(P.Subscribe(1, [(f"{topic}/{i}/#", 1) for i in range(n)]))
    assert c.recv().reason_codes == [1] * n
    c.send(P.Publish(f"{topic}/{n - 1}/x", b"last filter works", 1, packet_id=2))
    got = _next_publish(c)
    assert got is not None and got.payload == b"last filter works"
    c.close()
    entries = [e for e in gw.broker.limit_report.by_rule("/").get("L4", {}).get("entries", [])
               if e["object"].startswith("binding:amq.topic->") and e["worst_value"] > MAX_BINDING_KEYS]
    assert entries, gw.broker.limit_report.by_rule("/")
