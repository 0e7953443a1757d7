"""Closed audit segments compacted to Parquet, beside them in the same ``dt=/hour=`` folder (A7).

    <dir>/dt=…/hour=…/audit-<start>-<seq>.jsonl     the closed segment (kept by default)
    <dir>/dt=…/hour=…/audit-<start>-<seq>.parquet   its records, typed, zstd, one column each

Why Parquet: Spark reads it with its own reader (column pruning, filter pushdown, vectorized
decoding), which the Python data source cannot match on Spark 4.3 (no column pruning).

When: the audit writer calls ``closed(directory, retention_hours)`` after each rotation; it
takes a lock to learn whether a compactor is running on the directory and, if none is, starts
one (``python -m gateway.audit.compact``, niced, its own session) and returns at once: the
writer never waits for compaction.  The compactor holds ``<dir>/.compact.lock`` (flock) while
it works, then lets it go and looks once more: a segment closed while it was finishing is
compacted by it, or by the next one the writer starts (whoever holds the lock looks again
after letting it go, so no closed segment is left behind).

Crash safety, step by step: the Parquet file is written under a hidden temporary name
(``.audit-….parquet.tmp``: readers and Spark skip hidden names), fsynced, given the segment's
mtime (retention goes by mtime), renamed to its final name, and the folder fsynced.  Only then,
in ``remove`` mode, is the JSON-lines segment deleted (and the folder fsynced again).  A crash
leaves a temporary file (deleted by the next compactor, which holds the lock), or both forms of
one segment: every reader takes the Parquet file of a segment when both exist (``spark``'s
connector), and the next compactor removes the JSON-lines one.  So no record is lost and none
is read twice at any moment.

Mode: the environment variable ``CMQ_AUDIT_COMPACT`` of the gateway: ``keep`` (the default:
the JSON-lines segment stays, so ``jq``, ``grep`` and every tool built on A1's one JSON object
per line keep working, and the JSON is the source the Parquet file can always be rebuilt from;
retention deletes both at the same age), ``remove`` (only the Parquet file stays: about a
fifth of the bytes), or ``off``.

Each Parquet file has the record fields of ``RECORD_FIELDS`` plus ``_offset``, the byte offset
of the record's line in its segment (so a reader that planned byte ranges of the JSON-lines
segment can take the same rows from the Parquet file once the segment is gone), and in its
metadata (key ``cmq-audit``) the segment's size, its row count and the lines skipped as torn
or unreadable, with their offsets and text.  Imports of pyarrow stay inside functions: the
writer imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gateway.audit import layout

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["MODES", "META_KEY", "PARQUET_SUFFIX", "RECORD_FIELDS", "closed", "compact_dir", "compact_segment", "info",
           "list_parquet", "main", "mode", "parquet_path", "record_schema"]

log = logging.getLogger(__name__)

MODES = ("keep", "remove", "off")
MODE_ENV = "CMQ_AUDIT_COMPACT"
KILL_ENV = "CMQ_AUDIT_COMPACT_KILL_AT"  # tests only: see _kill_at
STEPS = ("before_write", "written", "fsynced", "renamed", "dir_fsynced", "removed")  # compact_segment's
PARQUET_SUFFIX = ".parquet"
LOCK_NAME = ".compact.lock"
META_KEY = b"cmq-audit"
FORMAT = 1
_TMP = ".tmp"
_ROW_GROUP = 131072  # rows: Spark splits a file by row groups, so a large segment is several tasks

# The record fields, in spark/SCHEMA.md order, as (name, Arrow type name): the Arrow types of
# the Spark schema (spark.schema.JSON_COLUMNS; a test checks they agree).
RECORD_FIELDS: tuple[tuple[str, str], ...] = (
    ("v", "int32"), ("ts", "ts"), ("event", "string"), ("vhost", "string"), ("topic", "string"),
    ("queue", "string"), ("subscription", "string"), ("msg_id", "string"), ("tags", "list"),
    ("routing_key", "string"), ("size", "int64"), ("attempt", "int32"), ("reason", "string"),
    ("user", "string"), ("peer", "string"), ("latency_ms", "double"), ("next_at", "ts"),
    ("policy", "string"), ("conn", "string"), ("dropped", "int64"), ("rule", "string"),
    ("value", "int64"), ("limit", "int64"), ("object", "string"), ("protocol", "string"),
    ("origin", "string"), ("auto_ack", "bool"),
)


def mode() -> str:
    value = os.environ.get(MODE_ENV, "keep").strip().lower() or "keep"
    return value if value in MODES else "keep"


def record_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "double": pa.float64(),
             "ts": pa.timestamp("us", tz="UTC"), "list": pa.list_(pa.string()), "bool": pa.bool_()}
    return pa.schema([pa.field(n, types[t]) for n, t in RECORD_FIELDS])


def parquet_path(jsonl_path: str) -> str:
    """``…/audit-X.jsonl`` → ``…/audit-X.parquet``."""
    return jsonl_path.removesuffix(".jsonl") + PARQUET_SUFFIX


def _key_of(parquet_name: str) -> str:
    return parquet_name.removesuffix(PARQUET_SUFFIX) + ".jsonl"


def list_parquet(root: str, keep_folder: Callable[[str, int], bool] | None = None) -> dict[str, str]:
    """Every compacted segment under ``root``: its key (the JSON-lines key,
    ``dt=…/hour=…/audit-….jsonl``) → the Parquet file's path.  List the JSON-lines segments
    *before* this, never after: a segment's Parquet file appears before its JSON-lines file
    goes, so one of the two listings sees it."""
    out: dict[str, str] = {}
    for d in sorted(_scan(root), key=lambda e: e.name):
        if not d.name.startswith("dt="):
            continue
        for h in sorted(_scan(d.path), key=lambda e: e.name):
            parsed = layout.parse_folder(d.name, h.name)
            if parsed is None or (keep_folder is not None and not keep_folder(*parsed)):
                continue
            for f in _scan(h.path):
                if f.name.startswith("audit-") and f.name.endswith(PARQUET_SUFFIX):
                    out[f"{d.name}/{h.name}/{_key_of(f.name)}"] = f.path
    return dict(sorted(out.items()))


_scan = layout._scandir  # a folder that vanishes (retention) lists as empty


# -- parsing ---------------------------------------------------------------------------------


def _read_json(body: bytes, schema: pa.Schema) -> pa.Table:
    import pyarrow as pa
    import pyarrow.json as pj

    block = min(max(len(body), 1 << 16), (1 << 31) - 1)
    return pj.read_json(pa.BufferReader(body), read_options=pj.ReadOptions(use_threads=False, block_size=block),
                        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))


def parse_segment(data: bytes) -> tuple[pa.Table, list[int], list[tuple[int, int, bytes]]]:
    """The records of a closed segment's bytes, each line's offset, and the lines skipped
    (offset, length, text): a torn last line, a line that is not a JSON object, a field of the
    wrong type.  The same rule as the connector's parser (spark.lines)."""
    import pyarrow as pa

    schema = record_schema()
    cut = data.rfind(b"\n") + 1
    skipped: list[tuple[int, int, bytes]] = []
    if cut < len(data):
        skipped.append((cut, len(data) - cut, data[cut:]))
    starts: list[int] = []
    lines: list[bytes] = []
    pos = 0
    for line in data[:cut].splitlines(keepends=True):
        if line.strip():
            starts.append(pos)
            lines.append(line)
        pos += len(line)
    if not lines:
        return schema.empty_table(), [], skipped
    try:
        table = _read_json(data[:cut], schema)
        if table.num_rows == len(lines):
            return table, starts, skipped
    except pa.ArrowInvalid:
        pass
    # Slow path, only for a segment with a bad line: find it line by line.
    good: list[int] = []
    for i, line in enumerate(lines):
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if ok:
            good.append(i)
        else:
            skipped.append((starts[i], len(line), line))
    tables: list[pa.Table] = []
    offsets: list[int] = []
    try:
        tables.append(_read_json(b"".join(lines[i] for i in good), schema))
        offsets = [starts[i] for i in good]
    except pa.ArrowInvalid:
        for i in good:
            try:
                tables.append(_read_json(lines[i], schema))
                offsets.append(starts[i])
            except pa.ArrowInvalid:
                skipped.append((starts[i], len(lines[i]), lines[i]))
    skipped.sort()
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table, offsets, skipped


# -- writing -----------------------------------------------------------------------------------


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact_segment(jsonl_path: str, *, remove: bool, crash: Callable[[str], None] | None = None) -> int:
    """Compact one closed segment; returns its row count.  ``crash(step)`` is called at each
    step (tests inject a crash there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    step = crash or (lambda _: None)
    final = parquet_path(jsonl_path)
    folder, name = os.path.split(final)
    with open(jsonl_path, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read()
    table, offsets, skipped = parse_segment(data)
    table = table.append_column("_offset", pa.array(offsets, pa.int64()))
    meta = {"format": FORMAT, "size": st.st_size, "rows": table.num_rows,
            "skipped": [[o, n, t.decode("latin-1")] for o, n, t in skipped]}
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    tmp = os.path.join(folder, f".{name}.{os.getpid()}{_TMP}")
    step("before_write")
    try:
        with open(tmp, "wb") as out:
            pq.write_table(table, out, compression="zstd", row_group_size=_ROW_GROUP,
                           use_dictionary=True, write_statistics=True,
                           column_encoding=None, use_byte_stream_split=False)
            step("written")
            out.flush()
            os.fsync(out.fileno())
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # retention goes by mtime
        step("fsynced")
        os.rename(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    step("renamed")
    _fsync_dir(folder)
    step("dir_fsynced")
    if remove:
        os.unlink(jsonl_path)
        step("removed")
        _fsync_dir(folder)
    return table.num_rows


def _whole(parquet: str) -> bool:
    """The Parquet file is readable and holds what its metadata says (else it is rebuilt)."""
    import pyarrow.parquet as pq

    try:
        md = pq.read_metadata(parquet)
        info = json.loads((md.metadata or {}).get(META_KEY, b"{}"))
        return bool(info.get("format") == FORMAT and info.get("rows") == md.num_rows)
    except Exception:  # noqa: BLE001 - any unreadable file is rebuilt
        return False


def _pending(root: str) -> Iterator[tuple[str, bool]]:
    """(closed segment path, already compacted) of every closed JSON-lines segment."""
    for af in layout.list_files(root):
        yield af.path, os.path.exists(parquet_path(af.path))


def _clear_temporaries(root: str) -> None:
    for d in _scan(root):
        if d.name.startswith("dt="):
            for h in _scan(d.path):
                for f in _scan(h.path):
                    if f.name.startswith(".audit-") and f.name.endswith(_TMP):
                        with contextlib.suppress(OSError):
                            os.unlink(f.path)


def _retention(root: str, retention_hours: float | None) -> int:
    """Parquet files past the retention (their mtime is their segment's): the writer's own
    retention only knows JSON-lines segments."""
    if retention_hours is None:
        return 0
    cutoff = time.time() - retention_hours * 3600.0
    removed = 0
    for path in list_parquet(root).values():
        with contextlib.suppress(OSError):
            if os.stat(path).st_mtime < cutoff:
                os.unlink(path)
                removed += 1
    return removed


def compact_pass(root: str, *, remove: bool, crash: Callable[[str], None] | None = None) -> tuple[int, int]:
    """One pass over ``root`` (the caller holds the lock): (segments compacted, rows)."""
    segments = rows = 0
    for path, done in list(_pending(root)):
        if done and _whole(parquet_path(path)):
            if remove:  # a crash came between the rename and the delete
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            continue
        try:
            rows += compact_segment(path, remove=remove, crash=crash)
        except FileNotFoundError:  # retention deleted it meanwhile
            continue
        segments += 1
    return segments, rows


def _try_lock(root: str) -> int | None:
    fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def compact_dir(root: str, *, remove: bool = False, retention_hours: float | None = None, wait: bool = False,
                crash: Callable[[str], None] | None = None) -> tuple[int, int] | None:
    """Compact every closed segment of ``root`` while holding its lock; None when another
    compactor holds it (and ``wait`` is false).  Looks again after letting the lock go."""
    segments = rows = 0
    while True:
        fd = _try_lock(root)
        if fd is None:
            if not wait:
                return None if not segments else (segments, rows)
            time.sleep(0.2)
            continue
        try:
            _clear_temporaries(root)
            while True:
                s, r = compact_pass(root, remove=remove, crash=crash)
                segments, rows = segments + s, rows + r
                if not s:
                    break
            _retention(root, retention_hours)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        # A segment closed after the last pass, whose writer found the lock held: ours to do.
        if not any(not done for _, done in _pending(root)):
            return segments, rows


# The compactor this process started last, per directory: while it runs, no other is started
# (it looks for new segments again before it exits).  Without this, a writer rotating faster
# than a compactor starts (a test's tiny rotate_bytes) started one per rotation, each taking
# the CPU to import pyarrow before finding the lock held: dozens at once.
_running: dict[str, subprocess.Popen[bytes]] = {}
_pyarrow: list[bool] = []


def _have_pyarrow() -> bool:
    """Whether the compactor can run here (looked up once; a gateway installed without pyarrow
    keeps its segments as JSON lines, warned about once)."""
    if not _pyarrow:
        import importlib.util

        _pyarrow.append(importlib.util.find_spec("pyarrow") is not None)
        if not _pyarrow[0]:
            log.warning("audit: pyarrow is not installed: closed segments stay JSON lines (A7)")
    return _pyarrow[0]


def closed(directory: str, retention_hours: float | None = None) -> None:
    """Called by the audit writer after it closed a segment: starts a compactor unless one is
    running on ``directory`` (which will find the new segment when it looks again; a segment
    closed in the instant between its last look and its exit waits for the next rotation, and
    is read from its JSON lines meanwhile).  Never raises: compaction is an optimisation of
    reads, not part of writing the log."""
    try:
        if mode() == "off" or not _have_pyarrow():
            return
        child = _running.get(directory)
        if child is not None and child.poll() is None:  # started by us and not done yet
            return
        fd = _try_lock(directory)
        if fd is None:  # one is running: it looks again after letting the lock go
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        args = [sys.executable, "-m", "gateway.audit.compact", "--background", directory]
        if retention_hours is not None:
            args[-1:-1] = ["--retention-hours", str(retention_hours)]
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        _running[directory] = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                                               close_fds=True, start_new_session=True)
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("audit: could not start the compactor on %s", directory)


def _kill_at(spec: str | None) -> Callable[[str], None] | None:
    """``KILL_ENV=step:n`` (tests): SIGKILL this process the n-th time it reaches ``step`` of
    ``compact_segment``, as a crash or an operator's kill -9 would stop it there."""
    if not spec:
        return None
    step, _, n = spec.partition(":")
    left = [int(n or 1)]

    def hook(at: str) -> None:
        if at == step:
            left[0] -= 1
            if left[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)
    return hook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.audit.compact")
    parser.add_argument("directory")
    parser.add_argument("--remove", action="store_true", default=None,
                        help="delete each JSON-lines segment once its Parquet file is durable")
    parser.add_argument("--keep", dest="remove", action="store_false")
    parser.add_argument("--retention-hours", type=float, default=None)
    parser.add_argument("--background", action="store_true", help="started by the audit writer: niced, quiet")
    args = parser.parse_args(argv)
    remove = args.remove if args.remove is not None else mode() == "remove"
    if args.background:
        with contextlib.suppress(OSError):
            os.nice(10)
    if args.background and all(done for _, done in _pending(args.directory)):
        return 0  # nothing to do (a writer's last segment was empty): not even pyarrow imported
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("audit compactor: pyarrow is not installed; segments stay JSON lines", file=sys.stderr)
        return 2
    try:
        done = compact_dir(args.directory, remove=remove, retention_hours=args.retention_hours,
                           wait=not args.background, crash=_kill_at(os.environ.get(KILL_ENV)))
    except OSError as e:  # the directory went away (a test's), or a full disk: the JSON lines stay
        print(f"audit compactor: {args.directory}: {e}", file=sys.stderr)
        return 1
    if not args.background and done is not None:
        print(f"compacted {done[0]} segment(s), {done[1]:,} records, in {args.directory}")
    return 0


def info(path: str) -> dict[str, Any]:
    """A Parquet segment's metadata (``size``, ``rows``, ``skipped``)."""
    import pyarrow.parquet as pq

    return dict(json.loads((pq.read_metadata(path).metadata or {})[META_KEY]))


if __name__ == "__main__":
    sys.exit(main())
