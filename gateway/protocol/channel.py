"""One AMQP channel as the core sees it: open or closing, and the content assembler.

Theory of operation (RabbitMQ's ``rabbit_command_assembler``): an open channel expects a
method frame. basic.publish makes it expect a content header for class 60, then body frames
until the header's body size is reached; then it emits a ``Content`` and expects a method
again. Any other frame type in any of these states is 505 UNEXPECTED_FRAME, with the class
and method IDs of the method being assembled.

After we send channel.close the channel is CLOSING: every frame but channel.close and
channel.close-ok is dropped (AMQP 0-9-1 2.2.4 / 1.5.2.5), including a half-sent content.
"""

from __future__ import annotations

import enum
from typing import Any

from gateway.protocol.errors import FRAME_ERROR, UNEXPECTED_FRAME, RemoteProtocolError
from gateway.protocol.events import Content
from gateway.protocol.properties import Properties

__all__ = ["Channel", "ChannelState"]


class ChannelState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # we sent channel.close, waiting for close-ok


class Channel:
    """Per-channel state; the connection owns the table of channels."""

    __slots__ = ("number", "state", "publish", "properties", "remaining", "chunks", "received")

    def __init__(self, number: int) -> None:
        self.number = number
        self.state = ChannelState.OPEN
        self.publish: Any = None  # the basic.publish whose content is being assembled
        self.properties: Properties | None = None  # set once the header arrived
        self.remaining = 0
        self.chunks: list[bytes] = []
        self.received = 0  # body bytes held in chunks (W5: counted as held memory)

    @property
    def expecting_method(self) -> bool:
        return self.publish is None

    def _unexpected(self, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(UNEXPECTED_FRAME, detail, class_id=60, method_id=40, channel=self.number)

    def start_content(self, publish: Any) -> None:
        self.publish = publish

    def reset(self) -> None:
        self.publish = None
        self.properties = None
        self.chunks = []
        self.remaining = 0
        self.received = 0

    def on_header(self, class_id: int, weight: int, body_size: int, raw_properties: bytes) -> Content | None:
        """The content header; a Content at once when the body is empty."""
        if self.publish is None or self.properties is not None:
            raise self._unexpected_any("content header")
        if class_id != 60 or weight != 0:
            raise self._unexpected(f"expected content header for class 60, got one for class {class_id} instead")
        try:
            props = Properties(raw_properties)
        except ValueError as exc:
            raise RemoteProtocolError(FRAME_ERROR, f"unable to parse content properties: {exc}",
                                      class_id=60, method_id=40, channel=self.number) from None
        if body_size == 0:
            content = Content(self.number, self.publish, props, b"")
            self.reset()
            return content
        self.properties = props
        self.remaining = body_size
        return None

    def on_body(self, payload: bytes) -> Content | None:
        """One body frame; a Content when the body is complete."""
        if self.properties is None:
            raise self._unexpected_any("content body")
        self.remaining -= len(payload)
        if self.remaining < 0:
            raise self._unexpected("content body frames are larger than the size in the content header")
        if self.remaining:
            self.chunks.append(payload)
            self.received += len(payload)
            return None
        # A one-frame body reaches the event as the very bytes object cut from the buffer.
        body = payload if not self.chunks else b"".join(self.chunks) + payload
        content = Content(self.number, self.publish, self.properties, body)
        self.reset()
        return content

    def _unexpected_any(self, got: str) -> RemoteProtocolError:
        if self.publish is None:
            return RemoteProtocolError(UNEXPECTED_FRAME, f"expected method frame, got {got} frame instead",
                                       channel=self.number)
        want = "content header" if self.properties is None else "content body"
        return self._unexpected(f"expected {want}, got {got} frame instead")
