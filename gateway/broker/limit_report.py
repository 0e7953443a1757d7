"""The migration report: what would break on CMQ, seen in the compatible profile (SPEC PF4).

In ``compatible`` a breach of a CMQ limit is let through and reported: one audit record
``limit_exceeded`` per breach (the broker emits it), and an entry here, which is what
``GET /api/cmq/limits`` lists. Memory is bounded: breaches are aggregated per (vhost, rule,
object, user) with a count, the first and last time seen and the worst value; past
``max_entries`` distinct entries a new one is only counted (``overflow``), never stored.

Restarts (A6): the broker keeps each entry in its store (``persistence.limit_key``) when it
is made and again at a clean stop, and loads them back first thing at a start
(``restore``); the objects a start restores are checked again, and a breach the report
already holds for that object and rule (``has``) is neither counted nor recorded again, so
a standing breach is reported once, and ``GET /api/cmq/limits`` lists the same before and
after a restart. After a crash the counts and ``last_seen`` are those of the entry's making
or of the last clean stop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LimitEntry", "LimitReport"]

MAX_ENTRIES = 10_000


@dataclass(slots=True)
class LimitEntry:
    """One (vhost, rule, object, user): how often it broke the rule and how badly."""

    vhost: str
    rule: str
    object: str
    user: str | None
    count: int
    first_seen: float
    last_seen: float
    worst_value: Any
    limit: Any
    example: str   # the reply text the cmq profile would have closed the channel with
    peer: str | None

    @classmethod
    def from_json(cls, vhost: str, r: dict[str, Any]) -> LimitEntry:
        return cls(vhost, r["rule"], r["object"], r.get("user"), int(r["count"]), float(r["first_seen"]),
                   float(r["last_seen"]), r.get("worst_value"), r.get("limit"), r.get("example", ""),
                   r.get("peer"))

    def as_json(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "rule": self.rule, "object": self.object, "user": self.user,
                "peer": self.peer, "count": self.count, "first_seen": self.first_seen,
                "last_seen": self.last_seen, "worst_value": self.worst_value, "limit": self.limit,
                "example": self.example}


def _worse(new: Any, old: Any) -> bool:
    try:
        return bool(new > old)
    except TypeError:
        return False


class LimitReport:
    """Breaches of CMQ limits, aggregated (PF4)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str, str, str | None], LimitEntry] = {}
        self.overflow: dict[tuple[str, str], int] = defaultdict(int)  # (vhost, rule) -> not stored
        self._objects: dict[tuple[str, str, str], int] = {}  # (vhost, rule, object) -> entries
        # Entries changed since they were last kept (the broker's store, at a clean stop).
        self.changed: set[tuple[str, str, str, str | None]] = set()
        self.on_clear: Callable[[list[LimitEntry]], None] | None = None  # the broker unkeeps them

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, vhost: str, rule: str, object: str, user: str | None, peer: str | None,
               value: Any, limit: Any, text: str, now: float) -> bool:
        """Count one breach; True when it made a new entry (for the broker to keep)."""
        key = (vhost, rule, object, user)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_entries:
                self.overflow[vhost, rule] += 1
                return False
            self._add(LimitEntry(vhost, rule, object, user, 1, now, now, value, limit, text, peer))
            return True
        self.changed.add(key)
        entry.count += 1
        entry.last_seen = now
        entry.peer = peer or entry.peer
        if _worse(value, entry.worst_value):
            entry.worst_value = value
            entry.limit = limit
            entry.example = text
        return False

    def _add(self, entry: LimitEntry) -> None:
        self._entries[entry.vhost, entry.rule, entry.object, entry.user] = entry
        obj = (entry.vhost, entry.rule, entry.object)
        self._objects[obj] = self._objects.get(obj, 0) + 1

    def restore(self, entry: LimitEntry) -> None:
        """An entry kept before a restart, back as it was (A6)."""
        if (entry.vhost, entry.rule, entry.object, entry.user) not in self._entries:
            self._add(entry)

    def has(self, vhost: str, rule: str, object: str) -> bool:
        """The report holds a breach of ``rule`` by ``object`` (by any user)."""
        return (vhost, rule, object) in self._objects

    def entry(self, vhost: str, rule: str, object: str, user: str | None) -> LimitEntry | None:
        return self._entries.get((vhost, rule, object, user))

    def entries(self, vhost: str | None = None) -> list[LimitEntry]:
        """Stored entries (of one vhost), by rule, then object, then user."""
        out = [e for e in self._entries.values() if vhost is None or e.vhost == vhost]
        out.sort(key=lambda e: (e.rule, e.vhost, e.object, e.user or ""))
        return out

    def by_rule(self, vhost: str | None = None) -> dict[str, dict[str, Any]]:
        """The management view: per rule, the objects and users that would break on CMQ."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.entries(vhost):
            rule = out.setdefault(e.rule, {"rule": e.rule, "count": 0, "objects": [], "users": [],
                                           "entries": [], "not_stored": 0})
            rule["count"] += e.count
            if e.object not in rule["objects"]:
                rule["objects"].append(e.object)
            if e.user is not None and e.user not in rule["users"]:
                rule["users"].append(e.user)
            rule["entries"].append(e.as_json())
        for (v, rule_id), n in self.overflow.items():
            if vhost is None or v == vhost:
                rule = out.setdefault(rule_id, {"rule": rule_id, "count": 0, "objects": [], "users": [],
                                                "entries": [], "not_stored": 0})
                rule["count"] += n
                rule["not_stored"] += n
        return dict(sorted(out.items()))

    def clear(self, vhost: str | None = None) -> list[LimitEntry]:
        """Forget the entries (of one vhost); returns them (the broker unkeeps them)."""
        gone = []
        for key in [k for k in self._entries if vhost is None or k[0] == vhost]:
            gone.append(self._entries.pop(key))
            self.changed.discard(key)
            obj = key[:3]
            self._objects[obj] -= 1
            if not self._objects[obj]:
                del self._objects[obj]
        for dropped in [k for k in self.overflow if vhost is None or k[0] == vhost]:
            del self.overflow[dropped]
        if gone and self.on_clear is not None:
            self.on_clear(gone)
        return gone
