"""RabbitMQ's direct reply-to (amq.rabbitmq.reply-to), as RabbitMQ 3.10 answers it (M16 texts)."""

from __future__ import annotations

from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare, deliveries

R = "amq.rabbitmq.reply-to"


async def test_direct_reply_to_round_trip(broker):
    client, server = Client(broker), Client(broker)
    client.open_channel()
    server.open_channel()
    declare(server, C.Queue.Declare(queue="rpc"))
    [ok] = declare(client, C.Basic.Consume(queue=R, consumer_tag="rt", no_ack=True))
    assert (ok.name, ok.consumer_tag) == ("Basic.ConsumeOk", "rt")
    client.publish(1, "", "rpc", b"request", reply_to=R, correlation_id="c1", headers={"h": 1})
    server.send(1, C.Basic.Get(queue="rpc", no_ack=True))
    [(_, props, body)] = deliveries(server.read())
    assert body == b"request" and props.reply_to.startswith(R + ".") and len(props.reply_to) > len(R) + 1
    assert (props.correlation_id, props.headers["h"]) == ("c1", 1)
    server.publish(1, "", props.reply_to, b"response", correlation_id="c1")
    [(d, rprops, rbody)] = deliveries(client.read())
    assert (d.consumer_tag, d.delivery_tag, d.redelivered, d.exchange, d.routing_key) == (
        "rt", 1, False, "", props.reply_to)
    assert (rbody, rprops.correlation_id, rprops.headers) == (b"response", "c1", None)
    # Once the reply consumer is cancelled, a late reply is unroutable (312 under mandatory).
    declare(client, C.Basic.Cancel(consumer_tag="rt"))
    server.publish(1, "", props.reply_to, b"late", mandatory=True)
    [(ret, _, _)] = deliveries(server.read())
    assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
    assert client.read() == []


def _close_text(c: Client) -> tuple[int, str]:
    [close] = c.methods()
    return close.reply_code, close.reply_text


async def test_direct_reply_to_refusals(broker):
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Basic.Consume(queue=R, no_ack=False))
    assert _close_text(c) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
    c.open_channel(2)
    c.publish(2, "", "anything", b"q", reply_to=R)
    assert _close_text(c) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    c.open_channel(3)
    declare(c, C.Basic.Consume(queue=R, no_ack=True), channel=3)
    c.send(3, C.Basic.Consume(queue=R, no_ack=True))
    assert _close_text(c) == (406, "PRECONDITION_FAILED - reply consumer already set")


async def test_direct_reply_to_passive_declare_and_channel_close(broker):
    c = Client(broker)
    c.open_channel()
    [ok] = declare(c, C.Queue.Declare(queue=R, passive=True))
    assert (ok.queue, ok.message_count, ok.consumer_count) == (R, 0, 1)
    declare(c, C.Basic.Consume(queue=R, no_ack=True))
    assert len(broker.replies._by_key) == 1
    c.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert broker.replies._by_key == {}
