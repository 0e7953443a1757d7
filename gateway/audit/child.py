"""The audit writer's formatting and files in a process of their own (``AuditLog(process=True)``).

Why: formatting JSON costs ~3 us a record and the gateway writes 4-5 records a message; in
the gateway's writer thread that time held the GIL, so the event loop lost a quarter of its
throughput to the audit log. The parent's thread now only pops records and ``marshal``s them
(~0.3 us a record) into this process's stdin; this process formats, writes, rotates and prunes
with the very code of the in-thread writer (``AuditLog._drain`` & co., run here without a
thread), so files, layout and records are the same.

Protocol on stdin, each message ``kind (1 byte) + length (4 bytes, big endian) + payload``:
``B`` a batch (``marshal`` of a list of ``(time, event, vhost, fields)``), ``P`` a batch
packed on the event loop (gateway.audit.fastformat.Records: ``unpack`` makes the same list), ``F`` "tell me where
you are" (also runs the time rotation and the retention), ``S`` the same once the open file is
fsynced (A5: the store's group commit waits for it), ``C`` close the open file and exit.
Each ``F``, ``S`` and ``C`` is answered on stdout with one JSON line of counters, with the record
counts (``AuditLog.counts``) that changed since the last answer as ``[key, added]`` pairs.
On a full disk it waits for room rather than drop a record (``AuditLog._until_room``), until
the gateway's ``close()`` sends ``STOP_SIGNAL``. End of input without ``C`` (the gateway died) leaves the open file ``.open``, exactly as a
crash of the in-thread writer would; the next ``AuditLog`` closes it (A3). Before that end
comes, this process writes everything its pipe holds: the records the gateway handed over
before a delivery (A5, ``AuditLog.handoff``) survive a kill -9 of the gateway; an answer
nobody is left to read is not an error.
"""

from __future__ import annotations

import gc
import json
import marshal
import os
import signal
import sys
from typing import Any, BinaryIO

from gateway.audit.fastformat import unpack
from gateway.audit.pipe import Reader
from gateway.audit.writer import CHILD_HEADER as HEADER
from gateway.audit.writer import DOORBELL_ENV, STOP_SIGNAL, AuditLog

__all__ = ["main"]


def _read_exact(stream: BinaryIO | Reader, n: int) -> bytes | None:
    data = stream.read(n)
    if data is None or len(data) < n:
        return None
    return data


def main() -> None:
    # Nothing here makes reference cycles, and a batch is tens of thousands of tuples: the
    # collector's passes over them were half of unmarshalling's cost (callgrind, 0.8 -> 0.24 us
    # a record).
    gc.disable()
    params: dict[str, Any] = json.loads(sys.argv[1])
    # The gateway holds the directory's lock for this process (A7).
    log = AuditLog(params.pop("directory"), process=False, lock=False, _thread=False, **params)
    # The gateway's close(): a write waiting for room on a full disk gives up (AuditLog._until_room).
    signal.signal(STOP_SIGNAL, lambda *_: setattr(log, "space_final", True))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
    # Records are read on this process's clock while they come, not on every write (pipe.Reader).
    bell = os.environ.get(DOORBELL_ENV)
    stdin, stdout = Reader(sys.stdin.fileno(), int(bell) if bell else None), sys.stdout.buffer
    reported: dict[Any, int] = {}  # log.counts as of the last answer
    while True:
        head = _read_exact(stdin, HEADER.size)
        if head is None:
            os._exit(0)  # the gateway is gone: leave the open file as a crash would (A3)
        kind, size = HEADER.unpack(head)
        payload = _read_exact(stdin, size) if size else b""
        if payload is None:
            os._exit(0)
        if kind == b"B" or kind == b"P":
            # The batch as it came, in one pass (what _drain does in chunks for a thread).
            items = marshal.loads(payload) if kind == b"B" else unpack(payload)  # type: ignore[misc]
            log._write(*log._format(items, bytearray(), 0, "", "")[:2])
            continue
        if kind == b"F":
            log._periodic()
        elif kind == b"S":  # A5: F, with the lines on disk before the answer
            log._sync_file()
            log._periodic()
        elif kind == b"C":
            log._close_file()
        changed = [[key, n - reported.get(key, 0)] for key, n in log.counts.items() if reported.get(key) != n]
        reported.update(log.counts)
        try:
            stdout.write(json.dumps({"written": log.written, "dropped": log.dropped,
                                     "files_closed": log.files_closed, "files_deleted": log.files_deleted,
                                     "counts": changed}).encode() + b"\n")
            stdout.flush()
        except BrokenPipeError:
            # The gateway died after asking: what follows in the pipe (records handed over
            # before its deliveries) is still to be written.
            stdout = open(os.devnull, "wb")  # noqa: SIM115 (until this process exits)
        if kind == b"C":
            return


if __name__ == "__main__":
    main()
