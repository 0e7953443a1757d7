"""What the store raises. None of these is a CMQ refusal: they mean the disk let us down."""

from __future__ import annotations

__all__ = ["StoreClosedError", "StoreCorruptError", "StoreError", "StoreFailedError", "StoreLockedError"]


class StoreError(Exception):
    """Base class of the store's own failures."""


class StoreLockedError(StoreError):
    """Another process (or another Store object) has the directory open."""


class StoreClosedError(StoreError):
    """The store was closed."""


class StoreFailedError(StoreError):
    """A write or fsync failed (a full disk, a read-only file system, an I/O error).

    Nothing is lost from memory: the batch is pending again and the next ``sync()`` retries
    it. After a failed fsync the kernel may already have dropped the dirty pages, so merely
    fsyncing again could report as durable something that is not (the "fsyncgate" lesson):
    the retry cuts the segment back to its last good batch and writes the bytes anew.
    """


class StoreCorruptError(StoreError):
    """Durable data is damaged. Opening again with ``salvage=True`` keeps every record that
    verifies, copies the damaged bytes aside and says so in ``store.recovery``."""
