"""Long polling (SPEC Q5) as pure state.

A receive that finds no Active message and has a polling wait > 0 registers a waiter with a
deadline. Whenever messages may have become Active (after a send, a release, a tick), the
gateway calls :meth:`Waiters.serve`: the earliest registered waiters get them, first come
first served. At its deadline a waiter gets "empty" (:meth:`Waiters.expire`). A message
Active at the very instant of the deadline is too late: the deadline wins, so a wait of
``w`` seconds never lasts longer than ``w``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable

from semantics.queue import CmqQueue, Receipt

__all__ = ["Waiters"]


class Waiters:
    """The long-poll receives waiting on one queue; tokens are the caller's (any hashable)."""

    __slots__ = ("_deadline_of", "_fifo", "_heap", "_tiebreak")

    def __init__(self) -> None:
        self._deadline_of: dict[Hashable, float] = {}  # the live waiters
        self._fifo: deque[tuple[Hashable, float]] = deque()  # registration order, lazy
        self._heap: list[tuple[float, int, Hashable]] = []  # deadlines, lazy
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        return len(self._deadline_of)

    def __contains__(self, token: Hashable) -> bool:
        return token in self._deadline_of

    def add(self, token: Hashable, deadline: float) -> None:
        """Register a waiter until ``deadline`` (absolute time)."""
        if token in self._deadline_of:
            raise ValueError(f"waiter {token!r} is already waiting")
        self._deadline_of[token] = deadline
        self._fifo.append((token, deadline))
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), token))

    def cancel(self, token: Hashable) -> bool:
        """Forget a waiter (its consumer went away). False if it was not waiting."""
        return self._deadline_of.pop(token, None) is not None

    def receive_or_wait(self, queue: CmqQueue, token: Hashable, now: float,
                        wait: float | None = None) -> Receipt | None:
        """Q5: CMQ ReceiveMessage with long polling. A message now, or None and ``token``
        waits ``wait`` seconds (default: the queue's polling_wait_seconds; 0: no wait)."""
        if not self._deadline_of:
            receipt = queue.receive(now)
            if receipt is not None:
                return receipt
        # Earlier waiters go first: the new one queues behind them. Handing out messages that
        # are Active now is the caller's `serve`, which reports who got what; serving here
        # would take messages with nobody told (they would sit Inactive until their timeout).
        if wait is None:
            wait = float(queue.attributes.polling_wait_seconds)
        if wait > 0:
            self.add(token, now + wait)
        return None

    def serve(self, queue: CmqQueue, now: float,
              receive: Callable[[float], Receipt | None] | None = None) -> list[tuple[Hashable, Receipt]]:
        """Hand Active messages to the earliest waiters whose deadline is still ahead.
        ``receive`` replaces ``queue.receive`` (the gateway's x-delivery-limit receive)."""
        if receive is None:
            receive = queue.receive
        served: list[tuple[Hashable, Receipt]] = []
        fifo = self._fifo
        live = self._deadline_of
        while fifo:
            token, deadline = fifo[0]
            if live.get(token) != deadline:
                fifo.popleft()  # cancelled, served or expired earlier
                continue
            if deadline <= now:
                fifo.popleft()  # its wait is over: expire() reports it
                continue
            receipt = receive(now)
            if receipt is None:
                break
            fifo.popleft()
            del live[token]
            served.append((token, receipt))
        return served

    def expire(self, now: float) -> list[Hashable]:
        """The waiters whose deadline is due: they get an empty answer (Q5)."""
        expired: list[Hashable] = []
        heap = self._heap
        live = self._deadline_of
        while heap and heap[0][0] <= now:
            deadline, _, token = heapq.heappop(heap)
            if live.get(token) == deadline:
                del live[token]
                expired.append(token)
        return expired

    def tick(self, queue: CmqQueue, now: float, receive: Callable[[float], Receipt | None] | None = None,
             ) -> tuple[list[Hashable], list[tuple[Hashable, Receipt]]]:
        """``expire`` then ``serve``: (tokens that get empty, (token, receipt) pairs)."""
        expired = self.expire(now)
        return expired, self.serve(queue, now, receive)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live waiter, for the gateway's scheduler."""
        heap = self._heap
        live = self._deadline_of
        while heap and live.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
