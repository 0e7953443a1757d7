"""One writer per audit directory (A7): an exclusive ``flock`` on ``<dir>/.lock``.

Why: a second writer on the same directory took the first one's live ``.open`` file for
one "left open by a crash" and renamed it closed under the running writer, which then
crashed at its own stop (issue 27). ``AuditLog`` takes this lock before it touches anything
in the directory (before closing files left open by a crash) and holds it until it is
closed; the kernel drops it when the process dies, so a kill -9 never leaves it stale.

The file is hidden (a dot file): Spark's file sources skip dot files, where a plain file
beside ``dt=...`` would upset partition discovery. Its text names the holder (``pid`` and
``host``), so a refused second writer can say who holds the directory.
"""

from __future__ import annotations

import fcntl
import os
import socket

__all__ = ["LOCK_NAME", "AuditDirLock", "AuditDirLocked"]

LOCK_NAME = ".lock"


class AuditDirLocked(Exception):
    """Another writer holds the directory; ``holder`` is what its lock file says."""

    def __init__(self, directory: str, holder: str) -> None:
        self.directory = directory
        self.holder = holder
        super().__init__(f"audit dir {directory} is in use by another writer ({holder or 'holder unknown'})")


class AuditDirLock:
    """Held from construction to ``release()``; refuses with AuditDirLocked when taken."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = -1
