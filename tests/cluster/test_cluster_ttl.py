"""CL4/M7/Q8: message TTLs on JetStream fall due at their time even when no gateway pulls the
queue, and end once with two gateways (the one holding the ``sweep`` lease ends them).

pika over real sockets; gateways in-process on a real nats-server (tests/cluster/conftest.py).
Nothing pulls the source queue in these tests: its counts come from declare-ok (JetStream's
count of undelivered messages), so a message that left it was ended by the sweep.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import nats
import pika

from gateway.broker import persistence as P
from semantics.jetstream.names import queue_stream, queue_subject


def _url(gw: Any) -> str:
    return f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"


def _count(ch: Any, name: str) -> int:
    return ch.queue_declare(name, passive=True).method.message_count


def _wait_count(ch: Any, name: str, n: int, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while _count(ch, name) != n:
        assert time.monotonic() < deadline, f"{name} never held {n} messages"
        ch.connection.sleep(0.1)


def _dead_letters(ch: Any, name: str) -> list[tuple[bytes, Any]]:
    out = []
    while (m := ch.basic_get(name, auto_ack=True))[0] is not None:
        out.append((m[2], m[1]))
    return out


def _setup(js_gateways: Callable[..., Any], arguments: Callable[[str], dict[str, Any]]) -> tuple[Any, Any, str]:
    """Two gateways; queue ``name`` (``arguments(name)``) and ``name.dlq`` declared on the first."""
    a, b = js_gateways(2)
    name = f"ttl-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(_url(a)))
    ch = conn.channel()
    ch.queue_declare(f"{name}.dlq", durable=True)
    ch.queue_declare(name, durable=True, arguments=arguments(name))
    conn.close()
    deadline = time.monotonic() + 10
    while name not in b.broker.vhosts["/"].queues:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return a, b, name


def _dlx(name: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{name}.dlq"}


def _reason(props: Any) -> str:
    reason = props.headers["x-death"][0]["reason"]
    return reason.decode() if isinstance(reason, bytes) else reason


def test_CL4_M7_x_message_ttl_dead_letters_when_due_without_a_pull(js_gateways: Callable[..., Any]) -> None:
    a, b, name = _setup(js_gateways, lambda n: {"x-message-ttl": 1000, **_dlx(n)})
    conn = pika.BlockingConnection(pika.URLParameters(_url(b)))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, b"t%d" % i, pika.BasicProperties(delivery_mode=2))
    assert _count(ch, name) == 3  # not yet due
    _wait_count(ch, name, 0)
    _wait_count(ch, f"{name}.dlq", 3)
    dead = _dead_letters(ch, f"{name}.dlq")
    assert [body for body, _ in dead] == [b"t0", b"t1", b"t2"]  # each once, with two gateways
    assert {_reason(p) for _, p in dead} == {"expired"}
    conn.close()


def test_CL4_M7_per_message_expiration_dead_letters_when_due_without_a_pull(
        js_gateways: Callable[..., Any]) -> None:
    """RabbitMQ's per-message TTL (the expiration property) on a queue without x-message-ttl."""
    a, b, name = _setup(js_gateways, _dlx)
    conn = pika.BlockingConnection(pika.URLParameters(_url(a)))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", name, b"short", pika.BasicProperties(delivery_mode=2, expiration="800"))
    ch.basic_publish("", name, b"forever", pika.BasicProperties(delivery_mode=2))
    _wait_count(ch, f"{name}.dlq", 1)
    assert _count(ch, name) == 1  # the one without an expiration stays
    dead = _dead_letters(ch, f"{name}.dlq")
    assert [body for body, _ in dead] == [b"short"] and _reason(dead[0][1]) == "expired"
    conn.close()


def _age(store_url: str, name: str, seconds: float) -> None:
    """The one message of queue ``name`` as if it had been published ``seconds`` ago: its
    stored record (what a gateway wrote) written again with that enqueue time."""
    async def run() -> None:
        nc = await nats.connect(store_url.split(",")[0])
        js = nc.jetstream()
        stream = queue_stream("/", name)
        info = await js.consumer_info(stream, "cmq")
        raw = await js.get_msg(stream, seq=info.delivered.stream_seq + 1, subject=queue_subject("/", name),
                               next=True)
        r = P.decode_message(raw.data)
        msg_id = f"msg-{uuid.uuid4().hex}"
        await js.publish(queue_subject("/", name), P.encode_message(
            "/", name, msg_id, r["enqueue_time"] - seconds, r["exchange"], r["routing_key"], r["properties"],
            r["body"]), headers={"Nats-Msg-Id": msg_id})
        await js.delete_msg(stream, raw.seq)
        await nc.close()
    asyncio.run(run())


def test_CL4_Q8_max_time_to_live_dead_letters_when_due_without_a_pull(
        js_gateways: Callable[..., Any], core_nats: Any) -> None:
    """Q8 maxTimeToLive (300 s at least): a message that has sat 400 s unconsumed moves to the
    CMQ dead-letter queue, though no gateway pulls its queue."""
    a, b, name = _setup(js_gateways, lambda n: {"x-cmq-dead-letter-queue": f"{n}.dlq",
                                                "x-cmq-max-time-to-live": 300})
    conn = pika.BlockingConnection(pika.URLParameters(_url(a)))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", name, b"old", pika.BasicProperties(delivery_mode=2))
    conn.sleep(1.5)
    assert _count(ch, name) == 1  # young: stays
    _age(core_nats.store_url, name, 400)
    _wait_count(ch, name, 0)
    _wait_count(ch, f"{name}.dlq", 1)
    assert [body for body, _ in _dead_letters(ch, f"{name}.dlq")] == [b"old"]
    conn.close()


def test_CL4_M7_ttl_ends_each_message_once_while_a_slow_consumer_pulls(js_gateways: Callable[..., Any]) -> None:
    """A slow consumer on one gateway pulls while the sweep ends the due heads: every message
    is either delivered or dead-lettered, never both, never twice."""
    a, b, name = _setup(js_gateways, lambda n: {"x-message-ttl": 400, **_dlx(n)})
    pub = pika.BlockingConnection(pika.URLParameters(_url(a)))
    pch = pub.channel()
    pch.confirm_delivery()
    sent = [b"s%02d" % i for i in range(30)]
    for body in sent:
        pch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
    con = pika.BlockingConnection(pika.URLParameters(_url(b)))
    cch = con.channel()
    cch.basic_qos(prefetch_count=1)
    delivered: list[bytes] = []
    deadline = time.monotonic() + 3
    for method, _props, body in cch.consume(name, inactivity_timeout=0.1):
        if method is not None:
            delivered.append(body)
            con.sleep(0.05)
            cch.basic_ack(method.delivery_tag)
        if time.monotonic() > deadline:
            break
    cch.cancel()
    _wait_count(pch, name, 0)
    pub.sleep(1.0)  # anything ended twice would arrive meanwhile
    dead = [body for body, _ in _dead_letters(pch, f"{name}.dlq")]
    assert sorted(delivered + dead) == sent
    assert dead, "nothing fell due: the test did not exercise the sweep"
    con.close()
    pub.close()
