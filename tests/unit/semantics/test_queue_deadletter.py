"""Dead-letter policy (Q8)."""

from __future__ import annotations

from semantics.queue import CmqQueue, DeadLettered, Expired, MessageState, VisibilityExpired
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0


def test_Q8_moved_after_max_receive_count_receives() -> None:
    """Q8: with maxReceiveCount=3 the message is received 3 times, then moved instead of
    being received a 4th time."""
    q = CmqQueue("work", QueueAttributes(visibility_timeout=10, dead_letter_queue="work-dlq",
                                         max_receive_count=3))
    m = q.send(b"poison", 6, T0)
    for i in range(3):
        r = q.receive(T0 + 10 * i)
        assert r is not None and r.message is m and m.receive_count == i + 1
    assert q.receive(T0 + 29.9) is None
    assert q.tick(T0 + 30) == [VisibilityExpired(m)] * 3 + [DeadLettered(m, "work-dlq", "max_receive_count")]
    assert m.state is MessageState.REMOVED
    assert (q.active, q.inactive, q.retained) == (0, 0, 0)
    assert q.receive(T0 + 30) is None


def test_Q8_release_counts_towards_max_receive_count() -> None:
    """Q8/M13: a requeued message that reached maxReceiveCount is moved, not made Active."""
    q = CmqQueue("work", QueueAttributes(dead_letter_queue="dlq", max_receive_count=1))
    m = q.send(b"a", 1, T0)
    r = q.receive(T0)
    assert r is not None and q.release(r, T0 + 1)
    assert q.drain_events() == [DeadLettered(m, "dlq", "max_receive_count")]
    assert q.retained == 0


def test_Q8_moved_after_max_time_to_live_unconsumed() -> None:
    """Q8: a message not consumed within maxTimeToLive (300 s) is moved instead of expiring."""
    q = CmqQueue("work", QueueAttributes(msg_retention_seconds=3_600, dead_letter_queue="dlq",
                                         max_time_to_live=300))
    m = q.send(b"a", 1, T0)
    keep = q.send(b"b", 1, T0 + 100)
    assert q.next_wakeup() == T0 + 300
    assert q.tick(T0 + 299.999) == []
    assert q.tick(T0 + 300) == [DeadLettered(m, "dlq", "max_time_to_live")]
    assert keep.state is MessageState.ACTIVE and q.retained == 1
    assert q.tick(T0 + 400) == [DeadLettered(keep, "dlq", "max_time_to_live")]


def test_Q8_time_to_live_judges_a_received_message_when_it_comes_back() -> None:
    """Q8: while being processed (Inactive) a message is not moved; if it comes back Active
    past maxTimeToLive it is moved then; deleted in time it is never moved."""
    q = CmqQueue("work", QueueAttributes(visibility_timeout=400, dead_letter_queue="dlq",
                                         max_time_to_live=300))
    slow = q.send(b"slow", 1, T0)
    done = q.send(b"done", 1, T0)
    r_slow = q.receive(T0 + 1)
    r_done = q.receive(T0 + 1)
    assert r_slow is not None and r_done is not None
    assert q.tick(T0 + 300) == []
    assert q.delete(r_done, T0 + 350)
    assert q.tick(T0 + 401) == [VisibilityExpired(slow), DeadLettered(slow, "dlq", "max_time_to_live")]
    assert done.state is MessageState.REMOVED and q.retained == 0


def test_Q8_retention_shorter_than_time_to_live_expires_first() -> None:
    """Q8/Q1: maxTimeToLive beyond the retention never fires: the message expires."""
    q = CmqQueue("work", QueueAttributes(msg_retention_seconds=300, dead_letter_queue="dlq",
                                         max_time_to_live=600))
    m = q.send(b"a", 1, T0)
    assert q.tick(T0 + 300) == [Expired(m, "retention")]
