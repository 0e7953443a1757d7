"""A lean path over nats-py for what a JetStream gateway sends and reads per queue message.

nats-py spends, per message it reads, a ``Msg`` object, a header parse in several steps, a
put on the subscription's asyncio queue and a turn of that subscription's task; per message it
writes, a subject check, a header built key by key and a flusher future. For the few messages
that come once per queue message (pulled deliveries, PubAcks) and go once per queue message
(publishes, acks, pull requests) that was most of a gateway's time on JetStream (issue 28).

Here a subscription made with nats-py (which still sends SUB, and SUB again after a reconnect,
under the same sid) may have a *handler*: the connection's ``_process_msg`` hands its messages
to it at once, in the read loop's own turn, as a :class:`Delivery`; every other subscription
goes on through nats-py as before. Writes are protocol commands built here and handed to the
connection's buffer together, one flush for the lot; while the connection is not up they go
through ``Client.publish``, so nats-py's own rules (buffering while reconnecting, errors once
closed) hold for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE

from gateway.purepython import pure_python

__all__ = ["Delivery", "Handlers", "hpub", "parse_headers", "pub", "pubs", "send", "send_now", "write"]

log = logging.getLogger("cmq_gateway.jetstream")


class Delivery:
    """What the handlers read of a message: as nats-py's ``Msg`` has it (str subjects).
    _wire.c's take_lone fills the four slots of the deliveries it reads without calling
    ``__init__`` (issue 28: CPU a delivery), so ``__init__`` does nothing but set them."""

    __slots__ = ("subject", "reply", "data", "headers")

    def __init__(self, subject: str, reply: str, data: bytes, headers: dict[str, str] | None) -> None:
        self.subject = subject
        self.reply = reply
        self.data = data
        self.headers = headers


# The header of a queue message's delivery: its Nats-Msg-Id alone, no status (Handlers._take).
_MSG_ID = "Nats-Msg-Id"
_MSG_ID_HEAD = b"NATS/1.0\r\nNats-Msg-Id:"
_MSG_ID_AT = len(_MSG_ID_HEAD)
# Subscription ids as read, as ints: a connection has a few (Handlers._take).
_SIDS: dict[bytes, int] = {}
_SIDS_MAX = 1024

# The runs of a subscription's deliveries and PubAcks after their first, read in C where the
# package was built with a compiler (gateway/jetstream/_wire.c: the same messages as this
# module's reading makes, which stays the reference); None: read here.
_scan: Any = None
if not pure_python():
    try:
        from gateway.jetstream import _wire as _scan  # type: ignore[attr-defined, no-redef]
    except ImportError:  # built without a C compiler: this module's reading, same results
        pass


def compiled() -> Any:
    """gateway/jetstream/_wire.c's module, or None (CMQ_GATEWAY_PURE_PYTHON=1, no compiler)."""
    return _scan


# Header names as read, decoded once: the few a gateway's messages carry (Nats-Msg-Id, ...).
_NAMES: dict[bytes, str] = {}
_NAMES_MAX = 64


def parse_headers(raw: bytes) -> dict[str, str] | None:
    """``NATS/1.0[ <status>[ <description>]]\\r\\nKey: value\\r\\n...\\r\\n\\r\\n`` -> a dict,
    the status under ``Status`` and its text under ``Description`` (nats-py's keys)."""
    if not raw:
        return None
    if raw.startswith(b"NATS/1.0\r\n") and raw.endswith(b"\r\n\r\n") and raw.count(b"\r\n") == 3:
        # One header and no status: what nearly every delivery of a queue message carries (its
        # Nats-Msg-Id), read without the line loop (issue 28: CPU per message pulled).
        key, sep, value = raw[10:-4].partition(b":")
        if not sep:
            return {}
        name = _NAMES.get(key)
        if name is None:
            name = key.decode().strip()
            if len(_NAMES) < _NAMES_MAX:
                _NAMES[key] = name
        return {name: value.decode().strip()}
    lines = raw.split(b"\r\n")
    first = lines[0]
    hdr: dict[str, str] = {}
    if len(first) > 9:  # NATS/1.0 404 No Messages
        status, _, desc = first[9:].partition(b" ")
        if status.isdigit():
            hdr["Status"] = status.decode()
        if desc:
            hdr["Description"] = desc.decode()
    for line in lines[1:]:
        if not line:
            continue
        key, sep, value = line.partition(b":")
        if sep:
            hdr[key.decode().strip()] = value.decode().strip()
    return hdr


class Handlers:
    """Handlers by subscription id, on one connection (installed once per connection).

    Messages for them are parsed where nats-py's parser would be fed: in its read loop's
    turn, and, once the loop has read a first time on a connection, straight from the
    socket's callback (the ``StreamReader``'s ``feed_data``) whenever nothing earlier waits
    to be parsed, which spares each read a turn of the read loop's task and two copies
    (issue 28, latency). What the handlers do not take (PING, INFO, -ERR, messages for
    nats-py's own subscriptions) and everything after it goes to nats-py's read loop as
    before, so the order of everything read holds."""

    def __init__(self, nc: Any) -> None:
        self.by_sid: dict[int, Callable[[Delivery], None]] = {}
        # Beside a handler: what takes that subscription's messages without headers or reply
        # subject, as (subject, payload) bytes (add's ``plain``).
        self.plain: dict[int, Callable[[bytes, bytes], None]] = {}
        # Beside a handler: what takes that subscription's deliveries whose header is a lone
        # Nats-Msg-Id (a queue message pulled) together, as a list (add's ``many``).
        self.many: dict[int, Callable[[list[Delivery]], None]] = {}
        # Beside a plain: what takes those messages of a read together, as (subject, payload) pairs.
        self.plains: dict[int, Callable[[list[tuple[bytes, bytes]]], None]] = {}
        self._read_end: list[Callable[[], None]] = []
        self._rest = b""  # the start of a message the last read did not hold all of
        self._nc = nc
        self._reader: Any = None  # the StreamReader whose feed_data parses here first
        self._parsing = False  # nats-py's read loop is parsing a read (it may await within)
        original = nc._process_msg
        ps = self._ps = nc._ps
        parse = ps.parse

        async def parse_read(data: bytes) -> None:
            self._parsing = True
            try:
                self._direct_reads()  # a new connection's reader, after a (re)connect
                if ps.state == AWAITING_CONTROL_LINE and not ps.buf:
                    rest, self._rest = self._rest, b""
                    data = rest + data if rest else data
                    pos = 0
                    while True:
                        pos, other = self._take(data, pos, False)
                        if other is None:
                            break
                        await original(*other)  # a message for nats-py's own subscription
                    if pos >= 0 and pos < len(data):
                        await parse(data[pos:])  # anything else (PING, INFO, -ERR) and what follows
                else:
                    await parse(data)  # nats-py's parser holds part of a message: it goes on
            finally:
                self._parsing = False
                self.read_ended()

        ps.parse = parse_read
        reset = ps.reset

        def reset_all() -> None:  # a reconnect: nothing of the old connection's reads is kept
            reset()
            self._rest = b""

        ps.reset = reset_all

        async def process(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            handler = self.by_sid.get(sid)  # what nats-py's parser reads (after a PING, say)
            if handler is None:
                await original(sid, subject, reply, data, headers)
                return
            try:
                handler(Delivery(subject.decode(), reply.decode(), data, parse_headers(headers) if headers else None))
            except Exception:  # a bug in one handler must not end the connection's read loop
                log.exception("handling a NATS message on %r failed", subject)

        nc._process_msg = process

    def _direct_reads(self) -> None:
        """The connection's reader handing its reads here first (see the class)."""
        transport = self._nc._transport
        reader = getattr(transport, "_io_reader", None)
        if reader is None or reader is self._reader or not isinstance(reader, asyncio.StreamReader):
            return
        self._reader = reader
        feed = reader.feed_data
        ps = self._ps
        nc = self._nc

        def feed_data(data: bytes) -> None:
            if (self._parsing or reader._buffer or ps.state != AWAITING_CONTROL_LINE or ps.buf  # type: ignore[attr-defined]
                    or not data or self._reader is not reader or not nc.is_connected or nc.is_connecting
                    or getattr(nc._transport, "_io_reader", None) is not reader):
                feed(data)  # something earlier waits for the read loop, or not connected: in order
                return
            rest, self._rest = self._rest, b""
            if rest:
                data = rest + data
            try:
                pos, _ = self._take(data, 0, True)
            finally:
                self.read_ended()
            if 0 <= pos < len(data):
                feed(data[pos:])

        reader.feed_data = feed_data  # type: ignore[method-assign, assignment]

    def _take(self, data: bytes, pos: int, direct: bool) -> tuple[int, tuple[int, bytes, bytes, bytes, bytes | None] | None]:
        """The MSG and HMSG commands for handlers from ``pos`` on, handed on in order. Stops at
        the end (``len(data)``, None); at a command of another kind (its position, None: for
        nats-py's parser); at a message for a subscription without a handler (the position
        after it and its parts, for nats-py's ``_process_msg``; when ``direct``, its position
        and None); or at a message the data does not hold all of (-1, None; it is kept for
        the next read). nats-py's parser matches several regular expressions and deletes
        from its buffer for every message (issue 28: a share of the CPU per message)."""
        # The latest run of lone-id deliveries (``many``) or plain messages (``plains``) of one
        # subscription read: [its key, its taker, what it gathered]; handed on together when
        # anything else comes and at every return, so that every message is handed on in the
        # order read (issue 28: one call a run, not one a message).
        run: list[Any] = [None, None, []]
        try:
            return self._take_from(data, pos, direct, run)
        finally:
            if run[2]:
                self._hand_on(run)

    @staticmethod
    def _hand_on(run: list[Any]) -> None:
        fn, items = run[1], run[2]
        run[0], run[2] = None, []
        try:
            fn(items)
        except Exception:  # a bug in one handler must not end the connection's read loop
            log.exception("handling NATS messages failed")

    def _take_from(self, data: bytes, pos: int, direct: bool, run: list[Any],
                   ) -> tuple[int, tuple[int, bytes, bytes, bytes, bytes | None] | None]:
        by_sid = self.by_sid
        many = self.many
        plains = self.plains
        sids = _SIDS
        scan = _scan if type(data) is bytes else None
        end = len(data)
        while pos < end:
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if end - pos > MAX_CONTROL_LINE_SIZE or not (data.startswith(b"MSG ", pos)
                                                             or data.startswith(b"HMSG ", pos)):
                    return pos, None
                self._rest = data[pos:]  # a control line cut in two
                return -1, None
            # nats-server writes one space between the arguments (none of which may hold
            # whitespace): split at spaces, as the generic split reads it (twice as fast a
            # line, two lines a message); an empty argument (two spaces) takes the generic one.
            args = data[pos:eol].split(b" ")
            if b"" in args:
                args = data[pos:eol].split()
            n = len(args)
            op = args[0] if n else b""
            if op == b"MSG" and (n == 4 or n == 5):
                hsize, size = 0, int(args[-1])
                reply = args[3] if n == 5 else b""
            elif op == b"HMSG" and (n == 5 or n == 6):
                hsize, size = int(args[-2]), int(args[-1])
                reply = args[3] if n == 6 else b""
            else:
                return pos, None
            start = eol + 2
            stop = start + size
            if stop + 2 > end:
                self._rest = data[pos:]
                return -1, None
            sid = sids.get(args[2])  # a few sids, read once each: not an int() a message
            if sid is None:
                sid = int(args[2])
                if len(sids) < _SIDS_MAX:
                    sids[args[2]] = sid
            handler = by_sid.get(sid)
            if handler is None:
                if direct:
                    return pos, None
                return stop + 2, (sid, args[1], reply, data[start + hsize:stop],
                                  data[start:start + hsize] if hsize else None)
            try:
                body = start + hsize
                # parse_headers of a lone Nats-Msg-Id (nearly every delivery), without its call
                lone = (hsize and data.startswith(_MSG_ID_HEAD, start) and data.startswith(b"\r\n\r\n", body - 4)
                        and data.find(b"\r\n", start + _MSG_ID_AT) == body - 4)
                if lone and sid in many:
                    # A queue message pulled (no status): taken with the others of its run
                    item: Any = Delivery(args[1].decode(), reply.decode(), data[body:stop],
                                         {_MSG_ID: data[start + _MSG_ID_AT:body - 4].decode().strip()})
                    key = sid
                elif not hsize and not reply and sid in plains:
                    item, key = (args[1], data[start:stop]), ~sid  # a PubAck: likewise
                else:
                    item = None
                if item is not None:
                    if run[0] != key:
                        if run[2]:
                            self._hand_on(run)
                        run[0], run[1] = key, many[sid] if key == sid else plains[sid]
                    run[2].append(item)
                    pos = stop + 2
                    if scan is not None:  # the rest of the run (_scan)
                        pos = (scan.take_lone(data, pos, sid, Delivery, _MSG_ID, run[2]) if key == sid
                               else scan.take_plain(data, pos, sid, run[2]))
                    continue
                if run[2]:
                    self._hand_on(run)
                plain = self.plain.get(sid) if not hsize and not reply else None
                if plain is not None:
                    # A message without headers or reply subject for a handler that reads its
                    # bytes as they come (a PubAck): no Delivery, no decoding (issue 28: CPU a message).
                    plain(args[1], data[start:stop])
                else:
                    if lone:
                        headers: dict[str, str] | None = {_MSG_ID: data[start + _MSG_ID_AT:body - 4].decode().strip()}
                    else:
                        headers = parse_headers(data[start:body]) if hsize else None
                    handler(Delivery(args[1].decode(), reply.decode(), data[body:stop], headers))
            except Exception:  # a bug in one handler must not end the connection's read loop
                log.exception("handling a NATS message on %r failed", args[1])
            pos = stop + 2
        return pos, None

    @classmethod
    def of(cls, nc: Any) -> Handlers:
        handlers = getattr(nc, "_cmq_handlers", None)
        if handlers is None:
            handlers = nc._cmq_handlers = cls(nc)
        return handlers

    def at_read_end(self, fn: Callable[[], None]) -> None:
        """``fn`` called once the messages of the read being parsed are all handled, in the
        same turn of the loop: what a read brought is taken together, without waiting for
        the loop's next turn."""
        self._read_end.append(fn)

    def read_ended(self) -> None:
        while self._read_end:
            todo, self._read_end = self._read_end, []
            for fn in todo:
                try:
                    fn()
                except Exception:  # a bug in one must not end the connection's read loop
                    log.exception("handling the end of a NATS read failed")

    def add(self, sub: Any, handler: Callable[[Delivery], None],
            plain: Callable[[bytes, bytes], None] | None = None,
            many: Callable[[list[Delivery]], None] | None = None,
            plains: Callable[[list[tuple[bytes, bytes]]], None] | None = None) -> None:
        """``handler`` takes ``sub``'s messages; ``plain``, if given, those without headers or
        reply subject that this module parses (not those nats-py's parser reads: it must do
        what ``handler`` does), as (subject, payload) bytes, and ``plains`` (with it) several
        of those at once, in the order read; ``many``, if given, those whose header is a lone
        Nats-Msg-Id that this module parses, several at once in the order read (it must do
        what ``handler`` does with each, in turn)."""
        self.by_sid[sub._id] = handler
        if plain is not None:
            self.plain[sub._id] = plain
            if plains is not None:
                self.plains[sub._id] = plains
        if many is not None:
            self.many[sub._id] = many

    def discard(self, sub: Any) -> None:
        self.by_sid.pop(sub._id, None)
        self.plain.pop(sub._id, None)
        self.plains.pop(sub._id, None)
        self.many.pop(sub._id, None)

    def retire(self, sub: Any, handler: Callable[[Delivery], None], seconds: float) -> None:
        """``sub``'s messages go to ``handler`` for ``seconds``, also once nats-py has
        unsubscribed it (nats-py drops what still comes for a sid it no longer knows); then
        nothing is kept of it. nats-py never reuses a sid."""
        sid = sub._id
        self.by_sid[sid] = handler
        self.plain.pop(sid, None)
        self.plains.pop(sid, None)
        self.many.pop(sid, None)
        asyncio.get_running_loop().call_later(seconds, self._forget_sid, sid, handler)

    def _forget_sid(self, sid: int, handler: Callable[[Delivery], None]) -> None:
        if self.by_sid.get(sid) is handler:
            del self.by_sid[sid]


def pub(subject: str, reply: str, payload: bytes) -> tuple[bytes, str, str, bytes, None]:
    """A PUB command (and what ``Client.publish`` takes, for when the connection is down)."""
    head = b"PUB %s %s %d\r\n" % (subject.encode(), reply.encode(), len(payload)) if reply else \
        b"PUB %s %d\r\n" % (subject.encode(), len(payload))
    return head + payload + b"\r\n", subject, reply, payload, None


_ACK = b"+ACK"
_ACK_TAIL = b" %d\r\n%s\r\n" % (len(_ACK), _ACK)


def pubs(messages: list[tuple[str, bytes]]) -> list[tuple[bytes, str, str, bytes, None]]:
    """PUB commands without reply subjects (acks, naks), as :func:`pub` makes each, in one
    call for the lot (issue 28: CPU a message). An ack's command is two concatenations: the
    format was a third of the instructions of this call an ack."""
    return [(b"PUB " + subject.encode() + _ACK_TAIL if payload == _ACK else
             b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload), subject, "", payload, None)
            for subject, payload in messages]


def hpub(subject: str, reply: str, headers: dict[str, str], payload: bytes) -> tuple[bytes, str, str, bytes, dict[str, str]]:
    """An HPUB command. The header values are the gateway's own (ids, numbers, object names):
    no line breaks to escape."""
    if len(headers) == 1:  # a queue message's Nats-Msg-Id alone, nearly always
        (k, v), = headers.items()
        hdr = f"NATS/1.0\r\n{k}: {v}\r\n\r\n".encode()
        n = len(hdr)
        # joined, not formatted: b"%s" formatting was half of this call's instructions (issue 28)
        return (b"".join((f"HPUB {subject} {reply} {n} {n + len(payload)}\r\n".encode(), hdr, payload, b"\r\n")),
                subject, reply, payload, headers)
    hdr = b"NATS/1.0\r\n" + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items()) + b"\r\n"
    return (b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(hdr), len(hdr) + len(payload),
                                                  hdr, payload),
            subject, reply, payload, headers)


# Past this many bytes in the socket's own buffer, writes go through nats-py's flusher, which
# waits for the buffer to drain (a slow server holds them there, not in the gateway's memory).
DIRECT_MAX_BUFFERED = 1 << 20


def send(nc: Any, commands: list[tuple[bytes, str, str, bytes, dict[str, str] | None]]) -> bool:
    """The commands queued, in order, behind anything nats-py holds for its flusher, and
    written to the socket at the start of the loop's next turn together with every other
    command of this turn (one write a turn, as nats-py's flusher makes, without its task's
    turn, queue and future: issue 28, latency and CPU per message). False, having queued
    nothing, while the connection is not up: the caller then awaits :func:`write` in a task."""
    if (not nc.is_connected or nc.is_connecting or nc._transport is None or nc._flusher_task is None
            or nc._flusher_task.done()):
        return False
    pending = nc._pending
    size = 0
    for c in commands:
        pending.append(c[0])
        size += len(c[0])
    nc._pending_data_size += size
    if not getattr(nc, "_cmq_flush_soon", False):
        nc._cmq_flush_soon = True
        asyncio.get_running_loop().call_soon(_flush, nc)
    return True


def send_now(nc: Any) -> None:
    """What :func:`send` queued so far, written now rather than at the start of the loop's
    next turn: the end of a client's read that published (issue 28, latency at 3,000 msg/s:
    the turn waited 0.11 ms at the median and 3.3 ms at p90, at load 14)."""
    if getattr(nc, "_cmq_flush_soon", False):
        _flush(nc)


def _flush(nc: Any) -> None:
    """What this turn queued, in one write, unless nats-py's flusher wrote it meanwhile; while
    the socket's buffer is full or the connection not up, nats-py's flusher takes it (it
    drains, and buffers while reconnecting)."""
    nc._cmq_flush_soon = False
    if not nc._pending_data_size:
        return
    transport = nc._transport
    writer = getattr(transport, "_io_writer", None)
    if (nc.is_connected and not nc.is_connecting and writer is not None
            and writer.transport.get_write_buffer_size() <= DIRECT_MAX_BUFFERED):
        pending = nc._pending
        nc._pending = []
        nc._pending_data_size = 0
        transport.writelines(pending)
        return
    if nc._flush_queue is not None and nc._flush_queue.empty():
        nc._flush_queue.put_nowait(asyncio.get_running_loop().create_future())


async def write(nc: Any, commands: Iterable[tuple[bytes, str, str, bytes, dict[str, str] | None]]) -> None:
    """The commands, in order, as one write (one flush), or through ``Client.publish`` one by
    one while the connection is not up."""
    if not nc.is_connected:
        for _, subject, reply, payload, headers in commands:
            await nc.publish(subject, payload, reply=reply, headers=headers)
        return
    blob = b"".join(c[0] for c in commands)
    if not blob:
        return
    await nc._send_command(blob)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()
