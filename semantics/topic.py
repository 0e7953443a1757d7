"""A CMQ topic: subscriptions, routing, per-subscription delivery state and retries.

SPEC T2, T3, T5, L5, L6, D1-D4, D6 (blocking), D8, D9. Pure: no I/O, ``now`` is passed in.

Theory of operation
-------------------
``publish`` routes a message (tag index or key trie, T5), then calls ``attempt(sub, msg)``
for every subscription that took it and is not blocked (D1). ``attempt`` answers True
(delivered, e.g. a queue accepted it), False (failed) or None (pending: an HTTP push is on
its way and the caller will ``report`` the outcome). When every answer is True, which is the
normal case for queue endpoints, the message is done and nothing is kept for it (D2,
scenario 5). A message no subscription takes is discarded at once, never retained (T2).

Otherwise the message is *retained* with one delivery state per subscription that took it
(D4): pending, succeeded, retrying (attempts, next time), given up, expired. It is deleted as
soon as every such subscription has succeeded or given up (D2), and at the latest 86,400 s
after ``published_at`` whatever the retries (D3, ``expire``). ``due(now)`` hands out the
retries whose time has come, oldest first; the caller performs them and ``report``s each.

Blocking (D5, D6, seed scenario 4), as this module reads it
-----------------------------------------------------------
Each subscription has at most one *blocker*: a message that is failing for it. While there
is one, nothing else is attempted for that subscription: later messages, including new ones
published meanwhile, wait behind it (retained, state pending), and retries of other messages
that come due wait as well. When the blocker succeeds, is given up or expires, the
subscription unblocks.

* BACKOFF_RETRY: the first failure blocks ("if the 101st message fails, the delivery of the
  subsequent 99 messages will be blocked"). Retries go strictly in order, oldest first: on
  unblock the oldest waiting message becomes the head and is attempted at once (or at its
  own retry time if it had already failed); a message that fails gets up to 3 retries 10-20 s
  apart, then is dropped for that subscription and the next one is tried.
* EXPONENTIAL_DECAY_RETRY: messages are delivered concurrently; a first failure does not
  block ("the very message will be retried"), it is retried after 1 s while later messages
  keep flowing. The second failure of a message ("if it fails again") makes it the blocker;
  other messages wait until it has succeeded, used up its 176 retries (86,015 s) or expired.
  On unblock the waiting messages are released together (each at its own retry time, new
  ones at once); the next one to fail twice blocks again. ``due`` hands out a batch before
  any outcome is known, so a caller that runs a batch concurrently may see several fail
  before the block takes hold (the seed's "concurrently, sequence not guaranteed");
  ``deliver_due`` sees each outcome first and holds back the rest of a blocked batch.

Republish (D8) follows: a healthy subscription is attempted at once and so receives only the
new messages, while a blocked one keeps the old and the new.
"""

from __future__ import annotations

import enum
import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from semantics.errors import CMQError, LimitError
from semantics.limits import (
    MAX_SUBSCRIPTIONS,
    TOPIC_LIFECYCLE_SECONDS,
    TOPIC_MAX_MSG_SIZE_DEFAULT,
    TOPIC_MAX_MSG_SIZE_MAX,
    TOPIC_MAX_MSG_SIZE_MIN,
)
from semantics.matching import (
    KeyTrie,
    TagIndex,
    filter_breach,
    validate_binding_keys,
    validate_key,
    validate_tags,
)
from semantics.names import validate_topic_name
from semantics.profile import CMQ_LIMITS, Limits
from semantics.retry import DEFAULT_STRATEGY, NotifyStrategy, retry_wait

__all__ = [
    "Attempt",
    "Deleted",
    "Delivered",
    "DeliveryState",
    "DeliveryStatus",
    "Discarded",
    "Event",
    "FilterType",
    "GaveUp",
    "PublishResult",
    "RetryScheduled",
    "Routed",
    "Subscription",
    "Topic",
    "TopicMessage",
]


class FilterType(enum.StrEnum):
    """T5: chosen when the topic is created."""

    TAG = "tag"
    ROUTING_KEY = "routing_key"


class DeliveryStatus(enum.StrEnum):
    """D4: the state of one message for one subscription."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    GIVEN_UP = "given_up"
    EXPIRED = "expired"


@dataclass(slots=True)
class TopicMessage:
    """A published message; ``size`` is the body size in bytes (L6), ``payload`` the gateway's.

    T3: the tags (a tuple) are bound to the message ID at publish: the subscriptions that take
    the message are decided then and every retry goes to those, whatever changes later. Not
    frozen on purpose: a frozen dataclass costs about 2 us more to build, once per publish."""

    msg_id: str
    published_at: float
    tags: tuple[str, ...] = ()
    routing_key: str = ""
    payload: object = None
    size: int = 0


@dataclass(frozen=True, slots=True)
class DeliveryState:
    """D4: a snapshot of one (message, subscription) delivery."""

    status: DeliveryStatus
    attempts: int              # delivery attempts made so far (the first delivery is 1)
    next_at: float | None      # when the next retry is due (retrying only)
    in_flight: bool = False    # an attempt was handed out and its outcome is not reported yet


# Events, for the gateway's audit log (A1). ``attempt`` is the delivery attempt number:
# 1 is the first delivery, 2 the first retry.
@dataclass(frozen=True, slots=True)
class Routed:
    msg_id: str
    subscriptions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Delivered:
    msg_id: str
    subscription: str
    attempt: int


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    msg_id: str
    subscription: str
    attempt: int
    next_at: float
    policy: str


@dataclass(frozen=True, slots=True)
class GaveUp:
    """The retries are used up: dropped for this subscription (audit: discard retries_exhausted)."""

    msg_id: str
    subscription: str
    attempts: int
    policy: str
    reason: str = "retries_exhausted"


@dataclass(frozen=True, slots=True)
class Discarded:
    """``no_match`` (T2, whole message), ``expired`` (D3, per subscription still waiting)."""

    msg_id: str
    reason: str
    subscription: str | None = None


@dataclass(frozen=True, slots=True)
class Deleted:
    """A retained message left the topic (D2 all done, or D3 expired)."""

    msg_id: str


Event = Routed | Delivered | RetryScheduled | GaveUp | Discarded | Deleted


class Subscription:
    """A subscription: ``name``, opaque ``endpoint``, ``filters`` (tags or binding keys) and
    notify ``strategy``. Created by :meth:`Topic.subscribe`; the underscored fields are the
    topic's delivery bookkeeping."""

    __slots__ = ("_blocker", "_filter_set", "_filters", "_open", "_parked", "endpoint", "name", "strategy")

    def __init__(self, name: str, endpoint: object, filters: tuple[str, ...], strategy: NotifyStrategy) -> None:
        self.name = name
        self.endpoint = endpoint
        # The filters as a set kept in order: one added or removed costs O(1) (SE5); the tuple
        # ``filters`` is made again only when it is read after a change.
        self._filter_set: dict[str, None] = dict.fromkeys(filters)
        self._filters: tuple[str, ...] | None = tuple(self._filter_set)
        self.strategy = strategy
        self._open: dict[str, _Entry] = {}  # unresolved messages, in publish order
        self._blocker: _Entry | None = None
        self._parked: list[_Entry] = []     # exponential decay: waiting behind the blocker

    @property
    def filters(self) -> tuple[str, ...]:
        if self._filters is None:
            self._filters = tuple(self._filter_set)
        return self._filters

    def __repr__(self) -> str:
        return f"Subscription({self.name!r}, filters={self.filters!r}, strategy={self.strategy.value})"


Attempt = Callable[[Subscription, TopicMessage], "bool | None"]


class _Retained:
    __slots__ = ("entries", "msg", "seq", "unresolved")

    def __init__(self, msg: TopicMessage, seq: int) -> None:
        self.msg = msg
        self.seq = seq
        self.entries: dict[str, _Entry] = {}
        self.unresolved = 0


class _Entry:
    __slots__ = ("attempts", "in_flight", "next_at", "rec", "status", "sub", "tick")

    def __init__(self, rec: _Retained, sub: Subscription, status: DeliveryStatus, attempts: int,
                 next_at: float) -> None:
        self.rec = rec
        self.sub = sub
        self.status = status
        self.attempts = attempts
        self.next_at = next_at
        self.in_flight = False
        self.tick = 0  # identifies the entry's live timer; older heap items are stale


class PublishResult:
    """What ``publish`` did. ``events`` is built on first access, so a gateway that does not
    audit routing pays nothing for it on the all-delivered path."""

    __slots__ = ("_events", "matched", "msg_id", "retained")

    def __init__(self, msg_id: str, matched: tuple[Subscription, ...], retained: bool,
                 events: tuple[Event, ...] | None) -> None:
        self.msg_id = msg_id
        self.matched = matched
        self.retained = retained
        self._events = events

    @property
    def discarded(self) -> bool:
        """T2: nothing took the message, so it was dropped at once."""
        return not self.matched

    @property
    def events(self) -> tuple[Event, ...]:
        if self._events is None:
            msg_id = self.msg_id
            names = tuple(s.name for s in self.matched)
            self._events = (Routed(msg_id, names), *(Delivered(msg_id, n, 1) for n in names))
        return self._events

    def __repr__(self) -> str:
        return (f"PublishResult({self.msg_id!r}, matched={len(self.matched)}, "
                f"discarded={self.discarded}, retained={self.retained})")


_WAIT = object()  # a publish outcome: the subscription is blocked, not attempted
_CACHE_MAX = 4096


class Topic:
    """One CMQ topic. See the module docstring for the delivery model."""

    def __init__(self, name: str, filter_type: FilterType = FilterType.TAG, *,
                 max_message_size: int = TOPIC_MAX_MSG_SIZE_DEFAULT, rng: random.Random | None = None,
                 limits: Limits = CMQ_LIMITS) -> None:
        self.name = validate_topic_name(name)
        # The size and count limits that refuse (semantics.profile): CMQ's, or RabbitMQ's in
        # the compatible profile (PF3). Matching is the same under both.
        self.limits = limits
        self.filter_type = FilterType(filter_type)
        self._max_size = self._check_size(max_message_size)
        self._rng = rng if rng is not None else random.Random()
        self._subs: dict[str, Subscription] = {}
        self._tags: TagIndex[Subscription] | None = None
        self._keys: KeyTrie[Subscription] | None = None
        if self.filter_type is FilterType.TAG:
            self._tags = TagIndex()
        else:
            self._keys = KeyTrie()
        # Read directly by the gateway's publish (gateway.broker.vhost), as are _max_size and
        # Subscription._blocker: a frame a message each saved there.
        self._cache: dict[object, tuple[Subscription, ...]] = {}
        self._retained: dict[str, _Retained] = {}
        self._timers: list[tuple[float, int, int, _Entry]] = []   # (next_at, seq, tick, entry)
        self._expiry: list[tuple[float, int, _Retained]] = []      # (expires_at, seq, record)
        self._seq = 0
        self._tick = 0

    # -- attributes ------------------------------------------------------------------------

    @staticmethod
    def _check_size(size: int) -> int:
        if not TOPIC_MAX_MSG_SIZE_MIN <= size <= TOPIC_MAX_MSG_SIZE_MAX:
            raise LimitError("L6", f"MaximumMessageSize {size} is outside {TOPIC_MAX_MSG_SIZE_MIN}-"
                             f"{TOPIC_MAX_MSG_SIZE_MAX} bytes", value=size,
                             limit=(TOPIC_MAX_MSG_SIZE_MIN, TOPIC_MAX_MSG_SIZE_MAX))
        return size

    @property
    def max_message_size(self) -> int:
        """L6: MaximumMessageSize in bytes, 1 KB-1024 KB, default 64 KB, changeable."""
        return self._max_size

    @max_message_size.setter
    def max_message_size(self, size: int) -> None:
        self._max_size = self._check_size(size)

    def set_limits(self, limits: Limits) -> None:
        """Another profile's limits from now on (PF1); subscriptions already made stay."""
        self.limits = limits
        self._cache.clear()

    @property
    def retained_count(self) -> int:
        """D9: messages retained in the topic (waiting for or in retry for some subscription)."""
        return len(self._retained)

    # -- subscriptions ---------------------------------------------------------------------

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return tuple(self._subs.values())

    def subscription(self, name: str) -> Subscription:
        try:
            return self._subs[name]
        except KeyError:
            raise CMQError("M8", f"no subscription {name!r} on topic {self.name!r}", reply_code=404, value=name)

    def _check_filters(self, name: str, filters: Iterable[str]) -> tuple[str, ...]:
        if self._tags is not None:
            return validate_tags(filters, what=f"subscription {name!r}", limits=self.limits)
        return validate_binding_keys(filters, self.limits)

    def _index(self, sub: Subscription) -> None:
        if self._tags is not None:
            self._tags.add(sub, sub.filters)
        elif self._keys is not None:
            self._keys.add(sub, sub.filters)
        self._cache.clear()

    def subscribe(self, name: str, endpoint: object, filters: Iterable[str] = (),
                  strategy: NotifyStrategy = DEFAULT_STRATEGY) -> Subscription:
        """Add a subscription. ``filters`` are tags (tag topic) or binding keys (routing-key
        topic); none means it takes every message. The 501st is refused (L5)."""
        if name in self._subs:
            raise CMQError("M8", f"subscription {name!r} already exists on topic {self.name!r}", value=name)
        if len(self._subs) >= MAX_SUBSCRIPTIONS:
            raise LimitError("L5", f"topic {self.name!r} already has {MAX_SUBSCRIPTIONS} subscriptions",
                             value=len(self._subs) + 1, limit=MAX_SUBSCRIPTIONS)
        sub = Subscription(name, endpoint, self._check_filters(name, filters), NotifyStrategy(strategy))
        self._subs[name] = sub
        self._index(sub)
        return sub

    def add_filter(self, name: str, value: str) -> Subscription:
        """Add one tag or binding key (one AMQP binding key of the same pair, M8); L3/L4 past 5.
        Checks the count and the new value only, and indexes the new value only: a
        subscription given n filters one at a time costs O(n) in all (SE5)."""
        sub = self.subscription(name)
        if value in sub._filter_set:
            return sub
        tags = self._tags is not None
        err = filter_breach(len(sub._filter_set) + 1, value, self.limits, tags=tags, what=f"subscription {name!r}")
        if err is not None:
            raise err
        sub._filter_set[value] = None
        sub._filters = None
        if self._tags is not None:
            self._tags.add_tag(sub, value)
        elif self._keys is not None:
            self._keys.add_key(sub, value)
        self._cache.clear()
        return sub

    def remove_filter(self, name: str, value: str) -> Subscription:
        """Remove one tag or binding key. With none left the subscription takes every message:
        the gateway unsubscribes when the last AMQP binding of the pair goes."""
        sub = self.subscription(name)
        if value in sub._filter_set:
            del sub._filter_set[value]
            sub._filters = None
            if self._tags is not None:
                self._tags.remove_tag(sub, value)
            elif self._keys is not None:
                self._keys.remove_key(sub, value)
            self._cache.clear()
        return sub

    def unsubscribe(self, name: str) -> list[Event]:
        """Remove a subscription; messages that only it held are deleted (D2)."""
        sub = self._subs.pop(name, None)
        if sub is None:
            return []
        if self._tags is not None:
            self._tags.remove(sub)
        elif self._keys is not None:
            self._keys.remove(sub)
        self._cache.clear()
        events: list[Event] = []
        for entry in list(sub._open.values()):
            rec = entry.rec
            del rec.entries[name]
            rec.unresolved -= 1
            if rec.unresolved == 0:
                self._delete(rec, events)
        sub._open.clear()
        sub._parked.clear()
        sub._blocker = None
        return events

    # -- routing ---------------------------------------------------------------------------

    def match(self, tags: Sequence[str] = (), routing_key: str = "") -> tuple[Subscription, ...]:
        """The subscriptions that take a message with these tags (tag topic) or this routing
        key (routing-key topic). Validates L3/L4; results are cached until the subscriptions change."""
        if self._tags is not None:
            return self._route(tuple(tags))
        return self._route(routing_key)

    def _route(self, key: tuple[str, ...] | str) -> tuple[Subscription, ...]:
        subs = self._cache.get(key)
        if subs is None:
            if isinstance(key, str):
                assert self._keys is not None
                subs = self._keys.match(validate_key(key, limits=self.limits))
            else:
                assert self._tags is not None
                subs = self._tags.match(validate_tags(key, limits=self.limits))
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = subs
        return subs

    # -- publish ---------------------------------------------------------------------------

    def publish(self, msg: TopicMessage, now: float, attempt: Attempt) -> PublishResult:
        """D1: deliver ``msg`` to every subscription that takes it; retain it only if needed.

        Raises LimitError L6 (body above MaximumMessageSize), L3 (tags) or L4 (routing key);
        nothing is changed then (L6 only when ``limits.message_size``: PF3 reports it instead).
        ``attempt`` must not raise."""
        if msg.size > self._max_size and self.limits.message_size:
            raise LimitError("L6", f"message of {msg.size} bytes is larger than topic {self.name!r} "
                             f"MaximumMessageSize {self._max_size}", value=msg.size, limit=self._max_size)
        subs = self._route(msg.tags if self._tags is not None else msg.routing_key)
        if not subs:  # T2
            return PublishResult(msg.msg_id, subs, False, (Discarded(msg.msg_id, "no_match"),))
        slow: list[tuple[Subscription, object]] | None = None
        for sub in subs:
            if sub._blocker is not None:       # D6: waits behind the failing head
                outcome: object = _WAIT
            else:
                outcome = attempt(sub, msg)
                if outcome is True:
                    continue
            if slow is None:
                slow = []
            slow.append((sub, outcome))
        if slow is None:  # the hot path: all delivered, nothing kept (D2)
            return PublishResult(msg.msg_id, subs, False, None)
        return self._retain(msg, now, subs, slow)

    def retain_failed(self, msg: TopicMessage, now: float, subs: tuple[Subscription, ...],
                      failed: list[Subscription]) -> PublishResult:
        """The end of :meth:`publish` for a caller that made the attempts itself, in ``subs``
        order, after ``route``: the gateway's path for queue endpoints (gateway.broker.vhost),
        which calls this only when no subscription in ``subs`` was blocked (D6) and ``msg``
        is within MaximumMessageSize (L6). ``failed``: those whose attempt failed (D7), in
        order; the rest succeeded. The same retention and events as publish (D1, D2, D4)."""
        return self._retain(msg, now, subs, [(s, False) for s in failed])

    def _retain(self, msg: TopicMessage, now: float, subs: tuple[Subscription, ...],
                slow: list[tuple[Subscription, object]]) -> PublishResult:
        msg_id = msg.msg_id
        self._seq += 1
        rec = _Retained(msg, self._seq)
        events: list[Event] = [Routed(msg_id, tuple(s.name for s in subs))]
        waiting = {s.name for s, _ in slow}
        for sub in subs:
            if sub.name not in waiting:
                rec.entries[sub.name] = _Entry(rec, sub, DeliveryStatus.SUCCEEDED, 1, now)
                events.append(Delivered(msg_id, sub.name, 1))
        self._retained[msg_id] = rec
        heapq.heappush(self._expiry, (msg.published_at + TOPIC_LIFECYCLE_SECONDS, rec.seq, rec))
        for sub, outcome in slow:
            entry = _Entry(rec, sub, DeliveryStatus.PENDING, 0 if outcome is _WAIT else 1, now)
            rec.entries[sub.name] = entry
            rec.unresolved += 1
            sub._open[msg_id] = entry
            if outcome is _WAIT:
                if sub.strategy is NotifyStrategy.EXPONENTIAL_DECAY_RETRY:
                    sub._parked.append(entry)
                # BACKOFF_RETRY: stays in sub._open, the queue the head is taken from.
            elif outcome is None:
                entry.in_flight = True
            else:
                self._fail(entry, now, events)
        retained = self._retained.get(msg_id) is rec
        return PublishResult(msg_id, subs, retained, tuple(events))

    # -- outcomes --------------------------------------------------------------------------

    def report(self, msg_id: str, sub_name: str, ok: bool, now: float) -> list[Event]:
        """The outcome of an attempt that ``attempt`` answered None for, or that ``due`` handed
        out. An outcome for a message that has expired or left meanwhile is ignored."""
        rec = self._retained.get(msg_id)
        entry = rec.entries.get(sub_name) if rec is not None else None
        if entry is None or not entry.in_flight or self._subs.get(sub_name) is not entry.sub:
            return []
        events: list[Event] = []
        if ok:
            entry.in_flight = False
            entry.status = DeliveryStatus.SUCCEEDED
            events.append(Delivered(msg_id, sub_name, entry.attempts))
            self._close(entry, now, events)
        else:
            self._fail(entry, now, events)
        return events

    def _fail(self, entry: _Entry, now: float, events: list[Event]) -> None:
        """An attempt failed: schedule the next retry (D5/D6) or give up."""
        entry.in_flight = False
        sub = entry.sub
        msg_id = entry.rec.msg.msg_id
        wait = retry_wait(sub.strategy, entry.attempts, self._rng)
        if wait is None:
            entry.status = DeliveryStatus.GIVEN_UP
            events.append(GaveUp(msg_id, sub.name, entry.attempts, sub.strategy.value))
            self._close(entry, now, events)
            return
        entry.status = DeliveryStatus.RETRYING
        entry.next_at = now + wait
        events.append(RetryScheduled(msg_id, sub.name, entry.attempts + 1, entry.next_at, sub.strategy.value))
        if sub.strategy is NotifyStrategy.BACKOFF_RETRY:
            if sub._blocker is None:       # the first failure blocks
                sub._blocker = entry
            if sub._blocker is entry:      # others wait their turn in sub._open
                self._schedule(entry)
        else:
            if sub._blocker is None and entry.attempts >= 2:  # the second failure blocks
                sub._blocker = entry
            self._schedule(entry)

    def _close(self, entry: _Entry, now: float, events: list[Event]) -> None:
        """The entry succeeded or was given up: the subscription is done with this message."""
        sub = entry.sub
        rec = entry.rec
        sub._open.pop(rec.msg.msg_id, None)
        rec.unresolved -= 1
        if sub._blocker is entry:
            self._unblock(sub, now)
        if rec.unresolved == 0:  # D2
            self._delete(rec, events)

    def _delete(self, rec: _Retained, events: list[Event]) -> None:
        msg_id = rec.msg.msg_id
        if self._retained.get(msg_id) is rec:
            del self._retained[msg_id]
            events.append(Deleted(msg_id))

    def _unblock(self, sub: Subscription, now: float) -> None:
        sub._blocker = None
        if sub.strategy is NotifyStrategy.BACKOFF_RETRY:
            # Oldest first: the oldest waiting message becomes the head.
            for entry in sub._open.values():
                if not entry.in_flight:
                    sub._blocker = entry
                    if entry.status is DeliveryStatus.PENDING:
                        entry.next_at = now
                    self._schedule(entry)
                    break
        else:
            parked, sub._parked = sub._parked, []
            for entry in parked:
                if sub._open.get(entry.rec.msg.msg_id) is entry and not entry.in_flight:
                    # Those already due go out at once, in publish order.
                    entry.next_at = max(entry.next_at, now)
                    self._schedule(entry)

    def _schedule(self, entry: _Entry) -> None:
        self._tick += 1
        entry.tick = self._tick
        heapq.heappush(self._timers, (entry.next_at, entry.rec.seq, self._tick, entry))

    def _live(self, entry: _Entry, tick: int) -> bool:
        sub = entry.sub
        return (entry.tick == tick and not entry.in_flight
                and sub._open.get(entry.rec.msg.msg_id) is entry and self._subs.get(sub.name) is sub)

    # -- retries and expiry ----------------------------------------------------------------

    def _due(self, now: float) -> list[_Entry]:
        out: list[_Entry] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, tick, entry = heapq.heappop(timers)
            if not self._live(entry, tick):
                continue
            sub = entry.sub
            if sub._blocker is not None and sub._blocker is not entry:
                sub._parked.append(entry)  # D6: waits behind the blocker
                continue
            entry.in_flight = True
            entry.attempts += 1
            out.append(entry)
        return out

    def due(self, now: float) -> list[tuple[Subscription, TopicMessage, int]]:
        """Attempts due at ``now``, oldest first, as (subscription, message, attempt number).
        Each is in flight until the caller ``report``s its outcome. Blocked ones are held."""
        return [(e.sub, e.rec.msg, e.attempts) for e in self._due(now)]

    def deliver_due(self, now: float, attempt: Attempt) -> list[Event]:
        """``due`` + ``report`` in a loop with the publish-style ``attempt`` callback, until
        nothing more is due at ``now`` (a success may release the next message at once).
        Unlike a caller of ``due``, it sees each outcome before the next attempt, so an
        attempt whose subscription became blocked within the batch is held back (D6)."""
        events: list[Event] = []
        while batch := self._due(now):
            for entry in batch:
                sub = entry.sub
                if sub._blocker is not None and sub._blocker is not entry:
                    entry.in_flight = False      # not attempted after all: wait behind it
                    entry.attempts -= 1
                    sub._parked.append(entry)
                    continue
                msg = entry.rec.msg
                outcome = attempt(sub, msg)
                if (outcome is None and sub._blocker is None and entry.attempts >= 2
                        and sub.strategy is NotifyStrategy.EXPONENTIAL_DECAY_RETRY):
                    # D6: a retry whose outcome comes later (an HTTP endpoint) holds the rest
                    # of this subscription until it is known, exactly as a queue endpoint's
                    # second failure would; blocking must not depend on the endpoint's kind.
                    sub._blocker = entry
                elif outcome is not None:
                    events.extend(self.report(msg.msg_id, sub.name, outcome, now))
        return events

    def next_wakeup(self) -> float | None:
        """The earliest time at which ``due`` or ``expire`` has something to do."""
        timers = self._timers
        while timers and not self._live(timers[0][3], timers[0][2]):
            heapq.heappop(timers)
        expiry = self._expiry
        while expiry and self._retained.get(expiry[0][2].msg.msg_id) is not expiry[0][2]:
            heapq.heappop(expiry)
        times = [heap[0][0] for heap in (timers, expiry) if heap]
        return min(times) if times else None

    def expire(self, now: float) -> list[Event]:
        """D3: delete every message published 86,400 s or more before ``now``, for every
        subscription still waiting for it, whatever its retries."""
        events: list[Event] = []
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, _, rec = heapq.heappop(expiry)
            msg_id = rec.msg.msg_id
            if self._retained.get(msg_id) is not rec:
                continue
            for entry in rec.entries.values():
                if entry.status is DeliveryStatus.PENDING or entry.status is DeliveryStatus.RETRYING:
                    entry.status = DeliveryStatus.EXPIRED
                    entry.in_flight = False
                    sub = entry.sub
                    events.append(Discarded(msg_id, "expired", sub.name))
                    if sub._open.get(msg_id) is entry:
                        del sub._open[msg_id]
                    if sub._blocker is entry:
                        self._unblock(sub, now)
            rec.unresolved = 0
            self._delete(rec, events)
        return events

    # -- visibility (D4, D9) ---------------------------------------------------------------

    def waiting(self, sub_name: str) -> int:
        """D9: messages waiting for or in retry of delivery to this subscription."""
        return len(self.subscription(sub_name)._open)

    def blocker(self, sub_name: str) -> str | None:
        """The ID of the message the subscription is blocked behind, if any (D6)."""
        entry = self.subscription(sub_name)._blocker
        return entry.rec.msg.msg_id if entry is not None else None

    def head(self, sub_name: str) -> tuple[str, DeliveryState] | None:
        """D4/D6: the subscription's oldest unresolved message and its delivery state: the
        message it is blocked behind when there is one, else the oldest still waiting for
        (or in retry of) delivery; None when nothing is owed to it."""
        sub = self.subscription(sub_name)
        entry = sub._blocker
        if entry is None:
            entry = next(iter(sub._open.values()), None)
        if entry is None:
            return None
        return entry.rec.msg.msg_id, DeliveryState(
            entry.status, entry.attempts, entry.next_at if entry.status is DeliveryStatus.RETRYING else None,
            entry.in_flight)

    def state(self, msg_id: str) -> dict[str, DeliveryState]:
        """D4: subscription name -> delivery state of a retained message; {} once it has left."""
        rec = self._retained.get(msg_id)
        if rec is None:
            return {}
        return {name: DeliveryState(e.status, e.attempts,
                                    e.next_at if e.status is DeliveryStatus.RETRYING else None, e.in_flight)
                for name, e in rec.entries.items()}
