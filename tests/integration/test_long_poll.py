"""Q5 / M7 x-cmq-polling-wait-seconds over the wire: basic.get long-polls.

Real clients (aio-pika, and raw frames for pipelining) against a gateway in this event loop
(port 0). Gateway-only: RabbitMQ has no long-polling basic.get. Nothing asserts on elapsed
time; where a test needs a get to be waiting first, it reads the gateway's queue state.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import aio_pika
import pytest
from aio_pika.exceptions import QueueEmpty
from pamqp import body as B
from pamqp import commands as C
from pamqp import frame as F
from pamqp import header
from pamqp.base import Frame

from gateway.server import Gateway, running_gateway

WAIT = "x-cmq-polling-wait-seconds"


def _url(gw: Gateway) -> str:
    return f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"


async def _waiting(gw: Gateway, queue: str, n: int) -> None:
    """Until ``n`` basic.gets wait on ``queue`` (a hang guard of 2,000 loop turns, no clock)."""
    for _ in range(2000):
        q = gw.broker.vhosts["/"].queues.get(queue)
        if q is not None and (len(q.waiters) if q.waiters is not None else 0) == n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{n} gets never waited on {queue}")


async def test_Q5_get_waits_and_receives_a_message_published_later() -> None:
    async with running_gateway(port=0, hosts=("127.0.0.1",), profile="cmq") as gw:
        getter = await aio_pika.connect(_url(gw), timeout=10)
        publisher = await aio_pika.connect(_url(gw), timeout=10)
        async with getter, publisher:
            ch = await getter.channel()
            q = await ch.declare_queue("lp.later", arguments={WAIT: 10})
            get = asyncio.ensure_future(q.get(no_ack=True, timeout=30))
            await _waiting(gw, "lp.later", 1)
            await asyncio.sleep(0.5)
            assert not get.done()  # still waiting: no get-empty came back
            pch = await publisher.channel()
            await pch.default_exchange.publish(aio_pika.Message(b"half a second later"), routing_key="lp.later")
            msg = await get  # get-ok: aio-pika raises QueueEmpty on get-empty
            assert (msg.body, msg.redelivered, msg.headers["x-cmq-receive-count"]) == (b"half a second later", False, 1)


async def test_Q5_get_ends_empty_after_the_wait() -> None:
    async with running_gateway(port=0, hosts=("127.0.0.1",)) as gw:
        conn = await aio_pika.connect(_url(gw), timeout=10)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("lp.empty", arguments={WAIT: 1})
            with pytest.raises(QueueEmpty):
                await q.get(no_ack=True, timeout=30)
            assert gw.broker.vhosts["/"].queues["lp.empty"].waiters is None


async def test_Q5_polling_wait_0_is_rabbitmq_basic_get() -> None:
    async with running_gateway(port=0, hosts=("127.0.0.1",)) as gw:
        conn = await aio_pika.connect(_url(gw), timeout=10)
        async with conn:
            ch = await conn.channel()
            for name, args in (("lp.zero", {WAIT: 0}), ("lp.plain", None)):
                q = await ch.declare_queue(name, arguments=args)
                with pytest.raises(QueueEmpty):
                    await q.get(no_ack=True, timeout=30)
                await ch.default_exchange.publish(aio_pika.Message(b"now"), routing_key=name)
                assert (await q.get(no_ack=True, timeout=30)).body == b"now"


async def test_Q5_two_waiting_channels_are_served_in_arrival_order() -> None:
    async with running_gateway(port=0, hosts=("127.0.0.1",)) as gw:
        conn = await aio_pika.connect(_url(gw), timeout=10)
        async with conn:
            first_ch, second_ch, pub = await conn.channel(), await conn.channel(), await conn.channel()
            first = await first_ch.declare_queue("lp.order", arguments={WAIT: 30})
            second = await second_ch.declare_queue("lp.order", arguments={WAIT: 30})
            got_first = asyncio.ensure_future(first.get(no_ack=True, timeout=60))
            await _waiting(gw, "lp.order", 1)
            got_second = asyncio.ensure_future(second.get(no_ack=True, timeout=60))
            await _waiting(gw, "lp.order", 2)
            await pub.default_exchange.publish(aio_pika.Message(b"m1"), routing_key="lp.order")
            assert (await got_first).body == b"m1"
            assert not got_second.done()
            await pub.default_exchange.publish(aio_pika.Message(b"m2"), routing_key="lp.order")
            assert (await got_second).body == b"m2"


class RawClient:
    """AMQP 0-9-1 frames over a socket, so methods can be pipelined behind a waiting get."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = cls(reader, writer)
        writer.write(b"AMQP\x00\x00\x09\x01")
        assert isinstance(await c.frame(), C.Connection.Start)
        c.send(0, C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest"))
        tune = await c.frame()
        c.send(0, C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        c.send(0, C.Connection.Open(virtual_host="/"))
        assert isinstance(await c.frame(), C.Connection.OpenOk)
        return c

    def send(self, channel: int, *frames: Frame) -> None:
        self.writer.write(b"".join(F.marshal(fr, channel) for fr in frames))

    def publish_frames(self, routing_key: str, body: bytes) -> tuple[Frame, ...]:
        return (C.Basic.Publish(exchange="", routing_key=routing_key),
                header.ContentHeader(0, len(body), C.Basic.Properties()), B.ContentBody(body))

    async def frame(self) -> Any:
        head = await self.reader.readexactly(7)
        size = struct.unpack(">I", head[3:7])[0]
        rest = await self.reader.readexactly(size + 1)
        return F.unmarshal(head + rest)[2]

    async def methods(self, n: int) -> list[tuple[str, Any, bytes]]:
        """The next ``n`` methods: (name, method, body or b"")."""
        out = []
        while len(out) < n:
            fr = await self.frame()
            body = b""
            if isinstance(fr, C.Basic.GetOk):
                hdr = await self.frame()
                body = (await self.frame()).value if hdr.body_size else b""
            out.append((fr.name, fr, body))
        return out


async def test_Q5_methods_pipelined_on_the_waiting_channel_run_after_the_get_in_order() -> None:
    async with running_gateway(port=0, hosts=("127.0.0.1",)) as gw:
        raw = await RawClient.open(gw.port)
        publisher = await aio_pika.connect(_url(gw), timeout=10)
        async with publisher:
            raw.send(1, C.Channel.Open())
            raw.send(1, C.Queue.Declare(queue="lp.pipe", arguments={WAIT: 30}))
            raw.send(1, C.Queue.Declare(queue="lp.other"))
            assert [m[0] for m in await raw.methods(3)] == ["Channel.OpenOk", "Queue.DeclareOk", "Queue.DeclareOk"]
            # One write: the get waits; the rest of the channel's methods wait behind it.
            raw.send(1, C.Basic.Get(queue="lp.pipe", no_ack=True),
                     C.Queue.Declare(queue="lp.other", passive=True),
                     *raw.publish_frames("lp.other", b"published behind the get"),
                     C.Basic.Get(queue="lp.other", no_ack=True))
            await _waiting(gw, "lp.pipe", 1)
            for _ in range(2000):  # until the transport has read all of it (hang guard, no clock)
                if sorted(len(ch.held) for s in gw.broker.sessions for ch in s.channels.values()
                          if ch.held is not None) == [3]:
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError("the pipelined methods were never held")
            assert gw.broker.vhosts["/"].queues["lp.other"].message_count == 0  # the publish is held
            pch = await publisher.channel()
            await pch.default_exchange.publish(aio_pika.Message(b"answer"), routing_key="lp.pipe")
            got = await raw.methods(3)
            assert [(name, body) for name, _, body in got] == [
                ("Basic.GetOk", b"answer"), ("Queue.DeclareOk", b""), ("Basic.GetOk", b"published behind the get")]
            assert got[1][1].message_count == 0  # declare-ok answered before the publish behind it ran
        raw.writer.close()


async def _consume(url: str, queue: str, n: int) -> list[tuple[bytes, bool, int]]:
    conn = await aio_pika.connect(url, timeout=10)
    got = []
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, arguments={WAIT: 30})
        async with q.iterator() as it:
            async for msg in it:
                async with msg.process():
                    got.append((msg.body, msg.redelivered, msg.headers["x-cmq-receive-count"]))
                if len(got) == n:
                    break
    return got


async def test_Q5_channel_closed_while_waiting_leaves_the_message_for_the_next_consumer() -> None:
    """aio-pika sends channel.close only after its pending get ends, so raw frames close the
    channel while the get waits. A publish pipelined behind the get still counts."""
    async with running_gateway(port=0, hosts=("127.0.0.1",), profile="cmq") as gw:
        raw = await RawClient.open(gw.port)
        raw.send(1, C.Channel.Open(), C.Queue.Declare(queue="lp.closed", arguments={WAIT: 30}))
        assert [m[0] for m in await raw.methods(2)] == ["Channel.OpenOk", "Queue.DeclareOk"]
        raw.send(1, C.Basic.Get(queue="lp.closed", no_ack=True), *raw.publish_frames("lp.closed", b"behind"))
        await _waiting(gw, "lp.closed", 1)
        raw.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        assert [m[0] for m in await raw.methods(1)] == ["Channel.CloseOk"]
        q = gw.broker.vhosts["/"].queues["lp.closed"]
        assert (q.waiters, q.cmq.active, q.cmq.inactive) == (None, 1, 0)
        publisher = await aio_pika.connect(_url(gw), timeout=10)
        async with publisher:
            pch = await publisher.channel()
            await pch.default_exchange.publish(aio_pika.Message(b"kept"), routing_key="lp.closed")
        assert await _consume(_url(gw), "lp.closed", 2) == [(b"behind", False, 1), (b"kept", False, 1)]
        raw.writer.close()


async def test_Q5_connection_lost_while_waiting_cancels_the_waiter() -> None:
    async with running_gateway(port=0, hosts=("127.0.0.1",), profile="cmq") as gw:
        raw = await RawClient.open(gw.port)
        raw.send(1, C.Channel.Open(), C.Queue.Declare(queue="lp.lost", arguments={WAIT: 30}),
                 C.Basic.Get(queue="lp.lost", no_ack=True))
        await _waiting(gw, "lp.lost", 1)
        raw.writer.close()
        await _waiting(gw, "lp.lost", 0)
        publisher = await aio_pika.connect(_url(gw), timeout=10)
        async with publisher:
            pch = await publisher.channel()
            await pch.default_exchange.publish(aio_pika.Message(b"kept"), routing_key="lp.lost")
        assert await _consume(_url(gw), "lp.lost", 1) == [(b"kept", False, 1)]
