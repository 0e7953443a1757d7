"""VHost._route's common case compiled (gateway/broker/_queue.c enqueue_lean) against its Python
reference (gateway.broker.vhost.py_enqueue_lean, which calls EmbeddedMessages.enqueue).

Random fanout publishes (transient and persistent, in a transport's read or not, under
confirms) to random queues (durable or not, x-max-length with reject-publish or drop-head,
x-message-ttl, a consumer or none, acks), some while the store is read-only (W5): the same
client bytes (deliveries, confirms), the same audit records, the same messages in each
queue's model, the same messages the topic keeps for retries, either way. The compiled loop
does the transient enqueue itself and hands durable ones, refusals and the rest to the
Python steps, so both paths are crossed. SPEC D1, D2, D7, M7, M10, M14, W5.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from gateway.broker import Broker, BrokerConfig
from gateway.broker import vhost as vhost_module
from semantics.clock import ManualClock
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare
from tests.unit.broker.twins import running

COMPILED = vhost_module.compiled_enqueue_lean()
needs_compiled = pytest.mark.skipif(COMPILED is None, reason="pure Python or no C build: no compiled twin to compare")




_QUEUE = st.fixed_dictionaries({
    "durable": st.booleans(),
    "max_length": st.none() | st.integers(1, 3),
    "overflow": st.sampled_from(["reject-publish", "drop-head"]),
    "ttl": st.none() | st.sampled_from([0, 5000]),
    "consumer": st.booleans(),
})
_OP = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 3), st.booleans(), st.sampled_from([0, 16, 300])),
    st.tuples(st.just("batch"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("ack"), st.booleans()),
    st.tuples(st.just("read_only"), st.booleans()),
    st.tuples(st.just("time"), st.sampled_from([1.0, 10.0])),
)


def _scenario(run: Any, queues: list[dict[str, Any]], ops: list[tuple[Any, ...]], confirm: bool) -> tuple[Any, ...]:

    async def go() -> tuple[Any, ...]:
        audit = Recorder()
        clock = ManualClock()
        broker = await Broker.open(None, clock=clock, audit=audit, config=BrokerConfig())
        try:
            c = Client(broker)
            c.open_channel()
            declare(c, C.Exchange.Declare(exchange="fx", exchange_type="fanout"))
            if confirm:
                declare(c, C.Confirm.Select())
            for i, spec in enumerate(queues):
                args: dict[str, Any] = {}
                if spec["max_length"] is not None:
                    args["x-max-length"] = spec["max_length"]
                    args["x-overflow"] = spec["overflow"]
                if spec["ttl"] is not None:
                    args["x-message-ttl"] = spec["ttl"]
                declare(c, C.Queue.Declare(queue=f"q{i}", durable=spec["durable"], arguments=args),
                        C.Queue.Bind(queue=f"q{i}", exchange="fx"))
                if spec["consumer"]:
                    declare(c, C.Basic.Consume(queue=f"q{i}", consumer_tag=f"c{i}"))
            seen = [bytes(c.conn.data_to_send())]
            ch = c.session.channels[1]
            for op in ops:
                kind = op[0]
                if kind == "publish":
                    for _ in range(op[1]):
                        c.publish(1, "fx", "", b"m" * op[3], delivery_mode=2 if op[2] else 1)
                elif kind == "batch":
                    broker.begin_batch()
                    for _ in range(op[1]):
                        c.publish(1, "fx", "", b"b", delivery_mode=2 if op[2] else 1)
                    broker.end_batch()
                elif kind == "ack":
                    if ch.unacked:
                        c.send(1, C.Basic.Ack(delivery_tag=max(ch.unacked) if op[1] else min(ch.unacked),
                                              multiple=op[1]))
                elif kind == "read_only":
                    broker.read_only = op[1]
                else:
                    broker.advance_time(op[1])
                seen.append(bytes(c.conn.data_to_send()))
            vh = broker.vhosts["/"]
            # the payload's store key and class too: a body left in the store only when a durable
            # queue is its one holder (EmbeddedMessages.enqueue, issue 15)
            models = {name: sorted((m.msg_id, m.state, m.receive_count, m.payload.key, type(m.payload).__name__)
                                   for m in q.cmq._messages.values())
                      for name, q in vh.queues.items()}
            ex = vh.exchanges["fx"]
            kept = None if ex.topic is None else sorted(ex.topic._retained)  # D2: kept for retries
            return seen, audit.records, models, kept
        finally:
            broker.read_only = False
            await broker.close()

    with running(vhost_module, "enqueue_lean", run):
        return asyncio.run(go())


@needs_compiled
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues=st.lists(_QUEUE, min_size=1, max_size=5), ops=st.lists(_OP, max_size=10), confirm=st.booleans())
def test_D1_compiled_enqueues_match_the_python_loop(queues, ops, confirm):
    assert _scenario(COMPILED, queues, ops, confirm) == _scenario(vhost_module.py_enqueue_lean, queues, ops, confirm)


@needs_compiled
def test_D1_the_common_path_is_the_compiled_ones():
    """A transient fanout's enqueues are the compiled loop's own (EmbeddedMessages.enqueue not
    called), with the same records and deliveries as the Python loop's."""
    from gateway.broker.storage import EmbeddedMessages

    calls = []
    original = EmbeddedMessages.enqueue

    def counting(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    queues = [{"durable": False, "max_length": None, "overflow": "drop-head", "ttl": None, "consumer": i % 2 == 0}
              for i in range(3)]
    ops = [("publish", 2, False, 16), ("batch", 2, False)]
    EmbeddedMessages.enqueue = counting  # type: ignore[method-assign]
    try:
        compiled = _scenario(COMPILED, queues, ops, False)
        assert calls == []
        python = _scenario(vhost_module.py_enqueue_lean, queues, ops, False)
        assert len(calls) == 12
    finally:
        EmbeddedMessages.enqueue = original  # type: ignore[method-assign]
    assert compiled == python
    assert len([r for r in compiled[1] if r[0] == "enqueue"]) == 12


def test_D1_the_gateway_uses_the_compiled_loop_where_built():
    from gateway.broker import queue as broker_queue

    if broker_queue.COMPILED is None:
        assert vhost_module.enqueue_lean is vhost_module.py_enqueue_lean
    else:
        assert vhost_module.enqueue_lean.__name__ == "enqueue_lean"
        assert type(vhost_module.enqueue_lean).__name__ == "builtin_function_or_method"
