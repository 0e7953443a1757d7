"""A delivery that a publish causes is written by the publisher's read turn (gateway.transport,
``flush_requested``), after that turn's audit hand-off (A5), in one write.

Why it matters: written by the consumer's ``call_soon`` instead, the delivery waited for the
rest of the turn, for every other socket the loop's poll returned with the publisher's, and for
the loop's own round: part of scenario 7's p50 (docs/BENCHMARKS.md). What is tested here is the
order of the calls, not a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from gateway import transport as tr
from gateway.config import AuditSettings
from gateway.perf.client import AmqpClient, parse_uri
from gateway.perf.frames import encode_properties, publish_template
from gateway.server import running_gateway

_DELIVER = b"\x00\x3c\x00\x3c"  # basic.deliver's class and method ids


async def test_a_publish_delivery_is_written_in_the_publishers_read_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Any]] = []  # ("read", conn) / ("read-end", conn) / ("handoff", ...) / ("deliver", conn)
    received = tr.AMQPConnection.data_received
    take = tr.AMQPConnection._take

    def data_received(self: Any, data: bytes) -> None:
        calls.append(("read", self))
        try:
            received(self, data)
        finally:
            calls.append(("read-end", self))

    class Writes:
        def __init__(self, conn: Any, transport: Any) -> None:
            self._conn, self._t = conn, transport

        def write(self, data: bytes) -> None:
            if _DELIVER in data:
                calls.append(("deliver", self._conn))
            self._t.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._t, name)

    def _take(self: Any, transport: Any) -> None:
        take(self, transport)
        self.transport = Writes(self, self.transport)

    monkeypatch.setattr(tr.AMQPConnection, "data_received", data_received)
    monkeypatch.setattr(tr.AMQPConnection, "_take", _take)

    async with running_gateway(0, str(tmp_path / "data"), hosts=("127.0.0.1",),
                               audit=dataclasses.replace(AuditSettings(), dir=str(tmp_path / "audit"))) as gw:
        handoff = gw.broker.audit_handoff

        def audit_handoff() -> bool:
            calls.append(("handoff", None))
            return bool(handoff())

        gw.broker.audit_handoff = audit_handoff
        address = parse_uri(f"amqp://guest:guest@127.0.0.1:{gw.port}/")
        producer = await AmqpClient.connect(address)
        consumer = await AmqpClient.connect(address)
        got = asyncio.get_running_loop().create_future()
        consumer.on_delivery = lambda channel, tag, sent_ns: got.done() or got.set_result(tag)
        for client in (producer, consumer):
            await client.open_channel(1)
        await consumer.rpc(1, commands.Queue.Declare(queue="turn-q"), commands.Queue.DeclareOk)
        await consumer.rpc(1, commands.Basic.Consume(queue="turn-q", consumer_tag="c"), commands.Basic.ConsumeOk)
        await asyncio.sleep(0.05)  # the consume-ok's own flushes are behind us
        calls.clear()
        t = publish_template(1, "", "turn-q", 16, encode_properties(delivery_mode=1), producer.frame_max)
        producer.write(t.head + bytes(8) + t.tail)
        assert await asyncio.wait_for(got, 10) == 1
        await producer.close()
        await consumer.close()

    delivers = [i for i, (kind, _) in enumerate(calls) if kind == "deliver"]
    assert len(delivers) == 1, calls  # one write for the delivery
    at = delivers[0]
    consumer_conn = calls[at][1]
    # The read turn on the stack when the delivery was written: the publisher's.
    open_reads = [conn for kind, conn in calls[:at] if kind == "read"]
    closed_reads = [conn for kind, conn in calls[:at] if kind == "read-end"]
    for conn in closed_reads:
        open_reads.remove(conn)
    assert len(open_reads) == 1 and open_reads[0] is not consumer_conn, calls
    publisher_read = max(i for i, (kind, conn) in enumerate(calls[:at]) if kind == "read" and conn is open_reads[0])
    # A5: the turn's records were handed to the audit writer after the publish was read and
    # before its delivery went out.
    assert any(kind == "handoff" for kind, _ in calls[publisher_read:at]), calls


async def test_flushes_asked_outside_an_amqp_read_turn_are_not_kept(tmp_path: Path) -> None:
    """Deliveries that no AMQP read turn caused (here an MQTT publisher's, to an MQTT
    subscriber that never writes) are written by their own ``call_soon``; the list of flushes
    for the next read turn must not keep one entry per delivery meanwhile (it would grow for as
    long as no AMQP client sends anything)."""
    from gateway.mqtt import codec as P
    from tests.integration.mqtt_client import AsyncRawClient

    async with running_gateway(0, None, hosts=("127.0.0.1",), mqtt_port=0, mqtt_host="127.0.0.1") as gw:
        sub, _ = await AsyncRawClient.connect(gw.mqtt.port, "turn-sub", level=4)
        sub.send(P.Subscribe(packet_id=1, subscriptions=[("turn/t", 0)]))
        assert isinstance(await sub.recv(), P.SubAck)
        pub, _ = await AsyncRawClient.connect(gw.mqtt.port, "turn-pub", level=4)
        count = 300
        for i in range(count):
            pub.send(P.Publish(topic="turn/t", payload=b"%d" % i))
            await asyncio.sleep(0)  # a loop iteration each: a flush each
        got = [await sub.recv() for _ in range(count)]
        assert [p.payload for p in got] == [b"%d" % i for i in range(count)]
        assert len(tr._requested) <= 2, len(tr._requested)
        for client in (pub, sub):
            client.send(P.Disconnect())
