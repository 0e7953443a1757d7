"""Pulling queue messages from their streams into this gateway's leases, and settling them there (M11-M13, Q1-Q6).

Part of the broker's message storage on JetStream (gateway.jetstream.messages). Each queue's
messages come from its stream's one shared consumer, pulled as far as this gateway's readers
can take them (its consumers' credit, its basic.gets, CMQ API receives): the deliveries are
*leases* in the local CMQ model, delivered as on one broker; the local model decides their fate
and JetStream follows it (an ack, a nak that makes a message Active for every gateway again).
Pull requests, acks and naks go on the socket in the turn that made them (gateway.jetstream.wire).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from gateway.broker.message import Message, init_message, new_message
from gateway.jetstream import wire
from gateway.jetstream.api_receive import answer_receives
from gateway.jetstream.bodies import BODY_HEADER, Bodies
from gateway.jetstream.direct import RECEIVED, UNLIMITED_CREDIT
from gateway.jetstream.head import _NAMES, _PROPERTIES, EXPIRES_AT, MSG_ID, VISIBLE_AT, stored_message
from gateway.jetstream.plain_takes import compiled_take_plains
from gateway.jetstream.queues import QueueStream, rewind_consumer, subscribe
from gateway.jetstream.streams import STARTUP_STREAMS_SECONDS
from gateway.jetstream.wire import Handlers, compiled
from semantics import queue as Q
from semantics.errors import CMQError
from semantics.jetstream.config import ACK_WAIT_MARGIN

if TYPE_CHECKING:
    from gateway.jetstream.broker import ClusterBroker

__all__ = ["Pulls"]

log = logging.getLogger("cmq_gateway.jetstream")

PULL_WAIT = 1.0  # a pull request waits this long at the server for messages (then asks again)
PULL_MAX = 512  # messages per pull request, at most; several may be under way
PULL_MIN = 64  # while a pull is under way, the next one asks for at least this many (or all the credit)
LEASED_MAX = 4096  # messages asked for or leased and not yet delivered, per queue, at most
PULL_WAITING = b'"expires":%d' % int(PULL_WAIT * 1e9)
AGAIN_WAIT = 0.1  # a plain get's second pull waits this long at the server (Pulls._ask_again)
AGAIN_REQUEST = b'{"batch":1,"expires":%d}' % int(AGAIN_WAIT * 1e9)
NAK_WAIT = 2.0
# Within this of the consumer's ack_wait a lease is not naked: JetStream's own timer makes it
# Active for every gateway by then, and a nak that reaches the server after that timer gave the
# message to another gateway makes the server deliver it once more while that one holds it
# (docs/CLUSTER.md, "The NATS server"). Under load a nak can be that late: it may wait behind
# withdrawn pull requests (_forget_requests) for up to PULL_WAIT + NAK_WAIT.
NAK_LATE_MARGIN = 0.25
# How long deliveries to a withdrawn inbox are handed back: longer than a pull request waits.
RETIRED_INBOX_SECONDS = 3 * PULL_WAIT
EXPIRY_MARGIN = 0.1  # the server counts a request's expiry from when it read it
# A delivery's numbers read from its reply subject in C (gateway/jetstream/_wire.c), or None:
# Pulls._take's own reading.
_ack_numbers = getattr(compiled(), "ack_numbers", None)
# wire.pubs in C (None: wire.pubs makes the acks' and naks' commands)
_ack_pubs = getattr(compiled(), "ack_pubs", None)



def lease_age(reply: str, now_ns: int) -> float | None:
    """Seconds since the server sent this delivery, by this machine's clock: the ``<time>``
    token of its reply subject (the server's clock, ns since the epoch; see delivery_counts for
    the two forms). None when the subject has no such token. A clock ahead of the server's
    makes a lease look older, so a nak is left to ack_wait early: the message is Active at most
    that skew later, never twice."""
    t = reply.split(".")
    at = 7 if len(t) == 9 else 9
    try:
        return (now_ns - int(t[at])) / 1e9
    except (IndexError, ValueError):
        return None

class Pulls:
    """See the module docstring: one per broker, owned by its JetStreamMessages."""

    def __init__(self, broker: ClusterBroker, bodies: Bodies) -> None:
        self.broker = broker
        self.bodies = bodies
        self.link = broker.link
        self.clock = broker.clock
        self.spawn = broker.spawn
        self._loop = asyncio.get_running_loop()
        self._replies: list[tuple[str, bytes]] = []
        self.taking: set[QueueStream] = set()  # queues that got deliveries lately (JetStreamMessages.backlog)
        # JetStreamMessages.hand_back: a direct message into the stream (gateway.jetstream.direct)
        self.hand_back: Callable[[QueueStream, Q.QueueMessage, int], None] | None = None

    def want_soon(self, s: QueueStream) -> None:
        """After the rest of this turn: the acks read with this one free credit too, and
        one pull asks for all of it."""
        if not s.want_soon:
            s.want_soon = True
            self._loop.call_soon(self._want_soon, s)

    def _want_soon(self, s: QueueStream) -> None:
        s.want_soon = False
        self.want(s)

    @staticmethod
    def pullers(s: QueueStream) -> Any:
        q = s.q
        return q.consumers if s.sac_active or not q.qargs.single_active_consumer else ()

    def _need(self, s: QueueStream) -> int:
        q = s.q
        need = 0
        for c in self.pullers(s):
            if c.has_credit():
                need += c.prefetch - c.unacked if c.prefetch and not c.no_ack else UNLIMITED_CREDIT
        if q.waiters is not None:
            need += len(q.waiters)
        need += s.api_demand  # CMQ API receives (gateway.jetstream.api_receive)
        return min(need, LEASED_MAX) - q.cmq.active - len(s.held_back)

    def want(self, s: QueueStream) -> None:
        """Ask JetStream for what this gateway can take and has not asked for yet: a pull
        request (batch, and for consumers a wait of PULL_WAIT at the server; for plain
        basic.gets no wait, so that "no messages" is JetStream's answer, not a timer's)."""
        q = s.q
        if (s.inbox is None or q.deleted or self.broker._closed or s.naks_pending
                or s.rewinding):
            return
        s.plain_gets = [ch for ch in s.plain_gets if ch.waiting_get is not None and ch.waiting_get[0] is q]
        if s.in_flight and s.plain_gets:
            return  # a basic.get follows the publishes before it (asked again when they land)
        need = self._need(s)
        extra = need - s.requested
        if extra <= 0:
            return
        if s.requested and q.waiters is None and extra < min(PULL_MIN, need):
            # A pull is under way: the next one waits until a batch's worth of credit is free
            # (an ack frees one), not one pull request per ack.
            return
        waiting = any(c.has_credit() for c in q.consumers) or s.api_polls > 0 or (
            q.waiters is not None and len(q.waiters) > len(s.plain_gets))
        s.asked_at = self.clock.now()
        if waiting:
            s.waiting_until = time.monotonic() + PULL_WAIT
        requests = []
        while extra > 0:
            # Several requests of at most PULL_MAX each, all under way at once: JetStream
            # delivers a batch while the next one's request is already there.
            batch = min(extra, PULL_MAX)
            extra -= batch
            s.pull_seq += 1
            reply = f"{s.inbox}.{s.pull_seq}"
            s.pulls[reply] = [batch, not waiting]
            s.requested += batch
            requests.append((reply, b'{"batch":%d,%s}' % (batch, PULL_WAITING if waiting else b'"no_wait":true')))
        self._send(self.link.nc, [wire.pub(s.next_subject, reply, request) for reply, request in requests])

    def _send(self, nc: Any, commands: list[Any]) -> None:
        """Pull requests, acks, naks: on the socket in this turn (gateway.jetstream.wire.send),
        else through nats-py in a task (NATS away: a lost ack or pull is made good by ack_wait
        and unstick)."""
        if not wire.send(nc, commands):
            self.spawn(self._write(nc, commands))

    async def _write(self, nc: Any, commands: list[Any]) -> None:
        try:
            await wire.write(nc, commands)
        except Exception as e:  # noqa: BLE001 - lost: JetStream's ack_wait redelivers, unstick asks again
            log.info("write to JetStream lost: %r", e)

    def pulled(self, s: QueueStream, m: Any) -> None:
        """One message on the queue's inbox: a delivery, or a status ending a pull request."""
        status = m.headers.get("Status") if m.headers else None
        if status is None:
            # Counted against the pulls under way when taken (_take_arrived): for the read's
            # deliveries together, before anything else looks at the pulls.
            s.arrived.append(m)
            if len(s.arrived) == 1:
                # Taken once the read that brought it is parsed, in the same turn: together
                # with the rest of that read, not a loop turn later (issue 28, latency).
                Handlers.of(self.link.nc).at_read_end(partial(self._take_arrived, s))
            return
        if status == "100":
            return  # a heartbeat
        self._take_arrived(s)  # what came before the status first: a get waits for it
        if status in ("404", "408"):
            # 404: a no_wait request found nothing; 408: a waiting request expired, or a
            # no_wait one ran dry after some messages. What it did not bring is not coming.
            pull = s.pulls.pop(m.subject, None)
            # What it did not bring, as JetStream counts it (exact whichever request the
            # deliveries before were counted against), else as counted here.
            left = m.headers.get("Nats-Pending-Messages")
            if left is not None and left.isdigit():
                s.requested = max(0, s.requested - int(left))
            elif pull is not None:
                s.requested = max(0, s.requested - pull[0])
            if status == "404" and (s.plain_gets or s.api_signals) and s.published_at > s.again_at:
                self._ask_again(s)
                self.want(s)
                return  # the gets and receives wait for that pull's end
            if pull is not None and (pull[1] or status == "404"):
                self._nothing_to_get(s)
        else:  # 409 and others (leader change, too many waiting): start over
            s.requested = 0
            s.pulls.clear()
            self._nothing_to_get(s)
        if not s.held_back:
            answer_receives(s, status=True)  # a pull ended: CMQ API receives look again (or answer 7000)
        self.want(s)

    def pulled_many(self, s: QueueStream, ms: list[Any]) -> None:
        """Deliveries of queue messages (no status) read together, in order: as ``pulled``
        takes each, in one call (issue 28: CPU a message)."""
        if s.arrived:
            s.arrived.extend(ms)
            return
        s.arrived = ms
        Handlers.of(self.link.nc).at_read_end(partial(self._take_arrived, s))

    def _take_arrived(self, s: QueueStream) -> None:
        q = s.q
        msgs, s.arrived = s.arrived, []
        if not msgs:
            return
        n = len(msgs)
        s.requested = max(0, s.requested - n)
        # A delivery's subject is its stream's, not the request's: JetStream (2.9) fills
        # waiting requests in the order they came, so each counts against the oldest one.
        pulls = s.pulls
        while n and pulls:
            reply = next(iter(pulls))
            oldest = pulls[reply]
            came = min(n, oldest[0])
            oldest[0] -= came
            n -= came
            if oldest[0] <= 0:
                del pulls[reply]  # its whole batch came: JetStream says no more of it
        if not s.requested:
            pulls.clear()
        if not q.deleted:
            self._take(s, msgs)

    def unstick(self, s: QueueStream, now: float) -> None:
        """A pull request whose end never came (NATS restarted meanwhile): asked anew."""
        if s.requested and now - s.asked_at > 3 * PULL_WAIT:
            s.requested = 0
            s.pulls.clear()
            self._nothing_to_get(s)
            self.want(s)

    def _ask_again(self, s: QueueStream) -> None:
        """A no_wait pull for plain basic.gets or CMQ API receives was answered "404 No
        Messages" after a publish of this gateway to the queue: nats-server (2.10 and 2.15
        alike) can say so when the pull comes right after it acknowledged a publish to the
        stream, before its consumer has caught up (~1 % of such pulls, and a pull at once after
        it can say so again). A get after a publish on its channel must get that message (M11),
        and a receive after a SendMessage likewise, so they wait for one pull that waits at the
        server for AGAIN_WAIT: served as soon as the consumer has it, get-empty (or 7000) at its
        end (a 408) when another gateway took it. Once per publish: a get on a queue drained
        since pays nothing."""
        s.again_at = s.published_at
        s.pull_seq += 1
        reply = f"{s.inbox}.{s.pull_seq}"
        s.pulls[reply] = [1, True]
        s.requested += 1
        self._send(self.link.nc, [wire.pub(s.next_subject, reply, AGAIN_REQUEST)])

    def _nothing_to_get(self, s: QueueStream) -> None:
        """A pull found nothing: the plain basic.gets waiting for it get get-empty (M11),
        those with a polling wait keep waiting (Q5)."""
        q = s.q
        if s.held_back:
            return  # a message is on its way (its large body being read): it answers a get
        gets, s.plain_gets = s.plain_gets, []
        for ch in gets:
            if ch.waiting_get is not None and ch.waiting_get[0] is q and q.waiters is not None:
                q.waiters.cancel(ch)
                if not q.waiters:
                    q.waiters = None
                self.broker._get_answered(ch, q, None)

    def _take(self, s: QueueStream, msgs: list[Any]) -> None:
        """Pulled deliveries into the local model (leases), then delivered as usual."""
        q = s.q
        if s.held_back:
            s.held_back.extend(msgs)  # behind a large body being read: in order (M11)
            return
        now = self.clock.now()
        s.took_at = time.monotonic()
        self.taking.add(s)
        cmq = q.cmq
        leases = s.leases
        delays = s.delays
        restore = cmq.restore
        restore_plain = cmq.restore_plain
        numbers = _ack_numbers
        # The latest delivery's (consumer seq) pending count, or its reply subject's tokens
        # (read once, of the latest)
        last: int | list[str] | None = None
        plains = compiled_take_plains
        i, n = 0, len(msgs)
        while i < n:
            if plains is not None:
                # the common case's run from here, in C (gateway.jetstream.plain_takes): what
                # the body below does for each, in one call
                i, pending = plains(msgs, i, s, now, leases, delays, restore_plain, _NAMES, _PROPERTIES,
                                    new_message, init_message, Message, CMQError, MSG_ID)
                if pending is not None:
                    last = pending
                if i >= n:
                    break
            m = msgs[i]
            i += 1
            # delivery_counts, without its call: read in C where the numbers are plain ASCII
            # digits (_wire.c's ack_numbers, as delivery_counts reads them: test_ack_numbers.py),
            # else here; the pending count read once, of the latest
            nums = numbers(m.reply) if numbers is not None else None
            if nums is None:
                t = m.reply.split(".")
                at = 4 if len(t) == 9 else 6
                delivered = int(t[at])
                consumer_seq = int(t[at + 2])
                if consumer_seq > s.last_delivery:
                    s.last_delivery = consumer_seq
                    last = t
            else:
                delivered, consumer_seq, pending = nums
                if consumer_seq > s.last_delivery:
                    s.last_delivery = consumer_seq
                    last = pending
            headers = m.headers or {}
            visible_at = headers.get(VISIBLE_AT)
            msg_id = headers.get(MSG_ID, "")
            if visible_at is not None and float(visible_at) > now:
                # Q4: too early; JetStream keeps it for the rest of the delay, for every gateway.
                self.reply(m, b"-NAK {\"delay\": %d}" % int((float(visible_at) - now) * 1e9))
                delays[msg_id] = (float(visible_at), True)
                continue
            if delays:
                delays.pop(msg_id, None)
            count = delivered - 1
            if visible_at is not None and count > 0:
                # Q4/M11: a delayed message was naked once for its delay by whichever gateway
                # pulled it first (any puller during the delay does): not a receive.
                count -= 1
            received = headers.get(RECEIVED)
            if received is not None and received.isdigit():
                count += int(received)  # received directly before it went into the stream (direct)
            exp = headers.get(EXPIRES_AT)
            if exp is None and count <= 0 and BODY_HEADER not in headers:
                # The common case (issue 28: CPU a message): restore_plain's own ID check
                # (Q3) stands for cmq.get's, as the message is restored or leased anyway.
                msg = stored_message(m.data, msg_id)
                leases[msg_id] = m
                try:
                    restore_plain(msg, len(msg.body), now, msg_id, msg.published_at)
                except CMQError as e:
                    if e.rule != "Q3":
                        raise
                    # JetStream's delivery of a message leased here already: the newer lease
                continue
            if cmq.get(msg_id) is not None:
                leases[msg_id] = m
                continue  # JetStream's delivery of a message leased here already: the newer lease
            if BODY_HEADER in headers:
                body = s.fetched.pop(msg_id, None)
                if body is None:
                    s.held_back = msgs[i - 1:]  # this one and those after it wait for its body
                    self.spawn(self._fetch_body(s, m, headers[BODY_HEADER], msg_id))
                    break
                msg = stored_message(m.data, msg_id, body)
            else:
                msg = stored_message(m.data, msg_id)
            leases[msg_id] = m
            restore(msg, len(msg.body), now, msg_id=msg_id, enqueue_time=msg.published_at,
                    receive_count=count if count > 0 else 0, expires_at=None if exp is None else float(exp))
        if last is not None:
            q.remote_ready = last if isinstance(last, int) else int(last[8 if len(last) == 9 else 10])
        if not s.own_taken and s.last_own in leases:
            s.own_taken = True  # this gateway's latest publish into the stream came back (direct)
        vh = self.broker.vhosts[q.vhost]
        self.broker.after_queue_change(vh, q)
        self._return_surplus(s)
        if not s.held_back:
            answer_receives(s, status=False)
        self.want(s)  # what was naked for its delay (Q4) left a get or a credit unserved

    async def _fetch_body(self, s: QueueStream, m: Any, name: str, msg_id: str) -> None:
        """A large body (gateway.jetstream.bodies) read back, then the message taken."""
        q = s.q
        try:
            s.fetched[msg_id] = await self.bodies.get(name)
        except Exception as e:  # noqa: BLE001 - back to JetStream; another pull tries again
            log.warning("body %s of queue %r not read: %r", name, q.name, e)
            s.held_back.pop(0)
            self.nak(s, m)
        held, s.held_back = s.held_back, []
        if not q.deleted and held:
            self._take(s, held)

    def _return_surplus(self, s: QueueStream) -> None:
        """Leases pulled for consumers that went meanwhile go back to JetStream at once."""
        q = s.q
        if q.consumers or q.waiters is not None or s.api_demand:
            return
        now = self.clock.now()
        while (r := q.cmq.receive(now)) is not None:
            q.cmq.delete(r, now)
            m = r.message
            lease = s.leases.pop(m.msg_id, None)
            if lease is not None:
                self.nak(s, lease)
            elif m.msg_id in s.direct and self.hand_back is not None:
                self.hand_back(s, m, m.receive_count - 1)  # (that receive was no delivery)

    def nak(self, s: QueueStream, m: Any) -> None:
        """Active again for every gateway (M13, Q1). Confirmed by JetStream before this
        gateway pulls again: its next pull (a basic.get right after a requeue) must find it,
        and JetStream applies acks and pull requests on separate queues."""
        s.naks_pending += 1
        self.spawn(self._nak_confirmed(s, m))

    async def _nak_confirmed(self, s: QueueStream, m: Any) -> None:
        try:
            if s.forgetting is not None:  # behind the UNSUB of the requests withdrawn (_forget_requests)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(s.forgetting), PULL_WAIT + NAK_WAIT)
            age = lease_age(m.reply, time.time_ns())
            ack_wait = float(s.q.attrs.visibility_timeout) + ACK_WAIT_MARGIN
            if age is not None and age >= ack_wait - NAK_LATE_MARGIN:
                log.info("nak of a lease %.2f s old not sent: JetStream's ack_wait (%.1f s) hands it out", age, ack_wait)
                return
            await self.link.nc.request(m.reply, b"-NAK", timeout=NAK_WAIT)
        except Exception as e:  # noqa: BLE001 - lost: ack_wait makes it Active anyway
            log.info("nak to JetStream not confirmed: %r", e)
        finally:
            s.naks_pending -= 1
            if not s.naks_pending:
                self.want(s)

    def reply(self, m: Any, payload: bytes) -> None:
        """An ack, nak or term of one delivery; sent in order, batched per loop turn."""
        self._replies.append((m.reply, payload))
        if len(self._replies) == 1:
            self._loop.call_soon(self._send_replies)

    def _send_replies(self) -> None:
        replies, self._replies = self._replies, []
        if not replies:
            return  # sent at the end of the batch that settled them (end_batch)
        # wire.pubs' commands, made in C where every subject is ASCII (_wire.c's ack_pubs)
        commands = _ack_pubs(replies) if _ack_pubs is not None else None
        self._send(self.link.nc, commands if commands is not None else wire.pubs(replies))

    def send_replies(self) -> None:
        """The acks and naks settled so far, now (the end of a client's read)."""
        if self._replies:
            self._send_replies()

    def ack_lease(self, lease: Any) -> None:
        """A delivery settled here: acked to JetStream, its large body (if any) deleted."""
        replies = self._replies  # reply(), without its call (issue 28: CPU a message)
        replies.append((lease.reply, b"+ACK"))
        if len(replies) == 1:
            self._loop.call_soon(self._send_replies)
        headers = lease.headers
        if headers and BODY_HEADER in headers:
            self.spawn(self.bodies.delete(headers[BODY_HEADER]))

    def readers_left(self, s: QueueStream) -> None:
        """Nobody here takes from the queue any more: its pulls are withdrawn, its leases go back."""
        q = s.q
        if not q.consumers and q.waiters is None and s.requested and s.forgetting is None:
            # Set now, not in the task: naks spawned in this turn (a closing channel's) wait.
            s.forgetting = self._loop.create_future()
            self.spawn(self._forget_requests(s))
        self._return_surplus(s)

    def api_demand_ended(self, s: QueueStream) -> None:
        """The last CMQ API receive of the queue answered: what was pulled for it and not
        received goes back. Its pulls are not withdrawn (_forget_requests), as a consumer's
        are: what they are delivering meanwhile would be held by JetStream until ack_wait (the
        visibility timeout); a pull ends within PULL_WAIT, and what it brings goes back at once."""
        self._return_surplus(s)

    async def _forget_requests(self, s: QueueStream) -> None:
        """Nobody here takes from the queue any more: its waiting pull requests must not take
        messages that another gateway's consumers would get (JetStream drops a request whose
        reply subject lost its interest), so the inbox is replaced.

        The naks of a closing channel's deliveries wait (``s.forgetting``) until the old
        requests have expired at the server: nats-server 2.9 hands a naked message to the
        oldest waiting request, finds that its interest is gone, and keeps the message
        pending until ack_wait (the visibility timeout) instead of giving it to the next
        request; a basic.get right after the close found the first requeued message missing
        for 30 s (tests/integration/test_ack_multiple.py). What JetStream sent to the old
        inbox before reading the UNSUB goes back at once (``_hand_back``)."""
        old = s.sub
        forgetting = s.forgetting
        expired_at = s.waiting_until  # the old requests': the new ones' come after
        s.sub = s.inbox = None  # (no pull from here on until the new inbox is there)
        self._take_arrived(s)  # what the old requests brought: counted against them, not the new ones
        s.requested = 0
        s.pulls.clear()
        try:
            if old is not None:
                Handlers.of(self.link.nc).retire(old, self._hand_back, RETIRED_INBOX_SECONDS)
                with contextlib.suppress(Exception):
                    await old.unsubscribe()
            await subscribe(self.link, s, self.pulled, self.pulled_many)
            self.want(s)
            left = expired_at - time.monotonic()
            if left > 0:
                await asyncio.sleep(left + EXPIRY_MARGIN)
        finally:
            if s.forgetting is forgetting:
                s.forgetting = None
            if forgetting is not None and not forgetting.done():
                forgetting.set_result(None)

    def _hand_back(self, m: Any) -> None:
        """A delivery to a withdrawn pull request: Active again at once (a nak)."""
        if m.reply and not (m.headers and "Status" in m.headers):
            self.reply(m, b"-NAK")

    def get_waits(self, ch: Any, s: QueueStream, plain: bool) -> None:
        """basic.get with nothing leased here waits (as a long poll, Q5) for one pull;
        ``plain`` (no polling wait): answered get-empty by the first pull that finds nothing."""
        if plain:
            s.plain_gets.append(ch)
        self.want(s)

    def start_rewind(self, s: QueueStream, to_time: float) -> None:
        s.rewinding += 1
        self.spawn(self._rewind(s, to_time))

    async def _rewind(self, s: QueueStream, to_time: float) -> None:
        """M15/Q6: the queue's consumer starts again at ``to_time`` for every gateway; what
        this gateway leased from the old one is dropped (the new one delivers it again)."""
        q = s.q
        try:
            await asyncio.wait_for(s.ready.wait(), STARTUP_STREAMS_SECONDS)
            await rewind_consumer(self.link.js, s, to_time)
        except Exception as e:  # noqa: BLE001 - the queue keeps its consumer as it was
            log.warning("rewind of queue %r failed: %r", q.name, e)
        finally:
            s.rewinding -= 1
        now = self.clock.now()
        for msg_id in list(s.leases):
            m = q.cmq.get(msg_id)
            if m is not None and m.state is Q.MessageState.ACTIVE:
                q.cmq.delete(Q.Receipt(m, m.handle), now)
        s.leases.clear()
        s.requested = 0
        s.pulls.clear()
        self.want(s)
