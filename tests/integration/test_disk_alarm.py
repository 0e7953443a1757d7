"""W5/M14 on a real full disk: `cmq-gateway serve` with its data directory on a small tmpfs.

The disk alarm blocks publishers when the file system's free space drops below
``disk_free_limit`` and when the store cannot write; the store retries and the gateway
resumes by itself once there is room; acks never fail; a restart on a full disk serves.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from tests.integration.test_process import serve
from tests.small_disk import FILLER, fill, free, small_disk
from tests.support.audit_files import records

PERSISTENT = pika.BasicProperties(delivery_mode=2)
HANG = 30.0  # hang protection only


def _url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def _config(tmp_path: Path, **limits: int) -> str:
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps({"limits": limits}))
    return str(path)


def _health(proc: Any, check: str = "alarms") -> tuple[int, dict[str, Any]]:
    port = proc.operator["management API"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/health/checks/{check}",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _until(what: Callable[[], bool], conn: pika.BlockingConnection | None = None) -> None:
    deadline = time.monotonic() + HANG
    while not what():
        assert time.monotonic() < deadline, "timed out (hang protection)"
        if conn is not None:
            conn.process_data_events(time_limit=0.1)
        else:
            time.sleep(0.05)


DISK_ALARM = {"status": "failed", "reason": "There are alarms in effect in the cluster",
              "alarms": [{"node": "cmq-gateway@localhost", "resource": "disk"}]}


def _watched_publisher(port: int) -> tuple[pika.BlockingConnection, Any, list[str]]:
    conn = pika.BlockingConnection(pika.URLParameters(_url(port)))
    notes: list[str] = []
    conn.add_on_connection_blocked_callback(lambda c, m: notes.append(m.method.NAME))
    conn.add_on_connection_unblocked_callback(lambda c, m: notes.append(m.method.NAME))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch, notes


def _publish_in_thread(port: int, queue: str, body: bytes) -> tuple[threading.Thread, dict[str, str]]:
    """A confirmed persistent publish on its own connection; ``result["outcome"]`` says how
    it ended: ack, nack or closed."""
    result: dict[str, str] = {}

    def run() -> None:
        try:
            with pika.BlockingConnection(pika.URLParameters(_url(port))) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.basic_publish("", queue, body, properties=PERSISTENT)
                result["outcome"] = "ack"
        except pika.exceptions.NackError:
            result["outcome"] = "nack"
        except pika.exceptions.AMQPError as e:
            result["outcome"] = f"closed: {e!r}"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def _drain(port: int, queue: str) -> list[bytes]:
    with pika.BlockingConnection(pika.URLParameters(_url(port))) as conn:
        ch = conn.channel()
        bodies = []
        while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
            bodies.append(got[2])
        return bodies


def test_W5_M14_full_disk_blocks_publishers_acks_still_work_and_it_resumes_by_itself(
        tmp_path: Path, unique: str) -> None:
    """Issue 11 item 2: a write that fails on a full disk sets the disk alarm (publishers get
    connection.blocked, the health check 503 with resource disk); a consumer's ack of a
    persistent message is no error; the confirm waiting for the failed write is an ack once
    there is room again, without a restart, and nothing confirmed is lost."""
    queue = f"{unique}-q"
    with small_disk(tmp_path / "disk") as disk, \
            serve(disk / "data", "--config", _config(tmp_path, disk_free_limit=0)) as (proc, port):
        pub, ch, notes = _watched_publisher(port)
        ch.queue_declare(queue, durable=True)
        for i in range(3):
            ch.basic_publish("", queue, f"m{i}".encode(), properties=PERSISTENT)  # each confirmed
        consumer = pika.BlockingConnection(pika.URLParameters(_url(port)))
        cch = consumer.channel()
        got = cch.basic_get(queue)
        assert got[2] == b"m0"
        assert _health(proc) == (200, {"status": "ok"})

        fill(disk)
        waiting, result = _publish_in_thread(port, queue, b"B" * 60_000)
        _until(lambda: _health(proc)[0] == 503)
        assert _health(proc) == (503, DISK_ALARM)
        assert _health(proc, "local-alarms")[1]["alarms"] == DISK_ALARM["alarms"]
        _until(lambda: notes == ["Connection.Blocked"], pub)
        cch.basic_ack(got[0].delivery_tag)  # its delete cannot be journalled yet: no 541
        assert cch.queue_declare(queue, passive=True).method.message_count == 2 + 1
        assert waiting.is_alive() and result == {}  # the confirm waits for the retried write

        free(disk)
        waiting.join(HANG)
        assert result == {"outcome": "ack"}
        _until(lambda: _health(proc) == (200, {"status": "ok"}))
        _until(lambda: notes == ["Connection.Blocked", "Connection.Unblocked"], pub)
        ch.basic_publish("", queue, b"after", properties=PERSISTENT)
        consumer.close()
        pub.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=HANG)
        with serve(disk / "data") as (_proc, again):
            assert sorted(_drain(again, queue)) == [b"B" * 60_000, b"after", b"m1", b"m2"]


def test_W5_restart_on_a_still_full_disk_serves_reads_and_blocks_publishers(tmp_path: Path, unique: str) -> None:
    """Issue 11 item 2: stopped while its disk is full (with a write that failed and was never
    confirmed), the gateway starts again on the still-full disk: consumers read, publishers
    are blocked, the alarm is reported; when space returns it takes publishes again."""
    queue = f"{unique}-q"
    with small_disk(tmp_path / "disk") as disk:
        # No free-space limit at first, so that the write itself fails on the full disk.
        with serve(disk / "data", "--config", _config(tmp_path, disk_free_limit=0)) as (proc, port):
            with pika.BlockingConnection(pika.URLParameters(_url(port))) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(queue, durable=True)
                ch.basic_publish("", queue, b"before", properties=PERSISTENT)
            fill(disk)
            waiting, result = _publish_in_thread(port, queue, b"N" * 60_000)
            _until(lambda: _health(proc)[0] == 503)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=HANG) == 0
            waiting.join(HANG)
            assert result["outcome"] != "ack"  # never written, never confirmed
        with serve(disk / "data", "--config", _config(tmp_path, disk_free_limit=1_000_000)) as (proc, port):
            assert _health(proc) == (503, DISK_ALARM)  # from the start: no room to write
            pub, ch, notes = _watched_publisher(port)
            ch.basic_publish("", "nowhere", b"x")  # a publisher now: blocked
            _until(lambda: notes == ["Connection.Blocked"], pub)
            assert _drain(port, queue) == [b"before"]
            free(disk)
            _until(lambda: _health(proc) == (200, {"status": "ok"}))
            _until(lambda: notes == ["Connection.Blocked", "Connection.Unblocked"], pub)
            ch.basic_publish("", queue, b"later", properties=PERSISTENT)  # confirmed
            pub.close()
            assert _drain(port, queue) == [b"later"]


def test_W5_disk_alarm_follows_the_free_space_not_the_store_size(tmp_path: Path) -> None:
    """Issue 11 item 3: the alarm compares the data directory's free space with
    disk_free_limit (here 2 MB of an 8 MB disk): another file filling the disk blocks
    publishers before the store has anything to fail on; freeing it unblocks them."""
    with small_disk(tmp_path / "disk") as disk, \
            serve(disk / "data", "--config", _config(tmp_path, disk_free_limit=2_000_000)) as (proc, port):
        pub, ch, notes = _watched_publisher(port)
        ch.basic_publish("", "nowhere", b"x")
        assert _health(proc) == (200, {"status": "ok"})
        (disk / FILLER).write_bytes(b"\0" * 7_000_000)
        _until(lambda: notes == ["Connection.Blocked"], pub)
        assert _health(proc) == (503, DISK_ALARM)
        free(disk)
        _until(lambda: notes == ["Connection.Blocked", "Connection.Unblocked"], pub)
        assert _health(proc) == (200, {"status": "ok"})
        pub.close()



def test_W5_A5_an_audit_dir_on_a_full_disk_of_its_own_blocks_publishers(tmp_path: Path, unique: str) -> None:
    """The audit writer waits for room rather than drop a record (A5), and deliveries wait
    for it: an audit dir on a file system of its own under disk_free_limit sets the disk
    alarm as the data dir's would, so the publishers stop before the audit log does; every
    record is there once room returns."""
    queue = f"{unique}-q"
    with small_disk(tmp_path / "disk") as disk:
        with serve(tmp_path / "data", "--audit-dir", str(disk / "audit"),
                   "--config", _config(tmp_path, disk_free_limit=2_000_000)) as (proc, port):
            pub, ch, notes = _watched_publisher(port)
            ch.queue_declare(queue, durable=True)
            ch.basic_publish("", queue, b"before", properties=PERSISTENT)
            assert _health(proc) == (200, {"status": "ok"})
            (disk / FILLER).write_bytes(b"\0" * 7_000_000)
            _until(lambda: notes == ["Connection.Blocked"], pub)
            assert _health(proc) == (503, DISK_ALARM)
            assert _drain(port, queue) == [b"before"]  # consumers go on
            free(disk)
            _until(lambda: notes == ["Connection.Blocked", "Connection.Unblocked"], pub)
            ch.basic_publish("", queue, b"after", properties=PERSISTENT)
            pub.close()
            assert _drain(port, queue) == [b"after"]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=HANG) == 0
        mine = [r["event"] for r in records(disk / "audit") if r.get("queue") == queue]
        # basic_get with auto_ack: a deliver record says so, no ack record follows (spark/SCHEMA.md)
        assert sorted(mine) == sorted(["queue_declare"] + ["publish", "enqueue", "deliver"] * 2), mine
