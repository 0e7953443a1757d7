"""The per-second lag of a run (issue 28, aim 2's measure): the ages of the deliveries that
came in each second, read from the producer's stamp in each body."""

from __future__ import annotations

import socket

import pytest

from gateway.perf.config import RunConfig
from gateway.perf.runner import run
from gateway.perf.stats import LatencyHistogram

URI = "amqp://guest:guest@127.0.0.1:5672/"


def test_recent_max_is_the_largest_since_the_last_take_and_max_stays_cumulative() -> None:
    h = LatencyHistogram()
    for ns in (5_000, 900_000, 40_000):
        h.record_ns(ns)
    assert h.take_recent_max() == 900
    assert h.take_recent_max() == 0
    h.record_ns(7_000)
    assert h.take_recent_max() == 7
    assert h.max_us == 900


def test_percentile_since_counts_only_what_came_after_the_copy() -> None:
    h = LatencyHistogram()
    for _ in range(100):
        h.record_ns(2_000_000_000)  # 2 s, all before the copy
    before = list(h.counts)
    assert h.percentile_since(before, 50) is None
    for us in (10, 20, 30):
        h.record_ns(us * 1000)
    assert h.percentile_since(before, 50) == 20
    whole = h.percentile(50)
    assert whole is not None and whole > 1e6  # the whole run's median differs


@pytest.mark.rabbitmq
def test_every_second_of_a_run_carries_its_lag() -> None:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        pytest.fail("this test needs RabbitMQ on 127.0.0.1:5672 (guest/guest)")
    result = run(RunConfig(uri=URI, rate=200, duration=2.0, progress=False), None)
    assert result["errors"] == []
    rows = result["per_second"]
    assert [r["t"] for r in rows] == [1.0, 2.0]
    overall_max_s = result["latency_us"]["max"] / 1e6
    for r in rows:
        assert r["received"] > 0
        assert 0 <= r["lag_p50_s"] <= r["lag_max_s"] <= overall_max_s + 1e-6


@pytest.mark.rabbitmq
async def test_sndbuf_caps_the_producer_sockets_kernel_buffer() -> None:
    """The lag a flood shows is mostly the kernel's buffers; --sndbuf caps the producer's."""
    import socket as s

    from gateway.perf.client import AmqpClient, parse_uri

    plain = await AmqpClient.connect(parse_uri(URI))
    capped = await AmqpClient.connect(parse_uri(URI), sndbuf=65536)
    try:
        assert plain.transport is not None and capped.transport is not None
        size = capped.transport.get_extra_info("socket").getsockopt(s.SOL_SOCKET, s.SO_SNDBUF)
        assert 65536 <= size <= 4 * 65536  # Linux doubles it for its bookkeeping
        default = plain.transport.get_extra_info("socket").getsockopt(s.SOL_SOCKET, s.SO_SNDBUF)
        assert default != size
    finally:
        await plain.close()
        await capped.close()


@pytest.mark.rabbitmq
def test_a_run_with_a_capped_send_buffer_delivers_everything() -> None:
    result = run(RunConfig(uri=URI, rate=200, duration=1.0, sndbuf=65536, progress=False), None)
    assert result["errors"] == []
    assert result["config"]["sndbuf"] == 65536
    assert result["received"] == result["sent"] > 0
