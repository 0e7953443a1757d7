"""The broker on JetStream: one of many gateways sharing one state (docs/CLUSTER.md).

:class:`ClusterBroker` is the embedded :class:`Broker` with the store seam filled by
:class:`JetStreamStore` and the methods where state crosses the network replaced; the
embedded broker's own methods are untouched, so its hot path pays nothing for this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from gateway.broker import persistence as P
from gateway.broker.broker import Broker
from gateway.broker.exchange import Exchange
from gateway.broker.policies import Policy
from gateway.jetstream.link import Link, open_link
from gateway.jetstream.meta import MetaWatch
from gateway.jetstream.store import JetStreamStore
from gateway.jetstream.vhost import ClusterVHost
from semantics.clock import Clock, SystemClock
from semantics.store.keys import parse_key

__all__ = ["ClusterBroker"]

log = logging.getLogger("cmq_gateway.jetstream")

CLOSE_SETTLE_SECONDS = 5.0


class ClusterBroker(Broker):
    """See the module docstring; open with :meth:`open_cluster`."""

    vhost_class = ClusterVHost
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
            await broker.watch.load()
            broker._recover()
            store.on_durable = broker._on_durable
            broker.watch.start()
        except BaseException:
            await link.close()
            raise
        return broker

    def __init__(self, data_dir: str | None, *, link: Link, gateway_id: str, **kwargs: Any) -> None:
        self.link = link
        self.gateway_id = gateway_id
        super().__init__(data_dir, **kwargs)
        self.watch = MetaWatch(self)

    # -- the store: JetStream acknowledges as it goes (no group commit thread) ---------------

    async def _flush_loop(self) -> None:
        return None

    def sync_now(self) -> int:
        durable = self.store.durable_lsn
        self._on_durable(durable)
        return durable

    async def flush(self) -> int:
        durable = await self.store.settled()
        self._on_durable(durable)
        return durable

    def _log_recovery(self) -> None:
        log.info("store: NATS JetStream, %d replica(s), gateway id %s", self.link.replicas, self.gateway_id)

    async def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.store.settled(), CLOSE_SETTLE_SECONDS)
        await self.watch.stop()
        await super().close()
        await self.link.close()

    def forget_queue(self, vh: Any, q: Any) -> None:
        super().forget_queue(vh, q)
        if not q.durable:  # shared in the bucket too (gateway.jetstream.vhost)
            self.unpersist(P.queue_key(vh.name, q.name), missing_ok=True)

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
        assert isinstance(vh, ClusterVHost)
        if value is None:
            q = vh.queues.get(names[1])
            if q is not None:
                vh.forget_remote(q)
            return
        r = P.decode_json(value)
        q = vh.queues.get(r["name"])
        if q is None:
            vh.declare_remote(r)
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
