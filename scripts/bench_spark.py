"""Measure the cmq-audit connector against spark.read.json over the same records.

    .venv/bin/python scripts/bench_spark.py [--records 1000000] [--keep DIR]

Writes ~N records with the real AuditLog (spark.demo, 5 publishes/s, so they span several
hours), then times, on local[2]: a full scan (count + sum over typed columns, so every row is
parsed) and a one-hour time-range scan, by the connector and by spark.read.json with an
explicit schema (no inference pass).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="reuse/keep the generated log here")
    args = ap.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    root = args.keep or tempfile.mkdtemp(prefix="bench-spark-")
    from spark.demo import write_demo_log

    if not os.path.isdir(os.path.join(root)) or not os.listdir(root):
        t0 = time.perf_counter()
        n = write_demo_log(root, int(args.records / 9.1), rate=5.0, rotate_bytes=32 * 1024 * 1024)
        print(f"generated {n:,} records in {time.perf_counter() - t0:.1f}s", flush=True)

    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructField, StructType

    from spark import register
    from spark.schema import JSON_COLUMNS

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    agg = ["count(*) as n", "sum(size) as bytes", "count(distinct event) as events", "max(ts) as last"]
    first = spark.read.format("cmq-audit").load(root).selectExpr("min(ts) as t").collect()[0].t
    lo = first.replace(minute=0, second=0, microsecond=0)
    hour = (lo.replace(hour=lo.hour + 2)).strftime("%Y-%m-%dT%H:00:00Z")
    hour_end = (lo.replace(hour=lo.hour + 3)).strftime("%Y-%m-%dT%H:00:00Z")
    where = f"ts >= timestamp'{hour}' and ts < timestamp'{hour_end}'"
    json_schema = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS])

    def timed(label: str, make) -> None:  # type: ignore[no-untyped-def]
        best = None
        for _ in range(2):  # the first run also warms the JVM and the Python workers
            t0 = time.perf_counter()
            row = make().selectExpr(*agg).collect()[0]
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        print(f"{label:44s} {row.n:>10,} rows {best:6.1f}s {row.n / best:>12,.0f} rows/s", flush=True)

    timed("cmq-audit, full scan", lambda: spark.read.format("cmq-audit").load(root))
    timed("spark.read.json, full scan", lambda: spark.read.schema(json_schema).json(root))
    timed("cmq-audit, one hour (from/to options)",
          lambda: spark.read.format("cmq-audit").option("from", hour).option("to", hour_end).load(root))
    timed("cmq-audit, one hour (WHERE, pushFilters)",
          lambda: spark.read.format("cmq-audit").option("pushFilters", "true").load(root).where(where))
    timed("spark.read.json, one hour (WHERE)", lambda: spark.read.schema(json_schema).json(root).where(where))
    spark.stop()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
