"""Replay protection that outlives the process and spans a cluster (SPEC CA1, SE6).

A signed request carries a ``Nonce``; its second use by the same SecretId within the
Timestamp window is a replay and is refused (4100). The nonces used are remembered for the
whole window (two TIMESTAMP_WINDOWs: a Timestamp may be ahead of the gateway's clock by one):

* on the embedded store, as ``n/<key>`` records beside the broker's (value: the Unix time of
  the use), read back on the first request after a start and dropped once out of the window;
  a request that changes something is answered after its store sync, which covers its nonce;
* on JetStream, in the KV bucket ``CMQ_NONCES`` whose entries JetStream itself expires after
  the window (``ttl``), written with a create that fails when the key exists: of two gateways
  given the same captured request, exactly one takes it, however close together they are.

The key of a (SecretId, Nonce) pair is a digest (gateway.cmqapi.signing.nonce_key), so any
Nonce a client sends is a valid key in both. A local NonceCache answers a replay to the same
gateway without a round trip.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.cmqapi.errors import INTERNAL, CmqApiError
from gateway.cmqapi.signing import TIMESTAMP_WINDOW, NonceCache, replayed
from semantics.store.keys import key_prefix, make_key

__all__ = ["NONCE_BUCKET", "NonceStore"]

log = logging.getLogger("cmq_gateway.cmqapi")

NONCE_BUCKET = "CMQ_NONCES"
KIND = "n"
KV_WAIT = 10.0  # hang protection of one create in the bucket



class NonceStore:
    """The nonces of one gateway's CMQ API over its broker's store (see the module)."""

    def __init__(self, broker: Any, window: float = TIMESTAMP_WINDOW) -> None:
        self.broker = broker
        self.link = getattr(broker, "link", None)  # a ClusterBroker's NATS link, else None
        self.cache = NonceCache(window, forget=None if self.link is not None else self._forget)
        self._kv: Any = None
        self._loaded = False
        self._loading = asyncio.Lock()

    async def use(self, secret_id: str, nonce: str, now: float) -> None:
        """Record the nonce of a verified request; CmqApiError 4100 when it was used before."""
        await self._open(now)
        key = self.cache.use(secret_id, nonce, now)
        if self.link is None:
            self.broker.persist(make_key(KIND, key), b"%d" % int(now))
            return
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            await asyncio.wait_for(self._kv.create(key, b"%d" % int(now)), KV_WAIT)
        except KeyWrongLastSequenceError:
            raise replayed(nonce) from None
        except Exception as e:  # noqa: BLE001 - NATS away: refuse rather than risk a replay
            self.cache.drop(key)
            log.warning("nonce not recorded in %s: %r", NONCE_BUCKET, e)
            raise CmqApiError(INTERNAL, "server internal error: the nonce store did not answer, try again") from None

    async def _open(self, now: float) -> None:
        if self._loaded:
            return
        async with self._loading:
            if not self._loaded:
                await self._load(now)
                self._loaded = True

    async def _load(self, now: float) -> None:
        if self.link is None:
            records = []
            for k, v in list(self.broker.store.items(key_prefix(KIND))):
                try:
                    records.append((float(v), k))
                except ValueError:
                    records.append((0.0, k))
            for at, k in sorted(records):
                if self.cache.expired(at, now):
                    self.broker.unpersist(k, missing_ok=True)
                else:
                    self.cache.remember(k.rpartition("/")[2], at)
            return
        js = self.link.js
        try:
            self._kv = await js.key_value(NONCE_BUCKET)
        except Exception:  # noqa: BLE001 - not found: the first gateway creates it
            self._kv = await js.create_key_value(bucket=NONCE_BUCKET, history=1, ttl=2 * self.cache.window,
                                                 replicas=self.link.replicas)

    def _forget(self, key: str) -> None:
        self.broker.unpersist(make_key(KIND, key), missing_ok=True)
