"""Random operation sequences against a plain reference model (Q1, Q2, Q3, Q4, L7).

The reference keeps every message in a dict and decides each state from the times alone, in
O(n) per step; the queue under test must agree with it after every step: no message is ever
received while Inactive or delayed, none is lost, none is duplicated, every count matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from semantics.queue import CmqQueue, MessageState, Receipt
from semantics.queue_attrs import QueueAttributes

T0 = 1_700_000_000.0
VT = 5.0
RETENTION = 60.0
MAX_RECEIVES = 4  # Q8: the fourth visibility end moves a message to the dead-letter queue


@dataclass
class Ref:
    state: str  # active | inactive | delayed
    enqueue: float
    visible_at: float
    handle: int = 0
    receives: int = 0


class QueueVersusReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.q = CmqQueue("prop", QueueAttributes(visibility_timeout=VT, msg_retention_seconds=RETENTION,
                                                  dead_letter_queue="dlq", max_receive_count=MAX_RECEIVES))
        self.now = T0
        self.ref: dict[str, Ref] = {}
        self.receipts: list[Receipt] = []
        self.received_while: list[tuple[str, str]] = []

    def _advance_ref(self) -> None:
        for msg_id, r in list(self.ref.items()):
            if r.enqueue + RETENTION <= self.now:
                del self.ref[msg_id]  # Q1/L7: expired, received or not
            elif r.state == "inactive" and r.visible_at <= self.now and r.receives >= MAX_RECEIVES:
                del self.ref[msg_id]  # Q8: moved instead of being received again
            elif r.state in ("inactive", "delayed") and r.visible_at <= self.now:
                r.state = "active"

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0, 7.0, 30.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self._advance_ref()

    @rule(delay=st.sampled_from([0, 0, 0, 1, 3, 10]))
    def send(self, delay: int) -> None:
        m = self.q.send(None, 1, self.now, delay=delay)
        assert m.msg_id not in self.ref
        self.ref[m.msg_id] = Ref("delayed" if delay else "active", self.now, self.now + delay)

    @rule(visibility=st.sampled_from([None, None, None, 1.0, 12.0]))
    def receive(self, visibility: float | None) -> None:
        # A visibility of its own sends the timer out of the FIFO lane's order, to the heap.
        self._advance_ref()
        receipt = self.q.receive(self.now, visibility)
        active = {i for i, r in self.ref.items() if r.state == "active"}
        if receipt is None:
            assert not active
            return
        msg_id = receipt.message.msg_id
        assert msg_id in active, f"received {msg_id} while {self.ref.get(msg_id)}"  # Q2
        r = self.ref[msg_id]
        r.state, r.visible_at, r.handle = "inactive", self.now + (visibility or VT), receipt.handle
        r.receives += 1
        assert receipt.message.receive_count == r.receives  # Q7
        self.receipts.append(receipt)

    @rule()
    def receive_and_delete(self) -> None:
        self._advance_ref()
        m = self.q.receive_and_delete(self.now)
        active = {i for i, r in self.ref.items() if r.state == "active"}
        if m is None:
            assert not active
        else:
            assert m.msg_id in active
            del self.ref[m.msg_id]

    def _ref_handle_holds(self, receipt: Receipt) -> bool:
        r = self.ref.get(receipt.message.msg_id)
        return r is not None and r.handle == receipt.handle and r.state in ("active", "inactive")

    @precondition(lambda self: self.receipts)
    @rule(i=st.integers(min_value=0), how=st.sampled_from(["delete", "drop", "release"]))
    def settle(self, i: int, how: str) -> None:
        self._advance_ref()
        receipt = self.receipts[i % len(self.receipts)]
        holds = self._ref_handle_holds(receipt)
        msg_id = receipt.message.msg_id
        if how == "delete":
            assert self.q.delete(receipt, self.now) is holds  # Q3: stale handles delete nothing
            if holds:
                del self.ref[msg_id]
        elif how == "drop":
            assert (self.q.drop(receipt, self.now) is not None) is holds
            if holds:
                del self.ref[msg_id]
        else:
            holds = holds and self.ref[msg_id].state == "inactive"
            assert self.q.release(receipt, self.now) is holds
            if holds:
                r = self.ref[msg_id]
                r.state, r.handle = "active", 0
                if r.receives >= MAX_RECEIVES:
                    del self.ref[msg_id]

    @rule()
    def tick(self) -> None:
        self.q.tick(self.now)
        self._advance_ref()
        wake = self.q.next_wakeup()
        assert wake is None or wake > self.now

    @invariant()
    def agrees_with_reference(self) -> None:
        # _next_due is a lower bound of next_wakeup (the broker's dispatch relies on it).
        bound = self.q._next_due
        w = self.q.next_wakeup()
        assert bound <= (math.inf if w is None else w), (bound, w)
        self.q.tick(self.now)
        self._advance_ref()
        states = {"active": 0, "inactive": 0, "delayed": 0}
        for r in self.ref.values():
            states[r.state] += 1
        assert (self.q.active, self.q.inactive, self.q.delayed) == (
            states["active"], states["inactive"], states["delayed"])
        assert self.q.retained == len(self.ref)
        ids = [m.msg_id for m in self.q.messages()]
        assert len(ids) == len(set(ids)) and set(ids) == set(self.ref)  # none lost or duplicated
        names = {MessageState.ACTIVE: "active", MessageState.INACTIVE: "inactive",
                 MessageState.DELAYED: "delayed"}
        for m in self.q.messages():
            assert names[m.state] == self.ref[m.msg_id].state


QueueVersusReference.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_Q1_Q2_Q3_queue_agrees_with_reference_model = QueueVersusReference.TestCase


def test_Q2_no_message_handed_out_twice_while_inactive_at_scale() -> None:
    """Q2: 10,000 receives over 2,000 messages and a short visibility: never a message that
    is still Inactive, and each receive count equals the times it was handed out."""
    q = CmqQueue("scale", QueueAttributes(visibility_timeout=3))
    for i in range(2_000):
        q.send(i, 1, T0)
    seen: dict[str, int] = {}
    busy_until: dict[str, float] = {}
    empty = 0
    for step in range(10_000):
        now = T0 + step * 0.001  # all 2,000 go out in 2 s, then 1 s with nothing Active
        r = q.receive(now)
        if r is None:
            empty += 1
            assert min(busy_until.values()) > now and q.active == 0
            continue
        msg_id = r.message.msg_id
        assert busy_until.get(msg_id, 0.0) <= now
        busy_until[msg_id] = now + 3
        seen[msg_id] = seen.get(msg_id, 0) + 1
    assert len(seen) == 2_000 and sum(seen.values()) == 10_000 - empty
    assert empty == 3_000  # 1,000 empty steps in each of the three 3 s rounds
    assert all(q.get(i).receive_count == n for i, n in seen.items())  # type: ignore[union-attr]
