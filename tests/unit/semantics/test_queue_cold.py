"""Restored messages held as a compact run, and a live backlog folded into compact runs
(semantics.queue_cold; issue 15), behave exactly as messages held one by one (Q1, Q3, Q4,
Q6, Q7, Q8, M13).

The twin test drives three queues with the same random operations: one restored with
``restore`` and never folded, one restored with ``restore_cold`` and one with ``restore``,
both folding their backlog with tiny thresholds, and requires the same answers and events
after every step; the others pin the parts a twin cannot show (the objects are made lazily,
the run's arrays go once it is used up).
"""

from __future__ import annotations

import gc
import math
import tracemalloc

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from semantics.message_ids import new_msg_id
from semantics.queue import CmqQueue, QueueEvent, QueueMessage, Receipt
from semantics.queue_attrs import QueueAttributes
from semantics.queue_cold import ColdRun

T0 = 1_700_000_000.0
ATTRS = QueueAttributes(visibility_timeout=5, msg_retention_seconds=600, dead_letter_queue="dlq",
                        max_receive_count=3, max_time_to_live=300, rewind_seconds=300)


def _payload(i: int, msg_id: str, enq: float, size: int, ref: int) -> object:
    return ("payload", msg_id, ref)


def _backlog(n: int, start: float) -> list[tuple[str, float, int]]:
    """(msg_id, enqueue time, size) in enqueue order, some older than the restore allows."""
    return [(f"msg-old{i:08x}", start + i * 8, 10 + i) for i in range(n)]


class Freezer:
    """Folds any payload but "hot" ones (a gateway keeps some messages as they are)."""

    def __init__(self) -> None:
        self.payloads: list[object] = []
        self.frozen = 0
        self.thawed = 0

    def freeze(self, msg_id: str, payload: object, enqueue_time: float) -> int:
        if isinstance(payload, tuple) and payload[0] == "hot":
            return -1
        self.payloads.append(payload)
        self.frozen += 1
        return len(self.payloads) - 1

    def thaw(self, index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
        self.thawed += 1
        return self.payloads[ref]


def _restored(backlog: list[tuple[str, float, int]], now: float, cold: bool,
              attrs: QueueAttributes = ATTRS) -> CmqQueue:
    q = CmqQueue("twin", attrs)
    if cold:
        run = ColdRun(_payload)
        for i, (msg_id, enq, size) in enumerate(backlog):
            run.append(msg_id, enq, size, i)
        q.restore_cold(run, now)
    else:
        for i, (msg_id, enq, size) in enumerate(backlog):
            q.restore(("payload", msg_id, i), size, now, msg_id=msg_id, enqueue_time=enq)
    return q


def _msg(m: QueueMessage | None) -> tuple[object, ...] | None:
    if m is None:
        return None
    return (m.msg_id, m.payload, m.size, m.enqueue_time, m.receive_count, m.first_receive_time,
            m.state, m.seq)


def _events(events: list[QueueEvent]) -> list[tuple[object, ...]]:
    return [(type(e).__name__, e.message.msg_id, getattr(e, "reason", None)) for e in events]


class ColdVersusRestored(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        backlog = _backlog(40, T0 - 350)  # the first ones are past their dead-letter TTL
        self.hot = _restored(backlog, self.now, cold=False)
        self.cold = _restored(backlog, self.now, cold=True)
        self.folded = _restored(backlog, self.now, cold=False)
        # Tiny thresholds: folds happen within a few sends; the restored one-by-one
        # messages have IDs of another process and stay hot.
        self.freezers = [Freezer(), Freezer()]
        self.cold.fold_with(self.freezers[0], keep=2, tail=1, batch=3)
        self.folded.fold_with(self.freezers[1], keep=1, tail=2, batch=2)
        self.others = (self.cold, self.folded)
        self.ids = [b[0] for b in backlog]
        self.receipts: list[tuple[Receipt, ...]] = []

    def _same(self, a: object, *others: object) -> None:
        for b in others:
            assert a == b, (a, b)

    @rule(dt=st.sampled_from([0.0, 0.3, 1.0, 2.5, 5.0, 9.0, 30.0, 120.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._same(*(_events(q.tick(self.now)) for q in (self.hot, *self.others)))

    @rule(visibility=st.sampled_from([None, None, 1.0, 12.0]))
    def receive(self, visibility: float | None) -> None:
        got = [q.receive(self.now, visibility) for q in (self.hot, *self.others)]
        self._same(*(r is None for r in got))
        if got[0] is not None:
            self._same(*((_msg(r.message), r.handle) for r in got if r is not None))
            self.receipts.append(tuple(r for r in got if r is not None))

    @rule()
    def receive_and_delete(self) -> None:
        self._same(*(_msg(q.receive_and_delete(self.now)) for q in (self.hot, *self.others)))

    @precondition(lambda self: self.receipts)
    @rule(i=st.integers(min_value=0), how=st.sampled_from(["delete", "release", "drop"]))
    def settle(self, i: int, how: str) -> None:
        receipts = self.receipts.pop(i % len(self.receipts))
        outcomes = [getattr(q, how)(r, self.now) for q, r in zip((self.hot, *self.others), receipts, strict=True)]
        if how == "drop":
            outcomes = [_msg(m) for m in outcomes]
        self._same(*outcomes)

    @rule(delay=st.sampled_from([0, 0, 0, 0, 2]), payload=st.sampled_from(["new", "new", "new", "hot"]),
          ttl=st.sampled_from([None, None, None, 40.0]), n=st.sampled_from([1, 1, 3, 6]))
    def send(self, delay: int, payload: str, ttl: float | None, n: int) -> None:
        """Bursts long enough to fold, with messages a fold must leave hot in between
        (a payload the gateway keeps, a TTL of its own, a delay)."""
        for _ in range(n):
            msg_id = new_msg_id()
            expires = None if ttl is None else self.now + ttl
            for q in (self.hot, *self.others):
                q.send((payload, msg_id), 1, self.now, delay=delay, msg_id=msg_id, expires_at=expires)
            self.ids.append(msg_id)

    @rule(i=st.integers(min_value=0))
    def send_a_held_id(self, i: int) -> None:
        """Q3: an ID the queue holds is refused, cold or not."""
        msg_id = self.ids[-1 - i % len(self.ids)]
        outcomes = []
        for q in (self.hot, *self.others):
            try:
                q.send("again", 1, self.now, msg_id=msg_id)
                outcomes.append("sent")
            except Exception as exc:  # noqa: BLE001 - the two must fail alike
                outcomes.append(type(exc).__name__)
        self._same(*outcomes)

    @rule(i=st.integers(min_value=0))
    def get(self, i: int) -> None:
        msg_id = self.ids[-1 - i % len(self.ids)]
        self._same(*(_msg(q.get(msg_id)) for q in (self.hot, *self.others)))

    @rule(back=st.sampled_from([0.0, 10.0, 250.0]))
    def rewind(self, back: float) -> None:
        outcomes = []
        for q in (self.hot, *self.others):
            try:
                outcomes.append(q.rewind(self.now - back, self.now))
            except Exception as exc:  # noqa: BLE001
                outcomes.append(type(exc).__name__)
        self._same(*outcomes)

    @rule(retention=st.sampled_from([300, 600, 900]))
    def set_retention(self, retention: int) -> None:
        for q in (self.hot, *self.others):
            q.set_attributes(q.attributes.replace(msg_retention_seconds=retention), self.now)

    @rule()
    def purge(self) -> None:
        self._same(*([m.msg_id for m in q.purge(self.now)] for q in (self.hot, *self.others)))

    @rule()
    def listing(self) -> None:
        self._same(*([_msg(m) for m in q.messages()] for q in (self.hot, *self.others)))

    @invariant()
    def same_counts_and_wakeup(self) -> None:
        qs = (self.hot, *self.others)
        for attr in ("active", "inactive", "delayed", "rewindable", "retained"):
            self._same(*((attr, getattr(q, attr)) for q in qs))
        self._same(*(len(q) for q in qs))
        # A folding queue may also wake up earlier to fold again what its freezer refused
        # (FOLD_RETRY, issue 31): a change of no message, so no event.
        # _next_due is a lower bound of next_wakeup (the broker's dispatch skips asking the
        # queue when the scheduler's deadline for it is at or before that bound).
        due = [q._next_due for q in qs]
        want = self.hot.next_wakeup()
        assert due[0] <= (math.inf if want is None else want), (due[0], want)
        for q, bound in zip(self.others, due[1:], strict=True):
            w = q.next_wakeup()
            assert bound <= (math.inf if w is None else w), (bound, w)
            assert w == want or (w == q._fold_retry and (want is None or w < want)), (w, want, q._fold_retry)
        self._same(*(_events(q.drain_events()) for q in qs))
        for q, f in zip(self.others, self.freezers, strict=True):
            assert q.cold >= f.frozen - f.thawed  # the live runs hold what was frozen


ColdVersusRestored.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_Q1_Q6_Q8_cold_and_folded_runs_behave_as_messages_held_one_by_one = ColdVersusRestored.TestCase


def test_Q1_restore_cold_makes_no_message_object_until_received() -> None:
    made: list[int] = []

    def thaw(i: int, msg_id: str, enq: float, size: int, ref: int) -> object:
        made.append(i)
        return ref

    run = ColdRun(thaw)
    for i in range(1000):
        run.append(f"msg-old{i:08x}", T0 + i, 100, i * 7)
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=86_400))
    q.restore_cold(run, T0 + 1000)
    assert (q.active, q.retained, q.cold, made) == (1000, 1000, 1000, [])
    r = q.receive(T0 + 1000)
    assert r is not None and (r.message.msg_id, r.message.payload, r.message.receive_count) == ("msg-old00000000", 0, 1)
    assert (made, q.cold, q.active, q.inactive) == ([0], 999, 999, 1)


def test_Q1_cold_messages_expire_at_their_retention_in_order() -> None:
    run = ColdRun(_payload)
    for i in range(10):
        run.append(f"msg-old{i:08x}", T0 + i, 1, i)
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=100))
    q.restore_cold(run, T0 + 50)
    assert q.next_wakeup() == T0 + 100
    events = q.tick(T0 + 104.5)
    assert [(type(e).__name__, e.message.msg_id) for e in events] == [
        ("Expired", f"msg-old{i:08x}") for i in range(5)]
    assert (q.cold, q.retained, q.next_wakeup()) == (5, 5, T0 + 105)


def test_restore_cold_sorts_a_run_out_of_enqueue_order() -> None:
    run = ColdRun(_payload)
    for i, t in enumerate([3.0, 1.0, 2.0]):
        run.append(f"msg-old{i}", T0 + t, 1, i)
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=100))
    q.restore_cold(run, T0 + 10)
    got = [q.receive_and_delete(T0 + 10) for _ in range(3)]
    assert [m.msg_id for m in got if m is not None] == ["msg-old1", "msg-old2", "msg-old0"]


def test_cold_run_holds_under_64_bytes_a_message_and_frees_them_when_drained() -> None:
    """Issue 15: the run's memory is a few flat buffers, against ~1 KB of objects a message
    restored one by one; draining the queue gives them back."""
    n = 20_000
    backlog = _backlog(n, T0)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        hot = _restored(backlog, T0 + n, cold=False, attrs=QueueAttributes(msg_retention_seconds=86_400))
        hot_bytes = tracemalloc.get_traced_memory()[0] - base
        del hot
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        q = _restored(backlog, T0 + n, cold=True, attrs=QueueAttributes(msg_retention_seconds=86_400))
        cold_bytes = tracemalloc.get_traced_memory()[0] - base
        while q.receive_and_delete(T0 + n) is not None:
            pass
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # The backlog list itself (its ID strings and tuples) is outside both measures.
    assert cold_bytes / n < 64, cold_bytes / n
    assert cold_bytes * 5 < hot_bytes, (cold_bytes, hot_bytes)
    assert left < cold_bytes / 20, (left, cold_bytes)
    assert q.cold == 0 and len(q) == 0


def test_a_folded_backlog_is_thawed_in_order_and_the_queue_says_once_when_it_drained() -> None:
    """Issue 15: past the thresholds, the middle of the backlog is folded (the head and the
    newest stay objects); when the queue empties after that, on_drained runs once (the
    gateway then gives the memory back), and not for a queue that never held a run."""
    freezer = Freezer()
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=86_400))
    q.fold_with(freezer, keep=10, tail=5, batch=20)
    drained: list[int] = []
    q.on_drained = lambda: drained.append(1)
    ids = [new_msg_id() for _ in range(100)]
    for i, msg_id in enumerate(ids):
        q.send(("new", msg_id), 1, T0 + i, msg_id=msg_id)
    assert q.cold > 50 and len(q._messages) == 100 - q.cold
    assert q.get(ids[-1]) is not None and q.cold > 50  # the newest was never folded
    got = []
    while (m := q.receive_and_delete(T0 + 100)) is not None:
        got.append((m.msg_id, m.payload, m.enqueue_time))
    assert got == [(msg_id, ("new", msg_id), T0 + i) for i, msg_id in enumerate(ids)]
    assert (drained, freezer.thawed, q.cold) == ([1], freezer.frozen, 0)
    q.send("again", 1, T0 + 200)
    q.receive_and_delete(T0 + 200)
    assert drained == [1]


def test_CA2_the_oldest_message_time_comes_off_the_runs_without_thawing_them() -> None:
    """GetQueueAttributes' minMsgTime over a restored run and a folded backlog: the oldest
    Active or Inactive message's enqueue time, with every run left as it is (listing every
    message, as it was computed before, thawed a backlog of 10^6 for one answer)."""
    run = ColdRun(_payload)
    for i in range(50):
        run.append(f"msg-old{i:08x}", T0 + i, 1, i)
    q = CmqQueue("q", QueueAttributes(msg_retention_seconds=86_400))
    assert q.oldest_enqueue_time() is None
    q.restore_cold(run, T0 + 100)
    q.fold_with(Freezer(), keep=10, tail=5, batch=20)
    for i in range(100):
        msg_id = new_msg_id()
        q.send(("new", msg_id), 1, T0 + 100 + i, msg_id=msg_id)
    cold = q.cold
    assert cold > 100  # the restored run and a folded one
    assert (q.oldest_enqueue_time(), q.cold) == (T0, cold)
    r = q.receive(T0 + 200)  # the oldest is Inactive now: CMQ still counts it
    assert r is not None and (q.oldest_enqueue_time(), q.cold) == (T0, cold - 1)
    assert q.delete(r, T0 + 200)
    assert (q.oldest_enqueue_time(), q.cold) == (T0 + 1, cold - 1)  # the run's new head
    while (m := q.receive_and_delete(T0 + 200)) is not None:
        last = m.enqueue_time
    assert (last, q.oldest_enqueue_time()) == (T0 + 199, None)
