"""One AMQP connection on a socket: a thin asyncio.Protocol around the sans-IO core.

Theory of operation. ``data_received`` feeds the bytes to ``ServerConnection``, drains every
event it yields and writes what the core queued in one ``transport.write`` for the whole
batch, never one per frame. Connection-level events (handshake, login, vhost, close,
heartbeat timeout, protocol errors) are handled here; channel events go to the broker's
``Session``. When the broker writes on its own (a delivery caused by another connection, a
confirm after fsync, a timer) it calls ``request_flush``, which schedules a single write with
``call_soon`` however many times it is called in one loop iteration; when a read turn caused
it (a publish's delivery to another connection), that turn writes it as it ends, after its
audit hand-off (``flush_requested``), rather than leave it a loop iteration for the
``call_soon``: behind the rest of the turn, the other sockets the poll returned, and the loop's
own round (scenario 7, docs/BENCHMARKS.md).

Fairness between connections. uvloop (libuv) keeps reading a socket for as long as each read
fills its buffer, up to 32 reads of 256 KB per poll, so a producer that writes faster than we
decode was read for seconds on end while a consumer's acks sat unread in the kernel: deliveries
stopped until the producer did (measured: 30k msg/s accepted, 0 delivered for 4 s). So one
call handles at most ``EVENTS_PER_TURN`` events; when frames remain, reading this socket is
paused and the rest is handled in a ``call_soon`` callback (likewise after TURN_SECONDS), after the other ready sockets had
their turn. Nothing more is read from this peer until its buffered frames are handled, which
also bounds the input buffer (a publisher is throttled by TCP, as RabbitMQ's credit flow does).

Turns of that size still made a light connection wait: a prefetch-1 consumer's ack sat in the
kernel behind the flood's publisher turn and its consumer's turn, about 6-16 ms a delivery, where
RabbitMQ's per-connection reader processes take it up at once (1-2 ms). So connections that send
little (``LightPeers``: under LIGHT_EVENTS_PER_SECOND) are watched in an epoll set of their own,
and a busy connection's turn ends as soon as one of them has input, checked every
LIGHT_CHECK_SECONDS; the light one is then read in the same loop iteration. Busy turns that
only busy connections wait behind keep their full size, so throughput pays nothing for it.

The other way round, a busy publisher yields to busy consumers: after its turn it is neither
read nor handled while a consumer connection that the broker owes deliveries to (its queue
holds messages and waits for that consumer's credit, Broker.owed) has input unread, as long
as that input lets messages out, for YIELD_MAX_SECONDS at most. Those acks are what lets the
deliveries out, and every enqueue made before them is work taken from the deliveries (a
fan-out enqueued four copies for each one it delivered). It is the analogue of RabbitMQ's
credit flow, which holds a channel while the queue processes it feeds are behind. A consumer
whose socket is quiet (slow, stuck, or light) holds nobody.

Back-pressure runs both ways: the socket's ``pause_writing``/``resume_writing`` stop and
restart deliveries to this connection (a slow consumer), and while a resource alarm is in
effect (W5, gateway/alarms.py) a connection that publishes, or is in the middle of sending a
content body, is sent ``connection.blocked`` and no longer read from, until
``connection.unblocked``. The memory mark is checked after every read turn, not only by the
tick, so that a large body is stopped as it arrives.

Heartbeats, the handshake deadline (SE4) and close timeouts are driven by one periodic ``tick``
from the server for every connection, not a timer per connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import select
import socket
import struct
import time
from typing import TYPE_CHECKING, Any, cast

from gateway.admission import tcp_keepalive
from gateway.auth import AuthError, UserDB
from gateway.memory import HELD
from gateway.protocol import events as ev
from gateway.protocol import fastpath
from gateway.protocol.connection import ConnState, ServerConnection
from gateway.protocol.sasl import EXTERNAL, offered

if TYPE_CHECKING:
    from gateway.broker import Session

__all__ = ["AMQPConnection", "ClientProtocol", "is_loopback"]

log = logging.getLogger("cmq_gateway.transport")

# A peer that neither answers our connection.close nor hangs up is cut after this long.
CLOSE_TIMEOUT = 3.0
# After close-ok to the peer's connection.close, the peer closes the socket (a client that
# is still writing would get EPIPE if we did, and some wait for the EOF they cause); one that
# does not is cut after this long, or after its heartbeat interval if shorter (rabbit_reader's
# CLOSING_TIMEOUT).
LINGER_TIMEOUT = 30.0
_CONTENT, _METHOD = ev.Content, ev.Method
_OPEN = ConnState.OPEN
_ACK_T = fastpath.Ack
ACK_FRAME = fastpath.ACK_FRAME
# A run of a consumer's acks (fastpath.ack_run) is taken without the loop's time checks in
# between: short enough that a light connection still waits about one check interval
# (LIGHT_CHECK_SECONDS) at most, long enough to take a batch's acks in a few calls.
ACK_RUN_MAX = 32
_CHANNEL_EVENTS = frozenset((ev.ChannelOpen, ev.ChannelClose, ev.ChannelCloseOk, ev.ChannelFlow, ev.Method,
                             ev.Content))
# Events (a publish is one) handled per loop turn before the other connections get theirs,
# and the time a turn may take: a publish to a fanout of 50 queues is 50 enqueues, and 256 of
# them held the loop for a second while the consumers' acks waited (scenario 3).
EVENTS_PER_TURN = 256
TURN_SECONDS = 0.005
# Light connections (see the module docstring): fewer events a second than this, measured over
# LIGHT_WINDOW_SECONDS. A consumer acking 1,000 deliveries a second is busy; one with prefetch 1
# and 10 ms of work per message (~100 acks a second) is light.
LIGHT_EVENTS_PER_SECOND = 500
LIGHT_BYTES_PER_WINDOW = 1 << 16  # a few large messages are not light: their bodies take turns
LIGHT_WINDOW_SECONDS = 0.5
LIGHT_CHECK_SECONDS = 0.00025
# Publisher flow control, as RabbitMQ's credit flow: a publishing connection is not read from
# while the store holds more than FLOW_HIGH writes it has not yet acknowledged (a JetStream
# store: its PubAcks lag), and is read again below FLOW_LOW. Unlike W5 nothing is sent to the
# client: a producer without confirms otherwise fills the gateway's memory and takes the CPU
# its deliveries need (docs/CLUSTER.md). The embedded store acknowledges in the same turn.
FLOW_HIGH = 8192
FLOW_LOW = 4096
FLOW_CHECK_SECONDS = 0.002
# The longest a busy publisher yields to owed consumers at a time (the module docstring;
# docs/BENCHMARKS.md, scenario 3): a publisher moves however its consumers behave.
YIELD_MAX_SECONDS = 0.05
# Connections that asked for a flush (ClientProtocol.request_flush) since the last read turn
# ended: written at the end of that turn (flush_requested), not a loop iteration later.
_requested: list[ClientProtocol] = []


class LightPeers:
    """The sockets of the light connections, in an epoll set of their own: one ``poll(0)``
    says whether any of them has input waiting, whatever their number. A connection leaves the
    set while its reading is paused, so a socket nobody reads never ends other turns. The
    gateway's second set (``consumer_peers``) holds the busy consumers for owed_input_waiting,
    from their first busy turn until they are gone; that function skips the paused ones."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._members: dict[int, object] = {}  # fd -> the connection registered with it

    def add(self, conn: object, fd: int) -> None:
        if self._epoll is None:
            return
        try:
            if fd in self._members:  # a closed socket's fd, reused (epoll dropped the old one)
                self._epoll.modify(fd, select.EPOLLIN)
            else:
                self._epoll.register(fd, select.EPOLLIN)
        except OSError:
            try:
                self._epoll.register(fd, select.EPOLLIN)
            except OSError:
                return  # closed under us: it takes no part
        self._members[fd] = conn

    def discard(self, conn: object, fd: int) -> None:
        if self._members.get(fd) is not conn:
            return
        del self._members[fd]
        assert self._epoll is not None
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass  # the socket is closed already, which removed it from the set

    def waiting(self) -> bool:
        """Has any light connection input the kernel holds for it?"""
        return bool(self._members) and bool(self._epoll.poll(0, 1))  # type: ignore[union-attr]

    def readable(self, limit: int = 64) -> list[Any]:
        """The members (at most ``limit``) whose input the kernel holds."""
        if not self._members:
            return []
        members = self._members
        return [members[fd] for fd, _ in self._epoll.poll(0, limit) if fd in members]  # type: ignore[union-attr]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._members.clear()


def flush_requested(gw: Any) -> None:
    """Write now what the connections of ``gw`` were asked to flush (a delivery that a read
    turn's publish or ack caused): at the end of that turn, after its audit hand-off, rather
    than in their ``call_soon`` a loop iteration later, behind the rest of this turn and every
    other socket the loop's poll returned with it (scenario 7's latency). Still one write per
    connection per turn. Entries of another gateway are left to their ``call_soon``."""
    pending = _requested[:]
    _requested.clear()
    for conn in pending:
        if conn._flush_scheduled and conn.gw is gw:
            try:
                conn._flush()
            except Exception:  # that connection's, as in its call_soon: not the reader's
                log.exception("flush failed on connection %s", conn.peer)


def owed_input_waiting(gw: Any, publisher: Any) -> bool:
    """Has a busy consumer connection, that the broker owes deliveries to (Broker.owed), input
    the kernel holds for it and this loop iteration will read? (YIELD_MAX_SECONDS)"""
    owed = gw.broker.owed
    if not owed:
        return False
    for conn in gw.consumer_peers.readable():
        # Held itself (W5, flow, yielding) it is not read: waiting for it would hold for nothing.
        if conn is publisher or not conn._busy or conn._reading_paused and not conn._backlog:
            continue
        session = conn.session
        if session is None:
            continue
        for ch in session.channels.values():
            for c in ch.consumers.values():
                if c.queue in owed:
                    return True
    return False


def is_loopback(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))


class ClientProtocol(asyncio.Protocol):
    """What every client protocol shares (AMQP here, MQTT in gateway.mqtt): taking the
    socket (peer name, loopback, the server's set of connections), one write per loop
    iteration of what the sans-IO core queued, the socket's back-pressure passed to the broker
    session, and the unsent bytes counted as held memory (W5). Subclasses set ``gw``, ``conn``
    (the core), ``session``, ``_lost`` and ``_flush_scheduled``, and say what happens once the
    core has closed."""

    gw: Any
    conn: Any
    transport: asyncio.Transport | None
    session: Any
    _lost: bool
    _flush_scheduled: bool
    peer: str
    from_loopback: bool

    def _take(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        if peername:
            host, port = peername[0], peername[1]
            self.peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            self.from_loopback = is_loopback(host)
        self.gw.connections.add(self)

    def write_buffer_size(self) -> int:
        """Bytes written to the socket and not yet sent (W5: held memory)."""
        transport = self.transport
        return 0 if transport is None or self._lost else transport.get_write_buffer_size()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.pause_delivery()

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.resume_delivery()

    def request_flush(self) -> None:
        """Given to the Session: one write at the end of the read turn that asked for it
        (flush_requested), or of this loop iteration when no read turn is under way."""
        if not self._flush_scheduled and not self._lost:
            self._flush_scheduled = True
            _requested.append(self)
            asyncio.get_running_loop().call_soon(self._flush_if_requested)

    def _flush_if_requested(self) -> None:
        # Every read turn of this loop iteration is over by now, so what _requested still holds
        # is written by its own call_soon: forgotten here, it cannot grow while no AMQP read
        # turn comes (deliveries to no-ack consumers of MQTT or CMQ API publishers, timers).
        _requested.clear()
        if self._flush_scheduled:  # else flush_requested wrote it already
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._lost or self.transport is None:
            return
        out = self.conn.data_to_send()
        if out:
            # A5: a delivery among these bytes has its records out of this process first, so
            # a kill -9 from here on cannot take the records of what the client got.
            if not self.gw.broker.audit_handoff():
                # A stop, while the audit writer waits for room on a full disk: the client
                # gets nothing whose records are still here, and the stop goes on.
                self.transport.abort()
                return
            self.gw.bytes_out += len(out)
            self.transport.write(out)
        if self.conn.closed:
            self._core_closed()

    def _core_closed(self) -> None:
        raise NotImplementedError


class AMQPConnection(ClientProtocol):
    """The transport for one client. ``gateway`` is the server's shared state (see server.py)."""

    def __init__(self, gateway: Any) -> None:
        self.gw = gateway
        limits = gateway.config.limits
        self.conn = ServerConnection(server_properties=gateway.server_properties,
                                     frame_max=limits.frame_max, channel_max=limits.channel_max,
                                     heartbeat=limits.heartbeat, max_message_size=limits.max_message_size,
                                     handshake_timeout=limits.handshake_timeout)
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.peer = "?"
        self.from_loopback = False
        self.user: str | None = None
        self.vhost: str | None = None
        self.client_properties: dict[str, Any] = {}
        self.tls = False  # came in on an AMQPS listener (SE2)
        self.cert_user: str | None = None  # named by a verified client certificate: EXTERNAL
        self.tls_info: dict[str, Any] = {}  # the management API's ssl_* fields (gateway/tls.py)
        self.opened_at = time.monotonic()
        self.closing_since: float | None = None  # when we sent connection.close
        self._close_audited = False  # the connection_close record was written already
        self.lingering_since: float | None = None  # when we sent close-ok to the peer's close
        self.publisher = False  # has published: subject to W5 blocking
        self.blocked = False  # connection.blocked was sent / reading paused
        self._flow = False  # not read while the store's unacknowledged writes are many
        self._yielding = False  # not read nor handled while owed consumers' input waits
        self._yield_since = 0.0
        self._yield_mark = 0  # broker.dispatches_out at the last look (_yield_check)
        self.flow_at = -1e9  # time.monotonic() of its last hold (_flow, _yielding): "flow" in the API
        self._owed_watch = False  # in gw.consumer_peers (has had a consumer)
        self._reading_paused = False  # transport.pause_reading() is in effect
        self._backlog = False  # frames left in the core's buffer: handled in a later turn
        self._flush_scheduled = False
        self._lost = False
        self._partial = 0  # partial body bytes counted in HELD (W5)
        self._fd = -1  # the socket's, for LightPeers
        self._light = False  # in gw.light_peers
        self._busy = False  # sent LIGHT_EVENTS_PER_SECOND or more in its last window
        self._window_events = 0
        self._window_bytes = 0
        self._window_start = time.monotonic()
        self._gate: Any = None  # the listener's admission gate (SE5), once admitted

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        admission = getattr(self.gw, "admission", None)
        if admission is not None and self._gate is None:  # SE5: the listener's limit and the descriptors' reserve
            gate = admission.gate("amqps" if ssl_object is not None else "amqp")
            if not gate.enter():
                from gateway.admission import refuse

                self._lost = True
                refuse(transport)
                return
            self._gate = gate
        # SE5: a client that asked for no heartbeats (heartbeat 0) and vanished without a FIN
        # would hold its socket, channels and unacked deliveries forever; the kernel's
        # keep-alive probes find it within about 2 minutes, and a live idle client never notices.
        tcp_keepalive(transport)
        self._take(transport)
        if ssl_object is not None:  # the TLS handshake is over: the peer's certificate is known
            from gateway.tls import connection_info, peer_username

            self.tls = True
            self.tls_info = connection_info(ssl_object)
            tls = self.gw.config.tls
            self.cert_user = peer_username(ssl_object, tls.ssl_cert_login_from if tls else "distinguished_name")
            self.conn.mechanisms = offered(external=self.cert_user is not None)
        self.conn.tick(time.monotonic())  # starts the core's handshake deadline (SE4)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()
        self._sync_light()

    def data_received(self, data: bytes) -> None:
        self.gw.bytes_in += len(data)
        self._window_bytes += len(data)
        self.conn.receive_data(data)
        if self._yielding:  # _yield_check handles it
            self._backlog = True
        elif not self._backlog:  # else a turn is already scheduled and reading paused
            self._process()

    def _process(self) -> None:
        """Handle at most EVENTS_PER_TURN events; schedule the rest for a later turn."""
        more = False
        budget = EVENTS_PER_TURN
        if not self._lost:
            conn = self.conn
            next_event = conn.next_event
            fast_event = fastpath.fast_event
            ack_run = fastpath.ack_run
            dispatch = self._dispatch
            clock = time.perf_counter
            start = clock()
            deadline = start + TURN_SECONDS
            # A light connection's own turns are short; a busy one looks for light input.
            check_at = deadline if self._light else start
            light_waiting = self.gw.light_peers.waiting
            broker = self.gw.broker
            broker.begin_batch()  # deliveries caused by this turn: one dispatch per queue
            try:
                while not self._lost:
                    # next_event's first step (a publish or an ack, well-formed and whole),
                    # without its frame: two a message.
                    got = fast_event(conn._in, conn._pos, conn.frame_max, conn.max_message_size,
                                     conn._channels) if conn.state is _OPEN else None
                    if got is not None:
                        event, conn._pos = got
                    else:
                        event = next_event()
                        if event is None:
                            break
                    kind = type(event)
                    # Every message's publish and ack go straight to the session (what
                    # _dispatch does for them, without its frame: two a message).
                    if (kind is _CONTENT or kind is _METHOD) and self.session is not None:
                        if kind is _CONTENT:
                            self.publisher = True
                        self.session.on_event(event)
                        if got is not None and kind is _METHOD and budget > 1 and conn.state is _OPEN \
                                and type(event.method) is _ACK_T:
                            # The plain acks right behind this one, on its channel, in one
                            # call (Session.on_acks; ACK_FRAME octets each), each an event
                            # of this turn's budget; what it leaves is read as before.
                            tags = ack_run(conn._in, conn._pos, event.channel, conn.frame_max,
                                           ACK_RUN_MAX if budget > ACK_RUN_MAX else budget - 1)
                            if tags is not None:
                                taken = self.session.on_acks(event.channel, tags)
                                conn._pos += ACK_FRAME * taken
                                budget -= taken
                    else:
                        dispatch(event)
                    budget -= 1
                    if not budget:
                        more = True
                        break
                    now = clock()
                    if now >= check_at:
                        if now >= deadline or light_waiting():
                            more = True
                            break
                        check_at = now + LIGHT_CHECK_SECONDS
            except Exception:  # a bug below us must not take the event loop down with it
                log.exception("internal error on connection %s", self.peer)
                self._force_close(541, "INTERNAL_ERROR - internal error")
                more = False
            finally:
                try:
                    broker.end_batch()
                except Exception:
                    log.exception("dispatch failed after a read from %s", self.peer)
            # A5's hand-off of this turn's audit records, by the turn that made them: a flood
            # that writes nothing back otherwise left hundreds of them to the next connection
            # with bytes to send, and a light consumer's reply waited milliseconds behind them.
            broker.audit_handoff()
            if _requested:
                flush_requested(self.gw)
        self._flush()
        if self._lost:
            return
        self._count_partial()
        self._measure(EVENTS_PER_TURN - budget, more)
        gw = self.gw
        if gw.memory_over():
            gw.check_alarms()
        if self.publisher and gw.blocked and not self.blocked:
            self._block()
        if self.publisher and not self._flow and gw.broker.write_backlog() > FLOW_HIGH:
            self._flow = True
            self.flow_at = time.monotonic()
            self._sync_reading()
            asyncio.get_running_loop().call_later(FLOW_CHECK_SECONDS, self._flow_check)
        if self.publisher and self._busy and not self._yielding and owed_input_waiting(gw, self):
            self._yielding = True
            self._yield_since = time.perf_counter()
            self._yield_mark = -1  # the first look asks no progress: the consumers may not have been read yet
            self.flow_at = time.monotonic()
            self._sync_reading()
            asyncio.get_running_loop().call_soon(self._yield_check)
        if more:
            if not self._backlog:
                self._backlog = True
                self._sync_reading()
            if not self._yielding:
                asyncio.get_running_loop().call_soon(self._process)
        elif self._backlog:
            self._backlog = False
            self._sync_reading()

    def _yield_check(self) -> None:
        """Once a loop iteration while yielding (YIELD_MAX_SECONDS): go on yielding while the
        owed consumers' input lets messages out, or take the turn. A consumer connection that
        talks without letting anything out (it publishes too, say, while its own consumer waits
        on a long task) holds a publisher for an iteration or two, not YIELD_MAX_SECONDS."""
        if self._lost:
            return
        broker = self.gw.broker
        out = broker.dispatches_out
        if out != self._yield_mark and time.perf_counter() - self._yield_since < YIELD_MAX_SECONDS \
                and owed_input_waiting(self.gw, self):
            self._yield_mark = out
            asyncio.get_running_loop().call_soon(self._yield_check)
            return
        self._yielding = False
        self._sync_reading()
        if self._backlog:
            self._process()

    def _flow_check(self) -> None:
        if self._lost:
            return
        if self.gw.broker.write_backlog() > FLOW_LOW:
            asyncio.get_running_loop().call_later(FLOW_CHECK_SECONDS, self._flow_check)
            return
        self._flow = False
        self._sync_reading()

    def _sync_reading(self) -> None:
        """Read from the socket unless blocked (W5), held by flow control, or frames are
        still buffered."""
        want_paused = self.blocked or self._backlog or self._flow or self._yielding
        if want_paused == self._reading_paused or self.transport is None or self._lost:
            return
        self._reading_paused = want_paused
        if want_paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()
        self._sync_light()

    def _measure(self, events: int, more: bool) -> None:
        """Count this turn's events towards the connection's rate; a turn that could not
        handle all its input, or many bytes, make it busy at once."""
        self._window_events += events
        now = time.monotonic()
        elapsed = now - self._window_start
        if more or self._window_bytes > LIGHT_BYTES_PER_WINDOW:
            busy = True
        elif elapsed >= LIGHT_WINDOW_SECONDS:
            busy = self._window_events >= LIGHT_EVENTS_PER_SECOND * elapsed
        else:
            return
        if elapsed >= LIGHT_WINDOW_SECONDS:
            self._window_events = self._window_bytes = 0
            self._window_start = now
        if busy and not self._owed_watch and self.session is not None and self._fd >= 0 \
                and any(ch.consumers for ch in self.session.channels.values()):
            # A busy consumer: publishers yield to its input while it is owed deliveries
            # (owed_input_waiting). It stays in the set until it is gone.
            self._owed_watch = True
            self.gw.consumer_peers.add(self, self._fd)
        if busy != self._busy:
            self._busy = busy
            self._sync_light()

    def _sync_light(self) -> None:
        want = not (self._busy or self._reading_paused or self._lost or self._fd < 0)
        if want != self._light:
            self._light = want
            if want:
                self.gw.light_peers.add(self, self._fd)
            else:
                self.gw.light_peers.discard(self, self._fd)

    def _count_partial(self) -> None:
        """W5: the body bytes of contents still arriving are held memory, and a connection
        sending one is a publisher (blocked by an alarm in the middle of its body)."""
        partial = self.conn.partial_body_bytes()
        if partial != self._partial:
            HELD.partial += partial - self._partial
            self._partial = partial
            if partial:
                self.publisher = True

    def eof_received(self) -> bool | None:
        return None  # let asyncio close the transport; connection_lost cleans up

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self.gw.connections.discard(self)
        if self._owed_watch:
            self._owed_watch = False
            self.gw.consumer_peers.discard(self, self._fd)
        if self._gate is not None:
            self._gate.leave()
            self._gate = None
        self._sync_light()
        HELD.partial -= self._partial  # a body that never finished is let go
        self._partial = 0
        if self.session is not None:
            try:
                self.session.on_connection_lost()
            except Exception:
                log.exception("session cleanup failed for %s", self.peer)
            self.session = None
        if self.user is not None and not self._close_audited:
            self.gw.audit.emit("connection_close", self.vhost or "/", user=self.user, peer=self.peer,
                               reason="closed" if exc is None else str(exc))

    # -- writes -----------------------------------------------------------------------------

    def _core_closed(self) -> None:
        if self.lingering_since is None:  # after our close-ok the peer hangs up (tick cuts it)
            self._hang_up()

    # -- events -----------------------------------------------------------------------------

    def _dispatch(self, event: object) -> None:
        kind = type(event)
        if kind is ev.Content or kind in _CHANNEL_EVENTS:  # one test on the hot path
            if self.session is None:  # the core lets no channel frame through before open
                return
            if kind is ev.Content:
                self.publisher = True
            self.session.on_event(event)
        elif isinstance(event, ev.ProtocolHeaderOK):
            pass  # the core has queued connection.start
        elif isinstance(event, ev.StartOk):
            self._on_start_ok(event)
        elif isinstance(event, ev.TuneOk):
            pass  # the core applies the negotiated values
        elif isinstance(event, ev.ConnectionOpen):
            self._on_open(event)
        elif isinstance(event, ev.ProtocolError):
            # The core has queued connection.close; tick cuts the peer if close-ok never comes.
            log.info("protocol error from %s: %s %s", self.peer, event.reply_code, event.reply_text)
            if self.closing_since is None:
                self.closing_since = time.monotonic()
        elif isinstance(event, ev.HeartbeatTimeout):
            log.info("heartbeat timeout from %s", self.peer)
        elif isinstance(event, ev.HandshakeTimeout):
            self._on_handshake_timeout(event)
        elif isinstance(event, ev.ConnectionClose):
            self._linger()
        # ConnectionCloseOk, BadProtocolHeader (W6) and HeartbeatTimeout leave the core
        # CLOSED: _flush() writes what it queued and hangs up.

    def _linger(self) -> None:
        """The peer closed the connection: the session ends now (its exclusive queues go, as
        RabbitMQ deletes them before close-ok), the socket when the peer hangs up (tick)."""
        self.lingering_since = time.monotonic()
        if self.session is not None:
            try:
                self.session.on_connection_lost()
            finally:
                self.session = None

    def _on_handshake_timeout(self, event: ev.HandshakeTimeout) -> None:
        limit = self.conn.handshake_timeout
        reason = f"handshake_timeout: not open after {limit:g} s (state {event.state})"
        log.info("closing connection %s: %s", self.peer, reason)
        self.gw.audit.emit("connection_close", self.conn.vhost or "/", user=self.user, peer=self.peer,
                           reason=reason)
        self._close_audited = True
        # RabbitMQ sends nothing and resets the socket (rabbit_net:fast_close); so do we.
        self._reset()

    def _on_start_ok(self, event: Any) -> None:
        self.client_properties = dict(event.client_properties or {})
        users: UserDB = self.gw.config.users
        external = event.mechanism == EXTERNAL and self.cert_user is not None
        try:
            if external:
                assert self.cert_user is not None
                user = users.authenticate_external(self.cert_user, from_loopback=self.from_loopback)
            else:
                user = users.authenticate(event.mechanism, event.response, from_loopback=self.from_loopback)
        except AuthError as e:
            attempted = self.cert_user if external else _attempted_user(event)
            # The client is told "see the broker logfile", as RabbitMQ words it: say it here.
            log.warning("login refused: user %r, mechanism %s, from %s: %s", attempted, event.mechanism,
                        self.peer, e.cause)
            self.gw.audit.emit("auth_failure", "/", peer=self.peer, reason=f"{e.cause}: {e}", user=attempted)
            # W2: authentication_failure_close — a 403 connection.close, not a silent hang-up.
            self._force_close(403, f"ACCESS_REFUSED - {e}")
            return
        self.user = user.name
        self.conn.send_tune()

    def _on_open(self, event: Any) -> None:
        vhost = event.vhost or "/"
        assert self.user is not None
        if self.gw.config.users.vhost_permission(self.user, vhost) is None:
            self.gw.audit.emit("auth_failure", vhost, peer=self.peer, user=self.user,
                               reason="vhost access refused")
            self._force_close(530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{self.user}'")
            return
        self.vhost = vhost
        from gateway.broker import Session

        self.session = Session(self.gw.broker, self.conn, vhost, self.user, self.peer, self.request_flush)
        self.conn.send_open_ok()
        self.gw.audit.emit("connection_open", vhost, user=self.user, peer=self.peer,
                           conn=str(self.client_properties.get("connection_name", "")) or None)

    # -- closing ----------------------------------------------------------------------------

    def _force_close(self, reply_code: int, reply_text: str) -> None:
        """Send connection.close and wait (bounded by tick) for close-ok."""
        if self.closing_since is not None:
            return
        self.closing_since = time.monotonic()
        try:
            self.conn.close(reply_code, reply_text)
        except Exception:
            log.exception("could not queue connection.close for %s", self.peer)
            self._abort()

    def close_for_shutdown(self) -> None:
        """Graceful shutdown: 320 CONNECTION_FORCED, as RabbitMQ does on stop."""
        self.close_forced("shutdown")

    def close_forced(self, reason: str) -> None:
        """320 CONNECTION_FORCED with RabbitMQ's wording (shutdown, a deleted user or vhost)."""
        if self.lingering_since is not None:
            self._hang_up()  # the peer had closed already; it need not be waited for now
            return
        self._force_close(320, f"CONNECTION_FORCED - broker forced connection closure with reason '{reason}'")
        self._flush()

    def _hang_up(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # close() writes what is buffered first

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _reset(self) -> None:
        """Abort with an RST rather than a FIN (SO_LINGER 0), as RabbitMQ's fast_close."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass  # already gone: the abort below is all that is left to do
        self._abort()

    # -- periodic ---------------------------------------------------------------------------

    def tick(self, now_monotonic: float) -> None:
        """Called about once a second by the server for every connection."""
        if self._lost:
            return
        if self.closing_since is not None and now_monotonic - self.closing_since > CLOSE_TIMEOUT:
            self._abort()
            return
        if self.lingering_since is not None:
            heartbeat = self.conn.heartbeat
            limit = heartbeat if 0 < heartbeat < LINGER_TIMEOUT else LINGER_TIMEOUT
            if now_monotonic - self.lingering_since > limit:
                self._hang_up()
            return
        if self.blocked or self._flow:
            if self._peer_hung_up():
                self._abort()  # what it held (a partial body) is let go in connection_lost
                return
            self.conn.reading_paused()
        for event in self.conn.tick(now_monotonic):
            self._dispatch(event)
        self._flush()

    def _peer_hung_up(self) -> bool:
        """A blocked connection is not read from, so its peer's FIN goes unseen (and its
        heartbeats do not count): ask the kernel instead (POLLRDHUP is set even while
        unread bytes wait), so that a dead publisher does not hold its memory for ever."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not hasattr(select, "POLLRDHUP"):
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        return bool(poller.poll(0))

    def set_blocked(self, blocked: bool) -> None:
        """W5: the gateway crossed its high-water mark (True) or dropped below it (False)."""
        if blocked and self.publisher and not self.blocked:
            self._block()
        elif not blocked and self.blocked:
            self.blocked = False
            self.conn.send_unblocked()
            self._sync_reading()
            self._flush()

    def _block(self) -> None:
        self.blocked = True
        self.conn.send_blocked(self.gw.block_reason)
        self._sync_reading()
        self._flush()


def _attempted_user(event: Any) -> str | None:
    from gateway.auth import parse_response

    try:
        return parse_response(event.mechanism, event.response)[0]
    except AuthError:
        return None
