"""M16: refusals with RabbitMQ's codes and words (each text checked against RabbitMQ 3.10)."""

from __future__ import annotations

import pytest
from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare


def _refusal(c: Client, *frames) -> tuple[str, int, str]:
    c.send(1, *frames)
    [close] = [m for m in c.methods() if isinstance(m, C.Channel.Close | C.Connection.Close)]
    return close.name, close.reply_code, close.reply_text


@pytest.mark.parametrize(("first", "second", "text"), [
    ({"x-message-ttl": 1000}, {"x-message-ttl": 2000},
     "received '2000' but current is '1000'"),
    (None, {"x-message-ttl": 2000},
     "received the value '2000' of type 'signedint' but current is none"),
    ({"x-message-ttl": 2000}, None,
     "received none but current is the value '2000' of type 'signedint'"),
    ({"x-dead-letter-exchange": "a"}, {"x-dead-letter-exchange": "b"}, "received 'b' but current is 'a'"),
])
async def test_M16_inequivalent_queue_arguments(broker, first, second, text):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="q", arguments=first))
    assert _refusal(c, C.Queue.Declare(queue="q", arguments=second)) == (
        "Channel.Close", 406, f"PRECONDITION_FAILED - inequivalent arg '{next(iter(first or second))}' for queue 'q' "
                      f"in vhost '/': {text}")


async def test_M16_arguments_rabbitmq_does_not_compare_are_ignored_on_redeclare(broker):
    c = Client(broker)
    c.open_channel()
    ok = declare(c, C.Queue.Declare(queue="q", arguments={"foo": "a"}),
                 C.Queue.Declare(queue="q", arguments={"foo": "b"}),
                 C.Exchange.Declare(exchange="x", arguments={"foo": 1}),
                 C.Exchange.Declare(exchange="x"))
    assert [type(m).__name__ for m in ok] == ["DeclareOk"] * 4
    assert broker.vhosts["/"].queues["q"].arguments == {"foo": "a"}


@pytest.mark.parametrize(("first", "second", "arg", "text"), [
    (C.Queue.Declare(queue="q", arguments={"x-cmq-visibility-timeout": 5}), C.Queue.Declare(queue="q"),
     "x-cmq-visibility-timeout", "received none but current is the value '5' of type 'signedint'"),
    (C.Queue.Declare(queue="q", durable=True), C.Queue.Declare(queue="q"),
     "durable", "received 'false' but current is 'true'"),
])
async def test_M16_x_cmq_arguments_and_flags_are_compared(broker, first, second, arg, text):
    c = Client(broker)
    c.open_channel()
    declare(c, first)
    assert _refusal(c, second) == (
        "Channel.Close", 406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue 'q' in vhost '/': {text}")


async def test_M16_delete_if_empty_and_system_exchange_and_amq_prefix(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="full"))
    c.publish(1, "", "full", b"1")
    assert _refusal(c, C.Queue.Delete(queue="full", if_empty=True)) == (
        "Channel.Close", 406, "PRECONDITION_FAILED - queue 'full' in vhost '/' not empty")
    c.open_channel(2)
    c.send(2, C.Exchange.Delete(exchange="amq.direct"))
    [close] = c.methods()
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")
    c.open_channel(3)
    c.send(3, C.Exchange.Declare(exchange="amq.foo"))
    [close] = c.methods()
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'")


async def test_M16_qos_prefetch_size_is_540(broker):
    c = Client(broker)
    c.open_channel()
    assert _refusal(c, C.Basic.Qos(prefetch_size=10)) == (
        "Connection.Close", 540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)")


@pytest.mark.parametrize(("args", "text"), [
    ({"x-expires": 0}, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"),
    ({"x-expires": "a"}, "invalid arg 'x-expires' for queue 'q' in vhost '/': \"expected integer, got longstr\""),
    ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}"),
    ({"x-max-length": -1}, "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"),
    ({"x-overflow": "bogus"}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow"),
    ({"x-dead-letter-exchange": 5}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' "
                                    "in vhost '/'"),
    ({"x-dead-letter-routing-key": "k"}, "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
                                         "routing_key_but_no_dlx_defined"),
    ({"x-single-active-consumer": "yes"}, "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
                                          "{unacceptable_type,longstr}"),
    ({"x-max-priority": 300}, "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,300}"),
])
async def test_M16_rabbitmq_queue_arguments_refused_in_its_words(broker, args, text):
    c = Client(broker)
    c.open_channel()
    assert _refusal(c, C.Queue.Declare(queue="q", arguments=args)) == (
        "Channel.Close", 406, f"PRECONDITION_FAILED - {text}")
    assert "q" not in broker.vhosts["/"].queues
