"""A real small file system for the tests of a failing disk: a tmpfs of a few MB.

Mounting needs root (CAP_SYS_ADMIN); elsewhere the tests that use it are skipped with that
reason. ``fill`` takes every free byte with a filler file (``free`` gives them back). A read-only
remount is no substitute for EROFS here: the kernel refuses it (EBUSY) while the store
holds its segment open for writing, so EROFS and EIO share the store's OSError path, which
the fsync test covers with a failing ``os.fsync``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = ".filler"


@contextlib.contextmanager
def small_disk(where: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (created), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a small tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    """Write until the file system is full (ENOSPC)."""
    chunk = b"\0" * 65536
    with open(disk / FILLER, "ab", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    with contextlib.suppress(OSError), open(disk / FILLER, "ab", buffering=0) as f:
        while f.write(b"\0"):  # the last few bytes of a page
            pass


def free(disk: Path) -> None:
    """Give the filler's space back."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(disk / FILLER)
