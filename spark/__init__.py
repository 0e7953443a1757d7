"""PySpark connector and analyses for the gateway's audit log (A4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_audit", "register", "session_builder"]


def register(spark: SparkSession) -> None:
    """Register the ``cmq-audit`` data source on ``spark`` (see ``spark.source``)."""
    from spark.source import register as _register

    _register(spark)


def read_audit(session: SparkSession, path_or_paths: str | list[str] | tuple[str, ...], **options: Any) -> DataFrame:
    """The audit log as one DataFrame: compacted segments through Spark's Parquet reader, the
    rest through the ``cmq-audit`` source, each record once (see ``spark.read``)."""
    from spark.read import read_audit as _read_audit

    return _read_audit(session, path_or_paths, **options)


def session_builder(builder: Any = None, extra_java_options: str = "") -> Any:
    """``SparkSession.builder`` with the driver's JVM started from this machine's class
    archive, recorded by the first such session (see ``spark.class_archive``)."""
    from spark.class_archive import session_builder as _session_builder

    return _session_builder(builder, extra_java_options)
