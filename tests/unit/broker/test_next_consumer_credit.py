"""W4: BrokerQueue.next_consumer's round-robin must be the one a reference written on
Consumer.has_credit gives, for every channel and consumer state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.broker.arguments import QueueArgs
from gateway.broker.channel import Channel
from gateway.broker.consumers import Consumer
from gateway.broker.queue import BrokerQueue
from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes

_channel_state = st.fixed_dictionaries({
    "flow_active": st.booleans(), "closing": st.booleans(), "committing": st.booleans(),
    "paused": st.booleans(), "channel_prefetch": st.integers(0, 3), "unacked": st.integers(0, 4),
    "tx_acks": st.integers(0, 2),
})
_consumer_state = st.fixed_dictionaries({
    "no_ack": st.booleans(), "prefetch": st.integers(0, 3), "unacked": st.integers(0, 4),
    "channel": st.integers(0, 2),
})


def _queue() -> BrokerQueue:
    return BrokerQueue("/", "q", durable=False, exclusive_owner=None, auto_delete=False, arguments={},
                       qargs=QueueArgs(), attrs=QueueAttributes(), cmq=CmqQueue("q"))


def _channel(state: dict[str, Any]) -> Channel:
    ch = Channel(SimpleNamespace(paused=state["paused"]), 1)  # type: ignore[arg-type]
    ch.flow_active, ch.closing, ch.committing = state["flow_active"], state["closing"], state["committing"]
    ch.channel_prefetch = state["channel_prefetch"]
    ch.unacked = dict.fromkeys(range(state["unacked"]))  # type: ignore[arg-type]
    ch.tx_acks = [None] * state["tx_acks"]  # type: ignore[list-item]
    return ch


def _reference_next(q: BrokerQueue) -> Consumer | None:
    """next_consumer as it was with Consumer.has_credit called."""
    n = len(q.consumers)
    for _ in range(n):
        if q._rr >= n:
            q._rr = 0
        c = q.consumers[q._rr]
        q._rr += 1
        if c.has_credit():
            return c
    return None


@settings(max_examples=400, deadline=None)
@given(st.lists(_channel_state, min_size=1, max_size=3), st.lists(_consumer_state, min_size=0, max_size=5),
       st.integers(0, 6), st.integers(1, 8))
def test_W4_next_consumer_inlined_credit_equals_has_credit(channels: list[dict[str, Any]],
                                                           consumers: list[dict[str, Any]], rr: int,
                                                           turns: int) -> None:
    chans = [_channel(s) for s in channels]
    inlined, reference = _queue(), _queue()
    for i, c in enumerate(consumers):
        ch = chans[c["channel"] % len(chans)]
        consumer = Consumer(f"c{i}", ch, inlined, no_ack=c["no_ack"], exclusive=False, prefetch=c["prefetch"])
        consumer.unacked = c["unacked"]
        inlined.consumers.append(consumer)
        reference.consumers.append(consumer)
    inlined._rr = reference._rr = rr
    for _ in range(turns):
        got, want = inlined.next_consumer(), _reference_next(reference)
        assert got is want
        assert inlined._rr == reference._rr
        if got is not None:  # a delivery uses the credit, as Channel.deliver counts it
            got.unacked += 1
