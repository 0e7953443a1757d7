"""The five scenarios of the CMQ tag-matching document (seeds/cmq-tag-matching-en.md), with
its own numbers: T1, T2, T3, D2, D3, D5, D6, D8."""

from __future__ import annotations

import random
from collections import Counter

from semantics.clock import ManualClock
from semantics.retry import NotifyStrategy
from semantics.topic import Deleted, Discarded, GaveUp, Subscription, Topic, TopicMessage

NOON_01 = 1_700_049_660.0   # "12:01"
NOON_02 = NOON_01 + 60.0    # "12:02"
APPLE_TAGS = ("apple", "imac", "iphone", "macbook")


class Endpoint:
    """A subscriber that fails while ``down`` or for the message numbers in ``fail``."""

    def __init__(self, fail: range = range(0)) -> None:
        self.fail = fail
        self.down = False
        self.got: list[int] = []
        self.tried: list[tuple[int, float]] = []
        self.clock: ManualClock | None = None

    def deliver(self, msg: TopicMessage) -> bool:
        n = int(msg.msg_id.removeprefix("msg-"))
        self.tried.append((n, self.clock.now() if self.clock else 0.0))
        if self.down or n in self.fail:
            return False
        self.got.append(n)
        return True


def attempt(sub: Subscription, msg: TopicMessage) -> bool:
    endpoint = sub.endpoint
    assert isinstance(endpoint, Endpoint)
    return endpoint.deliver(msg)


def publish(topic: Topic, numbers: range, now: float, tags: tuple[str, ...] = APPLE_TAGS) -> list[bool]:
    """Publish messages ``msg-<n>``; returns, per message, whether it was retained."""
    return [topic.publish(TopicMessage(f"msg-{n}", now, tags, "", None, 100), now, attempt).retained
            for n in numbers]


def subscribe(topic: Topic, tags: dict[str, tuple[str, ...]],
              strategy: NotifyStrategy = NotifyStrategy.EXPONENTIAL_DECAY_RETRY) -> dict[str, Endpoint]:
    endpoints = {name: Endpoint() for name in tags}
    for name, sub_tags in tags.items():
        topic.subscribe(name, endpoints[name], sub_tags, strategy)
    return endpoints


def run(topic: Topic, clock: ManualClock, end: float) -> list[object]:
    events: list[object] = []
    while (wake := topic.next_wakeup()) is not None and wake <= end:
        clock.set(max(wake, clock.now()))
        events += topic.expire(clock.now())
        events += topic.deliver_due(clock.now(), attempt)
    clock.set(end)
    return events


def test_T1_scenario_1_tagged_and_untagged_subscribers() -> None:
    topic = Topic("scenario1")
    eps = subscribe(topic, {"A": ("apple",), "B": ("xiaomi",), "C": ("imac", "xiaomi"), "D": ()})
    retained = publish(topic, range(100), NOON_01)
    assert [len(eps[n].got) for n in "ABCD"] == [100, 0, 100, 100]
    assert retained == [False] * 100
    assert topic.retained_count == 0


def test_T1_scenario_2_no_subscriber_tags_all_receive() -> None:
    topic = Topic("scenario2")
    eps = subscribe(topic, {"A": (), "B": (), "C": (), "D": ()})
    publish(topic, range(100), NOON_01)
    assert [len(eps[n].got) for n in "ABCD"] == [100, 100, 100, 100]


def test_T2_T3_scenario_3_no_match_discarded_immediately() -> None:
    topic = Topic("scenario3")
    eps = subscribe(topic, {"A": ("xiaomi",)})
    results = [topic.publish(TopicMessage(f"msg-{n}", NOON_01, APPLE_TAGS), NOON_01, attempt)
               for n in range(100)]
    assert sum(r.discarded for r in results) == 100
    assert sum(r.retained for r in results) == 0
    assert all(r.events == (Discarded(r.msg_id, "no_match"),) for r in results)
    assert eps["A"].tried == []
    assert topic.retained_count == 0
    assert topic.next_wakeup() is None


def test_D2_scenario_5_all_received_deleted_immediately() -> None:
    topic = Topic("test2")
    eps = subscribe(topic, {"A": (), "B": (), "C": ()})
    results = [topic.publish(TopicMessage(f"msg-{n}", NOON_01), NOON_01, attempt) for n in range(200)]
    assert [len(eps[n].got) for n in "ABC"] == [200, 200, 200]
    assert sum(r.retained for r in results) == 0
    assert topic.retained_count == 0
    assert all(topic.state(r.msg_id) == {} for r in results)


def test_D2_D3_D6_D8_scenario_4_exponential_decay_retention_blocking_republish() -> None:
    """test1: A fails 100 of 200 (from the 101st), B 30 (overlapping 20 of A's), C none: 110
    retained. A blocks behind the 101st. At 12:02 100 new ones: 210 retained, C gets only the
    new 100. Lifecycles end a day after each publish, whatever the retries."""
    clock = ManualClock(NOON_01)
    topic = Topic("test1")
    eps = subscribe(topic, {"A": (), "B": (), "C": ()})
    a, b, c = eps["A"], eps["B"], eps["C"]
    for ep in eps.values():
        ep.clock = clock
    a.fail = range(101, 201)   # messages are numbered 1-200: A fails from the 101st
    b.fail = range(91, 121)
    publish(topic, range(1, 201), NOON_01)
    assert (topic.waiting("A"), topic.waiting("B"), topic.waiting("C")) == (100, 30, 0)
    assert topic.retained_count == 110
    assert len(c.got) == 200
    # A and B cannot respond from now on.
    a.down = b.down = True
    run(topic, clock, NOON_02)
    assert topic.blocker("A") == "msg-101"
    assert topic.blocker("B") == "msg-91"
    tries = Counter(n for n, _ in a.tried if n > 100)
    # The 101st: first attempt, then retries at +1, +3, +7, +15, +31 s. Its retry at +1 s
    # failed first, so the other 99 (tried once) wait behind it, their retries held.
    assert tries[101] == 6
    assert {tries[n] for n in range(102, 201)} == {1}
    # Republish at 12:02.
    publish(topic, range(201, 301), NOON_02)
    assert topic.retained_count == 210
    assert c.got == list(range(1, 301))          # only the 100 new, each once
    assert (topic.waiting("A"), topic.waiting("B")) == (200, 130)
    assert Counter(n for n, _ in a.tried if n > 200) == Counter()  # blocked: not even tried
    # A day later (D3): the retries never extend a lifecycle.
    events = run(topic, clock, NOON_01 + 86_400)
    events += topic.expire(NOON_01 + 86_400)
    gave_up = sorted((e.subscription, e.msg_id) for e in events if isinstance(e, GaveUp))
    assert gave_up == [("A", "msg-101"), ("B", "msg-91")]   # 176 retries = 86,015 s
    expired = Counter(e.subscription for e in events if isinstance(e, Discarded))
    assert expired == Counter({"A": 99, "B": 29})
    assert topic.retained_count == 100
    events = run(topic, clock, NOON_02 + 86_400)
    events += topic.expire(NOON_02 + 86_400)
    expired = Counter(e.subscription for e in events if isinstance(e, Discarded))
    assert expired == Counter({"A": 100, "B": 100})
    assert sum(isinstance(e, Deleted) for e in events) == 100
    assert topic.retained_count == 0


def test_D5_scenario_4_backoff_blocks_at_the_101st_and_retries_in_order() -> None:
    """Blocking: the 101st fails, the next 99 are blocked (100 fail). Backoff: they are
    retried from the first one in sequence; three failed retries drop one, then the next."""
    clock = ManualClock(NOON_01)
    topic = Topic("test1", rng=random.Random(4))
    eps = subscribe(topic, {"A": (), "B": (), "C": ()}, NotifyStrategy.BACKOFF_RETRY)
    a = eps["A"]
    a.clock = clock
    a.fail = range(101, 201)
    publish(topic, range(1, 201), NOON_01)
    assert [n for n, _ in a.tried] == list(range(1, 102))   # 102-200 never tried: blocked
    assert topic.waiting("A") == 100
    assert topic.retained_count == 100
    assert (len(eps["B"].got), len(eps["C"].got)) == (200, 200)
    a.down = True
    events = run(topic, clock, NOON_01 + 86_400)
    gave_up = [e for e in events if isinstance(e, GaveUp)]
    assert [e.msg_id for e in gave_up] == [f"msg-{n}" for n in range(101, 201)]  # in order
    assert {e.attempts for e in gave_up} == {4}
    retried = [(n, t) for n, t in a.tried if n > 100]
    assert [n for n, _ in retried] == [n for n in range(101, 201) for _ in range(4)]
    for i in range(0, 400, 4):  # three 10-20 s waits per message, the next one at once
        times = [t for _, t in retried[i:i + 4]]
        assert all(10 <= later - earlier <= 20 for earlier, later in zip(times, times[1:], strict=False))
        if i:
            assert times[0] == retried[i - 1][1]
    assert topic.retained_count == 0
