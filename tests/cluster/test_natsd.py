"""The test harness's own nats-server processes (tests/support/natsd.py), checked with nats-py:
they are what every CL1-CL4 test stands on, so a harness that reports a cluster ready before
JetStream is, or restarts a node on another directory, would make those tests lie."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig

from tests.support.natsd import NatsCluster


async def _connect(cluster: NatsCluster) -> nats.NATS:
    return await nats.connect(servers=cluster.urls, connect_timeout=2, reconnect_time_wait=0.2,
                              max_reconnect_attempts=-1)


async def _put_and_count(cluster: NatsCluster, stream: str, bodies: list[bytes]) -> int:
    nc = await _connect(cluster)
    try:
        js = nc.jetstream(timeout=10)
        for body in bodies:
            await js.publish(f"{stream}.x", body, stream=stream)
        return (await js.stream_info(stream)).state.messages
    finally:
        await nc.close()


async def _stream_leader(cluster: NatsCluster, stream: str) -> str:
    nc = await _connect(cluster)
    try:
        info = await nc.jetstream(timeout=10).stream_info(stream)
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader
    finally:
        await nc.close()


async def _retry(coro_fn, seconds: float = 30.0):  # type: ignore[no-untyped-def]
    """A stream that lost its leader answers after a new election: retry until it does."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            return await coro_fn()
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)


async def test_single_node_has_jetstream(nats_single: NatsCluster) -> None:
    nc = await _connect(nats_single)
    try:
        js = nc.jetstream(timeout=10)
        info = await js.account_info()
        assert info.limits is not None
        await js.add_stream(StreamConfig(name="SINGLE", subjects=["SINGLE.>"]))
        ack = await js.publish("SINGLE.a", b"one")
        assert (ack.stream, ack.seq) == ("SINGLE", 1)
    finally:
        await nc.close()


async def test_an_R3_stream_keeps_its_messages_when_its_leader_is_killed(
        fresh_nats_cluster: NatsCluster) -> None:
    # A cluster of its own: the session's may hold dozens of queue streams by now, which a
    # restarted node must all catch up on before it counts as ready.
    cluster = fresh_nats_cluster
    nc = await _connect(cluster)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(StreamConfig(name="R3KILL", subjects=["R3KILL.>"], num_replicas=3))
    finally:
        await nc.close()
    assert await _put_and_count(cluster, "R3KILL", [b"a%d" % i for i in range(50)]) == 50
    leader = await _stream_leader(cluster, "R3KILL")
    cluster.kill9(leader)
    # Two of three keep a quorum: a new leader is elected, nothing acknowledged is gone, and
    # writes go on.
    count = await _retry(lambda: _put_and_count(cluster, "R3KILL", [b"after"]))
    assert count == 51
    assert await _stream_leader(cluster, "R3KILL") != leader
    cluster.restart(leader)
    # The restarted node catches up from the others (same store dir) and serves the stream again.
    cluster.kill9(await _stream_leader(cluster, "R3KILL"))
    assert await _retry(lambda: _put_and_count(cluster, "R3KILL", [])) == 51
    for s in cluster.servers:
        if not s.running:
            cluster.restart(s.name)


async def test_the_whole_cluster_restarts_on_its_own_directories(fresh_nats_cluster: NatsCluster) -> None:
    cluster = fresh_nats_cluster
    nc = await _connect(cluster)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(StreamConfig(name="R3ALL", subjects=["R3ALL.>"], num_replicas=3))
        kv = await js.create_key_value(bucket="META", history=1, replicas=3)
        await kv.put("q.one", b"declared")
    finally:
        await nc.close()
    assert await _put_and_count(cluster, "R3ALL", [b"m%d" % i for i in range(20)]) == 20
    ports = [s.port for s in cluster.servers]
    cluster.restart_all()  # SIGKILL all three, then start them again
    assert [s.port for s in cluster.servers] == ports
    assert all(s.starts == 2 for s in cluster.servers)
    assert await _retry(lambda: _put_and_count(cluster, "R3ALL", [])) == 20

    async def read_kv() -> bytes:
        nc = await _connect(cluster)
        try:
            entry = await (await nc.jetstream(timeout=10).key_value("META")).get("q.one")
            return entry.value or b""
        finally:
            await nc.close()

    assert await _retry(read_kv) == b"declared"


def test_store_url_lists_every_server(nats_cluster: NatsCluster) -> None:
    url = nats_cluster.store_url
    assert url.startswith("nats://") and url.count(",") == 2
    assert all(f"127.0.0.1:{s.port}" in url for s in nats_cluster.servers)
    assert 4222 not in {s.port for s in nats_cluster.servers}
    assert nats_cluster.replicas == 3


def test_a_server_that_cannot_start_is_reported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = NatsCluster(tmp_path, 1)
    cluster.servers[0].config.write_text("this is { not a config\n")
    with pytest.raises(RuntimeError, match="exited"):
        cluster.start(timeout=20)
    cluster.stop()
