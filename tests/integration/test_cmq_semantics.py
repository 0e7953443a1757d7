"""The CMQ behaviours over the wire, against the gateway only (RabbitMQ differs on purpose).

Where RabbitMQ behaves otherwise the test says so; the README's compatibility table lists
each difference.
"""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration.differential import blocking, expect_fault, pump

# Issue 14: these run on the embedded store and on NATS JetStream (tests/conftest.py).
pytestmark = pytest.mark.both_stores


def _drain(ch, queue: str) -> list[bytes]:  # type: ignore[no-untyped-def]
    out = []
    while (m := ch.basic_get(queue, auto_ack=True))[0] is not None:
        out.append(m[2])
    return out


def test_M2_T1_empty_binding_key_takes_every_message(gateway_url: str, unique: str) -> None:
    """M2/T1: on a direct exchange the binding key "" is a subscription without tags.

    RabbitMQ would route only messages whose routing key is "" to it."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "direct")
        for q, key in (("all", ""), ("red", "red")):
            ch.queue_declare(f"{unique}.{q}")
            ch.queue_bind(f"{unique}.{q}", unique, key)
        for key in ("red", "blue", ""):
            ch.basic_publish(unique, key, key.encode() or b"untagged")
        assert _drain(ch, f"{unique}.all") == [b"red", b"blue", b"untagged"]
        assert _drain(ch, f"{unique}.red") == [b"red"]  # T1: untagged never reaches a tagged one


def test_M2_T1_x_cmq_tags_adds_tags_n_to_m(gateway_url: str, unique: str) -> None:
    """M2/T1 N:M: a message's tags are its routing key plus x-cmq-tags; a subscription
    with several binding keys takes a message that has at least one of them."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "direct")
        ch.queue_declare(f"{unique}.ab")
        ch.queue_bind(f"{unique}.ab", unique, "a")
        ch.queue_bind(f"{unique}.ab", unique, "b")
        ch.queue_declare(f"{unique}.c")
        ch.queue_bind(f"{unique}.c", unique, "c")
        ch.basic_publish(unique, "x", b"x+b+c", pika.BasicProperties(headers={"x-cmq-tags": ["b", "c"]}))
        ch.basic_publish(unique, "a", b"a")
        ch.basic_publish(unique, "z", b"z")
        assert _drain(ch, f"{unique}.ab") == [b"x+b+c", b"a"]
        assert _drain(ch, f"{unique}.c") == [b"x+b+c"]


def test_T4_star_and_hash(gateway_url: str, unique: str) -> None:
    """T4: `*` one non-empty word, `#` zero or more; `1.#.0` takes `1.0`."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "topic")
        for i, key in enumerate(("1.*.0", "1.#.0")):
            ch.queue_declare(f"{unique}.{i}")
            ch.queue_bind(f"{unique}.{i}", unique, key)
        for rk in ("1.x.0", "1.2.3.4.4.2.2.0", "1.0", "1..0", "2.x.0"):
            ch.basic_publish(unique, rk, rk.encode())
        assert _drain(ch, f"{unique}.0") == [b"1.x.0"]
        assert _drain(ch, f"{unique}.1") == [b"1.x.0", b"1.2.3.4.4.2.2.0", b"1.0", b"1..0"]


@pytest.mark.slow
def test_L5_501st_subscription_refused(gateway_url: str, unique: str) -> None:
    """L5/M8: 500 queues bind to one exchange; the 501st binding gets 406 naming L5."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "fanout")
        for i in range(500):
            ch.queue_declare(f"{unique}.{i}", auto_delete=False)
            ch.queue_bind(f"{unique}.{i}", unique, "")
        ch.queue_declare(f"{unique}.501")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_bind(f"{unique}.501", unique, "")
        ch = conn.channel()
        ch.queue_bind(f"{unique}.0", unique, "")  # rebinding an existing pair is no new subscription
        ch.basic_publish(unique, "", b"still routes")
        assert ch.basic_get(f"{unique}.499", auto_ack=True)[2] == b"still routes"
        assert ch.queue_declare(f"{unique}.501", passive=True).method.message_count == 0
    assert e.value.reply_code == 406
    assert "500 subscriptions" in e.value.reply_text and "L5" in e.value.reply_text


def test_L3_L4_tag_and_key_limits_refused(cmq_gateway_url: str, unique: str) -> None:
    """L3: at most 5 tags, each at most 16 characters; L4: keys at most 64 bytes / 15 dots,
    at most 5 binding keys per subscription. Each is a 406 naming the rule in the cmq profile
    (PF2); test_profiles_wire.py has the same inputs passing and reported in compatible (PF4)."""
    with blocking(cmq_gateway_url) as conn:
        faults = {}
        ch = conn.channel()
        ch.exchange_declare(unique, "direct")
        ch.exchange_declare(unique + "-t", "topic")
        ch.queue_declare(unique)

        def attempt(label: str, action) -> None:  # type: ignore[no-untyped-def]
            nonlocal ch
            try:
                faults[label] = expect_fault(action)
            finally:
                ch = conn.channel()

        attempt("tag too long", lambda: ch.queue_bind(unique, unique, "t" * 17))
        attempt("six tags", lambda: (ch.basic_publish(unique, "a", b"x", pika.BasicProperties(
            headers={"x-cmq-tags": ["b", "c", "d", "e", "f"]})), ch.queue_declare(unique, passive=True)))
        attempt("key too long", lambda: ch.queue_bind(unique, unique + "-t", "k" * 65))
        attempt("sixteen dots", lambda: ch.queue_bind(unique, unique + "-t", "." .join("a" * 17)))
        for k in ("k1", "k2", "k3", "k4", "k5"):
            ch.queue_bind(unique, unique + "-t", k)
        attempt("sixth binding key", lambda: ch.queue_bind(unique, unique + "-t", "k6"))
    assert faults == {label: ("channel", 406, "PRECONDITION_FAILED") for label in
                      ("tag too long", "six tags", "key too long", "sixteen dots", "sixth binding key")}


def test_Q1_M11_visibility_timeout_redelivers_and_Q3_stale_ack(cmq_gateway_url: str, unique: str) -> None:
    """Q1/M11: an unacked message turns Active again after the visibility timeout and comes
    back with redelivered set and receive count 2; Q3/M12: an ack with the old delivery tag
    deletes nothing and is no error; the latest one deletes."""
    with blocking(cmq_gateway_url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, arguments={"x-cmq-visibility-timeout": 1})
        ch.basic_publish("", unique, b"v")
        m1, p1, _ = ch.basic_get(unique)
        assert ch.basic_get(unique)[0] is None  # Inactive: nobody else receives it (Q2)
        time.sleep(1.6)
        m2, p2, body = ch.basic_get(unique)
        assert (body, m2.redelivered, p2.headers["x-cmq-receive-count"]) == (b"v", True, 2)
        assert (m1.redelivered, p1.headers["x-cmq-receive-count"]) == (False, 1)
        assert p1.message_id == p2.message_id and p1.message_id.startswith("msg-")
        ch.basic_ack(m1.delivery_tag)  # stale: no channel error
        assert ch.queue_declare(unique, passive=True).method.message_count == 0  # still Inactive
        ch.basic_ack(m2.delivery_tag)
        time.sleep(1.6)
        assert ch.basic_get(unique)[0] is None  # deleted for good


def test_Q4_M10_x_delay_on_default_exchange(gateway_url: str, unique: str) -> None:
    """M10/Q4: x-delay (ms) keeps a message sent to a queue invisible that long."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique)
        ch.basic_publish("", unique, b"later", pika.BasicProperties(headers={"x-delay": 1000}))
        ch.basic_publish("", unique, b"now")
        assert _drain(ch, unique) == [b"now"]
        time.sleep(1.5)
        assert _drain(ch, unique) == [b"later"]


def test_Q4_M9_delay_through_a_topic_refused(gateway_url: str, unique: str) -> None:
    """M9/Q4: delay is a queue feature only: x-delay through an exchange is a 406."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(unique, "fanout")
        fault = expect_fault(lambda: (ch.basic_publish(unique, "", b"x", pika.BasicProperties(
            headers={"x-delay": 1000})), ch.exchange_declare(unique, "fanout", passive=True)))
    assert fault == ("channel", 406, "PRECONDITION_FAILED")


def test_Q6_M15_rewind_with_x_stream_offset(gateway_url: str, unique: str) -> None:
    """Q6/M15: on a queue with rewind, a consumer with x-stream-offset (a timestamp) receives
    again, in production order, every message produced since then, acked or not."""
    with blocking(gateway_url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, arguments={"x-cmq-rewind-seconds": 600})
        start = int(time.time()) - 1
        for b in (b"r1", b"r2", b"r3"):
            ch.basic_publish("", unique, b)
        assert _drain(ch, unique) == [b"r1", b"r2", b"r3"]
        got: list[bytes] = []
        ch.basic_consume(unique, lambda c, m, p, b: got.append(b), auto_ack=True,
                         arguments={"x-stream-offset": start})
        pump(conn, lambda: len(got) >= 3)
    assert got == [b"r1", b"r2", b"r3"]


def test_Q8_dead_letter_after_max_receive_count(cmq_gateway_url: str, unique: str) -> None:
    """Q8/M7: after x-cmq-max-receive-count receives the message moves to the dead-letter queue."""
    with blocking(cmq_gateway_url) as conn:
        ch = conn.channel()
        ch.queue_declare(unique + "-dlq")
        ch.queue_declare(unique, arguments={"x-cmq-dead-letter-queue": unique + "-dlq",
                                            "x-cmq-max-receive-count": 2})
        ch.basic_publish("", unique, b"poison")
        counts = []
        for _ in range(2):
            m, p, _ = ch.basic_get(unique)
            counts.append(p.headers["x-cmq-receive-count"])
            ch.basic_nack(m.delivery_tag, requeue=True)
        assert counts == [1, 2]
        assert ch.basic_get(unique)[0] is None
        assert _drain(ch, unique + "-dlq") == [b"poison"]
