"""One AMQP connection's view of the broker: its channels, consumers, confirms and tx."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.broker.broker import Broker

__all__ = ["Session"]


class Session:
    """Created by the transport after the handshake, one per connection.

    The transport feeds channel events to :meth:`on_event`; the session answers through
    ``conn`` (send_method / send_content / send_deliver / close_channel / close) and calls
    ``request_flush()`` whenever it wrote outside of ``on_event`` (deliveries caused by
    another connection, confirms after fsync, timers).
    """

    def __init__(self, broker: Broker, conn: Any, vhost: str, user: str, peer: str,
                 request_flush: Callable[[], None]) -> None:
        self.broker = broker
        self.conn = conn
        self.vhost = vhost
        self.user = user
        self.peer = peer
        self.request_flush = request_flush

    def on_event(self, event: object) -> None:
        """ChannelOpen / ChannelClose / ChannelCloseOk / ChannelFlow / Method / Content."""
        raise NotImplementedError

    def pause_delivery(self) -> None:
        """Transport write buffer above high water: stop pushing deliveries (slow consumer)."""

    def resume_delivery(self) -> None:
        """Write buffer drained below low water: deliver again."""

    def on_connection_lost(self) -> None:
        """Unacked deliveries become Active again (M13); exclusive queues are dropped."""
