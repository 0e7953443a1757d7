"""The pipe to the audit writer process, and the thread that keeps it fed (A5, issue 27).

Why: ``AuditLog.handoff()`` runs on the event loop before every write to a client, and must
leave every record emitted so far out of this process (in the pipe) when it returns. It used
to marshal everything queued since the last call and write it with a blocking write: after a
flood's turn ~0.5-1 ms on the loop, in front of whatever reply came next, and the loop stood
still whenever the writer process was a full pipe behind.

Now a pump thread hands records over as they are emitted (``emit()`` wakes it once the queue
holds ``PUMP_AT`` records), in chunks, releasing the GIL at each write, so a hand-off on the
loop finds only what was emitted since the pump last ran. The pipe's write end is
non-blocking: a write finds room (the pipe is made as large as the kernel allows: 8 MiB
with CAP_SYS_RESOURCE, else 1 MiB) or waits on ``poll`` for it, and says that it waited, so that the rare case is
counted (``Stats.waits``) instead of hidden in a blocking ``write()``. Waiting is the one
behaviour that keeps A5's promise when the writer process is a full pipe behind: what a
delivery depends on cannot be out of this process any sooner.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable

__all__ = ["PIPE_BYTES", "PUMP_AT", "PUMP_CHUNK", "Pump", "Stats", "prepare", "write_all"]

# Queued records that wake the pump: small enough that a hand-off after a long event-loop
# turn finds little left, large enough that the pump takes the GIL once per few hundred records.
PUMP_AT = 256
# Records the pump marshals under the send lock at a time (~0.3 ms of GIL at ~0.15 us each):
# between chunks the loop can take the lock and hand over the rest itself.
PUMP_CHUNK = 2048
# Linux fcntl F_SETPIPE_SZ. The pipe is asked for PIPE_BYTES (~150,000 records, a second or
# two of a flood's records while the writer process gets no CPU on a loaded machine), which a
# process with CAP_SYS_RESOURCE (root) gets; else for /proc/sys/fs/pipe-max-size (1 MiB by
# default, ~18,000 records), the most an unprivileged process may ask for. The default 64 KiB
# held a tenth of one batch.
_F_SETPIPE_SZ = 1031
PIPE_BYTES = 8 * 1024 * 1024
_PIPE_MAX = "/proc/sys/fs/pipe-max-size"


class Stats:
    """What the hand-offs cost (read by scripts/bench_audit.py and the tests)."""

    __slots__ = ("handoffs", "pipe_bytes", "pumped", "records", "seconds", "wait_seconds", "waits")

    def __init__(self) -> None:
        self.pipe_bytes = 0  # the pipe's size (prepare)
        self.handoffs = 0  # hand-offs on the loop that found records to send
        self.records = 0  # records those sent
        self.seconds = 0.0  # time they took
        self.pumped = 0  # records the pump thread sent
        self.waits = 0  # writes (any thread) that found the pipe full and waited for room
        self.wait_seconds = 0.0


def prepare(fd: int) -> int:
    """Make ``fd`` (the pipe's write end) non-blocking and as large as allowed; its size (0:
    unknown, not Linux)."""
    os.set_blocking(fd, False)
    try:
        import fcntl
    except ImportError:
        return 0
    with contextlib.suppress(OSError):  # without CAP_SYS_RESOURCE: at most pipe-max-size
        return int(fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES))
    with contextlib.suppress(OSError, ValueError), open(_PIPE_MAX) as f:
        return int(fcntl.fcntl(fd, _F_SETPIPE_SZ, int(f.read())))
    return 0


def _gil_held_write() -> Callable[[int, bytes], int] | None:
    """libc's write(2) called with the GIL held (ctypes.PyDLL): os.write releases the GIL, and
    on a busy gateway another thread (the pump, the writer thread, the store's sync thread)
    then takes it, so the event loop got it back only after that thread's switch interval
    (5 ms): a hand-off's wall time was 20-30 times its CPU time (scripts/bench_audit.py
    handoff). A write to a non-blocking pipe never sleeps, so holding the GIL costs nobody."""
    try:
        import ctypes
        import errno

        libc = ctypes.PyDLL(None, use_errno=True)
        raw = libc.write
    except (OSError, AttributeError, ImportError):
        return None
    raw.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    raw.restype = ctypes.c_ssize_t
    get_errno = ctypes.get_errno

    def write(fd: int, data: bytes) -> int:
        n = int(raw(fd, data, len(data)))
        if n >= 0:
            return n
        err = get_errno()
        if err == errno.EAGAIN:
            return 0
        if err == errno.EINTR:
            return 0
        raise OSError(err, os.strerror(err))  # EPIPE: BrokenPipeError, as os.write raises
    return write


_write_holding_gil = _gil_held_write()


def write_all(fd: int, data: bytes, stats: Stats, keep_gil: bool = False) -> None:
    """Write all of ``data`` to the non-blocking ``fd``, waiting for room only when the pipe
    is full (counted in ``stats``; the wait releases the GIL). ``keep_gil``: the first write
    keeps the GIL (the event loop's hand-off). Raises BrokenPipeError when the reader is gone."""
    view = memoryview(data)
    try:
        n = _write_holding_gil(fd, data) if keep_gil and _write_holding_gil else os.write(fd, view)
    except BlockingIOError:
        n = 0
    if n == len(view):
        return
    import time

    start = time.perf_counter()
    view = view[n:]
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view:
        poller.poll(1000)
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
    stats.waits += 1
    stats.wait_seconds += time.perf_counter() - start


class Pump:
    """A daemon thread that runs ``send()`` whenever ``wake()`` is called, until ``stop()``."""

    def __init__(self, send: Callable[[], None]) -> None:
        self._send = send
        self._event = threading.Event()
        self.wake = self._event.set
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="audit-pump", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait, clear = self._event.wait, self._event.clear
        while True:
            wait()
            clear()
            if self._stopping:
                return
            self._send()

    def stop(self) -> None:
        self._stopping = True
        self._event.set()
        self._thread.join()
