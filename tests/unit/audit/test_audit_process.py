"""The audit writer in a child process (AuditLog(process=True), the gateway's default): the
same files and records as the in-thread writer (A2, A3), and no record lost when the child dies."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.audit import AuditLog
from gateway.audit.layout import list_files


class StepClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        self.t += 0.000_25
        return self.t


class Odd(int):
    """An int subclass marshal refuses: sent as a plain int."""


def _emit_all(audit: AuditLog) -> None:
    for i in range(300):
        audit.emit("publish", "/", queue="q", msg_id=f"msg-{i}", size=16, user="guest", peer="p")
        audit.emit("deliver", "/", queue="q", msg_id=f"msg-{i}", attempt=1, size=16)
    audit.emit("retry", "/v", topic="t", tags=("a", 7), attempt=Odd(2), next_at=1_714_557_615.5,
               latency_ms=1.5, other={"k": [1, "x"]}, conn=None)


def _files(root: Path) -> list[tuple[str, bytes]]:
    return [(af.key, Path(af.path).read_bytes()) for af in list_files(str(root), include_open=True)]


def test_A2_A3_process_writer_writes_the_same_files_as_the_thread_writer(tmp_path: Path) -> None:
    outs = []
    for process in (True, False):
        root = tmp_path / str(process)
        with AuditLog(str(root), clock=StepClock(1_714_557_599.9), rotate_bytes=20_000,
                      process=process) as audit:
            _emit_all(audit)
        assert audit.written == 601 and audit.dropped == 0
        outs.append(_files(root))
    assert outs[0] == outs[1]
    assert len(outs[0]) > 2  # rotated by size and by the hour boundary
    assert all(not key.endswith(".open") for key, _ in outs[0])
    last = json.loads(outs[0][-1][1].splitlines()[-1])
    assert (last["event"], last["attempt"], last["tags"], last["other"]) == ("retry", 2, ["a", "7"], {"k": [1, "x"]})


def test_A3_child_death_loses_nothing_acknowledged_and_writing_goes_on(tmp_path: Path) -> None:
    audit = AuditLog(str(tmp_path), process=True)
    audit.emit("publish", "/", msg_id="before")
    assert audit.flush(timeout=30)
    assert audit._child is not None
    audit._child.kill()
    audit._child.wait()
    for i in range(3):
        audit.emit("publish", "/", msg_id=f"after-{i}")
    audit.close()
    records = [json.loads(line) for _, data in _files(tmp_path) for line in data.splitlines()]
    assert [r["msg_id"] for r in records] == ["before", "after-0", "after-1", "after-2"]
    assert all(not key.endswith(".open") for key, _ in _files(tmp_path))


def test_A1_flush_does_not_wait_for_the_writers_next_nap(tmp_path: Path) -> None:
    """flush() (every management call and /metrics scrape makes the counts exact with it) needs
    one whole writer cycle after the call, not the cycle after the writer's flush_interval nap:
    with an hour-long interval, each flush still completes and counts what came before it.
    (It used to need two cycles and so waited out the nap: 100 ms a request by default.)"""
    for process in (True, False):
        with AuditLog(str(tmp_path / str(process)), flush_interval=3600.0, process=process) as audit:
            for i in range(3):
                audit.emit("ack", "/", queue="q", msg_id=f"m{i}")
                assert audit.flush(timeout=60.0)  # hang protection only: False is the failure
                assert audit.counts == {("ack", "/", "q"): i + 1}


def test_A5_handoff_puts_the_records_in_the_writer_process_without_a_writer_cycle(tmp_path: Path) -> None:
    """A5 (issue 27): handoff(), which the transports call before a delivery's frames go out,
    hands what is queued to the writer process itself: the records reach the file while the
    writer thread naps (an hour here), so a kill -9 of this process would no longer take them.
    In-thread mode has no process to hand them to: handoff() leaves them queued."""
    import time

    for process in (True, False):
        root = tmp_path / str(process)
        with AuditLog(str(root), flush_interval=3600.0, process=process) as audit:
            for i in range(5):
                audit.emit("publish", "/", queue="q", msg_id=f"m{i}", size=1)
            audit.handoff()
            assert audit.pending == 0 if process else audit.pending == 5
            deadline = time.monotonic() + 30
            lines: list[bytes] = []
            while process and len(lines) < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
                lines = [line for _, data in _files(root) for line in data.splitlines()]
            assert [json.loads(line)["msg_id"] for line in lines] == ([f"m{i}" for i in range(5)] if process else [])
            audit.emit("publish", "/", queue="q", msg_id="m5", size=1)  # the thread's path still follows
        records = [json.loads(line) for _, data in _files(root) for line in data.splitlines()]
        assert [r["msg_id"] for r in records] == [f"m{i}" for i in range(6)]
