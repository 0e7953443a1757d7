"""The message-storage contract (gateway.broker.storage.MessageStorage), one suite for every store.

As ZODB's BasicStorage and Synchronization test mixins run against FileStorage, MappingStorage
and RelStorage, :class:`MessageStorageContract` holds the tests and each subclass opens a broker
on one store: the embedded store (in memory) and JetStream (a real nats-server of the session,
tests/support/natsd.py). Every test drives the broker as its callers do (vhost.publish,
broker.receive, the storage's settle/release/purge/demand/counts, a Session over a real
ServerConnection for basic.get, the -ok counts and confirms) and reads the results through the
same seam, so a difference between the stores is a failure of one of the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pytest
from pamqp import body as B
from pamqp import commands as C

from gateway.broker import Broker
from gateway.broker.queue import BrokerQueue
from gateway.protocol.properties import Properties
from semantics import queue as Q
from semantics.errors import LimitError
from semantics.send_rules import MaxLengthRejected

VISIBILITY = 1  # x-cmq-visibility-timeout of the tests that wait for a message to come back
TAKE_WAIT = 10.0  # hang protection: a message that is there arrives long before this
ABSENT_WAIT = 1.0  # how long a test looks for a message that must not be there


def _persistent() -> Properties:
    return Properties.build(delivery_mode=2)


async def take(broker: Any, q: Any, count: int = 1, wait: float = TAKE_WAIT) -> list[Q.Receipt]:
    """Receive up to ``count`` messages of ``q`` as a CMQ API ReceiveMessage does: through
    the storage's demand, looking again until ``count`` came or ``wait`` seconds passed."""
    got: list[Q.Receipt] = []
    demand = broker.messages.demand(q, count, True)
    deadline = time.monotonic() + wait
    with demand if demand is not None else contextlib.nullcontext():
        while len(got) < count:
            while len(got) < count and (r := broker.receive(q, broker.now())) is not None:
                got.append(r)
            left = deadline - time.monotonic()
            if len(got) >= count or left <= 0:
                break
            if demand is None:
                await asyncio.sleep(0.02)
            else:
                await demand.pulled(min(left, 0.5))
    return got


async def eventually_counts(broker: Any, q: Any, want: tuple[int, int, int], wait: float = TAKE_WAIT) -> tuple:
    """The (Active, Inactive, Delayed) counts of ``q`` once they read ``want``, or the last read."""
    deadline = time.monotonic() + wait
    while True:
        found = await broker.messages.counts(q)
        if found is not None and tuple(found[:3]) == want or time.monotonic() > deadline:
            return tuple(found[:3]) if found is not None else None
        await asyncio.sleep(0.1)


class MessageStorageContract:
    """The tests; a subclass provides the ``broker`` fixture of its store."""

    async def declare(self, broker: Any, durable: bool = True, **arguments: Any) -> Any:
        vh = broker.vhost("/")
        name = f"contract-{uuid.uuid4().hex[:8]}"
        q = vh.declare_queue(None, name, passive=False, durable=durable, exclusive=False, auto_delete=False,
                             arguments=arguments)
        await self.ready(q)
        return q

    async def ready(self, q: Any) -> None:
        """The queue can store messages (a JetStream stream is created asynchronously)."""

    def publish(self, broker: Any, q: Any, body: bytes, **headers: Any) -> Any:
        props = Properties.build(delivery_mode=2, headers=headers or None)
        return broker.vhost("/").publish("", q.name, props, body)

    async def stored(self, broker: Any, q: Any, prefix: bytes, count: int) -> list[str]:
        """``count`` messages (bodies ``prefix`` 0, 1, ...) published to ``q`` and durable."""
        ids = [self.publish(broker, q, b"%s%d" % (prefix, i)).msg_id for i in range(count)]
        await asyncio.wait_for(broker.flush(), TAKE_WAIT)
        return ids

    async def test_every_store_makes_the_brokers_one_queue_class(self, broker: Any) -> None:
        """Issue 28 aim 4, the store the only seam: what a store keeps of a queue is its own
        object, ``q.stored`` (None where the local model holds every message), not a subclass
        of the queue; and ``message_count`` counts what it holds outside the local model."""
        q = await self.declare(broker)
        assert type(q) is BrokerQueue
        assert type(q.cmq) is Q.CmqQueue  # one CMQ queue model too (leased on JetStream)
        await self.stored(broker, q, b"m", 2)
        assert q.message_count == q.cmq.active + q.remote_ready == 2

    async def test_M10_an_enqueued_message_is_received_with_its_body(self, broker: Any) -> None:
        q = await self.declare(broker)
        out = self.publish(broker, q, b"hello")
        assert out.routed and not out.rejected
        (r,) = await take(broker, q)
        assert r.message.payload.body == b"hello"
        assert r.message.msg_id == out.msg_id

    async def test_M14_the_confirm_LSN_becomes_durable(self, broker: Any) -> None:
        q = await self.declare(broker)
        lsns = [self.publish(broker, q, b"m%d" % i).lsn for i in range(3)]
        assert lsns == sorted(lsns)
        await asyncio.wait_for(broker.flush(), TAKE_WAIT)
        assert broker.durable_lsn >= lsns[-1]
        assert len(await take(broker, q, 3)) == 3

    @pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient"])
    async def test_M12_a_settled_message_is_never_received_again(self, broker: Any, durable: bool) -> None:
        # Issue 28: acks on non-durable queues never reached JetStream, which delivered them again.
        q = await self.declare(broker, durable=durable, **{"x-cmq-visibility-timeout": VISIBILITY})
        self.publish(broker, q, b"once")
        (r,) = await take(broker, q)
        assert q.cmq.delete(r, broker.now())
        broker.messages.settle(q, r.message, body_needed=False)
        await asyncio.sleep(VISIBILITY + 1.5)  # past the visibility timeout (JetStream's ack_wait)
        assert await take(broker, q, wait=ABSENT_WAIT) == []

    async def test_Q1_an_unsettled_message_comes_back_after_its_visibility_timeout(self, broker: Any) -> None:
        # The guard of the test above: without the settle, the same wait does bring it back.
        q = await self.declare(broker, **{"x-cmq-visibility-timeout": VISIBILITY})
        self.publish(broker, q, b"again")
        (r,) = await take(broker, q)
        (again,) = await take(broker, q, wait=VISIBILITY + TAKE_WAIT)
        assert again.message.msg_id == r.message.msg_id

    async def test_M13_a_released_message_is_received_again_and_counted(self, broker: Any) -> None:
        q = await self.declare(broker)
        self.publish(broker, q, b"back")
        (r,) = await take(broker, q)
        assert r.message.receive_count == 1
        assert broker.messages.release(q, r, broker.now())
        (again,) = await take(broker, q)
        assert again.message.msg_id == r.message.msg_id
        assert again.message.receive_count == 2  # Q8's dequeueCount counts both receives

    async def test_Q3_a_stale_receipt_releases_nothing(self, broker: Any) -> None:
        q = await self.declare(broker)
        self.publish(broker, q, b"x")
        (r,) = await take(broker, q)
        assert broker.messages.release(q, r, broker.now())
        assert not broker.messages.release(q, r, broker.now())

    async def test_M7_purge_removes_the_ready_messages(self, broker: Any) -> None:
        q = await self.declare(broker)
        await self.stored(broker, q, b"p", 3)
        assert broker.vhost("/").purge_queue(None, q.name) == 3
        assert await eventually_counts(broker, q, (0, 0, 0)) == (0, 0, 0)
        assert await take(broker, q, wait=ABSENT_WAIT) == []

    async def test_CA2_counts_follow_receives(self, broker: Any) -> None:
        q = await self.declare(broker)
        for i in range(3):
            self.publish(broker, q, b"c%d" % i)
        assert await eventually_counts(broker, q, (3, 0, 0)) == (3, 0, 0)
        assert len(await take(broker, q, 1)) == 1
        assert await eventually_counts(broker, q, (2, 1, 0)) == (2, 1, 0)

    # -- the CMQ rules of semantics.send_rules, on both stores --------------------------------

    async def test_L6_a_message_above_max_msg_size_is_refused(self, broker: Any) -> None:
        broker.set_vhost_profile("/", "cmq")  # the cmq profile refuses (PF2)
        q = await self.declare(broker, **{"x-cmq-max-msg-size": 1024})
        with pytest.raises(LimitError) as e:
            self.publish(broker, q, b"x" * 1025)
        assert e.value.rule == "L6"
        broker.set_vhost_profile("/", None)  # compatible: taken, and reported (PF4)
        assert self.publish(broker, q, b"x" * 1025).routed
        assert len(await take(broker, q)) == 1
        assert await take(broker, q, wait=ABSENT_WAIT) == []

    async def test_L8_a_queue_at_max_msg_heap_num_takes_no_more(self, broker: Any) -> None:
        q = await self.declare(broker, **{"x-cmq-max-msg-heap-num": 1000})
        for i in range(1000):
            self.publish(broker, q, b"h%d" % i)
        with pytest.raises(LimitError) as e:
            self.publish(broker, q, b"one too many")
        assert e.value.rule == "L8"

    async def test_M7_reject_publish_refuses_when_full(self, broker: Any) -> None:
        q = await self.declare(broker, **{"x-max-length": 2, "x-overflow": "reject-publish"})
        outs = [self.publish(broker, q, b"r%d" % i) for i in range(3)]
        assert [o.rejected for o in outs] == [False, False, True]
        assert await eventually_counts(broker, q, (2, 0, 0)) == (2, 0, 0)

    async def test_M7_reject_publish_raises_from_the_storage(self, broker: Any) -> None:
        # The storage itself refuses, before any record (the vhost turns it into a nack).
        q = await self.declare(broker, **{"x-max-length": 1, "x-overflow": "reject-publish"})
        self.publish(broker, q, b"first")
        await asyncio.wait_for(broker.flush(), TAKE_WAIT)
        from gateway.broker.message import Message
        msg = Message(b"second", _persistent(), "", q.name, broker.now(), (), "msg-contract-2", None)
        with pytest.raises(MaxLengthRejected):
            broker.messages.enqueue(broker.vhost("/"), q, msg, broker.now(), None, None, 0, None, None)

    async def test_Q4_the_queue_default_delay_holds_a_message_back(self, broker: Any) -> None:
        q = await self.declare(broker, **{"x-cmq-delay-seconds": 2})
        self.publish(broker, q, b"later")
        assert await eventually_counts(broker, q, (0, 0, 1)) == (0, 0, 1)
        assert await take(broker, q, wait=ABSENT_WAIT) == []
        (r,) = await take(broker, q, wait=2 + TAKE_WAIT)
        assert r.message.payload.body == b"later"

    async def test_M7_x_message_ttl_ends_an_unreceived_message(self, broker: Any) -> None:
        q = await self.declare(broker, **{"x-message-ttl": 300})
        self.publish(broker, q, b"short-lived")
        await asyncio.sleep(1.0)
        assert await take(broker, q, wait=ABSENT_WAIT) == []

    async def test_M7_a_zero_expiration_ends_the_message_despite_a_longer_queue_ttl(self, broker: Any) -> None:
        # The JetStream store's own copy of the TTL rule read expiration 0 as "none" (issue 28).
        q = await self.declare(broker, **{"x-message-ttl": 60_000})
        props = Properties.build(delivery_mode=2, expiration="0")
        broker.vhost("/").publish("", q.name, props, b"now or never")
        await asyncio.sleep(1.0)
        assert await take(broker, q, wait=ABSENT_WAIT) == []

    async def test_M7_a_message_expiration_shorter_than_the_queue_ttl_wins(self, broker: Any) -> None:
        q = await self.declare(broker, **{"x-message-ttl": 60_000})
        props = Properties.build(delivery_mode=2, expiration="200")
        broker.vhost("/").publish("", q.name, props, b"short")
        self.publish(broker, q, b"long")
        await asyncio.sleep(1.0)
        got = await take(broker, q, 2, wait=ABSENT_WAIT + 1)
        assert [r.message.payload.body for r in got] == [b"long"]


    # -- what a channel sees: basic.get and the -ok counts (MessageStorage.getting,
    # get_waits, message_count), through a real Session and ServerConnection ---------------

    async def test_M11_a_basic_get_receives_a_stored_message_then_get_empty(self, broker: Any) -> None:
        q = await self.declare(broker)
        self.publish(broker, q, b"got")
        await asyncio.wait_for(broker.flush(), TAKE_WAIT)
        c = _client(broker)
        c.send(1, C.Basic.Get(queue=q.name, no_ack=True))
        frames = await _answer(c, C.Basic.GetOk, C.Basic.GetEmpty)
        assert [type(f) for f in frames if isinstance(f, C.Basic.GetOk | C.Basic.GetEmpty)] == [C.Basic.GetOk]
        assert b"".join(f.value for f in frames if isinstance(f, B.ContentBody)) == b"got"
        c.send(1, C.Basic.Get(queue=q.name, no_ack=True))
        assert isinstance((await _answer(c, C.Basic.GetOk, C.Basic.GetEmpty))[-1], C.Basic.GetEmpty)

    async def test_Q5_a_basic_get_waits_its_polling_wait_for_a_message(self, broker: Any) -> None:
        q = await self.declare(broker, **{"x-cmq-polling-wait-seconds": 5})
        c = _client(broker)
        c.send(1, C.Basic.Get(queue=q.name, no_ack=True))
        await asyncio.sleep(0.3)
        assert c.methods() == []  # waiting
        self.publish(broker, q, b"awaited")
        frames = await _answer(c, C.Basic.GetOk, C.Basic.GetEmpty)
        assert b"".join(f.value for f in frames if isinstance(f, B.ContentBody)) == b"awaited"

    async def test_M7_declare_ok_purge_ok_and_delete_ok_count_the_stored_messages(self, broker: Any) -> None:
        q = await self.declare(broker)
        await self.stored(broker, q, b"n", 3)
        c = _client(broker)
        c.send(1, C.Queue.Declare(queue=q.name, passive=True))
        (ok,) = [f for f in await _answer(c, C.Queue.DeclareOk) if isinstance(f, C.Queue.DeclareOk)]
        assert ok.message_count == 3
        assert len(await take(broker, q, 1)) == 1  # received: no longer counted as ready
        c.send(1, C.Queue.Purge(queue=q.name))
        (ok,) = [f for f in await _answer(c, C.Queue.PurgeOk) if isinstance(f, C.Queue.PurgeOk)]
        assert ok.message_count == 2
        self.publish(broker, q, b"last")
        await asyncio.wait_for(broker.flush(), TAKE_WAIT)
        c.send(1, C.Queue.Delete(queue=q.name))
        (ok,) = [f for f in await _answer(c, C.Queue.DeleteOk) if isinstance(f, C.Queue.DeleteOk)]
        assert ok.message_count == 1

    async def test_M7_the_count_of_a_queue_without_messages_is_0(self, broker: Any) -> None:
        q = await self.declare(broker)
        later = broker.messages.message_count(q, q.message_count)
        assert (0 if later is None else await asyncio.wait_for(later, TAKE_WAIT)) == 0

    # -- consumers: what a channel's credit brings (MessageStorage.want) and what goes back
    # when its reader leaves (release, readers_left) --------------------------------------

    async def test_M11_a_consumer_receives_stored_messages_as_its_prefetch_allows(self, broker: Any) -> None:
        q = await self.declare(broker)
        await self.stored(broker, q, b"d", 5)
        c = _client(broker)
        c.send(1, C.Basic.Qos(prefetch_count=3))
        c.send(1, C.Basic.Consume(queue=q.name, consumer_tag="ct"))
        first = await _delivered(c, 3)
        assert [body for _, _, body in first] == [b"d0", b"d1", b"d2"]
        assert await _delivered(c, 1, wait=ABSENT_WAIT) == []  # W4: no fourth before an ack
        c.send(1, C.Basic.Ack(delivery_tag=first[-1][0].delivery_tag, multiple=True))
        assert [body for _, _, body in await _delivered(c, 2)] == [b"d3", b"d4"]

    async def test_M13_what_a_closed_channel_held_goes_to_the_next_reader(self, broker: Any) -> None:
        q = await self.declare(broker)
        ids = await self.stored(broker, q, b"h", 4)
        c = _client(broker)
        c.send(1, C.Basic.Qos(prefetch_count=2))
        c.send(1, C.Basic.Consume(queue=q.name, consumer_tag="ct"))
        assert len(await _delivered(c, 2)) == 2  # unacked when the channel closes
        c.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        got = await take(broker, q, 4)
        assert sorted(r.message.msg_id for r in got) == sorted(ids)

    # -- confirms (M14): start, sync, flush, refused, batch_end --------------------------------

    async def test_M14_flush_and_sync_reach_every_write_taken(self, broker: Any) -> None:
        q = await self.declare(broker)
        lsn = max(self.publish(broker, q, b"f%d" % i).lsn for i in range(5))
        assert await asyncio.wait_for(broker.messages.flush(), TAKE_WAIT) >= lsn
        assert broker.messages.sync() >= lsn
        assert broker.durable_lsn >= lsn

    async def test_M14_a_write_the_store_took_is_never_refused(self, broker: Any) -> None:
        q = await self.declare(broker)
        lsns = [self.publish(broker, q, b"w%d" % i).lsn for i in range(3)]
        watched = broker.messages.watch_refusals(lsns)
        await asyncio.wait_for(broker.flush(), TAKE_WAIT)
        assert not broker.messages.refused(broker.durable_lsn)
        assert broker.messages.refusals_seen(watched) is False

    async def test_M14_confirms_of_a_batch_go_once_its_writes_are_durable(self, broker: Any) -> None:
        q = await self.declare(broker)
        c = _client(broker)
        c.send(1, C.Confirm.Select())
        c.read()
        broker.begin_batch()  # one read of a client, as the transport hands it over
        for i in range(4):
            c.publish(1, "", q.name, b"b%d" % i, delivery_mode=2)
        broker.end_batch()  # MessageStorage.batch_end: the writes leave now
        deadline = time.monotonic() + TAKE_WAIT
        acked = 0
        while acked < 4 and time.monotonic() < deadline:
            for f in c.methods():
                assert not isinstance(f, C.Basic.Nack)
                if isinstance(f, C.Basic.Ack):
                    acked = f.delivery_tag
            await asyncio.sleep(0.02)
        assert acked == 4
        assert len(await take(broker, q, 4)) == 4


def _client(broker: Any) -> Any:
    from tests.unit.broker.helpers import Client
    c = Client(broker)
    c.open_channel(1)
    return c


async def _delivered(c: Any, count: int, wait: float = TAKE_WAIT) -> list[tuple[Any, Any, bytes]]:
    """The deliveries ``c`` receives until ``count`` came or ``wait`` seconds passed."""
    from tests.unit.broker.helpers import deliveries
    frames: list[tuple[int, Any]] = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        frames += c.read()
        if len(deliveries(frames)) >= count:
            break
        await asyncio.sleep(0.02)
    return deliveries(frames)


async def _answer(c: Any, *wanted: type, wait: float = TAKE_WAIT) -> list[Any]:
    """The frames ``c`` receives until one of type ``wanted`` (and its content) came."""
    frames: list[Any] = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        frames += [f for _, f in c.read()]
        if any(isinstance(f, wanted) for f in frames):
            await asyncio.sleep(0.05)  # its content frames, if any
            return frames + [f for _, f in c.read()]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {wanted} within {wait} s: {frames}")


class TestEmbeddedStore(MessageStorageContract):
    @pytest.fixture
    def broker(self, embedded_broker: Broker) -> Broker:
        return embedded_broker


class TestJetStreamStore(MessageStorageContract):
    @pytest.fixture
    def broker(self, jetstream_broker: Any) -> Any:
        return jetstream_broker

    async def ready(self, q: Any) -> None:
        await asyncio.wait_for(q.stored.ready.wait(), TAKE_WAIT)  # its stream is there
