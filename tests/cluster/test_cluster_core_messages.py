"""CL1/CL3 and the queue rules on JetStream: messages published through one gateway are
consumed through another, with acks, requeues, receive counts and confirms kept."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel


def _conn(gw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.05)


def _declare_both(a: Any, b: Any, name: str, **arguments: Any) -> tuple[pika.BlockingConnection, BlockingChannel]:
    conn = _conn(a)
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=arguments or None)
    _eventually(lambda: name in b.broker.vhosts["/"].queues)
    return conn, ch


def _get(ch: BlockingChannel, queue: str, timeout: float = 10.0) -> tuple[Any, Any, bytes]:
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = ch.basic_get(queue)
        if method is not None:
            return method, props, body
        assert time.monotonic() < deadline, "no message"


def test_CL1_publish_on_one_gateway_consume_on_another(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    q = _name("work")
    pub, pch = _declare_both(a, b, q)
    pch.confirm_delivery()
    for i in range(20):
        pch.basic_publish("", q, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    con = _conn(b)
    cch = con.channel()
    cch.basic_qos(prefetch_count=5)
    got: list[bytes] = []

    def on(ch: BlockingChannel, method: Any, props: Any, body: bytes) -> None:
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    cch.basic_consume(q, on)
    deadline = time.monotonic() + 20
    while len(got) < 20 and time.monotonic() < deadline:
        con.process_data_events(0.1)
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
    con.close()
    pub.close()


def test_M13_requeue_on_one_gateway_redelivers_on_another_with_redelivered(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    q = _name("requeue")
    conn, ch = _declare_both(a, b, q, **{"x-cmq-receive-metadata": True})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"once", pika.BasicProperties(delivery_mode=2))
    method, _, body = _get(ch, q)
    assert body == b"once" and not method.redelivered
    ch.basic_nack(method.delivery_tag, requeue=True)
    other = _conn(b)
    och = other.channel()
    method, props, body = _get(och, q)
    assert body == b"once" and method.redelivered  # M11: receive count 2 from num_delivered
    assert props.headers["x-cmq-receive-count"] == 2
    och.basic_ack(method.delivery_tag)
    time.sleep(0.5)
    assert och.basic_get(q)[0] is None and ch.basic_get(q)[0] is None
    other.close()
    conn.close()


def test_Q1_unacked_deliveries_of_a_gone_consumer_come_back_after_visibility(js_gateways: Callable[..., Any]) -> None:
    """CL3 (the gateway side): a consumer that never acks; after VisibilityTimeout the
    message is Active again and another gateway receives it, receive count 2."""
    a, b = js_gateways(2)
    q = _name("vis")
    conn, ch = _declare_both(a, b, q, **{"x-cmq-visibility-timeout": 1})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"slow", pika.BasicProperties(delivery_mode=2))
    method, _, _ = _get(ch, q)  # received on a, never acked
    t0 = time.monotonic()
    other = _conn(b)
    och = other.channel()
    method2, _, body = _get(och, q, timeout=15)
    assert body == b"slow" and method2.redelivered
    assert time.monotonic() - t0 >= 0.8
    och.basic_ack(method2.delivery_tag)
    ch.basic_ack(method.delivery_tag)  # M12: stale, deletes nothing, no error
    other.close()
    conn.close()


def test_M14_confirm_comes_after_jetstream_has_it(js_gateways: Callable[..., Any]) -> None:
    """CL3: a confirmed message is in the queue's stream (read back through another gateway
    started afterwards)."""
    (a,) = js_gateways(1)
    q = _name("confirm")
    conn = _conn(a)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", q, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()
    (b,) = js_gateways(1)
    c2 = _conn(b)
    ch2 = c2.channel()
    assert ch2.queue_declare(q, passive=True).method.message_count == 50
    seen = {_get(ch2, q)[2] for _ in range(50)}
    assert seen == {b"%d" % i for i in range(50)}
    c2.close()


def _with_dead_letters(a: Any, b: Any, arguments: Callable[[str], dict[str, Any]], body: bytes
                       ) -> tuple[str, str, BlockingChannel, BlockingChannel, list[pika.BlockingConnection]]:
    """A dead-letter queue and a source queue declared on ``a`` (seen on ``b``), one message
    published to the source; the channels of both gateways."""
    dlq, q = _name("dlq"), _name("src")
    conn = _conn(a)
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(q, durable=True, arguments=arguments(dlq))
    _eventually(lambda: q in b.broker.vhosts["/"].queues)
    ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))
    other = _conn(b)
    return dlq, q, ch, other.channel(), [conn, other]


def test_M13_reject_without_requeue_dead_letters(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    dlq, q, ch, och, conns = _with_dead_letters(
        a, b, lambda dlq: {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}, b"bad")
    method, _, _ = _get(och, q)
    och.basic_reject(method.delivery_tag, requeue=False)
    _, props, body = _get(ch, dlq)
    assert body == b"bad" and props.headers["x-death"][0]["reason"] == "rejected"
    for c in conns:
        c.close()


def test_Q8_max_receive_count_moves_to_the_dead_letter_queue(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    dlq, q, ch, och, conns = _with_dead_letters(
        a, b, lambda dlq: {"x-cmq-dead-letter-queue": dlq, "x-cmq-max-receive-count": 2}, b"poison")
    for chan in (ch, och):  # one receive on each gateway, each requeued
        method, _, _ = _get(chan, q)
        chan.basic_nack(method.delivery_tag, requeue=True)
    _, _, body = _get(och, dlq)
    assert body == b"poison"
    time.sleep(0.3)
    assert ch.basic_get(q)[0] is None
    for c in conns:
        c.close()


@pytest.mark.parametrize("purge", [True, False])
def test_CL1_purge_and_delete_count_and_empty_the_stream(js_gateways: Callable[..., Any], purge: bool) -> None:
    a, b = js_gateways(2)
    q = _name("purge")
    conn, ch = _declare_both(a, b, q)
    ch.confirm_delivery()
    for _ in range(5):
        ch.basic_publish("", q, b"x", pika.BasicProperties(delivery_mode=2))
    other = _conn(b)
    och = other.channel()
    # Counts on another gateway follow JetStream's within a second (docs/CLUSTER.md, "Counts").
    _eventually(lambda: och.queue_declare(q, passive=True).method.message_count == 5)
    if purge:
        assert och.queue_purge(q).method.message_count == 5
        time.sleep(0.3)
        assert ch.basic_get(q)[0] is None
    else:
        assert och.queue_delete(q).method.message_count == 5
        _eventually(lambda: q not in a.broker.vhosts["/"].queues)
    other.close()
    conn.close()


def test_CL1_a_body_larger_than_one_nats_message_crosses_gateways(js_gateways: Callable[..., Any]) -> None:
    """Bodies above NATS's max_payload (1 MiB) go through the CMQ_BODIES object store."""
    import os
    a, b = js_gateways(2)
    q = _name("big")
    conn, ch = _declare_both(a, b, q)
    ch.confirm_delivery()
    body = os.urandom(3 << 20)
    ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2, headers={"k": "v"}))
    other = _conn(b)
    och = other.channel()
    method, props, got = _get(och, q)
    assert got == body and props.headers == {"k": "v"}
    och.basic_ack(method.delivery_tag)
    other.close()
    conn.close()


def test_Q6_M15_rewind_on_one_gateway_receives_again_what_another_consumed(js_gateways: Callable[..., Any]) -> None:
    """Q6 on JetStream: the queue's shared consumer restarts at the rewind time."""
    a, b = js_gateways(2)
    q = _name("rewind")
    conn, ch = _declare_both(a, b, q, **{"x-cmq-rewind-seconds": 3600})
    ch.confirm_delivery()
    start = int(time.time()) - 1
    for i in range(3):
        ch.basic_publish("", q, b"r%d" % i, pika.BasicProperties(delivery_mode=2))
    other = _conn(b)
    och = other.channel()
    for i in range(3):
        method, _, body = _get(och, q)
        assert body == b"r%d" % i
        och.basic_ack(method.delivery_tag)
    time.sleep(0.3)
    assert ch.basic_get(q)[0] is None
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)),
                     arguments={"x-cmq-rewind-to": start})
    deadline = time.monotonic() + 15
    while len(got) < 3 and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert got == [b"r0", b"r1", b"r2"]
    other.close()
    conn.close()
