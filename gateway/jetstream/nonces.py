"""The CMQ API's nonce ledger on JetStream (SE6, gateway.cmqapi.nonces): the KV bucket
``CMQ_NONCES``, shared by every gateway of the cluster.

Its entries expire after the window (the bucket's ``ttl``: JetStream drops them, not the
gateway), and a nonce is taken with a create that fails when the key exists: of two gateways
given the same captured request, exactly one takes it, however close together they are.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.js.errors import KeyWrongLastSequenceError

from gateway.cmqapi.errors import INTERNAL, CmqApiError
from gateway.cmqapi.signing import NonceCache, replayed

__all__ = ["NONCE_BUCKET", "KvLedger"]

log = logging.getLogger("cmq_gateway.cmqapi")

NONCE_BUCKET = "CMQ_NONCES"
KV_WAIT = 10.0  # hang protection of one create in the bucket


class KvLedger:
    """See the module docstring (``JetStreamMessages.nonce_ledger`` makes it)."""

    expires_itself = True

    def __init__(self, link: Any, ttl: float) -> None:
        self.link = link
        self.ttl = ttl
        self._kv: Any = None

    async def load(self, cache: NonceCache, now: float) -> None:
        js = self.link.js
        try:
            self._kv = await js.key_value(NONCE_BUCKET)
        except Exception:  # noqa: BLE001 - not found: the first gateway creates it
            self._kv = await js.create_key_value(bucket=NONCE_BUCKET, history=1, ttl=self.ttl,
                                                 replicas=self.link.replicas)

    async def take(self, key: str, nonce: str, now: float) -> None:
        try:
            await asyncio.wait_for(self._kv.create(key, b"%d" % int(now)), KV_WAIT)
        except KeyWrongLastSequenceError:
            raise replayed(nonce) from None
        except Exception as e:  # noqa: BLE001 - NATS away: refuse rather than risk a replay
            log.warning("nonce not recorded in %s: %r", NONCE_BUCKET, e)
            raise CmqApiError(INTERNAL, "server internal error: the nonce store did not answer, try again") from None

    def forget(self, key: str) -> None:
        pass  # the bucket's ttl
