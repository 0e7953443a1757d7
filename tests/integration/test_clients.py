"""Real client libraries end to end, each run against RabbitMQ and against the gateway.

The same code and the same exact expectations on both: pika SelectConnection, aio-pika,
aiormq, kombu (py-amqp, AMQPLAIN login) and a Celery task with the rpc:// result backend.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import os
import subprocess
import sys
from pathlib import Path

import aio_pika
import aiormq
import kombu
import pika
import pytest
from celery import Celery
from pika.adapters.select_connection import SelectConnection

# Issue 14: the gateway runs also on NATS JetStream ([jetstream], tests/conftest.py).
pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]
ROOT = Path(__file__).resolve().parents[2]


async def test_aio_pika_confirms_types_and_consume(broker_url: str, unique: str) -> None:
    """W1: aio-pika needs publisher_confirms; floats and nested tables round-trip."""
    headers = {"f": 2.5, "i": -7, "s": "ü", "b": True, "d": decimal.Decimal("1.25"),
               "t": {"n": [1, 2.0, "x"]}, "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)}
    conn = await aio_pika.connect(broker_url, timeout=10)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue(unique, durable=True)
        x = await ch.declare_exchange(unique, aio_pika.ExchangeType.TOPIC)
        await q.bind(x, "a.#")
        for i in range(3):
            confirm = await x.publish(
                aio_pika.Message(f"m{i}".encode(), headers=headers, correlation_id=f"c{i}",
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=f"a.{i}")
            assert confirm.name == "Basic.Ack"
        got = []
        async with q.iterator() as it:
            async for msg in it:
                async with msg.process():
                    got.append((msg.body, msg.routing_key, msg.correlation_id,
                                {k: v for k, v in msg.headers.items() if not k.startswith("x-cmq-")}))
                if len(got) == 3:
                    break
        await q.delete()
        await x.delete()
    assert got == [(f"m{i}".encode(), f"a.{i}", f"c{i}", headers) for i in range(3)]


async def test_aiormq_get_nack_and_mandatory_return(broker_url: str, unique: str) -> None:
    conn = await aiormq.connect(broker_url)
    try:
        ch = await conn.channel()
        await ch.queue_declare(unique)
        await ch.basic_publish(b"one", routing_key=unique)
        first = await ch.basic_get(unique)
        await ch.basic_nack(first.delivery_tag, requeue=True)
        again = await ch.basic_get(unique)
        await ch.basic_ack(again.delivery_tag)
        empty = await ch.basic_get(unique)
        # aiormq turns a basic.return in confirm mode into PublishError (M9: 312 NO_ROUTE).
        with pytest.raises(aiormq.exceptions.PublishError) as returned:
            await ch.basic_publish(b"lost", exchange="amq.direct", routing_key=unique + "none",
                                   mandatory=True, properties=aiormq.spec.Basic.Properties(message_id="r1"))
        await ch.queue_delete(unique)
    finally:
        await conn.close()
    assert (first.body, first.delivery.redelivered) == (b"one", False)
    assert (again.body, again.delivery.redelivered) == (b"one", True)
    assert empty.delivery.name == "Basic.GetEmpty"
    assert (returned.value.frame.reply_code, returned.value.frame.reply_text) == (312, "NO_ROUTE")
    assert returned.value.message.body == b"lost"


def test_kombu_amqplain_simple_queue(broker_url: str, unique: str) -> None:
    """W2: py-amqp logs in with AMQPLAIN."""
    with kombu.Connection(broker_url.replace("amqp://", "pyamqp://"), login_method="AMQPLAIN",
                          connect_timeout=10) as conn:
        q = conn.SimpleQueue(unique)
        for i in range(3):
            q.put({"n": i, "who": "kombu"})
        got = []
        for _ in range(3):
            m = q.get(timeout=5)
            got.append(m.payload)
            m.ack()
        q.close()
        conn.default_channel.queue_delete(unique)
    assert got == [{"n": i, "who": "kombu"} for i in range(3)]


def test_pika_select_connection_publish_consume(broker_url: str, unique: str) -> None:
    result: dict[str, object] = {}

    def on_open(conn: SelectConnection) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch) -> None:  # type: ignore[no-untyped-def]
        def on_declared(_frame) -> None:  # type: ignore[no-untyped-def]
            ch.basic_publish("", unique, b"select", pika.BasicProperties(app_id="sel"))
            ch.basic_consume(unique, on_message)

        def on_message(chan, method, props, body) -> None:  # type: ignore[no-untyped-def]
            result["msg"] = (body, props.app_id, method.redelivered)
            chan.basic_ack(method.delivery_tag)
            chan.queue_delete(unique, callback=lambda _f: chan.connection.close())

        ch.queue_declare(unique, callback=on_declared)

    conn = SelectConnection(pika.URLParameters(broker_url), on_open_callback=on_open,
                            on_close_callback=lambda c, e: c.ioloop.stop())
    conn.ioloop.call_later(15, conn.ioloop.stop)  # hang protection only
    conn.ioloop.start()
    assert result["msg"] == (b"select", "sel", False)


def test_celery_task_round_trip(broker_url: str, unique: str) -> None:
    """A Celery worker (a subprocess) runs a task sent through the broker; rpc:// returns it."""
    env = {**os.environ, "CMQ_TEST_BROKER_URL": broker_url.replace("amqp://", "pyamqp://"),
           "CMQ_TEST_CELERY_QUEUE": unique}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.celery_app", "worker", "--pool=solo",
         "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel=WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # A fresh client app per broker: Celery caches its connection pools per app.
    client = Celery(unique, broker=env["CMQ_TEST_BROKER_URL"], backend="rpc://")
    try:
        result = client.send_task("cmq_gateway_tests.add", (2, 40), queue=unique)
        assert result.get(timeout=60) == 42
    finally:
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate(timeout=20)
        with kombu.Connection(env["CMQ_TEST_BROKER_URL"]) as conn:
            conn.default_channel.queue_delete(unique)
        client.close()
    assert b"Traceback" not in err


async def test_aio_pika_basic_get_sees_all_queued(broker_url: str, unique: str) -> None:
    conn = await aio_pika.connect(broker_url)
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue(unique, auto_delete=False)
        for i in range(4):
            await ch.default_exchange.publish(aio_pika.Message(bytes([i])), routing_key=unique)
        await asyncio.sleep(0)
        bodies = []
        while (m := await q.get(no_ack=True, fail=False)) is not None:
            bodies.append(m.body)
        await q.delete()
    assert bodies == [b"\x00", b"\x01", b"\x02", b"\x03"]
