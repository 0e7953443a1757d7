"""M6: the default exchange and the amq.* exchanges, the same on RabbitMQ and the gateway.

The default exchange sends straight to the queue named by the routing key (CMQ SendMessage);
it cannot be bound to or deleted, and every vhost has amq.direct, amq.fanout, amq.topic,
amq.headers and amq.match. The same client code runs against RabbitMQ and against the gateway
and the outcomes are compared.
"""

from __future__ import annotations

import pytest

from tests.integration.differential import blocking, expect_fault

# Issue 14: these run on the embedded store and on NATS JetStream (tests/conftest.py).
pytestmark = pytest.mark.both_stores

AMQ_EXCHANGES = {"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
                 "amq.headers": "headers", "amq.match": "headers"}


def _outcome(url: str, unique: str) -> dict[str, object]:
    out: dict[str, object] = {}
    q = f"{unique}.m6"
    with blocking(url) as conn:
        ch = conn.channel()
        for name, kind in AMQ_EXCHANGES.items():
            ch.exchange_declare(name, exchange_type=kind, passive=True)  # 404 if missing
        ch.queue_declare(q)
        ch.basic_publish("", q, b"straight to the queue")
        ch.basic_publish("", f"{unique}.nowhere", b"no such queue: dropped")
        method, _props, body = ch.basic_get(q, auto_ack=True)
        out["default_exchange"] = (method.exchange, method.routing_key, body)
        out["left"] = ch.queue_declare(q, passive=True).method.message_count
    with blocking(url) as conn:
        out["bind_default"] = expect_fault(lambda: conn.channel().queue_bind(q, "", "k"))
    with blocking(url) as conn:
        out["delete_amq"] = expect_fault(lambda: conn.channel().exchange_delete("amq.direct"))
    for name, kind in AMQ_EXCHANGES.items():
        other = "fanout" if kind != "fanout" else "direct"
        with blocking(url) as conn:
            out[f"redeclare {name}"] = expect_fault(
                lambda n=name, o=other: conn.channel().exchange_declare(n, exchange_type=o))
    with blocking(url) as conn:
        out["redeclare durable"] = conn.channel().exchange_declare(
            "amq.direct", exchange_type="direct", durable=True).method.NAME
        out["redeclare transient"] = expect_fault(
            lambda: conn.channel().exchange_declare("amq.direct", exchange_type="direct"))
    with blocking(url) as conn:
        conn.channel().queue_delete(q)
    return out


@pytest.mark.rabbitmq
def test_M6_default_and_amq_exchanges_as_rabbitmq(rabbitmq_url: str, gateway_url: str, unique: str) -> None:
    expected = _outcome(rabbitmq_url, unique)
    got = _outcome(gateway_url, unique)
    assert expected["default_exchange"] == ("", f"{unique}.m6", b"straight to the queue")
    assert expected["left"] == 0
    assert expected["bind_default"][:2] == ("channel", 403)
    assert got == expected
