"""The write end of the audit writer process's input (gateway.audit.writer), non-blocking.

The event loop writes to it in ``AuditLog.handoff`` before a delivery leaves (A5). A writer
process that waits for room on a full disk reads nothing, so that write can wait for as long
as the disk stays full. A blocking write could not be interrupted by anything, and a graceful
stop asked meanwhile would never run, because it runs on the blocked loop. Here every wait is a
``select`` that can be cut short: the hand-off gives up when a stop is asked (the caller
then does not write the delivery), and what it could not write stays queued, in order, for
the writer thread, which writes it once the stopped process reads again.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable

# How often a wait that may give up looks whether it should (a signal handler sets the flag;
# the select it interrupts is resumed by Python, so the look comes on the next turn of this).
GIVE_UP_POLL = 0.2
_IOV_MAX = 1024


class Pipe:
    """Bytes queued with ``write`` go out in order with ``flush``; one writer at a time (the
    AuditLog's send lock)."""

    __slots__ = ("fd", "_chunks")

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self._chunks: list[bytes | memoryview] = []

    def __len__(self) -> int:
        """Chunks not yet written."""
        return len(self._chunks)

    def write(self, data: bytes) -> None:
        self._chunks.append(data)

    def flush(self, give_up: Callable[[], bool] | None = None) -> bool:
        """Write every queued chunk; True once all are out. With ``give_up``, waits for room
        only until it returns True, then returns False with the rest still queued. OSError
        (the process is gone: EPIPE) is the caller's."""
        chunks = self._chunks
        fd = self.fd
        while chunks:
            try:
                n = os.writev(fd, chunks[:_IOV_MAX])
            except BlockingIOError:
                n = 0
            while n:  # drop what went out
                first = chunks[0]
                if len(first) <= n:
                    n -= len(first)
                    del chunks[0]
                else:
                    chunks[0] = memoryview(first)[n:]
                    n = 0
            if not chunks:
                break
            if give_up is not None and give_up():
                return False
            select.select((), (fd,), (), GIVE_UP_POLL if give_up is not None else None)
        return True
