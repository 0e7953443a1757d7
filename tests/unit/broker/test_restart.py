"""Restart: durable things and persistent messages come back, transient ones do not."""

from __future__ import annotations

from gateway.broker import Broker
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock


async def test_restart_keeps_durable_and_persistent_only(tmp_path):
    clock = ManualClock()
    b = await Broker.open(str(tmp_path), clock=clock)
    vh = b.vhost("/")
    vh.declare_exchange("dx", "direct", passive=False, durable=True, auto_delete=False, internal=False,
                        arguments=None)
    vh.declare_exchange("tx", "fanout", passive=False, durable=False, auto_delete=False, internal=False,
                        arguments=None)
    for name, durable in (("dq", True), ("tq", False)):
        vh.declare_queue(None, name, passive=False, durable=durable, exclusive=False, auto_delete=False,
                         arguments=None)
    vh.bind(None, "dx", ("q", "dq"), "k", None)
    vh.publish("dx", "k", Properties.build(delivery_mode=2), b"persistent")
    vh.publish("dx", "k", Properties.build(delivery_mode=1), b"transient")
    vh.publish("", "tq", Properties.build(delivery_mode=2), b"in transient queue")
    await b.close()

    b2 = await Broker.open(str(tmp_path), clock=clock)
    vh2 = b2.vhosts["/"]
    assert "dx" in vh2.exchanges and "tx" not in vh2.exchanges
    assert set(vh2.queues) == {"dq"}
    assert vh2.exchanges["dx"].bindings[("q", "dq")].keys == ["k"]
    q = vh2.queues["dq"]
    assert q.message_count == 1
    receipt = q.receive(clock.now())
    assert receipt.message.payload.body == b"persistent"
    await b2.close()
