"""W5: the resource alarms, as RabbitMQ has them: ``memory`` and ``disk``.

* memory: the bytes the broker holds (gateway/memory.py) above ``memory_high_watermark``;
  cleared below ``low_watermark_ratio`` of it, so that it does not flap.
* disk: the data directory's file system has less than ``disk_free_limit`` bytes free
  (``os.statvfs``, the space an unprivileged writer may use, as RabbitMQ's ``df``), or the
  store failed to write (a full disk, a read-only file system: the store retries, and the
  alarm clears when a write succeeds), or the store's files are above the optional
  ``store_high_watermark`` quota. The audit directory, when it is on a file system of its
  own, is held to the same ``disk_free_limit``: its writer waits for room rather than drop a
  record (A5), and the deliveries wait for its writer, so the publishers are stopped first,
  as they are for the store.

While either is in effect, publishers get ``connection.blocked`` and are no longer read
from; consumers keep flowing. The health checks and metrics read ``Alarms``.
"""

from __future__ import annotations

import os
from typing import Any

from gateway.memory import HELD

__all__ = ["Alarms", "rss_bytes"]


class Alarms:
    """The alarms in effect and the readings they were decided on, for one gateway."""

    def __init__(self) -> None:
        self.memory = False
        self.disk = False
        self.disk_why = ""  # why the disk alarm is set, for the log and the overview
        self.held = 0  # bytes held at the last check (messages, partial bodies and pre-login input,
        # retained MQTT messages, output, store)
        self.outgoing = 0  # bytes in the sockets' write buffers at the last tick
        self.disk_free: int | None = None  # free bytes of the data dir's file system

    @property
    def resources(self) -> list[str]:
        """RabbitMQ's resource names of the alarms in effect."""
        return [name for name, on in (("memory", self.memory), ("disk", self.disk)) if on]

    @property
    def reason(self) -> str:
        """The connection.blocked reason, in RabbitMQ's words."""
        return "low on " + " & ".join(self.resources) if self.resources else ""

    def held_bytes(self, broker: Any) -> int:
        """What the broker holds now; cheap (counters, no scan): the transport asks often."""
        store = getattr(broker, "store", None)
        return HELD.total + self.outgoing + (store.live_bytes if store is not None else 0)

    def check(self, limits: Any, broker: Any, data_dir: str | None, audit_dir: str | None = None) -> bool:
        """Re-decide both alarms; True when either changed."""
        self.held = held = self.held_bytes(broker)
        mark = limits.memory_high_watermark
        memory = held > (mark * limits.low_watermark_ratio if self.memory else mark)
        why = self._disk_reason(limits, broker, data_dir) or self._audit_reason(limits, data_dir, audit_dir)
        changed = memory != self.memory or bool(why) != self.disk
        self.memory, self.disk, self.disk_why = memory, bool(why), why
        return changed

    def _disk_reason(self, limits: Any, broker: Any, data_dir: str | None) -> str:
        if getattr(broker, "read_only", False):
            return f"the store cannot write: {broker.store.failed!r}"
        if data_dir is None:
            return ""
        self.disk_free = free = free_bytes(data_dir)
        if free is None:
            return ""
        if free < limits.disk_free_limit:
            return f"free disk space {free} is below disk_free_limit {limits.disk_free_limit}"
        quota = limits.store_high_watermark
        if quota and (used := store_bytes(data_dir)) > quota:
            return f"store size {used} is above store_high_watermark {quota}"
        return ""

    @staticmethod
    def _audit_reason(limits: Any, data_dir: str | None, audit_dir: str | None) -> str:
        if audit_dir is None:
            return ""
        try:
            if data_dir is not None and os.stat(audit_dir).st_dev == os.stat(data_dir).st_dev:
                return ""  # the data dir's reading covers it
        except OSError:
            return ""
        free = free_bytes(audit_dir)
        if free is not None and free < limits.disk_free_limit:
            return (f"free disk space {free} of the audit dir {audit_dir} is below disk_free_limit"
                    f" {limits.disk_free_limit}")
        return ""


def free_bytes(path: str) -> int | None:
    """What an unprivileged writer may still use of ``path``'s file system (``os.statvfs``, as
    RabbitMQ's ``df``); None when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def store_bytes(data_dir: str) -> int:
    """Bytes of the store's files (the top level of the data dir; audit/ is not the store)."""
    try:
        with os.scandir(data_dir) as entries:
            return sum(e.stat().st_size for e in entries if e.is_file(follow_symlinks=False))
    except OSError:
        return 0


def rss_bytes() -> int:
    """Resident memory now (not the peak that getrusage reports); 0 where /proc is missing.
    Shown next to the held bytes; the alarm no longer compares it (see gateway/memory.py)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
