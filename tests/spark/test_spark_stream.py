"""readStream.format("cmq-audit") tails the live log exactly once (A3, A4)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from gateway.audit.layout import list_files
from spark.schema import AUDIT_SCHEMA
from spark.stream import AuditStreamReader

pytestmark = pytest.mark.spark

H10 = 1_714_557_600.0  # 2024-05-01T10:00:00Z


class Live:
    """A live AuditLog on a step clock: records 60 s apart, so hours turn over too."""

    def __init__(self, root: Path) -> None:
        self.now = H10 + 3000
        self.n = 0
        self.log = AuditLog(str(root), rotate_bytes=1500, clock=lambda: self.now)

    def emit(self, count: int) -> None:
        for _ in range(count):
            self.log.emit("publish", "/", topic="t", msg_id=f"msg-{self.n:05d}")
            self.n += 1
            self.now += 60
        assert self.log.flush(timeout=60)


def run_once(spark, root: Path, out: Path, ck: Path) -> tuple[int, int]:
    q = (
        spark.readStream.format("cmq-audit").load(str(root)).select("msg_id", "file")
        .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination()
    assert q.exception() is None
    got = spark.read.parquet(str(out)).selectExpr("count(*) n", "count(distinct msg_id) d").collect()[0]
    return got.n, got.d


def test_A4_stream_available_now_reads_each_record_once_across_restarts(spark, tmp_path: Path) -> None:
    root, out, ck = tmp_path / "audit", tmp_path / "out", tmp_path / "ck"
    live = Live(root)
    try:
        live.emit(30)  # the newest file is still open: read up to its last whole line
        assert any(f.is_open for f in list_files(str(root), include_open=True))
        assert run_once(spark, root, out, ck) == (30, 30)

        live.emit(30)  # the open file grows, is renamed at rotation, an hour turns over
        assert run_once(spark, root, out, ck) == (60, 60)
        assert run_once(spark, root, out, ck) == (60, 60)  # nothing new: nothing read

        seen = {f.key for f in list_files(str(root), include_open=True)}
        live.emit(30)
        # Retention deletes a closed file the stream has not read yet: its records are gone,
        # the query neither fails nor reads anything twice.
        unread = [f for f in list_files(str(root)) if f.key not in seen][0]
        lost = Path(unread.path).read_bytes().count(b"\n")
        os.unlink(unread.path)
        assert run_once(spark, root, out, ck) == (90 - lost, 90 - lost)
    finally:
        live.log.close()


def test_A3_stream_ranges_survive_rotation_and_retention_between_plan_and_read(tmp_path: Path) -> None:
    live = Live(tmp_path)
    try:
        live.emit(12)
        reader = AuditStreamReader({"path": str(tmp_path)}, AUDIT_SCHEMA)
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)  # type: ignore[arg-type]
        parts = reader.partitions(start, end)
        files = list(list_files(str(tmp_path), include_open=True))
        assert files[-1].is_open and end == {"file": files[-1].key, "offset": files[-1].size}
        deleted = Path(files[0].path).read_bytes().count(b"\n")
        os.unlink(files[0].path)  # retention, after planning
        live.emit(30)  # the open file is renamed closed, and later files appear
        rows = [sum(b.num_rows for b in reader.read(p)) for p in parts]
        assert rows[0] == 0 and sum(rows) == 12 - deleted and deleted > 0
        # The next batch starts where this one ended and holds exactly the 30 new records.
        end2 = reader.latestOffset(end, None)  # type: ignore[arg-type]
        assert sum(b.num_rows for p in reader.partitions(end, end2) for b in reader.read(p)) == 30
    finally:
        live.log.close()
