"""The management API's "get messages" on the JetStream store (issue 28): the local queue holds
only what was pulled for consumers and gets, so the request pulls for itself, as a CMQ API
ReceiveMessage does. Requeued, a message is there again for every gateway."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Callable
from typing import Any

import pika


def _get(gw: Any, queue: str, count: int, ackmode: str) -> list[dict[str, Any]]:
    address = dict(gw.operator_addresses())["management API"]
    req = urllib.request.Request(
        f"http://{address}/api/queues/%2F/{queue}/get", method="POST",
        data=json.dumps({"count": count, "ackmode": ackmode, "encoding": "auto"}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_M12_management_get_pulls_from_jetstream(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2, management_port=0, management_host="127.0.0.1")
    name = f"mget-{uuid.uuid4().hex[:6]}"
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", a.port))
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    deadline = time.monotonic() + 10
    while name not in b.broker.vhosts["/"].queues:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Through the other gateway, which never pulled the queue: the request pulls for itself.
    first = _get(b, name, 1, "ack_requeue_true")
    assert [m["payload"] for m in first] == ["m0"]
    got = _get(b, name, 3, "ack_requeue_false")
    assert sorted(m["payload"] for m in got) == ["m0", "m1", "m2"]
    assert [m["redelivered"] for m in got if m["payload"] == "m0"] == [True]
    assert _get(a, name, 3, "ack_requeue_false") == []
    conn.close()
