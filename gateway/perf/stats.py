"""Latency histogram and confirm tracking, kept cheap enough for the per-message path.

The histogram is log-linear, like HdrHistogram with 2 significant binary digits past 64:
values below 128 µs are exact, above that each power of two is cut into 64 buckets, so a
percentile is off by at most 1/64 (1.6 %). Buckets are merged across worker processes by
index; a worker ships only the buckets that changed.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ConfirmTracker", "LatencyHistogram", "bucket_index", "bucket_value"]

_BUCKETS = 64 * 48  # reaches 2**47 µs, far past any run


def bucket_index(value_us: int) -> int:
    if value_us < 128:
        return value_us if value_us > 0 else 0
    e = value_us.bit_length() - 7
    return 64 * e + (value_us >> e)


def bucket_value(index: int) -> float:
    """A representative value (the bucket's midpoint) in µs."""
    if index < 128:
        return float(index)
    e = index // 64 - 1
    m = index - 64 * e
    return ((m << e) + ((m + 1) << e) - 1) / 2


def _percentile(counts: list[int], p: float) -> float | None:
    total = sum(counts)
    if total == 0:
        return None
    rank = max(1, int(total * p / 100 + 0.999999))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            return bucket_value(i)
    return None  # pragma: no cover - rank <= total


class LatencyHistogram:
    __slots__ = ("_dirty", "counts", "max_us", "recent_max_us")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.max_us = 0
        self.recent_max_us = 0
        self._dirty: set[int] = set()

    def record_ns(self, latency_ns: int) -> None:
        v = latency_ns // 1000
        i = bucket_index(v)
        self.counts[i] += 1
        self._dirty.add(i)
        if v > self.recent_max_us:
            self.recent_max_us = v
            if v > self.max_us:
                self.max_us = v

    def take_recent_max(self) -> int:
        """The largest value recorded since the last call (0: none)."""
        v, self.recent_max_us = self.recent_max_us, 0
        return v

    def percentile_since(self, before: list[int], p: float) -> float | None:
        """The percentile of what was recorded since ``before`` (a copy of ``counts``)."""
        return _percentile([c - b for c, b in zip(self.counts, before, strict=True)], p)

    def take_delta(self) -> dict[int, int]:
        """The counts of the buckets touched since the last call (cumulative, not differences),
        for merging into the main process's copy."""
        delta = {i: self.counts[i] for i in self._dirty}
        self._dirty.clear()
        return delta

    def merge_cumulative(self, counts: Mapping[int, int], base: dict[int, int]) -> None:
        """Apply a worker's cumulative bucket counts; `base` remembers what that worker had
        already contributed."""
        for i, c in counts.items():
            self.counts[i] += c - base.get(i, 0)
            base[i] = c

    @property
    def count(self) -> int:
        return sum(self.counts)

    def percentile(self, p: float) -> float | None:
        v = _percentile(self.counts, p)
        return None if v is None else min(v, float(self.max_us))

    def summary(self) -> dict[str, float | int] | None:
        if self.count == 0:
            return None
        return {
            "count": self.count,
            "p50": self.percentile(50) or 0.0,
            "p95": self.percentile(95) or 0.0,
            "p99": self.percentile(99) or 0.0,
            "max": float(self.max_us),
        }


class ConfirmTracker:
    """Counts publisher confirms: tags are 1, 2, 3, ... per channel; the broker may ack one tag
    or all tags up to one (multiple). Tags above `low` acked singly wait in a set."""

    __slots__ = ("_above", "acked", "low", "nacked")

    def __init__(self) -> None:
        self.low = 1  # lowest tag not yet confirmed
        self._above: set[int] = set()
        self.acked = 0
        self.nacked = 0

    def confirm(self, tag: int, multiple: bool, ok: bool) -> int:
        """Record one basic.ack/nack; returns how many messages it settled."""
        if multiple:
            if tag < self.low:
                return 0
            settled = tag - self.low + 1 - sum(1 for t in self._above if t <= tag)
            self._above = {t for t in self._above if t > tag}
            self.low = tag + 1
        elif tag == self.low:
            settled = 1
            self.low += 1
        elif tag > self.low and tag not in self._above:
            settled = 1
            self._above.add(tag)
        else:
            return 0
        while self.low in self._above:
            self._above.discard(self.low)
            self.low += 1
        if ok:
            self.acked += settled
        else:
            self.nacked += settled
        return settled
