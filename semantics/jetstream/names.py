"""Names on JetStream for what the broker names freely (docs/CLUSTER.md, "Names and keys").

AMQP names hold any byte; stream and consumer names may not hold ``.``, ``*``, ``>``, ``/`` or
white space, subject tokens not ``.``/``*``/``>``, and KV keys only ``[-/_=.a-zA-Z0-9]``.

* A queue's token: a readable prefix (other characters as ``_``) and 16 hex digits of SHA-256
  over ``vhost NUL queue``: every gateway computes the same token, distinct queues get
  distinct tokens (64 bits of hash), and an operator listing streams recognises the queue.
* A KV key: the store key's kind (readable, so a watch can filter on ``q.>``), a dot, then
  base64url without padding of the rest, which round-trips any text.
"""

from __future__ import annotations

import base64
import hashlib
import re

__all__ = [
    "BODY_BUCKET",
    "META_BUCKET",
    "LEASE_BUCKET",
    "CONSUMER",
    "kv_key",
    "queue_stream",
    "queue_subject",
    "queue_token",
    "store_key",
]

META_BUCKET = "CMQ_META"
LEASE_BUCKET = "CMQ_LEASE"
BODY_BUCKET = "CMQ_BODIES"  # object store: bodies above one NATS message (gateway.jetstream.bodies)
CONSUMER = "cmq"  # the one durable pull consumer per queue stream, shared by every gateway
_READABLE = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def queue_token(vhost: str, queue: str) -> str:
    digest = hashlib.sha256(f"{vhost}\0{queue}".encode()).hexdigest()[:16]
    return f"{_UNSAFE.sub('_', queue[:_READABLE])}_{digest}"


def queue_stream(vhost: str, queue: str) -> str:
    return "CMQQ_" + queue_token(vhost, queue)


def queue_subject(vhost: str, queue: str) -> str:
    return "cmq.q." + queue_token(vhost, queue)


def kv_key(key: str) -> str:
    """The KV key of store key ``key`` (``kind/components...``)."""
    kind, _, rest = key.partition("/")
    return f"{kind}.{base64.urlsafe_b64encode(rest.encode()).decode().rstrip('=')}"


def store_key(kv: str) -> str:
    """The inverse of :func:`kv_key`; ValueError for a key it did not make."""
    kind, dot, rest = kv.partition(".")
    if not dot or not kind:
        raise ValueError(f"{kv!r} is not a gateway KV key")
    raw = base64.urlsafe_b64decode(rest + "=" * (-len(rest) % 4))
    return f"{kind}/{raw.decode()}"
