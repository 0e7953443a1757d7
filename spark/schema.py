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
)

# open_file: the row came from the file a running gateway is still writing (more may follow).
LAYOUT_COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("dt", _S), ("hour", _I), ("file", _S), ("open_file", BooleanType()))

AUDIT_SCHEMA = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS + LAYOUT_COLUMNS])

# option("output", "skipped"): the lines the reader skipped (torn or unparseable), one row each.
SKIPPED_SCHEMA = StructType(
    [
        StructField("file", _S, True),
        StructField("offset", _L, True),
        StructField("length", _L, True),
        StructField("text", _S, True),
    ]
)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark checks a returned RecordBatch against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def json_arrow_schema() -> pa.Schema:
    """Explicit schema for pyarrow's JSON reader: the record fields only."""
    return arrow_schema(StructType([StructField(n, t, True) for n, t in JSON_COLUMNS]))
