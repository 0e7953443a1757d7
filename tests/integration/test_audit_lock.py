"""A7: one writer per audit directory. Real `serve` processes over real sockets.

The issue-27 reproduction: the first gateway's audit dir is inside its own data dir (the
default), and a second gateway with another data dir is given that audit dir. It used to
start, "close" the first one's live file as left open by a crash, and the first one's
writer then crashed at its stop (FileNotFoundError on the rename, EOFError)."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pika

from tests.integration.differential import blocking
from tests.integration.test_process import serve
from tests.integration.test_startup import _audit_files, _wait_for, one_line, run_serve


def _records(audit: Path) -> list[dict[str, object]]:
    out = []
    for data in _audit_files(audit).values():
        for line in data.decode().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a torn last line (none expected here: both stop cleanly)
                continue
    return out


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
        _wait_for(lambda: any(r["event"] == "connection_close" for r in _records(audit)), "the close record")
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
    publishes = [r for r in _records(audit) if r["event"] == "publish" and r.get("queue", "lock-q") == "lock-q"]
    assert len(publishes) == 40
    # The lock is released at the stop: the directory can be taken by the next gateway.
    with serve(tmp_path / "other-data", "--audit-dir", str(audit)) as (proc2, _port):
        proc2.send_signal(signal.SIGTERM)
        assert proc2.wait(timeout=60) == 0
