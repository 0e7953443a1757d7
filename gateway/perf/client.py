"""A lean AMQP 0-9-1 client over an asyncio Protocol, for the load generator.

Why not pika / aio-pika: both build objects per frame and per message, which makes the
generator the bottleneck long before the broker (scripts/perf_compare.py measures this). This
client does the rare things (handshake, declarations, qos, consume, confirm.select) with pamqp
and the hot ones by hand (gateway.perf.frames), parsing incoming frames in one loop over one
buffer in `data_received`, without a task or an object per frame.

Theory of operation: one `AmqpClient` is one connection. `rpc()` sends a pamqp method and
awaits the reply type on that channel. Incoming basic.deliver + header + body frames become a
call to `on_delivery(channel, delivery_tag, sent_ns)` once the whole body has arrived (sent_ns
is the timestamp in the first 8 body bytes); basic.ack / basic.nack from the broker (publisher
confirms) become `on_confirm(delivery_tag, multiple, ok)`. Subclasses or callers set those.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlparse

from pamqp import commands, frame
from pamqp.base import Frame

from gateway.perf.frames import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, HEARTBEAT

__all__ = ["AmqpClient", "AmqpError", "BrokerAddress", "parse_uri"]

_FRAME_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_U64 = struct.Struct(">Q")
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "cmq-gateway perf",
    "platform": "Python",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}


class AmqpError(Exception):
    """The broker closed the channel or connection, or the connection failed."""


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_uri(uri: str) -> BrokerAddress:
    """amqp://user:pass@host:port/vhost as RabbitMQ reads it: the path, percent-decoded, is the
    vhost; an empty path means "/"."""
    parts = urlparse(uri)
    if parts.scheme != "amqp":
        raise ValueError(f"only amqp:// URIs are supported, not {uri!r}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return BrokerAddress(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5672,
        user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        vhost=unquote(path) if path else "/",
    )


def _ignore_delivery(channel: int, delivery_tag: int, sent_ns: int) -> None:
    return None


def _ignore_confirm(delivery_tag: int, multiple: bool, ok: bool) -> None:
    return None


class AmqpClient(asyncio.Protocol):
    """One AMQP connection; see the module docstring."""

    frame_max: int
    channel_max: int

    def __init__(self, address: BrokerAddress) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.frame_max = 131072
        self.channel_max = 2047
        self.on_delivery: Callable[[int, int, int], None] = _ignore_delivery
        self.on_confirm: Callable[[int, bool, bool], None] = _ignore_confirm
        self.error: AmqpError | None = None
        self._closing = False
        self._buf = bytearray()
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters: dict[int, list[tuple[tuple[type, ...], asyncio.Future[Frame]]]] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        # Content in progress: channel, delivery tag, bytes still expected, send timestamp.
        self._content_channel = 0
        self._content_tag = 0
        self._content_left = 0
        self._content_sent_ns = -1
        self._content_first = False
        self._content_is_delivery = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def connect(cls, address: BrokerAddress, timeout: float = 10.0, sndbuf: int = 0) -> AmqpClient:
        """``sndbuf``: the socket's kernel send buffer in bytes (0: the system's, which Linux
        grows to ``tcp_wmem``'s maximum, megabytes that a flood fills while the broker holds it)."""
        loop = asyncio.get_running_loop()
        transport, client = await asyncio.wait_for(
            loop.create_connection(lambda: cls(address), address.host, address.port), timeout
        )
        if sndbuf:
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        await asyncio.wait_for(asyncio.shield(client._opened), timeout)
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transport is not a subclass of asyncio.Transport, only shaped like one.
        self.transport = cast(asyncio.Transport, transport)
        transport = self.transport
        # A small user-space buffer (the kernel's socket buffer holds more) keeps "sent" honest:
        # a message counts as sent once written here, so little may wait unsent behind it.
        transport.set_write_buffer_limits(high=1 << 16, low=1 << 14)
        transport.write(_PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closing and exc is None and self.error is None:
            err = AmqpError("connection closed by this client")
        else:
            err = self.error or AmqpError(
                f"connection lost: {exc}" if exc else "connection closed by the broker"
            )
            self.error = err
        if not self._opened.done():
            self._opened.set_exception(err)
            self._opened.exception()  # retrieved: nobody may be waiting any more
        if not self._closed.done():
            self._closed.set_result(None)
        for waiters in self._waiters.values():
            for _, future in waiters:
                if not future.done():
                    future.set_exception(err)
        self._waiters.clear()
        self._writable.set()
        self._unblocked.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    @property
    def is_open(self) -> bool:
        return self.error is None and self.transport is not None and not self.transport.is_closing()

    async def close(self, timeout: float = 5.0) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.error is None:
            self._closing = True
            self.send_method(0, commands.Connection.Close(200, "Normal shutdown", 0, 0))
            try:
                await asyncio.wait_for(asyncio.shield(self._closed), timeout)
            except (TimeoutError, AmqpError):
                pass
        self.transport.close()

    # ------------------------------------------------------------------ sending

    def write(self, data: bytes | bytearray) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def unsent_bytes(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    async def writable(self) -> None:
        """Wait while the transport is above its high water mark or the broker sent
        connection.blocked (W5)."""
        if not self._writable.is_set():
            await self._writable.wait()
        if not self._unblocked.is_set():
            await self._unblocked.wait()
        if self.error is not None:
            raise self.error

    def send_method(self, channel: int, method: Frame) -> None:
        self.write(frame.marshal(method, channel))

    async def rpc(self, channel: int, method: Frame, *replies: type, timeout: float = 30.0) -> Frame:
        if self.error is not None:
            raise self.error
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(channel, []).append((replies, future))
        self.send_method(channel, method)
        return await asyncio.wait_for(future, timeout)

    async def open_channel(self, channel: int) -> None:
        await self.rpc(channel, commands.Channel.Open(), commands.Channel.OpenOk)

    # ------------------------------------------------------------------ receiving

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        end = len(buf)
        pos = 0
        # One clock read per socket read: every message in this read arrived at the same time
        # as far as this process can tell.
        now_ns = time.monotonic_ns()
        unpack_head = _FRAME_HEAD.unpack_from
        while end - pos >= 8:
            ftype, channel, size = unpack_head(buf, pos)
            fend = pos + 7 + size
            if fend >= end:
                break
            if buf[fend] != 0xCE:
                self._fail(AmqpError(f"frame end byte is {buf[fend]:#x}, not 0xce"))
                return
            if ftype == FRAME_METHOD:
                cls, meth = _CLASS_METHOD.unpack_from(buf, pos + 7)
                if cls == 60 and meth == 60:  # basic.deliver: only the delivery tag matters
                    ctag_len = buf[pos + 11]
                    (self._content_tag,) = _U64.unpack_from(buf, pos + 12 + ctag_len)
                    self._content_channel = channel
                    self._content_is_delivery = True
                elif cls == 60 and (meth == 80 or meth == 120):  # confirms: basic.ack / nack
                    (tag,) = _U64.unpack_from(buf, pos + 11)
                    self.on_confirm(tag, bool(buf[pos + 19] & 1), meth == 80)
                else:
                    self._slow_method(bytes(buf[pos : fend + 1]))
                    if self.error is not None:
                        return
            elif ftype == FRAME_HEADER:
                (self._content_left,) = _U64.unpack_from(buf, pos + 11)
                self._content_first = True
                self._content_sent_ns = -1
                if self._content_left == 0:
                    self._content_done(now_ns)
            elif ftype == FRAME_BODY:
                if self._content_first:
                    self._content_first = False
                    if size >= 8:
                        (self._content_sent_ns,) = _U64.unpack_from(buf, pos + 7)
                self._content_left -= size
                if self._content_left <= 0:
                    self._content_done(now_ns)
            elif ftype == FRAME_HEARTBEAT:
                self.write(HEARTBEAT)
            pos = fend + 1
        if pos:
            del buf[:pos]

    def _content_done(self, now_ns: int) -> None:
        if self._content_is_delivery:
            self._content_is_delivery = False
            sent = self._content_sent_ns
            self.on_delivery(self._content_channel, self._content_tag, now_ns - sent if sent >= 0 else -1)

    def _slow_method(self, raw: bytes) -> None:
        """Every method frame that is not on the hot path: decoded by pamqp."""
        _, channel, method = frame.unmarshal(raw)
        if isinstance(method, commands.Connection.Start):
            creds = f"\0{self.address.user}\0{self.address.password}"
            self.send_method(
                0, commands.Connection.StartOk(client_properties=_CLIENT_PROPERTIES, response=creds)
            )
        elif isinstance(method, commands.Connection.Tune):
            self.channel_max = min(method.channel_max or 2047, 2047)
            self.frame_max = min(method.frame_max or 131072, 131072)
            # heartbeat 0: a load generator is never idle long enough to need them, and we still
            # answer any the broker sends.
            self.send_method(0, commands.Connection.TuneOk(self.channel_max, self.frame_max, 0))
            self.send_method(0, commands.Connection.Open(virtual_host=self.address.vhost))
        elif isinstance(method, commands.Connection.OpenOk):
            if not self._opened.done():
                self._opened.set_result(None)
        elif isinstance(method, commands.Connection.Close):
            self.write(frame.marshal(commands.Connection.CloseOk(), 0))
            self._fail(AmqpError(f"connection closed by the broker: {method.reply_code} {method.reply_text}"))
        elif isinstance(method, commands.Connection.CloseOk):
            if not self._closed.done():
                self._closed.set_result(None)
            assert self.transport is not None
            self.transport.close()
        elif isinstance(method, commands.Connection.Blocked):
            self._unblocked.clear()
        elif isinstance(method, commands.Connection.Unblocked):
            self._unblocked.set()
        elif isinstance(method, commands.Channel.Close):
            self.write(frame.marshal(commands.Channel.CloseOk(), channel))
            err = AmqpError(
                f"channel {channel} closed by the broker: {method.reply_code} {method.reply_text}"
            )
            waiters = self._waiters.pop(channel, [])
            if waiters:
                for _, future in waiters:
                    if not future.done():
                        future.set_exception(err)
            else:
                self._fail(err)
        elif isinstance(method, commands.Basic.Return):
            # The returned content follows; it is not a delivery.
            self._content_is_delivery = False
        elif isinstance(method, commands.Basic.Cancel):
            self._fail(AmqpError(f"consumer {method.consumer_tag} cancelled by the broker"))
        elif isinstance(method, Frame):
            self._resolve(channel, method)

    def _resolve(self, channel: int, method: Frame) -> None:
        waiters = self._waiters.get(channel, [])
        for i, (types, future) in enumerate(waiters):
            if isinstance(method, types):
                del waiters[i]
                if not future.done():
                    future.set_result(method)
                return

    def _fail(self, err: AmqpError) -> None:
        if self.error is None:
            self.error = err
        if self.transport is not None:
            self.transport.close()
