from __future__ import annotations

import pytest

from gateway.broker import Broker
from semantics.clock import ManualClock


@pytest.fixture
async def broker():
    b = await Broker.open(None, clock=ManualClock())
    yield b
    await b.close()
