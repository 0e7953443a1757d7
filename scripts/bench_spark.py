"""Measure the cmq-audit connector against spark.read.json over the same records, in one run.

    .venv/bin/python scripts/bench_spark.py [--records 1000000] [--keep DIR] [--cases full,noop]
                                            [--cluster | --master URL]

Writes ~N records with the real AuditLog (spark.demo, 5 publishes/s, so they span several
hours), then times each case as the connector and spark.read.json (explicit schema, no
inference pass) back to back, three rounds after one warm-up each, and prints the medians and
their ratio.  Each query is count + sum + count distinct + max over typed columns, so every row
is parsed:

* ``full``: every column of the connector (it cannot learn which columns a query uses: the
  Python data source API has no column pruning) against spark.read.json, which prunes itself
  to the three columns the query reads;
* ``noop``: equal work, every column of every row materialised on both sides: a write to
  Spark's ``noop`` format instead of the aggregate;
* ``infer``: the same aggregate against spark.read.json *without* a schema, as a user who
  does not type one runs it (inference reads every file once more, and ``ts`` stays a string);
* ``columns``: full scan with the ``columns`` option: the connector told the columns the
  query uses;
* ``hour``, ``where``: one hour, by the from/to options and by WHERE with pushFilters.

``--cache off,cold,warm`` (the default) runs each case once per state of the connector's
columnar cache of closed files (spark/cache.py), labelled so: ``off`` parses JSON as before;
``cold`` empties the cache before each of the connector's runs, so every run parses and writes
it; ``warm`` reads the entries its warm-up run wrote.  The cache is a temporary directory
(the ``cache`` option), not the log's own; ``--cache-codec`` compresses it (``zstd``, the
connector's default, ``lz4`` or ``none``).

``--cases full,noop`` runs only those.  The machine's load average is printed before and
after: on a shared machine, read the ratios (both sides alternate under the same load), not
the seconds.

``--read-audit`` measures instead ``spark.read_audit`` (the log compacted to Parquet, read
by Spark's own Parquet reader) against spark.read.json on the same records: a full-scan
aggregate, a narrow query (count per event) and a filtered one (one hour's acks), warm (one
session) and cold (each run the first query of a new session), and the bytes on disk of both
forms.  ``--warmup N`` runs N queries of each side before the warm rounds (a fresh JVM, and on a
cluster a fresh executor, runs each reader's first queries several times slower until the JIT
has compiled its paths), and prints each round's seconds and the executors' task CPU of each
query (Spark's event log); ``--warm-only`` skips the cold runs.  ``--layouts`` instead rewrites
the log's Parquet files under other writer settings (``LAYOUTS``: row groups, codecs, delta
encoding of ``ts``) and times Spark's scan of each, interleaved, by wall and task CPU.

``--class-archive`` (with ``--read-audit``) runs the cold part twice over, interleaved: as
above, and with both sides' JVMs started from one class archive (``spark.class_archive.
session_builder``), recorded first by a process that ran one query of each side, so that
neither side's classes are favoured; the archive lives in a temporary cache directory.
``--cold-before CHECKOUT`` adds cold runs whose processes import the connector from another
checkout (``git archive REV | tar -x -C DIR``), interleaved with the others: a before/after
under the same load.

``--cluster`` starts a standalone master and one worker (2 cores) from pyspark's own launcher
for the run, as tests/spark/test_spark_cluster.py does; ``--master URL`` uses a running one;
the default is local[2].
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.spark.standalone, and this checkout ahead of an installed copy
ROUNDS = 3
AGG = ["count(*) as n", "sum(size) as bytes", "count(distinct event) as events", "max(ts) as last"]
USED = "ts,event,size"  # the columns AGG reads
CODE = ROOT


def tree_cpu() -> float:
    """CPU seconds of this process and every descendant (the JVM, the Python workers and
    planners), finished children included: on a machine shared with other work, CPU time per
    query says more than wall time.  Local mode only (a cluster's executors are not ours)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    me = os.getpid()

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == me:
                return True
            pid = parent.get(pid, 0)
        return False

    return sum(c for pid, c in cpu.items() if ours(pid))


CASES = ("full", "noop", "infer", "columns", "hour", "where")
CACHE_STATES = ("off", "cold", "warm")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(root: str, master: str, cases: tuple[str, ...] = CASES,
        cache_states: tuple[str, ...] = ("off",), codec: str = "zstd") -> None:
    from tests.spark.standalone import spark_env

    # The driver, the planner and the executors all import the connector from CODE.
    os.environ.update({k: v for k, v in spark_env(CODE).items() if k.startswith("PYSPARK") or k == "PYTHONPATH"})
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

    from spark import register
    from spark.schema import JSON_COLUMNS

    builder = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g"))
    if master.startswith("spark://"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.executor.memory", "1536m")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    first = spark.read.format("cmq-audit").option("cache", "off").option("columns", "ts").load(root).selectExpr("min(ts) as t").collect()[0].t
    lo = first.replace(minute=0, second=0, microsecond=0)
    hour = (lo.replace(hour=lo.hour + 2)).strftime("%Y-%m-%dT%H:00:00Z")
    hour_end = (lo.replace(hour=lo.hour + 3)).strftime("%Y-%m-%dT%H:00:00Z")
    where = f"ts >= timestamp'{hour}' and ts < timestamp'{hour_end}'"
    json_schema = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS])

    cache_dir = tempfile.mkdtemp(prefix="bench-spark-cache-")
    state = ["off"]

    def audit(**options: str) -> DataFrame:
        reader = (spark.read.format("cmq-audit").option("cache", "off" if state[0] == "off" else cache_dir)
                  .option("cacheCodec", codec))
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load(root)

    local = master.startswith("local")

    def timed(make: Callable[[], DataFrame], noop: bool, cold: bool = False) -> tuple[float, float, Any]:
        if cold:  # outside the timing: every run of the connector parses and writes the cache
            shutil.rmtree(cache_dir, ignore_errors=True)
        c0, t0 = tree_cpu() if local else 0.0, time.perf_counter()
        if noop:  # every column of every row materialised, nothing kept
            make().write.format("noop").mode("overwrite").save()
            row = None
        else:
            row = make().selectExpr(*AGG).collect()[0]
        return time.perf_counter() - t0, (tree_cpu() if local else 0.0) - c0, row

    def case(label: str, connector: Callable[[], DataFrame], builtin: Callable[[], DataFrame],
             noop: bool = False) -> None:
        cold = state[0] == "cold"
        label = f"{label} [cache {state[0]}{'' if state[0] == 'off' else ', ' + codec}]"
        timed(connector, noop, cold)  # warm-up: the JVM's code paths, the Python workers, the cache
        timed(builtin, noop)
        a: list[tuple[float, float]] = []
        b: list[tuple[float, float]] = []
        for _ in range(ROUNDS):  # interleaved, so that load from elsewhere hits both alike
            wall, cpu, row_a = timed(connector, noop, cold)
            a.append((wall, cpu))
            wall, cpu, row_b = timed(builtin, noop)
            b.append((wall, cpu))
        if noop:  # the aggregate cases check the rows; count them here
            n = connector().count()
            assert n == builtin().count(), n
        else:
            assert (row_a.n, row_a.bytes, row_a.events) == (row_b.n, row_b.bytes, row_b.events), (row_a, row_b)
            n = row_a.n
        ma, mb = (statistics.median(w for w, _ in x) for x in (a, b))
        ca, cb = (statistics.median(c for _, c in x) for x in (a, b))
        cpu_note = f"  cpu {ca:5.2f}s vs {cb:5.2f}s, ratio {cb / ca:4.2f}x" if local else ""
        print(f"{label:48s} {n:>9,} rows  cmq-audit {ma:5.2f}s {n / ma:>9,.0f} rows/s  "
              f"spark.read.json {mb:5.2f}s {n / mb:>9,.0f} rows/s  ratio {mb / ma:4.2f}x{cpu_note}", flush=True)

    print(f"master {master}, medians of {ROUNDS}, ratio = spark.read.json time / cmq-audit time "
          f"(cpu: seconds of CPU of the driver, the JVM and the Python workers); "
          f"load average {load_average()}", flush=True)
    typed = lambda: json_reader(spark).schema(json_schema).json(root)  # noqa: E731
    runs: dict[str, Callable[[], None]] = {
        "full": lambda: case("full scan, every column", audit, typed),
        "noop": lambda: case("full scan, noop write (all columns)", audit, typed, noop=True),
        "infer": lambda: case("full scan, json infers the schema", audit, lambda: json_reader(spark).json(root)),
        "columns": lambda: case(f"full scan, columns={USED}", lambda: audit(columns=USED), typed),
        "hour": lambda: case("one hour, from/to options", lambda: audit(**{"from": hour, "to": hour_end, "columns": USED}),
                             lambda: typed().where(where)),
        "where": lambda: case("one hour, WHERE + pushFilters", lambda: audit(pushFilters="true", columns=USED).where(where),
                              lambda: typed().where(where)),
    }
    try:
        for name in cases:
            for st in cache_states:  # the states of one case back to back, under the same load
                state[0] = st
                runs[name]()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(f"load average {load_average()}", flush=True)
    spark.stop()


def json_reader(spark: Any) -> Any:
    """spark.read for the JSON-lines segments only (the Parquet files beside them are not JSON)."""
    return spark.read.option("pathGlobFilter", "*.jsonl")


def disk_bytes(root: str) -> tuple[int, int]:
    """Bytes of the JSON-lines segments and of their Parquet files under ``root``."""
    jsonl = sum(p.stat().st_size for p in Path(root).rglob("audit-*.jsonl"))
    parquet = sum(p.stat().st_size for p in Path(root).rglob("audit-*.parquet"))
    return jsonl, parquet


READ_AUDIT_CASES = {
    # name: (what it asks, SQL over the DataFrame "t")
    "full": ("full scan: count, sum(size), count distinct event, max(ts)",
             "select count(*) as n, sum(size) as bytes, count(distinct event) as events, max(ts) as last from t"),
    "narrow": ("narrow: count per event",
               "select event, count(*) as n from t group by event order by event"),
    "filtered": ("filtered: acks of one hour, p50 latency",
                 "select count(*) as n, percentile_approx(latency_ms, 0.5) as p50 from t "
                 "where event = 'ack' and ts >= timestamp'{hour}' and ts < timestamp'{hour_end}'"),
}


def task_cpu_by_job(event_dir: str) -> dict[str, float]:
    """Executor CPU seconds (task run and deserialization) of each job description's tasks, from
    Spark's uncompressed event log under ``event_dir``: the work of a query's tasks, which a
    loaded machine stretches in wall time but hardly in CPU, and which on a cluster is the
    executor's (the driver's tree_cpu does not see it)."""
    stage_job: dict[int, str] = {}
    cpu: dict[str, float] = {}
    for path in Path(event_dir).rglob("*"):
        if not path.is_file() or not path.name.startswith("events_"):  # not appstatus_* (empty)
            continue
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerJobStart":
                    tag = (event.get("Properties") or {}).get("spark.job.description", "")
                    stage_job.update((stage, tag) for stage in event["Stage IDs"])
                elif kind == "SparkListenerTaskEnd":
                    tag = stage_job.get(event["Stage ID"], "")
                    m = event.get("Task Metrics") or {}
                    ns = m.get("Executor CPU Time", 0) + m.get("Executor Deserialize CPU Time", 0)
                    cpu[tag] = cpu.get(tag, 0.0) + ns / 1e9
    return cpu


def run_read_audit(root: str, master: str, rounds: int, cases: tuple[str, ...] = tuple(READ_AUDIT_CASES),
                   archive: bool = False, before: Path | None = None, warmup: int = 1, cold: bool = True) -> None:
    """``--read-audit``: spark.read_audit (compacted segments through Spark's Parquet reader)
    against spark.read.json with the explicit schema, on the same records.  Warm: one session,
    a warm-up of each, then ``rounds`` interleaved runs.  Cold: each run the first query of a
    new process (a new JVM: no JIT-compiled code, no listing cached), interleaved; its start
    is not timed.  A cold run is timed twice: the query alone, and with the DataFrame's making
    before it (read_audit's listing and plan, spark.read.json's listing), which a user waits
    for as well.  ``warmup``: queries of each side before the timed ones (a new JVM, the
    executor's on a cluster, runs the first few of each reader several times slower until the
    JIT has compiled its paths); each round's seconds are printed, and the executors' task
    CPU of each query from Spark's event log."""
    from tests.spark.standalone import spark_env

    os.environ.update({k: v for k, v in spark_env(CODE).items() if k.startswith("PYSPARK") or k == "PYTHONPATH"})
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructField, StructType

    from spark import read_audit
    from spark.schema import JSON_COLUMNS

    json_schema = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS])

    events = tempfile.mkdtemp(prefix="bench-spark-events-")

    def session() -> SparkSession:
        builder = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g")
                   .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", events)
                   .config("spark.eventLog.compress", "false"))
        if master.startswith("spark://"):
            builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.executor.memory", "1536m")
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark

    spark = session()
    first = read_audit(spark, root, columns="ts").selectExpr("min(ts) as t").collect()[0].t
    lo = first.replace(minute=0, second=0, microsecond=0)
    hour = (lo.replace(hour=lo.hour + 2)).strftime("%Y-%m-%dT%H:00:00Z")
    hour_end = (lo.replace(hour=lo.hour + 3)).strftime("%Y-%m-%dT%H:00:00Z")
    os.environ["BENCH_HOUR"] = f"{hour},{hour_end}"  # for the cold runs' processes

    def query(spark: SparkSession, which: str, sql: str, tag: str = "") -> tuple[float, list[Any]]:
        df = read_audit(spark, root) if which == "read_audit" else json_reader(spark).schema(json_schema).json(root)
        df.createOrReplaceTempView("t")
        spark.sparkContext.setJobDescription(tag or None)
        t0 = time.perf_counter()
        rows = spark.sql(sql.format(hour=hour, hour_end=hour_end)).collect()
        return time.perf_counter() - t0, rows

    jsonl, parquet = disk_bytes(root)
    print(f"master {master}; bytes on disk: JSON lines {jsonl:,}, Parquet {parquet:,} "
          f"({parquet / jsonl:.1%} of the JSON); load average {load_average()}", flush=True)
    print(f"ratio = spark.read.json time / read_audit time; medians of {rounds}", flush=True)
    warm: list[tuple[str, list[float], list[float], str]] = []
    for name in cases:
        label, sql = READ_AUDIT_CASES[name]
        for _ in range(warmup):  # interleaved, as the timed rounds
            query(spark, "read_audit", sql)
            query(spark, "json", sql)
        a, b = [], []
        for i in range(rounds):
            wa, ra = query(spark, "read_audit", sql, f"read_audit:{name}:{i}")
            wb, rb = query(spark, "json", sql, f"json:{name}:{i}")
            assert [r[:2] if name == "narrow" else r[0] for r in ra] == [r[:2] if name == "narrow" else r[0] for r in rb], \
                (name, ra, rb)
            a.append(wa)
            b.append(wb)
        ma, mb = statistics.median(a), statistics.median(b)
        rows = f"; {ra[0].n:,} records on both sides" if name == "full" else ""
        print(f"warm  {label:48s} read_audit {ma:6.2f}s  spark.read.json {mb:6.2f}s  ratio {mb / ma:5.2f}x{rows}",
              flush=True)
        warm.append((name, a, b, load_average()))
    spark.stop()
    cpu = task_cpu_by_job(events)
    shutil.rmtree(events, ignore_errors=True)
    for name, a, b, load in warm:
        ca, cb = ([cpu.get(f"{side}:{name}:{i}", 0.0) for i in range(rounds)] for side in ("read_audit", "json"))
        print(f"warm  {name}: after {warmup} warm-up(s) a side, each round's seconds {[round(x, 2) for x in a]} vs "
              f"{[round(x, 2) for x in b]}; executor task CPU {statistics.median(ca):.3f}s vs {statistics.median(cb):.3f}s "
              f"(ratio {statistics.median(cb) / max(statistics.median(ca), 1e-9):.2f}x), each round's "
              f"{[round(x, 3) for x in ca]} vs {[round(x, 3) for x in cb]}; load {load}", flush=True)
    if not cold:
        print(f"load average {load_average()}", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-spark-archive-") as cache:
        # (label, the checkout the processes import, the archive's cache directory)
        kinds = [("", CODE, "")]
        if before is not None:
            kinds.append((f" (before: {before})", before, ""))
        if archive:  # recorded by one process that ran a query of each side
            kinds.append((" +archive", CODE, cache))
            cold_query(root, master, "both", cases[0], cache)
            assert list(Path(cache, "cmq-audit").glob("*.jsa")), "no class archive was recorded"
        for name in cases:
            label = READ_AUDIT_CASES[name][0]
            got: dict[str, tuple[list[tuple[float, float, float, str, int, int]], ...]] = {k[0]: ([], []) for k in kinds}
            for _ in range(rounds):
                for k, code, cache_dir in kinds:  # interleaved: read_audit, json, then the next kind
                    got[k][0].append(cold_query(root, master, "read_audit", name, cache_dir, code))
                    got[k][1].append(cold_query(root, master, "json", name, cache_dir, code))
            for k, (ca, cb) in got.items():
                ma, mb = (statistics.median(x[0] for x in side) for side in (ca, cb))
                da, db = (statistics.median(x[1] for x in side) for side in (ca, cb))
                sa, sb = (statistics.median(x[2] for x in side) for side in (ca, cb))
                loads = "; ".join(f"{x[3]}/{y[3]}" for x, y in zip(ca, cb, strict=True))
                ka, kb = ((statistics.median(x[4] for x in side), statistics.median(x[5] for x in side))
                          for side in (ca, cb))
                print(f"cold{k}  {label:48s} read_audit {ma:6.2f}s  spark.read.json {mb:6.2f}s  "
                      f"ratio {mb / ma:5.2f}x;  with the DataFrame's making {ma + da:6.2f}s vs {mb + db:6.2f}s "
                      f"(medians of each part), ratio {(mb + db) / (ma + da):5.2f}x;  session start {sa:5.2f}s "
                      f"vs {sb:5.2f}s;  classes loaded making/query {ka[0]:.0f}/{ka[1]:.0f} vs {kb[0]:.0f}/{kb[1]:.0f};  "
                      f"each run's queries {[round(x[0], 2) for x in ca]} vs {[round(y[0], 2) for y in cb]}, "
                      f"load {loads}", flush=True)
    print(f"load average {load_average()}", flush=True)


# --layouts: the compactor's Parquet files rewritten under other writer settings (pyarrow's
# write_table keywords), to see what the layout changes in Spark's scan.
LAYOUTS: dict[str, dict[str, Any]] = {
    "compactor": {},  # as gateway.audit.compact writes them: zstd, dictionary, 131,072-row groups
    "one-row-group": {"row_group_size": 1 << 30},
    "snappy": {"compression": "snappy"},
    "uncompressed": {"compression": "none"},
    "delta-ts": {"use_dictionary": ["ts", "_offset", "latency_ms"],  # inverted below: all but these
                 "column_encoding": {"ts": "DELTA_BINARY_PACKED", "_offset": "DELTA_BINARY_PACKED"}},
}


def run_layouts(root: str, master: str, rounds: int, warmup: int) -> None:
    """``--layouts``: each Parquet file of ``root`` rewritten under each of ``LAYOUTS`` (same
    rows, same names), then the full-scan aggregate through plain ``spark.read.parquet`` with
    read_audit's schema and ``basePath``, the layouts interleaved in one session: bytes, wall
    and the executors' task CPU (Spark's event log) of each."""
    import pyarrow.parquet as pq

    from tests.spark.standalone import spark_env

    os.environ.update({k: v for k, v in spark_env(CODE).items() if k.startswith("PYSPARK") or k == "PYTHONPATH"})
    from pyspark.sql import SparkSession

    from spark.read import _PARQUET_SCHEMA

    work = tempfile.mkdtemp(prefix="bench-spark-layouts-")
    files = sorted(Path(root).glob("dt=*/hour=*/audit-*.parquet"))
    sizes: dict[str, int] = {}
    for name, options in LAYOUTS.items():
        for f in files:
            table = pq.read_table(f)
            kw: dict[str, Any] = {"compression": "zstd", "row_group_size": 131072, "use_dictionary": True,
                                  "write_statistics": True, **options}
            if isinstance(kw["use_dictionary"], list):
                kw["use_dictionary"] = [c for c in table.column_names if c not in kw["use_dictionary"]]
            out = Path(work, name, f.relative_to(root))
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out, **kw)
        sizes[name] = sum(p.stat().st_size for p in Path(work, name).rglob("*.parquet"))
    events = tempfile.mkdtemp(prefix="bench-spark-events-")
    builder = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g").config("spark.eventLog.enabled", "true")
               .config("spark.eventLog.dir", events).config("spark.eventLog.compress", "false"))
    if master.startswith("spark://"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.executor.memory", "1536m")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sql = READ_AUDIT_CASES["full"][1]

    def query(name: str, tag: str) -> float:
        base = str(Path(work, name))
        paths = sorted(str(p) for p in Path(base).glob("dt=*/hour=*/*.parquet"))
        spark.read.schema(_PARQUET_SCHEMA).option("basePath", base).parquet(*paths).createOrReplaceTempView("t")
        spark.sparkContext.setJobDescription(tag)
        t0 = time.perf_counter()
        row = spark.sql(sql).collect()[0]
        wall = time.perf_counter() - t0
        assert row.n == counts.setdefault("n", row.n), (name, row)  # the same records in every layout
        return wall

    counts: dict[str, int] = {}
    print(f"master {master}; layouts of {len(files)} Parquet files, full-scan aggregate, {warmup} warm-up(s) "
          f"each, medians of {rounds} interleaved rounds; load average {load_average()}", flush=True)
    for i in range(warmup):
        for name in LAYOUTS:
            query(name, f"warm-up:{name}:{i}")
    walls: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for i in range(rounds):
        for name in (list(LAYOUTS) if i % 2 == 0 else list(LAYOUTS)[::-1]):
            walls[name].append(query(name, f"{name}:{i}"))
    spark.stop()
    cpu = task_cpu_by_job(events)
    for name in LAYOUTS:
        c = [cpu.get(f"{name}:{i}", 0.0) for i in range(rounds)]
        print(f"{name:14s} {sizes[name]:>12,} bytes  wall {statistics.median(walls[name]):6.3f}s  "
              f"task CPU {statistics.median(c):6.3f}s  each round's CPU {[round(x, 3) for x in c]}", flush=True)
    print(f"{counts['n']:,} records in every layout; load average {load_average()}", flush=True)
    shutil.rmtree(events, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def cold_query(root: str, master: str, which: str, case: str,
               archive: str = "", code_dir: Path | None = None) -> tuple[float, float, float, str, int, int]:
    """One query as the first of a new process (a new JVM: no JIT-compiled code, no file
    listing or footer cached): the seconds of the query alone, of making its DataFrame and of
    the session's start (the JVM's), the 1-minute load average after it, and the classes the
    JVM loaded for the making and for the query.  ``archive``: a cache
    directory whose class archive the JVM starts from (``which`` "both": records it);
    ``code_dir``: the checkout the process imports (CODE by default)."""
    import subprocess

    code_dir = code_dir or CODE
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    if archive:
        env.update({"XDG_CACHE_HOME": archive, "BENCH_ARCHIVE": "1"})
        env.pop("CMQ_AUDIT_CLASS_ARCHIVE", None)
    code = ["--code", str(code_dir)] if code_dir != ROOT else []  # a "before" run's processes import it too
    got = subprocess.run([sys.executable, __file__, "--keep", root, "--master", master, *code,
                          "--cold-query", f"{which}:{case}"], env=env, capture_output=True, text=True, check=True)
    if which == "both":
        return 0.0, 0.0, 0.0, load_average().split()[0], 0, 0
    q, d, start, cm, cq = got.stdout.strip().splitlines()[-1].split()
    return float(q), float(d), float(start), load_average().split()[0], int(cm), int(cq)


def one_cold_query(root: str, master: str, spec: str) -> None:
    from tests.spark.standalone import spark_env

    os.environ.update({k: v for k, v in spark_env(CODE).items() if k.startswith("PYSPARK") or k == "PYTHONPATH"})
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructField, StructType

    from spark import read_audit
    from spark.schema import JSON_COLUMNS

    which, case = spec.split(":")
    if os.environ.get("BENCH_ARCHIVE"):
        from spark.class_archive import session_builder

        builder = session_builder()
    else:
        builder = SparkSession.builder
    builder = (builder.master(master).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g"))
    if master.startswith("spark://"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.executor.memory", "1536m")
    t0 = time.perf_counter()
    spark = builder.getOrCreate()
    started = time.perf_counter() - t0
    spark.sparkContext.setLogLevel("ERROR")
    json_schema = StructType([StructField(n, t, True) for n, t in JSON_COLUMNS])
    hour, hour_end = os.environ["BENCH_HOUR"].split(",") if "BENCH_HOUR" in os.environ else ("", "")
    classes = spark._jvm.java.lang.management.ManagementFactory.getClassLoadingMXBean()
    for side in ("read_audit", "json") if which == "both" else (which,):
        c0 = classes.getTotalLoadedClassCount()
        t0 = time.perf_counter()
        df = read_audit(spark, root) if side == "read_audit" else json_reader(spark).schema(json_schema).json(root)
        made = time.perf_counter() - t0
        c1 = classes.getTotalLoadedClassCount()
        df.createOrReplaceTempView("t")
        t0 = time.perf_counter()
        spark.sql(READ_AUDIT_CASES[case][1].format(hour=hour, hour_end=hour_end)).collect()
        q = time.perf_counter() - t0
        # Classes the JVM loaded for the making and for the query: a cold query's fixed cost
        # that does not depend on the machine's load, unlike its seconds.
        print(q, made, started, c1 - c0, classes.getTotalLoadedClassCount() - c1)
    spark.stop()


def time_report(audit_dir: str, runs: int) -> None:
    """``--report-time``: ``cmq-audit report`` on ``audit_dir`` as a user runs it (a new
    process, Spark started), ``runs`` times: wall time, and CPU seconds of the whole process
    tree (the CLI, the JVM, Python workers), sampled every 0.2 s per process, since on a
    loaded shared machine the wall time measures the others' load as much as the report."""
    import subprocess

    for _ in range(runs):
        out = tempfile.mkdtemp(prefix="bench-report-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
        env["PYTHONPATH"] = str(CODE)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "spark.cli", "report", "--audit-dir", audit_dir, "--out", out],
                                env=env, stderr=subprocess.PIPE, text=True)
        peak: dict[int, float] = {}
        while proc.poll() is None:
            for pid, cpu in tree_cpu_by_pid(proc.pid).items():
                peak[pid] = max(cpu, peak.get(pid, 0.0))
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        lines = proc.stderr.read().splitlines() if proc.stderr else []
        records = json.loads(Path(out, "report.json").read_text())["records"]
        print(f"cmq-audit report on {records:,} records: wall {wall:6.1f}s, cpu {sum(peak.values()):6.1f}s "
              f"({len(peak)} processes), stderr {len(lines)} lines; load average {load_average()}", flush=True)
        shutil.rmtree(out, ignore_errors=True)


def tree_cpu_by_pid(root: int) -> dict[int, float]:
    """CPU seconds (user + system, own) of ``root`` and each live descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    return {pid: c for pid, c in cpu.items() if ours(pid)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="reuse/keep the generated log here")
    ap.add_argument("--code", default=None,
                    help="import the connector from this checkout instead (a 'before' measurement)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, of {', '.join(CASES)} (with --read-audit: {', '.join(READ_AUDIT_CASES)})")
    ap.add_argument("--cache", default=",".join(CACHE_STATES),
                    help=f"comma-separated states of the connector's cache, of {', '.join(CACHE_STATES)}")
    ap.add_argument("--cache-codec", default="zstd", help="the cacheCodec option: zstd, lz4 or none")
    ap.add_argument("--read-audit", action="store_true",
                    help="spark.read_audit over the compacted log against spark.read.json (full, narrow, "
                         "filtered; warm and cold) instead of the cases above; compacts the log first")
    ap.add_argument("--class-archive", action="store_true",
                    help="with --read-audit: the cold runs also with both sides' JVMs started from one class archive")
    ap.add_argument("--cold-before", metavar="CHECKOUT", default=None,
                    help="with --read-audit: cold runs of this checkout too, interleaved (a before/after in one run)")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--warmup", type=int, default=1,
                    help="with --read-audit: warm-up queries of each side before the warm rounds")
    ap.add_argument("--warm-only", action="store_true", help="with --read-audit: no cold runs")
    ap.add_argument("--layouts", action="store_true",
                    help="with --read-audit: the Parquet files rewritten under other layouts (LAYOUTS), "
                         "each scanned by spark.read.parquet, interleaved, instead of the comparison with JSON")
    ap.add_argument("--cold-query", default=None, help=argparse.SUPPRESS)  # WHICH:CASE, one run in this process
    ap.add_argument("--report-time", metavar="DIR", default=None,
                    help="time `cmq-audit report` on this audit directory (--rounds runs) and nothing else")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--master", default="local[2]")
    where.add_argument("--cluster", action="store_true", help="start a standalone cluster for the run")
    args = ap.parse_args()
    if args.code:
        global CODE
        CODE = Path(args.code).resolve()
        sys.path.insert(0, str(CODE))
    if args.cold_query:
        one_cold_query(args.keep, args.master, args.cold_query)
        return

    if args.report_time:
        time_report(args.report_time, args.rounds)
        return
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    known = tuple(READ_AUDIT_CASES) if args.read_audit else CASES
    if args.read_audit and args.cases == ",".join(CASES):
        cases = known
    if not cases or set(cases) - set(known):
        ap.error(f"--cases: choose from {', '.join(known)}")
    cache_states = tuple(c.strip() for c in args.cache.split(",") if c.strip())
    if not cache_states or set(cache_states) - set(CACHE_STATES):
        ap.error(f"--cache: choose from {', '.join(CACHE_STATES)}")

    root = args.keep or tempfile.mkdtemp(prefix="bench-spark-")
    if not os.path.isdir(root) or not os.listdir(root):
        from spark.demo import write_demo_log

        t0 = time.perf_counter()
        # spark.demo writes about 8.67 records per message lifecycle.
        n = write_demo_log(root, round(args.records / 8.67), rate=5.0, rotate_bytes=32 * 1024 * 1024)
        print(f"generated {n:,} records in {time.perf_counter() - t0:.1f}s", flush=True)
    if args.read_audit:
        from gateway.audit.compact import compact_dir

        t0 = time.perf_counter()
        done = compact_dir(root, wait=True)  # what the writer's compactor has not done yet
        print(f"compacted {done} in {time.perf_counter() - t0:.1f}s", flush=True)

    def go(master: str) -> None:
        if args.read_audit and args.layouts:
            run_layouts(root, master, args.rounds, args.warmup)
        elif args.read_audit:
            run_read_audit(root, master, args.rounds, cases, args.class_archive,
                           Path(args.cold_before).resolve() if args.cold_before else None, args.warmup,
                           not args.warm_only)
        else:
            run(root, master, cases, cache_states, args.cache_codec)

    try:
        if args.cluster:
            from tests.spark.standalone import standalone

            with tempfile.TemporaryDirectory(prefix="bench-spark-cluster-") as tmp, \
                    standalone(Path(tmp), memory="2g") as url:
                go(url)
        else:
            go(args.master)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
