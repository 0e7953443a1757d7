"""Which gateways are alive, and where each queue has consumers (docs/CLUSTER.md, CL4).

The ``CMQ_LEASE`` bucket (a TTL bucket) holds, refreshed every HEARTBEAT seconds by their
gateway:

* ``gw.<id>``: the gateway is alive;
* ``c.<queue token>.<id>``: how many consumers the gateway has on the queue (auto-delete: a
  queue is deleted when the last consumer of *every* gateway has gone);
* ``sac.<queue token>``: the gateway whose consumer is the queue's single active consumer
  (x-single-active-consumer), created with ``create`` so that one gateway holds it; deleted
  by its holder when its last consumer goes, then taken by the next gateway with one;
* ``u.<queue token>``: the last use (declare, basic.get, last consumer gone; epoch seconds) of
  a queue with x-expires on any gateway, written by the gateway that used it and rewritten
  every USE_REFRESH seconds by the one that used it last (the bucket's TTL would drop it): a
  gateway whose own x-expires timer fires deletes the queue only if nobody used it since,
  and only if it creates ``xp.<queue token>.<that last use>`` (so the queue expires once);
* ``sweep``: the gateway that ends due message TTLs nobody pulls (gateway.jetstream.sweeper),
  taken like ``sac.``; ``e.<queue token>``: a message with an expiration was published to it.

Expiry in a 2.9 TTL bucket leaves no marker a watch sees, so liveness is judged from the time
a key was last written: a gateway silent for DEAD_AFTER seconds is dead (its exclusive queues
are deleted, its consumers no longer count, its single-active lease may be taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nats.js.api import DeliverPolicy

from gateway.jetstream.meta import stop_watching
from semantics.jetstream.names import LEASE_BUCKET, queue_token

if TYPE_CHECKING:
    from gateway.broker.queue import BrokerQueue
    from gateway.jetstream.broker import ClusterBroker

__all__ = ["Presence"]

log = logging.getLogger("cmq_gateway.jetstream")

HEARTBEAT = 1.0
DEAD_AFTER = 5.0
LEASE_TTL = 30.0  # the bucket's max_age: what a dead gateway leaves is gone after it
USE_REFRESH = 10.0  # a queue's last use (u.<token>) is rewritten this often, well within LEASE_TTL



# A bucket another gateway created a moment ago answers once its stream has a leader (an R3
# stream on a fresh cluster: a second or two); until then a write has no responders. Two
# gateways started together on a new cluster met this and one of them exited.
FIRST_WRITE_WAIT = 60.0


async def answered(write: Callable[[], Awaitable[Any]], wait: float = FIRST_WRITE_WAIT) -> Any:
    """``write()``, again every 0.25 s while JetStream has no responder or times out, for at
    most ``wait`` seconds."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NoStreamResponseError

    until = time.monotonic() + wait
    while True:
        try:
            return await write()
        except (NoRespondersError, NoStreamResponseError, NatsTimeout):
            if time.monotonic() > until:
                raise
            log.info("JetStream bucket not answering yet; again")
            await asyncio.sleep(0.25)

class Presence:
    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self.me = broker.gateway_id
        self.kv: Any = None
        self.seen: dict[str, float] = {}  # gateway id -> monotonic time of its last write
        self.counts: dict[str, dict[str, int]] = {}  # queue token -> gateway id -> consumers
        self.sac: dict[str, str] = {}  # queue token -> the gateway holding its active consumer
        self.sweeper_id: str | None = None  # the gateway holding ``sweep``
        self.used: dict[str, float] = {}  # queue token -> its last use on any gateway (x-expires)
        # token -> (use written here, monotonic time written, the queue's x-expires in seconds)
        self.my_use: dict[str, tuple[float, float, float]] = {}
        self.started = time.monotonic()
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        js = self.broker.link.js
        try:
            self.kv = await js.key_value(LEASE_BUCKET)
        except Exception:  # noqa: BLE001 - not found: the first gateway creates it
            self.kv = await js.create_key_value(bucket=LEASE_BUCKET, history=1, ttl=LEASE_TTL,
                                                replicas=self.broker.link.replicas)

        async def got(msg: Any) -> None:
            self._on(msg)

        self._sub = await js.subscribe(f"$KV.{LEASE_BUCKET}.>", cb=got, ordered_consumer=True,
                                       deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        await answered(lambda: self.kv.put(f"gw.{self.me}", b"1"))
        self._task = asyncio.get_running_loop().create_task(self._beat())

    async def stop(self) -> None:
        await stop_watching(self._task, self._sub)
        with contextlib.suppress(Exception):
            for token, holder in list(self.sac.items()):
                if holder == self.me:
                    await self.kv.delete(f"sac.{token}")
            if self.sweeper_id == self.me:
                await self.kv.delete("sweep")
            await self.kv.delete(f"gw.{self.me}")

    # -- what the others say -----------------------------------------------------------------

    def _on(self, msg: Any) -> None:
        key = msg.subject[len(f"$KV.{LEASE_BUCKET}."):]
        deleted = (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
        kind, _, rest = key.partition(".")
        now = time.monotonic()
        if kind == "gw":
            if deleted:
                self.seen.pop(rest, None)
            else:
                self.seen[rest] = now
        elif kind == "c":
            token, _, gw = rest.rpartition(".")
            self.seen.setdefault(gw, now)
            per = self.counts.setdefault(token, {})
            if deleted:
                per.pop(gw, None)
            else:
                n = int(msg.data or b"0")
                per[gw] = n
                self.seen[gw] = max(self.seen[gw], now)
                if n > 0 and gw != self.me:
                    # its consumers take from the queue too: what waits here for ours goes
                    # to the stream (gateway.jetstream.direct)
                    self.broker.messages.others_consume_now(token)
        elif kind == "sweep":
            self.sweeper_id = None if deleted else bytes(msg.data).decode()
        elif kind == "e":
            if not deleted:
                self.broker.messages.sweeper.noted(rest)
        elif kind == "u":
            if deleted:
                self.used.pop(rest, None)
            else:
                self.used[rest] = max(self.used.get(rest, 0.0), float(msg.data or b"0"))
        elif kind == "sac":
            if deleted:
                self.sac.pop(rest, None)
                self.broker.single_active_free(rest)
            else:
                self.sac[rest] = bytes(msg.data).decode()

    def alive(self, gw: str) -> bool:
        if gw == self.me:
            return True
        last = self.seen.get(gw)
        now = time.monotonic()
        if last is None:
            return now - self.started < DEAD_AFTER  # not heard of yet: give it the time to speak
        return now - last < DEAD_AFTER

    def others_consume(self, q: BrokerQueue) -> bool:
        """Some other live gateway has a consumer on ``q`` (auto-delete waits for it)."""
        per = self.counts.get(queue_token(q.vhost, q.name), {})
        return any(n > 0 and gw != self.me and self.alive(gw) for gw, n in per.items())

    def holds_sweep(self) -> bool:
        return self.sweeper_id == self.me

    def last_use(self, q: BrokerQueue) -> float:
        """x-expires: the last use of ``q`` on any gateway (0 when none is known)."""
        return self.used.get(queue_token(q.vhost, q.name), 0.0)

    # -- what this gateway says --------------------------------------------------------------

    def note_use(self, q: BrokerQueue, when: float) -> None:
        """x-expires: ``q`` was used here at ``when``; the other gateways learn it."""
        if q.qargs.expires_ms is None or self.kv is None:
            return
        token = queue_token(q.vhost, q.name)
        if when <= self.used.get(token, 0.0):
            return
        self.used[token] = when
        self.my_use[token] = (when, time.monotonic(), q.qargs.expires_ms / 1000.0)
        self.broker.spawn(self._put_use(token, when))

    async def claim_expiry(self, q: BrokerQueue, last: float) -> bool:
        """x-expires: this gateway deletes ``q``, unused since ``last`` (``xp.<token>.<last
        in ms>`` created here: the other gateways whose timer ran out with it do not)."""
        try:
            await self.kv.create(f"xp.{queue_token(q.vhost, q.name)}.{int(last * 1000)}", self.me.encode())
        except Exception:  # noqa: BLE001 - another gateway took it (or NATS is away: later)
            return False
        return True

    async def _put_use(self, token: str, when: float) -> None:
        with contextlib.suppress(Exception):
            await self.kv.put(f"u.{token}", repr(when).encode())

    async def _refresh_uses(self) -> None:
        """The last uses written here and not since overtaken, written again before the
        bucket's TTL drops them (while the queue may still expire)."""
        now = time.monotonic()
        wall = self.broker.clock.now()
        for token, (when, written, expires) in list(self.my_use.items()):
            if self.used.get(token, 0.0) > when or when + expires < wall:
                del self.my_use[token]  # another gateway used it later, or it is past expiring
            elif now - written >= USE_REFRESH:
                self.my_use[token] = (when, now, expires)
                await self._put_use(token, when)

    def consumers_changed(self, q: BrokerQueue) -> None:
        token = queue_token(q.vhost, q.name)
        n = 0 if q.deleted else len(q.consumers)
        self.counts.setdefault(token, {})[self.me] = n
        self.broker.spawn(self._put_count(token, n))
        if q.qargs.single_active_consumer:
            s = q.stored
            if n and not s.sac_active:
                self.broker.spawn(self.claim(q))
            elif not n and s.sac_active:
                s.sac_active = False
                self.sac.pop(token, None)
                self.broker.spawn(self._release(token))

    async def _put_count(self, token: str, n: int) -> None:
        with contextlib.suppress(Exception):
            if n:
                await self.kv.put(f"c.{token}.{self.me}", str(n).encode())
            else:
                await self.kv.delete(f"c.{token}.{self.me}")

    async def _release(self, token: str) -> None:
        with contextlib.suppress(Exception):
            await self.kv.delete(f"sac.{token}")

    async def claim(self, q: BrokerQueue) -> None:
        """x-single-active-consumer: this gateway's consumers become the queue's active one
        when no live gateway holds the lease (the first to ask gets it)."""
        token = queue_token(q.vhost, q.name)
        holder = self.sac.get(token)
        if holder is not None and holder != self.me and self.alive(holder):
            return
        try:
            if holder is not None and holder != self.me:
                await self.kv.delete(f"sac.{token}")  # its gateway is dead
            await self.kv.create(f"sac.{token}", self.me.encode())
        except Exception:  # noqa: BLE001 - another gateway got it first
            return
        if q.consumers and not q.deleted:
            self.sac[token] = self.me
            q.stored.sac_active = True
            self.broker.single_active_won(q)
        else:
            await self._release(token)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self._heartbeat()
            except Exception as e:  # noqa: BLE001 - NATS away: next beat
                log.info("presence heartbeat failed: %r", e)

    async def _heartbeat(self) -> None:
        kv = self.kv
        await kv.put(f"gw.{self.me}", b"1")
        for s in self.broker.messages.queue_streams():
            q = s.q
            token = queue_token(q.vhost, q.name)
            if q.consumers:
                await kv.put(f"c.{token}.{self.me}", str(len(q.consumers)).encode())
            if q.qargs.single_active_consumer:
                if s.sac_active:
                    await kv.put(f"sac.{token}", self.me.encode())
                elif q.consumers:
                    await self.claim(q)
        await self._refresh_uses()
        await self._sweep_lease()
        self.broker.reap_dead(self)

    async def _sweep_lease(self) -> None:
        """One gateway sweeps due TTLs (gateway.jetstream.sweeper): the holder keeps ``sweep``
        fresh; the others take it when nobody holds it or its holder is dead."""
        holder = self.sweeper_id
        if holder == self.me:
            await self.kv.put("sweep", self.me.encode())
            return
        if holder is not None and self.alive(holder):
            return
        with contextlib.suppress(Exception):  # another gateway took it first
            if holder is not None:
                await self.kv.delete("sweep")
            await self.kv.create("sweep", self.me.encode())
            self.sweeper_id = self.me
