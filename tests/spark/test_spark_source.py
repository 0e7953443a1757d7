"""The cmq-audit source reads what the real AuditLog writes (A3, A4)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan, StringStartsWith

from gateway.audit import AuditLog
from gateway.audit.layout import list_files
from gateway.audit.record import SCHEMA_VERSION
from spark.schema import AUDIT_SCHEMA
from spark.source import AuditPushdownReader, AuditReader

pytestmark = pytest.mark.spark

H10 = 1_714_557_600.0  # 2024-05-01T10:00:00Z
UTC = dt.UTC


def write(root: Path, start: float, count: int, step: float, **kw: object) -> None:
    """``count`` publishes, ``step`` seconds apart, topics alternating a/b, through AuditLog."""
    now = [start]
    with AuditLog(str(root), clock=lambda: now[0], **kw) as audit:  # type: ignore[arg-type]
        for i in range(count):
            audit.emit("publish", "/" if i % 3 else "prod", topic="a" if i % 2 else "b",
                       msg_id=f"msg-{int(start)}-{i:05d}", size=i, tags=["t1", "t2"], user="u")
            now[0] += step


def reader_rows(reader: AuditReader) -> int:
    return sum(b.num_rows for p in reader.partitions() for b in reader.read(p))


def test_A4_typed_schema_round_trip(spark, tmp_path: Path) -> None:
    now = [H10 + 0.25]
    with AuditLog(str(tmp_path), clock=lambda: now[0]) as audit:
        audit.emit("retry", "/", topic="orders", subscription="billing", msg_id="msg-1", tags=["x"],
                   attempt=3, policy="BACKOFF_RETRY", next_at=H10 + 12, latency_ms=1.5, size=10, conn=7)
    df = spark.read.format("cmq-audit").load(str(tmp_path))
    assert df.schema == AUDIT_SCHEMA
    (row,) = df.collect()
    assert row.ts == dt.datetime(2024, 5, 1, 10, 0, 0, 250000)  # session time zone is UTC
    assert (row.v, row.event, row.topic, row.subscription, row.tags, row.attempt, row.size) == (
        SCHEMA_VERSION, "retry", "orders", "billing", ["x"], 3, 10)
    assert (row.latency_ms, row.next_at, row.conn, row.policy) == (
        1.5, dt.datetime(2024, 5, 1, 10, 0, 12), "7", "BACKOFF_RETRY")
    assert (row.dt, row.hour, row.file.startswith("dt=2024-05-01/hour=10/audit-")) == ("2024-05-01", 10, True)


def test_A3_torn_last_line_and_bad_line_are_skipped_and_counted(spark, tmp_path: Path) -> None:
    write(tmp_path, H10, 20, 1.0)
    (af,) = list(list_files(str(tmp_path)))
    lines = Path(af.path).read_bytes().splitlines(keepends=True)
    # A garbled line in the middle and a torn last line, as a crash mid-write leaves it.
    Path(af.path).write_bytes(b"".join(lines[:10]) + b'{"v":1,"ts":"2024\n' + b"".join(lines[10:]) + b'{"v":1,"e')
    df = spark.read.format("cmq-audit").load(str(tmp_path))
    assert df.count() == 20
    skipped = spark.read.format("cmq-audit").option("output", "skipped").load(str(tmp_path))
    rows = sorted(skipped.collect(), key=lambda r: r.offset)
    assert [(r.file, r.length, r.text) for r in rows] == [
        (af.key, 18, '{"v":1,"ts":"2024\n'), (af.key, 9, '{"v":1,"e')]
    assert rows[0].offset == sum(len(x) for x in lines[:10])


def test_A4_empty_directory_and_empty_folders_read_as_nothing(spark, tmp_path: Path) -> None:
    (tmp_path / "dt=2024-05-01" / "hour=10").mkdir(parents=True)
    (tmp_path / "dt=2024-05-02").mkdir()
    (tmp_path / "not-a-folder.txt").write_text("x")
    assert spark.read.format("cmq-audit").load(str(tmp_path)).count() == 0


def test_A4_pruning_and_pushdown_reduce_partitions_and_rows(spark, tmp_path: Path) -> None:
    # Three hours, 60 records each, a file per 25 records: 9 files.
    write(tmp_path, H10, 180, 60.0, rotate_bytes=20 * 200)
    files = list(list_files(str(tmp_path)))
    per_hour = {h: sum(1 for f in files if f.hour == h) for h in (10, 11, 12)}
    root = str(tmp_path)

    full = AuditReader({"path": root}, AUDIT_SCHEMA)
    assert len(full.partitions()) == len(files) and reader_rows(full) == 180

    lo, hi = dt.datetime(2024, 5, 1, 11, 0, tzinfo=UTC), dt.datetime(2024, 5, 1, 11, 30, tzinfo=UTC)
    filters = [GreaterThanOrEqual(("ts",), lo), LessThan(("ts",), hi), EqualTo(("topic",), "a"),
               In(("vhost",), ["/"]), StringStartsWith(("msg_id",), "msg")]
    reader = AuditPushdownReader({"path": root}, AUDIT_SCHEMA)
    unhandled = list(reader.pushFilters(filters))
    assert unhandled == [filters[4]] and unhandled[0] is filters[4]
    assert len(reader.partitions()) == per_hour[11]  # only hour=11 is listed
    # 11:00–11:29 holds records 60..89; topic a = odd i; vhost "/" = i % 3 != 0.
    expected = sum(1 for i in range(60, 90) if i % 2 and i % 3)
    assert reader_rows(reader) == expected

    # Through Spark, by options (the default reader) and by WHERE (pushFilters=true): fewer
    # input partitions, and the same rows as filtering everything.
    by_option = (spark.read.format("cmq-audit").option("from", "2024-05-01T11:00:00Z")
                 .option("to", "2024-05-01T11:30:00Z").option("topic", "a").option("vhost", "/").load(root))
    assert by_option.rdd.getNumPartitions() == per_hour[11] and by_option.count() == expected
    where = ("ts >= timestamp'2024-05-01 11:00:00Z' and ts < timestamp'2024-05-01 11:30:00Z' "
             "and topic = 'a' and vhost in ('/') and msg_id like 'msg%'")
    pushed = spark.read.format("cmq-audit").option("pushFilters", "true").load(root).where(where)
    assert pushed.rdd.getNumPartitions() == per_hour[11] and pushed.count() == expected
    df = spark.read.format("cmq-audit").load(root)
    assert df.rdd.getNumPartitions() == len(files) and df.where(where).count() == expected


def test_A4_default_reader_can_be_reused_after_a_filtered_query(spark, tmp_path: Path) -> None:
    """A4: the default reader keeps no pushed state, so one DataFrame serves many analyses
    (Spark 4.3 would otherwise replay a filtered read plan for the unfiltered query)."""
    write(tmp_path, H10, 40, 1.0)
    df = spark.read.format("cmq-audit").load(str(tmp_path))
    assert df.where("topic = 'a' and ts < timestamp'2024-05-01 10:00:10Z'").count() == 5
    assert df.count() == 40
    assert df.where("event = 'nothing'").count() == 0
    assert df.count() == 40


def test_A4_large_file_is_read_as_byte_ranges_without_loss_or_duplicates(spark, tmp_path: Path) -> None:
    write(tmp_path, H10, 3000, 0.001)
    (af,) = list(list_files(str(tmp_path)))
    df = spark.read.format("cmq-audit").option("maxPartitionBytes", "65536").load(str(tmp_path))
    assert df.rdd.getNumPartitions() == -(-af.size // 65536)
    agg = df.selectExpr("count(*) as n", "count(distinct msg_id) as d").collect()[0]
    assert (agg.n, agg.d) == (3000, 3000)


def test_A4_file_deleted_before_read_yields_nothing(spark, tmp_path: Path) -> None:
    write(tmp_path, H10, 10, 1.0, rotate_bytes=5 * 200)
    reader = AuditReader({"path": str(tmp_path)}, AUDIT_SCHEMA)
    parts = reader.partitions()
    os.unlink(list(list_files(str(tmp_path)))[0].path)  # retention, between planning and reading
    left = [Path(f.path).read_bytes().count(b"\n") for f in list_files(str(tmp_path))]
    assert sum(left) < 10
    assert [sum(b.num_rows for b in reader.read(p)) for p in parts] == [0, *left]


def test_A4_batch_reads_the_open_file_of_a_running_gateway_whole_lines_once(spark, tmp_path: Path) -> None:
    """A4: operators read the log while the gateway writes it: the batch reader takes the open
    file up to its last complete line, marks those rows open_file, and after rotation reads
    the same records once more, no more, from the closed file."""
    now = [H10 + 1]
    audit = AuditLog(str(tmp_path), clock=lambda: now[0])
    try:
        for i in range(150):
            audit.emit("publish", "/", topic="t", msg_id=f"msg-{i:04d}", size=i)
        assert audit.flush(timeout=30)
        (af,) = list(list_files(str(tmp_path), include_open=True))
        assert af.is_open
        live = spark.read.format("cmq-audit").load(str(tmp_path))
        rows = live.select("msg_id", "open_file").collect()
        assert sorted(r.msg_id for r in rows) == [f"msg-{i:04d}" for i in range(150)]
        assert {r.open_file for r in rows} == {True}
    finally:
        audit.close()
    closed = spark.read.format("cmq-audit").load(str(tmp_path)).select("msg_id", "open_file").collect()
    assert len(closed) == 150 and {r.open_file for r in closed} == {False}


def test_A4_batch_never_reads_half_a_line_of_an_open_file(spark, tmp_path: Path) -> None:
    """A4: the line the writer is in the middle of is left for the next read, not skipped as
    torn and not returned half."""
    write(tmp_path, H10, 3, 1.0)
    (af,) = list(list_files(str(tmp_path)))
    folder = Path(af.path).parent
    whole = Path(af.path).read_bytes()
    Path(af.path).unlink()
    (folder / f".{Path(af.path).name}.open").write_bytes(whole + b'{"v":1,"ts":"2024-05-01T10:00:09Z","ev')
    assert spark.read.format("cmq-audit").load(str(tmp_path)).count() == 3
    assert spark.read.format("cmq-audit").option("output", "skipped").load(str(tmp_path)).count() == 0
