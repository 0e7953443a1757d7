"""Input partitions of the ``cmq-audit`` source: one per closed file, or per byte range of a
large one, cut at line starts so that every range holds whole lines (A4)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from gateway.audit import layout
from spark.lines import Parsed, Skipped, find_line_start, last_line_end, parse_chunks, read_bytes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from spark.pushdown import Pushdown

__all__ = ["FileRange", "Layout", "constant", "plan_batch", "read_compacted", "read_range", "skipped_batch", "split", "to_batches"]


@dataclass(frozen=True)
class FileRange(InputPartition):
    root: str  # the audit directory: one gateway's (column gateway)
    key: str  # dt=…/hour=…/audit-….jsonl
    dt: str
    hour: int
    start: int
    end: int
    closed_end: bool  # the range runs to the end of a closed file: a partial last line is torn
    from_open: bool = False  # read from the file the gateway is still writing (column open_file)
    compacted: bool = False  # read whole from its Parquet file (gateway.audit.compact)


def split(root: str, af: layout.AuditFile, start: int, end: int, closed_end: bool,
          max_bytes: int) -> Iterator[FileRange]:
    """[start, end) of one file as ranges of about ``max_bytes``, each starting a line."""
    at = start
    while at < end:
        cut = end
        if end - at > max_bytes:
            cut = min(end, find_line_start(af.path, at + max_bytes, end))
        yield FileRange(root, af.key, af.dt, af.hour, at, cut, closed_end and cut == end, af.is_open)
        at = cut


def plan_batch(roots: list[str], pushdown: Pushdown, max_bytes: int,
               exclude: dict[str, frozenset[str]] | None = None) -> list[FileRange]:
    """Closed files, and the file a running gateway is writing up to its last complete line, so
    that operators see the log while it grows.  Files are append-only and known by one key
    whatever their name, so a file listed open and renamed before it is read still yields the
    same bytes, each line once.  Folders and files ruled out by the pushed filters are never
    listed or opened.  Several directories (one per gateway) are listed one after the other.

    A segment compacted to Parquet is read from its Parquet file (the one copy a reader takes
    when both exist), whole; ``exclude``: per directory, the keys not to read at all (those
    ``spark.read_audit`` reads through Spark's Parquet reader).  The JSON-lines files are
    listed before the Parquet ones: a segment's Parquet file appears before its JSON-lines
    file may go, so one of the two listings has it."""
    from gateway.audit.compact import list_parquet

    out: list[FileRange] = []
    for root in roots:
        skip = exclude.get(root, frozenset()) if exclude else frozenset()
        jsonl = list(layout.list_files(root, include_open=True, keep_folder=pushdown.keep_folder))
        compacted = list_parquet(root, keep_folder=pushdown.keep_folder)
        for af in jsonl:
            if not af.size or af.key in skip or af.key in compacted or not pushdown.keep_file(af.key):
                continue
            end = last_line_end(root, af.key, af.size) if af.is_open else af.size
            out.extend(split(root, af, 0, end, not af.is_open, max_bytes))
        for key in compacted:
            if key in skip or not pushdown.keep_file(key):
                continue
            dt, hour = key.split("/")[0][3:], int(key.split("/")[1][5:])
            out.append(FileRange(root, key, dt, hour, 0, 0, True, compacted=True))
    return out


def read_compacted(part: FileRange, names: frozenset[str] | None = None) -> Iterator[Parsed] | None:
    """The records of ``part`` from its segment's Parquet file: all of them for a compacted
    range, else those whose line lies in [start, end) (the JSON-lines file was removed after
    it was planned).  None when there is no Parquet file either (retention deleted both)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from gateway.audit.compact import info, parquet_path
    from spark.schema import json_arrow_schema

    path = parquet_path(os.path.join(part.root, *part.key.split("/")))
    columns = [f.name for f in json_arrow_schema(names)]
    try:
        # ParquetFile, not read_table: read_table goes through pyarrow.dataset, whose import
        # brings pandas into every fresh Python worker (see constant()).
        table = pq.ParquetFile(path).read(columns=[*columns, "_offset"], use_threads=False)
        skipped = [Skipped(o, n, t.encode("latin-1")) for o, n, t in info(path)["skipped"]]
    except FileNotFoundError:
        return None
    if not part.compacted:
        at = table.column("_offset")
        table = table.filter(pc.and_(pc.greater_equal(at, part.start), pc.less(at, part.end)))
        skipped = [s for s in skipped if part.start <= s.offset < part.end]
    return iter([Parsed(table.drop_columns(["_offset"]), skipped)])


def read_range(part: FileRange, names: frozenset[str] | None = None) -> Iterator[Parsed] | None:
    """The range parsed a chunk at a time; ``names``: the record fields to convert (all by
    default).  None when the file was deleted since planning (read before returning)."""
    data = read_bytes(part.root, part.key, part.start, part.end)
    if data is None:  # deleted by retention since planning
        return None
    return parse_chunks(data, part.start, closed_end=part.closed_end, names=names)


def constant(value: str | int | bool, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of ``value`` built from raw buffers: ``pa.scalar``/``pa.array`` would
    import pandas into every fresh Python worker (about half a second of CPU each)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_string(type_):
        raw = str(value).encode()
        # int32 offsets: n is at most a batch (65536 rows) times a path's length.
        offsets = np.arange(n + 1, dtype=np.int64) * len(raw)
        if offsets[-1] >= 1 << 31:
            raise ValueError(f"cmq-audit: {n} copies of a {len(raw)}-byte value do not fit a batch")
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                pa.py_buffer(raw * n)])
    if pa.types.is_boolean(type_):
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer((b"\xff" if value else b"\0") * ((n + 7) // 8))])
    if pa.types.is_int32(type_):
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(np.full(n, value, dtype=np.int32))])
    raise TypeError(f"cmq-audit: no constant column of type {type_}")


class Layout:
    """The columns the reader adds (``dt``, ``hour``, ``file``, ``open_file``, ``gateway``):
    one value for a whole range, built once at batch size and sliced (no copy) per batch."""

    def __init__(self, part: FileRange, target: pa.Schema, max_rows: int) -> None:
        values: dict[str, str | int | bool] = {"dt": part.dt, "hour": part.hour, "file": part.key, "open_file": part.from_open,
                  "gateway": part.root}
        self.columns = {f.name: constant(values[f.name], f.type, max_rows)
                        for f in target if f.name in values}

    def column(self, name: str, n: int) -> pa.Array:
        return self.columns[name].slice(0, n)


def to_batches(part: FileRange, parsed: Parsed, schema: StructType, pushdown: Pushdown | None,
               max_rows: int = 65536, layout: Layout | None = None) -> Iterator[pa.RecordBatch]:
    """Filter, add the layout columns, and shape to exactly the Arrow schema Spark expects;
    pass the range's ``layout`` when calling per chunk, so its columns are built once."""
    import pyarrow as pa

    from spark.schema import arrow_schema

    table = parsed.table
    if pushdown is not None:
        mask = pushdown.mask(table)
        if mask is not None:
            table = table.filter(mask)
    if table.num_rows == 0:
        return
    target = arrow_schema(schema)
    if layout is None:
        layout = Layout(part, target, max_rows)
    for batch in table.to_batches(max_chunksize=max_rows):
        n = batch.num_rows
        if n == 0:
            continue
        columns = [layout.column(f.name, n) if f.name in layout.columns else batch.column(f.name)
                   for f in target]
        # The parser's schema is built from the same Spark types, so no cast happens unless
        # a field's Arrow type drifts between pyarrow versions.
        columns = [c if c.type == f.type else c.cast(f.type) for c, f in zip(columns, target, strict=True)]
        yield pa.RecordBatch.from_arrays(columns, schema=target)


def skipped_batch(part: FileRange, skipped: list[Skipped], schema: StructType) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    from spark.schema import arrow_schema

    if not skipped:
        return
    target = arrow_schema(schema)
    cols = {
        "file": pa.array([part.key] * len(skipped), pa.string()),
        "offset": pa.array([s.offset for s in skipped], pa.int64()),
        "length": pa.array([s.length for s in skipped], pa.int64()),
        "text": pa.array([s.text.decode("utf-8", "replace") for s in skipped], pa.string()),
        "gateway": pa.array([part.root] * len(skipped), pa.string()),
    }
    yield pa.RecordBatch.from_arrays([cols[n] for n in target.names], schema=target)
