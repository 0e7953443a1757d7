"""Restored messages held as compact records until they are delivered or inspected (issue 15).

A restart brings back every retained message of a queue at once; as Python objects
(QueueMessage, the gateway's payload, its ID string, a timer entry, a dict slot) each cost
~1 KB and ~10 us to build. A :class:`ColdRun` keeps the ones that come back plainly Active
(no delay, no per-message expiry, never received) as a few flat arrays in restore order:
~50 bytes each, built in bulk, and freed as whole buffers when the run is used up.

The queue (semantics.queue) treats a run as the Active messages with the lowest positions
and thaws them, oldest first, into ordinary messages when one is received, when its
deadline comes, or when an operation needs every message as an object. Because every
message of a run was restored at the same time with the same rules, its deadline is a
non-decreasing function of its enqueue time, so one deadline (the head's) is all the
timers need.

A :class:`LiveRun` does the same for messages published by the running process: when a
queue's backlog of Active messages grows long, the queue folds the older ones that are
plain (never received, no delay or expiry of their own, a payload its :class:`Freezer`
can rebuild) into one, keeping the head hot for the consumers about to take it and the
newest messages hot until their bodies are on disk. Such messages are not contiguous in
position or production order (others stay hot between them), so a live run keeps both
per message; their IDs are this process's (``msg-<prefix><16 hex digits>``), kept as the
counter alone and in increasing order, so one is found by bisection.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import Protocol

__all__ = ["ColdRun", "Freezer", "LiveRun", "Thaw"]

# (index in the run, msg_id, enqueue time, size, ref) -> the message's payload.
Thaw = Callable[[int, str, float, int, int], object]


class ColdRun:
    """Messages in enqueue order: their IDs, enqueue times, sizes and an opaque ``ref``
    per message from which ``thaw`` rebuilds the payload (the gateway: which properties
    and names the message shares with others)."""

    __slots__ = ("thaw", "ids", "enqueue_times", "sizes", "refs", "head", "cursor", "pos0", "seq0",
                 "visible_at")

    def __init__(self, thaw: Thaw) -> None:
        self.thaw = thaw
        # "\0id\0id\0...": IDs never hold NUL (the store record ends them with one), so an
        # ID is found with one bytes.find and the head's is cut at the next NUL.
        self.ids = bytearray(b"\x00")
        self.enqueue_times = array("d")
        self.sizes = array("Q")
        self.refs = array("Q")
        self.head = 0  # index of the oldest message not yet thawed
        self.cursor = 1  # where its ID starts in ``ids``
        # Set by the queue that takes the run: index i has position pos0 + i and production
        # order seq0 + i; every message became visible when the run was restored.
        self.pos0 = self.seq0 = 0
        self.visible_at = 0.0

    def append(self, msg_id: str, enqueue_time: float, size: int, ref: int) -> None:
        """Add the next message; enqueue times must not decrease (:meth:`ordered`)."""
        self.ids += msg_id.encode()
        self.ids.append(0)
        self.enqueue_times.append(enqueue_time)
        self.sizes.append(size)
        self.refs.append(ref)

    def __len__(self) -> int:
        """Messages not yet thawed."""
        return len(self.enqueue_times) - self.head

    def ordered(self) -> bool:
        # Pairs compared by map in C: a generator over indexes took 0.27 s for a restart's
        # 10^6 messages, a sixth of a start from the clean stop's checkpoint; this 0.11 s.
        t = self.enqueue_times
        return all(map(operator.le, t, itertools.islice(t, 1, None)))

    def sort(self) -> None:
        """Put the messages in enqueue order (stable): the journal's order is that order
        unless the clock stepped back."""
        ids = bytes(self.ids[1:-1]).split(b"\x00") if len(self.enqueue_times) else []
        order = sorted(range(len(self.enqueue_times)), key=self.enqueue_times.__getitem__)
        self.ids = bytearray(b"\x00" + b"".join(ids[i] + b"\x00" for i in order))
        self.enqueue_times = array("d", (self.enqueue_times[i] for i in order))
        self.sizes = array("Q", (self.sizes[i] for i in order))
        self.refs = array("Q", (self.refs[i] for i in order))

    def head_enqueue_time(self) -> float:
        return self.enqueue_times[self.head]

    def pop(self) -> tuple[int, str, float, int, object]:
        """Thaw the head: (its index, msg_id, enqueue time, size, payload)."""
        i = self.head
        end = self.ids.index(0, self.cursor)
        msg_id = self.ids[self.cursor:end].decode()
        self.cursor = end + 1
        self.head = i + 1
        enq = self.enqueue_times[i]
        size = self.sizes[i]
        return i, msg_id, enq, size, self.thaw(i, msg_id, enq, size, self.refs[i])

    def contains(self, msg_id: str) -> bool:
        """Whether a message not yet thawed has this ID (a scan: for rare paths)."""
        return self.ids.find(b"\x00" + msg_id.encode() + b"\x00", self.cursor - 1) >= 0

    # The queue's view of a run (shared with LiveRun).

    def head_pos(self) -> int:
        return self.pos0 + self.head

    def head_seq(self) -> int:
        return self.seq0 + self.head

    def last(self) -> tuple[int, float]:
        """(position, enqueue time) of the newest message."""
        n = len(self.enqueue_times)
        return self.pos0 + n - 1, self.enqueue_times[n - 1]

    def last_seq(self) -> int:
        """Production order of the newest message."""
        return self.seq0 + len(self.enqueue_times) - 1

    def take(self) -> tuple[str, float, int, object, int, int, float]:
        """Thaw the head: (msg_id, enqueue time, size, payload, position, seq, visible since)."""
        i, msg_id, enq, size, payload = self.pop()
        return msg_id, enq, size, payload, self.pos0 + i, self.seq0 + i, self.visible_at


class Freezer(Protocol):
    """What a queue folding its backlog needs from the owner of the payloads."""

    def freeze(self, msg_id: str, payload: object, enqueue_time: float) -> int:
        """A ref from which ``thaw`` rebuilds ``payload`` (which is then let go), or -1 to
        keep the message as it is."""

    def thaw(self, index: int, msg_id: str, enqueue_time: float, size: int, ref: int) -> object:
        """The payload again (``index`` is meaningless for a live run)."""


class LiveRun:
    """Messages folded by a running queue, in position order: per message its ID counter,
    enqueue time, size, the freezer's ref, position and production order (38 bytes: a size
    in 4 and a ref in 2, which the gateway's never pass; a larger one widens that array)."""

    __slots__ = ("freezer", "prefix", "counters", "enqueue_times", "sizes", "refs", "poss", "seqs", "head")

    def __init__(self, freezer: Freezer, prefix: str) -> None:
        self.freezer = freezer
        self.prefix = prefix  # "msg-" and this process's prefix
        self.counters = array("Q")
        self.enqueue_times = array("d")
        # 4 + 2 bytes, not 8 + 8: 10 B of the ~100 a message folded costs at 10^6 (issue 31 aim
        # 3). The gateway's refs are under MAX_SHARED (4,096), its sizes under 4 GiB.
        self.sizes = array("I")
        self.refs = array("H")
        self.poss = array("q")
        self.seqs = array("q")
        self.head = 0

    def append(self, counter: int, enqueue_time: float, size: int, ref: int, pos: int, seq: int) -> None:
        """Add the next message: counter, position and enqueue time must not decrease."""
        self.counters.append(counter)
        self.enqueue_times.append(enqueue_time)
        try:
            self.sizes.append(size)
        except OverflowError:
            self.sizes = array("Q", self.sizes)
            self.sizes.append(size)
        try:
            self.refs.append(ref)
        except OverflowError:
            self.refs = array("Q", self.refs)
            self.refs.append(ref)
        self.poss.append(pos)
        self.seqs.append(seq)

    def __len__(self) -> int:
        return len(self.poss) - self.head

    def head_enqueue_time(self) -> float:
        return self.enqueue_times[self.head]

    def head_pos(self) -> int:
        return self.poss[self.head]

    def head_seq(self) -> int:
        return self.seqs[self.head]

    def last(self) -> tuple[int, float]:
        return self.poss[-1], self.enqueue_times[-1]

    def last_seq(self) -> int:
        return self.seqs[-1]

    def take(self) -> tuple[str, float, int, object, int, int, float]:
        i = self.head
        self.head = i + 1
        msg_id = f"{self.prefix}{self.counters[i]:016x}"
        enq = self.enqueue_times[i]
        size = self.sizes[i]
        payload = self.freezer.thaw(i, msg_id, enq, size, self.refs[i])
        return msg_id, enq, size, payload, self.poss[i], self.seqs[i], enq

    def contains(self, msg_id: str) -> bool:
        prefix = self.prefix
        if len(msg_id) != len(prefix) + 16 or not msg_id.startswith(prefix):
            return False
        try:
            counter = int(msg_id[len(prefix):], 16)
        except ValueError:
            return False
        i = bisect_left(self.counters, counter, self.head)
        return i < len(self.counters) and self.counters[i] == counter
