"""Topic.head: the management view's window on a subscription's oldest unresolved message
(D4, D6, D9), through the public API instead of the subscription's private state."""

from __future__ import annotations

from typing import Any

from semantics.topic import DeliveryState, DeliveryStatus, Topic, TopicMessage

T0 = 1_700_000_000.0


def _msg(i: int, at: float) -> TopicMessage:
    return TopicMessage(f"msg-{i:04d}", at)


def test_D4_D6_head_is_the_blocker_else_the_oldest_waiting_message() -> None:
    topic = Topic("orders")
    topic.subscribe("a", ("q", "qa"))  # EXPONENTIAL_DECAY_RETRY: the blocking policy (D6)
    outcome: dict[str, bool | None] = {"a": False}

    def attempt(sub: Any, tmsg: TopicMessage) -> bool | None:
        return outcome[sub.name]

    assert topic.head("a") is None
    topic.publish(_msg(0, T0), T0, attempt)  # fails: retry 1 s later, not blocking yet
    assert topic.head("a") == ("msg-0000", DeliveryState(DeliveryStatus.RETRYING, 1, T0 + 1, False))
    outcome["a"] = None  # the next attempt is pending (an HTTP push in flight)
    topic.publish(_msg(1, T0 + 0.5), T0 + 0.5, attempt)
    assert topic.head("a") == ("msg-0000", DeliveryState(DeliveryStatus.RETRYING, 1, T0 + 1, False))
    outcome["a"] = False
    topic.deliver_due(T0 + 1, attempt)  # msg 0 fails again: it blocks the subscription
    assert topic.blocker("a") == "msg-0000"
    assert topic.head("a") == ("msg-0000", DeliveryState(DeliveryStatus.RETRYING, 2, T0 + 3, False))
    topic.report("msg-0001", "a", True, T0 + 1.5)
    outcome["a"] = True
    topic.deliver_due(T0 + 3, attempt)  # the blocker succeeds: nothing is owed any more
    assert topic.head("a") is None
    assert topic.waiting("a") == 0
