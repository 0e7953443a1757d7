"""The core path through a real ServerConnection: declare, bind, publish, consume, ack."""

from __future__ import annotations

import pytest
from pamqp import commands as C

from tests.unit.broker.helpers import Client


async def test_M2_direct_exchange_routes_by_tag_and_empty_binding_takes_all(broker):
    """M2 / T1: the routing key is the tag; binding key "" takes every message."""
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Exchange.Declare(exchange="orders", exchange_type="direct"))
    c.send(1, C.Queue.Declare(queue="apple"), C.Queue.Declare(queue="all"))
    c.send(1, C.Queue.Bind(queue="apple", exchange="orders", routing_key="apple"))
    c.send(1, C.Queue.Bind(queue="all", exchange="orders", routing_key=""))
    c.read()
    c.publish(1, "orders", "xiaomi", b"m1")
    c.publish(1, "orders", "apple", b"m2")
    vh = broker.vhosts["/"]
    assert vh.queues["apple"].message_count == 1
    assert vh.queues["all"].message_count == 2


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_M11_consume_delivers_with_cmq_headers_and_ack_deletes(broker):
    """M11: message_id is the CMQ ID, x-cmq-* headers; M12: ack deletes."""
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Queue.Declare(queue="work"))
    c.read()
    c.publish(1, "", "work", b"hello")
    c.send(1, C.Basic.Consume(queue="work", consumer_tag="ct"))
    frames = c.read()
    kinds = [type(f).__name__ for _, f in frames]
    assert kinds == ["ConsumeOk", "Deliver", "ContentHeader", "ContentBody"]
    deliver = frames[1][1]
    props = frames[2][1].properties
    assert deliver.consumer_tag == "ct" and deliver.delivery_tag == 1 and deliver.redelivered is False
    assert props.message_id.startswith("msg-")
    assert props.headers["x-cmq-msg-id"] == props.message_id
    assert props.headers["x-cmq-receive-count"] == 1
    assert frames[3][1].value == b"hello"
    q = broker.vhosts["/"].queues["work"]
    assert q.cmq.inactive == 1
    c.send(1, C.Basic.Ack(delivery_tag=1))
    assert (q.cmq.inactive, q.cmq.active, len(q.cmq)) == (0, 0, 0)


async def test_M12_unknown_delivery_tag_closes_channel_406(broker):
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Basic.Ack(delivery_tag=7))
    [close] = c.methods()
    assert isinstance(close, C.Channel.Close)
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 7")


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_Q3_M12_stale_ack_deletes_nothing(broker):
    """Q3/M12: after the visibility timeout another consumer received it: the old ack is stale."""
    a, b = Client(broker), Client(broker)
    a.open_channel()
    b.open_channel()
    a.send(1, C.Queue.Declare(queue="vis", arguments={"x-cmq-visibility-timeout": 5}))
    a.publish(1, "", "vis", b"x")
    a.send(1, C.Basic.Consume(queue="vis", consumer_tag="a"))
    a.read()
    a.send(1, C.Basic.Cancel(consumer_tag="a"))
    broker.advance_time(6)
    b.send(1, C.Basic.Consume(queue="vis", consumer_tag="b"))
    frames = b.read()
    deliver = frames[1][1]
    assert deliver.redelivered is True
    assert frames[2][1].properties.headers["x-cmq-receive-count"] == 2
    a.send(1, C.Basic.Ack(delivery_tag=1))  # stale: no error, nothing deleted
    q = broker.vhosts["/"].queues["vis"]
    assert q.cmq.inactive == 1
    assert [type(m).__name__ for m in a.methods()] == ["CancelOk"]
    b.send(1, C.Basic.Ack(delivery_tag=1))
    assert len(q.cmq) == 0


async def test_M9_mandatory_unroutable_returns_312(broker):
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Exchange.Declare(exchange="t", exchange_type="topic"))
    c.read()
    c.publish(1, "t", "a.b", b"x", mandatory=True)
    frames = c.read()
    ret = frames[0][1]
    assert isinstance(ret, C.Basic.Return)
    assert (ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key) == (312, "NO_ROUTE", "t", "a.b")


async def test_M14_confirms_ack_each_publish(broker):
    c = Client(broker)
    c.open_channel()
    c.send(1, C.Confirm.Select(), C.Queue.Declare(queue="cq"))
    c.read()
    c.publish(1, "", "cq", b"1")
    c.publish(1, "", "cq", b"2")
    acks = [m for m in c.methods() if isinstance(m, C.Basic.Ack)]
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(1, False), (2, False)]
