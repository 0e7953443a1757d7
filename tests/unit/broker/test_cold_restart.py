"""A restart brings persistent messages back as compact runs (issue 15): none is made an
object before it is wanted, held memory (W5) counts what a cold message really holds, and
an ack of a message that was cold deletes its record (M14)."""

from __future__ import annotations

import gc

from gateway.broker import Broker
from gateway.broker import persistence as P
from gateway.broker.recovery import COLD_MESSAGE_BYTES
from gateway.memory import HELD, MESSAGE_OVERHEAD
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock

N = 500


async def _backlog(path: str, clock: ManualClock) -> None:
    b = await Broker.open(path, clock=clock)
    vh = b.vhost("/")
    vh.declare_queue(None, "q", passive=False, durable=True, exclusive=False, auto_delete=False, arguments=None)
    for i in range(N):
        vh.publish("", "q", Properties.build(delivery_mode=2, headers={"i": i}), bytes([i % 256]) * (100 + 3 * i))
    await b.close()


async def _reopened(path: str, clock: ManualClock) -> tuple[Broker, int]:
    """The backlog's broker restarted, and the held memory before it opened."""
    await _backlog(path, clock)
    gc.collect()  # the publishing broker's messages are gone
    before = HELD.messages
    b = await Broker.open(path, clock=clock)
    assert b.vhosts["/"].queues["q"].cmq.cold == N
    return b, before


async def test_W5_M14_a_restarted_backlog_is_cold_until_delivered_and_its_acks_delete_records(tmp_path):
    clock = ManualClock()
    b, before = await _reopened(str(tmp_path), clock)
    q = b.vhosts["/"].queues["q"]
    assert q.message_count == N
    # W5: a cold message counts its arrays, not the ~700 bytes of a message made of objects.
    assert HELD.messages - before == N * COLD_MESSAGE_BYTES
    for i in range(N):
        r = q.receive(clock.now())
        assert r is not None
        msg = r.message.payload
        assert (msg.body, msg.properties.headers) == (bytes([i % 256]) * (100 + 3 * i), {"i": i})
        assert q.cmq.cold == N - i - 1
        assert q.cmq.delete(r, clock.now())
        b.unpersist_message(q, r.message, body_needed=False)
        assert P.message_key("/", "q", r.message.msg_id) not in b.store
        del r, msg
    assert q.cmq.cold == 0 and q.cmq.retained == 0
    assert not b.store.keys(P.MESSAGES_PREFIX)
    assert abs(HELD.messages - before) < MESSAGE_OVERHEAD
    await b.close()


async def test_W5_M14_a_purged_cold_backlog_gives_back_its_held_memory_and_records(tmp_path):
    b, before = await _reopened(str(tmp_path), ManualClock())
    vh = b.vhosts["/"]
    assert vh.purge_queue(None, "q") == N
    assert vh.queues["q"].cmq.cold == 0 and not b.store.keys(P.MESSAGES_PREFIX)
    gc.collect()
    assert abs(HELD.messages - before) < MESSAGE_OVERHEAD
    await b.close()
