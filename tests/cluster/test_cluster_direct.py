"""Direct delivery on JetStream (gateway.jetstream.direct, issue 28 aim 1): a transient message
on a non-durable queue whose consumer is on the publishing gateway skips the stream; whenever it
would be Active again it goes into the stream, for every gateway, flagged redelivered. What went
where is read from outside: the queue stream's last sequence (JetStream's own count of what was
ever stored in it)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Callable
from typing import Any

import aio_pika
import nats
import pika
import pytest
from nats.js.errors import NotFoundError

from gateway.config import CmqKey
from gateway.jetstream import messages as messages_mod
from semantics.jetstream.names import queue_stream
from tests.integration.cmq_gateway import ADMIN_ID, ADMIN_KEY, admin, users
from tests.support.natsd import NatsCluster

TRANSIENT = pika.BasicProperties(delivery_mode=1)
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _name(what: str) -> str:
    return f"direct-{what}-{uuid.uuid4().hex[:6]}"


def _conn(gw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))


def _last_seq(cluster: NatsCluster, queue: str) -> int:
    """The last sequence of the queue's stream: how many messages were ever stored in it."""
    async def read() -> int:
        nc = await nats.connect(cluster.store_url)
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + 10
            while True:
                try:
                    return int((await js.stream_info(queue_stream("/", queue))).state.last_seq)
                except NotFoundError:
                    assert time.monotonic() < deadline, f"no stream for {queue}"
                    await asyncio.sleep(0.05)
        finally:
            await nc.close()

    return asyncio.run(read())


def _until(what: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _consume_one(conn: pika.BlockingConnection, ch: Any, queue: str, body: bytes | None = None,
                 seconds: float = 20) -> tuple[Any, Any, bytes]:
    """One delivery to a consumer of ``ch``, cancelled after it (the delivery stays unacked);
    ``body``: published (transient) once the consumer is there."""
    got: list[tuple[Any, Any, bytes]] = []
    tag = ch.basic_consume(queue, lambda _c, m, p, b: got.append((m, p, b)))
    if body is not None:
        conn.channel().basic_publish("", queue, body, TRANSIENT)
    deadline = time.monotonic() + seconds
    while not got:
        assert time.monotonic() < deadline, f"nothing delivered from {queue}"
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got[0]


def test_a_transient_message_to_a_consumer_here_skips_the_stream(js_gateways: Callable[..., Any],
                                                                 core_nats: NatsCluster) -> None:
    (gw,) = js_gateways(1)
    name = _name("plain")
    conn = _conn(gw)
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, _p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pub = conn.channel()
    for i in range(20):
        pub.basic_publish("", name, b"m%d" % i, TRANSIENT)
        while len(got) <= i:
            conn.process_data_events(time_limit=0.05)
    assert got == [b"m%d" % i for i in range(20)]
    assert _last_seq(core_nats, name) == 0  # nothing was stored, nothing acked there
    assert gw.broker.messages.direct_count == 20
    declared = pub.queue_declare(name, passive=True)
    assert declared.method.message_count == 0
    conn.close()


@pytest.mark.parametrize("ahead", [0, 20])
async def test_FIFO_per_publisher_across_the_direct_and_stream_paths(js_gateways: Callable[..., Any],
                                                                   core_nats: NatsCluster, ahead: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer with a small prefetch, and few messages allowed to wait here for its credit
    (LOCAL_AHEAD, lowered: none, or 20): a burst's first messages go direct, the rest through
    the stream, and direct again once this gateway's stream messages came back; every message
    arrives in publish order."""
    monkeypatch.setattr(messages_mod, "LOCAL_AHEAD", ahead)
    (gw,) = js_gateways(1)
    name = _name("fifo")
    total = 3000
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        cch = await conn.channel()
        await cch.set_qos(prefetch_count=3)
        queue = await cch.declare_queue(name, durable=False)
        got: list[int] = []
        done = asyncio.Event()

        async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(int(m.body))
            await m.ack()
            if len(got) == total:
                done.set()

        await queue.consume(on_message)
        pconn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
        pch = await pconn.channel()
        i = 0
        burst = 1
        while i < total:
            n = min(burst, total - i)  # published together: one read of the gateway's
            await asyncio.gather(*(pch.default_exchange.publish(aio_pika.Message(b"%d" % k), routing_key=name)
                                   for k in range(i, i + n)))
            i += n
            burst = burst % 37 + 1
            await asyncio.sleep(0.002 * (burst % 4))
        await asyncio.wait_for(done.wait(), 120)
        await pconn.close()
        assert got == list(range(total))
        direct = gw.broker.messages.direct_count
        stored = await asyncio.to_thread(_last_seq, core_nats, name)
        assert direct > 0 and stored > 0, (direct, stored)  # both paths taken
        assert direct + stored == total
    finally:
        await conn.close()


@pytest.mark.parametrize("how", ["nack", "channel_close", "connection_close"])
def test_a_requeued_direct_message_goes_to_the_stream_for_every_gateway(js_gateways: Callable[..., Any],
                                                                         core_nats: NatsCluster, how: str) -> None:
    a, b = js_gateways(2)
    name = _name(how)
    conn = _conn(a)
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_qos(prefetch_count=1)
    method, _props, body = _consume_one(conn, ch, name, b"once")  # cancelled: only the delivery is held
    assert (body, method.redelivered) == (b"once", False)
    assert _last_seq(core_nats, name) == 0
    if how == "nack":
        ch.basic_nack(method.delivery_tag, requeue=True)
        conn.process_data_events(time_limit=0.1)
    elif how == "channel_close":
        ch.close()
    else:
        conn.close()
    _until(lambda: _last_seq(core_nats, name) == 1)  # in the stream now
    other = _conn(b)
    och = other.channel()
    declared = och.queue_declare(name, passive=True)
    assert declared.method.message_count == 1
    method, _props, body = _consume_one(other, och, name)
    assert (body, method.redelivered) == (b"once", True)
    och.basic_ack(method.delivery_tag)
    other.process_data_events(time_limit=0.1)
    assert och.queue_declare(name, passive=True).method.message_count == 0
    other.close()
    if conn.is_open:
        conn.close()


def test_a_direct_message_past_its_visibility_timeout_comes_back_through_the_stream(
        js_gateways: Callable[..., Any], core_nats: NatsCluster) -> None:
    (gw,) = js_gateways(1)
    name = _name("visibility")
    conn = _conn(gw)
    ch = conn.channel()
    ch.queue_declare(name, arguments={"x-cmq-visibility-timeout": 1})
    ch.basic_qos(prefetch_count=5)
    got: list[tuple[bytes, bool]] = []
    ch.basic_consume(name, lambda _c, m, _p, body: got.append((body, m.redelivered)))
    conn.channel().basic_publish("", name, b"late", TRANSIENT)
    deadline = time.monotonic() + 30
    while len(got) < 2:
        assert time.monotonic() < deadline, got
        conn.process_data_events(time_limit=0.05)
    assert got == [(b"late", False), (b"late", True)]
    assert _last_seq(core_nats, name) == 1
    conn.close()


@pytest.mark.parametrize("kind", ["durable_queue", "persistent_message", "switched_off"])
def test_what_must_be_stored_still_goes_through_the_stream(js_gateways: Callable[..., Any],
                                                           core_nats: NatsCluster, kind: str) -> None:
    (gw,) = js_gateways(1, **({"direct_delivery": False} if kind == "switched_off" else {}))
    name = _name(kind)
    conn = _conn(gw)
    ch = conn.channel()
    ch.queue_declare(name, durable=kind == "durable_queue")
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, _p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pub = conn.channel()
    for i in range(5):
        pub.basic_publish("", name, b"m%d" % i, PERSISTENT if kind == "persistent_message" else TRANSIENT)
        while len(got) <= i:
            conn.process_data_events(time_limit=0.05)
    assert got == [b"m%d" % i for i in range(5)]
    assert _last_seq(core_nats, name) == 5
    assert gw.broker.messages.direct_count == 0
    conn.close()


def test_counts_see_a_direct_message_as_unacked(js_gateways: Callable[..., Any], core_nats: NatsCluster) -> None:
    """declare-ok counts ready messages (none); the management API and CMQ's GetQueueAttributes
    count the direct delivery not yet acked as unacked / Inactive."""
    settings: dict[str, Any] = {
        "cmq_api_port": 0, "cmq_api_host": "127.0.0.1", "users": users(),
        "cmq_keys": {ADMIN_ID: CmqKey("admin", ADMIN_KEY)}, "management_port": 0, "management_host": "127.0.0.1"}
    (gw,) = js_gateways(1, **settings)
    cmq = admin(f"{gw.operator_scheme('CMQ API')}://{dict(gw.operator_addresses())['CMQ API']}")
    name = _name("counts")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", gw.port, credentials=pika.PlainCredentials("admin", "admin")))
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_qos(prefetch_count=1)
    method, _props, _body = _consume_one(conn, ch, name, b"held")
    assert _last_seq(core_nats, name) == 0
    assert conn.channel().queue_declare(name, passive=True).method.message_count == 0  # ready ones
    q = _management_queue(gw, name)
    assert (q["messages_ready"], q["messages_unacknowledged"], q["messages"]) == (0, 1, 1)
    attrs = cmq.ok("GetQueueAttributes", queueName=name)
    assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"]) == (0, 1)
    ch.basic_ack(method.delivery_tag)
    conn.process_data_events(time_limit=0.1)
    _until(lambda: _management_queue(gw, name)["messages"] == 0)
    attrs = cmq.ok("GetQueueAttributes", queueName=name)
    assert (attrs["activeMsgNum"], attrs["inactiveMsgNum"]) == (0, 0)
    conn.close()


def _management_queue(gw: Any, queue: str) -> dict[str, Any]:
    address = dict(gw.operator_addresses())["management API"]
    req = urllib.request.Request(f"http://{address}/api/queues/%2F/{queue}",
                                 headers={"Authorization": "Basic " + b64encode(b"admin:admin").decode()})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _deliveries(conn: pika.BlockingConnection, ch: Any, queue: str, prefetch: int, ack: bool,
                into: list[tuple[bytes, bool]]) -> str:
    """A consumer of ``queue`` on ``ch`` whose deliveries (body, redelivered) go to ``into``."""
    ch.basic_qos(prefetch_count=prefetch)

    def on(c: Any, m: Any, _p: Any, body: bytes) -> None:
        into.append((body, m.redelivered))
        if ack:
            c.basic_ack(m.delivery_tag)

    return str(ch.basic_consume(queue, on))


def _pump(conns: list[pika.BlockingConnection], until: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "timed out"
        for c in conns:
            c.process_data_events(time_limit=0.02)


def _waiting_on(gw: Any, core_nats: NatsCluster, queue: str, total: int) -> tuple[pika.BlockingConnection, Any,
                                                                                   list[tuple[bytes, bool]]]:
    """``total`` transient messages published on ``gw`` to a new non-durable queue whose only
    consumer, there, has prefetch 1 and acks nothing: the first is delivered, the others wait
    on ``gw`` for its credit (direct, in no stream)."""
    conn = _conn(gw)
    ch = conn.channel()
    ch.queue_declare(queue)
    got: list[tuple[bytes, bool]] = []
    _deliveries(conn, ch, queue, 1, False, got)
    pub = conn.channel()
    pub.confirm_delivery()
    for i in range(total):
        pub.basic_publish("", queue, b"%d" % i, TRANSIENT)
    _pump([conn], lambda: len(got) == 1)
    conn.process_data_events(time_limit=0.2)
    assert got == [(b"0", False)]
    assert gw.broker.messages.direct_count == total
    assert _last_seq(core_nats, queue) == 0  # all of them here only
    return conn, ch, got


def _in_order(seen: list[tuple[bytes, bool]]) -> bool:
    numbers = [int(b) for b, _r in seen]
    return numbers == sorted(numbers)


def test_direct_messages_waiting_here_go_to_a_consumer_that_appears_on_another_gateway(
        js_gateways: Callable[..., Any], core_nats: NatsCluster) -> None:
    """Issue 28: messages waiting on the publishing gateway for its slow consumer's credit are
    handed to the stream once another gateway's consumer appears, so that it takes them (as
    RabbitMQ round-robins over both); later publishes wait here no more."""
    a, b = js_gateways(2)
    name = _name("appears")
    total = 30
    conn, ch, on_a = _waiting_on(a, core_nats, name, total)
    other = _conn(b)
    on_b: list[tuple[bytes, bool]] = []
    _deliveries(other, other.channel(), name, 100, True, on_b)
    _pump([conn, other], lambda: len(on_b) == total - 1)
    assert on_b == [(b"%d" % i, False) for i in range(1, total)]  # never delivered: not redelivered
    assert _last_seq(core_nats, name) == total - 1  # handed back, each once
    assert on_a == [(b"0", False)]
    # Another gateway consumes now: a new publish on a, its consumer without credit, waits
    # here no more; either consumer takes it, each message once, each in publish order.
    pub = conn.channel()
    pub.confirm_delivery()
    more = 10
    for i in range(total, total + more):
        pub.basic_publish("", name, b"%d" % i, TRANSIENT)
    _pump([conn, other], lambda: len(on_b) == total - 1 + more)
    assert a.broker.messages.direct_count == total  # none of them waited on a
    ch.basic_ack(1)
    conn.process_data_events(time_limit=0.2)
    bodies = sorted(int(body) for body, _r in on_a + on_b)
    assert bodies == list(range(total + more))
    assert _in_order(on_a) and _in_order(on_b)
    assert not any(r for _b, r in on_a + on_b)
    conn.close()
    other.close()


def test_direct_messages_waiting_here_go_to_the_stream_when_the_last_consumer_here_goes(
        js_gateways: Callable[..., Any], core_nats: NatsCluster) -> None:
    a, b = js_gateways(2)
    name = _name("gone")
    total = 12
    conn, ch, on_a = _waiting_on(a, core_nats, name, total)
    # The pull a asked at basic.consume (credit 1, taken since by a direct message) has ended:
    # still waiting at the server, it would catch the first message handed back and return it
    # with a nak, flagged redelivered (readers_left hands back before its UNSUB is through).
    s = next(s for s in a.broker.messages.queue_streams() if s.q.name == name)
    _pump([conn], lambda: s.requested == 0)
    ch.basic_cancel(ch.consumer_tags[0])  # its delivery stays unacked; the waiting ones go
    _until(lambda: _last_seq(core_nats, name) == total - 1)
    other = _conn(b)
    on_b: list[tuple[bytes, bool]] = []
    _deliveries(other, other.channel(), name, 100, True, on_b)
    _pump([conn, other], lambda: len(on_b) == total - 1)
    assert on_b == [(b"%d" % i, False) for i in range(1, total)]
    conn.close()  # the unacked first one is requeued: into the stream, redelivered
    _pump([other], lambda: len(on_b) == total)
    assert on_b[-1] == (b"0", True)
    assert on_a == [(b"0", False)]
    other.close()
