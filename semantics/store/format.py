"""The on-disk format of the store: batches of records in journal segments, and snapshots.

Theory of operation
-------------------
A journal segment (``journal-<n>.log``) is a sequence of *batches*. One ``Store.sync()``
writes exactly one batch with one ``write`` and one ``fsync`` (group commit)::

    batch   = BATCH_HEADER record*
    BATCH_HEADER = magic "CQJB" | body_len u64 | count u32 | first_lsn u64 | crc32 u32
    record  = crc32 u32 | type u8 | key_len u16 | value_len u32 | lsn u64 | key | value

The batch header CRC covers the 24 bytes before it; a record CRC covers everything after its
own CRC field (header rest, key, value), so one ``zlib.crc32`` call checks a record. Records
of one batch carry consecutive LSNs starting at ``first_lsn``.

Why batches and not just records (ZODB frames transactions the same way): a batch is written
only after the previous batch's ``fsync`` returned, because ``sync()`` calls are serialized.
So if any valid batch header lies *after* a damaged spot, the damaged bytes had been fsynced
and confirmed: that is corruption of durable data, not a torn write. A damaged last batch
with nothing valid after it is a torn write of a batch that was never confirmed. A power
loss may persist pages of the unsynced last batch out of order; only batch headers prove
order, so record-level holes inside the last batch are still classified as torn.

A snapshot (``snapshot-<n>.snap``) holds the live map as of the end of segment ``n - 1``::

    SNAPSHOT_HEADER = magic "CQS1" | lsn u64 | count u64 | crc32 u32
    followed by ``count`` PUT records (each with its own CRC), then end of file.

Values left on disk
-------------------
A value of at least ``OFFLOAD_MIN`` bytes is not kept in memory once it is on disk: the map
holds its *location* instead, one int packing the file, the offset and the length
(:func:`location`), and the value is read back when asked for. 10^6 message bodies were
10^6 bytes objects in the map (and as many copied out of the files at every start); an int
is 36 bytes. File ids: segment ``n`` is ``2n``, snapshot ``n`` is ``2n + 1``, so every file
a compaction replaces (segments and snapshots numbered below the new snapshot ``n``) has an
id below ``2n``.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# What the parsers read: a file read into bytes or mapped. Slicing either gives bytes, so the
# values handed out never point into a mapping that is later closed.
Buffer = bytes | mmap.mmap

__all__ = [
    "BATCH_HEADER",
    "Buffer",
    "BATCH_MAGIC",
    "BadBatch",
    "DELETE",
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "PUT",
    "RECORD_HEADER",
    "SNAPSHOT_HEADER",
    "SNAPSHOT_MAGIC",
    "Batch",
    "OFFLOAD_MIN",
    "LOCATION_BYTES",
    "encode_batch_header",
    "encode_record",
    "encode_snapshot_header",
    "find_next_batch",
    "iter_snapshot_chunks",
    "location",
    "location_file",
    "location_length",
    "location_offset",
    "parse_batch",
    "parse_snapshot_header",
    "parse_snapshot_records",
    "segment_file_id",
    "snapshot_file_id",
]

BATCH_MAGIC = b"CQJB"
SNAPSHOT_MAGIC = b"CQS1"
PUT = 0x50  # 'P'
DELETE = 0x44  # 'D'

BATCH_HEADER = struct.Struct("<4sQIQI")
RECORD_HEADER = struct.Struct("<IBHIQ")
SNAPSHOT_HEADER = struct.Struct("<4sQQI")

MAX_KEY_BYTES = 0xFFFF
MAX_VALUE_BYTES = 0xFFFFFFFF

_REC_PREFIX = struct.Struct("<BHIQ")  # the part of RECORD_HEADER after the CRC
_crc32 = zlib.crc32

# Values from this size on stay on disk once written (see "Values left on disk"): below it
# the bytes object costs little more than its location and a read would cost more than it saves.
OFFLOAD_MIN = 128
# What a value left on disk costs in memory: its location (an int of three 30-bit digits).
LOCATION_BYTES = 36

# A location: file id << 72 | offset << 32 | length (offsets below 2^40, lengths below 2^32).
_OFF_SHIFT = 32
_FILE_SHIFT = 72
_LEN_MASK = (1 << 32) - 1
_OFF_MASK = (1 << 40) - 1


def segment_file_id(n: int) -> int:
    return 2 * n


def snapshot_file_id(n: int) -> int:
    return 2 * n + 1


def location(file_id: int, offset: int, length: int) -> int:
    return (file_id << _FILE_SHIFT) | (offset << _OFF_SHIFT) | length


def location_file(loc: int) -> int:
    return loc >> _FILE_SHIFT


def location_offset(loc: int) -> int:
    return (loc >> _OFF_SHIFT) & _OFF_MASK


def location_length(loc: int) -> int:
    return loc & _LEN_MASK


def encode_record(kind: int, lsn: int, key: bytes, value: bytes) -> bytes:
    """The record header; the caller appends ``key`` and ``value`` (no copy of the value)."""
    prefix = _REC_PREFIX.pack(kind, len(key), len(value), lsn)
    crc = _crc32(value, _crc32(key, _crc32(prefix)))
    return crc.to_bytes(4, "little") + prefix


def encode_batch_header(body_len: int, count: int, first_lsn: int) -> bytes:
    head = BATCH_HEADER.pack(BATCH_MAGIC, body_len, count, first_lsn, 0)[:-4]
    return head + _crc32(head).to_bytes(4, "little")


def encode_snapshot_header(lsn: int, count: int) -> bytes:
    head = SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, lsn, count, 0)[:-4]
    return head + _crc32(head).to_bytes(4, "little")


@dataclass(slots=True)
class Batch:
    """One verified batch: its byte range and its operations, in LSN order."""

    start: int
    end: int
    first_lsn: int
    # (kind, key, value); value is b"" for a delete, a location (int) for a value left on disk.
    ops: list[tuple[int, str, bytes | int]]


class BadBatch(Exception):
    """The batch at ``offset`` failed a check; ``reason`` says which."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def _batch_header_ok(data: Buffer, pos: int) -> tuple[int, int, int] | None:
    if len(data) - pos < BATCH_HEADER.size:
        return None
    magic, body_len, count, first_lsn, crc = BATCH_HEADER.unpack_from(data, pos)
    if magic != BATCH_MAGIC or _crc32(memoryview(data)[pos:pos + BATCH_HEADER.size - 4]) != crc:
        return None
    return body_len, count, first_lsn


def parse_batch(data: Buffer, pos: int, file_id: int = -1) -> Batch:
    """Verify and decode the batch at ``pos`` or raise :class:`BadBatch`.

    Nothing of a batch is returned unless every record in it checks out, so a caller applies
    whole batches only (one batch = one sync = one unit of durability). With a ``file_id``
    (>= 0) a value of OFFLOAD_MIN bytes or more comes back as its location in that file.
    """
    size = len(data)
    header = _batch_header_ok(data, pos)
    if header is None:
        reason = "short batch header" if size - pos < BATCH_HEADER.size else "bad batch header"
        raise BadBatch(pos, reason)
    body_len, count, first_lsn = header
    end = pos + BATCH_HEADER.size + body_len
    if end > size:
        raise BadBatch(pos, f"batch of {body_len} bytes runs past end of file ({size})")
    view = memoryview(data)
    unpack = RECORD_HEADER.unpack_from
    hsize = RECORD_HEADER.size
    ops: list[tuple[int, str, bytes | int]] = []
    append = ops.append
    big = OFFLOAD_MIN if file_id >= 0 else 1 << 40
    file_bits = file_id << _FILE_SHIFT
    r = pos + BATCH_HEADER.size
    lsn = first_lsn
    for _ in range(count):
        if end - r < hsize:
            raise BadBatch(pos, f"record at {r} runs past its batch")
        crc, kind, klen, vlen, rec_lsn = unpack(data, r)
        k0 = r + hsize
        v0 = k0 + klen
        nxt = v0 + vlen
        if nxt > end:
            raise BadBatch(pos, f"record at {r} runs past its batch")
        if _crc32(view[r + 4:nxt]) != crc:
            raise BadBatch(pos, f"record at {r}: CRC mismatch")
        if rec_lsn != lsn or kind not in (PUT, DELETE):
            raise BadBatch(pos, f"record at {r}: lsn {rec_lsn} / type {kind} out of sequence")
        if kind != PUT:
            value: bytes | int = b""
        elif vlen >= big:
            value = file_bits | (v0 << _OFF_SHIFT) | vlen
        else:
            value = data[v0:nxt]
        append((kind, str(view[k0:v0], "utf-8"), value))
        lsn += 1
        r = nxt
    if r != end:
        raise BadBatch(pos, f"batch holds {end - r} bytes after its {count} records")
    return Batch(pos, end, first_lsn, ops)


def find_next_batch(data: Buffer, pos: int) -> int:
    """The offset of the next valid batch header after ``pos``, or -1.

    Used only after damage, to tell a torn tail (nothing valid follows) from corruption of
    durable data (a later, confirmed batch follows).
    """
    at = data.find(BATCH_MAGIC, pos + 1)
    while at != -1:
        if _batch_header_ok(data, at) is not None:
            return at
        at = data.find(BATCH_MAGIC, at + 1)
    return -1


def parse_snapshot_header(data: Buffer) -> tuple[int, int]:
    """``(lsn, count)`` of a snapshot, or :class:`BadBatch` at offset 0."""
    if len(data) < SNAPSHOT_HEADER.size:
        raise BadBatch(0, "short snapshot header")
    magic, lsn, count, crc = SNAPSHOT_HEADER.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC or _crc32(memoryview(data)[:SNAPSHOT_HEADER.size - 4]) != crc:
        raise BadBatch(0, "bad snapshot header")
    return lsn, count


def parse_snapshot_records(
    data: Buffer, count: int, into: dict[str, bytes | int], file_id: int = -1
) -> tuple[int, BadBatch | None]:
    """Load up to ``count`` records into ``into``; returns (records read, damage or None).
    With a ``file_id`` (>= 0) large values come back as locations, as in :func:`parse_batch`."""
    size = len(data)
    big = OFFLOAD_MIN if file_id >= 0 else 1 << 40
    file_bits = file_id << _FILE_SHIFT
    view = memoryview(data)
    unpack = RECORD_HEADER.unpack_from
    hsize = RECORD_HEADER.size
    r = SNAPSHOT_HEADER.size
    for n in range(count):
        if size - r < hsize:
            return n, BadBatch(r, "snapshot record header runs past end of file")
        crc, kind, klen, vlen, _lsn = unpack(data, r)
        k0 = r + hsize
        v0 = k0 + klen
        nxt = v0 + vlen
        if nxt > size or kind != PUT or _crc32(view[r + 4:nxt]) != crc:
            return n, BadBatch(r, "bad snapshot record")
        into[str(view[k0:v0], "utf-8")] = file_bits | (v0 << _OFF_SHIFT) | vlen if vlen >= big else data[v0:nxt]
        r = nxt
    if r != size:
        return count, BadBatch(r, f"{size - r} unexpected bytes after the last snapshot record")
    return count, None


def iter_snapshot_chunks(
    lsn: int, items: Iterable[tuple[str, bytes]], count: int, chunk_bytes: int = 1 << 20,
    placed: Callable[[str, int, int], None] | None = None,
) -> Iterable[bytes]:
    """The snapshot file's bytes in chunks of about ``chunk_bytes`` (one join per chunk).
    ``placed(key, offset, length)`` is told where each value lands: a value of any size may be
    one the map holds as a location (a store left small values on disk while a backlog built),
    and that location must move to the snapshot too."""
    head = encode_snapshot_header(lsn, count)
    pieces: list[bytes] = [head]
    size = 0
    pos = len(head)
    hsize = RECORD_HEADER.size
    for key, value in items:
        kb = key.encode()
        pieces.append(encode_record(PUT, lsn, kb, value))
        pieces.append(kb)
        pieces.append(value)
        n = len(kb) + len(value) + hsize
        if placed is not None:
            placed(key, pos + hsize + len(kb), len(value))
        pos += n
        size += n
        if size >= chunk_bytes:
            yield b"".join(pieces)
            pieces.clear()
            size = 0
    if pieces:
        yield b"".join(pieces)
