"""The durable key -> bytes store of the gateway (see docs/ARCHITECTURE.md, "semantics.store").

``Store.open(path)`` opens a directory of journal segments and snapshots; ``Store.open(None)``
gives the same API in memory. See store.py for threads and compaction, format.py for the
bytes on disk and recovery.py for what happens to damaged files.
"""

from __future__ import annotations

from .errors import StoreClosedError, StoreCorruptError, StoreError, StoreFailedError, StoreLockedError
from .recovery import RecoveryReport
from .store import Store, trim_heap
from .versioning import StoreFormatError

__all__ = [
    "RecoveryReport",
    "Store",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreError",
    "StoreFailedError",
    "StoreFormatError",
    "StoreLockedError",
    "trim_heap",
]
