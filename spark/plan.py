"""Input partitions of the ``cmq-audit`` source: one per closed file, or per byte range of a
large one, cut at line starts so that every range holds whole lines (A4)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from gateway.audit import layout
from spark.lines import Parsed, find_line_start, last_line_end, parse_lines, read_bytes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from spark.pushdown import Pushdown

__all__ = ["FileRange", "plan_batch", "read_range", "skipped_batch", "split"]


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


def plan_batch(roots: list[str], pushdown: Pushdown, max_bytes: int) -> list[FileRange]:
    """Closed files, and the file a running gateway is writing up to its last complete line, so
    that operators see the log while it grows.  Files are append-only and known by one key
    whatever their name, so a file listed open and renamed before it is read still yields the
    same bytes, each line once.  Folders and files ruled out by the pushed filters are never
    listed or opened.  Several directories (one per gateway) are listed one after the other."""
    out: list[FileRange] = []
    for root in roots:
        for af in layout.list_files(root, include_open=True, keep_folder=pushdown.keep_folder):
            if not af.size or not pushdown.keep_file(af.key):
                continue
            end = last_line_end(root, af.key, af.size) if af.is_open else af.size
            out.extend(split(root, af, 0, end, not af.is_open, max_bytes))
    return out


def read_range(part: FileRange, names: frozenset[str] | None = None) -> Parsed | None:
    """The range parsed; ``names``: the record fields to convert (all by default)."""
    data = read_bytes(part.root, part.key, part.start, part.end)
    if data is None:  # deleted by retention since planning
        return None
    return parse_lines(data, part.start, closed_end=part.closed_end, names=names)


def to_batches(part: FileRange, parsed: Parsed, schema: StructType, pushdown: Pushdown | None,
               max_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """Filter, add the layout columns, and shape to exactly the Arrow schema Spark expects."""
    import pyarrow as pa

    from spark.schema import arrow_schema

    table = parsed.table
    if pushdown is not None:
        mask = pushdown.mask(table)
        if mask is not None:
            table = table.filter(mask)
    n = table.num_rows
    if n == 0:
        return
    target = arrow_schema(schema)
    layout_values = {"dt": part.dt, "hour": part.hour, "file": part.key, "open_file": part.from_open,
                     "gateway": part.root}
    for name in target.names:
        if name in layout_values:  # one value for the whole range, only if asked for
            field = target.field(name)
            table = table.append_column(field, pa.repeat(pa.scalar(layout_values[name], field.type), n))
    table = table.select(target.names)
    if not table.schema.equals(target):
        table = table.cast(target)
    yield from table.to_batches(max_chunksize=max_rows)


def skipped_batch(part: FileRange, parsed: Parsed, schema: StructType) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    from spark.schema import arrow_schema

    if not parsed.skipped:
        return
    target = arrow_schema(schema)
    cols = {
        "file": pa.array([part.key] * len(parsed.skipped), pa.string()),
        "offset": pa.array([s.offset for s in parsed.skipped], pa.int64()),
        "length": pa.array([s.length for s in parsed.skipped], pa.int64()),
        "text": pa.array([s.text.decode("utf-8", "replace") for s in parsed.skipped], pa.string()),
        "gateway": pa.array([part.root] * len(parsed.skipped), pa.string()),
    }
    yield pa.RecordBatch.from_arrays([cols[n] for n in target.names], schema=target)
