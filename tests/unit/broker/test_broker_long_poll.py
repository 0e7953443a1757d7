"""Q5 / M7 x-cmq-polling-wait-seconds: basic.get long-polls, through a real ServerConnection.

The broker runs on a ManualClock: waits end when the test moves time, never by wall clock.
Each client's frames are handed over as one transport read (begin_batch .. end_batch), as
gateway/transport.py does: a long poll answered during a read replays its channel's held
events at the end of that read.
"""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import body as B
from pamqp import commands as C
from pamqp import header
from pamqp.base import Frame

from gateway.broker import Broker
from tests.unit.broker import helpers
from tests.unit.broker.helpers import declare, deliveries


class Client(helpers.Client):
    def send(self, channel: int, *frames: Frame) -> None:
        broker = self.session.broker
        broker.begin_batch()
        try:
            super().send(channel, *frames)
        finally:
            broker.end_batch()


def _queue(c: Client, name: str, wait: float | None = 5, channel: int = 1, **more: Any) -> None:
    args: dict[str, Any] = dict(more)
    if wait is not None:
        args["x-cmq-polling-wait-seconds"] = wait
    got = declare(c, C.Queue.Declare(queue=name, arguments=args), channel=channel)
    assert [type(m) for m in got] == [C.Queue.DeclareOk]


def _clients(broker: Broker, n: int, wait: float | None = 5, **more: Any) -> list[Client]:
    """``n`` connections with channel 1 open; the first declares the queue "lpq"."""
    clients = [Client(broker) for _ in range(n)]
    for c in clients:
        c.open_channel(1)
    _queue(clients[0], "lpq", wait, **more)
    return clients


def _got(frames: list[tuple[int, Any]]) -> list[tuple[int, str, bytes]]:
    """(channel, method name, body) of each method read, in order (b"" without content)."""
    bodies = {id(fr): body for fr, _, body in deliveries(frames)}
    return [(ch, fr.name, bodies.get(id(fr), b"")) for ch, fr in frames
            if not isinstance(fr, header.ContentHeader | B.ContentBody)]


async def test_Q5_get_waits_and_receives_a_message_published_later(broker: Broker) -> None:
    waiter, publisher = _clients(broker, 2)
    waiter.send(1, C.Basic.Get(queue="lpq"))
    assert waiter.read() == []  # waiting: neither get-ok nor get-empty yet
    broker.advance_time(2.0)
    assert waiter.read() == []
    publisher.publish(1, "", "lpq", b"late")
    frames = waiter.read()
    assert _got(frames) == [(1, "Basic.GetOk", b"late")]
    get_ok = frames[0][1]
    assert (get_ok.delivery_tag, get_ok.redelivered, get_ok.message_count) == (1, False, 0)
    # Not an empty answer arriving later: the wait is over and the message is Inactive.
    broker.advance_time(10.0)
    assert waiter.read() == []
    assert broker.vhosts["/"].queues["lpq"].cmq.inactive == 1


async def test_Q5_get_ends_empty_when_the_wait_ends(broker: Broker) -> None:
    [c] = _clients(broker, 1, wait=1)
    c.send(1, C.Basic.Get(queue="lpq"))
    broker.advance_time(0.9)
    assert c.read() == []
    broker.advance_time(0.1)
    assert _got(c.read()) == [(1, "Basic.GetEmpty", b"")]
    assert broker.vhosts["/"].queues["lpq"].waiters is None


async def test_Q5_polling_wait_0_is_rabbitmq_basic_get(broker: Broker) -> None:
    c = Client(broker)
    c.open_channel(1)
    _queue(c, "zero", wait=0)
    _queue(c, "plain", wait=None)
    for name in ("zero", "plain"):
        c.send(1, C.Basic.Get(queue=name))
        assert _got(c.read()) == [(1, "Basic.GetEmpty", b"")]
        assert broker.vhosts["/"].queues[name].waiters is None


async def test_Q5_waiting_gets_are_served_in_arrival_order(broker: Broker) -> None:
    p, a, b = _clients(broker, 3)
    a.open_channel(2)
    b.send(1, C.Basic.Get(queue="lpq"))      # first
    a.send(2, C.Basic.Get(queue="lpq"))      # second
    a.send(1, C.Basic.Get(queue="lpq"))      # third
    p.publish(1, "", "lpq", b"m1")
    assert _got(b.read()) == [(1, "Basic.GetOk", b"m1")]
    assert a.read() == []
    p.publish(1, "", "lpq", b"m2")
    p.publish(1, "", "lpq", b"m3")
    assert _got(a.read()) == [(2, "Basic.GetOk", b"m2"), (1, "Basic.GetOk", b"m3")]


async def test_Q5_methods_pipelined_on_the_waiting_channel_run_after_the_get_in_order(broker: Broker) -> None:
    c, p = _clients(broker, 2)
    c.open_channel(2)
    _queue(c, "other", wait=None)
    c.send(1, C.Basic.Get(queue="lpq"))
    c.send(1, C.Queue.Declare(queue="other", passive=True))
    c.publish(1, "", "other", b"after")
    c.send(1, C.Basic.Get(queue="other"))
    c.send(1, C.Basic.Get(queue="lpq"))  # waits again once replayed
    c.send(1, C.Queue.Declare(queue="other", passive=True))
    c.send(2, C.Queue.Declare(queue="other", passive=True))  # another channel: not held
    frames = c.read()
    assert _got(frames) == [(2, "Queue.DeclareOk", b"")]
    assert frames[0][1].message_count == 0  # the held publish has not run
    p.publish(1, "", "lpq", b"first")
    frames = c.read()
    assert _got(frames) == [(1, "Basic.GetOk", b"first"), (1, "Queue.DeclareOk", b""),
                            (1, "Basic.GetOk", b"after")]
    assert frames[3][1].message_count == 0  # declare-ok before the publish it preceded ran
    p.publish(1, "", "lpq", b"second")
    assert _got(c.read()) == [(1, "Basic.GetOk", b"second"), (1, "Queue.DeclareOk", b"")]
    # The gets were acked by nobody: delivery tags 1..3 on channel 1, in order.
    assert sorted(broker_channel(c, 1).unacked) == [1, 2, 3]


def broker_channel(c: Client, n: int) -> Any:
    return c.session.channels[n]


async def test_Q5_held_ack_runs_after_the_get_answer(broker: Broker) -> None:
    """basic.get, get-ok, then (pipelined behind a second, waiting get) the ack of the first."""
    c, p = _clients(broker, 2, wait=1)
    p.publish(1, "", "lpq", b"one")
    c.send(1, C.Basic.Get(queue="lpq"))
    assert _got(c.read()) == [(1, "Basic.GetOk", b"one")]
    c.send(1, C.Basic.Get(queue="lpq"))   # waits
    c.send(1, C.Basic.Ack(delivery_tag=1))
    q = broker.vhosts["/"].queues["lpq"]
    assert q.cmq.inactive == 1  # held: not yet acked
    broker.advance_time(1.0)
    assert _got(c.read()) == [(1, "Basic.GetEmpty", b"")]
    assert (len(q.cmq), c.session.channels[1].unacked) == (0, {})


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_Q5_channel_closed_while_waiting_leaves_the_message_for_the_next(broker: Broker) -> None:
    c, p, nxt = _clients(broker, 3)
    c.send(1, C.Basic.Get(queue="lpq"))
    c.publish(1, "", "lpq", b"published-after-the-get")  # held behind the get
    c.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert _got(c.read()) == [(1, "Channel.CloseOk", b"")]
    q = broker.vhosts["/"].queues["lpq"]
    assert q.waiters is None
    # The held publish was still routed; nobody took it.
    assert (q.cmq.active, q.cmq.inactive) == (1, 0)
    p.publish(1, "", "lpq", b"later")
    nxt.send(1, C.Basic.Get(queue="lpq", no_ack=True))
    nxt.send(1, C.Basic.Get(queue="lpq", no_ack=True))
    frames = nxt.read()
    assert _got(frames) == [(1, "Basic.GetOk", b"published-after-the-get"), (1, "Basic.GetOk", b"later")]
    assert [d[1].headers["x-cmq-receive-count"] for d in deliveries(frames)] == [1, 1]


async def test_Q5_connection_lost_while_waiting_cancels_the_waiter(broker: Broker) -> None:
    p, c, nxt = _clients(broker, 3)
    c.send(1, C.Basic.Get(queue="lpq", no_ack=True))
    c.session.on_connection_lost()
    assert broker.vhosts["/"].queues["lpq"].waiters is None
    p.publish(1, "", "lpq", b"kept")
    nxt.send(1, C.Basic.Get(queue="lpq"))
    assert _got(nxt.read()) == [(1, "Basic.GetOk", b"kept")]


@pytest.mark.profile("cmq")  # PF2 limits / M11 receive metadata
async def test_Q5_delay_end_visibility_end_and_requeue_serve_a_waiting_get(broker: Broker) -> None:
    c, p = _clients(broker, 2, wait=30, **{"x-cmq-visibility-timeout": 10})
    # Delay end (Q4).
    p.publish(1, "", "lpq", b"delayed", headers={"x-cmq-delay-seconds": 3})
    c.send(1, C.Basic.Get(queue="lpq"))
    broker.advance_time(2.9)
    assert c.read() == []
    broker.advance_time(0.1)
    frames = c.read()
    assert _got(frames) == [(1, "Basic.GetOk", b"delayed")]
    # Visibility end (Q1): the unacked get comes back to the next waiting get, redelivered.
    c.send(1, C.Basic.Get(queue="lpq"))
    broker.advance_time(9.9)
    assert c.read() == []
    broker.advance_time(0.1)
    frames = c.read()
    assert _got(frames) == [(1, "Basic.GetOk", b"delayed")]
    assert (frames[0][1].delivery_tag, frames[0][1].redelivered) == (2, True)
    # Requeue (M13): basic.reject from another channel's delivery makes it Active for the waiter.
    p.send(1, C.Basic.Get(queue="lpq"))  # Inactive: p waits
    c.send(1, C.Basic.Reject(delivery_tag=2, requeue=True))
    frames = p.read()
    assert _got(frames) == [(1, "Basic.GetOk", b"delayed")]
    assert deliveries(frames)[0][1].headers["x-cmq-receive-count"] == 3


async def test_Q5_queue_deleted_while_a_get_waits_answers_get_empty(broker: Broker) -> None:
    c, other = _clients(broker, 2)
    c.send(1, C.Basic.Get(queue="lpq"))
    assert [m.name for m in declare(other, C.Queue.Delete(queue="lpq"))] == ["Queue.DeleteOk"]
    assert _got(c.read()) == [(1, "Basic.GetEmpty", b"")]
    c.send(1, C.Basic.Get(queue="lpq"))  # the next one: RabbitMQ's 404 for a missing queue
    closed = c.read()
    assert [(fr.name, fr.reply_code) for _, fr in closed] == [("Channel.Close", 404)]


async def test_Q5_consumers_get_messages_after_the_waiting_gets(broker: Broker) -> None:
    c, p = _clients(broker, 2)
    c.open_channel(2)
    declare(c, C.Basic.Consume(queue="lpq", consumer_tag="ct", no_ack=True), channel=2)
    c.send(1, C.Basic.Get(queue="lpq"))
    p.publish(1, "", "lpq", b"to-the-get")
    p.publish(1, "", "lpq", b"to-the-consumer")
    frames = c.read()
    assert [(ch, type(fr).__name__, body) for (fr, _, body), (ch, _) in
            zip(deliveries(frames), [f for f in frames if isinstance(f[1], C.Basic.GetOk | C.Basic.Deliver)],
                strict=True)] == [(1, "GetOk", b"to-the-get"), (2, "Deliver", b"to-the-consumer")]
