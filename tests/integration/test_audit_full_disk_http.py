"""A5 for the HTTP callers of the audit hand-off: a stop while the audit writer waits for room
on a full disk hands nothing out over HTTP. `cmq-gateway serve` with its audit dir on a real
full tmpfs: the management API's get messages and the CMQ API's ReceiveMessage answer 503,
the messages stay queued (unreceived, so not redelivered), and no record says they were
delivered, acked or requeued. HTTP push, which has no client to answer: test_http_push_stop.py."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pika
import pytest
import yaml

from tests.integration.cmq_client import CmqClient
from tests.integration.test_process import serve
from tests.small_disk import fill, free, small_disk
from tests.support.audit_files import records
from tests.support.audit_stall import stall

HANG = 60.0  # seconds: a bound on a hang, never a measurement
KEPT = 5
KEY_ID, SECRET = "AKIDstop", "stop-secret"


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "limits": {"disk_free_limit": 0},  # no disk alarm: the writer itself must wait
        "users": [{"name": "guest", "password": "guest", "tags": ["administrator"],
                   "cmq_keys": [{"secret_id": KEY_ID, "secret_key": SECRET}]}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}))
    return path


def _waiting_bytes(port: int) -> int:
    """Bytes the kernel holds for the gateway on its established connections to ``port``
    (the request it has not read yet: its event loop is held by a hand-off)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, queues = cols[1], cols[3], cols[4]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    total += int(queues.split(":")[1], 16)
    return total


def _request(kind: str, operator: dict[str, int]) -> tuple[str, int, dict[str, Any]]:
    if kind == "management":
        return ("POST", operator["management API"], {
            "url": f"http://127.0.0.1:{operator['management API']}/api/queues/%2F/kept/get",
            "json": {"count": KEPT, "ackmode": "ack_requeue_false", "encoding": "auto"},
            "auth": aiohttp.BasicAuth("guest", "guest")})
    port = operator["CMQ API"]
    client = CmqClient(f"http://127.0.0.1:{port}", KEY_ID, SECRET)
    return ("POST", port, {"url": f"http://127.0.0.1:{port}/v2/index.php",
                           "data": client.signed("BatchReceiveMessage", {"queueName": "kept", "numOfMsg": KEPT})})


def _ask(method: str, kw: dict[str, Any], out: dict[str, Any]) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HANG)) as http, \
                http.request(method, **kw) as r:
            out["status"], out["body"] = r.status, await r.text()
    try:
        asyncio.run(go())
    except Exception as e:  # noqa: BLE001  # said by the assertion below
        out["error"] = repr(e)


@pytest.mark.parametrize("kind", ["management", "cmq"], ids=["management-get", "cmq-receive"])
def test_A5_a_stop_on_a_full_disk_hands_out_nothing_over_http(tmp_path: Path, kind: str) -> None:
    config = _config(tmp_path)
    with small_disk(tmp_path / "disk", "2m") as disk:
        audit = disk / "audit"
        with serve(tmp_path / "data", "--audit-dir", str(audit), "--config", str(config),
                   "--mqtt-port", "off") as (proc, port):
            params = pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=HANG)
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("kept", durable=True)
            for i in range(KEPT):  # confirmed: on disk, records included (A5)
                ch.basic_publish("", "kept", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
            conn.close()
            fill(disk)
            done = threading.Event()
            try:
                stall(params, done, HANG)
                method, http_port, kw = _request(kind, proc.operator)  # type: ignore[attr-defined]
                before = _waiting_bytes(http_port)
                answer: dict[str, Any] = {}
                asking = threading.Thread(target=_ask, args=(method, kw, answer), daemon=True)
                asking.start()
                deadline = time.monotonic() + HANG
                while _waiting_bytes(http_port) <= before and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert _waiting_bytes(http_port) > before, "the request never reached the gateway"
                proc.send_signal(signal.SIGTERM)
                asking.join(HANG)
                code = proc.wait(timeout=HANG)
            finally:
                done.set()
                free(disk)
            assert code == 0
            assert answer.get("status") == 503, answer
            assert "stopping" in answer["body"], answer
            if kind == "cmq":
                assert json.loads(answer["body"])["code"] == 6000, answer
        told = [r for r in records(audit, include_open=True) if r.get("queue") == "kept"]
        assert {r["event"] for r in told} <= {"queue_declare", "publish", "enqueue"}, told

        # Nothing lost, nothing counted as received: a restart finds every message, first time.
        with serve(tmp_path / "data", "--audit-dir", str(audit), "--config", str(config),
                   "--mqtt-port", "off", "--cmq-api-port", "off") as (proc2, _):
            url = f"http://127.0.0.1:{proc2.operator['management API']}/api/queues/%2F/kept/get"  # type: ignore[attr-defined]
            got: dict[str, Any] = {}
            _ask("POST", {"url": url, "json": {"count": KEPT + 1, "ackmode": "ack_requeue_false",
                                               "encoding": "auto"},
                          "auth": aiohttp.BasicAuth("guest", "guest")}, got)
            proc2.send_signal(signal.SIGTERM)
            assert proc2.wait(timeout=HANG) == 0
        assert got.get("status") == 200, got
        shown = json.loads(got["body"])
        assert sorted(m["payload"] for m in shown) == [f"m{i}" for i in range(KEPT)]
        assert not any(m["redelivered"] for m in shown), shown
