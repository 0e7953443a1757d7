"""M11 / W4: a queue's only consumer is served by Broker._dispatch_one (next_consumer's and
has_credit's steps inlined), and an ack read with nothing Active in its queue dispatches
nothing (Broker.ack). What a client sees must be what the general round-robin gives."""

from __future__ import annotations

from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare, deliveries


def _tags(frames):
    return [(d.consumer_tag, d.delivery_tag, body) for d, _, body in deliveries(frames)]


def _one_delivered_one_waiting(broker, queue: str) -> Client:
    """Consumer a (prefetch 1) of ``queue`` has message 0; message 1 waits for its credit."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue=queue), C.Basic.Qos(prefetch_count=1))
    declare(c, C.Basic.Consume(queue=queue, consumer_tag="a"))
    for i in range(2):
        c.publish(1, "", queue, str(i).encode())
    assert _tags(c.read()) == [("a", 1, b"0")]
    return c


async def test_M11_a_lone_consumer_that_found_nothing_keeps_its_turn(broker):
    """Its dispatch found the queue empty: the next message is still its own when a second
    consumer has joined (keep_turn's position, 0), as RabbitMQ's round-robin gives."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="turn"))
    declare(c, C.Basic.Consume(queue="turn", consumer_tag="a"))
    q = broker.vhosts["/"].queues["turn"]
    broker.dispatch(q)  # nothing Active: a keeps its turn
    declare(c, C.Basic.Consume(queue="turn", consumer_tag="b"))
    for i in range(3):
        c.publish(1, "", "turn", str(i).encode())
    assert _tags(c.read()) == [("a", 1, b"0"), ("b", 2, b"1"), ("a", 3, b"2")]


async def test_W4_a_lone_consumer_out_of_credit_passes_its_turn(broker):
    """Its dispatch ended for want of credit (position 1, as next_consumer leaves it): once a
    second consumer joins and the first has credit again, the round-robin goes on from the
    second."""
    c = _one_delivered_one_waiting(broker, "credit")
    q = broker.vhosts["/"].queues["credit"]
    assert q._rr == 1
    c.open_channel(2)  # b: no prefetch
    c.send(2, C.Basic.Consume(queue="credit", consumer_tag="b"))
    assert _tags(c.read()) == [("b", 1, b"1")]
    c.send(1, C.Basic.Ack(delivery_tag=1))  # a has credit again: the turn goes on from b
    for i in range(2, 5):
        c.publish(1, "", "credit", str(i).encode())
    assert _tags(c.read()) == [("b", 2, b"2"), ("a", 2, b"3"), ("b", 3, b"4")]


async def test_W4_an_ack_read_in_a_batch_frees_credit_for_the_next_message(broker):
    """The transport's reads (begin_batch/end_batch): an ack with messages Active behind it
    delivers the next one; an ack with none dispatches nothing, and a publish after it is
    delivered at once."""
    c = _one_delivered_one_waiting(broker, "b1")
    for tag, want in ((1, [("a", 2, b"1")]), (2, [])):
        broker.begin_batch()
        c.send(1, C.Basic.Ack(delivery_tag=tag))
        broker.end_batch()
        assert _tags(c.read()) == want
    broker.begin_batch()
    c.publish(1, "", "b1", b"2")
    broker.end_batch()
    assert _tags(c.read()) == [("a", 3, b"2")]
