"""A columnar cache of the parsed records of closed audit files (A3, A4).

A closed audit file is never written again (A3), so what parsing one of its byte ranges gives
is fixed: the first scan that parses a range of a closed file also writes its rows as an Arrow
IPC file (zstd-compressed by default: a tenth of the JSON's size, where uncompressed Arrow is
about its size; a scan decompresses only the columns it converts) and later scans read that
instead of parsing JSON, most of the connector's Python CPU.

Entries live in ``<audit-dir>/.cmq-audit-cache/`` by default (a hidden folder: the gateway's
listing, its retention and ``spark.read.json`` only look at ``dt=…`` folders and skip hidden
names) or under the ``cache`` option's directory, one sub-folder per audit directory.  An
entry is ``<key>.<start>-<end>.arrow``; the file's size, mtime and inode and the schema's tag
are in the entry, checked on every read: an entry that does not match what is on disk now, or
that cannot be read, is ignored and written anew, never served.  The file the gateway is still
writing is never cached, nor a file modified within ``RACY_SECONDS`` of being read (a rewrite
within the file system's timestamp granularity would keep its mtime).  A cache that cannot be
written (read-only audit directory, full disk) only means every scan parses.

Runs on executors: pyarrow is imported lazily.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gateway.audit import layout
from spark.lines import Parsed, Skipped, parse_chunks
from spark.schema import JSON_COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa

    from spark.plan import FileRange

__all__ = ["CODECS", "DEFAULT_DIR", "RACY_SECONDS", "cache_base", "cached_chunks", "check_codec", "entry_path",
           "sweep"]

log = logging.getLogger(__name__)

DEFAULT_DIR = ".cmq-audit-cache"
RACY_SECONDS = 2.0  # coarser than any file system's mtime granularity we expect (FAT: 2 s)
_FORMAT = 1  # bump when the entry layout changes
CODECS = ("zstd", "lz4", "none")
_OFF = frozenset({"off", "false", "none", "no", "0"})
_META = b"cmq-audit-cache"
_ROWS = 65536  # rows per cached batch, as the reader hands them to Spark
_TMP = ".tmp"
_warned: set[str] = set()

# Adding, renaming or retyping a record field changes the tag: every entry is rebuilt.
TAG = hashlib.sha256(
    repr((_FORMAT, [(n, t.simpleString()) for n, t in JSON_COLUMNS])).encode()).hexdigest()[:16]

Identity = tuple[int, int, int]  # size, mtime_ns, inode


def cache_base(root: str, option: str) -> str | None:
    """Where the entries of audit directory ``root`` live; None when the cache is off.
    ``option``: the ``cache`` option (``on``: the default folder under ``root``)."""
    if option.strip().lower() in ("", "on", "true", "yes", "1"):
        return os.path.join(root, DEFAULT_DIR)
    if option.strip().lower() in _OFF:
        return None
    # One directory may serve several gateways' logs: each gets its own sub-folder.
    tag = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]
    return os.path.join(option, tag)


def entry_path(base: str, part: FileRange) -> str:
    return os.path.join(base, *part.key.split("/")) + f".{part.start}-{part.end}.arrow"


def _identity(st: os.stat_result) -> Identity:
    return st.st_size, st.st_mtime_ns, st.st_ino


def cached_chunks(base: str, part: FileRange, names: frozenset[str] | None,
                  codec: str = "zstd") -> Iterator[Parsed] | None:
    """The range's records from its entry under ``base``, or parsed (all fields, written to
    the cache as they go to Spark) when no entry matches the file; None when the file was
    deleted since planning.  Only for ranges of files that were closed when planned."""
    path = os.path.join(part.root, *part.key.split("/"))
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # retention deleted it since planning: a closed file has no other name
        return None
    try:
        ident = _identity(os.fstat(fd))
        entry = entry_path(base, part)
        hit = _load(entry, ident, names)
        if hit is not None:
            return hit
        read_at = time.time()
        data = os.pread(fd, part.end - part.start, part.start)
        settled = (_identity(os.fstat(fd)) == ident
                   and read_at - ident[1] / 1e9 >= RACY_SECONDS)
    finally:
        os.close(fd)
    chunks = parse_chunks(data, part.start, closed_end=part.closed_end, names=None if settled else names)
    if not settled:
        return chunks
    return _writing(entry, ident, chunks, names, codec)


def _select(table: pa.Table, names: frozenset[str] | None) -> pa.Table:
    return table if names is None else table.select([n for n in table.schema.names if n in names])


def _load(entry: str, ident: Identity, names: frozenset[str] | None) -> Iterator[Parsed] | None:
    """The entry's rows when it is whole and matches ``ident`` and this schema, else None."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from spark.schema import json_arrow_schema

    try:
        source = pa.memory_map(entry, "r")
    except OSError:  # none yet (or unreadable): parse
        return None
    try:
        full = json_arrow_schema()
        # Only the fields the scan converts are decompressed; threads: Spark runs a task a core.
        fields = None if names is None else [i for i, f in enumerate(full) if f.name in names]
        reader = ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=fields, use_threads=False))
        n = reader.num_record_batches
        if n == 0 or reader.schema != (full if fields is None else pa.schema([full[i] for i in fields])):
            return None
        _, meta = reader.get_batch_with_custom_metadata(n - 1)  # the last batch: the commit record
        info = json.loads(meta[_META]) if meta is not None and _META in meta else None
        if not info or info["tag"] != TAG or tuple(info["identity"]) != ident:
            return None
        batches = [reader.get_batch(i) for i in range(n - 1)]
        for b in batches:
            b.validate()  # buffer sizes against lengths (cheap): never hand Spark a bad batch
        if sum(b.num_rows for b in batches) != info["rows"]:
            return None
        skipped = [Skipped(o, ln, t.encode("latin-1")) for o, ln, t in info["skipped"]]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        log.info("cmq-audit: ignoring cache entry %s (%s)", entry, e)
        return None
    return _serve(batches, skipped, names)


def _serve(batches: list[pa.RecordBatch], skipped: list[Skipped],
           names: frozenset[str] | None) -> Iterator[Parsed]:
    import pyarrow as pa

    from spark.schema import json_arrow_schema

    if not batches:
        yield Parsed(pa.Table.from_batches([], schema=json_arrow_schema(names)), skipped)
        return
    for i, b in enumerate(batches):
        yield Parsed(pa.Table.from_batches([b]), skipped if i == 0 else [])


def _warn_once(where: str, e: OSError) -> None:
    if where not in _warned:
        _warned.add(where)
        log.warning("cmq-audit: cannot write the cache under %s (%s): parsing each scan", where, e)


def _writing(entry: str, ident: Identity, chunks: Iterator[Parsed],
             names: frozenset[str] | None, codec: str) -> Iterator[Parsed]:
    """``chunks`` handed on as they come (narrowed to ``names``) while written to ``entry``;
    the entry appears (atomically, by rename) only once the whole range went through."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from spark.schema import json_arrow_schema

    tmp = f"{entry}.{os.getpid()}-{uuid.uuid4().hex[:8]}{_TMP}"
    sink = writer = None
    rows = 0
    skipped: list[Skipped] = []
    try:
        try:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            sink = pa.OSFile(tmp, "wb")
            writer = ipc.new_file(sink, json_arrow_schema(), options=ipc.IpcWriteOptions(
                compression=None if codec == "none" else codec, use_threads=False))
        except OSError as e:
            _warn_once(os.path.dirname(os.path.dirname(os.path.dirname(entry))), e)
        for parsed in chunks:
            if writer is not None:
                try:
                    writer.write_table(parsed.table, max_chunksize=_ROWS)
                except OSError as e:  # full disk: this range goes on uncached
                    _warn_once(entry, e)
                    writer = None
            rows += parsed.table.num_rows
            skipped.extend(parsed.skipped)
            yield Parsed(_select(parsed.table, names), parsed.skipped)
        if writer is not None:
            info = {"tag": TAG, "identity": list(ident), "rows": rows,
                    "skipped": [[s.offset, s.length, s.text.decode("latin-1")] for s in skipped]}
            try:
                writer.write_batch(_empty_batch(), custom_metadata={_META: json.dumps(info).encode()})
                writer.close()
                writer = None
                sink.close()  # type: ignore[union-attr]
                os.replace(tmp, entry)
            except OSError as e:
                _warn_once(entry, e)
    finally:
        # Also when Spark stops early (a LIMIT closes this generator): no half entry is left.
        for closing in (writer, sink):
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def check_codec(codec: str) -> str:
    """The ``cacheCodec`` option: ``zstd`` (the default; ~0.3 s of CPU per 10^6 records read,
    measured), ``lz4`` (a little faster, twice zstd's size) or ``none`` (the JSON's size)."""
    import pyarrow as pa

    codec = codec.strip().lower()
    if codec != "none" and (codec not in CODECS or not pa.Codec.is_available(codec)):
        raise ValueError(f"cmq-audit: cacheCodec must be one of {CODECS} (available here), not {codec!r}")
    return codec


def _empty_batch() -> pa.RecordBatch:
    import pyarrow as pa

    from spark.schema import json_arrow_schema

    schema = json_arrow_schema()
    # pa.nulls, not pa.array or empty_table: those import pandas into every fresh worker.
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def sweep(base: str, root: str, older_than: float = 3600.0) -> int:
    """Remove entries whose audit file is gone (retention deleted it) and temporary files a
    killed task left; returns how many.  Every error is ignored: it runs again next scan."""
    removed = 0
    now = time.time()
    for d in _entries(base):
        for h in _entries(d.path):
            folder = os.path.join(root, d.name, h.name)
            for e in _entries(h.path):
                name = e.name
                try:
                    if name.endswith(_TMP):
                        gone = now - e.stat().st_mtime > older_than
                    else:
                        gone = _orphan(folder, name)
                    if gone:
                        os.unlink(e.path)
                        removed += 1
                except OSError:
                    continue
            with contextlib.suppress(OSError):
                os.rmdir(h.path)  # only when empty
        with contextlib.suppress(OSError):
            os.rmdir(d.path)
    return removed


def _orphan(folder: str, name: str) -> bool:
    """The entry ``name`` (``<file>.<start>-<end>.arrow``) is of a file that is gone, or of
    a range past the end of what the file holds now (it was replaced: never served again)."""
    try:
        audit, span, _ = name.rsplit(".", 2)
        end = int(span.split("-")[1])
    except (ValueError, IndexError):  # not an entry's name: leave it
        return False
    try:
        return end > os.stat(os.path.join(folder, audit)).st_size
    except FileNotFoundError:
        return not os.path.exists(layout.open_path(os.path.join(folder, audit)))


def _entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return [e for e in it if not e.is_symlink()]
    except OSError:
        return []
