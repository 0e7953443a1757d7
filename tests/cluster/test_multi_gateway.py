"""CL1: several gateways on one NATS JetStream cluster are one broker.

Three ``cmq-gateway serve --store nats://...`` processes on a three-node cluster (R3), each
with its own data and audit directory; clients are pika and aio-pika over real sockets. What
one gateway is told (a declare, a publish, an ack) the others see; messages published
through one are consumed through another, each exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter

import aio_pika
import pika
import pika.exceptions
import pytest

from tests.support.amqp_checks import (
    connection,
    drain,
    eventually,
    passive_exchange,
    passive_queue,
    publish_confirmed,
)
from tests.support.gateway_procs import GatewayGroup

# How long a declare may take to reach the other gateways (a KV watch: normally milliseconds).
SEEN_WITHIN = 10.0


def test_CL1_publish_confirmed_through_one_consumed_through_another_pika(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, _ = cluster_gateways
    with connection(gw1.url) as conn:
        conn.channel().queue_declare(unique, durable=True)
    bodies = [b"m%03d" % i for i in range(100)]
    publish_confirmed(gw1.url, "", unique, bodies)
    got = drain(gw2.url, unique, expect=100)
    assert sorted(b for b, _ in got) == bodies  # each once: no loss, no duplicate
    assert not any(redelivered for _, redelivered in got)
    # In publish order: one publisher, one queue (FIFO as on one gateway).
    assert [b for b, _ in got] == bodies
    assert eventually(lambda: passive_queue(gw1.url, unique) == (0, 0), SEEN_WITHIN,
                      what="the acks made on gw2 reach gw1's message count")


async def test_CL1_publish_through_one_consumed_through_another_aio_pika(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    _, gw2, gw3 = cluster_gateways
    pub = await aio_pika.connect(gw2.url)
    sub = await aio_pika.connect(gw3.url)
    try:
        pch = await pub.channel(publisher_confirms=True)
        await pch.declare_queue(unique, durable=True)
        for i in range(50):
            confirm = await pch.default_exchange.publish(
                aio_pika.Message(b"a%02d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                 headers={"n": i}), routing_key=unique)
            assert type(confirm).__name__ == "Ack", confirm  # aiormq raises on a nack
        sch = await sub.channel()
        await sch.set_qos(prefetch_count=10)
        queue = await eventually_async(lambda: sch.declare_queue(unique, passive=True))
        got: list[tuple[bytes, int]] = []

        async def consume() -> None:
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.headers["n"]))
                    if len(got) == 50:
                        break

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(consume(), 30)
        assert got == [(b"a%02d" % i, i) for i in range(50)]
    finally:
        await pub.close()
        await sub.close()


async def eventually_async(make, timeout: float = SEEN_WITHIN):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await make()
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


def test_CL1_a_declare_on_one_is_seen_by_the_others(cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    # Nothing yet anywhere: passive declares are 404 on every gateway.
    for gw in cluster_gateways:
        assert passive_queue(gw.url, unique) == 404
        assert passive_exchange(gw.url, unique + "-x") == 404
    with connection(gw1.url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique + "-x", "topic", durable=True)
        ch.queue_declare(unique, durable=True)
        ch.queue_bind(unique, unique + "-x", "orders.*.paid")
    for gw in (gw2, gw3):
        eventually(lambda gw=gw: passive_exchange(gw.url, unique + "-x") == 200, SEEN_WITHIN,
                   what=f"exchange on {gw.name}")
        eventually(lambda gw=gw: passive_queue(gw.url, unique) == (0, 0), SEEN_WITHIN,
                   what=f"queue on {gw.name}")
    # The binding made on gw1 routes what gw3 receives (routing is done where the publish lands).
    publish_confirmed(gw3.url, unique + "-x", "orders.eu.paid", [b"routed"])
    publish_confirmed(gw3.url, unique + "-x", "orders.eu.open", [b"not routed"])
    assert drain(gw2.url, unique, expect=1) == [(b"routed", False)]


def test_CL1_redeclare_with_other_arguments_is_406_on_another_gateway(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    """A queue's arguments are the cluster's, not one gateway's: declaring it differently
    elsewhere is the same 406 PRECONDITION_FAILED as on one broker."""
    gw1, gw2, _ = cluster_gateways
    with connection(gw1.url) as conn:
        conn.channel().queue_declare(unique, durable=True, arguments={"x-cmq-visibility-timeout": 40})
    eventually(lambda: passive_queue(gw2.url, unique) == (0, 0), SEEN_WITHIN)
    with connection(gw2.url) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(unique, durable=True, arguments={"x-cmq-visibility-timeout": 50})
    assert e.value.reply_code == 406


def test_CL1_a_delete_on_one_is_seen_by_the_others(cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    with connection(gw1.url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique + "-x", "fanout", durable=True)
        ch.queue_declare(unique, durable=True)
    eventually(lambda: passive_queue(gw3.url, unique) == (0, 0), SEEN_WITHIN)
    publish_confirmed(gw1.url, "", unique, [b"doomed"])
    with connection(gw2.url) as conn:
        ch = conn.channel()
        assert ch.queue_delete(unique).method.message_count == 1
        ch.exchange_delete(unique + "-x")
    for gw in (gw1, gw3):
        eventually(lambda gw=gw: passive_queue(gw.url, unique) == 404, SEEN_WITHIN, what=f"queue gone on {gw.name}")
        eventually(lambda gw=gw: passive_exchange(gw.url, unique + "-x") == 404, SEEN_WITHIN)
    # Declared again, it starts empty: the deleted queue's message is not resurrected.
    with connection(gw3.url) as conn:
        conn.channel().queue_declare(unique, durable=True)
    publish_confirmed(gw3.url, "", unique, [b"fresh"])
    assert drain(gw1.url, unique, expect=1) == [(b"fresh", False)]


def test_CL1_fanout_declared_on_one_bound_on_others_delivers_to_every_queue(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    with connection(gw1.url) as conn:
        conn.channel().exchange_declare(unique, "fanout", durable=True)
    for i, gw in enumerate((gw2, gw3)):
        eventually(lambda gw=gw: passive_exchange(gw.url, unique) == 200, SEEN_WITHIN)
        with connection(gw.url) as conn:
            ch = conn.channel()
            ch.queue_declare(f"{unique}-{i}", durable=True)
            ch.queue_bind(f"{unique}-{i}", unique)
    # Both bindings reach gw1 before it routes: publish only once they are there.
    eventually(lambda: all(passive_queue(gw1.url, f"{unique}-{i}") == (0, 0) for i in range(2)), SEEN_WITHIN)

    def routed_to_both() -> bool:
        publish_confirmed(gw1.url, unique, "", [b"probe"])
        return all(passive_queue(gw3.url, f"{unique}-{i}")[0] >= 1 for i in range(2))  # type: ignore[index]

    eventually(routed_to_both, SEEN_WITHIN, interval=0.5)
    for i in range(2):
        drain(gw2.url, f"{unique}-{i}", expect=1000, timeout=3)
    publish_confirmed(gw1.url, unique, "", [b"f1", b"f2", b"f3"])
    assert [b for b, _ in drain(gw3.url, f"{unique}-0", expect=3)] == [b"f1", b"f2", b"f3"]
    assert [b for b, _ in drain(gw1.url, f"{unique}-1", expect=3)] == [b"f1", b"f2", b"f3"]


def test_CL1_Q2_competing_consumers_on_two_gateways_get_each_message_once(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    """Q2 across gateways: consumers on gw1 and gw2 share one queue; every message is
    delivered to exactly one of them (acked at once, so none comes back)."""
    gw1, gw2, gw3 = cluster_gateways
    with connection(gw3.url) as conn:
        conn.channel().queue_declare(unique, durable=True, arguments={"x-cmq-visibility-timeout": 60})
    eventually(lambda: all(passive_queue(g.url, unique) == (0, 0) for g in (gw1, gw2)), SEEN_WITHIN)
    total = 300
    seen: dict[str, list[bytes]] = {"gw1": [], "gw2": []}
    stop = threading.Event()
    ready = threading.Barrier(3)

    def consume(gw_url: str, into: list[bytes]) -> None:
        with connection(gw_url) as conn:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=5)
            ready.wait()
            for method, _, body in ch.consume(unique, inactivity_timeout=0.2):
                if method is not None:
                    into.append(body)
                    time.sleep(0.002)  # a little work, so both consumers get a share
                    ch.basic_ack(method.delivery_tag)
                if stop.is_set():
                    break
            ch.cancel()

    threads = [threading.Thread(target=consume, args=(gw1.url, seen["gw1"])),
               threading.Thread(target=consume, args=(gw2.url, seen["gw2"]))]
    for t in threads:
        t.start()
    ready.wait()
    publish_confirmed(gw3.url, "", unique, [b"c%04d" % i for i in range(total)])
    eventually(lambda: len(seen["gw1"]) + len(seen["gw2"]) >= total, 60, what="every message consumed")
    time.sleep(1.0)  # anything delivered twice would arrive now
    stop.set()
    for t in threads:
        t.join(30)
    counts = Counter(seen["gw1"] + seen["gw2"])
    assert len(counts) == total and set(counts.values()) == {1}, counts.most_common(3)
    assert seen["gw1"] and seen["gw2"], {k: len(v) for k, v in seen.items()}


def test_CL1_M13_requeue_on_one_gateway_redelivers_through_another(
        cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, _ = cluster_gateways
    with connection(gw1.url) as conn:
        conn.channel().queue_declare(unique, durable=True, arguments={"x-cmq-visibility-timeout": 60})
    publish_confirmed(gw1.url, "", unique, [b"again"])
    with connection(gw1.url) as conn:
        ch = conn.channel()
        method, _, body = eventually(lambda: ch.basic_get(unique), SEEN_WITHIN)
        assert (body, method.redelivered) == (b"again", False)
        ch.basic_nack(method.delivery_tag, requeue=True)
        ch.basic_qos(prefetch_count=0)
        conn.process_data_events(0.2)
    # Requeued at once (M13), not after the 60 s visibility timeout, and marked redelivered.
    assert drain(gw2.url, unique, expect=1, timeout=10) == [(b"again", True)]


def test_CL1_basic_get_and_message_count_across_gateways(cluster_gateways: GatewayGroup, unique: str) -> None:
    gw1, gw2, gw3 = cluster_gateways
    with connection(gw1.url) as conn:
        conn.channel().queue_declare(unique, durable=True)
    publish_confirmed(gw1.url, "", unique, [b"g1", b"g2", b"g3"])
    eventually(lambda: passive_queue(gw2.url, unique) == (3, 0), SEEN_WITHIN, what="3 ready on gw2")
    with connection(gw2.url) as conn:
        ch = conn.channel()
        method, _, body = ch.basic_get(unique, auto_ack=True)
        assert body == b"g1"
    with connection(gw3.url) as conn:
        ch = conn.channel()
        bodies = []
        for _ in range(2):
            m, _, b = eventually(lambda ch=ch: ch.basic_get(unique, auto_ack=True), SEEN_WITHIN)
            bodies.append(b)
        assert bodies == [b"g2", b"g3"]
        assert ch.basic_get(unique)[0] is None
    eventually(lambda: passive_queue(gw1.url, unique) == (0, 0), SEEN_WITHIN)


def test_CL1_three_gateways_publish_and_consume_crosswise(cluster_gateways: GatewayGroup, unique: str) -> None:
    """Each gateway publishes a share into one topic exchange; each queue is consumed through
    a different gateway than any publisher of its share; every copy arrives once."""
    gws = list(cluster_gateways)
    with connection(gws[0].url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "topic", durable=True)
        for i in range(3):
            ch.queue_declare(f"{unique}-{i}", durable=True)
            ch.queue_bind(f"{unique}-{i}", unique, f"k.{i}.#")
    for gw in gws[1:]:
        eventually(lambda gw=gw: passive_queue(gw.url, f"{unique}-2") == (0, 0), SEEN_WITHIN)
    time.sleep(0.5)  # the bindings follow the queue records
    for p, gw in enumerate(gws):
        for i in range(3):
            publish_confirmed(gw.url, unique, f"k.{i}.from{p}", [b"%d-%d-%d" % (p, i, n) for n in range(20)])
    for i in range(3):
        got = drain(gws[(i + 1) % 3].url, f"{unique}-{i}", expect=60)
        assert sorted(b for b, _ in got) == sorted(b"%d-%d-%d" % (p, i, n) for p in range(3) for n in range(20))
