"""Flow control on MQTT (issue 31): a publisher faster than its subscriber is slowed, not
acknowledged into a backlog without bound (W5's back-pressure per destination, as RabbitMQ's
credit flow), and nothing is lost (MQ4: each QoS 1 message PUBACKed and delivered).

A real paho publisher with up to WINDOW QoS 1 messages unacknowledged and a subscriber that takes
nothing for a while (a raw socket that does not read: the gateway sends its 100 in flight and
keeps the rest in its session queue). Before flow control the gateway acknowledged the whole
stream into that queue."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gateway.mqtt import codec as P
from gateway.mqtt.session import BACKLOG_HIGH, queue_name
from tests.integration.mqtt_client import RawClient
from tests.integration.mqtt_fixtures import gw_fixture  # noqa: F401

COUNT = BACKLOG_HIGH * 3
# What a publisher may add after the check that stops it: the packets read before it (one
# publisher's window) and what one turn handles.
SLACK = 4096
WAIT = 60  # seconds before the test calls a message lost (not a speed)
# QoS 1 PUBLISHes the publisher keeps unacknowledged. paho looks through every message it
# holds at each PUBACK: with thousands in flight the client, not the gateway, sets the rate.
WINDOW = 100


class Publisher:
    """paho, sending the next PUBLISH from each PUBACK's callback: WINDOW in flight."""

    def __init__(self, port: int, topic: str, count: int) -> None:
        self.topic, self.count, self.sent = topic, count, 0
        self.acks: list[int] = []
        self.payload = b"x" * 64
        c = self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"flow-pub-{uuid.uuid4().hex[:8]}",
                                      protocol=MQTTProtocolVersion.MQTTv311)
        c.username_pw_set("guest", "guest")
        c.max_inflight_messages_set(WINDOW)
        c.on_publish = self._acked
        c.connect("127.0.0.1", port, keepalive=600)
        c.loop_start()

    def start(self) -> None:
        for _ in range(WINDOW):
            self._next()

    def _next(self) -> None:
        if self.sent < self.count:
            self.sent += 1
            self.client.publish(self.topic, self.payload, qos=1)

    def _acked(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        self.acks.append(mid)
        self._next()

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _wait(cond: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def test_MQ4_W5_publisher_faster_than_its_subscriber_is_slowed_and_nothing_is_lost(gw: Any) -> None:
    topic = f"flow/{uuid.uuid4().hex[:10]}"
    sub_id = f"flow-sub-{uuid.uuid4().hex[:8]}"
    sub = RawClient(gw.mqtt.port, level=4)
    sub.connect(sub_id)
    sub.send(P.Subscribe(1, [(topic, 1)]))
    assert isinstance(sub.recv(), P.SubAck)
    queue = gw.broker.vhost("/").queues[queue_name("/", sub_id)]
    pub = Publisher(gw.mqtt.port, topic, COUNT)
    acks = pub.acks
    try:
        pub.start()
        # The subscriber reads nothing: its queue grows to the mark, and the publisher stops there.
        assert _wait(lambda: queue.cmq.active > BACKLOG_HIGH, WAIT), queue.cmq.active
        peak, settled = 0, 0
        end = time.monotonic() + 2
        while time.monotonic() < end:
            peak = max(peak, queue.cmq.active)
            settled = len(acks)
            time.sleep(0.01)
        assert peak <= BACKLOG_HIGH + SLACK, f"undelivered grew to {peak}"
        assert settled < COUNT - BACKLOG_HIGH, f"{settled} of {COUNT} PUBACKed while the subscriber took nothing"
        time.sleep(0.5)
        assert len(acks) - settled <= WINDOW, "the held publisher kept being acknowledged"
        # The subscriber takes its messages: the publisher is read again, and every message
        # comes through once, PUBACKed to the publisher (MQ4).
        got = 0
        end = time.monotonic() + WAIT
        while got < COUNT and time.monotonic() < end:
            p = sub.recv(timeout=WAIT)
            assert p is not None, "the gateway closed the subscriber"
            if type(p) is P.Publish:
                got += 1
                sub.send_raw(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
                peak = max(peak, queue.cmq.active)
        assert got == COUNT
        assert _wait(lambda: len(acks) == COUNT, WAIT), f"{len(acks)} of {COUNT} PUBACKed"
        assert peak <= BACKLOG_HIGH + SLACK, f"undelivered grew to {peak}"
    finally:
        pub.stop()
        sub.close()


class _Peer:
    """A raw client that floods QoS 1 PUBLISHes to ``to`` from one thread while another reads
    its own subscription's deliveries and PUBACKs each, as a device that both sends and
    receives does."""

    def __init__(self, port: int, name: str, own: str, to: str, count: int) -> None:
        self.c = RawClient(port, level=4)
        self.c.connect(name, keep_alive=600)
        self.c.send(P.Subscribe(1, [(own, 1)]))
        assert isinstance(self.c.recv(), P.SubAck)
        self.to, self.count = to, count
        self.got = self.acked = 0
        self.lock = threading.Lock()

    def _send(self, data: bytes) -> None:
        with self.lock:
            self.c.send_raw(data)

    def flood(self) -> None:
        head = P.encode(P.Publish(self.to, b"y" * 32, 1, packet_id=1), 4)
        cut = len(head) - 32 - 2  # the packet identifier's offset
        for i in range(self.count):
            pid = i + 1
            self._send(head[:cut] + bytes((pid >> 8, pid & 0xFF)) + head[cut + 2:])

    def read(self) -> None:
        while self.got < self.count or self.acked < self.count:
            p = self.c.recv(timeout=WAIT)
            if p is None:
                return
            if type(p) is P.Publish:
                self.got += 1
                self._send(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
            elif type(p) is P.Ack:
                self.acked += 1


def test_MQ4_W5_two_clients_flooding_each_other_are_not_held_forever(gw: Any) -> None:
    """Each publishes to the other's subscription faster than the other takes it in, and each
    has deliveries in flight whose PUBACKs are behind its own PUBLISHes: a client with
    deliveries in flight is not held by flow control, or neither would be read again."""
    tag = uuid.uuid4().hex[:8]
    a_topic, b_topic = f"peer/{tag}/a", f"peer/{tag}/b"
    a = _Peer(gw.mqtt.port, f"peer-a-{tag}", a_topic, b_topic, COUNT)
    b = _Peer(gw.mqtt.port, f"peer-b-{tag}", b_topic, a_topic, COUNT)
    threads = [threading.Thread(target=f, daemon=True) for p in (a, b) for f in (p.flood, p.read)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 2)
        assert (a.got, b.got, a.acked, b.acked) == (COUNT,) * 4
    finally:
        for p in (a, b):
            p.c.sock.close()
