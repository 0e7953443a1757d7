"""The same pika code against RabbitMQ and the gateway: outcomes must be equal.

Each scenario runs on RabbitMQ first and its outcome is checked against the exact values
RabbitMQ gives (so the scenario itself is known to be right), then on the gateway, whose
outcome must equal RabbitMQ's after removing the gateway's M11 additions.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.differential import blocking, expect_fault, message_outcome, pump

# Issue 14: the gateway runs also on NATS JetStream ([jetstream], tests/conftest.py).
pytestmark = [pytest.mark.rabbitmq, pytest.mark.both_stores]

Scenario = Callable[[str, str], Any]


def differential(scenario: Scenario, rabbitmq_url: str, gateway_url: str, unique: str) -> Any:
    rabbit = scenario(rabbitmq_url, unique)
    gateway = scenario(gateway_url, unique)
    assert gateway == rabbit
    return rabbit


# pika cannot encode floats in tables; the aio-pika tests cover them.
HEADERS: dict[str, Any] = {
    "str": "text ü", "int": 7, "neg": -3, "big": 2**40, "true": True,
    "false": False, "none": None, "dec": decimal.Decimal("3.14"),
    "when": datetime.datetime(2024, 5, 6, 7, 8, 9), "table": {"a": 1, "b": ["x", 2]},
    "list": [1, "two", False], "bytes": b"\x00\xff",
}
PROPS = pika.BasicProperties(
    content_type="application/json", content_encoding="gzip", headers=HEADERS, delivery_mode=2,
    priority=5, correlation_id="corr-1", reply_to="replies", expiration="60000",
    message_id="my-id-1", timestamp=1_700_000_000, type="order.created", user_id="guest",
    app_id="tests", cluster_id="c1",
)


def test_every_property_and_header_type_round_trips(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name)
            ch.basic_publish("", name, b"payload", PROPS)
            ch.basic_publish("", name, b"", pika.BasicProperties())
            got = [ch.basic_get(name, auto_ack=True) for _ in range(3)]
            ch.queue_delete(name)
        return [None if m[0] is None else message_outcome(*m) for m in got]

    out = differential(scenario, rabbitmq_url, gateway_url, unique)
    assert out[0]["body"] == b"payload"
    assert out[0]["props"]["headers"]["big"] == ("long", 2**40)  # pika decodes type l as its long
    assert out[0]["props"]["headers"]["dec"] == ("Decimal", decimal.Decimal("3.14"))
    assert out[0]["props"]["message_id"] == "my-id-1"
    assert out[1] == {"body": b"", "redelivered": False, "exchange": "", "routing_key": unique,
                      "props": {f: None for f in out[1]["props"]}}
    assert out[2] is None


def test_order_and_ack_with_consumer(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name, durable=True)
            for i in range(20):
                ch.basic_publish("", name, str(i).encode(), pika.BasicProperties(delivery_mode=2))
            bodies = []
            for method, _props, body in ch.consume(name, inactivity_timeout=2):
                if method is None:
                    break
                bodies.append(body)
                ch.basic_ack(method.delivery_tag)
                if len(bodies) == 20:
                    break
            ch.cancel()
            left = ch.queue_declare(name, passive=True).method.message_count
            ch.queue_delete(name)
        return bodies, left

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == (
        [str(i).encode() for i in range(20)], 0)


def test_routing_direct_topic_fanout_headers(rabbitmq_url, gateway_url, unique) -> None:
    """M2/M3/M4/M5 where CMQ and RabbitMQ agree (non-empty keys)."""

    def scenario(url: str, name: str) -> Any:
        kinds = {"direct": ["red", "blue"], "topic": ["1.*.0", "1.#.0", "#"], "fanout": ["ignored"]}
        keys = ["red", "blue", "green", "1.x.0", "1.2.3.4.4.2.2.0", "1.0", "1.x.1"]
        seen: dict[str, Any] = {}
        with blocking(url) as conn:
            ch = conn.channel()
            for kind, bkeys in kinds.items():
                x = f"{name}.{kind}"
                ch.exchange_declare(x, kind)
                for i, bk in enumerate(bkeys):
                    ch.queue_declare(f"{x}.q{i}")
                    ch.queue_bind(f"{x}.q{i}", x, bk)
                for key in keys:
                    ch.basic_publish(x, key, key.encode())
                for i, _ in enumerate(bkeys):
                    msgs = []
                    while (m := ch.basic_get(f"{x}.q{i}", auto_ack=True))[0] is not None:
                        msgs.append(m[2])
                    seen[f"{kind}.q{i}"] = msgs
                    ch.queue_delete(f"{x}.q{i}")
                ch.exchange_delete(x)
            hx = f"{name}.headers"
            ch.exchange_declare(hx, "headers")
            ch.queue_declare(f"{hx}.all")
            ch.queue_bind(f"{hx}.all", hx, "", {"x-match": "all", "a": 1, "b": "z"})
            ch.queue_declare(f"{hx}.any")
            ch.queue_bind(f"{hx}.any", hx, "", {"x-match": "any", "a": 1, "b": "z"})
            for h in ({"a": 1, "b": "z"}, {"a": 1}, {"b": "y"}):
                ch.basic_publish(hx, "", repr(h).encode(), pika.BasicProperties(headers=h))
            for q in ("all", "any"):
                seen[f"headers.{q}"] = [ch.basic_get(f"{hx}.{q}", auto_ack=True)[2] for _ in range(3)]
                ch.queue_delete(f"{hx}.{q}")
            ch.exchange_delete(hx)
        return seen

    out = differential(scenario, rabbitmq_url, gateway_url, unique)
    assert out["direct.q0"] == [b"red"]
    assert out["topic.q0"] == [b"1.x.0"]
    assert out["topic.q1"] == [b"1.x.0", b"1.2.3.4.4.2.2.0", b"1.0"]  # T4
    assert out["topic.q2"] == [k.encode() for k in
                               ["red", "blue", "green", "1.x.0", "1.2.3.4.4.2.2.0", "1.0", "1.x.1"]]
    assert out["fanout.q0"] == out["topic.q2"]
    assert out["headers.all"] == [b"{'a': 1, 'b': 'z'}", None, None]
    assert out["headers.any"] == [b"{'a': 1, 'b': 'z'}", b"{'a': 1}", None]


def test_M13_nack_reject_requeue(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name)
            for b in (b"a", b"b", b"c"):
                ch.basic_publish("", name, b)
            steps = []
            m, _, body = ch.basic_get(name)
            steps.append((body, m.redelivered))
            ch.basic_nack(m.delivery_tag, requeue=True)
            m, _, body = ch.basic_get(name)
            steps.append((body, m.redelivered))
            ch.basic_reject(m.delivery_tag, requeue=False)  # a gone for good
            m, _, body = ch.basic_get(name)
            steps.append((body, m.redelivered))
            ch.basic_reject(m.delivery_tag, requeue=True)
            m, _, body = ch.basic_get(name)
            steps.append((body, m.redelivered))
            ch.basic_nack(m.delivery_tag, requeue=False)
            m, _, body = ch.basic_get(name)
            steps.append((body, m.redelivered))
            ch.basic_ack(m.delivery_tag)
            steps.append(ch.basic_get(name)[0])
            ch.queue_delete(name)
        return steps

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == [
        (b"a", False), (b"a", True), (b"b", False), (b"b", True), (b"c", False), None]


def test_M13_unacked_return_on_channel_close(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name)
            ch.basic_publish("", name, b"x")
            first = ch.basic_get(name)[0].redelivered
            ch.close()
            ch2 = conn.channel()
            m = ch2.basic_get(name, auto_ack=True)[0]
            ch2.queue_delete(name)
        return first, m.redelivered

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == (False, True)


def test_W4_prefetch_per_consumer(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name)
            for i in range(5):
                ch.basic_publish("", name, str(i).encode())
            ch.basic_qos(prefetch_count=2)
            got: list[Any] = []
            ch.basic_consume(name, lambda c, m, p, b: got.append((m.delivery_tag, b)))
            pump(conn, lambda: len(got) >= 2)
            first = list(got)
            ch.basic_ack(got[-1][0], multiple=True)
            pump(conn, lambda: len(got) >= 4)
            ch.queue_delete(name)
        return first, got

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == (
        [(1, b"0"), (2, b"1")], [(1, b"0"), (2, b"1"), (3, b"2"), (4, b"3")])


def test_M14_confirms_and_M9_mandatory_return(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(name, durable=True)
            ch.exchange_declare(name, "direct")
            ch.basic_publish("", name, b"ok", pika.BasicProperties(delivery_mode=2), mandatory=True)
            try:
                ch.basic_publish(name, "nowhere", b"lost", mandatory=True)
                returned = None
            except pika.exceptions.UnroutableError as e:
                returned = [(m.method.reply_code, m.method.reply_text, m.body) for m in e.messages]
            count = ch.queue_declare(name, passive=True).method.message_count
            ch.queue_delete(name)
            ch.exchange_delete(name)
        return returned, count

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == ([(312, "NO_ROUTE", b"lost")], 1)


def test_transactions_commit_and_rollback(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name)
            ch.tx_select()
            ch.basic_publish("", name, b"rolled back")
            ch.tx_rollback()
            after_rollback = ch.queue_declare(name, passive=True).method.message_count
            ch.basic_publish("", name, b"committed")
            before_commit = ch.queue_declare(name, passive=True).method.message_count
            ch.tx_commit()
            m = ch.basic_get(name)
            ch.basic_ack(m[0].delivery_tag)
            ch.tx_rollback()  # the ack is undone: the message stays unacked on this channel
            held = ch.basic_get(name)[0]
            ch.close()  # and comes back when the channel closes
            ch = conn.channel()
            again = ch.basic_get(name, auto_ack=True)
            ch.queue_delete(name)
        return after_rollback, before_commit, m[2], held, again[2], again[0].redelivered

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == (
        0, 0, b"committed", None, b"committed", True)


def test_M16_faults_and_reply_codes(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        faults = {}
        with blocking(url) as conn:
            ch = conn.channel()
            faults["passive missing queue"] = expect_fault(lambda: ch.queue_declare(name + "nope", passive=True))
            ch = conn.channel()
            faults["publish to missing exchange"] = expect_fault(
                lambda: (ch.basic_publish(name + "nope", "k", b"x"), ch.queue_declare("", exclusive=True)))
            ch = conn.channel()
            ch.queue_declare(name, durable=False)
            faults["redeclare with other durable"] = expect_fault(lambda: ch.queue_declare(name, durable=True))
            ch = conn.channel()
            ch.exchange_declare(name, "fanout")
            faults["redeclare exchange other type"] = expect_fault(lambda: ch.exchange_declare(name, "topic"))
            ch = conn.channel()
            faults["consume missing queue"] = expect_fault(lambda: ch.basic_consume(name + "nope", print))
            ch = conn.channel()
            faults["unknown delivery tag"] = expect_fault(
                lambda: (ch.basic_ack(99), ch.queue_declare(name, passive=True)))
            ch = conn.channel()
            ch.queue_declare(name + "excl", exclusive=True)
            with blocking(url) as other:
                och = other.channel()
                faults["exclusive elsewhere"] = expect_fault(lambda: och.queue_declare(name + "excl"))
            ch = conn.channel()
            faults["bind missing exchange"] = expect_fault(lambda: ch.queue_bind(name, name + "nope", "k"))
            ch = conn.channel()
            faults["delete amq.direct"] = expect_fault(lambda: ch.exchange_declare("amq.nope", "direct"))
            ch = conn.channel()
            ch.queue_delete(name)
            ch.exchange_delete(name)
        with blocking(url) as conn:
            ch = conn.channel()
            faults["unknown exchange type"] = expect_fault(lambda: ch.exchange_declare(name, "nope-type"))
        return faults

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == {
        "passive missing queue": ("channel", 404, "NOT_FOUND"),
        "publish to missing exchange": ("channel", 404, "NOT_FOUND"),
        "redeclare with other durable": ("channel", 406, "PRECONDITION_FAILED"),
        "redeclare exchange other type": ("channel", 406, "PRECONDITION_FAILED"),
        "consume missing queue": ("channel", 404, "NOT_FOUND"),
        "unknown delivery tag": ("channel", 406, "PRECONDITION_FAILED"),
        "exclusive elsewhere": ("channel", 405, "RESOURCE_LOCKED"),
        "bind missing exchange": ("channel", 404, "NOT_FOUND"),
        "delete amq.direct": ("channel", 403, "ACCESS_REFUSED"),
        "unknown exchange type": ("connection", 503, "COMMAND_INVALID"),
    }


def test_purge_delete_counts_and_server_named_queue(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url) as conn:
            ch = conn.channel()
            ch.queue_declare(name)
            for _ in range(3):
                ch.basic_publish("", name, b"x")
            purged = ch.queue_purge(name).method.message_count
            ch.basic_publish("", name, b"y")
            deleted = ch.queue_delete(name).method.message_count
            gen = ch.queue_declare("", exclusive=True).method.queue
        return purged, deleted, gen.startswith("amq.gen-")

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == (3, 1, True)


def test_W3_heartbeat_negotiated_and_kept(rabbitmq_url, gateway_url, unique) -> None:
    def scenario(url: str, name: str) -> Any:
        with blocking(url, heartbeat=1) as conn:
            negotiated = conn._impl.params.heartbeat
            conn.sleep(3.5)  # three intervals idle: heartbeats must keep it open both ways
            ch = conn.channel()
            ok = ch.queue_declare("", exclusive=True).method.message_count
        return negotiated, conn.is_closed, ok

    assert differential(scenario, rabbitmq_url, gateway_url, unique) == (1, True, 0)
