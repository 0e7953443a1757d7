"""Retained messages (SPEC MQ5): one per topic and vhost, durable in the broker's store.

Key ``mr/<vhost>/<topic>`` (a topic over 256 bytes: ``mr/<vhost>/#/<digest>``, as MQTT's
65,535 bytes, escaped, would pass the store's 64 KiB keys; ``#`` is no topic name, MQ8); value:
a JSON line ``{"topic", "qos"}`` then the payload. An empty payload clears the topic. Read from
the store once per vhost, on first use.

What the in-memory copy holds is counted as held memory (SE6: ``HELD.retained``, topic +
payload + ``RETAINED_OVERHEAD`` each) so that retained messages raise the memory alarm; the
store counts its own copy (``live_bytes``: a large value left on disk counts as its location).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from gateway.memory import HELD, RETAINED_OVERHEAD
from gateway.mqtt.topics import matches
from semantics.store.keys import key_prefix, make_key

if TYPE_CHECKING:
    from gateway.mqtt.session import MQTTSession

__all__ = ["RetainedStore", "retained_key"]

_LONG_TOPIC = 256  # bytes: a longer topic is a digest in its key


def _digest(topic: str) -> str:
    return hashlib.sha256(topic.encode()).hexdigest()[:32]


def retained_key(vhost: str, topic: str) -> str:
    if len(topic) > _LONG_TOPIC // 4 and len(topic.encode()) > _LONG_TOPIC:
        return make_key("mr", vhost, "#", _digest(topic))
    return make_key("mr", vhost, topic)


class RetainedStore:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._vhosts: dict[str, dict[str, tuple[int, bytes]]] = {}
        self.held = 0  # bytes counted in HELD.retained

    def _count(self, topic: str, old: tuple[int, bytes] | None, new: tuple[int, bytes] | None) -> None:
        delta = 0
        if old is not None:
            delta -= len(topic) + len(old[1]) + RETAINED_OVERHEAD
        if new is not None:
            delta += len(topic) + len(new[1]) + RETAINED_OVERHEAD
        self.held += delta
        HELD.retained += delta

    def close(self) -> None:
        """The gateway stops: what it held is let go (the counters are process-wide)."""
        HELD.retained -= self.held
        self.held = 0
        self._vhosts.clear()

    def _of(self, vhost: str) -> dict[str, tuple[int, bytes]]:
        known = self._vhosts.get(vhost)
        if known is None:
            known = self._vhosts[vhost] = {}
            for _, raw in self.broker.store.items(key_prefix("mr", vhost)):
                head, _, payload = raw.partition(b"\n")
                r = json.loads(head)
                topic, entry = r["topic"], (int(r["qos"]), payload)
                self._count(topic, known.get(topic), entry)
                known[topic] = entry
        return known

    def changed(self, vhost: str, topic: str, raw: bytes | None, digest: str = "") -> None:
        """The record of ``topic`` was written by another gateway (a shared store); a long
        topic's key names it by ``digest``."""
        known = self._vhosts.get(vhost)
        if known is None:
            return  # read from the store on first use
        if raw is not None:
            topic = json.loads(raw.partition(b"\n")[0])["topic"]
        elif digest:
            topic = next((t for t in known if len(t) > _LONG_TOPIC // 4 and _digest(t) == digest), "")
        if raw is None:
            self._count(topic, known.pop(topic, None), None)
            return
        head, _, payload = raw.partition(b"\n")
        entry = (int(json.loads(head)["qos"]), payload)
        self._count(topic, known.get(topic), entry)
        known[topic] = entry

    def put(self, vhost: str, topic: str, qos: int, payload: bytes) -> int:
        """Retain (or, with an empty payload, clear) ``topic``; the store's lsn to wait for."""
        known = self._of(vhost)
        key = retained_key(vhost, topic)
        if not payload:
            old = known.pop(topic, None)
            if old is None:
                return 0
            self._count(topic, old, None)
            self.broker.unpersist(key)
            return int(self.broker.durable_lsn) + 1  # a delete has no lsn here: wait for the next sync
        entry = (qos, payload)
        self._count(topic, known.get(topic), entry)
        known[topic] = entry
        return int(self.broker.persist(key, json.dumps({"topic": topic, "qos": qos}).encode() + b"\n" + payload))

    def deliver(self, session: MQTTSession, topic_filter: str, sub_qos: int) -> None:
        for topic, (qos, payload) in list(self._of(session.state.vhost).items()):
            if matches(topic_filter, topic):
                session.deliver_retained(topic, payload, min(qos, sub_qos))

    def count(self, vhost: str) -> int:
        return len(self._of(vhost))
