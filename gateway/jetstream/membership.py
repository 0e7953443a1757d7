"""Membership in a cluster of gateways sharing one state (docs/CLUSTER.md, CL4).

The embedded vhost journals only durable objects; a cluster must also share transient and
exclusive queues, exchanges and bindings (a publish through gateway B routes to a queue
declared through gateway A), so VHost writes their records too (``shares``), marked
``"durable": false`` and, for an exclusive queue, with the owning gateway's id (``owner``).
Which queues are exclusive to another gateway, and when an auto-delete or x-expires queue
may go, is decided here with the other gateways, through the presence bucket
(gateway.jetstream.presence).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.vhost import VHost
    from gateway.jetstream.broker import ClusterBroker

__all__ = ["JetStreamMembership"]

AUTO_DELETE_GRACE = 0.5
EXPIRES_RECHECK = 1.0  # x-expires: while another gateway has consumers, asked again this often


class JetStreamMembership:
    """gateway.broker.membership.Membership for the gateways of one cluster."""

    shares = True

    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self.owner = broker.gateway_id
        # CL4: queues exclusive to a connection of another gateway (vhost -> name -> gateway id).
        self.remote_exclusive: dict[str, dict[str, str]] = {}

    def locked(self, vhost: str, name: str) -> bool:
        held = self.remote_exclusive.get(vhost)
        return held is not None and name in held

    def release(self, vhost: str, name: str) -> bool:
        """No longer exclusive to another gateway (its owner is dead or taken over): True if it was."""
        held = self.remote_exclusive.get(vhost)
        return held is not None and held.pop(name, None) is not None

    def used(self, q: BrokerQueue) -> None:
        self.broker.presence.note_use(q, q.last_used)

    # -- declarations of other gateways ------------------------------------------------------

    def declare_remote(self, vh: VHost, r: dict[str, Any]) -> None:
        """A queue another gateway declared (its record from the bucket)."""
        # As a server-named queue (checked where it was declared; amq.* names are MQTT's, MQ8).
        vh.declare_queue_here(None, "", server_name=r["name"], passive=False, durable=r.get("durable", True),
                              exclusive=False, auto_delete=r["auto_delete"], arguments=r["arguments"])
        owner = r.get("exclusive_owner")
        if owner is not None and owner != self.owner:
            self.remote_exclusive.setdefault(vh.name, {})[r["name"]] = owner

    def forget_remote(self, vh: VHost, q: BrokerQueue) -> None:
        """A queue another gateway deleted."""
        self.release(vh.name, q.name)
        vh.delete_queue(None, q.name, if_unused=False, if_empty=False)

    def reap_dead(self, alive: Any) -> None:
        """Exclusive queues of a dead gateway go, as RabbitMQ's go with their node."""
        for vh in list(self.broker.vhosts.values()):
            held = self.remote_exclusive.get(vh.name, {})
            for name, owner in list(held.items()):
                if not alive(owner):
                    del held[name]
                    if name in vh.queues:
                        vh.delete_queue(None, name, if_unused=False, if_empty=False, reason="owner_closed")

    # -- CL4: auto-delete and x-expires across gateways ----------------------------------------

    def hold_auto_delete(self, vh: VHost, q: BrokerQueue) -> bool:
        """CL4: an auto-delete queue goes when the last consumer of every gateway has gone;
        decided AUTO_DELETE_GRACE seconds later, once a consumer another gateway just added
        has reached this one through the presence bucket."""
        self.broker.touch_queue(q)
        self.broker.spawn(self._auto_delete_later(vh, q))
        return True

    async def _auto_delete_later(self, vh: VHost, q: BrokerQueue) -> None:
        await asyncio.sleep(AUTO_DELETE_GRACE)
        if not q.consumers and not q.deleted and not self.broker.presence.others_consume(q):
            vh.last_consumer_left(q)

    def hold_expiry(self, vh: VHost, q: BrokerQueue) -> bool:
        """CL4 x-expires: this gateway's timer ran out; the queue goes only if no gateway
        used it since (presence ``u.<token>``) and none has a consumer on it, so a queue
        unused on every gateway expires once and one used anywhere stays."""
        if q.qargs.expires_ms is None:
            return False
        broker = self.broker
        presence = broker.presence
        now = broker.now()
        ttl = q.qargs.expires_ms / 1000.0
        if presence.others_consume(q):
            q.last_used = now - ttl + EXPIRES_RECHECK  # looked at again when they may have gone
            broker.scheduler.reschedule(q)
            return True
        last = presence.last_use(q)
        if last + ttl > now:
            q.last_used = max(q.last_used, last)
            broker.scheduler.reschedule(q)
            return True
        # Every gateway's timer runs out about now: the one that takes the lease deletes it
        # (once); the others follow the watch, or look again after x-expires if it did not.
        q.last_used = now
        broker.scheduler.reschedule(q)
        broker.spawn(self._expire_once(vh, q, last))
        return True

    async def _expire_once(self, vh: VHost, q: BrokerQueue, last: float) -> None:
        if await self.broker.presence.claim_expiry(q, last):
            vh.remove_expired(q)
