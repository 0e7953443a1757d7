"""The audit log's records as the gateway left them on disk, read line by line for the tests
of crashes and restarts (A3, A5, A6): closed segments skip a torn last line, as readers do;
``include_open`` adds the whole lines of a file still being written (or left open by a kill)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def records(audit: Path, *, include_open: bool = False) -> list[dict[str, Any]]:
    """Every whole record of the closed segments, in file order; with ``include_open`` those
    of ``.open`` files too, after them."""
    out = []
    for path in sorted(audit.glob("dt=*/hour=*/*.jsonl")):
        for line in _read(path).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line (A3)
    if include_open:
        out += open_records(audit)
    return out


def open_records(audit: Path) -> list[dict[str, Any]]:
    """The whole lines of the file being written (or left open by a kill)."""
    out = []
    for path in sorted(audit.glob("dt=*/hour=*/.*.open")):
        for line in _read(path).split(b"\n")[:-1]:
            out.append(json.loads(line))
    return out


def _read(path: Path) -> bytes:
    """The file's bytes; none when a running writer renamed (closed) or the retention removed
    it since the listing (a closed file is read whole by the next look)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
