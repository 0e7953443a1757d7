"""Dead-lettered messages carry RabbitMQ's ``x-death`` history (SPEC M13, M7).

CMQ has no such header; ``x-dead-letter-exchange`` keeps its RabbitMQ meaning, so the
message it receives looks as RabbitMQ 3.10 makes it:

* ``x-death``: an array of tables, most recent first, one per (queue, reason) with ``count``
  (long), ``reason`` (``rejected``, ``expired``, ``maxlen``, ``delivery_limit``), ``queue``,
  ``time`` (timestamp), ``exchange`` and ``routing-keys`` as published, and
  ``original-expiration`` when the message had a per-message TTL. Dying again in the same
  queue for the same reason increments that entry's count and moves it to the front.
* ``x-first-death-reason`` / ``-queue`` / ``-exchange``: set once, at the first death.
* The ``expiration`` property is removed (kept in ``original-expiration``) so that the
  message does not expire again for the same TTL.

Every other property and header keeps its original bytes (``Properties.encode_with``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.protocol.fieldtable import Typed
from gateway.protocol.properties import Properties

__all__ = ["cycling_queues", "dead_letter_properties", "set_shortstr", "without_expiration"]

_EXPIRATION = 7  # field index of ``expiration`` in the basic property list


def set_shortstr(raw: bytes, index: int, value: str | None) -> bytes:
    """The property list ``raw`` with the short-string field ``index`` set to ``value``
    (None: removed); every other field keeps its bytes. Fields 0, 1, 5-8 and 10-13 are short
    strings (content_type, content_encoding, correlation_id, reply_to, expiration, ...)."""
    flags = int.from_bytes(raw[:2], "big")
    bit = 0x8000 >> index
    pos = 2
    for i in range(index):
        if not flags & (0x8000 >> i):
            continue
        if i == 2:  # headers: a table with a 32-bit length
            pos += 4 + int.from_bytes(raw[pos:pos + 4], "big")
        elif i in (3, 4):  # delivery_mode, priority: octets
            pos += 1
        elif i == 9:  # timestamp
            pos += 8
        else:  # short strings
            pos += 1 + raw[pos]
    end = pos + 1 + raw[pos] if flags & bit else pos
    if value is None:
        if not flags & bit:
            return raw
        return (flags & ~bit).to_bytes(2, "big") + raw[2:pos] + raw[end:]
    data = value.encode("utf-8")
    if len(data) > 255:
        raise ValueError("short string over 255 bytes")
    return (flags | bit).to_bytes(2, "big") + raw[2:pos] + bytes((len(data),)) + data + raw[end:]


def without_expiration(raw: bytes) -> bytes:
    """The property list ``raw`` with its ``expiration`` field removed, all else byte for byte."""
    return set_shortstr(raw, _EXPIRATION, None)


def dead_letter_properties(props: Any, *, reason: str, queue: str, exchange: str,
                           routing_keys: Sequence[str], now: float) -> Properties:
    """The properties of ``props`` as the dead-letter exchange receives them."""
    headers = props.headers or {}
    deaths = [dict(d) for d in _history(headers) if isinstance(d, dict)]
    entry = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason), None)
    if entry is not None:
        deaths.remove(entry)
        count = entry.get("count")
        entry["count"] = (count if isinstance(count, int) else 0) + 1
    else:
        entry = {"count": 1, "reason": reason, "queue": queue, "time": Typed("T", int(now)),
                 "exchange": exchange, "routing-keys": list(routing_keys)}
        expiration = props.expiration
        if expiration is not None:
            entry["original-expiration"] = (expiration.decode("latin-1") if isinstance(expiration, bytes)
                                            else expiration)
    deaths.insert(0, entry)
    extra: dict[str, Any] = {"x-death": deaths}
    if "x-first-death-reason" not in headers:
        extra["x-first-death-exchange"] = exchange
        extra["x-first-death-queue"] = queue
        extra["x-first-death-reason"] = reason
    return Properties(Properties(without_expiration(props.raw)).encode_with(extra_headers=extra))


def cycling_queues(props: Properties) -> frozenset[str]:
    """The queues a dead-lettered message must not enter again: RabbitMQ drops it there
    rather than loop "fully automatically", i.e. when the queue is in its x-death history with
    no ``rejected`` death on the way back to it (a rejection is a consumer's choice)."""
    out: set[str] = set()
    for d in _history(props.headers or {}):
        if not isinstance(d, dict) or d.get("reason") == "rejected":
            break
        queue = d.get("queue")
        if isinstance(queue, str):
            out.add(queue)
    return frozenset(out)


def _history(headers: Any) -> list[Any]:
    """The x-death array; a publisher's x-death that is not one is no history (not a 541)."""
    deaths = headers.get("x-death")
    return deaths if isinstance(deaths, list) else []
