"""SE4: the handshake deadline of the sans-IO core, with the time injected through ``tick``.

RabbitMQ 3.10.8 (measured with a raw socket) resets a connection that is not open 10 s after
accept, whatever stage it is in: one deadline for the whole handshake, which the core keeps.
"""

from __future__ import annotations

import pytest
from amqp_pipe import PROTOCOL_HEADER, Pipe
from pamqp import commands

from gateway.protocol import ConnState, HandshakeTimeout, ServerConnection

C = commands


def _start_ok() -> C.Connection.StartOk:
    return C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0guest\0guest")


def _advance(pipe: Pipe, stage: ConnState) -> None:
    """Drive the handshake until the core is in ``stage``."""
    steps = [
        (ConnState.EXPECT_START_OK, lambda: pipe.feed(PROTOCOL_HEADER)),
        (ConnState.AUTHENTICATING, lambda: pipe.send(0, _start_ok())),
        (ConnState.EXPECT_TUNE_OK, pipe.server.send_tune),
        (ConnState.EXPECT_OPEN, lambda: pipe.send(0, C.Connection.TuneOk(channel_max=2047, frame_max=131072,
                                                                          heartbeat=0))),
        (ConnState.OPENING, lambda: pipe.send(0, C.Connection.Open(virtual_host="/"))),
    ]
    for reached, step in steps:
        if pipe.server.state is stage:
            return
        step()
        assert pipe.server.state is reached
    assert pipe.server.state is stage


@pytest.mark.parametrize("stage", [ConnState.EXPECT_HEADER, ConnState.EXPECT_START_OK, ConnState.AUTHENTICATING,
                                   ConnState.EXPECT_TUNE_OK, ConnState.EXPECT_OPEN, ConnState.OPENING])
def test_SE4_every_stage_before_open_times_out(stage: ConnState) -> None:
    """A client stuck in any stage (logged in but never sending connection.open included) is
    cut at the deadline, with nothing sent: RabbitMQ resets the socket without a close."""
    pipe = Pipe(ServerConnection({"product": "test"}, heartbeat=0, handshake_timeout=10.0))
    assert pipe.server.tick(100.0) == []  # accept
    _advance(pipe, stage)
    pipe.server.data_to_send()
    assert pipe.server.tick(109.5) == [] and pipe.server.state is stage
    assert pipe.server.tick(110.0) == [HandshakeTimeout(stage.value)]
    assert pipe.server.closed
    assert pipe.server.data_to_send() == b""


def test_SE4_one_deadline_for_the_whole_handshake() -> None:
    """Progress does not restart the clock: each stage came 4 s after the last, well inside a
    per-stage limit, and the connection is still cut 10 s after accept (as RabbitMQ)."""
    pipe = Pipe(ServerConnection({"product": "test"}, heartbeat=0, handshake_timeout=10.0))
    pipe.server.tick(0.0)
    pipe.server.tick(4.0)
    pipe.feed(PROTOCOL_HEADER)
    pipe.server.tick(8.0)
    pipe.send(0, _start_ok())
    pipe.server.send_tune()
    assert pipe.server.tick(10.0) == [HandshakeTimeout("expect_tune_ok")]


def test_SE4_open_connection_has_no_handshake_deadline() -> None:
    pipe = Pipe(ServerConnection({"product": "test"}, heartbeat=0, handshake_timeout=10.0))
    pipe.server.tick(0.0)
    pipe.handshake()
    assert pipe.server.tick(1000.0) == [] and pipe.server.state is ConnState.OPEN


def test_SE4_handshake_timeout_zero_turns_the_limit_off() -> None:
    pipe = Pipe(ServerConnection({"product": "test"}, heartbeat=0, handshake_timeout=0))
    pipe.server.tick(0.0)
    pipe.feed(PROTOCOL_HEADER)
    assert pipe.server.tick(1e6) == [] and pipe.server.state is ConnState.EXPECT_START_OK
