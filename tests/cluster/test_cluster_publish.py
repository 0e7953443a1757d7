"""CL3 on the pipelined publisher (gateway/jetstream/publisher.py): which JetStream replies
let a confirm (M14) go out, and pulls batched by the consumers' credit.

The end-to-end tests put a stand-in for the stream on the queue's subject (a plain NATS
subscriber on the real server, after the stream is deleted), so that the test decides what
each publish is answered with: the gateway, its AMQP client and NATS are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import aio_pika
import nats
import pytest
from nats.aio.msg import Msg

from gateway.broker.persistence import message_body
from gateway.jetstream.publisher import REFUSED, STORED, UNKNOWN, reading
from gateway.jetstream.queues import delivery_counts
from semantics.jetstream.names import queue_stream, queue_subject
from tests.support.natsd_interest import subscribed


def test_CL3_a_puback_counts_only_when_it_names_a_stream_sequence() -> None:
    """A duplicate with seq 0 is JetStream's staged id of an attempt not yet replicated
    (nats-server 2.9): not a proof of storage. An error is a refusal (basic.nack)."""
    assert reading(None, b'{"stream":"S","seq":12}') == STORED
    assert reading(None, b'{"stream":"S","seq":12,"duplicate": true}') == STORED
    assert reading(None, b'{"stream":"S","seq":0,"duplicate": true}') == UNKNOWN
    assert reading(None, b'{"stream":"S"}') == UNKNOWN
    assert reading({"Status": "503"}, b"") == UNKNOWN  # no responders: nobody stored it
    assert reading(None, b"") == UNKNOWN
    assert reading(None, b"[1]") == UNKNOWN
    assert reading(None, b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},'
                         b'"stream":"S","seq":0}') == REFUSED


def test_delivery_counts_read_as_nats_py_reads_them() -> None:
    """The pull path's own reading of a delivery's reply subject (both of JetStream's forms)."""
    for reply in ("$JS.ACK.CMQQ_a_1.cmq.3.17.12.1700000000000000000.41",
                  "$JS.ACK._.ACCHASH.CMQQ_a_1.cmq.3.17.12.1700000000000000000.41.rnd"):
        md = Msg.Metadata._from_reply(reply)
        assert delivery_counts(reply) == (md.num_delivered, md.sequence.consumer, md.num_pending) == (3, 12, 41)


async def _queue_with_stand_in(gw: Any, name: str) -> tuple[Any, str]:
    """``name`` declared (its stream ready), then its stream deleted: publishes to it reach
    only whoever subscribes to its subject. Returns a NATS client and that subject."""
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        ch = await conn.channel()
        await ch.declare_queue(name, durable=True)  # its -ok waits for the stream
    finally:
        await conn.close()
    nc = await nats.connect(gw.broker.link.nc.connected_url.geturl())
    await nc.jetstream().delete_stream(queue_stream("/", name))
    return nc, queue_subject("/", name)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def _eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        await asyncio.sleep(0.02)


async def test_CL3_a_duplicate_puback_without_a_sequence_is_no_confirm(js_gateways: Callable[..., Any]) -> None:
    """The first attempts are answered "duplicate, seq 0" (staged, not stored): no confirm;
    the gateway sends the same message again, same Nats-Msg-Id, and only the PubAck naming a
    sequence lets the basic.ack go out."""
    (gw,) = js_gateways(1)
    name = _name("dup0")
    nc, subject = await _queue_with_stand_in(gw, name)
    attempts: list[str] = []
    acked_at: list[float] = []

    async def stand_in(msg: Any) -> None:
        attempts.append(msg.headers["Nats-Msg-Id"])
        if len(attempts) < 3:
            await msg.respond(b'{"stream":"S","seq":0,"duplicate": true}')
        else:
            acked_at.append(time.monotonic())
            await msg.respond(b'{"stream":"S","seq":41}')

    await nc.subscribe(subject, cb=stand_in)
    await subscribed(nc)  # flush() alone: its PING may pass the SUB
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2), routing_key=name, timeout=30)
        confirmed_at = time.monotonic()
    finally:
        await conn.close()
        await nc.close()
    assert len(attempts) >= 3 and len(set(attempts)) == 1, attempts  # one message, resent
    assert acked_at and confirmed_at >= acked_at[0]


async def test_CL3_a_refused_puback_is_a_nack(js_gateways: Callable[..., Any]) -> None:
    """M14/L8: JetStream's error answer (here "maximum messages exceeded") is a basic.nack."""
    (gw,) = js_gateways(1)
    name = _name("refused")
    nc, subject = await _queue_with_stand_in(gw, name)

    async def stand_in(msg: Any) -> None:
        await msg.respond(json.dumps({"error": {"code": 503, "err_code": 10077,
                                                "description": "maximum messages exceeded"}}).encode())

    await nc.subscribe(subject, cb=stand_in)
    await subscribed(nc)  # flush() alone: its PING may pass the SUB
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ch.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2), routing_key=name,
                                              timeout=30)
    finally:
        await conn.close()
        await nc.close()


async def test_CL3_M14_no_confirm_passes_a_publish_whose_puback_has_not_come(
        js_gateways: Callable[..., Any]) -> None:
    """Five publishes on one channel; JetStream answers the 2nd to 5th at once and holds the
    1st: no confirm goes out (not even the later ones, whose PubAcks came) until the 1st's
    PubAck comes; then all five are confirmed. The stand-in sees them in publish order."""
    (gw,) = js_gateways(1)
    name = _name("order")
    nc, subject = await _queue_with_stand_in(gw, name)
    first: list[Any] = []
    seen: list[bytes] = []

    async def stand_in(msg: Any) -> None:
        if msg.data in seen:
            return  # a resend of the held one: it stays held
        seen.append(msg.data)
        if not first:
            first.append(msg)
        else:
            await msg.respond(json.dumps({"stream": "S", "seq": len(seen)}).encode())

    await nc.subscribe(subject, cb=stand_in)
    await subscribed(nc)  # flush() alone: its PING may pass the SUB
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        confirmed: list[int] = []

        async def one(i: int) -> None:
            await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode(), delivery_mode=2),
                                              routing_key=name, timeout=30)
            confirmed.append(i)

        tasks = [asyncio.create_task(one(i)) for i in range(5)]
        await _eventually(lambda: len(seen) == 5)
        await asyncio.sleep(0.5)  # the four PubAcks are in; their confirms must still wait
        assert confirmed == []
        await first[0].respond(b'{"stream":"S","seq":1}')
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert sorted(confirmed) == [0, 1, 2, 3, 4]
    finally:
        await conn.close()
        await nc.close()
    assert [next(i for i in range(5) if b"m%d" % i in payload) for payload in seen] == [0, 1, 2, 3, 4]


async def test_pulls_follow_the_consumers_credit_in_batches(js_gateways: Callable[..., Any]) -> None:
    """M11/Q2: a consumer acking one message at a time does not make one pull request per
    ack: credit is asked for a batch at a time (docs/CLUSTER.md, "Delivery")."""
    (gw,) = js_gateways(1)
    name = _name("batches")
    total = 600
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    nc = await nats.connect(gw.broker.link.nc.connected_url.geturl())
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(name, durable=True)
        await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(b"%d" % i, delivery_mode=2),
                                                           routing_key=name) for i in range(total)))
        requests: list[int] = []

        async def watch(msg: Any) -> None:
            requests.append(json.loads(msg.data).get("batch", 1))

        await nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{queue_stream('/', name)}.cmq", cb=watch)
        await subscribed(nc)  # flush() alone: its PING may pass the SUB
        cch = await conn.channel()
        await cch.set_qos(prefetch_count=100)
        got: list[bytes] = []
        cqueue = await cch.get_queue(name, ensure=False)

        async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(m.body)
            await m.ack()

        await cqueue.consume(on_message)
        await _eventually(lambda: len(got) == total, 60)
        assert sorted(int(b) for b in got) == list(range(total))
        assert sum(requests) >= total - 100
        assert max(requests) <= 100  # never more than the consumer's credit (Q2)
        # One request per ack would be ~600: credit is asked for as acks free it, a turn's at once.
        assert len(requests) < total // 2, requests
    finally:
        await conn.close()
        await nc.close()


async def test_CL3_a_publisher_is_not_read_while_jetstream_owes_many_pubacks(
        js_gateways: Callable[..., Any]) -> None:
    """Flow control (RabbitMQ's credit flow): a producer without confirms is not read from
    while the store owes more than FLOW_HIGH PubAcks, so the gateway holds a bounded number of
    unstored messages; once JetStream answers, reading goes on and every message is stored."""
    from gateway.transport import EVENTS_PER_TURN, FLOW_HIGH

    (gw,) = js_gateways(1)
    name = _name("flow")
    total = FLOW_HIGH * 3  # of 2 KB: more than the sockets' buffers hold

    def body(i: int) -> bytes:
        return (b"f%d " % i).ljust(2048, b".")

    nc, subject = await _queue_with_stand_in(gw, name)
    held: list[Any] = []
    stored: set[bytes] = set()
    answering = False

    async def stand_in(msg: Any) -> None:
        if not answering:
            held.append(msg)  # JetStream silent (a leader election, a slow disk)
            return
        stored.add(message_body(msg.data))
        await msg.respond(json.dumps({"stream": "S", "seq": len(stored)}).encode())

    await nc.subscribe(subject, cb=stand_in, pending_msgs_limit=-1, pending_bytes_limit=-1)
    await subscribed(nc)  # flush() alone: its PING may pass the SUB
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    publisher = gw.broker.messages.writes.publisher
    try:
        ch = await conn.channel(publisher_confirms=False)

        async def flood() -> None:
            for i in range(total):
                await ch.default_exchange.publish(aio_pika.Message(body(i), delivery_mode=2), routing_key=name)

        task = asyncio.create_task(flood())
        most = 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # JetStream silent: what does the gateway take in?
            most = max(most, publisher.pending)
            await asyncio.sleep(0.01)
        assert most > FLOW_HIGH // 2, most  # the flood did reach the store
        assert most <= FLOW_HIGH + EVENTS_PER_TURN, most  # and was not read past the mark
        assert not task.done()  # the producer is held back, not refused
        answering = True
        for msg in held:
            await stand_in(msg)
        await asyncio.wait_for(task, 120)
        await _eventually(lambda: len(stored) == total, 120)
    finally:
        await conn.close()
        await nc.close()
    assert stored == {body(i) for i in range(total)}


@pytest.mark.parametrize("refusing", [0, 1])
async def test_CL3_M14_a_message_one_of_whose_queues_refuses_it_is_nacked(
        js_gateways: Callable[..., Any], refusing: int) -> None:
    """A fanout to two queues, one of which JetStream refuses (its first or its second write:
    the confirm waits for the message's last write): basic.nack, never basic.ack."""
    (gw,) = js_gateways(1)
    names = [_name("fan-a"), _name("fan-b")]
    exchange_name = _name("fan")
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange(exchange_name, aio_pika.ExchangeType.FANOUT, durable=True)
        for n in names:
            q = await ch.declare_queue(n, durable=True)
            await q.bind(ex)
    finally:
        await conn.close()
    nc = await nats.connect(gw.broker.link.nc.connected_url.geturl())
    await nc.jetstream().delete_stream(queue_stream("/", names[refusing]))

    async def stand_in(msg: Any) -> None:
        await msg.respond(json.dumps({"error": {"code": 503, "err_code": 10077,
                                                "description": "maximum messages exceeded"}}).encode())

    await nc.subscribe(queue_subject("/", names[refusing]), cb=stand_in)
    await subscribed(nc)  # flush() alone: its PING may pass the SUB
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(exchange_name, ensure=False)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ex.publish(aio_pika.Message(b"x", delivery_mode=2), routing_key="", timeout=30)
    finally:
        await conn.close()
        await nc.close()
