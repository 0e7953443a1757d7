"""Sans-IO AMQP 0-9-1 server core: bytes in, events out, bytes out (see connection.py)."""

from gateway.protocol.connection import ConnState, ServerConnection
from gateway.protocol.errors import LocalProtocolError, ProtocolViolation, RemoteProtocolError
from gateway.protocol.events import (
    BadProtocolHeader,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    Content,
    Event,
    HandshakeTimeout,
    HeartbeatTimeout,
    Method,
    ProtocolError,
    ProtocolHeaderOK,
    StartOk,
    TuneOk,
)
from gateway.protocol.fieldtable import Typed
from gateway.protocol.properties import Properties
from gateway.protocol.sasl import decode_amqplain, decode_plain, decode_response

__all__ = [
    "BadProtocolHeader",
    "ChannelClose",
    "ChannelCloseOk",
    "ChannelFlow",
    "ChannelOpen",
    "ConnState",
    "ConnectionClose",
    "ConnectionCloseOk",
    "ConnectionOpen",
    "Content",
    "Event",
    "HandshakeTimeout",
    "HeartbeatTimeout",
    "LocalProtocolError",
    "Method",
    "Properties",
    "ProtocolError",
    "ProtocolHeaderOK",
    "ProtocolViolation",
    "RemoteProtocolError",
    "ServerConnection",
    "StartOk",
    "TuneOk",
    "Typed",
    "decode_amqplain",
    "decode_plain",
    "decode_response",
]
