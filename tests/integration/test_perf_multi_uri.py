"""`cmq-gateway perf` with several URIs (issue 28, aim 3): connections are dealt over the
gateways of one cluster, producers and consumers each spread over them, and the consumers
read the queue the producers publish to through whichever gateway they landed on.

The dealing itself is checked from the gateways' side: during the run each gateway's
management API lists the connections and consumers it holds (real gateway processes on one
nats-server, real perf worker processes over real sockets)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gateway.perf.cli import build_parser, config_from_args
from gateway.perf.config import RunConfig
from gateway.perf.runner import _specs, deal, run
from gateway.perf.topology import build_topology
from tests.support.gateway_procs import GatewayGroup
from tests.support.natsd import NatsCluster

A, B, C = ("amqp://guest:guest@127.0.0.1:1/", "amqp://guest:guest@127.0.0.1:2/", "amqp://guest:guest@127.0.0.1:3/")


def test_uri_repeated_and_comma_lists_make_one_list() -> None:
    args = build_parser().parse_args(["--uri", A, "--uri", f"{B},{C}"])
    assert config_from_args(args).uri == f"{A},{B},{C}"
    assert config_from_args(build_parser().parse_args([])).uri == RunConfig().uri


@pytest.mark.parametrize(("n", "producers", "consumers", "expected"), [
    (1, 2, 2, ([0, 0], [0, 0])),
    (2, 1, 1, ([0], [1])),  # every message crosses from one gateway to the other
    (2, 2, 2, ([0, 1], [0, 1])),
    (3, 3, 3, ([0, 1, 2], [0, 1, 2])),
    (3, 2, 2, ([0, 1], [2, 0])),
])
def test_deal_spreads_each_role_round_robin(n: int, producers: int, consumers: int,
                                            expected: tuple[list[int], list[int]]) -> None:
    assert deal(n, producers, consumers) == expected


def test_worker_specs_carry_the_dealt_uri_of_each_connection() -> None:
    cfg = RunConfig(uri=f"{A},{B},{C}", producers=3, consumers=3, producer_processes=2, consumer_processes=2)
    specs = _specs(cfg, build_topology("queue", "x", 1, 5, False))
    for role in ("producer", "consumer"):
        got = sorted(u for s in specs if s.role == role for u in s.uris)
        assert got == [A, B, C], role
    for s in specs:
        assert len(s.uris) == len(s.routes) + len(s.queues)


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayGroup]:
    root = tmp_path_factory.mktemp("perf-multi-uri")
    with NatsCluster(root / "nats", 1) as nats:
        group = GatewayGroup(root, nats.store_url, 2)
        try:
            yield group.start()
        finally:
            group.stop()


class _Census(threading.Thread):
    """The most connections and perf consumers each gateway listed at once during the run."""

    def __init__(self, group: GatewayGroup, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.group, self.stop = group, stop
        self.connections = [0] * len(group)
        self.consumers = [0] * len(group)

    def run(self) -> None:
        while not self.stop.is_set():
            for i, gw in enumerate(self.group):
                try:
                    conns = requests.get(f"{gw.management_url}/api/connections", auth=("guest", "guest"), timeout=5)
                    cons = requests.get(f"{gw.management_url}/api/consumers", auth=("guest", "guest"), timeout=5)
                except requests.RequestException:
                    continue
                self.connections[i] = max(self.connections[i], len(conns.json()))
                perf = [c for c in cons.json() if c["queue"]["name"].startswith("perf-")]
                self.consumers[i] = max(self.consumers[i], len(perf))
            time.sleep(0.1)


def _counted(group: GatewayGroup, argv: list[str]) -> tuple[dict[str, Any], _Census]:
    """One perf run (100 msg/s per producer) with the gateways' census taken alongside."""
    stop = threading.Event()
    census = _Census(group, stop)
    census.start()
    try:
        return run(config_from_args(build_parser().parse_args([*argv, "--rate", "100", "--quiet"])), None), census
    finally:
        stop.set()
        census.join()


def test_CL1_perf_deals_producers_and_consumers_over_two_gateways(two_gateways: GatewayGroup) -> None:
    """Two producers and two consumers on two gateways: each gateway holds one producer and one
    consumer connection, and every message sent, through either gateway, is received."""
    result, census = _counted(two_gateways, ["--uri", two_gateways[0].url, "--uri", two_gateways[1].url,
                                             "--producers", "2", "--consumers", "2", "--duration", "3"])
    assert result["errors"] == []
    assert census.connections == [2, 2]
    assert census.consumers == [1, 1]
    assert result["sent"] > 0
    assert result["received"] == result["sent"]


def test_CL1_perf_crosses_gateways_with_one_producer_and_one_consumer(two_gateways: GatewayGroup) -> None:
    """One producer, one consumer, a comma list: the producer on the first gateway, the
    consumer on the second, so every message is published through one and consumed through
    the other."""
    result, census = _counted(two_gateways, ["--uri", ",".join(two_gateways.urls), "--duration", "2"])
    assert result["errors"] == []
    assert census.consumers == [0, 1]
    assert census.connections == [1, 1]
    assert result["received"] == result["sent"] > 0


def test_uri_list_is_shown_without_passwords() -> None:
    shown = RunConfig(uri=f"{A},{B}").public()["uri"]
    assert shown == "amqp://guest@127.0.0.1:1/,amqp://guest@127.0.0.1:2/"
