"""The cold runs of a clean stop, kept for the next start (issue 15, target 2).

A restart rebuilt every queue's cold run (gateway.broker.recovery) by reading and decoding
the head of each of 10^6 message records: most of a restart's time once the store's index
came from its checkpoint. The runs are a function of the store's message records alone, so
a clean stop computes them once more from the store as it closes it and writes them here;
the next start takes them instead of reading the records when the store reopened from the
checkpoint written by that very close (its token and LSN, semantics/store/checkpoint.py),
which proves the records are the same. Anything else (no checkpoint, another one, a cache
that is torn, damaged or from another close) and the records are read, as before; the
cache is removed at every start before the store appends anything, so it never outlives
the state it describes. RabbitMQ does the same with the recovery terms of a clean shutdown.

    messages.cache = HEADER | body, HEADER = magic "CQR1" | token 8s | lsn u64 | body_len u64
                     | body_crc u32 | header_crc u32
    body           = per queue: meta_len u32 | meta (JSON: vhost, queue, combos, odd keys,
                     id bytes, count) | ids | enqueue times f64 | sizes u64 | refs u64
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.broker.recovery import QueueRecords, properties_cache, read_runs
from semantics.store import Store
from semantics.store.files import fsync_dir

if TYPE_CHECKING:
    from gateway.broker.broker import Broker

__all__ = ["CACHE_NAME", "load", "save"]

log = logging.getLogger(__name__)

CACHE_NAME = "messages.cache"
_MAGIC = b"CQR1"
_HEADER = struct.Struct("<4s8sQQI")
_META = struct.Struct("<I")


def _encode(runs: dict[tuple[str, str], QueueRecords]) -> list[bytes]:
    body: list[bytes] = []
    for (vhost, queue), records in runs.items():
        run = records.run
        assert run is not None
        combos = [[raw.decode("latin-1"), exchange, routing_key]
                  for (raw, exchange, routing_key), _ in sorted(records.shared.items(), key=lambda kv: kv[1])]
        meta = json.dumps({"vhost": vhost, "queue": queue, "combos": combos, "odd": records.odd_keys,
                           "ids": len(run.ids), "count": len(run.enqueue_times)}).encode()
        body += [_META.pack(len(meta)), meta, bytes(run.ids), run.enqueue_times.tobytes(), run.sizes.tobytes(),
                 run.refs.tobytes()]
    return body


def save(broker: Broker) -> None:
    """Write the cache for the store as it is now (call it right before the store's clean
    close, with nothing left to write). A failure only costs the next start its speed."""
    store = broker.store
    directory = broker.data_dir
    if directory is None or not isinstance(store, Store):
        return
    final = os.path.join(directory, CACHE_NAME)
    tmp = final + ".tmp"
    try:
        body = _encode(read_runs(store, properties_cache()))
        crc = 0
        for piece in body:
            crc = zlib.crc32(piece, crc)
        head = _HEADER.pack(_MAGIC, store.checkpoint_token, store.last_lsn, sum(map(len, body)), crc)
        with open(tmp, "wb") as f:
            f.write(head + zlib.crc32(head).to_bytes(4, "little"))
            for piece in body:
                f.write(piece)
            f.flush()
            if store.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if store.fsync:
            fsync_dir(directory)
    except Exception:
        log.warning("recovery cache not written; the next start reads the message records", exc_info=True)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _read(broker: Broker) -> bytes | None:
    """The cache's bytes, removed from the directory (durably) as it is read."""
    directory = broker.data_dir
    if directory is None or not isinstance(broker.store, Store):
        return None
    path = os.path.join(directory, CACHE_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    os.unlink(path)
    if broker.store.fsync:
        fsync_dir(directory)
    return raw


def load(broker: Broker, properties: Callable[[bytes], Any]) -> dict[tuple[str, str], QueueRecords] | None:
    """The runs of the cache if it was written for exactly the state the store reopened
    with, else None; the cache is gone from the directory either way."""
    raw = _read(broker)
    if raw is None or not isinstance(broker.store, Store) or not broker.store.recovery.checkpoint:
        return None
    report = broker.store.recovery
    hsize = _HEADER.size
    if len(raw) < hsize + 4 or zlib.crc32(raw[:hsize]) != int.from_bytes(raw[hsize:hsize + 4], "little"):
        return None
    magic, token, lsn, body_len, crc = _HEADER.unpack_from(raw)
    body = memoryview(raw)[hsize + 4:]
    if (magic != _MAGIC or token != report.checkpoint_token or lsn != report.checkpoint_lsn
            or len(body) != body_len or zlib.crc32(body) != crc):
        return None
    store = broker.store
    runs: dict[tuple[str, str], QueueRecords] = {}
    pos = 0
    try:
        while pos < body_len:
            (n,) = _META.unpack_from(body, pos)
            pos += _META.size
            meta = json.loads(bytes(body[pos:pos + n]))
            pos += n
            records = QueueRecords(store, meta["vhost"], meta["queue"])
            for text, exchange, routing_key in meta["combos"]:
                records.ref(text.encode("latin-1"), ("", "", exchange, routing_key), properties)
            records.odd_keys.update(meta["odd"])
            run = records.run
            assert run is not None
            count = meta["count"]
            run.ids = bytearray(body[pos:pos + meta["ids"]])
            pos += meta["ids"]
            for column in (run.enqueue_times, run.sizes, run.refs):
                column.frombytes(body[pos:pos + 8 * count])
                pos += 8 * count
            if len(run.refs) != count or any(len(c) != count for c in (run.enqueue_times, run.sizes)):
                return None
            runs[(meta["vhost"], meta["queue"])] = records
    except (ValueError, KeyError, TypeError, struct.error):
        return None
    return runs if pos == body_len else None

