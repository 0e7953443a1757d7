"""Q1, Q3, Q7: every field of the QueueMessage CmqQueue.send makes must be what
QueueMessage(...) sets, and a delete by the latest handle must leave the queue as the general
path does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from semantics.queue import DELETED, REMOVED, CmqQueue, QueueMessage
from semantics.queue_attrs import QueueAttributes

T0 = 1_000_000.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 65536), st.one_of(st.none(), st.floats(T0, T0 + 1e6)), st.integers(0, 5))
def test_Q7_send_sets_the_fields_the_constructor_sets(size: int, expires_at: float | None, before: int) -> None:
    q = CmqQueue("q")
    for i in range(before):
        q.send(("p", i), 1, T0)
    msg = q.send("payload", size, T0 + 1, msg_id="msg-00ab", expires_at=expires_at)
    ref = QueueMessage("msg-00ab", "payload", size, T0 + 1, before, expires_at)
    # send goes on past the constructor: its deadline (Q1 retention or the TTL), its place.
    ref.deadline = msg.deadline
    ref.pos = msg.pos
    for name in QueueMessage.__slots__:
        assert getattr(msg, name) == getattr(ref, name), name
    assert msg.deadline == min(T0 + 1 + q._retention, expires_at if expires_at is not None else float("inf"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["send", "receive", "ack", "ack_again"]), max_size=40), st.sampled_from([0, 60]))
def test_Q3_delete_of_a_received_message_matches_the_general_path(ops: list[str], rewind: int) -> None:
    """The inlined delete (a received message, no Q6 copy) leaves what _finish_delete left:
    the counts, the lanes' heads and the message table after every step; Q6 keeps a copy."""
    q = CmqQueue("q", QueueAttributes(rewind_seconds=rewind))
    receipts = []
    acked = []
    now = T0
    for op in ops:
        now += 0.001
        if op == "send":
            q.send("p", 1, now)
        elif op == "receive":
            r = q.receive(now)
            if r is not None:
                receipts.append(r)
        elif op == "ack" and receipts:
            r = receipts.pop(0)
            m = r.message
            assert q.delete(r, now) is True
            acked.append(r)
            assert m.handle == 0
            assert not q._vis or q._vis[0][2] is not m  # its visibility entry went with it
            if rewind:
                assert m.state is DELETED and q.get(m.msg_id) is m  # Q6 keeps it
            else:
                assert m.state is REMOVED and q.get(m.msg_id) is None
                assert not q._dl or q._dl[0][2] is not m
        elif op == "ack_again" and acked:
            assert q.delete(acked[-1], now) is False  # Q3: a used handle deletes nothing
        assert q.active + q.inactive == len(q)
        assert len(q) + q.rewindable == len(q._messages)
        assert q.rewindable == (len(acked) if rewind else 0)
    assert q.inactive == len(receipts)
