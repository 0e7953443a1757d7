"""M7/CL2: x-max-length with each x-overflow, on RabbitMQ, the embedded store and JetStream.

Differential: every test runs against RabbitMQ (the reference), the gateway on its embedded
store and the gateway on NATS JetStream (``both_stores``, tests/conftest.py), with pika over
real sockets, and asserts the same outcome on all three.
"""

from __future__ import annotations

import time
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.differential import blocking

pytestmark = pytest.mark.both_stores


def _declare(ch, name: str, **arguments) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare(name, arguments=arguments)


def _publish(ch, queue: str, bodies: list[bytes]) -> list[bool]:  # type: ignore[no-untyped-def]
    """Published under confirms: True for each basic.ack, False for each basic.nack."""
    out = []
    for body in bodies:
        try:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
            out.append(True)
        except pika.exceptions.NackError:
            out.append(False)
    return out


def _get_all(ch, queue: str) -> list[tuple[bytes, object]]:  # type: ignore[no-untyped-def]
    out = []
    while (m := ch.basic_get(queue, auto_ack=True))[0] is not None:
        out.append((m[2], m[1]))
    return out


def _bodies(n: int) -> list[bytes]:
    return [b"m%d" % i for i in range(n)]


def _reason(props) -> str:  # type: ignore[no-untyped-def]
    reason = props.headers["x-death"][0]["reason"]
    return reason.decode() if isinstance(reason, bytes) else reason


def _with_dead_letters(url: str, name: str, n: int, **arguments: object) -> tuple[list[bytes], list[bytes], list[bool]]:
    """n messages published to a queue dead-lettering into ``<name>.dlq``: what the queue
    kept, what was dead-lettered (each with x-death reason maxlen), the confirms."""
    with blocking(url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        _declare(ch, f"{name}.dlq")
        _declare(ch, name, **arguments, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{name}.dlq"})
        acked = _publish(ch, name, _bodies(n))
        kept = [b for b, _ in _get_all(ch, name)]
        dead = _get_all(ch, f"{name}.dlq")
        assert {_reason(p) for _, p in dead} <= {"maxlen"}
        ch.queue_delete(name)
        ch.queue_delete(f"{name}.dlq")
    return kept, [b for b, _ in dead], acked


@pytest.mark.rabbitmq
def test_M7_max_length_drop_head_keeps_the_newest(broker_url: str, unique: str) -> None:
    """drop-head (the default): the oldest ready messages go, the publish is acked."""
    with blocking(broker_url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        _declare(ch, unique, **{"x-max-length": 3})
        assert _publish(ch, unique, _bodies(5)) == [True] * 5
        assert ch.queue_declare(unique, passive=True).method.message_count == 3
        assert [b for b, _ in _get_all(ch, unique)] == [b"m2", b"m3", b"m4"]
        ch.queue_delete(unique)


@pytest.mark.rabbitmq
def test_M7_max_length_drop_head_dead_letters_with_reason_maxlen(broker_url: str, unique: str) -> None:
    kept, dead, acked = _with_dead_letters(broker_url, unique, 5, **{"x-max-length": 2})
    assert acked == [True] * 5
    assert (kept, dead) == ([b"m3", b"m4"], [b"m0", b"m1", b"m2"])


@pytest.mark.rabbitmq
def test_M7_max_length_reject_publish_nacks_past_the_limit(broker_url: str, unique: str) -> None:
    with blocking(broker_url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        _declare(ch, unique, **{"x-max-length": 2, "x-overflow": "reject-publish"})
        assert _publish(ch, unique, _bodies(4)) == [True, True, False, False]
        assert [b for b, _ in _get_all(ch, unique)] == [b"m0", b"m1"]
        assert _publish(ch, unique, [b"again"]) == [True]  # room again once consumed
        ch.queue_delete(unique)


@pytest.mark.rabbitmq
def test_M7_max_length_counts_ready_messages_only(broker_url: str, unique: str) -> None:
    """Messages delivered and not yet acked do not count (RabbitMQ counts ready ones)."""
    with blocking(broker_url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        _declare(ch, unique, **{"x-max-length": 2, "x-overflow": "reject-publish"})
        assert _publish(ch, unique, _bodies(2)) == [True, True]
        held = [ch.basic_get(unique)[0] for _ in range(2)]  # unacked
        assert all(m is not None for m in held)
        assert _publish(ch, unique, [b"n0", b"n1", b"n2"]) == [True, True, False]
        for m in held:
            ch.basic_ack(m.delivery_tag)
        assert [b for b, _ in _get_all(ch, unique)] == [b"n0", b"n1"]
        ch.queue_delete(unique)


@pytest.mark.rabbitmq
def test_M7_max_length_reject_publish_dlx_dead_letters_the_refused(broker_url: str, unique: str) -> None:
    kept, dead, acked = _with_dead_letters(broker_url, unique, 3, **{"x-max-length": 1,
                                                                     "x-overflow": "reject-publish-dlx"})
    assert acked == [True, False, False]
    assert (kept, dead) == ([b"m0"], [b"m1", b"m2"])


def test_M7_CL1_drop_head_across_two_gateways_drops_each_message_once(js_gateways) -> None:  # type: ignore[no-untyped-def]
    """Publishes through two gateways into one drop-head queue: the queue ends with the limit,
    and every other message is dead-lettered exactly once (a stream delete succeeds once)."""
    a, b = js_gateways(2)
    name = f"ml-{uuid.uuid4().hex[:8]}"
    urls = [f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F" for gw in (a, b)]
    with blocking(urls[0]) as conn:
        ch = conn.channel()
        _declare(ch, f"{name}.dlq")
        _declare(ch, name, **{"x-max-length": 3, "x-dead-letter-exchange": "",
                              "x-dead-letter-routing-key": f"{name}.dlq"})
    deadline = time.monotonic() + 10
    while name not in b.broker.vhosts["/"].queues:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with blocking(urls[0]) as ca, blocking(urls[1]) as cb:
        cha, chb = ca.channel(), cb.channel()
        cha.confirm_delivery()
        chb.confirm_delivery()
        for i in range(10):
            assert _publish(cha, name, [b"a%d" % i]) == [True]
            assert _publish(chb, name, [b"b%d" % i]) == [True]
        kept = [body for body, _ in _get_all(cha, name)]
        dead = [body for body, _ in _get_all(chb, f"{name}.dlq")]
    assert len(kept) == 3
    assert sorted(kept + dead) == sorted([b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)])
    assert kept == [b"b8", b"a9", b"b9"]  # the newest: each publish above was confirmed in turn


def test_M7_CL1_drop_head_confirm_follows_the_trim(js_gateways) -> None:  # type: ignore[no-untyped-def]
    """A drop-head publish is confirmed once the queue has dropped what it pushed over the
    limit, as on RabbitMQ: right after each confirm, another gateway counts the limit, never
    one more (the trim runs after JetStream stores the message; the confirm waits for it)."""
    a, b = js_gateways(2)
    name = f"ml-{uuid.uuid4().hex[:8]}"
    with blocking(f"amqp://guest:guest@127.0.0.1:{a.port}/%2F") as conn:
        conn.channel().queue_declare(name, arguments={"x-max-length": 2})
    deadline = time.monotonic() + 10
    while name not in b.broker.vhosts["/"].queues:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with blocking(f"amqp://guest:guest@127.0.0.1:{a.port}/%2F") as ca, \
            blocking(f"amqp://guest:guest@127.0.0.1:{b.port}/%2F") as cb:
        cha, chb = ca.channel(), cb.channel()
        cha.confirm_delivery()
        counts = []
        for i in range(12):
            assert _publish(cha, name, [b"m%d" % i]) == [True]
            counts.append(chb.queue_declare(name, passive=True).method.message_count)
        assert counts == [1] + [2] * 11
        assert [body for body, _ in _get_all(chb, name)] == [b"m10", b"m11"]
        chb.queue_delete(name)
