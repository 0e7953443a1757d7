"""One scheduler for every timed thing in the broker.

Queues (visibility expiry, delay end, TTL, retention, dead letters) and topics (retries,
lifecycle expiry, D3/D5/D6) each expose ``next_wakeup() -> float | None`` and a method to run
what is due. Rather than one task or timer per message, the broker keeps one heap of
``(deadline, seq, owner)`` and a single asyncio timer armed for the earliest deadline. An owner
is rescheduled by pushing a new entry; older entries for it are skipped when popped (lazy
deletion), so rescheduling is O(log n) and never scans the heap.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

from semantics.clock import Clock

__all__ = ["Scheduler", "Timed"]


class Timed(Protocol):
    """Something the scheduler drives."""

    def next_wakeup(self) -> float | None: ...

    def run_due(self, now: float) -> None: ...


class Scheduler:
    """A heap of deadlines and one timer for the earliest of them.

    ``loop`` may be None (tests with a ManualClock drive it through :meth:`run_due`); with a
    loop, the timer is computed from ``clock.now()`` so a ManualClock never fires it by itself.
    """

    def __init__(self, clock: Clock, loop: asyncio.AbstractEventLoop | None = None,
                 on_ran: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self._loop = loop
        self._heap: list[tuple[float, int, Timed]] = []
        # owner -> the deadline of its live heap entry; anything else in the heap is stale.
        self._deadline: dict[Timed, float] = {}
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._on_ran = on_ran
        self._closed = False

    def __len__(self) -> int:
        return len(self._deadline)

    def reschedule(self, owner: Timed) -> None:
        """Ask ``owner`` when it next needs to run and keep that deadline (None: never)."""
        when = owner.next_wakeup()
        old = self._deadline.get(owner)
        if when is None:
            if old is not None:
                del self._deadline[owner]
            return
        if old is not None and old <= when:
            # A deadline may be early, never late: the earlier entry stays, and when it fires
            # the owner finds nothing due and is asked again. Otherwise every ack (the acked
            # message's visibility end was the queue's next deadline) pushed an entry and
            # cancelled and re-created the loop's timer (docs/BENCHMARKS.md).
            return
        self._deadline[owner] = when
        heapq.heappush(self._heap, (when, next(self._seq), owner))
        self._arm()

    def reschedule_after(self, owner: Timed, earliest: float) -> None:
        """``reschedule``, told that ``owner`` needs nothing before ``earliest`` (a lower bound
        of its next_wakeup): when its deadline here is at or before that, reschedule would
        keep it, and the owner is not asked (a queue's next_wakeup is two frames and a scan
        of its timer lanes, after every dispatch)."""
        old = self._deadline.get(owner)
        if old is None or old > earliest:
            self.reschedule(owner)

    def forget(self, owner: Timed) -> None:
        self._deadline.pop(owner, None)

    def next_deadline(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def run_due(self, now: float | None = None) -> int:
        """Run every owner whose deadline is at or before ``now``; returns how many ran."""
        if now is None:
            now = self._clock.now()
        ran = 0
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                break
            _, _, owner = heapq.heappop(self._heap)
            del self._deadline[owner]
            owner.run_due(now)
            ran += 1
            self.reschedule(owner)
        self._arm()
        return ran

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._deadline.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)

    def _arm(self) -> None:
        if self._loop is None or self._closed:
            return
        earliest = self.next_deadline()
        armed = self._timer_at
        if earliest == armed or (earliest is not None and armed is not None
                                 and self._clock.now() < armed <= earliest):
            # The armed timer fires first; _fire re-arms for what is due then. One that is
            # already overdue by the clock is replaced (a ManualClock moves without it firing).
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = earliest
        if earliest is not None:
            delay = max(0.0, earliest - self._clock.now())
            self._timer = self._loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.run_due() and self._on_ran is not None:
            self._on_ran()
        self._arm()
