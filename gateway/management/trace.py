"""A message's fate as the audit log tells it (SPEC UI3): ``GET /api/cmq/trace/{vhost}/{msg_id}``.

The gateway's audit directory (A3: ``dt=.../hour=.../audit-*.jsonl`` closed files and the one
``.open`` file being written) is read for the records of that vhost whose ``msg_id`` is the
one asked for: publish, route, enqueue, deliver, ack, nack, requeue, retry, discard... in the
order they were written. The CMQ message ID is the one the gateway gives a message (M11: it
is also the delivery's ``message_id`` unless the publisher set one, and its
``x-cmq-msg-id`` header).

Query: ``hours`` (default 24, at most 168): only the folders of the last so many hours are
read, so that a trace costs a few files, not the whole retention. At most ``MAX_EVENTS``
records are returned (``truncated`` says so). Monitors and administrators only (authz):
records name every client's user, peer and routing keys.

The files are read in a worker thread, the writer flushed first (its records are written
every ~0.1 s), so the event loop never waits on the disk. Closed segments compacted to
Parquet whose JSON lines were removed (A7 mode ``remove``) are not read here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from gateway.audit import layout
from gateway.management.app import ApiError, Management, bad_request

__all__ = ["MAX_EVENTS", "add_routes", "trace"]

MAX_EVENTS = 1000
MAX_HOURS = 168


def trace(directory: str, vhost: str, msg_id: str, hours: float, now: float) -> dict[str, Any]:
    """The records of ``msg_id`` in ``vhost`` from the folders of the last ``hours``."""
    since = dt.datetime.fromtimestamp(now - hours * 3600, dt.UTC).strftime("%Y-%m-%dT%H")

    def keep(day: str, hour: int) -> bool:
        return f"{day}T{hour:02d}" >= since

    needle = json.dumps(msg_id)  # as the writer writes the field: "msg_id":"<id>"
    events: list[dict[str, Any]] = []
    files = 0
    truncated = False
    for af in layout.list_files(directory, include_open=True, keep_folder=keep):
        files += 1
        for line in _lines(directory, af):
            if needle not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line of the open file
            if not isinstance(record, dict) or record.get("msg_id") != msg_id or record.get("vhost") != vhost:
                continue
            if len(events) >= MAX_EVENTS:
                truncated = True
                break
            events.append(record)
        if truncated:
            break
    events.sort(key=lambda r: str(r.get("ts", "")))  # stable: written order within a time
    return {"vhost": vhost, "msg_id": msg_id, "hours": hours, "files": files, "events": events,
            "truncated": truncated}


def _lines(directory: str, af: layout.AuditFile) -> Iterator[str]:
    """The file's lines, read as they come (a segment is up to 64 MiB); an open file renamed
    since the listing is read under its closed name, a file removed since (retention) is
    skipped."""
    paths = [af.path]
    if af.is_open:
        paths.append(os.path.join(directory, af.key))
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                yield from f
            return
        except FileNotFoundError:  # only open() raises it
            continue


def add_routes(app: web.Application, mgmt: Management) -> None:
    async def handler(request: web.Request) -> web.Response:
        vhost = request.match_info["vhost"]
        mgmt.vhost(vhost)  # 404 when missing
        msg_id = request.match_info["msg_id"].strip()
        try:
            hours = float(request.query.get("hours", "24"))
        except ValueError:
            raise bad_request("hours must be a number")
        if not 0 < hours <= MAX_HOURS:
            raise bad_request(f"hours must be > 0 and <= {MAX_HOURS}")
        audit = mgmt.broker.audit
        directory = getattr(audit, "directory", None)
        if directory is None:
            raise ApiError(404, "Object Not Found", "The audit log is off (no audit dir configured)")
        loop = asyncio.get_running_loop()
        flush = getattr(audit, "flush", None)
        if flush is not None:
            await loop.run_in_executor(None, flush, 2.0)
        out = await loop.run_in_executor(None, trace, directory, vhost, msg_id, hours, time.time())
        return web.json_response(out)

    app.router.add_get("/api/cmq/trace/{vhost}/{msg_id}", handler)
