"""M11 on JetStream: a queue keeps its publish order when some bodies are too large for one
NATS message (gateway.jetstream.bodies: the body goes to an object store first).

Such a message is a slow write, and so is every message behind it until it is stored; the store
ran slow writes side by side, so a small message's record overtook a large one still uploading
its body, and two large ones raced (a CI run saw kombu's two 1 MB messages come back swapped).
pika over real sockets, a gateway in-process on a real nats-server (tests/cluster/conftest.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import pika

LARGE = 1 << 20  # above the server's 1 MB max_payload less the headroom: a body of its own


def test_M11_large_and_small_bodies_keep_their_order(js_gateways: Callable[..., Any]) -> None:
    (gw,) = js_gateways(1)
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
    ch = conn.channel()
    name = f"order-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(name, durable=True)
    sizes = [LARGE, 16, LARGE, LARGE, 16, 16, LARGE, 16] * 2
    sent = [os.urandom(size) for size in sizes]
    for body in sent:  # back to back: no confirm awaited between them
        ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
    # The declare-ok counts after this gateway's own publishes landed.
    assert ch.queue_declare(name, passive=True).method.message_count == len(sent)
    got = []
    while (m := ch.basic_get(name, auto_ack=True))[0] is not None:
        got.append(m[2])
    ch.queue_delete(name)
    conn.close()
    assert [len(b) for b in got] == sizes
    assert got == sent
