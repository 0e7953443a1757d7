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
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

__all__ = ["ColdRun", "Thaw"]

# (index in the run, msg_id, enqueue time, size, ref) -> the message's payload.
Thaw = Callable[[int, str, float, int, int], object]


class ColdRun:
    """Messages in enqueue order: their IDs, enqueue times, sizes and an opaque ``ref``
    per message from which ``thaw`` rebuilds the payload (the gateway: which properties
    and names the message shares with others)."""

    __slots__ = ("thaw", "ids", "enqueue_times", "sizes", "refs", "head", "cursor")

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
        t = self.enqueue_times
        return all(t[i] <= t[i + 1] for i in range(len(t) - 1))

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
