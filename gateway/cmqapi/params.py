"""Reading an action's parameters as CMQ's API pages define them (CA1-CA3).

Every value arrives as a string (form or query). Lists are ``name.n`` parameters whose
indexes start at 0 or 1 and must be consecutive ("n 从0开始或者从1开始都可以，但必须连续").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gateway.cmqapi.errors import CmqApiError

__all__ = ["BATCH_MAX", "Params"]

BATCH_MAX = 16  # CA2/CA3: BatchSendMessage, BatchReceiveMessage, BatchDeleteMessage, BatchPublishMessage

_INT = re.compile(r"-?[0-9]{1,30}\Z")  # longer is out of every range (and int() refuses 4,300 digits)
_INDEX = re.compile(r"[0-9]{1,9}\Z")  # ASCII: str.isdigit() takes "²", which int() refuses


class Params:
    """The parameters of one request."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def text(self, name: str, default: str | None = None) -> str:
        value = self.values.get(name)
        if value is None or value == "":
            if default is None:
                raise CmqApiError.missing(name)
            return default
        return value

    def opt(self, name: str) -> str | None:
        value = self.values.get(name)
        return value if value not in (None, "") else None

    def number(self, name: str, low: int, high: int, default: int | None = None) -> int:
        raw = self.opt(name)
        if raw is None:
            if default is None:
                raise CmqApiError.missing(name)
            return default
        raw = raw.strip()
        if re.fullmatch(r"-?[0-9]+", raw, re.ASCII) and not _INT.match(raw):
            raise CmqApiError.out_of_range(name, f"{raw[:40]}... is not in {low}-{high}")
        if not _INT.match(raw):
            raise CmqApiError.param(f"parameter {name} error type: {raw[:100]!r} is not an integer", 10360)
        value = int(raw)
        if not low <= value <= high:
            raise CmqApiError.out_of_range(name, f"{value} is not in {low}-{high}")
        return value

    def opt_number(self, name: str, low: int, high: int) -> int | None:
        return None if self.opt(name) is None else self.number(name, low, high)

    def page(self, names: Iterable[str]) -> tuple[int, list[str]]:
        """The List actions: how many names contain ``searchWord``, and those from ``offset``
        (0) on, at most ``limit`` (20), in name order."""
        word = self.opt("searchWord") or ""
        found = sorted(n for n in names if word in n)
        offset = self.number("offset", 0, 2**62, 0)
        limit = self.number("limit", 1, 1000, 20)
        return len(found), found[offset:offset + limit]

    def bodies(self, batch: bool) -> list[str]:
        """``msgBody``, or the ``msgBody.n`` of a batch (at most BATCH_MAX)."""
        if not batch:
            return [self.text("msgBody")]
        bodies = self.indexed("msgBody", BATCH_MAX)
        if not bodies:
            raise CmqApiError.missing("msgBody.n")
        return bodies

    def indexed(self, name: str, limit: int | None = None) -> list[str]:
        """The values of ``name.0``/``name.1``..., in index order; [] when there are none."""
        prefix = name + "."
        indexed: dict[int, str] = {}
        for key, value in self.values.items():
            if key.startswith(prefix) and _INDEX.match(key[len(prefix):]):
                indexed[int(key[len(prefix):])] = value
        if not indexed:
            return []
        first = min(indexed)
        if first not in (0, 1) or sorted(indexed) != list(range(first, first + len(indexed))):
            raise CmqApiError.param(f"{name} parameter is not consequent (indexes {sorted(indexed)})", 10380)
        if limit is not None and len(indexed) > limit:
            raise CmqApiError.batch_size(name, limit)
        return [indexed[i] for i in sorted(indexed)]
