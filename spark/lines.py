"""Audit JSON lines → Arrow, skipping what a crash or a bad write left (A3).

The fast path hands pyarrow's JSON reader the lines with the explicit schema, a few MiB at a
time (``parse_chunks``), so that the first rows reach Spark while the rest are still parsed
and a 64 MiB range never sits in memory as one table.  Only when a chunk fails (a torn or garbled line in the middle, a field of the
wrong JSON type) does it fall back to finding the bad lines one by one; those are skipped and
returned so the caller can count them.  Bytes after the last newline of a *closed* file are a
torn last line: skipped and counted too.  Runs on executors: pyarrow is imported lazily.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.audit import layout

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["CHUNK", "Parsed", "Skipped", "chunk_bounds", "find_line_start", "last_line_end",
           "parse_chunks", "parse_lines", "read_bytes"]

# Lines handed to pyarrow at once.  Each chunk is one block parsed on one thread: Spark already
# runs a task per core, and pyarrow's threads only added CPU time (measured in spark.md).
CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Skipped:
    offset: int  # byte offset in the file
    length: int
    text: bytes


@dataclass(slots=True)
class Parsed:
    table: pa.Table
    skipped: list[Skipped]


def _candidates(root: str, key: str) -> tuple[str, str]:
    closed = os.path.join(root, key)
    return closed, layout.open_path(closed)


def read_bytes(root: str, key: str, start: int, end: int) -> bytes | None:
    """Bytes [start, end) of the file ``key`` under whichever name it has now; None when
    retention deleted it (not an error: the records are gone either way)."""
    for path in _candidates(root, key):
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except FileNotFoundError:
            continue
    return None


def find_line_start(path: str, pos: int, size: int) -> int:
    """The first line start at or after ``pos`` (``size`` if none): where to cut a file."""
    if pos <= 0:
        return 0
    with open(path, "rb") as f:
        f.seek(pos - 1)
        at = pos - 1
        while at < size:
            chunk = f.read(65536)
            if not chunk:
                break
            i = chunk.find(b"\n")
            if i >= 0:
                return at + i + 1
            at += len(chunk)
    return size


def last_line_end(root: str, key: str, size: int) -> int:
    """Offset just after the last newline in the first ``size`` bytes (only whole lines)."""
    step = 65536
    end = size
    while end > 0:
        start = max(0, end - step)
        data = read_bytes(root, key, start, end)
        if data is None:
            return 0
        i = data.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0


def _read_json(body: bytes, names: frozenset[str] | None = None) -> pa.Table:
    """The record fields in ``names`` (all by default) of whole JSON lines; pyarrow skips the
    others without converting them, which is most of the cost of a field."""
    import pyarrow as pa
    import pyarrow.json as pj

    from spark.schema import json_arrow_schema

    # One block for the whole body (a chunk is a few MiB): pyarrow reads it in place.
    block = min(max(len(body), 1 << 16), (1 << 31) - 1)
    return pj.read_json(
        pa.BufferReader(body),
        read_options=pj.ReadOptions(use_threads=False, block_size=block),
        parse_options=pj.ParseOptions(
            explicit_schema=json_arrow_schema(names), unexpected_field_behavior="ignore"
        ),
    )


def _line_by_line(body: bytes, base: int, names: frozenset[str] | None) -> Parsed:
    import pyarrow as pa

    good: list[tuple[int, bytes]] = []
    skipped: list[Skipped] = []
    pos = 0
    for line in body.splitlines(keepends=True):
        ok = False
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            pass
        if ok:
            good.append((base + pos, line))
        elif line.strip():
            skipped.append(Skipped(base + pos, len(line), line))
        pos += len(line)
    try:
        table = _read_json(b"".join(line for _, line in good), names) if good else None
    except pa.ArrowInvalid:
        # Valid JSON of the wrong type somewhere (e.g. "size": "big"): find it line by line.
        tables = []
        for offset, line in good:
            try:
                tables.append(_read_json(line, names))
            except pa.ArrowInvalid:
                skipped.append(Skipped(offset, len(line), line))
        table = pa.concat_tables(tables) if tables else None
    if table is None:
        from spark.schema import json_arrow_schema

        table = json_arrow_schema(names).empty_table()
    skipped.sort(key=lambda s: s.offset)
    return Parsed(table, skipped)


def parse_lines(data: bytes, base: int, *, closed_end: bool, names: frozenset[str] | None = None) -> Parsed:
    """Parse whole lines of ``data`` (which starts at file offset ``base``).  ``closed_end``:
    the data runs to the end of a closed file, so a last line without newline is torn.
    ``names``: the record fields to convert (all by default); a line is still skipped when it
    is not JSON, but a field left out is not checked for its type."""
    import pyarrow as pa

    from spark.schema import json_arrow_schema

    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    torn = [Skipped(base + cut, len(tail), tail)] if tail and closed_end else []
    body = data[:cut]
    if not body or body.isspace():  # isspace: no copy of a range of many MiB, as strip() makes
        return Parsed(json_arrow_schema(names).empty_table(), torn)
    try:
        parsed = Parsed(_read_json(body, names), [])
    except pa.ArrowInvalid:
        parsed = _line_by_line(body, base, names)
    parsed.skipped.extend(torn)
    return parsed


def chunk_bounds(data: bytes, size: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) spans of ``data`` of about ``size`` bytes, each cut just after a newline (the
    last one runs to the end), so that every line falls in exactly one span."""
    at, n = 0, len(data)
    while at < n:
        cut = n
        if n - at > size:
            nl = data.find(b"\n", at + size - 1)
            cut = n if nl < 0 else nl + 1
        yield at, cut
        at = cut


def parse_chunks(data: bytes, base: int, *, closed_end: bool, names: frozenset[str] | None = None,
                 size: int | None = None) -> Iterator[Parsed]:
    """``parse_lines`` of ``data`` a chunk at a time (``CHUNK`` bytes by default): the same
    rows and skipped lines, lazily."""
    for lo, hi in chunk_bounds(data, size or CHUNK):
        yield parse_lines(data[lo:hi], base + lo, closed_end=closed_end and hi == len(data), names=names)
