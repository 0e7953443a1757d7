"""A pamqp-driven client linked to the server core through an in-memory pipe (as
h11/tests/helpers.py links a client and a server)."""

from __future__ import annotations

from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header

from gateway.protocol import ServerConnection
from gateway.protocol.events import Event

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def parse_frames(data: bytes) -> list[tuple[int, Any]]:
    """Every frame in ``data`` decoded by pamqp (the reference decoder)."""
    out = []
    while data:
        consumed, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[consumed:]
    return out


def method_frame(channel: int, method: Any) -> bytes:
    return frame.marshal(method, channel)


def content_frames(channel: int, body: bytes, properties: commands.Basic.Properties | None = None,
                   frame_max: int = 131072) -> bytes:
    out = frame.marshal(header.ContentHeader(0, len(body), properties or commands.Basic.Properties()), channel)
    step = frame_max - 8
    for i in range(0, len(body), step):
        out += frame.marshal(pbody.ContentBody(body[i:i + step]), channel)
    return out


class Pipe:
    """The client half: writes frames into the server and reads back what it sent."""

    def __init__(self, server: ServerConnection | None = None) -> None:
        self.server = server or ServerConnection({"product": "test"}, heartbeat=0)

    def feed(self, data: bytes) -> list[Event]:
        self.server.receive_data(data)
        events = []
        while (event := self.server.next_event()) is not None:
            events.append(event)
        return events

    def send(self, channel: int, method: Any) -> list[Event]:
        return self.feed(method_frame(channel, method))

    def read(self) -> list[tuple[int, Any]]:
        return parse_frames(self.server.data_to_send())

    def handshake(self, *, frame_max: int = 131072, channel_max: int = 2047, heartbeat: int = 0,
                  client_properties: dict[str, Any] | None = None) -> None:
        """A full handshake to OPEN, asserting each step."""
        self.feed(PROTOCOL_HEADER)
        (start,) = self.read()
        assert isinstance(start[1], commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(client_properties=client_properties or {},
                                                 mechanism="PLAIN", response="\0guest\0guest"))
        self.server.send_tune()
        (tune,) = self.read()
        assert isinstance(tune[1], commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.server.send_open_ok()
        (open_ok,) = self.read()
        assert isinstance(open_ok[1], commands.Connection.OpenOk)

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        (ok,) = self.read()
        assert ok[0] == channel and isinstance(ok[1], commands.Channel.OpenOk)
