"""A raw AMQP 0-9-1 client on a socket (pamqp frames), for what client libraries cannot send:
a content header whose body never comes, or a body after the server closed the channel."""

from __future__ import annotations

import select
import socket
import struct
from typing import Any

from pamqp import body, commands, frame, header

__all__ = ["RawClient"]


class RawClient:
    """Connected, logged in as guest, channel 1 open. ``capabilities`` go in start-ok."""

    def __init__(self, port: int, capabilities: dict[str, bool] | None = None, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = bytearray()
        self.sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
        self.expect(commands.Connection.Start)
        props = {"capabilities": capabilities or {}}
        self.sock.sendall(frame.marshal(commands.Connection.StartOk(client_properties=props,
                                                                    response="\0guest\0guest"), 0))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.sock.sendall(frame.marshal(commands.Connection.TuneOk(channel_max=16, frame_max=tune.frame_max,
                                                                   heartbeat=0), 0))
        self.sock.sendall(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        self.expect(commands.Connection.OpenOk)
        self.sock.sendall(frame.marshal(commands.Channel.Open(), 1))
        self.expect(commands.Channel.OpenOk)

    def read_frame(self) -> tuple[int, Any]:
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack_from(">I", self.buf, 3)[0]
                if len(self.buf) >= size + 8:
                    consumed, channel, value = frame.unmarshal(bytes(self.buf[:size + 8]))
                    del self.buf[:consumed]
                    return channel, value
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the server")
            self.buf += chunk

    def expect(self, kind: type) -> Any:
        _, value = self.read_frame()
        assert isinstance(value, kind), value
        return value

    def readable(self) -> bool:
        return bool(self.buf) or bool(select.select([self.sock], [], [], 0)[0])

    def start_publish(self, routing_key: str, body_size: int) -> None:
        """basic.publish and a content header announcing ``body_size`` bytes."""
        self.sock.sendall(frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), 1)
                          + frame.marshal(header.ContentHeader(0, body_size, commands.Basic.Properties()), 1))

    def body_frame(self, size: int) -> bytes:
        return frame.marshal(body.ContentBody(b"b" * size), 1)

    def close(self) -> None:
        self.sock.close()

    def abort(self) -> None:
        """Close with a reset (SO_LINGER 0). A plain close's FIN waits behind the bytes still
        queued for a server that no longer reads them (a blocked publisher), unseen."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
