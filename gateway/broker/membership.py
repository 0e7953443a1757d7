"""Which gateway owns what: the broker's membership seam (issue 28, aim 4).

Beside ``StoreBackend`` (records) and ``MessageStorage`` (queue messages, gateway.broker.storage),
:class:`Membership` is what a vhost asks where one gateway alone would decide by itself: whether
transient declarations are shared (recorded too), whether a queue is exclusive to a connection
of another gateway (CL4, 405 RESOURCE_LOCKED), and whether an auto-delete queue or an expired
one (x-expires) may go now or only once the other gateways agree. The embedded gateway is alone:
:class:`EmbeddedMembership` shares nothing and never holds anything back. The cluster's is
gateway.jetstream.membership.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.vhost import VHost

__all__ = ["EmbeddedMembership", "Membership"]


class Membership(Protocol):
    # True: transient and exclusive queues, exchanges and bindings are recorded too (marked
    # "durable": false), since a publish through another gateway must route to them.
    shares: bool
    # The id an exclusive queue's shared record names as its owner ("exclusive_owner").
    owner: str

    def locked(self, vhost: str, name: str) -> bool:
        """The queue is exclusive to a connection of another gateway (CL4)."""
        ...

    def used(self, q: BrokerQueue) -> None:
        """``q`` was used here at ``q.last_used`` (x-expires counts from its last use anywhere)."""
        ...

    def hold_auto_delete(self, vh: VHost, q: BrokerQueue) -> bool:
        """The last consumer here of auto-delete ``q`` left. True: the membership decides
        later (``vh.last_consumer_left``) whether it goes; False: it is decided now."""
        ...

    def hold_expiry(self, vh: VHost, q: BrokerQueue) -> bool:
        """``q``'s x-expires timer ran out here. True: the membership decides later
        (``vh.remove_expired``) whether it goes; False: it goes now."""
        ...


class EmbeddedMembership:
    """One gateway alone: every answer is its own."""

    shares = False
    owner = ""

    def __init__(self, broker: object = None) -> None:
        pass  # made as the cluster's is, given the broker; it needs nothing of it

    def locked(self, vhost: str, name: str) -> bool:
        return False

    def used(self, q: BrokerQueue) -> None:
        pass

    def hold_auto_delete(self, vh: VHost, q: BrokerQueue) -> bool:
        return False

    def hold_expiry(self, vh: VHost, q: BrokerQueue) -> bool:
        return False
