"""Flow control at the widest in-flight window (issue 31 aim 2: "at any in-flight window from
100 to 65,535"). test_mqtt_flow.py holds a paho publisher with 100 unacknowledged; here a raw
publisher writes its whole stream without waiting for one PUBACK (every message in flight at
once, the most a 65,535 window allows of this stream), while its subscriber takes nothing.

W5 / MQ4: the gateway reads the publisher only while the subscriber's queue is under the mark,
so the undelivered stay bounded and the PUBACKs stop (the rest of the stream waits unread in
the publisher's socket); once the subscriber reads, every message comes through once and is
PUBACKed once."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from gateway.mqtt import codec as P
from gateway.mqtt.session import BACKLOG_HIGH, DEFAULT_INFLIGHT, queue_name
from tests.integration.mqtt_client import RawClient
from tests.integration.mqtt_fixtures import gw_fixture  # noqa: F401
from tests.integration.test_mqtt_flow import SLACK, WAIT, _wait

COUNT = BACKLOG_HIGH * 3  # all of it unacknowledged at once: under the 65,535 identifiers


class FloodingPublisher:
    """Writes COUNT QoS 1 PUBLISHes back to back (packet ids 1..COUNT, none reused) from one
    thread; another counts the PUBACKs, each identifier once."""

    def __init__(self, port: int, topic: str) -> None:
        self.c = RawClient(port, level=4)
        self.c.connect(f"flood-pub-{uuid.uuid4().hex[:8]}", keep_alive=600)
        self.topic = topic
        self.acked: set[int] = set()
        self.duplicate_acks = 0
        self.sent = 0
        self._stop = False

    def flood(self) -> None:
        head = P.encode(P.Publish(self.topic, b"z" * 64, 1, packet_id=1), 4)
        prefix = head[:len(head) - 64 - 2]  # up to the packet identifier
        batch: list[bytes] = []
        for pid in range(1, COUNT + 1):
            # The payload names the message: each must arrive once.
            batch.append(prefix + bytes((pid >> 8, pid & 0xFF)) + pid.to_bytes(8, "big") + b"z" * 56)
            if len(batch) == 256 or pid == COUNT:
                try:
                    self.c.send_raw(b"".join(batch))  # blocks while the gateway does not read
                except OSError:
                    return
                self.sent = pid
                batch = []
                if self._stop:
                    return

    def read(self) -> None:
        while len(self.acked) < COUNT and not self._stop:
            try:
                p = self.c.recv(timeout=WAIT)
            except OSError:  # a timeout too
                return
            if p is None:
                return
            if type(p) is P.Ack and p.kind == P.PUBACK:
                if p.packet_id in self.acked:
                    self.duplicate_acks += 1
                self.acked.add(p.packet_id)

    def stop(self) -> None:
        self._stop = True
        self.c.close()


def test_MQ4_W5_a_whole_window_unacknowledged_is_slowed_and_nothing_is_lost(gw: Any) -> None:
    topic = f"flow/{uuid.uuid4().hex[:10]}"
    sub_id = f"flow-sub-{uuid.uuid4().hex[:8]}"
    sub = RawClient(gw.mqtt.port, level=4)
    sub.connect(sub_id, keep_alive=600)
    sub.send(P.Subscribe(1, [(topic, 1)]))
    assert isinstance(sub.recv(), P.SubAck)
    queue = gw.broker.vhost("/").queues[queue_name("/", sub_id)]
    pub = FloodingPublisher(gw.mqtt.port, topic)
    threads = [threading.Thread(target=pub.flood, daemon=True), threading.Thread(target=pub.read, daemon=True)]
    try:
        for t in threads:
            t.start()
        # The subscriber reads nothing: the gateway sends it its DEFAULT_INFLIGHT and queues the
        # rest up to the mark, where the publisher stops being read.
        assert _wait(lambda: queue.cmq.active > BACKLOG_HIGH, WAIT), queue.cmq.active
        peak, acked = 0, 0
        end = time.monotonic() + 2
        while time.monotonic() < end:
            peak = max(peak, queue.cmq.active)
            acked = len(pub.acked)
            time.sleep(0.01)
        assert peak <= BACKLOG_HIGH + SLACK, f"undelivered grew to {peak}"
        # Acknowledged: what is queued or in flight to the subscriber, nothing beyond it.
        assert acked <= BACKLOG_HIGH + SLACK + DEFAULT_INFLIGHT, f"{acked} of {COUNT} PUBACKed, nothing delivered"
        time.sleep(0.5)
        assert len(pub.acked) == acked, "the held publisher kept being acknowledged"
        got: set[int] = set()
        payloads = 0  # deliveries, duplicates counted
        end = time.monotonic() + WAIT
        while payloads < COUNT and time.monotonic() < end:
            p = sub.recv(timeout=WAIT)
            assert p is not None, "the gateway closed the subscriber"
            if type(p) is P.Publish:
                payloads += 1
                got.add(int.from_bytes(p.payload[:8], "big"))
                sub.send_raw(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
                peak = max(peak, queue.cmq.active)
        assert payloads == COUNT and got == set(range(1, COUNT + 1)), f"{len(got)} of {COUNT} in {payloads}"
        assert _wait(lambda: len(pub.acked) == COUNT, WAIT), f"{len(pub.acked)} of {COUNT} PUBACKed"
        assert pub.duplicate_acks == 0
        assert peak <= BACKLOG_HIGH + SLACK, f"undelivered grew to {peak}"
    finally:
        pub.stop()
        sub.close()
        for t in threads:
            t.join(timeout=5)
