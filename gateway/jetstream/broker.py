"""The broker on JetStream: one of many gateways sharing one state (docs/CLUSTER.md).

:class:`ClusterBroker` is the embedded :class:`Broker` with its two seams filled: records
(``StoreBackend``) by :class:`JetStreamStore`, queue messages and the confirms that follow
them (``MessageStorage``, gateway.broker.storage) by :class:`JetStreamMessages`, which calls
the pull, lease and count machinery below. What it overrides of ``Broker`` is membership
only: declarations of every gateway applied at start (``_recover_declarations``), the topic
retries a gateway owns (``_recover_retained``) and leaving the cluster (``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from nats.errors import MaxPayloadError
from nats.js.errors import APIError

from gateway.broker import persistence as P
from gateway.broker.broker import Broker
from gateway.broker.exchange import Exchange
from gateway.broker.message import Message
from gateway.broker.policies import Policy
from gateway.jetstream import wire
from gateway.jetstream.api_receive import answer_receives
from gateway.jetstream.bodies import BODY_HEADER, Bodies
from gateway.jetstream.head import EXPIRES_AT, MSG_ID, stored_message
from gateway.jetstream.link import Link, open_link
from gateway.jetstream.messages import JetStreamMessages
from gateway.jetstream.meta import ORIGIN, MetaWatch, value_of
from gateway.jetstream.mqtt_state import MQTTCluster
from gateway.jetstream.presence import Presence
from gateway.jetstream.publisher import Publisher
from gateway.jetstream.queues import (
    ClusterQueue,
    LeasedCmqQueue,
    delivery_counts,
    ensure_stream,
    rewind_consumer,
    subscribe,
)
from gateway.jetstream.store import JetStreamStore
from gateway.jetstream.sweeper import Sweeper
from gateway.jetstream.vhost import ClusterVHost
from gateway.jetstream.wire import Handlers
from semantics import queue as Q
from semantics.clock import Clock, SystemClock
from semantics.jetstream.names import CONSUMER
from semantics.store.keys import parse_key

__all__ = ["ClusterBroker"]

log = logging.getLogger("cmq_gateway.jetstream")

CLOSE_SETTLE_SECONDS = 5.0
STARTUP_STREAMS_SECONDS = 30.0
COUNT_EVERY = 1.0  # seconds between refreshes of a recently used queue's JetStream count
COUNT_RECENT = 60.0  # a queue used (declared, got from, published to) this recently is counted
PULL_WAIT = 1.0  # a pull request waits this long at the server for messages (then asks again)
PULL_MAX = 512  # messages per pull request, at most; several may be under way
PULL_MIN = 64  # while a pull is under way, the next one asks for at least this many (or all the credit)
# What a consumer without a prefetch limit (no-ack, or prefetch 0) is pulled for ahead: its
# deliveries must not wait a round trip to JetStream each batch (a credit of 64 held a no-ack
# consumer to ~1,100 msg/s under a flood, issue 28).
UNLIMITED_CREDIT = 1000
LEASED_MAX = 4096  # messages asked for or leased and not yet delivered, per queue, at most
PULL_WAITING = b'"expires":%d' % int(PULL_WAIT * 1e9)
VISIBLE_AT = "Cmq-Visible-At"  # Q4: not before (epoch seconds), honoured by the puller
NAK_WAIT = 2.0


class NotStoredYet(Exception):
    """JetStream's answer does not say the message is stored (retried, never confirmed)."""


class ClusterBroker(Broker):
    """See the module docstring; open with :meth:`open_cluster`."""

    vhost_class = ClusterVHost
    storage_class = JetStreamMessages
    messages: JetStreamMessages
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
            await broker.publisher.start()
            log.info("store: NATS JetStream, %d replica(s), gateway id %s", link.replicas, gateway_id)
            await broker.watch.load()
            broker._recover()
            broker.messages.start()  # confirms follow JetStream's acknowledgements
            # The streams of the queues it knows, before it serves: a declare-ok counts them.
            if broker._ensuring:
                await asyncio.wait(list(broker._ensuring), timeout=STARTUP_STREAMS_SECONDS)
            broker.watch.start()
            await broker.presence.start()
            await broker.mqtt.start()  # answers MQTT client-id claims (gateway.jetstream.mqtt_state)
            broker.spawn(broker._count_loop())
            broker.spawn(broker.sweeper.run())
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
        self.sweeper = Sweeper(self)
        self.mqtt = MQTTCluster(self)
        self.bodies = Bodies(link)
        self.publisher = Publisher(link.publishing, asyncio.get_running_loop())
        self.store.publisher = self.publisher  # MQTT session records beside messages (ORDERED_KINDS)
        self.pub_js = link.publishing.jetstream(timeout=5.0)
        self.retained_owner: dict[str, str] = {}  # t/ key -> the gateway running its retries
        # Kinds of records the broker does not decode itself (MQTT's ms/, mr/): a change made
        # by another gateway goes to its watcher here (gateway.jetstream.mqtt_state).
        self.record_watchers: dict[str, Callable[[str, bytes | None], None]] = {}
        # (vhost, queue) -> done when the stream of a queue deleted here is gone.
        self.deleting: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._ensuring: set[asyncio.Task[Any]] = set()
        self._replies: list[tuple[str, bytes]] = []
        self._durable_scheduled = False
        self.taking: set[ClusterQueue] = set()  # queues that got deliveries lately (JetStreamMessages.backlog)

    async def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.store.settled(), CLOSE_SETTLE_SECONDS)
        await self.watch.stop()
        await self.presence.stop()
        await self.publisher.stop()
        await super().close()  # cancels the tasks it runs (spawn)
        await self.link.close()

    # -- queue messages in JetStream (Q1-Q8, M10-M13, CL3) -----------------------------------

    def cluster_queues(self) -> list[ClusterQueue]:
        return [cast(ClusterQueue, q) for vh in self.vhosts.values() for q in vh.queues.values()]

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
        for vh in list(self.vhosts.values()):
            for name, owner in list(cast(ClusterVHost, vh).remote_exclusive.items()):
                if not presence.alive(owner):
                    del cast(ClusterVHost, vh).remote_exclusive[name]
                    if name in vh.queues:
                        vh.delete_queue(None, name, if_unused=False, if_empty=False, reason="owner_closed")

    def single_active_free(self, token: str) -> None:
        from semantics.jetstream.names import queue_token
        for q in self.cluster_queues():
            if q.consumers and not q.sac_active and queue_token(q.vhost, q.name) == token:
                self.spawn(self.presence.claim(q))

    def single_active_won(self, q: ClusterQueue) -> None:
        self.dispatch(q)

    def _start_rewind(self, q: ClusterQueue, to_time: float) -> None:
        q.rewinding += 1
        self.spawn(self._rewind(q, to_time))

    async def _rewind(self, q: ClusterQueue, to_time: float) -> None:
        """M15/Q6: the queue's consumer starts again at ``to_time`` for every gateway; what
        this gateway leased from the old one is dropped (the new one delivers it again)."""
        try:
            await asyncio.wait_for(q.ready.wait(), STARTUP_STREAMS_SECONDS)
            await rewind_consumer(self.link.js, q, to_time)
        except Exception as e:  # noqa: BLE001 - the queue keeps its consumer as it was
            log.warning("rewind of queue %r failed: %r", q.name, e)
        finally:
            q.rewinding -= 1
        now = self.clock.now()
        for msg_id in list(q.leases):
            m = q.cmq.get(msg_id)
            if m is not None and m.state is Q.MessageState.ACTIVE:
                q.cmq.delete(Q.Receipt(m, m.handle), now)
        q.leases.clear()
        q.requested = 0
        q.pulls.clear()
        self._want(q)

    def queue_made(self, q: ClusterQueue) -> None:
        q.on_consumers = self.presence.consumers_changed
        cast(LeasedCmqQueue, q.cmq).on_rewind = lambda to_time: self._start_rewind(q, to_time)
        # The declaring gateway creates the stream; those that learn of it wait for it first.
        task = asyncio.get_running_loop().create_task(self._ensure(q, create=not self.store.applying))
        self._tasks.add(task)
        self._ensuring.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._ensuring.discard)

    async def _count_loop(self) -> None:
        """Counts (declare-ok, get-ok, the management API) of queues in use follow what other
        gateways publish and consume, at most COUNT_EVERY late (docs/CLUSTER.md, "Counts")."""
        js = self.link.js
        while not self._closed:
            await asyncio.sleep(COUNT_EVERY)
            now = self.clock.now()
            for vh in list(self.vhosts.values()):
                for q in cast(list[ClusterQueue], list(vh.queues.values())):
                    if not q.ready.is_set() or q.deleted:
                        continue
                    self._unstick(q, now)
                    if now - max(q.last_used, q.published_at) > COUNT_RECENT and not q.consumers:
                        continue
                    try:
                        info = await js.consumer_info(q.stream, CONSUMER)
                    except Exception:  # noqa: BLE001 - deleted meanwhile, or NATS away
                        continue
                    q.remote_ready = info.num_pending or 0

    async def _ensure(self, q: ClusterQueue, create: bool) -> None:
        gone = self.deleting.get((q.vhost, q.name))
        if gone is not None:
            # Declared again while its stream (same name) was being deleted here: after the
            # deletion, or it would delete the new queue's stream.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(gone), STARTUP_STREAMS_SECONDS)
        while not q.deleted and not self._closed:
            try:
                await ensure_stream(self.link, q, self.pulled, create)
                break
            except Exception as e:  # noqa: BLE001 - no JetStream for now: try again
                log.warning("stream of queue %r not ready: %r", q.name, e)
                await asyncio.sleep(1.0)
        self._want(q)

    async def _counted(self, q: ClusterQueue, done: asyncio.Future[int], change: Any) -> None:
        """``change`` (a purge or delete of the stream), after reading how many messages
        JetStream held undelivered, the count its -ok reports."""
        remote = q.stale_remote
        try:
            await self._publishes_landed(q)
            if not q.ready.is_set():
                await asyncio.wait_for(q.ready.wait(), 5)
            remote = (await self.link.js.consumer_info(q.stream, CONSUMER)).num_pending or 0
        except Exception as e:  # noqa: BLE001 - the estimate stands
            log.info("count of %s not read: %r", q.stream, e)
        finally:
            if not done.done():
                done.set_result(remote)
        try:
            await change(q.stream)
        except Exception as e:  # noqa: BLE001 - already gone (deleted by another gateway too)
            log.info("stream %s not changed: %r", q.stream, e)

    def drop_stream(self, q: ClusterQueue) -> None:
        """The queue was deleted here: its stream goes, after JetStream's count for the -ok."""
        q.stale_remote = q.remote_ready
        q.count_done = asyncio.get_running_loop().create_future()
        gone = self.deleting[q.vhost, q.name] = asyncio.get_running_loop().create_future()
        self.spawn(self._delete_stream(q, q.count_done, gone))

    async def _delete_stream(self, q: ClusterQueue, done: asyncio.Future[int], gone: asyncio.Future[None]) -> None:
        try:
            await self._counted(q, done, self.link.js.delete_stream)
        finally:
            if self.deleting.get((q.vhost, q.name)) is gone:
                del self.deleting[q.vhost, q.name]
            gone.set_result(None)

    def purge_stream(self, q: ClusterQueue) -> None:
        for msg_id in [m for m in q.leases if q.cmq.get(m) is None]:
            del q.leases[msg_id]  # purged here; the stream's purge removes it there
        q.stale_remote, q.remote_ready = q.remote_ready, 0
        q.count_done = asyncio.get_running_loop().create_future()
        self.spawn(self._counted(q, q.count_done, self.link.js.purge_stream))

    async def _publishes_landed(self, q: ClusterQueue) -> None:
        """A count follows the publishes before it on this gateway (as on one broker)."""
        deadline = self.clock.now() + CLOSE_SETTLE_SECONDS
        while q.in_flight and self.clock.now() < deadline:
            await asyncio.sleep(0.005)

    async def counted(self, q: ClusterQueue, local: int, done: asyncio.Future[int] | None) -> int:
        """A -ok's count (JetStreamMessages.message_count): ``local`` (leased here) and
        JetStream's count of undelivered messages; ``done``: the one read before a purge or
        delete of the stream."""
        remote = q.remote_ready
        try:
            if done is not None:
                remote = await asyncio.wait_for(done, 5)
            else:
                # Not before its stream is there: an -ok means this gateway can serve it.
                await asyncio.wait_for(q.ready.wait(), STARTUP_STREAMS_SECONDS)
                await self._publishes_landed(q)
                remote = (await asyncio.wait_for(self.link.js.consumer_info(q.stream, CONSUMER), 2)).num_pending or 0
                q.remote_ready = remote
        except Exception as e:  # noqa: BLE001 - the estimate stands
            log.info("count of %s not read: %r", q.stream, e)
        return local + remote

    def publish_message(self, q: ClusterQueue, msg: Message, now: float, delay: float | None,
                        expires_at: float | None) -> int:
        big = len(msg.body) > self.bodies.limit
        payload = P.encode_message(q.vhost, q.name, msg.msg_id, now, msg.exchange, msg.routing_key,
                                   msg.properties.raw, b"" if big else msg.body)
        headers = {MSG_ID: msg.msg_id}
        if big:
            headers[BODY_HEADER] = f"{q.stream or q.name}.{msg.msg_id}"
        if delay:
            headers[VISIBLE_AT] = repr(now + delay)
            q.delays[msg.msg_id] = (now + delay, False)  # delayMsgNum (gateway.jetstream.api_receive)
        if expires_at is not None:
            headers[EXPIRES_AT] = repr(expires_at)
        q.remote_ready += 1
        q.in_flight += 1
        q.published_at = now  # counted (COUNT_RECENT), but not a use: x-expires ignores publishes
        if big or not q.ready.is_set() or q.slow_writes or q.chain.waiting:
            # One request each, in the queue's chain: a large body goes to the object store
            # first, a queue not ready waits for its stream; and while any of these is under
            # way, the queue's later messages follow them there, so their order holds.
            q.slow_writes += 1
            return self.store.track(self._publish, q, payload, headers, msg.body if big else None, chain=q.chain)
        return self.store.track_message(self.publisher, q.subject, payload, headers, lambda: self._published(q),
                                        lambda: q.deleted)

    async def _publish(self, q: ClusterQueue, payload: bytes, headers: dict[str, str], body: bytes | None) -> None:
        while not q.ready.is_set() and not q.deleted:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(q.ready.wait(), 1.0)
        if q.deleted:
            # Deleted since it was routed there (here, or through another gateway, which deleted
            # its stream): the message goes with the queue, as on one broker. Retried, a publish
            # to a stream that is gone would hold every later confirm of this gateway.
            q.slow_writes -= 1
            self._published(q)
            return
        try:
            if body is not None:
                await self.bodies.put(headers[BODY_HEADER], body)
            # On the publisher's connection: behind the queue's pipelined messages sent before it.
            ack = await self.pub_js.publish(q.subject, payload, headers=headers)
        except (APIError, MaxPayloadError):
            q.slow_writes -= 1
            self._published(q)  # refused for good (the store nacks it)
            raise
        if not ack.seq:
            # CL3: a duplicate whose first attempt is staged, not stored (gateway.jetstream.
            # publisher): not an acknowledgement; the store sends it again.
            raise NotStoredYet(f"{q.stream}: duplicate of a publish not yet stored")
        q.slow_writes -= 1
        self._published(q)

    def _published(self, q: ClusterQueue) -> None:
        q.in_flight -= 1
        if q.in_flight == 1 and q.landed is not None and not q.landed.done():
            q.landed.set_result(None)  # only the trim's own count is left (gateway.jetstream.maxlength)
        if not q.in_flight and q.plain_gets:
            self._want(q)

    def _durable_soon(self, durable: int) -> None:
        """JetStream acknowledges each write on its own: the confirms they release go out
        once per loop turn, after every acknowledgement that arrived with this one, so that a
        burst is confirmed as RabbitMQ confirms it (basic.ack multiple=true), not frame by frame."""
        if not self._durable_scheduled:
            self._durable_scheduled = True
            asyncio.get_running_loop().call_soon(self._durable_now)

    def _durable_now(self) -> None:
        self._durable_scheduled = False
        self._on_durable(self.store.durable_lsn)

    def send_replies(self) -> None:
        """The acks and naks settled so far, now (the end of a client's read)."""
        if self._replies:
            self._send_replies()

    # pulling: as much as this gateway's consumers and gets can take

    def want_soon(self, q: ClusterQueue) -> None:
        """After the rest of this turn: the acks read with this one free credit too, and
        one pull asks for all of it."""
        if not q.want_soon:
            q.want_soon = True
            self._loop.call_soon(self._want_soon, q)  # type: ignore[union-attr]

    def _want_soon(self, q: ClusterQueue) -> None:
        q.want_soon = False
        self._want(q)

    @staticmethod
    def pullers(q: ClusterQueue) -> Any:
        return q.consumers if q.sac_active or not q.qargs.single_active_consumer else ()

    def _need(self, q: ClusterQueue) -> int:
        need = 0
        for c in self.pullers(q):
            if c.has_credit():
                need += c.prefetch - c.unacked if c.prefetch and not c.no_ack else UNLIMITED_CREDIT
        if q.waiters is not None:
            need += len(q.waiters)
        need += q.api_demand  # CMQ API receives (gateway.jetstream.api_receive)
        return min(need, LEASED_MAX) - q.cmq.active - len(q.held_back)

    def _want(self, q: Any) -> None:
        """Ask JetStream for what this gateway can take and has not asked for yet: a pull
        request (batch, and for consumers a wait of PULL_WAIT at the server; for plain
        basic.gets no wait, so that "no messages" is JetStream's answer, not a timer's)."""
        if (q.inbox is None or q.deleted or self._closed or q.naks_pending
                or q.rewinding):
            return
        q.plain_gets = [ch for ch in q.plain_gets if ch.waiting_get is not None and ch.waiting_get[0] is q]
        if q.in_flight and q.plain_gets:
            return  # a basic.get follows the publishes before it (asked again when they land)
        need = self._need(q)
        extra = need - q.requested
        if extra <= 0:
            return
        if q.requested and q.waiters is None and extra < min(PULL_MIN, need):
            # A pull is under way: the next one waits until a batch's worth of credit is free
            # (an ack frees one), not one pull request per ack.
            return
        waiting = any(c.has_credit() for c in q.consumers) or q.api_polls > 0 or (
            q.waiters is not None and len(q.waiters) > len(q.plain_gets))
        q.asked_at = self.clock.now()
        requests = []
        while extra > 0:
            # Several requests of at most PULL_MAX each, all under way at once: JetStream
            # delivers a batch while the next one's request is already there.
            batch = min(extra, PULL_MAX)
            extra -= batch
            q.pull_seq += 1
            reply = f"{q.inbox}.{q.pull_seq}"
            q.pulls[reply] = [batch, not waiting]
            q.requested += batch
            requests.append((reply, b'{"batch":%d,%s}' % (batch, PULL_WAITING if waiting else b'"no_wait":true')))
        self._send(self.link.nc, [wire.pub(q.next_subject, reply, request) for reply, request in requests])

    def _send(self, nc: Any, commands: list[Any]) -> None:
        """Pull requests, acks, naks: on the socket in this turn (gateway.jetstream.wire.send),
        else through nats-py in a task (NATS away: a lost ack or pull is made good by ack_wait
        and _unstick)."""
        if not wire.send(nc, commands):
            self.spawn(self._write(nc, commands))

    async def _write(self, nc: Any, commands: list[Any]) -> None:
        try:
            await wire.write(nc, commands)
        except Exception as e:  # noqa: BLE001 - lost: JetStream's ack_wait redelivers, _unstick asks again
            log.info("write to JetStream lost: %r", e)

    def pulled(self, q: ClusterQueue, m: Any) -> None:
        """One message on the queue's inbox: a delivery, or a status ending a pull request."""
        status = m.headers.get("Status") if m.headers else None
        if status is None:
            q.requested = max(0, q.requested - 1)
            # A delivery's subject is its stream's, not the request's: JetStream (2.9) fills
            # waiting requests in the order they came, so it counts against the oldest one.
            for reply, oldest in q.pulls.items():
                oldest[0] -= 1
                if oldest[0] <= 0:
                    del q.pulls[reply]  # its whole batch came: JetStream says no more of it
                break
            if not q.requested:
                q.pulls.clear()
            q.arrived.append(m)
            if len(q.arrived) == 1:
                # Taken once the read that brought it is parsed, in the same turn: together
                # with the rest of that read, not a loop turn later (issue 28, latency).
                Handlers.of(self.link.nc).at_read_end(partial(self._take_arrived, q))
            return
        if status == "100":
            return  # a heartbeat
        self._take_arrived(q)  # what came before the status first: a get waits for it
        if status in ("404", "408"):
            # 404: a no_wait request found nothing; 408: a waiting request expired, or a
            # no_wait one ran dry after some messages. What it did not bring is not coming.
            pull = q.pulls.pop(m.subject, None)
            # What it did not bring, as JetStream counts it (exact whichever request the
            # deliveries before were counted against), else as counted here.
            left = m.headers.get("Nats-Pending-Messages")
            if left is not None and left.isdigit():
                q.requested = max(0, q.requested - int(left))
            elif pull is not None:
                q.requested = max(0, q.requested - pull[0])
            if pull is not None and (pull[1] or status == "404"):
                self._nothing_to_get(q)
        else:  # 409 and others (leader change, too many waiting): start over
            q.requested = 0
            q.pulls.clear()
            self._nothing_to_get(q)
        if not q.held_back:
            answer_receives(q, status=True)  # a pull ended: CMQ API receives look again (or answer 7000)
        self._want(q)

    def _take_arrived(self, q: ClusterQueue) -> None:
        msgs, q.arrived = q.arrived, []
        if msgs and not q.deleted:
            self._take(q, msgs)

    def _unstick(self, q: ClusterQueue, now: float) -> None:
        """A pull request whose end never came (NATS restarted meanwhile): asked anew."""
        if q.requested and now - q.asked_at > 3 * PULL_WAIT:
            q.requested = 0
            q.pulls.clear()
            self._nothing_to_get(q)
            self._want(q)

    def _nothing_to_get(self, q: ClusterQueue) -> None:
        """A pull found nothing: the plain basic.gets waiting for it get get-empty (M11),
        those with a polling wait keep waiting (Q5)."""
        if q.held_back:
            return  # a message is on its way (its large body being read): it answers a get
        gets, q.plain_gets = q.plain_gets, []
        for ch in gets:
            if ch.waiting_get is not None and ch.waiting_get[0] is q and q.waiters is not None:
                q.waiters.cancel(ch)
                if not q.waiters:
                    q.waiters = None
                self._get_answered(ch, q, None)

    def _take(self, q: ClusterQueue, msgs: list[Any]) -> None:
        """Pulled deliveries into the local model (leases), then delivered as usual."""
        if q.held_back:
            q.held_back.extend(msgs)  # behind a large body being read: in order (M11)
            return
        now = self.clock.now()
        q.took_at = time.monotonic()
        self.taking.add(q)
        cmq = q.cmq
        for i, m in enumerate(msgs):
            delivered, consumer_seq, pending = delivery_counts(m.reply)
            if consumer_seq > q.last_delivery:
                q.last_delivery = consumer_seq
                q.remote_ready = pending
            headers = m.headers or {}
            visible_at = headers.get(VISIBLE_AT)
            msg_id = headers.get(MSG_ID, "")
            if visible_at is not None and float(visible_at) > now:
                # Q4: too early; JetStream keeps it for the rest of the delay, for every gateway.
                self._reply(m, b"-NAK {\"delay\": %d}" % int((float(visible_at) - now) * 1e9))
                q.delays[msg_id] = (float(visible_at), True)
                continue
            q.delays.pop(msg_id, None)
            if cmq.get(msg_id) is not None:
                q.leases[msg_id] = m
                continue  # JetStream's delivery of a message leased here already: the newer lease
            r = P.decode_message(m.data)
            body = r["body"]
            if BODY_HEADER in headers:
                body = q.fetched.pop(msg_id, None)
                if body is None:
                    q.held_back = msgs[i:]  # this one and those after it wait for its body
                    self.spawn(self._fetch_body(q, m, headers[BODY_HEADER], msg_id))
                    break
            q.leases[msg_id] = m
            msg = stored_message(r, body, msg_id)
            count = delivered - 1
            if visible_at is not None and count > 0:
                # Q4/M11: a delayed message was naked once for its delay by whichever gateway
                # pulled it first (any puller during the delay does): not a receive.
                count -= 1
            exp = headers.get(EXPIRES_AT)
            cmq.restore(msg, len(msg.body), now, msg_id=msg_id, enqueue_time=r["enqueue_time"],
                        receive_count=max(0, count), expires_at=None if exp is None else float(exp))
        vh = self.vhosts[q.vhost]
        self.after_queue_change(vh, q)
        self._return_surplus(q)
        if not q.held_back:
            answer_receives(q, status=False)
        self._want(q)  # what was naked for its delay (Q4) left a get or a credit unserved

    async def _fetch_body(self, q: ClusterQueue, m: Any, name: str, msg_id: str) -> None:
        """A large body (gateway.jetstream.bodies) read back, then the message taken."""
        try:
            q.fetched[msg_id] = await self.bodies.get(name)
        except Exception as e:  # noqa: BLE001 - back to JetStream; another pull tries again
            log.warning("body %s of queue %r not read: %r", name, q.name, e)
            q.held_back.pop(0)
            self._nak(q, m)
        held, q.held_back = q.held_back, []
        if not q.deleted and held:
            self._take(q, held)

    def _return_surplus(self, q: ClusterQueue) -> None:
        """Leases pulled for consumers that went meanwhile go back to JetStream at once."""
        if q.consumers or q.waiters is not None or q.api_demand:
            return
        now = self.clock.now()
        while (r := q.cmq.receive(now)) is not None:
            q.cmq.delete(r, now)
            lease = q.leases.pop(r.message.msg_id, None)
            if lease is not None:
                self._nak(q, lease)

    def _nak(self, q: ClusterQueue, m: Any) -> None:
        """Active again for every gateway (M13, Q1). Confirmed by JetStream before this
        gateway pulls again: its next pull (a basic.get right after a requeue) must find it,
        and JetStream applies acks and pull requests on separate queues."""
        q.naks_pending += 1
        self.spawn(self._nak_confirmed(q, m))

    async def _nak_confirmed(self, q: ClusterQueue, m: Any) -> None:
        try:
            await self.link.nc.request(m.reply, b"-NAK", timeout=NAK_WAIT)
        except Exception as e:  # noqa: BLE001 - lost: ack_wait makes it Active anyway
            log.info("nak to JetStream not confirmed: %r", e)
        finally:
            q.naks_pending -= 1
            if not q.naks_pending:
                self._want(q)

    def _reply(self, m: Any, payload: bytes) -> None:
        """An ack, nak or term of one delivery; sent in order, batched per loop turn."""
        self._replies.append((m.reply, payload))
        if len(self._replies) == 1:
            self._loop.call_soon(self._send_replies)  # type: ignore[union-attr]

    def _send_replies(self) -> None:
        replies, self._replies = self._replies, []
        if not replies:
            return  # sent at the end of the batch that settled them (end_batch)
        self._send(self.link.nc, [wire.pub(subject, "", payload) for subject, payload in replies])

    # settlement: the local model decides, JetStream follows (gateway.jetstream.messages)

    def ack_lease(self, lease: Any) -> None:
        """A delivery settled here: acked to JetStream, its large body (if any) deleted."""
        self._reply(lease, b"+ACK")
        name = (lease.headers or {}).get(BODY_HEADER)
        if name is not None:
            self.spawn(self.bodies.delete(name))

    def nak(self, q: ClusterQueue, lease: Any) -> None:
        self._nak(q, lease)

    def readers_left(self, q: ClusterQueue) -> None:
        """Nobody here takes from ``q`` any more: its pulls are withdrawn, its leases go back."""
        if not q.consumers and q.waiters is None and q.requested:
            self.spawn(self._forget_requests(q))
        self._return_surplus(q)

    def api_demand_ended(self, q: ClusterQueue) -> None:
        """The last CMQ API receive of ``q`` answered: what was pulled for it and not
        received goes back. Its pulls are not withdrawn (_forget_requests), as a consumer's
        are: what they are delivering meanwhile would be held by JetStream until ack_wait (the
        visibility timeout); a pull ends within PULL_WAIT, and what it brings goes back at once."""
        self._return_surplus(q)

    def want_pull(self, q: ClusterQueue) -> None:
        self._want(q)

    async def publishes_landed(self, q: ClusterQueue) -> None:
        await self._publishes_landed(q)

    async def _forget_requests(self, q: ClusterQueue) -> None:
        """Nobody here takes from the queue any more: its waiting pull requests must not take
        messages that another gateway's consumers would get (JetStream drops a request whose
        reply subject lost its interest), so the inbox is replaced."""
        old = q.sub
        q.sub = q.inbox = None
        q.requested = 0
        q.pulls.clear()
        try:
            await subscribe(self.link, q, self.pulled)
        finally:
            if old is not None:
                Handlers.of(self.link.nc).discard(old)
                with contextlib.suppress(Exception):
                    await old.unsubscribe()
        self._want(q)

    def get_waits(self, ch: Any, q: ClusterQueue, plain: bool) -> None:
        """basic.get with nothing leased here waits (as a long poll, Q5) for one pull;
        ``plain`` (no polling wait): answered get-empty by the first pull that finds nothing."""
        if plain:
            q.plain_gets.append(ch)
        self._want(q)

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
        vh = cast(ClusterVHost, self.vhost(names[0]))
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
