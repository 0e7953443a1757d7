"""The hand-off to the audit writer process off the event loop's critical path (A5, issue 27):
a pump thread feeds the pipe as records accumulate, a full pipe makes a write wait (counted),
never drop or reorder, and records reach the writer process in the order they were emitted
whichever thread sent them."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from gateway.audit import AuditLog
from gateway.audit.pipe import PUMP_AT
from tests.support.audit_files import records


def _wait_for(pred, timeout: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_A5_the_pump_hands_records_over_with_no_handoff_and_no_writer_cycle(tmp_path: Path) -> None:
    """Records go into the writer process as they accumulate, so a hand-off before a client
    write finds little left: with the writer thread napping for an hour and no handoff(), all
    but the last few records emitted reach the file."""
    n = 5000
    with AuditLog(str(tmp_path), flush_interval=3600.0, process=True) as audit:
        for i in range(n):
            audit.emit("publish", "/", queue="q", msg_id=f"m{i}", size=1)
        assert _wait_for(lambda: audit.pending < PUMP_AT // 4)
        assert audit.handoff_stats.pumped >= n - PUMP_AT // 4
        assert audit.handoff_stats.handoffs == 0
        assert _wait_for(lambda: len(records(tmp_path, include_open=True)) >= audit.handoff_stats.pumped)
    assert [r["msg_id"] for r in records(tmp_path)] == [f"m{i}" for i in range(n)]


def test_A5_a_full_pipe_makes_the_handoff_wait_counted_and_loses_nothing(tmp_path: Path) -> None:
    """The writer process stopped (SIGSTOP) while records pour in: the pipe fills, a write
    waits for room (counted in handoff_stats.waits) rather than dropping or keeping records
    in this process, and once the process runs again every record is written, in order."""
    n = 300_000  # marshalled, several times the largest pipe the kernel gives (8 MiB)
    with AuditLog(str(tmp_path), flush_interval=3600.0, max_pending=n + 1, process=True) as audit:
        assert audit._child is not None
        pid = audit._child.pid
        os.kill(pid, signal.SIGSTOP)
        resumed = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))
        resumed.start()
        try:
            for i in range(n):
                audit.emit("publish", "/", queue="q", msg_id=f"m{i}", size=1)
            audit.handoff()
        finally:
            resumed.join()
            os.kill(pid, signal.SIGCONT)
        assert audit.pending == 0
        stats = audit.handoff_stats
        assert stats.waits >= 1 and stats.wait_seconds > 0
        assert stats.handoffs + (stats.pumped > 0) >= 1
    got = [r["msg_id"] for r in records(tmp_path)]
    assert len(got) == n and got == [f"m{i}" for i in range(n)]
    assert audit.dropped == 0


def test_A5_records_keep_their_order_with_the_pump_and_handoffs_racing(tmp_path: Path) -> None:
    """The pump thread and handoff() on the caller's thread both send; each takes records off
    the queue and writes them under one lock, so the file holds them in emit order."""
    n = 60_000
    with AuditLog(str(tmp_path), flush_interval=3600.0, max_pending=n + 1, process=True) as audit:
        for i in range(n):
            audit.emit("publish", "/", queue="q", msg_id=f"m{i}", size=1)
            if i % 1500 == 0:
                audit.handoff()
            elif i % 1000 == 0:
                time.sleep(0.001)  # as an event loop's poll would: the pump takes the GIL
        audit.handoff()
        assert audit.pending == 0
        assert audit.handoff_stats.pumped > 0 and audit.handoff_stats.handoffs > 0
    assert [r["msg_id"] for r in records(tmp_path)] == [f"m{i}" for i in range(n)]
