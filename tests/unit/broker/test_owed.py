"""W5: Broker.owed, the queues whose last dispatch ended for want of a consumer's credit. The
transport lets a busy publisher wait while such a consumer's input is unread (its acks let the
deliveries out: gateway.transport.owed_input_waiting); a queue leaves the set when a dispatch
ends for want of a message, and when it is deleted."""

from __future__ import annotations

from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare, deliveries


def _consumer(broker, queue: str, prefetch: int, tags: tuple[str, ...] = ("a",)) -> Client:
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue=queue), C.Basic.Qos(prefetch_count=prefetch))
    for tag in tags:
        declare(c, C.Basic.Consume(queue=queue, consumer_tag=tag))
    return c


def _delivery_tags(c: Client) -> list[int]:
    return [d.delivery_tag for d, _, _ in deliveries(c.read())]


async def test_W5_a_lone_consumer_out_of_credit_is_owed_until_its_queue_is_drained(broker):
    c = _consumer(broker, "owed-one", prefetch=1)
    q = broker.vhosts["/"].queues["owed-one"]
    c.publish(1, "", "owed-one", b"0")
    assert _delivery_tags(c) == [1]
    assert q in broker.owed  # its credit went with the delivery: the loop stopped for want of it
    c.publish(1, "", "owed-one", b"1")
    assert _delivery_tags(c) == [] and q in broker.owed  # message 1 waits for a's ack
    c.send(1, C.Basic.Ack(delivery_tag=1))
    assert _delivery_tags(c) == [2] and q in broker.owed  # the ack let it out; credit is spent again
    c.send(1, C.Basic.Ack(delivery_tag=2))
    c.publish(1, "", "owed-one", b"2")
    assert _delivery_tags(c) == [3]
    c.send(1, C.Basic.Ack(delivery_tag=3))
    c.publish(1, "", "owed-one", b"3")  # its dispatch: delivered with credit to spare
    assert _delivery_tags(c) == [4]
    c.send(1, C.Basic.Qos(prefetch_count=10))
    c.read()
    broker.dispatch(q)  # credit left and nothing to deliver: owed nothing
    assert q not in broker.owed


async def test_W5_round_robin_owes_when_every_consumer_is_out_of_credit(broker):
    c = _consumer(broker, "owed-rr", prefetch=1, tags=("a", "b"))
    q = broker.vhosts["/"].queues["owed-rr"]
    for i in range(3):
        c.publish(1, "", "owed-rr", str(i).encode())
    assert _delivery_tags(c) == [1, 2]
    assert q in broker.owed  # message 2 waits: neither a nor b has credit
    c.send(1, C.Basic.Ack(delivery_tag=1))
    assert _delivery_tags(c) == [3]
    c.send(1, C.Basic.Ack(delivery_tag=2))
    c.send(1, C.Basic.Ack(delivery_tag=3))
    broker.dispatch(q)  # credit for both, nothing Active
    assert q not in broker.owed


async def test_W5_a_deleted_queue_is_owed_nothing(broker):
    c = _consumer(broker, "owed-gone", prefetch=1)
    q = broker.vhosts["/"].queues["owed-gone"]
    for i in range(2):
        c.publish(1, "", "owed-gone", str(i).encode())
    assert q in broker.owed
    declare(c, C.Queue.Delete(queue="owed-gone"))
    assert q not in broker.owed  # nor is the queue object kept alive by the set
