"""pytest fixtures over tests/support/natsd.py. Import them where they are used:

    from tests.support.natsd_fixtures import *  # noqa: F401,F403

``nats_single`` and ``nats_cluster`` last the session and are shared by every test that only
reads and writes through them: such a test must leave every server running (a test that
kills one restarts it before it ends, or takes a ``fresh_*`` fixture instead). The
``fresh_nats_*`` fixtures start servers for one test, for faults that change the whole
cluster (restart_all) or that a later test must not see.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
    down = [s.name for s in nats_cluster.servers if not s.running]
    for name in down:
        nats_cluster.restart(name)
    nats_cluster.wait_ready()
    assert not down, f"the test left nats servers {down} down"


@pytest.fixture
def fresh_nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """A three-node cluster of this test's own, on new ports and dirs."""
    yield from _cluster(tmp_path_factory, 3, "nats-fresh-cluster")


@pytest.fixture
def fresh_nats_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from _cluster(tmp_path_factory, 1, "nats-fresh-single")
