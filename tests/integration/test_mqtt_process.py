"""MQTT against the real `cmq-gateway serve` process: a persistent session's QoS 1 messages
survive a restart, and kill -9 loses no PUBACKed message (MQ3, MQ4)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gateway.mqtt import codec as P
from tests.integration.mqtt_client import RawClient
from tests.integration.test_process import serve


def _subscribe_persistent(port: int, client_id: str, level: int) -> None:
    c = RawClient(port, level)
    props = {"session_expiry": 3600} if level == 5 else {}
    c.connect(client_id, clean=False, **props)
    c.send(P.Subscribe(1, [("dev/+/data", 1)]))
    assert c.recv().reason_codes == [1]
    c.close()


def _publish_acked(port: int, n: int, *, retain_first: bool = False) -> list[bytes]:
    """QoS 1 publishes; the payloads whose PUBACK came back."""
    pub = RawClient(port, 4)
    pub.connect("publisher")
    for i in range(1, n + 1):
        pub.send(P.Publish(f"dev/k{i % 3}/data", f"m{i}".encode(), 1, retain=retain_first and i == 1, packet_id=i))
    acked = []
    for _ in range(n):
        ack = pub.recv()
        assert isinstance(ack, P.Ack) and ack.kind == P.PUBACK and ack.reason_code == 0
        acked.append(f"m{ack.packet_id}".encode())
    pub.close()
    return acked


def _drain(port: int, client_id: str, level: int, expect: int) -> list[bytes]:
    c = RawClient(port, level)
    props = {"session_expiry": 3600} if level == 5 else {}
    assert c.connect(client_id, clean=False, **props).session_present is True
    got = []
    while len(got) < expect:
        p = c.recv()
        assert isinstance(p, P.Publish), p
        got.append(p.payload)
        c.send(P.Ack(P.PUBACK, p.packet_id))
    c.close()
    return got


def test_MQ3_persistent_session_messages_survive_a_restart(tmp_path: Path) -> None:
    for level in (4, 5):
        data = tmp_path / f"data{level}"
        with serve(data) as (proc, _):
            port = proc.mqtt_port  # type: ignore[attr-defined]
            assert port
            _subscribe_persistent(port, f"dev-{level}", level)
            acked = _publish_acked(port, 20, retain_first=True)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        with serve(data) as (proc, _):
            port = proc.mqtt_port  # type: ignore[attr-defined]
            got = _drain(port, f"dev-{level}", level, len(acked))
            assert sorted(got) == sorted(acked)
            # The retained message came back too (MQ5).
            c = RawClient(port, level)
            c.connect("late")
            c.send(P.Subscribe(1, [("dev/k1/data", 0)]))
            c.recv()
            retained = c.recv()
            assert isinstance(retained, P.Publish) and retained.retain and retained.payload == b"m1"
            c.close()


def test_MQ4_kill_9_loses_no_pubacked_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data) as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        _subscribe_persistent(port, "dev-k", 4)
        acked = _publish_acked(port, 200)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with serve(data) as (proc, _):
        got = _drain(proc.mqtt_port, "dev-k", 4, len(acked))  # type: ignore[attr-defined]
        assert set(got) >= set(acked)


def test_MQ1_taken_mqtt_port_is_one_line_exit_1(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from tests.integration.test_process import ROOT

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                               "--management-port", "off", "--metrics-port", "off", "--mqtt-port", str(taken),
                               "--data-dir", str(tmp_path / "d")], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"cmq-gateway: cannot listen on 127.0.0.1:{taken}: port {taken} is in use (Mosquitto, or RabbitMQ's "
        "MQTT plugin?): choose another with --mqtt-port, or --mqtt-port off"]


def test_MQ1_serve_starts_mqtt_by_default_and_off_turns_it_off(tmp_path: Path) -> None:
    from gateway.cli import build_parser
    from gateway.config import parse_config

    assert build_parser().parse_args(["serve"]).mqtt_port is None  # then 1883 (DEFAULT_MQTT_PORT)
    assert build_parser().parse_args(["serve", "--mqtt-port", "off"]).mqtt_port == -1
    cfg = parse_config({"mqtt": {"port": 0, "host": "127.0.0.1", "max_packet_size": 1000}})
    assert (cfg.mqtt_port, cfg.mqtt_host, cfg.mqtt_max_packet_size) == (0, "127.0.0.1", 1000)
    with serve(tmp_path / "d", "--mqtt-port", "off") as (proc, _):
        assert proc.mqtt_port is None  # type: ignore[attr-defined]


def test_MQ4_qos2_exactly_once_across_kill_9(tmp_path: Path) -> None:
    """QoS 2 packet-identifier state is in the store with the persistent session: after a
    kill -9 a resent PUBLISH is not routed again, and an unfinished delivery comes again
    under the same packet identifier, so the client can drop the duplicate."""
    data = tmp_path / "data"
    with serve(data) as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        sub = RawClient(port, 4)
        sub.connect("q2-sub", clean=False)
        sub.send(P.Subscribe(1, [("q2/#", 2)]))
        sub.recv()
        pub = RawClient(port, 4)
        pub.connect("q2-pub", clean=False)
        pub.send(P.Publish("q2/x", b"only-once", 2, packet_id=7))
        rec = pub.recv()
        assert (rec.kind, rec.packet_id) == (P.PUBREC, 7)
        first = sub.recv()
        assert isinstance(first, P.Publish) and first.qos == 2  # not acknowledged before the kill
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with serve(data) as (proc, _):
        port = proc.mqtt_port  # type: ignore[attr-defined]
        pub = RawClient(port, 4)
        assert pub.connect("q2-pub", clean=False).session_present
        pub.send(P.Publish("q2/x", b"only-once", 2, dup=True, packet_id=7))  # PUBREC was "lost"
        assert (lambda r: (r.kind, r.packet_id))(pub.recv()) == (P.PUBREC, 7)
        pub.send(P.Ack(P.PUBREL, 7))
        assert (lambda r: (r.kind, r.packet_id, r.reason_code))(pub.recv()) == (P.PUBCOMP, 7, 0)
        pub.send(P.Publish("q2/marker", b"marker", 2, packet_id=8))
        pub.recv()
        sub = RawClient(port, 4)
        assert sub.connect("q2-sub", clean=False).session_present
        again = sub.recv()
        assert isinstance(again, P.Publish) and again.dup and again.packet_id == first.packet_id
        assert again.payload == b"only-once"
        sub.send(P.Ack(P.PUBREC, again.packet_id))
        payloads = []
        while True:
            p = sub.recv()
            assert p is not None
            if isinstance(p, P.Ack) and p.kind == P.PUBREL:
                sub.send(P.Ack(P.PUBCOMP, p.packet_id))
            elif isinstance(p, P.Publish):
                payloads.append(p.payload)
                sub.send(P.Ack(P.PUBREC, p.packet_id))
                if p.payload == b"marker":
                    break
        assert payloads == [b"marker"]  # the resent PUBLISH was not routed a second time
        sub.close()
        pub.close()
