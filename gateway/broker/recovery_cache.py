"""The cold runs of a clean stop, kept for the next start (issue 15, target 2).

A restart rebuilt every queue's cold run (gateway.broker.recovery) by reading and decoding
the head of each of 10^6 message records: most of a restart's time once the store's index
came from its checkpoint. The runs are a function of the store's message records alone, so
a clean stop writes them here as it closes the store; the next start takes them instead of
reading the records when the store reopened from the checkpoint written by that very close
(its token and LSN, semantics/store/checkpoint.py), which proves the records are the same.
The stop does not read the records either: the queues hold what they say, in their runs
and messages (``from_queues``), and the count of records proves it; only when it does not
(a record no queue accounts for) are they read (``read_runs``, as a start after a crash). Anything else (no checkpoint, another one, a cache
that is torn, damaged or from another close) and the records are read, as before; the
cache is removed at every start before the store appends anything, so it never outlives
the state it describes. RabbitMQ does the same with the recovery terms of a clean shutdown.

    messages.cache = HEADER | body, HEADER = magic "CQR1" | token 8s | lsn u64 | body_len u64
                     | body_crc u32 | header_crc u32
    body           = per queue: meta_len u32 | meta (JSON: vhost, queue, combos, odd keys,
                     id bytes, count) | ids | enqueue times f64 | sizes u64 | refs u64
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
import os
import struct
import sys
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.broker import persistence as P
from gateway.broker.folding import DiskPayloads
from gateway.broker.message import Message
from gateway.broker.recovery import QueueRecords, properties_cache, read_runs
from semantics.queue_cold import ColdRun, LiveRun
from semantics.store import Store
from semantics.store.files import fsync_dir

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.broker.queue import BrokerQueue
    from semantics.queue import QueueMessage

__all__ = ["CACHE_NAME", "CachedQueue", "from_queues", "load", "save"]

log = logging.getLogger(__name__)

CACHE_NAME = "messages.cache"
_MAGIC = b"CQR1"
_HEADER = struct.Struct("<4s8sQQI")
_META = struct.Struct("<I")
_SEQ = operator.attrgetter("seq")
_HEAD_SEQ = operator.methodcaller("head_seq")


class CachedQueue:
    """One queue's message records as the cache holds them: per record its ID, enqueue
    time, body size and ``ref``, the index of its (properties bytes, exchange, routing key)
    in ``combos``; ``odd`` the keys other than the queue's prefix and the ID."""

    __slots__ = ("vhost", "queue", "combos", "shared", "odd", "ids", "times", "sizes", "refs")

    def __init__(self, vhost: str, queue: str) -> None:
        self.vhost = vhost
        self.queue = queue
        self.combos: list[tuple[bytes, str, str]] = []
        self.shared: dict[tuple[bytes, str, str], int] = {}
        self.odd: dict[str, str] = {}
        self.ids = bytearray(b"\x00")  # as ColdRun.ids: "\0id\0id\0..."
        self.times = array("d")
        self.sizes = array("Q")
        self.refs = array("Q")

    @classmethod
    def of_records(cls, vhost: str, queue: str, records: QueueRecords) -> CachedQueue:
        """The run ``read_runs`` read for the queue."""
        run = records.run
        assert run is not None
        cq = cls(vhost, queue)
        cq.combos = [combo for combo, _ in sorted(records.shared.items(), key=lambda kv: kv[1])]
        cq.shared = dict(records.shared)
        cq.odd = dict(records.odd_keys)
        cq.ids, cq.times, cq.sizes, cq.refs = run.ids, run.enqueue_times, run.sizes, run.refs
        return cq

    def __len__(self) -> int:
        return len(self.times)

    def ref(self, combo: tuple[bytes, str, str]) -> int:
        ref = self.shared.get(combo)
        if ref is None:
            ref = self.shared[combo] = len(self.combos)
            self.combos.append(combo)
        return ref

    def add(self, msg_id: str, key: str, prefix: str, enqueue_time: float, size: int,
            combo: tuple[bytes, str, str]) -> None:
        """One record."""
        self.ids += msg_id.encode()
        self.ids.append(0)
        self.times.append(enqueue_time)
        self.sizes.append(size)
        self.refs.append(self.ref(combo))
        if key != prefix + msg_id:
            self.odd[msg_id] = key

    def add_refs(self, refs: array[int], combos: list[tuple[Any, str, str]]) -> None:
        """``refs`` into another list of (Properties, exchange, routing key), as this one's."""
        table = {r: self.ref((combos[r][0].raw, combos[r][1], combos[r][2])) for r in sorted(set(refs))}
        if all(old == new for old, new in table.items()):
            self.refs += refs if refs.typecode == "Q" else array("Q", refs)  # a LiveRun's are narrower
        else:
            self.refs += array("Q", map(table.__getitem__, refs))

    def add_cold(self, run: ColdRun, records: QueueRecords) -> None:
        """A restored run's messages from its head on."""
        head = run.head
        self.ids += memoryview(run.ids)[run.cursor:]
        self.times += run.enqueue_times[head:]
        self.sizes += run.sizes[head:]
        self.add_refs(run.refs[head:], records.combos)
        self.odd.update(records.odd_keys)  # the thawed ones' are gone from it

    def add_live(self, run: LiveRun, freezer: DiskPayloads, start: int, end: int) -> None:
        """Messages ``start`` to ``end`` of a folded run. Their IDs are the run's prefix and
        each counter in 16 hex digits (LiveRun.take), made here all at once."""
        n = end - start
        if n <= 0:
            return
        prefix = run.prefix.encode()
        width = len(prefix) + 17
        ids = bytearray((prefix + bytes(17)) * n)
        counters = run.counters[start:end]
        if sys.byteorder == "little":
            counters.byteswap()
        digits = counters.tobytes().hex().encode()
        at = len(prefix)
        for k in range(16):
            ids[at + k::width] = digits[k::16]
        self.ids += ids
        self.times += run.enqueue_times[start:end]
        sizes = run.sizes[start:end]
        self.sizes += sizes if sizes.typecode == "Q" else array("Q", sizes)  # 4 bytes in a LiveRun
        self.add_refs(run.refs[start:end], freezer.combos)


def _encode(queues: list[CachedQueue]) -> list[bytes]:
    body: list[bytes] = []
    for cq in queues:
        combos = [[raw.decode("latin-1"), exchange, routing_key] for raw, exchange, routing_key in cq.combos]
        meta = json.dumps({"vhost": cq.vhost, "queue": cq.queue, "combos": combos, "odd": cq.odd,
                           "ids": len(cq.ids), "count": len(cq.times)}).encode()
        body += [_META.pack(len(meta)), meta, bytes(cq.ids), cq.times.tobytes(), cq.sizes.tobytes(),
                 cq.refs.tobytes()]
    return body


def _unclaimed(store: Store, vhost: str, queue: str, records: QueueRecords) -> CachedQueue:
    """The records of a queue that did not exist at the start: those still stored."""
    cq = CachedQueue(vhost, queue)
    run = records.run
    if run is None or not len(run.enqueue_times):
        return cq
    combos = [(p.raw, exchange, routing_key) for p, exchange, routing_key in records.combos]
    for i, raw_id in enumerate(bytes(run.ids[1:-1]).split(b"\x00")):
        msg_id = raw_id.decode()
        key = records.odd_keys.get(msg_id) or records.prefix + msg_id
        if key in store:
            cq.add(msg_id, key, records.prefix, run.enqueue_times[i], run.sizes[i], combos[run.refs[i]])
    return cq


def _add_queue(cq: CachedQueue, store: Store, q: BrokerQueue) -> bool:
    """Add the records of ``q``'s messages in production order, the order the store holds
    them in (each was put as its message was sent or restored); False when the queue holds
    something this cannot account for."""
    hot, runs = q.cmq.held()
    hot.sort(key=_SEQ)
    runs.sort(key=_HEAD_SEQ)
    vhost, name, key_of = q.vhost, q.name, P.message_key
    prefix = P.queue_messages_prefix(vhost, name)
    n = len(hot)
    i = 0

    def add_hot(m: QueueMessage) -> bool:
        key = key_of(vhost, name, m.msg_id)
        if key not in store:
            return True  # not persistent, or deleted and kept for a rewind (Q6)
        msg = m.payload
        if not isinstance(msg, Message):
            return False
        cq.add(m.msg_id, key, prefix, m.enqueue_time, m.size, (msg.properties.raw, msg.exchange, msg.routing_key))
        return True

    last = -1
    for run in runs:
        first = run.head_seq()
        if first <= last:
            return False  # runs that overlap: never made so
        last = run.last_seq()
        while i < n and hot[i].seq < first:
            if not add_hot(hot[i]):
                return False
            i += 1
        if type(run) is ColdRun:
            # Its positions from the head on are all its own: nothing hot among them.
            records = getattr(run.thaw, "__self__", None)
            if not isinstance(records, QueueRecords) or (i < n and hot[i].seq <= last):
                return False
            cq.add_cold(run, records)
        elif type(run) is LiveRun:
            freezer = run.freezer
            if not isinstance(freezer, DiskPayloads):
                return False
            start, seqs = run.head, run.seqs
            while i < n and hot[i].seq <= last:  # messages that stayed hot amid the folded
                end = bisect_left(seqs, hot[i].seq, start)
                if seqs[end] == hot[i].seq:
                    return False
                cq.add_live(run, freezer, start, end)
                start = end
                if not add_hot(hot[i]):
                    return False
                i += 1
            cq.add_live(run, freezer, start, len(seqs))
        else:
            return False
    while i < n:
        if not add_hot(hot[i]):
            return False
        i += 1
    return True


def from_queues(broker: Broker) -> list[CachedQueue] | None:
    """The store's message records as the queues hold them now, or None when they do not
    account for every one of them (the stop then reads the records, as a start would).

    A durable queue's records are its messages, read here without thawing any: its runs
    (restored or folded; a run's records stay as they are while its messages are in it)
    and, of its messages that are objects, those whose key is in the store; before them,
    the records left by a queue of that name that did not exist at the start. The count of
    message records in the store being the count found here proves the two the same set:
    a record left behind (a removal whose delete has not happened) makes it differ."""
    store = broker.store
    assert isinstance(store, Store)
    queues = {where: _unclaimed(store, *where, records) for where, records in broker.unclaimed_records.items()}
    for vname, vh in broker.vhosts.items():
        for qname, q in vh.queues.items():
            if not q.durable:
                continue
            cq = queues.get((vname, qname))
            if cq is None:
                cq = queues[(vname, qname)] = CachedQueue(vname, qname)
            if not _add_queue(cq, store, q):
                log.info("recovery cache: queue %r of vhost %r holds what it cannot write; reading the records",
                         qname, vname)
                return None
    found = [cq for cq in queues.values() if len(cq)]
    held, stored = sum(map(len, found)), len(store.keys(P.MESSAGES_PREFIX))
    if held != stored:
        log.info("recovery cache: the queues hold %d message records, the store %d; reading the records",
                 held, stored)
        return None
    return found


def save(broker: Broker) -> None:
    """Write the cache for the store as it is now (call it right before the store's clean
    close, with nothing left to write), from the queues (``from_queues``), else from the
    records. A failure only costs the next start its speed."""
    store = broker.store
    directory = broker.data_dir
    if directory is None or not isinstance(store, Store):
        return
    final = os.path.join(directory, CACHE_NAME)
    tmp = final + ".tmp"
    try:
        queues = from_queues(broker)
        if queues is None:
            queues = [CachedQueue.of_records(vhost, queue, records)
                      for (vhost, queue), records in read_runs(store, properties_cache()).items()]
        body = _encode(queues)
        crc = 0
        for piece in body:
            crc = zlib.crc32(piece, crc)
        head = _HEADER.pack(_MAGIC, store.checkpoint_token, store.last_lsn, sum(map(len, body)), crc)
        # Not fsynced: a cache that did not reach the disk whole fails its CRCs (or is
        # missing), and one that did describes nothing but its own close (token and LSN),
        # so a crash after the stop costs the next start its speed, never its state. The
        # fsync of 57 MB at 10^6 messages took 0.5 s of a stop after a long publish.
        with open(tmp, "wb") as f:
            f.write(head + zlib.crc32(head).to_bytes(4, "little"))
            for piece in body:
                f.write(piece)
        os.replace(tmp, final)
    except Exception:
        log.warning("recovery cache not written; the next start reads the message records", exc_info=True)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _read(broker: Broker) -> bytes | None:
    """The cache's bytes, removed from the directory (durably) as it is read."""
    directory = broker.data_dir
    if directory is None or not isinstance(broker.store, Store):
        return None
    path = os.path.join(directory, CACHE_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    os.unlink(path)
    if broker.store.fsync:
        fsync_dir(directory)
    return raw


def load(broker: Broker, properties: Callable[[bytes], Any]) -> dict[tuple[str, str], QueueRecords] | None:
    """The runs of the cache if it was written for exactly the state the store reopened
    with, else None; the cache is gone from the directory either way."""
    raw = _read(broker)
    if raw is None or not isinstance(broker.store, Store) or not broker.store.recovery.checkpoint:
        return None
    report = broker.store.recovery
    hsize = _HEADER.size
    if len(raw) < hsize + 4 or zlib.crc32(raw[:hsize]) != int.from_bytes(raw[hsize:hsize + 4], "little"):
        return None
    magic, token, lsn, body_len, crc = _HEADER.unpack_from(raw)
    body = memoryview(raw)[hsize + 4:]
    if (magic != _MAGIC or token != report.checkpoint_token or lsn != report.checkpoint_lsn
            or len(body) != body_len or zlib.crc32(body) != crc):
        return None
    store = broker.store
    runs: dict[tuple[str, str], QueueRecords] = {}
    pos = 0
    try:
        while pos < body_len:
            (n,) = _META.unpack_from(body, pos)
            pos += _META.size
            meta = json.loads(bytes(body[pos:pos + n]))
            pos += n
            records = QueueRecords(store, meta["vhost"], meta["queue"])
            for text, exchange, routing_key in meta["combos"]:
                records.ref(text.encode("latin-1"), ("", "", exchange, routing_key), properties)
            records.odd_keys.update(meta["odd"])
            run = records.run
            assert run is not None
            count = meta["count"]
            run.ids = bytearray(body[pos:pos + meta["ids"]])
            pos += meta["ids"]
            for column in (run.enqueue_times, run.sizes, run.refs):
                column.frombytes(body[pos:pos + 8 * count])
                pos += 8 * count
            if len(run.refs) != count or any(len(c) != count for c in (run.enqueue_times, run.sizes)):
                return None
            runs[(meta["vhost"], meta["queue"])] = records
    except (ValueError, KeyError, TypeError, struct.error):
        return None
    return runs if pos == body_len else None

