"""Persistent bodies stay in the store (issue 15): a persistent message in one durable queue
lets go of its body once its record is durable, and reads it back when it is delivered; a
restart rebuilds the queues from the records' heads only. What still needs a body after its
record goes (dead-lettering, a rewind: Q6, M13) gets it back into memory first."""

from __future__ import annotations

from gateway.broker import Broker
from gateway.broker.message import DiskMessage, Message
from gateway.memory import HELD
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock

BODY = bytes(range(256)) * 4  # 1 KB


def _declare(vh, name: str, **arguments) -> None:
    vh.declare_queue(None, name, passive=False, durable=True, exclusive=False, auto_delete=False,
                     arguments=arguments or None)


def _persistent() -> Properties:
    return Properties.build(delivery_mode=2)


async def test_a_durable_body_leaves_memory_and_is_delivered_from_the_store(tmp_path):
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    vh = b.vhost("/")
    _declare(vh, "dq")
    vh.publish("", "dq", _persistent(), BODY)
    vh.publish("", "dq", _persistent(), b"small")  # under DISK_BODY_MIN: kept
    q = vh.queues["dq"]
    [big, small] = [m.payload for m in q.cmq.messages()]
    assert type(big) is Message  # not durable yet: the body is all there is
    held = HELD.messages
    b.sync_now()
    assert type(big) is DiskMessage and type(small) is Message
    assert HELD.messages == held - len(BODY)
    receipt = q.receive(clock.now())
    assert receipt.message.payload.body == BODY
    assert q.cmq.delete(receipt, clock.now())
    b.unpersist_message(q, receipt.message, body_needed=False)
    await b.close()


async def test_a_message_in_two_queues_keeps_its_body(tmp_path):
    b = await Broker.open(str(tmp_path), clock=ManualClock())
    vh = b.vhost("/")
    vh.declare_exchange("fan", "fanout", passive=False, durable=True, auto_delete=False, internal=False,
                        arguments=None)
    for name in ("a", "z"):
        _declare(vh, name)
        vh.bind(None, "fan", ("q", name), "", None)
    vh.publish("fan", "", _persistent(), BODY)
    b.sync_now()
    [m] = list(vh.queues["a"].cmq.messages())
    assert type(m.payload) is Message and m.payload.body == BODY
    await b.close()


async def test_restart_indexes_records_and_reads_bodies_on_delivery(tmp_path):
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    vh = b.vhost("/")
    _declare(vh, "dq")
    for i in range(20):
        vh.publish("", "dq", _persistent(), bytes([i]) * 1000)
    vh.publish("", "dq", Properties.build(delivery_mode=2, headers={"h": "x" * 600}), BODY)  # a long head
    vh.publish("", "dq", _persistent(), b"tiny")
    await b.close()

    b2 = await Broker.open(str(tmp_path), clock=clock)
    q = b2.vhosts["/"].queues["dq"]
    assert q.message_count == 22
    kinds = [type(m.payload) for m in q.cmq.messages()]
    assert kinds == [DiskMessage] * 21 + [Message]
    bodies = []
    while (r := q.receive(clock.now())) is not None:
        bodies.append(r.message.payload.body)
    assert bodies == [bytes([i]) * 1000 for i in range(20)] + [BODY, b"tiny"]
    last = list(q.cmq.messages())[20].payload
    assert last.properties.headers == {"h": "x" * 600}
    await b2.close()


async def test_M13_a_dead_lettered_body_is_read_back_before_its_record_goes(tmp_path):
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    vh = b.vhost("/")
    vh.declare_exchange("dlx", "fanout", passive=False, durable=True, auto_delete=False, internal=False,
                        arguments=None)
    _declare(vh, "dead")
    vh.bind(None, "dlx", ("q", "dead"), "", None)
    _declare(vh, "src", **{"x-dead-letter-exchange": "dlx", "x-message-ttl": 1000})
    vh.publish("", "src", _persistent(), BODY)
    b.sync_now()
    assert type(next(vh.queues["src"].cmq.messages()).payload) is DiskMessage
    b.advance_time(2.0)  # expired: dead-lettered after its record in "src" was deleted
    dead = vh.queues["dead"]
    assert dead.message_count == 1
    assert dead.receive(clock.now()).message.payload.body == BODY
    await b.close()


async def test_Q6_an_acked_body_kept_for_rewind_is_read_back_first(tmp_path):
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    vh = b.vhost("/")
    _declare(vh, "rq", **{"x-cmq-rewind-seconds": 3600})
    vh.publish("", "rq", _persistent(), BODY)
    b.sync_now()
    q = vh.queues["rq"]
    r = q.receive(clock.now())
    assert type(r.message.payload) is DiskMessage
    assert q.cmq.delete(r, clock.now())
    b.unpersist_message(q, r.message, body_needed=False)  # as an ack does
    assert q.cmq.rewind(clock.now() - 60, clock.now()) == 1
    assert q.receive(clock.now()).message.payload.body == BODY
    await b.close()
