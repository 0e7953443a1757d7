"""The gateway's side of a durable queue folding its backlog (semantics.queue_cold.LiveRun).

A persistent message published by the running process costs ~1 KB of objects even with its
body on disk (issue 15). Once its queue's backlog is long, the queue folds it into a run of
array entries and lets go of the objects; :class:`DiskPayloads` is what lets it: a message
whose body is on disk and whose record is under its queue's key comes back, when the queue
thaws it, as :func:`~gateway.broker.message.recovered` makes a message restored at a
restart: the same properties, names and enqueue time, its body read from the store when
delivered. What it keeps per message is a ``ref`` to the (properties, exchange, routing
key) it shares with others of its queue.
"""

from __future__ import annotations

from typing import Any

from gateway.broker import persistence as P
from gateway.broker.message import DiskMessage, recovered
from gateway.broker.recovery import COLD_MESSAGE_BYTES
from gateway.memory import HELD, HeldMemory

__all__ = ["DiskPayloads"]

# Messages with ever-new properties (a message-id or timestamp property each) would each
# add an entry here and save little: past this many, a message with new ones stays as it is.
MAX_SHARED = 4096


class DiskPayloads:
    """A :class:`~semantics.queue_cold.Freezer` for one durable queue's messages."""

    __slots__ = ("store", "prefix", "shared", "combos", "held")

    def __init__(self, store: Any, vhost: str, queue: str) -> None:
        self.store = store
        self.prefix = P.queue_messages_prefix(vhost, queue)
        self.shared: dict[tuple[bytes, str, str], int] = {}
        self.combos: list[tuple[Any, str, str]] = []  # (Properties, exchange, routing key)
        self.held = 0  # W5 bytes counted for the messages folded

    def freeze(self, msg_id: str, payload: object, enqueue_time: float) -> int:
        # Only what `recovered` rebuilds exactly: a body on disk under this queue's key, no
        # TTL or dead-letter cycle of its own, published when enqueued here. (Its tags are
        # for routing, which is over: a restart does not keep them either.)
        if (type(payload) is not DiskMessage or payload.key != self.prefix + msg_id
                or payload.ttl is not None or payload.cycle
                or payload.published_at != enqueue_time or payload.store is not self.store):
            return -1
        props = payload.properties
        combo = (props.raw, payload.exchange, payload.routing_key)
        ref = self.shared.get(combo)
        if ref is None:
            if len(self.combos) >= MAX_SHARED:
                return -1
            ref = self.shared[combo] = len(self.combos)
            self.combos.append((props, payload.exchange, payload.routing_key))
        self.held += COLD_MESSAGE_BYTES
        HELD.messages += COLD_MESSAGE_BYTES
        return ref

    def thaw(self, index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
        props, exchange, routing_key = self.combos[ref]
        self.held -= COLD_MESSAGE_BYTES
        HELD.messages -= COLD_MESSAGE_BYTES
        if not self.held:  # none folded any more: the refs start again
            self.shared = {}
            self.combos = []
        return recovered(self.store, self.prefix + msg_id, props, exchange, routing_key, enqueue_time, msg_id)

    def __del__(self, _held: HeldMemory = HELD) -> None:  # bound now: safe at interpreter exit
        _held.messages -= self.held
