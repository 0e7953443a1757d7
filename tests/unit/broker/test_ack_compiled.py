"""Broker.ack compiled (gateway/broker/_queue.c, bound to each broker as ``broker.ack``) against
Broker.ack itself.

Random publishes (transient and persistent) to queues (durable or not, a short visibility
timeout so that deliveries come again and old tags' acks go stale, Q1/Q3), acks one by one and
multiple, nacks with requeue, time passing, in a transport's read or not: the same client
bytes, audit records (latencies included) and queue models either way. SPEC M12, Q3, A1.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from gateway.broker import Broker, BrokerConfig
from gateway.broker import broker as broker_module
from gateway.broker import vhost as vhost_module
from semantics.clock import ManualClock
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare

needs_compiled = pytest.mark.skipif(broker_module.bind_ack is None,
                                    reason="pure Python or no C build: no compiled twin to compare")

_OP = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 2), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 20), st.booleans(), st.booleans()),
    st.tuples(st.just("nack"), st.integers(0, 20)),
    st.tuples(st.just("time"), st.sampled_from([0.0004, 0.5, 3.0, 45.0])),
)


def _scenario(compiled: bool, durable: list[bool], ops: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    counter = itertools.count(1)

    async def go() -> tuple[Any, ...]:
        audit = Recorder()
        broker = await Broker.open(None, clock=ManualClock(), audit=audit, config=BrokerConfig())
        if not compiled:
            vars(broker).pop("ack", None)  # Broker.ack, the class's
        assert ("ack" in vars(broker)) == compiled
        try:
            c = Client(broker)
            c.open_channel()
            declare(c, C.Basic.Qos(prefetch_count=2))  # an ack frees credit for a waiting message (W4)
            for i, d in enumerate(durable):
                declare(c, C.Queue.Declare(queue=f"q{i}", durable=d, arguments={"x-cmq-visibility-timeout": 1}))
                declare(c, C.Basic.Consume(queue=f"q{i}", consumer_tag=f"c{i}"))
            seen = [bytes(c.conn.data_to_send())]
            ch = c.session.channels[1]
            delivered: list[int] = []
            for op in ops:
                kind = op[0]
                if kind == "publish":
                    for _ in range(op[2]):
                        c.publish(1, "", f"q{op[1] % len(durable)}", b"m", delivery_mode=2 if op[3] else 1)
                elif kind == "ack":
                    tags = sorted(set(delivered) | set(ch.unacked))
                    if tags:
                        tag = tags[op[1] % len(tags)]
                        if tag in ch.unacked or not op[2]:
                            if op[3]:
                                broker.begin_batch()
                            c.send(1, C.Basic.Ack(delivery_tag=tag, multiple=op[2]))
                            if op[3]:
                                broker.end_batch()
                elif kind == "nack":
                    if ch.unacked:
                        tags = sorted(ch.unacked)
                        c.send(1, C.Basic.Nack(delivery_tag=tags[op[1] % len(tags)], requeue=True))
                else:
                    broker.advance_time(op[1])
                delivered = sorted(set(delivered) | set(ch.unacked))
                seen.append(bytes(c.conn.data_to_send()))
            vh = broker.vhosts["/"]
            models = {name: sorted((m.msg_id, m.state, m.receive_count) for m in q.cmq._messages.values())
                      for name, q in vh.queues.items()}
            stored = sorted(broker.store.keys(""))  # a durable queue's persistent records, settled by acks
            return seen, audit.records, models, stored
        finally:
            await broker.close()

    saved = vhost_module.new_msg_id
    vhost_module.new_msg_id = lambda: f"id-{next(counter):06d}"
    try:
        return asyncio.run(go())
    finally:
        vhost_module.new_msg_id = saved


@needs_compiled
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(durable=st.lists(st.booleans(), min_size=1, max_size=3), ops=st.lists(_OP, max_size=14))
def test_M12_compiled_acks_match_broker_ack(durable, ops):
    assert _scenario(True, durable, ops) == _scenario(False, durable, ops)


@needs_compiled
def test_M12_acks_and_a_stale_one_are_recorded_alike():
    """An ack, and an ack of a delivery whose visibility ended and which was delivered again
    (stale, Q3): the same ack and stale_ack records from the compiled ack as from Broker.ack."""
    ops = [("publish", 0, 2, False), ("ack", 0, False, False), ("time", 45.0), ("ack", 1, False, True),
           ("ack", 2, False, True)]
    compiled = _scenario(True, [False], ops)
    assert compiled == _scenario(False, [False], ops)
    events = [e for e, _ in compiled[1]]
    assert events.count("ack") >= 1 and "stale_ack" in events


def test_M12_the_gateway_acks_through_the_compiled_ack_where_built():
    assert (broker_module.bind_ack is None) == (broker_module.compiled_ack() is None)
