"""Retained messages (SPEC MQ5): one per topic and vhost, durable in the broker's store.

Key ``mr/<vhost>/<topic>``; value: a JSON line ``{"topic", "qos"}`` then the payload. An empty
payload clears the topic. Read from the store once per vhost, on first use.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gateway.mqtt.topics import matches
from semantics.store.keys import key_prefix, make_key

if TYPE_CHECKING:
    from gateway.mqtt.session import MQTTSession

__all__ = ["RetainedStore"]


class RetainedStore:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._vhosts: dict[str, dict[str, tuple[int, bytes]]] = {}

    def _of(self, vhost: str) -> dict[str, tuple[int, bytes]]:
        known = self._vhosts.get(vhost)
        if known is None:
            known = self._vhosts[vhost] = {}
            for _, raw in self.broker.store.items(key_prefix("mr", vhost)):
                head, _, payload = raw.partition(b"\n")
                r = json.loads(head)
                known[r["topic"]] = (int(r["qos"]), payload)
        return known

    def changed(self, vhost: str, topic: str, raw: bytes | None) -> None:
        """The record of ``topic`` was written by another gateway (a shared store)."""
        known = self._vhosts.get(vhost)
        if known is None:
            return  # read from the store on first use
        if raw is None:
            known.pop(topic, None)
            return
        head, _, payload = raw.partition(b"\n")
        known[topic] = (int(json.loads(head)["qos"]), payload)

    def put(self, vhost: str, topic: str, qos: int, payload: bytes) -> int:
        """Retain (or, with an empty payload, clear) ``topic``; the store's lsn to wait for."""
        known = self._of(vhost)
        key = make_key("mr", vhost, topic)
        if not payload:
            if known.pop(topic, None) is None:
                return 0
            self.broker.unpersist(key)
            return int(self.broker.durable_lsn) + 1  # a delete has no lsn here: wait for the next sync
        known[topic] = (qos, payload)
        return int(self.broker.persist(key, json.dumps({"topic": topic, "qos": qos}).encode() + b"\n" + payload))

    def deliver(self, session: MQTTSession, topic_filter: str, sub_qos: int) -> None:
        for topic, (qos, payload) in list(self._of(session.state.vhost).items()):
            if matches(topic_filter, topic):
                session.deliver_retained(topic, payload, min(qos, sub_qos))

    def count(self, vhost: str) -> int:
        return len(self._of(vhost))
