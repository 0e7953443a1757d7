"""The checkpoint a clean close leaves behind: the live map's index, so the next open need not
replay the journal (issue 15: a restart with 10^6 retained messages spent most of its time
re-reading and re-checking every record of a 1 GB journal to rebuild an index it had at close).

What it holds
-------------
``checkpoint.idx``: a header, then the map as *runs* of consecutive entries (in the map's
order, which the broker's recovery relies on: it is the enqueue order) that share a key kind
(up to the first ``/``) and either a file their values were left in or "in memory"::

    HEADER = magic "CQK1" | segment u32 | segment_size u64 | snapshot u32 | snapshot_size u64
             | lsn u64 | count u64 | live_bytes u64 | memory u64 | body_len u64 | body_crc u32
             | token 8s | tail_len u16 | tail | header_crc u32
    tail   = the last bytes of the segment (up to 64), then the snapshot's header (if any)
    run    = RUN | kind | keys ("\\0"-joined UTF-8) | values
    RUN    = form u8 | file_id u32 | count u32 | kind_len u16 | keys_len u64 | values_len u64

Values of a run of ``form`` LOCATED are the locations' low bits (offset << 32 | length) as
u64s when every offset is below 2^32, else (WIDE) the offsets then the lengths as u64s; of
form INLINE their lengths as u32s then their bytes. A run is decoded with a handful of
C-level calls (``str.split``, ``array.frombytes``, ``dict.update``): no Python code runs per
entry unless the values are kept in memory.

When it is used
---------------
Only when it describes exactly the files found: the same last segment with the same size,
the same snapshot with the same size, the same tail bytes (the end of the segment, the
snapshot's header with its LSN and CRC), no segment missing in between, and its own CRCs
check out. Anything else (a torn or partial checkpoint, a journal that grew after it: a put
after an open that died with kill -9) and the journal is replayed as before. The store
removes the checkpoint it opened from before its first write (a batch or a compaction; an
open that writes nothing leaves it, still exact), and a stale one at once, so a checkpoint
never outlives the state it describes; the size and tail checks guard against one whose removal
never reached the disk. Values are not checked against their record CRCs again: recovery
(or the process that wrote them) checked every one before it was indexed.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from . import packed as _packed
from .files import fsync_dir, segment_name, snapshot_name
from .format import LOCATION_BYTES, RECORD_HEADER, SNAPSHOT_HEADER
from .packed import Packed, PackedBuilder

__all__ = ["CHECKPOINT_NAME", "Checkpoint", "LocatedRun", "load_checkpoint", "remove_checkpoint", "write_checkpoint"]

CHECKPOINT_NAME = "checkpoint.idx"
MAGIC = b"CQK1"
HEADER = struct.Struct("<4sIQIQQQQQQI8sH")  # then the tail, then the CRC of both
RUN = struct.Struct("<BIIHQQ")
LOCATED, WIDE, INLINE = 1, 2, 3
TAIL_BYTES = 64
_FILE_SHIFT = 72  # format.location's layout
_LOW_BITS = (1 << _FILE_SHIFT) - 1
_U32 = 1 << 32
_crc32 = zlib.crc32

Value = bytes | int


@dataclass(slots=True)
class Checkpoint:
    data: dict[str, Value]  # the entries that did not go to ``packed``
    kinds: dict[str, list[str]]  # the keys of ``data`` by kind, as Store._keys builds them
    last_lsn: int
    live_bytes: int
    memory: int
    token: bytes  # the closing store's Store.checkpoint_token
    # The bulk of the located entries (packed.py) and the positions of the entries of
    # ``data`` among them (Store._pos), or None.
    packed: Packed | None = None
    positions: dict[str, int] | None = None


def _tail(directory: str, segment: int, segment_size: int, snapshot: int) -> bytes:
    """The bytes whose change would mean the files are not the ones the checkpoint saw."""
    out = b""
    with open(os.path.join(directory, segment_name(segment)), "rb") as f:
        n = min(TAIL_BYTES, segment_size)
        if n:
            out = os.pread(f.fileno(), n, segment_size - n)
    if snapshot:
        with open(os.path.join(directory, snapshot_name(snapshot)), "rb") as f:
            out += os.pread(f.fileno(), SNAPSHOT_HEADER.size, 0)
    return out


@dataclass(slots=True)
class LocatedRun:
    """Entries that ``items`` hands over as one run already (the store's packed tier,
    packed.py): keys of one kind joined by NUL, their values' file and low location bits."""

    kind: str
    file_id: int
    blob: bytes
    low: array


Item = tuple[str, Value] | LocatedRun


def _runs(items: Iterable[Item]) -> Iterable[tuple[str, int, list[str], list[Value]] | LocatedRun]:
    """(kind, file id or -1 for values in memory, keys, values) of consecutive entries, and
    the LocatedRuns among them as they are."""
    kind = ""
    where = -2
    keys: list[str] = []
    values: list[Value] = []
    for item in items:
        if type(item) is LocatedRun:
            if keys:
                yield kind, where, keys, values
            kind, where, keys, values = "", -2, [], []
            yield item
            continue
        k, v = item  # type: ignore[misc]
        slash = k.find("/")
        kk = k[:slash + 1]
        w = v >> _FILE_SHIFT if type(v) is int else -1
        if w != where or kk != kind:
            if keys:
                yield kind, where, keys, values
            kind, where, keys, values = kk, w, [], []
        keys.append(k)
        values.append(v)
    if keys:
        yield kind, where, keys, values


def encode_checkpoint(items: Iterable[Item], count: int, *, segment: int, segment_size: int,
                      snapshot: int, snapshot_size: int, lsn: int, tail: bytes, token: bytes = bytes(8)
                      ) -> list[bytes] | None:
    """The checkpoint's pieces, or None when the map cannot be written as runs (a key with
    a NUL in it: such a store is replayed, as before). The byte counts it holds are the
    ones the store computes from a replayed map (Store.data_bytes, Store.live_bytes)."""
    body: list[bytes] = []
    live_bytes = memory = 0
    for run in _runs(items):
        if type(run) is LocatedRun:
            n = len(run.low)
            kb = run.kind.encode()
            keys_bytes = len(run.blob) - (n - 1) + RECORD_HEADER.size * n
            live_bytes += keys_bytes + sum(map(0xFFFFFFFF.__and__, run.low))
            memory += keys_bytes + LOCATION_BYTES * n
            body += [RUN.pack(LOCATED, run.file_id, n, len(kb), len(run.blob), 8 * n), kb, run.blob, run.low.tobytes()]
            continue
        kind, where, keys, values = run  # type: ignore[misc]
        blob = "\0".join(keys).encode()
        if blob.count(0) != len(keys) - 1:
            return None
        kb = kind.encode()
        keys_bytes = sum(map(len, keys)) + RECORD_HEADER.size * len(keys)
        if where < 0:
            lengths = array("I", map(len, values))  # type: ignore[arg-type]
            vals = lengths.tobytes() + b"".join(values)  # type: ignore[arg-type]
            form, file_id = INLINE, 0
            live_bytes += keys_bytes + sum(lengths)
            memory += keys_bytes + sum(lengths)
        else:
            try:
                low = array("Q", map(_LOW_BITS.__and__, values))  # type: ignore[arg-type]
                form = LOCATED
            except OverflowError:  # an offset at 2^32 or more: offsets, then lengths
                low = array("Q", ((v & _LOW_BITS) >> 32 for v in values))  # type: ignore[operator]
                low.extend(v & 0xFFFFFFFF for v in values)  # type: ignore[operator]
                form = WIDE
            vals = low.tobytes()
            file_id = where
            live_bytes += keys_bytes + sum(map(0xFFFFFFFF.__and__, values))  # type: ignore[arg-type]
            memory += keys_bytes + LOCATION_BYTES * len(keys)
        body.append(RUN.pack(form, file_id, len(keys), len(kb), len(blob), len(vals)))
        body.append(kb)
        body.append(blob)
        body.append(vals)
    body_len = sum(map(len, body))
    crc = 0
    for piece in body:
        crc = _crc32(piece, crc)
    head = HEADER.pack(MAGIC, segment, segment_size, snapshot, snapshot_size, lsn, count, live_bytes,
                       memory, body_len, crc, token, len(tail)) + tail
    return [head + _crc32(head).to_bytes(4, "little"), *body]


def write_checkpoint(directory: str, items: Iterable[Item], count: int, *, segment: int,
                     segment_size: int, snapshot: int, snapshot_size: int, lsn: int, do_fsync: bool,
                     token: bytes = bytes(8)) -> bool:
    """Write the checkpoint (temp file, fsync, rename, fsync of the directory); False when
    the map cannot be checkpointed. Raises OSError; a temp file left behind is removed by
    the next open, as a snapshot's is."""
    tail = _tail(directory, segment, segment_size, snapshot)
    pieces = encode_checkpoint(items, count, segment=segment, segment_size=segment_size, snapshot=snapshot,
                               snapshot_size=snapshot_size, lsn=lsn, tail=tail, token=token)
    if pieces is None:
        return False
    final = os.path.join(directory, CHECKPOINT_NAME)
    tmp = final + ".tmp"
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            if do_fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if do_fsync:
        fsync_dir(directory)
    return True


def remove_checkpoint(directory: str, *, do_fsync: bool) -> bool:
    """Remove the checkpoint (before the store appends anything); whether there was one."""
    try:
        os.unlink(os.path.join(directory, CHECKPOINT_NAME))
    except FileNotFoundError:
        return False
    if do_fsync:
        fsync_dir(directory)
    return True


def load_checkpoint(directory: str, segments: list[int], snapshot: int) -> Checkpoint | None:
    """The map the checkpoint holds if it describes exactly these files (the segments from
    the snapshot on, ``snapshot`` 0 for none), else None: replay the journal."""
    try:
        with open(os.path.join(directory, CHECKPOINT_NAME), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) < HEADER.size + 4 or raw[:4] != MAGIC or not segments:
        return None
    (_, segment, segment_size, snap, snapshot_size, lsn, count, live_bytes, memory, body_len, body_crc, token,
     tail_len) = HEADER.unpack_from(raw)
    head_end = HEADER.size + tail_len
    if len(raw) < head_end + 4 or _crc32(raw[:head_end]) != int.from_bytes(raw[head_end:head_end + 4], "little"):
        return None
    body = memoryview(raw)[head_end + 4:]
    if len(body) != body_len or _crc32(body) != body_crc:
        return None  # torn or partial
    if segment != segments[-1] or snap != snapshot:
        return None
    try:
        if os.path.getsize(os.path.join(directory, segment_name(segment))) != segment_size:
            return None  # the journal grew (or was cut) after the checkpoint
        if snap and os.path.getsize(os.path.join(directory, snapshot_name(snap))) != snapshot_size:
            return None
        if _tail(directory, segment, segment_size, snap) != raw[HEADER.size:head_end]:
            return None
    except OSError:
        return None
    data: dict[str, Value] = {}
    kinds: dict[str, list[str]] = {}
    # Enough entries to pack: the runs of locations go to the packed tier (packed.py), the
    # rest to ``data`` with their positions among them.
    builder = PackedBuilder() if count >= _packed.PACK_MIN else None
    positions: dict[str, int] = {}
    pos = 0
    try:
        while pos < body_len:
            form, file_id, n, kind_len, keys_len, vals_len = RUN.unpack_from(body, pos)
            pos += RUN.size
            kind = str(body[pos:pos + kind_len], "utf-8")
            pos += kind_len
            blob = body[pos:pos + keys_len]
            pos += keys_len
            vals = body[pos:pos + vals_len]
            pos += vals_len
            if len(vals) != vals_len:
                return None
            if builder is not None and form == LOCATED and len(blob) == keys_len:
                low = array("Q")
                low.frombytes(vals)
                if builder.add_run(bytes(blob), n, file_id, low):
                    continue
            keys = str(blob, "utf-8").split("\0")
            if len(keys) != n:
                return None
            values: Iterable[Value]
            if form == INLINE:
                lengths = array("I")
                lengths.frombytes(vals[:4 * n])
                inline = bytes(vals[4 * n:])
                ends = list(accumulate(lengths))
                if (ends[-1] if ends else 0) != len(inline):
                    return None
                values = [inline[e - m:e] for e, m in zip(ends, lengths, strict=True)]
            else:
                low = array("Q")
                low.frombytes(vals)
                bits = file_id << _FILE_SHIFT
                if form == LOCATED and builder is not None and builder.add_located(keys, file_id, low):
                    continue  # message keys of queues published interleaved
                if form == LOCATED and len(low) == n:
                    values = map(bits.__or__, low)
                elif form == WIDE and len(low) == 2 * n:
                    values = [bits | o << 32 | m for o, m in zip(low[:n], low[n:], strict=True)]
                else:
                    return None
            if builder is not None:
                kept = []
                for k, v in zip(keys, values, strict=True):
                    if type(v) is not int or not builder.add(k, v):
                        positions[k] = len(builder)  # before the packed entry at that position
                        data[k] = v
                        kept.append(k)
                keys = kept
            else:
                data.update(zip(keys, values, strict=True))
            if not keys:
                continue
            found = kinds.get(kind)
            if found is None:
                kinds[kind] = keys
            else:
                found.extend(keys)
    except (struct.error, UnicodeDecodeError, ValueError):
        return None
    packed = builder.finish() if builder is not None and len(builder) else None
    if len(data) + (len(packed) if packed is not None else 0) != count:
        return None
    return Checkpoint(data, kinds, lsn, live_bytes, memory, token, packed, positions if packed is not None else None)

