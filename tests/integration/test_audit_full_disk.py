"""A5 on a full disk: the audit writer waits for room instead of dropping records (a confirm
or a delivery may rest on them), and only a graceful stop gives up what it cannot write,
counted. Both writers: the gateway's writer process and the in-thread one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from tests.small_disk import fill, free, small_disk
from tests.support.audit_files import records
from tests.support.audit_stall import stall

HANG = 60.0  # seconds: a bound on a hang, never a measurement


def _emit(audit: AuditLog, first: int, n: int) -> None:
    for i in range(first, first + n):
        audit.emit("publish", "/", queue="q", msg_id=f"m{i}", size=16, user="guest", peer="p")


@pytest.mark.parametrize("process", [True, False], ids=["writer-process", "writer-thread"])
def test_A5_a_full_disk_delays_the_records_and_drops_none(tmp_path: Path, process: bool) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        audit = AuditLog(str(disk / "audit"), process=process)
        try:
            _emit(audit, 0, 10)
            assert audit.flush(timeout=HANG)
            fill(disk)
            _emit(audit, 10, 5_000)  # ~0.7 MB of lines: none fits
            mark = audit.sync_mark()
            assert not audit.wait_synced(mark, timeout=1.0)  # cannot be on disk: no room
            assert audit.dropped == 0
            free(disk)
            assert audit.wait_synced(mark, timeout=HANG)
        finally:
            audit.close()
        assert audit.dropped == 0
        got = [r["msg_id"] for r in records(disk / "audit")]
        assert got == [f"m{i}" for i in range(5_010)]


@pytest.mark.parametrize("process", [True, False], ids=["writer-process", "writer-thread"])
def test_A5_a_stop_on_a_full_disk_gives_up_and_counts_what_it_could_not_write(tmp_path: Path,
                                                                              process: bool) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        audit = AuditLog(str(disk / "audit"), process=process)
        _emit(audit, 0, 10)
        assert audit.flush(timeout=HANG)
        fill(disk)
        _emit(audit, 10, 5_000)
        assert not audit.flush(timeout=1.0) or audit.written == 10
        closing = threading.Thread(target=audit.close)
        closing.start()
        closing.join(HANG)
        assert not closing.is_alive()
        written = records(disk / "audit")
        got = [r["msg_id"] for r in written if r["event"] == "publish"]
        # Whatever whole lines found room are there, in order, once; the rest is counted
        # (with the audit_dropped records that report the loss, if they cannot be written either).
        assert got == [f"m{i}" for i in range(len(got))]
        assert len(got) < 5_010
        assert audit.written == len(written)
        assert audit.dropped >= 5_010 - len(got) > 0


def test_A5_sigterm_stops_a_gateway_whose_deliveries_wait_for_a_full_disk(tmp_path: Path) -> None:
    """`cmq-gateway serve` with its audit dir on a full disk of its own (no disk alarm): the
    writer process waits for room, its pipe fills, and a delivery's hand-off (A5) waits for
    it on the event loop. A SIGTERM then still stops the gateway: the hand-off gives up, the
    delivery is not written, and the writer process counts what it could not write."""
    import json
    import signal

    import pika

    from tests.integration.test_process import serve

    config = tmp_path / "gateway.yaml"
    config.write_text(json.dumps({"limits": {"disk_free_limit": 0}}))
    with small_disk(tmp_path / "disk", "2m") as disk, \
            serve(tmp_path / "data", "--audit-dir", str(disk / "audit"), "--config", str(config),
                  "--management-port", "off", "--metrics-port", "off", "--cmq-api-port", "off",
                  "--mqtt-port", "off") as (proc, port):
        params = pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=HANG)
        fill(disk)
        done = threading.Event()
        stall(params, done, HANG)  # the loop now waits in a hand-off
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=HANG)
        finally:
            done.set()
            free(disk)  # a gateway that did not stop finishes once there is room
        assert code == 0
        proc.drain.join(HANG)  # type: ignore[attr-defined]
        said = "".join(proc.lines)  # type: ignore[attr-defined]
        assert "cmq-gateway: stopped" in said, said[-2000:]
        assert "records lost" in said, said[-2000:]  # counted, never silent
