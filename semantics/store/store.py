"""The durable key -> bytes store: an in-memory map backed by a journal and snapshots.

Threads (group commit)
----------------------
``put``/``delete`` run on the event loop thread: under ``_lock`` they assign an LSN, change
the map and append the encoded record to the pending batch (a list of header, key and value
pieces: the value is referenced, not copied). ``sync()`` runs on a worker thread: under
``_sync_lock`` (so two syncs never interleave their writes) it swaps the pending batch out
under ``_lock``, joins it once, writes it with one ``write`` and fsyncs once, outside
``_lock``; the event loop keeps appending meanwhile. A sync that waited for another finds
its records already written and returns at once.

Compaction
----------
``maybe_compact()`` is meant to be called from the same worker thread after ``sync()``. It
holds ``_sync_lock`` only to flush the pending batch, copy the map and switch appends to a
new segment ``n+1``; the snapshot (``snapshot-<n+1>.snap``: the state at the end of segment
``n``) is written to a temp file, fsynced, renamed and the directory fsynced *without*
holding ``_sync_lock``, so other syncs keep committing meanwhile. Only then are the older
segments and snapshot removed. A crash at any step leaves either the old snapshot and all
segments after it, or the new snapshot (plus stale files that recovery removes).

A failing disk
--------------
When a write or fsync fails (a full disk, a file system remounted read-only, an I/O error)
the batch is not lost: it goes back to the front of the pending batch, the segment is cut
back to the end of the last batch that was written and fsynced (``_good_size``), and
``failed`` holds the error. ``put``/``delete`` keep working in memory meanwhile (an ack's
delete is journalled later, not refused), and the next ``sync()`` cuts the segment back
again and rewrites everything pending from memory, so a resumed store never counts on pages
whose write-back failed (the "fsyncgate" lesson: those pages were cut off, the bytes are
written anew and fsynced anew). ``durable_lsn`` only moves once a write and its fsync have
both succeeded; nothing is reported durable that is not.

Values left on disk
-------------------
A value of ``OFFLOAD_MIN`` bytes or more (any value, while a backlog builds: see ``_fold``)
is held in memory only until its batch is written:
``_write_batch`` then puts its location in the map in its place (unless a later put or
delete replaced it meanwhile: it checks the map still holds that very object), recovery
rebuilds the map with locations without copying a value out of the files, and a compaction
moves the locations into the snapshot it wrote before the old files go. ``get`` reads such a
value back with one ``pread`` under ``_lock`` (so no compaction closes the file under it);
``heads`` reads only the start of each value out of the mapped files, for a start-up pass
that needs no more. A value read back is not checked against its CRC again: recovery verified every
record it indexed, and a record the process wrote itself is checked at the next start
that replays the journal.

A clean close
-------------
``close()`` leaves a checkpoint of the map (checkpoint.py: keys by kind, locations, the
small values) when everything in it is on disk; the next open loads it instead of replaying
and checking every record (issue 15: 10^6 retained messages), and removes it before its
first write. A killed process leaves none, and its successor replays the journal as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
import sys
import threading
from array import array
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from .checkpoint import Item, LocatedRun, remove_checkpoint, write_checkpoint
from .errors import StoreClosedError, StoreCorruptError, StoreFailedError
from .files import DirLock, fsync_dir, list_numbered, segment_name, snapshot_name
from .format import (
    _FILE_SHIFT,
    _LEN_MASK,
    _OFF_MASK,
    BATCH_HEADER,
    DELETE,
    LOCATION_BYTES,
    MAX_KEY_BYTES,
    OFFLOAD_MIN,
    PUT,
    RECORD_HEADER,
    encode_batch_header,
    encode_record,
    iter_snapshot_chunks,
    location,
    location_file,
    location_length,
    location_offset,
    segment_file_id,
    snapshot_file_id,
)
from .packed import RUN_MIN, Packed
from .recovery import RecoveryReport, recover

__all__ = ["Store"]

# Compact when the journal (segments + snapshot) is above both of these.
COMPACT_RATIO = 2.0
COMPACT_MIN_BYTES = 32 << 20
# The fold (Store._fold): once the dict holds more than FOLD_AT entries the packed tier does
# not place, its oldest go to the tier until FOLD_KEEP are left (the newest: those a consumer
# keeping up acks soon, at the dict's speed), FOLD_SLICE at a time under the lock. Small, so
# that a backlog folds as it builds (issue 31: one of 10^5 never reached the old 131,072 and
# cost 171 B a message in the dict, against the tier's 37 B), while a consumer that keeps up
# (a backlog of a few thousand) never pays for a fold.
FOLD_AT = 8192
FOLD_KEEP = 4096
FOLD_SLICE = 4096
# The fold places at most this many dict keys (values kept in memory, keys that do not pack)
# before the next position: every later slice scans past them under the lock.
PLACE_MAX = 2 * FOLD_KEEP
# A backlog building gives glibc's free pages back (trim_heap) once this many entries folded
# since the last time, about once a fold: a trim took a median 3.7 ms on the sync thread
# (10^5 published, load 8), under 1 us a folded message; every 8,192 it left ~25 B a
# retained message more resident at 10^5 (issue 31).
TRIM_EVERY = 4096
# A compaction drops the pages it read through its source maps (_unmap_read) each time the
# snapshot has grown by this much.
UNMAP_EVERY = 32 << 20
# A tier less than half alive is rebuilt (Packed.repacked), or goes back to the dict when it
# has fewer than DROP_BELOW live entries.
DROP_BELOW = FOLD_KEEP // 2

_OVERHEAD = RECORD_HEADER.size

Value = bytes | int  # bytes in memory, or a location (format.py) of a value left on disk
Batch = tuple[list[bytes | bytearray], int, int, int, list[tuple[str, bytes, int]]]


def _disk_bytes(v: Value) -> int:
    return location_length(v) if type(v) is int else len(v)  # type: ignore[arg-type]


def _memory_bytes(v: Value) -> int:
    return LOCATION_BYTES if type(v) is int else len(v)  # type: ignore[arg-type]


def trim_heap() -> None:
    """Have glibc give back the free pages inside its heaps: what a drained backlog freed
    sits there in holes below live allocations, which the heap cannot shrink past (issue
    15: a drained restart of 10^6 messages held 2.7x its idle RSS). The store calls it only
    after its map shrank, so a few times per drain (each a quarter of the one before); the
    gateway once a drained backlog's objects are freed (gateway.broker.folding)."""
    if _libc is None:
        return
    with contextlib.suppress(AttributeError, OSError):
        _libc.malloc_trim(0)


def _unmap_read(maps: dict[int, mmap.mmap]) -> None:
    """Drop the pages a compaction has read through its source maps from the process (they
    stay in the page cache; one read again faults back in from there). Mapped pages count in
    RSS: compacting a drained-while-compacting backlog of 10^6 1 KB messages took the
    gateway from 155 to 789 MB for the nine seconds the snapshot took (issue 31 aim 3)."""
    if _MADV_DONTNEED is None:
        return
    for m in maps.values():
        with contextlib.suppress(OSError, ValueError):
            m.madvise(_MADV_DONTNEED)


_MADV_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


_libc = _load_libc()


def _interleave(placed: list[str], pos: dict[str, int], positions: Iterable[int]) -> Iterator[str | int]:
    """The dict keys ``placed`` (sorted by their place in ``pos``) and the packed
    ``positions`` (ascending) in one order: a key comes right before the packed entry of its
    place, and the keys placed after the last position come last (see Store._pos)."""
    i, n = 0, len(placed)
    for p in positions:
        while i < n and pos[placed[i]] <= p:
            yield placed[i]
            i += 1
        yield p
    yield from placed[i:]


def _ordered_items(hot: dict[str, Value], pos: dict[str, int] | None, packed: Packed | None,
                   live: bytes | bytearray) -> Iterator[tuple[str, Value, int]]:
    """(key, value, packed position or -1) of every entry of the dict ``hot`` and of the live
    entries (``live``) of ``packed``, in the order one dict would hold them (see Store._pos)."""
    if packed is None or pos is None:
        for k, v in hot.items():
            yield k, v, -1
        return
    placed = sorted((k for k in hot if k in pos), key=pos.__getitem__)
    key, value = packed.key, packed.value
    for x in _interleave(placed, pos, itertools.compress(range(len(live)), live)):
        if isinstance(x, int):
            yield key(x), value(x), x
        else:
            yield x, hot[x], -1
    for k, v in hot.items():
        if k not in pos:
            yield k, v, -1


def _checkpoint_items(hot: dict[str, Value], pos: dict[str, int] | None, packed: Packed | None) -> Iterator[Item]:
    """_ordered_items for a checkpoint: the packed tier's live entries as LocatedRuns, so that
    a clean close of 10^6 packed messages makes no string per key."""
    if packed is None or pos is None:
        yield from hot.items()
        return
    placed = sorted((k for k in hot if k in pos), key=pos.__getitem__)
    at = 0
    for k in [*placed, None]:
        cut = pos[k] if k is not None else len(packed.live)
        for g, f, counters, low in packed.runs(at, max(at, cut)):
            stem = packed.stems[g]
            if len(counters) >= RUN_MIN:
                yield LocatedRun(stem[:stem.find("/") + 1], f, packed.join_keys(g, counters), low)
            else:  # a short stretch (queues interleaved): entries, that _runs groups as a dict's
                bits = f << _FILE_SHIFT
                for c, lo in zip(counters, low, strict=True):
                    yield f"{stem}{c:016x}", bits | lo
        at = max(at, cut)
        if k is not None:
            yield k, hot[k]
    for k, v in hot.items():
        if k not in pos:
            yield k, v


class Store:
    """See the module docstring; open with :meth:`Store.open`."""

    def __init__(self, directory: str | None, *, fsync: bool = True, salvage: bool = False,
                 compact_min_bytes: int = COMPACT_MIN_BYTES, compact_ratio: float = COMPACT_RATIO,
                 lock: DirLock | None = None) -> None:
        self._dir = directory
        self._fsync = fsync
        self._compact_min_bytes = compact_min_bytes
        self._compact_ratio = compact_ratio
        self._lock = threading.Lock()  # the map, the LSN and the pending batch
        self._sync_lock = threading.Lock()  # the segment file: one writer at a time
        self._compact_lock = threading.Lock()  # one compaction at a time
        # pending[0] is a placeholder for the batch header, filled in by sync(). Deletes in a
        # row go into one bytearray at its end (see delete).
        self._pending: list[bytes | bytearray] = [b""]
        self._pending_bytes = 0
        # (key, value, offset of the value in the batch body): the values to leave on disk
        # once their batch is written.
        self._pending_big: list[tuple[str, bytes, int]] = []
        self._pending_first = 1
        self._durable = 0
        self._failed: BaseException | None = None
        self._good_size = 0  # segment bytes written and fsynced: a failed write is cut back to it
        self._closed = False
        self._file: BinaryIO | None = None
        self._dirlock: DirLock | None = None
        self._journal_bytes = 0  # segment bytes since the snapshot (written, not pending)
        self._snapshot_bytes = 0
        self.recovery = RecoveryReport()
        self._live_bytes = 0  # estimate of the snapshot size, for compaction_due
        self._memory = 0  # what the map holds in memory (values left on disk count their location)
        self._readers: dict[int, int] = {}  # file id -> a read-only fd (under _lock)
        self._peak = 0  # the map's largest size since it was last rebuilt (see _shrink)
        # The keys by kind (up to the first "/"), made by a prefix scan and dropped by the
        # next put or delete: see _keys.
        self._kinds: dict[str, list[str]] | None = None
        self._snapshot_n = 0  # the number of the snapshot the journal starts from (0: none)
        # Names this open's checkpoint (recovery.checkpoint_token at the next open), so that
        # a cache its owner writes at close can tell it belongs to that very state.
        self.checkpoint_token = os.urandom(8)
        self._checkpoint_left = False  # the checkpoint this open came from is still on disk
        # The packed tier (packed.py): entries a start loaded, looked at after the dict. A
        # dict key that a plain dict would iterate among them has its place in ``_pos``: it
        # comes right before the packed entry of that position (see _ordered).
        self._packed: Packed | None = None
        self._pos: dict[str, int] | None = None
        self._fold_again_at = 0  # see _fold
        self._folded = 0  # entries folded since the last trim_heap (see TRIM_EVERY)
        # A backlog is building (more than FOLD_KEEP unplaced keys in the dict at the last
        # sync): values of any size are left on disk once written, so that they can fold.
        self._offload_all = False
        if directory is None:
            self._map: dict[str, Value] = {}
            self._lsn = 0
            self._segment = 0
            return
        os.makedirs(directory, exist_ok=True)
        # A lock handed in stays its taker's to release (the gateway locks the data dir
        # before it opens the audit log there, so that a refused second one touches nothing).
        self._dirlock = DirLock(directory) if lock is None else None
        try:
            found = recover(directory, salvage=salvage, do_fsync=fsync)
        except BaseException:
            if self._dirlock is not None:
                self._dirlock.release()
            raise
        self._map = found.data
        self._packed, self._pos = found.packed, found.positions
        if self._packed is not None and self._pos is None:
            self._pos = {}
        self._lsn = self._durable = found.last_lsn
        self._pending_first = self._lsn + 1
        self._segment = found.segment
        self._journal_bytes = found.journal_bytes
        self._snapshot_bytes = found.snapshot_bytes
        self.recovery = found.report
        self._snapshot_n = found.snapshot
        if found.report.checkpoint:
            # Valid until the first write: a close before one leaves it as it is.
            self._checkpoint_left = True
            self.checkpoint_token = found.report.checkpoint_token
        self._file = open(os.path.join(directory, segment_name(self._segment)), "ab", buffering=0)  # noqa: SIM115 - lives as long as the store
        self._good_size = os.fstat(self._file.fileno()).st_size
        if found.live_bytes is not None and found.memory is not None:
            self._live_bytes, self._memory, self._kinds = found.live_bytes, found.memory, found.kinds
        else:
            keys = sum(map(len, self._map)) + _OVERHEAD * len(self._map)
            self._live_bytes = keys + sum(map(_disk_bytes, self._map.values()))
            self._memory = keys + sum(map(_memory_bytes, self._map.values()))
        self._peak = len(self._map)
        if found.needs_snapshot:
            # Salvage dropped damaged bytes: a fresh snapshot makes the next open clean.
            self.maybe_compact(force=True)

    @classmethod
    def open(cls, path: str | None, *, fsync: bool = True, salvage: bool = False,
             compact_min_bytes: int = COMPACT_MIN_BYTES, compact_ratio: float = COMPACT_RATIO,
             lock: DirLock | None = None) -> Store:
        """Open (creating or recovering) the store in directory ``path``; ``None``: in memory.

        ``fsync=False`` skips every fsync (tests, benchmarks): sync() then only reaches the OS.
        ``salvage=True`` opens despite corruption of durable data (see recovery.py).
        ``lock``: a DirLock on ``path`` the caller already holds (and releases after close()).
        """
        return cls(path, fsync=fsync, salvage=salvage, compact_min_bytes=compact_min_bytes,
                   compact_ratio=compact_ratio, lock=lock)

    # -- the event loop side ---------------------------------------------------------------

    def put(self, key: str, value: bytes) -> int:
        """Set ``key``; returns its LSN. Visible to ``get`` at once, durable after ``sync()``."""
        kb = key.encode()
        if len(kb) > MAX_KEY_BYTES:
            raise ValueError(f"store key of {len(kb)} bytes is above {MAX_KEY_BYTES}")
        if type(value) is not bytes:
            value = bytes(value)  # a caller's bytearray/memoryview may change under us
        with self._lock:
            self._check()
            self._lsn = lsn = self._lsn + 1
            old = self._map.get(key)
            moved = False
            if old is None and self._packed is not None:
                old = self._unpack(key)  # a packed key put again moves to the dict
                moved = old is not None
            self._map[key] = value
            size = len(kb) + len(value) + _OVERHEAD
            if old is None or moved:
                if self._kinds is not None:
                    # A start-up's own puts (its declarations) keep the kinds a checkpoint
                    # gave: a new key only joins its kind, at the end as in the map.
                    kind = key[:key.find("/") + 1]
                    found = self._kinds.get(kind)
                    if found is None:
                        self._kinds[kind] = [key]
                    else:
                        found.append(key)
                if len(self._map) > self._peak:
                    self._peak = len(self._map)
            if old is None:
                self._live_bytes += size
                self._memory += size
            else:
                self._live_bytes += len(value) - _disk_bytes(old)
                self._memory += len(value) - _memory_bytes(old)
            if self._file is not None:
                pending = self._pending
                if len(value) >= OFFLOAD_MIN or self._offload_all:
                    self._pending_big.append((key, value, self._pending_bytes + _OVERHEAD + len(kb)))
                pending.append(encode_record(PUT, lsn, kb, value))
                pending.append(kb)
                pending.append(value)
                self._pending_bytes += size
        return lsn

    def delete(self, key: str) -> int:
        """Remove ``key`` (absent is fine); returns the LSN of the delete."""
        kb = key.encode()
        with self._lock:
            self._check()
            self._lsn = lsn = self._lsn + 1
            self._kinds = None
            old = self._map.pop(key, None)
            if self._pos is not None:
                self._pos.pop(key, None)
                if old is None and self._packed is not None:
                    old = self._packed.take(key)
            if old is not None:
                self._live_bytes -= len(key) + _disk_bytes(old) + _OVERHEAD
                self._memory -= len(key) + _memory_bytes(old) + _OVERHEAD
            if self._file is not None:
                # Into one growing buffer, not two small bytes objects a delete: the worker
                # thread does not sync while it compacts (9-15 s at 10^6 messages), and a
                # backlog drained meanwhile piled its deletes here as small objects: CPython's
                # 1 MiB arenas went from 27 to 41, and 29-33 stayed after the drain, pinned by
                # what the event loop kept from that time (27 with the buffer; issue 31 aim 3).
                # A buffer past 512 bytes lives in malloc's heap, which the trims give back.
                tail = self._pending[-1]
                if type(tail) is bytearray:
                    tail += encode_record(DELETE, lsn, kb, b"")
                    tail += kb
                else:
                    tail = bytearray(encode_record(DELETE, lsn, kb, b""))
                    tail += kb
                    self._pending.append(tail)
                self._pending_bytes += len(kb) + _OVERHEAD
        return lsn

    def get(self, key: str) -> bytes | None:
        """The value of ``key`` (read back from its file when it was left on disk), or None."""
        v = self._map.get(key)
        if type(v) is not int and (v is not None or self._packed is None):
            return v  # type: ignore[return-value]
        with self._lock:
            self._check()  # its read fds are closed
            v = self._map.get(key)  # again: a compaction may have moved it meanwhile
            if v is None and self._packed is not None:
                v = self._packed.get(key)
            if type(v) is not int:
                return v  # type: ignore[return-value]
            return self._read(v)

    def _unpack(self, key: str) -> int | None:
        """Take ``key`` out of the packed tier, keeping its place for the dict (caller
        holds ``_lock``): its location, or None when it is not there."""
        assert self._packed is not None and self._pos is not None
        p = self._packed.find(key)
        if p < 0:
            return None
        self._packed.kill(p)
        self._pos[key] = p
        return self._packed.value(p)

    def _read(self, loc: int) -> bytes:
        """The value at ``loc`` (caller holds ``_lock``)."""
        file_id = location_file(loc)
        fd = self._readers.get(file_id)
        if fd is None:
            fd = self._readers[file_id] = os.open(self._path_of(file_id), os.O_RDONLY | os.O_CLOEXEC)
        length = location_length(loc)
        data = os.pread(fd, length, location_offset(loc))
        if len(data) != length:
            raise StoreCorruptError(f"{self._path_of(file_id)}: {length} bytes at offset {location_offset(loc)} "
                                    f"are past the end of the file")
        return data

    def _path_of(self, file_id: int) -> str:
        assert self._dir is not None
        n, snap = divmod(file_id, 2)
        return os.path.join(self._dir, snapshot_name(n) if snap else segment_name(n))

    def __contains__(self, key: str) -> bool:
        if key in self._map:
            return True
        if self._packed is None:
            return False
        with self._lock:
            return key in self._map or (self._packed is not None and self._packed.find(key) >= 0)

    def __len__(self) -> int:
        packed = self._packed
        return len(self._map) + (packed.n_live if packed is not None else 0)

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """Pairs whose key starts with ``prefix``, in no particular order.

        A copy is taken under the lock, so the caller may put/delete while iterating. It
        scans every key: meant for start-up and management, not for the hot path.
        """
        with self._lock:
            keys, values = self._ordered(prefix, True)
            return iter([(k, self._read(v) if type(v) is int else v)  # type: ignore[misc]
                         for k, v in zip(keys, values, strict=True)])

    def keys(self, prefix: str = "") -> list[str]:
        """The keys that start with ``prefix`` (no value is read): a copy, as for ``items``."""
        with self._lock:
            return self._keys(prefix)

    def _keys(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` in the map's order (caller holds ``_lock``)."""
        return self._ordered(prefix, False)[0]

    def _ordered(self, prefix: str, with_values: bool) -> tuple[list[str], list[Value]]:
        """The keys under ``prefix`` of both tiers, in the order one dict would hold them,
        and their values when asked (else []). Caller holds ``_lock``."""
        hot = self._hot_keys(prefix)
        m = self._map
        pos, packed = self._pos, self._packed
        if pos is None or packed is None:
            return hot, list(map(m.__getitem__, hot)) if with_values else []
        placed = [k for k in hot if k in pos]
        rest = [k for k in hot if k not in pos] if placed else hot
        keys: list[str]
        values: list[Value] = []
        if not placed and (found := packed.entries(prefix, with_values)) is not None:
            keys, values = found  # type: ignore[assignment]
        elif not placed:
            ps = packed.positions(prefix)
            keys = list(map(packed.key, ps))
            if with_values:
                values = list(map(packed.value, ps))
        else:
            placed.sort(key=pos.__getitem__)  # stable: equal places keep the dict's order
            keys = []
            for x in _interleave(placed, pos, packed.positions(prefix)):
                if isinstance(x, int):
                    keys.append(packed.key(x))
                    if with_values:
                        values.append(packed.value(x))
                else:
                    keys.append(x)
                    if with_values:
                        values.append(m[x])
        keys.extend(rest)
        if with_values:
            values.extend(map(m.__getitem__, rest))
        return keys, values

    def _hot_keys(self, prefix: str) -> list[str]:
        """The dict's keys under ``prefix`` (caller holds ``_lock``): a start-up scans 10^6 keys once
        per kind of record, so no (key, value) pair is made for a key that does not match."""
        if not prefix:
            return list(self._map)
        slash = prefix.find("/")
        if slash < 0:
            return [k for k in self._map if k.startswith(prefix)]
        if self._kinds is None:
            # One pass sorts every key by its kind; the start-up's scans (a handful of kinds,
            # each once) then each read only their own keys instead of all 10^6.
            kinds: dict[str, list[str]] = {}
            for k in self._map:
                kind = k[:k.find("/") + 1]
                found = kinds.get(kind)
                if found is None:
                    kinds[kind] = [k]
                else:
                    found.append(k)
            self._kinds = kinds
        keys = self._kinds.get(prefix[:slash + 1], [])
        if slash + 1 == len(prefix):
            return list(keys)
        return [k for k in keys if k.startswith(prefix)]

    def heads(self, prefix: str, size: int) -> Iterator[tuple[str, bytes, int]]:
        """``(key, the first size bytes of its value, the value's length)`` for the keys
        that start with ``prefix``: a start-up pass that needs only the head of each value
        (10^6 messages: their metadata) reads it straight from the mapped files, and no
        body is copied. A copy of the keys is taken first, as for ``items``."""
        with self._lock:
            keys, values = self._ordered(prefix, True)
            maps: dict[int, mmap.mmap] = {}
            for file_id in {location_file(v) for v in values if type(v) is int}:  # type: ignore[arg-type]
                with open(self._path_of(file_id), "rb") as f:
                    maps[file_id] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # location_file/offset/length inlined: this loop runs once per retained message.
        at, mapped, shift, off_mask, len_mask = -1, None, _FILE_SHIFT, _OFF_MASK, _LEN_MASK
        try:
            for k, v in zip(keys, values, strict=True):
                if type(v) is int:
                    if v >> shift != at:
                        at = v >> shift
                        mapped = maps[at]
                    off = (v >> 32) & off_mask
                    length = v & len_mask
                    yield k, mapped[off:off + (size if length > size else length)], length  # type: ignore[index]
                else:
                    yield k, v[:size], len(v)  # type: ignore[index,arg-type]
        finally:
            for m in maps.values():
                m.close()

    @property
    def fsync(self) -> bool:
        """Whether writes are fsynced (False: tests, benchmarks)."""
        return self._fsync

    @property
    def durable_lsn(self) -> int:
        """Every put/delete with an LSN up to this one is on disk (fsynced)."""
        return self._durable

    @property
    def last_lsn(self) -> int:
        """The LSN of the latest put/delete, durable or not."""
        return self._lsn

    @property
    def live_bytes(self) -> int:
        """Bytes of the keys and values held in memory (plus record headers): memory the
        store holds. A value left on disk counts as its location, not its length."""
        return self._memory

    @property
    def data_bytes(self) -> int:
        """Bytes of the live keys and values wherever they are (the next snapshot's size)."""
        return self._live_bytes

    @property
    def failed(self) -> BaseException | None:
        """The error of the last write or fsync when it failed; None once a sync succeeds."""
        return self._failed

    @property
    def pending_bytes(self) -> int:
        """Journal bytes appended but not yet synced: one input to the W5 high-water mark."""
        return self._pending_bytes

    @property
    def compaction_due(self) -> bool:
        """True when the journal is large enough, relative to the live data, to compact."""
        total = self._journal_bytes + self._pending_bytes + self._snapshot_bytes
        return (self._file is not None and total > self._compact_min_bytes
                and total > self._compact_ratio * self._live_bytes)

    # -- the worker thread side ------------------------------------------------------------

    def sync(self) -> int:
        """Write and fsync everything appended so far; returns the durable LSN. Blocking."""
        with self._sync_lock:
            return self._sync_locked()

    def _sync_locked(self) -> int:
        with self._lock:
            self._check()
            if self._file is None:  # in memory: everything applied is as durable as it gets
                self._durable = self._lsn
                return self._durable
            batch = self._take_batch()
        durable = self._write_batch(batch)
        packed = self._packed
        if packed is not None and packed.n_live * 2 < len(packed.live):
            if packed.n_live < DROP_BELOW:
                self._drop_packed()
            else:
                self._repack()
        unplaced = len(self._map) - len(self._pos or ())
        self._offload_all = unplaced > FOLD_KEEP
        if unplaced > max(FOLD_AT, self._fold_again_at):
            before = len(self._packed.live) if self._packed is not None else 0
            self._fold()
            self._folded += (len(self._packed.live) if self._packed is not None else 0) - before
            if self._folded >= TRIM_EVERY:
                # The bodies of what folded were written and freed meanwhile, in holes between
                # what stays (the tier's arrays, the queues' runs): glibc keeps those pages
                # until trimmed (issue 31: ~50 B a retained message at 10^5).
                self._folded = 0
                trim_heap()
        if self._peak > 4096 and len(self._map) * 4 < self._peak:
            self._shrink()
        return durable

    def _take_batch(self) -> Batch:
        """Swap the pending batch out (caller holds ``_lock``): (pieces, body bytes, first,
        last, the values to leave on disk once written)."""
        pending, self._pending = self._pending, [b""]
        body_len, self._pending_bytes = self._pending_bytes, 0
        big, self._pending_big = self._pending_big, []
        first, last = self._pending_first, self._lsn
        self._pending_first = last + 1
        return pending, body_len, first, last, big

    def _write_batch(self, batch: Batch) -> int:
        """Write one batch with one write and one fsync (caller holds ``_sync_lock``).

        On failure the batch goes back in front of what is pending, for the next sync."""
        pending, body_len, first, last, big = batch
        if last < first:
            return self._durable
        assert self._file is not None
        pending[0] = encode_batch_header(body_len, last - first + 1, first)
        data = b"".join(pending)
        start = self._good_size
        try:
            self._drop_checkpoint()
            if self._failed is not None:
                self._cut_back()  # a failed write may have left part of a batch behind
            self._write_all(data)
            if self._fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            self._put_back(pending, body_len, first, big, exc)
            raise StoreFailedError(f"store write failed: {exc!r}; retried by the next sync") from exc
        self._good_size += len(data)
        self._journal_bytes += len(data)
        self._durable = last
        self._failed = None
        if big:
            self._leave_on_disk(big, segment_file_id(self._segment), start + BATCH_HEADER.size)
        return last

    def _leave_on_disk(self, big: list[tuple[str, bytes, int]], file_id: int, base: int) -> None:
        """The values of a batch just written give way to their locations, unless a later
        put or delete replaced them meanwhile (then the map no longer holds that object)."""
        with self._lock:
            m = self._map
            freed = 0
            for key, value, offset in big:
                if m.get(key) is value:
                    m[key] = location(file_id, base + offset, len(value))
                    freed += len(value) - LOCATION_BYTES
            self._memory -= freed

    def _put_back(self, pieces: list[bytes | bytearray], body_len: int, first: int, big: list[tuple[str, bytes, int]],
                  exc: BaseException) -> None:
        """A batch that failed is pending again, ahead of what was appended meanwhile (the
        LSNs stay contiguous, so the next sync writes both as one batch)."""
        with self._lock:
            pieces[0] = b""
            pieces.extend(self._pending[1:])
            self._pending = pieces
            # The values appended meanwhile now sit behind the put-back batch body.
            big.extend((k, v, off + body_len) for k, v, off in self._pending_big)
            self._pending_big = big
            self._pending_bytes += body_len
            self._pending_first = first
            self._failed = exc
        try:
            self._cut_back()  # frees what the torn batch took on a full disk
        except OSError:
            pass  # read-only: cut back before the next write instead

    def _cut_back(self) -> None:
        """Drop whatever a failed write left after the last good batch."""
        assert self._file is not None
        fd = self._file.fileno()
        if os.fstat(fd).st_size != self._good_size:
            os.ftruncate(fd, self._good_size)

    def _write_all(self, data: bytes) -> None:
        assert self._file is not None
        view = memoryview(data)
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError("short write")
            view = view[n:]

    def maybe_compact(self, *, force: bool = False) -> bool:
        """Write a snapshot and drop old segments if the journal has grown enough (see
        ``compaction_due``); returns whether it compacted. Call it from the worker thread."""
        if self._file is None or not (force or self.compaction_due):
            return False
        if not self._compact_lock.acquire(blocking=False):
            return False
        try:
            self._compact()
        finally:
            self._compact_lock.release()
        return True

    def _compact(self) -> None:
        directory = self._dir
        assert directory is not None and self._file is not None
        with self._sync_lock:
            self._drop_checkpoint()  # before the new segment exists
            # The snapshot must hold exactly the state at the end of the segment we close, so
            # copy the map in the same critical section that swaps the pending batch out.
            with self._lock:
                self._check()
                state = dict(self._map)
                # The packed tier is not copied: only its tombstones change meanwhile (and
                # _relocate below, which this compaction alone runs).
                packed = self._packed
                pos = dict(self._pos) if self._pos is not None else None
                live = bytes(packed.live) if packed is not None else b""
                lsn = self._lsn
                batch = self._take_batch()
            self._write_batch(batch)
            old = self._segment
            new = old + 1
            # Opened before the old one is closed: a failure here leaves the store appending
            # to the old segment, as if no compaction had started.
            opened = open(os.path.join(directory, segment_name(new)), "xb", buffering=0)  # noqa: SIM115 - closed at rotation or close()
            self._file.close()
            self._file = opened
            self._good_size = 0
            if self._fsync:
                fsync_dir(directory)
            self._segment = new
            old_journal, self._journal_bytes = self._journal_bytes, 0
        # From here on syncs append to segment `new` while the snapshot is written.
        final = os.path.join(directory, snapshot_name(new))
        tmp = final + ".tmp"
        snap_id = snapshot_file_id(new)
        replaced = segment_file_id(new)  # every file id below it goes once the snapshot is in
        sources: dict[int, mmap.mmap] = {}

        def value_of(v: Value) -> bytes:
            if type(v) is not int:
                return v  # type: ignore[return-value]
            file_id = location_file(v)
            m = sources.get(file_id)
            if m is None:
                with open(self._path_of(file_id), "rb") as f:
                    m = sources[file_id] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            off = location_offset(v)
            return m[off:off + location_length(v)]

        # Where the packed entries land in the snapshot: their low bits by position (0: not
        # placed), or in ``wide`` when those do not fit in 64 bits.
        new_low = array("Q", bytes(8 * len(live)))
        wide: dict[int, int] = {}
        at = -1  # the packed position of the item being written, else -1

        def placed(key: str, offset: int, length: int) -> None:
            if at < 0:
                state[key] = location(snap_id, offset, length)  # an existing key: no resize
            elif (low := offset << 32 | length) < 1 << 64:
                new_low[at] = low
            else:
                wide[at] = low

        def values() -> Iterator[tuple[str, bytes]]:
            nonlocal at
            for k, v, p in _ordered_items(state, pos, packed, live):
                at = p
                yield k, value_of(v)

        try:
            size = 0
            with open(tmp, "wb") as f:
                count = len(state) + live.count(1)
                unmapped = 0
                for chunk in iter_snapshot_chunks(lsn, values(), count, placed=placed):
                    f.write(chunk)
                    size += len(chunk)
                    if size - unmapped >= UNMAP_EVERY:
                        unmapped = size
                        _unmap_read(sources)
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            for m in sources.values():
                m.close()
            sources.clear()
            os.replace(tmp, final)
            if self._fsync:
                fsync_dir(directory)
            self._snapshot_bytes = size
            self._snapshot_n = new
            if packed is not None:  # first: _relocate closes the old files' read fds
                self._relocate_packed(packed, new_low, wide, snap_id, replaced)
            self._relocate(state, replaced)
            segments, snapshots, _ = list_numbered(directory)
            for n in segments:
                if n < new:
                    os.unlink(os.path.join(directory, segment_name(n)))
            for n in snapshots:
                if n < new:
                    os.unlink(os.path.join(directory, snapshot_name(n)))
            if self._fsync:
                fsync_dir(directory)
        except OSError:
            # The old snapshot and segments are still complete; count them so we try again,
            # and give back the space a half-written snapshot took (a full disk).
            self._journal_bytes += old_journal
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            for m in sources.values():
                m.close()

    def _relocate(self, state: dict[str, Value], replaced: int) -> None:
        """Values left in files about to go (ids below ``replaced``) now live in the new
        snapshot: ``state`` holds their locations there. A map entry that points elsewhere
        was put after the snapshot's LSN and stays. The lock is taken per slice, so the
        event loop is not held up for the whole map."""
        items = iter(state.items())
        while True:
            with self._lock:
                m = self._map
                done = True
                for key, v in itertools.islice(items, 8192):
                    done = False
                    if type(v) is int:
                        cur = m.get(key)
                        if type(cur) is int and location_file(cur) < replaced:
                            m[key] = v
                if done:
                    # Every read from now on finds the new snapshot: the old files may close.
                    for file_id in [f for f in self._readers if f < replaced]:
                        os.close(self._readers.pop(file_id))
                    return

    def _relocate_packed(self, packed: Packed, new_low: array, wide: dict[int, int], snap_id: int,
                         replaced: int) -> None:
        """_relocate for the packed tier: ``new_low`` holds the new low bits by position. An
        entry put or deleted since is dead there; one whose new offset does not fit moves to
        the dict, in its place."""
        fid, low, alive = packed.fid, packed.low, packed.live
        for start in range(0, len(new_low), 65536):
            with self._lock:
                if self._packed is not packed:
                    return
                for p in range(start, min(start + 65536, len(new_low))):
                    nl = new_low[p]
                    if nl and alive[p] and fid[p] < replaced:
                        fid[p] = snap_id
                        low[p] = nl
        with self._lock:
            if self._packed is packed and self._pos is not None:
                for p, nl in wide.items():
                    if alive[p] and fid[p] < replaced:
                        key = packed.key(p)
                        packed.kill(p)
                        self._map[key] = snap_id << _FILE_SHIFT | nl
                        self._pos[key] = p
                        self._kinds = None

    def _fold(self) -> None:
        """The oldest entries of the dict that the tier does not place go to the tier, in
        the dict's order (so the one-dict order holds: they were before every entry still
        unplaced), until FOLD_KEEP are left: a backlog published to a running store then
        costs an entry of the tier (~40 B) instead of a key, an int and a slot (~175 B). An
        entry that cannot go there (not a message key, counted out of order, a value kept in
        memory) is placed before the next position instead; once PLACE_MAX are placed, the
        fold stops until the dict has grown by FOLD_AT. Small values are kept in memory only
        until a backlog builds (``_offload_all``), so a backlog of small messages folds too,
        past the few put before it.
        Not while a compaction runs (it relocates the tier by position). Caller holds
        ``_sync_lock``."""
        if not self._compact_lock.acquire(blocking=False):
            return
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    m = self._map
                    pos = self._pos if self._pos is not None else {}
                    unplaced = len(m) - len(pos)
                    if unplaced <= FOLD_KEEP:
                        return
                    keys = list(itertools.islice(itertools.filterfalse(pos.__contains__, m),
                                                 min(FOLD_SLICE, unplaced - FOLD_KEEP)))
                    values = list(map(m.__getitem__, keys))
                    if len(pos) + sum(type(v) is not int for v in values) > PLACE_MAX:
                        self._fold_again_at = unplaced + FOLD_AT
                        return
                    packed = self._packed if self._packed is not None else Packed.empty()
                    # Both before a key leaves the dict: get() and `in` read the dict unlocked
                    # and look in the tier when it is there.
                    self._packed, self._pos = packed, pos
                    self._kinds = None
                    if packed.append_run(keys, values):  # type: ignore[arg-type]
                        for k in keys:
                            del m[k]
                    else:
                        for k, v in zip(keys, values, strict=True):
                            if type(v) is int and packed.append(k, v):
                                del m[k]
                            else:
                                pos[k] = len(packed.live)
                    packed.settle()
        finally:
            self._compact_lock.release()

    def _repack(self) -> None:
        """A tier less than half alive is rebuilt with its live entries alone (a backlog that
        is consumed as fast as it is published would otherwise keep every tombstone); the
        dict's places move with them. Built outside the lock from a copy of the live flags
        (0.2-0.5 s at 10^6 positions: the event loop is not held up meanwhile), then swapped
        in under it with the deletes made since. Not while a compaction runs (it relocates
        by position); no fold runs meanwhile (the same thread). Caller holds ``_sync_lock``."""
        if not self._compact_lock.acquire(blocking=False):
            return
        try:
            with self._lock:
                packed, pos = self._packed, self._pos
                if packed is None or pos is None or self._closed:
                    return
                live = bytes(packed.live)
                places = list(pos.values())
            fresh, rank = packed.repacked(live, places)
            with self._lock:
                if self._packed is not packed or self._pos is None or self._closed:
                    return
                fresh.catch_up(packed, live, rank)
                # A place made since (a packed key put again) is at an entry alive in the copy.
                self._pos = {k: rank[p] for k, p in self._pos.items()}
                self._packed = fresh
        finally:
            self._compact_lock.release()
        trim_heap()

    def _drop_packed(self) -> None:
        """A packed tier that is mostly tombstones (a drained backlog) goes: its live
        entries move to a dict rebuilt in the map's order, and its arrays are freed
        (issue 15, target 3b). Not while a compaction runs (it relocates the tier): the
        next sync tries again. Caller holds ``_sync_lock``."""
        if not self._compact_lock.acquire(blocking=False):
            return
        try:
            with self._lock:
                packed = self._packed
                if packed is None:
                    return
                self._map = {k: v for k, v, _ in _ordered_items(self._map, self._pos, packed, packed.live)}
                self._packed = self._pos = self._kinds = None
                self._peak = len(self._map)
        finally:
            self._compact_lock.release()
        trim_heap()

    def _shrink(self) -> None:
        """A dict never gives back the table it grew to when its keys go: after 10^6 messages
        drained, the map kept tens of MB for a handful of keys. Rebuilt once it holds under a
        quarter of its peak (the copy costs at most a quarter of the growth it undoes)."""
        with self._lock:
            if self._peak > 4096 and len(self._map) * 4 < self._peak:
                self._map = dict(self._map)
                self._peak = len(self._map)
            else:
                return
        trim_heap()

    # -- life cycle ------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise StoreClosedError("store is closed")

    def close(self, *, sync: bool = True) -> None:
        """Sync what is pending (unless ``sync`` is False: it is dropped), then release the
        files. Idempotent. A sync that fails raises StoreFailedError after the release."""
        if self._closed:
            return
        try:
            if sync:
                self.sync()
        finally:
            # Wait for a compaction in progress: its snapshot must not race a new owner.
            with self._compact_lock, self._sync_lock, self._lock:
                self._closed = True
                if self._file is not None:
                    if sync:
                        self._checkpoint()
                    self._file.close()
                    self._file = None
                for fd in self._readers.values():
                    os.close(fd)
                self._readers.clear()
                if self._dirlock is not None:
                    self._dirlock.release()
                    self._dirlock = None

    def _drop_checkpoint(self) -> None:
        """Remove the checkpoint this open came from before the first write changes the
        files it describes (caller holds ``_sync_lock``). Raises OSError."""
        if self._checkpoint_left:
            assert self._dir is not None
            remove_checkpoint(self._dir, do_fsync=self._fsync)
            self._checkpoint_left = False
            self.checkpoint_token = os.urandom(8)

    def _checkpoint(self) -> None:
        """Leave the map's index for the next open (checkpoint.py) when everything in it is
        on disk (caller holds every lock; the file is still open). Nothing is lost without
        one: the next open replays the journal instead."""
        assert self._file is not None and self._dir is not None
        if self._checkpoint_left or self._failed is not None or self._durable != self._lsn or self._pending_bytes:
            return  # the one on disk still holds (nothing was written), or the map is not on disk
        try:
            if os.fstat(self._file.fileno()).st_size != self._good_size:
                return
            items = _checkpoint_items(self._map, self._pos, self._packed)
            write_checkpoint(self._dir, items, len(self), segment=self._segment,
                             segment_size=self._good_size, snapshot=self._snapshot_n,
                             snapshot_size=self._snapshot_bytes, lsn=self._lsn, do_fsync=self._fsync,
                             token=self.checkpoint_token)
        except OSError:
            pass  # a full or failing disk: the next open replays

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self._dir or "memory"
        return f"<Store {where} keys={len(self)} lsn={self._lsn} durable={self._durable}>"

