"""A1: the ack record's latency_ms is round((ack time - publish time) * 1000, 3), the float
``round`` gives, whichever way Broker.ack computes it (it skips round's decimal conversion when
the value is not within a hair of a tie: near ties, past the float's spacing and for zero it
must still agree bit for bit, -0.0 and 0.0 apart)."""

from __future__ import annotations

import random

import pytest
from pamqp import commands as C

from gateway.broker import Broker
from semantics.clock import ManualClock
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare, deliveries


def _delays(seed: int) -> list[float]:
    """Seconds between publish and ack: near a tie of the third decimal of the milliseconds
    (k + 0.5 microseconds, where about one in six computed without the tie's guard comes out a
    thousandth off), anywhere, zero, and past ~19 h (the float's spacing; within the queue's
    4-day retention, Q1, so the message is still there to ack)."""
    rnd = random.Random(seed)
    ties = [(rnd.randrange(6 * 10**10) + 0.5) / 1e6 for _ in range(300)]
    tiny = [(rnd.randrange(1000) + 0.5) / 1e6 for _ in range(50)]
    anywhere = [rnd.uniform(0.0, 1e5) for _ in range(100)]
    long = [rnd.uniform(6.7e4, 3e5) for _ in range(20)]
    return [0.0, *ties, *tiny, *anywhere, *long, 0.0]


@pytest.mark.parametrize("start", [0.0, 1_700_000_000.0, 12.345])
async def test_A1_ack_latency_is_rounds_float(start: float):
    audit = Recorder()
    broker = await Broker.open(None, clock=ManualClock(start), audit=audit)
    try:
        c = Client(broker)
        c.open_channel()
        declare(c, C.Queue.Declare(queue="lat"))
        clock = broker.clock
        delays = _delays(int(start))
        for delay in delays:
            published = clock.now()
            c.publish(1, "", "lat", b"m")
            clock.advance(delay)  # type: ignore[attr-defined]
            c.send(1, C.Basic.Get(queue="lat"))
            [(ok, _, _)] = deliveries(c.read())
            c.send(1, C.Basic.Ack(delivery_tag=ok.delivery_tag))
            got = audit.of("ack")[-1]["latency_ms"]
            want = round((clock.now() - published) * 1000.0, 3)
            assert repr(got) == repr(want), (published, clock.now())
        assert len(audit.of("ack")) == len(delays)
    finally:
        await broker.close()
