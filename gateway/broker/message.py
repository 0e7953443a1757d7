"""The message as the broker carries it: body and raw property bytes, never copied."""

from __future__ import annotations

from typing import Any

from gateway.memory import HELD, MESSAGE_OVERHEAD, HeldMemory

__all__ = ["Message"]


class Message:
    """One published message. ``properties`` is the protocol core's ``Properties`` (raw
    content-header bytes plus lazily decoded fields); the body is the bytes object the core
    handed over, shared by every queue the message is routed to (no copies on the hot path)."""

    __slots__ = ("body", "properties", "exchange", "routing_key", "persistent", "published_at",
                 "tags", "msg_id", "ttl", "cycle", "held")

    def __init__(self, body: bytes, properties: Any, exchange: str, routing_key: str,
                 published_at: float, tags: tuple[str, ...] = (), msg_id: str = "",
                 ttl: float | None = None) -> None:
        # W5: held memory, given back when the last holder drops the message (gateway/memory.py).
        self.held = held = len(body) + len(getattr(properties, "raw", b"")) + MESSAGE_OVERHEAD
        HELD.messages += held
        # msg_id: the one CMQ message ID from publish through route, enqueue and delivery
        # (A2): a message routed to several queues has the same ID in each of them.
        self.msg_id = msg_id
        self.ttl = ttl  # the per-message TTL in seconds (expiration property), or None
        self.cycle: frozenset[str] = frozenset()  # dead-lettered: queues it must not re-enter
        self.body = body
        self.properties = properties
        self.exchange = exchange
        self.routing_key = routing_key
        self.persistent = getattr(properties, "delivery_mode", None) == 2
        self.published_at = published_at
        self.tags = tags

    def __del__(self, _held: HeldMemory = HELD) -> None:  # bound now: safe at interpreter exit
        _held.messages -= self.held

    @property
    def headers(self) -> dict[str, Any] | None:
        return getattr(self.properties, "headers", None)

    @property
    def size(self) -> int:
        return len(self.body)
