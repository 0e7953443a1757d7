"""The message lifecycle of a CMQ queue: Q1, Q2, Q3, Q7, L6 (queue part), L7, L8 (heap num)."""

from __future__ import annotations

import pytest

from semantics.clock import ManualClock
from semantics.errors import CMQError, LimitError
from semantics.message_ids import format_handle, is_msg_id, parse_handle
from semantics.queue import CmqQueue, Expired, MessageState, VisibilityExpired
from semantics.queue_attrs import QueueAttributes


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


def test_Q1_active_inactive_active_at_exactly_visibility_timeout(clock: ManualClock) -> None:
    """Q1: a receive hides the message for exactly VisibilityTimeout, then it is Active again."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=45))
    t0 = clock.now()
    m = q.send(b"a", 1, t0)
    assert m.state is MessageState.ACTIVE and (q.active, q.inactive) == (1, 0)
    r = q.receive(t0)
    assert r is not None and r.message is m
    assert m.state is MessageState.INACTIVE and (q.active, q.inactive) == (0, 1)
    assert q.next_wakeup() == t0 + 45
    clock.advance(44.999)
    assert q.tick(clock.now()) == []
    assert q.receive(clock.now()) is None
    clock.set(t0 + 45)
    assert q.tick(clock.now()) == [VisibilityExpired(m)]
    assert m.state is MessageState.ACTIVE and (q.active, q.inactive) == (1, 0)
    r2 = q.receive(clock.now())
    assert r2 is not None and r2.message is m and m.receive_count == 2


def test_Q1_delete_makes_it_deleted_and_gone(clock: ManualClock) -> None:
    """Q1: a delete within the visibility timeout removes the message for good."""
    q = CmqQueue("orders")
    t0 = clock.now()
    m = q.send(b"a", 1, t0)
    r = q.receive(t0)
    assert r is not None
    assert q.delete(r, t0 + 29.999) is True
    assert m.state is MessageState.REMOVED
    assert (q.active, q.inactive, q.retained, q.get(m.msg_id)) == (0, 0, 0, None)
    assert q.tick(t0 + 30) == []
    assert q.receive(t0 + 30) is None


def test_L7_Q1_retention_expiry_at_exactly_msg_retention_seconds(clock: ManualClock) -> None:
    """Q1/L7: past msgRetentionSeconds from sending the message expires, received or not."""
    q = CmqQueue("orders", QueueAttributes(msg_retention_seconds=60, visibility_timeout=50))
    t0 = clock.now()
    waiting = q.send(b"w", 1, t0)
    taken = q.send(b"t", 1, t0)
    assert q.receive(t0) is not None  # 'waiting' is Inactive until t0 + 50
    receipt = q.receive(t0 + 20)
    assert receipt is not None and receipt.message is taken  # Inactive until t0 + 70
    assert q.tick(t0 + 59.999) == [VisibilityExpired(waiting)]
    assert q.retained == 2
    events = q.tick(t0 + 60)
    assert events == [Expired(waiting, "retention"), Expired(taken, "retention")]
    assert (q.active, q.inactive, q.retained) == (0, 0, 0)
    assert q.delete(receipt, t0 + 61) is False
    assert q.next_wakeup() is None


def test_Q2_only_active_messages_are_received(clock: ManualClock) -> None:
    """Q2: while a message is Inactive no second consumer gets it; later it may get it again."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=10))
    t0 = clock.now()
    a = q.send(b"a", 1, t0)
    b = q.send(b"b", 1, t0)
    r1 = q.receive(t0)
    r2 = q.receive(t0)
    assert r1 is not None and r2 is not None
    assert (r1.message, r2.message) == (a, b)
    assert q.receive(t0 + 9) is None
    r3 = q.receive(t0 + 10)
    assert r3 is not None and r3.message is a


def test_Q3_ids_are_msg_hex_and_unique(clock: ManualClock) -> None:
    """Q3: every send returns a new ID 'msg-' + hex digits."""
    q = CmqQueue("orders")
    ids = [q.send(b"", 0, clock.now()).msg_id for _ in range(1_000)]
    assert len(set(ids)) == 1_000
    assert all(is_msg_id(i) and i.startswith("msg-") for i in ids)
    assert not is_msg_id("Msg-12") and not is_msg_id("msg-xyz")


def test_Q3_ids_count_up_in_sixteen_hex_digits_across_the_table_boundary() -> None:
    """new_msg_id takes its last three digits from a table: the IDs still count up by one,
    the counter 16 hex digits after the process's prefix, across each 4,096th ID."""
    from semantics.message_ids import new_msg_id, process_prefix

    ids = [new_msg_id() for _ in range(2 * 4096 + 10)]
    head = "msg-" + process_prefix()
    counters = [int(i[len(head):], 16) for i in ids]
    assert all(i.startswith(head) and len(i) == len(head) + 16 and is_msg_id(i) for i in ids)
    assert counters == list(range(counters[0], counters[0] + len(ids)))


def test_Q3_M12_stale_handle_deletes_nothing(clock: ManualClock) -> None:
    """Q3/M12: after a new receive, the older handle deletes nothing; the latest does."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=30))
    t0 = clock.now()
    m = q.send(b"a", 1, t0)
    old = q.receive(t0)
    new = q.receive(t0 + 30)
    assert old is not None and new is not None
    assert old.handle != new.handle and old.message is new.message is m
    assert q.delete(old, t0 + 31) is False
    assert m.state is MessageState.INACTIVE and q.retained == 1
    assert q.release(old, t0 + 31) is False
    assert q.drop(old, t0 + 31) is None
    assert m.state is MessageState.INACTIVE and q.inactive == 1
    assert q.delete(new, t0 + 31) is True
    assert q.retained == 0
    assert q.delete(new, t0 + 32) is False  # a handle deletes once


def test_M12_latest_handle_still_deletes_after_timeout_if_not_received_again(clock: ManualClock) -> None:
    """M12: the ack is stale only when the message "was received elsewhere"; Active but not
    received again, the latest handle still deletes it."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=5))
    t0 = clock.now()
    m = q.send(b"a", 1, t0)
    r = q.receive(t0)
    assert r is not None
    assert q.tick(t0 + 5) == [VisibilityExpired(m)]
    assert q.delete(r, t0 + 6) is True
    assert (q.active, q.retained) == (0, 0)
    assert q.receive(t0 + 6) is None


def test_Q3_handle_wire_form_round_trips() -> None:
    """Q3: the receipt handle's text form names the message and the receive."""
    text = format_handle("msg-00ab", 0x1F)
    assert text == "msg-00ab.1f"
    assert parse_handle(text) == ("msg-00ab", 31)
    with pytest.raises(ValueError):
        parse_handle("nonsense")


def test_Q7_receive_reports_metadata(clock: ManualClock) -> None:
    """Q7: ID, body, enqueue time, first receive time, next visible time, receive count."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=30))
    t0 = clock.now()
    sent = q.send(b"body", 4, t0)
    r1 = q.receive(t0 + 2)
    assert r1 is not None
    m = r1.message
    assert (m.msg_id, m.payload, m.size) == (sent.msg_id, b"body", 4)
    assert (m.enqueue_time, m.first_receive_time, m.next_visible_time, m.receive_count) == (
        t0, t0 + 2, t0 + 32, 1)
    r2 = q.receive(t0 + 32)
    assert r2 is not None
    assert (m.enqueue_time, m.first_receive_time, m.next_visible_time, m.receive_count) == (
        t0, t0 + 2, t0 + 62, 2)


def test_receive_with_own_visibility(clock: ManualClock) -> None:
    """Q1: a receive may ask for its own visibility timeout (the gateway's per-consumer choice)."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=30))
    t0 = clock.now()
    q.send(b"a", 1, t0)
    r = q.receive(t0, visibility=300)
    assert r is not None and r.message.next_visible_time == t0 + 300
    assert q.receive(t0 + 299.9) is None
    assert q.receive(t0 + 300) is not None


def test_receive_and_delete_for_no_ack(clock: ManualClock) -> None:
    """Q1: a no-ack receive is a receive and a delete at once; metadata still set (Q7)."""
    q = CmqQueue("orders")
    t0 = clock.now()
    sent = q.send(b"a", 1, t0)
    m = q.receive_and_delete(t0 + 1)
    assert m is sent and (m.receive_count, m.first_receive_time) == (1, t0 + 1)
    assert (q.active, q.inactive, q.retained) == (0, 0, 0)
    assert q.receive_and_delete(t0 + 1) is None


def test_L6_queue_max_msg_size_refuses_larger_body(clock: ManualClock) -> None:
    """L6: a body larger than MaxMsgSize is refused, naming the size; nothing stored."""
    q = CmqQueue("orders", QueueAttributes(max_msg_size=1_024))
    assert q.send(b"x" * 1_024, 1_024, clock.now()).size == 1_024
    with pytest.raises(LimitError) as info:
        q.send(b"x" * 1_025, 1_025, clock.now())
    assert (info.value.rule, info.value.value, info.value.limit) == ("L6", 1_025, 1_024)
    assert "1,025 bytes" in str(info.value) and "1,024" in str(info.value)
    assert q.retained == 1


def test_L8_heap_num_cap_refusal_leaves_queue_unchanged(clock: ManualClock) -> None:
    """L8: with maxMsgHeapNum retained messages the next send is refused and nothing changes."""
    q = CmqQueue("orders", QueueAttributes(max_msg_heap_num=3))
    t0 = clock.now()
    sent = [q.send(i, 1, t0) for i in range(3)]
    r = q.receive(t0)
    assert r is not None
    before = (q.active, q.inactive, q.retained, q.next_wakeup(), [m.state for m in sent])
    with pytest.raises(LimitError) as info:
        q.send("x", 1, t0)
    assert (info.value.rule, info.value.limit) == ("L8", 3)
    assert "3 messages" in str(info.value)
    assert (q.active, q.inactive, q.retained, q.next_wakeup(), [m.state for m in sent]) == before
    assert [q.get(m.msg_id) for m in sent] == sent
    # Inactive messages are still retained: only a delete makes room.
    assert q.delete(r, t0)
    assert q.send("x", 1, t0).payload == "x"


def test_send_with_msg_id_keeps_it_and_refuses_a_duplicate(clock: ManualClock) -> None:
    """Q3: the gateway may pass the ID (topic deliveries keep it); a duplicate is refused."""
    q = CmqQueue("orders")
    assert q.send(b"", 0, clock.now(), msg_id="msg-0001").msg_id == "msg-0001"
    with pytest.raises(CMQError) as info:
        q.send(b"", 0, clock.now(), msg_id="msg-0001")
    assert info.value.rule == "Q3"
    assert q.retained == 1


def test_operations_apply_due_changes_without_tick(clock: ManualClock) -> None:
    """Q1: the model is right whenever it is asked; tick only reports the events."""
    q = CmqQueue("orders", QueueAttributes(visibility_timeout=10))
    t0 = clock.now()
    m = q.send(b"a", 1, t0)
    assert q.receive(t0) is not None
    r = q.receive(t0 + 10)  # no tick in between
    assert r is not None and r.message is m
    assert q.drain_events() == [VisibilityExpired(m)]
    assert q.drain_events() == []


def test_L7_shorter_retention_applies_to_messages_already_queued(clock: ManualClock) -> None:
    """L7/Q1: SetQueueAttributes with a shorter msgRetentionSeconds expires older messages at
    their send time + the new retention; a new visibility timeout applies to later receives."""
    q = CmqQueue("orders", QueueAttributes(msg_retention_seconds=3_600, visibility_timeout=30))
    t0 = clock.now()
    m = q.send(b"a", 1, t0)
    q.set_attributes(q.attributes.replace(msg_retention_seconds=120, visibility_timeout=7), t0 + 10)
    r = q.receive(t0 + 10)
    assert r is not None and m.next_visible_time == t0 + 17
    assert q.next_wakeup() == t0 + 17
    assert q.tick(t0 + 119.9) == [VisibilityExpired(m)]
    assert q.tick(t0 + 120) == [Expired(m, "retention")]
    assert q.retained == 0 and q.next_wakeup() is None
