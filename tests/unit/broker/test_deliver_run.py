"""Broker._dispatch_one's loop compiled (gateway/broker/_queue.c deliver_run) against its Python
reference (gateway.broker.channel.py_deliver_run, which calls Channel.deliver).

Random sequences of publishes (bodies empty to past a frame, some with properties), acks,
nacks with requeue (redeliveries), basic.qos per consumer and per channel (W4), channel.flow
off and on, and a channel closed under a consumer, over a consumer that acks or not and
receive metadata asked by the queue or the consumer (M11, PF5): the same client bytes, the
same audit records, the same unacked deliveries, delivery tags, credit counts and round-robin
position either way. The compiled run does the common delivery itself and hands every other
one to Channel.deliver, so both paths are crossed. SPEC M11, M12, M13, W4.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from gateway.broker import Broker, BrokerConfig
from gateway.broker import broker as broker_module
from gateway.broker import channel as channel_module
from semantics.clock import ManualClock
from tests.unit.broker.conftest import Recorder
from tests.unit.broker.helpers import Client, declare
from tests.unit.broker.twins import running

COMPILED = channel_module.compiled_deliver_run()
needs_compiled = pytest.mark.skipif(COMPILED is None, reason="pure Python or no C build: no compiled twin to compare")




_OP = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 4), st.sampled_from([0, 1, 16, 300, 140_000]), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("nack"), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("qos"), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("flow"), st.booleans()),
    st.tuples(st.just("batch"), st.integers(1, 3)),
)


def _scenario(run: Any, ops: list[tuple[Any, ...]], no_ack: bool, queue_metadata: bool, consumer_metadata: bool,
              prefetch: int, close_at: int | None) -> tuple[Any, ...]:
    """What a client and the audit log see, and the broker's delivery state, after ``ops``."""

    async def go() -> tuple[Any, ...]:
        audit = Recorder()
        broker = await Broker.open(None, clock=ManualClock(), audit=audit, config=BrokerConfig())
        try:
            c = Client(broker)
            c.open_channel()
            qargs = {"x-cmq-receive-metadata": True} if queue_metadata else None
            cargs = {"x-cmq-receive-metadata": True} if consumer_metadata else None
            declare(c, C.Queue.Declare(queue="q", arguments=qargs), C.Basic.Qos(prefetch_count=prefetch))
            declare(c, C.Basic.Consume(queue="q", consumer_tag="ct", no_ack=no_ack, arguments=cargs))
            seen: list[bytes] = [bytes(c.conn.data_to_send())]
            q = broker.vhosts["/"].queues["q"]
            ch = c.session.channels[1]
            for i, op in enumerate(ops):
                if i == close_at:
                    c.session.conn.close_channel(1, 406, "PRECONDITION_FAILED")  # the client's channel ends
                kind = op[0]
                if kind == "publish":
                    for n in range(op[1]):
                        props = {"content_type": "text/plain", "priority": n} if op[3] else {}
                        c.publish(1, "", "q", bytes(range(256)) * (op[2] // 256) + b"x" * (op[2] % 256), **props)
                elif kind in ("ack", "nack"):
                    tags = sorted(ch.unacked)
                    if tags:
                        tag = tags[op[1] % len(tags)]
                        method = C.Basic.Ack(delivery_tag=tag, multiple=op[2]) if kind == "ack" else \
                            C.Basic.Nack(delivery_tag=tag, multiple=op[2], requeue=True)
                        c.send(1, method)
                elif kind == "qos":
                    c.send(1, C.Basic.Qos(prefetch_count=op[1], global_=op[2]))
                elif kind == "flow":
                    c.send(1, C.Channel.Flow(active=op[1]))
                else:  # a transport's read: one dispatch at its end
                    broker.begin_batch()
                    for _ in range(op[1]):
                        c.publish(1, "", "q", b"batch")
                    broker.end_batch()
                seen.append(bytes(c.conn.data_to_send()))
            consumer = ch.consumers.get("ct")
            unacked = [(tag, u.queue.name, u.handle.message.msg_id, u.handle.handle, u.msg_id,
                        None if u.consumer is None else u.consumer.tag) for tag, u in ch.unacked.items()]
            return (seen, audit.records, unacked, ch.next_tag, None if consumer is None else consumer.unacked,
                    q._rr, q.cmq.active, q.cmq.inactive)
        finally:
            await broker.close()

    with running(broker_module, "deliver_run", run):
        return asyncio.run(go())


@needs_compiled
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_OP, max_size=14), no_ack=st.booleans(), queue_metadata=st.booleans(),
       consumer_metadata=st.booleans(), prefetch=st.integers(0, 3),
       close_at=st.none() | st.integers(0, 13))
def test_M11_compiled_deliveries_match_the_python_loop(ops, no_ack, queue_metadata, consumer_metadata, prefetch,
                                                      close_at):
    args = (ops, no_ack, queue_metadata, consumer_metadata, prefetch, close_at)
    assert _scenario(COMPILED, *args) == _scenario(channel_module.py_deliver_run, *args)


@needs_compiled
def test_M11_the_common_path_is_the_compiled_ones():
    """A plain run's deliveries are the compiled loop's own (Channel.deliver not called), and
    the same bytes and records as the Python loop's."""
    calls = []
    original = channel_module.Channel.deliver

    def counting(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    ops = [("publish", 3, 16, False), ("batch", 2), ("ack", 0, True), ("publish", 2, 300, True)]
    channel_module.Channel.deliver = counting  # type: ignore[method-assign]
    try:
        compiled = _scenario(COMPILED, ops, False, False, False, 0, None)
        assert calls == []
        python = _scenario(channel_module.py_deliver_run, ops, False, False, False, 0, None)
        assert len(calls) == 7
    finally:
        channel_module.Channel.deliver = original  # type: ignore[method-assign]
    assert compiled == python
    assert len([r for r in compiled[1] if r[0] == "deliver"]) == 7


def test_M11_the_gateway_uses_the_compiled_loop_where_built():
    """The broker's loop is the C one wherever gateway.broker.queue compiled (the Python one
    under CMQ_GATEWAY_PURE_PYTHON=1 or without a compiler)."""
    from gateway.broker import queue as broker_queue

    if broker_queue.COMPILED is None:
        assert broker_module.deliver_run is channel_module.py_deliver_run
    else:
        assert type(broker_module.deliver_run).__name__ == "builtin_function_or_method"
        assert broker_module.deliver_run.__name__ == "deliver_run"
