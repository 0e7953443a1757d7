"""The audit writer process's input (gateway.audit.writer): the write end, non-blocking
(``Pipe``), and the read end as the process reads it (``Reader``, below).

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


# The writer process's side. A blocked reader is woken by every write to its pipe, and the
# event loop writes a message's records just before its delivery (A5): the wake-up cost the
# loop ~10-20 us inside that write, and the process it woke took a core just as the consumer
# needed one (scenario 7: p50 0.20 against 0.15 ms with the hand-off's records left to the
# writer's cycle instead). So while records come, the process reads them on its own clock,
# every POLL_SECONDS, and the parent rings a doorbell (a second pipe) only when it waits for
# an answer; after IDLE_POLLS empty looks it waits on the pipe itself again, so an idle
# gateway's writer sleeps. The records are in the pipe either way: a kill -9 of the gateway
# takes none of them (the process reads to the end of its input before it exits).
POLL_SECONDS = 0.005
IDLE_POLLS = 200  # a second of looks: a trickle of a few messages a second keeps it on its clock
_READ_BYTES = 1 << 20


def readable(fds: tuple[int, ...], timeout: float | None) -> list[int]:
    """Which of ``fds`` have input (or their writer gone), waiting up to ``timeout`` seconds
    (None: until one has). poll, not select: a descriptor may be past FD_SETSIZE."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000)]


class Reader:
    """The read end for the writer process: ``read(n)`` as a blocking binary stream's (fewer
    bytes only at the end of input). ``doorbell``: the read end of the parent's doorbell pipe;
    None reads as a plain blocking pipe."""

    __slots__ = ("fd", "doorbell", "_buf", "_eof", "_idle")

    def __init__(self, fd: int, doorbell: int | None) -> None:
        self.fd = fd
        self.doorbell = doorbell
        self._buf = bytearray()
        self._eof = False
        self._idle = 0
        if doorbell is not None:
            os.set_blocking(fd, False)
            os.set_blocking(doorbell, False)

    def read(self, n: int) -> bytes:
        buf = self._buf
        while len(buf) < n and not self._eof:
            self._fill()
        out = bytes(buf[:n])
        del buf[:n]
        return out

    def _fill(self) -> None:
        try:
            chunk = os.read(self.fd, _READ_BYTES)
        except BlockingIOError:
            self._wait()
            return
        if chunk:
            self._buf += chunk
            self._idle = 0
        else:
            self._eof = True

    def _wait(self) -> None:
        bell = self.doorbell
        if bell is None:  # the doorbell's writer is gone: a plain blocking read from here on
            os.set_blocking(self.fd, True)
            return
        self._idle += 1
        if self._idle <= IDLE_POLLS:
            ready = readable((bell,), POLL_SECONDS)
        else:
            ready = readable((bell, self.fd), None)
        if bell in ready:
            try:
                if not os.read(bell, 4096):
                    self.doorbell = None
            except BlockingIOError:
                pass
