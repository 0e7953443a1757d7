"""The broker on JetStream: one of many gateways sharing one state (docs/CLUSTER.md).

:class:`ClusterBroker` is the embedded :class:`Broker` with its three seams filled: records
(``StoreBackend``) by :class:`JetStreamStore`; queue messages and the confirms that follow
them (``MessageStorage``, gateway.broker.storage) by :class:`JetStreamMessages`, which owns
the publishing, pulling, leases, counts and streams (gateway.jetstream.messages); what a vhost
asks of the other gateways (``Membership``, gateway.broker.membership: shared records of
transient objects, exclusive queues of other gateways, auto-delete and x-expires) by
:class:`JetStreamMembership`. What is left here: which gateway owns the topic retries and the
single active consumer (through gateway.jetstream.presence), the declarations of every
gateway (applied at start, ``_recover_declarations``, and as they change, ``apply_remote``)
and joining and leaving the cluster (``open_cluster``, ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from gateway.broker import persistence as P
from gateway.broker.broker import Broker
from gateway.broker.exchange import Exchange
from gateway.broker.policies import Policy
from gateway.broker.queue import BrokerQueue
from gateway.jetstream.link import Link, open_link
from gateway.jetstream.membership import JetStreamMembership
from gateway.jetstream.messages import JetStreamMessages
from gateway.jetstream.meta import ORIGIN, MetaWatch, value_of
from gateway.jetstream.mqtt_state import MQTTCluster
from gateway.jetstream.presence import Presence
from gateway.jetstream.store import JetStreamStore
from semantics.clock import Clock, SystemClock
from semantics.store.keys import parse_key

__all__ = ["ClusterBroker"]

log = logging.getLogger("cmq_gateway.jetstream")

CLOSE_SETTLE_SECONDS = 5.0


class ClusterBroker(Broker):
    """See the module docstring; open with :meth:`open_cluster`."""

    storage_class = JetStreamMessages
    membership_class = JetStreamMembership
    messages: JetStreamMessages
    membership: JetStreamMembership
    store: JetStreamStore
    link: Link

    @classmethod
    async def open_cluster(cls, url: str, options: dict[str, str] | None = None, *,
                           clock: Clock | None = None, audit: Any = None, config: Any = None,
                           lock: Any = None) -> ClusterBroker:
        """Connect (NatsUnavailable: one line), read the shared state, recover, watch."""
        link = await open_link(url, options)
        try:
            store = await JetStreamStore.open(link)
            gateway_id = uuid.uuid4().hex[:12]
            store.origin = gateway_id
            loop = asyncio.get_running_loop()
            broker = cls(None, clock=clock or SystemClock(), audit=audit, config=config, loop=loop,
                         store=store, link=link, gateway_id=gateway_id)
            await broker.messages.open()
            log.info("store: NATS JetStream, %d replica(s), gateway id %s", link.replicas, gateway_id)
            await broker.watch.load()
            broker._recover()
            broker.messages.start()  # confirms follow JetStream's acknowledgements
            await broker.messages.streams_ready()
            broker.watch.start()
            await broker.presence.start()
            await broker.mqtt.start()  # answers MQTT client-id claims (gateway.jetstream.mqtt_state)
            broker.messages.run()  # counts, the TTL sweep
        except BaseException:
            await link.close()
            raise
        return broker

    def __init__(self, data_dir: str | None, *, link: Link, gateway_id: str, **kwargs: Any) -> None:
        self.link = link
        self.gateway_id = gateway_id
        super().__init__(data_dir, **kwargs)
        self.watch = MetaWatch(self)
        self.presence = Presence(self)
        self.mqtt = MQTTCluster(self)
        self.retained_owner: dict[str, str] = {}  # t/ key -> the gateway running its retries
        # Kinds of records the broker does not decode itself (MQTT's ms/, mr/): a change made
        # by another gateway goes to its watcher here (gateway.jetstream.mqtt_state).
        self.record_watchers: dict[str, Callable[[str, bytes | None], None]] = {}

    async def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.store.settled(), CLOSE_SETTLE_SECONDS)
        await self.watch.stop()
        await self.presence.stop()
        await self.messages.stop()
        await super().close()  # cancels the tasks it runs (spawn)
        await self.link.close()

    # -- CL4: exclusive, auto-delete and single active consumer across gateways --------------

    def note_owner(self, key: str, msg: Any) -> None:
        """D2-D6: which gateway runs the retries of a topic-retained message (its writer)."""
        if key.startswith(P.RETAINED_PREFIX):
            origin = (msg.headers or {}).get(ORIGIN)
            if origin is None or value_of(msg) is None:
                self.retained_owner.pop(key, None)
            else:
                self.retained_owner[key] = origin

    def _recover_retained(self, now: float, keys: list[str] | None = None) -> None:
        """At start the records stay where they are: their gateway (alive) runs their
        retries, or the gateway that takes over from it once it is dead (reap_dead)."""
        if keys is not None:
            super()._recover_retained(now, keys)

    async def _take_over(self, owner: str, keys: list[str]) -> None:
        """One live gateway (the one that creates the lease ``rt.<dead id>``) offers a dead
        gateway's retained messages again and owns their retries from now on (CL4, D2-D6)."""
        try:
            await self.presence.kv.create(f"rt.{owner}", self.gateway_id.encode())
        except Exception:  # noqa: BLE001 - another gateway took it over
            for key in keys:
                if self.retained_owner.get(key) == owner:
                    self.retained_owner[key] = ""  # not ours to run; its new owner rewrites it
            return
        log.info("taking over %d retained topic messages of gateway %s", len(keys), owner)
        for key in keys:
            self.retained_owner.pop(key, None)
        self._recover_retained(self.clock.now(), keys)

    def reap_dead(self, presence: Presence) -> None:
        """Exclusive queues of a dead gateway go, as RabbitMQ's go with their node; its
        topic retries are taken over."""
        dead: dict[str, list[str]] = {}
        for key, owner in self.retained_owner.items():
            if owner and owner != self.gateway_id and not presence.alive(owner):
                dead.setdefault(owner, []).append(key)
        for owner, keys in dead.items():
            for key in keys:
                self.retained_owner[key] = ""
            self.spawn(self._take_over(owner, keys))
        self.membership.reap_dead(presence.alive)

    def single_active_free(self, token: str) -> None:
        from semantics.jetstream.names import queue_token
        for s in self.messages.queue_streams():
            q = s.q
            if q.consumers and not s.sac_active and queue_token(q.vhost, q.name) == token:
                self.spawn(self.presence.claim(q))

    def single_active_won(self, q: BrokerQueue) -> None:
        self.dispatch(q)

    # -- declarations of every gateway (CL1) -------------------------------------------------

    def _recover_declarations(self) -> None:
        for kind in ("p", "x", "q", "b"):
            for key, raw in self.store.items(kind + "/"):
                self._apply(key, raw)

    def apply_remote(self, key: str, value: bytes | None) -> None:
        """Another gateway changed ``key`` in the bucket: the same change here."""
        if self.store.get(key) == value:
            return
        self._apply(key, value)
        self.store.load(key, value)
        if key.startswith("u/"):
            self._recover_accounts()
        elif key.startswith(P.SUBSCRIPTIONS_PREFIX):
            self._apply_http_subscription(key, value)
        else:
            watcher = self.record_watchers.get(key.partition("/")[0])
            if watcher is not None:
                watcher(key, value)

    def _apply_http_subscription(self, key: str, value: bytes | None) -> None:
        """D7: an HTTP subscription made or removed through another gateway."""
        from gateway.push import HttpPusher
        pusher = HttpPusher.of(self)
        if value is not None:
            pusher.recover()  # makes the ones it does not have yet
            return
        _, names = parse_key(key)
        self.store.applying = True
        try:
            pusher.unsubscribe(*names[:3])
        finally:
            self.store.applying = False

    def _apply(self, key: str, value: bytes | None) -> None:
        store = self.store
        kind, names = parse_key(key)
        store.applying = True
        strict, self.strict_names = self.strict_names, False  # L2 was checked where it was declared
        try:
            if kind == "p":
                self._apply_policy(names, value)
            elif kind == "x":
                self._apply_exchange(names, value)
            elif kind == "q":
                self._apply_queue(names, value)
            elif kind == "b":
                self._apply_binding(names, value)
        finally:
            store.applying = False
            self.strict_names = strict

    def _apply_policy(self, names: tuple[str, ...], value: bytes | None) -> None:
        vh = self.vhost(names[0])
        if value is None:
            vh.delete_policy(names[1])
        else:
            vh.set_policy(Policy.from_json(P.decode_json(value)))

    def _apply_exchange(self, names: tuple[str, ...], value: bytes | None) -> None:
        vh = self.vhost(names[0])
        if value is None:
            if names[1] in vh.exchanges:
                vh.delete_exchange(names[1], if_unused=False)
            return
        r = P.decode_json(value)
        if r["name"] not in vh.exchanges:
            vh.exchanges[r["name"]] = Exchange(vh.name, r["name"], r["type"], durable=r.get("durable", True),
                                               auto_delete=r["auto_delete"], internal=r["internal"],
                                               arguments=r["arguments"], limits=vh.profile.enforced)

    def _apply_queue(self, names: tuple[str, ...], value: bytes | None) -> None:
        vh = self.vhost(names[0])
        if value is None:
            q = vh.queues.get(names[1])
            if q is not None:
                self.membership.forget_remote(vh, q)
            return
        r = P.decode_json(value)
        q = vh.queues.get(r["name"])
        if q is None:
            self.membership.declare_remote(vh, r)
        elif r["arguments"] != q.arguments:
            with contextlib.suppress(Exception):
                vh.set_queue_arguments(q, r["arguments"])

    def _apply_binding(self, names: tuple[str, ...], value: bytes | None) -> None:
        vh = self.vhost(names[0])
        source, kind, dest, key = names[1:5]
        if value is None:
            vh.unbind(None, source, (kind, dest), key)  # type: ignore[arg-type]
            return
        r = P.decode_json(value)
        with contextlib.suppress(Exception):  # its queue or exchange may not be here yet
            vh.bind(None, r["source"], (r["kind"], r["dest"]), r["key"], r["arguments"])
