"""The transport against real sockets: W1 properties, W2 logins, W3 heartbeats, W5 blocking,
W6 bad headers, IPv6. Gateway only: these are the gateway's own connection-level rules."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands, frame, header

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import AuditSettings, Limits
from gateway.server import gateway_in_thread

# Issue 14: these also run on the gateway on NATS JetStream (tests/conftest.py).
pytestmark = pytest.mark.both_stores


def test_W1_server_properties_and_capabilities(gateway_url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(gateway_url))
    props = conn._impl.server_properties
    conn.close()
    assert props["product"] == "cmq-gateway"
    assert props["cluster_name"] == "cmq-gateway"
    assert props["platform"].startswith("Python 3.")
    assert props["version"] == "0.1.0"
    assert props["capabilities"] == {
        "publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
        "connection.blocked": True, "authentication_failure_close": True, "per_consumer_qos": True,
        # W1: advertised because exchange-to-exchange bindings work (tested in tests/unit/broker).
        "exchange_exchange_bindings": True}


def test_W2_bad_password_is_403_and_audited(tmp_path: Path) -> None:
    with gateway_in_thread(data_dir=None, audit=AuditSettings(dir=str(tmp_path))) as gw, \
            pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
        pika.BlockingConnection(pika.URLParameters(f"amqp://guest:nope@127.0.0.1:{gw.port}/%2F"))
    assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(e.value)
    records = [json.loads(line) for f in sorted(tmp_path.rglob("*.jsonl*")) for line in f.read_text().splitlines()]
    failures = [r for r in records if r["event"] == "auth_failure"]
    assert len(failures) == 1
    assert (failures[0]["user"], failures[0]["vhost"]) == ("guest", "/")
    assert failures[0]["peer"].startswith("127.0.0.1:")


def test_W2_users_vhosts_and_guest_only_from_loopback() -> None:
    users = UserDB({"guest": User("guest", hash_password("guest")), "app": User("app", hash_password("pw"))},
                   {("guest", "/"): Permission(), ("app", "orders"): Permission()}, ["/", "orders"])
    outside = _outside_address()
    with gateway_in_thread(hosts=("0.0.0.0",), users=users) as gw:
        ok = pika.BlockingConnection(pika.URLParameters(f"amqp://app:pw@{outside}:{gw.port}/orders"))
        assert ok.is_open
        ok.close()
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
            pika.BlockingConnection(pika.URLParameters(f"amqp://app:pw@127.0.0.1:{gw.port}/%2F"))
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as remote_guest:
            pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@{outside}:{gw.port}/%2F"))
        local = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
        assert local.is_open
        local.close()
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'app'\"" in str(denied.value)
    assert "(403) \"ACCESS_REFUSED - user 'guest' can only connect via localhost\"" in str(remote_guest.value)


def _outside_address() -> str:
    """A non-loopback address of this machine (the one a default route would use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent for a UDP connect
        except OSError:
            pytest.skip("this machine has no non-loopback IPv4 address")
        address = s.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


def test_ipv6_loopback_client(gateway: object) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="::1", port=gateway.port))  # type: ignore[attr-defined]
    ch = conn.channel()
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    conn.close()


def test_W6_wrong_protocol_header_gets_ours_and_close(gateway: object) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:  # type: ignore[attr-defined]
        s.sendall(b"AMQP\x00\x00\x08\x00")
        assert _read_all(s) == b"AMQP\x00\x00\x09\x01"


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _read_frame(s: socket.socket, buf: bytearray) -> object:
    while True:
        if len(buf) >= 7:
            size = struct.unpack_from(">I", buf, 3)[0]
            if len(buf) >= size + 8:
                consumed, _channel, value = frame.unmarshal(bytes(buf[:size + 8]))
                del buf[:consumed]
                return value
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def test_W3_silent_peer_is_disconnected_after_two_intervals(gateway: object) -> None:
    """W3: a client that negotiated heartbeat=1 and then sends nothing is cut."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=15) as s:  # type: ignore[attr-defined]
        buf = bytearray()
        s.sendall(frame.marshal(header.ProtocolHeader(), 0))
        assert isinstance(_read_frame(s, buf), commands.Connection.Start)
        s.sendall(frame.marshal(commands.Connection.StartOk(response="\0guest\0guest"), 0))
        tune = _read_frame(s, buf)
        assert isinstance(tune, commands.Connection.Tune) and tune.heartbeat == 60
        s.sendall(frame.marshal(commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=1), 0))
        s.sendall(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        assert isinstance(_read_frame(s, buf), commands.Connection.OpenOk)
        seen = []
        while True:  # the server sends its heartbeats, then hangs up on our silence
            try:
                seen.append(type(_read_frame(s, buf)).__name__)
            except ConnectionError:
                break
    assert seen and set(seen) == {"Heartbeat"}


def test_W5_blocked_publisher_then_unblocked(gateway: object) -> None:
    """W5: above the high-water mark (the memory the broker holds: here one queued message
    is above 1 byte) a publishing connection gets connection.blocked; below it,
    connection.unblocked."""
    notes: list[str] = []
    with gateway_in_thread(limits=Limits(memory_high_watermark=1)) as gw:
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
        conn.add_on_connection_blocked_callback(lambda c, m: notes.append(m.method.NAME))
        conn.add_on_connection_unblocked_callback(lambda c, m: notes.append(m.method.NAME))
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", queue, b"x")
        deadline = time.monotonic() + 10  # hang protection only: the tick runs every second
        while not notes and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        gw.config.limits = Limits()  # back below the mark
        while len(notes) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        conn.close()
    assert notes == ["Connection.Blocked", "Connection.Unblocked"]


async def test_running_gateway_in_this_event_loop(tmp_path: Path) -> None:
    """The in-process API: a gateway on port 0 in the test's own loop, reached by aio-pika."""
    import aio_pika

    from gateway.server import running_gateway

    async with running_gateway(port=0, data_dir=str(tmp_path)) as gw:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("inproc")
            await ch.default_exchange.publish(aio_pika.Message(b"same loop"), routing_key="inproc")
            msg = await q.get(no_ack=True)
        assert [a[1] for a in gw.addresses] == [gw.port, gw.port]
    assert msg.body == b"same loop"
