"""RabbitMQ priority queues (``x-max-priority``) over the wire, the same on RabbitMQ and the
gateway's embedded store: basic.get and a consumer take the highest priority first, a missing
priority is 0, one above the maximum counts as the maximum, a message put back keeps its
place, and a restart keeps the order. (On the JetStream store priorities order only what a
gateway has pulled: README, "Not supported".)"""

from __future__ import annotations

import random
from typing import Any

import pika
import pytest

from tests.integration.differential import blocking, pump
from tests.support.gateway_procs import GatewayProcess

pytestmark = pytest.mark.rabbitmq

PRIORITIES = [None, 0, 1, 3, 5, 7, 9]


def _sent(n: int, seed: int) -> list[tuple[str, int | None]]:
    rnd = random.Random(seed)
    return [(f"{seed}-{i}:{p}", p) for i, p in enumerate(rnd.choice(PRIORITIES) for _ in range(n))]


def _publish(ch: Any, queue: str, sent: list[tuple[str, int | None]]) -> None:
    for body, p in sent:
        ch.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=p, delivery_mode=2))


def _by_priority(sent: list[tuple[str, int | None]], max_priority: int) -> list[str]:
    """RabbitMQ's order: the priority capped at the maximum (none is 0), highest first; within
    one priority, publishing order (a stable sort of ``sent`` in publishing order)."""
    return [body for body, p in sorted(sent, key=lambda m: -min(m[1] or 0, max_priority))]


def test_M13_basic_get_and_consume_take_the_highest_priority_first(broker_url: str, unique: str) -> None:
    first_batch, second_batch = _sent(40, seed=7), _sent(20, seed=8)
    with blocking(broker_url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, arguments={"x-max-priority": 5})
        _publish(ch, unique, first_batch)
        method, _, first = ch.basic_get(unique)
        ch.basic_nack(method.delivery_tag, requeue=True)  # back to its own place
        got = [ch.basic_get(unique, auto_ack=True)[2].decode() for _ in range(20)]
        _publish(ch, unique, second_batch)
        consumed: list[str] = []
        ch.basic_qos(prefetch_count=100)
        ch.basic_consume(unique, lambda c, m, p, b: consumed.append(b.decode()), auto_ack=True)
        pump(conn, lambda: len(consumed) >= 40)
        ch.queue_delete(unique)
    order = _by_priority(first_batch, 5)
    assert first.decode() == order[0]
    assert got == order[:20]
    left = [m for m in first_batch if m[0] not in got]  # in publishing order, then the new ones
    assert consumed == _by_priority(left + second_batch, 5)


@pytest.mark.parametrize("kill", [False, True], ids=["clean stop", "kill -9"])
def test_a_restart_keeps_a_durable_priority_queues_order(tmp_path, unique: str, kill: bool) -> None:
    """Persistent messages of a durable priority queue come back in priority order, from a
    clean stop's checkpoint as from a replay (restored one by one, not as a run in publishing
    order)."""
    sent = _sent(30, seed=3)
    with GatewayProcess(tmp_path, "gw", management=False) as gw:
        with blocking(gw.url) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(unique, durable=True, arguments={"x-max-priority": 9})
            _publish(ch, unique, sent)
        gw.restart(kill=kill)
        with blocking(gw.url) as conn:
            got = [conn.channel().basic_get(unique, auto_ack=True)[2].decode() for _ in range(30)]
    assert got == _by_priority(sent, 9)
