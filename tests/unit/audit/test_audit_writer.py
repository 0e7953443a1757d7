"""The audit writer against the real filesystem (A1, A2, A3)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from gateway.audit import AuditLog, NullAudit
from gateway.audit.layout import list_files

T0 = 1_714_557_599.5  # 2024-05-01T09:59:59.5Z: half a second before an hour boundary


def _lines(root: Path) -> list[dict]:
    out = []
    for af in list_files(str(root), include_open=True):
        with open(af.path, "rb") as f:
            out.extend(json.loads(line) for line in f.read().splitlines())
    return out


class StepClock:
    """A clock that moves only when told to (the writer's time, not wall time)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_A2_record_has_version_ts_and_typed_fields(tmp_path: Path) -> None:
    clock = StepClock(1_714_557_600.123456)
    with AuditLog(str(tmp_path), clock=clock) as audit:
        audit.emit("retry", "/", topic="orders", subscription="s1", msg_id="msg-1", tags=["a", 7],
                   attempt=2, policy="BACKOFF_RETRY", next_at=1_714_557_615.0, conn=12, size=None)
    assert _lines(tmp_path) == [{
        "v": 2, "ts": "2024-05-01T10:00:00.123456Z", "event": "retry", "vhost": "/",
        "topic": "orders", "subscription": "s1", "msg_id": "msg-1", "tags": ["a", "7"],
        "attempt": 2, "policy": "BACKOFF_RETRY", "next_at": "2024-05-01T10:00:15.000000Z",
        "conn": "12",
    }]


def test_A1_events_filter_keeps_only_named_events(tmp_path: Path) -> None:
    with AuditLog(str(tmp_path), events={"publish"}) as audit:
        audit.emit("publish", "/", msg_id="m1")
        audit.emit("deliver", "/", msg_id="m1")
        audit.emit("publish", "/", msg_id="m2")
    assert [(r["event"], r["msg_id"]) for r in _lines(tmp_path)] == [("publish", "m1"), ("publish", "m2")]


def test_A3_rotates_by_size_and_every_file_is_closed(tmp_path: Path) -> None:
    with AuditLog(str(tmp_path), rotate_bytes=1000) as audit:
        for i in range(200):
            audit.emit("publish", "/", topic="t", msg_id=f"msg-{i:04d}")
    files = list(list_files(str(tmp_path), include_open=True))
    line_len = len(Path(files[0].path).read_bytes().split(b"\n")[0]) + 1
    per_file = 1000 // line_len
    assert len(files) == -(-200 // per_file)
    assert not any(f.is_open for f in files)
    assert all(f.size <= 1000 for f in files)
    # In key order the records come back in emit order: keys sort in write order.
    assert [r["msg_id"] for r in _lines(tmp_path)] == [f"msg-{i:04d}" for i in range(200)]


def test_A3_hour_boundary_starts_a_new_folder(tmp_path: Path) -> None:
    clock = StepClock(T0)
    with AuditLog(str(tmp_path), clock=clock) as audit:
        audit.emit("publish", "/", msg_id="before")
        clock.t = T0 + 1.0
        audit.emit("publish", "/", msg_id="after")
    files = list(list_files(str(tmp_path)))
    assert [(f.dt, f.hour) for f in files] == [("2024-05-01", 9), ("2024-05-01", 10)]
    assert [r["msg_id"] for r in _lines(tmp_path)] == ["before", "after"]


def test_A3_rotates_by_time_and_closed_file_is_never_rewritten(tmp_path: Path) -> None:
    clock = StepClock(T0 + 10)
    audit = AuditLog(str(tmp_path), rotate_seconds=60, clock=clock, flush_interval=0.01)
    try:
        audit.emit("publish", "/", msg_id="m1")
        assert audit.flush(timeout=30)
        clock.t += 61
        assert audit.flush(timeout=30)  # the writer closes the idle file on its own
        closed = [f for f in list_files(str(tmp_path), include_open=True)]
        assert [(f.is_open, f.size) for f in closed] == [(False, closed[0].size)]
        digest = hashlib.sha256(Path(closed[0].path).read_bytes()).hexdigest()
        mtime = os.stat(closed[0].path).st_mtime_ns
        audit.emit("publish", "/", msg_id="m2")
        assert audit.flush(timeout=30)
    finally:
        audit.close()
    assert hashlib.sha256(Path(closed[0].path).read_bytes()).hexdigest() == digest
    assert os.stat(closed[0].path).st_mtime_ns == mtime
    assert len(list(list_files(str(tmp_path)))) == 2


def test_A1_overload_is_counted_and_recorded_never_silent(tmp_path: Path) -> None:
    """A1: when the writer is stuck, emit() sheds records, counts them and says so in the log."""
    release = threading.Event()
    blocked = threading.Event()
    writer_thread: list[threading.Thread] = []

    class HoldingClock:
        # Blocks the writer thread (and only it) the first time it opens a file.
        def __call__(self) -> float:
            if writer_thread and threading.current_thread() is writer_thread[0] and not release.is_set():
                blocked.set()
                release.wait(60)
            return 1_714_557_600.0

    audit = AuditLog(str(tmp_path), max_pending=10, clock=HoldingClock())
    writer_thread.append(audit._thread)
    audit.emit("publish", "/", msg_id="first")
    audit.flush(timeout=0)  # wake the writer now
    assert blocked.wait(60)
    for i in range(50):
        audit.emit("publish", "/", msg_id=f"m{i}")
    assert audit.dropped == 40
    release.set()
    audit.close()
    records = _lines(tmp_path)
    assert [r["msg_id"] for r in records if r["event"] == "publish"] == ["first"] + [f"m{i}" for i in range(10)]
    assert [(r["event"], r["dropped"]) for r in records if r["event"] == "audit_dropped"] == [("audit_dropped", 40)]
    assert audit.written == 12


_CRASHER = """
import os, sys
from gateway.audit import AuditLog
audit = AuditLog(sys.argv[1])
for i in range(5):
    audit.emit("publish", "/", msg_id=f"m{i}")
audit.flush(timeout=30)
os._exit(0)  # no close(): the file stays .open, as after kill -9
"""


def test_A3_crash_leaves_one_torn_line_and_restart_closes_the_file(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", _CRASHER, str(tmp_path)], check=True, cwd=os.getcwd())
    (left,) = list(list_files(str(tmp_path), include_open=True))
    assert left.is_open
    with open(left.path, "ab") as f:  # the crash interrupted a write half way
        f.write(b'{"v":1,"ts":"2024-05-')
    before = Path(left.path).read_bytes()
    AuditLog(str(tmp_path)).close()
    (closed,) = list(list_files(str(tmp_path), include_open=True))
    assert closed.key == left.key and not closed.is_open
    assert Path(closed.path).read_bytes() == before
    assert before.count(b"\n") == 5 and not before.endswith(b"\n")


def test_A3_retention_deletes_old_closed_files_and_empty_folders(tmp_path: Path) -> None:
    clock = StepClock(T0)
    with AuditLog(str(tmp_path), clock=clock) as audit:
        audit.emit("publish", "/", msg_id="old")
        clock.t = T0 + 3600
        audit.emit("publish", "/", msg_id="new")
    old, new = list(list_files(str(tmp_path)))
    os.utime(old.path, (os.stat(old.path).st_atime, os.stat(old.path).st_mtime - 3 * 3600))
    audit = AuditLog(str(tmp_path), retention_hours=2, retention_check_seconds=0)
    assert audit.flush(timeout=30)
    audit.close()
    assert [f.key for f in list_files(str(tmp_path))] == [new.key]
    assert audit.files_deleted == 1
    assert not (tmp_path / "dt=2024-05-01" / "hour=09").exists()


def test_null_audit_keeps_nothing(tmp_path: Path) -> None:
    audit = NullAudit()
    assert audit.emit("publish", "/", msg_id="m") is None
    assert (audit.dropped, audit.written) == (0, 0)
