"""Typed protocol errors, as h11 types them (``h11/_util.py``).

A :class:`RemoteProtocolError` means the peer broke AMQP 0-9-1: it carries the reply code,
text and the class/method IDs that ``connection.close`` is sent with (SPEC M16). The
connection core catches it, queues the close and reports a ``ProtocolError`` event; it never
escapes ``next_event()``.

A :class:`LocalProtocolError` means our own code (broker or transport) asked the core for
something the protocol forbids (a method on a channel the core does not know, a body on
channel 0, a short string over 255 bytes). It is raised to the caller: it is a bug, not a
peer fault.
"""

from __future__ import annotations

from semantics.errors import REPLY_NAMES

__all__ = [
    "CHANNEL_ERROR",
    "COMMAND_INVALID",
    "FRAME_ERROR",
    "LocalProtocolError",
    "NOT_ALLOWED",
    "NOT_IMPLEMENTED",
    "PRECONDITION_FAILED",
    "ProtocolViolation",
    "RemoteProtocolError",
    "SYNTAX_ERROR",
    "UNEXPECTED_FRAME",
    "fit_reply_text",
    "reply_text",
]

# Connection-level reply codes of SPEC M16 (hard errors in AMQP 0-9-1).
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
# Channel-level, used by the core only for an oversized message (as RabbitMQ does).
PRECONDITION_FAILED = 406


def reply_text(code: int, detail: str) -> str:
    """The reply text as RabbitMQ formats it: ``NAME - detail``."""
    return f"{REPLY_NAMES.get(code, 'ERROR')} - {detail}"


def fit_reply_text(text: str) -> str:
    """A reply text is a short string (255 bytes); a refusal that quotes a client's 255-byte
    name is longer. RabbitMQ cuts it to 252 bytes and "..." (rabbit_binary_generator's
    amqp_exception_explanation); without the cut the close cannot be encoded at all."""
    raw = text.encode("utf-8")
    if len(raw) <= 255:
        return text
    return raw[:252].decode("utf-8", "ignore") + "..."


class ProtocolViolation(Exception):
    """Base of both kinds; ``reply_text`` is already prefixed with the code's name."""

    def __init__(self, reply_code: int, detail: str, *, class_id: int = 0, method_id: int = 0,
                 channel: int = 0) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text(reply_code, detail)
        self.class_id = class_id
        self.method_id = method_id
        self.channel = channel
        super().__init__(self.reply_text)


class RemoteProtocolError(ProtocolViolation):
    """The peer broke the protocol; the connection is closed with ``reply_code``."""


class LocalProtocolError(ProtocolViolation):
    """Our side asked for something the protocol forbids (a programming error)."""

    def __init__(self, detail: str) -> None:
        super().__init__(COMMAND_INVALID, detail)
