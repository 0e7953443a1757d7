"""The JetStream side of the store seam (semantics/store/backend.py; docs/CLUSTER.md).

An in-memory map answers ``get``/``items`` at once, as the embedded store's map does; every
put/delete of a shared kind (exchanges, queues, bindings, policies, HTTP subscriptions,
accounts) is also written to the ``CMQ_META`` KV bucket, pipelined (``publish_async``), under
the store's LSN. Queue messages are not records here: the cluster broker publishes them to
their queue's stream through :meth:`JetStreamStore.track`, which gives them an LSN of the same
sequence. ``durable_lsn`` is the highest LSN below which JetStream acknowledged every write,
so a confirm (M14) waits for the PubAck of its message *and* of every declare before it (CL3).

Writes that fail for want of a server (a timeout, a lost connection, a leader election) are
retried with the same ``Nats-Msg-Id`` until JetStream takes them: a retried publish is not
stored twice. The store is single-threaded (the event loop's), unlike the embedded one:
nothing here is called from the broker's sync thread.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from nats.errors import ConnectionClosedError, MaxPayloadError
from nats.js.errors import APIError

from gateway.jetstream.link import Link
from gateway.jetstream.meta import ORIGIN
from semantics.jetstream.names import META_BUCKET, kv_key, store_key
from semantics.store import Store
from semantics.store.errors import StoreClosedError

__all__ = ["SHARED_KINDS", "Chain", "JetStreamStore"]

log = logging.getLogger("cmq_gateway.jetstream")

# The kinds every gateway shares through the bucket (docs/CLUSTER.md). Topic-retained
# messages (t/) are shared so that another gateway takes their retries over when their
# gateway dies (D2-D6); MQTT sessions (ms/) and retained messages (mr/) so that a client
# finds them through any gateway (gateway.jetstream.mqtt_state).
SHARED_KINDS = frozenset({"x", "q", "b", "p", "s", "u", "t", "meta", "ms", "mr"})
# MQTT session records (MQ8): written on the queue messages' connection, in LSN order with
# them. A gateway killed mid-write leaves NATS a prefix of what it sent on that connection,
# so a message routed after its session record (an incoming QoS 2 identifier and the message
# IDs it carries) never reaches a stream without the record; the opposite case, the record
# without its message, is repaired by the client's resend under the same message IDs, which
# the streams' duplicate window stores once (gateway.mqtt.server.MQTTService.stored_session).
ORDERED_KINDS = frozenset({"ms"})
RETRY_SECONDS = 0.5
KV_DEL = {"KV-Operation": "DEL"}


class Chain:
    """Writes whose order must hold across retries (see JetStreamStore.track)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, Any, tuple[Any, ...]]] = []
        self.retrier: asyncio.Task[None] | None = None


class _Report:
    records = 0
    seconds = 0.0
    torn_bytes = 0
    aside_path = None
    damaged: list[Any] = []


class JetStreamStore:
    """See the module docstring. Open with :meth:`open` (reads the whole bucket)."""

    checkpoint_token: bytes | None = None  # no checkpoint to reopen from (StoreBackend)

    def __init__(self, link: Link, kv: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.link = link
        self.kv = kv
        self._loop = loop
        self._mem = Store.open(None)  # the records, in memory: what get/items answer
        self._lsn = 0
        self._durable = 0
        # LSNs written and not yet acknowledged; _order holds them in order, and settled ones
        # until they reach its front (a dict's first key costs a scan over deleted slots).
        self._open: set[int] = set()
        self._order: deque[int] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        # durable()'s callers: (lsn, tie-break, future), woken by _settle as durable_lsn passes.
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tie = itertools.count()
        self._failed: BaseException | None = None
        self._closed = False
        self.recovery = _Report()
        self.on_durable: Callable[[int], None] = lambda lsn: None  # the broker's confirms
        self.applying = False  # a change from another gateway: into the map only
        self.refused: set[int] = set()  # LSNs of writes JetStream refused (M14: nack)
        # A message's write -> its next write to another queue (the last one is the LSN its
        # confirm waits for), kept until durable: see ClusterBroker._on_durable.
        self.fanout_next: dict[int, int] = {}
        self.origin = ""  # this gateway's id, on every write (gateway.jetstream.meta)
        # Set by the cluster broker: MQTT session records go through the queue messages'
        # pipelined publisher (see put), not beside it.
        self.publisher: Any = None
        # A pipelined write's answer, one bound method for every write (not a closure each),
        # and the same for several answered together (Publisher._replied_plains).
        self._settle_one = self._settle
        self.settles = (self._settle_one, self._settle_many)  # the publisher's (Publisher.settles)

    @classmethod
    async def open(cls, link: Link) -> JetStreamStore:
        js = link.js
        try:
            kv = await js.key_value(META_BUCKET)
        except Exception:  # noqa: BLE001 - not found: the first gateway creates it
            kv = await js.create_key_value(bucket=META_BUCKET, history=1, replicas=link.replicas)
        store = cls(link, kv, asyncio.get_running_loop())
        return store

    def load(self, key: str, value: bytes | None) -> None:
        """A record read from the bucket (start-up, or another gateway's change)."""
        if value is None:
            self._mem.delete(key)
        else:
            self._mem.put(key, value)

    # -- the seam ----------------------------------------------------------------------------

    def put(self, key: str, value: bytes) -> int:
        if self._closed:
            raise StoreClosedError("store is closed")
        if type(value) is not bytes:
            value = bytes(value)
        self._mem.put(key, value)
        return self._write(key, value)

    def delete(self, key: str) -> int:
        if self._closed:
            raise StoreClosedError("store is closed")
        self._mem.delete(key)
        return self._write(key, None)

    def _write(self, key: str, value: bytes | None) -> int:
        """A put (``value``) or delete (None) already applied to the map: to the bucket if its
        kind is shared (and made here, not another gateway's change being applied)."""
        if not self.applying:
            kind = key.partition("/")[0]
            if kind in ORDERED_KINDS and self.publisher is not None:
                return self._ordered_put(key, value)
            if kind in SHARED_KINDS:
                return self.track(self._kv_put, key, value)
        self._lsn += 1
        return self._lsn

    def get(self, key: str) -> bytes | None:
        return self._mem.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._mem

    def __len__(self) -> int:
        return len(self._mem)

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        return self._mem.items(prefix)

    def keys(self, prefix: str = "") -> list[str]:
        return self._mem.keys(prefix)

    def heads(self, prefix: str, size: int) -> Iterator[tuple[str, bytes, int]]:
        return self._mem.heads(prefix, size)

    @property
    def last_lsn(self) -> int:
        """The LSN of the latest write (durable_lsn reaches it once JetStream has it all)."""
        return self._lsn

    async def durable(self, lsn: int, timeout: float) -> bool:
        """Every write up to ``lsn`` is acknowledged (unlike settled(), later writes of a busy
        gateway do not keep it waiting); False after ``timeout`` seconds."""
        if self.durable_lsn >= lsn:
            return True
        future: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._waiting, (lsn, next(self._tie), future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return False
        return True

    @property
    def durable_lsn(self) -> int:
        order = self._order
        while order and order[0] not in self._open:
            order.popleft()
        return order[0] - 1 if order else self._lsn

    @property
    def live_bytes(self) -> int:
        return 0  # nothing held on this machine's disk

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def sync(self) -> int:
        return self.durable_lsn  # writes are acknowledged as they come (see track)

    async def settled(self) -> int:
        """Every write made so far is acknowledged (management answers, close)."""
        await self._idle.wait()
        return self.durable_lsn

    def maybe_compact(self, *, force: bool = False) -> bool:
        return False

    def close(self, *, sync: bool = True) -> None:
        self._closed = True

    # -- writes ------------------------------------------------------------------------------

    def track(self, write: Callable[..., Awaitable[Any]], *args: Any, chain: Chain | None = None) -> int:
        """Run ``write(*args)`` until JetStream takes it, under a new LSN (returned): the
        one way anything reaches JetStream, so durable_lsn covers every write. Writes of one
        ``chain`` (one queue's messages) keep their order across retries: once one fails,
        it and every later one go through the chain's retrier, one at a time, in LSN order."""
        lsn = self._next_lsn()
        if chain is not None and chain.waiting:
            chain.waiting.append((lsn, write, args))
        else:
            self._loop.create_task(self._run(lsn, write, args, chain))
        return lsn

    def track_message(self, publisher: Any, subject: str, payload: bytes, headers: dict[str, str],
                      done: Callable[[], None], gone: Callable[[], bool] | None = None) -> int:
        """A queue message through the pipelined publisher (gateway.jetstream.publisher),
        under a new LSN like every other write: it settles when its PubAck names a stream
        sequence (or refuses it, then a nack), and durable_lsn still waits for every LSN
        before it."""
        # _next_lsn, without its call (issue 28: CPU a message)
        lsn = self._lsn = self._lsn + 1
        if not self._open:
            self._idle.clear()
        self._open.add(lsn)
        self._order.append(lsn)
        # Publisher.publish, without its call (issue 28: CPU a message). A pipelined write's
        # answer is _settle(lsn, refused, done): one bound method for every write, not a
        # closure each.
        publisher._writes[lsn] = (subject, payload, headers, done, gone, self._settle_one)
        publisher._outbox.append(lsn)
        if not publisher._scheduled:
            publisher.schedule()
        return lsn

    def hold(self) -> int:
        """An LSN that is no write: durable_lsn stays below it, so no confirm passes it, until
        :meth:`release` (work a confirm must follow that is not one write, such as a trim)."""
        return self._next_lsn()

    def release(self, lsn: int) -> None:
        if lsn in self._open:
            self._settle(lsn)

    def _next_lsn(self) -> int:
        """A new write's LSN, open (durable_lsn stays below it) until it settles."""
        lsn = self._lsn = self._lsn + 1
        if not self._open:
            self._idle.clear()  # set only while nothing is open (_settle): not a call a write
        self._open.add(lsn)
        self._order.append(lsn)
        return lsn

    async def _run(self, lsn: int, write: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                   chain: Chain | None = None) -> None:
        while True:
            try:
                await write(*args)
                break
            except (APIError, MaxPayloadError) as e:
                # Refused by JetStream itself (a stream deleted meanwhile, a limit): retrying
                # gives the same answer. What refuses messages is handled by the writer.
                log.warning("jetstream refused a write (lsn %d): %s", lsn, e)
                self.refused.add(lsn)
                break
            except (ConnectionClosedError, asyncio.CancelledError):
                if self._closed:
                    break
                await asyncio.sleep(RETRY_SECONDS)
            except Exception as e:  # noqa: BLE001 - timeouts, no responders during an election
                if self._failed is None:
                    log.warning("jetstream write failed, retrying: %r", e)
                self._failed = e
                if self._closed:
                    break
                if chain is not None:
                    # Retried by the chain, behind any earlier write of it that failed too.
                    bisect.insort(chain.waiting, (lsn, write, args), key=lambda w: w[0])
                    if chain.retrier is None:
                        chain.retrier = self._loop.create_task(self._retry_chain(chain))
                    return
                await asyncio.sleep(RETRY_SECONDS)
        self._failed = None
        self._settle(lsn)

    async def _retry_chain(self, chain: Chain) -> None:
        await asyncio.sleep(RETRY_SECONDS)
        try:
            while chain.waiting and not self._closed:
                lsn, write, args = chain.waiting[0]
                await self._run(lsn, write, args)  # no chain: retried here until it is taken
                chain.waiting.pop(0)
        finally:
            chain.retrier = None

    def _settle(self, lsn: int, refused: bool = False, done: Callable[[], None] | None = None) -> None:
        """The write ``lsn`` over (``refused`` by JetStream: a nack); ``done`` called first
        (a pipelined write's own, track_message)."""
        if refused:
            self.refused.add(lsn)
        if done is not None:
            done()
        self._open.discard(lsn)
        self._advance()

    def _settle_many(self, writes: list[tuple[int, Callable[[], None]]]) -> None:
        """Pipelined writes stored, as ``_settle(lsn, False, done)`` of each in turn, the
        durable LSN moved once for them all (issue 28: CPU a message)."""
        opened = self._open
        for lsn, done in writes:
            done()
            opened.discard(lsn)
        self._advance()

    def _advance(self) -> None:
        """durable_lsn past the writes no longer open, the broker told, durable()'s callers woken."""
        opened = self._open
        # durable_lsn, without its call (issue 28: CPU a message)
        order = self._order
        while order and order[0] not in opened:
            order.popleft()
        durable = order[0] - 1 if order else self._lsn
        if durable > self._durable:
            self._durable = durable
            self.on_durable(durable)
            waiting = self._waiting
            while waiting and waiting[0][0] <= durable:
                future = heapq.heappop(waiting)[2]
                if not future.done():  # a caller that timed out cancelled its future
                    future.set_result(None)
        if not opened:
            self._idle.set()

    def _ordered_put(self, key: str, value: bytes | None) -> int:
        headers = {ORIGIN: self.origin} if value is not None else {**KV_DEL, ORIGIN: self.origin}
        return self.track_message(self.publisher, f"$KV.{META_BUCKET}.{kv_key(key)}", value or b"", headers,
                                  _nothing)

    async def _kv_put(self, key: str, value: bytes | None) -> None:
        subject = f"$KV.{META_BUCKET}.{kv_key(key)}"
        js = self.link.js
        if value is None:
            await js.publish(subject, b"", headers={**KV_DEL, ORIGIN: self.origin})
        else:
            await js.publish(subject, value, headers={ORIGIN: self.origin})


def _nothing() -> None:
    pass


def decode_entry(kv_name: str) -> str | None:
    try:
        return store_key(kv_name)
    except (ValueError, UnicodeDecodeError):
        return None
