"""Closed audit segments compacted to Parquet, and read back with every record once (A7).

The log is written by the real ``AuditLog``; each record carries a unique ``msg_id``, so a
record lost or read twice shows as a missing or doubled id.  The compactor is the real one,
run as ``python -m gateway.audit.compact`` and killed (SIGKILL) at each step of its work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.audit import AuditLog, compact, layout
from spark import read_audit
from spark.plan import plan_batch
from spark.pushdown import Pushdown
from spark.schema import AUDIT_SCHEMA
from spark.source import read_partition

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_764_288_000.0  # 2025-11-28T00:00:00Z


def _write(directory: str, first: int, n: int, *, close: bool = True) -> AuditLog:
    """Records ``m<first>`` … over ~1.5 h (so two hour folders), segments of ~40 records."""
    now = [T0 + first * 2.0]
    audit = AuditLog(directory, rotate_bytes=4096, clock=lambda: now[0], process=False)
    for i in range(first, first + n):
        now[0] = T0 + i * 2.0
        audit.emit("publish", "/", queue="q", msg_id=f"m{i}", size=i, user="u", peer="127.0.0.1:1")
    if close:
        audit.close()
    else:
        assert audit.flush(30)
    return audit


def _ids(df) -> Counter[str]:  # type: ignore[no-untyped-def]
    return Counter(r.msg_id for r in df.select("msg_id").collect())


def _expected(n: int) -> Counter[str]:
    return Counter(f"m{i}" for i in range(n))


def _driver_read(root: str) -> Counter[str]:
    """The ``cmq-audit`` source's plan and reads, run here on the driver (no Spark job)."""
    got: Counter[str] = Counter()
    for part in plan_batch([root], Pushdown(), 64 << 20):
        for batch in read_partition(part, AUDIT_SCHEMA, "records", Pushdown(), "off"):
            got.update(batch.column(AUDIT_SCHEMA.names.index("msg_id")).to_pylist())
    return got


@pytest.fixture
def no_auto_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer starts no compactor: the tests choose which segments are compacted."""
    monkeypatch.setenv(compact.MODE_ENV, "off")


def test_A7_compacted_uncompacted_and_open_segments_each_record_once(spark, tmp_path: Path,
                                                                    no_auto_compaction: None) -> None:
    root = str(tmp_path / "audit")
    _write(root, 0, 600)
    closed = [af.path for af in layout.list_files(root)]
    assert len(closed) >= 10
    for path in closed[:4]:  # both forms on disk: the Parquet one is read
        compact.compact_segment(path, remove=False)
    for path in closed[4:8]:  # Parquet only
        compact.compact_segment(path, remove=True)
    audit = _write(root, 600, 30, close=False)  # the gateway still writing: an open segment
    try:
        assert any(af.is_open for af in layout.list_files(root, include_open=True))
        df = read_audit(spark, root)
        assert df.schema == AUDIT_SCHEMA
        assert _ids(df) == _expected(630)
        # Spark's own Parquet reader read the compacted part.
        assert "parquet" in df._jdf.queryExecution().executedPlan().toString().lower()
        by = {(r.open_file, r.file.endswith(".jsonl")) for r in df.select("open_file", "file").collect()}
        assert by == {(True, True), (False, True)}
        # file, dt, hour, gateway: as the cmq-audit source names them, whichever form was read.
        plain = spark.read.format("cmq-audit").option("cache", "off").load(root)
        cols = ["msg_id", "ts", "size", "dt", "hour", "file", "open_file", "gateway"]
        assert sorted(map(tuple, df.select(cols).collect())) == sorted(map(tuple, plain.select(cols).collect()))
        assert _ids(plain) == _expected(630)
        # Options apply to both parts; columns narrow the schema.
        narrow = read_audit(spark, root, columns="msg_id,ts", **{"from": "2025-11-28T00:10:00Z",
                                                                 "to": "2025-11-28T01:00:00Z"})
        assert narrow.columns == ["ts", "msg_id"]
        assert _ids(narrow) == Counter(f"m{i}" for i in range(300, 630) if T0 + i * 2 < T0 + 3600)
        # The DataFrame was made; now the rest is compacted (JSON lines removed) before its
        # next action: still each record once.
        for path in closed[8:]:
            compact.compact_segment(path, remove=True)
        assert _ids(df) == _expected(630)
        assert _ids(read_audit(spark, root)) == _expected(630)
    finally:
        audit.close()


def test_A7_read_audit_of_parquet_alone_registers_no_python_source(spark, tmp_path: Path, no_auto_compaction: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A log compacted whole is read without the Python source, not even registered: a
    session's first Python data source call starts a Python process (Spark's lookup of
    ``pyspark_*`` modules), the larger part of a cold read_audit's fixed cost on such a log.
    The real ``register`` runs, counted."""
    import spark.source as source

    calls: list[object] = []
    real = source.register
    monkeypatch.setattr(source, "register", lambda s: (calls.append(s), real(s))[1])
    root = str(tmp_path / "audit")
    _write(root, 0, 200)
    for af in layout.list_files(root):
        compact.compact_segment(af.path, remove=True)
    df = read_audit(spark, root)
    assert _ids(df) == _expected(200)
    assert not calls
    assert "parquet" in df._jdf.queryExecution().executedPlan().toString().lower()
    audit = _write(root, 200, 10, close=False)  # an open segment: only the Python source reads it
    try:
        assert _ids(read_audit(spark, root)) == _expected(210)
        assert calls == [spark]
    finally:
        audit.close()


def test_A7_read_audit_makes_its_parquet_part_in_one_projection(spark, tmp_path: Path,
                                                               no_auto_compaction: None) -> None:
    """Each DataFrame step is analysed by the JVM as it is made, a fixed cost of a cold
    read: the compacted part is one projection (with its filter) over the Parquet relation,
    not a projection per step, and still the same rows and layout columns as the source."""
    root = str(tmp_path / "audit")
    _write(root, 0, 200)
    for af in layout.list_files(root):
        compact.compact_segment(af.path, remove=True)
    df = read_audit(spark, root)
    logical = df._jdf.queryExecution().logical().toString()
    assert logical.count("Project") == 1, logical
    assert "Relation" in logical and "parquet" in logical
    assert df.schema == AUDIT_SCHEMA
    cols = ["msg_id", "ts", "dt", "hour", "file", "open_file", "gateway"]
    plain = spark.read.format("cmq-audit").option("cache", "off").load(root)
    assert sorted(map(tuple, df.select(cols).collect())) == sorted(map(tuple, plain.select(cols).collect()))
    late = read_audit(spark, root, columns="msg_id", **{"from": "2025-11-28T00:05:00Z"})
    logical = late._jdf.queryExecution().logical().toString()
    assert logical.count("Project") == 1 and logical.count("Filter") == 1, logical
    assert late.columns == ["msg_id"]
    assert _ids(late) == Counter(f"m{i}" for i in range(150, 200))


def test_A7_planned_as_json_lines_and_compacted_before_read(tmp_path: Path, no_auto_compaction: None) -> None:
    """A segment planned as JSON-lines ranges whose file is compacted and removed before the
    ranges are read: its records come from the Parquet file, each range's own, once."""
    root = str(tmp_path / "audit")
    _write(root, 0, 300)
    parts = plan_batch([root], Pushdown(), 1024)  # small ranges: several a segment
    assert len(parts) > len(list(layout.list_files(root)))
    compact.compact_dir(root, remove=True)
    assert not list(layout.list_files(root))
    got: Counter[str] = Counter()
    for part in parts:
        for batch in read_partition(part, AUDIT_SCHEMA, "records", Pushdown(), "off"):
            got.update(batch.column(AUDIT_SCHEMA.names.index("msg_id")).to_pylist())
    assert got == _expected(300)


def _run_compactor(root: str, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(compact.KILL_ENV, None)
    if kill_at:
        env[compact.KILL_ENV] = kill_at
    return subprocess.run([sys.executable, "-m", "gateway.audit.compact", root, *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _kill_points() -> Iterator[tuple[str, int]]:
    for step in compact.STEPS:
        for n in (1, 4):  # the first segment, and one after three were done
            yield step, n


def test_A7_compactor_killed_at_every_step_loses_and_duplicates_nothing(spark, tmp_path: Path,
                                                                        no_auto_compaction: None) -> None:
    pristine = str(tmp_path / "pristine")
    _write(pristine, 0, 400)
    n_segments = len(list(layout.list_files(pristine)))
    assert n_segments >= 6
    killed = 0
    for step, n in _kill_points():
        root = str(tmp_path / f"trial-{step}-{n}")
        shutil.copytree(pristine, root)
        got = _run_compactor(root, "--remove", kill_at=f"{step}:{n}")
        assert got.returncode == -9, (step, n, got.returncode, got.stderr)
        killed += 1
        # Whatever the kill left (a temporary file, both forms, Parquet only): read once each.
        assert _driver_read(root) == _expected(400), (step, n)
        assert _ids(read_audit(spark, root)) == _expected(400), (step, n)
        # The next compactor finishes the work: every segment Parquet only, no temporary file.
        assert _run_compactor(root, "--remove").returncode == 0
        assert not list(layout.list_files(root)), (step, n)
        assert len(compact.list_parquet(root)) == n_segments
        assert not [p for p in Path(root).rglob("*") if p.name.endswith(".tmp")]
        assert _ids(read_audit(spark, root)) == _expected(400), (step, n)
    assert killed == 2 * len(compact.STEPS)


def test_A7_cmq_audit_compact_by_hand_and_skipped_lines_kept(spark, tmp_path: Path, no_auto_compaction: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An older gateway's log compacted by hand; a torn last line and a line that is not
    JSON are skipped as the JSON reader skips them, and still reported as skipped."""
    from spark.cli import main
    from spark.read import skipped_lines

    root = str(tmp_path / "audit")
    _write(root, 0, 200)
    last = list(layout.list_files(root))[-1]
    with open(last.path, "ab") as f:
        f.write(b"not json\n" + b'{"v":1,"ts":"2025-')
    before = sorted(map(tuple, spark.read.format("cmq-audit").option("output", "skipped").option("cache", "off")
                        .load(root).select("file", "offset", "length", "text").collect()))
    assert len(before) == 2
    assert main(["compact", root]) == 0
    assert "compacted" in capsys.readouterr().out
    assert len(compact.list_parquet(root)) == len(list(layout.list_files(root)))  # kept: the default
    assert _ids(read_audit(spark, root)) == _expected(200)
    after = sorted(map(tuple, read_audit(spark, root, output="skipped").select("file", "offset", "length", "text")
                       .collect()))
    assert after == before
    assert skipped_lines(spark, root) == 2
    assert main(["compact", str(tmp_path / "nothing")]) == 2


def _without_pyspark_python() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.timeout(1500)  # a hang guard: a new JVM on a loaded machine
def test_A7_readme_snippet_runs_in_a_venv_without_pyspark_python(tmp_path: Path, no_auto_compaction: None) -> None:
    """Issue 27 item 5: with PYSPARK_PYTHON unset, the Python workers of the cmq-audit source
    (the open segment is read through it) run this interpreter, not ``python3`` from PATH."""
    root = str(tmp_path / "audit")
    audit = _write(root, 0, 100, close=False)
    try:
        snippet = ("from pyspark.sql import SparkSession\n"
                   "from spark import read_audit\n"
                   "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
                   f"print('records', read_audit(spark, {root!r}).count())\n"
                   "spark.stop()\n")
        got = subprocess.run([sys.executable, "-c", snippet], env=_without_pyspark_python(), cwd=tmp_path,
                             capture_output=True, text=True, timeout=1400)
    finally:
        audit.close()
    assert got.returncode == 0, got.stderr[-3000:]
    assert "records 100" in got.stdout


@pytest.mark.timeout(1500)  # a hang guard: a new JVM on a loaded machine
def test_A7_cmq_audit_report_is_quiet_without_verbose(tmp_path: Path) -> None:
    """Issue 27 item 4: the report's stderr is its own progress lines; Spark's go to
    OUT/spark.log.  PYSPARK_PYTHON unset (the report defaults it to this interpreter)."""
    root, out = str(tmp_path / "audit"), tmp_path / "report"
    _write(root, 0, 175)
    assert _run_compactor(root).returncode == 0  # as the writer's own compactor leaves it
    env = {**_without_pyspark_python(), "XDG_CACHE_HOME": str(tmp_path / "cache")}  # a first report
    got = subprocess.run([sys.executable, "-m", "spark.cli", "report", "--audit-dir", root, "--out", str(out)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1400)
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stderr.splitlines()
    # Besides its progress, a first report says once why its end takes longer (spark.class_archive).
    said = ("[", "report written to ", "cmq-audit: keeping Spark's classes")
    assert lines and all(line.startswith(said) for line in lines), lines
    assert (out / "index.html").exists() and (out / "spark.log").exists()
    assert '"records": 175' in (out / "report.json").read_text()
