"""Message delay (Q4) and the 20,000 in-flight rule (L8)."""

from __future__ import annotations

import pytest

from semantics import limits
from semantics.errors import LimitError
from semantics.queue import CmqQueue, DelayEnded, MessageState
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0


def test_Q4_delayed_message_invisible_for_exactly_its_delay() -> None:
    """Q4: DelaySeconds=45 keeps the message invisible for the first 45 s."""
    q = CmqQueue("orders")
    m = q.send(b"a", 1, T0, delay=45)
    assert m.state is MessageState.DELAYED and m.next_visible_time == T0 + 45
    assert (q.active, q.delayed, q.retained) == (0, 1, 1)
    assert q.next_wakeup() == T0 + 45
    assert q.receive(T0 + 44.999) is None
    assert q.tick(T0 + 45) == [DelayEnded(m)]
    assert (q.active, q.delayed) == (1, 0)
    r = q.receive(T0 + 45)
    assert r is not None and r.message is m


def test_Q4_queue_default_delay_and_explicit_zero() -> None:
    """Q4: the queue's DelaySeconds applies when the send gives none; 0 means no delay."""
    q = CmqQueue("orders", QueueAttributes(delay_seconds=10))
    delayed = q.send(b"a", 1, T0)
    now = q.send(b"b", 1, T0, delay=0)
    assert delayed.state is MessageState.DELAYED and delayed.next_visible_time == T0 + 10
    assert now.state is MessageState.ACTIVE


def test_Q4_L8_delay_out_of_range_refused() -> None:
    """Q4/L8: a delay above 3,600 s (or negative) is refused and nothing is stored."""
    q = CmqQueue("orders")
    assert q.send(b"a", 1, T0, delay=3_600).next_visible_time == T0 + 3_600
    for bad in (3_600.5, -1):
        with pytest.raises(LimitError) as info:
            q.send(b"a", 1, T0, delay=bad)
        assert (info.value.rule, info.value.value) == ("L8", bad)
    assert q.retained == 1


def test_Q4_delayed_messages_become_active_in_delay_order() -> None:
    """Q4: messages become receivable when their own delay ends, not in send order."""
    q = CmqQueue("orders")
    late = q.send(b"late", 1, T0, delay=20)
    early = q.send(b"early", 1, T0, delay=5)
    plain = q.send(b"plain", 1, T0)
    got = [q.receive(T0 + 30) for _ in range(3)]
    assert [r.message for r in got if r is not None] == [plain, early, late]


def test_L8_20000_in_flight_then_new_delayed_messages_wait_for_the_count_to_drop() -> None:
    """L8: at most 20,000 delayed messages are in flight; the next ones are accepted but stay
    invisible, even past their own delay, until the in-flight count drops."""
    assert limits.MAX_INFLIGHT_DELAYED == 20_000
    q = CmqQueue("orders")
    for _ in range(20_000):
        q.send(None, 1, T0, delay=100)
    assert (q.delayed, q.parked) == (20_000, 0)
    over = q.send(b"over", 1, T0 + 1, delay=1)
    assert over.state is MessageState.PARKED
    assert (q.delayed, q.parked, q.retained) == (20_001, 1, 20_001)
    assert q.receive(T0 + 99) is None  # its own delay ended at T0 + 2, but it is parked
    assert over.state is MessageState.PARKED
    # Not delayed messages are not in flight and flow as usual.
    plain = q.send(b"plain", 1, T0 + 99)
    r = q.receive(T0 + 99)
    assert r is not None and r.message is plain
    # At T0 + 100 the 20,000 end their delay: the first slot that frees admits the parked
    # one, whose own delay is long over, so it is Active right behind the first.
    events = q.tick(T0 + 100)
    assert len(events) == 20_001 and events[1] == DelayEnded(over)
    assert over.state is MessageState.ACTIVE
    assert (q.delayed, q.parked, q.active) == (0, 0, 20_001)


def test_L8_parked_message_keeps_the_rest_of_its_delay() -> None:
    """L8: admitted before its own delay ends, a parked message waits for the rest of it."""
    q = CmqQueue("orders")
    q.max_inflight = 2  # the rule with a small number; 20,000 is checked above
    q.send(b"1", 1, T0, delay=10)
    q.send(b"2", 1, T0, delay=50)
    parked = q.send(b"3", 1, T0, delay=30)
    parked_too = q.send(b"4", 1, T0, delay=1)
    assert (parked.state, parked_too.state) == (MessageState.PARKED, MessageState.PARKED)
    q.tick(T0 + 10)  # one slot frees: the oldest parked takes it with its own end, T0 + 30
    assert parked.state is MessageState.DELAYED and parked.next_visible_time == T0 + 30
    assert parked_too.state is MessageState.PARKED  # FIFO: it waits behind
    assert q.tick(T0 + 30)[0] == DelayEnded(parked)
    assert parked_too.state is MessageState.ACTIVE  # its delay was long over
    assert (q.delayed, q.parked, q.active) == (1, 0, 3)
