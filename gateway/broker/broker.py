"""The broker: vhosts (M1), the store, one scheduler and the group-commit flusher (M14)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from gateway.audit import NullAudit
from gateway.audit.rows import ACK, ACK_MQTT, Row, fields_emitter, row_emitter, values_emitter
from gateway.broker import persistence as P
from gateway.broker import recovery_cache
from gateway.broker.channel import deliver_run
from gateway.broker.consumers import Consumer, Unacked
from gateway.broker.deadletter import cycling_queues, dead_letter_properties
from gateway.broker.exchange import sub_label
from gateway.broker.limit_report import LimitEntry, LimitReport
from gateway.broker.membership import EmbeddedMembership, Membership
from gateway.broker.message import Message
from gateway.broker.queue import BrokerQueue
from gateway.broker.recovery import QueueRecords, recover_messages, return_big_buffers
from gateway.broker.reply_to import ReplyRouter
from gateway.broker.scheduler import Scheduler
from gateway.broker.storage import EmbeddedMessages, MessageStorage
from gateway.broker.vhost import VHost
from semantics import queue as Q
from semantics import topic as T
from semantics.clock import Clock, SystemClock
from semantics.errors import LimitError
from semantics.limits import TOPIC_LIFECYCLE_SECONDS
from semantics.names import Kind, cmq_name
from semantics.profile import COMPATIBLE, DEFAULT_PROFILE, Profile, profile_named
from semantics.store import Store, StoreFailedError
from semantics.store.backend import StoreBackend
from semantics.store.store import COMPACT_MIN_BYTES
from semantics.store.versioning import upgrade
from semantics.waiters import Waiters

if TYPE_CHECKING:
    from gateway.broker.channel import Channel
    from gateway.broker.exchange import Exchange
    from gateway.broker.session import Session

__all__ = ["Broker", "BrokerConfig"]

_floor = math.floor

log = logging.getLogger("cmq_gateway.broker")

# How often a failed store write is retried (a full disk may get room back at any time).
STORE_RETRY_SECONDS = 1.0
# A5: how long a group commit waits for the audit writer before it lets the confirms go (a
# writer that cannot write counts what it lost in audit_dropped; confirms are not held hostage).
AUDIT_SYNC_TIMEOUT = 30.0
# No audit log: confirms follow the store alone.
NO_AUDIT_LIMIT = 1 << 62


def _no_handoff() -> bool:
    """An audit sink without a writer process to hand records to (A5)."""
    return True


@dataclass
class BrokerConfig:
    """What the broker reads from the gateway configuration (any object with these attributes
    works; missing ones take these defaults)."""

    vhosts: list[str] = field(default_factory=lambda: ["/"])
    strict_names: bool = False
    profile: str = DEFAULT_PROFILE.name  # PF1: "compatible" or "cmq"
    vhost_profiles: dict[str, str] = field(default_factory=dict)  # PF1: per-vhost overrides
    fsync: bool = True
    salvage: bool = False  # open a store with damaged confirmed data, setting the damage aside
    compact_min_bytes: int = COMPACT_MIN_BYTES  # the journal is compacted above this size


def ack_latency(now: float, published_at: float) -> float:
    """The ack record's latency in ms, round(x, 3) of x = (now - published_at) * 1000.0 without
    round's decimal conversion (dtoa and snprintf, ~2.5k instructions an ack): when x * 1000 is
    not within 0.0001 of a half, its nearest integer r is the one round keeps, and r / 1000.0
    is the double nearest r/1000, which round returns. Ties, negatives (round's -0.0) and
    latencies past ~19 h (the float's spacing) are round's own. (The compiled ack computes the
    same for two floats, and calls this otherwise.)"""
    x = (now - published_at) * 1000.0
    y = x * 1000.0
    r = _floor(y + 0.5)
    return r / 1000.0 if 0.0 <= y < 6.8e10 and -0.4999 < y - r < 0.4999 else round(x, 3)


class Broker:
    """All vhosts of one gateway process.

    Open with ``await Broker.open(data_dir, clock=..., audit=..., config=...)``; ``data_dir``
    None keeps everything in memory. Durable exchanges, queues, bindings and persistent
    messages in durable queues are journaled in the store and recovered on open.
    """

    emit_row: Callable[[Row, str, tuple[Any, ...]], None]
    emit_values: Callable[..., None]  # emit_values(row, vhost, *values): the hot paths' (no tuple)
    emit_fields: Callable[[str, str, dict[str, Any]], None]
    audit_handoff: Callable[[], bool]  # False: a stop is asked and the records are not out
    store: StoreBackend
    # The seams where the stores differ; the cluster broker (gateway.jetstream) fills each
    # with its own, so that the embedded path runs one code with no test of the store behind.
    # Where queue messages are kept (gateway.broker.storage).
    storage_class: Callable[[Any], MessageStorage] = EmbeddedMessages
    # What a vhost asks of the other gateways (gateway.broker.membership).
    membership_class: Callable[[Any], Membership] = EmbeddedMembership

    @property
    def clock(self) -> Clock:
        return self._clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self._clock = clock
        # clock.now resolved once (SystemClock's is time.time): ``broker.clock.now()`` on the
        # publish and ack paths was a method load CPython 3.11 cannot specialize (a staticmethod).
        # Read as ``clock_now = broker.clock_now; clock_now()``: an instance attribute called
        # as ``broker.clock_now()`` is not specialized either.
        self.clock_now: Callable[[], float] = clock.now

    @property
    def audit(self) -> Any:
        """The audit sink (A1). Setting it also sets ``emit_row`` (the per-message records'
        way in) and ``emit_fields`` (a record whose fields are already a dict), resolved once
        rather than on every record."""
        return self._audit

    @audit.setter
    def audit(self, sink: Any) -> None:
        self._audit = sink
        self.emit_row = row_emitter(sink)
        self.emit_values = values_emitter(sink)
        self.emit_fields = fields_emitter(sink)
        # A5: called by the transports before they write to a client (a delivery), so that
        # what the client sees has its records out of this process first (AuditLog.handoff).
        self.audit_handoff = getattr(sink, "handoff", None) or _no_handoff

    def __init__(self, data_dir: str | None, *, clock: Clock, audit: Any, config: Any,
                 loop: asyncio.AbstractEventLoop | None = None, lock: Any = None,
                 store: StoreBackend | None = None) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.audit = audit if audit is not None else NullAudit()  # sets emit_row/emit_fields too
        if bind_ack is not None and type(self).ack is Broker.ack:
            # ack compiled (gateway/broker/_queue.c), bound here: Session.on_acks and Channel.ack
            # call ``broker.ack`` a delivery, now without a Python frame (Broker.ack is its reference).
            self.ack = bind_ack(self)  # type: ignore[method-assign]
        self.config = config if config is not None else BrokerConfig()
        self.strict_names = bool(getattr(self.config, "strict_names", False))  # L2
        # PF1: the gateway's profile, and the vhosts that override it.
        self.profile = profile_named(getattr(self.config, "profile", None))
        self.vhost_profiles: dict[str, Profile] = {
            str(v): profile_named(p) for v, p in (getattr(self.config, "vhost_profiles", None) or {}).items()}
        self.limit_report = LimitReport()  # PF4: the migration report
        self.limit_report.on_clear = self._unkeep_limit_entries  # A6: kept in the store
        self._recovering = False
        # Advertised in connection.start capabilities (W1): exchange.bind works (M8).
        self.exchange_exchange_bindings = True
        if store is None:
            store = Store.open(data_dir, fsync=getattr(self.config, "fsync", True),
                               salvage=bool(getattr(self.config, "salvage", False)),
                               compact_min_bytes=int(getattr(self.config, "compact_min_bytes", COMPACT_MIN_BYTES)),
                               lock=lock)
        self.store = store
        # Queue messages (gateway.broker.storage) and membership (gateway.broker.membership).
        self.messages: MessageStorage = self.storage_class(self)
        # The embedded store holds every message of a queue in its model (want() brings in
        # nothing): an ack on a queue with nothing Active and nothing due has nothing to hand
        # out (Broker.ack). A store that pulls for freed credit (JetStream) dispatches always.
        self._local_messages = type(self.messages) is EmbeddedMessages
        self.membership: Membership = self.membership_class(self)
        self.opened_lsn = int(getattr(store, "last_lsn", 0))  # the last durable write before this start (MQ8)
        self._log_recovery()
        self._upgrade_store()
        self.vhosts: dict[str, VHost] = {}
        for name in getattr(self.config, "vhosts", None) or ["/"]:
            self.vhost(name)
        self.sessions: set[Session] = set()
        self.replies = ReplyRouter()  # direct reply-to (amq.rabbitmq.reply-to)
        # Delivery to subscription endpoints the broker does not serve itself (D7), by the
        # endpoint's kind: ("http", url) -> hook(topic, subscription, topic_message), which
        # answers True (delivered), False (failed: retry policy) or None (pending: the hook
        # reports the outcome to the topic later).
        self.endpoint_hooks: dict[str, Callable[[Any, Any, Any], bool | None]] = {}
        self.http_pusher: Any = None  # gateway.push.HttpPusher, once HTTP subscriptions exist
        self.confirm_waiters: set[Channel] = set()
        # Publishes acked to publishers, by vhost (the management API's message_stats.confirm;
        # the audit log has no record of a confirm to count).
        self.confirmed: dict[str, int] = {}
        # True while the store cannot write (W5, M14). The guarantee, for a persistent message
        # to a durable queue: basic.ack only once it is on disk (fsynced); basic.nack only for
        # a message the gateway never took (published while read-only: not enqueued, so never
        # stored later); a confirm that waited on the write that failed keeps waiting, and is
        # an ack once the retried write succeeds (or a nack if the gateway stops first, its
        # message then dropped). Everything else keeps working in memory, acks included: their
        # deletes are journalled when the store resumes.
        self.read_only = False
        self.on_store_change: Callable[[bool], None] = lambda failed: None  # the server's disk alarm
        self._confirms_ready: list[Channel] = []  # channels with acks to send at end_batch()
        # (lsn, queue message) of persistent bodies to leave in the store once that LSN is
        # durable (Message.to_disk), in LSN order.
        self._to_disk: deque[tuple[int, Q.QueueMessage]] = deque()
        self.scheduler = Scheduler(clock, loop, on_ran=self._flush_sessions)
        self._loop = loop
        self._dirty = asyncio.Event() if loop is not None else None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="store-sync")
        self._flusher: asyncio.Task[None] | None = None
        self._batch_depth = 0  # begin_batch() nesting (the transport's read turns)
        self._to_dispatch: dict[BrokerQueue, None] = {}  # queues to dispatch at end_batch()
        # Queues whose last dispatch ended for want of a consumer's credit: the loop owes their
        # consumers deliveries as soon as it reads their acks. The transport lets a busy
        # publisher wait while such a consumer's input is unread (gateway/transport.py,
        # owed_input_waiting). Entries of deleted or consumer-less queues are skipped there.
        self.owed: dict[BrokerQueue, None] = {}
        self.dispatches_out = 0  # dispatches that let a message out: the yield's progress
        # Q5: channels whose long-polling basic.get was answered, their held events to replay
        # once no other input is being handled (end_batch, or the next loop turn).
        self._replays: deque[Channel] = deque()
        self._replay_soon = False
        # Message records of queues that did not exist at the start, as read then
        # (gateway.broker.recovery): still stored until something deletes them.
        self.unclaimed_records: dict[tuple[str, str], QueueRecords] = {}
        self._closed = False
        # A5: the store LSN up to which the audit records are on disk as well; only the
        # group commit (_flush_loop) moves it, so with an audit log a confirm waits for its
        # message's publish and enqueue records. No audit log: no limit.
        self._audit_sync = getattr(audit, "sync_mark", None) is not None
        self._audit_lsn = NO_AUDIT_LIMIT
        self._tasks: set[asyncio.Task[Any]] = set()  # spawn(): cancelled at close

    @classmethod
    async def open(cls, data_dir: str | None, *, clock: Clock | None = None, audit: Any = None,
                   config: Any = None, lock: Any = None) -> Broker:
        """Open the store under ``data_dir``, recover durable state and start the flusher.
        ``lock``: the data dir's DirLock when the caller took it first (Store.open)."""
        loop = asyncio.get_running_loop()
        return_big_buffers()  # before the store's map and the runs grow
        broker = cls(data_dir, clock=clock or SystemClock(), audit=audit, config=config, loop=loop, lock=lock)
        broker._recover()
        if broker._audit_sync:
            broker._audit_lsn = broker._last_lsn()  # what recovery wrote needs no confirm
        broker.messages.start()  # the group commit (_flush_loop)
        return broker

    # -- basics ------------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock.now()

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` on the loop, cancelled when the broker closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(self, name, self.profile_of(name))
        return vh

    # -- profiles (PF1-PF4) ------------------------------------------------------------------

    def profile_of(self, vhost: str) -> Profile:
        """PF1: the vhost's own profile, else the gateway's (compatible while recovering)."""
        if self._recovering:
            return COMPATIBLE
        return self.vhost_profiles.get(vhost, self.profile)

    def set_vhost_profile(self, vhost: str, profile: str | Profile | None) -> Profile:
        """PF1: override (None: drop the override of) one vhost's profile, from now on."""
        if profile is None:
            self.vhost_profiles.pop(vhost, None)
        else:
            self.vhost_profiles[vhost] = profile_named(profile)
        chosen = self.profile_of(vhost)
        self.vhost(vhost).set_profile(chosen)
        return chosen

    def report_breach(self, vhost: str, err: LimitError, object: str, user: str | None,
                      peer: str | None) -> None:
        """PF4: a breach the cmq profile would refuse, let through: one audit record
        ``limit_exceeded`` (rule, value, limit, object, user, peer; reason: the refusal text)
        and an entry in the migration report."""
        if self._recovering and self.limit_report.has(vhost, err.rule, object):
            return  # A6: a standing breach the report kept across the restart: reported already
        value = err.value if isinstance(err.value, int) and not isinstance(err.value, bool) else None
        limit = err.limit if isinstance(err.limit, int) and not isinstance(err.limit, bool) else None
        # While recovering, emit_fields marks it origin "recovery": found again, not a client's doing.
        self.emit_fields("limit_exceeded", vhost, {"rule": err.rule, "value": value, "limit": limit,
                                                   "object": object, "user": user, "peer": peer,
                                                   "reason": err.reply_text})
        if self.limit_report.record(vhost, err.rule, object, user, peer, value, limit, err.reply_text,
                                    self.clock.now()):
            self._keep_limit_entry(vhost, err.rule, object, user)

    # -- the limits report across restarts (A6) ----------------------------------------------

    def _keep_limit_entry(self, vhost: str, rule: str, object: str, user: str | None) -> None:
        entry = self.limit_report.entry(vhost, rule, object, user)
        if entry is not None:
            self.persist(P.limit_key(vhost, rule, object, user), P.encode_json(entry.as_json()))

    def _unkeep_limit_entries(self, entries: list[LimitEntry]) -> None:
        for e in entries:
            self.unpersist(P.limit_key(e.vhost, e.rule, e.object, e.user), missing_ok=True)

    def _keep_limit_counts(self) -> None:
        """A clean stop: the counts and times changed since the entries were made."""
        changed, self.limit_report.changed = self.limit_report.changed, set()
        for vhost, rule, object, user in changed:
            self._keep_limit_entry(vhost, rule, object, user)

    def _recover_limit_report(self) -> None:
        for _, raw in self.store.items(P.LIMITS_PREFIX):
            r = P.decode_json(raw)
            self.limit_report.restore(LimitEntry.from_json(r["vhost"], r))

    def _recover_names(self, vh: VHost, kind: Kind, names: Any) -> None:
        """L1/L2 (PF4): a restored exchange's or queue's name CMQ could not hold is a standing
        breach (VHost._check_name skips them while recovering: it would raise under
        strict_names). Reported as report_breach does while recovering (A6)."""
        what = "exchange" if kind == "topic" else "queue"
        for name in names:
            try:
                cmq_name(name, kind, strict=True)
            except LimitError as e:
                self.report_breach(vh.name, e, f"{what}:{name}", None, None)

    # -- the store and group commit (M14) ----------------------------------------------------

    def persist(self, key: str, value: bytes) -> int:
        if self._recovering and self.store.checkpoint_token is not None and self.store.get(key) == value:
            # A declaration coming back as it is stored: putting it again changed nothing
            # but made the checkpoint the store reopened from stale, so that the next clean
            # close wrote it again (1.3 s at 10^6 messages) after a start that changed nothing.
            return self._last_lsn()
        lsn = self.store.put(key, value)
        if self._dirty is not None:
            self._dirty.set()
        return lsn

    def unpersist(self, key: str, missing_ok: bool = False) -> None:
        if key in self.store:
            self.store.delete(key)
            if self._dirty is not None:
                self._dirty.set()

    def _last_lsn(self) -> int:
        """The store's latest LSN (both stores have it; StoreBackend does not say so)."""
        return int(cast(Any, self.store).last_lsn)

    @property
    def durable_lsn(self) -> int:
        """What confirms follow (M14): the store's durable LSN, and with an audit log no
        further than the LSN whose records are on disk too (A5, ``_flush_loop``)."""
        durable: int = self.store.durable_lsn
        return durable if durable <= self._audit_lsn else self._audit_lsn

    def wait_durable(self, ch: Channel) -> None:
        self.confirm_waiters.add(ch)

    def confirm_ready(self, ch: Channel) -> None:
        """M14: ``ch`` has confirms with nothing to wait for. Inside a transport turn they
        are sent at end_batch(), coalesced as RabbitMQ coalesces them (one basic.ack
        multiple=true for a burst instead of one frame per message); outside one, now."""
        if self._batch_depth:
            self._confirms_ready.append(ch)
        else:
            ch.send_ready_confirms()
            ch.session.request_flush()

    def sync_now(self) -> int:
        """Sync on the calling thread and send the confirms it releases (tests, close)."""
        durable = self.messages.sync()
        self._on_durable(self.durable_lsn)
        return durable

    async def flush(self) -> int:
        """Everything persisted so far is durable when this returns (a management change
        answered only once it would survive a crash, SE4; MessageStorage.flush)."""
        durable = await self.messages.flush()
        self._on_durable(self.durable_lsn)
        return durable

    def audit_synced(self, lsn_mark: int) -> None:
        """A5: the audit records of every write up to ``lsn_mark`` are on disk too."""
        if self._audit_sync and lsn_mark > self._audit_lsn:
            self._audit_lsn = lsn_mark

    async def _flush_loop(self) -> None:
        # One executor thread syncs whatever piled up while the last sync ran: group commit.
        assert self._dirty is not None and self._loop is not None
        while not self._closed:
            if not self.read_only:
                await self._dirty.wait()
            self._dirty.clear()
            # A5: between two loop turns every message stored so far has had its records
            # emitted (publish and enqueue come before the store put, in one turn): the audit
            # writes and fsyncs up to this mark while the store syncs, and the confirms go no
            # further than this LSN, whichever finishes last.
            lsn_mark = self._last_lsn()
            audit_mark = self.audit.sync_mark() if self._audit_sync else 0
            try:
                await self._loop.run_in_executor(self._executor, self._sync_and_compact, audit_mark)
            except StoreFailedError as e:
                self._store_failed(e)
                # The batch is pending again in the store: retried until the disk takes it.
                await asyncio.sleep(STORE_RETRY_SECONDS)
                continue
            self.audit_synced(lsn_mark)
            if self.read_only:
                self._store_resumed()
            self._on_durable(self.durable_lsn)

    def _store_failed(self, e: StoreFailedError) -> None:
        """W5/M14: the disk refused a write. Confirms still waiting stay waiting (their
        messages are kept in memory and written by a later retry; see ``read_only``)."""
        if not self.read_only:
            log.error("%s; publishes of persistent messages are refused until the store can write again", e)
            self.read_only = True
            self.on_store_change(True)

    def _store_resumed(self) -> None:
        log.warning("store writes again: resource alarm for the store cleared")
        self.read_only = False
        self.on_store_change(False)

    def _sync(self, audit_mark: int = 0) -> int:
        """Sync the store; with ``audit_mark`` (``audit.sync_mark()``), wait for the audit
        records before it to be on disk as well (A5; the writer fsyncs meanwhile)."""
        durable = self.store.sync()
        if audit_mark:
            self.audit.wait_synced(audit_mark, AUDIT_SYNC_TIMEOUT)
        return durable

    def _sync_and_compact(self, audit_mark: int = 0) -> int:
        """The worker thread's turn: sync, then compact if the journal has grown enough
        (safe here: see semantics/store/store.py, "Compaction")."""
        durable = self._sync(audit_mark)
        try:
            self.store.maybe_compact()
        except OSError:
            log.warning("store compaction failed; retried after the next sync", exc_info=True)
        return durable

    def _fail_confirms(self) -> None:
        """The store failed at close: every confirm still waiting is a basic.nack (M14)."""
        for ch in list(self.confirm_waiters):
            ch.fail_pending_confirms()
        self.confirm_waiters.clear()

    def _log_recovery(self) -> None:
        r = self.store.recovery
        if self.data_dir is None:
            return
        log.info("store.recovery records=%d seconds=%.3f set_aside_bytes=%d aside=%s damaged=%d",
                 r.records, r.seconds, r.torn_bytes, r.aside_path, len(r.damaged))

    def _upgrade_store(self) -> None:
        """Keys written by an older layout are rewritten before anything reads them; a newer
        layout is refused (StoreFormatError) before anything is changed."""
        try:
            done = upgrade(self.store, P.FORMAT_VERSION, {0: P.rekey_v0})
        except BaseException:
            self.store.close()
            raise
        if done.found != done.version:
            log.info("store.upgrade key format %d -> %d: %d records rekeyed",
                     done.found, done.version, done.renamed)
            try:
                self.store.maybe_compact()  # the rekeyed records were written twice
            except OSError:
                log.warning("store compaction after the upgrade failed; retried after a sync", exc_info=True)

    def _on_durable(self, durable: int) -> None:
        refused = self.messages.refused(durable)
        if refused:
            # M14: a write the store refused after taking it is a basic.nack, in its place.
            for ch in self.confirm_waiters:
                if any(lsn in refused for _, lsn in ch.pending_confirms):
                    ch.pending_confirms = deque((seq, -1 if lsn in refused else lsn)
                                               for seq, lsn in ch.pending_confirms)
        for ch in list(self.confirm_waiters):
            if not ch.on_durable(durable):
                self.confirm_waiters.discard(ch)
        if self._to_disk:
            self._bodies_to_disk(durable)

    def body_stored(self, lsn: int, qmsg: Q.QueueMessage) -> None:
        """Record ``lsn`` holds the body of ``qmsg``, whose message is in no other queue: it
        lets go of the body once the record is durable (issue 15: retained persistent
        messages cost their index, not their bodies)."""
        self._to_disk.append((lsn, qmsg))

    def _bodies_to_disk(self, durable: int) -> None:
        pending = self._to_disk
        store = self.store
        waiting = (Q.ACTIVE, Q.DELAYED, Q.PARKED)
        while pending and pending[0][0] <= durable:
            qm = pending.popleft()[1]
            # A message already delivered is acked soon: reading its body back would be waste.
            if qm.state in waiting:
                qm.payload.to_disk(store)  # type: ignore[attr-defined]

    # -- time --------------------------------------------------------------------------------

    def run_due(self) -> None:
        """Run every queue tick and topic retry whose deadline has passed."""
        self.scheduler.run_due(self.clock.now())
        self._flush_sessions()

    def advance_time(self, seconds: float) -> None:
        """Tests: move a ManualClock forward and run everything that fell due."""
        self.clock.advance(seconds)  # type: ignore[attr-defined]
        self.run_due()

    def _flush_sessions(self) -> None:
        for s in list(self.sessions):
            s.request_flush()

    def reschedule_exchange(self, vh: VHost, ex: Exchange) -> None:
        if ex.on_tick is None:
            ex.on_tick = lambda e, now: self._topic_tick(vh, e, now)
        self.scheduler.reschedule(ex)

    def _topic_tick(self, vh: VHost, ex: Exchange, now: float) -> None:
        assert ex.topic is not None
        events = ex.topic.expire(now)
        topic = ex.topic

        def attempt(sub: Any, tmsg: Any) -> bool | None:
            from gateway.broker.vhost import PublishOutcome
            if sub.endpoint[0] not in ("q", "x"):
                return self.attempt_endpoint(topic, sub, tmsg)
            msg = tmsg.payload
            return vh._attempt(sub.endpoint, msg, msg.headers, now, PublishOutcome(), {ex.name}, ex.name,
                               sub_label(ex.name, sub.name))

        events.extend(ex.topic.deliver_due(now, attempt))
        self.topic_events(vh, ex, events)

    def topic_events(self, vh: VHost, ex: Exchange, events: Any) -> None:
        """A1: the topic's retries, give-ups and expiries in the audit log (D3-D6); the
        journal of retained persistent messages follows their delivery states."""
        emit = self.audit.emit
        touched: set[str] | None = None
        for e in events:
            if isinstance(e, T.RetryScheduled):
                emit("retry", vh.name, topic=ex.name, msg_id=e.msg_id, subscription=sub_label(ex.name, e.subscription),
                     attempt=e.attempt, next_at=e.next_at, policy=e.policy)
            elif isinstance(e, T.GaveUp):
                emit("discard", vh.name, topic=ex.name, msg_id=e.msg_id,
                     subscription=sub_label(ex.name, e.subscription), attempt=e.attempts, policy=e.policy,
                     reason="retries_exhausted")
            elif isinstance(e, T.Discarded) and e.reason == "expired":
                emit("discard", vh.name, topic=ex.name, msg_id=e.msg_id, reason="expired",
                     subscription=sub_label(ex.name, e.subscription) if e.subscription else None)
            if ex.durable and not isinstance(e, T.Routed):
                if touched is None:
                    touched = set()
                touched.add(e.msg_id)
        if touched:
            for msg_id in touched:
                self._rejournal_retained(vh, ex, msg_id)

    def attempt_endpoint(self, topic: Any, sub: Any, tmsg: Any) -> bool | None:
        """D7 for an endpoint of another kind (HTTP push): its hook, or a failure without one."""
        hook = self.endpoint_hooks.get(sub.endpoint[0])
        return hook(topic, sub, tmsg) if hook is not None else False

    # -- topic-retained messages (D2, M14) ---------------------------------------------------

    def journal_retained(self, vh: VHost, ex: Exchange, msg: Message) -> int:
        """A persistent message a durable topic keeps for retries is journaled, with the
        subscriptions still owed it, so that a confirmed message survives a restart (M14)."""
        if not (ex.durable and msg.persistent) or self.read_only:
            return 0  # read-only: refused (basic.nack), so never journalled later either
        return self._rejournal_retained(vh, ex, msg.msg_id, msg)

    def _rejournal_retained(self, vh: VHost, ex: Exchange, msg_id: str, msg: Message | None = None) -> int:
        assert ex.topic is not None
        key = P.retained_key(vh.name, ex.name, msg_id)
        owed = [name for name, st in ex.topic.state(msg_id).items()
                if st.status in (T.DeliveryStatus.PENDING, T.DeliveryStatus.RETRYING)]
        if not owed:
            self.unpersist(key, missing_ok=True)
            return 0
        if msg is None:
            if key not in self.store:
                return 0  # not journaled: transient, or not a durable topic
            r = P.decode_retained(self.store.get(key) or b"")
            if r["owed"] == owed:
                return 0
            return self.persist(key, P.encode_retained(vh.name, ex.name, msg_id, r["published_at"], owed,
                                                       r["routing_key"], r["tags"], r["properties"],
                                                       r["body"]))
        return self.persist(key, P.encode_retained(vh.name, ex.name, msg_id, msg.published_at, owed,
                                                   msg.routing_key, list(msg.tags), msg.properties.raw,
                                                   msg.body))

    # -- queues ------------------------------------------------------------------------------

    def after_queue_change(self, vh: VHost, q: BrokerQueue, dispatch: bool = True) -> None:
        # Its common case in a transport's read (a queue with consumers and nothing else to
        # do: marked for end_batch) is inlined in ack and EmbeddedMessages.enqueue; a change
        # here is a change there.
        if q.on_tick is None:
            q.on_tick = lambda qq, now: self._queue_tick(vh, qq, now)
        if q.waiters is not None:
            self._serve_waiters(q, self.clock.now())  # Q5: long polls first, in arrival order
        if q.cmq.outbox:
            self._queue_events(vh, q, q.cmq.drain_events())
        if dispatch and q.consumers and not q.deleted:
            if self._batch_depth:
                self._to_dispatch[q] = None  # dispatched (and so rescheduled) by end_batch()
            else:
                self.dispatch(q)  # reschedules q when it is done
        else:
            self.scheduler.reschedule(q)

    def write_backlog(self) -> int:
        """Transport flow control: the message store's backlog (MessageStorage.backlog)."""
        return self.messages.backlog()

    def begin_batch(self) -> None:
        """The transport hands over the events of one read between begin_batch() and
        end_batch(): the dispatches they cause are coalesced into one per queue, so one pass
        delivers everything the batch published or freed credit for, instead of a dispatch
        per publish and per ack (measured: -38% gateway CPU per message, docs/BENCHMARKS.md).
        Sessions driven without a transport (tests) dispatch at once, as before."""
        self._batch_depth += 1

    def end_batch(self) -> None:
        self._batch_depth -= 1
        if self._batch_depth:
            return
        if self._confirms_ready:
            ready, self._confirms_ready = self._confirms_ready, []
            for ch in ready:
                ch.send_ready_confirms()
        if self._replays:
            self._run_replays()  # its own end_batch() dispatches what is pending
            return
        if self._to_dispatch:
            pending, self._to_dispatch = self._to_dispatch, {}
            for q in pending:
                if q.consumers and not q.deleted:
                    self.dispatch(q)
                elif not q.deleted:
                    self.scheduler.reschedule(q)
        # What this read made leaves together now (MessageStorage.batch_end).
        self.messages.batch_end()

    def _queue_tick(self, vh: VHost, q: BrokerQueue, now: float) -> None:
        if q.waiters is not None and not self._batch_depth:
            # Q5: the long polls this tick answers replay their held events at end_batch().
            self.begin_batch()
            try:
                self._queue_tick(vh, q, now)
            finally:
                self.end_batch()
            return
        expiry = q.expires_at()
        if expiry is not None and now >= expiry:
            vh.expire_queue(q)  # x-expires: unused for that long
            return
        self._queue_events(vh, q, q.cmq.tick(now))
        if q.waiters is not None:
            self._serve_waiters(q, now)  # Q5: what turned Active, and the waits that ended
            if q.cmq.outbox:
                self._queue_events(vh, q, q.cmq.drain_events())
        if q.consumers:
            self.dispatch(q)

    def touch_queue(self, q: BrokerQueue) -> None:
        """The queue was used (declare, basic.get, its last consumer left): x-expires restarts."""
        q.last_used = self.clock.now()
        if q.qargs.expires_ms is not None:
            self.scheduler.reschedule(q)

    def _queue_events(self, vh: VHost, q: BrokerQueue, events: list[Q.QueueEvent]) -> None:
        events = self.messages.timed(vh, q, events)
        emit = self.audit.emit
        for e in events:
            m = e.message
            if isinstance(e, Q.VisibilityExpired):
                emit("visibility_expire", vh.name, queue=q.name, msg_id=m.msg_id, attempt=m.receive_count)
            elif isinstance(e, Q.DeadLettered):
                # Q8: CMQ's dead-letter queue takes it (maxReceiveCount / maxTimeToLive).
                self.messages.settle(q, m)
                emit("dead_letter", vh.name, queue=q.name, msg_id=m.msg_id, reason=e.reason,
                     subscription=e.to_queue, size=m.size)
                target = vh.queues.get(e.to_queue)
                if target is not None:
                    msg: Message = m.payload  # type: ignore[assignment]
                    with contextlib.suppress(Exception):
                        vh.publish("", target.name, msg.properties, msg.body)
            elif isinstance(e, Q.Expired | Q.MaxLengthDropped):
                self.messages.settle(q, m, body_needed=q.qargs.dead_letter_exchange is not None)
                maxlen = isinstance(e, Q.MaxLengthDropped)
                if not self._dead_letter_exchange(vh, q, m, "maxlen" if maxlen else "expired"):
                    emit("discard", vh.name, queue=q.name, msg_id=m.msg_id, size=m.size,
                         reason="max_length" if maxlen else "expired")
            elif isinstance(e, Q.RewindableRemoved):
                self.messages.settle(q, m, body_needed=False)

    def unpersist_message(self, q: BrokerQueue, m: Q.QueueMessage, body_needed: bool = True) -> None:
        """``m`` left ``q`` for good: MessageStorage.settle (kept for the CMQ API's callers)."""
        self.messages.settle(q, m, body_needed)

    def _dead_letter_exchange(self, vh: VHost, q: BrokerQueue, m: Q.QueueMessage, reason: str) -> bool:
        """M13: x-dead-letter-exchange takes rejected, expired and dropped messages, with the
        x-death history RabbitMQ adds (reason rejected, expired, maxlen, delivery_limit)."""
        return self.dead_letter(vh, q, m.payload, m.msg_id, m.size, reason)  # type: ignore[arg-type]

    def dead_letter(self, vh: VHost, q: BrokerQueue, msg: Message, msg_id: str, size: int, reason: str) -> bool:
        """Publish ``msg`` to the queue's x-dead-letter-exchange; False when it has none."""
        dlx = q.qargs.dead_letter_exchange
        if dlx is None:
            return False
        key = q.qargs.dead_letter_routing_key or msg.routing_key
        self.audit.emit("dead_letter", vh.name, queue=q.name, msg_id=msg_id, topic=dlx, routing_key=key,
                        reason=reason, size=size)
        props = dead_letter_properties(msg.properties, reason=reason, queue=q.name, exchange=msg.exchange,
                                       routing_keys=[msg.routing_key], now=self.clock.now())
        with contextlib.suppress(Exception):  # a missing DLX drops the message, as RabbitMQ
            vh.publish(dlx, key, props, msg.body, cycle=cycling_queues(props))
        return True

    def forget_queue(self, vh: VHost, q: BrokerQueue) -> None:
        self.scheduler.forget(q)
        self.owed.pop(q, None)
        if q.waiters is not None:
            # Q5: the queue is gone while gets wait on it: each is answered get-empty (the
            # next basic.get on it gets RabbitMQ's 404 NOT_FOUND).
            waiters, q.waiters = q.waiters, None
            for ch in waiters.expire(math.inf):
                self._get_answered(ch, q, None)  # type: ignore[arg-type]
        # Its record: a durable queue's; on a shared store any queue's (VHost.declare_queue).
        self.unpersist(P.queue_key(vh.name, q.name), missing_ok=True)
        self.messages.drop(vh, q)

    # -- delivery (M11-M13) ------------------------------------------------------------------

    def dispatch(self, q: BrokerQueue) -> None:
        """Round-robin Active messages to consumers with credit (M11, W4); the store brings
        in more for the credit left (MessageStorage.want; the embedded store's does nothing)."""
        if not self._local_messages:
            self.messages.want(q)
        if not q.consumers or q.deleted:
            return
        now = self.clock.now()
        touched: set[Session] = set()
        limit = q.qargs.delivery_limit  # read once: this loop is the delivery hot path
        consumers = q.consumers
        if len(consumers) == 1 and limit is None and not q.qargs.single_active_consumer:
            self._dispatch_one(q, consumers[0], now)
            return
        while True:
            consumer = q.next_consumer()
            if consumer is None:
                self.owed[q] = None
                break
            receipt = q.receive(now) if limit is None else self._receive_limited(q, now, limit)
            if receipt is None:
                # Nothing for it after all: it keeps its turn. Else every dispatch without a
                # message (after an ack, say) moves the turn on, and with as many of those
                # as consumers per message one consumer would get every message.
                q.keep_turn()
                self.owed.pop(q, None)
                break
            consumer.channel.deliver(consumer, q, receipt)
            touched.add(consumer.channel.session)
        vh = self.vhosts[q.vhost]
        if q.cmq.outbox:
            self._queue_events(vh, q, q.cmq.drain_events())
        self.scheduler.reschedule(q)
        if touched:
            self.dispatches_out += 1
        for s in touched:
            s.request_flush()

    def _dispatch_one(self, q: BrokerQueue, c: Consumer, now: float) -> None:
        """dispatch for a queue's only consumer (every queue of scenarios 1-5): the steps of
        next_consumer and Consumer.has_credit inlined, without their two frames a delivery,
        and the round-robin position left as they leave it (1 after a turn that ended for
        want of credit, 0 after one that ended for want of a message: keep_turn)."""
        ch = c.channel
        session = ch.session
        # The loop (gateway.broker.channel.deliver_run, compiled where it can be): bit 0 says
        # a message went out, bit 1 that the turn ended for want of credit.
        ended = deliver_run(ch, c, q, now)
        q._rr = ended >> 1
        if ended & 2:
            self.owed[q] = None
        elif self.owed:
            self.owed.pop(q, None)
        cmq = q.cmq
        if cmq.outbox:
            self._queue_events(self.vhosts[q.vhost], q, cmq.drain_events())
        if q.waiters is None:
            # The queue's next wakeup is its model's (no long poll waits; x-expires counts
            # only without consumers), of which _next_due is a lower bound.
            self.scheduler.reschedule_after(q, cmq._next_due)
        else:
            self.scheduler.reschedule(q)
        if ended & 1:
            self.dispatches_out += 1
            session.request_flush()

    def receive(self, q: BrokerQueue, now: float) -> Q.Receipt | None:
        """One CMQ receive from ``q`` (M11), honouring its x-delivery-limit: what every
        consumer, basic.get and CMQ API ReceiveMessage takes a message through."""
        limit = q.qargs.delivery_limit
        return q.receive(now) if limit is None else self._receive_limited(q, now, limit)

    def _receive_limited(self, q: BrokerQueue, now: float, limit: int) -> Q.Receipt | None:
        """x-delivery-limit without a CMQ dead-letter queue (M7): a message past ``limit``
        receives is dead-lettered (x-dead-letter-exchange) or dropped instead."""
        while (receipt := q.receive(now)) is not None:
            m = receipt.message
            if m.receive_count <= limit:
                return receipt
            q.cmq.delete(receipt, now)
            self.messages.settle(q, m, body_needed=q.qargs.dead_letter_exchange is not None)
            if not self._dead_letter_exchange(self.vhosts[q.vhost], q, m, "delivery_limit"):
                self.audit.emit("discard", q.vhost, queue=q.name, msg_id=m.msg_id, size=m.size,
                                reason="rejected")
        return None

    def dispatch_channel(self, ch: Channel) -> None:
        for q in {c.queue for c in ch.consumers.values()}:
            self.dispatch(q)

    def get(self, ch: Channel, q: BrokerQueue, no_ack: bool) -> None:
        """basic.get: CMQ ReceiveMessage. With x-cmq-polling-wait-seconds > 0 and nothing
        Active it long-polls (Q5): the channel waits on the queue's Waiters, behind the gets
        already waiting, and its later events are held until the answer."""
        from pamqp import commands as C
        now = self.clock.now()
        q.last_used = now
        store_wait = self.messages.getting(q, now)  # > 0: the store may bring one (MessageStorage)
        if ch.draining:  # closing (Q5 end_wait): nothing more is handed to this channel
            ch.session.conn.send_method(ch.number, C.Basic.GetEmpty())
            return
        wait = q.cmq.attributes.polling_wait_seconds
        receipt = None
        if not (wait > 0 and q.waiters) and not store_wait:  # earlier long polls go first
            receipt = self.receive(q, now)
        waiting = receipt is None and (wait > 0 or store_wait > 0)
        if receipt is not None:
            self._answer_get(ch, q, receipt, no_ack)
        elif waiting:
            if q.waiters is None:
                q.waiters = Waiters()
            q.waiters.add(ch, now + (wait if wait > 0 else store_wait))
            ch.waiting_get = (q, no_ack)
            ch.held = []
        else:
            ch.session.conn.send_method(ch.number, C.Basic.GetEmpty())
        self.after_queue_change(self.vhosts[q.vhost], q, dispatch=False)
        if waiting and store_wait:
            self.messages.get_waits(q, ch, plain=wait <= 0)

    def _answer_get(self, ch: Channel, q: BrokerQueue, receipt: Q.Receipt, no_ack: bool) -> None:
        """basic.get-ok (M11); no_ack: the message is deleted at once."""
        ch.deliver(None, q, receipt, get_count=q.message_count, no_ack=no_ack)  # no_ack: settled there

    # -- long polling (Q5) -------------------------------------------------------------------

    def _serve_waiters(self, q: BrokerQueue, now: float) -> None:
        """The waits that ended get get-empty; then Active messages go to the earliest
        waiting gets (semantics.waiters)."""
        waiters = q.waiters
        assert waiters is not None
        limit = q.qargs.delivery_limit
        receive = None if limit is None else (lambda t: self._receive_limited(q, t, limit))
        expired, served = waiters.tick(q.cmq, now, receive)
        for ch in expired:
            self._get_answered(ch, q, None)  # type: ignore[arg-type]
        for ch, receipt in served:
            self._get_answered(ch, q, receipt)  # type: ignore[arg-type]
        if not waiters and q.waiters is waiters:
            q.waiters = None

    def _get_answered(self, ch: Channel, q: BrokerQueue, receipt: Q.Receipt | None) -> None:
        """A long poll ends: get-ok or get-empty; the channel's held events replay soon."""
        from pamqp import commands as C
        waiting, ch.waiting_get = ch.waiting_get, None
        if receipt is None:
            ch.session.conn.send_method(ch.number, C.Basic.GetEmpty())
        else:
            self._answer_get(ch, q, receipt, waiting[1] if waiting is not None else False)
        ch.session.request_flush()
        self._replays.append(ch)
        if self._batch_depth:
            return  # end_batch() replays
        if self._loop is None:
            self._run_replays()
        elif not self._replay_soon:
            # Not inside another connection's input (a timer, the management API): the held
            # events run on the next loop turn, never nested in whatever called us.
            self._replay_soon = True
            self._loop.call_soon(self._replays_due)

    def _replays_due(self) -> None:
        self._replay_soon = False
        if self._replays and not self._batch_depth:
            self._run_replays()

    def _run_replays(self) -> None:
        self.begin_batch()
        try:
            while self._replays:
                ch = self._replays.popleft()
                ch.session.replay_held(ch)
        finally:
            self.end_batch()

    def cancel_get(self, ch: Channel) -> None:
        """Q5: the channel closes while its get waits: the waiter goes, having taken nothing."""
        waiting, ch.waiting_get = ch.waiting_get, None
        if waiting is None:
            return
        q = waiting[0]
        waiters = q.waiters
        if waiters is not None:
            waiters.cancel(ch)
            if not waiters:
                q.waiters = None

    def settle_deleted(self, q: BrokerQueue, receipt: Q.Receipt) -> None:
        """A no-ack delivery: deleted at once."""
        if q.cmq.delete(receipt, self.clock.now()):
            self.messages.settle(q, receipt.message, body_needed=False)

    def drop_received(self, q: BrokerQueue, receipt: Q.Receipt, user: str | None = None) -> None:
        """A received message rejected without requeue outside a channel (the management
        API's get): deleted, then dead-lettered or discarded (M13)."""
        m = q.cmq.drop(receipt, self.clock.now())
        if m is None:
            return
        self.messages.settle(q, m, body_needed=q.qargs.dead_letter_exchange is not None)
        if not self._dead_letter_exchange(self.vhosts[q.vhost], q, m, "rejected"):
            self.audit.emit("discard", q.vhost, queue=q.name, msg_id=m.msg_id, size=m.size, reason="rejected",
                            user=user)

    def ack(self, session: Session, u: Unacked) -> None:
        """M12: CMQ DeleteMessage with this delivery's receipt handle; stale: nothing (Q3)."""
        q = u.queue
        if q.deleted:
            return
        clock_now = self.clock_now
        now = clock_now()
        handle = u.handle
        if q.cmq.delete(handle, now):
            m = handle.message
            if q.durable or self.messages.settles_transient:
                self.messages.settle(q, m, body_needed=False)  # durable or not (issue 28)
            msg = m.payload
            latency = ack_latency(now, msg.published_at) if isinstance(msg, Message) else None
            if session.protocol is None:
                emit_values = self.emit_values  # an instance attribute: called through a local, specialized
                emit_values(ACK, session.vhost_name, session.user, session.peer, q.name, u.msg_id, latency)
            else:  # MQ7
                self.emit_row(ACK_MQTT, session.vhost_name,
                              (session.user, session.peer, q.name, u.msg_id, latency, session.protocol))
        else:
            session.emit("stale_ack", queue=q.name, msg_id=u.msg_id)
        cmq = q.cmq
        if self._batch_depth and q.consumers and q.on_tick is not None and q.waiters is None \
                and not cmq.outbox:
            # after_queue_change's case in a read's acks, without its frame. The credit this
            # ack freed can take nothing when nothing is Active and no timer is due (delete
            # ran the due ones) in a queue the store holds whole: no dispatch then (its
            # receive would find nothing, ~10 calls an ack for a consumer keeping up, 0.31
            # dispatches a delivery in scenario 3). Its reschedule is not needed either: an
            # ack only removes timers, and the scheduler keeps the earlier deadline anyway.
            if cmq._n_active or cmq._next_due <= now or not self._local_messages:
                self._to_dispatch[q] = None
        else:
            self.after_queue_change(self.vhosts[q.vhost], q)

    def reject(self, session: Session, u: Unacked, requeue: bool) -> None:
        """M13: requeue: Active at once; otherwise deleted or dead-lettered."""
        q = u.queue
        if q.deleted:
            return
        now = self.clock.now()
        vh = self.vhosts[q.vhost]
        if requeue:
            if self.messages.release(q, u.handle, now):
                session.emit("requeue", queue=q.name, msg_id=u.msg_id)
        else:
            m = q.cmq.drop(u.handle, now)
            if m is not None:
                self.messages.settle(q, m, body_needed=q.qargs.dead_letter_exchange is not None)
                session.emit("nack", queue=q.name, msg_id=u.msg_id, reason="rejected")
                if not self._dead_letter_exchange(vh, q, m, "rejected"):
                    session.emit("discard", queue=q.name, msg_id=u.msg_id, size=m.size, reason="rejected")
        self.after_queue_change(vh, q)

    def answer_count(self, ch: Channel, q: BrokerQueue | None, count: int, frame: Callable[[int], Any]) -> None:
        """queue.declare-ok / delete-ok / purge-ok with the queue's message count: at once,
        or once the store counted (MessageStorage.message_count), the channel's later frames
        held until then."""
        later = None if q is None else self.messages.message_count(q, count)
        if later is None:
            ch.session.conn.send_method(ch.number, frame(count))
            return
        ch.held = []
        self.spawn(self._answer_count(ch, later, frame))

    async def _answer_count(self, ch: Channel, later: Any, frame: Callable[[int], Any]) -> None:
        count = await later
        session = ch.session
        if session.channels.get(ch.number) is ch and not ch.closing:
            session.conn.send_method(ch.number, frame(count))
            session.replay_held(ch)

    def consumer_gone(self, q: BrokerQueue) -> None:
        self.vhosts[q.vhost].consumer_gone(q)
        if not q.deleted:
            self.messages.readers_left(q)

    # -- recovery ----------------------------------------------------------------------------

    def _recover(self) -> None:
        """Durable exchanges, queues, bindings and persistent messages come back (restart).

        The cyclic garbage collector is off meanwhile: recovery allocates several objects per
        message and frees none, so each collection only walked the growing backlog again
        (3x10^5 messages: 5.0 -> 3.0 s). It runs again, as before, once they are all back."""
        strict, self.strict_names = self.strict_names, False  # L2 is checked when declared, not now
        # PF1: so are the profile's limits. What the store gives back was accepted when it was
        # declared or published, maybe under the other profile: it comes back under
        # compatible's (a breach of a CMQ limit is reported, never dropped), and each vhost
        # takes its own profile once everything is back.
        self._recovering = True
        for vh in self.vhosts.values():
            vh.set_profile(COMPATIBLE)
        collecting = gc.isenabled()
        gc.disable()
        # A6: what a start restores is no client action: its records say origin "recovery".
        emit_fields = self.emit_fields

        def recovered(event: str, vhost: str, fields: dict[str, Any]) -> None:
            if "origin" not in fields:
                fields["origin"] = "recovery"
            emit_fields(event, vhost, fields)

        self.emit_fields = recovered
        try:
            self._recover_limit_report()
            self._recover_accounts()
            try:
                self._recover_declarations()
            finally:
                self.strict_names = strict
            now = self.clock.now()
            self._recover_messages(now)
            self._recover_http_subscriptions()
            self._recover_retained(now)
        finally:
            self.emit_fields = emit_fields
            if collecting:
                gc.enable()
            self._recovering = False
            for name, vh in self.vhosts.items():
                vh.set_profile(self.profile_of(name))

    def _recover_accounts(self) -> None:
        """SE4: users, vhosts and permissions changed over the management API."""
        users = getattr(self.config, "users", None)
        if users is not None:
            from gateway.accounts import Accounts
            Accounts(users, self).recover()

    def _recover_http_subscriptions(self) -> None:
        """D7: persisted HTTP subscriptions come back before the topic-retained messages, so
        that a message still owed only to an HTTP endpoint is retained and pushed again."""
        if next(self.store.items(P.SUBSCRIPTIONS_PREFIX), None) is None:
            return
        from gateway.push import HttpPusher
        HttpPusher.of(self).recover()

    def _recover_declarations(self) -> None:
        from gateway.broker.policies import Policy

        store = self.store
        for _, raw in store.items(P.POLICIES_PREFIX):
            policy = Policy.from_json(P.decode_json(raw))
            self.vhost(policy.vhost).policies[policy.name] = policy  # before the queues they shape
        for _, raw in store.items(P.EXCHANGES_PREFIX):
            r = P.decode_json(raw)
            vh = self.vhost(r["vhost"])
            if r["name"] not in vh.exchanges:
                vh.exchanges[r["name"]] = _exchange(vh, r)
                self._recover_names(vh, "topic", (r["name"],))
        for _, raw in store.items(P.QUEUES_PREFIX):
            r = P.decode_json(raw)
            vh = self.vhost(r["vhost"])
            # As a server-named queue: checked when it was declared, and an amq.* name (an
            # MQTT session's, MQ8) is only ever given by the server.
            vh.declare_queue(None, "", server_name=r["name"], passive=False, durable=True, exclusive=False,
                             auto_delete=r["auto_delete"], arguments=r["arguments"])
            self._recover_names(vh, "queue", (r["name"],))
        for _, raw in store.items(P.BINDINGS_PREFIX):
            r = P.decode_json(raw)
            vh = self.vhost(r["vhost"])
            with contextlib.suppress(Exception):
                vh.bind(None, r["source"], (r["kind"], r["dest"]), r["key"], r["arguments"])
        for vh in self.vhosts.values():
            if vh.policies:
                vh.apply_policies()

    def _recover_messages(self, now: float) -> None:
        """Persistent messages come back with their bodies left in the store, each queue's
        as one compact run (gateway.broker.recovery; issue 15)."""
        recover_messages(self, now)

    def _recover_retained(self, now: float, keys: list[str] | None = None) -> None:
        """Messages a durable topic retained for retries (D2) are offered again to the
        subscriptions still owed them; the others already have them. Retry counts start
        over; the lifecycle (D3) still counts from the original publish. ``keys``: only
        these records (the cluster broker takes over those of a gateway that died)."""
        from gateway.broker.vhost import PublishOutcome
        from gateway.protocol.properties import Properties

        found = (self.store.items(P.RETAINED_PREFIX) if keys is None
                 else ((key, raw) for key in keys if (raw := self.store.get(key)) is not None))
        records = [(key, P.decode_retained(raw)) for key, raw in found]
        records.sort(key=lambda kr: kr[1]["published_at"])
        for key, r in records:
            vh = self.vhosts.get(r["vhost"])
            ex = vh.exchanges.get(r["exchange"]) if vh is not None else None
            if vh is None or ex is None or ex.topic is None or now >= r["published_at"] + TOPIC_LIFECYCLE_SECONDS:
                self.unpersist(key)
                continue
            msg = Message(r["body"], Properties(r["properties"]), ex.name, r["routing_key"], r["published_at"],
                          tuple(r["tags"]), r["msg_id"])
            owed = set(r["owed"])
            ex_name = ex.name
            vhost = vh

            def attempt(sub: Any, tmsg: Any, owed: set[str] = owed, msg: Message = msg,
                        vhost: VHost = vhost, ex_name: str = ex_name, topic: Any = ex.topic) -> bool | None:
                if sub.name not in owed:
                    return True  # it had this message before the restart
                if sub.endpoint[0] not in ("q", "x"):
                    return self.attempt_endpoint(topic, sub, tmsg)
                return vhost._attempt(sub.endpoint, msg, msg.headers, now, PublishOutcome(), {ex_name},
                                      ex_name, sub_label(ex_name, sub.name))

            result = ex.topic.publish(T.TopicMessage(msg.msg_id, msg.published_at, msg.tags, msg.routing_key,
                                                     msg, len(msg.body)), now, attempt)
            if result.retained:
                self._rejournal_retained(vh, ex, msg.msg_id, msg)
                self.reschedule_exchange(vh, ex)
            else:
                self.unpersist(key)

    async def close(self) -> None:
        """Flush the store, stop the timers and the flusher."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        self.scheduler.close()
        if self.http_pusher is not None:
            await self.http_pusher.close()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._flusher
        synced = True
        if not self.read_only:
            self._keep_limit_counts()  # A6: the report as it stands, for the next start
        try:
            self.sync_now()
        except StoreFailedError as e:
            # Stopping on a disk that still refuses writes: what was never confirmed is lost,
            # and the confirms still waiting say so (no later attempt may store them).
            log.error("%s; stopping with unconfirmed changes not written", e)
            synced = False
            self._fail_confirms()
        if synced and not self.read_only:
            # The queues' cold runs for the next start, next to the store's checkpoint.
            recovery_cache.save(self)
        with contextlib.suppress(StoreFailedError):
            self.store.close(sync=synced)
        self._executor.shutdown(wait=True)


def _exchange(vh: VHost, r: dict[str, Any]) -> Exchange:
    from gateway.broker.exchange import Exchange
    return Exchange(vh.name, r["name"], r["type"], durable=True, auto_delete=r["auto_delete"],
                    internal=r["internal"], arguments=r["arguments"], limits=vh.profile.enforced)


def compiled_ack() -> Callable[[Broker], Any] | None:
    """bind_ack (gateway/broker/_queue.c: Broker.ack compiled, bound to a broker), or None under
    CMQ_GATEWAY_PURE_PYTHON=1 or where the package was built without a compiler
    (gateway.broker.queue.COMPILED)."""
    from gateway.broker import queue as broker_queue

    if broker_queue.COMPILED is None:
        return None
    from gateway.broker import _queue  # type: ignore[attr-defined]

    _queue.configure_ack(Broker.ack, ACK, ACK_MQTT, Message, ack_latency, round)
    return _queue.bind_ack  # type: ignore[no-any-return]


bind_ack = compiled_ack()
