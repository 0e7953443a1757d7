"""Declarations shared through the ``CMQ_META`` bucket (docs/CLUSTER.md, "Metadata", CL1).

Every gateway subscribes to the bucket's subjects (an ordered consumer, last value per key
first, then every change). A change made by another gateway is applied to the in-memory
vhosts with the decode the embedded recovery uses; a gateway's own writes carry its id in
the ``Cmq-Origin`` header and are skipped, so a put followed by a delete is never undone by
the put's echo arriving late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from nats.js.api import DeliverPolicy

from gateway.broker import persistence as P
from semantics.jetstream.names import META_BUCKET, store_key
from semantics.store.keys import parse_key

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker

__all__ = ["ORIGIN", "MetaWatch", "stop_watching", "value_of"]

log = logging.getLogger("cmq_gateway.jetstream")

ORIGIN = "Cmq-Origin"
_DELETES = ("DEL", "PURGE")


def value_of(msg: Any) -> bytes | None:
    op = (msg.headers or {}).get("KV-Operation")
    return None if op in _DELETES else bytes(msg.data)


class MetaWatch:
    """The bucket's changes, applied to one broker."""

    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self._sub: Any = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # The bucket's stream sequence applied so far: a reader that must see every change
        # made before a moment waits for it to pass that moment's last sequence (caught_up).
        self.seq = 0

    async def load(self) -> None:
        """Subscribe and read every key's last value into the store's map (before recovery)."""
        js = self.broker.link.js
        info = await js.stream_info(f"KV_{META_BUCKET}")
        last = info.state.last_seq

        async def got(msg: Any) -> None:
            self._queue.put_nowait(msg)

        self._sub = await js.subscribe(f"$KV.{META_BUCKET}.>", cb=got, ordered_consumer=True,
                                       deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        store = self.broker.store
        seq = last
        while info.state.messages:
            msg = await asyncio.wait_for(self._queue.get(), 10)
            key = _key(msg)
            if key is not None:
                store.load(key, value_of(msg))
                self.broker.note_owner(key, msg)
            # Past ``last`` when a key was written again since stream_info (its older value is
            # gone, the newer one comes here): that one is read too.
            seq = max(seq, msg.metadata.sequence.stream)
            if msg.metadata.sequence.stream >= last or msg.metadata.num_pending == 0:
                break
        self.seq = seq

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        me = self.broker.gateway_id
        while True:
            msg = await self._queue.get()
            key = _key(msg) if (msg.headers or {}).get(ORIGIN) != me else None
            if key is not None:
                self.broker.note_owner(key, msg)
                try:
                    self.broker.apply_remote(key, value_of(msg))
                except Exception:  # noqa: BLE001 - one bad record must not stop the watch
                    log.exception("cannot apply %s from the metadata bucket", key)
            with contextlib.suppress(Exception):
                self.seq = msg.metadata.sequence.stream

    async def caught_up(self, timeout: float) -> bool:
        """Every change written to the bucket before this call is applied here (False: not
        within ``timeout`` seconds, or NATS did not answer)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            info = await asyncio.wait_for(self.broker.link.js.stream_info(f"KV_{META_BUCKET}"), timeout)
        except Exception:  # noqa: BLE001 - NATS away: what is here is all there is to read
            return False
        last = info.state.last_seq
        while self.seq < last:
            if loop.time() > deadline:
                log.warning("metadata watch at sequence %d, the bucket at %d", self.seq, last)
                return False
            await asyncio.sleep(0.01)
        return True

    async def stop(self) -> None:
        await stop_watching(self._task, self._sub)


async def stop_watching(task: asyncio.Task[None] | None, sub: Any) -> None:
    """End a bucket watch: its task, then its subscription."""
    if task is not None:
        # A cancel can be lost on Python 3.11: asyncio.wait_for (nats-py's requests wait in
        # it) swallows one that comes as its inner future completes, and the task runs on
        # (a stop hung in Presence._beat's next heartbeat). Cancel again until it is done.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    if sub is not None:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def _key(msg: Any) -> str | None:
    name = msg.subject[len(f"$KV.{META_BUCKET}."):]
    try:
        key = store_key(name)
        parse_key(key)
    except (ValueError, UnicodeDecodeError):
        return None
    return key


def decode(raw: bytes) -> dict[str, Any]:
    return P.decode_json(raw)  # type: ignore[no-any-return]
