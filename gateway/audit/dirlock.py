"""One writer per audit directory (A7): an exclusive ``flock`` on ``<dir>/.lock``.

Why: a second writer on the same directory took the first one's live ``.open`` file for
one "left open by a crash" and renamed it closed under the running writer, which then
crashed at its own stop (issue 27). ``AuditLog`` takes this lock before it touches anything
in the directory (before closing files left open by a crash) and holds it until it is
closed; the kernel drops it when the processes holding it die, so a kill -9 never leaves it
stale.

The gateway's audit writer process shares the lock (it inherits the descriptor): after a kill
-9 of the gateway it still writes what its pipe holds (A5, ``AuditLog.handoff``) and holds the
directory until it exits. A start that finds the lock held by a holder whose gateway process
is gone therefore waits for it (``DEAD_HOLDER_WAIT``), rather than refusing: that writer is
finishing, and the kernel drops the lock when it exits.

The file is hidden (a dot file): Spark's file sources skip dot files, where a plain file
beside ``dt=...`` would upset partition discovery. Its text names the holder (``pid`` and
``host``), so a refused second writer can say who holds the directory.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time

__all__ = ["LOCK_NAME", "AuditDirLock", "AuditDirLocked"]

LOCK_NAME = ".lock"
# How long a start waits for the writer process of a gateway that died (its pipe is at most
# 1 MiB of records, well under a second of work; the rest is a loaded machine's scheduling).
DEAD_HOLDER_WAIT = 30.0
_HOLDER = re.compile(r"pid (\d+) on host (\S+)")


class AuditDirLocked(Exception):
    """Another writer holds the directory; ``holder`` is what its lock file says."""

    def __init__(self, directory: str, holder: str) -> None:
        self.directory = directory
        self.holder = holder
        if holder and _holder_gone(holder):
            # Its writer process outlived it and has not finished in DEAD_HOLDER_WAIT: it
            # waits for room on a full disk rather than drop records (gateway.audit.writer).
            text = (f"audit dir {directory} is still held by the audit writer process of a gateway that"
                    f" has exited ({holder}); it is writing what that gateway handed it, and waits for"
                    " room if the disk is full")
        else:
            text = f"audit dir {directory} is in use by another writer ({holder or 'holder unknown'})"
        super().__init__(text)


class AuditDirLock:
    """Held from construction to ``release()``; refuses with AuditDirLocked when taken."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _take(fd)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
            finally:
                os.close(fd)
            raise AuditDirLocked(directory, holder) from None
        except BaseException:
            os.close(fd)
            raise
        # Written after the lock is ours: a reader of a held lock sees its holder's text.
        text = f"pid {os.getpid()} on host {socket.gethostname()}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        self._fd = fd

    def fileno(self) -> int:
        """The descriptor that holds the lock: a process that inherits it holds it too."""
        return self._fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = -1


def _take(fd: int) -> None:
    """The lock, at once, or once the writer process of a dead holder has exited (raises
    BlockingIOError when a live gateway holds it, or the wait is over)."""
    deadline = time.monotonic() + DEAD_HOLDER_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline or not _holder_gone(os.pread(fd, 512, 0).decode("utf-8", "replace")):
                raise
        time.sleep(0.02)


def _holder_gone(text: str) -> bool:
    """The lock's text names a gateway of this host that no longer runs (a zombie counts)."""
    m = _HOLDER.search(text)
    if m is None or m.group(2) != socket.gethostname():
        return False
    try:
        with open(f"/proc/{m.group(1)}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return not _alive(int(m.group(1)))
    return state in (b"Z", b"X")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
