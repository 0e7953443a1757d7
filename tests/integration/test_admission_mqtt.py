"""SE5 and SE6 on the MQTT listener, on a real `cmq-gateway serve` process: the CONNECT
deadline counted from accept, the bytes before login capped and counted as held memory, a
publisher that connects while the memory alarm is raised held like an AMQP one, and retained
messages counted by the alarm (issue 26 items 3, 5 and 9b). Raw sockets and paho-mqtt; every
wait is bounded by HANG only (hang protection, not a threshold under test).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pika
from paho.mqtt.enums import CallbackAPIVersion

from gateway.mqtt import codec as P
from tests.integration.test_admission_http import _closed
from tests.integration.test_disk_alarm import _config
from tests.integration.test_memory_alarm import _overview
from tests.integration.test_process import serve

HANG = 30.0


def _until(what: Any, why: str) -> None:
    deadline = time.monotonic() + HANG
    while not what():
        assert time.monotonic() < deadline, f"timed out: {why}"
        time.sleep(0.05)


def _connect_bytes(client_id: str = "c", password: bytes = b"guest", level: int = 4) -> bytes:
    return P.encode(P.Connect(level=level, client_id=client_id, username="guest", password=password), level)


def _paho(port: int, client_id: str) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311)
    c.username_pw_set("guest", "guest")
    c.max_inflight_messages_set(1000)
    c.max_queued_messages_set(0)
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect("127.0.0.1", port, keepalive=60)
    c.loop_start()
    assert connected.wait(HANG), "no CONNACK"
    return c


def test_SE5_mqtt_connect_trickled_is_closed_at_the_deadline_from_accept(tmp_path: Path) -> None:
    """Issue 26 item 9b: a CONNECT sent one byte every 0.5 s (here with a 2 s deadline; 10 s
    by default) is closed by the deadline counted from accept, not from its last byte."""
    with serve(tmp_path / "data", "--config", _config(tmp_path, handshake_timeout=2)) as (proc, _port):
        connect = _connect_bytes()
        sock = socket.create_connection(("127.0.0.1", proc.mqtt_port), timeout=10)
        sent = 0
        got = b""
        deadline = time.monotonic() + HANG
        sock.settimeout(0.5)
        while sent < len(connect) - 1:  # never the last byte
            assert time.monotonic() < deadline, "still open"
            try:
                sock.sendall(connect[sent:sent + 1])
                sent += 1
                got = sock.recv(1024)
            except TimeoutError:
                continue
            except OSError:
                break
            if not got:
                break
        else:
            raise AssertionError(f"the whole CONNECT but one byte was taken over {sent * 0.5:.0f} s")
        assert got == b""  # closed, no CONNACK
        sock.close()
        ok = _paho(proc.mqtt_port, "after")  # the listener serves the others
        ok.disconnect()
        ok.loop_stop()


def test_SE5_mqtt_connect_over_preauth_bytes_is_refused(tmp_path: Path) -> None:
    """A CONNECT whose length is over limits.preauth_bytes (64 KiB by default) is refused as
    soon as its fixed header is read (closed: the protocol level is not known yet, so no
    CONNACK); one of 60 KB (a long password: MQTT allows 65,535 bytes) is read and answered."""
    with serve(tmp_path / "data") as (proc, _port):
        big = _connect_bytes(password=b"p" * 65_535, level=5)  # 65.6 KB
        assert len(big) > 65_536
        sock = socket.create_connection(("127.0.0.1", proc.mqtt_port), timeout=10)
        try:
            sock.sendall(big)
        except OSError:
            pass  # closed once the fixed header said how long it is: the rest is not read
        assert _closed(sock) == b""  # before: read to its end and answered (CONNACK 0x86)
        sock.close()
        fits = _connect_bytes(password=b"p" * 60_000, level=5)
        sock = socket.create_connection(("127.0.0.1", proc.mqtt_port), timeout=10)
        sock.sendall(fits)
        dec = P.Decoder()
        dec.level = 5
        dec.feed(_closed(sock))
        ack = dec.next_packet()
        assert isinstance(ack, P.ConnAck) and ack.reason_code == 0x86, ack  # bad user name or password
        sock.close()


def test_SE5_mqtt_bytes_before_connack_are_held_memory(tmp_path: Path) -> None:
    """Issue 26 item 3: 40 sockets that each send 60 KB of a CONNECT and stop hold 2.4 MB
    before any login, which the memory alarm counts (mem_used) and lets go when they close."""
    with serve(tmp_path / "data") as (proc, _port):
        before = _overview(proc)["mem_used"]
        head = P.encode(P.Connect(level=4, client_id="c", username="guest", password=b"p" * 62_000), 4)
        socks = []
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", proc.mqtt_port), timeout=10)
            s.sendall(head[:60_000])
            socks.append(s)
        _until(lambda: _overview(proc)["mem_used"] >= before + 40 * 60_000, "pre-login bytes not counted")
        for s in socks:
            s.close()
        _until(lambda: _overview(proc)["mem_used"] < before + 40 * 60_000, "pre-login bytes never let go")


def _raise_memory_alarm(port: int, queue: str) -> tuple[pika.BlockingConnection, int]:
    """An AMQP publisher fills ``queue`` until it is blocked (the alarm raised)."""
    pub = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
    notes: list[str] = []
    pub.add_on_connection_blocked_callback(lambda c, m: notes.append(m.method.NAME))
    ch = pub.channel()
    ch.queue_declare(queue)
    published = 0
    while not notes:
        assert published < 1000, "never blocked"
        ch.basic_publish("", queue, b"m" * 50_000)
        published += 1
        pub.process_data_events(time_limit=0)
    return pub, published


def test_SE6_mqtt_publisher_connected_during_the_alarm_is_held_then_released(tmp_path: Path, unique: str) -> None:
    """Issue 26 item 5: a paho client that connects while the memory alarm is raised logs in,
    but its 300 QoS 1 publishes are not acknowledged while the alarm lasts (before: 59,976 of
    60,000 were); once the queue that raised it drains, every one is acknowledged and a
    subscriber gets them all."""
    queue = f"{unique}-fill"
    topic = f"{unique}/held"
    with serve(tmp_path / "data", "--config", _config(tmp_path, memory_high_watermark=3_000_000)) as (proc, port):
        sub = _paho(proc.mqtt_port, f"{unique}-sub")
        got: list[bytes] = []
        subscribed = threading.Event()
        sub.on_message = lambda c, u, m: got.append(m.payload)
        sub.on_subscribe = lambda *a: subscribed.set()
        sub.subscribe(topic, qos=1)
        assert subscribed.wait(HANG)
        amqp_pub, filled = _raise_memory_alarm(port, queue)
        assert _overview(proc)["mem_alarm"] is True
        pub = _paho(proc.mqtt_port, f"{unique}-pub")  # connected during the alarm
        acked: list[int] = []
        pub.on_publish = lambda c, u, mid, rc, props: acked.append(mid)
        for i in range(300):
            pub.publish(topic, b"%d" % i + b"x" * 1000, qos=1)
        time.sleep(2.0)  # not a threshold: what would have been acknowledged by now (all, before)
        assert len(acked) <= 1, len(acked)
        assert _overview(proc)["mem_alarm"] is True
        with pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F")) as c:
            ch = c.channel()
            drained = 0
            deadline = time.monotonic() + HANG
            while drained < filled:
                method, _, _ = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    assert time.monotonic() < deadline, "the queue never filled"
                    amqp_pub.process_data_events(time_limit=0.05)
                    continue
                drained += 1
        _until(lambda: len(acked) == 300, f"{len(acked)} of 300 acknowledged after the alarm cleared")
        _until(lambda: len(got) == 300, f"{len(got)} of 300 delivered")
        assert sorted(int(p[:p.index(b"x")]) for p in got) == list(range(300))
        for client in (pub, sub):
            client.disconnect()
            client.loop_stop()
        amqp_pub.close()


def test_SE6_retained_mqtt_messages_raise_the_memory_alarm(tmp_path: Path, unique: str) -> None:
    """Issue 26 item 5: retained messages are held memory. Ten 900 KB retained messages
    (9 MB) pass a 6 MB mark: the alarm is raised and the publisher is held (before: no alarm
    whatever was retained, the store keeping large values on disk)."""
    payload = b"r" * 900_000
    with serve(tmp_path / "data", "--config", _config(tmp_path, memory_high_watermark=6_000_000)) as (proc, _port):
        assert _overview(proc)["mem_alarm"] is False
        pub = _paho(proc.mqtt_port, f"{unique}-ret")
        acked: list[int] = []
        pub.on_publish = lambda c, u, mid, rc, props: acked.append(mid)
        for i in range(10):
            pub.publish(f"{unique}/r/{i}", payload, qos=1, retain=True)
        _until(lambda: _overview(proc)["mem_alarm"] is True, "no memory alarm")
        assert _overview(proc)["mem_used"] > 4 * 900_000  # those retained so far, at least
        time.sleep(1.0)  # not a threshold: the publisher is held, its last publishes wait
        assert len(acked) < 10
        pub.disconnect()
        pub.loop_stop()


def test_SE5_mqtt_connect_announcing_1_mb_is_refused_before_login(tmp_path: Path) -> None:
    """Issue 26 item 3: a CONNECT announcing 1,000,000 bytes (under mqtt max_packet_size, 1 MiB)
    was read to the end before login; now the connection is closed once its length is read,
    whatever follows."""
    with serve(tmp_path / "data") as (proc, _port):
        sock = socket.create_connection(("127.0.0.1", proc.mqtt_port), timeout=10)
        # CONNECT, remaining length 1,000,000 (variable-length integer).
        n, length = 1_000_000, b""
        while True:
            byte, n = n % 128, n // 128
            length += struct.pack("B", byte | (0x80 if n else 0))
            if not n:
                break
        sock.sendall(b"\x10" + length + b"\x00\x04MQTT\x04")
        assert _closed(sock, None, b"\x00" * 1000, every=0.05) == b""  # 3.1.1: closed, no CONNACK
        sock.close()
