"""CL1: declarations made through one gateway on JetStream are seen by every other."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker


def _conn(gw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.05)


def _passive_ok(gw: Any, queue: str) -> bool:
    conn = _conn(gw)
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_CL1_queue_declared_on_one_gateway_is_seen_on_another(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    name = f"orders-{uuid.uuid4().hex[:6]}"
    conn = _conn(a)
    conn.channel().queue_declare(name, durable=True, arguments={"x-cmq-visibility-timeout": 5})
    conn.close()
    _eventually(lambda: _passive_ok(b, name))
    assert b.broker.vhosts["/"].queues[name].attrs.visibility_timeout == 5


def test_CL1_exchange_binding_and_delete_seen_everywhere(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    ex, q = f"ex-{uuid.uuid4().hex[:6]}", f"q-{uuid.uuid4().hex[:6]}"
    conn = _conn(a)
    ch = conn.channel()
    ch.exchange_declare(ex, "topic")  # transient: shared too
    ch.queue_declare(q)
    ch.queue_bind(q, ex, "a.*")
    vb = b.broker.vhosts["/"]
    _eventually(lambda: ex in vb.exchanges and ("q", q) in vb.exchanges[ex].bindings)
    ch.queue_delete(q)
    _eventually(lambda: q not in vb.queues)
    ch.exchange_delete(ex)
    _eventually(lambda: ex not in vb.exchanges)
    conn.close()


def test_CL1_a_later_gateway_starts_with_what_was_declared(js_gateways: Callable[..., Any]) -> None:
    (a,) = js_gateways(1)
    name = f"later-{uuid.uuid4().hex[:6]}"
    conn = _conn(a)
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    time.sleep(0.3)  # the declare's KV write acknowledged
    (b,) = js_gateways(1)
    assert _passive_ok(b, name)


def test_CL4_exclusive_queue_of_another_gateway_is_locked(js_gateways: Callable[..., Any]) -> None:
    a, b = js_gateways(2)
    name = f"excl-{uuid.uuid4().hex[:6]}"
    owner = _conn(a)
    owner.channel().queue_declare(name, exclusive=True)
    _eventually(lambda: name in b.broker.vhosts["/"].queues)
    other = _conn(b)
    with pytest.raises(ChannelClosedByBroker) as e:
        other.channel().basic_consume(name, lambda *a: None)
    assert e.value.reply_code == 405
    other.close()
    owner.close()  # the owner's connection goes: the queue goes on every gateway
    _eventually(lambda: name not in b.broker.vhosts["/"].queues)
