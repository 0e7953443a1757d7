"""The message as the broker carries it: body and raw property bytes, never copied."""

from __future__ import annotations

from typing import Any

from gateway.memory import HELD, MESSAGE_OVERHEAD, HeldMemory
from gateway.protocol.properties import DELIVERY_MODE, Properties

__all__ = ["DISK_BODY_MIN", "NO_CYCLE", "DiskMessage", "Message", "init_message", "new_message", "recovered"]

# A persistent message's body from this size on is left in the store (DiskMessage): a
# smaller one costs less in memory than the read that would bring it back.
DISK_BODY_MIN = 256
# The dead-letter cycle of a message that was never dead-lettered (Message.cycle): one shared
# empty set, not a frozenset() call a publish.
NO_CYCLE: frozenset[str] = frozenset()


class Message:
    """One published message. ``properties`` is the protocol core's ``Properties`` (raw
    content-header bytes plus lazily decoded fields); the body is the bytes object the core
    handed over, shared by every queue the message is routed to (no copies on the hot path).

    ``key``: None until the message is enqueued; then the store key of its record when its
    one queue is durable and it is persistent, else "" (a message held in several places,
    or not on disk, keeps its body: see :class:`DiskMessage`)."""

    __slots__ = ("body", "properties", "exchange", "routing_key", "persistent", "published_at",
                 "tags", "msg_id", "ttl", "cycle", "held", "key", "store")

    def __init__(self, body: bytes, properties: Any, exchange: str, routing_key: str,
                 published_at: float, tags: tuple[str, ...] = (), msg_id: str = "",
                 ttl: float | None = None) -> None:
        if type(properties) is Properties:
            # delivery_mode read from its span: the property's getter was a frame a publish.
            raw = properties.raw
            span = properties._spans[DELIVERY_MODE]
            self.persistent = span is not None and raw[span[0]] == 2
        else:
            raw = getattr(properties, "raw", b"")
            self.persistent = getattr(properties, "delivery_mode", None) == 2
        # W5: held memory, given back when the last holder drops the message (gateway/memory.py).
        self.held = held = len(body) + len(raw) + MESSAGE_OVERHEAD
        HELD.messages += held
        # msg_id: the one CMQ message ID from publish through route, enqueue and delivery
        # (A2): a message routed to several queues has the same ID in each of them.
        self.msg_id = msg_id
        self.ttl = ttl  # the per-message TTL in seconds (expiration property), or None
        self.cycle: frozenset[str] = NO_CYCLE  # dead-lettered: queues it must not re-enter
        self.body = body
        self.properties = properties
        self.exchange = exchange
        self.routing_key = routing_key
        self.published_at = published_at
        self.tags = tags
        self.key: str | None = None
        self.store: Any = None

    def __del__(self, _held: HeldMemory = HELD) -> None:  # bound now: safe at interpreter exit
        _held.messages -= self.held

    @property
    def headers(self) -> dict[str, Any] | None:
        return getattr(self.properties, "headers", None)

    @property
    def size(self) -> int:
        return len(self.body)

    def to_disk(self, store: Any) -> None:
        """Let go of the body: it is read back from record ``key`` of ``store`` when wanted."""
        if type(self) is not Message or not self.key:
            return
        size = len(_BODY.__get__(self, Message))
        _BODY.__set__(self, b"")
        self.held -= size
        HELD.messages -= size
        self.store = store
        self.__class__ = DiskMessage

    def to_memory(self) -> None:
        """Hold the body again: its record is about to go (a dead-lettered message's body
        is published again after its record was deleted)."""


_BODY: Any = Message.__dict__["body"]  # the slot itself: DiskMessage's property hides it

# ``Message(...)`` runs __init__ from C (type_call, slot_tp_init: a call into a new interpreter
# frame, ~190 ns); the publish path makes its message as ``msg = new_message(Message)`` then
# ``init_message(msg, ...)``, two calls the interpreter makes inline: the same object.
new_message = object.__new__
init_message = Message.__init__


class DiskMessage(Message):
    """A persistent message whose body stays in the store until it is delivered (issue 15:
    10^6 retained 1 KB messages held 2.4 GB). Made only from a :class:`Message` by
    ``to_disk`` (a class switch: same slots, so the transient hot path never pays for a
    property), and only for a message in exactly one durable queue, whose record is the one
    place its body lives; ``to_memory`` switches it back before that record is deleted for
    any reason other than the message's end."""

    __slots__ = ()

    @property
    def body(self) -> bytes:  # type: ignore[override]
        from gateway.broker.persistence import message_body

        raw = self.store.get(self.key)
        if raw is None:
            raise LookupError(f"message {self.msg_id!r}: its record {self.key!r} is gone from the store")
        return message_body(raw)

    def to_memory(self) -> None:
        body = self.body
        self.__class__ = Message  # type: ignore[assignment]
        _BODY.__set__(self, body)
        self.held += len(body)
        HELD.messages += len(body)
        self.store = None


def recovered(store: Any, key: str, properties: Any, exchange: str, routing_key: str,
              published_at: float, msg_id: str) -> Message:
    """A persistent message recovered from record ``key`` of ``store``, its body left
    there. Its slots are filled here directly: 10^6 of them are made at a restart."""
    msg = object.__new__(DiskMessage)
    msg.held = held = len(properties.raw) + MESSAGE_OVERHEAD
    HELD.messages += held
    msg.msg_id = msg_id
    msg.ttl = None
    msg.cycle = NO_CYCLE
    _BODY.__set__(msg, b"")
    msg.properties = properties
    msg.exchange = exchange
    msg.routing_key = routing_key
    msg.persistent = True
    msg.published_at = published_at
    msg.tags = ()
    msg.key = key
    msg.store = store
    return msg

