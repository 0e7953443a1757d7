"""The membership contract (gateway.broker.membership.Membership), one suite for both stores.

A vhost asks its broker's membership what one gateway alone cannot decide: whether transient
declarations are recorded too (``shares``), whether a queue is exclusive to another gateway,
whether an auto-delete or x-expires queue may go now. Seen from one gateway, both stores must
answer as RabbitMQ does (M7); the records differ only as ``shares`` says. Every test drives
the broker as its callers do (a Session over a real ServerConnection, the vhost's methods).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from pamqp import commands as C

from gateway.broker import Broker
from gateway.broker import persistence as P

GONE_WAIT = 10.0  # hang protection: a queue that goes is gone long before this


def _client(broker: Any) -> Any:
    from tests.unit.broker.helpers import Client
    c = Client(broker)
    c.open_channel(1)
    return c


def _close_of(methods: list[Any]) -> tuple[int, str]:
    closes = [m for m in methods if isinstance(m, C.Channel.Close)]
    assert closes, methods
    return closes[0].reply_code, closes[0].reply_text


async def _methods(c: Any, wanted: type, wait: float = GONE_WAIT) -> list[Any]:
    """The methods ``c`` is answered with until one of type ``wanted`` came (the cluster
    answers a declare once its record is written)."""
    got: list[Any] = []
    deadline = time.monotonic() + wait
    while not any(isinstance(m, wanted) for m in got) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        got += c.methods()
    return got


async def _gone(vh: Any, name: str, wait: float = GONE_WAIT) -> bool:
    deadline = time.monotonic() + wait
    while name in vh.queues and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return name not in vh.queues


class MembershipContract:
    """The tests; a subclass provides the ``broker`` fixture of its store."""

    def name(self) -> str:
        return f"member-{uuid.uuid4().hex[:8]}"

    async def test_CL1_transient_declarations_are_recorded_as_membership_shares_them(self, broker: Any) -> None:
        vh, shares = broker.vhost("/"), broker.membership.shares
        durable_q, transient_q, x = self.name(), self.name(), self.name()
        for name, durable in ((durable_q, True), (transient_q, False)):
            vh.declare_queue(None, name, passive=False, durable=durable, exclusive=False, auto_delete=False,
                             arguments=None)
        vh.declare_exchange(x, "direct", passive=False, durable=False, auto_delete=False, internal=False,
                            arguments=None)
        vh.bind(None, x, ("q", durable_q), "k", None)
        assert P.queue_key("/", durable_q) in broker.store
        assert "durable" not in P.decode_json(broker.store.get(P.queue_key("/", durable_q)))
        for key in (P.queue_key("/", transient_q), P.exchange_key("/", x), P.binding_key("/", x, "q", durable_q, "k")):
            assert (key in broker.store) is shares, key
        if shares:
            assert P.decode_json(broker.store.get(P.queue_key("/", transient_q)))["durable"] is False
            assert P.decode_json(broker.store.get(P.exchange_key("/", x)))["durable"] is False
        vh.delete_exchange(x, if_unused=False)
        assert P.exchange_key("/", x) not in broker.store
        assert P.binding_key("/", x, "q", durable_q, "k") not in broker.store

    async def test_M7_CL4_an_exclusive_queue_is_locked_to_its_connection(self, broker: Any) -> None:
        a, b = _client(broker), _client(broker)
        name = self.name()
        a.send(1, C.Queue.Declare(queue=name, exclusive=True))
        assert any(isinstance(m, C.Queue.DeclareOk) for m in await _methods(a, C.Queue.DeclareOk))
        key = P.queue_key("/", name)
        if broker.membership.shares:
            assert P.decode_json(broker.store.get(key))["exclusive_owner"] == broker.membership.owner
        else:
            assert key not in broker.store
        assert not broker.membership.locked("/", name)  # exclusive here, not to another gateway
        b.send(1, C.Queue.Declare(queue=name, exclusive=True))
        code, text = _close_of(await _methods(b, C.Channel.Close))
        assert code == 405 and text.startswith(f"RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                                               f"queue '{name}'")
        a.session.on_connection_lost()
        assert name not in broker.vhost("/").queues

    async def test_M7_CL4_an_auto_delete_queue_goes_with_its_last_consumer(self, broker: Any) -> None:
        vh, c, name = broker.vhost("/"), _client(broker), self.name()
        c.send(1, C.Queue.Declare(queue=name, auto_delete=True), C.Basic.Consume(queue=name, consumer_tag="one"),
               C.Basic.Consume(queue=name, consumer_tag="two"))
        c.send(1, C.Basic.Cancel(consumer_tag="one"))
        await asyncio.sleep(0.1)
        assert name in vh.queues  # a consumer is left
        c.send(1, C.Basic.Cancel(consumer_tag="two"))
        assert await _gone(vh, name)

    async def test_M7_CL4_a_queue_unused_for_its_x_expires_goes(self, broker: Any) -> None:
        vh, name = broker.vhost("/"), self.name()
        vh.declare_queue(None, name, passive=False, durable=False, exclusive=False, auto_delete=False,
                         arguments={"x-expires": 300})
        assert await _gone(vh, name)


class TestEmbeddedMembership(MembershipContract):
    @pytest.fixture
    def broker(self, embedded_broker: Broker) -> Broker:
        return embedded_broker


class TestJetStreamMembership(MembershipContract):
    @pytest.fixture
    def broker(self, jetstream_broker: Any) -> Any:
        return jetstream_broker
