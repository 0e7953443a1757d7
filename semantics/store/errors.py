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
    """A write or fsync failed earlier; the store refuses further work.

    After a failed fsync the kernel may already have dropped the dirty pages, so retrying
    could report as durable something that is not (the "fsyncgate" lesson). The gateway must
    nack what it has not confirmed and restart, which recovers from what is really on disk.
    """


class StoreCorruptError(StoreError):
    """Durable data is damaged. Opening again with ``salvage=True`` keeps every record that
    verifies, copies the damaged bytes aside and says so in ``store.recovery``."""
