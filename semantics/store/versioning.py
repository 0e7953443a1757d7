"""The version of a store's key layout, and upgrading an older layout in one atomic batch.

The journal and snapshot formats (format.py) carry their own magic; what they cannot tell
is what the *keys* mean, which is the store user's business. So the user names the layout
version it writes, and the store keeps it under :data:`FORMAT_KEY` (no layout key has a
kind longer than one letter, so ``meta/...`` never falls inside a layout's scans):

* no version key and no data: a new store; the current version is written;
* no version key but data: version 0 (written before versions existed);
* an older version: every step up to the current one is applied, then the version is set;
* a newer version: :class:`StoreFormatError`, before anything is read or changed.

Crash safety: a step only *computes* renames (``old key -> new key``) from the records as
they are; all of them, deletes of the old keys before puts of the new ones (a new key may
equal another record's old key), and the new version are appended and synced as ONE batch.
A batch is applied whole or not at all on recovery (format.py: a torn last batch is cut
off), so a crash during the upgrade leaves the old layout with the old version (the next
open upgrades again) or the new layout with the new version, never a mix.

The cost is that batch: its bytes (every renamed record, written once more) are held in
memory once more while it is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .backend import StoreBackend as Store
from .errors import StoreError

__all__ = ["FORMAT_KEY", "Rekey", "StoreFormatError", "Upgrade", "read_version", "upgrade"]

FORMAT_KEY = "meta/format"

# One upgrade step: the key a record belongs under in the next version, given its key and
# value in this one; None leaves it where it is.
Rekey = Callable[[str, bytes], "str | None"]


class StoreFormatError(StoreError):
    """The store's key layout is newer than this program understands (or unreadable)."""


@dataclass(slots=True)
class Upgrade:
    """What :func:`upgrade` did (the broker logs it)."""

    found: int  # the version the store had (0: before versions)
    version: int  # the version it has now
    renamed: int = 0  # records moved to a new key


def read_version(store: Store) -> int | None:
    """The stored layout version; None for a store with neither a version nor data."""
    raw = store.get(FORMAT_KEY)
    if raw is None:
        return None if len(store) == 0 else 0
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise StoreFormatError(f"store key format {raw!r} is unreadable") from None


def upgrade(store: Store, current: int, steps: Mapping[int, Rekey]) -> Upgrade:
    """Bring ``store`` to layout version ``current``; ``steps[v]`` rekeys version v to v+1.

    Call it right after opening, before anything else writes (the pending batch must hold
    only the upgrade). Raises :class:`StoreFormatError` for a newer or unreadable version.
    """
    found = read_version(store)
    if found is None:
        store.put(FORMAT_KEY, str(current).encode())
        store.sync()
        return Upgrade(current, current)
    if found > current:
        raise StoreFormatError(f"store key format {found} is newer than this gateway's "
                               f"{current}: open it with the newer cmq-gateway that wrote it")
    result = Upgrade(found, current)
    if found == current:
        return result
    for version in range(found, current):
        rekey = steps[version]
        renames: dict[str, tuple[str, bytes]] = {}
        for key, value in store.items():
            if key == FORMAT_KEY:
                continue
            new = rekey(key, value)
            if new is not None and new != key:
                renames[key] = (new, value)
        for old in renames:
            store.delete(old)
        for new, value in renames.values():
            store.put(new, value)
        result.renamed += len(renames)
    store.put(FORMAT_KEY, str(current).encode())
    store.sync()
    return result
