"""Streaming reads of the live audit log: ``spark.readStream.format("cmq-audit")`` (A4).

An offset is ``{"file": KEY, "offset": N}``: every file whose key sorts before KEY has been
read, and the first N bytes of KEY.  Keys sort in write order (``gateway/audit/layout.py``) and
one writer appends only to its newest file, so a single position is a complete offset.  The
end offset of a micro-batch stops after the last *complete* line of the newest file; the
bytes of a file before that are final, so re-planning a batch after a restart (from Spark's
checkpoint) reads exactly the same records: exactly-once with an idempotent sink.

Rotation renames a file under the reader: a range is read by key under whichever name the
file has now.  Retention may delete a file before it is read: its records are gone, the range
yields nothing, the query goes on; nothing is read twice since offsets only move forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from gateway.audit import layout
from spark.lines import last_line_end
from spark.plan import FileRange, split

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["AuditStreamReader"]

_START: dict[str, Any] = {"file": "", "offset": 0}


def _folder_of(key: str) -> str:
    return key.rsplit("/", 1)[0]


class AuditStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        from spark.source import _options

        roots, self.max_bytes, self.output = _options(options)
        if len(roots) != 1:  # an offset is one position in one directory's write order
            raise ValueError(f"cmq-audit: a stream reads one audit directory, not {len(roots)}: "
                             f"start one stream per gateway")
        self.root = roots[0]
        self.schema = schema
        self.starting = options.get("startingoffsets", "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise ValueError("cmq-audit: startingOffsets must be 'earliest' or 'latest'")
        self._target: dict[str, Any] | None = None

    def _files_after(self, start: dict[str, Any]) -> list[layout.AuditFile]:
        first = start["file"]
        folder = _folder_of(first) if first else ""
        return [
            af
            for af in layout.list_files(
                self.root, include_open=True,
                keep_folder=lambda dt, hour: f"dt={dt}/hour={hour:02d}" >= folder,
            )
            if af.key >= first
        ]

    def _latest(self, start: dict[str, Any]) -> dict[str, Any]:
        files = self._files_after(start)
        if not files:
            return start
        last = files[-1]
        # Whole lines only; a closed file is final, its torn tail (if any) read as skipped.
        end = last.size if not last.is_open else last_line_end(self.root, last.key, last.size)
        pos = {"file": last.key, "offset": end}
        return pos if (last.key, end) > (start["file"], start["offset"]) else start

    def initialOffset(self) -> dict[str, Any]:
        return dict(_START) if self.starting == "earliest" else self._latest(dict(_START))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # No per-trigger limit is offered (getDefaultReadLimit is ReadAllAvailable).
        if self._target is not None:
            t = self._target
            return t if (t["file"], t["offset"]) > (start["file"], start["offset"]) else start
        return self._latest(start)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest(dict(_START))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FileRange]:  # type: ignore[override]
        out: list[FileRange] = []
        for af in self._files_after(start):
            if af.key > end["file"]:
                break
            lo = start["offset"] if af.key == start["file"] else 0
            # A file before the newest one is closed and final; the newest ends where
            # _latest put it: after a newline, or at the end of a closed file, so any bytes
            # after the last newline of a range are a torn line.
            hi = end["offset"] if af.key == end["file"] else af.size
            if hi > lo:
                out.extend(split(self.root, af, lo, hi, True, self.max_bytes))
        return out

    def read(self, partition: FileRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        from spark.source import read_partition

        return read_partition(partition, self.schema, self.output, None)

    def commit(self, end: dict[str, Any]) -> None:
        return None
