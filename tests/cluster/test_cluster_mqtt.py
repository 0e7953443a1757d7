"""CL1 for MQTT: several gateways on one JetStream store are one MQTT broker (MQ1, MQ3-MQ6).

Gateway processes (``serve --store nats://... --mqtt-port``) on the session's three-node
NATS cluster; devices are paho-mqtt clients, and the gateway's own codec on a raw socket
(tests/integration/mqtt_client.py) where a test must see exact reason codes or hold back a
PUBACK. A device that comes back through another gateway finds its persistent session (its
subscriptions and the QoS 1 messages published while it was away), retained messages are
the same through every gateway, a second connection of a client id through another gateway
takes the session over, and a device without rights is refused by every gateway.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gateway.mqtt import codec as P
from tests.cluster.mqtt_gateways import Device, MQTTGateway
from tests.integration.mqtt_client import RawClient
from tests.support.amqp_checks import eventually
from tests.support.natsd import NatsCluster
from tests.support.natsd_fixtures import *  # noqa: F401,F403

SEEN_WITHIN = 10.0  # a record written through one gateway reaches the others (a KV watch)
# JetStream redelivers what a killed gateway had delivered after the queue's visibility
# timeout (30 s by default) plus one second (docs/CLUSTER.md, "Visibility timeout").
REDELIVERED_WITHIN = 60.0


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def two(nats_cluster: NatsCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MQTTGateway]]:
    """Two gateways with MQTT on the session's NATS cluster, for tests that kill neither."""
    root = tmp_path_factory.mktemp("mqtt-gateways")
    gws = [MQTTGateway(root, f"gw{i + 1}", nats_cluster.store_url) for i in range(2)]
    try:
        for g in gws:
            g.start()
        yield gws
    finally:
        for g in gws:
            g.stop()


def raw_connect(port: int, client_id: str, level: int = 5, **kw: object) -> tuple[RawClient, P.ConnAck]:
    c = RawClient(port, level)
    return c, c.connect(client_id, **kw)  # type: ignore[arg-type]


def raw_subscribe(c: RawClient, topic_filter: str, qos: int = 1) -> None:
    c.send(P.Subscribe(1, [(topic_filter, qos)]))
    ack = c.recv()
    assert isinstance(ack, P.SubAck) and ack.reason_codes == [qos], ack


def next_publish(c: RawClient, timeout: float = 10.0) -> P.Publish | None:
    """The next PUBLISH to ``c`` (None: none within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            p = c.recv(timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            return None
        if isinstance(p, P.Publish):
            return p
    return None


@pytest.mark.parametrize("level", [4, 5])
def test_MQ3_CL1_persistent_session_resumed_through_another_gateway_with_its_qos1_backlog(
        two: list[MQTTGateway], level: int) -> None:
    """A persistent session (3.1.1 clean session 0; MQTT 5 session expiry) made through gw1
    is resumed through gw2: session present, its subscription kept (no SUBSCRIBE again), and
    every QoS 1 message published while it was away delivered, in order."""
    gw1, gw2 = two
    client_id, topic = f"dev-{uid()}", f"cmd/{uid()}"
    expiry = 600 if level == 5 else None
    dev = Device(gw1.mqtt_port, client_id, clean=False, level=level, expiry=expiry)
    assert dev.connect() == (False, 0)
    assert dev.subscribe(topic + "/#", 1) == [1]
    dev.close()
    sent = [b"m%02d" % i for i in range(20)]
    pub = Device(gw1.mqtt_port, f"pub-{uid()}")
    pub.connect()
    for body in sent:
        pub.publish(f"{topic}/x", body, qos=1)  # PUBACK: in the session queue's stream (MQ4)
    pub.close()

    back = Device(gw2.mqtt_port, client_id, clean=False, level=level, expiry=expiry)
    try:
        assert back.connect() == (True, 0)  # the session made through gw1
        got = back.take(len(sent))
        assert [m.payload for m in got] == sent
        assert {m.qos for m in got} == {1} and {m.topic for m in got} == {f"{topic}/x"}
        # Its subscription is the same one: a publish through gw2 now reaches it too.
        live = Device(gw2.mqtt_port, f"pub-{uid()}")
        live.connect()
        live.publish(f"{topic}/y", b"live", qos=1)
        live.close()
        assert [m.payload for m in back.take(1)] == [b"live"]
    finally:
        back.close()


def test_MQ3_CL1_clean_start_through_another_gateway_discards_the_session(two: list[MQTTGateway]) -> None:
    """A clean session through gw2 ends the persistent one made through gw1 (MQ3): no
    session present, nothing of its backlog (its first message is the one published after
    its own SUBACK), and a later resume finds nothing either."""
    gw1, gw2 = two
    client_id, topic = f"dev-{uid()}", f"cmd/{uid()}"
    dev = Device(gw1.mqtt_port, client_id, clean=False)
    dev.connect()
    dev.subscribe(topic, 1)
    dev.close()
    pub = Device(gw1.mqtt_port, f"pub-{uid()}")
    pub.connect()
    pub.publish(topic, b"old", qos=1)
    pub.close()
    clean = Device(gw2.mqtt_port, client_id, clean=True)
    assert clean.connect() == (False, 0)
    # Its new queue has the old one's name: made once the old one's stream is gone.
    assert clean.subscribe(topic, 1) == [1]
    clean.publish(topic, b"new", qos=1)
    assert [m.payload for m in clean.take(1)] == [b"new"]
    clean.close()
    again = Device(gw1.mqtt_port, client_id, clean=False)
    try:
        assert again.connect() == (False, 0)
        time.sleep(1)
        assert again.messages.empty(), [m.payload for m in again.messages.queue]
    finally:
        again.close()


def test_MQ5_CL1_retained_message_is_the_same_through_every_gateway(two: list[MQTTGateway]) -> None:
    """Retained through gw1, received by a new subscriber on gw2; replaced through gw2, the
    new one received on gw1 (whose own copy was read before); cleared through gw1, gone on
    gw2."""
    gw1, gw2 = two
    topic = f"state/{uid()}"

    def first_on_subscribe(port: int) -> bytes:
        """The first message a new subscriber to ``topic`` gets: the retained one, or the
        marker published right after the SUBACK when there is none."""
        sub = Device(port, f"sub-{uid()}")
        sub.connect()
        try:
            sub.subscribe(topic, 1)
            sub.publish(topic, b"marker", qos=1)
            m = sub.take(1)[0]
            return m.payload if m.retain or m.payload == b"marker" else b"?" + m.payload
        finally:
            sub.close()

    a = Device(gw1.mqtt_port, f"pub-{uid()}")
    a.connect()
    b = Device(gw2.mqtt_port, f"pub-{uid()}")
    b.connect()
    try:
        a.publish(topic, b"v1", qos=1, retain=True)  # PUBACK once the record is in the bucket
        assert first_on_subscribe(gw2.mqtt_port) == b"v1"
        assert first_on_subscribe(gw1.mqtt_port) == b"v1"  # gw1 has read its retained messages now
        b.publish(topic, b"v2", qos=1, retain=True)
        assert eventually(lambda: first_on_subscribe(gw1.mqtt_port) == b"v2", SEEN_WITHIN,
                          what="the retained message replaced through gw2 reaches gw1")
        a.publish(topic, b"", qos=1, retain=True)  # an empty retained payload clears it
        assert eventually(lambda: first_on_subscribe(gw2.mqtt_port) == b"marker", SEEN_WITHIN,
                          what="the retained message cleared through gw1 is gone on gw2")
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ5_CL1_same_client_id_through_another_gateway_takes_the_session_over(
        two: list[MQTTGateway], level: int) -> None:
    """MQTT-3.1.4-2 across gateways: connecting through gw2 with the client id of a live
    connection on gw1 closes that one (MQTT 5: DISCONNECT 0x8E, session taken over) and the
    session's messages go to the new connection only."""
    gw1, gw2 = two
    client_id, topic = f"dev-{uid()}", f"cmd/{uid()}"
    expiry = {"session_expiry": 600} if level == 5 else {}
    old, ack = raw_connect(gw1.mqtt_port, client_id, level, clean=False, **expiry)
    assert ack.reason_code == 0
    raw_subscribe(old, topic)
    new, ack = raw_connect(gw2.mqtt_port, client_id, level, clean=False, **expiry)
    try:
        assert ack.reason_code == 0 and ack.session_present
        last = old.recv(timeout=SEEN_WITHIN)
        if level == 5:
            assert isinstance(last, P.Disconnect) and last.reason_code == 0x8E, last
            last = old.recv(timeout=SEEN_WITHIN)
        assert last is None  # closed by gw1
        pub = Device(gw1.mqtt_port, f"pub-{uid()}")
        pub.connect()
        pub.publish(topic, b"after", qos=1)
        pub.close()
        m = new.recv(timeout=30)
        assert isinstance(m, P.Publish) and m.payload == b"after" and m.qos == 1, m
        new.send(P.Ack(P.PUBACK, m.packet_id))
    finally:
        old.sock.close()
        new.close()


def test_MQ5_CL1_clean_session_taken_over_through_another_gateway(two: list[MQTTGateway]) -> None:
    """A clean session's queue is exclusive to its connection: the connection through gw2
    that takes it over subscribes at once (its queue is not found locked by gw1's)."""
    gw1, gw2 = two
    client_id, topic = f"dev-{uid()}", f"cmd/{uid()}"
    old, ack = raw_connect(gw1.mqtt_port, client_id, 4, clean=True)
    raw_subscribe(old, topic)
    new, ack = raw_connect(gw2.mqtt_port, client_id, 4, clean=True)
    try:
        assert ack.reason_code == 0 and not ack.session_present
        assert old.recv(timeout=SEEN_WITHIN) is None
        raw_subscribe(new, topic)
        pub = Device(gw2.mqtt_port, f"pub-{uid()}")
        pub.connect()
        pub.publish(topic, b"to-new", qos=1)
        pub.close()
        m = new.recv(timeout=30)
        assert isinstance(m, P.Publish) and m.payload == b"to-new", m
    finally:
        old.sock.close()
        new.close()


def test_MQ3_MQ6_CL1_session_of_a_killed_gateway_resumed_through_another(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """gw1 is killed (SIGKILL) while a persistent session is connected through it with one
    QoS 1 delivery not yet acknowledged. Through gw2 the device resumes the session, gets what
    was published while it was away at once, and the unacknowledged one again, DUP set, after
    the queue's visibility timeout (MQ6; JetStream's ack_wait, since gw1 is gone). A device
    with a clean session on gw1 connects through gw2 at once and subscribes again (MQ3)."""
    gw1 = MQTTGateway(tmp_path, "gw1", nats_cluster.store_url).start()
    gw2 = MQTTGateway(tmp_path, "gw2", nats_cluster.store_url).start()
    try:
        client_id, topic = f"dev-{uid()}", f"cmd/{uid()}"
        dev, ack = raw_connect(gw1.mqtt_port, client_id, 4, clean=False)
        raw_subscribe(dev, topic)
        # And a clean session, whose queue is exclusive to its connection on gw1.
        clean_id = f"clean-{uid()}"
        other, ack = raw_connect(gw1.mqtt_port, clean_id, 4, clean=True)
        raw_subscribe(other, topic)
        pub = Device(gw2.mqtt_port, f"pub-{uid()}")
        pub.connect()
        pub.publish(topic, b"in-flight", qos=1)
        m = dev.recv(timeout=30)
        assert isinstance(m, P.Publish) and m.payload == b"in-flight", m  # and no PUBACK
        gw1.kill9()
        dev.sock.close()
        other.sock.close()
        # Back at once through gw2, before gw2 can know gw1 is dead: the queue gw1's connection
        # held exclusively is not found locked (the new connection takes the client id over).
        other, ack = raw_connect(gw2.mqtt_port, clean_id, 4, clean=True)
        assert ack.reason_code == 0 and not ack.session_present
        raw_subscribe(other, topic)
        sent = [b"away%02d" % i for i in range(10)]
        for body in sent:
            pub.publish(topic, body, qos=1)
        pub.close()

        back, ack = raw_connect(gw2.mqtt_port, client_id, 4, clean=False)
        try:
            assert ack.reason_code == 0 and ack.session_present
            got: list[P.Publish] = []
            deadline = time.monotonic() + REDELIVERED_WITHIN
            while len(got) < len(sent) + 1 and time.monotonic() < deadline:
                m = back.recv(timeout=max(0.1, deadline - time.monotonic()))
                assert isinstance(m, P.Publish), m
                back.send(P.Ack(P.PUBACK, m.packet_id))
                got.append(m)
            bodies = [m.payload for m in got]
            assert bodies[:len(sent)] == sent  # the backlog at once, in order
            assert bodies[len(sent):] == [b"in-flight"]  # gw1's delivery, once its lease ran out
            assert got[-1].dup
            # The clean session through gw2 got what was published after its SUBACK.
            fresh = [next_publish(other, timeout=30) for _ in sent]
            assert [m.payload for m in fresh if m is not None] == sent
        finally:
            back.close()
            other.close()
    finally:
        gw1.kill9()
        gw2.stop()


def test_MQ1_SE1_CL1_device_without_rights_is_refused_through_every_gateway(two: list[MQTTGateway]) -> None:
    """Users and permissions are the broker's (MQ1), made through one gateway's management
    API (SE1: an administrator's) and enforced by every gateway: a user without access to the
    vhost is refused at CONNECT, one without write rights on amq.topic cannot publish, a
    wrong password is refused, and a deleted user can no longer connect anywhere."""
    gw1, gw2 = two
    api = gw1.management_url
    reader, nobody = f"reader-{uid()}", f"nobody-{uid()}"
    for user in (reader, nobody):
        r = requests.put(f"{api}/api/users/{user}", json={"password": "pw", "tags": ""}, auth=("guest", "guest"),
                         timeout=30)
        assert r.status_code in (201, 204), r.text
    r = requests.put(f"{api}/api/permissions/%2F/{reader}", auth=("guest", "guest"), timeout=30,
                     json={"configure": "^mqtt-subscription-.*", "write": "^mqtt-subscription-.*", "read": ".*"})
    assert r.status_code in (201, 204), r.text

    def connack(port: int, user: str, password: str) -> int:
        c = RawClient(port, 4)
        try:
            return c.connect(f"d-{uid()}", user=user, password=password.encode()).reason_code
        finally:
            c.sock.close()

    for gw in (gw1, gw2):
        assert eventually(lambda gw=gw: connack(gw.mqtt_port, reader, "pw") == 0, SEEN_WITHIN,
                          what=f"the new user reaches {gw.name}")
        assert connack(gw.mqtt_port, nobody, "pw") == 5  # not authorized: no access to the vhost
        assert connack(gw.mqtt_port, reader, "wrong") == 4  # bad user name or password
        # Subscribing is within its rights, publishing on amq.topic is not: 3.1.1 disconnects.
        c = RawClient(gw.mqtt_port, 4)
        assert c.connect(f"d-{uid()}", user=reader, password=b"pw").reason_code == 0
        raw_subscribe(c, f"x/{uid()}")
        c.send(P.Publish(f"x/{uid()}", b"no", qos=1, packet_id=7))
        assert c.recv(timeout=30) is None  # closed, never a PUBACK
        c.sock.close()
    r = requests.delete(f"{api}/api/users/{reader}", auth=("guest", "guest"), timeout=30)
    assert r.status_code == 204, r.text
    assert eventually(lambda: connack(gw2.mqtt_port, reader, "pw") == 4, SEEN_WITHIN,
                      what="the user deleted through gw1 is refused by gw2")


def test_MQ3_CL1_shared_subscription_outlives_a_member_leaving_through_another_gateway(
        two: list[MQTTGateway]) -> None:
    """MQTT 5 shared subscription ($share/<group>/<filter>) with one member on each gateway:
    the member on gw1 leaves (a clean session ends), the group's queue stays for the member on
    gw2, which gets every message published after."""
    gw1, gw2 = two
    topic, group = f"jobs/{uid()}", f"g{uid()}"
    m1 = Device(gw1.mqtt_port, f"m1-{uid()}", level=5)
    m2 = Device(gw2.mqtt_port, f"m2-{uid()}", level=5)
    m1.connect()
    m2.connect()
    try:
        assert m1.subscribe(f"$share/{group}/{topic}", 1) == [1]
        assert m2.subscribe(f"$share/{group}/{topic}", 1) == [1]
        time.sleep(3)  # each gateway's consumers reach the other through the presence bucket
        m1.close()
        time.sleep(2)
        pub = Device(gw1.mqtt_port, f"pub-{uid()}")
        pub.connect()
        sent = [b"j%d" % i for i in range(5)]
        for body in sent:
            pub.publish(topic, body, qos=1)
        pub.close()
        assert sorted(m.payload for m in m2.take(len(sent))) == sent
    finally:
        m2.close()


def test_MQ5_CL1_delayed_will_of_a_session_resumed_through_another_gateway_is_not_sent(
        two: list[MQTTGateway]) -> None:
    """MQTT 5 will delay across gateways: a client gone from gw1 and back through gw2 within
    the delay resumes its session and no will goes out (MQTT-3.1.3-9); one back through gw2
    with a clean start ends the old session, and its will goes out at once."""
    gw1, gw2 = two
    topic = f"wills/{uid()}"
    sub = RawClient(gw2.mqtt_port, 5)
    sub.connect(f"s-{uid()}")
    raw_subscribe(sub, f"{topic}/#", 0)
    kept, ended = f"kept-{uid()}", f"ended-{uid()}"
    # The ended one's delay is far longer than the test: its will can only come from the end.
    for client_id, delay in ((kept, 4), (ended, 3600)):
        c = RawClient(gw1.mqtt_port, 5)
        c.connect(client_id, clean=False, session_expiry=7200,
                  will=P.Will(f"{topic}/{client_id}", b"will", 0, properties={"will_delay": delay}))
        c.drop()
    back = RawClient(gw2.mqtt_port, 5)
    assert back.connect(kept, clean=False, session_expiry=7200).session_present
    fresh = RawClient(gw2.mqtt_port, 5)
    assert not fresh.connect(ended, clean=True).session_present
    got = next_publish(sub, timeout=30)
    assert got is not None and got.topic == f"{topic}/{ended}", got
    time.sleep(6)  # past the will delay: had the kept session's will been left, it went out now
    back.send(P.Publish(f"{topic}/marker", b"m"))
    got = next_publish(sub)
    assert got is not None and got.topic == f"{topic}/marker", got
    for c in (back, fresh, sub):
        c.close()


def _record_routed_without_message(urls: list[str], client_id: str, pid: int) -> None:
    """What a gateway killed between its two writes leaves on JetStream: the session record
    says QoS 2 identifier ``pid`` was routed (under a message ID of its own), and no stream got
    the message."""
    import asyncio
    import json

    import nats

    from gateway.mqtt.session import session_key
    from semantics.jetstream.names import META_BUCKET, kv_key

    async def edit() -> None:
        nc = await nats.connect(servers=urls)
        try:
            kv = await nc.jetstream().key_value(META_BUCKET)
            key = kv_key(session_key("/", client_id))
            record = json.loads((await kv.get(key)).value)
            record["inbound_qos2"] = sorted({*record["inbound_qos2"], pid})
            record.setdefault("inbound_ids", {})[str(pid)] = [f"msg-{uuid.uuid4().hex}"]
            await kv.put(key, json.dumps(record).encode())
        finally:
            await nc.close()

    asyncio.run(edit())


def test_MQ4_MQ8_CL1_qos2_resends_after_a_kill_are_stored_once_whether_or_not_the_message_was(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """The incoming half of exactly-once on JetStream, where the session record and the
    message are writes to two streams. A gateway is killed after a QoS 2 PUBLISH was stored
    and answered (PUBREC, no PUBREL yet), and the record of a second identifier says it was
    routed though its message never reached a stream. Through the restarted gateway the
    client resends both (DUP): the first is not delivered twice, the second is not lost
    (before: taken for a duplicate because the record said so, 42 messages lost in one of 31
    crash trials)."""
    gw = MQTTGateway(tmp_path, "gw1", nats_cluster.store_url).start()
    try:
        sub_id, pub_id, topic = f"sub-{uid()}", f"pub-{uid()}", f"mq8/{uid()}"
        sub, _ = raw_connect(gw.mqtt_port, sub_id, 4, clean=False)
        raw_subscribe(sub, topic, 2)
        sub.close()
        pub, _ = raw_connect(gw.mqtt_port, pub_id, 4, clean=False)
        pub.send(P.Publish(topic, b"stored", 2, packet_id=9))
        assert (lambda r: (r.kind, r.packet_id))(pub.recv(timeout=30)) == (P.PUBREC, 9)
        gw.kill9()
        pub.sock.close()
        _record_routed_without_message(nats_cluster.urls, pub_id, 10)
        gw.start()
        pub, ack = raw_connect(gw.mqtt_port, pub_id, 4, clean=False)
        assert ack.session_present
        for pid, body in ((9, b"stored"), (10, b"lost")):
            pub.send(P.Publish(topic, body, 2, dup=True, packet_id=pid))
            assert (lambda r: (r.kind, r.packet_id))(pub.recv(timeout=30)) == (P.PUBREC, pid)
            pub.send(P.Ack(P.PUBREL, pid))
            assert (lambda r: (r.kind, r.packet_id))(pub.recv(timeout=30)) == (P.PUBCOMP, pid)
        pub.send(P.Publish(topic, b"marker", 2, packet_id=11))
        assert pub.recv(timeout=30).kind == P.PUBREC
        pub.close()
        sub, ack = raw_connect(gw.mqtt_port, sub_id, 4, clean=False)
        got: list[bytes] = []
        while not got or got[-1] != b"marker":
            m = next_publish(sub, timeout=30)
            assert m is not None, got
            got.append(m.payload)
            sub.send(P.Ack(P.PUBREC, m.packet_id))
        sub.close()
        assert got == [b"stored", b"lost", b"marker"]
    finally:
        gw.stop()
