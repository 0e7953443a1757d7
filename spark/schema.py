"""The typed schema of audit records as the ``cmq-audit`` source returns them (A2, A4).

``JSON_COLUMNS`` are the record's own fields, in ``spark/SCHEMA.md`` order; ``dt``, ``hour``,
``file`` and ``open_file`` are added by the reader from the file's place in the layout.
Imports of pyarrow stay inside functions: this module is imported on the driver before Spark
is up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "AUDIT_SCHEMA",
    "JSON_COLUMNS",
    "LAYOUT_COLUMNS",
    "SKIPPED_SCHEMA",
    "arrow_schema",
    "json_arrow_schema",
    "select_columns",
]

_S, _L, _I = StringType(), LongType(), IntegerType()

JSON_COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("v", _I),
    ("ts", TimestampType()),
    ("event", _S),
    ("vhost", _S),
    ("topic", _S),
    ("queue", _S),
    ("subscription", _S),
    ("msg_id", _S),
    ("tags", ArrayType(_S)),
    ("routing_key", _S),
    ("size", _L),
    ("attempt", _I),
    ("reason", _S),
    ("user", _S),
    ("peer", _S),
    ("latency_ms", DoubleType()),
    ("next_at", TimestampType()),
    ("policy", _S),
    ("conn", _S),
    ("dropped", _L),
    # limit_exceeded (PF4): nullable like every field; older records simply lack them.
    ("rule", _S),
    ("value", _L),
    ("limit", _L),
    ("object", _S),
    # CA4 / MQ7: the API that carried the message when not AMQP ("cmq-api", "mqtt").
    ("protocol", _S),
    # v2: "recovery" on what the gateway's start-up restored (A6); absent (null) on client actions.
    ("origin", _S),
    # deliver of a no-ack consumer / get / MQTT QoS 0: settled as sent, no ack record follows.
    ("auto_ack", BooleanType()),
)

# open_file: the row came from the file a running gateway is still writing (more may follow).
# gateway: the audit directory the row was read from (each gateway writes its own, issue 14).
LAYOUT_COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("dt", _S), ("hour", _I), ("file", _S), ("open_file", BooleanType()), ("gateway", _S))

AUDIT_SCHEMA = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS + LAYOUT_COLUMNS])

# option("output", "skipped"): the lines the reader skipped (torn or unparseable), one row each.
SKIPPED_SCHEMA = StructType(
    [
        StructField("file", _S, True),
        StructField("offset", _L, True),
        StructField("length", _L, True),
        StructField("text", _S, True),
        StructField("gateway", _S, True),
    ]
)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark checks a returned RecordBatch against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def json_arrow_schema(names: frozenset[str] | None = None) -> pa.Schema:
    """Explicit schema for pyarrow's JSON reader: the record fields only (those in ``names``,
    all by default; the reader skips the others without converting them)."""
    return arrow_schema(StructType([StructField(n, t, True) for n, t in JSON_COLUMNS
                                    if names is None or n in names]))


def select_columns(spec: str) -> StructType:
    """``option("columns", "ts,event,size")``: the audit schema narrowed to those columns, in
    schema order.  Raises ValueError naming an unknown column."""
    wanted = {c.strip() for c in spec.split(",") if c.strip()}
    unknown = wanted - set(AUDIT_SCHEMA.names)
    if unknown or not wanted:
        raise ValueError(f"cmq-audit: columns must name columns of the audit schema, "
                         f"not {sorted(unknown) or spec!r} (known: {', '.join(AUDIT_SCHEMA.names)})")
    return StructType([f for f in AUDIT_SCHEMA if f.name in wanted])
