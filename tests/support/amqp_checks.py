"""Small client-side helpers for the multi-gateway tests: wait for a condition, drain a queue,
publish with confirms, all over real sockets with pika."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, TypeVar

import pika
import pika.exceptions

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.2, what: str = "") -> T:
    """``check()``'s first result that is truthy and raises nothing, within ``timeout`` seconds.
    A declare on one gateway reaches the others through the store's watch: not at once."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except Exception as e:  # the last failure is what the assertion shows
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s{': ' + what if what else ''}: last {last!r}")
        time.sleep(interval)


@contextmanager
def connection(url: str, **params: Any):  # type: ignore[no-untyped-def]
    p = pika.URLParameters(url)
    p.heartbeat = params.pop("heartbeat", 0)
    p.blocked_connection_timeout = params.pop("blocked_connection_timeout", 60)
    p.socket_timeout = params.pop("socket_timeout", 30)
    conn = pika.BlockingConnection(p)
    try:
        yield conn
    finally:
        if conn.is_open:
            try:
                conn.close()
            except pika.exceptions.AMQPError:
                pass


def passive_queue(url: str, name: str) -> tuple[int, int] | int:
    """(message_count, consumer_count) when the queue exists there, else the reply code."""
    with connection(url) as conn:
        ch = conn.channel()
        try:
            ok = ch.queue_declare(name, passive=True).method
            return ok.message_count, ok.consumer_count
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code


def passive_exchange(url: str, name: str) -> int:
    """200 when the exchange exists there, else the reply code."""
    with connection(url) as conn:
        ch = conn.channel()
        try:
            ch.exchange_declare(name, passive=True)
            return 200
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code


def publish_confirmed(url: str, exchange: str, key: str, bodies: list[bytes], **props: Any) -> None:
    """Every body published persistent with publisher confirms; raises if one is nacked."""
    with connection(url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2, **props),
                             mandatory=False)


def drain(url: str, queue: str, expect: int, timeout: float = 30.0, *, ack: bool = True,
          prefetch: int = 50) -> list[tuple[bytes, bool]]:
    """Consume (body, redelivered) pairs from ``queue`` until ``expect`` arrived or ``timeout``
    passed without reaching it; then wait a little for anything more (a duplicate)."""
    got: list[tuple[bytes, bool]] = []
    with connection(url) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        deadline = time.monotonic() + timeout
        settle = None
        for method, _props, body in ch.consume(queue, inactivity_timeout=0.3):
            now = time.monotonic()
            if method is not None:
                got.append((body, method.redelivered))
                if ack:
                    ch.basic_ack(method.delivery_tag)
            if len(got) >= expect and settle is None:
                settle = now + 1.0
            if (settle is not None and now > settle) or now > deadline:
                break
        ch.cancel()
    return got
