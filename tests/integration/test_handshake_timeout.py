"""SE4 against real sockets: a client that stops half-way through the handshake is cut.

Differential: the same raw-socket clients run against RabbitMQ 3.10.8 and the gateway. RabbitMQ
(``handshake_timeout`` 10 s, measured from accept) sends nothing and resets the socket; the
gateway under test is configured with a 1 s limit so that the test stays short. The socket
timeouts are hang protection, not speed assertions.
"""

from __future__ import annotations

import json
import selectors
import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands, frame

from gateway.config import AuditSettings, Limits
from gateway.server import gateway_in_thread

HEADER = b"AMQP\x00\x00\x09\x01"
HANG_PROTECTION = 30.0
C = commands


@pytest.fixture(params=["rabbitmq", "gateway"])
def amqp_port(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[int]:
    if request.param == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")  # fails the test when RabbitMQ is not there
        yield 5672
        return
    with gateway_in_thread(data_dir=None, limits=Limits(handshake_timeout=1.0),
                           audit=AuditSettings(dir=str(tmp_path / "audit"))) as gw:
        yield gw.port


def _read_frame(sock: socket.socket) -> object:
    data = b""
    while True:
        try:
            _, _, value = frame.unmarshal(data)
            return value
        except Exception:  # pamqp: not a whole frame yet
            chunk = sock.recv(65536)
            assert chunk, "the broker hung up during the handshake"
            data += chunk


def _stall_at(port: int, stage: str) -> socket.socket:
    """A client that goes as far as ``stage`` through the handshake, then stays silent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_PROTECTION)
    if stage == "nothing":
        return sock
    sock.sendall(HEADER)
    assert isinstance(_read_frame(sock), C.Connection.Start)
    if stage == "header":
        return sock
    sock.sendall(frame.marshal(C.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                    response="\0guest\0guest"), 0))
    tune = _read_frame(sock)
    assert isinstance(tune, C.Connection.Tune)
    if stage == "start-ok":
        return sock
    sock.sendall(frame.marshal(C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                   heartbeat=0), 0))
    return sock  # logged in and tuned, but connection.open never comes


def _how_it_ended(sock: socket.socket) -> tuple[bytes, str]:
    """(bytes received after the client fell silent, "reset" | "eof")."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        return received, "reset"
    return received, "eof"


STAGES = ("nothing", "header", "start-ok", "tune-ok")


def test_SE4_stalled_handshake_is_reset_without_a_close(amqp_port: int) -> None:
    """Whatever stage a client stalls in (after start-ok: logged in, and after tune-ok: never
    sending connection.open), the broker sends nothing more and resets the socket."""
    socks = {stage: _stall_at(amqp_port, stage) for stage in STAGES}
    endings = {}
    with selectors.DefaultSelector() as sel:
        for stage, sock in socks.items():
            sel.register(sock, selectors.EVENT_READ, stage)
        while len(endings) < len(socks):
            ready = sel.select(timeout=HANG_PROTECTION)
            assert ready, f"still open: {sorted(set(socks) - set(endings))}"
            for key, _ in ready:
                endings[key.data] = _how_it_ended(socks[key.data])
                sel.unregister(key.fileobj)
    for sock in socks.values():
        sock.close()
    assert endings == {stage: (b"", "reset") for stage in STAGES}


def test_SE4_handshake_timeout_audited_and_others_served(tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    with gateway_in_thread(data_dir=None, limits=Limits(handshake_timeout=1.0),
                           audit=AuditSettings(dir=str(audit))) as gw:
        stalled = _stall_at(gw.port, "tune-ok")
        stalled.settimeout(HANG_PROTECTION)
        assert _how_it_ended(stalled) == (b"", "reset")
        stalled.close()
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
        assert conn.channel().is_open
        conn.close()
    records = [json.loads(line) for f in sorted(audit.rglob("*.jsonl*")) for line in f.read_text().splitlines()]
    closes = [r for r in records if r["event"] == "connection_close" and "handshake_timeout" in r["reason"]]
    assert len(closes) == 1
    assert closes[0]["user"] == "guest" and closes[0]["peer"].startswith("127.0.0.1:")
    assert closes[0]["reason"] == "handshake_timeout: not open after 1 s (state expect_open)"
