"""The broker's use of the store: compaction from the sync worker, the recovery report at
start-up, and a failed store nacking the confirms still waiting (semantics.store, M14)."""

from __future__ import annotations

import asyncio
import logging
import os

from pamqp import commands as C

from gateway.broker import Broker, BrokerConfig
from gateway.broker import broker as broker_module
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock
from tests.unit.broker.helpers import Client

MIN_BYTES = 8192


def _dir_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def _confirms(c: Client) -> list[tuple[str, int, bool]]:
    return [(m.name, m.delivery_tag, m.multiple) for m in c.methods()]


async def _settle(b: Broker) -> None:
    """Let the flusher sync what is pending, then wait for the worker thread to finish its
    turn (sync and compaction run in one single-threaded executor, in order)."""
    loop = asyncio.get_running_loop()
    while b.store.durable_lsn < b.store.last_lsn:
        await asyncio.sleep(0)
        await loop.run_in_executor(b._executor, lambda: None)
    await loop.run_in_executor(b._executor, lambda: None)


async def test_M14_put_delete_cycles_compact_the_journal_and_reopen_recovers_live_state(tmp_path) -> None:
    """semantics.store compaction: the flusher compacts after sync, so 300 put/delete cycles
    of 600-byte persistent messages (about 360 KB of journal) leave the data dir bounded, and
    a reopen recovers exactly the three live messages, in order."""
    d = str(tmp_path)
    clock = ManualClock()
    config = BrokerConfig(fsync=False, compact_min_bytes=MIN_BYTES)
    b = await Broker.open(d, clock=clock, config=config)
    vh = b.vhost("/")
    vh.declare_queue(None, "dq", passive=False, durable=True, exclusive=False, auto_delete=False, arguments=None)
    q = vh.queues["dq"]
    for i in range(300):
        vh.publish("", "dq", Properties.build(delivery_mode=2), b"%05d" % i + b"x" * 595)
        receipt = q.receive(clock.now())
        assert receipt is not None
        b.settle_deleted(q, receipt)
        await _settle(b)
    for body in (b"live-1", b"live-2", b"live-3"):
        vh.publish("", "dq", Properties.build(delivery_mode=2), body)
    await _settle(b)
    names = sorted(os.listdir(d))
    assert [n for n in names if n.startswith("journal-")] != ["journal-00000001.log"]  # rotated
    assert len([n for n in names if n.startswith("snapshot-")]) == 1
    assert _dir_bytes(d) < 2 * MIN_BYTES
    await b.close()

    b2 = await Broker.open(d, clock=clock, config=config)
    q2 = b2.vhosts["/"].queues["dq"]
    assert q2.message_count == 3
    bodies = []
    while (r := q2.receive(clock.now())) is not None:
        bodies.append(r.message.payload.body)
    assert bodies == [b"live-1", b"live-2", b"live-3"]
    assert len(list(b2.store.items("m/"))) == 3
    await b2.close()


async def test_store_recovery_is_logged_at_start_up(tmp_path, caplog) -> None:
    """semantics.store: the recovery report (records, seconds, bytes set aside) is logged as
    store.recovery when the broker opens a data dir (three records: two queues and the key
    format version)."""
    b = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
    vh = b.vhost("/")
    for name in ("queue-1", "queue-2"):  # valid CMQ names: no breach kept in the limits report (A6)
        vh.declare_queue(None, name, passive=False, durable=True, exclusive=False, auto_delete=False,
                         arguments=None)
    await b.close()
    with caplog.at_level(logging.INFO, logger="cmq_gateway.broker"):
        b2 = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("store.recovery")]
    assert line.startswith("store.recovery records=3 seconds=")
    assert line.endswith(" set_aside_bytes=0 aside=None damaged=0")
    await b2.close()


async def test_M14_store_failure_keeps_waiting_confirms_and_refuses_new_persistent_publishes(
        tmp_path, monkeypatch) -> None:
    """M14/W5: when a write fails, the confirm waiting for it keeps waiting (its message is
    in memory and written by the store's retry: an ack, never a nack followed by the message
    being stored anyway); a persistent publish arriving while the store cannot write is
    nacked and never enqueued; an ack meanwhile is no error; the store resumes by itself."""
    monkeypatch.setattr(broker_module, "STORE_RETRY_SECONDS", 0.01)
    b = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
    c = Client(b)
    c.open_channel()
    c.send(1, C.Queue.Declare(queue="dq", durable=True), C.Confirm.Select())
    c.publish(1, "", "dq", b"zero", delivery_mode=2)
    await _settle(b)
    assert [m.name for m in c.methods()] == ["Queue.DeclareOk", "Confirm.SelectOk", "Basic.Ack"]
    # The seam: the segment file refuses writes (the real full disk is in the process test).
    seg = b.store._file
    assert seg is not None
    b.store._file = open(seg.name, "rb", buffering=0)  # noqa: SIM115 - closed below
    c.publish(1, "", "dq", b"one", delivery_mode=2)
    for _ in range(1000):  # hang protection only
        if b.read_only:
            break
        await asyncio.sleep(0.005)
    assert b.read_only and _confirms(c) == []  # waits for the retry, not nacked
    c.publish(1, "", "dq", b"two", delivery_mode=2)
    assert _confirms(c) == []  # its nack goes out in publish order, behind the ack of "one"
    assert b.vhost("/").queues["dq"].message_count == 2  # zero and one; two was refused
    c.send(1, C.Basic.Get(queue="dq"))
    c.read()
    c.send(1, C.Basic.Ack(delivery_tag=1))  # deletes "zero": journalled once the disk is back
    assert c.methods() == []
    b.store._file.close()
    b.store._file = seg  # the disk is writable again
    for _ in range(1000):
        if not b.read_only:
            break
        await asyncio.sleep(0.005)
    await _settle(b)
    assert _confirms(c) == [("Basic.Ack", 2, False), ("Basic.Nack", 3, False)]
    await b.close()
    again = await Broker.open(str(tmp_path), clock=ManualClock(), config=BrokerConfig(fsync=False))
    q = again.vhost("/").queues["dq"]
    assert q.message_count == 1
    receipt = q.receive(again.now())
    assert receipt is not None and receipt.message.payload.body == b"one"
    await again.close()


