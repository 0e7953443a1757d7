"""A vhost whose declarations and messages are shared by every gateway (docs/CLUSTER.md).

The embedded vhost journals only durable objects; a cluster must also share transient and
exclusive queues, exchanges and bindings (a publish through gateway B routes to a queue
declared through gateway A), so this one writes their records too, marked ``"durable":
false`` and, for an exclusive queue, with the owning gateway's id.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway.broker import persistence as P
from gateway.broker.errors import resource_locked
from gateway.broker.vhost import VHost
from gateway.jetstream.queues import ClusterQueue

if TYPE_CHECKING:
    from gateway.broker.exchange import Exchange
    from gateway.broker.queue import BrokerQueue
    from gateway.broker.session import Session

__all__ = ["ClusterVHost"]

AUTO_DELETE_GRACE = 0.5
EXPIRES_RECHECK = 1.0  # x-expires: while another gateway has consumers, asked again this often


class ClusterVHost(VHost):
    """Every queue of it is a ClusterQueue (queue_class), so none is tested for it."""

    queue_class = ClusterQueue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # CL4: queues exclusive to a connection of another gateway (name -> gateway id).
        self.remote_exclusive: dict[str, str] = {}

    def queue(self, name: str, session: Session | None = None) -> BrokerQueue:
        if session is not None and name in self.remote_exclusive:
            raise resource_locked(name, self.name)
        return super().queue(name, session)

    def declare_queue(self, session: Session | None, name: str, *, passive: bool, durable: bool,
                      exclusive: bool, auto_delete: bool, arguments: dict[str, Any] | None,
                      user: str | None = None, server_name: str | None = None,
                      peer: str | None = None) -> BrokerQueue:
        if not passive and name in self.remote_exclusive:
            raise resource_locked(name, self.name)
        new = not passive and name not in self.queues
        q = super().declare_queue(session, name, passive=passive, durable=durable, exclusive=exclusive,
                                  auto_delete=auto_delete, arguments=arguments, user=user,
                                  server_name=server_name, peer=peer)
        if new and not (durable and not exclusive):
            record: dict[str, Any] = {"vhost": self.name, "name": q.name, "auto_delete": auto_delete,
                                      "arguments": q.arguments, "durable": durable}
            if exclusive:
                record["exclusive_owner"] = self.broker.gateway_id  # type: ignore[attr-defined]
            self.broker.persist(P.queue_key(self.name, q.name), P.encode_json(record))
        self.broker.presence.note_use(q, q.last_used)  # type: ignore[attr-defined]
        return q

    def declare_remote(self, r: dict[str, Any]) -> None:
        """A queue another gateway declared (its record from the bucket)."""
        # As a server-named queue (checked where it was declared; amq.* names are MQTT's, MQ8).
        super().declare_queue(None, "", server_name=r["name"], passive=False, durable=r.get("durable", True),
                              exclusive=False, auto_delete=r["auto_delete"], arguments=r["arguments"])
        owner = r.get("exclusive_owner")
        if owner is not None and owner != self.broker.gateway_id:  # type: ignore[attr-defined]
            self.remote_exclusive[r["name"]] = owner

    def forget_remote(self, q: BrokerQueue) -> None:
        """A queue another gateway deleted."""
        self.remote_exclusive.pop(q.name, None)
        self._remove_queue(q, user=None, reason="deleted")

    def declare_exchange(self, name: str, type: str, *, passive: bool, durable: bool,
                         auto_delete: bool, internal: bool, arguments: dict[str, Any] | None,
                         user: str | None = None, peer: str | None = None) -> Exchange:
        new = not passive and name not in self.exchanges
        ex = super().declare_exchange(name, type, passive=passive, durable=durable, auto_delete=auto_delete,
                                      internal=internal, arguments=arguments, user=user, peer=peer)
        if new and not durable:
            self.broker.persist(P.exchange_key(self.name, name), P.encode_json(
                {"vhost": self.name, "name": name, "type": type, "auto_delete": auto_delete,
                 "internal": internal, "arguments": ex.arguments, "durable": False}))
        return ex

    def delete_exchange(self, name: str, *, if_unused: bool, user: str | None = None) -> None:
        ex = self.exchanges.get(name)
        super().delete_exchange(name, if_unused=if_unused, user=user)
        if ex is not None and not ex.durable:
            self.broker.unpersist(P.exchange_key(self.name, name), missing_ok=True)

    def bind(self, session: Session | None, source: str, dest: Any, key: str,
             arguments: dict[str, Any] | None, user: str | None = None, peer: str | None = None) -> None:
        super().bind(session, source, dest, key, arguments, user=user, peer=peer)
        ex = self.exchanges[source]
        other = self.queues.get(dest[1]) if dest[0] == "q" else self.exchanges.get(dest[1])
        if not (ex.durable and other is not None and other.durable):
            self.broker.persist(P.binding_key(self.name, source, dest[0], dest[1], key), P.encode_json(
                {"vhost": self.name, "source": source, "kind": dest[0], "dest": dest[1], "key": key,
                 "arguments": dict(arguments or {})}))

    def consumer_gone(self, q: BrokerQueue) -> None:
        """CL4: an auto-delete queue goes when the last consumer of every gateway has gone;
        decided AUTO_DELETE_GRACE seconds later, once a consumer another gateway just added
        has reached this one through the presence bucket."""
        if q.auto_delete and not q.consumers and not q.deleted:
            self.broker.touch_queue(q)
            self.broker.spawn(self._auto_delete_later(q))
            return
        super().consumer_gone(q)
        if not q.consumers and not q.deleted:
            self.broker.presence.note_use(q, q.last_used)  # type: ignore[attr-defined]

    def expire_queue(self, q: BrokerQueue) -> None:
        """CL4 x-expires: this gateway's timer ran out; the queue goes only if no gateway
        used it since (presence ``u.<token>``) and none has a consumer on it, so a queue
        unused on every gateway expires once and one used anywhere stays."""
        if not q.deleted and not q.consumers and q.qargs.expires_ms is not None:
            presence = self.broker.presence  # type: ignore[attr-defined]
            now = self.broker.now()
            ttl = q.qargs.expires_ms / 1000.0
            if presence.others_consume(q):
                q.last_used = now - ttl + EXPIRES_RECHECK  # looked at again when they may have gone
                self.broker.scheduler.reschedule(q)
                return
            last = presence.last_use(q)
            if last + ttl > now:
                q.last_used = max(q.last_used, last)
                self.broker.scheduler.reschedule(q)
                return
            # Every gateway's timer runs out about now: the one that takes the lease deletes it
            # (once); the others follow the watch, or look again after x-expires if it did not.
            q.last_used = now
            self.broker.scheduler.reschedule(q)
            self.broker.spawn(self._expire_once(q, last))
            return
        super().expire_queue(q)

    async def _expire_once(self, q: BrokerQueue, last: float) -> None:
        if await self.broker.presence.claim_expiry(q, last):  # type: ignore[attr-defined]
            super().expire_queue(q)

    async def _auto_delete_later(self, q: BrokerQueue) -> None:
        await asyncio.sleep(AUTO_DELETE_GRACE)
        if not q.consumers and not q.deleted and not self.broker.presence.others_consume(q):  # type: ignore[attr-defined]
            super().consumer_gone(q)
