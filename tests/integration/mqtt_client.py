"""A raw MQTT client on a socket, built on the gateway's codec, for what client libraries
hide: DUP resends, a socket dropped without DISCONNECT, exact reason codes."""

from __future__ import annotations

import socket
from typing import Any

from gateway.mqtt import codec as P


class RawClient:
    def __init__(self, port: int, level: int = 5, host: str = "127.0.0.1") -> None:
        self.level = level
        self.sock = socket.create_connection((host, port), timeout=10)
        self.dec = P.Decoder()
        self.dec.level = level

    def connect(self, client_id: str, *, clean: bool = True, will: P.Will | None = None,
                keep_alive: int = 60, user: str = "guest", password: bytes = b"guest", **props: Any) -> P.ConnAck:
        self.send(P.Connect(level=self.level, client_id=client_id, clean_start=clean, keep_alive=keep_alive,
                            username=user, password=password, will=will, properties=props))
        ack = self.recv()
        assert isinstance(ack, P.ConnAck), ack
        return ack

    def send(self, packet: Any) -> None:
        self.sock.sendall(P.encode(packet, self.level))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 10.0) -> Any:
        """The next packet; None when the server closed the connection."""
        self.sock.settimeout(timeout)
        while True:
            packet = self.dec.next_packet()
            if packet is not None:
                return packet
            data = self.sock.recv(65536)
            if not data:
                return None
            self.dec.feed(data)

    def drop(self) -> None:
        """Gone without DISCONNECT: an ungraceful end (the will goes out, MQ5)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.sock.close()

    def close(self) -> None:
        try:
            self.send(P.Disconnect())
        except OSError:
            pass
        self.sock.close()


class AsyncRawClient:
    """The same, on asyncio streams: for a gateway running in the test's own event loop."""

    def __init__(self, reader: Any, writer: Any, level: int) -> None:
        self.reader, self.writer, self.level = reader, writer, level
        self.dec = P.Decoder()
        self.dec.level = level

    @classmethod
    async def connect(cls, port: int, client_id: str, level: int = 5, *, clean: bool = True,
                      **props: Any) -> tuple[AsyncRawClient, P.ConnAck]:
        import asyncio

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = cls(reader, writer, level)
        c.send(P.Connect(level=level, client_id=client_id, clean_start=clean, username="guest",
                         password=b"guest", properties=props))
        ack = await c.recv()
        assert isinstance(ack, P.ConnAck), ack
        return c, ack

    def send(self, packet: Any) -> None:
        self.writer.write(P.encode(packet, self.level))

    async def recv(self, timeout: float = 10.0) -> Any:
        import asyncio

        while True:
            packet = self.dec.next_packet()
            if packet is not None:
                return packet
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            self.dec.feed(data)

    def close(self) -> None:
        self.send(P.Disconnect())
        self.writer.close()
