"""A CMQ queue whose messages live in a JetStream stream (docs/CLUSTER.md, "Queue messages").

:class:`QueueStream` is what this gateway holds of the shared queue, beside the broker's one
queue class (``BrokerQueue``, whose ``stored`` it is): the deliveries it pulled from the queue's
durable consumer (its *leases*: JetStream message -> its reply subject for ack/nak), its pulls
and writes under way; the count of messages still in JetStream is the queue's
``remote_ready``. The local CMQ model (``semantics.queue.CmqQueue``) holds only the leased
messages: it delivers them to this gateway's consumers and counts their receives, restored
from JetStream's ``num_delivered``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from gateway.broker.persistence import decode_message
from gateway.broker.queue import BrokerQueue
from gateway.jetstream.head import undelivered
from gateway.jetstream.link import Link
from gateway.jetstream.store import Chain
from gateway.jetstream.wire import Handlers
from semantics.jetstream.config import consumer_config, stream_config
from semantics.jetstream.names import CONSUMER

__all__ = ["QueueStream", "delivery_counts", "ensure_stream", "rewind_consumer",
           "subscribe"]

log = logging.getLogger("cmq_gateway.jetstream")

OTHERS_STREAM_TRIES = 15  # 3 s of 0.2 s waits for the declaring gateway's stream
STREAM_IN_USE = 10058  # "stream name already in use with a different configuration"


class QueueStream:
    """What this gateway holds of one queue's stream: its pulls, leases, writes under way and
    counts. Owned by the broker's JetStreamMessages (made by ``made``, reached from the queue as
    ``q.stored``); the queue itself is the broker's one BrokerQueue."""

    def __init__(self, q: BrokerQueue) -> None:
        self.q = q
        self.stream = ""
        self.subject = ""
        self.ready: asyncio.Event = asyncio.Event()  # the stream and its consumer exist
        # Pulls: requests to next_subject, answered on inbox (a subscription of this gateway).
        self.inbox: str | None = None
        self.next_subject = ""
        self.sub: Any = None
        self.requested = 0  # messages asked for and not yet come (nor refused)
        # The pull requests under way, by their reply subject (``<inbox>.<n>``): [messages not
        # yet come, no_wait]. One subject each, because JetStream ends a request in several
        # ways (its whole batch came: no word; 404 nothing there; 408 expired, or a no_wait
        # one ran dry after some) and only the subject says which request a status ends.
        self.pulls: dict[str, list[int]] = {}
        self.pull_seq = 0
        self.asked_at = 0.0
        self.waiting_until = 0.0  # monotonic: when the last pull request that waits at the server expires
        self.published_at = 0.0  # the last publish from here (x-expires' last_used ignores those)
        self.slow_writes = 0  # publishes on the one-request-each path (large, before ready, behind those)
        self.in_flight = 0  # publishes to it from here not yet acknowledged by JetStream
        self.forgetting: asyncio.Future[None] | None = None  # pulls withdrawn, their UNSUB not yet written
        self.naks_pending = 0  # naks sent and not yet confirmed: no pull until they are
        self.want_soon = False  # a pull is to be considered at the end of this loop turn
        self.rewinding = 0  # the shared consumer is being moved (Q6): no pulls meanwhile
        self.arrived: list[Any] = []  # deliveries come on the inbox, taken once per loop turn
        self.took_at = 0.0  # monotonic time of the last deliveries taken (JetStreamMessages.backlog)
        self.sac_active = False  # x-single-active-consumer: this gateway holds the lease (CL4)
        self.chain = Chain()  # its publishes, in order across retries (CL3)
        self.slow_tail: asyncio.Future[None] | None = None  # the last slow write's end (Writes.publish)
        self.held_back: list[Any] = []  # pulled behind a large body still being read
        self.last_delivery = 0  # the consumer sequence of the newest delivery seen (its counts)
        self.fetched: dict[str, bytes] = {}  # large bodies read back, for the message's next take
        self.leases: dict[str, Any] = {}  # msg_id -> the JetStream message last pulled for it
        self.plain_gets: list[Any] = []  # channels whose basic.get (no polling wait) waits for a pull
        self.again_at = 0.0  # published_at of the last publish a plain get's 404 was asked again for
        # CMQ API receives (gateway.jetstream.api_receive): messages wanted, how many of them
        # long-poll, and the futures of those waiting for a pull's answer.
        self.api_demand = 0
        self.api_polls = 0
        self.api_signals: list[asyncio.Future[None]] = []
        # Delayed messages this gateway knows of (Q4): msg_id -> (visible at, pulled and naked
        # for the rest of the delay, i.e. ack-pending in JetStream, rather than not delivered yet).
        self.delays: dict[str, tuple[float, bool]] = {}
        self.last_ack: str | None = None  # the reply subject of the latest ack sent, unconfirmed
        # A purge or delete under way: JetStream's count just before it, and the estimate the
        # broker's own count included (replaced by the former in the -ok's count).
        self.count_done: asyncio.Future[int] | None = None
        # Its pipelined writes' callbacks (gateway.jetstream.writes), made once here rather than
        # as two closures per message (issue 28: CPU per message).
        self.on_published: Callable[[], None] | None = None
        self.is_gone: Callable[[], bool] = lambda: q.deleted
        self.stale_remote = 0
        self.trimming = False  # x-max-length drop-head (gateway.jetstream.maxlength)
        self.trim_again = False
        self.landed: asyncio.Future[None] | None = None  # a trim waiting for the publishes before it
        self.trim_hold = 0  # the store's hold on the confirms of publishes the next trim covers
        # Direct delivery (gateway.jetstream.direct): the IDs of the messages here that are in
        # no stream; the ID of this gateway's latest publish into the stream, and whether this
        # gateway pulled it since (then every earlier one was delivered); the queue's settings
        # last judged by plain_queue, and the verdict.
        self.direct: set[str] = set()
        self.last_own: str | None = None
        self.own_taken = True
        self.plain_of: tuple[Any, Any] = (None, None)
        self.plain = False


def delivery_counts(reply: str) -> tuple[int, int, int]:
    """(num_delivered, consumer sequence, num_pending) of a delivery, from its reply subject
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``
    (with ``<domain>.<account hash>`` after ``ACK`` in the newer form): what nats-py's
    ``Msg.metadata`` reads, without building its objects for every message pulled."""
    t = reply.split(".")
    at = 4 if len(t) == 9 else 6
    return int(t[at]), int(t[at + 2]), int(t[at + 4])


async def ensure_stream(link: Link, s: QueueStream, pulled: Callable[[QueueStream, Any], None],
                        create: bool = True, many: Callable[[QueueStream, list[Any]], None] | None = None) -> None:
    """The queue's stream and durable consumer, created if missing (every gateway may try:
    the same configuration is accepted again), then this gateway's pull subscription."""
    js = link.js
    q = s.q
    c = stream_config(q.vhost, q.name, q.attrs, replicas=link.replicas, durable=q.durable)
    s.stream, s.subject = c["name"], c["subjects"][0]
    if not create:
        # Declared by another gateway, which creates the stream: wait for it a little rather
        # than have every gateway ask for the same stream at once (slow in a loaded cluster).
        for _ in range(OTHERS_STREAM_TRIES):
            try:
                await js.consumer_info(c["name"], CONSUMER)
                break
            except NotFoundError:
                await asyncio.sleep(0.2)
        else:
            create = True
    if create:
        await _create(js, c, q)
    await subscribe(link, s, pulled, many)
    info = await undelivered(js, c["name"], c["retention"] == "workqueue")
    # The publishes made from here meanwhile wait for ``ready``: not in JetStream's count yet.
    q.remote_ready = (info.num_pending or 0) + s.in_flight
    s.ready.set()


def _consumer(q: BrokerQueue, **start: Any) -> ConsumerConfig:
    c = consumer_config(q.attrs)
    return ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=c["ack_wait"],
                          max_deliver=c["max_deliver"], max_ack_pending=c["max_ack_pending"],
                          **(start or {"deliver_policy": DeliverPolicy.ALL}))


async def rewind_consumer(js: Any, s: QueueStream, to_time: float) -> None:
    """Q6 on JetStream: the shared consumer recreated to start at ``to_time``, or earlier at
    the oldest message not yet acknowledged (which must still be received: a consumer started
    by time alone would skip it), so acked messages between the two are received again."""
    start: dict[str, Any] = {"deliver_policy": DeliverPolicy.BY_START_TIME,
                             "opt_start_time": datetime.fromtimestamp(to_time, UTC)}
    with contextlib.suppress(Exception):
        info = await js.consumer_info(s.stream, CONSUMER)
        floor = info.ack_floor.stream_seq + 1
        oldest = await js.get_msg(s.stream, seq=floor)
        if oldest.data and decode_message(oldest.data)["enqueue_time"] < to_time:
            start = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": floor}
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(s.stream, CONSUMER)
    await js.add_consumer(s.stream, _consumer(s.q, **start))


async def _create(js: Any, s: dict[str, Any], q: BrokerQueue) -> None:
    config = StreamConfig(
        name=s["name"], subjects=s["subjects"],
        retention=RetentionPolicy.LIMITS if s["retention"] == "limits" else RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE if s["storage"] == "file" else StorageType.MEMORY,
        max_age=s["max_age"], max_msgs=s["max_msgs"], discard=DiscardPolicy.NEW,
        duplicate_window=s["duplicate_window"], num_replicas=s["num_replicas"])
    try:
        await js.add_stream(config)
    except APIError as e:
        if e.err_code != STREAM_IN_USE:
            raise
        await js.update_stream(config)  # an attribute changed (retention, size): the new one wins
    try:
        await js.add_consumer(s["name"], _consumer(q))
    except APIError as e:
        log.info("consumer of %s kept as it is: %s", s["name"], e)


async def subscribe(link: Link, s: QueueStream, pulled: Callable[[QueueStream, Any], None],
                    many: Callable[[QueueStream, list[Any]], None] | None = None) -> None:
    """The pull inbox's subscription: ``pulled`` takes each message on it, ``many`` (if given)
    the deliveries of queue messages of a read together (gateway.jetstream.wire.Handlers.add)."""
    if s.sub is None:
        async def on_message(m: Any) -> None:
            pulled(s, m)

        inbox = link.nc.new_inbox()
        s.sub = await link.nc.subscribe(inbox + ".*", cb=on_message, pending_msgs_limit=-1, pending_bytes_limit=-1)
        Handlers.of(link.nc).add(s.sub, partial(pulled, s), None,
                                 None if many is None else partial(many, s))  # in the read loop's turn (wire)
        s.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{s.stream}.{CONSUMER}"
        s.inbox = inbox
