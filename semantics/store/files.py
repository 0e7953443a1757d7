"""File names and the few file-system habits the store relies on.

Every file that is created, renamed or removed is followed by an fsync of the directory,
otherwise the *name* may not survive a power loss even when the data does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time

from .errors import StoreLockedError

__all__ = [
    "DirLock",
    "fsync_dir",
    "list_numbered",
    "segment_name",
    "set_aside",
    "snapshot_name",
]

_SEGMENT = re.compile(r"^journal-(\d{8,})\.log$")
_SNAPSHOT = re.compile(r"^snapshot-(\d{8,})\.snap$")


def segment_name(n: int) -> str:
    return f"journal-{n:08d}.log"


def snapshot_name(n: int) -> str:
    """The snapshot that holds the state as of the end of segment ``n - 1``."""
    return f"snapshot-{n:08d}.snap"


def list_numbered(directory: str) -> tuple[list[int], list[int], list[str]]:
    """(segment numbers, snapshot numbers, leftover temp files), numbers ascending."""
    segments: list[int] = []
    snapshots: list[int] = []
    temps: list[str] = []
    for name in os.listdir(directory):
        if m := _SEGMENT.match(name):
            segments.append(int(m.group(1)))
        elif m := _SNAPSHOT.match(name):
            snapshots.append(int(m.group(1)))
        elif name.endswith(".tmp"):
            temps.append(name)
    return sorted(segments), sorted(snapshots), temps


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside(path: str, data: bytes, label: str, *, do_fsync: bool = True) -> str:
    """Copy damaged bytes next to ``path`` for an operator to inspect; returns the new path.

    The name carries the wall-clock time so that repeated damage never overwrites evidence.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    base = f"{path}.{label}-{stamp}"
    aside = base
    n = 1
    while os.path.exists(aside):
        n += 1
        aside = f"{base}.{n}"
    try:
        with open(aside, "xb") as f:
            f.write(data)
            if do_fsync:
                f.flush()
                os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(aside)  # a half copy on a full disk would only take the room it lacked
        raise
    if do_fsync:
        fsync_dir(os.path.dirname(path) or ".")
    return aside


class DirLock:
    """An exclusive ``flock`` on ``<dir>/LOCK``: two processes must never append to one journal.

    The kernel drops the lock when the process dies, so a SIGKILLed gateway never leaves a
    stale lock behind. ``name``: another lock file, for a directory others read (the audit
    log's ``.lock`` is hidden from Spark's file sources, which skip dot files).
    """

    def __init__(self, directory: str, name: str = "LOCK") -> None:
        self._fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise StoreLockedError(f"store {directory!r} is already open in another process or object")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
