"""A clean stop writes the recovery cache from what the queues hold (recovery_cache.from_queues)
instead of reading every message record: it must be what reading the records (read_runs)
gives, since the next start takes it for them. Random publishes, acks, requeues, unacked
deliveries, expiries, purges, queue deletions, rewinds and records left by a deleted queue,
in several queues and vhosts, folded and not, over several clean restarts (each start from
the cache the stop before wrote)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest

import semantics.queue as Q
from gateway.broker import Broker, recovery_cache
from gateway.broker import persistence as P
from gateway.broker.recovery import properties_cache, read_runs
from gateway.broker.recovery_cache import CachedQueue
from gateway.protocol.properties import Properties
from semantics.clock import ManualClock
from semantics.errors import CMQError
from semantics.store.checkpoint import CHECKPOINT_NAME

# (vhost, queue, arguments): a plain one, one with a name to escape, one in another vhost,
# one with a queue TTL, one keeping deleted messages for a rewind (Q6).
QUEUES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("/", "a", None),
    ("/", "b/c%d", None),
    ("v2", "a", None),
    ("/", "ttl", {"x-message-ttl": 300}),
    ("/", "rewind", {"x-cmq-rewind-seconds": 3600}),
]


def _declare(b: Broker, vhost: str, queue: str, arguments: dict[str, Any] | None, durable: bool = True) -> None:
    b.vhost(vhost).declare_queue(None, queue, passive=False, durable=durable, exclusive=False, auto_delete=False,
                                 arguments=arguments)


def _records(queues: list[CachedQueue]) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """Per queue, every record as the next start restores it: ID, enqueue time, body size,
    properties bytes, exchange, routing key and store key, in the order the start puts
    them in (its stable sort by enqueue time, ties in the cache's order)."""
    out = {}
    for cq in queues:
        ids = bytes(cq.ids[1:-1]).decode().split("\0") if len(cq) else []
        prefix = P.queue_messages_prefix(cq.vhost, cq.queue)
        rows = [(msg_id, cq.times[i], cq.sizes[i], *cq.combos[cq.refs[i]], cq.odd.get(msg_id, prefix + msg_id))
                for i, msg_id in enumerate(ids)]
        assert len(rows) == len(cq) and len(set(ids)) == len(ids)
        rows.sort(key=lambda row: row[1])
        out[(cq.vhost, cq.queue)] = rows
    return out


def _read(b: Broker) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    return _records([CachedQueue.of_records(v, q, r) for (v, q), r in read_runs(b.store, properties_cache()).items()])


class Driver:
    """Random operations on a broker's queues, the clock advanced by a ManualClock."""

    def __init__(self, b: Broker, rng: random.Random, clock: ManualClock) -> None:
        self.b, self.rng, self.clock = b, rng, clock
        self.unacked: list[tuple[Any, Any]] = []  # (queue, receipt)
        self.n = 0

    def queue(self) -> Any:
        names = [(v, q) for v, q, _ in QUEUES if q in self.b.vhost(v).queues]
        if not names:
            return None
        v, q = self.rng.choice(names)
        return self.b.vhosts[v].queues[q]

    def publish(self) -> None:
        v, q, _ = self.rng.choice(QUEUES)
        if q not in self.b.vhost(v).queues:
            return
        rng = self.rng
        self.n += 1
        props = Properties.build(delivery_mode=1 if rng.random() < 0.1 else 2,
                                 headers={"k": rng.randrange(3)} if rng.random() < 0.5 else None,
                                 expiration="200" if rng.random() < 0.05 else None,
                                 message_id=f"m{self.n}" if rng.random() < 0.05 else None)
        size = rng.choice([10, 100, 300, 1000])  # both sides of DISK_BODY_MIN (256)
        self.b.vhost(v).publish("", q, props, bytes([self.n % 256]) * size)

    def receive(self) -> None:
        q = self.queue()
        if q is None:
            return
        r = q.receive(self.clock.now())
        if r is not None:
            self.unacked.append((q, r))

    def settle(self) -> None:
        if not self.unacked:
            return
        q, r = self.unacked.pop(self.rng.randrange(len(self.unacked)))
        now = self.clock.now()
        if q.deleted:
            return
        if self.rng.random() < 0.6:
            if q.cmq.delete(r, now):
                self.b.unpersist_message(q, r.message, body_needed=False)
        else:
            q.cmq.release(r, now)  # requeue

    def tick(self) -> None:
        """Time passes: TTLs end (their records deleted), visibility timeouts too."""
        self.clock.advance(self.rng.choice([0.05, 0.5]))
        now = self.clock.now()
        for vh in list(self.b.vhosts.values()):
            for q in list(vh.queues.values()):
                self.b._queue_tick(vh, q, now)

    def purge(self) -> None:
        q = self.queue()
        if q is not None:
            self.b.vhosts[q.vhost].purge_queue(None, q.name)

    def delete(self) -> None:
        q = self.queue()
        if q is not None:
            self.b.vhosts[q.vhost].delete_queue(None, q.name, if_unused=False, if_empty=False)
            self.unacked = [(uq, r) for uq, r in self.unacked if uq is not q]

    def redeclare(self) -> None:
        v, q, args = self.rng.choice(QUEUES)
        if q not in self.b.vhost(v).queues:
            _declare(self.b, v, q, args)

    def rewind(self) -> None:
        q = self.b.vhost("/").queues.get("rewind")
        if q is not None:  # forward only (Q6): to just after the last rewind at most
            with contextlib.suppress(CMQError):
                q.cmq.rewind(self.clock.now() - self.rng.choice([0.5, 5.0]), self.clock.now())

    def forget_declaration(self) -> None:
        """A queue's record gone but not its messages' (a deletion cut short): the next
        start finds records of a queue that does not exist."""
        q = max((q for vh in self.b.vhosts.values() for q in vh.queues.values() if q.durable),
                key=lambda q: q.message_count, default=None)
        if q is not None:
            self.b.unpersist(P.queue_key(q.vhost, q.name))

    def put_records(self) -> None:
        """Records no queue holds, under IDs whose keys are escaped (the key is not the
        prefix and the ID): the next start restores them."""
        props = Properties.build(delivery_mode=2)
        for q in [q for vh in self.b.vhosts.values() for q in vh.queues.values() if q.durable]:
            for i in range(3):
                self.n += 1
                msg_id = f"odd/{self.n}%{i}"
                self.b.persist(P.message_key(q.vhost, q.name, msg_id), P.encode_message(
                    q.vhost, q.name, msg_id, self.clock.now(), "", q.name, props.raw, b"x" * 300 * i))

    def step(self) -> None:
        op = self.rng.choices(
            [self.publish, self.receive, self.settle, self.tick, self.purge, self.delete, self.redeclare,
             self.rewind, self.b.sync_now],
            [50, 12, 12, 4, 0.1, 0.1, 1, 0.5, 5])[0]
        op()
        if self.rng.random() < 0.5:
            self.clock.advance(0.001)  # else the next one has the same time: a tie to keep in order


@pytest.mark.parametrize("folded", [True, False])
@pytest.mark.parametrize("seed", range(4))
async def test_the_cache_from_the_queues_is_the_one_the_records_give(tmp_path, monkeypatch, seed, folded):
    if folded:  # fold a backlog of a few messages (module values read when a queue is made)
        monkeypatch.setattr(Q, "FOLD_KEEP", 2)
        monkeypatch.setattr(Q, "FOLD_TAIL", 1)
        monkeypatch.setattr(Q, "FOLD_BATCH", 3)
    rng = random.Random(seed)
    clock = ManualClock()
    d = str(tmp_path / "d")
    runs = cold = records = unclaimed = odd = 0
    for round_ in range(5):
        b = await Broker.open(d, clock=clock)
        for v, q, args in QUEUES:
            if round_ == 0 or rng.random() < 0.3:  # again, or after a deletion
                _declare(b, v, q, args)
        _declare(b, "/", "transient", None, durable=False)  # persistent messages, no records
        unclaimed += sum(len(r.run or ()) for r in b.unclaimed_records.values())
        driver = Driver(b, rng, clock)
        for _ in range(400):
            driver.step()
        if round_ % 2:
            driver.forget_declaration()
        b.sync_now()
        for vh in b.vhosts.values():
            for q in vh.queues.values():
                runs += len(q.cmq.held()[1])
                cold += q.cmq.cold
        expected = _read(b)
        if round_ == 1:
            driver.put_records()
            assert recovery_cache.from_queues(b) is None  # the stop reads the records
            expected = _read(b)
        else:
            got = recovery_cache.from_queues(b)
            assert got is not None, "the queues did not account for the records"
            assert _records(got) == expected
        records += sum(map(len, expected.values()))
        if round_ > 1:  # those put at the end of round 1, restored and written from the queues
            odd += sum(1 for rows in expected.values() for row in rows if "/" in row[0])
        await b.close()
    assert records > 500 and unclaimed and odd
    assert (runs and cold) if folded else True


async def test_a_start_that_changes_nothing_leaves_the_checkpoint_as_it_was(tmp_path):
    """Recovery declares the durable queues, exchanges and bindings again: as they are
    stored, so nothing is written, and the checkpoint the store reopened from holds at the
    next close (not written again: most of a clean stop's time at 10^6 messages)."""
    clock = ManualClock()
    d = str(tmp_path / "d")
    b = await Broker.open(d, clock=clock)
    vh = b.vhost("/")
    _declare(b, "/", "a", {"x-message-ttl": 60000})
    vh.declare_exchange("x", "topic", passive=False, durable=True, auto_delete=False, internal=False,
                        arguments=None)
    vh.bind(None, "x", ("q", "a"), "k.#", None)
    for i in range(20):
        vh.publish("x", "k.1", Properties.build(delivery_mode=2), bytes(i) * 300)
    await b.close()
    with open(tmp_path / "d" / CHECKPOINT_NAME, "rb") as f:
        written = f.read()
    for _ in range(2):
        b = await Broker.open(d, clock=clock)
        assert b.store.recovery.checkpoint and b.vhosts["/"].queues["a"].message_count == 20
        await b.close()
        with open(tmp_path / "d" / CHECKPOINT_NAME, "rb") as f:
            assert f.read() == written
    b = await Broker.open(d, clock=clock)  # a change: the checkpoint goes, another comes at the close
    b.vhost("/").publish("x", "k.1", Properties.build(delivery_mode=2), b"one more")
    await b.close()
    with open(tmp_path / "d" / CHECKPOINT_NAME, "rb") as f:
        assert f.read() != written
    b = await Broker.open(d, clock=clock)
    assert b.store.recovery.checkpoint and b.vhosts["/"].queues["a"].message_count == 21
    await b.close()
