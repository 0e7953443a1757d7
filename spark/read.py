"""``read_audit``: the documented way to read the audit log into one DataFrame (A4, A7).

    from spark import read_audit
    df = read_audit(spark, "/var/log/cmq-gateway")                 # or a list, "a,b", a glob
    hour = read_audit(spark, dir, **{"from": "2024-05-01T10:00:00Z", "to": "2024-05-01T11:00:00Z"})

Segments the gateway has compacted to Parquet (``gateway.audit.compact``) are read by Spark's
own Parquet reader: it reads only the columns a query uses, skips row groups by their
statistics for a WHERE on ``ts``, ``event``, ``queue``… and decodes vectorized, in the JVM.  The
rest (the segment the gateway is writing, and closed segments not compacted yet) is read by the
``cmq-audit`` Python source, told to leave out the compacted ones (option ``exclude``).  The two
are one DataFrame with the ``cmq-audit`` schema (``AUDIT_SCHEMA``, or the ``columns`` option's).

Each record exactly once: the Parquet files are listed when ``read_audit`` is called, and the
Python source excludes exactly those keys; every other segment it reads in one form, the
Parquet one when both exist (``spark.plan.plan_batch``), even while a compactor is at work.
A Parquet file is only ever renamed into place complete, so the listing never sees half of one.
The compacted part of the DataFrame is what existed when ``read_audit`` was called; the rest is
listed again by each action, as ``spark.read.format("cmq-audit")`` does.  When nothing but
Parquet files existed at that moment (a stopped gateway's log, all compacted), the Python
source is left out entirely: no Python worker is started, and ``cmq-audit`` is not even
registered (``register`` does that for ``spark.read.format("cmq-audit")``).

Options are those of ``cmq-audit`` (``spark.source``): ``columns``, ``from``/``to``, ``event``,
``vhost``, ``topic``, ``queue`` apply to both parts; the others (``cache``, ``maxPartitionBytes``,
``pushFilters``…) to the Python part.  ``output="skipped"`` is answered by the Python source
alone (it reads the skipped lines that each Parquet file keeps in its metadata).
"""

from __future__ import annotations

import json
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType, StructField, StructType

from spark.dirs import audit_dirs
from spark.pushdown import Pushdown
from spark.schema import AUDIT_SCHEMA, JSON_COLUMNS, select_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["read_audit", "skipped_lines", "uncompacted"]

_RECORD_SCHEMA = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS])
# With the partition columns, so that Spark reads them from the dt=/hour= folders as typed here.
_PARQUET_SCHEMA = StructType([*_RECORD_SCHEMA.fields, *(f for f in AUDIT_SCHEMA.fields if f.name in ("dt", "hour"))])
_FILTER_KEYS = ("event", "vhost", "topic", "queue")


def _paths(path_or_paths: str | list[str] | tuple[str, ...]) -> dict[str, str]:
    if isinstance(path_or_paths, str):
        return {"path": path_or_paths}
    return {"paths": json.dumps(list(path_or_paths))}


def read_audit(session: SparkSession, path_or_paths: str | list[str] | tuple[str, ...], **options: Any) -> DataFrame:
    """The audit records under ``path_or_paths`` (one gateway's audit directory, several as a
    list or comma-separated, or a glob): compacted segments through Spark's Parquet reader, the
    rest through the ``cmq-audit`` source; one schema, each record once."""
    from gateway.audit.compact import list_parquet
    from spark.source import option_filters

    opts = {k.lower(): str(v) for k, v in options.items()}
    if opts.get("output", "records").lower() != "records":
        return _python_part(session, audit_dirs(_paths(path_or_paths)), opts, {})
    roots = audit_dirs(_paths(path_or_paths))
    schema = select_columns(opts["columns"]) if opts.get("columns") else AUDIT_SCHEMA
    pushdown = Pushdown()
    for f in option_filters(opts):
        pushdown.offer(f)
    parts: list[DataFrame] = []
    exclude: dict[str, list[str]] = {}
    tail = False
    conds = _conditions(opts)
    for root in roots:
        compacted = list_parquet(root, keep_folder=pushdown.keep_folder)
        exclude[root] = list(compacted)
        if compacted:
            parts.append(_parquet_part(session, root, compacted, schema, conds))
        tail = tail or _has_tail(root, set(compacted), pushdown)
    if tail or not parts:
        parts.append(_python_part(session, roots, opts, exclude).select(*schema.names))
    return reduce(lambda a, b: a.unionByName(b), parts)


def _has_tail(root: str, compacted: set[str], pushdown: Pushdown) -> bool:
    """Whether ``root`` holds a segment (open or closed, not empty) outside ``compacted``."""
    from gateway.audit import layout

    return any(af.size and af.key not in compacted
               for af in layout.list_files(root, include_open=True, keep_folder=pushdown.keep_folder))


def _python_part(session: SparkSession, roots: list[str], opts: dict[str, str],
                 exclude: dict[str, list[str]]) -> DataFrame:
    # Registered here, not in read_audit: a session's first Python data source call starts a
    # Python process that imports every ``pyspark_*`` module on the path to look for more
    # (1.3-2 s on this venv), a fixed cost a read of Parquet files alone need not pay.
    from spark.source import register

    register(session)
    reader = session.read.format("cmq-audit")
    for k, v in opts.items():
        if k not in ("path", "paths"):
            reader = reader.option(k, v)
    if any(exclude.values()):
        reader = reader.option("exclude", json.dumps(exclude))
    return reader.option("paths", json.dumps(roots)).load()


def _parquet_part(session: SparkSession, root: str, compacted: dict[str, str], schema: StructType,
                  conds: Column | None) -> DataFrame:
    """One directory's Parquet segments, filtered by ``conds``, as the columns of ``schema``
    with the layout ones: ``dt``/``hour`` as Spark's partition columns (``basePath``: pruned
    by a WHERE on them, read from the path, not the file), ``file`` the segment's key (as the
    Python source names it), ``gateway`` the directory.  Each is nullable, as in
    ``AUDIT_SCHEMA`` (``nullif`` with NULL: the optimizer drops it).  ``_metadata.file_path``
    would do for ``file``, but referring to ``_metadata`` made every scan read the row-index
    metadata column too (4x the time of a narrow query).

    One ``select`` makes all of it: each DataFrame step is analysed by the JVM when it is
    made, and ``withColumns`` then ``select`` cost a cold JVM about 0.2 s more (of 0.45 s)."""
    # A file that retention deletes between this listing and the read is simply absent.
    df = (session.read.schema(_PARQUET_SCHEMA).option("basePath", root).option("ignoreMissingFiles", "true")
          .parquet(*compacted.values()))
    if conds is not None:  # on the file's own columns, before any is renamed or left out
        df = df.where(conds)
    key = F.concat(F.regexp_extract(F.input_file_name(), r"(dt=[^/]+/hour=[0-9]+/audit-[^/]+)\.parquet$", 1),
                   F.lit(".jsonl"))
    # Typed NULLs by DataType, not by name: a type name goes through the SQL parser, about 370
    # classes a cold JVM loads for the making alone when the query is not SQL.
    null_string, null_bool = F.lit(None).cast(StringType()), F.lit(None).cast(BooleanType())
    layout = {
        "file": F.nullif(key, null_string),
        "open_file": F.nullif(F.lit(False), null_bool),
        "gateway": F.nullif(F.lit(root), null_string),
    }
    return df.select(*(layout[n].alias(n) if n in layout else F.col(n) for n in schema.names))


def _conditions(opts: dict[str, str]) -> Column | None:
    """The pruning options as one Spark condition (pushed down into the Parquet scan)."""
    from spark.times import parse_time

    conds: list[Column] = []
    if opts.get("from"):
        conds.append(F.col("ts") >= F.lit(parse_time(opts["from"])))
    if opts.get("to"):
        conds.append(F.col("ts") < F.lit(parse_time(opts["to"])))
    for col in _FILTER_KEYS:
        if opts.get(col):
            conds.append(F.col(col).isin([v.strip() for v in opts[col].split(",")]))
    return reduce(lambda a, b: a & b, conds) if conds else None


def skipped_lines(session: SparkSession, path_or_paths: str | list[str] | tuple[str, ...]) -> int:
    """How many torn or unreadable lines a read of ``path_or_paths`` skips: those of compacted
    segments from their Parquet files' metadata (no Spark job), the others counted by the
    ``cmq-audit`` source (``output="skipped"``) when there are any others."""
    from gateway.audit.compact import info, list_parquet

    roots = audit_dirs(_paths(path_or_paths))
    n, tail = 0, False
    exclude: dict[str, list[str]] = {}
    for root in roots:
        compacted = list_parquet(root)
        exclude[root] = []
        for key, path in compacted.items():
            try:
                n += len(info(path)["skipped"])
            except (OSError, KeyError, ValueError):  # deleted since listed: the source decides
                continue
            exclude[root].append(key)
        tail = tail or _has_tail(root, set(exclude[root]), Pushdown())
    if tail:
        n += _python_part(session, roots, {"output": "skipped"}, exclude).count()
    return n


def uncompacted(path_or_paths: str | list[str] | tuple[str, ...]) -> bool:
    """Whether a read of ``path_or_paths`` goes through the Python source at all (a segment
    open or not compacted yet): the report caches the records only then."""
    from gateway.audit.compact import list_parquet

    return any(_has_tail(root, set(list_parquet(root)), Pushdown()) for root in audit_dirs(_paths(path_or_paths)))
