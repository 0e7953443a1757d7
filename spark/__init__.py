"""PySpark connector and analyses for the gateway's audit log (A4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Register the ``cmq-audit`` data source on ``spark`` (see ``spark.source``)."""
    from spark.source import register as _register

    _register(spark)
