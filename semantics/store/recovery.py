"""Rebuilding the live map from a store directory: newest snapshot, then the segments after it.

Policy on damage (the user must never lose a confirmed message):

* A damaged *last* batch of the *last* segment, with no valid batch after it, is a torn write
  of a batch that was never confirmed (its fsync had not returned). Its bytes are copied aside
  to ``journal-N.log.torn-<time>`` and the segment is truncated at the end of the last whole
  batch. The store opens normally; ``recovery.torn_bytes`` says how much was set aside.
* Damage with a valid batch after it (or in a segment that is not the last, or in a snapshot,
  or a gap in the LSN sequence) hits data that had been fsynced and confirmed. Dropping the
  later records would lose confirmed messages; dropping only the damaged ones would silently
  resurrect or lose single keys. So by default opening fails with :class:`StoreCorruptError`
  naming the file, offset and reason, and nothing is changed on disk. ``salvage=True`` keeps
  every batch that verifies, copies each damaged range aside (``.corrupt-<time>``), lists it
  in ``recovery.damaged`` and makes the store write a fresh snapshot at once, so the damage
  is reported once and not replayed again. Damaged data is never returned.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from dataclasses import dataclass, field

from .checkpoint import load_checkpoint, remove_checkpoint
from .errors import StoreCorruptError
from .files import fsync_dir, list_numbered, segment_name, set_aside, snapshot_name
from .format import (
    LOCATION_BYTES,
    PUT,
    RECORD_HEADER,
    BadBatch,
    Buffer,
    find_next_batch,
    location_length,
    parse_batch,
    parse_snapshot_header,
    parse_snapshot_records,
    segment_file_id,
    snapshot_file_id,
)
from .packed import Packed, pack_map

__all__ = ["Recovered", "RecoveryReport", "recover"]


@dataclass(slots=True)
class RecoveryReport:
    """What opening the store found (``store.recovery``)."""

    records: int = 0  # journal records replayed plus snapshot records loaded
    torn_bytes: int = 0  # bytes of a torn tail set aside (and of damage, with salvage)
    aside_path: str | None = None  # the last file damaged bytes were copied to
    seconds: float = 0.0
    snapshot_records: int = 0
    segments: int = 0
    damaged: list[str] = field(default_factory=list)  # one line per damaged range (salvage)
    aside_paths: list[str] = field(default_factory=list)
    checkpoint: bool = False  # the map came from a clean close's checkpoint, not a replay
    # That close's Store.checkpoint_token and LSN: what the store's owner may have left
    # alongside, for the same state, is valid when it names both.
    checkpoint_token: bytes = b""
    checkpoint_lsn: int = 0


@dataclass(slots=True)
class Recovered:
    # A large value is its location in a file (format.py, "Values left on disk"): the
    # bodies stay in the page cache or on disk, and only the index is rebuilt.
    data: dict[str, bytes | int]
    last_lsn: int
    segment: int  # number of the segment to append to
    segment_bytes: int  # its size
    journal_bytes: int  # bytes in all segments since the snapshot
    snapshot_bytes: int
    needs_snapshot: bool  # salvage found damage: write a fresh snapshot now
    report: RecoveryReport
    # From a checkpoint (checkpoint.py): the keys by kind and the byte counts the store
    # would otherwise compute with a pass over the map.
    kinds: dict[str, list[str]] | None = None
    live_bytes: int | None = None
    memory: int | None = None
    snapshot: int = 0  # the number of the snapshot the map starts from (0: none)
    # The bulk of the entries whose values are locations, packed (packed.py; ``data`` holds
    # the rest), and the positions of the entries of ``data`` among them (Store._pos).
    packed: Packed | None = None
    positions: dict[str, int] | None = None


def _map(path: str) -> Buffer:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        # The mapping outlives the file object; it is unmapped when the last slice view goes.
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def _note_aside(report: RecoveryReport, aside: str, nbytes: int) -> None:
    report.torn_bytes += nbytes
    report.aside_path = aside
    report.aside_paths.append(aside)


def _load_snapshot(path: str, file_id: int, salvage: bool, data: dict[str, bytes | int],
                   report: RecoveryReport, do_fsync: bool) -> tuple[int, bool]:
    """Load a snapshot into ``data``; returns (its lsn, whether salvage dropped something)."""
    buf = _map(path)
    try:
        lsn, count = parse_snapshot_header(buf)
        read, damage = parse_snapshot_records(buf, count, data, file_id)
    except BadBatch as exc:
        read, damage, lsn = 0, exc, -1
    report.snapshot_records = read
    report.records += read
    if damage is None:
        return lsn, False
    text = f"{path}: damaged snapshot at offset {damage.offset} ({damage.reason})"
    if not salvage or lsn < 0:
        # Without a readable header we do not even know which LSN the snapshot covers.
        raise StoreCorruptError(text + ("; open with salvage=True to keep the records that verify" if lsn >= 0 else ""))
    aside = set_aside(path, buf[damage.offset:], "corrupt", do_fsync=do_fsync)
    _note_aside(report, aside, len(buf) - damage.offset)
    report.damaged.append(text)
    return lsn, True


class _OutOfSequence(BadBatch):
    pass


def _replay_segment(
    path: str, file_id: int, last: bool, expected: int, resync: bool, salvage: bool,
    data: dict[str, bytes | int], report: RecoveryReport, do_fsync: bool,
) -> tuple[int, int, bool]:
    """Apply the batches of one segment.

    Returns (last lsn, segment size after, resync). ``resync`` is true while salvage is
    skipping damage: the next batch that verifies is accepted whatever LSN it starts at.
    """
    buf = _map(path)
    size = len(buf)
    pos = 0
    while pos < size:
        try:
            batch = parse_batch(buf, pos, file_id)
            first = batch.first_lsn
            if first != expected + 1 and not (resync and first > expected):
                raise _OutOfSequence(pos, f"batch starts at lsn {first}, expected {expected + 1}")
        except BadBatch as exc:
            nxt = find_next_batch(buf, pos)
            # A batch that verifies but is out of sequence was not torn: batches are lost.
            if nxt == -1 and last and not resync and not isinstance(exc, _OutOfSequence):
                # Torn write of an unconfirmed batch: set it aside and cut it off.
                try:
                    aside = set_aside(path, buf[pos:], "torn", do_fsync=do_fsync)
                    _note_aside(report, aside, size - pos)
                except OSError as full:
                    if full.errno != errno.ENOSPC:
                        raise
                    # A full disk has no room for the copy; the batch was never confirmed,
                    # so cutting it off loses nothing, and the store still opens (W5).
                    report.torn_bytes += size - pos
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    if do_fsync:
                        os.fsync(f.fileno())
                return expected, pos, False
            stop = size if nxt == -1 else nxt
            text = f"{path}: damaged durable data at offset {pos}..{stop} ({exc.reason})"
            if not salvage:
                raise StoreCorruptError(
                    text + "; it is not a torn write of the last, unconfirmed batch. "
                    "Nothing was changed on disk; open with salvage=True to keep every record "
                    "that verifies and copy the damaged bytes aside")
            aside = set_aside(path, buf[pos:stop], "corrupt", do_fsync=do_fsync)
            _note_aside(report, aside, stop - pos)
            report.damaged.append(text)
            resync = True
            pos = stop
            continue
        for kind, key, value in batch.ops:
            if kind == PUT:
                data[key] = value
            else:
                data.pop(key, None)
        report.records += len(batch.ops)
        expected = first + len(batch.ops) - 1
        resync = False
        pos = batch.end
    return expected, size, resync


def recover(directory: str, *, salvage: bool = False, do_fsync: bool = True) -> Recovered:
    started = time.perf_counter()
    report = RecoveryReport()
    segments, snapshots, temps = list_numbered(directory)
    changed = False
    for name in temps:  # a snapshot being written when the process died: never renamed, so unused
        os.unlink(os.path.join(directory, name))
        changed = True

    data: dict[str, bytes | int] = {}
    needs_snapshot = False
    snapshot_bytes = 0
    last_lsn = 0
    if snapshots:
        first = snapshots[-1]
        snapshot_bytes = os.path.getsize(os.path.join(directory, snapshot_name(first)))
        # Older snapshots and segments before the newest snapshot are what a compaction had
        # not yet removed when it was interrupted; the snapshot replaces them.
        for n in snapshots[:-1]:
            os.unlink(os.path.join(directory, snapshot_name(n)))
            changed = True
        for n in [s for s in segments if s < first]:
            os.unlink(os.path.join(directory, segment_name(n)))
            changed = True
        segments = [s for s in segments if s >= first]
    else:
        first = segments[0] if segments else 1
        if first != 1:
            raise StoreCorruptError(
                f"{directory}: no snapshot and the journal starts at segment {first}: "
                "earlier segments are missing")
    if segments and segments != list(range(first, first + len(segments))):
        missing = sorted(set(range(first, segments[-1] + 1)) - set(segments))
        raise StoreCorruptError(f"{directory}: journal segments {missing} are missing")

    # A clean close left the map's index (checkpoint.py): used when it describes exactly
    # these files (the store removes it before it first writes), else removed now.
    checkpoint = None if changed or not segments else load_checkpoint(directory, segments, first if snapshots else 0)
    if checkpoint is None:
        remove_checkpoint(directory, do_fsync=do_fsync)
    else:
        report.records = len(checkpoint.data)
        report.segments = len(segments)
        report.checkpoint = True
        report.checkpoint_token = checkpoint.token
        report.checkpoint_lsn = checkpoint.last_lsn
        sizes = [os.path.getsize(os.path.join(directory, segment_name(n))) for n in segments]
        if changed and do_fsync:
            fsync_dir(directory)
        report.seconds = time.perf_counter() - started
        return Recovered(checkpoint.data, checkpoint.last_lsn, segments[-1], sizes[-1], sum(sizes), snapshot_bytes,
                         False, report, checkpoint.kinds, checkpoint.live_bytes, checkpoint.memory,
                         first if snapshots else 0, checkpoint.packed, checkpoint.positions)

    if snapshots:
        path = os.path.join(directory, snapshot_name(first))
        last_lsn, needs_snapshot = _load_snapshot(path, snapshot_file_id(first), salvage, data, report, do_fsync)

    journal_bytes = 0
    segment_bytes = 0
    resync = needs_snapshot
    for i, n in enumerate(segments):
        last_lsn, segment_bytes, resync = _replay_segment(
            os.path.join(directory, segment_name(n)), segment_file_id(n), i == len(segments) - 1, last_lsn,
            resync, salvage, data, report, do_fsync)
        journal_bytes += segment_bytes
    needs_snapshot = needs_snapshot or bool(report.damaged)
    report.segments = len(segments)

    segment = segments[-1] if segments else first
    if not segments:
        # A fresh store, or the segment after a snapshot was lost: start appending to it.
        with open(os.path.join(directory, segment_name(segment)), "xb"):
            pass
        changed = True
    if changed and do_fsync:
        fsync_dir(directory)
    # The byte counts over the whole map, then the bulk of it packed (packed.py).
    keys = sum(map(len, data)) + RECORD_HEADER.size * len(data)
    live_bytes = keys + sum(location_length(v) if type(v) is int else len(v) for v in data.values())  # type: ignore[misc,arg-type]
    memory = keys + sum(LOCATION_BYTES if type(v) is int else len(v) for v in data.values())  # type: ignore[misc,arg-type]
    data, packed, positions = pack_map(data)
    report.seconds = time.perf_counter() - started
    return Recovered(data, last_lsn, segment, segment_bytes, journal_bytes, snapshot_bytes, needs_snapshot, report,
                     None, live_bytes, memory, first if snapshots else 0, packed, positions)
