"""A broker on each store, for the contract suites (each runs once per store)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from gateway.broker import Broker, BrokerConfig


@pytest_asyncio.fixture(loop_scope="function")
async def embedded_broker() -> AsyncIterator[Broker]:
    b = await Broker.open(None, config=BrokerConfig())
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture(loop_scope="function")
async def jetstream_broker(nats_single: Any) -> AsyncIterator[Any]:
    from gateway.jetstream.broker import ClusterBroker
    b = await ClusterBroker.open_cluster(nats_single.store_url, config=BrokerConfig())
    try:
        yield b
    finally:
        await b.close()
