"""The ``cmq-audit`` PySpark data source (A4).

    from spark import register
    register(spark)
    df = spark.read.format("cmq-audit").load("/var/log/cmq-gateway")
    both = spark.read.format("cmq-audit").load(["/logs/gw-a", "/logs/gw-b"])  # or "/logs/gw-*"
    slim = spark.read.format("cmq-audit").option("columns", "ts,event,size").load(dir)
    parse = spark.read.format("cmq-audit").option("cache", "off").load(dir)  # no columnar cache
    hour = (spark.read.format("cmq-audit")
            .option("from", "2024-05-01T10:00:00Z").option("to", "2024-05-01T11:00:00Z")
            .option("event", "publish,ack").load(dir))       # pruned before any file is opened
    skipped = spark.read.format("cmq-audit").option("output", "skipped").load(dir)  # torn lines
    stream = spark.readStream.format("cmq-audit").load(dir)

Options: ``path`` (the audit directory; several, one per gateway, comma-separated or as a
list to ``load``, and each may be a glob such as ``/logs/gw-*``: their records are merged, and
the column ``gateway`` holds the directory each row came from, as given or as the glob
matched it; a directory given twice is read once); ``columns`` (comma-separated: the only
columns to return, in schema order; the others are not even converted from JSON, which is
most of the cost of a scan. A line is still skipped when it is not JSON, but a field left out
is not checked for its type); ``from`` / ``to`` (ISO-8601 or Unix seconds: keep
``from <= ts < to``; folders outside are never listed); ``event``, ``vhost``, ``topic``,
``queue`` (comma-separated values to keep); ``maxPartitionBytes`` (default 64 MiB: a larger
file is read as several line-aligned ranges); ``output`` (``records``, the default, or
``skipped``: one row per torn or unparseable line the records view skips); ``cache``
(``on``, the default: the parsed records of each closed file are kept as Arrow in
``<dir>/.cmq-audit-cache/`` and later scans read them instead of parsing JSON; a directory
to keep them elsewhere; ``off``; a cache that cannot be written means parsing, see
``spark.cache``.  A range read through the cache is parsed whole once, so a line with a
wrong-typed field is skipped even when that field is not among ``columns``); ``cacheCodec``
(``zstd``, the default, ``lz4`` or ``none``: how new cache entries are compressed); ``pushFilters``
(``true``: also take WHERE conditions through Spark's filter pushdown, see below); for streams
``startingOffsets`` (``earliest``, the default, or ``latest``).

Why pruning is by option by default: in Spark 4.3 the read plan a Python reader makes during
filter pushdown is kept on the relation, so a later query on the *same DataFrame* without a
pushable filter reuses it and silently reads only the rows of the earlier filter (later Spark
keeps it per scan).  With ``pushFilters=true`` use one DataFrame per filtered query.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    GreaterThanOrEqual,
    In,
    LessThan,
)
from pyspark.sql.types import StructType

from spark.cache import cache_base, cached_chunks, check_codec, sweep
from spark.dirs import audit_dirs
from spark.plan import FileRange, Layout, plan_batch, read_compacted, read_range, skipped_batch, to_batches
from spark.pushdown import Pushdown
from spark.schema import AUDIT_SCHEMA, JSON_COLUMNS, SKIPPED_SCHEMA, arrow_schema, select_columns
from spark.times import parse_time

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = ["AuditDataSource", "AuditPushdownReader", "AuditReader", "default_python", "option_filters", "register"]

log = logging.getLogger(__name__)

_OUTPUTS = ("records", "skipped")


_DEFAULT_PARTITION_BYTES = 64 * 1024 * 1024
_MAX_ROWS = 65536  # rows per Arrow batch handed to Spark


def _options(options: dict[str, str]) -> tuple[list[str], int, str]:
    """Validated on the driver at planning time, so a bad option fails the query early.
    ``options`` has lower-case keys (``AuditDataSource._plain_options``)."""
    roots = audit_dirs(options)
    max_bytes = int(options.get("maxpartitionbytes", str(_DEFAULT_PARTITION_BYTES)))
    if max_bytes < 1024:
        raise ValueError("cmq-audit: maxPartitionBytes must be at least 1024")
    output = options.get("output", "records").lower()
    if output not in _OUTPUTS:
        raise ValueError(f"cmq-audit: output must be one of {_OUTPUTS}, not {output!r}")
    return roots, max_bytes, output


_JSON_NAMES = frozenset(n for n, _ in JSON_COLUMNS)


def parse_names(schema: StructType, pushdown: Pushdown | None) -> frozenset[str] | None:
    """The record fields a read must convert: the schema's and those the row filters test;
    None (all of them) for the full schema, so a full read checks every field as before."""
    names = _JSON_NAMES & set(schema.names)
    if names == _JSON_NAMES:
        return None
    if pushdown is not None:
        names |= {c for c, _, _ in pushdown.row_conds}
    return frozenset(names or {"v"})  # at least one field, so that rows are counted


def read_partition(part: object, schema: StructType, output: str,
                   pushdown: Pushdown | None, cache: str | None = None,
                   codec: str = "zstd") -> Iterator[pa.RecordBatch]:
    """Shared by the batch and the stream reader; stateless, runs on an executor.
    ``cache``: the ``cache`` option (``spark.cache``); None (streams) parses every range."""
    if not isinstance(part, FileRange):  # Spark plans InputPartition(None) when there is no file
        return
    names = parse_names(schema, pushdown) if output == "records" else None
    if part.compacted:
        chunks = read_compacted(part, names)
    else:
        # The file the gateway is still writing is never cached: it is not final.
        base = cache_base(part.root, cache) if cache is not None and not part.from_open else None
        chunks = cached_chunks(base, part, names, codec) if base is not None else read_range(part, names)
        if chunks is None:  # compacted and removed since it was planned: the same rows from Parquet
            chunks = read_compacted(part, names)
    if chunks is None:
        log.warning("cmq-audit: %s was deleted before it was read", part.key)
        return
    if output == "skipped":
        yield from skipped_batch(part, [s for parsed in chunks for s in parsed.skipped], schema)
        return
    layout = Layout(part, arrow_schema(schema), _MAX_ROWS)
    skipped = 0
    for parsed in chunks:  # each chunk's rows go to Spark before the next chunk is parsed
        skipped += len(parsed.skipped)
        yield from to_batches(part, parsed, schema, pushdown, _MAX_ROWS, layout)
    if skipped:
        log.warning("cmq-audit: skipped %d torn or bad line(s) in %s", skipped, part.key)


def option_filters(options: dict[str, str]) -> list[Filter]:
    """The pruning options as the filters they stand for."""
    out: list[Filter] = []
    if options.get("from"):
        out.append(GreaterThanOrEqual(("ts",), parse_time(options["from"])))
    if options.get("to"):
        out.append(LessThan(("ts",), parse_time(options["to"])))
    for col in ("event", "vhost", "topic", "queue"):
        if options.get(col):
            out.append(In((col,), tuple(v.strip() for v in options[col].split(","))))
    return out


class AuditReader(DataSourceReader):
    """Batch reader; prunes by the ``from``/``to``/``event``/... options only (safe to reuse)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.roots, self.max_bytes, self.output = _options(options)
        self.schema = schema
        self.cache = options.get("cache", "on")
        self.codec = check_codec(options.get("cachecodec", "zstd"))
        # read_audit: per directory, the keys it reads through Spark's Parquet reader.
        self.exclude = {root: frozenset(keys) for root, keys in json.loads(options.get("exclude", "{}")).items()}
        self.pushdown = Pushdown()
        for f in option_filters(options):
            if not self.pushdown.offer(f):
                raise ValueError(f"cmq-audit: cannot apply option filter {f}")

    def partitions(self) -> list[FileRange]:  # type: ignore[override]
        for root in self.roots:  # entries of files retention has deleted since the last scan
            base = cache_base(root, self.cache)
            if base is not None:
                sweep(base, root)
        return plan_batch(self.roots, self.pushdown, self.max_bytes, self.exclude)

    def read(self, partition: object) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(partition, self.schema, self.output,
                              self.pushdown if self.output == "records" else None, self.cache, self.codec)


class AuditPushdownReader(AuditReader):
    """``pushFilters=true``: WHERE conditions on ts, dt, hour, file and the string keys are
    pruned and applied here (see the module note on Spark 4.3)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if self.output != "records" or not self.pushdown.offer(f):
                yield f


class AuditDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cmq-audit"

    def schema(self) -> StructType:
        output = self.options.get("output", "records").lower()
        if output == "skipped":
            return SKIPPED_SCHEMA
        columns = self.options.get("columns")
        return select_columns(columns) if columns else AUDIT_SCHEMA

    def _plain_options(self) -> dict[str, str]:
        # Spark's options are case-insensitive; readers get a plain dict with lower-case keys.
        return {k.lower(): v for k, v in self.options.items()}

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._plain_options()
        if options.get("pushfilters", "false").lower() == "true":
            return AuditPushdownReader(options, schema)
        return AuditReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark.stream import AuditStreamReader

        return AuditStreamReader(self._plain_options(), schema)


def default_python(spark: SparkSession) -> None:
    """Python workers run this interpreter unless told otherwise (issue 27 item 5): with
    ``PYSPARK_PYTHON`` unset, PySpark starts ``python3`` from the PATH, which in a virtual
    environment that is not activated lacks this package (``No module named 'spark'``).  Only
    when neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python`` says which."""
    if os.environ.get("PYSPARK_PYTHON"):
        return
    try:
        sc = spark.sparkContext
        if sc.getConf().get("spark.pyspark.python") or sc.pythonExec != "python3":
            return
        sc.pythonExec = sys.executable  # the interpreter the data source's functions are pickled for
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: its server decides
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable


def register(spark: SparkSession) -> None:
    """Register ``cmq-audit`` on this session and turn on Python filter pushdown, which the
    ``pushFilters=true`` reader needs (Spark refuses a reader with ``pushFilters`` while it is
    off; the default reader does not have one).  Python workers default to this interpreter
    (``default_python``)."""
    default_python(spark)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(AuditDataSource)
