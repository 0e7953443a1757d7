"""A7: one writer per audit directory. Real `serve` processes over real sockets.

The issue-27 reproduction: the first gateway's audit dir is inside its own data dir (the
default), and a second gateway with another data dir is given that audit dir. It used to
start, "close" the first one's live file as left open by a crash, and the first one's
writer then crashed at its stop (FileNotFoundError on the rename, EOFError)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pika
import pytest

from gateway.audit import dirlock
from gateway.audit.dirlock import AuditDirLock
from tests.integration.differential import blocking
from tests.integration.test_process import serve
from tests.integration.test_startup import _audit_files, _wait_for, one_line, run_serve
from tests.support.audit_files import records

ROOT = Path(__file__).resolve().parents[2]


def test_A7_second_gateway_on_the_audit_dir_is_refused_and_the_first_stops_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    audit = data / "audit"  # inside the first one's data dir: its data dir lock does not cover a second
    with serve(data) as (proc, port):
        url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        with blocking(url) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("lock-q", durable=True)
            for i in range(20):
                ch.basic_publish("", "lock-q", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        _wait_for(lambda: any(name.endswith(".open") for name in _audit_files(audit)), "an open audit file")
        # Every record of that connection written (its close comes after its confirms: A5).
        _wait_for(lambda: any(r["event"] == "connection_close" for r in records(audit, include_open=True)), "the close record")
        before = _audit_files(audit)

        done = run_serve("--data-dir", str(tmp_path / "other-data"), "--audit-dir", str(audit))
        assert (done.returncode, one_line(done)) == (
            2, f"cmq-gateway: audit dir {audit} is in use by another cmq-gateway "
               f"(pid {proc.pid} on host {socket.gethostname()}): stop that one, "
               f"or choose another directory with --audit-dir")
        assert _audit_files(audit) == before  # nothing renamed, nothing written

        # The first one's writer is unaffected: it keeps writing, then stops cleanly.
        with blocking(url) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(20, 40):
                ch.basic_publish("", "lock-q", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    names = list(_audit_files(audit))
    assert names and not [n for n in names if n.endswith(".open")]  # its own writer closed its file
    publishes = [r for r in records(audit, include_open=True) if r["event"] == "publish" and r.get("queue", "lock-q") == "lock-q"]
    assert len(publishes) == 40
    # The lock is released at the stop: the directory can be taken by the next gateway.
    with serve(tmp_path / "other-data", "--audit-dir", str(audit)) as (proc2, _port):
        proc2.send_signal(signal.SIGTERM)
        assert proc2.wait(timeout=60) == 0


def test_A7_a_start_waits_for_the_writer_process_a_killed_gateway_left(tmp_path: Path) -> None:
    """A5 + A7: the audit writer process shares its gateway's lock and, after a kill -9 of the
    gateway, writes what its pipe holds before it exits. A start that finds the lock held
    while the gateway the lock names is gone waits for that process (the kernel drops the
    lock when it exits) instead of refusing, and so never closes or compacts a file that is
    still being written. Here the "gateway" takes the lock, starts a child that inherits it
    and finishes a file 1.5 s later, and dies at once."""
    audit = tmp_path / "audit"
    done = audit / "child-done"
    script = textwrap.dedent(f"""
        import os, subprocess, sys
        from gateway.audit.dirlock import AuditDirLock
        lock = AuditDirLock({str(audit)!r})
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5); open({str(done)!r}, 'w').close()"],
                         pass_fds=(lock.fileno(),), start_new_session=True, stdout=subprocess.DEVNULL)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60, stdout=subprocess.DEVNULL)
    assert not done.exists()  # the child still runs and holds the lock
    started = time.monotonic()
    lock = AuditDirLock(str(audit))
    try:
        assert done.exists(), "the lock was taken while the dead gateway's writer still ran"
        assert time.monotonic() - started < 30
    finally:
        lock.release()


def test_A7_a_writer_that_outlives_the_wait_is_named_as_the_dead_gateway_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A5 + A7: a killed gateway's writer process waits for room on a full disk rather than
    drop records, so it may outlast a start's wait (DEAD_HOLDER_WAIT). The refusal then says
    so, not that another writer uses the directory."""
    audit = tmp_path / "audit"
    script = textwrap.dedent(f"""
        import os, subprocess, sys
        from gateway.audit.dirlock import AuditDirLock
        lock = AuditDirLock({str(audit)!r})
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         pass_fds=(lock.fileno(),), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(os.getpid(), flush=True)
        os._exit(0)
    """)
    dead = subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60,
                          capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(dirlock, "DEAD_HOLDER_WAIT", 0.5)
    with pytest.raises(dirlock.AuditDirLocked) as refused:
        AuditDirLock(str(audit))
    text = str(refused.value)
    assert f"pid {dead} on host {socket.gethostname()}" in text
    assert "still held by the audit writer process of a gateway that has exited" in text
    subprocess.run(["pkill", "-f", "import time; time.sleep(60)"], check=False)
