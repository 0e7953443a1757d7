"""M12 on JetStream: an acknowledged message is gone for every gateway, whatever the queue's
kind. Acks on non-durable queues used to stay in the gateway (the embedded store has nothing
on disk for them, and the ack skipped the store), so JetStream gave the messages again after
the visibility timeout and its consumer stalled at max_ack_pending (issue 28)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest

VISIBILITY = 1  # seconds (x-cmq-visibility-timeout): an unacknowledged message is back after it


def _conn(gw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))


@pytest.mark.parametrize("kind", ["transient", "exclusive", "auto_delete", "durable"])
def test_M12_acked_messages_do_not_come_back_on_jetstream(js_gateways: Callable[..., Any], kind: str) -> None:
    (gw,) = js_gateways(1)
    conn = _conn(gw)
    ch = conn.channel()
    name = f"acks-{kind}-{uuid.uuid4().hex[:6]}"
    ch.queue_declare(name, durable=kind == "durable", exclusive=kind == "exclusive",
                     auto_delete=kind == "auto_delete", arguments={"x-cmq-visibility-timeout": VISIBILITY})
    # (auto-delete: deleted only after its last consumer goes; basic.get is no consumer)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 5:
        assert time.monotonic() < deadline, f"only {got} received"
        method, _props, body = ch.basic_get(name)
        if method is not None:
            got.append(body)
            ch.basic_ack(method.delivery_tag)
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]
    # Past the visibility timeout (and JetStream's ack wait, which follows it) a message whose
    # ack never reached JetStream is delivered again.
    again = []
    until = time.monotonic() + VISIBILITY + 4
    while time.monotonic() < until:
        method, _props, body = ch.basic_get(name)
        if method is not None:
            again.append(body)
            ch.basic_ack(method.delivery_tag)
        conn.sleep(0.2)
    assert again == []
    conn.close()
