"""Events the connection core hands to the transport and the broker.

Small frozen dataclasses with ``__slots__`` (as ``h11/_events.py``). What the core has already
answered on its own is said on each event, so that nobody answers twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.protocol.properties import Properties

__all__ = [
    "BadProtocolHeader",
    "ChannelClose",
    "ChannelCloseOk",
    "ChannelFlow",
    "ChannelOpen",
    "ConnectionClose",
    "ConnectionCloseOk",
    "ConnectionOpen",
    "Content",
    "Event",
    "HandshakeTimeout",
    "HeartbeatTimeout",
    "Method",
    "ProtocolError",
    "ProtocolHeaderOK",
    "StartOk",
    "TuneOk",
]


@dataclass(frozen=True, slots=True)
class ProtocolHeaderOK:
    """``AMQP\\x00\\x00\\x09\\x01`` was received; connection.start is already queued."""


@dataclass(frozen=True, slots=True)
class BadProtocolHeader:
    """W6: any other header. Our header is queued; flush it, then close the socket."""

    received: bytes


@dataclass(frozen=True, slots=True)
class StartOk:
    """connection.start-ok. Authenticate, then call ``send_tune()`` or ``close(403, ...)``.

    ``next_event()`` returns None until one of them is called.
    """

    mechanism: str
    response: bytes
    locale: str
    client_properties: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TuneOk:
    """connection.tune-ok, already validated and applied (W3)."""

    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class ConnectionOpen:
    """connection.open. Call ``send_open_ok()`` or ``close(530, ...)``.

    ``next_event()`` returns None until one of them is called.
    """

    vhost: str


@dataclass(frozen=True, slots=True)
class ChannelOpen:
    """channel.open; the core has already sent channel.open-ok."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelClose:
    """The client closed the channel; the core has already sent channel.close-ok and
    forgotten the channel (its number may be reused by the next event)."""

    channel: int
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ChannelCloseOk:
    """The client confirmed a channel.close we sent; the channel is gone."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelFlow:
    """channel.flow from the client; the core has already sent channel.flow-ok."""

    channel: int
    active: bool


# Method and Content are made for every message (publish, ack): not frozen, because a
# frozen dataclass sets each field through object.__setattr__ (0.54 vs 0.15 us a Content).
# Nothing changes them after the core makes them.
@dataclass(slots=True)
class Method:
    """Any other method on an open channel (a pamqp command object)."""

    channel: int
    method: Any


@dataclass(slots=True)
class Content:
    """A complete basic.publish: method, header and every body frame."""

    channel: int
    method: Any  # pamqp.commands.Basic.Publish
    properties: Properties
    body: bytes


@dataclass(frozen=True, slots=True)
class ConnectionClose:
    """The client closed the connection; close-ok is queued. Flush, then close the socket."""

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ConnectionCloseOk:
    """The client confirmed our connection.close. Close the socket."""


@dataclass(frozen=True, slots=True)
class HeartbeatTimeout:
    """W3: no byte from the peer for two heartbeat intervals. Close the socket."""


@dataclass(frozen=True, slots=True)
class HandshakeTimeout:
    """SE4: the connection was not open ``handshake_timeout`` seconds after it began; ``state``
    is the stage it was stuck in (a ``ConnState`` value). Nothing is sent: reset the socket."""

    state: str


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """The peer broke the protocol; connection.close with these values is already queued.

    Everything but close-ok / close is ignored from now on (wait for close-ok, with a timeout).
    """

    reply_code: int
    reply_text: str
    channel: int
    class_id: int
    method_id: int


Event = (ProtocolHeaderOK | BadProtocolHeader | StartOk | TuneOk | ConnectionOpen | ChannelOpen
         | ChannelClose | ChannelCloseOk | ChannelFlow | Method | Content | ConnectionClose
         | ConnectionCloseOk | HeartbeatTimeout | HandshakeTimeout | ProtocolError)
