"""The server side of one AMQP 0-9-1 connection, sans-IO (modelled on h11's ``Connection``).

Theory of operation
-------------------
The transport feeds bytes in (``receive_data``), pulls events out (``next_event``, None when
it needs more bytes or waits for the transport's decision), and writes what
``data_to_send`` returns. The broker answers through ``send_*`` / ``close_channel`` /
``close``. Nothing here touches a socket or a clock: ``tick(now)`` is called by the
transport (about once a second) for heartbeats (SPEC W3) and the handshake deadline (SE4).

Connection states (a method on channel 0 moves the connection along the arrows; the two
states marked * wait on the transport, and ``next_event`` returns None there)::

    EXPECT_HEADER --header ok--> EXPECT_START_OK --start-ok--> AUTHENTICATING*
    AUTHENTICATING* --send_tune()--> EXPECT_TUNE_OK --tune-ok--> EXPECT_OPEN
    EXPECT_OPEN --open--> OPENING* --send_open_ok()--> OPEN
    any --close()/peer error--> CLOSING --close-ok--> CLOSED
    any --peer's close / bad header / lost framing / heartbeat timeout--> CLOSED

When the state is CLOSED (``conn.closed``), the transport flushes ``data_to_send()`` and
closes the socket; after the peer's own connection.close it leaves the socket for the peer
to close (bounded), as RabbitMQ does, and the core drops whatever still arrives. In CLOSING every frame but connection.close / close-ok is dropped, as
AMQP 0-9-1 requires after a close was sent.

Faults and their codes follow RabbitMQ (``rabbit_reader``, ``rabbit_command_assembler``,
``rabbit_binary_parser``): frame too large, bad end octet, unknown frame type and an
undecodable method or content header are 501 FRAME_ERROR; a frame of the wrong kind in the
assembler is 505 UNEXPECTED_FRAME; a method on a channel that was never opened is 504
CHANNEL_ERROR; negotiated values out of range and too many channels are 530 NOT_ALLOWED.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from typing import Any

from pamqp import commands

from gateway.protocol import codec, fastpath
from gateway.protocol.channel import Channel, ChannelState
from gateway.protocol.errors import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    LocalProtocolError,
    RemoteProtocolError,
    reply_text,
)
from gateway.protocol.events import (
    BadProtocolHeader,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    Event,
    HandshakeTimeout,
    HeartbeatTimeout,
    Method,
    ProtocolError,
    ProtocolHeaderOK,
    StartOk,
    TuneOk,
)
from gateway.protocol.properties import Properties
from gateway.protocol.sasl import MECHANISMS

__all__ = ["ConnState", "ServerConnection"]

C = commands
_CHANNEL_OPEN = C.Channel.Open.index
_CHANNEL_CLOSE = C.Channel.Close.index
_CHANNEL_CLOSE_OK = C.Channel.CloseOk.index
_CHANNEL_FLOW = C.Channel.Flow.index
_UPDATE_SECRET = C.Connection.UpdateSecret.index
_PUBLISH = C.Basic.Publish.index
# Content-bearing methods only a server may send (RabbitMQ's method_has_content).
_SERVER_CONTENT = frozenset((C.Basic.Deliver.index, C.Basic.GetOk.index, C.Basic.Return.index))
# Replies the core sends by itself; a second one from the broker is dropped.
_AUTO_REPLIES = frozenset((C.Channel.OpenOk.index, C.Channel.CloseOk.index, C.Channel.FlowOk.index))
_U32 = struct.Struct(">I")
_COMPACT_AT = 1 << 16  # compact the input buffer once this much of it has been consumed


class ConnState(enum.Enum):
    EXPECT_HEADER = "expect_header"
    EXPECT_START_OK = "expect_start_ok"
    AUTHENTICATING = "authenticating"
    EXPECT_TUNE_OK = "expect_tune_ok"
    EXPECT_OPEN = "expect_open"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# Read as module globals where every delivery tests them: a member read through its Enum
# class goes through EnumType.__getattr__'s slot (~50 ns against ~6 for a global, 3.11).
_CONN_OPEN = ConnState.OPEN
_CHAN_OPEN = ChannelState.OPEN


# The handshake as a transition table: (state, method received on channel 0) -> next state.
# connection.close is accepted in every state; anything else is "unexpected method" (504).
_HANDSHAKE = {
    (ConnState.EXPECT_START_OK, C.Connection.StartOk.index): ConnState.AUTHENTICATING,
    (ConnState.EXPECT_TUNE_OK, C.Connection.TuneOk.index): ConnState.EXPECT_OPEN,
    (ConnState.EXPECT_OPEN, C.Connection.Open.index): ConnState.OPENING,
}
# A tuple, not a set: next_event tests it once a frame, and a set would hash the member with
# Enum.__hash__, Python code (1.4 % of scenario 1's event loop in py-spy); a tuple compares
# by identity first, in C.
_WAITING = (ConnState.AUTHENTICATING, ConnState.OPENING, ConnState.CLOSED)
# Before OPEN the whole handshake must fit in ``handshake_timeout`` (SE4).
_HANDSHAKING = frozenset((ConnState.EXPECT_HEADER, ConnState.EXPECT_START_OK, ConnState.AUTHENTICATING,
                          ConnState.EXPECT_TUNE_OK, ConnState.EXPECT_OPEN, ConnState.OPENING))
_STATE_NAMES = {  # as rabbit_reader names them in "unexpected method in connection state X"
    ConnState.EXPECT_START_OK: "starting",
    ConnState.EXPECT_TUNE_OK: "tuning",
    ConnState.EXPECT_OPEN: "opening",
    ConnState.OPEN: "running",
}


def _snippet(payload: bytes) -> str:
    """rabbit_reader's payload snippet: all octets up to 16, else the first 16."""
    if len(payload) <= 16:
        return f"all octets = {payload!r}"
    return f"first 16 octets = {payload[:16]!r}"


class ServerConnection:
    """One connection, server side. See the module docstring for the theory of operation."""

    def __init__(self, server_properties: Mapping[str, Any] | None = None, *, frame_max: int = 131072,
                 channel_max: int = 2047, heartbeat: int = 60, max_message_size: int = 128 << 20,
                 mechanisms: str = MECHANISMS, locales: str = "en_US",
                 handshake_timeout: float = 10.0) -> None:
        self.server_properties = dict(server_properties or {})  # W1: passed through as given
        self.server_frame_max = frame_max
        self.server_channel_max = channel_max
        self.server_heartbeat = heartbeat
        self.max_message_size = max_message_size
        self.mechanisms = mechanisms
        self.locales = locales
        self.handshake_timeout = handshake_timeout
        # Negotiated values (W3); before tune-ok a frame may be as large as our own limit.
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = 0
        self.state = ConnState.EXPECT_HEADER
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.vhost: str | None = None
        self._in: bytes | bytearray = b""
        self._pos = 0
        self._out = bytearray()
        self._channels: dict[int, Channel] = {}
        self._received = 0
        self._sent = False
        self._last_recv: float | None = None
        self._last_send: float | None = None
        self._began: float | None = None  # the first tick: the transport calls it on accept

    # ------------------------------------------------------------------ properties

    @property
    def closed(self) -> bool:
        """True once the socket should be closed (after flushing ``data_to_send()``)."""
        return self.state is ConnState.CLOSED

    def is_open(self, channel: int) -> bool:
        """Whether ``channel`` is open (not closing) on an open connection."""
        chan = self._channels.get(channel)
        return chan is not None and chan.state is _CHAN_OPEN and self.state is _CONN_OPEN

    @property
    def open_channels(self) -> list[int]:
        return [n for n, c in self._channels.items() if c.state is ChannelState.OPEN]

    # ------------------------------------------------------------------ bytes in

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer (any split; events come out of ``next_event``)."""
        if not data or self.state is ConnState.CLOSED:
            return  # after close-ok the socket lingers for the peer to close it: drop what comes
        self._received += len(data)
        buf = self._in
        if self._pos >= len(buf):
            # The usual case, whole frames per read: keep the bytes object itself as the
            # buffer, so a body is cut from it with a single copy.
            self._in = data if type(data) is bytes else bytes(data)
            self._pos = 0
            return
        if isinstance(buf, bytes):
            buf = self._in = bytearray(memoryview(buf)[self._pos:])
            self._pos = 0
        elif self._pos >= _COMPACT_AT:
            del buf[:self._pos]
            self._pos = 0
        buf += data

    def _payload(self, start: int, end: int) -> bytes:
        return fastpath.cut(self._in, start, end)

    def next_event(self) -> Event | None:
        """The next event, or None: more bytes are needed, or the transport must answer
        StartOk / ConnectionOpen first, or the connection is closed."""
        while True:
            state = self.state
            if state is ConnState.OPEN:
                # The two methods of every message (publish with its content, ack) skip the
                # general path when they are well-formed; anything else falls through to it.
                got = fastpath.fast_event(self._in, self._pos, self.frame_max, self.max_message_size,
                                          self._channels)
                if got is not None:
                    self._pos = got[1]
                    return got[0]
            elif state in _WAITING:
                return None
            try:
                if state is ConnState.EXPECT_HEADER:
                    return self._read_header()
                buf = self._in
                pos = self._pos
                if len(buf) - pos < 7:
                    return None
                ftype, channel, size = codec.FRAME_HEAD.unpack_from(buf, pos)
                # rabbit_reader lets a payload reach frame_max (its 8-octet "fudge" for
                # clients that forget the frame overhead); anything larger is fatal.
                if self.frame_max and size > self.frame_max:
                    return self._fatal(f"type {ftype}, frame_too_large: payload of {size} octets "
                                       f"exceeds the negotiated frame_max {self.frame_max}", channel)
                if len(buf) - pos < size + 8:
                    return None
                start = pos + 7
                end = start + size
                if buf[end] != codec.FRAME_END:
                    return self._fatal(f"type {ftype}, {_snippet(bytes(buf[start:end]))}: "
                                       f"invalid_frame_end_marker {buf[end]}", channel)
                self._pos = end + 1
                event = self._on_frame(ftype, channel, start, end)
            except RemoteProtocolError as exc:
                return self._fail(exc)
            if event is not None:
                return event

    def _read_header(self) -> Event | None:
        buf = self._in
        if len(buf) - self._pos < 8:
            return None
        received = bytes(buf[self._pos:self._pos + 8])
        self._pos += 8
        if received != codec.PROTOCOL_HEADER:
            # W6: answer with the header we speak, then close (rabbit_reader refuse_connection).
            self._out += codec.PROTOCOL_HEADER
            self.state = ConnState.CLOSED
            return BadProtocolHeader(received)
        self._queue_method(0, C.Connection.Start(
            version_major=0, version_minor=9, server_properties=self.server_properties,
            mechanisms=self.mechanisms, locales=self.locales))
        self.state = ConnState.EXPECT_START_OK
        return ProtocolHeaderOK()

    # ------------------------------------------------------------------ frames

    def _on_frame(self, ftype: int, channel: int, start: int, end: int) -> Event | None:
        if self.state is ConnState.CLOSING:
            return self._on_frame_closing(ftype, channel, start, end)
        if ftype == codec.FRAME_METHOD:
            if channel == 0:
                return self._on_connection_method(self._decode(0, start, end))
            if self.state is not ConnState.OPEN:
                raise self._unexpected_frame(ftype, channel, start, end)
            return self._on_channel_method(channel, start, end)
        if ftype == codec.FRAME_HEARTBEAT:
            if end != start:
                raise self._frame_error(ftype, channel, start, end, "unknown_frame")
            if channel != 0:
                raise self._unexpected_frame(ftype, channel, start, end)
            return None
        if ftype == codec.FRAME_HEADER or ftype == codec.FRAME_BODY:
            if channel == 0 or self.state is not ConnState.OPEN:
                raise self._unexpected_frame(ftype, channel, start, end)
            chan = self._channels.get(channel)
            if chan is None:
                raise RemoteProtocolError(UNEXPECTED_FRAME, "expected method frame, got non method frame instead",
                                          channel=channel)
            if chan.state is ChannelState.CLOSING:
                return None
            if ftype == codec.FRAME_BODY:
                return chan.on_body(self._payload(start, end))
            try:
                class_id, weight, body_size, props = codec.decode_content_header(self._in, start, end)
            except ValueError:
                raise self._frame_error(ftype, channel, start, end, "unknown_frame") from None
            if body_size > self.max_message_size and chan.publish is not None and chan.properties is None:
                # As rabbit_channel: a channel error; the closing channel drops the body frames.
                self.close_channel(channel, 406, reply_text(
                    PRECONDITION_FAILED, f"message size {body_size} is larger than configured max size "
                                         f"{self.max_message_size}"), 60, 40)
                return None
            return chan.on_header(class_id, weight, body_size, props)
        raise self._frame_error(ftype, channel, start, end, "unknown_frame")

    def _on_frame_closing(self, ftype: int, channel: int, start: int, end: int) -> Event | None:
        if ftype != codec.FRAME_METHOD or channel != 0 or end - start < 4:
            return None
        index = _U32.unpack_from(self._in, start)[0]
        if index == C.Connection.CloseOk.index:
            self.state = ConnState.CLOSED
            return ConnectionCloseOk()
        if index == C.Connection.Close.index:
            self._queue_method(0, C.Connection.CloseOk())
            self.state = ConnState.CLOSED
            return ConnectionCloseOk()
        return None

    def _decode(self, channel: int, start: int, end: int) -> Any:
        try:
            return codec.decode_method(self._in, start, end)
        except KeyError:
            # RabbitMQ's reader exits on an unknown method ID and drops the socket without
            # a close; we close properly and name the IDs instead.
            index = _U32.unpack_from(self._in, start)[0]
            raise RemoteProtocolError(NOT_IMPLEMENTED, f"unknown method class {index >> 16} method "
                                      f"{index & 0xFFFF}", class_id=index >> 16, method_id=index & 0xFFFF,
                                      channel=channel) from None
        except ValueError:
            if end - start < 4:
                raise self._frame_error(codec.FRAME_METHOD, channel, start, end, "unknown_frame") from None
            index = _U32.unpack_from(self._in, start)[0]
            raise RemoteProtocolError(FRAME_ERROR, f"cannot decode {self._payload(start + 4, end)[:64]!r}",
                                      class_id=index >> 16, method_id=index & 0xFFFF, channel=channel) from None

    def _on_connection_method(self, method: Any) -> Event | None:
        index = method.index
        state = self.state
        if index == _UPDATE_SECRET and state is ConnState.OPEN:
            # As RabbitMQ 3.10 (checked against it): update-secret-ok; its internal user
            # database keeps the connection's login and accepts any new secret.
            self._queue_method(0, C.Connection.UpdateSecretOk())
            return None
        if index == C.Connection.Close.index:
            self._queue_method(0, C.Connection.CloseOk())
            self.state = ConnState.CLOSED
            return ConnectionClose(method.reply_code, method.reply_text, method.class_id, method.method_id)
        next_state = _HANDSHAKE.get((state, index))
        if next_state is None:
            class_id, method_id = codec.method_ids(method)
            raise RemoteProtocolError(CHANNEL_ERROR, f"unexpected method in connection state "
                                      f"{_STATE_NAMES.get(state, state.value)}", class_id=class_id,
                                      method_id=method_id)
        if next_state is ConnState.AUTHENTICATING:
            self.client_properties = method.client_properties or {}
            caps = self.client_properties.get("capabilities")
            self.capabilities = caps if isinstance(caps, dict) else {}
            self.state = next_state
            response = method.response
            if isinstance(response, str):
                response = response.encode("utf-8", "surrogateescape")
            return StartOk(method.mechanism, response, method.locale, self.client_properties)
        if next_state is ConnState.EXPECT_OPEN:
            self._check_negotiated("frame_max", codec.FRAME_MIN_SIZE, method.frame_max, self.server_frame_max)
            self._check_negotiated("channel_max", 1, method.channel_max, self.server_channel_max)
            self.frame_max = method.frame_max
            self.channel_max = method.channel_max
            self.heartbeat = method.heartbeat
            self.state = next_state
            return TuneOk(method.channel_max, method.frame_max, method.heartbeat)
        self.vhost = method.virtual_host
        self.state = next_state
        return ConnectionOpen(method.virtual_host)

    @staticmethod
    def _check_negotiated(field: str, minimum: int, client: int, server: int) -> None:
        """rabbit_reader's validate_negotiated_integer_value: 530 against connection.tune."""
        if client != 0 and client < minimum:
            raise RemoteProtocolError(NOT_ALLOWED, f"negotiated {field} = {client} is lower than the minimum "
                                      f"allowed value ({minimum})", class_id=10, method_id=30)
        if server != 0 and (client == 0 or client > server):
            raise RemoteProtocolError(NOT_ALLOWED, f"negotiated {field} = {client} is higher than the maximum "
                                      f"allowed value ({server})", class_id=10, method_id=30)

    def _on_channel_method(self, channel: int, start: int, end: int) -> Event | None:
        chan = self._channels.get(channel)
        if chan is not None and chan.state is ChannelState.CLOSING:
            # Only close / close-ok count on a channel we are closing; the rest is dropped.
            if end - start < 4:
                return None
            index = _U32.unpack_from(self._in, start)[0]
            if index == _CHANNEL_CLOSE:
                self._queue_method(channel, C.Channel.CloseOk())
            elif index == _CHANNEL_CLOSE_OK:
                del self._channels[channel]
                return ChannelCloseOk(channel)
            return None
        method = self._decode(channel, start, end)
        index = method.index
        if chan is None:
            if index != _CHANNEL_OPEN:
                class_id, method_id = codec.method_ids(method)
                raise RemoteProtocolError(CHANNEL_ERROR, "expected 'channel.open'", class_id=class_id,
                                          method_id=method_id, channel=channel)
            if self.channel_max and len(self._channels) >= self.channel_max:
                raise RemoteProtocolError(NOT_ALLOWED, f"number of channels opened ({len(self._channels)}) has "
                                          f"reached the negotiated channel_max ({self.channel_max})",
                                          class_id=20, method_id=10, channel=channel)
            self._channels[channel] = Channel(channel)
            self._queue_method(channel, C.Channel.OpenOk())
            return ChannelOpen(channel)
        if not chan.expecting_method:
            raise chan._unexpected_any("method")
        if index == _PUBLISH:
            chan.start_content(method)
            return None
        if index == _CHANNEL_CLOSE:
            del self._channels[channel]
            self._queue_method(channel, C.Channel.CloseOk())
            return ChannelClose(channel, method.reply_code, method.reply_text, method.class_id, method.method_id)
        if index == _CHANNEL_FLOW:
            if not method.active:
                # As RabbitMQ 3.x (rabbit_channel): a client may not stop the server's
                # deliveries with channel.flow; a connection error 540 "active=false".
                raise RemoteProtocolError(NOT_IMPLEMENTED, "active=false", class_id=20, method_id=20)
            self._queue_method(channel, C.Channel.FlowOk(active=method.active))
            return ChannelFlow(channel, method.active)
        if index == _CHANNEL_OPEN:
            raise RemoteProtocolError(CHANNEL_ERROR, "second 'channel.open' seen", class_id=20, method_id=10,
                                      channel=channel)
        if index in _SERVER_CONTENT or index == _CHANNEL_CLOSE_OK:
            class_id, method_id = codec.method_ids(method)
            raise RemoteProtocolError(COMMAND_INVALID, "unimplemented method", class_id=class_id,
                                      method_id=method_id, channel=channel)
        return Method(channel, method)

    # ------------------------------------------------------------------ errors

    def _frame_error(self, ftype: int, channel: int, start: int, end: int, what: str) -> RemoteProtocolError:
        return RemoteProtocolError(FRAME_ERROR, f"type {ftype}, {_snippet(self._payload(start, end))}: {what}",
                                   channel=channel)

    def _unexpected_frame(self, ftype: int, channel: int, start: int, end: int) -> RemoteProtocolError:
        return RemoteProtocolError(UNEXPECTED_FRAME, f"type {ftype}, {_snippet(self._payload(start, end))}",
                                   channel=channel)

    def _fail(self, exc: RemoteProtocolError) -> ProtocolError:
        """Queue connection.close for a peer's fault; from now on wait for close-ok."""
        self._channels.clear()
        self._queue_method(0, C.Connection.Close(reply_code=exc.reply_code, reply_text=exc.reply_text,
                                                 class_id=exc.class_id, method_id=exc.method_id))
        self.state = ConnState.CLOSING
        return ProtocolError(exc.reply_code, exc.reply_text, exc.channel, exc.class_id, exc.method_id)

    def _fatal(self, detail: str, channel: int) -> ProtocolError:
        """A framing fault: we lost sync with the peer, so close without waiting for close-ok
        (rabbit_reader's fatal_frame_error). A connection already closing has sent its one
        connection.close: it only hangs up, as RabbitMQ does."""
        if self.state is ConnState.CLOSING:
            event = ProtocolError(FRAME_ERROR, reply_text(FRAME_ERROR, detail), channel, 0, 0)
        else:
            event = self._fail(RemoteProtocolError(FRAME_ERROR, detail, channel=channel))
        self.state = ConnState.CLOSED
        self._in = b""
        self._pos = 0
        return event

    def partial_body_bytes(self) -> int:
        """Body bytes of contents still being assembled, on every channel (W5: held memory)."""
        return sum(chan.received for chan in self._channels.values()) if self._channels else 0

    def reading_paused(self) -> None:
        """W3/W5: the transport does not read from the peer (connection.blocked): its silence
        is ours, so it does not count toward the heartbeat timeout (RabbitMQ pauses its
        heartbeat monitor while a connection is blocked)."""
        self._received += 1

    # ------------------------------------------------------------------ bytes out

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, as one bytes object."""
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._sent = True
        return data

    def _queue_method(self, channel: int, method: Any) -> None:
        self._out += codec.encode_method(channel, method)

    def _sendable(self, channel: int) -> bool:
        """Sends to a channel that is gone or closing are dropped: the broker may race with
        the client's channel.close, and the events that tell it come in order anyway."""
        if channel == 0:
            raise LocalProtocolError("channel 0 carries only connection methods")
        chan = self._channels.get(channel)
        return chan is not None and chan.state is _CHAN_OPEN and self.state is _CONN_OPEN

    def send_tune(self) -> None:
        """After StartOk, once the transport authenticated the peer."""
        if self.state is not ConnState.AUTHENTICATING:
            raise LocalProtocolError(f"send_tune() in state {self.state.value}")
        self._queue_method(0, C.Connection.Tune(channel_max=self.server_channel_max,
                                                frame_max=self.server_frame_max,
                                                heartbeat=self.server_heartbeat))
        self.state = ConnState.EXPECT_TUNE_OK

    def send_open_ok(self) -> None:
        """After ConnectionOpen, once the transport allowed the vhost."""
        if self.state is not ConnState.OPENING:
            raise LocalProtocolError(f"send_open_ok() in state {self.state.value}")
        self._queue_method(0, C.Connection.OpenOk())
        self.state = ConnState.OPEN

    def send_method(self, channel: int, method: Any) -> None:
        """Any pamqp method. channel.close and connection.close go through close_channel()
        and close(); open-ok, close-ok and flow-ok are sent by the core and dropped here."""
        index = method.index
        if channel == 0:
            if index == C.Connection.Close.index:
                self.close(method.reply_code, method.reply_text, method.class_id, method.method_id)
                return
            if index >> 16 != 10:
                raise LocalProtocolError(f"{method.name} on channel 0")
            if self.state not in (ConnState.CLOSING, ConnState.CLOSED):
                self._queue_method(0, method)
            return
        if index == _CHANNEL_CLOSE:
            self.close_channel(channel, method.reply_code, method.reply_text, method.class_id, method.method_id)
            return
        if index in _AUTO_REPLIES or not self._sendable(channel):
            return
        self._out += codec.encode_method(channel, method)

    def send_content(self, channel: int, method: Any, properties: Properties | bytes | Any, body: bytes) -> None:
        """A method with content (basic.deliver / get-ok / return), the body split by frame_max.

        ``properties``: a Properties, raw property bytes, a pamqp Basic.Properties or None.
        """
        if not self._sendable(channel):
            return
        if isinstance(properties, Properties):
            raw = properties.raw
        elif isinstance(properties, bytes | bytearray):
            raw = bytes(properties)
        elif properties is None:
            raw = b"\x00\x00"
        else:
            raw = properties.marshal()
        out = self._out
        out += codec.encode_method(channel, method)
        out += codec.encode_content_header(channel, len(body), raw)
        codec.encode_body(out, channel, body, self.frame_max)

    def send_deliver(self, channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                     exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        """basic.deliver + header + body, hand-written (the hot path of every consumer)."""
        chan = self._channels.get(channel)  # _sendable's test inlined: once per delivery
        if chan is None or chan.state is not _CHAN_OPEN or self.state is not _CONN_OPEN:
            self._sendable(channel)  # raises for channel 0
            return
        fastpath.append_deliver(self._out, channel, consumer_tag, delivery_tag, redelivered, exchange,
                                routing_key, properties, body, self.frame_max)

    def send_get_ok(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str,
                    routing_key: str, message_count: int, properties: bytes, body: bytes) -> None:
        """basic.get-ok + header + body, hand-written."""
        if not self._sendable(channel):
            return
        codec.encode_get_ok(self._out, channel, delivery_tag, redelivered, codec.shortstr(exchange),
                            codec.shortstr(routing_key), message_count, properties, body, self.frame_max)

    def send_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        """basic.ack (publisher confirms), hand-written."""
        if self._sendable(channel):
            self._out += codec.encode_ack(channel, delivery_tag, multiple)

    def close_channel(self, channel: int, reply_code: int, reply_text: str, class_id: int = 0,
                      method_id: int = 0) -> None:
        """Send channel.close; the channel then ignores all but close / close-ok."""
        chan = self._channels.get(channel)
        if chan is None or chan.state is not ChannelState.OPEN or self.state is not ConnState.OPEN:
            return
        chan.state = ChannelState.CLOSING
        chan.reset()
        self._queue_method(channel, C.Channel.Close(reply_code=reply_code, reply_text=reply_text,
                                                    class_id=class_id, method_id=method_id))

    def close(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Send connection.close (e.g. 403 after a failed login, 530 for a vhost, 320 on
        shutdown); then only close-ok / close count."""
        if self.state in (ConnState.CLOSING, ConnState.CLOSED):
            return
        if self.state is ConnState.EXPECT_HEADER:
            self.state = ConnState.CLOSED
            return
        self._channels.clear()
        self._queue_method(0, C.Connection.Close(reply_code=reply_code, reply_text=reply_text,
                                                 class_id=class_id, method_id=method_id))
        self.state = ConnState.CLOSING

    def send_blocked(self, reason: str = "low on resources") -> bool:
        """W5: connection.blocked, only to a client that advertised the capability."""
        if self.state is ConnState.OPEN and self.capabilities.get("connection.blocked") is True:
            self._queue_method(0, C.Connection.Blocked(reason=reason))
            return True
        return False

    def send_unblocked(self) -> bool:
        """W5: connection.unblocked, only to a client that advertised the capability."""
        if self.state is ConnState.OPEN and self.capabilities.get("connection.blocked") is True:
            self._queue_method(0, C.Connection.Unblocked())
            return True
        return False

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> list[Event]:
        """W3: queue a heartbeat after one interval of our silence; HeartbeatTimeout (and
        CLOSED) after two intervals without a byte from the peer. SE4: HandshakeTimeout (and
        CLOSED, nothing queued) when not OPEN ``handshake_timeout`` seconds after the first tick.

        One deadline for the whole handshake, not one per stage, as RabbitMQ 3.10 does (its
        ``handshake_timeout`` timer starts at accept): a client that dribbles one method just
        before each stage's limit would otherwise hold the socket for four limits."""
        if self._began is None:
            self._began = now
        if (self.state in _HANDSHAKING and self.handshake_timeout
                and now - self._began >= self.handshake_timeout):
            stuck = self.state
            self.state = ConnState.CLOSED
            self._out.clear()
            return [HandshakeTimeout(stuck.value)]
        if self._last_recv is None or self._last_send is None:
            self._last_recv = self._last_send = now
        if self._received:
            self._received = 0
            self._last_recv = now
        if self._sent:
            self._sent = False
            self._last_send = now
        interval = self.heartbeat
        if not interval or self.state is ConnState.CLOSED:
            return []
        if now - self._last_recv >= 2 * interval:
            self.state = ConnState.CLOSED
            return [HeartbeatTimeout()]
        if now - self._last_send >= interval:
            self._out += codec.HEARTBEAT_FRAME
            self._last_send = now
        return []
