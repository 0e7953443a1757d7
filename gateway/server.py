"""Start and stop the whole gateway: listeners, the broker, the audit log, the periodic tick.

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
import logging
import os
import platform
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from importlib import metadata
from typing import Any

from gateway.alarms import Alarms
from gateway.audit import AuditLog, NullAudit
from gateway.config import GatewayConfig, Listener
from gateway.transport import AMQPConnection

__all__ = [
    "Gateway",
    "ListenError",
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


def _version() -> str:
    try:
        return metadata.version("cmq-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def server_properties(cluster_name: str, *, exchange_exchange_bindings: bool) -> dict[str, Any]:
    """W1: what connection.start advertises; the capabilities are exactly those that work."""
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
        "version": _version(),
        "platform": f"Python {platform.python_version()}",
        "cluster_name": cluster_name,
        "information": "AMQP 0-9-1 with Tencent Cloud CMQ semantics",
        "capabilities": capabilities,
    }


def _open_audit(config: GatewayConfig) -> Any:
    settings = config.audit
    if settings.dir is None:
        return NullAudit()
    return AuditLog(settings.dir, rotate_bytes=settings.rotate_bytes, rotate_seconds=settings.rotate_seconds,
                    retention_hours=settings.retention_hours,
                    events=None if settings.events is None else set(settings.events))


async def _operator_listen(where: str, starting: Any) -> Any:
    """A taken management or metrics port is the same one-line error as a taken AMQP port."""
    try:
        return await starting
    except OSError as e:
        reason = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise ListenError(e.errno, f"cannot listen on {where}: {reason}") from None


def _bind(listener: Listener) -> socket.socket:
    """A listening socket; IPv6 sockets are v6-only so that 0.0.0.0 and :: share a port."""
    family = socket.AF_INET6 if ":" in listener.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((listener.host, listener.port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        where = f"[{listener.host}]:{listener.port}" if family == socket.AF_INET6 else \
            f"{listener.host}:{listener.port}"
        reason = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e)).lower()
        raise ListenError(e.errno, f"cannot listen on {where}: {reason}") from None
    return sock


def _bind_all(listeners: list[Listener]) -> list[socket.socket]:
    """Bind every listener; port 0 on several hosts means one free port shared by all."""
    socks: list[socket.socket] = []
    chosen: dict[int, int] = {}
    try:
        for lst in listeners:
            port = chosen.get(lst.port, lst.port)
            try:
                sock = _bind(Listener(lst.host, port))
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


class Gateway:
    """One gateway: ``await start()``, ``await stop()``; ``port`` is the first listener's port."""

    def __init__(self, config: GatewayConfig, *, clock: Any = None) -> None:
        self.config = config
        self.clock = clock
        self.broker: Any = None
        self.audit: Any = NullAudit()
        self.connections: set[AMQPConnection] = set()
        self.server_properties: dict[str, Any] = {}
        self.alarms = Alarms()
        self.blocked = False  # a resource alarm is in effect (W5): publishers are blocked
        self.block_reason = ""
        self._servers: list[asyncio.AbstractServer] = []
        self._ticker: asyncio.Task[None] | None = None
        self.addresses: list[tuple[str, int]] = []
        # Bytes read from / written to AMQP clients (metrics: cmq_gateway_*_bytes_total).
        self.bytes_in = 0
        self.bytes_out = 0
        # (name, aiohttp runner) of the management API and /metrics, when served.
        self._operator: list[tuple[str, Any]] = []

    @property
    def port(self) -> int:
        return self.addresses[0][1]

    async def start(self) -> None:
        from gateway.broker import Broker

        socks = _bind_all(self.config.listeners)  # before anything else: a taken port fails fast
        try:
            self.audit = _open_audit(self.config)
            kwargs: dict[str, Any] = {"audit": self.audit, "config": self.config}
            if self.clock is not None:
                kwargs["clock"] = self.clock
            if self.config.data_dir is not None:
                os.makedirs(self.config.data_dir, exist_ok=True)
            self.broker = await Broker.open(self.config.data_dir, **kwargs)
            self.broker.on_store_change = lambda failed: self.check_alarms()
            self.check_alarms()  # a full disk blocks publishers from the first connection on
            self.server_properties = server_properties(
                self.config.cluster_name,
                exchange_exchange_bindings=bool(getattr(self.broker, "exchange_exchange_bindings", False)))
            loop = asyncio.get_running_loop()
            for sock in socks:
                server = await loop.create_server(lambda: AMQPConnection(self), sock=sock)
                self._servers.append(server)
                host, port = sock.getsockname()[:2]
                self.addresses.append((host, port))
        except BaseException:
            for s in socks:
                s.close()
            raise
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
        await self._start_operator_window()

    def operator_addresses(self) -> list[tuple[str, str]]:
        """("management API" | "metrics", "host:port") of the HTTP endpoints being served."""
        out = []
        for name, runner in self._operator:
            host, port = runner.addresses[0][:2]
            out.append((name, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"))
        return out

    async def _start_operator_window(self) -> None:
        """The management API (RabbitMQ's port 15672) and /metrics (15692), when configured."""
        config = self.config
        if config.management_port is not None:
            from gateway.management import start_management
            where = f"{config.management_host}:{config.management_port} (management API)"
            self._operator.append(("management API", await _operator_listen(
                where, start_management(self, config.management_host, config.management_port))))
        if config.metrics_port is not None:
            from gateway.metrics import start_metrics
            where = f"{config.metrics_host}:{config.metrics_port} (metrics)"
            self._operator.append(("metrics", await _operator_listen(
                where, start_metrics(self, config.metrics_host, config.metrics_port))))

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
        self.audit.close()

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
        if not alarms.check(self.config.limits, self.broker, self.config.data_dir):
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


def run(config: GatewayConfig) -> None:
    """Serve until SIGTERM or SIGINT; raises ListenError when a listener cannot be bound."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _new_loop_run(_serve(config))


async def _serve(config: GatewayConfig) -> None:
    gw = Gateway(config)
    await gw.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    where = ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in gw.addresses)
    # One parseable line: scripts (and the restart tests) read the port from it.
    print(f"cmq-gateway: listening on {where} (data dir {config.data_dir})", file=sys.stderr, flush=True)
    for name, address in gw.operator_addresses():
        print(f"cmq-gateway: {name} on http://{address}/", file=sys.stderr, flush=True)
    await stop.wait()
    log.info("shutting down")
    await gw.stop()
    print("cmq-gateway: stopped", file=sys.stderr, flush=True)
