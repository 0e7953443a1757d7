"""Deliveries from JetStream keep coming (issue 28, M11/M12): several pull requests under way at
once, each delivery counted against the request JetStream filled, and what an expired request
did not bring taken from JetStream's own count. A consumer with prefetch 1000 that acks every
delivery used to get exactly max_ack_pending (20,000) messages and no more; a no-ack consumer
was pulled for 64 messages a round trip.

No timing is asserted: a stall shows as messages missing at a generous deadline."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest

from gateway.jetstream.publisher import REFUSED, STORED, UNKNOWN, reading
from gateway.jetstream.wire import Delivery, hpub, parse_headers, pub

MAX_ACK_PENDING = 20_000  # the shared consumer's (semantics.jetstream.config)


def _conn(gw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.port))


def _publish(gw: Any, name: str, n: int, durable: bool) -> None:
    conn = _conn(gw)
    ch = conn.channel()
    ch.queue_declare(name, durable=durable)
    ch.confirm_delivery()  # so that every message is in JetStream before the consumer starts
    props = pika.BasicProperties(delivery_mode=2 if durable else 1)
    for i in range(n):
        ch.basic_publish("", name, b"%d" % i, props)
    conn.close()


def _consume(gw: Any, name: str, n: int, *, no_ack: bool, deadline_s: float = 300.0) -> list[int]:
    conn = _conn(gw)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=0 if no_ack else 1000)
    got: list[int] = []
    deadline = time.monotonic() + deadline_s
    for method, _props, body in ch.consume(name, auto_ack=no_ack, inactivity_timeout=1.0):
        if method is not None:
            got.append(int(body))
            if not no_ack:
                ch.basic_ack(method.delivery_tag)
        if len(got) >= n or time.monotonic() > deadline:
            break
    ch.cancel()
    conn.close()
    return got


def _pulls_settle(q: Any) -> None:
    """With nothing left to deliver, the requests under way expire (PULL_WAIT) and are
    renewed: what this gateway thinks it asked for is what its live requests ask for."""
    s = q.stored  # the queue's pulls and leases here (gateway.jetstream.queues.QueueStream)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if s.requested == sum(p[0] for p in s.pulls.values()) and len(s.pulls) <= 16:
            return
        time.sleep(0.2)
    raise AssertionError(f"requested {s.requested}, pulls {s.pulls}")


def test_M12_acking_consumer_gets_more_than_max_ack_pending(js_gateways: Callable[..., Any]) -> None:
    (gw,) = js_gateways(1)
    name = f"flow-ack-{uuid.uuid4().hex[:6]}"
    n = MAX_ACK_PENDING + 5_000
    _publish(gw, name, n, durable=False)
    got = _consume(gw, name, n, no_ack=False)
    assert len(got) == n and sorted(got) == list(range(n))
    q = gw.broker.vhosts["/"].queues[name]
    assert q.cmq.active == 0 and not q.stored.leases
    _pulls_settle(q)


@pytest.mark.parametrize("durable", [False, True])
def test_M11_no_ack_consumer_gets_each_message_once(js_gateways: Callable[..., Any], durable: bool) -> None:
    (gw,) = js_gateways(1)
    name = f"flow-noack-{uuid.uuid4().hex[:6]}"
    n = 6_000
    _publish(gw, name, n, durable=durable)
    got = _consume(gw, name, n, no_ack=True)
    assert sorted(got) == list(range(n))
    q = gw.broker.vhosts["/"].queues[name]
    _pulls_settle(q)
    assert q.cmq.active == 0 and not q.stored.leases


def test_wire_headers_as_nats_py_reads_them() -> None:
    assert parse_headers(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 14\r\n"
                         b"Nats-Pending-Bytes: 0\r\n\r\n") == {
        "Status": "408", "Description": "Request Timeout", "Nats-Pending-Messages": "14", "Nats-Pending-Bytes": "0"}
    assert parse_headers(b"NATS/1.0 404\r\n\r\n") == {"Status": "404"}
    assert parse_headers(b"NATS/1.0\r\nNats-Msg-Id: msg-1\r\nCmq-Visible-At: 1.5\r\n\r\n") == {
        "Nats-Msg-Id": "msg-1", "Cmq-Visible-At": "1.5"}
    assert pub("a.b", "", b"+ACK")[0] == b"PUB a.b 4\r\n+ACK\r\n"
    assert pub("a.b", "_I.1", b"{}")[0] == b"PUB a.b _I.1 2\r\n{}\r\n"
    hdr = b"NATS/1.0\r\nNats-Msg-Id: m\r\n\r\n"
    assert hpub("s", "r.1", {"Nats-Msg-Id": "m"}, b"xy")[0] == b"HPUB s r.1 %d %d\r\n%sxy\r\n" % (
        len(hdr), len(hdr) + 2, hdr)
    d = Delivery("s", "r", b"x", None)
    assert (d.subject, d.reply, d.data, d.headers) == ("s", "r", b"x", None)


def test_CL3_pubacks_as_the_server_writes_them() -> None:
    """nats-server 2.9 writes ``{"stream":"S", "seq":N}`` (a space after the comma): read by
    the fast path, and still a sequence of 0 is not a store (the PubAck rule)."""
    assert reading(None, b'{"stream":"S", "seq":12}') == STORED
    assert reading(None, b'{"stream":"S", "seq":12,"duplicate": true}') == STORED
    assert reading(None, b'{"stream":"S", "seq":0,"duplicate": true}') == UNKNOWN
    assert reading(None, b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}') == REFUSED
