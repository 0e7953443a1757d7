"""SE5: one admission policy for every listener (AMQP, AMQPS, MQTT, MQTTS, the management
API, /metrics, the CMQ API).

* A login deadline counted from accept: ``limits.handshake_timeout`` (10 s, RabbitMQ's) for
  AMQP (the core's handshake deadline) and MQTT (CONNECT answered), whatever the client
  trickles meanwhile.
* HTTP: from accept, or from the end of the previous response (an idle keep-alive socket),
  a request's headers must be complete within ``limits.http_idle_timeout``, and its body
  read within ``limits.http_body_timeout`` of them; a silent or trickling socket is closed
  then (the handlers themselves, a CMQ long poll, are not timed). The headers may be at most
  ``limits.preauth_bytes``.
* A connection limit per listener (``limits.max_connections``, 0: none) and descriptors held
  in reserve: when fewer than ``limits.fd_reserve`` descriptors of the process's
  RLIMIT_NOFILE are free, a listener that holds ``fd_reserve // 4`` sockets or more takes no
  more (new ones are closed at once), so that a flood of one listener leaves descriptors
  for the others (AMQP logins keep working while 1,100 silent sockets knock on the CMQ API);
  below ``fd_reserve // 8`` free, no listener takes one (the store's files need them).
* Bytes received before login are capped per connection (``limits.preauth_bytes``: an MQTT
  CONNECT, HTTP headers) and, with HTTP request bodies until their handler is done, counted
  as held memory (``HELD.partial``), which the memory alarm watches. The management API
  decides the login on the headers, before any body (``BEFORE_BODY``); the CMQ API cannot
  (its signature is in the body), so the bodies one listener receives at once are capped at
  a quarter of the memory mark: sockets sending big bodies slowly cannot raise the alarm
  that would block every publisher (503 past the cap, one body always taken).

``Admission`` is one per gateway (``gw.admission``); ``Gate`` one per listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.memory import HELD

__all__ = ["BEFORE_BODY", "Admission", "Gate", "HttpPolicy", "TlsListener", "audit_http_login", "http_peer",
           "publishers_held", "serve_http", "tcp_keepalive"]

log = logging.getLogger("cmq_gateway.admission")

# How often the process's open descriptors are counted (/proc/self/fd), when far from the
# reserve and when near it: counting 10^4 descriptors takes a few milliseconds.
_RECOUNT_FAR, _RECOUNT_NEAR = 30.0, 0.5
# Every listener's accept queue (AMQP, MQTT, HTTP; plain and TLS). asyncio's default is 100,
# RabbitMQ's 128: a reconnect storm of a fleet (hundreds of clients at once after a restart)
# overflowed it, and each dropped SYN cost its client a second's retransmit; the kernel caps
# it at net.core.somaxconn (4096 here).
LISTEN_BACKLOG = 1024

_REFUSED_HTTP = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


_said: dict[str, tuple[float, int]] = {}  # what was said last, when, and how often since


def _note(what: str, text: str, *args: Any) -> None:
    """One INFO line per ``what`` every 10 s at most, with how many it stands for: a flood of
    bad requests must not become a flood of log lines."""
    now = time.monotonic()
    last, since = _said.get(what, (0.0, 0))
    if now - last < 10:
        _said[what] = (last, since + 1)
        return
    _said[what] = (now, 0)
    log.info(text + (f" (and {since} more like it in the last 10 s)" if since else ""), *args)


class _BadRequests(logging.Filter):
    """aiohttp logs every request it cannot parse (400, 431...) with a traceback at ERROR:
    a client's fault, said in one rate-limited INFO line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            _note("bad request", "bad HTTP request from %s: %s", peer, str(exc).splitlines()[0][:200])
            return False
        return True


_server_log = logging.getLogger("cmq_gateway.http")
_server_log.addFilter(_BadRequests())


def _open_descriptors() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return None


class Admission:
    """The gates of one gateway and the descriptor reserve they share."""

    def __init__(self, limits: Any) -> None:
        self.max_connections = int(getattr(limits, "max_connections", 0) or 0)
        self.fd_reserve = int(getattr(limits, "fd_reserve", 256))
        self.gates: dict[str, Gate] = {}
        self._untracked: int | None = None  # open descriptors that are no gate's connection
        self._counted_at = 0.0
        self.refused = 0  # sockets closed at accept (metrics, notes)

    def gate(self, name: str) -> Gate:
        gate = self.gates.get(name)
        if gate is None:
            gate = self.gates[name] = Gate(self, name, self.max_connections)
        return gate

    def _tracked(self) -> int:
        return sum(g.count for g in self.gates.values())

    def free_descriptors(self) -> int | None:
        """RLIMIT_NOFILE's soft limit less the descriptors open (estimated between counts:
        the sockets of the gates change, the rest seldom); None when unknown or unlimited."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return None
        now = time.monotonic()
        tracked = self._tracked()
        if self._untracked is None or now - self._counted_at > (
                _RECOUNT_NEAR if soft - (self._untracked + tracked) < 4 * self.fd_reserve else _RECOUNT_FAR):
            found = _open_descriptors()
            if found is None:
                return None
            self._untracked, self._counted_at = max(0, found - tracked), now
        return soft - (self._untracked + tracked)

    def admit(self, gate: Gate) -> str:
        """"" when ``gate`` may take the socket just accepted (already open, not yet counted),
        else why not."""
        if gate.limit and gate.count >= gate.limit:
            return f"{gate.name}: max_connections {gate.limit} reached"
        reserve = self.fd_reserve
        if reserve <= 0:
            return ""
        free = self.free_descriptors()
        if free is None:
            return ""
        if free < max(1, reserve // 8):
            return f"{gate.name}: {free} descriptors free"
        if free < reserve and gate.count >= max(1, reserve // 4):
            return f"{gate.name}: {free} descriptors free, below fd_reserve {reserve}, and {gate.count} held here"
        return ""


class Gate:
    """One listener's count of open connections."""

    def __init__(self, admission: Admission, name: str, limit: int) -> None:
        self.admission = admission
        self.name = name
        self.limit = limit
        self.count = 0
        self.refused = 0
        self.bodies = 0  # HTTP: the announced sizes of the request bodies being received (SE5)
        self._said = 0.0

    def enter(self) -> bool:
        """Count a socket just accepted; False (not counted) when it must be closed now."""
        why = self.admission.admit(self)
        if why:
            self.refused += 1
            self.admission.refused += 1
            now = time.monotonic()
            if now - self._said > 10:  # a flood is one line every 10 s, not one a socket
                self._said = now
                log.warning("new connections refused on %s (%d so far)", why, self.refused)
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1


def refuse(transport: asyncio.BaseTransport) -> None:
    """Close a refused socket at once, with an RST: nothing of it is kept."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
    transport.abort()  # type: ignore[attr-defined]


class TlsListener:
    """A TLS listener whose sockets its gate counts from accept, before their handshake (as
    RabbitMQ's ranch does): accepted here, admitted or refused at once, and only then given
    to asyncio for the handshake (``connect_accepted_socket``), whose protocol arrives
    admitted (``_gate`` set: it leaves the gate at its end). ``create_server(ssl=...)`` tells
    a protocol of its socket only after the handshake, so sockets still in it escaped
    ``max_connections`` and the descriptor reserve. Quacks as the ``asyncio.Server`` the
    listeners keep (close, wait_closed, sockets)."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol], gate: Gate,
                 ssl_context: Any, timeout: float | None) -> None:
        self.sockets = [sock]
        self.factory = factory
        self.gate = gate
        self.ssl_context = ssl_context
        self.timeout = timeout or None
        self.handshakes: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        sock.listen(LISTEN_BACKLOG)  # as create_server would (a socket given to aiohttp is not listening yet)
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except (OSError, ValueError) as e:
                if sock.fileno() < 0:
                    return  # closed (a start that failed closes its sockets before stopping)
                # EMFILE and the like: as asyncio's own accept loop, wait a little
                _note("tls accept", "accept on %s failed: %r", self.gate.name, e)
                await asyncio.sleep(0.1)
                continue
            if not self.gate.enter():
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
                continue
            task = loop.create_task(self._handshake(conn))
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    async def _handshake(self, conn: socket.socket) -> None:
        def admitted() -> asyncio.Protocol:
            protocol = self.factory()
            protocol._gate = self.gate  # type: ignore[attr-defined]
            return protocol

        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                admitted, conn, ssl=self.ssl_context, ssl_handshake_timeout=self.timeout)
        except BaseException as e:  # a failed or timed-out handshake (or the listener closed)
            if not isinstance(e, asyncio.CancelledError):
                _note("tls handshake", "TLS handshake on %s failed: %r", self.gate.name, e)
            conn.close()
            self.gate.leave()
            if not isinstance(e, Exception):
                raise

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self.handshakes):
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._accepting

    def is_serving(self) -> bool:
        return not self._accepting.done()


# -- HTTP -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpPolicy:
    idle_timeout: float = 10.0  # accept / last response -> headers complete
    body_timeout: float = 10.0  # headers -> body read
    header_bytes: int = 65536  # the request line and headers, at most
    # The request bodies one listener receives at once (announced sizes), at most: a quarter
    # of the memory mark (0: no limit). One body is always taken when no other is.
    body_budget: int = 0

    @classmethod
    def of(cls, limits: Any) -> HttpPolicy:
        return cls(float(getattr(limits, "http_idle_timeout", 10.0)),
                   float(getattr(limits, "http_body_timeout", 10.0)),
                   int(getattr(limits, "preauth_bytes", 65536)),
                   int(getattr(limits, "memory_high_watermark", 0) or 0) // 4)


class _HttpGuard(asyncio.Protocol):
    """In front of aiohttp's RequestHandler: the gate, the headers' deadline and size, and the
    bytes of a request counted as held memory until its handler is done. aiohttp itself only
    times an idle connection whose request has not begun; a trickled request it waits for."""

    def __init__(self, inner: Any, gate: Gate, policy: HttpPolicy, guards: dict[Any, _HttpGuard]) -> None:
        self.inner = inner
        self.gate = gate
        self.policy = policy
        self.guards = guards
        self.transport: asyncio.Transport | None = None
        self.admitted = False
        self.busy = 0  # requests whose handler runs (the admission middleware entered)
        self.header_seen = False  # the end of this request's headers was received
        self.header_bytes = 0
        self.held = 0  # bytes counted in HELD.partial
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None
        self._unsent: int | None = None  # the answers' bytes buffered at the last look (_expire)
        self._resumed = False  # the transport resumed writing since that look
        # The logins audited on this connection (audit_http_login), closed with it.
        self.logins: dict[tuple[str, str], Callable[[], None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if getattr(self, "_gate", None) is None and not self.gate.enter():
            if transport.get_extra_info("ssl_object") is None:
                try:
                    transport.write(_REFUSED_HTTP)  # type: ignore[attr-defined]  # into the kernel's buffer: abort after it
                except Exception:  # noqa: BLE001 - refused either way
                    pass
            refuse(transport)
            return
        self.admitted = True
        self.transport = transport  # type: ignore[assignment]
        self.guards[self.inner] = self
        self._arm(self.policy.idle_timeout)
        self.inner.connection_made(transport)

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire) if seconds > 0 else None

    def _expire(self) -> None:
        self._timer = None
        transport = self.transport
        if transport is None or self.busy:
            return
        size = transport.get_write_buffer_size()
        if size:
            # A response still going out is not idle while the peer takes it: some of it left
            # (a smaller buffer, or writing resumed) since the last look. A peer that takes
            # nothing for a whole period is closed (RabbitMQ's ranch send_timeout, nginx's
            # send_timeout): else a client that never reads held its socket, and the answers
            # buffered for it, for ever, and a few of them filled max_connections.
            if self._unsent is None or self._resumed or size < self._unsent:
                self._unsent, self._resumed = size, False
                self._arm(self.policy.idle_timeout)
                return
            _note("unread", "HTTP answers on %s unread for %g s: closed", self.gate.name, self.policy.idle_timeout)
        transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        n = len(data)
        self.held += n
        HELD.partial += n
        if not self.header_seen and not self.busy:
            scan = self._tail + data
            end = scan.find(b"\r\n\r\n")
            if end < 0:
                self.header_bytes += n
                self._tail = scan[-3:]
            else:
                self.header_bytes += max(0, end + 4 - len(self._tail))
                self.header_seen = True
                self._tail = b""
            if self.header_bytes > self.policy.header_bytes:
                _note("431", "HTTP request headers over %d bytes on %s: closed", self.policy.header_bytes,
                      self.gate.name)
                self._let_go()
                assert self.transport is not None
                try:
                    self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                         b"Connection: close\r\nContent-Length: 0\r\n\r\n")
                finally:
                    self.transport.close()
                return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self._resumed = True
        if self.admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.gate.leave()
        self._let_go()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guards.pop(self.inner, None)
        self.transport = None
        logins, self.logins = self.logins, {}
        for closed in logins.values():
            closed()
        self.inner.connection_lost(exc)

    def _let_go(self) -> None:
        HELD.partial -= self.held
        self.held = 0

    # -- the middleware's side --------------------------------------------------------------

    def request_began(self) -> None:
        self.busy += 1
        self._unsent = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_ended(self) -> None:
        self.busy -= 1
        if self.busy:
            return
        self._let_go()  # what was read for it (headers, body) is the handler's no more
        self.header_seen = False
        self.header_bytes = 0
        self._tail = b""
        if self.transport is not None:
            self._arm(self.policy.idle_timeout)  # the keep-alive idle time starts now


async def _answer_and_close(request: web.Request, guard: _HttpGuard,
                            response: web.StreamResponse) -> web.StreamResponse:
    """Answer a request whose body is not read, and close its socket: aiohttp would wait for
    the rest of the body (its lingering read, 10 s) before it closes; the socket is closed
    here, the answer being in its buffer already."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    if guard.transport is not None:
        guard.transport.close()
    return response


def _middleware(guards: dict[Any, _HttpGuard], policy: HttpPolicy) -> Any:
    @web.middleware
    async def admission(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        guard = guards.get(request.protocol)
        if guard is None:
            return await handler(request)
        request[GUARD] = guard
        guard.request_began()
        reserved = 0
        try:
            before = request.app.get(BEFORE_BODY)
            if before is not None and request.body_exists:
                # SE5: the login (and the route's rule) is decided on the headers alone, so that
                # no body is read for a client that is not logged in: its bytes before login
                # stay within the headers' cap instead of a body's (held memory, W5).
                refused = await before(request)
                if refused is not None:  # the body is left unread: the connection goes with it
                    return await _answer_and_close(request, guard, refused)
            if request.body_exists and policy.body_budget > 0:
                # SE5/W5: bodies are held memory, and on the CMQ API (its signature is in the
                # body) they come before the caller is known: sockets that send big bodies
                # slowly would otherwise raise the memory alarm and block every publisher.
                size = request.content_length if request.content_length is not None else CHUNKED_BODY
                gate = guard.gate
                if gate.bodies and gate.bodies + size > policy.body_budget:
                    _note("503 bodies", "HTTP request bodies over %d bytes at once on %s: refused",
                          policy.body_budget, gate.name)
                    busy = web.Response(status=503, text="too many request bodies at once, send again later\n",
                                        headers={"Retry-After": "1"})
                    return await _answer_and_close(request, guard, busy)
                gate.bodies += size
                reserved = size
            if request.body_exists and policy.body_timeout > 0:
                # The body is read here, within its deadline, and kept by aiohttp for the
                # handler's own read()/json(): a trickled body cannot hold the socket.
                try:
                    async with asyncio.timeout(policy.body_timeout):
                        await request.read()
                except TimeoutError:
                    _note("408", "HTTP request body not read within %g s: closed", policy.body_timeout)
                    late = web.Response(status=408, text="request body not received in time\n")
                    return await _answer_and_close(request, guard, late)
            return await handler(request)
        finally:
            guard.gate.bodies -= reserved
            guard.request_ended()
    return admission


# SE5: TCP keep-alive on a client socket whose protocol may switch its own off (MQTT keep
# alive 0): a peer gone without a FIN (power lost, a NAT's state dropped) is found by the
# kernel after KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES seconds (2 minutes),
# instead of holding its socket, its session and a descriptor forever.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES = 60, 10, 6


def tcp_keepalive(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                            ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def publishers_held(gateway: Any) -> str:
    """SE6: why the resource alarms hold publishers now ("" when they do not): W5's memory or
    disk alarm, or the memory mark passed since the last tick, as the AMQP transport checks
    it after each read. For the publishers of the HTTP APIs, which have no socket to stop
    reading: they are refused instead (CMQ API 4410, management API 503)."""
    if gateway is None or not hasattr(gateway, "alarms"):
        return ""
    alarms = gateway.alarms
    if alarms.memory or alarms.disk:
        return str(alarms.reason)
    return "low on memory" if gateway.memory_over() else ""


CHUNKED_BODY = 1 << 20  # what a body of unannounced size (chunked) is counted as


GUARD: web.RequestKey[_HttpGuard] = web.RequestKey("admission_guard", _HttpGuard)


def http_peer(request: web.Request) -> str:
    """The client's "host:port" ("[v6]:port"), as the AMQP transport names its peer."""
    host = request.remote or ""
    peername = request.transport.get_extra_info("peername") if request.transport is not None else None
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"[{host}]:{peername[1]}" if ":" in host else f"{host}:{peername[1]}"
    return host


def audit_http_login(request: web.Request, audit: Any, *, user: str, vhost: str, protocol: str) -> None:
    """A/SE5: a successful login over HTTP is audited as AMQP's and MQTT's are, once per TCP
    connection and user: ``connection_open`` at the first request it authenticates, and
    ``connection_close`` when the socket closes (a keep-alive client polling the API every
    few seconds writes two records, not one per request). ``protocol`` says which API."""
    guard = request.get(GUARD)
    key = (user, vhost)
    if guard is None or key in guard.logins:
        return  # not served by serve_http (an application under test): no socket to pair with
    peer = http_peer(request)
    local = request.transport.get_extra_info("sockname") if request.transport is not None else None
    here = f"{local[0]}:{local[1]}" if isinstance(local, tuple) and len(local) >= 2 else "?"
    fields = {"user": user, "peer": peer, "conn": f"{peer} -> {here}", "protocol": protocol}
    audit.emit("connection_open", vhost, **fields)
    guard.logins[key] = lambda: audit.emit("connection_close", vhost, reason="closed", **fields)


# An application's check of a request on its headers alone, before its body is read (the
# management API's login and authorization): a response refuses the request, None lets it in.
BEFORE_BODY: web.AppKey[Callable[[web.Request], Awaitable[web.StreamResponse | None]]] = web.AppKey("before_body")


class _GuardedSite(web.SockSite):
    """aiohttp's SockSite, each connection's protocol behind an _HttpGuard, and the TLS
    handshake timed as on the AMQPS port (aiohttp's default: 60 s)."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, *, ssl_context: Any,
                 factory: Callable[[], asyncio.Protocol], handshake_timeout: float | None, gate: Gate) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context, backlog=LISTEN_BACKLOG)
        self._gate = gate
        self._factory = factory
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        if self._ssl_context is not None:
            self._server = TlsListener(self._sock, self._factory, self._gate, self._ssl_context,  # type: ignore[assignment]
                                       self._handshake_timeout)
        else:
            self._server = await loop.create_server(self._factory, sock=self._sock, backlog=self._backlog)


async def serve_http(app: web.Application, *, gate: Gate, policy: HttpPolicy, sockets: list[socket.socket],
                     ssl_context: Any = None, handshake_timeout: float | None = None) -> web.AppRunner:
    """Serve ``app`` on ``sockets`` (bound and listening) under the admission policy."""
    guards: dict[Any, _HttpGuard] = {}
    app.middlewares.insert(0, _middleware(guards, policy))  # outermost: before any login
    # aiohttp's own keep-alive close as well (its default is an hour).
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=policy.idle_timeout or 3630, logger=_server_log)
    await runner.setup()
    server = runner.server
    assert server is not None

    def factory() -> asyncio.Protocol:
        return _HttpGuard(server(), gate, policy, guards)

    try:
        for sock in sockets:
            await _GuardedSite(runner, sock, ssl_context=ssl_context, factory=factory,
                               handshake_timeout=handshake_timeout, gate=gate).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bind_http(host: str, port: int) -> list[socket.socket]:
    """A listening socket on (host, port), for the HTTP endpoints started without sockets."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return [sock]


def of(obj: Any) -> tuple[Admission, HttpPolicy, float | None]:
    """The admission of a Gateway (or a bare Broker's default), its HTTP policy and TLS
    handshake limit."""
    config = getattr(obj, "config", None)
    limits = getattr(config, "limits", None)
    admission = getattr(obj, "admission", None)
    if not isinstance(admission, Admission):
        admission = Admission(limits)
    tls = getattr(config, "tls", None)
    return admission, HttpPolicy.of(limits), getattr(tls, "handshake_timeout", None) or 5.0
