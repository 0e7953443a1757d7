"""Long polling (Q5)."""

from __future__ import annotations

import pytest

from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes
from semantics.waiters import Waiters

T0 = 1_700_000_000.0


def test_Q5_message_at_once_when_active() -> None:
    """Q5: with a message Active the receive returns it at once and nobody waits."""
    q = CmqQueue("q", QueueAttributes(polling_wait_seconds=20))
    w = Waiters()
    m = q.send("a", 1, T0)
    r = w.receive_or_wait(q, "c1", T0)
    assert r is not None and r.message is m
    assert len(w) == 0


def test_Q5_wakes_up_as_soon_as_a_message_is_active() -> None:
    """Q5: a long poll of 20 s is answered the moment a message is sent at +7 s."""
    q = CmqQueue("q", QueueAttributes(polling_wait_seconds=20))
    w = Waiters()
    assert w.receive_or_wait(q, "c1", T0) is None
    assert "c1" in w and w.next_deadline() == T0 + 20
    m = q.send("a", 1, T0 + 7)
    served = w.serve(q, T0 + 7)
    assert len(served) == 1 and served[0][0] == "c1" and served[0][1].message is m
    assert len(w) == 0 and w.next_deadline() is None
    assert w.expire(T0 + 20) == []


def test_Q5_empty_at_exactly_the_deadline() -> None:
    """Q5: with nothing Active the waiter gets empty when the wait ends, not before."""
    q = CmqQueue("q", QueueAttributes(polling_wait_seconds=30))
    w = Waiters()
    assert w.receive_or_wait(q, "c1", T0) is None
    assert w.expire(T0 + 29.999) == []
    assert w.expire(T0 + 30) == ["c1"]
    assert len(w) == 0
    # A message arriving after the deadline goes to nobody.
    q.send("late", 1, T0 + 31)
    assert w.serve(q, T0 + 31) == [] and q.active == 1


def test_Q5_deadline_wins_a_tie() -> None:
    """Q5: a message Active at the very instant of the deadline is too late for the waiter."""
    q = CmqQueue("q")
    w = Waiters()
    assert w.receive_or_wait(q, "c1", T0, wait=5) is None
    q.send("a", 1, T0 + 5)
    assert w.tick(q, T0 + 5) == (["c1"], [])


def test_Q5_earliest_waiter_first_and_delayed_message_wakes_it() -> None:
    """Q5: waiters are served in arrival order; a delay ending makes a message Active."""
    q = CmqQueue("q")
    w = Waiters()
    for token in ("c1", "c2", "c3"):
        assert w.receive_or_wait(q, token, T0, wait=30) is None
    assert w.cancel("c1") is True and w.cancel("c1") is False
    q.send("a", 1, T0, delay=10)
    q.send("b", 1, T0, delay=10)
    assert w.serve(q, T0 + 9) == []
    served = w.serve(q, T0 + 10)
    assert [(t, r.message.payload) for t, r in served] == [("c2", "a"), ("c3", "b")]


def test_Q5_zero_wait_does_not_register_and_duplicate_token_is_refused() -> None:
    """Q5: PollingWaitSeconds 0 is a plain receive; a token waits at most once."""
    q = CmqQueue("q")
    w = Waiters()
    assert w.receive_or_wait(q, "c1", T0) is None and len(w) == 0
    w.add("c1", T0 + 1)
    with pytest.raises(ValueError):
        w.add("c1", T0 + 2)


def test_Q5_a_new_waiter_behind_earlier_ones_takes_no_message_unseen() -> None:
    """Q5: a message sent while others wait stays Active until `serve` hands it out, and then
    goes to the earliest waiter; a newcomer queued behind them takes nothing meanwhile."""
    q = CmqQueue("q", QueueAttributes(polling_wait_seconds=20))
    w = Waiters()
    assert w.receive_or_wait(q, "first", T0) is None
    m = q.send("a", 1, T0 + 1)  # the caller has not called serve yet
    assert w.receive_or_wait(q, "second", T0 + 2) is None
    assert q.active == 1 and q.inactive == 0  # nothing taken with nobody told
    served = w.serve(q, T0 + 2)
    assert [(token, r.message) for token, r in served] == [("first", m)]
    assert "second" in w and q.inactive == 1
