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

import asyncio
import gc
from typing import Any

from gateway.broker import persistence as P
from gateway.broker.message import DiskMessage, recovered
from gateway.broker.recovery import COLD_MESSAGE_BYTES
from gateway.memory import HELD, HeldMemory
from semantics.store import trim_heap

__all__ = ["DiskPayloads", "give_back_memory_soon"]

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


_GIVE_BACK_DELAY = 1.0  # s: a drain's last acks and deliveries settle first
_give_back_pending = False


def give_back_memory_soon() -> None:
    """A long backlog drained (CmqQueue.on_drained): give its memory back to the system
    shortly, once for however many queues drain meanwhile. Its objects are all freed by
    then, but the allocators keep their memory: CPython's 1 MiB arenas stay while any block
    in them is used, and the free lists of floats, tuples, dicts... (which only a full
    collection empties) hold blocks scattered over every arena the backlog touched; glibc
    keeps the freed pages of its heap. Issue 15: a drained backlog of 2 * 10^5 1 KB
    messages left the gateway at 2x its idle RSS; a full collection and malloc_trim bring
    it back to about 1.4x."""
    global _give_back_pending
    if _give_back_pending:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # no event loop (the model driven by tests): nothing to schedule
    _give_back_pending = True
    loop.call_later(_GIVE_BACK_DELAY, _give_back)


def _give_back() -> None:
    global _give_back_pending
    _give_back_pending = False
    gc.collect()
    trim_heap()
