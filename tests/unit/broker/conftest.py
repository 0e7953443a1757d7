from __future__ import annotations

from typing import Any

import pytest

from gateway.broker import Broker, BrokerConfig
from semantics.clock import ManualClock


class Recorder:
    """An audit sink that keeps every record as (event, fields)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, vhost: str, **fields: Any) -> None:
        self.records.append((event, {"vhost": vhost, **fields}))

    def of(self, event: str) -> list[dict[str, Any]]:
        return [f for e, f in self.records if e == event]


@pytest.fixture
async def broker():
    b = await Broker.open(None, clock=ManualClock())
    yield b
    await b.close()


@pytest.fixture
def audit() -> Recorder:
    return Recorder()


@pytest.fixture
async def audited(audit: Recorder):
    b = await Broker.open(None, clock=ManualClock(), audit=audit)
    yield b
    await b.close()


@pytest.fixture
async def strict():
    b = await Broker.open(None, clock=ManualClock(), config=BrokerConfig(strict_names=True))
    yield b
    await b.close()
