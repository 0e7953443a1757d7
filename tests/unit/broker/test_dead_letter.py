"""Dead-lettering (M13) with RabbitMQ's x-death history, per-message TTL, CMQ's Q8 queue."""

from __future__ import annotations

import datetime

import pytest
from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare, deliveries

T0 = datetime.datetime.fromtimestamp(1_700_000_000, tz=datetime.UTC)


def _setup(c: Client, **src_args) -> None:
    c.open_channel()
    declare(c, C.Exchange.Declare(exchange="dlx", exchange_type="fanout"),
            C.Queue.Declare(queue="dead"), C.Queue.Bind(queue="dead", exchange="dlx"),
            C.Queue.Declare(queue="src", arguments={"x-dead-letter-exchange": "dlx", **src_args}))


def _get(c: Client, queue: str):
    c.send(1, C.Basic.Get(queue=queue, no_ack=True))
    [(ok, props, body)] = deliveries(c.read())
    return ok, props, body


async def test_M13_reject_without_requeue_dead_letters_with_x_death(broker):
    c = Client(broker)
    _setup(c)
    c.publish(1, "", "src", b"hello", expiration="60000", headers={"a": 1})
    c.send(1, C.Basic.Get(queue="src"))
    [(ok, _, _)] = deliveries(c.read())
    c.send(1, C.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
    ok, props, body = _get(c, "dead")
    # What RabbitMQ 3.10 gives for the same steps (checked with pika against it).
    assert (ok.exchange, ok.routing_key, body, props.expiration) == ("dlx", "src", b"hello", None)
    h = props.headers
    assert h["a"] == 1
    assert h["x-death"] == [{"count": 1, "reason": "rejected", "queue": "src", "time": T0, "exchange": "",
                             "routing-keys": ["src"], "original-expiration": "60000"}]
    assert (h["x-first-death-exchange"], h["x-first-death-queue"], h["x-first-death-reason"]) == (
        "", "src", "rejected")
    assert broker.vhosts["/"].queues["src"].message_count == 0


async def test_M13_dying_again_in_the_same_queue_counts_up(broker):
    c = Client(broker)
    _setup(c)
    c.publish(1, "", "src", b"again")
    for _ in range(2):
        c.send(1, C.Basic.Get(queue="src"))
        [(ok, _, _)] = deliveries(c.read())
        c.send(1, C.Basic.Nack(delivery_tag=ok.delivery_tag, requeue=False))
        _, props, body = _get(c, "dead")
        # The consumer of "dead" republishes to src with the headers it got (as a retry loop does).
        c.publish(1, "", "src", body, headers=props.headers)
    _, props, _ = _get(c, "src")
    deaths = props.headers["x-death"]
    assert [(d["count"], d["reason"], d["queue"]) for d in deaths] == [(2, "rejected", "src")]


async def test_M13_x_message_ttl_expiry_dead_letters_with_reason_expired(broker):
    c = Client(broker)
    _setup(c, **{"x-message-ttl": 1000, "x-dead-letter-routing-key": "late"})
    c.publish(1, "", "src", b"t")
    broker.advance_time(1)
    ok, props, _ = _get(c, "dead")
    assert (ok.exchange, ok.routing_key) == ("dlx", "late")
    assert props.headers["x-death"] == [{"count": 1, "reason": "expired", "queue": "src",
                                         "time": T0 + datetime.timedelta(seconds=1), "exchange": "",
                                         "routing-keys": ["src"]}]


async def test_M7_per_message_expiration_is_honoured_and_removed_on_dead_letter(broker):
    """RabbitMQ's per-message TTL (CMQ has none): expires after `expiration` ms."""
    c = Client(broker)
    _setup(c)
    c.publish(1, "", "src", b"short", expiration="2500")
    broker.advance_time(2.4)
    assert broker.vhosts["/"].queues["src"].message_count == 1
    broker.advance_time(0.1)
    ok, props, _ = _get(c, "dead")
    assert props.expiration is None
    assert props.headers["x-death"][0]["original-expiration"] == "2500"
    assert props.headers["x-death"][0]["reason"] == "expired"


@pytest.mark.parametrize(("expiration", "why"), [
    ("soon", "no_integer"), ("-5", "{value_negative,-5}"),
    ("1.5", '{leftover_string,".5"}')])
async def test_M16_invalid_expiration_is_406_worded_as_rabbitmq(broker, expiration, why):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="q"))
    c.publish(1, "", "q", b"x", expiration=expiration)
    [close] = c.methods()
    assert (close.reply_code, close.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {why}")
    assert broker.vhosts["/"].queues["q"].message_count == 0


async def test_M13_x_max_length_drop_head_dead_letters_as_maxlen(broker):
    c = Client(broker)
    _setup(c, **{"x-max-length": 1})
    c.publish(1, "", "src", b"first")
    c.publish(1, "", "src", b"second")
    ok, props, body = _get(c, "dead")
    assert body == b"first"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert _get(c, "src")[2] == b"second"


async def test_M13_reject_publish_dlx_nacks_and_dead_letters_the_refused_message(broker):
    c = Client(broker)
    _setup(c, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    declare(c, C.Confirm.Select())
    c.publish(1, "", "src", b"in")
    c.publish(1, "", "src", b"refused")
    confirms = [(type(m).__name__, m.delivery_tag) for m in c.methods() if isinstance(m, C.Basic.Ack | C.Basic.Nack)]
    assert confirms == [("Ack", 1), ("Nack", 2)]
    ok, props, body = _get(c, "dead")
    assert (body, props.headers["x-death"][0]["reason"]) == (b"refused", "maxlen")
    assert _get(c, "src")[2] == b"in"


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_M7_x_delivery_limit_dead_letters_as_delivery_limit(broker):
    """M7: x-delivery-limit is the receive count: past 2 receives, the next one dead-letters."""
    c = Client(broker)
    _setup(c, **{"x-delivery-limit": 2})
    c.publish(1, "", "src", b"poison")
    for rc in (1, 2):
        c.send(1, C.Basic.Get(queue="src"))
        [(ok, props, _)] = deliveries(c.read())
        assert props.headers["x-cmq-receive-count"] == rc
        c.send(1, C.Basic.Nack(delivery_tag=ok.delivery_tag, requeue=True))
    c.send(1, C.Basic.Get(queue="src"))
    assert [type(m).__name__ for m in c.methods()] == ["GetEmpty"]
    ok, props, body = _get(c, "dead")
    assert body == b"poison"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"


async def test_M7_x_delivery_limit_applies_to_consumers_too(broker):
    c = Client(broker)
    _setup(c, **{"x-delivery-limit": 1})
    c.publish(1, "", "src", b"poison")
    c.send(1, C.Basic.Consume(queue="src", consumer_tag="x"))
    [(d, _, _)] = deliveries(c.read())
    c.send(1, C.Basic.Nack(delivery_tag=d.delivery_tag, requeue=True))
    assert deliveries(c.read()) == []
    assert broker.vhosts["/"].queues["dead"].message_count == 1


async def test_Q8_cmq_dead_letter_queue_after_max_receive_count(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="dlq"),
            C.Queue.Declare(queue="work", arguments={"x-cmq-dead-letter-queue": "dlq",
                                                      "x-cmq-max-receive-count": 2,
                                                      "x-cmq-visibility-timeout": 5}))
    c.publish(1, "", "work", b"w")
    for _ in range(2):
        c.send(1, C.Basic.Get(queue="work"))
        assert len(deliveries(c.read())) == 1
        broker.advance_time(5)
    q = broker.vhosts["/"].queues
    assert (q["work"].message_count, len(q["work"].cmq), q["dlq"].message_count) == (0, 0, 1)
    assert _get(c, "dlq")[2] == b"w"


async def test_M13_an_automatic_dead_letter_cycle_is_dropped_a_rejected_one_is_not(broker):
    """As RabbitMQ 3.10: a queue that dead-letters expired messages to itself drops them; one
    whose message was rejected by a consumer takes it back (x-death count 1)."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="loop", arguments={"x-message-ttl": 200, "x-dead-letter-exchange": "",
                                                        "x-dead-letter-routing-key": "loop"}),
            C.Queue.Declare(queue="back", arguments={"x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": "back"}))
    c.publish(1, "", "loop", b"loop")
    c.publish(1, "", "back", b"rej")
    c.send(1, C.Basic.Get(queue="back"))
    [(ok, _, _)] = deliveries(c.read())
    c.send(1, C.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
    broker.advance_time(1)
    qs = broker.vhosts["/"].queues
    assert (len(qs["loop"].cmq), qs["back"].message_count) == (0, 1)
    _, props, body = _get(c, "back")
    assert (body, props.headers["x-death"][0]["count"]) == (b"rej", 1)
