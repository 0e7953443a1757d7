"""Each queue's stream and shared consumer, from declaration to deletion, and its counts (CL1, M7).

Part of the broker's message storage on JetStream (gateway.jetstream.messages). A queue made
here or learnt of from another gateway gets its stream (created by the declaring gateway,
waited for by the others) and this gateway's pull subscription; a purge or delete of the
queue purges or deletes the stream after reading JetStream's count for the -ok; and the
counts of queues in use follow what every gateway publishes and consumes (docs/CLUSTER.md,
"Counts").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from gateway.jetstream.head import undelivered
from gateway.jetstream.queues import QueueStream, ensure_stream
from semantics.jetstream.names import CONSUMER

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker
    from gateway.jetstream.pulls import Pulls
    from gateway.jetstream.writes import Writes

__all__ = ["STARTUP_STREAMS_SECONDS", "Streams"]

log = logging.getLogger("cmq_gateway.jetstream")

STARTUP_STREAMS_SECONDS = 30.0
COUNT_EVERY = 1.0  # seconds between refreshes of a recently used queue's JetStream count
COUNT_RECENT = 60.0  # a queue used (declared, got from, published to) this recently is counted


class Streams:
    """See the module docstring: one per broker, owned by its JetStreamMessages."""

    def __init__(self, broker: ClusterBroker, pulls: Pulls, writes: Writes) -> None:
        self.broker = broker
        self.link = broker.link
        self.spawn = broker.spawn
        self.pulls = pulls
        self.writes = writes
        # (vhost, queue) -> done when the stream of a queue deleted here is gone.
        self.deleting: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.ensuring: set[asyncio.Task[Any]] = set()  # streams being made or found

    async def ready(self) -> None:
        """The streams of the queues known at start, before the gateway serves: a
        declare-ok counts them."""
        if self.ensuring:
            await asyncio.wait(list(self.ensuring), timeout=STARTUP_STREAMS_SECONDS)

    def made(self, s: QueueStream) -> None:
        q = s.q
        # Presence (membership) learns of its consumers; the stream is this module's.
        q.on_consumers = self.broker.presence.consumers_changed
        q.cmq.on_rewind = lambda to_time: self.pulls.start_rewind(s, to_time)
        # The declaring gateway creates the stream; those that learn of it wait for it first.
        task = asyncio.get_running_loop().create_task(self._ensure(s, create=not self.broker.store.applying))
        self.broker._tasks.add(task)
        self.ensuring.add(task)
        task.add_done_callback(self.broker._tasks.discard)
        task.add_done_callback(self.ensuring.discard)

    async def count_loop(self) -> None:
        """Counts (declare-ok, get-ok, the management API) of queues in use follow what other
        gateways publish and consume, at most COUNT_EVERY late (docs/CLUSTER.md, "Counts")."""
        js = self.link.js
        sweeper = self.broker.messages.sweeper
        while not self.broker._closed:
            await asyncio.sleep(COUNT_EVERY)
            now = self.broker.clock.now()
            queues = [q for vh in list(self.broker.vhosts.values()) for q in list(vh.queues.values())]
            # Every queue's lost pull requests first, without an await between them: while
            # consumers have no leader (a quorum lost, then back), each consumer_info below
            # waits out the 5 s timeout, and a queue behind several of those waited that many
            # timeouts before its lost pull (one JetStream never answers) was asked again.
            for q in queues:
                s: QueueStream = q.stored
                if s.ready.is_set() and not q.deleted:
                    self.pulls.unstick(s, now)
            for q in queues:
                s = q.stored
                if not s.ready.is_set() or q.deleted:
                    continue
                if now - max(q.last_used, s.published_at) > COUNT_RECENT and not q.consumers:
                    continue
                # A queue whose heads gateways delete (due TTLs, x-max-length) can meet the
                # server's miscount after a delete (head.undelivered); x-max-length's trim and
                # reject-publish act on this estimate, so those queues are read the safe way.
                a = q.attrs
                heads_end = a.rewind_seconds <= 0 and (a.max_length is not None or sweeper.looks_at(q))
                try:
                    info = await (undelivered(js, s.stream, True) if heads_end
                                  else js.consumer_info(s.stream, CONSUMER))
                except Exception:  # noqa: BLE001 - deleted meanwhile, or NATS away
                    continue
                q.remote_ready = info.num_pending or 0

    async def _ensure(self, s: QueueStream, create: bool) -> None:
        q = s.q
        gone = self.deleting.get((q.vhost, q.name))
        if gone is not None:
            # Declared again while its stream (same name) was being deleted here: after the
            # deletion, or it would delete the new queue's stream.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(gone), STARTUP_STREAMS_SECONDS)
        while not q.deleted and not self.broker._closed:
            try:
                await ensure_stream(self.link, s, self.pulls.pulled, create, self.pulls.pulled_many)
                break
            except Exception as e:  # noqa: BLE001 - no JetStream for now: try again
                log.warning("stream of queue %r not ready: %r", q.name, e)
                await asyncio.sleep(1.0)
        self.pulls.want(s)

    async def _counted(self, s: QueueStream, done: asyncio.Future[int], change: Any) -> None:
        """``change`` (a purge or delete of the stream), after reading how many messages
        JetStream held undelivered, the count its -ok reports."""
        remote = s.stale_remote
        try:
            await self.writes.landed(s)
            if not s.ready.is_set():
                await asyncio.wait_for(s.ready.wait(), 5)
            remote = (await undelivered(self.link.js, s.stream, s.q.attrs.rewind_seconds <= 0)).num_pending or 0
        except Exception as e:  # noqa: BLE001 - the estimate stands
            log.info("count of %s not read: %r", s.stream, e)
        finally:
            if not done.done():
                done.set_result(remote)
        try:
            await change(s.stream)
        except Exception as e:  # noqa: BLE001 - already gone (deleted by another gateway too)
            log.info("stream %s not changed: %r", s.stream, e)

    def drop(self, s: QueueStream) -> None:
        """The queue was deleted here: its stream goes, after JetStream's count for the -ok."""
        q = s.q
        s.stale_remote = q.remote_ready
        s.count_done = asyncio.get_running_loop().create_future()
        gone = self.deleting[q.vhost, q.name] = asyncio.get_running_loop().create_future()
        self.spawn(self._delete_stream(s, s.count_done, gone))

    async def _delete_stream(self, s: QueueStream, done: asyncio.Future[int], gone: asyncio.Future[None]) -> None:
        q = s.q
        try:
            await self._counted(s, done, self.link.js.delete_stream)
        finally:
            if self.deleting.get((q.vhost, q.name)) is gone:
                del self.deleting[q.vhost, q.name]
            gone.set_result(None)

    def purge(self, s: QueueStream) -> None:
        q = s.q
        for msg_id in [m for m in s.leases if q.cmq.get(m) is None]:
            del s.leases[msg_id]  # purged here; the stream's purge removes it there
        s.stale_remote, q.remote_ready = q.remote_ready, 0
        s.count_done = asyncio.get_running_loop().create_future()
        self.spawn(self._counted(s, s.count_done, self.link.js.purge_stream))

    async def counted(self, s: QueueStream, local: int, done: asyncio.Future[int] | None) -> int:
        """A -ok's count (JetStreamMessages.message_count): ``local`` (leased here) and
        JetStream's count of undelivered messages; ``done``: the one read before a purge or
        delete of the stream."""
        q = s.q
        remote = q.remote_ready
        try:
            if done is not None:
                remote = await asyncio.wait_for(done, 5)
            else:
                # Not before its stream is there: an -ok means this gateway can serve it.
                await asyncio.wait_for(s.ready.wait(), STARTUP_STREAMS_SECONDS)
                await self.writes.landed(s)
                info = await asyncio.wait_for(undelivered(self.link.js, s.stream, q.attrs.rewind_seconds <= 0), 2)
                remote = info.num_pending or 0
                q.remote_ready = remote
        except Exception as e:  # noqa: BLE001 - the estimate stands
            log.info("count of %s not read: %r", s.stream, e)
        return local + remote
