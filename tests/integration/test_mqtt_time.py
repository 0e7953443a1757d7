"""MQTT rules that need time to pass, on a gateway with a manual clock (MQ3, MQ6)."""

from __future__ import annotations

import asyncio

from gateway.mqtt import codec as P
from gateway.mqtt.session import queue_name
from gateway.server import running_gateway
from semantics.clock import ManualClock
from tests.integration.mqtt_client import AsyncRawClient


async def test_MQ6_unacked_delivery_comes_again_with_dup_after_visibility_timeout() -> None:
    clock = ManualClock(1_700_000_000.0)
    async with running_gateway(port=0, hosts=("127.0.0.1",), clock=clock, mqtt_port=0, mqtt_host="127.0.0.1") as gw:
        sub, _ = await AsyncRawClient.connect(gw.mqtt.port, "vis", 5)
        sub.send(P.Subscribe(1, [("v/#", 1)]))
        assert (await sub.recv()).reason_codes == [1]
        pub, _ = await AsyncRawClient.connect(gw.mqtt.port, "vis-pub", 5)
        pub.send(P.Publish("v/1", b"late", 1, packet_id=9))
        assert (await pub.recv()).kind == P.PUBACK
        first = await sub.recv()
        assert isinstance(first, P.Publish) and not first.dup
        gw.broker.advance_time(31)  # past the queue's visibility timeout (Q1, 30 s by default)
        again = await sub.recv()
        assert isinstance(again, P.Publish) and again.dup and again.payload == b"late"
        assert again.packet_id == first.packet_id  # the same identifier, as MQTT resends
        sub.send(P.Ack(P.PUBACK, again.packet_id))
        sub.send(P.PingReq())
        assert isinstance(await sub.recv(), P.PingResp)  # the PUBACK before it was handled
        gw.broker.advance_time(31)
        sub.send(P.PingReq())
        assert isinstance(await sub.recv(), P.PingResp)  # nothing came again once acknowledged
        sub.close()
        pub.close()


async def test_MQ3_session_expiry_ends_a_persistent_session() -> None:
    clock = ManualClock(1_700_000_000.0)
    async with running_gateway(port=0, hosts=("127.0.0.1",), clock=clock, mqtt_port=0, mqtt_host="127.0.0.1") as gw:
        c, ack = await AsyncRawClient.connect(gw.mqtt.port, "exp", 5, clean=False, session_expiry=5)
        c.send(P.Subscribe(1, [("e/#", 1)]))
        await c.recv()
        c.close()
        c, ack = await AsyncRawClient.connect(gw.mqtt.port, "exp", 5, clean=False, session_expiry=5)
        assert ack.session_present  # within the expiry
        c.close()
        for _ in range(50):  # the server's side of the close
            if not gw.broker.vhost("/").queues[queue_name("/", "exp")].consumers:
                break
            await asyncio.sleep(0.02)
        gw.broker.advance_time(6)
        assert queue_name("/", "exp") not in gw.broker.vhost("/").queues
        c, ack = await AsyncRawClient.connect(gw.mqtt.port, "exp", 5, clean=False, session_expiry=5)
        assert not ack.session_present
        c.close()
