"""The publish and enqueue records of stored messages that a crash kept from the audit log (A5).

Why: a confirm waits for its message's records to be on disk (the broker's group commit,
``AuditLog.sync_mark``), but a persistent message can reach the store in a group commit
whose records were still on their way to the audit file when the gateway died: it was never
confirmed, yet it comes back at the restart and is delivered. Its ``publish`` and
``enqueue`` records are written again at the start, from what the store holds, with
``origin: "rebuilt"`` (a client action, recorded late: analyses count it as the publish it
was; its ``ts`` is the restart's, the time the store gave in ``enqueued_at``).

Cost: records are written in the order they were emitted (one queue, one writer), and a
message's records are emitted at its enqueue time, so only messages enqueued after the last
record the log holds (less ``MARGIN`` for the clock) can miss theirs: the last file's last
line is read, and the files of that tail are read only when such messages exist.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from gateway.audit import layout

__all__ = ["MARGIN", "last_ts", "missing", "parse_ts", "records_since"]

log = logging.getLogger(__name__)

MARGIN = 2.0  # seconds: a message enqueued this long before the log's last record is looked up
_TS_AT = len('{"v":2,"ts":"')  # v is one digit in every version so far
_TAIL = 64 * 1024


def parse_ts(ts: str) -> float:
    """``2026-11-28T17:04:55.123456Z`` -> Unix seconds."""
    whole, _, frac = ts.rstrip("Z").partition(".")
    sec = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return sec + (float("0." + frac) if frac else 0.0)


def _read(af: layout.AuditFile, directory: str, tail: int | None = None) -> bytes:
    """A file's bytes (its last ``tail`` ones), wherever it is now: the writer process may be
    closing (renaming) a crashed ``.open`` file while this reads it."""
    for path in (af.path, os.path.join(directory, af.key)):
        try:
            with open(path, "rb") as f:
                if tail is not None:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
                return f.read()
        except FileNotFoundError:
            continue
    return b""


# A segment: (its key, its JSON-lines file or None, its Parquet file when that is all there is).
_Segment = tuple[str, "layout.AuditFile | None", "str | None"]


def _segments(directory: str) -> list[_Segment]:
    """Every segment, oldest first: its JSON lines, or its Parquet file once compaction
    removed them (gateway.audit.compact, mode ``remove``)."""
    from gateway.audit import compact

    files = {af.key: af for af in layout.list_files(directory, include_open=True)}
    parquet = compact.list_parquet(directory)  # after the JSON lines: one of the two sees each
    keys = sorted(set(files) | set(parquet), key=lambda k: k.rsplit("/", 1)[-1])
    return [(k, files.get(k), None if k in files else parquet[k]) for k in keys]


def _parquet_rows(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["ts", "event", "vhost", "queue", "msg_id"])
    except FileNotFoundError:
        return []
    return [{**r, "ts": r["ts"].timestamp() if r["ts"] is not None else None} for r in table.to_pylist()]


def _line_ts(line: bytes) -> str | None:
    if not line.startswith(b'{"v":') or len(line) < _TS_AT + 27:
        return None
    return line[_TS_AT:_TS_AT + 27].decode("ascii", "replace")


def last_ts(directory: str) -> float | None:
    """The time of the last whole record in the log (None: no record at all)."""
    for _key, af, parquet in reversed(_segments(directory)):
        if af is None:
            assert parquet is not None
            times = [r["ts"] for r in _parquet_rows(parquet) if r["ts"] is not None]
            if times:
                return float(max(times))
            continue
        data = _read(af, directory, _TAIL)  # a start reads the last lines, not a 64 MiB file
        end = data.rfind(b"\n")  # a torn last line is not a record
        while end > 0:
            start = data.rfind(b"\n", 0, end) + 1
            ts = _line_ts(data[start:end])
            if ts is not None:
                try:
                    return parse_ts(ts)
                except ValueError:
                    pass
            end = start - 1
    return None


def records_since(directory: str, since: float) -> Iterable[dict[str, Any]]:
    """The publish and enqueue records of the segments that may hold records from ``since``
    on (the ones opened since, and the one open at ``since``)."""
    segments = _segments(directory)
    since_name = time.strftime("%Y%m%dT%H%M%S", time.gmtime(since))
    first = 0
    for i, (key, _af, _parquet) in enumerate(segments):
        if key.rsplit("/", 1)[-1][len("audit-"):len("audit-") + 15] <= since_name:
            first = i
    for _key, af, parquet in segments[first:]:
        if af is None:
            assert parquet is not None
            yield from (r for r in _parquet_rows(parquet) if r["event"] in ("publish", "enqueue"))
            continue
        for line in _read(af, directory).split(b"\n"):
            if b'"event":"publish"' not in line and b'"event":"enqueue"' not in line:
                continue
            try:
                yield json.loads(line)
            except ValueError:  # torn
                continue


def missing(directory: str, stored: Callable[[float], Iterable[tuple[str, str, str, str, str, int]]]
            ) -> list[tuple[str, str, dict[str, Any]]]:
    """The records to write again: ``(event, vhost, fields)``. ``stored(since)`` gives the
    stored messages enqueued from ``since`` on, as (vhost, queue, msg_id, exchange, routing
    key, size)."""
    last = last_ts(directory)
    since = (last - MARGIN) if last is not None else float("-inf")
    candidates = list(stored(since))
    if not candidates:
        return []
    published: set[tuple[str, str]] = set()
    enqueued: set[tuple[str, str, str]] = set()
    if last is not None:
        for r in records_since(directory, since - MARGIN):
            mid = str(r.get("msg_id"))
            if r.get("event") == "publish":
                published.add((str(r.get("vhost", "")), mid))
            else:
                enqueued.add((str(r.get("vhost", "")), str(r.get("queue")), mid))
    out: list[tuple[str, str, dict[str, Any]]] = []
    for vhost, queue, msg_id, exchange, routing_key, size in candidates:
        if (vhost, msg_id) not in published:
            published.add((vhost, msg_id))  # once for a message stored in several queues
            where = {"queue": routing_key} if exchange == "" else {"topic": exchange}
            out.append(("publish", vhost, {**where, "routing_key": routing_key, "msg_id": msg_id,
                                           "size": size, "origin": "rebuilt"}))
        if (vhost, queue, msg_id) not in enqueued:
            out.append(("enqueue", vhost, {"queue": queue, "msg_id": msg_id, "size": size,
                                           "topic": exchange or None, "origin": "rebuilt"}))
    if out:
        log.warning("audit: %d publish and enqueue records of stored messages were missing after a crash;"
                    " written again (origin \"rebuilt\")", len(out))
    return out
