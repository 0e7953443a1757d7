"""RabbitMQ behaviour kept by the queue where CMQ is silent: requeue position (M13), TTL and
max-length (M7), purge, restore from the store."""

from __future__ import annotations

import pytest

from semantics.queue import (
    CmqQueue,
    DelayEnded,
    Expired,
    MaxLengthDropped,
    MaxLengthRejected,
    MessageState,
    VisibilityExpired,
)
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0


def _payloads(q: CmqQueue, now: float) -> list[object]:
    out = []
    while (r := q.receive(now)) is not None:
        out.append(r.message.payload)
    return out


def test_M13_release_is_active_at_once_at_its_original_position() -> None:
    """M13: nack/reject with requeue makes the message Active at once, ahead of later ones."""
    q = CmqQueue("q")
    for p in "abcd":
        q.send(p, 1, T0)
    ra = q.receive(T0)
    rb = q.receive(T0)
    assert ra is not None and rb is not None
    assert q.release(rb, T0 + 1) and q.release(ra, T0 + 1)
    assert rb.message.state is MessageState.ACTIVE and q.active == 4
    assert q.release(ra, T0 + 1) is False  # already Active: nothing to do
    assert q.delete(ra, T0 + 1) is False  # the released delivery's handle is over
    assert _payloads(q, T0 + 1) == ["a", "b", "c", "d"]


def test_M13_visibility_expiry_returns_to_original_position() -> None:
    """Q1/M13: a message whose visibility ended is received again before later messages."""
    q = CmqQueue("q", QueueAttributes(visibility_timeout=5))
    q.send("a", 1, T0)
    assert q.receive(T0) is not None
    q.send("b", 1, T0 + 1)
    assert _payloads(q, T0 + 5) == ["a", "b"]


def test_M13_drop_removes_and_returns_the_message() -> None:
    """M13: nack without requeue removes the message and hands it to the gateway."""
    q = CmqQueue("q")
    m = q.send("a", 1, T0)
    r = q.receive(T0)
    assert r is not None
    assert q.drop(r, T0) is m
    assert (q.retained, m.state) == (0, MessageState.REMOVED)


def test_M7_queue_ttl_expires_waiting_messages_at_exactly_ttl() -> None:
    """M7: x-message-ttl (ms) removes a message waiting in the queue that long."""
    q = CmqQueue("q", QueueAttributes(message_ttl_ms=1_500))
    m = q.send("a", 1, T0)
    assert m.expires_at == T0 + 1.5
    assert q.tick(T0 + 1.499) == []
    assert q.tick(T0 + 1.5) == [Expired(m, "ttl")]
    assert q.retained == 0


def test_M7_ttl_counts_after_the_delay_and_per_message_expiration_is_the_minimum() -> None:
    """M7: the queue TTL counts from when a delayed message enters the queue; a message's own
    expiration wins when sooner."""
    q = CmqQueue("q", QueueAttributes(message_ttl_ms=10_000))
    delayed = q.send("d", 1, T0, delay=5)
    sooner = q.send("s", 1, T0, expires_at=T0 + 2)
    assert (delayed.expires_at, sooner.expires_at) == (T0 + 15, T0 + 2)
    assert q.tick(T0 + 5) == [Expired(sooner, "ttl"), DelayEnded(delayed)]
    assert q.tick(T0 + 15) == [Expired(delayed, "ttl")]


def test_M7_ttl_does_not_expire_an_unacked_message_until_it_comes_back() -> None:
    """M7: as in RabbitMQ an unacked message does not expire; requeued past its TTL it does."""
    q = CmqQueue("q", QueueAttributes(message_ttl_ms=1_000, visibility_timeout=10))
    m = q.send("a", 1, T0)
    r = q.receive(T0 + 0.5)
    assert r is not None
    assert q.tick(T0 + 5) == []
    assert m.state is MessageState.INACTIVE
    assert q.tick(T0 + 10.5) == [VisibilityExpired(m), Expired(m, "ttl")]
    assert q.retained == 0


def test_M7_max_length_drop_head_returns_the_dropped_head() -> None:
    """M7: x-max-length 2 with drop-head: the third send drops the oldest ready message."""
    q = CmqQueue("q", QueueAttributes(max_length=2))
    a = q.send("a", 1, T0)
    q.send("b", 1, T0)
    assert q.drain_events() == []
    q.send("c", 1, T0)
    assert q.drain_events() == [MaxLengthDropped(a)]
    assert (q.active, q.retained, a.state) == (2, 2, MessageState.REMOVED)
    assert _payloads(q, T0) == ["b", "c"]


def test_M7_max_length_counts_ready_messages_only() -> None:
    """M7: unacked (Inactive) messages do not count towards x-max-length, as in RabbitMQ."""
    q = CmqQueue("q", QueueAttributes(max_length=1, overflow="reject-publish"))
    q.send("a", 1, T0)
    assert q.receive(T0) is not None
    assert q.send("b", 1, T0).payload == "b"
    with pytest.raises(MaxLengthRejected) as info:
        q.send("c", 1, T0)
    assert info.value.rule == "M7"
    assert (q.active, q.inactive, q.retained) == (1, 1, 2)


def test_purge_removes_ready_and_delayed_but_not_unacked() -> None:
    """M7 (RabbitMQ queue.purge): ready and delayed messages go, unacked ones stay."""
    q = CmqQueue("q")
    a = q.send("a", 1, T0)
    b = q.send("b", 1, T0)
    d = q.send("d", 1, T0, delay=60)
    r = q.receive(T0)
    assert r is not None and r.message is a
    gone = q.purge(T0)
    assert gone == [b, d]
    assert (q.active, q.inactive, q.delayed, q.retained) == (0, 1, 0, 1)
    assert q.next_wakeup() == T0 + 30  # only a's visibility timer is left
    assert q.delete(r, T0)


def test_restore_keeps_id_enqueue_time_and_receive_count() -> None:
    """Q7/M13: recovery from the store keeps the metadata; the message is Active again."""
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=600))
    m = q.restore(b"a", 1, T0 + 100, msg_id="msg-00ff", enqueue_time=T0, receive_count=2,
                  first_receive_time=T0 + 1)
    assert (m.msg_id, m.enqueue_time, m.receive_count, m.first_receive_time, m.state) == (
        "msg-00ff", T0, 2, T0 + 1, MessageState.ACTIVE)
    delayed = q.restore(b"d", 1, T0 + 100, msg_id="msg-0100", enqueue_time=T0 + 90, visible_at=T0 + 120)
    assert delayed.state is MessageState.DELAYED and q.delayed == 1
    r = q.receive(T0 + 100)
    assert r is not None and r.message is m and m.receive_count == 3
    assert q.next_wakeup() == T0 + 120
    assert q.tick(T0 + 600)[-1] == Expired(m, "retention")  # retention from the original enqueue time
