"""pytest fixtures over tests/support/natsd.py. Import them where they are used:

    from tests.support.natsd_fixtures import *  # noqa: F401,F403

``nats_single`` and ``nats_cluster`` last the session and are shared by every test that only
reads and writes through them: such a test must leave every server running (a test that
kills one restarts it before it ends, or takes a ``fresh_*`` fixture instead). The
``fresh_nats_*`` fixtures start servers for one test, for faults that change the whole
cluster (restart_all) or that a later test must not see.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.gateway_procs import GatewayGroup, GatewayProcess
from tests.support.natsd import NatsCluster


def _cluster(tmp_path_factory: pytest.TempPathFactory, size: int, name: str) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp(name), size) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def nats_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """One JetStream server (R1) for the session."""
    yield from _cluster(tmp_path_factory, 1, "nats-single")


@pytest.fixture(scope="session")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """A three-node JetStream cluster (R3) for the session. A test that kills a node must
    restart it (``nats_cluster.restart(i)``) before it ends; the fixture checks that."""
    yield from _cluster(tmp_path_factory, 3, "nats-cluster")


@pytest.fixture
def nats_cluster_intact(nats_cluster: NatsCluster) -> Iterator[NatsCluster]:
    """The session cluster, checked whole after the test (a node left down would skew the
    next test's numbers), and brought back whole if it was not."""
    yield nats_cluster
    down = nats_cluster.revive()
    assert not down, f"the test left nats servers {down} down"


@pytest.fixture
def fresh_nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """A three-node cluster of this test's own, on new ports and dirs."""
    yield from _cluster(tmp_path_factory, 3, "nats-fresh-cluster")


@pytest.fixture
def fresh_nats_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from _cluster(tmp_path_factory, 1, "nats-fresh-single")


@pytest.fixture(scope="session")
def cluster_gateways(nats_cluster: NatsCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayGroup]:
    """Three gateway processes on the session's three-node cluster, for tests that do not kill
    them (a test that kills or restarts one takes ``spawn_gateways`` instead).

    CMQ_CLUSTER_SELFCHECK=1 checks the tests themselves instead: the three are one embedded
    gateway, a single broker, where every CL1 expectation must hold trivially."""
    if os.environ.get("CMQ_CLUSTER_SELFCHECK"):
        one = GatewayProcess(tmp_path_factory.mktemp("selfcheck-gateway"), "gw")
        with one:
            group = GatewayGroup(tmp_path_factory.mktemp("unused"), None, 0)
            group.gateways = [one, one, one]
            yield group
        return
    with GatewayGroup(tmp_path_factory.mktemp("cluster-gateways"), nats_cluster.store_url, 3) as group:
        yield group


@pytest.fixture
def spawn_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., GatewayGroup]]:
    """``spawn_gateways(store_url, count)``: gateways of this test's own, stopped after it."""
    groups: list[GatewayGroup] = []

    def spawn(store: str | None, count: int = 2, **kwargs: Any) -> GatewayGroup:
        group = GatewayGroup(tmp_path_factory.mktemp("gateways"), store, count, **kwargs)
        groups.append(group)
        return group.start()

    yield spawn
    for group in groups:
        group.stop()
