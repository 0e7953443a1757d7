"""A known workload sent with pika to a real gateway, and the audit numbers it must give (A4).

Through the default exchange: WORK messages to queue ``work``; its first NACKED deliveries are
nacked with requeue (so redelivered), the next REJECTED are rejected without requeue
(discarded), the rest acked.  Through topic exchange ``events``: EU messages ``order.eu`` (to
``ev-eu`` and ``ev-orders``), US messages ``order.us`` (to ``ev-orders``) and UNROUTED
``click.us`` that no binding takes (discarded, no_match); all acked.  One failed login.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pika
import pika.exceptions

from spark.analyses import DEFAULT_EXCHANGE

WORK, NACKED, REJECTED = 150, 20, 10
EU, US, UNROUTED = 100, 50, 10
WORK_BODY, EVENT_BODY, UNROUTED_BODY = 100, 50, 1
SUB_EU, SUB_ORDERS = "events->q:ev-eu", "events->q:ev-orders"  # as the log names a binding

PUBLISHED = WORK + EU + US + UNROUTED
DELIVERIES = {"work": WORK + NACKED, "ev-eu": EU, "ev-orders": EU + US}
ACKS = {"work": WORK - REJECTED, "ev-eu": EU, "ev-orders": EU + US}

# Every record the workload makes, by event: the broker's own count of what it did.
EVENTS = {
    "auth_failure": 1, "connection_open": 1, "connection_close": 1,
    "queue_declare": 3, "exchange_declare": 1, "bind": 2,
    "publish": PUBLISHED,
    "route": 2 * EU + US,                      # one per subscription that took the message
    "enqueue": WORK + 2 * EU + US,
    "discard": REJECTED + UNROUTED,
    "deliver": sum(DELIVERIES.values()),
    "requeue": NACKED,                         # a nack with requeue
    "nack": REJECTED,                          # a reject without requeue, then its discard
    "ack": sum(ACKS.values()),
}

# funnel(): (topic, subscription) -> published, routed, delivered, acked, discarded,
# discarded_rejected, discarded_no_match
FUNNEL = {
    (DEFAULT_EXCHANGE, "work"): (WORK, WORK, WORK, WORK - REJECTED, REJECTED, REJECTED, 0),
    ("events", None): (EU + US + UNROUTED, 0, 0, 0, UNROUTED, 0, UNROUTED),
    ("events", SUB_EU): (EU + US + UNROUTED, EU, EU, EU, 0, 0, 0),
    ("events", SUB_ORDERS): (EU + US + UNROUTED, EU + US, EU + US, EU + US, 0, 0, 0),
}
FUNNEL_COLUMNS = ("published", "routed", "delivered", "acked", "discarded", "discarded_rejected",
                  "discarded_no_match")

# stale_and_redeliveries(): queue -> deliveries, redeliveries, requeues, visibility expiries, stale acks
REDELIVERIES = {"work": (WORK + NACKED, NACKED, NACKED, 0, 0), "ev-eu": (EU, 0, 0, 0, 0),
                "ev-orders": (EU + US, 0, 0, 0, 0)}
BYTES = WORK * WORK_BODY + (EU + US) * EVENT_BODY + UNROUTED * UNROUTED_BODY
# latency_percentiles(): acks per topic, None the total
LATENCY_ACKS = {None: sum(ACKS.values()), DEFAULT_EXCHANGE: ACKS["work"], "events": ACKS["ev-eu"] + ACKS["ev-orders"]}


def run_workload(port: int, user: str, password: str) -> None:
    """The workload above against the gateway on 127.0.0.1:``port``."""
    url = f"amqp://{user}:{{}}@127.0.0.1:{port}/%2F"
    with contextlib.suppress(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.URLParameters(url.format(password + "-wrong"))).close()
        raise AssertionError("a wrong password was accepted")
    conn = pika.BlockingConnection(pika.URLParameters(url.format(password)))
    try:
        ch = conn.channel()
        ch.queue_declare("work")
        ch.exchange_declare("events", "topic")
        ch.queue_declare("ev-eu")
        ch.queue_bind("ev-eu", "events", "*.eu")
        ch.queue_declare("ev-orders")
        ch.queue_bind("ev-orders", "events", "order.*")
        ch.confirm_delivery()
        for _ in range(WORK):
            ch.basic_publish("", "work", b"w" * WORK_BODY)
        for key, n, size in (("order.eu", EU, EVENT_BODY), ("order.us", US, EVENT_BODY),
                             ("click.us", UNROUTED, UNROUTED_BODY)):
            for _ in range(n):
                ch.basic_publish("events", key, b"e" * size)
        for queue, n in DELIVERIES.items():
            for i, (method, _props, _body) in enumerate(_deliveries(ch, queue, n)):
                if queue == "work" and i < NACKED:
                    ch.basic_nack(method.delivery_tag, requeue=True)
                elif queue == "work" and i < NACKED + REJECTED:
                    ch.basic_reject(method.delivery_tag, requeue=False)
                else:
                    ch.basic_ack(method.delivery_tag)
    finally:
        conn.close()


def _deliveries(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int) -> Iterator[tuple]:
    for got, delivery in enumerate(ch.consume(queue, inactivity_timeout=60), 1):  # timeout: hang guard
        assert delivery[0] is not None, f"{queue}: {got - 1} deliveries of {n}, then none for 60 s"
        yield delivery
        if got == n:
            break
    ch.cancel()
