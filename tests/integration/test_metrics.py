"""Prometheus metrics over real HTTP after known workloads driven by aio-pika (SPEC D9, W5, T2)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import aio_pika
import aiohttp
import pytest_asyncio

from gateway.management.testing import OperatorGateway, operator_gateway


@pytest_asyncio.fixture(loop_scope="function")
async def og(tmp_path: object) -> AsyncIterator[OperatorGateway]:
    async with operator_gateway(str(tmp_path)) as g:
        yield g


async def scrape(og: OperatorGateway) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{og.metrics_url}/metrics") as r:
        assert (r.status, r.headers["Content-Type"]) == (200, "text/plain; version=0.0.4; charset=utf-8")
        text = await r.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r"(\S+) (\S+)", line)
            assert m is not None, line
            samples[m.group(1)] = float(m.group(2))
    return samples


async def test_D9_counters_and_gauges_after_a_workload(og: OperatorGateway) -> None:
    """Publish 5 (one unroutable), get 3, ack 1, requeue 1: every counter and gauge exact."""
    conn = await aio_pika.connect(og.amqp_url)
    async with conn:
        ch = await conn.channel()
        x = await ch.declare_exchange("shop", aio_pika.ExchangeType.DIRECT, durable=True)
        q = await ch.declare_queue("orders", durable=True)
        await q.bind(x, "order")
        for i in range(4):
            await x.publish(aio_pika.Message(f"o{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                            routing_key="order")
        await x.publish(aio_pika.Message(b"lost"), routing_key="nobody")  # T2: discarded no_match
        got = [await q.get(no_ack=False) for _ in range(3)]
        await got[0].ack()
        await got[1].nack(requeue=True)
        again = await q.get(no_ack=False)  # the requeued one: receive count 2
        await ch.declare_queue("orders", passive=True)  # a round trip: everything above is handled
        m = await scrape(og)
    v = '{vhost="/"}'
    assert m[f"cmq_gateway_published_total{v}"] == 5
    assert m[f"cmq_gateway_routed_total{v}"] == 4
    assert m['cmq_gateway_discarded_total{vhost="/",reason="no_match"}'] == 1
    assert m[f"cmq_gateway_delivered_total{v}"] == 4
    assert m[f"cmq_gateway_redelivered_total{v}"] == 1
    assert m[f"cmq_gateway_acked_total{v}"] == 1
    qv = '{vhost="/",queue="orders"}'
    assert (m[f"cmq_gateway_queue_messages_ready{qv}"], m[f"cmq_gateway_queue_messages_unacked{qv}"]) == (1, 2)
    assert m['cmq_gateway_topic_retained_messages{vhost="/",topic="shop"}'] == 0
    assert m['cmq_gateway_subscription_waiting_messages{vhost="/",topic="shop",subscription="q:orders"}'] == 0
    assert (m["cmq_gateway_connections"], m["cmq_gateway_channels"], m["cmq_gateway_resource_alarm"]) == (1, 1, 0)
    # Persistent messages in a durable queue were committed by the store (M14): timed.
    assert m["cmq_gateway_store_commit_seconds_count"] >= 1
    assert m['cmq_gateway_store_commit_seconds_bucket{le="+Inf"}'] == m["cmq_gateway_store_commit_seconds_count"]
    assert again.redelivered is True


async def test_D9_connections_and_channels_gauges_follow_clients(og: OperatorGateway) -> None:
    a = await aio_pika.connect(og.amqp_url)
    b = await aio_pika.connect(og.amqp_url)
    await a.channel()
    await a.channel()
    ch = await b.channel()
    await ch.declare_queue("probe", passive=False)
    m = await scrape(og)
    assert (m["cmq_gateway_connections"], m["cmq_gateway_channels"]) == (2, 3)
    await a.close()
    for _ in range(100):  # the server forgets a connection when its socket is gone (hang protection)
        m = await scrape(og)
        if m["cmq_gateway_connections"] == 1:
            break
        await asyncio.sleep(0.02)
    assert (m["cmq_gateway_connections"], m["cmq_gateway_channels"]) == (1, 1)
    await b.close()
