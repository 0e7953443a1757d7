"""The ``cmq-audit`` PySpark data source (A4).

    from spark import register
    register(spark)
    df = spark.read.format("cmq-audit").load("/var/log/cmq-gateway")
    df.where("ts >= timestamp'2024-05-01 10:00:00Z' and event = 'publish'")
    skipped = spark.read.format("cmq-audit").option("output", "skipped").load(dir)  # torn lines
    stream = spark.readStream.format("cmq-audit").load(dir)

Options: ``path`` (the audit directory), ``maxPartitionBytes`` (default 64 MiB: a larger file
is read as several ranges), ``output`` (``records``, the default, or ``skipped``: one row per
torn or unparseable line the records view skips), and for streams ``startingOffsets``
(``earliest``, the default, or ``latest``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, Filter
from pyspark.sql.types import StructType

from spark.plan import FileRange, plan_batch, read_range, skipped_batch, to_batches
from spark.pushdown import Pushdown
from spark.schema import AUDIT_SCHEMA, SKIPPED_SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = ["AuditDataSource", "AuditReader", "register"]

log = logging.getLogger(__name__)

_OUTPUTS = ("records", "skipped")


def _options(options: dict[str, str]) -> tuple[str, int, str]:
    """Validated on the driver at planning time, so a bad option fails the query early."""
    root = options.get("path")
    if not root:
        raise ValueError("cmq-audit: give the audit directory: .load(DIR) or .option('path', DIR)")
    max_bytes = int(options.get("maxPartitionBytes", str(64 * 1024 * 1024)))
    if max_bytes < 1024:
        raise ValueError("cmq-audit: maxPartitionBytes must be at least 1024")
    output = options.get("output", "records").lower()
    if output not in _OUTPUTS:
        raise ValueError(f"cmq-audit: output must be one of {_OUTPUTS}, not {output!r}")
    return root, max_bytes, output


def read_partition(part: FileRange | None, schema: StructType, output: str,
                   pushdown: Pushdown | None) -> Iterator[pa.RecordBatch]:
    """Shared by the batch and the stream reader; stateless, runs on an executor."""
    if part is None:  # Spark plans one empty partition when there is no file at all
        return
    parsed = read_range(part)
    if parsed is None:
        log.warning("cmq-audit: %s was deleted before it was read", part.key)
        return
    if output == "skipped":
        yield from skipped_batch(part, parsed, schema)
        return
    if parsed.skipped:
        log.warning("cmq-audit: skipped %d torn or bad line(s) in %s", len(parsed.skipped), part.key)
    yield from to_batches(part, parsed, schema, pushdown)


class AuditReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.root, self.max_bytes, self.output = _options(options)
        self.schema = schema
        self.pushdown = Pushdown()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if self.output != "records" or not self.pushdown.offer(f):
                yield f

    def partitions(self) -> list[FileRange]:  # type: ignore[override]
        return plan_batch(self.root, self.pushdown, self.max_bytes)

    def read(self, partition: FileRange | None) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(partition, self.schema, self.output, self.pushdown)


class AuditDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cmq-audit"

    def schema(self) -> StructType:
        output = self.options.get("output", "records").lower()
        return SKIPPED_SCHEMA if output == "skipped" else AUDIT_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return AuditReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark.stream import AuditStreamReader

        return AuditStreamReader(dict(self.options), schema)


def register(spark: SparkSession) -> None:
    """Register ``cmq-audit`` on this session and turn on Python filter pushdown, which the
    reader needs (Spark refuses a reader with ``pushFilters`` while it is off)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(AuditDataSource)
