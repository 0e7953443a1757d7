"""One CMQ queue as pure state (SPEC Q1-Q8, L6-L8; RabbitMQ TTL and max-length, M7/M13).

Theory of operation
-------------------
A message is in exactly one state (``MessageState``)::

    send ──> ACTIVE <──────────── visibility timeout (Q1) / release (M13)
      │        │ receive (Q1)          ▲
      │        └──────> INACTIVE ──────┘
      │                   │ delete with the latest handle (Q3)
      │                   ▼
      │               DELETED (rewindable, Q6) ──> rewind() makes it ACTIVE again
      │
      └─ delay > 0 ─> DELAYED (in flight, Q4) ──> ACTIVE when the delay ends
           └─ over 20,000 in flight (L8) ─> PARKED ──> DELAYED/ACTIVE when the count drops

and REMOVED once it left the queue (deleted without rewind, expired, dead-lettered, dropped,
purged). Time never runs by itself: every operation takes ``now`` and first applies every
timed change due by then, so the model is right whenever the gateway calls ``tick``; the
gateway calls ``tick(now)`` at ``next_wakeup()`` to learn about the changes (events).

Data structures (all operations O(1) amortized, O(log n) where a heap is involved):

* ``_active``: a deque of ACTIVE messages in order of their position ``pos``; ``_returned``:
  a heap of ``(pos, message)`` for messages that came back (visibility timeout, release) so
  that they are received again at their original position, as RabbitMQ requeues. A receive
  takes the lower position of the two heads.
* Timers (visibility ends, delay ends, each message's deadline: retention, dead-letter time
  to live, TTL) run in three lanes. Visibility ends and deadlines are mostly pushed in time
  order (now + a queue-wide constant), so they go to plain FIFOs, ``_vis`` and ``_dl``, in
  O(1) whatever the backlog; an entry that would break a FIFO's order (a per-receive
  visibility, a restored message, a changed attribute) and every delay end goes to the heap
  ``_heap`` instead. ``_next_due`` is a lower bound of all three heads: the hot path
  compares ``now`` with it once.
* Entries whose message moved on are not searched for: they are skipped when they surface
  (lazy deletion), and the structure is rebuilt once stale entries outnumber live ones, so
  memory stays proportional to the messages held.
* ``_messages``: msg_id -> message for everything retained or rewindable.

Events (visibility expiry, expiry, dead-letter moves, max-length drops, ...) are appended to
an outbox, returned by ``tick`` and ``drain_events``; the gateway audits them and moves
dead-lettered messages to the named queue.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from semantics import limits
from semantics.errors import CMQError
from semantics.message_ids import MSG_ID_PREFIX, new_msg_id, process_prefix
from semantics.queue_attrs import QueueAttributes
from semantics.queue_cold import ColdRun, Freezer, LiveRun
from semantics.send_rules import (
    MaxLengthRejected,
    check_heap,
    check_room,
    check_size,
    send_delay,
    send_expiry,
)

__all__ = [
    "CmqQueue",
    "DeadLettered",
    "DelayEnded",
    "Expired",
    "MaxLengthDropped",
    "MaxLengthRejected",
    "MessageState",
    "QueueEvent",
    "QueueMessage",
    "Receipt",
    "RewindableRemoved",
    "VisibilityExpired",
]


class MessageState(IntEnum):
    DELAYED = 0  # Q4: invisible until its delay ends; holds one of the 20,000 in-flight slots
    PARKED = 1  # L8: delayed past the in-flight cap; invisible until the count drops
    ACTIVE = 2  # Q1: may be received
    INACTIVE = 3  # Q1: received, invisible until the visibility timeout
    DELETED = 4  # Q6: deleted but kept as rewindable until its retention ends
    REMOVED = 5  # gone from the queue


# Module-level aliases: identity tests against globals are the cheapest on the hot path.
DELAYED = MessageState.DELAYED
PARKED = MessageState.PARKED
ACTIVE = MessageState.ACTIVE
INACTIVE = MessageState.INACTIVE
DELETED = MessageState.DELETED
REMOVED = MessageState.REMOVED

# Timer kinds.
_VISIBLE = 0
_DELAY_END = 1
_DEADLINE = 2

_MIN_COMPACT = 1024
_INF = float("inf")
_OWN_IDS = MSG_ID_PREFIX + process_prefix()
_OWN_ID_LEN = len(_OWN_IDS) + 16  # new_msg_id's counter: 16 hex digits

# Folding (semantics.queue_cold.LiveRun): once a queue holds more than FOLD_KEEP +
# FOLD_TAIL + FOLD_BATCH Active messages in its hot order, the ones after the first
# FOLD_KEEP and before the newest FOLD_TAIL are folded. Shorter queues never pay for it.
FOLD_KEEP = 1024
FOLD_TAIL = 1024
FOLD_BATCH = 1024
# A fold leaves hot the messages its freezer refused for now (the gateway's: a body not yet
# on disk, the last group commits' publishes); FOLD_RETRY seconds later a timer folds again
# what it takes by then, and again after twice as long each time a fold takes fewer than it
# refuses, until the wait passes FOLD_RETRY_MAX (messages it never takes, transient ones in
# a durable queue, are scanned a handful of times, not forever). Without it the last fold's refusals
# and the sends after it stayed objects until the next send: ~14,000 messages, 9 MB, at the
# end of a publisher's run (issue 31).
FOLD_RETRY = 0.25
FOLD_RETRY_MAX = 8.0


class QueueMessage:
    """One message of a queue, with the receive metadata of Q7.

    ``payload`` is opaque: the gateway keeps the body and the AMQP properties there.
    Fields other than the documented ones are the queue's bookkeeping.
    """

    __slots__ = ("msg_id", "payload", "size", "enqueue_time", "first_receive_time", "next_visible_time",
                 "receive_count", "state", "expires_at", "handle", "pos", "seq", "deadline")

    def __init__(self, msg_id: str, payload: object, size: int, enqueue_time: float, seq: int,
                 expires_at: float | None) -> None:
        self.msg_id = msg_id
        self.payload = payload
        self.size = size
        self.enqueue_time = enqueue_time
        self.first_receive_time: float | None = None
        self.next_visible_time = enqueue_time
        self.receive_count = 0
        self.state = ACTIVE
        self.expires_at = expires_at  # RabbitMQ TTL (per message or per queue), absolute
        self.handle = 0  # the latest receipt handle; 0 once no handle may act on it
        self.pos = 0  # order among ACTIVE messages
        self.seq = seq  # production order, for rewind (Q6)
        self.deadline = 0.0  # the time of its live _DEADLINE timer

    def __lt__(self, other: object) -> bool:
        # Two heap entries with the same time, seq and kind may name two objects of one
        # message (a stale entry of one folded, and the one thawed since): neither first.
        return False

    def __repr__(self) -> str:
        return (f"QueueMessage({self.msg_id!r}, state={self.state.name}, size={self.size}, "
                f"receive_count={self.receive_count})")


# A message's hot-path construction (send, restore_plain): object.__new__ and the class's
# __init__ called directly (~0.3k instructions fewer a message than calling the class).
_new_object: Any = object.__new__  # or use_makers' object_new
_init_message = QueueMessage.__init__


class Receipt(NamedTuple):
    """What a receive returns (Q3): the message and this receive's handle."""

    message: QueueMessage
    handle: int


# Timer entries: (when, kind, message, token) in the FIFO lanes; the heap adds the message's
# seq after the time: at the same time, production order. token is the receipt handle for
# _VISIBLE.
_Entry = tuple[float, int, QueueMessage, int]
_HeapEntry = tuple[float, int, int, QueueMessage, int]

_new_receipt: Any = tuple.__new__  # (or use_makers' tuple_new) skips NamedTuple's Python-level __new__ on the hot path


# What QueueMessage.__init__ sets, in its order: a message made by use_makers' slots_new is
# given these, with __init__'s values (send, restore_plain).
_MESSAGE_SLOTS = ("msg_id", "payload", "size", "enqueue_time", "first_receive_time", "next_visible_time",
                  "receive_count", "state", "expires_at", "handle", "pos", "seq", "deadline")
_slots_new: Any = None  # or use_makers' slots_new


def use_makers(object_new: Callable[[type], object], tuple_new: Callable[[type, Any], tuple[Any, ...]],
               slots_new: Callable[..., object] | None = None) -> None:
    """Make QueueMessages and Receipts with ``object_new(cls)`` and ``tuple_new(cls, items)``
    from now on: equivalents of ``object.__new__`` and ``tuple.__new__`` that the caller holds
    to the same results (the gateway's compiled ones, gateway.protocol.fastpath: ~0.5k
    instructions fewer each, one of each a delivery). ``slots_new(cls, names, *values)``, if
    given: ``object_new(cls)`` with each name set to its value, in order; QueueMessages are
    then made by it with what their ``__init__`` would set (no __init__ frame). This package
    stays pure Python."""
    global _new_object, _new_receipt, _slots_new
    _new_object = object_new
    _new_receipt = tuple_new
    _slots_new = slots_new


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """A timed or secondary change of the queue, for the audit log (A1)."""

    message: QueueMessage


@dataclass(frozen=True, slots=True)
class VisibilityExpired(QueueEvent):
    """Q1: not deleted within the visibility timeout; Active again (unless moved on)."""


@dataclass(frozen=True, slots=True)
class DelayEnded(QueueEvent):
    """Q4: the delay ended; the message is Active (unless moved on)."""


@dataclass(frozen=True, slots=True)
class Expired(QueueEvent):
    """Removed: ``reason`` is ``retention`` (Q1, msgRetentionSeconds) or ``ttl`` (RabbitMQ)."""

    reason: str


@dataclass(frozen=True, slots=True)
class DeadLettered(QueueEvent):
    """Q8: removed here; the gateway must enqueue it on ``to_queue``.

    ``reason`` is ``max_receive_count`` or ``max_time_to_live``.
    """

    to_queue: str
    reason: str


@dataclass(frozen=True, slots=True)
class MaxLengthDropped(QueueEvent):
    """x-max-length with overflow drop-head: the head was removed (the gateway may dead-letter it)."""


@dataclass(frozen=True, slots=True)
class RewindableRemoved(QueueEvent):
    """Q6: a rewindable message left for good: ``retention`` ended or ``rewind_off``."""

    reason: str


# A priority queue (RabbitMQ's x-max-priority, which CMQ does not have): a message's position
# holds its rank (the queue's maximum priority minus its own, capped there) above a 48-bit
# arrival counter, so the Active order is by priority, then by arrival, and a message put back
# (M13) takes its own place again. Such a queue keeps its Active messages in the heap of
# returned ones (_returned) and never folds (its order is not the arrival order runs keep).
_RANK_SHIFT = 48


def _pos(msg: QueueMessage) -> int:
    return msg.pos


def _seq_of_item(item: tuple[str, QueueMessage]) -> int:
    return item[1].seq


def _timer_live(when: float, kind: int, msg: QueueMessage, token: int) -> bool:
    """False for a timer whose message moved on (lazy deletion)."""
    if kind == _VISIBLE:
        return msg.state is INACTIVE and msg.handle == token
    if kind == _DELAY_END:
        return msg.state is DELAYED and msg.next_visible_time == when
    return msg.state is not REMOVED and msg.deadline == when


class CmqQueue:
    """A CMQ queue (SPEC "Queue model"); see the module docstring."""

    # Slots: a compiled twin of the hot methods (use_compiled) reads and writes them at their
    # offsets; the Python methods read them as fast as instance attributes.
    __slots__ = ("name", "refuse_size", "leased", "on_rewind", "_messages", "_active", "_returned",
                 "_active_stale", "_parked", "_vis", "_dl", "_heap", "_vis_limit", "_dl_limit", "_heap_limit",
                 "_next_due", "_handles", "outbox", "_next_pos", "_next_seq", "_n_active", "_n_inactive",
                 "_n_delayed", "_n_parked", "_n_rewindable", "_rewound_to", "_runs", "_n_cold", "_freezer",
                 "_fold_at", "_fold_keep", "_fold_tail", "_fold_batch", "_fold_retry", "_fold_wait", "_live_max",
                 "_unordered", "on_drained", "_had_runs", "_priority_of", "_max_priority", "max_inflight",
                 "attributes", "_vt", "_retention", "_max_size", "_heap_num", "_default_delay", "_ttl",
                 "_max_length", "_overflow", "_dlq", "_max_receive", "_dlq_ttl", "_rewind", "__weakref__")

    def __init__(self, name: str, attributes: QueueAttributes | None = None, *,
                 refuse_size: bool = True, leased: bool = False) -> None:
        self.name = name
        # L6: MaxMsgSize refuses a larger body (cmq), or only the gateway reports it (PF3).
        self.refuse_size = refuse_size
        # The model holds only what this gateway leased from a store several gateways share
        # (gateway.jetstream): x-max-length and Q6's deleted copies are the store's, applied on
        # its counts and kept in it; a rewind is checked here as on one gateway, then
        # ``on_rewind`` moves the store's consumer.
        self.leased = leased
        self.on_rewind: Callable[[float], None] | None = None
        self._messages: dict[str, QueueMessage] = {}
        self._active: deque[QueueMessage] = deque()
        self._returned: list[tuple[int, QueueMessage]] = []
        self._active_stale = 0
        self._parked: deque[QueueMessage] = deque()
        self._vis: deque[_Entry] = deque()
        self._dl: deque[_Entry] = deque()
        self._heap: list[_HeapEntry] = []
        self._vis_limit = self._dl_limit = self._heap_limit = _MIN_COMPACT
        self._next_due = _INF
        self._handles = itertools.count(1)
        # The events since the last drain_events(); read-only to callers: the gateway tests
        # it for emptiness after every send and delete (a property's frame each, 2 a message).
        self.outbox: list[QueueEvent] = []
        self._next_pos = 0
        self._next_seq = 0
        self._n_active = 0
        self._n_inactive = 0
        self._n_delayed = 0
        self._n_parked = 0
        self._n_rewindable = 0
        self._rewound_to = float("-inf")
        # Active messages not yet (or no longer) objects (semantics.queue_cold): counted in
        # _n_active, in runs of increasing positions and enqueue times, so the first run's
        # head is the cold message received first and the first to reach its deadline.
        self._runs: deque[ColdRun | LiveRun] = deque()
        self._n_cold = 0
        self._freezer: Freezer | None = None
        self._fold_at = sys.maxsize  # len(_active) beyond which send folds (no freezer: never)
        self._fold_keep = FOLD_KEEP
        self._fold_tail = FOLD_TAIL
        self._fold_batch = FOLD_BATCH
        self._fold_retry = _INF  # when a timer folds again (see FOLD_RETRY)
        self._fold_wait = FOLD_RETRY  # the wait before it
        self._live_max = ""  # the highest ID ever folded: a later own ID is in no run
        self._unordered = False  # a thawed message went to the end of _messages
        # Called when the queue empties after holding a run (a long backlog drained): the
        # gateway gives memory back then (gateway.broker.folding).
        self.on_drained: Callable[[], None] | None = None
        self._had_runs = False
        self._priority_of: Callable[[object], int] | None = None  # a priority queue's (set_priorities)
        self._max_priority = 0
        self.max_inflight = limits.MAX_INFLIGHT_DELAYED  # L8; a test may lower it
        self._apply(attributes or QueueAttributes())

    # ------------------------------------------------------------------ attributes

    def _apply(self, a: QueueAttributes) -> None:
        # Cached as plain fields: the hot path reads them on every call.
        self.attributes = a
        self._vt = float(a.visibility_timeout)
        self._retention = float(a.msg_retention_seconds)
        self._max_size = a.max_msg_size
        self._heap_num = a.max_msg_heap_num
        self._default_delay = float(a.delay_seconds)
        self._ttl = a.message_ttl
        self._max_length = None if self.leased else a.max_length
        self._overflow = a.overflow
        self._dlq = a.dead_letter_queue
        self._max_receive = a.max_receive_count
        self._dlq_ttl = None if a.max_time_to_live is None else float(a.max_time_to_live)
        self._rewind = 0.0 if self.leased else float(a.rewind_seconds)

    def set_attributes(self, attributes: QueueAttributes, now: float) -> None:
        """CMQ SetQueueAttributes. New limits apply to new messages; new deadlines to all."""
        self._advance(now)
        old = self.attributes
        self._apply(attributes)
        self._in_send_order()
        if (old.msg_retention_seconds, old.max_time_to_live) != (
                attributes.msg_retention_seconds, attributes.max_time_to_live):
            for msg in self._messages.values():
                self._push_deadline(msg)
        if attributes.rewind_seconds == 0 and self._n_rewindable:
            self._drop_rewindable()
        self._advance(now)

    def set_rewind_seconds(self, seconds: float, now: float) -> None:
        """Q6: change the rewind range; 0 turns rewind off and drops the rewindable messages."""
        self.set_attributes(self.attributes.replace(rewind_seconds=seconds), now)

    # ------------------------------------------------------------------ counts

    @property
    def active(self) -> int:
        return self._n_active

    @property
    def inactive(self) -> int:
        return self._n_inactive

    @property
    def delayed(self) -> int:
        """Messages in flight (Q4), parked ones included."""
        return self._n_delayed + self._n_parked

    @property
    def parked(self) -> int:
        """Delayed messages over the 20,000 in-flight cap (L8)."""
        return self._n_parked

    @property
    def rewindable(self) -> int:
        return self._n_rewindable

    @property
    def retained(self) -> int:
        """Undeleted messages: what maxMsgHeapNum caps (L8)."""
        return len(self._messages) - self._n_rewindable + self._n_cold

    def __len__(self) -> int:
        return len(self._messages) - self._n_rewindable + self._n_cold

    @property
    def cold(self) -> int:
        """Restored messages still held as compact records (semantics.queue_cold)."""
        return self._n_cold

    def get(self, msg_id: str) -> QueueMessage | None:
        """The retained or rewindable message with this ID."""
        msg = self._messages.get(msg_id)
        if msg is None and self._n_cold and self._cold_has(msg_id):
            self._thaw_all()
            msg = self._messages.get(msg_id)
        return msg

    def messages(self) -> Iterator[QueueMessage]:
        """Retained and rewindable messages in send order (management API, store)."""
        self._thaw_all()
        return iter(list(self._messages.values()))

    def held(self) -> tuple[list[QueueMessage], list[ColdRun | LiveRun]]:
        """Everything the queue holds, nothing thawed: its messages that are objects
        (rewindable ones too) and its runs (their messages from the head on). Production
        order (``seq``) interleaves them; the gateway writes them down at a clean stop
        (gateway.broker.recovery_cache)."""
        return list(self._messages.values()), [run for run in self._runs if len(run)]

    def oldest_enqueue_time(self) -> float | None:
        """The enqueue time of the oldest Active or Inactive message (CMQ's minMsgTime), or
        None. Without thawing: a run's messages are Active in enqueue order, so each run's
        head is its oldest."""
        oldest = min((m.enqueue_time for m in self._messages.values() if m.state is ACTIVE or m.state is INACTIVE),
                     default=None)
        for run in self._runs:
            if len(run) and (oldest is None or run.head_enqueue_time() < oldest):
                oldest = run.head_enqueue_time()
        return oldest

    def set_priorities(self, max_priority: int, priority_of: Callable[[object], int]) -> None:
        """Deliver by priority (RabbitMQ's ``x-max-priority``; see _RANK_SHIFT): a payload's
        priority is ``priority_of(payload)``, read as 0 below 0 and as ``max_priority`` above
        it. Only while the queue is empty (when it is made, before a restart's messages come
        back); a priority queue does not fold."""
        if self._messages or self._runs:
            raise ValueError(f"queue '{self.name}' holds messages: its priorities are set when it is made")
        self._priority_of = priority_of
        self._max_priority = max_priority
        self._freezer = None
        self._fold_at = sys.maxsize

    def _place_ranked(self, msg: QueueMessage) -> None:
        """A priority queue's newly Active ``msg`` after every Active one of its priority."""
        assert self._priority_of is not None
        priority = self._priority_of(msg.payload)
        rank = self._max_priority - min(max(priority, 0), self._max_priority)
        msg.pos = (rank << _RANK_SHIFT) | self._next_pos
        self._next_pos += 1
        heapq.heappush(self._returned, (msg.pos, msg))

    def fold_with(self, freezer: Freezer, keep: int | None = None, tail: int | None = None,
                  batch: int | None = None) -> None:
        """Fold a long backlog (see FOLD_KEEP; the module's values when called) with
        ``freezer``'s help from now on (never a priority queue's)."""
        if self._priority_of is not None:
            return
        self._freezer = freezer
        # At least the newest message stays hot: send returns it, and the ID of a message
        # just sent is then known to be in no run (_cold_has).
        self._fold_keep = FOLD_KEEP if keep is None else keep
        self._fold_tail = max(FOLD_TAIL if tail is None else tail, 1)
        self._fold_batch = max(FOLD_BATCH if batch is None else batch, 1)
        self._fold_at = self._fold_keep + self._fold_tail + self._fold_batch

    # ------------------------------------------------------------------ send

    def send(self, payload: object, size: int, now: float, delay: float | None = None,
             msg_id: str | None = None, expires_at: float | None = None) -> QueueMessage:
        """CMQ SendMessage. Refusals raise and change nothing (L6, L8, Q4, max-length).
        ``delay``, ``msg_id`` and ``expires_at`` may be passed by position: the broker's
        enqueue does, a call by keyword costing ~40 % more than the same call by position."""
        # The rules every store applies (semantics.send_rules), on this model's own counts;
        # the hot path tests the common case inline and calls a rule only when it may apply.
        if size > self._max_size:
            check_size(self.name, size, self._max_size, self.refuse_size)
        if self._next_due <= now:
            self._advance(now)
        held = len(self._messages) - self._n_rewindable
        if held >= self._heap_num:
            check_heap(self.name, held, self._heap_num)
        delay = self._default_delay if delay is None else send_delay(delay, self._default_delay)
        if self._ttl is not None:
            expires_at = send_expiry(now, delay, self._ttl, expires_at)
        if self._max_length is not None:
            check_room(self.name, delay, self._n_active, self._max_length, self._overflow)
        if msg_id is None:
            msg_id = new_msg_id()
        elif msg_id in self._messages or (self._n_cold and self._cold_has(msg_id)):
            raise CMQError("Q3", f"message ID {msg_id!r} is already in queue '{self.name}'", value=msg_id)
        seq = self._next_seq
        self._next_seq = seq + 1
        if _slots_new is None:
            msg = _new_object(QueueMessage)  # its __init__ called, not its class: no type_call, slot_tp_init
            _init_message(msg, msg_id, payload, size, now, seq, expires_at)
        else:  # __init__'s values, _MESSAGE_SLOTS' order
            msg = _slots_new(QueueMessage, _MESSAGE_SLOTS, msg_id, payload, size, now, None, now, 0, ACTIVE,
                             expires_at, 0, 0, seq, 0.0)
        self._messages[msg_id] = msg
        if expires_at is None and self._dlq_ttl is None:
            # The common case, inlined: the deadline is the retention end (Q1), in send order.
            msg.deadline = when = now + self._retention
            dl = self._dl
            if not dl or dl[-1][0] <= when:
                dl.append((when, _DEADLINE, msg, 0))
                if when < self._next_due:
                    self._next_due = when
                if len(dl) > self._dl_limit:
                    self._dl_limit = self._compact_lane(dl)
            else:
                self._push_timer(when, _DEADLINE, msg, 0)
        else:
            self._push_deadline(msg)
        if delay > 0:
            msg.next_visible_time = now + delay
            if self._n_delayed >= self.max_inflight or self._n_parked:
                # L8: accepted, but invisible until the in-flight count drops (FIFO).
                msg.state = PARKED
                self._n_parked += 1
                self._parked.append(msg)
            else:
                msg.state = DELAYED
                self._n_delayed += 1
                self._push_timer(msg.next_visible_time, _DELAY_END, msg, 0)
        else:
            if self._priority_of is None:
                msg.pos = self._next_pos
                self._next_pos += 1
                self._active.append(msg)
            else:
                self._place_ranked(msg)
            self._n_active += 1
            if self._max_length is not None and self._n_active > self._max_length:
                self._drop_over_max_length()
            if len(self._active) > self._fold_at:
                self._fold(now)
        return msg

    def restore(self, payload: object, size: int, now: float, *, msg_id: str, enqueue_time: float,
                receive_count: int = 0, first_receive_time: float | None = None,
                visible_at: float | None = None, expires_at: float | None = None) -> QueueMessage:
        """Recovery from the store: keeps ID, enqueue time and receive count; no limit checks.

        Restore in enqueue order (it sets the receive order). An unacked message comes back
        Active (M13); one whose delay has not ended comes back DELAYED until ``visible_at``.
        """
        if msg_id in self._messages or (self._n_cold and self._cold_has(msg_id)):
            raise CMQError("Q3", f"message ID {msg_id!r} is already in queue '{self.name}'", value=msg_id)
        seq = self._next_seq
        self._next_seq = seq + 1
        msg = QueueMessage(msg_id, payload, size, enqueue_time, seq, expires_at)
        msg.receive_count = receive_count
        msg.first_receive_time = first_receive_time
        self._messages[msg_id] = msg
        self._push_deadline(msg)
        if visible_at is not None and visible_at > now:
            msg.state = DELAYED
            msg.next_visible_time = visible_at
            self._n_delayed += 1
            self._push_timer(visible_at, _DELAY_END, msg, 0)
        else:
            msg.state = REMOVED  # not yet counted anywhere; _make_active counts it
            msg.next_visible_time = now
            self._make_active(msg, now, False)
        self._advance(now)
        return msg

    def restore_plain(self, payload: object, size: int, now: float, msg_id: str, enqueue_time: float) -> QueueMessage:
        """``restore`` of a message with no delay, expiry or receive (a pulled message's
        common case, issue 28: itself and QueueMessage, not seven calls). The same steps as
        ``restore``'s, inlined for a queue with no dead-letter policy and no priorities;
        any other queue takes ``restore`` itself."""
        if self._dlq is not None or self._dlq_ttl is not None or self._priority_of is not None:
            return self.restore(payload, size, now, msg_id=msg_id, enqueue_time=enqueue_time)
        if msg_id in self._messages or (self._n_cold and self._cold_has(msg_id)):
            raise CMQError("Q3", f"message ID {msg_id!r} is already in queue '{self.name}'", value=msg_id)
        seq = self._next_seq
        self._next_seq = seq + 1
        if _slots_new is None:  # as in send
            msg = _new_object(QueueMessage)
            _init_message(msg, msg_id, payload, size, enqueue_time, seq, None)
        else:
            msg = _slots_new(QueueMessage, _MESSAGE_SLOTS, msg_id, payload, size, enqueue_time, None, enqueue_time,
                             0, ACTIVE, None, 0, 0, seq, 0.0)
        self._messages[msg_id] = msg
        # _push_deadline: the retention end (Q1); its seq is the newest, so the lane takes
        # it unless a later time is before it. Inlined as in send (a call each would cost
        # both hot paths what this method saves).
        msg.deadline = when = enqueue_time + self._retention
        dl = self._dl
        if not dl or dl[-1][0] <= when:
            dl.append((when, _DEADLINE, msg, 0))
            if when < self._next_due:
                self._next_due = when
            if len(dl) > self._dl_limit:
                self._dl_limit = self._compact_lane(dl)
        else:
            self._push_timer(when, _DEADLINE, msg, 0)
        # _make_active(msg, now, False): no expiry, no dead-letter policy, no priority.
        msg.next_visible_time = now
        self._n_active += 1
        msg.pos = self._next_pos
        self._next_pos += 1
        self._active.append(msg)
        if self._max_length is not None and self._n_active > self._max_length:
            self._drop_over_max_length()
        if self._active_stale > _MIN_COMPACT and self._active_stale * 2 > len(self._active) + len(self._returned):
            self._compact_active()
        if self._next_due <= now:
            self._advance(now)
        return msg

    def restore_cold(self, run: ColdRun, now: float) -> None:
        """Recovery in bulk: ``run``'s messages come back as ``restore`` would bring them
        back with no delay, expiry or receive (Active, in run order, their IDs and enqueue
        times kept), but held as the run's records until each is received or inspected.

        Only into a queue with no messages (a restart); otherwise, and for the messages a
        rule removes at once (their deadline passed), they are restored one by one."""
        if not run.ordered():
            run.sort()
        # A rule that would move an Active message with no receive at once (x-max-length,
        # a max receive count of 0) is left to the ordinary path.
        # A priority queue takes them one by one too: its order is not the run's.
        plain = (not self._messages and not self._runs and self._max_length is None and self._priority_of is None
                 and not (self._dlq is not None and self._max_receive is not None and self._max_receive <= 0))
        while len(run) and (not plain or self._cold_deadline(run.head_enqueue_time()) <= now):
            _, msg_id, enq, size, payload = run.pop()
            self.restore_plain(payload, size, now, msg_id, enq)
        n = len(run)
        if not n:
            return
        self._runs.append(run)
        self._had_runs = True
        self._n_cold = n
        run.visible_at = now
        run.pos0 = self._next_pos - run.head  # run index i has position pos0 + i
        run.seq0 = self._next_seq - run.head
        self._next_pos += n
        self._next_seq += n
        self._n_active += n
        first = self._cold_deadline(run.head_enqueue_time())
        if first < self._next_due:
            self._next_due = first

    def _cold_deadline(self, enqueue_time: float) -> float:
        """``_deadline_of`` for a message of the cold run (Active, no expiry of its own)."""
        deadline = enqueue_time + self._retention
        if self._dlq_ttl is not None and enqueue_time + self._dlq_ttl < deadline:
            deadline = enqueue_time + self._dlq_ttl
        return deadline

    def _cold_has(self, msg_id: str) -> bool:
        # An ID this process made was never restored, and one made after the last fold
        # (every new message's) was never folded: the search is for the others.
        if msg_id.startswith(_OWN_IDS) and len(msg_id) == _OWN_ID_LEN:
            if len(self._live_max) != _OWN_ID_LEN or msg_id > self._live_max:
                return False
            return any(run.contains(msg_id) for run in self._runs if type(run) is LiveRun)
        return any(run.contains(msg_id) for run in self._runs if type(run) is ColdRun)

    def _thaw(self) -> QueueMessage:
        """The first cold message as an ordinary ACTIVE one, counted as before, its
        deadline timer set; the caller places it in the Active order."""
        runs = self._runs
        run = runs[0]
        msg_id, enq, size, payload, pos, seq, visible = run.take()
        msg = QueueMessage(msg_id, payload, size, enq, seq, None)
        msg.pos = pos
        msg.next_visible_time = visible
        self._messages[msg_id] = msg
        self._unordered = True
        self._n_cold -= 1
        if not len(run):
            runs.popleft()  # its arrays go back as whole buffers
        self._push_deadline(msg)
        return msg

    def _thaw_all(self) -> None:
        """Every cold message as an object, in its place in the Active order, and
        ``_messages`` in send order again."""
        if self._n_cold:
            thawed = [self._thaw() for _ in range(self._n_cold)]
            if self._active and self._active[0].pos < thawed[-1].pos:
                self._active = deque(heapq.merge(thawed, self._active, key=_pos))
            else:
                thawed.reverse()
                self._active.extendleft(thawed)
        self._in_send_order()

    def _in_send_order(self) -> None:
        """``_messages`` in production order again (a thawed message went to its end), as
        the listings and the order of the events of a bulk change have it."""
        if self._unordered:
            self._messages = dict(sorted(self._messages.items(), key=_seq_of_item))
            self._unordered = False

    def _fold(self, now: float, retry: bool = False) -> None:
        """Fold the plain Active messages between the hot head and the hot tail into a
        LiveRun (see FOLD_KEEP), taking them out of ``_messages`` and the deadline lane.
        ``retry``: the timer's fold (FOLD_RETRY), of however few there are."""
        freezer = self._freezer
        assert freezer is not None
        active = self._active
        keep = self._fold_keep
        n = len(active) - keep - self._fold_tail
        self._fold_at = max(self._fold_keep + self._fold_tail + self._fold_batch, len(active) + self._fold_batch)
        if n < (1 if retry else self._fold_batch):
            return
        head = [active.popleft() for _ in range(keep)]
        middle = [active.popleft() for _ in range(n)]
        if self._runs:
            last_pos, last_enq = self._runs[-1].last()
        else:
            last_pos, last_enq = -1, -_INF
        last_id = self._live_max
        run = LiveRun(freezer, _OWN_IDS)
        stay: list[QueueMessage] = []
        messages = self._messages
        retention, dlq_ttl = self._retention, self._dlq_ttl
        folded_deadline = -_INF
        refused = 0
        for m in middle:
            state = m.state
            if state is not ACTIVE:
                self._active_stale -= 1  # a stale entry: dropped here
                continue
            enq = m.enqueue_time
            msg_id = m.msg_id
            deadline = enq + retention if dlq_ttl is None else min(enq + retention, enq + dlq_ttl)
            if (m.receive_count or m.expires_at is not None or m.next_visible_time != enq
                    or m.deadline != deadline or m.pos <= last_pos or enq < last_enq
                    or len(msg_id) != _OWN_ID_LEN or not msg_id.startswith(_OWN_IDS) or msg_id <= last_id):
                stay.append(m)
                continue
            ref = freezer.freeze(msg_id, m.payload, enq)
            if ref < 0:
                stay.append(m)
                refused += 1
                continue
            run.append(int(msg_id[len(_OWN_IDS):], 16), enq, m.size, ref, m.pos, m.seq)
            last_pos, last_enq, last_id = m.pos, enq, msg_id
            m.state = REMOVED  # its timer entries are stale from now on
            del messages[msg_id]
            folded_deadline = deadline
        stay.reverse()
        active.extendleft(stay)
        head.reverse()
        active.extendleft(head)
        # The next fold once FOLD_BATCH more came, counted from what is left hot now (counted
        # from before the fold, every fold waited FOLD_BATCH sends longer than the one before:
        # the hot order grew to ~14,000 messages over 10^5 published, issue 31); or as many
        # as it refused, so that messages it never takes are scanned again only as often as
        # their number doubles, not every FOLD_BATCH sends.
        self._fold_at = max(self._fold_keep + self._fold_tail + self._fold_batch,
                            len(active) + max(self._fold_batch, refused))
        if refused:
            # Some may be taken soon (the gateway: bodies on disk at the next commit). A fold
            # that took fewer than it refused (most of them may never be) waits longer: up to
            # FOLD_RETRY_MAX while it takes some, and no more once it takes none.
            if len(run) >= refused:
                wait = FOLD_RETRY
            elif len(run):
                wait = min(self._fold_wait * 2, FOLD_RETRY_MAX)
            else:
                wait = self._fold_wait * 2
            self._fold_wait = wait
            if wait <= FOLD_RETRY_MAX:
                self._fold_retry = when = now + wait
                if when < self._next_due:
                    self._next_due = when
        if not len(run):
            return
        self._runs.append(run)
        self._had_runs = True
        self._n_cold += len(run)
        self._live_max = last_id
        # Their deadline entries, in send order near the front of the lane, go too (each
        # holds its message); a stale entry met on the way goes with them.
        dl = self._dl
        kept = []
        while dl and dl[0][0] <= folded_deadline:
            e = dl.popleft()
            if e[2].state is not REMOVED:
                kept.append(e)
        kept.reverse()
        dl.extendleft(kept)

    # ------------------------------------------------------------------ receive / delete

    def receive(self, now: float, visibility: float | None = None) -> Receipt | None:
        """CMQ ReceiveMessage (Q1, Q2, Q3, Q7): the next Active message, Inactive now.

        ``visibility`` overrides the queue's visibility timeout for this receive.
        """
        if self._next_due <= now:
            self._advance(now)
        active = self._active
        msg: QueueMessage | None
        if active and active[0].state is ACTIVE and not self._n_cold and not self._returned:
            msg = active.popleft()  # _pop_active's common case, without its frame (a delivery's)
        else:
            msg = self._pop_active()
            if msg is None:
                return None
        msg.state = INACTIVE
        msg.receive_count += 1
        if msg.first_receive_time is None:
            msg.first_receive_time = now
        visible = now + (self._vt if visibility is None else visibility)
        msg.next_visible_time = visible
        handle = next(self._handles)
        msg.handle = handle
        self._n_active -= 1
        self._n_inactive += 1
        vis = self._vis
        if not vis or vis[-1][0] <= visible:
            vis.append((visible, _VISIBLE, msg, handle))
            if visible < self._next_due:
                self._next_due = visible
            if len(vis) > self._vis_limit:
                self._vis_limit = self._compact_lane(vis)
        else:
            self._push_timer(visible, _VISIBLE, msg, handle)
        return _new_receipt(Receipt, (msg, handle))  # type: ignore[no-any-return]

    def receive_and_delete(self, now: float) -> QueueMessage | None:
        """A receive immediately followed by its delete (AMQP no-ack consumers, basic.get no-ack)."""
        if self._next_due <= now:
            self._advance(now)
        msg = self._pop_active()
        if msg is None:
            return None
        msg.receive_count += 1
        if msg.first_receive_time is None:
            msg.first_receive_time = now
        self._n_active -= 1
        self._n_inactive += 1
        msg.state = INACTIVE  # as receive leaves it, for delete to end with its latest handle
        self.delete(_new_receipt(Receipt, (msg, msg.handle)), now)
        return msg

    def delete(self, receipt: Receipt, now: float) -> bool:
        """CMQ DeleteMessage (Q3, M12). False, and nothing deleted, for a stale handle."""
        msg, handle = receipt
        if self._next_due <= now:
            self._advance(now)
        # Q3 / M12: only the latest handle acts. After the visibility timeout it still acts if
        # nobody received the message again (M12: "and it was received elsewhere").
        if msg.handle != handle:
            return False
        state = msg.state
        if state is INACTIVE:
            self._n_inactive -= 1
        elif state is ACTIVE:
            self._n_active -= 1
            self._active_stale += 1
        else:
            return False
        msg.handle = 0
        # Deleted in the order received (a FIFO consumer's acks), the message's entries are
        # the heads of the timer lanes: dropped now, while it is in the cache, not by
        # next_wakeup later, when reading its state missed the cache once an entry (two of
        # those a message were 5 % of scenario 1's event loop). Stale entries only: its
        # visibility ended with the delete; its deadline unless Q6 keeps it. (These steps
        # were a method of their own, a frame on every ack.)
        vis = self._vis
        if vis and vis[0][2] is msg:
            vis.popleft()
        if self._rewind > 0:
            msg.state = DELETED  # Q6: kept until its retention ends
            self._n_rewindable += 1
        else:
            msg.state = REMOVED
            dl = self._dl
            if dl and dl[0][2] is msg:
                dl.popleft()
            del self._messages[msg.msg_id]
            if not self._messages and not self._n_cold:
                self._emptied()
        return True

    def release(self, receipt: Receipt, now: float) -> bool:
        """basic.nack/reject with requeue (M13): Active again at once, at its original position.

        False when the handle is stale or the message is already Active.
        """
        msg, handle = receipt
        if self._next_due <= now:
            self._advance(now)
        if msg.handle != handle or msg.state is not INACTIVE:
            return False
        self._uncount(msg)
        msg.handle = 0  # the delivery is over: its handle deletes nothing any more
        msg.next_visible_time = now
        self._make_active(msg, now, True)
        return True

    def drop(self, receipt: Receipt, now: float) -> QueueMessage | None:
        """basic.nack/reject without requeue (M13): deleted and returned (the gateway may
        dead-letter it); None for a stale handle."""
        msg = receipt.message
        return msg if self.delete(receipt, now) else None

    # ------------------------------------------------------------------ Active order

    def _pop_active(self) -> QueueMessage | None:
        active = self._active
        returned = self._returned
        while True:
            if self._n_cold:
                at = self._runs[0].head_pos()
                if (not returned or at < returned[0][0]) and (not active or at < active[0].pos):
                    return self._thaw()
            if returned:
                if active and active[0].pos < returned[0][0]:
                    msg = active.popleft()
                else:
                    msg = heapq.heappop(returned)[1]
            elif active:
                msg = active.popleft()
            else:
                return None
            if msg.state is ACTIVE:
                return msg
            self._active_stale -= 1

    def _make_active(self, msg: QueueMessage, now: float, back: bool) -> None:
        """Active again (``back``: at its original position) unless a rule moves it on.

        ``msg`` is counted in no state (see ``_uncount``)."""
        if msg.expires_at is not None and msg.expires_at <= now:
            self._remove(msg, Expired(msg, "ttl"))
            return
        if self._dlq is not None:
            reason = None
            if self._max_receive is not None and msg.receive_count >= self._max_receive:
                reason = "max_receive_count"  # Q8: instead of being received again
            elif self._dlq_ttl is not None and msg.enqueue_time + self._dlq_ttl <= now:
                reason = "max_time_to_live"
            if reason is not None:
                self._remove(msg, DeadLettered(msg, self._dlq, reason))
                return
        msg.state = ACTIVE
        self._n_active += 1
        if back:
            heapq.heappush(self._returned, (msg.pos, msg))
        elif self._priority_of is not None:
            self._place_ranked(msg)
        else:
            msg.pos = self._next_pos
            self._next_pos += 1
            self._active.append(msg)
            if self._max_length is not None and self._n_active > self._max_length:
                self._drop_over_max_length()
        if self._active_stale > _MIN_COMPACT and self._active_stale * 2 > len(self._active) + len(self._returned):
            self._compact_active()

    def _drop_over_max_length(self) -> None:
        # x-max-length counts ready messages only, as RabbitMQ does.
        assert self._max_length is not None
        while self._n_active > self._max_length:
            head = self._pop_active()
            if head is None:
                break
            self._n_active -= 1
            head.state = REMOVED
            head.handle = 0
            del self._messages[head.msg_id]
            self.outbox.append(MaxLengthDropped(head))

    def _compact_active(self) -> None:
        self._active = deque(m for m in self._active if m.state is ACTIVE)
        self._returned = [(p, m) for p, m in self._returned if m.state is ACTIVE and m.pos == p]
        heapq.heapify(self._returned)
        self._active_stale = 0

    def _rebuild_active(self) -> None:
        """All ACTIVE messages in production order (after a rewind, Q6)."""
        ordered = sorted((m for m in self._messages.values() if m.state is ACTIVE),
                         key=lambda m: (m.enqueue_time, m.seq))
        self._returned = []
        self._active_stale = 0
        if self._priority_of is not None:
            self._active = deque()
            for msg in ordered:
                self._place_ranked(msg)
            return
        for msg in ordered:
            msg.pos = self._next_pos
            self._next_pos += 1
        self._active = deque(ordered)

    # ------------------------------------------------------------------ removal

    def _uncount(self, msg: QueueMessage) -> None:
        """Take ``msg`` out of the count of its state (it is about to change state)."""
        state = msg.state
        if state is ACTIVE:
            self._n_active -= 1
            self._active_stale += 1  # its entry in _active/_returned is now stale
        elif state is INACTIVE:
            self._n_inactive -= 1
        elif state is DELAYED:
            self._n_delayed -= 1
        elif state is PARKED:
            self._n_parked -= 1
        elif state is DELETED:
            self._n_rewindable -= 1
        msg.state = REMOVED  # counted nowhere until the caller gives it its new state

    def _remove(self, msg: QueueMessage, event: QueueEvent | None) -> None:
        self._uncount(msg)
        if self._messages.get(msg.msg_id) is msg:
            del self._messages[msg.msg_id]
        msg.state = REMOVED
        msg.handle = 0
        if event is not None:
            self.outbox.append(event)
        if not self._messages and not self._n_cold:
            self._emptied()

    def _emptied(self) -> None:
        """No message is left, so every timer entry is stale: they go now (in place, as
        _advance may hold the lanes), with the table the message dict grew to, instead of
        one by one as each deadline comes. The retention deadline is days away: a drained
        backlog of 10^5 messages kept every one of them alive through it (issue 15)."""
        self._vis.clear()
        self._dl.clear()
        self._heap.clear()
        self._vis_limit = self._dl_limit = self._heap_limit = _MIN_COMPACT
        self._next_due = _INF
        self._fold_retry = _INF
        self._fold_wait = FOLD_RETRY
        self._messages = {}
        self._runs = deque()
        self._unordered = False
        if self._freezer is not None:
            self._fold_at = self._fold_keep + self._fold_tail + self._fold_batch
        if self._had_runs:
            self._had_runs = False
            if self.on_drained is not None:
                self.on_drained()

    def _drop_rewindable(self) -> None:
        for msg in [m for m in self._messages.values() if m.state is DELETED]:
            self._remove(msg, RewindableRemoved(msg, "rewind_off"))

    def purge(self, now: float) -> list[QueueMessage]:
        """AMQP queue.purge: removes the messages not being processed (Active, delayed), as
        RabbitMQ keeps unacked ones; returns them (the store deletes their records)."""
        self._advance(now)
        self._thaw_all()
        gone = [m for m in self._messages.values() if m.state in (ACTIVE, DELAYED, PARKED)]
        for msg in gone:
            self._remove(msg, None)
        self._active.clear()
        self._returned.clear()
        self._parked.clear()
        self._active_stale = 0
        return gone

    # ------------------------------------------------------------------ time

    def _push_timer(self, when: float, kind: int, msg: QueueMessage, token: int) -> None:
        lane = self._vis if kind == _VISIBLE else self._dl if kind == _DEADLINE else None
        # Deadlines at the same time run in production order: one behind a later message's
        # (a message thawed from a run) goes to the heap.
        if lane is not None and (not lane or lane[-1][0] < when or (
                lane[-1][0] == when and (lane is self._vis or lane[-1][2].seq <= msg.seq))):
            lane.append((when, kind, msg, token))
            if lane is self._vis:
                if len(lane) > self._vis_limit:
                    self._vis_limit = self._compact_lane(lane)
            elif len(lane) > self._dl_limit:
                self._dl_limit = self._compact_lane(lane)
        else:
            heap = self._heap
            heapq.heappush(heap, (when, msg.seq, kind, msg, token))
            if len(heap) > self._heap_limit:
                live = [e for e in heap if _timer_live(e[0], e[2], e[3], e[4])]
                heapq.heapify(live)
                heap[:] = live  # in place: _advance holds a reference
                self._heap_limit = max(_MIN_COMPACT, 2 * len(live))
        if when < self._next_due:
            self._next_due = when

    @staticmethod
    def _compact_lane(lane: deque[_Entry]) -> int:
        """Drop the stale entries of a FIFO lane, in place; returns its next limit.

        A lane is compacted when it doubled since the last time, so each entry is scanned
        O(1) times on average and stale entries never outnumber live ones for long."""
        live = [e for e in lane if _timer_live(*e)]
        lane.clear()
        lane.extend(live)
        return max(_MIN_COMPACT, 2 * len(live))

    def _deadline_of(self, msg: QueueMessage) -> float:
        """The next time a rule may remove ``msg``: retention (Q1), dead-letter TTL (Q8), TTL."""
        deadline = msg.enqueue_time + self._retention
        if msg.state is not DELETED:
            if self._dlq_ttl is not None:
                deadline = min(deadline, msg.enqueue_time + self._dlq_ttl)
            if msg.expires_at is not None:
                deadline = min(deadline, msg.expires_at)
        return deadline

    def _push_deadline(self, msg: QueueMessage) -> None:
        msg.deadline = when = self._deadline_of(msg)
        self._push_timer(when, _DEADLINE, msg, 0)

    def _advance(self, now: float) -> None:
        """Apply every timed change due at or before ``now``, in time order; at the same
        time, a visibility end first, then deadlines and delay ends in production order
        (which lane holds an entry depends on the entries before it, see _push_timer)."""
        if self._fold_retry <= now:
            self._fold_retry = _INF
            if self._freezer is not None:
                self._fold(now, True)
        vis, dl, heap = self._vis, self._dl, self._heap
        while True:
            v = vis[0][0] if vis else _INF
            d = dl[0][0] if dl else _INF
            h = heap[0][0] if heap else _INF
            due = min(v, d, h)
            if self._n_cold:
                run = self._runs[0]
                c = self._cold_deadline(run.head_enqueue_time())
                # Its turn is where its deadline entry would be if it had stayed an object.
                if (c <= now and c < v and (c < d or (c == d and run.head_seq() < dl[0][2].seq))
                        and (c < h or (c == h and run.head_seq() < heap[0][1]))):
                    # Due: an ordinary message now, at its position, its deadline run now.
                    msg = self._thaw()
                    heapq.heappush(self._returned, (msg.pos, msg))
                    self._fire(msg.deadline, _DEADLINE, msg, 0, now)
                    continue
                if c < due:
                    due = c  # only for _next_due below: it is not due yet
            if due > now:
                break
            if v <= d and v <= h:
                when, kind, msg, token = vis.popleft()
            elif d < h or (d == h and dl[0][2].seq <= heap[0][1]):
                when, kind, msg, token = dl.popleft()
            else:
                when, _, kind, msg, token = heapq.heappop(heap)
            self._fire(when, kind, msg, token, now)
        self._next_due = min(due, self._fold_retry)

    def _fire(self, when: float, kind: int, msg: QueueMessage, token: int, now: float) -> None:
        state = msg.state
        if kind == _VISIBLE:
            if state is INACTIVE and msg.handle == token:
                # Q1: not deleted in time: Active again, at its original position.
                self._uncount(msg)
                self.outbox.append(VisibilityExpired(msg))
                self._make_active(msg, now, True)
        elif kind == _DELAY_END:
            if state is DELAYED and msg.next_visible_time == when:
                self._uncount(msg)
                self.outbox.append(DelayEnded(msg))
                self._make_active(msg, now, False)
                self._admit_parked(now)
        elif state is not REMOVED and msg.deadline == when:
            self._on_deadline(msg, now)

    def _on_deadline(self, msg: QueueMessage, now: float) -> None:
        state = msg.state
        if now >= msg.enqueue_time + self._retention:
            # Q1: expired whether received or not; Q6: a rewindable one ends here too.
            was_delayed = state is DELAYED
            if state is DELETED:
                self._remove(msg, RewindableRemoved(msg, "retention"))
            else:
                self._remove(msg, Expired(msg, "retention"))
            if was_delayed:
                self._admit_parked(now)
            return
        if state is not INACTIVE and state is not DELETED:
            # A message being processed is judged when it comes back (_make_active), as
            # RabbitMQ does for TTL; a waiting one moves now.
            if self._dlq is not None and self._dlq_ttl is not None and msg.enqueue_time + self._dlq_ttl <= now:
                self._remove(msg, DeadLettered(msg, self._dlq, "max_time_to_live"))
                if state is DELAYED:
                    self._admit_parked(now)
                return
            if msg.expires_at is not None and msg.expires_at <= now:
                self._remove(msg, Expired(msg, "ttl"))
                if state is DELAYED:
                    self._admit_parked(now)
                return
        # Not removable yet (being processed, or rewindable): wait for the retention end.
        msg.deadline = when = msg.enqueue_time + self._retention
        self._push_timer(when, _DEADLINE, msg, 0)

    def _admit_parked(self, now: float) -> None:
        """L8: parked messages take the in-flight slots that freed up, oldest first."""
        parked = self._parked
        while parked and self._n_delayed < self.max_inflight:
            msg = parked.popleft()
            if msg.state is not PARKED:
                continue
            self._uncount(msg)
            if msg.next_visible_time <= now:
                self.outbox.append(DelayEnded(msg))
                self._make_active(msg, now, False)
            else:
                msg.state = DELAYED
                self._n_delayed += 1
                self._push_timer(msg.next_visible_time, _DELAY_END, msg, 0)

    def tick(self, now: float) -> list[QueueEvent]:
        """Apply what is due by ``now``; return every event since the last call."""
        self._advance(now)
        return self.drain_events()

    def drain_events(self) -> list[QueueEvent]:
        """The events of the outbox (also those caused by send/receive/release), emptied."""
        events = self.outbox
        if not events:
            return []
        self.outbox = []
        return events

    def next_wakeup(self) -> float | None:
        """The earliest time a timed change is due, for the gateway's scheduler."""
        vis, dl, heap = self._vis, self._dl, self._heap
        # Called after every send/receive/delete by the gateway's scheduler: the lane checks
        # of _timer_live are inlined (each lane holds one kind of timer).
        while vis:
            _, _, msg, token = vis[0]
            if msg.state is INACTIVE and msg.handle == token:
                break
            vis.popleft()
        while dl:
            when, _, msg, _ = dl[0]
            if msg.state is not REMOVED and msg.deadline == when:
                break
            dl.popleft()
        while heap and not _timer_live(heap[0][0], heap[0][2], heap[0][3], heap[0][4]):
            heapq.heappop(heap)
        self._next_due = first = min(vis[0][0] if vis else _INF, dl[0][0] if dl else _INF,
                                     heap[0][0] if heap else _INF, self._fold_retry,
                                     self._cold_deadline(self._runs[0].head_enqueue_time())
                                     if self._n_cold else _INF)
        return None if first == _INF else first

    # ------------------------------------------------------------------ rewind (Q6)

    def rewind(self, to_time: float, now: float) -> int:
        """Q6: from now on, receive every message produced at or after ``to_time``, in
        production order. Returns how many deleted messages became Active again."""
        rewind_range = float(self.attributes.rewind_seconds)  # a leased model keeps no copies (_rewind 0)
        if rewind_range <= 0:
            raise CMQError("Q6", f"queue '{self.name}' has rewind off (rewind_seconds=0)", value=to_time)
        oldest = now - rewind_range
        if to_time < oldest:
            raise CMQError("Q6", f"cannot rewind queue '{self.name}' to {to_time!r}: older than now - "
                           f"rewind_seconds ({oldest!r})", value=to_time)
        if to_time < self._rewound_to:
            raise CMQError("Q6", f"cannot rewind queue '{self.name}' back to {to_time!r}: rewind moves "
                           f"forward only (last rewind to {self._rewound_to!r})", value=to_time)
        self._advance(now)
        self._thaw_all()
        self._rewound_to = to_time
        count = 0
        for msg in self._messages.values():
            if msg.state is DELETED and msg.enqueue_time >= to_time:
                msg.state = ACTIVE
                msg.next_visible_time = now
                self._n_rewindable -= 1
                self._n_active += 1
                count += 1
                # A rewound message was consumed once: only its retention can remove it while
                # it waits (its TTL and dead-letter time to live would move it at once).
                retention_end = msg.enqueue_time + self._retention
                if msg.deadline != retention_end:
                    msg.deadline = retention_end
                    self._push_timer(retention_end, _DEADLINE, msg, 0)
        self._rebuild_active()
        if self.on_rewind is not None:
            self.on_rewind(to_time)
        return count

    def __repr__(self) -> str:
        return (f"CmqQueue({self.name!r}, active={self._n_active}, inactive={self._n_inactive}, "
                f"delayed={self.delayed}, rewindable={self._n_rewindable})")


# The Python methods of the common path: the model itself, and the reference and fallback of a
# compiled twin (use_compiled).
py_send = CmqQueue.send
py_receive = CmqQueue.receive
py_delete = CmqQueue.delete
py_restore_plain = CmqQueue.restore_plain


def use_compiled(send: Callable[..., QueueMessage], receive: Callable[..., Receipt | None],
                 delete: Callable[..., bool], restore_plain: Callable[..., QueueMessage]) -> None:
    """Make ``send``, ``receive``, ``delete`` and ``restore_plain`` of every CmqQueue these: twins of py_send, py_receive, py_delete and py_restore_plain (same
    arguments, results, state and events) that the caller holds to the same results, each
    handing any case it does not take to the Python method (the gateway's compiled ones,
    gateway.broker.queue). This package stays pure Python."""
    CmqQueue.send = send  # type: ignore[method-assign]
    CmqQueue.receive = receive  # type: ignore[method-assign]
    CmqQueue.delete = delete  # type: ignore[method-assign]
    CmqQueue.restore_plain = restore_plain  # type: ignore[method-assign]

