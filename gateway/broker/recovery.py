"""Persistent messages of durable queues back from the store at a restart, in bulk (issue 15).

Each record's head is read straight from the mapped journal (its body stays there) and goes
into its queue's :class:`~semantics.queue_cold.ColdRun` as a few array entries: no Message,
QueueMessage or timer is made until the message is delivered or inspected. What a run
keeps per message is its ID, enqueue time, body size and ``ref``, the index of the
(properties, exchange, routing key) it shares with others of its queue; the store key is
the queue's prefix and the ID, as the broker writes it (an older record under another key
keeps that key on the side).
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.broker import persistence as P
from gateway.broker.message import DISK_BODY_MIN, Message, recovered
from gateway.memory import HELD, HeldMemory
from semantics.queue_cold import ColdRun

log = logging.getLogger("cmq_gateway.broker")

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.vhost import VHost

__all__ = ["COLD_MESSAGE_BYTES", "QueueRecords", "properties_cache", "read_runs", "rebuild_records", "recover_messages",
           "return_big_buffers"]

# W5: what a message held cold counts as held memory: its ID and array entries (~60 bytes,
# tracemalloc), not the ~700 of a message made of objects (gateway.memory).
COLD_MESSAGE_BYTES = 64

_HEAD_BYTES = 512

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_BIG_BUFFER = 1 << 20


def return_big_buffers() -> bool:
    """Make glibc place every allocation of 1 MiB and more in a mapping of its own, given
    back to the system when freed. By default glibc raises that threshold (up to 32 MiB)
    each time such a buffer is freed, so the next big ones (the runs' arrays, the store
    map's table as it grows) come from the heap, where a drained backlog left them as holes
    the heap cannot shrink past (issue 15: a drained restart held 2x its idle RSS; with
    this, 1.2x). Setting it once also turns that adjustment off. False where there is no
    glibc (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _BIG_BUFFER))
    except (OSError, AttributeError):
        return False


class QueueRecords:
    """One queue's records as they are read: the run and what its refs and keys point at."""

    __slots__ = ("run", "shared", "combos", "odd_keys", "prefix", "store", "held")

    def __init__(self, store: Any, vhost: str, queue: str) -> None:
        self.store = store
        self.prefix = P.queue_messages_prefix(vhost, queue)
        self.shared: dict[tuple[bytes, str, str], int] = {}
        self.combos: list[tuple[Any, str, str]] = []  # (Properties, exchange, routing key)
        self.odd_keys: dict[str, str] = {}  # msg_id -> key
        # The run calls back self.thaw, so self lets go of the run once it is built: no
        # cycle, and its buffers go the moment the queue drops it.
        self.run: ColdRun | None = ColdRun(self.thaw)
        self.held = 0  # W5 bytes counted for the messages still cold

    def count_held(self, messages: int) -> None:
        self.held = messages * COLD_MESSAGE_BYTES
        HELD.messages += self.held

    def __del__(self, _held: HeldMemory = HELD) -> None:  # bound now: safe at interpreter exit
        _held.messages -= self.held

    def ref(self, raw: bytes, four: tuple[str, str, str, str], properties: Callable[[bytes], Any]) -> int:
        """The index of (these properties, exchange, routing key) in ``combos``."""
        combo = (raw, four[2], four[3])
        ref = self.shared.get(combo)
        if ref is None:
            ref = self.shared[combo] = len(self.combos)
            self.combos.append((properties(raw), four[2], four[3]))
        return ref

    def thaw(self, index: int, msg_id: str, enq: float, size: int, ref: int) -> object:
        if self.held:
            self.held -= COLD_MESSAGE_BYTES
            HELD.messages -= COLD_MESSAGE_BYTES
        props, exchange, routing_key = self.combos[ref]
        key = self.odd_keys.pop(msg_id, None) if self.odd_keys else None
        if key is None:
            key = self.prefix + msg_id
        if size >= DISK_BODY_MIN:
            return recovered(self.store, key, props, exchange, routing_key, enq, msg_id)
        raw = self.store.get(key)
        body = P.message_body(raw) if raw is not None else b""
        return Message(body, props, exchange, routing_key, enq, (), msg_id)


def properties_cache() -> Callable[[bytes], Any]:
    """Properties by their bytes: equal property bytes share one Properties (it only caches
    what it decodes from them)."""
    from gateway.protocol.properties import Properties

    props_of: dict[bytes, Any] = {}

    def properties(raw: bytes) -> Any:
        p = props_of.get(raw)
        if p is None:
            p = props_of[raw] = Properties(raw)
        return p

    return properties


def read_runs(store: Any, properties: Callable[[bytes], Any]) -> dict[tuple[str, str], QueueRecords]:
    """Every message record in the store as a cold run of its (vhost, queue), in the
    store's order (the enqueue order)."""
    names: dict[bytes, tuple[str, str, str, str]] = {}
    by_queue: dict[tuple[str, str], QueueRecords] = {}
    decode = P.decode_message_head
    at: tuple[str, str, str, str] | None = None
    records: QueueRecords | None = None
    last_raw = b""
    ref = -1
    # The loop is QueueRecords.add and ColdRun.append inlined, with the ref of the record
    # before reused while the properties repeat: 10^6 records pass here at a restart.
    for key, head, length in store.heads(P.MESSAGES_PREFIX, _HEAD_BYTES):
        got = decode(head, names)
        if got is None:  # a head longer than _HEAD_BYTES (large properties): read it all
            head = store.get(key) or b""
            got = decode(head, names)
            assert got is not None
        enq, four, msg_id, raw, body_at = got
        if four is not at:  # the same names as the record before: the same queue
            at = four
            records = by_queue.get((four[0], four[1]))
            if records is None:
                records = by_queue[(four[0], four[1])] = QueueRecords(store, four[0], four[1])
            run = records.run
            assert run is not None
            ids, times, sizes, refs = run.ids, run.enqueue_times, run.sizes, run.refs
            prefix = records.prefix
            ref = -1
        assert records is not None
        if ref < 0 or raw != last_raw:
            ref = records.ref(raw, four, properties)
            last_raw = raw
        if key != prefix + msg_id:
            records.odd_keys[msg_id] = key
        ids += msg_id.encode()
        ids.append(0)
        times.append(enq)
        sizes.append(length - body_at)
        refs.append(ref)
    return by_queue


def recover_messages(broker: Broker, now: float) -> None:
    """Every persistent message of a durable queue comes back as a cold run of its queue
    (semantics.queue_cold); records of a queue that no longer exists stay in the store, and
    their run in ``broker.unclaimed_records`` for the clean stop's cache (recovery_cache).
    The runs come from the cache a clean stop left (recovery_cache) when it was made for
    exactly the state the store reopened with, else from the records themselves."""
    from gateway.broker import recovery_cache

    properties = properties_cache()
    by_queue = recovery_cache.load(broker, properties)
    if by_queue is None:
        by_queue = read_runs(broker.store, properties)
    rebuild_records(broker, by_queue)
    touched: dict[BrokerQueue, VHost] = {}
    for (vhost, queue), records in by_queue.items():
        vh = broker.vhost(vhost)
        q = vh.queues.get(queue)
        if q is None:
            # Kept as read: the clean stop writes them down again while they are stored.
            broker.unclaimed_records[(vhost, queue)] = records
            continue
        run, records.run = records.run, None
        if run is not None:
            records.count_held(len(run))
            q.cmq.restore_cold(run, now)
            touched[q] = vh
    # Once a queue, when all its messages are back (it was once a message: a quarter of
    # the recovery's time went to rescheduling the same queue).
    for q, vh in touched.items():
        broker.after_queue_change(vh, q, dispatch=False)


def _stored_since(broker: Broker, by_queue: dict[tuple[str, str], QueueRecords], since: float
                  ) -> list[tuple[str, str, str, str, str, int]]:
    """The messages of existing queues enqueued from ``since`` on: (vhost, queue, msg_id,
    exchange, routing key, size). A run is in store order, so its tail is walked back only."""
    out: list[tuple[str, str, str, str, str, int]] = []
    for (vhost, queue), records in by_queue.items():
        run = records.run
        vh = broker.vhosts.get(vhost)
        if run is None or vh is None or queue not in vh.queues:
            continue
        times = run.enqueue_times
        n = len(times)
        k = 0
        while k < n and times[n - 1 - k] >= since:
            k += 1
        if not k:
            continue
        ids = bytes(run.ids).rsplit(b"\x00", k + 1)[1:-1]
        for i, raw in zip(range(n - k, n), ids, strict=True):
            _, exchange, routing_key = records.combos[run.refs[i]]
            out.append((vhost, queue, raw.decode(), exchange, routing_key, run.sizes[i]))
    return out


def rebuild_records(broker: Broker, by_queue: dict[tuple[str, str], QueueRecords]) -> None:
    """A5: the publish and enqueue records a crash kept from the audit log, for the stored
    messages that come back (gateway.audit.rebuild), written before anything else happens."""
    directory = getattr(broker.audit, "directory", None)
    if directory is None or not by_queue:
        return
    from gateway.audit import rebuild

    try:
        found = rebuild.missing(directory, lambda since: _stored_since(broker, by_queue, since))
    except OSError:
        log.warning("audit: the log could not be read to find the records a crash lost", exc_info=True)
        return
    for event, vhost, fields in found:
        broker.emit_fields(event, vhost, fields)
