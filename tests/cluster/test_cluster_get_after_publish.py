"""M11 on JetStream: a basic.get after a publish on the same channel gets that message, as on
RabbitMQ, never get-empty.

nats-server (2.10.26 and 2.15.1 alike) can answer a no_wait pull request "404 No Messages"
when it comes right after the server acknowledged a publish to the stream (about 0.5-1 % of
such pulls on an idle machine); asked again, it delivers. A plain basic.get's pull is such a
request: a fresh-clone CI run (2026-11-30) failed
test_differential_pika.py::test_M13_unacked_return_on_channel_close[jetstream] on it. pika over
real sockets, a gateway in-process on a real nats-server (tests/cluster/conftest.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest

ROUNDS = 1500


@pytest.mark.parametrize("durable", [True, False], ids=["file-stream", "memory-stream"])
def test_M11_a_get_after_a_publish_on_the_channel_gets_it(js_gateways: Callable[..., Any], durable: bool) -> None:
    (gw,) = js_gateways(1)
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
    ch = conn.channel()
    name = f"get-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(name, durable=durable)
    empty = []
    for i in range(ROUNDS):
        body = b"m%d" % i
        ch.basic_publish("", name, body)
        method, _, got = ch.basic_get(name, auto_ack=True)
        if method is None:
            empty.append(i)
            got = ch.basic_get(name, auto_ack=True)[2]  # the message is there: take it
        assert got == body
    ch.queue_delete(name)
    conn.close()
    assert empty == [], f"get-empty after {len(empty)} of {ROUNDS} publishes"
