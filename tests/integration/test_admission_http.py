"""SE5 on the HTTP listeners (CMQ API, management API, /metrics) and the descriptors they
share with AMQP, on a real `cmq-gateway serve` process with raw sockets and pika.

Issue 26 item 2: silent and trickling sockets stayed open (100 s and more) and 1,100 of them on
the CMQ API port made AMQP logins fail. Here the idle and body deadlines are set small in the
config; every wait is bounded only by HANG (hang protection, not a threshold under test).
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika

from tests.integration.test_disk_alarm import _config
from tests.integration.test_process import serve

HANG = 30.0
PORTS = ("CMQ API", "management API", "metrics")
# What each port answers a plain GET with (the CMQ API wants a signed POST: any answer will do).
AUTH = "Basic Z3Vlc3Q6Z3Vlc3Q="
PATHS = {"CMQ API": "/", "management API": "/api/overview", "metrics": "/metrics"}


def _closed(sock: socket.socket, deadline: float | None = None, drip: bytes = b"", every: float = 0.2) -> bytes:
    """Read until the gateway closes ``sock`` (returns what it answered); while waiting, send
    ``drip`` every ``every`` seconds (a trickling client). Fails at the deadline (hang
    protection; HANG from now by default)."""
    got = b""
    deadline = time.monotonic() + HANG if deadline is None else deadline
    sock.settimeout(every)
    while True:
        assert time.monotonic() < deadline, f"still open: {sock.getsockname()} (answered {got[:60]!r})"
        if drip:
            try:
                sock.sendall(drip)
            except OSError:
                return got
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset
            return got
        if not data:
            return got
        got += data


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _amqp_login(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=10,
                                                             socket_timeout=10))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"canary")
        method, _, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and body == b"canary"
    finally:
        conn.close()


def _get(port: int, path: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_SE5_silent_trickling_and_idle_keepalive_sockets_closed_on_every_http_port(tmp_path: Path) -> None:
    """On each HTTP port: a socket that says nothing, one that trickles its headers a byte at
    a time, one that trickles its body, and a keep-alive socket left idle after a response are
    all closed by the gateway (1 s deadlines here; 10 s by default)."""
    config = _config(tmp_path, http_idle_timeout=1, http_body_timeout=1)
    with serve(tmp_path / "data", "--config", config) as (proc, _port):
        for name in PORTS:
            port = proc.operator[name]
            silent = _connect(port)
            headers = _connect(port)
            headers.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            body = _connect(port)
            body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                         b"Content-Type: application/octet-stream\r\n\r\n")
            idle = _connect(port)
            idle.sendall(f"GET {PATHS[name]} HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n".encode())
            deadline = time.monotonic() + HANG
            assert _closed(silent, deadline) == b""
            assert _closed(headers, deadline, b"X-a: b\r\n") == b""
            answer = _closed(body, deadline, b"x")
            # The management API refuses a request without a login on its headers, before
            # its body (401); the others time the body out (408).
            assert answer == b"" or answer.startswith((b"HTTP/1.1 408", b"HTTP/1.1 401")), answer[:80]
            answer = _closed(idle, deadline)
            assert answer.startswith(b"HTTP/1.1 "), answer[:80]  # answered, then closed when idle
            for s in (silent, headers, body, idle):
                s.close()
            assert _get(port, PATHS[name]) in (200, 400, 404, 405)  # and still serving
        assert proc.poll() is None


def test_SE5_request_headers_over_preauth_bytes_refused_with_431(tmp_path: Path) -> None:
    """Headers past limits.preauth_bytes (64 KiB by default) are answered 431 and the socket
    closed, on every HTTP port, before any login."""
    with serve(tmp_path / "data") as (proc, _port):
        for name in PORTS:
            sock = _connect(proc.operator[name])
            try:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
                for _ in range(80):
                    sock.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
            except OSError:
                pass  # the gateway may have closed already: its answer is still readable
            answer = _closed(sock, time.monotonic() + HANG)
            sock.close()
            assert answer.startswith(b"HTTP/1.1 431"), (name, answer[:80])


def test_SE5_max_connections_per_listener_and_amqp_logins_during_a_flood(tmp_path: Path) -> None:
    """limits.max_connections holds for each listener on its own: 60 silent sockets on the
    CMQ API port, 20 are held and the rest are closed at once; AMQP logins still work then
    (their listener has its own 20), and /metrics counts both per listener."""
    config = _config(tmp_path, max_connections=20, http_idle_timeout=60)
    with serve(tmp_path / "data", "--config", config) as (proc, port):
        flood = [_connect(proc.operator["CMQ API"]) for _ in range(60)]
        deadline = time.monotonic() + HANG
        open_ = []
        for s in flood:
            s.settimeout(max(0.01, deadline - time.monotonic()) if len(open_) >= 20 else 0.5)
            try:
                data = s.recv(1024)
            except TimeoutError:
                open_.append(s)  # held: nothing said, still open
                continue
            except OSError:
                continue  # reset at once: refused
            assert data in (b"",) or data.startswith(b"HTTP/1.1 503"), data[:80]
        assert len(open_) == 20
        for _ in range(5):
            _amqp_login(port)
        assert _get(proc.operator["management API"], "/api/overview") == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.operator['metrics']}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'cmq_gateway_listener_connections{listener="cmq_api"} 20' in metrics
        assert 'cmq_gateway_listener_refused_total{listener="cmq_api"} 40' in metrics
        assert 'cmq_gateway_listener_refused_total{listener="amqp"} 0' in metrics
        for s in flood:
            s.close()


def _still_open(socks: list[socket.socket]) -> int:
    n = 0
    for s in socks:
        if s.fileno() < 0:
            continue
        s.settimeout(0.001)
        try:
            if s.recv(1024) == b"":
                s.close()
                continue
        except TimeoutError:
            n += 1
            continue
        except OSError:
            s.close()
            continue
        n += 1  # said something (it should not have): counted as open
    return n


@contextlib.contextmanager
def _descriptor_limit(soft: int) -> Iterator[None]:
    """Processes started inside inherit a soft RLIMIT_NOFILE of ``soft`` (the test's own is
    put back at once)."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_SE5_fd_reserve_keeps_amqp_logins_working_while_the_cmq_api_is_flooded(tmp_path: Path) -> None:
    """Issue 26 item 2 at a smaller scale: a gateway limited to 256 descriptors, 400 silent
    sockets on the CMQ API port (no connection limit, long idle timeout). The CMQ API takes
    sockets until fd_reserve descriptors are left and closes the rest at once; AMQP logins
    keep working with the flood in place (before: 'Transport indicated EOF')."""
    config = _config(tmp_path, fd_reserve=64, http_idle_timeout=120)
    limit = 256
    with _descriptor_limit(limit):
        started = serve(tmp_path / "data", "--config", config)
        proc, port = started.__enter__()
    try:
        flood: list[socket.socket] = []
        for _ in range(400):
            try:
                flood.append(_connect(proc.operator["CMQ API"]))
            except OSError:
                break
        for _ in range(5):
            _amqp_login(port)
        assert _get(proc.operator["management API"], "/api/overview") == 200
        deadline = time.monotonic() + HANG
        while True:  # sockets still in the accept queue look open until the gateway gets to them
            held = _still_open(flood)
            if held < limit - 32:
                break
            assert time.monotonic() < deadline, f"{held} sockets of the flood held"
            time.sleep(0.2)
        assert held > 0
        for _ in range(5):
            _amqp_login(port)  # and still, with the flood in place
        for s in flood:
            s.close()
    finally:
        started.__exit__(None, None, None)


def _tls_config(tmp_path: Path, limits: dict[str, int], handshake_timeout: int) -> tuple[Any, Path]:
    """Certificates under tmp_path/tls and a config with TLS on every port that takes it
    (AMQPS and MQTTS when asked on the command line; management, metrics and the CMQ API)."""
    from tests.integration.tls_certs import make_certs

    (tmp_path / "tls").mkdir()
    certs = make_certs(tmp_path / "tls")
    config = tmp_path / "gateway.yaml"
    config.write_text(json.dumps({"limits": limits,
                                  "tls": {"certfile": str(certs.server_cert), "keyfile": str(certs.server_key),
                                          "cacertfile": str(certs.ca), "management": True,
                                          "handshake_timeout": handshake_timeout}}))
    return certs, config


def test_SE5_https_management_closes_silent_sockets_before_and_after_the_tls_handshake(tmp_path: Path) -> None:
    """Issue 26 item 2 on HTTPS (management over TLS stayed open 20 s and more): a socket that
    never starts the TLS handshake is closed at tls.handshake_timeout; one that completes it
    and then says nothing, at http_idle_timeout. A real request is still answered."""
    import ssl

    certs, config = _tls_config(tmp_path, {"http_idle_timeout": 1}, handshake_timeout=1)
    with serve(tmp_path / "data", "--config", str(config), "--tls-port", "0") as (proc, _port):
        port = proc.operator["management API"]
        raw = _connect(port)  # no ClientHello
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        ctx.check_hostname = False
        quiet = ctx.wrap_socket(_connect(port))  # handshake done, then nothing
        deadline = time.monotonic() + HANG
        assert _closed(raw, deadline) == b""
        closed = False
        quiet.settimeout(0.2)
        while not closed:
            assert time.monotonic() < deadline, "the TLS socket is still open"
            try:
                closed = quiet.recv(1024) == b""
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                closed = True
        raw.close()
        quiet.close()
        with ctx.wrap_socket(_connect(port)) as ok:
            ok.sendall(f"GET /api/overview HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n"
                       "Connection: close\r\n\r\n".encode())
            ok.settimeout(10)
            assert ok.recv(64).startswith(b"HTTP/1.1 200")


def test_SE5_sockets_in_their_tls_handshake_count_against_max_connections(tmp_path: Path) -> None:
    """A TLS listener counts a socket from accept, before its handshake (as RabbitMQ's ranch
    does): AMQPS, MQTTS and HTTPS management each hold max_connections sockets that never send
    a ClientHello and close the rest at once; /metrics counts them per listener. Before, asyncio
    told the listener of a socket only after its handshake, so any number could sit in it."""
    import ssl

    certs, config = _tls_config(tmp_path, {"max_connections": 4}, handshake_timeout=60)
    with serve(tmp_path / "data", "--config", str(config), "--tls-port", "0", "--mqtts-port", "0") as (proc, _):
        lines = "".join(proc.lines)  # type: ignore[attr-defined]
        mqtts = int(lines.split("MQTTS (TLS) on 127.0.0.1:")[1].split()[0].rstrip(","))
        ports = {"amqps": proc.tls_port, "mqtts": mqtts,  # type: ignore[attr-defined]
                 "management": proc.operator["management API"]}  # type: ignore[attr-defined]
        for listener, port in ports.items():
            flood = [_connect(port) for _ in range(10)]
            time.sleep(0.5)  # the gateway accepts them all meanwhile
            assert _still_open(flood) == 4, listener
            ctx = ssl.create_default_context(cafile=str(certs.ca))
            ctx.check_hostname = False
            with contextlib.suppress(OSError, ssl.SSLError):  # refused: reset at once
                ctx.wrap_socket(_connect(port)).close()
                raise AssertionError(f"{listener}: a fifth TLS socket completed its handshake")
            for s in flood:
                s.close()
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        ctx.check_hostname = False
        with urllib.request.urlopen(f"https://127.0.0.1:{proc.operator['metrics']}/metrics", timeout=10,
                                    context=ctx) as r:
            metrics = r.read().decode()
        assert 'cmq_gateway_listener_refused_total{listener="amqps"} 7' in metrics, metrics
        assert 'cmq_gateway_listener_refused_total{listener="mqtts"} 7' in metrics
        # And once they are gone, a client gets in.
        deadline = time.monotonic() + HANG
        while True:
            try:
                with ctx.wrap_socket(_connect(ports["management"])) as ok:
                    ok.sendall(f"GET /api/overview HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n"
                               "Connection: close\r\n\r\n".encode())
                    ok.settimeout(10)
                    assert ok.recv(64).startswith(b"HTTP/1.1 200")
                break
            except (OSError, ssl.SSLError):
                assert time.monotonic() < deadline, "the closed sockets were never let go"
                time.sleep(0.2)


def _unread(port: int, request: bytes) -> socket.socket:
    """A client that sends requests and never reads an answer: a small receive buffer, the
    same request pipelined until the gateway stops taking them (its answers fill both
    kernels' buffers and then its own)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        for _ in range(20000):
            sock.send(request)
    return sock


def _get_or_refused(port: int, path: str) -> int:
    """_get, with a socket refused by max_connections as its 503 (which the reset that follows
    it may overtake)."""
    try:
        return _get(port, path)
    except (urllib.error.URLError, OSError):
        return 503


def test_SE5_a_client_that_never_reads_its_answers_is_closed_on_every_http_port(tmp_path: Path) -> None:
    """A socket whose answers stay unread for a whole http_idle_timeout is closed, as
    RabbitMQ's listener (ranch's send_timeout) and nginx (send_timeout) close one. Before,
    a response still going out re-armed the idle timer for ever: with max_connections 2, two
    such clients held a port against everyone else, and their answers stayed in memory."""
    config = _config(tmp_path, max_connections=2, http_idle_timeout=1, http_body_timeout=1)
    with serve(tmp_path / "data", "--config", config) as (proc, _port):
        for name in PORTS:
            port = proc.operator[name]
            request = f"GET {PATHS[name]} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n\r\n".encode()
            hogs = [_unread(port, request) for _ in range(2)]
            deadline = time.monotonic() + HANG
            while _get_or_refused(port, PATHS[name]) == 503:  # the port's two sockets are the hogs'
                assert time.monotonic() < deadline, f"{name}: clients that never read hold the port"
                time.sleep(0.2)
            for s in hogs:
                s.close()
        assert proc.poll() is None


def test_SE5_a_client_that_never_reads_its_answers_is_closed_on_every_https_port(tmp_path: Path) -> None:
    """The same over TLS, whose transport keeps the unsent answers in its own buffer (before,
    two such clients held each HTTPS port for ever under max_connections 2)."""
    import ssl

    certs, config = _tls_config(tmp_path, {"max_connections": 2, "http_idle_timeout": 1}, handshake_timeout=5)
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    ctx.check_hostname = False
    with serve(tmp_path / "data", "--config", str(config)) as (proc, _port):
        for name in PORTS:
            port = proc.operator[name]
            request = f"GET {PATHS[name]} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n\r\n".encode()
            hogs = []
            for _ in range(2):
                raw = socket.socket()
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
                raw.connect(("127.0.0.1", port))
                hog = ctx.wrap_socket(raw)
                hog.setblocking(False)
                with contextlib.suppress(ssl.SSLWantWriteError, BlockingIOError):
                    for _ in range(20000):
                        hog.send(request)
                hogs.append(hog)
            deadline = time.monotonic() + HANG
            while True:
                # (a refused socket is reset, in its handshake or after the 503)
                with contextlib.suppress(OSError, ssl.SSLError), ctx.wrap_socket(_connect(port)) as ok:
                    ok.sendall(f"GET {PATHS[name]} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n"
                               "Connection: close\r\n\r\n".encode())
                    answer = ok.recv(64)
                    if answer.startswith(b"HTTP/1.1 ") and not answer.startswith(b"HTTP/1.1 503"):
                        break
                assert time.monotonic() < deadline, f"{name}: clients that never read hold the port"
                time.sleep(0.2)
            for hog in hogs:
                hog.close()
        assert proc.poll() is None
