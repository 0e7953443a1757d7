"""A live backlog folds as it grows, and what its freezer refused for now folds later (issue 31).

The queue folds (semantics.queue_cold.LiveRun) once its hot order holds more than
keep + tail + batch messages. Each fold used to wait ``batch`` sends longer than the one
before (its next point was counted from before the fold), so 10^5 published left ~14,000
messages as objects; and a message the freezer refused (the gateway's: its body not yet on
disk) stayed an object until the next send, which never came once the publisher stopped.
These pin both, and that a queue folding this way answers as one that never folds.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from semantics import queue as Q
from semantics.message_ids import new_msg_id
from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0
ATTRS = QueueAttributes(msg_retention_seconds=86_400)


class LaggingFreezer:
    """Takes a message only once it is "on disk": sent ``lag`` or more sends ago (the
    gateway's freezer, whose bodies reach the disk at the next group commit)."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.sent = 0
        self.payloads: list[object] = []

    def freeze(self, msg_id: str, payload: object, enqueue_time: float) -> int:
        if self.lag < 0 or payload[1] > self.sent - self.lag:  # type: ignore[index]
            return -1
        self.payloads.append(payload)
        return len(self.payloads) - 1

    def thaw(self, index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
        return self.payloads[ref]


def _send(q: CmqQueue, f: LaggingFreezer, now: float) -> str:
    msg_id = new_msg_id()
    f.sent += 1
    q.send(("m", f.sent), 1, now, msg_id=msg_id)
    return msg_id


def test_the_hot_order_stays_bounded_however_long_the_backlog() -> None:
    """Every fold counts its next point from what it left hot: the objects never pass
    keep + tail + batch, at 20,000 messages as at 2,000."""
    q = CmqQueue("q", ATTRS)
    f = LaggingFreezer(0)
    q.fold_with(f, keep=16, tail=8, batch=32)
    most = 0
    for i in range(20_000):
        _send(q, f, T0 + i * 0.001)
        most = max(most, len(q._messages))
    assert most <= 16 + 8 + 32 + 1
    assert q.cold + len(q._messages) == 20_000 == len(q)


def test_what_the_freezer_refused_folds_on_a_timer_once_it_takes_it() -> None:
    """The last sends' messages, refused while their bodies were not on disk, fold at the
    queue's next wakeup (at most FOLD_RETRY_MAX later) with no send after them; the order
    is kept."""
    q = CmqQueue("q", ATTRS)
    f = LaggingFreezer(300)
    q.fold_with(f, keep=16, tail=8, batch=32)
    ids = [_send(q, f, T0 + i * 0.001) for i in range(2_000)]
    now = T0 + 2
    hot = len(q._messages)
    assert hot > 300  # the last 300 were refused
    wake = q.next_wakeup()
    assert wake is not None and wake <= now + Q.FOLD_RETRY_MAX
    f.lag = 0  # committed
    assert q.tick(max(wake, now)) == []
    assert len(q._messages) <= 16 + 8 and q.cold == 2_000 - len(q._messages)
    got = [q.receive_and_delete(now + 1) for _ in range(2_000)]
    assert [m.msg_id for m in got if m is not None] == ids


def test_a_freezer_that_never_takes_them_stops_the_retries() -> None:
    """Messages that never fold (transient ones in a durable queue) are retried with a
    doubling wait, and the timer stops once the wait passes FOLD_RETRY_MAX."""
    q = CmqQueue("q", ATTRS)
    f = LaggingFreezer(-1)
    q.fold_with(f, keep=16, tail=8, batch=32)
    for i in range(500):
        _send(q, f, T0 + i * 0.001)
    now = T0 + 1
    waits = 0
    while (wake := q.next_wakeup()) is not None and wake < now + 3_600:
        now = max(now, wake)
        q.tick(now)
        waits += 1
        assert waits < 20
    assert q.cold == 0 and len(q) == 500
    assert waits >= 1  # it did retry


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["send", "commit", "tick", "receive"]), st.integers(1, 60)),
                max_size=60))
def test_a_queue_folding_with_retries_answers_as_one_that_never_folds(ops: list[tuple[str, int]]) -> None:
    """The same sends, commits (the freezer's lag shrinks), timer ticks and receives on a
    folding queue and on one that never folds: the same messages come out in the same order,
    and the counts agree after every step."""
    folding, plain = CmqQueue("q", ATTRS), CmqQueue("q", ATTRS)
    f = LaggingFreezer(40)
    folding.fold_with(f, keep=4, tail=2, batch=8)
    now = T0
    for op, n in ops:
        now += 0.05
        if op == "send":
            for _ in range(n):
                msg_id = new_msg_id()
                f.sent += 1
                folding.send(("m", f.sent), 1, now, msg_id=msg_id)
                plain.send(("m", f.sent), 1, now, msg_id=msg_id)
        elif op == "commit":
            f.lag = max(0, f.lag - n)
        elif op == "tick":
            now += n * Q.FOLD_RETRY
            assert folding.tick(now) == plain.tick(now) == []
        else:
            for _ in range(n):
                a, b = folding.receive_and_delete(now), plain.receive_and_delete(now)
                assert (a and (a.msg_id, a.payload)) == (b and (b.msg_id, b.payload))
        assert len(folding) == len(plain)
