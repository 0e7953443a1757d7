"""The memory the broker holds (W5), counted as it is taken and given back.

Process RSS is no measure of it: CPython keeps the memory freed objects used, so a queue
that drained left RSS where it was and the memory alarm never cleared. What the alarm
compares with ``memory_high_watermark`` instead is what the broker holds for its clients:

* messages: body + raw properties + a fixed estimate of the objects that carry one message
  through queues and topics (``MESSAGE_OVERHEAD``), added when the broker's ``Message`` is
  made and taken off when the last queue, topic or delivery lets go of it (``__del__``: a
  message routed to ten queues is one object, counted once);
* partial bodies: the body frames of contents still being assembled, per connection, as
  they arrive (a client that sends a huge content header and trickles its body is held
  memory long before it is a message);
* the store's map (journalled state: a persistent message in a durable queue is there once
  more, encoded), which the store keeps counted for compaction anyway (``live_bytes``);
* unsent output: the sockets' write buffers, summed by the server's tick.

The counters are process-wide, as the memory they stand for is: two gateways in one test
process add up, like their RSS would.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

__all__ = ["HELD", "MESSAGE_OVERHEAD", "HeldMemory", "MemoryReturn"]

log = logging.getLogger("cmq_gateway.memory")

# Bytes of Python objects per queued message besides its body and properties: the Message,
# the queue's message record, its ID and the index entries (tracemalloc: 690 bytes per
# one-byte transient message in a queue, 5x10^4 messages, CPython 3.12).
MESSAGE_OVERHEAD = 700


class HeldMemory:
    """``messages`` and ``partial`` bytes held now; the server adds the write buffers."""

    __slots__ = ("messages", "partial")

    def __init__(self) -> None:
        self.messages = 0
        self.partial = 0

    @property
    def total(self) -> int:
        return self.messages + self.partial


HELD = HeldMemory()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS: nothing to call)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


class MemoryReturn:
    """Gives the memory a drained backlog used back to the OS.

    Freed bodies and dict tables go back to glibc's heap, which keeps them: after 10^5
    1 KB persistent messages drained, RSS stayed at over twice its idle size (issue 15).
    ``malloc_trim(0)`` hands the free pages in that heap back (measured in
    docs/BENCHMARKS.md). It walks the heap, so it runs once per drain: when what the broker
    holds falls under a quarter of the peak since the last time, and that peak was large."""

    MIN_PEAK = 64 << 20

    def __init__(self) -> None:
        self.peak = 0
        self._trim = _malloc_trim()

    def tick(self, held: int) -> bool:
        """Called with the held bytes now and then; True when it gave memory back."""
        if held > self.peak:
            self.peak = held
            return False
        if self.peak < self.MIN_PEAK or held * 4 >= self.peak:
            return False
        self.peak = held
        if self._trim is None:
            return False
        self._trim(0)
        return True
