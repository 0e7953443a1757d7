"""CL1/M7: a queue's count on JetStream is right after a gateway deleted its head (a due TTL,
x-max-length drop-head), even when a consumer info is answered while the delete is applied.

nats-server 2.11 onwards (still 2.15.1) miscounts then: the consumer's ``num_pending`` counts
the deleted message out twice and stays one short (2.10 does not). It was seen as a CI failure
of tests/cluster/test_cluster_ttl.py: a per-message TTL dead-lettered one message of two and
the declare-ok then counted 0. ``gateway.jetstream.head.undelivered`` makes the count good;
this provokes the race on a real server, as the gateways' count loops and declares do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StreamConfig

from gateway.jetstream.head import undelivered
from semantics.jetstream.names import CONSUMER
from tests.support.natsd import NatsCluster

TRIALS = 200
SHORT_SEEN = 3  # enough raw miscounts to know the race was provoked


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("count-nats"), 1) as cluster:
        yield cluster


async def _trials(url: str) -> tuple[list[int], list[int], tuple[int, ...]]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    raw, counted = [], []
    try:
        for i in range(TRIALS):
            stream = f"COUNT{i}"
            await js.add_stream(StreamConfig(name=stream, subjects=[f"count.{i}"],
                                             retention=RetentionPolicy.WORK_QUEUE))
            await js.add_consumer(stream, ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT,
                                                         deliver_policy=DeliverPolicy.ALL, max_deliver=-1))
            for body in (b"head", b"stays"):
                await js.publish(f"count.{i}", body)
            # The head deleted, and a consumer info asked while the delete is being applied.
            delete = asyncio.ensure_future(js.delete_msg(stream, 1))
            await asyncio.sleep(0)
            info = asyncio.ensure_future(js.consumer_info(stream, CONSUMER))
            await delete
            await info
            raw.append((await js.consumer_info(stream, CONSUMER)).num_pending)
            counted.append((await undelivered(js, stream, workqueue=True)).num_pending)
            await js.delete_stream(stream)
            if raw.count(0) >= SHORT_SEEN and len(raw) >= 20:
                break
        server = nc.connected_server_version
        version = (server.major, server.minor)
    finally:
        await nc.close()
    return raw, counted, version


def test_CL1_count_after_a_head_delete_is_right_despite_the_servers_race(server: NatsCluster) -> None:
    raw, counted, version = asyncio.run(_trials(server.urls[0]))
    assert counted == [1] * len(counted), f"counts after the delete: {counted}"
    if version >= (2, 11):
        # The server of the test extra: the race must have shown, or this proves nothing.
        assert raw.count(0) >= SHORT_SEEN, f"the race never showed in {len(raw)} trials ({version})"


def test_CL1_a_short_count_is_raised_only_when_it_stays_short(server: NatsCluster) -> None:
    """Without the race the raw count stands (no traffic: both readings agree with it)."""
    async def run() -> tuple[int, int]:
        nc = await nats.connect(server.urls[0])
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="PLAIN", subjects=["plain"], retention=RetentionPolicy.WORK_QUEUE))
        await js.add_consumer("PLAIN", ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT,
                                                      max_deliver=-1))
        for body in (b"a", b"b", b"c"):
            await js.publish("plain", body)
        sub = await js.pull_subscribe("plain", durable=CONSUMER, stream="PLAIN")
        (first,) = await sub.fetch(1)
        await first.nak(delay=30)  # leased and naked: not undelivered
        info = await undelivered(js, "PLAIN", workqueue=True)
        await nc.close()
        return info.num_pending, info.num_ack_pending
    assert asyncio.run(run()) == (2, 1)
