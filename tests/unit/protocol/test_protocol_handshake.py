"""Handshake, negotiation and connection close, driven by a pamqp client through a pipe."""

from __future__ import annotations

import pytest
from amqp_pipe import PROTOCOL_HEADER, Pipe, method_frame
from pamqp import commands as C

from gateway.protocol import (
    BadProtocolHeader,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnState,
    ProtocolError,
    ProtocolHeaderOK,
    ServerConnection,
    StartOk,
    TuneOk,
)

SERVER_PROPERTIES = {
    "product": "cmq-gateway",
    "version": "0.1.0",
    "platform": "Python",
    "cluster_name": "cmq@test",
    "capabilities": {"publisher_confirms": True, "basic.nack": True, "connection.blocked": True,
                     "consumer_cancel_notify": True, "authentication_failure_close": True,
                     "per_consumer_qos": True},
}


def test_W1_connection_start_carries_server_properties_mechanisms_and_locales() -> None:
    """W1: connection.start passes the server properties through unchanged."""
    pipe = Pipe(ServerConnection(SERVER_PROPERTIES))
    assert pipe.feed(PROTOCOL_HEADER) == [ProtocolHeaderOK()]
    ((channel, start),) = pipe.read()
    assert channel == 0
    assert isinstance(start, C.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.server_properties == SERVER_PROPERTIES
    assert start.mechanisms == "PLAIN AMQPLAIN"
    assert start.locales == "en_US"


@pytest.mark.parametrize("header", [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n"])
def test_W6_other_protocol_header_is_answered_with_ours_and_closed(header: bytes) -> None:
    """W6: any other header gets AMQP 0-9-1's header back and the connection closes."""
    pipe = Pipe()
    events = pipe.feed(header)
    assert events == [BadProtocolHeader(header[:8])]
    assert pipe.server.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert pipe.server.closed


def test_W6_header_one_byte_at_a_time() -> None:
    """W6: the header may arrive split anywhere."""
    pipe = Pipe()
    events = []
    for i in range(8):
        events += pipe.feed(PROTOCOL_HEADER[i:i + 1])
    assert events == [ProtocolHeaderOK()]


def test_full_handshake_events_and_states() -> None:
    pipe = Pipe(ServerConnection({}, frame_max=131072, channel_max=2047, heartbeat=60))
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    caps = {"connection.blocked": True}
    events = pipe.send(0, C.Connection.StartOk(client_properties={"capabilities": caps}, mechanism="PLAIN",
                                                response="\0guest\0pw", locale="en_US"))
    assert events == [StartOk("PLAIN", b"\0guest\0pw", "en_US", {"capabilities": caps})]
    assert pipe.server.state is ConnState.AUTHENTICATING
    pipe.server.send_tune()
    ((_, tune),) = pipe.read()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    events = pipe.send(0, C.Connection.TuneOk(channel_max=100, frame_max=65536, heartbeat=30))
    assert events == [TuneOk(100, 65536, 30)]
    assert (pipe.server.channel_max, pipe.server.frame_max, pipe.server.heartbeat) == (100, 65536, 30)
    assert pipe.send(0, C.Connection.Open(virtual_host="/prod")) == [ConnectionOpen("/prod")]
    pipe.server.send_open_ok()
    ((_, ok),) = pipe.read()
    assert isinstance(ok, C.Connection.OpenOk)
    assert pipe.server.state is ConnState.OPEN


def test_events_wait_for_the_transport_decision_after_start_ok() -> None:
    """Frames pipelined after start-ok stay buffered until send_tune() is called."""
    pipe = Pipe()
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    data = (method_frame(0, C.Connection.StartOk(mechanism="PLAIN", response="\0a\0b"))
            + method_frame(0, C.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0)))
    events = pipe.feed(data)
    assert [type(e) for e in events] == [StartOk]
    pipe.server.send_tune()
    assert pipe.feed(b"") == [TuneOk(10, 4096, 0)]


def test_authentication_failure_close_403() -> None:
    """W2: the transport refuses the login with 403; the client's close-ok ends it."""
    pipe = Pipe()
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    pipe.send(0, C.Connection.StartOk(mechanism="PLAIN", response="\0guest\0bad"))
    pipe.server.close(403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN")
    ((_, close),) = pipe.read()
    assert (close.reply_code, close.class_id, close.method_id) == (403, 0, 0)
    assert close.reply_text.startswith("ACCESS_REFUSED - ")
    assert pipe.send(0, C.Connection.CloseOk()) == [ConnectionCloseOk()]
    assert pipe.server.closed


def test_vhost_refused_530() -> None:
    pipe = Pipe()
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    pipe.send(0, C.Connection.StartOk(mechanism="PLAIN", response="\0a\0b"))
    pipe.server.send_tune()
    pipe.read()
    pipe.send(0, C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
    assert pipe.send(0, C.Connection.Open(virtual_host="nope")) == [ConnectionOpen("nope")]
    pipe.server.close(530, "NOT_ALLOWED - vhost nope not found", 10, 40)
    ((_, close),) = pipe.read()
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)


@pytest.mark.parametrize(
    ("channel_max", "frame_max", "detail"),
    [
        (0, 131072, "negotiated channel_max = 0 is higher than the maximum allowed value (2047)"),
        (2048, 131072, "negotiated channel_max = 2048 is higher than the maximum allowed value (2047)"),
        (10, 4095, "negotiated frame_max = 4095 is lower than the minimum allowed value (4096)"),
        (10, 131073, "negotiated frame_max = 131073 is higher than the maximum allowed value (131072)"),
        (10, 0, "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
    ],
)
def test_W3_tune_ok_out_of_range_is_530_on_connection_tune(channel_max: int, frame_max: int, detail: str) -> None:
    """W3: negotiated values above the server's (or frame_max under 4096) are refused as
    RabbitMQ refuses them: 530 NOT_ALLOWED against connection.tune (10, 30)."""
    pipe = Pipe()
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    pipe.send(0, C.Connection.StartOk(mechanism="PLAIN", response="\0a\0b"))
    pipe.server.send_tune()
    pipe.read()
    events = pipe.send(0, C.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0))
    assert events == [ProtocolError(530, "NOT_ALLOWED - " + detail, 0, 10, 30)]
    ((_, close),) = pipe.read()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (530, "NOT_ALLOWED - " + detail,
                                                                                     10, 30)


def test_W3_heartbeat_zero_and_lower_values_are_accepted() -> None:
    """W3: the client's heartbeat is taken as given (0 turns heartbeats off)."""
    pipe = Pipe(ServerConnection({}, heartbeat=60))
    pipe.handshake(heartbeat=0)
    assert pipe.server.heartbeat == 0
    pipe = Pipe(ServerConnection({}, heartbeat=60))
    pipe.handshake(heartbeat=5)
    assert pipe.server.heartbeat == 5


def test_client_close_is_answered_with_close_ok() -> None:
    pipe = Pipe()
    pipe.handshake()
    events = pipe.send(0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert events == [ConnectionClose(200, "bye", 0, 0)]
    ((channel, ok),) = pipe.read()
    assert channel == 0 and isinstance(ok, C.Connection.CloseOk)
    assert pipe.server.closed


def test_server_close_ignores_everything_until_close_ok() -> None:
    pipe = Pipe()
    pipe.handshake()
    pipe.open_channel(1)
    pipe.server.close(320, "CONNECTION_FORCED - shutdown")
    pipe.read()
    events = pipe.send(1, C.Basic.Qos(prefetch_count=1)) + pipe.send(0, C.Connection.CloseOk())
    assert events == [ConnectionCloseOk()]
    assert pipe.server.closed


def test_handshake_method_out_of_order_is_504_unexpected_method() -> None:
    """rabbit_reader: "unexpected method in connection state starting" (channel_error)."""
    pipe = Pipe()
    pipe.feed(PROTOCOL_HEADER)
    pipe.read()
    events = pipe.send(0, C.Connection.Open(virtual_host="/"))
    assert events == [ProtocolError(504, "CHANNEL_ERROR - unexpected method in connection state starting",
                                    0, 10, 40)]
    ((_, close),) = pipe.read()
    assert (close.reply_code, close.class_id, close.method_id) == (504, 10, 40)
