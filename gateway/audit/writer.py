"""The audit log writer (A1–A3): ``emit()`` on the event loop, JSON and disk on one thread.

Theory of operation
-------------------
``emit()`` appends one tuple ``(time, event, vhost, fields)`` to a ``deque`` (thread-safe, no
lock) and returns (``emit_row()`` appends ``(time, row id, vhost, values)`` for the broker's
per-message records, gateway.audit.rows): it never formats, never touches a file and never
waits.  One writer thread wakes every ``flush_interval`` (or early when the queue passes ``wake_at``), pops what is
queued, formats it (``record.format_line``) and writes it with one ``write()`` per file, then
flushes so that a tailing reader sees whole lines.

Files: the first record opens ``dt=…/hour=…/.audit-<start>-<seq>.jsonl.open``; the file is
closed (fsync, then renamed to ``audit-<start>-<seq>.jsonl``) when the next record would take
it past ``rotate_bytes``, when it has been open ``rotate_seconds``, when a record belongs to
another UTC hour (the folder is the hour, so every record in a folder is of that hour and
pruning by folder is exact), and at ``close()``.  A closed file is never opened again.  A crash
leaves one ``.open`` file whose last line may be torn; the next ``AuditLog`` on the directory
renames it closed as it is (readers skip a torn last line).

Durability (A5): the lines are flushed to the OS every cycle but fsynced only when a file is
closed, or when the broker's group commit asks: ``sync_mark()`` (on the event loop, next to
the store's last LSN) makes the next cycle fsync the open file after writing everything
emitted before the mark, and ``wait_synced(mark)`` (on the store's sync thread) returns once
it has; the broker's confirms wait for both (gateway.broker.broker, ``durable_lsn``).
Deliveries do not wait: ``handoff()`` (on the event loop, before a transport writes to a
client) hands what is queued to the writer process at once, which outlives a kill -9 of the
gateway and writes it (gateway.audit.child, gateway.audit.dirlock).

Counting: the writer counts every record it is handed (``counts``, keyed by
``gateway.audit.counting.count_key``), the ones the ``events`` filter leaves out of the files
included, so /metrics counts exactly what the broker recorded without any work on the event
loop. In process mode the child counts and answers each ``F`` with what changed; ``flush()``
therefore makes ``counts`` exact up to the moment it was called.

A full disk (A5): a write, fsync or file creation that fails for want of room (ENOSPC,
EDQUOT) is retried, with a warning, until there is room: records are never dropped for a full
disk, since a confirm or a delivery may already rest on them. The writer falls behind meanwhile
(in process mode its pipe fills, and a hand-off waits for it). Only a graceful stop gives up:
``close()`` makes the next failure final, the records it could not write are counted in
``dropped`` and logged, as the store gives up its own failed write at a stop (nothing waiting
on them was confirmed). A kill -9 of the gateway leaves the writer process waiting for room.

Bounded memory: past ``max_pending`` queued records ``emit()`` drops the record, counts it in
``dropped`` (for metrics) and the writer then writes an ``audit_dropped`` record carrying the
count, and logs a warning: records may be shed under overload, never silently.

Retention: every ``retention_check_seconds`` the writer deletes closed files whose mtime is
older than ``retention_hours`` and removes folders left empty.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import marshal
import operator
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FunctionType
from typing import IO, Any

from gateway.audit import fastformat, layout
from gateway.audit.batch import format_run, second_runs
from gateway.audit.counting import count_key
from gateway.audit.dirlock import AuditDirLock
from gateway.audit.pipe import GIVE_UP_POLL, Pipe
from gateway.audit.record import MICRO_Z, MILLI, format_line, format_ts
from gateway.audit.rows import ROWS, Row

__all__ = ["AuditLog", "NullAudit"]

log = logging.getLogger(__name__)

# (time, event, vhost, fields) or, for a row, (time, row id, vhost, values).
_Item = tuple[float, Any, str, Any]
_time_of = operator.itemgetter(0)
_TS_AT = len('{"v":2,"ts":"')  # where a line's ts starts (v first, then ts; one digit)
# Records formatted between two releases of the GIL by the writer thread (~0.5 ms of work).
_CHUNK = 200
# Bytes of lines the C formatter makes a call (gateway.audit.fastformat).
_RUN_BYTES = 1024 * 1024
# Records per message to the writer process. Large: each message costs this thread two
# takes of the GIL from the busy event loop (up to a switch interval each), so few large
# messages move more records per second than many small ones.
_BATCH = 16384
# Linux fcntl F_SETPIPE_SZ: a pipe that holds a whole batch, so a write rarely waits for the
# child to read (the default 64 KiB held a tenth of one).
_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1024 * 1024  # /proc/sys/fs/pipe-max-size, the default limit without privileges
# A message to the writer process (gateway.audit.child): kind, payload length.
CHILD_HEADER = struct.Struct(">cI")
# close() tells the writer process with this signal that a full disk's write now fails for
# good (it may be waiting for room, reading nothing, so a message on its pipe would not do).
STOP_SIGNAL = signal.SIGUSR1
# The writer process's doorbell (gateway.audit.pipe.Reader): the descriptor of its read end,
# in the child's environment. A byte on it says "an answer is awaited".
DOORBELL_ENV = "CMQ_AUDIT_DOORBELL_FD"
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


class NullAudit:
    """An audit log that keeps nothing (audit disabled, and most unit tests)."""

    __slots__ = ()
    dropped = 0
    written = 0

    def emit(self, event: str, vhost: str, **fields: Any) -> None:
        return None

    def emit_fields(self, event: str, vhost: str, fields: dict[str, Any]) -> None:
        return None

    def emit_row(self, row: Row, vhost: str, values: tuple[Any, ...]) -> None:
        return None

    def emit_values(self, row: Row, vhost: str, *values: Any) -> None:
        return None

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def handoff(self) -> bool:
        return True

    def ask_stop(self) -> None:  # nothing ever waits for a writer here
        return None

    def close(self) -> None:
        return None


class AuditLog:
    def __init__(
        self,
        directory: str,
        *,
        rotate_bytes: int = 64 * 1024 * 1024,
        rotate_seconds: float = 3600.0,
        retention_hours: float = 168.0,
        events: Iterable[str] | None = None,
        max_pending: int = 200_000,
        flush_interval: float = 0.1,
        retention_check_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
        process: bool | None = None,
        lock: bool | AuditDirLock = True,
        _thread: bool = True,
    ) -> None:
        """``process``: format and write in a child process (gateway.audit.child) instead of
        this process's writer thread; None means yes unless a ``clock`` is given (a test's
        clock cannot drive another process's file rotation). ``lock``: take the directory's
        lock (A7, gateway.audit.dirlock) before touching anything in it, and hold it until
        ``close()``; raises AuditDirLocked when another writer holds it. A lock already
        taken (the gateway claims its directories first) is held the same way. Only the
        writer process, whose parent holds the lock for it, passes False."""
        if rotate_bytes < 1:
            raise ValueError("rotate_bytes must be positive")
        self.directory = os.path.abspath(directory)
        self._lock = lock if isinstance(lock, AuditDirLock) else AuditDirLock(self.directory) if lock else None
        try:
            self._setup(rotate_bytes, rotate_seconds, retention_hours, events, max_pending, flush_interval,
                        retention_check_seconds, clock, process, _thread)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def _setup(self, rotate_bytes: int, rotate_seconds: float, retention_hours: float,
               events: Iterable[str] | None, max_pending: int, flush_interval: float,
               retention_check_seconds: float, clock: Callable[[], float], process: bool | None,
               _thread: bool) -> None:
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.retention_hours = retention_hours
        self.events: frozenset[str] | None = None if events is None else frozenset(events)
        self.max_pending = max_pending
        self._flush_interval = flush_interval
        self._retention_every = retention_check_seconds
        self._clock = clock

        # Exposed for metrics.
        self.dropped = 0  # records shed by emit() (queue full) or lost to a write error
        self.written = 0  # records written
        self.files_closed = 0
        self.files_deleted = 0
        # Records handed to the writer by count key (see the module doc); the writer thread
        # adds to it, readers take ``list(counts.items())`` (atomic under the GIL).
        self.counts: dict[tuple[Any, ...], int] = {}

        self._queue: collections.deque[_Item] = collections.deque()
        self._wake_at = max(1, max_pending // 8)
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._cycles = 0
        # A flush waits for the cycle numbered _flush_to; the writer starts the next cycle at
        # once while that one is not done, rather than after its flush_interval nap (which was
        # every management call's and every /metrics scrape's 100 ms).
        self._flush_to = 0
        # A5: the store's group commit asks for records on disk (written and fsynced) up to a
        # cycle (sync_mark); _synced is the last cycle that did so.
        self._sync_to = 0
        self._synced = 0
        self._busy = False  # a cycle is under way (set under _cond)
        self._stopping = False
        self._closed = False
        self._drop_lock = threading.Lock()
        self._dropped_reported = 0

        # Set by close() (or the writer process's stop signal): a full disk's write fails for
        # good instead of waiting for room.
        self.space_final = False
        self._file: IO[bytes] | None = None
        self._file_key = ""  # closed path of the open file
        self._file_synced = False  # its folder fsynced since it was opened
        self._file_unsynced = False  # lines written since the last fsync
        self._file_folder = ""
        self._file_size = 0
        self._file_opened_at = 0.0
        self._seq = 0
        self._last_retention = float("-inf")

        os.makedirs(self.directory, exist_ok=True)
        self._child: subprocess.Popen[bytes] | None = None
        self._bell = -1  # the write end of the child's doorbell (_ring)
        self._pipe: Pipe | None = None  # its input (gateway.audit.pipe), under _send_lock
        self._stop_asked = False  # ask_stop(): a hand-off stops waiting for a stalled process
        self._child_dropped = 0
        # Sent to the child, not yet confirmed written: items, or records packed (bytes).
        self._unacked: list[Any] = []
        # The pipe to the child has two writers, this thread and handoff() on the event loop:
        # each takes records off the queue and writes them under this lock, so they reach
        # the child in the order they were emitted.
        self._send_lock = threading.Lock()
        if process is None:
            process = clock is time.time and _thread
        if process:
            self._child = self._spawn()
            assert self._child.stdin is not None
            self._pipe = Pipe(self._child.stdin.fileno())
        else:
            self._recover()
        # Process mode: the loop's records packed in C as they are emitted (fastformat.Records,
        # stamped with time.time's clock), handed over as they are; None: tuples in _queue.
        self._records: Any = None
        if process and clock is time.time and fastformat.Records is not None:
            self._records = fastformat.Records(_plain)
        self._shares_gil = _thread  # formatting here holds the GIL the event loop needs
        # The rows' formatter in C (None: the Python path; tests set it to compare the two).
        self._format_rows = fastformat.format_rows
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        if _thread:
            self._thread.start()
        self.emit, self.emit_fields, self.emit_row = self._fast_emit()  # type: ignore[method-assign]
        if self._records is not None:  # the Records' own, in C, under emit_row's checks
            self.emit_values = self._records.emit_values  # type: ignore[method-assign]

    def _fast_emit(self) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
        """``emit``, ``emit_fields`` and ``emit_row`` as closures over the queue, the clock and
        the limits: the broker calls them 4-5 times a message on the event loop, and the
        attribute lookups of a method were a sixth of the cost (1.70 -> 1.46 us a record with
        the broker's wrapper, measured)."""
        q = self._queue
        append = q.append
        clock = self._clock
        max_pending = self.max_pending
        wake_at = self._wake_at
        wake = self._wake.set
        recs = self._records
        if recs is not None:
            return self._packed_emit(recs)

        # The ``events`` filter is applied by the writer, which counts every record first.
        # emit_fields and emit_row differ in what they queue (an event name or a row id); each
        # keeps the queueing inline, as a shared helper would be one more call a record.
        def emit_fields(event: str, vhost: str, fields: dict[str, Any]) -> None:
            n = len(q)
            if n >= max_pending or self._closed:
                return self._shed()
            append((clock(), event, vhost, fields))
            if n == wake_at:
                wake()

        def emit_row(row: Row, vhost: str, values: tuple[Any, ...]) -> None:
            n = len(q)
            if n >= max_pending or self._closed:
                return self._shed()
            append((clock(), row.id, vhost, values))
            if n == wake_at:
                wake()

        return _emitters(emit_fields, emit_row)

    def _packed_emit(self, recs: Any) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
        """``_fast_emit``'s closures for process mode: records packed by ``recs`` (in emission
        order, a dict record as its marshal), not queued as tuples."""
        add_item = recs.add_item
        clock = self._clock
        max_pending = self.max_pending
        wake_at = self._wake_at
        wake = self._wake.set

        def emit_fields(event: str, vhost: str, fields: dict[str, Any]) -> None:
            n = len(recs)
            if n >= max_pending or self._closed:
                return self._shed()
            item = (clock(), event, vhost, fields)
            try:
                add_item(marshal.dumps(item))
            except ValueError:  # a value marshal does not take: as the JSON writer sees it
                add_item(marshal.dumps((item[0], event, vhost, _plain(fields))))
            if n == wake_at:
                wake()

        # emit_row is the Records' own, in C: the same checks as emit_fields' (close() sets
        # its limit to 0), without a Python frame for each of a message's four records.
        recs.watch(max_pending, wake_at, self._shed, wake)
        return _emitters(emit_fields, recs.emit_row)

    def _take_packed(self) -> None:
        """The packed records into ``_queue`` as items (after the writer process failed,
        this thread writes them)."""
        recs = self._records
        if recs is not None and len(recs):
            assert fastformat.unpack is not None
            self._queue.extend(fastformat.unpack(recs.take()))

    def _shed(self) -> None:
        """A record refused (queue full, or the log closed): counted, reported by the writer."""
        with self._drop_lock:  # rare path; keeps the count exact if several threads emit
            self.dropped += 1

    # ---- event loop side -------------------------------------------------------------------

    def emit(self, event: str, vhost: str, **fields: Any) -> None:
        """Queue one record; never blocks, never raises for a full queue (A1)."""
        q = self._queue
        n = len(q)
        if n >= self.max_pending or self._closed:
            return self._shed()
        q.append((self._clock(), event, vhost, fields))
        if n == self._wake_at:
            self._wake.set()

    def emit_fields(self, event: str, vhost: str, fields: dict[str, Any]) -> None:
        """``emit`` with the fields as a dict the caller hands over (kept as the record's
        fields, not copied: the caller must not change it afterwards)."""
        self.emit(event, vhost, **fields)

    def emit_row(self, row: Row, vhost: str, values: tuple[Any, ...]) -> None:
        """``emit`` of a record of a fixed shape: ``values`` in ``row.keys`` order."""
        self.emit_fields(row.event, vhost, row.fields(values))

    def emit_values(self, row: Row, vhost: str, *values: Any) -> None:
        """``emit_row(row, vhost, values)`` with the values as arguments (in process mode the
        packed Records' own, which makes no tuple of them)."""
        self.emit_row(row, vhost, values)

    @property
    def pending(self) -> int:
        return len(self._queue) + (len(self._records) if self._records is not None else 0)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything emitted before this call is written (tests, shutdown)."""
        with self._cond:
            # A whole cycle that starts after this call: the next one when the writer is idle,
            # else the one after it (the cycle under way may have taken the queue already).
            target = self._cycles + (2 if self._busy else 1)
            self._flush_to = max(self._flush_to, target)
            self._wake.set()
            return self._cond.wait_for(
                lambda: self._cycles >= target or not self._thread.is_alive(), timeout
            )

    def sync_mark(self) -> int:
        """A5: ask for everything emitted before this call to be written and fsynced; returns
        the mark ``wait_synced`` waits for. Called by the broker's group commit on the event
        loop, next to the store's last LSN, so that a confirm never passes its records."""
        with self._cond:
            target = self._cycles + (2 if self._busy else 1)
            self._flush_to = max(self._flush_to, target)
            self._sync_to = max(self._sync_to, target)
            self._wake.set()
        return target

    def handoff(self) -> bool:
        """A5: hand every record emitted so far to the writer process now, before the
        caller lets a client see what they describe (a delivery's frames go to the socket
        after this). A kill -9 of the gateway then no longer takes them: the process, in a
        session of its own, writes what its pipe holds before it sees the end of its input,
        and holds the directory's lock until it exits, so a restart waits for it
        (gateway.audit.dirlock). Not fsynced: a machine's crash can still lose them, as it
        can any record no confirm waited for. Without a writer process (in-thread mode)
        this does nothing. Waits only while the process is a full pipe behind.

        False: a stop was asked (``ask_stop``) while the process could take nothing (a full
        disk); the records are still queued, and the caller must not show the client what
        they describe (it closes the connection instead)."""
        pipe = self._pipe
        if pipe is None or not (self._queue or len(pipe) or (self._records is not None and len(self._records))):
            return True
        lock = self._send_lock
        while not lock.acquire(timeout=GIVE_UP_POLL):  # the writer thread may be the one waiting
            if self._stop_asked:
                return False
        try:
            pipe = self._pipe
            if pipe is None:  # the process failed meanwhile: the writer thread took its records
                return True
            self._send_pending()
            return pipe.flush(self._stopping_asked)
        except Exception:  # the process is gone: the thread's next cycle finds it and takes over
            self._wake.set()
            return True
        finally:
            lock.release()

    def ask_stop(self) -> None:
        """A stop is coming (a signal handler calls this; it only sets a flag): a hand-off
        waiting for a writer process that can take nothing gives up rather than hold the
        event loop, and with it the stop, until the disk has room."""
        self._stop_asked = True

    def _stopping_asked(self) -> bool:
        return self._stop_asked

    def wait_synced(self, mark: int, timeout: float | None = None) -> bool:
        """Wait until the records before ``sync_mark()`` are on disk (False: the writer is
        gone, or ``timeout``)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._synced >= mark or not self._thread.is_alive(), timeout)

    def close(self) -> None:
        """Write everything queued, close (rename) the open file and stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._records is not None:
            self._records.watch(0, -1, self._shed, None)  # emit_row sheds from now on
        self._stopping = True
        self._stop_asked = True
        self.space_final = True
        if self._child is not None:
            with contextlib.suppress(OSError):  # it gives up what a full disk will not take
                self._child.send_signal(STOP_SIGNAL)
        self._wake.set()
        try:
            self._thread.join()
        finally:
            if self._lock is not None:  # the files are closed: another writer may take over
                self._lock.release()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writer thread ---------------------------------------------------------------------

    def _periodic(self) -> None:
        """Close a file open for rotate_seconds; apply the retention now and then."""
        if self._file is not None and self._clock() - self._file_opened_at >= self.rotate_seconds:
            self._close_file()
        if time.time() - self._last_retention >= self._retention_every:
            self._last_retention = time.time()
            self._apply_retention()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._flush_interval)
            with self._cond:
                self._busy = True
                sync = self._sync_to > self._cycles  # this cycle is one a sync_mark waits for
            self._wake.clear()
            stopping = self._stopping
            synced = False
            try:
                if self._child is not None:  # process mode: hand the records over, then ask
                    self._request(b"S" if sync else b"F")
                else:
                    self._drain()
                    if sync:
                        self._sync_file()
                    self._periodic()
                synced = sync
            except Exception:  # the writer must outlive any one bad batch
                if self._child is not None:
                    self._child_failed()  # its records go again; the next cycle syncs them
                else:
                    log.exception("audit writer cycle failed")
                    synced = sync  # lost records are counted in dropped: nothing to wait for
            with self._cond:
                self._cycles += 1
                if synced:
                    self._synced = self._cycles
                elif sync:
                    self._wake.set()
                self._busy = False
                if self._cycles < self._flush_to:
                    self._wake.set()
                self._cond.notify_all()
            if stopping and not self.pending:
                break
        try:
            if self._child is not None:
                self._request(b"C")
                self._child.wait(timeout=30)
                self._close_bell()
            else:
                self._close_file()
        finally:
            with self._cond:
                self._cycles += 1
                self._cond.notify_all()

    # ---- process mode: this thread only hands records to gateway.audit.child ----------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        params = {"directory": self.directory, "rotate_bytes": self.rotate_bytes,
                  "rotate_seconds": self.rotate_seconds, "retention_hours": self.retention_hours,
                  "retention_check_seconds": self._retention_every, "max_pending": 1 << 62,
                  "events": None if self.events is None else sorted(self.events)}
        env = dict(os.environ)
        # The child imports this very package, wherever it was imported from.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # The child shares the directory's lock (one flock, two descriptors): after a kill -9 of
        # the gateway it still holds it while it writes what its pipe holds (A5, handoff), so
        # a restart never closes or compacts the file it is finishing.
        keep: tuple[int, ...] = (self._lock.fileno(),) if self._lock is not None else ()
        bell_r, bell_w = os.pipe()
        os.set_blocking(bell_w, False)
        keep += (bell_r,)
        env[DOORBELL_ENV] = str(bell_r)
        # The child starts with STOP_SIGNAL blocked (a thread's mask survives fork and exec) and
        # unblocks it once its handler is in place: a stop signalled earlier waits for it
        # rather than killing it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})
        try:
            child = subprocess.Popen([sys.executable, "-m", "gateway.audit.child", json.dumps(params)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
                                     pass_fds=keep,
                                     start_new_session=True)  # no SIGINT/SIGTERM of the terminal's group
        except BaseException:
            os.close(bell_w)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(bell_r)
        self._bell = bell_w
        with contextlib.suppress(OSError, AttributeError, ValueError):  # not Linux, or over the limit
            import fcntl
            fcntl.fcntl(child.stdin.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[union-attr]
        return child

    def _ring(self) -> None:
        """Wake the writer process now: an answer is awaited (gateway.audit.pipe.Reader)."""
        if self._bell >= 0:
            with contextlib.suppress(BlockingIOError):  # rung already and not yet heard
                os.write(self._bell, b"\0")

    def _close_bell(self) -> None:
        bell, self._bell = self._bell, -1
        if bell >= 0:
            os.close(bell)

    def _child_failed(self) -> None:
        log.exception("audit writer process failed; writing from this process from now on")
        with self._send_lock:  # handoff() no longer writes to it
            child, self._child = self._child, None
            self._close_bell()
            self._pipe = None  # what it still held is in _unacked, written again below
            if child is not None:
                with contextlib.suppress(Exception):
                    child.kill()
                    child.wait(timeout=5)
            self._recover()  # its open file, closed as after a crash (A3)
            # What it was sent since its last answer is written again from here: at least once.
            unacked, self._unacked = self._unacked, []
            items: list[_Item] = []
            for sent in unacked:  # items, or records packed (bytes)
                if isinstance(sent, bytes):
                    assert fastformat.unpack is not None
                    items += fastformat.unpack(sent)
                else:
                    items.append(sent)
            self._queue.extendleft(reversed(items))
            self._take_packed()  # after them: emitted later

    def _send_pending(self) -> None:
        """Queue every queued record (and an audit_dropped record for what was shed) on the
        pipe, for its next flush; under ``_send_lock``."""
        pipe = self._pipe
        assert pipe is not None
        q = self._queue
        popleft = q.popleft
        remaining = len(q)
        shed = self.dropped - self._dropped_reported
        recs = self._records
        while remaining or shed > 0 or (recs is not None and len(recs)):
            if not remaining and recs is not None and len(recs):
                # The packed records, as they are: after the queue's (which holds some only
                # when a thread re-queued them), before an audit_dropped stamped now.
                data = recs.take()
                self._unacked.append(data)
                pipe.write(CHILD_HEADER.pack(b"P", len(data)))
                pipe.write(data)
                continue
            if remaining:
                n = min(remaining, _BATCH)
                remaining -= n
                items: list[_Item] = [popleft() for _ in range(n)]
            else:
                # Stamped now, so after everything queued: time order (and the hour folder) holds.
                self._dropped_reported += shed
                log.warning("audit log overloaded: %d records dropped", shed)
                items = [(self._clock(), "audit_dropped", "", {"dropped": shed})]
                shed = 0
            self._unacked.extend(items)
            try:
                payload = marshal.dumps(items)
            except ValueError:  # a value marshal does not take: as the JSON writer sees it
                payload = marshal.dumps([(t, e, v, _plain(f)) for t, e, v, f in items])
            pipe.write(CHILD_HEADER.pack(b"B", len(payload)))
            pipe.write(payload)

    def _request(self, kind: bytes) -> None:
        """Hand every queued record over, send ``F``, ``S`` or ``C`` and take the counters the
        child answers with."""
        child, pipe = self._child, self._pipe
        assert child is not None and child.stdout is not None and pipe is not None
        with self._send_lock:
            self._send_pending()
            pipe.write(CHILD_HEADER.pack(kind, 0))
            pipe.flush()  # waits as long as it takes: close() has told a stalled process to give up
            self._ring()
            sent = len(self._unacked)
        # Read without the lock: handoff() may send more meanwhile, which this answer does not cover.
        line = child.stdout.readline()
        if not line:
            raise EOFError("the audit writer process exited")
        counters = json.loads(line)
        with self._send_lock:
            del self._unacked[:sent]  # the child has written everything sent before this request
        counts = self.counts
        for key, n in counters["counts"]:
            k = tuple(key)
            counts[k] = counts.get(k, 0) + n
        self.written = counters["written"]
        self.files_closed = counters["files_closed"]
        self.files_deleted = counters["files_deleted"]
        lost = counters["dropped"] - self._child_dropped
        if lost:
            self._child_dropped = counters["dropped"]
            with self._drop_lock:
                self.dropped += lost

    def _drain(self) -> None:
        self._take_packed()
        q = self._queue
        popleft = q.popleft
        remaining = len(q)
        shed = self.dropped - self._dropped_reported
        buf = bytearray()
        nlines = 0
        hour = ""  # the folder changes only with the ts's "YYYY-MM-DDTHH" prefix
        folder = ""
        while True:
            if remaining:
                n = min(remaining, _CHUNK)
                remaining -= n
                items: list[_Item] = [popleft() for _ in range(n)]
            elif shed > 0:
                # Stamped now, so after everything queued: time order (and the hour folder) holds.
                self._dropped_reported += shed
                log.warning("audit log overloaded: %d records dropped", shed)
                items = [(self._clock(), "audit_dropped", "", {"dropped": shed})]
                shed = 0
            else:
                break
            buf, nlines, hour, folder = self._format(items, buf, nlines, hour, folder)
            if remaining and self._shares_gil:
                # Formatting holds the GIL; without a pause the event loop thread waited up
                # to the 5 ms switch interval each time (scenario 7 p99 after a busy run:
                # 44 ms). sleep(0) releases the GIL, so the loop runs between chunks. Not in
                # the writer process, which has no loop to wait for: there sleep(0) only gave
                # its CPU away (36% of its samples under load, py-spy).
                time.sleep(0)
        self._write(buf, nlines)

    def _format(self, items: list[_Item], buf: bytearray, nlines: int, hour: str, folder: str
                ) -> tuple[bytearray, int, str, str]:
        """Count ``items``, then format those the ``events`` filter keeps into ``buf`` (which
        holds ``nlines`` lines), writing (and rotating) as files fill up.

        Each run of rows of one second is formatted in a few C-level passes
        (gateway.audit.batch) and placed into files by ``_place``; anything else (other
        records, an ``events`` filter, a value of an unusual type) record by record. Where
        the C formatter is built (gateway.audit.fastformat), it takes the rows instead."""
        if self._format_rows is not None and self.events is None:
            return self._format_compiled(items, buf, nlines, hour, folder)
        runs = second_runs(list(map(_time_of, items))) if self.events is None else None
        if runs is None:
            return self._format_each(items, buf, nlines, hour, folder)
        counts = self.counts
        for start, end, sec in runs:
            chunk = items[start:end] if len(runs) > 1 else items
            got = format_run(chunk, sec)
            if got is None:
                buf, nlines, hour, folder = self._format_each(chunk, buf, nlines, hour, folder)
                continue
            data, ts, keyed = got
            if ts[:13] != hour:
                hour, folder = ts[:13], layout.folder_for(ts)
            for k, n in keyed:
                counts[k] = counts.get(k, 0) + n
            buf, nlines = self._place(data, end - start, folder, buf, nlines)
            if len(buf) >= 4 * 1024 * 1024:  # bound the bytes held when far behind
                self._write(buf, nlines)
                buf, nlines = bytearray(), 0
        return buf, nlines, hour, folder

    def _format_compiled(self, items: list[_Item], buf: bytearray, nlines: int, hour: str, folder: str
                         ) -> tuple[bytearray, int, str, str]:
        """``_format`` with the rows formatted and counted in C, a run of one folder at a
        time placed into files by ``_place``; a record the C formatter leaves to Python
        (a dict record, a value of an unusual type) goes through ``_format_each``."""
        format_rows = self._format_rows
        assert format_rows is not None
        pending: dict[tuple[Any, ...], int] = {}  # as _format_each counts rows
        i, n = 0, len(items)
        while i < n:
            data, lines, stop, ts, why = format_rows(items, i, _RUN_BYTES, pending)
            if lines:
                assert ts is not None
                if ts[:13] != hour:
                    hour, folder = ts[:13], layout.folder_for(ts)
                buf, nlines = self._place(data, lines, folder, buf, nlines)
                if len(buf) >= 4 * 1024 * 1024:  # bound the bytes held when far behind
                    self._write(buf, nlines)
                    buf, nlines = bytearray(), 0
            i = stop
            if why == fastformat.PYTHON:
                buf, nlines, hour, folder = self._format_each(items[i:i + 1], buf, nlines, hour, folder)
                i += 1
        counts = self.counts
        for (rid, vhost, picked), k in pending.items():
            key = ROWS[rid].count_key_picked(vhost, picked)
            counts[key] = counts.get(key, 0) + k
        return buf, nlines, hour, folder

    def _place(self, data: bytes, lines: int, folder: str, buf: bytearray, nlines: int) -> tuple[bytearray, int]:
        """Add ``data``, ``lines`` whole lines of one folder, to ``buf`` (lines for the open
        file), closing and opening files where ``_format_each`` would: before the first line
        of another folder, before a line the file has no room for (unless the file is
        empty: one line always goes in)."""
        pos, size = 0, len(data)
        while True:
            if self._file is None or folder != self._file_folder:
                buf, nlines = self._next_file(data, pos, folder, buf, nlines)
            room = self.rotate_bytes - self._file_size - len(buf)
            if size - pos <= room:
                buf += data[pos:] if pos else data
                return buf, nlines + lines
            cut = data.rfind(b"\n", pos, pos + max(room, 0)) + 1  # after the last line that fits
            if cut <= pos:  # not one line fits
                if self._file_size + len(buf):
                    buf, nlines = self._next_file(data, pos, folder, buf, nlines)
                    continue
                cut = data.index(b"\n", pos) + 1
            taken = data.count(b"\n", pos, cut)
            buf += data[pos:cut]
            nlines += taken
            lines -= taken
            pos = cut
            if pos == size:
                return buf, nlines
            buf, nlines = self._next_file(data, pos, folder, buf, nlines)

    def _next_file(self, data: bytes, pos: int, folder: str, buf: bytearray, nlines: int) -> tuple[bytearray, int]:
        """Write ``buf``, close the open file and open the next one, named for the line at
        ``pos`` of ``data`` (its ts: the 27 characters after '{"v":2,"ts":"')."""
        self._write(buf, nlines)
        self._close_file()
        self._open_file(data[pos + _TS_AT:pos + _TS_AT + 27].decode(), folder)
        return bytearray(), 0

    def _format_each(self, items: list[_Item], buf: bytearray, nlines: int, hour: str, folder: str
                     ) -> tuple[bytearray, int, str, str]:
        """``_format`` record by record.

        The writer process runs this for every record of every message (4 a message in
        scenario 1), on a core it shares with the gateway, so the loop is hand-tuned (3.6 ->
        2.3 us a record, measured): the timestamp's second, hour and folder are worked out
        once a second; rows are counted by (row, vhost, the values their key reads) and
        turned into count keys once per call; the rotation test is one comparison while the
        file has room."""
        events = self.events
        rows = ROWS
        pending: dict[tuple[Any, ...], int] = {}  # row counts: (row id, vhost, picked values)
        pget = pending.get
        last_sec = -1
        milli, micro_z = MILLI, MICRO_Z
        prefix = ""  # "YYYY-MM-DDTHH:MM:SS." of last_sec
        file_folder = self._file_folder if self._file is not None else None
        room = self.rotate_bytes - self._file_size - len(buf)
        for t, event, vhost, fields in items:
            sec = int(t)
            us = round((t - sec) * 1_000_000)
            if sec == last_sec and us < 1_000_000:
                ts = prefix + milli[us // 1000] + micro_z[us % 1000]
            else:
                ts = format_ts(t)
                if us < 1_000_000:
                    last_sec, prefix = sec, ts[:20]
                if ts[:13] != hour:
                    hour = ts[:13]
                    folder = layout.folder_for(ts)
            if event.__class__ is int:  # a row (gateway.audit.rows)
                row = rows[event]
                pk = (event, vhost, row.pick(fields))
                pending[pk] = pget(pk, 0) + 1
                if events is not None and row.event not in events:
                    continue
                start = len(buf)
                row.put(buf, ts, row.event, vhost, *fields)
            else:
                if event != "audit_dropped":  # the writer's own record: not a broker event
                    k = count_key(event, vhost, fields)
                    self.counts[k] = self.counts.get(k, 0) + 1
                    if events is not None and event not in events:
                        continue
                start = len(buf)
                buf += format_line(ts, event, vhost, fields).encode()
            n = len(buf) - start  # the line is in buf already: the file it goes to is decided now
            if n > room or folder is not file_folder:
                if self._file is None or folder != self._file_folder or (
                    self._file_size + start + n > self.rotate_bytes and self._file_size + start > 0
                ):
                    line = buf[start:]
                    del buf[start:]
                    self._write(buf, nlines)
                    buf, nlines = line, 0
                    self._close_file()
                    self._open_file(ts, folder)
                file_folder = self._file_folder
                room = self.rotate_bytes - self._file_size - (len(buf) - n)
            nlines += 1
            room -= n
            # Bound the bytes held in memory when the writer has fallen far behind.
            if len(buf) >= 4 * 1024 * 1024:
                self._write(buf, nlines)
                buf, nlines = bytearray(), 0
        counts = self.counts
        for (rid, vhost, picked), n in pending.items():
            k = rows[rid].count_key_picked(vhost, picked)
            counts[k] = counts.get(k, 0) + n
        return buf, nlines, hour, folder

    def _write(self, data: bytearray, nlines: int) -> None:
        """Write ``data``, ``nlines`` whole lines, to the open file."""
        if not nlines or self._file is None:
            return
        # Unbuffered: each write() is one system call, so after a partial write on a full disk
        # the rest is retried from where it stopped and no line is torn or repeated.
        view, done, size, write = memoryview(data), 0, len(data), self._file.write
        try:
            while done < size:
                done += self._until_room(write, view[done:])
        except OSError as e:
            kept = data.count(b"\n", 0, done)  # the whole lines before the failure are in the file
            log.error("audit write to %s failed (%s); %d records lost", self._file_key, e, nlines - kept)
            with self._drop_lock:
                self.dropped += nlines - kept
            self.written += kept
            self._close_file()
            return
        self._file_size += len(data)
        self._file_unsynced = True
        self.written += nlines

    def _sync_file(self) -> None:
        """A5: the open file's lines on disk (fsync; its folder too when the file is new, so
        that its name survives a power loss as well)."""
        f = self._file
        if f is None or not self._file_unsynced:
            return
        self._file_unsynced = False
        self._until_room(os.fsync, f.fileno())
        if not self._file_synced:
            self._file_synced = True
            _fsync_dir(os.path.dirname(self._file_key))

    def _until_room(self, op: Callable[..., Any], *args: Any) -> Any:
        """``op(*args)``, again and again while it fails for want of room on the disk, until
        ``space_final`` (A5: records are not dropped for a full disk)."""
        delay, warned = 0.01, 0.0
        while True:
            try:
                return op(*args)
            except OSError as e:
                if e.errno not in _NO_ROOM or self.space_final:
                    raise
                if time.monotonic() - warned >= 60.0:
                    warned = time.monotonic()
                    log.warning("audit dir %s: the disk is full (%s); waiting for room, nothing is dropped",
                                self.directory, e.strerror)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _open_file(self, ts: str, folder: str) -> None:
        folder_path = os.path.join(self.directory, folder)
        self._until_room(os.makedirs, folder_path, 0o777, True)
        while True:
            name = layout.closed_name(ts, self._seq)
            self._seq += 1
            closed = os.path.join(folder_path, name)
            if not os.path.exists(closed) and not os.path.exists(layout.open_path(closed)):
                break
        # "x": never append to (rewrite) a file that already exists.
        self._file = self._until_room(open, layout.open_path(closed), "xb", 0)  # unbuffered: see _write
        self._file_key = closed
        self._file_synced = False
        self._file_folder = folder
        self._file_size = 0
        self._file_opened_at = self._clock()

    def _close_file(self) -> None:
        f = self._file
        if f is None:
            return
        self._file = None
        try:
            self._until_room(os.fsync, f.fileno())
        finally:
            f.close()
            os.rename(layout.open_path(self._file_key), self._file_key)
            self.files_closed += 1
        from gateway.audit import compact  # A7: the closed segment to Parquet, in the background

        compact.closed(self.directory, self.retention_hours)

    def _apply_retention(self) -> None:
        cutoff = time.time() - self.retention_hours * 3600.0
        for af in layout.list_files(self.directory):
            try:
                if os.stat(af.path).st_mtime < cutoff:
                    os.unlink(af.path)
                    self.files_deleted += 1
            except FileNotFoundError:
                continue
        self._remove_empty_folders()

    def _remove_empty_folders(self) -> None:
        for dt_entry in os.scandir(self.directory):
            if not dt_entry.is_dir() or not dt_entry.name.startswith("dt="):
                continue
            for hour_entry in os.scandir(dt_entry.path):
                if hour_entry.is_dir():  # the open file's folder is never empty
                    try:
                        os.rmdir(hour_entry.path)
                    except OSError:  # not empty
                        pass
            try:
                os.rmdir(dt_entry.path)
            except OSError:
                pass

    def _recover(self) -> None:
        """Close what a crashed writer left open, torn last line and all (A3)."""
        for af in layout.list_files(self.directory, include_open=True):
            if af.is_open:
                closed = os.path.join(self.directory, af.key)
                log.warning("audit: closing %s left open by a crash", af.key)
                os.rename(af.path, closed)


def _emitters(emit_fields: Callable[..., None], emit_row: Callable[..., None]
              ) -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """``emit``, ``emit_fields`` and ``emit_row`` of the closures ``_fast_emit`` made. The
    broker's per-message records come through emit_row, its other dict records through
    emit_fields; emit (tests, other callers) only packs its keywords."""
    def emit(event: str, vhost: str, **fields: Any) -> None:
        emit_fields(event, vhost, fields)

    emit.__doc__ = AuditLog.emit.__doc__
    emit_fields.__doc__ = AuditLog.emit_fields.__doc__
    if isinstance(emit_row, FunctionType):  # Records.emit_row (C) has its own
        emit_row.__doc__ = AuditLog.emit_row.__doc__
    return emit, emit_fields, emit_row


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _plain(value: Any) -> Any:
    """``value`` as built-in types that marshal takes, written the same by format_line."""
    if value is None or type(value) in (str, int, float, bool, bytes):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
