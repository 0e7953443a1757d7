"""A raw AMQP 0-9-1 client over an asyncio socket, built on pamqp's frame codec.

For what no client library lets a test do: send arguments a library would refuse, watch the
exact frames a broker answers with (``multiple`` on confirms, a basic.cancel nobody asked
for), or notice when the broker hangs up. It speaks to RabbitMQ and the gateway alike.
"""

from __future__ import annotations

import asyncio
import struct
import urllib.parse
from types import SimpleNamespace
from typing import Any

from pamqp import base, encode
from pamqp import body as B
from pamqp import commands as C
from pamqp import frame as F
from pamqp import header as H

__all__ = ["Closed", "RawClient", "Raw", "address", "method", "method_frame"]


class Closed(Exception):
    """The broker hung up; ``frames`` is everything it sent before."""


def address(url: str) -> tuple[str, int, str, str, str]:
    """host, port, user, password, vhost of an amqp:// URL."""
    u = urllib.parse.urlparse(url)
    vhost = urllib.parse.unquote(u.path[1:]) if len(u.path) > 1 else "/"
    return (u.hostname or "127.0.0.1", u.port or 5672, urllib.parse.unquote(u.username or "guest"),
            urllib.parse.unquote(u.password or "guest"), vhost)


def method(cls: type, **fields: Any) -> Any:
    """A pamqp method with ``fields`` set past pamqp's validation (which refuses, e.g., the
    non-ASCII queue names AMQP allows and RabbitMQ accepts)."""
    unchecked = _UNCHECKED.get(cls)
    if unchecked is None:
        unchecked = _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": lambda self: None})
    m = unchecked()
    for k, v in fields.items():
        setattr(m, k, v)
    return m


_UNCHECKED: dict[type, type] = {}


class Raw(bytes):
    """A method argument already encoded (a table with its 4-byte length, a shortstr with
    its length octet): field types pamqp never writes (short-short, float, unsigned), names
    that are not UTF-8, malformed nestings."""


def method_frame(channel: int, m: Any) -> bytes:
    """A method frame for ``m`` (a pamqp method), unvalidated; a Raw goes in as is."""
    out: list[bytes] = []
    bits = offset = 0
    in_bits = False
    for name in m.__slots__:
        kind = m.amqp_type(name)
        value = getattr(m, name, 0)
        if kind == "bit":
            if not in_bits:
                bits, offset, in_bits = 0, 0, True
            bits = encode.bit(value, bits, offset)
            offset += 1
            if offset == 8:
                out.append(encode.octet(bits))
                in_bits = False
            continue
        if in_bits:
            out.append(encode.octet(bits))
            in_bits = False
        out.append(bytes(value) if isinstance(value, Raw) else encode.by_type(value, kind))
    if in_bits:
        out.append(encode.octet(bits))
    payload = struct.pack(">I", m.index) + b"".join(out)
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frame_max = 131072
        self.answer: Any = None  # the broker's answer to connection.open

    @classmethod
    async def open(cls, url: str, vhost: str | None = None, *, heartbeat: int = 0) -> RawClient:
        """Connected and, unless ``vhost`` is given, opened on the URL's vhost."""
        host, port, user, password, url_vhost = address(url)
        reader, writer = await asyncio.open_connection(host, port)
        c = cls(reader, writer)
        answer = await c.handshake(user, password, url_vhost if vhost is None else vhost, heartbeat)
        if vhost is None:
            assert answer.name == "Connection.OpenOk", answer
        c.answer = answer
        return c

    async def handshake(self, user: str, password: str, vhost: str, heartbeat: int = 0) -> Any:
        """Up to connection.open; returns the broker's answer to it (open-ok, or a close)."""
        self.writer.write(b"AMQP\x00\x00\x09\x01")
        start = await self.frame()
        assert isinstance(start, C.Connection.Start), start
        caps = {"consumer_cancel_notify": True, "publisher_confirms": True, "basic.nack": True,
                "connection.blocked": True, "authentication_failure_close": True}
        self.send(0, C.Connection.StartOk(client_properties={"capabilities": caps}, mechanism="PLAIN",
                                          response=f"\x00{user}\x00{password}"))
        tune = await self.frame()
        assert isinstance(tune, C.Connection.Tune), tune
        self.frame_max = tune.frame_max
        self.send(0, C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                         heartbeat=heartbeat))
        self.send(0, method(C.Connection.Open, virtual_host=vhost))
        return await self.frame()

    def send(self, channel: int, *frames: Any) -> None:
        self.writer.write(b"".join(method_frame(channel, fr) if isinstance(fr, base.Frame) else F.marshal(fr, channel)
                                   for fr in frames))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                properties: C.Basic.Properties | None = None, mandatory: bool = False) -> None:
        props = properties or C.Basic.Properties()
        frames: list[Any] = [C.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
                             H.ContentHeader(0, len(body), props)]
        if body:
            frames.append(B.ContentBody(body))
        self.send(channel, *frames)

    async def frame(self) -> Any:
        return (await self.frame_on())[1]

    async def frame_on(self) -> tuple[int, Any]:
        """The next frame and its channel."""
        try:
            head = await self.reader.readexactly(7)
            size = struct.unpack(">I", head[3:7])[0]
            rest = await self.reader.readexactly(size + 1)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise Closed() from e
        ftype, channel = head[0], struct.unpack(">H", head[1:3])[0]
        if ftype == 2:  # not decoded: a broker may echo back properties pamqp cannot read
            return channel, SimpleNamespace(name="ContentHeader", body_size=struct.unpack(">Q", rest[4:12])[0],
                                            properties=rest[12:-1])
        if ftype == 3:
            return channel, SimpleNamespace(name="ContentBody", value=rest[:-1])
        return channel, F.unmarshal(head + rest)[2]

    async def until(self, *names: str, timeout: float = 10) -> list[Any]:
        """Frames up to and including the first whose name is in ``names`` (hang guard only)."""
        out: list[Any] = []
        async with asyncio.timeout(timeout):
            while True:
                fr = await self.frame()
                out.append(fr)
                if getattr(fr, "name", "") in names:
                    return out

    async def call(self, channel: int, method: Any, *answers: str) -> Any:
        """Send ``method``; the first frame named in ``answers`` (or a Channel/Connection.Close)."""
        self.send(channel, method)
        return (await self.until(*answers, "Channel.Close", "Connection.Close"))[-1]

    async def channel(self, number: int = 1) -> None:
        ok = await self.call(number, C.Channel.Open(), "Channel.OpenOk")
        assert ok.name == "Channel.OpenOk", ok

    async def closed_by_peer(self, timeout: float = 10) -> bool:
        """Whether the broker hangs up (reads until EOF; hang guard only)."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return True

    async def aclose(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
