"""The real `cmq-gateway serve` process: restart durability, SIGTERM, a taken port, --help."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.differential import blocking

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


@contextmanager
def serve(data_dir: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`cmq-gateway serve --port 0` on loopback; yields the process and its port."""
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(data_dir), *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    port = None
    for line in proc.stderr:
        if m := LISTENING.search(line):
            port = int(m.group(1))
            break
    assert port is not None, "the gateway never said where it listens"
    # Keep draining stderr so the child never blocks on a full pipe.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def test_restart_keeps_durable_state_and_sigterm_is_320(tmp_path: Path, unique: str) -> None:
    """M14 + store: durable exchange, queue, binding and persistent messages survive a
    restart; transient ones do not. SIGTERM closes clients with 320 CONNECTION_FORCED."""
    with serve(tmp_path) as (proc, port), blocking(_url(port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dx", "direct", durable=True)
        ch.exchange_declare("tx", "direct", durable=False)
        ch.queue_declare("dq", durable=True)
        ch.queue_declare("tq", durable=False)
        ch.queue_bind("dq", "dx", "k")
        ch.basic_publish("dx", "k", b"persistent", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("dx", "k", b"transient", pika.BasicProperties(delivery_mode=1))
        ch.basic_publish("", "tq", b"in transient queue", pika.BasicProperties(delivery_mode=2))
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(time_limit=10)
        assert proc.wait(timeout=30) == 0
    assert closed.value.reply_code == 320
    assert closed.value.reply_text.startswith("CONNECTION_FORCED")

    with serve(tmp_path) as (_proc, port), blocking(_url(port)) as conn:
        ch = conn.channel()
        ch.exchange_declare("dx", "direct", durable=True, passive=True)
        ch.basic_publish("dx", "k", b"routed after restart", pika.BasicProperties(delivery_mode=2))
        bodies = []
        while (m := ch.basic_get("dq", auto_ack=True))[0] is not None:
            bodies.append(m[2])
        assert bodies == [b"persistent", b"routed after restart"]
        faults = []
        for name, declare in (("tx", lambda c: c.exchange_declare("tx", passive=True)),
                              ("tq", lambda c: c.queue_declare("tq", passive=True))):
            c = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                declare(c)
            faults.append((name, e.value.reply_code))
        assert faults == [("tx", 404), ("tq", 404)]


def test_taken_port_is_one_line_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port",
                               str(port), "--data-dir", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == f"cmq-gateway: cannot listen on 127.0.0.1:{port}: address already in use\n"


def test_help_explains_every_option() -> None:
    from gateway.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve.format_help()
    for option in ("--host", "--port", "--data-dir", "--config", "--audit-dir"):
        assert option in text
    assert "~/.local/share" in text or os.path.join(".local", "share", "cmq-gateway") in text
    done = subprocess.run([sys.executable, "-m", "gateway", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "serve" in done.stdout
