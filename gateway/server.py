"""Start and stop the whole gateway: listeners, the broker, the audit log, the periodic tick.

With a ``tls`` section the same AMQP service is also offered over TLS (AMQPS, SE2) on its own
port, and the management API and /metrics are served over HTTPS.

``Gateway`` is the in-process API (tests use ``running_gateway`` or, from blocking clients,
``gateway_in_thread``); ``run(config)`` is what ``cmq-gateway serve`` calls: uvloop when it is
installed, SIGTERM/SIGINT for a graceful stop (320 CONNECTION_FORCED to every client, then the
store is flushed so that no confirmed message is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
import logging.handlers
import os
import platform
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from gateway import version
from gateway.admission import LISTEN_BACKLOG, Admission
from gateway.alarms import Alarms
from gateway.audit import AuditLog, NullAudit
from gateway.config import GatewayConfig, Listener
from gateway.transport import AMQPConnection, LightPeers

__all__ = [
    "Gateway",
    "ListenError",
    "StartupError",
    "gateway_in_thread",
    "run",
    "running_gateway",
    "server_properties",
]

log = logging.getLogger("cmq_gateway.server")

TICK_SECONDS = 1.0
# How long a graceful stop waits for clients to answer 320 with close-ok.
SHUTDOWN_GRACE = 2.0


class ListenError(OSError):
    """A listener could not be bound; ``str()`` is the one-line message for the operator."""

    def __str__(self) -> str:
        return str(self.strerror)


class StartupError(Exception):
    """The data or audit directory cannot be used; ``str()`` is the one line that says why
    and which option chooses another."""


# What a port taken by the usual neighbour (a RabbitMQ on the same host) is, and the
# option that moves the gateway off it, by what the port serves.
_IN_USE = {
    "amqp": "(another AMQP broker?): choose another with --port, "
            "or --management-port/--metrics-port for 15672/15692",
    "management API": "(RabbitMQ's management plugin?): choose another with --management-port, "
                      "or --management-port off",
    "metrics": "(RabbitMQ's Prometheus plugin?): choose another with --metrics-port, or --metrics-port off",
    "amqps": "(another AMQPS broker?): choose another with --tls-port, or --tls-port off",
    "cmq-api": "(another cmq-gateway?): choose another with --cmq-api-port, or --cmq-api-port off",
    "mqtt": "(Mosquitto, or RabbitMQ's MQTT plugin?): choose another with --mqtt-port, or --mqtt-port off",
    "mqtts": "(Mosquitto, or RabbitMQ's MQTT plugin?): choose another with --mqtts-port, or --mqtts-port off",
}
# The option of a port whose name does not say it (the others: --<first word>-port).
_OPTION = {"amqp": "--port", "amqps": "--tls-port"}
# What a taken port's address is followed by, where the address alone does not say it.
_LABEL = {"amqps": " (AMQPS)", "mqtts": " (MQTTS)", "management API": " (management API)", "metrics": " (metrics)",
          "cmq-api": " (CMQ API)"}


def _listen_reason(e: OSError, port: int, serves: str) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} is in use {_IN_USE[serves]}"
    option = _OPTION.get(serves) or f"--{serves.split()[0]}-port"
    if e.errno == errno.EACCES:
        return f"permission denied (ports below 1024 need privileges): choose another with {option}"
    if e.errno == errno.EADDRNOTAVAIL:
        return "no such local address: choose another with --host"
    return (e.strerror or str(e)).lower()


def server_properties(cluster_name: str, *, exchange_exchange_bindings: bool,
                      profile: str = "compatible") -> dict[str, Any]:
    """W1: what connection.start advertises; the capabilities are exactly those that work.
    ``cmq_profile`` (PF1) is the gateway's profile: connection.start comes before the client
    names its vhost, so a vhost's own profile is shown by the management API instead."""
    capabilities = {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
    }
    if exchange_exchange_bindings:
        capabilities["exchange_exchange_bindings"] = True
    return {
        "product": "cmq-gateway",
        "version": version(),
        "platform": f"Python {platform.python_version()}",
        "cluster_name": cluster_name,
        "information": "AMQP 0-9-1 with Tencent Cloud CMQ semantics",
        "cmq_profile": profile,
        "capabilities": capabilities,
    }


def _open_audit(config: GatewayConfig, lock: Any = None) -> Any:
    """``lock``: the audit dir's AuditDirLock (A7), held by the AuditLog until it closes."""
    settings = config.audit
    if settings.dir is None:
        return NullAudit()
    return AuditLog(settings.dir, rotate_bytes=settings.rotate_bytes, rotate_seconds=settings.rotate_seconds,
                    retention_hours=settings.retention_hours,
                    events=None if settings.events is None else set(settings.events),
                    lock=True if lock is None else lock)


class DirInUseError(StartupError):
    """A7: the audit dir is another gateway's; ``exit_code`` 2 (issue 27)."""

    exit_code = 2


def _claim_dirs(config: GatewayConfig) -> list[Any]:
    """DirLocks on the data dir and on the audit dir. The audit dir's is taken wherever it
    lies, inside a data dir too: a gateway whose audit dir is inside its data dir must still
    keep out another one given that audit dir (issue 27, A7)."""
    from gateway.audit.dirlock import AuditDirLock
    from semantics.store.files import DirLock

    locks: list[Any] = []
    try:
        if config.data_dir is not None:
            locks.append(_claim(config.data_dir, "data dir", "--data-dir", lambda d: DirLock(d, "LOCK")))
        if config.audit.dir is not None:
            locks.append(_claim(config.audit.dir, "audit dir", "--audit-dir", AuditDirLock))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def _claim(directory: str, what: str, option: str, take: Callable[[str], Any]) -> Any:
    from gateway.audit.dirlock import AuditDirLocked
    from semantics.store import StoreLockedError

    try:
        os.makedirs(directory, exist_ok=True)
        return take(directory)
    except StoreLockedError:
        raise StartupError(f"{what} {directory} is in use by another cmq-gateway: stop that one, "
                           f"or choose another directory with {option}") from None
    except AuditDirLocked as e:
        raise DirInUseError(f"{what} {directory} is in use by another cmq-gateway "
                            f"({e.holder or 'holder unknown'}): stop that one, "
                            f"or choose another directory with {option}") from None
    except OSError as e:
        reason = "not a directory" if e.errno in (errno.EEXIST, errno.ENOTDIR) else \
            (e.strerror or str(e)).lower()
        where = e.filename if e.filename and os.fspath(e.filename) != directory else None
        raise StartupError(f"{what} {directory} cannot be used: {reason}"
                           + (f" ({where})" if where else "")
                           + f": choose another with {option}") from None


def _operator_sockets(host: str | None, port: int, serves: str) -> list[socket.socket]:
    """The management API's or /metrics' sockets: on ``host``, or with none configured on
    every IPv4 and IPv6 address (0.0.0.0 and ::, one port), as the AMQP listeners by default.
    A taken port is the same one-line error as a taken AMQP port, naming its own option."""
    hosts = [host] if host else ["0.0.0.0", "::"]
    return _bind_all([Listener(h, port) for h in hosts], serves)


async def _closing(socks: list[socket.socket], starting: Awaitable[Any]) -> Any:
    """What ``starting`` returns; the sockets closed if it fails (once served, its runner owns them)."""
    try:
        return await starting
    except BaseException:
        for s in socks:
            s.close()
        raise


def _bind(listener: Listener, serves: str = "amqp") -> socket.socket:
    """A listening socket; IPv6 sockets are v6-only so that 0.0.0.0 and :: share a port.
    ``serves`` (a key of _IN_USE) says which option the error names."""
    family = socket.AF_INET6 if ":" in listener.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((listener.host, listener.port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        where = f"[{listener.host}]:{listener.port}" if family == socket.AF_INET6 else \
            f"{listener.host}:{listener.port}"
        where += _LABEL.get(serves, "")
        raise ListenError(e.errno, f"cannot listen on {where}: {_listen_reason(e, listener.port, serves)}") from None
    return sock


def _bind_all(listeners: list[Listener], serves: str = "amqp") -> list[socket.socket]:
    """Bind every listener; port 0 on several hosts means one free port shared by all."""
    socks: list[socket.socket] = []
    chosen: dict[int, int] = {}
    try:
        for lst in listeners:
            port = chosen.get(lst.port, lst.port)
            try:
                sock = _bind(Listener(lst.host, port), serves)
            except ListenError as e:
                if e.errno == errno.EADDRNOTAVAIL and ":" in lst.host:
                    log.warning("no IPv6 on this host: %s", e)  # IPv4-only machines still serve
                    continue
                raise
            if lst.port == 0:
                chosen[0] = sock.getsockname()[1]
            socks.append(sock)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


# The option that moves each listener, for the start-up errors.
_MOVED_BY = {"amqp": "--port", "amqps": "--tls-port", "mqtt": "--mqtt-port", "mqtts": "--mqtts-port",
             "management API": "--management-port", "metrics": "--metrics-port", "cmq-api": "--cmq-api-port"}
_NAMED = {"amqp": "AMQP", "amqps": "AMQPS", "mqtt": "MQTT", "mqtts": "MQTTS", "management API": "the management API",
          "metrics": "/metrics", "cmq-api": "the CMQ API"}


def _planned_listeners(config: GatewayConfig) -> list[tuple[str, Listener, bool]]:
    """(what it serves, where, skipped with a warning when taken) of every listener a start
    will bind, as Gateway.start and _start_operator_window bind them."""
    out = [("amqp", lst, False) for lst in config.listeners]
    out += [("amqps", lst, False) for lst in config.tls_listeners()]
    if config.mqtt_port is not None and config.mqtt_port >= 0:
        out += [("mqtt", lst, config.mqtt_port_defaulted) for lst in config.mqtt_listeners(config.mqtt_port)]
    if config.tls is not None and config.mqtt_tls_port is not None and config.mqtt_tls_port >= 0:
        out += [("mqtts", lst, config.mqtt_tls_port_defaulted) for lst in config.mqtt_listeners(config.mqtt_tls_port)]
    for serves, host, port in (("management API", config.management_host, config.management_port),
                               ("metrics", config.metrics_host, config.metrics_port)):
        if port is not None:
            out += [(serves, Listener(h, port), False) for h in ([host] if host else ["0.0.0.0", "::"])]
    if config.cmq_api_port is not None:
        out.append(("cmq-api", Listener(config.cmq_api_host, config.cmq_api_port), False))
    return out


def _probe_listeners(config: GatewayConfig) -> None:
    """Bind every fixed port once and let it go, so that a start which would fail on a taken
    port names all of them in one line (issue 30: they came one failed start at a time), and a
    port given to two of the gateway's own listeners says so instead of guessing at a neighbour.
    A single taken port is left to the real bind, whose line is the same."""
    held: list[tuple[socket.socket, str]] = []
    problems: list[str] = []
    others = 0
    try:
        for serves, lst, optional in _planned_listeners(config):
            if lst.port == 0:
                continue
            try:
                held.append((_bind(lst, serves), serves))
            except ListenError as e:
                if optional or (e.errno == errno.EADDRNOTAVAIL and ":" in lst.host):
                    continue
                mine = next((s for sock, s in held if sock.getsockname()[1] == lst.port and s != serves), None)
                if e.errno == errno.EADDRINUSE and mine is not None:
                    problems.append(f"port {lst.port} is given to both {_NAMED[mine]} ({_MOVED_BY[mine]}) and "
                                    f"{_NAMED[serves]} ({_MOVED_BY[serves]}): choose another for one of them")
                else:
                    others += e.errno == errno.EADDRINUSE
                    problems.append(str(e))
    finally:
        for sock, _serves in held:
            sock.close()
    problems = list(dict.fromkeys(problems))
    if len(problems) > 1 or (problems and "given to both" in problems[0]):
        hint = "; or move every listener at once with --port-offset N" if others > 1 else ""
        raise ListenError(errno.EADDRINUSE, "; ".join(problems) + hint)


class Gateway:
    """One gateway: ``await start()``, ``await stop()``; ``port`` is the first listener's port."""

    def __init__(self, config: GatewayConfig, *, clock: Any = None) -> None:
        self.config = config
        self.clock = clock
        self.broker: Any = None
        self.audit: Any = NullAudit()
        self.connections: set[AMQPConnection] = set()
        self.light_peers = LightPeers()  # whose input ends a busy connection's read turn
        self.consumer_peers = LightPeers()  # connections with consumers (owed_input_waiting)
        self.server_properties: dict[str, Any] = {}
        self.alarms = Alarms()
        self.admission = Admission(config.limits)  # SE5: every listener's gate (gateway/admission.py)
        self.blocked = False  # a resource alarm is in effect (W5): publishers are blocked
        self.block_reason = ""
        self._servers: list[asyncio.AbstractServer] = []
        self._ticker: asyncio.Task[None] | None = None
        self.addresses: list[tuple[str, int]] = []
        self.tls_addresses: list[tuple[str, int]] = []  # AMQPS (SE2)
        self.ssl_context: Any = None  # shared by every TLS listener
        # Bytes read from / written to AMQP clients (metrics: cmq_gateway_*_bytes_total).
        self.bytes_in = 0
        self.bytes_out = 0
        # (name, aiohttp runner) of the management API and /metrics, when served.
        self._operator: list[tuple[str, Any]] = []
        self._locks: list[Any] = []  # DirLocks of the data dir and an audit dir outside it
        self._https: set[str] = set()  # the names of those served over HTTPS (SE2)
        self.mqtt: Any = None  # gateway.mqtt.server.MQTTService when MQTT is served (MQ1)
        self.mqtt_skipped = ""  # why the default MQTT port is not served

    @property
    def port(self) -> int:
        return (self.addresses or self.tls_addresses)[0][1]

    @property
    def tls_port(self) -> int:
        return self.tls_addresses[0][1]

    async def start(self) -> None:
        from gateway.broker import Broker

        if self.config.tls is not None:
            from gateway.tls import server_context

            self.ssl_context = server_context(self.config.tls)  # a bad certificate fails fast too
        _probe_listeners(self.config)  # every taken port named in one line, before anything starts
        socks = _bind_all(self.config.listeners)  # before anything else: a taken port fails fast
        try:
            tls_socks = _bind_all(self.config.tls_listeners(), "amqps")
        except BaseException:
            for s in socks:
                s.close()
            raise
        try:
            mqtt_socks = self._bind_mqtt()
        except BaseException:
            for s in socks + tls_socks:
                s.close()
            raise
        tls_socks += [sock for sock, _tls in mqtt_socks]  # closed with them should the start fail
        try:
            # The directories' locks before anything in them is touched: a refused second
            # gateway must not close (rename) the running one's open audit file.
            self._locks = _claim_dirs(self.config)
            self.audit = _open_audit(self.config, self._locks[-1] if self.config.audit.dir is not None else None)
            kwargs: dict[str, Any] = {"audit": self.audit, "config": self.config}
            if self.clock is not None:
                kwargs["clock"] = self.clock
            if self.config.data_dir is not None:
                kwargs["lock"] = self._locks[0]
            if self.config.store is not None:
                from gateway.jetstream.broker import ClusterBroker  # CL1: docs/CLUSTER.md
                self.broker = await ClusterBroker.open_cluster(self.config.store, self.config.nats, **kwargs)
            else:
                self.broker = await Broker.open(self.config.data_dir, **kwargs)
            self.broker.on_store_change = lambda failed: self.check_alarms()
            self.check_alarms()  # a full disk blocks publishers from the first connection on
            self.server_properties = server_properties(
                self.config.cluster_name,
                exchange_exchange_bindings=bool(getattr(self.broker, "exchange_exchange_bindings", False)),
                profile=self.broker.profile.name)
            loop = asyncio.get_running_loop()
            for sock in socks:
                server = await loop.create_server(lambda: AMQPConnection(self), sock=sock, backlog=LISTEN_BACKLOG)
                self._servers.append(server)
                host, port = sock.getsockname()[:2]
                self.addresses.append((host, port))
            for sock in tls_socks[:len(tls_socks) - len(mqtt_socks)]:
                await self._serve_tls(sock)
            if mqtt_socks:
                from gateway.mqtt.server import MQTTService
                self.mqtt = MQTTService(self)
                for sock, tls in mqtt_socks:
                    self._servers.append(await self.mqtt.serve(sock, self.ssl_context if tls else None))
            self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
            await self._start_operator_window()
        except BaseException:
            for s in socks + tls_socks:
                s.close()
            await self.stop()  # what did start (the store, the audit log, the locks) is closed
            raise

    def _bind_mqtt(self) -> list[tuple[socket.socket, bool]]:
        """MQ1's listeners, plain and over TLS, each on the AMQP hosts unless mqtt_host says
        otherwise: (socket, over TLS). A default port someone else holds is a warning, not a
        failure."""
        config = self.config
        out: list[tuple[socket.socket, bool]] = []
        wanted = [(config.mqtt_port, config.mqtt_port_defaulted, "mqtt", False)]
        if config.tls is not None:
            wanted.append((config.mqtt_tls_port, config.mqtt_tls_port_defaulted, "mqtts", True))
        try:
            for port, defaulted, serves, tls in wanted:
                if port is None or port < 0:  # < 0: off in the file
                    continue
                try:
                    out += [(sock, tls) for sock in _bind_all(config.mqtt_listeners(port), serves)]
                except ListenError as e:
                    if not defaulted:
                        raise
                    skipped = f"{'MQTTS' if tls else 'MQTT'} not served: {e}"
                    self.mqtt_skipped = f"{self.mqtt_skipped}; {skipped}" if self.mqtt_skipped else skipped
        except BaseException:
            for sock, _tls in out:
                sock.close()
            raise
        return out

    async def _serve_tls(self, sock: socket.socket) -> None:
        assert self.config.tls is not None
        # SE4: the TLS handshake has its own limit (RabbitMQ's ssl_handshake_timeout); the AMQP
        # handshake deadline starts when the transport sees the connection, after it.
        # SE5: counted by the listener's gate from accept, before the handshake.
        from gateway.admission import TlsListener

        server = TlsListener(sock, lambda: AMQPConnection(self), self.admission.gate("amqps"), self.ssl_context,
                             self.config.tls.handshake_timeout)
        self._servers.append(server)  # type: ignore[arg-type]  # quacks as one
        self.tls_addresses.append(sock.getsockname()[:2])

    def operator_scheme(self, name: str) -> str:
        """"https" when the endpoint ``name`` (see operator_addresses) is served over TLS."""
        return "https" if name in self._https else "http"

    def operator_addresses(self) -> list[tuple[str, str]]:
        """("management API" | "metrics" | "CMQ API", "host:port") of each address the HTTP
        endpoints are served on (by default 0.0.0.0 and [::], one port)."""
        out = []
        for name, runner in self._operator:
            for address in runner.addresses:
                host, port = address[:2]
                out.append((name, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"))
        return out

    async def _start_operator_window(self) -> None:
        """The management API (RabbitMQ's port 15672) and /metrics (15692), when configured."""
        config = self.config
        tls = config.tls
        if config.management_port is not None:
            from gateway.management import start_management
            ctx = self.ssl_context if tls is not None and tls.management else None
            socks = _operator_sockets(config.management_host, config.management_port, "management API")
            self._operator.append(("management API", await _closing(socks, start_management(
                self, sockets=socks, ssl_context=ctx))))
            if ctx is not None:
                self._https.add("management API")
        if config.metrics_port is not None:
            from gateway.metrics import start_metrics
            ctx = self.ssl_context if tls is not None and tls.metrics else None
            socks = _operator_sockets(config.metrics_host, config.metrics_port, "metrics")
            self._operator.append(("metrics", await _closing(socks, start_metrics(self, sockets=socks, ssl_context=ctx))))
            if ctx is not None:
                self._https.add("metrics")
        if config.cmq_api_port is not None:
            from gateway.cmqapi import start_cmq_api
            ctx = self.ssl_context if tls is not None and tls.cmq_api else None
            socks = _bind_all([Listener(config.cmq_api_host, config.cmq_api_port)], "cmq-api")
            self._operator.append(("CMQ API", await _closing(socks, start_cmq_api(
                self, ssl_context=ctx, sockets=socks))))
            if ctx is not None:
                self._https.add("CMQ API")

    async def stop(self) -> None:
        """Stop accepting, close every client with 320, flush the store, close the audit log."""
        for _name, runner in self._operator:
            await runner.cleanup()
        self._operator.clear()
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close_for_shutdown()
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0)  # let connection_lost run (unacked messages back to Active)
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for server in self._servers:
            await server.wait_closed()
        if self.broker is not None:
            await self.broker.close()
        if self.mqtt is not None:
            self.mqtt.retained.close()  # its bytes counted as held (SE6) are let go
        self.audit.close()
        self.light_peers.close()
        self.consumer_peers.close()
        for lock in self._locks:
            lock.release()
        self._locks = []

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                self.tick()
            except Exception:
                log.exception("periodic tick failed")

    def tick(self) -> None:
        """Heartbeats, close timeouts and the W5 alarms, for every connection at once."""
        self.alarms.outgoing = sum(c.write_buffer_size() for c in self.connections)
        self.check_alarms()
        mono = time.monotonic()
        for conn in list(self.connections):
            conn.tick(mono)

    def memory_over(self) -> bool:
        """The memory alarm is not set but its mark is passed: asked by the transport after
        each read turn, so that publishers are blocked as the bytes arrive, not a tick later."""
        return not self.alarms.memory and \
            self.alarms.held_bytes(self.broker) > self.config.limits.memory_high_watermark

    def check_alarms(self) -> None:
        """Set or clear the W5 alarms; block or unblock the publishers when that changes."""
        alarms = self.alarms
        if not alarms.check(self.config.limits, self.broker, self.config.data_dir, self.config.audit.dir):
            return
        blocked = bool(alarms.resources)
        if alarms.memory or alarms.disk:
            log.warning("resource alarm: %s (held %d bytes; %s)", alarms.reason, alarms.held,
                        alarms.disk_why or "disk ok")
        else:
            log.warning("resource alarms cleared")
        self.block_reason = alarms.reason or self.block_reason
        self.blocked = blocked
        for conn in list(self.connections):
            conn.set_blocked(blocked)  # idempotent: one alarm of two cleared changes nothing


def _test_config(port: int, data_dir: str | None, hosts: tuple[str, ...], **overrides: Any) -> GatewayConfig:
    config = GatewayConfig(listeners=[Listener(h, port) for h in hosts], data_dir=data_dir)
    return dataclasses.replace(config, **overrides) if overrides else config


@contextlib.asynccontextmanager
async def running_gateway(port: int = 0, data_dir: str | None = None, *,
                          hosts: tuple[str, ...] = ("127.0.0.1", "::1"), clock: Any = None,
                          **overrides: Any) -> AsyncIterator[Gateway]:
    """``async with running_gateway(port=0) as gw: gw.port`` — a gateway in this event loop."""
    gw = Gateway(_test_config(port, data_dir, hosts, **overrides), clock=clock)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


@contextlib.contextmanager
def gateway_in_thread(port: int = 0, data_dir: str | None = None, *,
                      hosts: tuple[str, ...] = ("127.0.0.1", "::1"), **overrides: Any) -> Iterator[Gateway]:
    """The same gateway on its own event loop in a daemon thread, for blocking clients."""
    config = _test_config(port, data_dir, hosts, **overrides)
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        gw = Gateway(config)
        stop = asyncio.Event()
        try:
            await gw.start()
        except BaseException as e:
            box["error"] = e
            ready.set()
            return
        box["gw"], box["loop"], box["stop"] = gw, asyncio.get_running_loop(), stop
        ready.set()
        await stop.wait()
        await gw.stop()

    thread = threading.Thread(target=lambda: _new_loop_run(main()), name="cmq-gateway", daemon=True)
    thread.start()
    ready.wait()
    if "error" in box:
        raise box["error"]
    try:
        yield box["gw"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(timeout=30)


def _new_loop_run(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


# Every message makes a few container objects (Message, QueueMessage, a receipt, frames'
# tuples), so with CPython's default gen-0 threshold (700) the cyclic collector ran
# thousands of times a second under load and walked the young backlog each time: ~1.5 s of
# a 10 s flood, pauses up to 63 ms that a slow consumer beside it waited through. Messages
# are freed by reference counting (they form no cycles), so collecting rarely costs no
# memory that matters: 10-14 % less CPU per message (scripts/bench_pipeline.py, same run).
# 200,000 rather than 50,000: a 25 s scenario 1 flood then runs without one collection,
# where 50,000 made 53 of up to 46 ms each (1.07 s in all: every object of the flood's
# backlog walked while alive); 300 connections opened and closed, with channel errors,
# left no cyclic garbage for a collection to find (docs/BENCHMARKS.md).
GC_THRESHOLDS = (200_000, 20, 10)


def run(config: GatewayConfig) -> None:
    """Serve until SIGTERM or SIGINT; raises ListenError when a listener cannot be bound."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gc.set_threshold(*GC_THRESHOLDS)
    _new_loop_run(_serve(config))


@contextlib.contextmanager
def _logs_held_until_started() -> Iterator[None]:
    """Log records of the start-up (the store's recovery summary, ...) wait for its outcome: a
    start that fails says so in one line, without the INFO lines of what it had opened."""
    root = logging.getLogger()
    handlers, held = root.handlers[:], logging.handlers.BufferingHandler(capacity=1 << 20)
    root.handlers = [held]
    started = False
    try:
        yield
        started = True
    finally:
        root.handlers = handlers
        for record in held.buffer:
            if started or record.levelno >= logging.WARNING:
                for handler in handlers:
                    if record.levelno >= handler.level:
                        handler.handle(record)


def _load_definitions(gw: Gateway, definitions: dict[str, Any]) -> None:
    """A definitions export given as the config brings its topology, as RabbitMQ's
    load_definitions does; what cannot be imported is said on stderr, never dropped silently.
    Importing is idempotent, so a restart with the same file changes nothing."""
    from gateway.management.app import Management
    from gateway.management.cli import render
    from gateway.management.definitions import import_definitions

    report = import_definitions(Management(gw), definitions)
    for line in render(report).splitlines():
        print(f"cmq-gateway: definitions: {line}", file=sys.stderr, flush=True)


def _addresses(addresses: list[tuple[str, int]]) -> str:
    """``127.0.0.1:5672, [::1]:5672``: the listeners' addresses as the start-up lines say them."""
    return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)


def _ask_stop(gw: Gateway) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        gw.audit.ask_stop()
    return handler


async def _serve(config: GatewayConfig) -> None:
    gw = Gateway(config)
    with _logs_held_until_started():
        try:
            await gw.start()
        except ListenError:
            raise
        except OSError as e:
            # Anything else the file system refuses while starting (a store file that cannot
            # be read, ...): the operator's to fix, so one line rather than a traceback.
            where = f" {e.filename}" if e.filename else ""
            raise StartupError(f"cannot start:{where}: {(e.strerror or str(e)).lower()}") from None
    if config.definitions:
        _load_definitions(gw, config.definitions)
    # What start-up made (modules, the recovered backlog) lives as long as the process, or
    # until its message is delivered: the collector need not walk it again on every full pass.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
        # The loop runs stop.set once it reads the signal from its wake-up pipe, which it
        # cannot while a hand-off waits for an audit writer that a full disk holds up. A
        # Python-level handler runs even then (that wait is a select, which Python resumes
        # after running handlers): it only tells the audit log to stop waiting.
        signal.signal(sig, _ask_stop(gw))
    where = _addresses(gw.addresses)
    # One parseable line: scripts (and the restart tests) read the port from it.
    dirs = f"data dir {config.data_dir}" + (f", audit dir {config.audit.dir}" if config.audit.dir else ", no audit log")
    print(f"cmq-gateway: listening on {where} ({dirs})", file=sys.stderr, flush=True)
    if "guest" not in config.users.users:
        # Issue 30: a config that lists users replaces RabbitMQ's default guest/guest; say so,
        # so that a refused guest login is not a mystery.
        print("cmq-gateway: no guest user: the config's users replace the default guest/guest",
              file=sys.stderr, flush=True)
    if gw.tls_addresses:
        where = _addresses(gw.tls_addresses)
        print(f"cmq-gateway: AMQPS (TLS) on {where}", file=sys.stderr, flush=True)
    if gw.mqtt is not None:
        for what, addresses in (("MQTT", gw.mqtt.addresses), ("MQTTS (TLS)", gw.mqtt.tls_addresses)):
            if addresses:
                print(f"cmq-gateway: {what} on {_addresses(addresses)}", file=sys.stderr, flush=True)
    if gw.mqtt_skipped:
        print(f"cmq-gateway: {gw.mqtt_skipped}", file=sys.stderr, flush=True)
    served: dict[str, list[str]] = {}
    for name, address in gw.operator_addresses():
        served.setdefault(name, []).append(f"{gw.operator_scheme(name)}://{address}/")
    for name, urls in served.items():
        print(f"cmq-gateway: {name} on {', '.join(urls)}", file=sys.stderr, flush=True)
    await stop.wait()
    log.info("shutting down")
    await gw.stop()
    print("cmq-gateway: stopped", file=sys.stderr, flush=True)
