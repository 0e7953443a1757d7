"""The broker's per-message rows of one second formatted in a few C-level passes.

Why: the audit writer process formats 4 records a message in scenario 1 (publish, enqueue,
deliver, ack), on the same 2 cores as the event loop. Record by record (``Row.put``: the
timestamp, a dict, ``encode_into``, counting) that was ~2.4 us a record. Here a run of rows of
one second is turned into columns (``zip``) and grouped by row; a column holding one value
(the queue, the user, the peer) is part of the literal text of the group's lines, so only
what differs (timestamp microseconds, msg_id, size, latency) is made per line, and all lines
are one join of their pieces; counts come from ``Counter``. No Python bytecode runs per
record: ~1.6 us a record (thread_time on the loaded 2-core machine; the record-by-record path
2.4 in the same runs).

The bytes are exactly those of ``Row.put`` (schema v1, tests/unit/audit/test_batch_format.py).
A value is copied into a line only when json would write it as it is: a str without quote,
backslash or non-printable character, an int, a finite float (json writes repr). A row with a
list (``tags``) is made into msgspec Structs tagged ``"v":2``, one ``encode`` each, when
msgspec writes those values as json does. Anything else (another record, a value of an
unusual type, a timestamp rounding into the next second) returns None, and the caller
formats the run record by record, as before.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec

from gateway.audit.record import FIELD_TYPES, SCHEMA_VERSION, format_ts
from gateway.audit.rows import ROWS, Row

__all__ = ["format_run", "second_runs"]

_NONE = type(None)
_OK_TYPES = {"string": {str, _NONE}, "long": {int, _NONE}, "int": {int, _NONE},
             "double": {float, _NONE}, "array<string>": {list, _NONE}}
_RESERVED = frozenset(("v", "ts", "event", "vhost"))
# Where msgspec and float.__repr__ write a float the same (repr switches to an exponent from
# 1e16 up and below 1e-4; msgspec writes that exponent another way, and NaN as null).
_FLOAT_MIN, _FLOAT_MAX = 1e-4, 1e16

_encode = msgspec.json.Encoder().encode
_decode = bytes.decode
_esc = json.encoder.encode_basestring  # type: ignore[attr-defined]
_HEAD = f'{{"v":{SCHEMA_VERSION},"ts":"'
_repeat = itertools.repeat
_chain = itertools.chain.from_iterable
_sub, _mul = operator.sub, operator.mul


class _Fast:
    """A row's Struct and the check of its columns."""

    __slots__ = ("checks", "cls", "event", "keys", "pick")

    def __init__(self, row: Row) -> None:
        self.event = row.event
        self.keys = row.keys
        self.pick = row.pick
        self.cls = msgspec.defstruct(
            f"Row{row.id}", [("ts", str), ("event", str), ("vhost", str), *((k, Any, None) for k in row.keys)],
            tag_field="v", tag=SCHEMA_VERSION, omit_defaults=True)
        self.checks = [(i, FIELD_TYPES[k]) for i, k in enumerate(row.keys)]


def _fast(row: Row) -> _Fast | None:
    kinds = [FIELD_TYPES.get(k) for k in row.keys]
    if any(k in _RESERVED for k in row.keys) or any(kind not in _OK_TYPES for kind in kinds):
        return None  # a key outside the schema or a timestamp field: record by record
    return _Fast(row)


_FAST: list[_Fast | None] = [_fast(r) for r in ROWS]


def _column_ok(kind: str, column: Sequence[Any]) -> bool:
    if not set(map(type, column)) <= _OK_TYPES[kind]:
        return False
    if kind == "double":
        present = list(map(abs, filter(None, column)))  # without None and zeros (written alike)
        return not present or (min(present) >= _FLOAT_MIN and max(present) < _FLOAT_MAX)
    if kind == "array<string>":
        return set(map(type, itertools.chain.from_iterable(filter(None, column)))) <= {str}
    return True


def second_runs(times: Sequence[float]) -> list[tuple[int, int, int]] | None:
    """``(start, end, second)`` of the runs of ``times`` in one whole second each, or None
    when ``times`` go back (a clock step: the caller takes the record-by-record path)."""
    secs = list(map(int, times))
    if not secs:
        return []
    if secs[0] == secs[-1] and min(secs) == secs[0] and max(secs) == secs[0]:
        return [(0, len(secs), secs[0])]
    if secs != sorted(secs):
        return None
    runs = []
    start = 0
    while start < len(secs):
        sec = secs[start]
        end = bisect.bisect_right(secs, sec, start)
        runs.append((start, end, sec))
        start = end
    return runs


def _safe_text(column: Sequence[str]) -> bool:
    """Every string in ``column`` is written by json as it is, between quotes (no quote,
    backslash or control character; a non-printable character is left to json)."""
    text = "".join(column)
    return text.isprintable() and '"' not in text and "\\" not in text


def _literal(kind: str, value: Any) -> str | None:
    """``value`` as the line's text, as json writes it, or None: not of the schema's type."""
    cls = value.__class__
    if kind == "string" and cls is str:
        return _esc(value)  # type: ignore[no-any-return]
    if kind in ("long", "int") and cls is int:
        return int.__repr__(value)
    if kind == "double" and cls is float and math.isfinite(value):
        return float.__repr__(value)
    return None


def _pieces(fast: _Fast, prefix: str, us: list[int], vhosts: list[str], columns: list[tuple[Any, ...]]
            ) -> Iterator[tuple[str, ...]] | None:
    """Each line of this group as its pieces (literal text, then a value's text, ...,
    ending with the newline), or None: a column of None and values, a float that json
    writes otherwise than repr, a string json would escape. A column of one value (the
    vhost, the queue, the user, most often the peer) is part of the literal text, so only
    what differs (timestamp, msg_id, size, latency) is made per line. Joined, not
    ``%``-formatted: the literal text is most of a line, and a join copies it, where ``%``
    scans it character by character (0.5 us a line)."""
    lit = [_HEAD + prefix]
    parts: list[Iterable[str]] = [map("%06d".__mod__, us)]
    lit.append('Z","event":' + _esc(fast.event) + ',"vhost":')
    if vhosts.count(vhosts[0]) == len(vhosts):
        lit[-1] += _esc(vhosts[0])
    elif _safe_text(vhosts):
        lit[-1] += '"'
        parts.append(vhosts)
        lit.append('"')
    else:
        return None
    for (i, kind), key in zip(fast.checks, fast.keys, strict=True):
        col = columns[i]
        first = col[0]
        if col.count(first) == len(col):  # one value (identity first: cheap)
            if first is None:
                continue  # omitted from every line
            text = _literal(kind, first)
            if text is None:
                return None
            lit[-1] += f',"{key}":' + text
            continue
        types = set(map(type, col))
        if kind == "string" and types == {str} and _safe_text(col):
            lit[-1] += f',"{key}":"'
            parts.append(col)
            lit.append('"')
        elif kind in ("long", "int") and types == {int}:
            lit[-1] += f',"{key}":'
            parts.append(map(int.__repr__, col))
            lit.append("")
        elif kind == "double" and types == {float} and all(map(math.isfinite, col)):
            lit[-1] += f',"{key}":'
            parts.append(map(float.__repr__, col))
            lit.append("")
        else:
            return None
    lit[-1] += "}\n"
    # lit has one more entry than parts: literal, value, literal, ..., value, literal.
    n = len(us)
    out: list[Iterable[str]] = []
    for text, values in zip(lit, parts, strict=False):
        out += (_repeat(text, n), values)
    out.append(_repeat(lit[-1], n))
    return zip(*out, strict=False)


def format_run(items: Sequence[tuple[float, Any, str, Any]], sec: int
               ) -> tuple[bytes, str, list[tuple[tuple[Any, ...], int]]] | None:
    """The lines (each ending in a newline) of ``items``, rows whose times are all in the
    second ``sec``; the timestamp text of the first (the file's folder and name come from
    it); and the records' ``(count key, number)``. None when a record needs the
    record-by-record path."""
    times, rids, vhosts, values = zip(*items, strict=True)
    if not set(map(type, rids)) <= {int} or not set(map(type, vhosts)) <= {str}:
        return None
    us = list(map(round, map(_mul, map(_sub, times, _repeat(sec)), _repeat(1_000_000))))
    if max(us) >= 1_000_000 or min(us) < 0:
        return None  # rounded into the next second: format_ts carries, this does not
    prefix = format_ts(sec)[:20]  # "YYYY-MM-DDTHH:MM:SS."
    n = len(rids)
    # The records grouped by row (stable): each group's lines are made by one map.
    order = sorted(range(n), key=rids.__getitem__)
    ordered_rids = list(map(rids.__getitem__, order))
    lines: list[tuple[str, ...]] = []  # each line's pieces
    counted: list[tuple[Row, Counter[Any]]] = []
    start = 0
    while start < n:
        rid = ordered_rids[start]
        end = bisect.bisect_right(ordered_rids, rid, start)
        fast = _FAST[rid] if 0 <= rid < len(_FAST) else None
        if fast is None:
            return None
        idx = order[start:end]
        group = list(map(values.__getitem__, idx))
        if not set(map(len, group)) <= {len(fast.checks)}:
            return None
        columns = list(zip(*group, strict=True))
        group_vhosts = list(map(vhosts.__getitem__, idx))
        group_us = list(map(us.__getitem__, idx))
        made = _pieces(fast, prefix, group_us, group_vhosts, columns)
        if made is not None:
            lines += made
        else:
            for i, kind in fast.checks:
                if not _column_ok(kind, columns[i]):
                    return None
            ts = map((prefix + "%06dZ").__mod__, group_us)
            try:
                lines += zip(map(_decode, map(_encode, map(fast.cls, ts, _repeat(fast.event), group_vhosts,
                                                           *columns))), _repeat("\n"), strict=False)
            except (TypeError, OverflowError, ValueError):  # an int past 64 bits, a lone surrogate...
                return None
        counted.append((ROWS[rid], Counter(zip(group_vhosts, map(fast.pick, group), strict=True))))
        start = end
    # Back to the order they came in: lines[k] is the record at position order[k].
    back = sorted(range(n), key=order.__getitem__)
    text = "".join(_chain(map(lines.__getitem__, back)))
    counts = [(row.count_key_picked(vhost, picked), k)
              for row, counter in counted for (vhost, picked), k in counter.items()]
    return text.encode(), f"{prefix}{us[0]:06d}Z", counts
