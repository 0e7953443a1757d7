"""Queue messages to JetStream, pipelined (docs/CLUSTER.md, "Publish").

nats-py's ``js.publish`` is a request per message (a task, a future, a timer and a reply
token each): the largest share of a JetStream gateway's time per message. Here the writes of
one loop turn go out in one task, in LSN order, each with the reply subject
``<inbox>.<its LSN>``, and one subscription on ``<inbox>.*`` takes the PubAcks. At most
MAX_IN_FLIGHT writes wait for their PubAck at a time; the next ones wait here, in order.

What a reply means (CL3). The rule that makes a confirm safe:

* A write counts as stored only on a PubAck naming a stream sequence (``seq`` > 0). JetStream
  (nats-server 2.9) answers a publish whose ``Nats-Msg-Id`` it has seen with
  ``"duplicate": true`` and the sequence of the first one; in a cluster the stream leader
  stages that id with sequence 0 *before* the first publish is replicated, so a duplicate
  with ``seq`` 0 only says an earlier attempt is under way, and that attempt is lost if the
  leader loses its quorum or steps down before committing it (nats-server PR 6415, fixed
  upstream in 2025). Taken as stored, it confirmed messages that were never stored: such a
  reply is "not known", and the write is sent again later, same id, until JetStream names its
  sequence (the first attempt committed) or stores it (the staged id expired).
* A PubAck with an ``error`` is a refusal (L8's "maximum messages exceeded", a stream
  deleted meanwhile): the write is settled as refused, which the broker turns into a
  basic.nack, never an ack.
* A status reply (503 no responders: no stream leader for now), an unreadable reply, or no
  reply within RESEND_AFTER seconds: sent again, same ``Nats-Msg-Id`` (the stream's
  duplicate_window, 2 min, stores it once).
* Replies are matched by LSN; a reply for a write already settled (the answer to an earlier
  attempt after a resend) changes nothing.

A write settled here only ends its own LSN: the store's ``durable_lsn`` (what confirms follow)
is below the oldest LSN not yet settled, so a channel's confirm never passes a publish whose
PubAck has not come (gateway.jetstream.store).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway.jetstream import wire

__all__ = ["MAX_IN_FLIGHT", "RESEND_AFTER", "Publisher", "reading"]

log = logging.getLogger("cmq_gateway.jetstream")

RESEND_AFTER = 5.0  # no PubAck this long after sending: sent again (nats-py's own timeout)
SWEEP_EVERY = 0.5
MAX_IN_FLIGHT = 4096  # writes sent and not yet answered, at most
SEND_BATCH = 256  # writes handed to the connection together

STORED, REFUSED, UNKNOWN, GONE = "stored", "refused", "unknown", "gone"
# The server writes a PubAck as {"stream":"S", "seq":N[,"duplicate": true]} (a space after the
# first comma in 2.9): read without a JSON decoder.
_PUBACK = re.compile(rb'\{"stream":"[^"]*",\s*"seq":(\d+)[,}]')
# _PUBACK's match with a sequence above 0 (a digit other than 0 in it): a write stored, told
# without the group and its int() (_replied_plains; test_pubacks_together.py holds them equal).
_PUBACK_STORED = re.compile(rb'\{"stream":"[^"]*",\s*"seq":0*[1-9]\d*[,}]')


def stored_lsn(subject: bytes, data: bytes) -> int | None:
    """The LSN of a plain reply (its subject's last token) that says its write is stored
    (_PUBACK_STORED, no "error"), else None: _replied_plains' reading, the reference for
    _wire.c's (test_pubacks_together.py)."""
    try:
        lsn = int(subject[subject.rindex(b".") + 1:])
    except ValueError:
        return None
    if _PUBACK_STORED.match(data) is None or data.find(b'"error"') >= 0:
        return None
    return lsn


# The same read in C where the LSN is plain ASCII digits (None: the Python reading's); one
# C call for the rindex, int() and regex match that were ~3.5k instructions a PubAck (issue 28).
_stored_lsn = getattr(wire.compiled(), "stored_lsn", None)
# stored_run in C (None: _replied_plains' loop body reads every reply)
_stored_run = getattr(wire.compiled(), "stored_run", None)


def stored_run(replies: list[tuple[bytes, bytes]], i: int, writes: dict[int, Any], sent: dict[int, float],
               again: set[int], settled: Any, out: list[tuple[int, Callable[[], None]]]) -> int:
    """_replied_plains' loop body for its common case over replies[i:], the reference for
    _wire.c's stored_run (one call a run, not ~2k instructions a PubAck: issue 28): each reply
    that ``stored_lsn``'s C reading takes as a stored write's PubAck (plain digits) names no
    write (passed over: an earlier attempt's answer) or one of ``settled``'s, which is taken
    out of ``writes``, ``sent`` and ``again`` into ``out`` as (lsn, done). Returns the index of
    the first reply that is anything else (the loop body's)."""
    while i < len(replies):
        t = replies[i]
        if type(t) is not tuple or len(t) != 2 or type(t[0]) is not bytes or type(t[1]) is not bytes:
            break
        subject, data = t
        tail = subject[subject.rfind(b".") + 1:]
        if b"." not in subject or not (0 < len(tail) <= 18 and tail.isdigit()):
            break  # an LSN the C reading declines
        lsn = stored_lsn(subject, data)
        if lsn is None:
            break
        w = writes.get(lsn)
        if w is not None:
            if type(w) is not tuple or len(w) != 6 or w[5] is not settled:
                break
            del writes[lsn]
            sent.pop(lsn, None)
            if again:
                again.discard(lsn)
            out.append((lsn, w[3]))
        i += 1
    return i
# wire.hpub of a one-header write with its reply subject made from the LSN, in C (None where
# the C module is not there or declines: wire.hpub makes it)
_hpub_lsn = getattr(wire.compiled(), "hpub_lsn", None)
# hpub_run in C (None: _next_batch's loop body makes every command)
_hpub_run = getattr(wire.compiled(), "hpub_run", None)


def hpub_run(outbox: deque[int], writes: dict[int, Any], sent: dict[int, float], again: set[int], prefix: str,
             now: float, max_sent: int, max_batch: int, batch: list[int], commands: list[Any]) -> None:
    """_next_batch's loop body over the outbox for the writes hpub_lsn makes (C), the reference
    for _wire.c's hpub_run (one call a batch, not ~2k instructions a write: issue 28): stops,
    leaving it in the outbox, at a write whose command wire.hpub makes."""
    while outbox and len(sent) < max_sent and len(batch) < max_batch:
        lsn = outbox[0]
        w = writes.get(lsn)
        if w is not None and lsn not in sent and lsn not in again:
            if type(w) is not tuple or len(w) != 6:
                break  # as C declines it
            subject, payload, headers, _, _, _ = w
            command = _hpub_lsn(subject, prefix, lsn, headers, payload) if _hpub_lsn is not None else None
            if command is None:
                break
            outbox.popleft()
            sent[lsn] = now
            batch.append(lsn)
            commands.append(command)
        else:
            outbox.popleft()


def reading(headers: dict[str, str] | None, data: bytes) -> str:
    """What one reply on the PubAck inbox says of its write (see the module docstring)."""
    if headers and headers.get("Status"):
        return UNKNOWN  # 503 no responders: nobody stored it
    plain = _PUBACK.match(data)  # the server's own text, without an error: no JSON decoder
    if plain is not None and data.find(b'"error"') < 0:
        return STORED if int(plain.group(1)) > 0 else UNKNOWN
    try:
        r = json.loads(data)
    except ValueError:
        return UNKNOWN
    if not isinstance(r, dict):
        return UNKNOWN
    if r.get("error") is not None:
        return REFUSED
    seq = r.get("seq")
    return STORED if isinstance(seq, int) and seq > 0 else UNKNOWN


Settled = Callable[[int, bool, Callable[[], None]], None]


# A write not settled yet: (subject, payload, headers, done, gone, settled). A tuple, not an
# object with an ``__init__``: no Python call a write (issue 28: CPU a message); when it was last
# sent is its value in ``Publisher._sent``. ``settled`` is called once, as settled(lsn, refused
# by JetStream, done): one callable shared by the writes of a store, ``done`` one shared by
# those of a queue, not a closure per write. ``gone``: its queue was deleted (an unstored
# write is then refused, not resent).
_Write = tuple[str, bytes, dict[str, str], Callable[[], None], Callable[[], bool] | None, Settled]


class Publisher:
    def __init__(self, nc: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.nc = nc
        self._loop = loop
        self.prefix = nc.new_inbox()
        self._writes: dict[int, _Write] = {}  # not settled, by LSN
        self._outbox: deque[int] = deque()  # LSNs to send, in order
        self._sent: dict[int, float] = {}  # sent and not answered, in the order sent: when last sent
        self._again: set[int] = set()  # answered "not known" or not sent: for the next sweep
        self._sending = False  # a send under way (a task awaiting nats-py while NATS is away)
        self._scheduled = False  # a flush in the loop's next turn
        self._sub: Any = None
        self._sweeper: asyncio.Task[None] | None = None
        self._told_unknown = False
        # (settled, settle_many) of the store whose writes these are (JetStreamStore.
        # track_message): several PubAcks of a read settled together (_replied_plains).
        self.settles: tuple[Settled, Callable[[list[tuple[int, Callable[[], None]]]], None]] | None = None

    async def start(self) -> None:
        async def on_reply(msg: Any) -> None:
            self._replied(msg)

        self._sub = await self.nc.subscribe(self.prefix + ".*", cb=on_reply,
                                            pending_msgs_limit=-1, pending_bytes_limit=-1)
        # in the read loop's turn
        wire.Handlers.of(self.nc).add(self._sub, self._replied, self._replied_plain, plains=self._replied_plains)
        self._sweeper = self._loop.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        if self._sub is not None:
            wire.Handlers.of(self.nc).discard(self._sub)
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    @property
    def pending(self) -> int:
        return len(self._writes)

    @property
    def in_flight(self) -> int:
        return len(self._sent)

    def publish(self, lsn: int, subject: str, payload: bytes, headers: dict[str, str],
                done: Callable[[], None], gone: Callable[[], bool] | None, settled: Settled) -> None:
        self._writes[lsn] = (subject, payload, headers, done, gone, settled)
        self._outbox.append(lsn)
        if not self._scheduled:
            self.schedule()

    def schedule(self) -> None:
        """Sent at the end of the client read that made it (flush, from the broker's
        end_batch), else in the next turn: a read's publishes handed over together."""
        self._scheduled = True
        self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """What is queued, written now (in window). The publishes have a connection of
        their own (gateway.jetstream.link), so this write holds only them: the acks and pull
        requests of the turn still leave together at the start of the next."""
        self._scheduled = False
        self._kick()
        wire.send_now(self.nc)

    def _kick(self) -> None:
        if not self._sending and self._outbox:
            self._sending = True
            self._send_now()

    def _send_now(self) -> None:
        """Everything queued, in order, as long as the window allows, handed to the
        connection at once (gateway.jetstream.wire.send: the writes of a loop turn leave
        together at the start of the next, not behind a task's turn and then the flusher's).
        While NATS is away a task awaits the writes instead."""
        try:
            while self._outbox and len(self._sent) < MAX_IN_FLIGHT:
                batch, commands = self._next_batch()
                if commands and not wire.send(self.nc, commands):
                    self._loop.create_task(self._send(batch, commands))
                    return
        except BaseException:
            self._sending = False
            raise
        self._sending = False

    def _next_batch(self) -> tuple[list[int], list[Any]]:
        """Up to SEND_BATCH writes from the outbox, in order, counted as sent."""
        prefix = self.prefix
        outbox = self._outbox
        writes = self._writes
        sent = self._sent
        again = self._again
        hpub_lsn = _hpub_lsn
        now = time.monotonic()
        batch: list[int] = []
        commands: list[Any] = []
        run = _hpub_run
        while outbox and len(sent) < MAX_IN_FLIGHT and len(batch) < SEND_BATCH:
            if run is not None:
                # the loop body below for each write hpub_lsn makes, in C (hpub_run)
                run(outbox, writes, sent, again, prefix, now, MAX_IN_FLIGHT, SEND_BATCH, batch, commands)
                if not (outbox and len(sent) < MAX_IN_FLIGHT and len(batch) < SEND_BATCH):
                    break
            lsn = outbox.popleft()
            w = writes.get(lsn)
            if w is None or lsn in sent or lsn in again:
                continue  # settled meanwhile, or queued twice
            sent[lsn] = now
            batch.append(lsn)
            subject, payload, headers, _, _, _ = w
            command = hpub_lsn(subject, prefix, lsn, headers, payload) if hpub_lsn is not None else None
            commands.append(command if command is not None else wire.hpub(subject, f"{prefix}.{lsn}", headers, payload))
        return batch, commands

    async def _send(self, batch: list[int], commands: list[Any]) -> None:
        """The batch the socket would not take now, then the rest, awaiting each write
        (nats-py's own path: buffered while reconnecting, drained while the socket is full)."""
        try:
            while True:
                try:
                    await wire.write(self.nc, commands)
                except Exception as e:  # noqa: BLE001 - NATS away or closed: the sweep sends them again
                    log.info("publish to JetStream not sent: %r", e)
                    for lsn in batch:
                        if lsn in self._sent:
                            self._unanswered(lsn)
                if not self._outbox or len(self._sent) >= MAX_IN_FLIGHT:
                    return
                batch, commands = self._next_batch()
        finally:
            self._sending = False

    def _unanswered(self, lsn: int) -> None:
        self._sent.pop(lsn, None)
        self._again.add(lsn)

    def _replied(self, msg: Any) -> None:
        try:
            lsn = int(msg.subject.rpartition(".")[2])
        except ValueError:
            return
        if lsn in self._writes:
            self._answered(lsn, reading(msg.headers, msg.data), msg.headers, msg.data)

    def _replied_plain(self, subject: bytes, data: bytes) -> None:
        """A reply without headers (a PubAck, nearly always), read as the bytes came: what
        ``_replied`` does, without a Delivery and its decoding (issue 28: CPU a message)."""
        try:
            lsn = int(subject[subject.rindex(b".") + 1:])
        except ValueError:
            return
        writes = self._writes
        w = writes.get(lsn)
        if w is None:
            return
        plain = _PUBACK.match(data)  # reading()'s first rule, without its call: nearly every reply
        if plain is None or data.find(b'"error"') >= 0:
            self._answered(lsn, reading(None, data), None, data)
        elif int(plain.group(1)) <= 0:
            self._answered(lsn, UNKNOWN, None, data)
        else:
            # _answered's STORED case, without its call (nearly every reply)
            del writes[lsn]
            self._sent.pop(lsn, None)
            if self._again:
                self._again.discard(lsn)
            _, _, _, done, _, settled = w
            settled(lsn, False, done)
            if self._outbox:
                self._kick()  # the window had room for one more

    def _replied_plains(self, replies: list[tuple[bytes, bytes]]) -> None:
        """Replies without headers read together (PubAcks): each as ``_replied_plain`` reads
        it, in order; a write's that names a stream sequence (nearly all) settled with the
        others of the read by the store at once (issue 28: CPU a message)."""
        writes = self._writes
        sent = self._sent
        again = self._again
        settles = self.settles
        one, many = settles if settles is not None else (None, None)
        stored: list[tuple[int, Callable[[], None]]] = []
        stored_ack = _PUBACK_STORED.match
        c_lsn = _stored_lsn
        run = _stored_run if one is not None else None
        i, n = 0, len(replies)
        while i < n:
            if run is not None:
                # the common case's run from here, in C (stored_run): the body below for each
                i = run(replies, i, writes, sent, again, one, stored)
                if i >= n:
                    break
            subject, data = replies[i]
            i += 1
            # stored_lsn: in C where the LSN is plain digits, else read here
            lsn = c_lsn(subject, data) if c_lsn is not None else None
            if lsn is None:
                try:
                    lsn = int(subject[subject.rindex(b".") + 1:])
                except ValueError:
                    continue
                # reading()'s STORED, without its call, group and int(); find, not ``in``:
                # bytes' ``in`` tries its argument as an int first, and that TypeError made
                # and cleared was ~1.8k instructions a PubAck (callgrind, issue 28)
                stored_here = stored_ack(data) is not None and data.find(b'"error"') < 0
            else:
                stored_here = True
            w = writes.get(lsn)
            if w is None:
                continue
            if not stored_here or w[5] is not one:
                if stored:
                    many(stored)  # type: ignore[misc]  # (one is not None: stored holds its writes)
                    stored = []
                self._replied_plain(subject, data)  # any other answer: as it comes
                continue
            del writes[lsn]
            sent.pop(lsn, None)
            if again:
                again.discard(lsn)
            stored.append((lsn, w[3]))
        if stored:
            many(stored)  # type: ignore[misc]
        if self._outbox:
            self._kick()  # the window had room for more

    def _answered(self, lsn: int, what: str, headers: dict[str, str] | None, data: bytes) -> None:
        """The write ``lsn``, not settled yet, answered ``what`` (see the module docstring)."""
        w = self._writes[lsn]
        if what == UNKNOWN:
            if not self._told_unknown:
                self._told_unknown = True
                log.warning("jetstream did not store a write (lsn %d) for now, sending it again: %r",
                            lsn, (headers or {}).get("Status") or data[:200])
            gone = w[4]  # see _Write
            if gone is None or not gone():
                self._unanswered(lsn)
                return
            # No stream any more (its queue deleted since it was routed there): the message goes
            # with the queue, as on one broker, and its confirm is not held (an MQTT publisher
            # would be cut off by a refusal when a subscriber's clean session leaves).
            what = GONE
        if what == REFUSED:
            log.warning("jetstream refused a message (lsn %d): %s", lsn, data[:200])
        del self._writes[lsn]
        self._sent.pop(lsn, None)
        self._again.discard(lsn)
        _, _, _, done, _, settled = w
        settled(lsn, what == REFUSED, done)
        if self._outbox:
            self._kick()  # the window had room for one more

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            silent_since = time.monotonic() - RESEND_AFTER
            for lsn, sent_at in self._sent.items():  # in the order sent: the oldest first
                if sent_at > silent_since:
                    break
                self._again.add(lsn)
            if not self._again:
                continue
            again = sorted(self._again)
            self._again.clear()
            for lsn in again:
                self._sent.pop(lsn, None)
            # Before anything not sent yet: the oldest writes go first (LSN order).
            self._outbox.extendleft(reversed(again))
            self._kick()
