"""What the formatter tests share: scenario 1's rows, and the files and counts a writer makes
of a batch (test_batch_format.py, test_format_c.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gateway.audit.rows import ACK, DELIVER, ENQUEUE, PUBLISH_QUEUE
from gateway.audit.writer import AuditLog

BASE = 1_790_000_000.0


def scenario_1(n: int, t: float) -> list[Any]:
    """The rows of ``n`` messages of scenario 1 (publish, enqueue, deliver, ack), from ``t``."""
    out: list[Any] = []
    for i in range(n):
        mid = f"msg-{i:016x}"
        out += [(t, PUBLISH_QUEUE.id, "/", ("perf-q", "perf-q", mid, 16, "guest", "127.0.0.1:5001")),
                (t + 1e-6, ENQUEUE.id, "/", ("perf-q", mid, 16, None, None)),
                (t + 2e-6, DELIVER.id, "/", ("guest", "127.0.0.1:5002", "perf-q", mid, 1, 16)),
                (t + 3e-6, ACK.id, "/", ("guest", "127.0.0.1:5002", "perf-q", mid, 0.25 * i))]
        t += 1e-5
    return out


def written(directory: str, items: list[Any], rotate_bytes: int, cut: int,
            fmt_of: Callable[[AuditLog], Callable[..., Any]]) -> Any:
    """The error type (or None), the files, the counts and the written count of a writer on
    ``directory`` that formats ``items`` in two calls (cut at ``cut``) with ``fmt_of(log)``."""
    log = AuditLog(directory, process=False, _thread=False, rotate_bytes=rotate_bytes)
    fmt = fmt_of(log)
    outcome: Any = None
    try:
        for part in (items[:cut], items[cut:]):  # the second call finds the file open
            log._write(*fmt(part, bytearray(), 0, "", "")[:2])
    except Exception as e:  # the reference's error must be the other path's too
        outcome = type(e)
    log._close_file()
    files = []
    for root, _, names in sorted(os.walk(directory)):
        for name in sorted(names):
            with open(os.path.join(root, name), "rb") as f:
                files.append((os.path.relpath(os.path.join(root, name), directory), f.read()))
    return outcome, files, log.counts, log.written
