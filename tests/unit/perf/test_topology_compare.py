"""Pattern topologies (who gets each message) and the compare table, without a broker."""

from __future__ import annotations

import pytest

from gateway.perf.compare import Row, markdown_table, metrics_of, text_table
from gateway.perf.scenarios import SCENARIOS, scenario_config
from gateway.perf.topology import Route, build_topology


def _topic_match(pattern: str, key: str) -> bool:
    """A reference matcher for T4, to check the topic bindings route as designed."""

    def m(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(m(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and (p[0] == "*" or p[0] == k[0]) and m(p[1:], k[1:])

    return m(pattern.split("."), key.split("."))


def test_queue_pattern_uses_the_default_exchange() -> None:
    t = build_topology("queue", "r1", 2, 5, durable=True)
    assert (t.exchange, t.exchange_type, t.bindings, t.deliveries_per_message) == ("", None, [], 1)
    assert t.routes == [Route("", "perf-r1-q0"), Route("", "perf-r1-q1")]


def test_fanout_binds_every_queue() -> None:
    t = build_topology("fanout", "r1", 3, 5, durable=False)
    assert t.bindings == [("perf-r1-q0", ""), ("perf-r1-q1", ""), ("perf-r1-q2", "")]
    assert (t.exchange_type, t.deliveries_per_message) == ("fanout", 3)


def test_direct_groups_share_a_key_so_each_message_reaches_k_of_n() -> None:
    t = build_topology("direct", "r1", 500, 5, durable=False)
    assert len(t.bindings) == 500 and len(t.routes) == 100
    for route in t.routes:
        assert sum(1 for _, key in t.bindings if key == route.routing_key) == 5


def test_tags_pattern_carries_k_tags_for_k_single_tag_subscriptions() -> None:
    t = build_topology("tags", "r1", 10, 5, durable=False)
    assert [k for _, k in t.bindings] == [f"tag{i}" for i in range(10)]
    assert t.routes[1] == Route("perf-r1-tags", "tag5", {"x-cmq-tags": ["tag6", "tag7", "tag8", "tag9"]})


def test_topic_bindings_use_star_and_hash_and_each_message_matches_exactly_k() -> None:
    t = build_topology("topic", "r1", 500, 5, durable=False)
    keys = [k for _, k in t.bindings]
    assert keys[:5] == ["g0.*.*", "g0.#", "g0.a.*", "g0.*.b", "g0.#.b"]
    for route in t.routes[:20]:
        assert sum(_topic_match(k, route.routing_key) for k in keys) == 5


@pytest.mark.parametrize(("pattern", "queues", "k"), [("direct", 10, 3), ("topic", 10, 6), ("fanout", 0, 1)])
def test_bad_shapes_are_refused(pattern: str, queues: int, k: int) -> None:
    with pytest.raises(ValueError):
        build_topology(pattern, "r1", queues, k, durable=False)


def test_scenarios_match_the_brief() -> None:
    s = {n: scenario_config(n, "amqp://x", 10.0) for n in SCENARIOS}
    assert (s[1].size, s[1].pattern, s[1].confirm, s[1].persistent) == (16, "queue", 0, False)
    assert (s[2].size, s[2].persistent, s[2].confirm, s[2].durable_queues) == (1024, True, 256, True)
    assert (s[3].pattern, s[3].queues) == ("fanout", 50)
    assert (s[4].pattern, s[4].queues, s[4].tag_fanout) == ("direct", 500, 5)
    assert scenario_config(4, "amqp://x", 10.0, native_tags=True).pattern == "tags"
    assert (s[5].pattern, s[5].queues, s[5].tag_fanout) == ("topic", 500, 5)
    assert (s[7].rate, s[7].producers) == (1000.0, 1)
    # 8: scenario 1's flood, and a prefetch-1 consumer acking 10 ms after each delivery.
    assert (s[8].size, s[8].pattern, s[8].rate, s[8].slow_ack_ms) == (16, "queue", 0.0, 10.0)
    assert [s[n].slow_ack_ms for n in range(1, 8)] == [0.0] * 7
    # 1-6 measure throughput: unlimited, whatever a plain run's default rate is (issue 12).
    assert [s[n].rate for n in range(1, 7)] == [0.0] * 6


def test_metrics_and_tables() -> None:
    result = {
        "rates": {"sent": 1000.0, "confirmed": 900.0, "received": 5000.0},
        "latency_us": {"p50": 1500.0, "p99": 3000.0},
        "config": {"confirm": 256},
    }
    assert metrics_of(2, result) == {
        "sent": ("msg/s", 1000.0),
        "confirmed": ("msg/s", 900.0),
        "received": ("deliveries/s", 5000.0),
        "latency p50": ("ms", 1.5),
        "latency p99": ("ms", 3.0),
    }
    assert metrics_of(7, result) == {"latency p50": ("ms", 1.5), "latency p99": ("ms", 3.0)}
    slow = {"received": 450, "rate": 45.0, "turnaround_us": {"p50": 2500.0, "p99": 40000.0}}
    assert metrics_of(8, result | {"slow": slow}) == {
        "slow consumer received": ("deliveries/s", 45.0),
        "slow turnaround p50": ("ms", 2.5),
        "slow turnaround p99": ("ms", 40.0),
        "flood received": ("deliveries/s", 5000.0),
    }
    rows = [Row(1, "sent", "msg/s", 2000.0, 1000.0), Row(7, "latency p99", "ms", 2.0, None)]
    assert rows[0].ratio == 0.5 and rows[1].ratio is None
    assert markdown_table(rows, "RabbitMQ", "gw").splitlines() == [
        "| # | scenario | metric | RabbitMQ | gw | gw / RabbitMQ |",
        "|---|---|---|---:|---:|---:|",
        "| 1 | transient 16 B, 1 producer, 1 consumer, default exchange | sent (msg/s) | 2,000 | 1,000 | 0.50 |",
        "| 7 | latency at a fixed 1,000 msg/s | latency p99 (ms) | 2 | - | - |",
    ]
    assert text_table(rows, "a", "b").splitlines()[1].split() == [
        "1",
        "sent",
        "msg/s",
        "2,000",
        "1,000",
        "0.50",
    ]
