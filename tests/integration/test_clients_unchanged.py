"""Client code written for RabbitMQ runs unchanged against the gateway: pika, aio-pika,
aiormq, kombu and py-amqp through their documented APIs, with default settings, names of
200+ characters, long routing keys and 1 MB bodies, on both brokers (``broker_url``).

Each case declares a direct exchange and a queue with long names, binds them with a long
routing key, publishes a 1 MB body through the exchange and a second one through the default
exchange, reads both back and deletes what it declared.
"""

from __future__ import annotations

import os
import urllib.parse

import pytest

# Issue 14: the gateway runs also on NATS JetStream ([jetstream], tests/conftest.py).
pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

BODY = os.urandom(1 << 20)  # 1 MB, the same for every client
OTHER = BODY[::-1]


def names(unique: str, exchange_chars: int = 210) -> tuple[str, str, str]:
    """A 210-character exchange name, a 220-character queue name, a 200-character key.
    aio-pika and aiormq encode with pamqp, which refuses exchange names over 127 characters
    before they are sent: with them the exchange name is 127 characters."""
    return (f"{unique}.exchange.".ljust(exchange_chars, "x"), f"{unique}.queue.".ljust(220, "q"),
            f"{unique}.key.".ljust(200, "k"))


PAMQP_EXCHANGE_MAX = 127


def test_pika(broker_url: str, unique: str) -> None:
    import pika

    exchange, queue, key = names(unique)
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, "direct")
        ch.queue_declare(queue)
        ch.queue_bind(queue, exchange, key)
        ch.basic_publish(exchange, key, BODY)
        ch.basic_publish("", queue, OTHER)
        got = []
        for method, _props, body in ch.consume(queue, inactivity_timeout=10):
            assert method is not None, "a message never arrived"
            got.append((method.exchange, method.routing_key, body))
            ch.basic_ack(method.delivery_tag)
            if len(got) == 2:
                break
        ch.cancel()
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)
    finally:
        conn.close()
    assert got == [(exchange, key, BODY), ("", queue, OTHER)]


async def test_aio_pika(broker_url: str, unique: str) -> None:
    import aio_pika

    exchange_name, queue_name, key = names(unique, PAMQP_EXCHANGE_MAX)
    conn = await aio_pika.connect_robust(broker_url)
    async with conn:
        ch = await conn.channel()
        exchange = await ch.declare_exchange(exchange_name, aio_pika.ExchangeType.DIRECT)
        queue = await ch.declare_queue(queue_name)
        await queue.bind(exchange, key)
        await exchange.publish(aio_pika.Message(BODY), routing_key=key)
        await ch.default_exchange.publish(aio_pika.Message(OTHER), routing_key=queue_name)
        got = []
        async with queue.iterator(timeout=10) as messages:
            async for message in messages:
                async with message.process():
                    got.append((message.exchange, message.routing_key, message.body))
                if len(got) == 2:
                    break
        await queue.unbind(exchange, key)
        await queue.delete()
        await exchange.delete()
    assert got == [(exchange_name, key, BODY), ("", queue_name, OTHER)]


async def test_aiormq(broker_url: str, unique: str) -> None:
    import aiormq

    exchange, queue, key = names(unique, PAMQP_EXCHANGE_MAX)
    conn = await aiormq.connect(broker_url)
    try:
        ch = await conn.channel()
        await ch.exchange_declare(exchange, exchange_type="direct")
        await ch.queue_declare(queue)
        await ch.queue_bind(queue, exchange, routing_key=key)
        await ch.basic_publish(BODY, exchange=exchange, routing_key=key)
        await ch.basic_publish(OTHER, routing_key=queue)
        got = []
        for _ in range(2):
            message = await ch.basic_get(queue, no_ack=True)
            got.append((message.delivery.exchange, message.delivery.routing_key, message.body))
        await ch.queue_delete(queue)
        await ch.exchange_delete(exchange)
    finally:
        await conn.close()
    assert got == [(exchange, key, BODY), ("", queue, OTHER)]


def test_kombu(broker_url: str, unique: str) -> None:
    import kombu

    exchange_name, queue_name, key = names(unique)
    with kombu.Connection(broker_url) as conn:
        exchange = kombu.Exchange(exchange_name, "direct", durable=False)
        queue = kombu.Queue(queue_name, exchange, routing_key=key, durable=False)
        producer = conn.Producer()
        producer.publish(BODY, exchange=exchange, routing_key=key, declare=[queue],
                         serializer=None, content_type="application/data", content_encoding="binary")
        producer.publish(OTHER, exchange="", routing_key=queue_name, serializer=None,
                         content_type="application/data", content_encoding="binary")
        got = []
        bound = queue(conn.default_channel)
        for _ in range(2):
            message = bound.get(no_ack=True)
            assert message is not None, "a message never arrived"
            info = message.delivery_info
            got.append((info["exchange"], info["routing_key"], message.body))
        bound.delete()
        exchange(conn.default_channel).delete()
    assert got == [(exchange_name, key, BODY), ("", queue_name, OTHER)]


def test_py_amqp(broker_url: str, unique: str) -> None:
    import amqp

    exchange, queue, key = names(unique)
    u = urllib.parse.urlparse(broker_url)
    vhost = urllib.parse.unquote(u.path[1:]) or "/"
    with amqp.Connection(f"{u.hostname}:{u.port}", userid=u.username, password=u.password,
                         virtual_host=vhost) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "direct", auto_delete=False)
        ch.queue_declare(queue, auto_delete=False)
        ch.queue_bind(queue, exchange, key)
        ch.basic_publish(amqp.Message(BODY), exchange=exchange, routing_key=key)
        ch.basic_publish(amqp.Message(OTHER), exchange="", routing_key=queue)
        got = []
        for _ in range(2):
            # On one channel a basic.get follows the publishes before it, on both brokers.
            message = ch.basic_get(queue, no_ack=True)
            assert message is not None, "a message never arrived"
            got.append((message.delivery_info["exchange"], message.delivery_info["routing_key"], message.body))
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)
    assert got == [(exchange, key, BODY), ("", queue, OTHER)]
