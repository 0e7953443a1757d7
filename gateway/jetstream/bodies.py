"""Bodies too large for one NATS message (docs/CLUSTER.md, "Large bodies").

A NATS message holds at most the server's ``max_payload`` (1 MiB by default), while AMQP
bodies may be far larger. A body above :attr:`Bodies.limit` goes to the ``CMQ_BODIES`` object
store (chunked there by nats-py), one object per queue and message; the queue's stream carries
the message without its body and the object's name in the ``Cmq-Body`` header. The pulling
gateway reads the body back before it delivers; the gateway that deletes the message (ack,
reject, dead-letter) deletes the object. Objects of purged or deleted queues stay until the
bucket's TTL, the longest retention a queue may have (L7).
"""

from __future__ import annotations

import logging
from typing import Any

from nats.js.api import ObjectStoreConfig

from gateway.jetstream.link import Link
from semantics.jetstream.names import BODY_BUCKET
from semantics.limits import QUEUE_RETENTION_MAX

__all__ = ["BODY_HEADER", "Bodies"]

log = logging.getLogger("cmq_gateway.jetstream")

BODY_HEADER = "Cmq-Body"
HEADROOM = 64 * 1024  # for the properties, names and headers beside the body


class Bodies:
    def __init__(self, link: Link) -> None:
        self.link = link
        self.limit = max(HEADROOM, link.nc.max_payload - HEADROOM)
        self._store: Any = None

    async def _bucket(self) -> Any:
        if self._store is None:
            js = self.link.js
            try:
                self._store = await js.object_store(BODY_BUCKET)
            except Exception:  # noqa: BLE001 - not found: the first large body creates it
                self._store = await js.create_object_store(BODY_BUCKET, ObjectStoreConfig(
                    ttl=float(QUEUE_RETENTION_MAX), replicas=self.link.replicas))
        return self._store

    async def put(self, name: str, body: bytes) -> None:
        await (await self._bucket()).put(name, body)

    async def get(self, name: str) -> bytes:
        result = await (await self._bucket()).get(name)
        return bytes(result.data or b"")

    async def delete(self, name: str) -> None:
        try:
            await (await self._bucket()).delete(name)
        except Exception as e:  # noqa: BLE001 - already gone; the TTL removes what is left
            log.info("body %s not deleted: %r", name, e)
