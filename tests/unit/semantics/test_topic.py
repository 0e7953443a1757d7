"""T2, T3, T5, L3-L6, D1-D9: the topic, its subscriptions, delivery states and retries."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semantics.clock import ManualClock
from semantics.errors import CMQError, LimitError
from semantics.retry import NotifyStrategy
from semantics.topic import (
    Deleted,
    Delivered,
    DeliveryState,
    DeliveryStatus,
    Discarded,
    FilterType,
    GaveUp,
    RetryScheduled,
    Routed,
    Subscription,
    Topic,
    TopicMessage,
)

BACKOFF = NotifyStrategy.BACKOFF_RETRY
EXP = NotifyStrategy.EXPONENTIAL_DECAY_RETRY
T0 = 1_700_000_000.0


class Endpoint:
    """A subscriber endpoint: answers True unless down (False) or asynchronous (None)."""

    def __init__(self, *, down: bool = False, pending: bool = False) -> None:
        self.down = down
        self.pending = pending
        self.got: list[str] = []      # msg IDs delivered
        self.tried: list[str] = []    # msg IDs attempted

    def deliver(self, msg: TopicMessage) -> bool | None:
        self.tried.append(msg.msg_id)
        if self.pending:
            return None
        if self.down:
            return False
        self.got.append(msg.msg_id)
        return True


def attempt(sub: Subscription, msg: TopicMessage) -> bool | None:
    endpoint = sub.endpoint
    assert isinstance(endpoint, Endpoint)
    return endpoint.deliver(msg)


def msg(i: int, at: float = T0, tags: tuple[str, ...] = (), key: str = "", size: int = 10) -> TopicMessage:
    return TopicMessage(f"msg-{i:04x}", at, tags, key, None, size)


def run_until(topic: Topic, clock: ManualClock, end: float) -> list[object]:
    """Drive retries and expiry with a manual clock, as the gateway's timer would."""
    events: list[object] = []
    while (wake := topic.next_wakeup()) is not None and wake <= end:
        clock.set(max(wake, clock.now()))
        events += topic.expire(clock.now())
        events += topic.deliver_due(clock.now(), attempt)
    clock.set(end)
    events += topic.expire(end)
    events += topic.deliver_due(end, attempt)
    return events


# -- limits -------------------------------------------------------------------------------


def test_L5_the_501st_subscription_is_refused() -> None:
    topic = Topic("orders")
    for i in range(500):
        topic.subscribe(f"sub-{i}", Endpoint())
    with pytest.raises(LimitError) as info:
        topic.subscribe("sub-500", Endpoint())
    assert info.value.rule == "L5"
    assert (info.value.value, info.value.limit) == (501, 500)
    assert info.value.reply_text == (
        "PRECONDITION_FAILED - topic 'orders' already has 500 subscriptions (CMQ limit L5)")
    assert len(topic.subscriptions) == 500
    topic.unsubscribe("sub-0")
    assert topic.subscribe("sub-500", Endpoint()).name == "sub-500"


def test_L6_maximum_message_size_range_default_and_change() -> None:
    topic = Topic("orders")
    assert topic.max_message_size == 65_536
    for bad in (1023, 1_048_577):
        with pytest.raises(LimitError) as info:
            topic.max_message_size = bad
        assert info.value.rule == "L6"
        assert topic.max_message_size == 65_536
    with pytest.raises(LimitError):
        Topic("orders", max_message_size=1023)
    a = Endpoint()
    topic.subscribe("a", a)
    assert topic.publish(msg(1, size=65_536), T0, attempt).matched
    with pytest.raises(LimitError) as info:
        topic.publish(msg(2, size=65_537), T0, attempt)
    assert info.value.rule == "L6"
    assert "message of 65537 bytes is larger than topic 'orders' MaximumMessageSize 65536" in str(info.value)
    assert a.got == ["msg-0001"]
    topic.max_message_size = 1_048_576
    topic.publish(msg(2, size=1_048_576), T0, attempt)
    topic.max_message_size = 1024
    with pytest.raises(LimitError):
        topic.publish(msg(3, size=1025), T0, attempt)
    assert a.got == ["msg-0001", "msg-0002"]


def test_L3_subscription_and_message_tags() -> None:
    topic = Topic("orders")
    topic.subscribe("a", Endpoint(), ["t1", "t2", "t3", "t4"])
    topic.add_filter("a", "t5")
    with pytest.raises(LimitError) as info:
        topic.add_filter("a", "t6")
    assert info.value.rule == "L3"
    assert topic.subscription("a").filters == ("t1", "t2", "t3", "t4", "t5")
    with pytest.raises(LimitError) as info:
        topic.subscribe("b", Endpoint(), ["x" * 17])
    assert info.value.rule == "L3"
    with pytest.raises(LimitError) as info:
        topic.publish(msg(1, tags=("a", "b", "c", "d", "e", "f")), T0, attempt)
    assert (info.value.rule, info.value.value) == ("L3", 6)
    assert topic.retained_count == 0


def test_L4_binding_keys_and_routing_keys() -> None:
    topic = Topic("orders", FilterType.ROUTING_KEY)
    topic.subscribe("a", Endpoint(), ["k1", "k2", "k3", "k4", "k5"])
    with pytest.raises(LimitError) as info:
        topic.add_filter("a", "k6")
    assert info.value.rule == "L4"
    with pytest.raises(LimitError) as info:
        topic.subscribe("b", Endpoint(), [".".join("a" * 17)])
    assert info.value.rule == "L4"
    with pytest.raises(LimitError) as info:
        topic.publish(msg(1, key="x" * 65), T0, attempt)
    assert (info.value.rule, info.value.limit) == ("L4", 64)


def test_L1_topic_name_is_validated() -> None:
    with pytest.raises(LimitError) as info:
        Topic("a.b")
    assert info.value.rule == "L1"


def test_duplicate_subscription_and_unknown_subscription() -> None:
    topic = Topic("orders")
    topic.subscribe("a", Endpoint())
    with pytest.raises(CMQError, match="already exists"):
        topic.subscribe("a", Endpoint())
    with pytest.raises(CMQError) as info:
        topic.waiting("nope")
    assert info.value.reply_code == 404


# -- filtering ----------------------------------------------------------------------------


def test_T2_nothing_matches_discarded_at_once() -> None:
    topic = Topic("orders")
    topic.subscribe("a", Endpoint(), ["xiaomi"])
    result = topic.publish(msg(1, tags=("apple",)), T0, attempt)
    assert result.discarded is True
    assert result.retained is False
    assert result.matched == ()
    assert result.events == (Discarded("msg-0001", "no_match"),)
    assert topic.retained_count == 0
    assert topic.next_wakeup() is None
    # A topic without any subscription discards too.
    assert Topic("empty").publish(msg(2), T0, attempt).discarded is True


def test_T3_tags_are_fixed_at_publish() -> None:
    m = msg(1, tags=("apple",))
    with pytest.raises(TypeError):
        m.tags[0] = "pear"  # type: ignore[index]
    topic = Topic("orders")
    b = Endpoint(down=True)
    topic.subscribe("b", b, ["apple"])
    topic.publish(m, T0, attempt)
    # Retries carry the message as it was published, to the subscriptions that took it then:
    # a later filter change does not re-route it.
    topic.remove_filter("b", "apple")
    topic.add_filter("b", "pear")
    assert topic.match(tags=["apple"]) == ()
    b.down = False
    topic.deliver_due(T0 + 1, attempt)
    assert b.got == ["msg-0001"]


def test_T5_filter_type_is_chosen_at_creation() -> None:
    by_tag = Topic("by-tag")
    by_key = Topic("by-key", FilterType.ROUTING_KEY)
    assert by_tag.filter_type is FilterType.TAG
    assert by_key.filter_type is FilterType.ROUTING_KEY
    t, k = Endpoint(), Endpoint()
    by_tag.subscribe("t", t, ["a.*"])     # a tag, not a pattern
    by_key.subscribe("k", k, ["a.*"])
    m = msg(1, tags=("a.*",), key="a.b")
    by_tag.publish(m, T0, attempt)
    by_key.publish(m, T0, attempt)
    assert by_tag.match(tags=["a.*"]) == by_tag.subscriptions
    assert by_tag.match(tags=["a.b"]) == ()
    assert by_key.match(routing_key="a.b") == by_key.subscriptions
    assert by_key.match(routing_key="a.*.c") == ()
    assert t.got == k.got == ["msg-0001"]


def test_T4_topic_routes_by_binding_keys_and_filter_changes() -> None:
    topic = Topic("orders", FilterType.ROUTING_KEY)
    topic.subscribe("s", Endpoint(), ["1.*.0"])
    assert [s.name for s in topic.match(routing_key="1.x.0")] == ["s"]
    assert topic.match(routing_key="1.2.3.4.4.2.2.0") == ()
    topic.add_filter("s", "1.#.0")
    assert [s.name for s in topic.match(routing_key="1.2.3.4.4.2.2.0")] == ["s"]
    assert [s.name for s in topic.match(routing_key="1.0")] == ["s"]
    topic.remove_filter("s", "1.#.0")
    assert topic.match(routing_key="1.0") == ()


# -- delivery -----------------------------------------------------------------------------


def test_D1_D2_all_delivered_at_once_keeps_nothing() -> None:
    topic = Topic("orders")
    eps = [Endpoint() for _ in range(3)]
    for i, ep in enumerate(eps):
        topic.subscribe(f"s{i}", ep)
    result = topic.publish(msg(1), T0, attempt)
    assert [s.name for s in result.matched] == ["s0", "s1", "s2"]
    assert result.retained is False and result.discarded is False
    assert result.events == (Routed("msg-0001", ("s0", "s1", "s2")), Delivered("msg-0001", "s0", 1),
                             Delivered("msg-0001", "s1", 1), Delivered("msg-0001", "s2", 1))
    assert [ep.got for ep in eps] == [["msg-0001"]] * 3
    assert topic.retained_count == 0
    assert topic.state("msg-0001") == {}
    assert topic.next_wakeup() is None


def test_D2_D4_pending_then_reported_deletes_when_all_done() -> None:
    topic = Topic("orders")
    http = Endpoint(pending=True)
    topic.subscribe("q", Endpoint())
    topic.subscribe("h", http)
    result = topic.publish(msg(1), T0, attempt)
    assert result.retained is True
    assert topic.state("msg-0001") == {
        "q": DeliveryState(DeliveryStatus.SUCCEEDED, 1, None),
        "h": DeliveryState(DeliveryStatus.PENDING, 1, None, in_flight=True),
    }
    assert topic.waiting("h") == 1 and topic.waiting("q") == 0
    assert topic.report("msg-0001", "h", True, T0 + 0.2) == [Delivered("msg-0001", "h", 1),
                                                              Deleted("msg-0001")]
    assert topic.retained_count == 0
    assert topic.report("msg-0001", "h", True, T0 + 0.3) == []  # a late duplicate is ignored


def test_D2_D4_D5_given_up_also_deletes() -> None:
    topic = Topic("orders", rng=random.Random(1))
    topic.subscribe("b", Endpoint(down=True), strategy=BACKOFF)
    topic.subscribe("ok", Endpoint())
    result = topic.publish(msg(1), T0, attempt)
    assert result.retained is True
    (retry,) = [e for e in result.events if isinstance(e, RetryScheduled)]
    assert (retry.attempt, retry.policy) == (2, "BACKOFF_RETRY")
    assert 10 <= retry.next_at - T0 <= 20
    state = topic.state("msg-0001")["b"]
    assert (state.status, state.attempts, state.next_at) == (DeliveryStatus.RETRYING, 1, retry.next_at)
    events = run_until(topic, ManualClock(T0), T0 + 61)
    assert [e for e in events if isinstance(e, GaveUp)] == [GaveUp("msg-0001", "b", 4, "BACKOFF_RETRY")]
    assert events[-1] == Deleted("msg-0001")
    assert topic.retained_count == 0


def test_D3_lifecycle_86400_s_from_publish_retries_never_extend_it() -> None:
    clock = ManualClock(T0)
    topic = Topic("orders")
    down = Endpoint(down=True)
    topic.subscribe("a", down)
    topic.publish(msg(1, at=T0 - 1000), T0, attempt)  # the producer published it 1,000 s earlier
    events = run_until(topic, clock, T0 - 1000 + 86_399.999)
    assert topic.retained_count == 1
    assert not any(isinstance(e, (Discarded, GaveUp)) for e in events)
    events = run_until(topic, clock, T0 - 1000 + 86_400)
    assert events == [Discarded("msg-0001", "expired", "a"), Deleted("msg-0001")]
    assert topic.retained_count == 0
    assert topic.next_wakeup() is None
    # Retries at T0 + 1, 3, ..., 1023, then every 512 s: 174 of them fit before T0 + 85,400;
    # the 175th (due at T0 + 85,503) and 176th never happen.
    assert len(down.tried) == 1 + 174
    assert topic.report("msg-0001", "a", True, clock.now()) == []


def test_D5_backoff_retries_three_times_10_to_20_s_then_drops_and_tries_the_next() -> None:
    clock = ManualClock(T0)
    topic = Topic("orders", rng=random.Random(5))
    ep = Endpoint(down=True)
    topic.subscribe("b", ep, strategy=BACKOFF)
    for i in range(3):
        topic.publish(msg(i), T0, attempt)
    assert ep.tried == ["msg-0000"]           # the first failure blocks the others
    assert topic.blocker("b") == "msg-0000"
    assert topic.waiting("b") == 3
    times: list[float] = []
    events: list[object] = []
    while (wake := topic.next_wakeup()) is not None and len(times) < 3:
        clock.set(wake)
        times.append(wake)
        events += topic.deliver_due(wake, attempt)
    # The third failed retry drops msg 0; msg 1 is tried at once, in the same round.
    assert ep.tried == ["msg-0000"] * 4 + ["msg-0001"]
    gaps = [b - a for a, b in zip([T0, *times], times, strict=False)]
    assert len(gaps) == 3 and all(10 <= g <= 20 for g in gaps)
    assert topic.state("msg-0001")["b"].next_at == pytest.approx(times[2] + 15, abs=5)
    assert [e.attempt for e in events if isinstance(e, RetryScheduled)] == [3, 4, 2]
    assert GaveUp("msg-0000", "b", 4, "BACKOFF_RETRY") in events
    assert topic.blocker("b") == "msg-0001"
    ep.down = False
    run_until(topic, clock, clock.now() + 20)
    assert ep.got == ["msg-0001", "msg-0002"]  # oldest first
    assert topic.retained_count == 0 and topic.blocker("b") is None


def test_D6_exponential_decay_first_failure_retried_second_blocks() -> None:
    clock = ManualClock(T0)
    topic = Topic("orders")
    ep = Endpoint(down=True)
    topic.subscribe("a", ep)                 # EXPONENTIAL_DECAY_RETRY by default
    assert topic.subscription("a").strategy is EXP
    r = topic.publish(msg(0), T0, attempt)
    assert [e for e in r.events if isinstance(e, RetryScheduled)] == [
        RetryScheduled("msg-0000", "a", 2, T0 + 1, "EXPONENTIAL_DECAY_RETRY")]
    topic.publish(msg(1), T0 + 0.5, attempt)  # first failure did not block: attempted
    assert ep.tried == ["msg-0000", "msg-0001"]
    assert topic.blocker("a") is None
    clock.set(T0 + 1)
    events = topic.deliver_due(clock.now(), attempt)   # msg 0 fails again: blocks
    assert events == [RetryScheduled("msg-0000", "a", 3, T0 + 3, "EXPONENTIAL_DECAY_RETRY")]
    assert topic.blocker("a") == "msg-0000"
    topic.publish(msg(2), T0 + 1.2, attempt)             # new messages wait
    clock.set(T0 + 1.5)
    assert topic.deliver_due(clock.now(), attempt) == []  # msg 1's retry waits too
    assert ep.tried == ["msg-0000", "msg-0001", "msg-0000"]
    assert topic.waiting("a") == 3
    assert topic.state("msg-0002")["a"] == DeliveryState(DeliveryStatus.PENDING, 0, None)
    # The blocker is retried at 1, 2, 4, ... s; when it succeeds the others are released.
    clock.set(T0 + 3)
    ep.down = False
    topic.deliver_due(clock.now(), attempt)
    assert ep.got == ["msg-0000", "msg-0001", "msg-0002"]
    assert topic.retained_count == 0


def test_D6_a_day_of_exponential_retries_then_give_up() -> None:
    clock = ManualClock(T0)
    topic = Topic("orders")
    ep = Endpoint(down=True)
    topic.subscribe("a", ep)
    topic.subscribe("ok", Endpoint())
    topic.publish(msg(0), T0, attempt)
    tried_at: list[float] = []

    def timed(sub: Subscription, m: TopicMessage) -> bool | None:
        tried_at.append(clock.now())
        return attempt(sub, m)

    events: list[object] = []
    while (wake := topic.next_wakeup()) is not None and wake < T0 + 86_400:
        clock.set(wake)
        events += topic.deliver_due(wake, timed)
    assert len(tried_at) == 176
    assert [t - T0 for t in tried_at[:11]] == [1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 1535]
    assert tried_at[-1] - T0 == 86_015
    assert events[-2:] == [GaveUp("msg-0000", "a", 177, "EXPONENTIAL_DECAY_RETRY"), Deleted("msg-0000")]
    assert topic.retained_count == 0


def test_D8_republish_healthy_gets_only_new_failing_keeps_both() -> None:
    topic = Topic("orders")
    healthy, failing = Endpoint(), Endpoint(down=True)
    topic.subscribe("h", healthy)
    topic.subscribe("f", failing)
    for i in range(3):
        topic.publish(msg(i), T0, attempt)
    topic.deliver_due(T0 + 1, attempt)                 # second failures: blocked
    for i in range(3, 5):
        topic.publish(msg(i), T0 + 60, attempt)
    assert healthy.got == [f"msg-{i:04x}" for i in range(5)]
    assert topic.waiting("f") == 5
    assert topic.retained_count == 5


def test_D9_waiting_and_retained_counts() -> None:
    topic = Topic("orders", FilterType.ROUTING_KEY, rng=random.Random(2))
    topic.subscribe("a", Endpoint(down=True), ["a.#"], strategy=BACKOFF)
    topic.subscribe("b", Endpoint(), ["#"])
    for i in range(4):
        topic.publish(msg(i, key="a.x"), T0, attempt)
    topic.publish(msg(9, key="b.x"), T0, attempt)
    assert topic.waiting("a") == 4
    assert topic.waiting("b") == 0
    assert topic.retained_count == 4
    assert topic.unsubscribe("a") == [Deleted(f"msg-{i:04x}") for i in range(4)]
    assert topic.retained_count == 0
    assert topic.next_wakeup() is None


# -- invariants under random outcomes -----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_D2_D4_D6_every_taker_ends_in_exactly_one_outcome(data: st.DataObject) -> None:
    """Random publishes, outcomes (ok, failed, pending), reports and clock steps. Always: a
    retained message has a subscription still waiting for it (D2); a blocked subscription is
    only handed its blocker (D6); nothing is delivered twice. At the end each (message,
    taker) pair has exactly one outcome: delivered, given up or expired (D4)."""
    clock = ManualClock(T0)
    topic = Topic("prop", rng=random.Random(data.draw(st.integers(0, 9))))
    for i, strategy in enumerate(data.draw(st.lists(st.sampled_from([BACKOFF, EXP]), min_size=1, max_size=3))):
        topic.subscribe(f"s{i}", None, data.draw(st.lists(st.sampled_from("ab"), max_size=2)), strategy)
    pending: list[tuple[str, str]] = []
    outcomes: dict[tuple[str, str], list[str]] = {}
    taken: set[tuple[str, str]] = set()

    def attempt_random(sub: Subscription, m: TopicMessage) -> bool | None:
        blocker = topic.blocker(sub.name)
        assert blocker is None or blocker == m.msg_id
        answer = data.draw(st.sampled_from([True, False, None]))
        if answer is None:
            pending.append((m.msg_id, sub.name))
        return answer

    def record(events: Iterable[object]) -> None:
        for e in events:
            if isinstance(e, Routed):
                taken.update((e.msg_id, s) for s in e.subscriptions)
            elif isinstance(e, (Delivered, GaveUp)):
                outcomes.setdefault((e.msg_id, e.subscription), []).append(type(e).__name__)
            elif isinstance(e, Discarded) and e.subscription is not None:
                outcomes.setdefault((e.msg_id, e.subscription), []).append("expired")

    for step in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["publish", "publish", "report", "tick"]))
        if op == "publish":
            tags = tuple(data.draw(st.lists(st.sampled_from("abc"), max_size=2, unique=True)))
            record(topic.publish(TopicMessage(f"m{step}", clock.now(), tags), clock.now(), attempt_random).events)
        elif op == "report" and pending:
            msg_id, sub_name = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
            record(topic.report(msg_id, sub_name, data.draw(st.booleans()), clock.now()))
        else:
            clock.advance(data.draw(st.sampled_from([0.5, 5, 30, 600, 40_000])))
            record(topic.expire(clock.now()))
            record(topic.deliver_due(clock.now(), attempt_random))
        open_ids = {m for s in topic.subscriptions for m in s._open}
        assert topic.retained_count == len(open_ids)
        assert sum(topic.waiting(s.name) for s in topic.subscriptions) == sum(len(s._open) for s in topic.subscriptions)
        assert all(len(v) == 1 for v in outcomes.values())
    # Settle: everything still in flight fails, then a day and more passes.
    for msg_id, sub_name in pending:
        record(topic.report(msg_id, sub_name, False, clock.now()))
    clock.advance(86_400)
    record(topic.expire(clock.now()))
    record(topic.deliver_due(clock.now(), lambda s, m: False))
    assert topic.retained_count == 0
    assert topic.next_wakeup() is None
    assert set(outcomes) == taken
    assert all(len(v) == 1 for v in outcomes.values())


def test_D6_a_retry_in_flight_to_an_async_endpoint_holds_the_rest() -> None:
    """D6: with an endpoint that answers later (HTTP), a retry whose outcome is unknown holds
    the subscription's other due retries, as a synchronous endpoint's second failure would;
    its success releases them, oldest first."""
    topic = Topic("topic-d6", FilterType.TAG)
    ep = Endpoint(down=True)
    topic.subscribe("A", ep, strategy=EXP)
    for i in range(3):
        topic.publish(msg(i), T0, attempt)          # each fails once: all three retry at +1 s
    assert ep.tried == ["msg-0000", "msg-0001", "msg-0002"]
    ep.down, ep.pending = False, True               # now the endpoint answers asynchronously
    topic.deliver_due(T0 + 1, attempt)
    assert ep.tried[3:] == ["msg-0000"]                # only the head's retry goes out
    assert topic.waiting("A") == 3
    ep.pending = False
    topic.report("msg-0000", "A", True, T0 + 1.5)      # its success releases the others
    topic.deliver_due(T0 + 1.5, attempt)
    assert ep.tried[3:] == ["msg-0000", "msg-0001", "msg-0002"]
    assert ep.got == ["msg-0001", "msg-0002"] and topic.waiting("A") == 0
