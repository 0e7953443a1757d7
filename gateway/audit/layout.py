"""Where audit files live and what they are called (A3).

    <dir>/dt=YYYY-MM-DD/hour=HH/audit-<start>-<seq>.jsonl          closed: never written again
    <dir>/dt=YYYY-MM-DD/hour=HH/.audit-<start>-<seq>.jsonl.open    the one file being written

The in-progress name starts with a dot so that Spark's own file sources (and ``spark.read.json``)
skip it, as they skip every hidden file; only the ``cmq-audit`` stream reader tails it.  A file is
known by its closed *key* (relative path, forward slashes) whichever name it has right now, so a
reader's offset survives the rename.  ``<start>`` is the UTC time the file was opened, so keys
sort in write order: within a folder, and across folders because ``dt=``/``hour=`` sort as dates.

The Spark connector imports this module: keep it free of anything but the standard library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "AuditFile",
    "closed_name",
    "folder_for",
    "list_files",
    "open_path",
    "parse_folder",
]

OPEN_PREFIX = "."
OPEN_SUFFIX = ".open"
_DT_RE = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
_HOUR_RE = re.compile(r"^hour=(\d{2})$")
_NAME_RE = re.compile(r"^audit-(\d{8}T\d{6}\.\d{6}Z)-(\d{6,})\.jsonl$")


def folder_for(ts: str) -> str:
    """``2024-05-01T10:...`` → ``dt=2024-05-01/hour=10``."""
    return f"dt={ts[:10]}/hour={ts[11:13]}"


def closed_name(ts: str, seq: int) -> str:
    """The file name for a file opened at ``ts`` (an ISO record timestamp)."""
    start = ts[:4] + ts[5:7] + ts[8:10] + "T" + ts[11:13] + ts[14:16] + ts[17:26] + "Z"
    return f"audit-{start}-{seq:06d}.jsonl"


def open_path(closed_path: str) -> str:
    """The in-progress path of a closed path (same folder, hidden, ``.open``)."""
    head, tail = os.path.split(closed_path)
    return os.path.join(head, OPEN_PREFIX + tail + OPEN_SUFFIX)


def parse_folder(dt_name: str, hour_name: str) -> tuple[str, int] | None:
    d = _DT_RE.match(dt_name)
    h = _HOUR_RE.match(hour_name)
    if d is None or h is None:
        return None
    return d.group(1), int(h.group(1))


@dataclass(frozen=True, slots=True)
class AuditFile:
    key: str  # "dt=.../hour=../audit-....jsonl", the closed name even while open
    dt: str
    hour: int
    path: str  # where it is now
    is_open: bool
    size: int


def _scandir(path: str) -> list[os.DirEntry[str]]:
    # A folder may vanish under us (retention removes empty ones): that is not an error.
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def list_files(
    root: str,
    *,
    include_open: bool = False,
    keep_folder: Callable[[str, int], bool] | None = None,
) -> Iterator[AuditFile]:
    """Every audit file under ``root`` in key order.  ``keep_folder(dt, hour) -> bool`` prunes
    whole folders before they are listed (partition pruning)."""
    for d in sorted(_scandir(root), key=lambda e: e.name):
        if not d.is_dir() or _DT_RE.match(d.name) is None:
            continue
        for h in sorted(_scandir(d.path), key=lambda e: e.name):
            parsed = parse_folder(d.name, h.name)
            if parsed is None or not h.is_dir():
                continue
            dt, hour = parsed
            if keep_folder is not None and not keep_folder(dt, hour):
                continue
            # readdir during a rename may show both names: keyed, the closed one wins.
            found: dict[str, AuditFile] = {}
            for f in _scandir(h.path):
                name, is_open = f.name, False
                if name.startswith(OPEN_PREFIX) and name.endswith(OPEN_SUFFIX):
                    if not include_open:
                        continue
                    name, is_open = name[len(OPEN_PREFIX) : -len(OPEN_SUFFIX)], True
                if _NAME_RE.match(name) is None:
                    continue
                try:
                    size = f.stat().st_size
                except FileNotFoundError:  # renamed or deleted since the listing
                    continue
                key = f"{d.name}/{h.name}/{name}"
                if key not in found or not is_open:
                    found[key] = AuditFile(key, dt, hour, f.path, is_open, size)
            yield from (found[k] for k in sorted(found))
