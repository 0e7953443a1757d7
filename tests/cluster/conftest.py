"""Fixtures of cluster-core's tests (test_cluster_core_*.py): a one-node JetStream server on
free ports for each module, and in-process gateways on it (``gateway_in_thread(store=...)``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.server import gateway_in_thread
from tests.support.natsd import NatsCluster


@pytest.fixture(scope="module")
def core_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("core-nats"), 1) as cluster:
        yield cluster


@pytest.fixture
def js_gateways(core_nats: NatsCluster, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``start(n)``: n gateways on the module's NATS server, each on its own port and dirs."""
    with contextlib.ExitStack() as stack:
        count = 0

        def start(n: int = 1, **overrides: Any) -> list[Any]:
            nonlocal count
            gws = []
            for _ in range(n):
                count += 1
                gws.append(stack.enter_context(gateway_in_thread(
                    0, None, hosts=("127.0.0.1",), store=core_nats.store_url, **overrides)))
            return gws

        yield start
