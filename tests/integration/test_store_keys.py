"""Store keys over the wire and across restarts: names holding ``/`` never share or shadow
another object's keys (issue 11, item 1: data loss), and a data dir written by the old
unescaped key format is migrated on open (M14: a confirmed message survives a restart)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pika

from gateway.broker import persistence as P
from semantics.store import Store
from tests.integration.differential import blocking
from tests.integration.test_process import ROOT, serve
from tests.unit.broker.old_format import SIDES, write_old_format_dir

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _url(port: int, vhost: str = "/") -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/{quote(vhost, safe='')}"


def _drain(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> list[bytes]:
    bodies = []
    while (m := ch.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append(m[2])
    return bodies


def test_M14_deleting_queue_orders_keeps_the_messages_of_orders_archive(tmp_path: Path) -> None:
    """M14: durable queues ``orders`` and ``orders/archive``, 100 confirmed persistent messages
    each; deleting ``orders`` must not erase the journaled messages of ``orders/archive``
    (the old prefix scan ``m///orders/`` matched them too: 0 after a restart)."""
    with serve(tmp_path) as (_proc, port), blocking(_url(port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for q in ("orders", "orders/archive"):
            ch.queue_declare(q, durable=True)
            for i in range(100):
                ch.basic_publish("", q, f"{q} {i}".encode(), PERSISTENT)
        ch.queue_delete("orders")
        assert ch.queue_declare("orders/archive", passive=True).method.message_count == 100

    with serve(tmp_path) as (_proc, port), blocking(_url(port)) as conn:
        ch = conn.channel()
        assert ch.queue_declare("orders/archive", passive=True).method.message_count == 100
        assert _drain(ch, "orders/archive") == [f"orders/archive {i}".encode() for i in range(100)]


def _config(tmp_path: Path, vhosts: list[str]) -> Path:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({
        "users": [{"name": "guest", "password": "guest"}],
        "vhosts": [{"name": v} for v in vhosts],
        "permissions": [{"user": "guest", "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
                        for v in vhosts],
    }))
    return path


def test_M14_vhost_a_queue_b_c_and_vhost_a_b_queue_c_both_survive_a_restart(tmp_path: Path) -> None:
    """M14: vhost ``a`` with exchange ``b/ex`` and queue ``b/c``, vhost ``a/b`` with exchange
    ``ex`` and queue ``c``, all durable, bound, with confirmed persistent messages: after a
    restart both exchanges, both queues, both bindings and every message are back."""
    data = tmp_path / "data"
    config = _config(tmp_path, ["/", "a", "a/b"])
    with serve(data, "--config", str(config)) as (_proc, port):
        for vhost, ex, q in SIDES:
            with blocking(_url(port, vhost)) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.exchange_declare(ex, "direct", durable=True)
                ch.queue_declare(q, durable=True)
                ch.queue_bind(q, ex, "k")
                for i in range(20):
                    ch.basic_publish(ex, "k", f"{vhost} {i}".encode(), PERSISTENT, mandatory=True)

    with serve(data, "--config", str(config)) as (_proc, port):
        for vhost, ex, q in SIDES:
            with blocking(_url(port, vhost)) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.exchange_declare(ex, "direct", durable=True, passive=True)
                # mandatory + confirms: pika raises UnroutableError if the binding is gone
                ch.basic_publish(ex, "k", f"{vhost} after".encode(), PERSISTENT, mandatory=True)
                assert _drain(ch, q) == [f"{vhost} {i}".encode() for i in range(20)] + [f"{vhost} after".encode()]


def test_M14_old_format_data_dir_is_migrated_and_served(tmp_path: Path) -> None:
    """M14: a data dir written with the old unescaped keys opens in the new gateway, which
    rewrites the keys once: every queue whose declaration the old store still held serves
    all its messages, bindings route, and deleting ``dq`` keeps ``dq/archive``'s messages."""
    data = tmp_path / "data"
    expect = write_old_format_dir(data)
    config = _config(tmp_path, ["/", "a", "a/b"])
    with serve(data, "--config", str(config)) as (_proc, port):
        with blocking(_url(port)) as conn:
            ch = conn.channel()
            ch.queue_delete("dq")
        with blocking(_url(port, "a/b")) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("ex", "k", b"routed", PERSISTENT, mandatory=True)
    with serve(data, "--config", str(config)) as (_proc, port):
        with blocking(_url(port)) as conn:
            assert _drain(conn.channel(), "dq/archive") == expect["/|dq/archive"]
        with blocking(_url(port, "a/b")) as conn:
            assert _drain(conn.channel(), "c") == [*expect["a/b|c"], b"routed"]


def test_store_of_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    """A data dir whose key format is newer than this gateway knows is refused before anything
    is read or rewritten: one line on stderr, exit 1, the store untouched."""
    data = tmp_path / "data"
    with Store.open(str(data)) as store:
        store.put(P.FORMAT_KEY, str(P.FORMAT_VERSION + 1).encode())
        store.put("q/x/y", b"{}")
    before = sorted((p.name, p.read_bytes()) for p in data.iterdir() if p.is_file())
    proc = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                           "--management-port", "off", "--metrics-port", "off", "--mqtt-port", "off",
                           "--data-dir", str(data)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("cmq-gateway:")]
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("cmq-gateway: store key format "), lines
    assert f"{P.FORMAT_VERSION + 1}" in lines[0]
    assert sorted((p.name, p.read_bytes()) for p in data.iterdir() if p.is_file()) == before

