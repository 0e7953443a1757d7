"""Consumers and settlement: qos (W4), tx (M12/M13 in transactions), rewind (M15/Q6)."""

from __future__ import annotations

import pytest
from pamqp import commands as C

from tests.unit.broker.helpers import Client, declare, deliveries


def _tags(frames):
    return [(d.consumer_tag, d.delivery_tag, body) for d, _, body in deliveries(frames)]


async def test_W4_prefetch_per_consumer_global_false(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="w"), C.Basic.Qos(prefetch_count=2))
    for i in range(5):
        c.publish(1, "", "w", str(i).encode())
    c.send(1, C.Basic.Consume(queue="w", consumer_tag="a"))
    assert _tags(c.read()) == [("a", 1, b"0"), ("a", 2, b"1")]
    c.send(1, C.Basic.Ack(delivery_tag=1))
    assert _tags(c.read()) == [("a", 3, b"2")]
    c.send(1, C.Basic.Ack(delivery_tag=3, multiple=True))
    assert _tags(c.read()) == [("a", 4, b"3"), ("a", 5, b"4")]


async def test_W4_prefetch_global_true_limits_the_channel(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="g1"), C.Queue.Declare(queue="g2"),
            C.Basic.Qos(prefetch_count=3, global_=True))
    for q in ("g1", "g2"):
        for i in range(3):
            c.publish(1, "", q, f"{q}-{i}".encode())
    c.send(1, C.Basic.Consume(queue="g1", consumer_tag="c1"))
    c.send(1, C.Basic.Consume(queue="g2", consumer_tag="c2"))
    got = _tags(c.read())
    assert got == [("c1", 1, b"g1-0"), ("c1", 2, b"g1-1"), ("c1", 3, b"g1-2")]
    c.send(1, C.Basic.Ack(delivery_tag=2))
    assert _tags(c.read()) == [("c2", 4, b"g2-0")]


async def test_W4_qos_without_credit_consumers_keep_round_robin(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="rr"), C.Basic.Qos(prefetch_count=1))
    declare(c, C.Basic.Consume(queue="rr", consumer_tag="a"), C.Basic.Consume(queue="rr", consumer_tag="b"))
    for i in range(3):
        c.publish(1, "", "rr", str(i).encode())
    assert _tags(c.read()) == [("a", 1, b"0"), ("b", 2, b"1")]
    c.send(1, C.Basic.Ack(delivery_tag=2))
    assert _tags(c.read()) == [("b", 3, b"2")]


async def test_M12_tx_publish_is_visible_only_after_commit_and_rollback_drops_it(broker):
    c = Client(broker)
    c.open_channel()
    assert [type(m).__name__ for m in declare(c, C.Queue.Declare(queue="txq"), C.Tx.Select())] == [
        "DeclareOk", "SelectOk"]
    q = broker.vhosts["/"].queues["txq"]
    c.publish(1, "", "txq", b"a")
    assert q.message_count == 0
    assert [type(m).__name__ for m in declare(c, C.Tx.Commit())] == ["CommitOk"]
    assert q.message_count == 1
    c.publish(1, "", "txq", b"b")
    assert [type(m).__name__ for m in declare(c, C.Tx.Rollback())] == ["RollbackOk"]
    declare(c, C.Tx.Commit())
    assert q.message_count == 1


async def test_M12_tx_rollback_keeps_the_original_delivery_tags(broker):
    """As RabbitMQ: acks in a rolled-back transaction never happened; tags do not change."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="txa"), C.Tx.Select())
    for b in (b"m1", b"m2", b"m3"):
        c.publish(1, "", "txa", b)
    declare(c, C.Tx.Commit())
    c.send(1, C.Basic.Consume(queue="txa", consumer_tag="t"))
    assert _tags(c.read()) == [("t", 1, b"m1"), ("t", 2, b"m2"), ("t", 3, b"m3")]
    q = broker.vhosts["/"].queues["txa"]
    c.send(1, C.Basic.Ack(delivery_tag=2, multiple=True))
    c.send(1, C.Basic.Reject(delivery_tag=3, requeue=False))
    assert (q.cmq.inactive, len(q.cmq)) == (3, 3)  # nothing settled before the commit
    declare(c, C.Tx.Rollback())
    ch = c.session.channels[1]
    assert list(ch.unacked) == [1, 2, 3]
    assert ch.consumers["t"].unacked == 3
    c.send(1, C.Basic.Ack(delivery_tag=3))
    c.send(1, C.Basic.Nack(delivery_tag=1, requeue=True))
    declare(c, C.Tx.Commit())
    assert list(ch.unacked) == [2, 4]  # m1 requeued, delivered again as tag 4
    assert (len(q.cmq), q.cmq.inactive) == (2, 2)
    c.send(1, C.Basic.Ack(delivery_tag=4, multiple=True))
    declare(c, C.Tx.Commit())
    assert (len(q.cmq), ch.unacked) == (0, {})


async def test_M12_tx_unknown_tag_is_406_even_inside_a_transaction(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Tx.Select())
    c.send(1, C.Basic.Ack(delivery_tag=9))
    [close] = c.methods()
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 9")


async def test_M14_confirm_and_tx_exclude_each_other(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Tx.Select())
    c.send(1, C.Confirm.Select())
    [close] = c.methods()
    assert (close.reply_code, close.reply_text) == (
        406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


async def test_M15_Q6_rewind_redelivers_deleted_messages_from_a_time(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="rw", arguments={"x-cmq-rewind-seconds": 3600}))
    t0 = broker.now()
    for i in range(3):
        c.publish(1, "", "rw", f"m{i}".encode())
        broker.advance_time(10)
    c.read()
    for _ in range(3):
        c.send(1, C.Basic.Get(queue="rw"))
        [(ok, _, _)] = deliveries(c.read())
        c.send(1, C.Basic.Ack(delivery_tag=ok.delivery_tag))
    q = broker.vhosts["/"].queues["rw"]
    assert (q.message_count, q.cmq.rewindable) == (0, 3)
    c.send(1, C.Basic.Consume(queue="rw", consumer_tag="r", arguments={"x-cmq-rewind-to": int(t0) + 10}))
    assert _tags(c.read()) == [("r", 4, b"m1"), ("r", 5, b"m2")]


async def test_M15_x_stream_offset_that_is_not_a_time_is_refused(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="rw2", arguments={"x-cmq-rewind-seconds": 60}))
    c.send(1, C.Basic.Consume(queue="rw2", arguments={"x-stream-offset": "first"}))
    [close] = c.methods()
    assert close.reply_code == 406
    assert close.reply_text == ("PRECONDITION_FAILED - x-stream-offset 'first' is not a timestamp; only a "
                                "rewind to a time is supported")


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_M13_basic_recover_requeues_and_requeue_false_is_540(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="rec"))
    c.publish(1, "", "rec", b"r")
    c.send(1, C.Basic.Consume(queue="rec", consumer_tag="k"))
    assert _tags(c.read()) == [("k", 1, b"r")]
    c.send(1, C.Basic.Recover(requeue=True))
    frames = c.read()
    assert type(frames[0][1]).__name__ == "RecoverOk"
    [(d, props, _)] = deliveries(frames)
    assert (d.delivery_tag, d.redelivered, props.headers["x-cmq-receive-count"]) == (2, True, 2)
    c.send(1, C.Basic.Recover(requeue=False))
    [close] = c.methods()
    assert isinstance(close, C.Connection.Close)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")


async def test_W4_an_ack_inside_a_transaction_frees_credit_only_at_commit(broker):
    """As RabbitMQ: the prefetch window moves when the transaction commits, not before."""
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="txc"), C.Basic.Qos(prefetch_count=1), C.Tx.Select())
    for b in (b"a", b"b"):
        c.publish(1, "", "txc", b)
    declare(c, C.Tx.Commit())
    c.send(1, C.Basic.Consume(queue="txc", consumer_tag="k"))
    assert _tags(c.read()) == [("k", 1, b"a")]
    c.send(1, C.Basic.Ack(delivery_tag=1))
    assert _tags(c.read()) == []
    c.send(1, C.Tx.Commit())
    frames = c.read()
    assert [type(f).__name__ for _, f in frames][0] == "CommitOk"
    assert _tags(frames) == [("k", 2, b"b")]


async def test_M7_single_active_consumer_only_the_first_receives_until_it_goes(broker):
    c = Client(broker)
    c.open_channel()
    declare(c, C.Queue.Declare(queue="sac", arguments={"x-single-active-consumer": True}),
            C.Basic.Consume(queue="sac", consumer_tag="first"), C.Basic.Consume(queue="sac", consumer_tag="second"))
    for i in range(3):
        c.publish(1, "", "sac", str(i).encode())
    assert _tags(c.read()) == [("first", 1, b"0"), ("first", 2, b"1"), ("first", 3, b"2")]
    c.send(1, C.Basic.Cancel(consumer_tag="first"))  # its unacked stay with the channel
    c.send(1, C.Basic.Recover(requeue=True))
    assert _tags(c.read()) == [("second", 4, b"0"), ("second", 5, b"1"), ("second", 6, b"2")]
