"""M7/CL4: x-expires over several gateways on JetStream counts the last use on any of them.

A queue used (basic.get, a consumer) through one gateway does not expire on another whose own
clients left it alone; once unused everywhere it goes, on every gateway. Publishing is not a
use (RabbitMQ's meaning). pika over real sockets, gateways on a real nats-server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions

EXPIRES_MS = 2500


def _url(gw: Any) -> str:
    return f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"


def _exists(gw: Any, name: str) -> bool:
    conn = pika.BlockingConnection(pika.URLParameters(_url(gw)))
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def _declared_on_both(a: Any, b: Any) -> str:
    name = f"exp-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(_url(a)))
    conn.channel().queue_declare(name, arguments={"x-expires": EXPIRES_MS})
    conn.close()
    deadline = time.monotonic() + 10
    while name not in b.broker.vhosts["/"].queues:
        assert time.monotonic() < deadline, "the declare did not reach the other gateway"
        time.sleep(0.05)
    return name


def _expiries(gws: list[Any], name: str) -> list[str]:
    """The gateways' own audit events as they emit them: which gateway deleted ``name`` for
    x-expires (each call goes on to the real audit)."""
    seen: list[str] = []
    for i, gw in enumerate(gws):
        emit = gw.broker.emit_fields

        def spy(event: str, vhost: str, fields: dict[str, Any], emit: Any = emit, i: int = i) -> None:
            if event == "queue_delete" and fields.get("queue") == name and fields.get("reason") == "expired":
                seen.append(f"gw{i}")
            emit(event, vhost, fields)
        gw.broker.emit_fields = spy
    return seen


def _gone_everywhere(gws: list[Any], name: str, within: float) -> None:
    deadline = time.monotonic() + within
    while any(name in gw.broker.vhosts["/"].queues for gw in gws):
        assert time.monotonic() < deadline, "the unused queue did not expire"
        time.sleep(0.1)
    assert not any(_exists(gw, name) for gw in gws)


def test_M7_CL4_x_expires_counts_a_basic_get_on_another_gateway(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    name = _declared_on_both(a, b)
    expired_by = _expiries([a, b], name)
    conn = pika.BlockingConnection(pika.URLParameters(_url(b)))
    ch = conn.channel()
    end = time.monotonic() + 2.5 * EXPIRES_MS / 1000
    while time.monotonic() < end:  # used through b only, for longer than x-expires
        ch.basic_get(name, auto_ack=True)
        time.sleep(0.3)
    conn.close()
    assert name in a.broker.vhosts["/"].queues  # a's own clients never used it: kept
    _gone_everywhere([a, b], name, within=EXPIRES_MS / 1000 + 5)
    time.sleep(1.0)
    assert len(expired_by) == 1, expired_by  # expired once, by one gateway


def test_M7_CL4_x_expires_waits_for_a_consumer_on_another_gateway(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    name = _declared_on_both(a, b)
    conn = pika.BlockingConnection(pika.URLParameters(_url(b)))
    ch = conn.channel()
    tag = ch.basic_consume(name, lambda *args: None)
    conn.sleep(2.5 * EXPIRES_MS / 1000)
    assert _exists(a, name) and name in b.broker.vhosts["/"].queues
    ch.basic_cancel(tag)
    conn.close()
    _gone_everywhere([a, b], name, within=EXPIRES_MS / 1000 + 5)


def test_M7_CL4_x_expires_ignores_publishes(js_gateways: Callable[..., Any]) -> None:
    """RabbitMQ: a queue only published to is unused; it expires (with its messages)."""
    a, b = js_gateways(2)
    name = _declared_on_both(a, b)
    conns = [pika.BlockingConnection(pika.URLParameters(_url(gw))) for gw in (a, b)]
    chs = [conn.channel() for conn in conns]
    deadline = time.monotonic() + EXPIRES_MS / 1000 + 8
    while name in a.broker.vhosts["/"].queues or name in b.broker.vhosts["/"].queues:
        assert time.monotonic() < deadline, "a queue only published to did not expire"
        for ch in chs:  # through both gateways
            ch.basic_publish("", name, b"x")
        conns[0].sleep(0.2)
    for conn in conns:
        conn.close()
    assert not _exists(a, name)
