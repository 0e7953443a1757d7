"""``CmqQueue.restore_plain`` (a pulled message's fast path, issue 28) does what ``restore``
does for a message with no delay, expiry or receive, on every kind of queue (Q1, Q3, Q6, Q7,
Q8, x-max-length, priorities, leased models).

The twin test drives two queues of the same attributes with the same random operations, one
restoring with ``restore`` and the other with ``restore_plain``, and requires the same answers,
events and counts after every step, and the same fields of every message.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semantics.errors import CMQError
from semantics.queue import CmqQueue, QueueMessage
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0

KINDS = {
    "plain": (QueueAttributes(visibility_timeout=5, msg_retention_seconds=3600), False, False),
    "leased": (QueueAttributes(visibility_timeout=5, msg_retention_seconds=3600, max_length=2), True, False),
    "dlq": (QueueAttributes(visibility_timeout=5, msg_retention_seconds=3600, dead_letter_queue="dlq",
                            max_receive_count=2, max_time_to_live=300), False, False),
    "max-length": (QueueAttributes(visibility_timeout=5, msg_retention_seconds=3600, max_length=3), False, False),
    "priority": (QueueAttributes(visibility_timeout=5, msg_retention_seconds=3600), False, True),
    "rewind": (QueueAttributes(visibility_timeout=5, msg_retention_seconds=3600, rewind_seconds=300), False, False),
}

FIELDS = ("msg_id", "payload", "size", "enqueue_time", "first_receive_time", "next_visible_time",
          "receive_count", "state", "expires_at", "pos", "seq", "deadline")


def _queue(kind: str) -> CmqQueue:
    attrs, leased, priority = KINDS[kind]
    q = CmqQueue("q", attrs, leased=leased)
    if priority:
        q.set_priorities(5, lambda payload: payload[1] % 6)  # type: ignore[index]
    return q


def _fields(m: QueueMessage | None) -> tuple[object, ...] | None:
    return None if m is None else tuple(getattr(m, f) for f in FIELDS)


def _events(q: CmqQueue) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.message.msg_id) for e in q.drain_events()]


def _state(q: CmqQueue) -> tuple[object, ...]:
    return (q.active, q.inactive, q.delayed, q.rewindable, q.retained, q.next_wakeup(),
            [_fields(m) for m in q.messages()])


OPS = st.lists(st.one_of(
    # (restore, seconds before now the message was enqueued: some past retention or the TTL)
    st.tuples(st.just("restore"), st.sampled_from([0.0, 1.0, 30.0, 299.0, 301.0, 3599.0, 3601.0, 9000.0])),
    st.tuples(st.just("again"), st.integers(0, 20)),  # an ID already held (Q3)
    st.tuples(st.just("receive"), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("wait"), st.sampled_from([0.5, 6.0, 250.0, 4000.0])),
    st.tuples(st.just("rewind"), st.sampled_from([10.0, 200.0])),
), max_size=60)


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_restore_plain_is_restore(kind: str, ops: list[tuple[str, float]]) -> None:
    a, b = _queue(kind), _queue(kind)
    now = T0
    ids: list[str] = []
    receipts: list[tuple[object, object]] = []
    for op, arg in ops:
        if op == "restore" or (op == "again" and ids):
            if op == "restore":
                msg_id = f"m{len(ids):04d}"
                ids.append(msg_id)
                enq = now - float(arg)
            else:
                msg_id = ids[int(arg) % len(ids)]
                enq = now
            payload = ("p", len(ids))
            out = []
            for q, plain in ((a, False), (b, True)):
                try:
                    if plain:
                        m = q.restore_plain(payload, 10, now, msg_id, enq)
                    else:
                        m = q.restore(payload, 10, now, msg_id=msg_id, enqueue_time=enq)
                    out.append(_fields(m))
                except CMQError as e:
                    out.append((e.rule, str(e)))
            assert out[0] == out[1]
        elif op == "receive":
            ra, rb = a.receive(now), b.receive(now)
            assert _fields(ra and ra.message) == _fields(rb and rb.message)
            if ra is not None and rb is not None:
                receipts.append((ra, rb))
        elif op in ("delete", "release") and receipts:
            ra, rb = receipts.pop(int(arg) % len(receipts))
            if op == "delete":
                assert a.delete(ra, now) == b.delete(rb, now)  # type: ignore[arg-type]
            else:
                assert a.release(ra, now) == b.release(rb, now)  # type: ignore[arg-type]
        elif op == "wait":
            now += float(arg)
            assert _events_of_tick(a, now) == _events_of_tick(b, now)
        elif op == "rewind" and KINDS[kind][0].rewind_seconds:
            out = []
            for q in (a, b):
                try:
                    out.append(q.rewind(now - float(arg), now))
                except CMQError as e:
                    out.append((e.rule, str(e)))
            assert out[0] == out[1]
        assert _events(a) == _events(b)
        assert _state(a) == _state(b)


def _events_of_tick(q: CmqQueue, now: float) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.message.msg_id) for e in q.tick(now)]


def test_restore_plain_is_active_with_its_deadline() -> None:
    """The fast path's own fields, not only its agreement with ``restore``: Active, visible
    now, no receive, its deadline the retention end."""
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=600))
    m = q.restore_plain("x", 1, T0, "m1", T0 - 10)
    assert (m.state.name, m.receive_count, m.first_receive_time, m.next_visible_time, m.deadline) == (
        "ACTIVE", 0, None, T0, T0 - 10 + 600)
    old = q.restore_plain("y", 1, T0, "m2", T0 - 700)  # past retention: expired at once (Q1)
    assert old.state.name == "REMOVED"
    assert [(type(e).__name__, e.message.msg_id) for e in q.drain_events()] == [("Expired", "m2")]
    assert q.active == 1
    r = q.receive(T0)
    assert r is not None and r.message is m and m.receive_count == 1
