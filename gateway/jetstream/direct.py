"""Direct delivery: a transient message on a non-durable queue handed to a consumer of the
publishing gateway without a round trip through JetStream (issue 28, aim 1's latency half).

On JetStream every message went gateway -> nats-server stream -> pull -> gateway, even when its
consumer was on the publishing gateway: nats-server's stream hop alone is ~0.66 ms p50 at 3,000
msg/s, ~4x the embedded store's whole client-to-client p50 (docs/CLUSTER.md, "JetStream latency
at 3,000 msg/s, hop by hop"). RabbitMQ keeps a non-durable queue's transient messages in memory
only, on the queue's node, and loses them with it; so does this path.

A message goes direct (JetStreamMessages.enqueue) when all of these hold, else through the stream
as before (always correct):

* it is transient (delivery_mode != 2), the queue is not durable and has none of the rules that
  act on stored messages (:func:`plain_queue`: delay, TTLs, x-max-length, dead-lettering,
  maxReceiveCount, delivery limit, priorities, rewind, single active consumer), it has no delay
  or expiry of its own and its body is not a large one (gateway.jetstream.bodies);
* a consumer of this gateway can take it now (:func:`room`: credit beyond the messages already
  Active here, which go first), or, when no other gateway consumes the queue, it waits here
  for them behind fewer than LOCAL_AHEAD others, as on the embedded store (without that, a
  flood took the direct path for 14.5 % of its messages: once one went through the stream, all
  later ones had to follow it until the stream was drained; the publishers pause before that
  many wait, JetStreamMessages.backlog); no basic.get or CMQ API receive waits on the queue,
  and nothing pulled is waiting to be taken (a large body being read);
* FIFO per publisher: every earlier publish of this gateway into the queue's stream has been
  delivered (:func:`stream_clear`): none awaits its PubAck, and the latest of them was pulled by
  this gateway itself. A work-queue stream delivers new messages in sequence order and this
  gateway's publishes to one stream are stored in the order sent, so the latest one pulled
  means every earlier one was delivered (to this gateway or another). Nothing naked here is
  awaiting its confirmation either (a requeued message goes before newer ones).

A direct message is in the local model only, as on the embedded store (the same audit records);
``QueueStream.direct`` holds its ID. Its ack ends it here (no JetStream traffic). Whenever it
would be Active again (a requeue by nack, reject, basic.recover or a closed channel; its
visibility timeout; a consumer gone before it was delivered) it is published into the stream
instead, with the receives it had in the RECEIVED header, so that any gateway can take it and it
comes back flagged redelivered as a stream message would. Those waiting here for credit go into
the stream too, unflagged, once another live gateway has a consumer on the queue (presence:
JetStreamMessages.others_consume_now), so that its consumers take them as well. A kill -9 of the gateway loses the
direct messages it had not settled, delivered or waiting (RabbitMQ loses a non-durable queue's
messages with its node). Waiting here, they are not in another gateway's counts (declare-ok, CMQ's
GetQueueAttributes) until they go into the stream.
``cluster: {direct_delivery: false}`` / ``--no-direct-delivery`` turns the path off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from semantics import queue as Q

if TYPE_CHECKING:
    from gateway.broker.queue import BrokerQueue
    from gateway.jetstream.queues import QueueStream

__all__ = ["LOCAL_AHEAD", "RECEIVED", "UNLIMITED_CREDIT", "direct_counts", "plain_queue", "room", "stream_clear"]

# A message that went into the stream after being received here directly: its receives so far
# (the puller adds JetStream's own delivery count to it, gateway.jetstream.pulls).
RECEIVED = "Cmq-Received"
# A queue only this gateway consumes: direct messages may wait here for its consumers' credit,
# fewer than this many (JetStreamMessages._wait_here); the publishers pause at about 2,700
# (JetStreamMessages.backlog), so a flood stays on the direct path.
LOCAL_AHEAD = 4096
# What a consumer without a prefetch limit (no-ack, or prefetch 0) counts as credit: what it is
# pulled for ahead (gateway.jetstream.pulls: its deliveries must not wait a round trip to
# JetStream each batch; a credit of 64 held a no-ack consumer to ~1,100 msg/s under a flood,
# issue 28), and what room() counts for it.
UNLIMITED_CREDIT = 1000


def plain_queue(q: BrokerQueue) -> bool:
    """The queue keeps its messages in memory only on RabbitMQ and applies no rule to stored
    messages that this gateway could not apply alone (see the module docstring)."""
    a = q.attrs
    x = q.qargs
    return (not q.durable and not a.delay_seconds and a.message_ttl_ms is None and a.max_length is None
            and a.dead_letter_queue is None and a.max_receive_count is None and a.max_time_to_live is None
            and not a.rewind_seconds and x.dead_letter_exchange is None and x.delivery_limit is None
            and not x.max_priority and not x.single_active_consumer)


def stream_clear(s: QueueStream) -> bool:
    """Every publish of this gateway into the queue's stream was delivered, and no nak of
    this gateway is on its way there (the FIFO rule of the module docstring)."""
    return (not s.in_flight and s.own_taken and not s.naks_pending and not s.held_back and not s.arrived
            and not s.api_demand)


def room(q: BrokerQueue) -> bool:
    """A consumer of this gateway has credit for one more message beyond those Active here
    (they are delivered first): Consumer.has_credit's tests, counted, a channel's prefetch
    (global) shared by its consumers. A no-ack delivery uses no channel credit."""
    ahead = q.cmq._n_active
    left: dict[Any, int] | None = None  # channel -> its credit not yet counted for a consumer
    for c in q.consumers:
        ch = c.channel
        if not ch.flow_active or ch.closing or ch.committing or ch.session.paused:
            continue
        limit = ch.channel_prefetch
        if c.no_ack:
            # A no-ack delivery takes no channel credit, but it needs some left: what an
            # earlier consumer of the channel was counted for is gone.
            if limit:
                free = limit - len(ch.unacked) - len(ch.tx_acks)
                if (left.get(ch, free) if left else free) <= 0:
                    continue
            n = UNLIMITED_CREDIT
        else:
            n = c.prefetch - c.unacked if c.prefetch else UNLIMITED_CREDIT
            if limit:
                if left is None:
                    left = {}
                free = left.get(ch, limit - len(ch.unacked) - len(ch.tx_acks))
                if n > free:
                    n = free
                if n > 0:
                    left[ch] = free - n
        if n > 0:
            ahead -= n
            if ahead < 0:
                return True
    return False


def direct_counts(q: BrokerQueue, s: Any) -> tuple[int, int]:
    """(Active, Inactive) of the queue's direct messages here: in the local model, in no
    stream (CMQ's counts, gateway.jetstream.api_receive)."""
    active = inactive = 0
    for msg_id in s.direct:
        m = q.cmq.get(msg_id)
        if m is None:
            continue
        if m.state is Q.ACTIVE:
            active += 1
        elif m.state is Q.INACTIVE:
            inactive += 1
    return active, inactive
