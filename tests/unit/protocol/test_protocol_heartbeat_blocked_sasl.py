"""Heartbeats (W3), connection.blocked (W5) and the PLAIN / AMQPLAIN decoders (W2)."""

from __future__ import annotations

import struct

import pytest
from amqp_pipe import Pipe, method_frame
from pamqp import commands as C

from gateway.protocol import (
    HeartbeatTimeout,
    ServerConnection,
    decode_amqplain,
    decode_plain,
    decode_response,
)

HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def _open(heartbeat: int) -> Pipe:
    pipe = Pipe(ServerConnection({}, heartbeat=60))
    pipe.handshake(heartbeat=heartbeat)
    return pipe


def test_W3_heartbeat_sent_after_one_interval_of_our_silence() -> None:
    pipe = _open(10)
    server = pipe.server
    assert server.tick(100.0) == []
    assert server.data_to_send() == b""
    pipe.feed(HEARTBEAT)
    assert server.tick(109.0) == [] and server.data_to_send() == b""
    pipe.feed(HEARTBEAT)
    assert server.tick(110.0) == []
    assert server.data_to_send() == HEARTBEAT
    pipe.feed(HEARTBEAT)
    assert server.tick(115.0) == [] and server.data_to_send() == b""


def test_W3_our_traffic_counts_as_a_heartbeat() -> None:
    pipe = _open(10)
    server = pipe.server
    server.tick(100.0)
    pipe.open_channel(1)  # data_to_send() happened: we were not silent
    pipe.feed(HEARTBEAT)
    server.tick(105.0)
    pipe.feed(HEARTBEAT)
    assert server.tick(114.0) == [] and server.data_to_send() == b""


def test_W3_peer_silent_for_two_intervals_times_out() -> None:
    """W3: no byte from the peer for two intervals: HeartbeatTimeout, connection closed."""
    pipe = _open(10)
    server = pipe.server
    server.tick(100.0)
    assert server.tick(119.0) == []
    pipe.feed(HEARTBEAT)
    assert server.tick(120.0) == []  # a byte arrived before this tick
    assert server.tick(139.0) == []
    assert server.tick(140.0) == [HeartbeatTimeout()]
    assert server.closed
    assert server.tick(200.0) == []


def test_W3_heartbeat_zero_disables_both_directions() -> None:
    pipe = _open(0)
    server = pipe.server
    server.tick(0.0)
    assert server.tick(10_000.0) == [] and server.data_to_send() == b""
    assert not server.closed


def test_heartbeat_frames_from_the_peer_are_silently_accepted() -> None:
    pipe = _open(10)
    assert pipe.feed(HEARTBEAT * 3) == []
    assert pipe.read() == []


@pytest.mark.parametrize(("capabilities", "sent"), [({"connection.blocked": True}, True), ({}, False),
                                                    ({"connection.blocked": False}, False)])
def test_W5_blocked_only_to_clients_that_advertise_it(capabilities: dict, sent: bool) -> None:
    """W5: connection.blocked / unblocked only when the client said it understands them."""
    pipe = Pipe()
    pipe.handshake(client_properties={"capabilities": capabilities})
    assert pipe.server.send_blocked("low on memory") is sent
    assert pipe.server.send_unblocked() is sent
    frames = pipe.read()
    if sent:
        assert [type(f) for _, f in frames] == [C.Connection.Blocked, C.Connection.Unblocked]
        assert frames[0][1].reason == "low on memory"
    else:
        assert frames == []


def test_W2_plain_response() -> None:
    assert decode_plain(b"\x00guest\x00secret") == ("guest", "secret")
    assert decode_plain(b"admin\x00guest\x00secret") == ("guest", "secret")
    assert decode_response("PLAIN", b"\x00u\x00p") == ("u", "p")
    with pytest.raises(ValueError):
        decode_plain(b"guest:secret")


def test_W2_amqplain_response_as_pika_sends_it() -> None:
    # LOGIN and PASSWORD as a table body without its length (what pika/py-amqp send)
    body = b"\x05LOGINS" + struct.pack(">I", 5) + b"guest" + b"\x08PASSWORDS" + struct.pack(">I", 6) + b"secret"
    assert decode_amqplain(body) == ("guest", "secret")
    assert decode_response("AMQPLAIN", body) == ("guest", "secret")
    with pytest.raises(ValueError):
        decode_amqplain(b"\x05LOGINS" + struct.pack(">I", 5) + b"guest")
    with pytest.raises(ValueError):
        decode_response("EXTERNAL", b"")


def test_start_ok_response_reaches_the_event_as_bytes() -> None:
    pipe = Pipe()
    pipe.feed(b"AMQP\x00\x00\x09\x01")
    (event,) = pipe.feed(method_frame(0, C.Connection.StartOk(mechanism="PLAIN", response="\0guest\0pw")))
    assert event.response == b"\x00guest\x00pw"
    assert decode_response(event.mechanism, event.response) == ("guest", "pw")
