"""Replay protection that outlives the process and spans a cluster (SPEC CA1, SE6).

A signed request carries a ``Nonce``; its second use by the same SecretId within the
Timestamp window is a replay and is refused (4100). The nonces used are remembered for the
whole window (two TIMESTAMP_WINDOWs: a Timestamp may be ahead of the gateway's clock by one)
in a *ledger* that the broker's message storage provides (``nonce_ledger``: the store answers
where its nonces live, the CMQ API does not ask which store it is):

* the embedded store's, :class:`RecordLedger`: ``n/<key>`` records beside the broker's
  (value: the Unix time of the use), read back on the first request after a start and dropped
  once out of the window; a request that changes something is answered after its store sync,
  which covers its nonce;
* JetStream's (gateway.jetstream.nonces): the KV bucket ``CMQ_NONCES``, whose entries
  JetStream itself expires after the window, written with a create that fails when the key
  exists: of two gateways given the same captured request, exactly one takes it.

The key of a (SecretId, Nonce) pair is a digest (gateway.cmqapi.signing.nonce_key), so any
Nonce a client sends is a valid key in both. A local NonceCache answers a replay to the same
gateway without a round trip.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway.cmqapi.errors import AUTH, CmqApiError
from gateway.cmqapi.signing import TIMESTAMP_WINDOW, NonceCache
from semantics.store.keys import key_prefix, make_key

__all__ = ["KIND", "NonceLedger", "NonceStore", "RecordLedger"]

KIND = "n"


class NonceLedger(Protocol):
    """Where a store keeps the nonces used (see the module docstring)."""

    # Whether the ledger drops what falls out of the window itself (JetStream's TTL); when
    # False the cache tells it (``forget``).
    expires_itself: bool

    async def load(self, cache: NonceCache, now: float) -> None:
        """Once, before the first use: what the ledger holds of the window into ``cache``."""

    async def take(self, key: str, nonce: str, now: float) -> None:
        """Record ``key`` as used at ``now``; CmqApiError 4100 when it was used before (by any
        gateway sharing the ledger), another CmqApiError when the ledger cannot say."""

    def forget(self, key: str) -> None:
        """``key`` fell out of the window."""


class RecordLedger:
    """The embedded store's ledger: records beside the broker's (see the module docstring)."""

    expires_itself = False

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    async def load(self, cache: NonceCache, now: float) -> None:
        records = []
        for k, v in list(self.broker.store.items(key_prefix(KIND))):
            try:
                records.append((float(v), k))
            except ValueError:
                records.append((0.0, k))
        for at, k in sorted(records):
            if cache.expired(at, now):
                self.broker.unpersist(k, missing_ok=True)
            else:
                cache.remember(k.rpartition("/")[2], at)

    async def take(self, key: str, nonce: str, now: float) -> None:
        self.broker.persist(make_key(KIND, key), b"%d" % int(now))  # the cache refused a replay

    def forget(self, key: str) -> None:
        self.broker.unpersist(make_key(KIND, key), missing_ok=True)


def ledger_of(broker: Any, window: float) -> NonceLedger:
    """The ledger the broker's message storage provides; a storage that has none of its own
    (the embedded one) keeps them as records beside the broker's."""
    ledger: NonceLedger | None = broker.messages.nonce_ledger(window)
    return ledger if ledger is not None else RecordLedger(broker)


class NonceStore:
    """The nonces of one gateway's CMQ API over its broker's store (see the module)."""

    def __init__(self, broker: Any, window: float = TIMESTAMP_WINDOW) -> None:
        self.broker = broker
        self.ledger = ledger_of(broker, 2 * window)
        self.cache = NonceCache(window, forget=None if self.ledger.expires_itself else self.ledger.forget)
        self._loaded = False
        self._loading = asyncio.Lock()

    async def use(self, secret_id: str, nonce: str, now: float) -> None:
        """Record the nonce of a verified request; CmqApiError 4100 when it was used before."""
        await self._open(now)
        key = self.cache.use(secret_id, nonce, now)
        try:
            await self.ledger.take(key, nonce, now)
        except CmqApiError as e:
            if e.code != AUTH:
                self.cache.drop(key)  # not recorded (NATS away): the same request may be sent again
            raise

    async def _open(self, now: float) -> None:
        if self._loaded:
            return
        async with self._loading:
            if not self._loaded:
                await self.ledger.load(self.cache, now)
                self._loaded = True
