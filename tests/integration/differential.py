"""Helpers for running the same client code against RabbitMQ and the gateway.

Outcomes are plain data (lists, dicts, tuples) so that the two runs compare with ``==``. The
gateway's additions (M11: ``x-cmq-*`` headers, a ``msg-…`` message_id when the publisher set
none) are removed first; everything else must match.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions

__all__ = ["Fault", "blocking", "expect_fault", "fault_of", "message_outcome", "props_outcome", "pump"]

PROPERTY_FIELDS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                   "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                   "user_id", "app_id", "cluster_id")

Fault = tuple[str, int, str]  # ("channel" | "connection", reply code, reply-text class)


def strip_gateway_headers(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    if headers is None:
        return None
    kept = {k: v for k, v in headers.items() if not k.startswith("x-cmq-")}
    return kept or None


def typed(value: Any) -> Any:
    """The value with the Python type of every leaf, so that 1 and True or 1 and 1.0 differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def props_outcome(props: pika.BasicProperties) -> dict[str, Any]:
    out = {f: getattr(props, f) for f in PROPERTY_FIELDS}
    headers = strip_gateway_headers(out["headers"])
    out["headers"] = None if headers is None else typed(headers)
    if isinstance(out["message_id"], str) and out["message_id"].startswith("msg-"):
        out["message_id"] = None  # M11: the gateway's CMQ message ID
    return out


def message_outcome(method: Any, props: pika.BasicProperties, body: bytes) -> dict[str, Any]:
    return {"body": body, "redelivered": method.redelivered, "exchange": method.exchange,
            "routing_key": method.routing_key, "props": props_outcome(props)}


def reply_class(text: str) -> str:
    """``NOT_FOUND - no queue 'x' in vhost '/'`` → ``NOT_FOUND``."""
    return text.split(" - ", 1)[0]


def fault_of(exc: BaseException) -> Fault:
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
        return ("channel", exc.reply_code, reply_class(exc.reply_text))
    if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
        return ("connection", exc.reply_code, reply_class(exc.reply_text))
    raise exc


def expect_fault(action: Callable[[], object]) -> Fault:
    try:
        action()
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as e:
        return fault_of(e)
    raise AssertionError("the broker accepted what it should have refused")


@contextmanager
def blocking(url: str, **params: Any) -> Iterator[pika.adapters.blocking_connection.BlockingConnection]:
    p = pika.URLParameters(url)
    for k, v in params.items():
        setattr(p, k, v)
    conn = pika.BlockingConnection(p)
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


HANG = 15.0  # hang protection only; a pass never waits for it


def pump(conn: pika.BlockingConnection, until: Callable[[], bool], settle: float = 0.3) -> None:
    """Process events until ``until()`` holds, then ``settle`` seconds more, so that a test sees
    what a broker sends late under load and still sees anything it sends beyond what it should.

    A fixed window (``time_limit=1.0``) read a slow CI machine's late delivery as a missing one.
    """
    deadline = time.monotonic() + HANG
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=settle)
