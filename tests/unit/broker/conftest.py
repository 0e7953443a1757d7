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


def _profile(request: pytest.FixtureRequest) -> str:
    """PF1: ``@pytest.mark.profile("cmq")`` runs the test's broker under that profile; the
    default is the gateway's (compatible)."""
    marker = request.node.get_closest_marker("profile")
    return marker.args[0] if marker is not None else BrokerConfig.profile


@pytest.fixture
async def broker(request: pytest.FixtureRequest):
    b = await Broker.open(None, clock=ManualClock(), config=BrokerConfig(profile=_profile(request)))
    yield b
    await b.close()


@pytest.fixture
def audit() -> Recorder:
    return Recorder()


@pytest.fixture
async def audited(audit: Recorder, request: pytest.FixtureRequest):
    b = await Broker.open(None, clock=ManualClock(), audit=audit, config=BrokerConfig(profile=_profile(request)))
    yield b
    await b.close()


@pytest.fixture
async def strict(request: pytest.FixtureRequest):
    b = await Broker.open(None, clock=ManualClock(),
                          config=BrokerConfig(strict_names=True, profile=_profile(request)))
    yield b
    await b.close()
