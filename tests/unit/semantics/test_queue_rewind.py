"""Message rewind (Q6)."""

from __future__ import annotations

import pytest

from semantics.errors import CMQError
from semantics.queue import CmqQueue, Expired, MessageState, RewindableRemoved
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0


def _consume_all(q: CmqQueue, now: float) -> list[bytes]:
    out = []
    while (r := q.receive(now)) is not None:
        out.append(r.message.payload)
        assert q.delete(r, now)
    return out


def _rewind_queue() -> CmqQueue:
    return CmqQueue("ledger", QueueAttributes(msg_retention_seconds=86_400, rewind_seconds=3_600))


def test_Q6_deleted_messages_are_kept_as_rewindable() -> None:
    """Q6: with rewindSeconds > 0 a delete keeps the message as rewindable."""
    q = _rewind_queue()
    m = q.send(b"a", 1, T0)
    assert _consume_all(q, T0) == [b"a"]
    assert m.state is MessageState.DELETED
    assert (q.retained, q.rewindable, q.get(m.msg_id)) == (0, 1, m)


def test_Q6_rewind_returns_messages_in_production_order_not_deletion_order() -> None:
    """Q6: after a rewind to T every message produced at or after T is received again, in
    production-time order, whatever the order of deletion."""
    q = _rewind_queue()
    msgs = [q.send(bytes([65 + i]), 1, T0 + i) for i in range(5)]  # A..E at T0..T0+4
    receipts = [q.receive(T0 + 10) for _ in range(5)]
    for r in reversed(receipts):  # deleted E first, A last
        assert r is not None and q.delete(r, T0 + 10)
    pending = q.send(b"F", 1, T0 + 11)  # never consumed
    assert q.rewind(T0 + 2, T0 + 20) == 3  # C, D, E come back
    assert _consume_all(q, T0 + 20) == [b"C", b"D", b"E", b"F"]
    assert msgs[0].state is MessageState.DELETED and pending.state is MessageState.DELETED
    assert msgs[2].receive_count == 2


def test_Q6_rewind_no_older_than_now_minus_rewind_seconds() -> None:
    """Q6: T must be no older than now - rewindSeconds (3,600 s here)."""
    q = _rewind_queue()
    q.send(b"a", 1, T0)
    _consume_all(q, T0)
    now = T0 + 4_000
    with pytest.raises(CMQError) as info:
        q.rewind(now - 3_600.001, now)
    assert info.value.rule == "Q6"
    assert q.rewind(now - 3_600, now) == 0  # T0 + 400: the message at T0 is out of range


def test_Q6_rewind_moves_forward_only() -> None:
    """Q6: after rewinding to B one may rewind to C > B, never back to A < B."""
    q = _rewind_queue()
    for i in range(3):
        q.send(bytes([65 + i]), 1, T0 + i)
    _consume_all(q, T0 + 10)
    assert q.rewind(T0 + 1, T0 + 10) == 2
    _consume_all(q, T0 + 10)
    with pytest.raises(CMQError) as info:
        q.rewind(T0, T0 + 10)
    assert info.value.rule == "Q6" and "forward only" in str(info.value)
    assert q.rewind(T0 + 1, T0 + 10) == 2  # the same point again is not backwards
    _consume_all(q, T0 + 10)
    assert q.rewind(T0 + 2, T0 + 10) == 1
    assert _consume_all(q, T0 + 10) == [b"C"]


def test_Q6_rewind_refused_when_off() -> None:
    """Q6: a queue without rewind cannot be rewound; its deleted messages are gone."""
    q = CmqQueue("plain")
    m = q.send(b"a", 1, T0)
    _consume_all(q, T0)
    assert m.state is MessageState.REMOVED and q.rewindable == 0
    with pytest.raises(CMQError) as info:
        q.rewind(T0, T0 + 1)
    assert info.value.rule == "Q6"


def test_Q6_turning_rewind_off_drops_rewindable_messages() -> None:
    """Q6 "Disable": the rewindable messages are deleted at once and cannot be rewound."""
    q = _rewind_queue()
    kept = q.send(b"kept", 1, T0)
    a = q.send(b"a", 1, T0)
    b = q.send(b"b", 1, T0)
    rk = q.receive(T0)
    ra = q.receive(T0)
    rb = q.receive(T0)
    assert rk is not None and ra is not None and rb is not None
    assert q.delete(ra, T0) and q.delete(rb, T0) and q.release(rk, T0)
    assert (q.retained, q.rewindable) == (1, 2)
    q.set_rewind_seconds(0, T0 + 1)
    assert q.tick(T0 + 1) == [RewindableRemoved(a, "rewind_off"), RewindableRemoved(b, "rewind_off")]
    assert (q.retained, q.rewindable) == (1, 0)
    assert (a.state, b.state, kept.state) == (MessageState.REMOVED, MessageState.REMOVED, MessageState.ACTIVE)
    with pytest.raises(CMQError):
        q.rewind(T0, T0 + 1)


def test_Q6_rewindable_messages_end_with_their_retention() -> None:
    """Q6: a rewindable message is kept until its retention ends, then removed."""
    q = CmqQueue("ledger", QueueAttributes(msg_retention_seconds=600, rewind_seconds=600))
    m = q.send(b"a", 1, T0)
    _consume_all(q, T0 + 1)
    assert q.next_wakeup() == T0 + 600
    assert q.tick(T0 + 599.9) == []
    assert q.tick(T0 + 600) == [RewindableRemoved(m, "retention")]
    assert (q.rewindable, q.get(m.msg_id)) == (0, None)


def test_Q6_rewound_message_still_expires_with_retention() -> None:
    """Q6/Q1: a rewound message is Active again but its retention still counts from sending."""
    q = CmqQueue("ledger", QueueAttributes(msg_retention_seconds=600, rewind_seconds=600))
    m = q.send(b"a", 1, T0)
    _consume_all(q, T0 + 1)
    assert q.rewind(T0, T0 + 100) == 1
    assert q.active == 1
    assert q.tick(T0 + 600) == [Expired(m, "retention")]
    assert (q.active, q.retained, q.rewindable) == (0, 0, 0)
