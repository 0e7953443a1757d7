"""SE2: AMQPS with pika and aio-pika, client certificates, the EXTERNAL mechanism, HTTPS.

Gateway only: the RabbitMQ on 127.0.0.1:5672 has no TLS listener and its configuration is not
ours to change. Certificates come from a throw-away CA (tests/integration/tls_certs.py); the
gateway binds free ports only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pika.credentials
import pika.exceptions
import pytest
import requests
from pamqp import commands, frame

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import OFF, AuditSettings, ConfigError, Limits, TLSSettings, parse_config
from gateway.server import Gateway, gateway_in_thread
from tests.integration.test_process import ROOT, serve
from tests.integration.tls_certs import Certs, make_certs

HEADER = b"AMQP\x00\x00\x09\x01"
HANG_PROTECTION = 30.0


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


def _users(*extra: str) -> UserDB:
    """guest/guest, and users with secret passwords that only EXTERNAL can log in as."""
    users = {"guest": User("guest", hash_password("guest"), ("administrator",))}
    users.update({name: User(name, hash_password(secrets.token_hex(16))) for name in ("svc", *extra)})
    return UserDB(users, {(name, "/"): Permission() for name in users})


@contextlib.contextmanager
def tls_gateway(certs: Certs, *, users: UserDB | None = None, **tls: Any) -> Iterator[Gateway]:
    overrides = {k: tls.pop(k) for k in ("audit", "limits", "management_port", "metrics_port") if k in tls}
    settings = TLSSettings(certfile=str(certs.server_cert), keyfile=str(certs.server_key), cafile=str(certs.ca),
                           port=0, **tls)
    with gateway_in_thread(data_dir=None, tls=settings, users=users or _users(), **overrides) as gw:
        yield gw


def _pika(port: int, ctx: ssl.SSLContext, credentials: Any = None) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="localhost", port=port, credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, "localhost"), connection_attempts=1))


def _round_trip(conn: pika.BlockingConnection) -> bytes:
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, b"over tls")
    _, _, body = ch.basic_get(queue, auto_ack=True)
    conn.close()
    return bytes(body)


def _mechanisms(port: int, ctx: ssl.SSLContext | None) -> str:
    """connection.start's mechanisms, read with a raw (TLS) socket."""
    raw = socket.create_connection(("localhost", port), timeout=HANG_PROTECTION)
    with ctx.wrap_socket(raw, server_hostname="localhost") if ctx else raw as sock:
        sock.sendall(HEADER)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before connection.start, after {data!r}")
            data += chunk
            with contextlib.suppress(Exception):  # pamqp: not a whole frame yet
                start = frame.unmarshal(data)[2]
                assert isinstance(start, commands.Connection.Start)
                return str(start.mechanisms)


def _users_logged_in(gw: Gateway) -> list[str | None]:
    return sorted(str(c.user) for c in list(gw.connections))


def test_SE2_pika_and_aio_pika_over_amqps(certs: Certs) -> None:
    """Server authentication only (verify_none): PLAIN over TLS, from both clients."""
    with tls_gateway(certs) as gw:
        assert gw.tls_port != gw.port
        assert _round_trip(_pika(gw.tls_port, certs.client_context())) == b"over tls"

        async def aio() -> bytes:
            url = f"amqps://guest:guest@localhost:{gw.tls_port}/?cafile={certs.ca}"
            async with await aio_pika.connect(url) as conn:
                ch = await conn.channel()
                queue = await ch.declare_queue(exclusive=True)
                await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), routing_key=queue.name)
                message = await queue.get(timeout=HANG_PROTECTION)
                return message.body

        assert _run(aio()) == b"aio over tls"
        # The plain listener still serves, and does not offer EXTERNAL.
        assert _mechanisms(gw.port, None) == "PLAIN AMQPLAIN"


def test_SE2_external_offered_only_with_a_verified_certificate(certs: Certs) -> None:
    with tls_gateway(certs, verify="verify_peer") as gw:
        assert _mechanisms(gw.tls_port, certs.client_context(certs.client)) == "EXTERNAL PLAIN AMQPLAIN"
        assert _mechanisms(gw.tls_port, certs.client_context()) == "PLAIN AMQPLAIN"  # no certificate
        assert _mechanisms(gw.port, None) == "PLAIN AMQPLAIN"
    with tls_gateway(certs, verify="verify_none") as gw:  # a certificate nobody checked names nobody
        assert _mechanisms(gw.tls_port, certs.client_context(certs.client)) == "PLAIN AMQPLAIN"


def test_SE2_external_login_with_pika(certs: Certs) -> None:
    """With ssl_cert_login_from: common_name the user is the certificate's CN; 'svc' has a
    password nobody knows."""
    with tls_gateway(certs, verify="verify_peer", fail_if_no_peer_cert=True,
                     ssl_cert_login_from="common_name") as gw:
        conn = _pika(gw.tls_port, certs.client_context(certs.client), pika.credentials.ExternalCredentials())
        assert _users_logged_in(gw) == ["svc"]
        assert _round_trip(conn) == b"over tls"


def test_SE2_external_login_with_aio_pika(certs: Certs) -> None:
    with tls_gateway(certs, verify="verify_peer", fail_if_no_peer_cert=True,
                     ssl_cert_login_from="common_name") as gw:

        async def aio() -> list[str | None]:
            url = f"amqps://localhost:{gw.tls_port}/?auth=external&cafile={certs.ca}&certfile={certs.client}"
            async with await aio_pika.connect(url) as conn:
                ch = await conn.channel()
                await ch.declare_queue(exclusive=True)
                return _users_logged_in(gw)

        assert _run(aio()) == ["svc"]


def test_SE2_external_login_from_the_distinguished_name(certs: Certs) -> None:
    """ssl_cert_login_from: distinguished_name (RabbitMQ's default): the user is the subject DN
    in RFC 4514 form, compared with what the cryptography package makes of the certificate."""
    dn = certs.subject_dn(certs.client)
    assert dn.startswith("CN=svc,")
    with tls_gateway(certs, users=_users(dn), verify="verify_peer",
                     ssl_cert_login_from="distinguished_name") as gw:
        conn = _pika(gw.tls_port, certs.client_context(certs.client), pika.credentials.ExternalCredentials())
        assert _users_logged_in(gw) == [dn]
        conn.close()


def test_SE2_external_for_an_unknown_user_is_refused_and_audited(certs: Certs, tmp_path: Path) -> None:
    with tls_gateway(certs, verify="verify_peer", audit=AuditSettings(dir=str(tmp_path)),
                     ssl_cert_login_from="common_name") as gw, \
            pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        _pika(gw.tls_port, certs.client_context(certs.nobody), pika.credentials.ExternalCredentials())
    assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(refused.value)
    records = [json.loads(line) for f in sorted(tmp_path.rglob("*.jsonl*")) for line in f.read_text().splitlines()]
    failures = [r for r in records if r["event"] == "auth_failure"]
    assert [(r["user"], r["vhost"]) for r in failures] == [(certs.nobody_name, "/")]


def test_SE2_fail_if_no_peer_cert_refuses_at_the_handshake(certs: Certs) -> None:
    """Without a certificate, or with one from another CA, the TLS handshake fails: no AMQP
    byte is ever exchanged. With the right one, PLAIN still works."""
    with tls_gateway(certs, verify="verify_peer", fail_if_no_peer_cert=True) as gw:
        for cert in (None, certs.rogue):
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                _pika(gw.tls_port, certs.client_context(cert))
            # asyncio drops the TLS alert of a failed handshake: the client sees the socket close.
            with pytest.raises((ssl.SSLError, ConnectionError), match="certificate|closed before connection.start, after b''"):
                _mechanisms(gw.tls_port, certs.client_context(cert))
        assert _round_trip(_pika(gw.tls_port, certs.client_context(certs.client))) == b"over tls"


def test_SE2_verify_peer_refuses_a_certificate_from_another_ca(certs: Certs) -> None:
    """verify_peer without fail_if_no_peer_cert: no certificate is fine, a bad one is not."""
    with tls_gateway(certs, verify="verify_peer") as gw:
        with pytest.raises((ssl.SSLError, ConnectionError), match="certificate|after b''"):
            _mechanisms(gw.tls_port, certs.client_context(certs.rogue))
        assert _round_trip(_pika(gw.tls_port, certs.client_context())) == b"over tls"


def test_SE2_plain_amqp_on_the_tls_port_is_closed_cleanly(certs: Certs, caplog: pytest.LogCaptureFixture) -> None:
    """A client speaking plain AMQP to the TLS port is hung up on without a traceback in the
    gateway's log, and the gateway keeps serving everybody else."""
    caplog.set_level(logging.INFO)
    with tls_gateway(certs) as gw:
        with socket.create_connection(("127.0.0.1", gw.tls_port), timeout=HANG_PROTECTION) as sock:
            sock.sendall(HEADER)
            received = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    received += chunk
            assert not received.startswith(b"AMQP") and b"\x0a\x00\x0a" not in received  # no connection.start
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.tls_port, connection_attempts=1))
        assert _round_trip(_pika(gw.tls_port, certs.client_context())) == b"over tls"
        assert _round_trip(pika.BlockingConnection(
            pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))) == b"over tls"
    gateway_side = [r for r in caplog.records if r.name.startswith(("cmq_gateway", "asyncio"))]
    assert [r.getMessage() for r in gateway_side if r.levelno >= logging.WARNING or r.exc_info] == []


def test_SE4_silent_client_on_the_tls_port_is_cut_at_the_tls_handshake_limit(certs: Certs) -> None:
    """A TCP client that never starts the TLS handshake is cut by tls.handshake_timeout."""
    with tls_gateway(certs, handshake_timeout=0.5) as gw, \
            socket.create_connection(("127.0.0.1", gw.tls_port), timeout=HANG_PROTECTION) as sock:
        try:
            received = sock.recv(65536)
        except ConnectionResetError:
            received = b""
        assert received == b""


def test_SE4_handshake_deadline_applies_after_tls(certs: Certs) -> None:
    """After the TLS handshake, a client that sends the AMQP header and stalls is reset by the
    AMQP handshake deadline, as on the plain port."""
    with tls_gateway(certs, limits=Limits(handshake_timeout=1.0)) as gw:
        raw = socket.create_connection(("localhost", gw.tls_port), timeout=HANG_PROTECTION)
        with certs.client_context().wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(HEADER)
            received = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    received += chunk
            consumed, _, start = frame.unmarshal(received)
            assert isinstance(start, commands.Connection.Start) and consumed == len(received)  # no close


def test_SE2_management_and_metrics_over_https(certs: Certs) -> None:
    with tls_gateway(certs, management_port=0, metrics_port=0, verify="verify_peer") as gw:
        served = dict(gw.operator_addresses())
        assert {gw.operator_scheme(name) for name in served} == {"https"}
        mgmt, metrics = (int(served[name].rsplit(":", 1)[1]) for name in ("management API", "metrics"))
        r = requests.get(f"https://localhost:{mgmt}/api/overview", auth=("guest", "guest"), verify=str(certs.ca),
                         timeout=HANG_PROTECTION)
        assert r.status_code == 200 and r.json()["product_name"]
        r = requests.get(f"https://localhost:{metrics}/metrics", verify=str(certs.ca), timeout=HANG_PROTECTION)
        assert r.status_code == 200 and "cmq_gateway" in r.text
        # The connections view tells TLS connections apart, with the client's certificate.
        tls_conn = _pika(gw.tls_port, certs.client_context(certs.client))
        plain_conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"))
        listed = requests.get(f"https://localhost:{mgmt}/api/connections", auth=("guest", "guest"),
                              verify=str(certs.ca), timeout=HANG_PROTECTION).json()
        tls_conn.close()
        plain_conn.close()
        views = {c["port"]: c for c in listed}
        assert views[gw.port]["ssl"] is False and views[gw.port]["peer_cert_subject"] is None
        tls_view = views[gw.tls_port]
        assert tls_view["ssl"] is True and tls_view["ssl_protocol"] in ("tlsv1.2", "tlsv1.3")
        assert tls_view["peer_cert_subject"] == certs.subject_dn(certs.client)
        with pytest.raises(requests.exceptions.SSLError):  # our CA is needed to trust it
            requests.get(f"https://localhost:{mgmt}/api/overview", timeout=HANG_PROTECTION)
        with pytest.raises(requests.exceptions.ConnectionError):  # no plain HTTP on that port
            requests.get(f"http://localhost:{mgmt}/api/overview", timeout=HANG_PROTECTION)


def _tls_config(tmp_path: Path, certs: Certs, **extra: Any) -> Path:
    import yaml

    tls = {"certfile": str(certs.server_cert), "keyfile": str(certs.server_key), "cacertfile": str(certs.ca),
           "verify": "verify_peer", **extra}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"tls": tls}))
    return path


def test_SE2_serve_with_a_tls_section_and_tls_port(tmp_path: Path, certs: Certs) -> None:
    """`cmq-gateway serve --config … --tls-port 0`: AMQPS beside AMQP, HTTPS management."""
    with serve(tmp_path / "data", "--config", str(_tls_config(tmp_path, certs)), "--tls-port", "0") as (proc, port):
        tls_port = proc.tls_port  # type: ignore[attr-defined]
        assert tls_port not in (None, port)
        assert _round_trip(_pika(tls_port, certs.client_context(certs.client))) == b"over tls"
        mgmt = proc.operator["management API"]  # type: ignore[attr-defined]
        r = requests.get(f"https://localhost:{mgmt}/api/overview", auth=("guest", "guest"), verify=str(certs.ca),
                         timeout=HANG_PROTECTION)
        assert r.status_code == 200


@pytest.mark.parametrize("broken", ["certfile", "cacertfile"])
def test_SE2_unreadable_certificate_is_one_line_exit_2(tmp_path: Path, certs: Certs, broken: str) -> None:
    config = _tls_config(tmp_path, certs, **{broken: str(tmp_path / "missing.pem")})
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                           "--tls-port", "0", "--data-dir", str(tmp_path / "data"), "--config", str(config),
                           "--management-port", "off", "--metrics-port", "off", "--mqtt-port", "off"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    what = "certfile" if broken == "certfile" else "cafile"
    assert done.stderr.startswith(f"cmq-gateway: tls: cannot load {what} '{tmp_path / 'missing.pem'}'")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("option", ["--tls-port", "--mqtts-port"])  # AMQPS; MQTT over TLS (MQ1)
def test_SE2_MQ1_tls_port_without_a_tls_section_is_exit_2(tmp_path: Path, option: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
                           option, "0", "--data-dir", str(tmp_path), "--mqtt-port", "off"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, f"cmq-gateway: {option} needs a tls section (certfile, keyfile, ...) in the config\n")


def test_SE2_tls_config_keys() -> None:
    cfg = parse_config({"listeners": [{"host": "127.0.0.1", "port": 5672}, {"host": "::1", "port": 5672}],
                        "tls": {"certfile": "s.pem", "keyfile": "s.key", "cacertfile": "ca.pem",
                                "verify": "verify_peer", "fail_if_no_peer_cert": True}})
    assert cfg.tls == TLSSettings(certfile="s.pem", keyfile="s.key", cafile="ca.pem", verify="verify_peer",
                                  fail_if_no_peer_cert=True, port=5671)
    assert [(lst.host, lst.port) for lst in cfg.tls_listeners()] == [("127.0.0.1", 5671), ("::1", 5671)]
    assert parse_config({}).tls is None and parse_config({}).tls_listeners() == []
    assert parse_config({"tls": {"certfile": "s.pem", "port": "off"}}).tls_listeners() == []
    assert parse_config({"tls": {"certfile": "s.pem", "port": "off"}}).tls.port == OFF  # type: ignore[union-attr]
    for bad, message in (({"keyfile": "k"}, "tls.certfile: required"),
                         ({"certfile": "c", "verify": "verify_all"}, "tls.verify: expected one of"),
                         ({"certfile": "c", "verify": "verify_peer"}, "verify_peer needs cafile"),
                         ({"certfile": "c", "cafile": "a", "cacertfile": "a"}, "not both"),
                         ({"certfile": "c", "ssl_cert_login_from": "email"}, "tls.ssl_cert_login_from"),
                         ({"certfile": "c", "versions": ["tlsv1.3"]}, "unknown key 'versions'")):
        with pytest.raises(ConfigError, match=message):
            parse_config({"tls": bad})


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)
