"""RabbitMQ priority queues (``x-max-priority``), which CMQ does not have: the Active order is
by priority (capped at the queue's maximum, none read as 0), then by arrival; a message put
back, or whose visibility timeout ends, takes its own place again; one whose delay ends queues
behind its priority's Active ones; a restart's messages come back in that order; such a queue
never folds."""

from __future__ import annotations

import random

import pytest

from semantics.queue import CmqQueue
from semantics.queue_attrs import QueueAttributes
from semantics.queue_cold import ColdRun

T0 = 1_700_000_000.0


def _priority(payload: object) -> int:
    return payload[1]  # type: ignore[index,no-any-return]


def _queue(max_priority: int = 5, **attrs: object) -> CmqQueue:
    q = CmqQueue("q", QueueAttributes(**attrs))  # type: ignore[arg-type]
    q.set_priorities(max_priority, _priority)
    return q


def _names(q: CmqQueue, now: float) -> list[str]:
    out = []
    while (r := q.receive(now)) is not None:
        out.append(r.message.payload[0])  # type: ignore[index]
    return out


def rabbitmq_order(sent: list[tuple[str, int]], max_priority: int) -> list[str]:
    """RabbitMQ's: highest capped priority first, arrival order within one (a stable sort)."""
    return [n for n, p in sorted(sent, key=lambda m: -min(max(m[1], 0), max_priority))]


@pytest.mark.parametrize("seed", range(5))
def test_M13_priority_order_is_by_capped_priority_then_arrival(seed: int) -> None:
    rnd = random.Random(seed)
    sent = [(f"m{i}", rnd.choice([-1, 0, 1, 3, 5, 7, 9])) for i in range(60)]
    q = _queue(5)
    for m in sent:
        q.send(m, 1, T0)
    assert _names(q, T0) == rabbitmq_order(sent, 5)


def test_M13_a_message_put_back_takes_its_place_in_its_priority() -> None:
    q = _queue(9)
    for m in [("low1", 1), ("high1", 8), ("low2", 1), ("high2", 8)]:
        q.send(m, 1, T0)
    high1 = q.receive(T0)
    assert high1 is not None and high1.message.payload[0] == "high1"  # type: ignore[index]
    q.send(("high3", 8), 1, T0)
    assert q.release(high1, T0)
    assert _names(q, T0) == ["high1", "high2", "high3", "low1", "low2"]


def test_Q2_Q4_a_delay_ends_behind_its_priority_a_visibility_timeout_at_its_own_place() -> None:
    q = _queue(9, visibility_timeout=30)
    q.send(("late", 8), 1, T0, delay=10)
    q.send(("a", 8), 1, T0)
    q.send(("low", 1), 1, T0)
    got = q.receive(T0)  # "a": received, not acked
    assert got is not None and got.message.payload[0] == "a"  # type: ignore[index]
    q.send(("b", 8), 1, T0 + 20)
    # At T0 + 40: "a" is back at its own place; "late" (Active since T0 + 10) before "b".
    assert _names(q, T0 + 40) == ["a", "late", "b", "low"]


def test_restored_messages_come_back_in_priority_order_and_never_fold() -> None:
    payloads = {f"msg-{i:04x}": (f"m{i}", [2, 0, 7, 2, 9][i % 5]) for i in range(20)}
    run = ColdRun(lambda index, msg_id, enq, size, ref: payloads[msg_id])
    for i, msg_id in enumerate(payloads):
        run.append(msg_id, T0 + i, 1, 0)
    q = _queue(7)
    q.restore_cold(run, T0 + 30)
    assert q.cold == 0  # restored one by one: a run's order is arrival, not priority
    q.fold_with(object(), keep=1, tail=1, batch=1)  # type: ignore[arg-type]
    for i in range(20, 40):
        q.send((f"m{i}", 7), 1, T0 + 30)
    assert q.cold == 0
    sent = [(name, p) for name, p in payloads.values()] + [(f"m{i}", 7) for i in range(20, 40)]
    assert _names(q, T0 + 30) == rabbitmq_order(sent, 7)


def test_priorities_are_set_on_an_empty_queue_only() -> None:
    q = CmqQueue("q")
    q.send(("x", 1), 1, T0)
    with pytest.raises(ValueError):
        q.set_priorities(5, _priority)
