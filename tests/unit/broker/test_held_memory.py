"""W5: the held-memory counter (gateway/memory.py) follows messages in and out exactly."""

from __future__ import annotations

import gc

from pamqp import commands as C

from gateway.broker import Broker, BrokerConfig
from gateway.memory import HELD, MESSAGE_OVERHEAD
from semantics.clock import ManualClock
from tests.unit.broker.helpers import Client
from tests.unit.protocol.amqp_pipe import Pipe, content_frames


async def test_W5_held_bytes_follow_messages_through_queues_and_back_to_zero() -> None:
    """A message routed to two queues is held once; it is given back when the last queue
    lets go of it, so the counter returns to where it was."""
    b = await Broker.open(None, clock=ManualClock(), config=BrokerConfig(fsync=False))
    c = Client(b)
    c.open_channel()
    c.send(1, C.Queue.Declare(queue="a"), C.Queue.Declare(queue="b"),
           C.Queue.Bind(queue="a", exchange="amq.fanout"), C.Queue.Bind(queue="b", exchange="amq.fanout"))
    c.methods()
    gc.collect()
    before = HELD.messages
    for _ in range(10):
        c.publish(1, "amq.fanout", "", b"x" * 1000)
    held = HELD.messages - before
    assert 10 * (1000 + MESSAGE_OVERHEAD) <= held < 10 * (1000 + MESSAGE_OVERHEAD + 100)  # once, not twice
    for _ in range(10):
        c.send(1, C.Basic.Get(queue="b", no_ack=True))
    c.read()
    assert HELD.messages - before == held  # still in queue a
    for _ in range(10):
        c.send(1, C.Basic.Get(queue="a", no_ack=True))
    c.read()
    gc.collect()
    assert HELD.messages == before
    await b.close()


def test_W5_partial_body_bytes_as_they_arrive_and_none_once_complete() -> None:
    """The protocol core reports the body bytes of contents still being assembled."""
    pipe = Pipe()
    pipe.handshake()
    pipe.open_channel(1)
    body = b"y" * 300_000
    frames = content_frames(1, body)
    head = len(content_frames(1, b""))  # the content header frame alone
    step = head + 131072 + 10  # the header, a whole body frame and a little of the next
    assert pipe.send(1, C.Basic.Publish(routing_key="q")) == []
    assert pipe.feed(frames[:step]) == []
    held = pipe.server.partial_body_bytes()
    assert held == 131072 - 8
    (content,) = pipe.feed(frames[step:])
    assert content.body == body and pipe.server.partial_body_bytes() == 0
