"""MQTT over TLS and over IPv6 (SPEC MQ1 with SE2): the MQTTS listener (RabbitMQ's 8883) with
the gateway's TLS settings, client-certificate login as RabbitMQ's ``ssl_cert_login``, and the
MQTT listeners on the AMQP hosts (127.0.0.1 and ::1 here), with paho-mqtt and aiomqtt."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import pytest
import requests
from paho.mqtt.enums import CallbackAPIVersion

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import ConfigError, TLSSettings, parse_config
from gateway.server import Gateway, gateway_in_thread
from tests.integration.mqtt_fixtures import VERSIONS, take
from tests.integration.test_process import serve
from tests.integration.tls_certs import Certs, make_certs

LESSER = "lesser-tls"  # a user that exists, with no permission on any vhost


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("mqtt-tls"), nobody_name=LESSER)


def _users() -> UserDB:
    users = {"guest": User("guest", hash_password("guest"), ("administrator",)),
             "svc": User("svc", hash_password(secrets.token_hex(16))),  # only a certificate logs in
             LESSER: User(LESSER, hash_password(secrets.token_hex(16)))}
    return UserDB(users, {("guest", "/"): Permission(), ("svc", "/"): Permission()})


@contextlib.contextmanager
def mqtts_gateway(certs: Certs, **tls: Any) -> Iterator[Gateway]:
    settings = TLSSettings(certfile=str(certs.server_cert), keyfile=str(certs.server_key), cafile=str(certs.ca),
                           port=0, verify="verify_peer", ssl_cert_login_from="common_name", **tls)
    with gateway_in_thread(data_dir=None, tls=settings, users=_users(), mqtt_port=0, mqtt_tls_port=0,
                           management_port=0, management_host="127.0.0.1") as gw:
        yield gw


def _paho_round_trip(host: str, port: int, level: int, topic: str, ctx: ssl.SSLContext | None,
                     user: str | None = "guest") -> bytes:
    """Subscribe and publish to oneself with paho-mqtt 2.x; the payload that came back."""
    got: list[bytes] = []
    subscribed, arrived = threading.Event(), threading.Event()
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"{topic}-paho", protocol=VERSIONS[level])
    if user is not None:
        c.username_pw_set(user, user)
    if ctx is not None:
        c.tls_set_context(ctx)
    c.on_subscribe = lambda *a: subscribed.set()
    c.on_message = lambda _c, _u, m: (got.append(m.payload), arrived.set())
    c.connect(host, port)
    c.loop_start()
    try:
        c.subscribe(topic, qos=1)
        assert subscribed.wait(10)
        c.publish(topic, b"over " + host.encode(), qos=1).wait_for_publish(10)
        assert arrived.wait(10)
    finally:
        c.disconnect()
        c.loop_stop()
    return got[0]


async def _aiomqtt_round_trip(host: str, port: int, level: int, topic: str, ctx: ssl.SSLContext | None,
                              **login: Any) -> bytes:
    async with aiomqtt.Client(host, port, protocol=VERSIONS[level], tls_context=ctx, **login) as c:
        await c.subscribe(topic, qos=1)
        await c.publish(topic, b"aiomqtt", qos=1)
        [m] = await take(c, 1)
    assert isinstance(m.payload, bytes)
    return m.payload


def _management(address: str, certs: Certs, path: str) -> Any:
    """The management API, over HTTPS as the tls section serves it (SE2)."""
    return requests.get(f"https://{address}/api/{path}", auth=("guest", "guest"), verify=str(certs.ca),
                        timeout=10).json()


@pytest.mark.parametrize("level", [4, 5])
def test_MQ1_mqtts_with_paho_and_aiomqtt(certs: Certs, level: int) -> None:
    """A user name and password over TLS, as on the plain port; the server certificate checked."""
    with mqtts_gateway(certs) as gw:
        assert gw.mqtt.tls_port not in (gw.mqtt.port, gw.port)
        ctx = certs.client_context()
        assert _paho_round_trip("127.0.0.1", gw.mqtt.tls_port, level, f"t{secrets.token_hex(4)}", ctx) == \
            b"over 127.0.0.1"
        assert asyncio.run(_aiomqtt_round_trip("127.0.0.1", gw.mqtt.tls_port, level, f"t{secrets.token_hex(4)}",
                                               ctx, username="guest", password="guest")) == b"aiomqtt"


@pytest.mark.parametrize("level", [4, 5])
def test_MQ1_mqtts_client_certificate_logs_in_without_a_password(certs: Certs, level: int) -> None:
    """RabbitMQ's ssl_cert_login: no user name or password in CONNECT, the verified
    certificate's CN names the user; the management API shows it as an EXTERNAL login over TLS."""
    with mqtts_gateway(certs) as gw:
        ctx = certs.client_context(certs.client)
        topic = f"t{secrets.token_hex(4)}"
        mgmt = dict(gw.operator_addresses())["management API"]
        seen: list[dict[str, Any]] = []

        async def run() -> bytes:
            async with aiomqtt.Client("127.0.0.1", gw.mqtt.tls_port, protocol=VERSIONS[level], tls_context=ctx,
                                      identifier=f"{topic}-cert") as c:
                listed = await asyncio.to_thread(_management, mgmt, certs, "connections")
                seen.extend(listed)
                await c.subscribe(topic, qos=1)
                await c.publish(topic, b"cert", qos=1)
                [m] = await take(c, 1)
            assert isinstance(m.payload, bytes)
            return m.payload

        assert asyncio.run(run()) == b"cert"
        assert _paho_round_trip("127.0.0.1", gw.mqtt.tls_port, level, topic, ctx, user=None) == b"over 127.0.0.1"
    [conn] = seen
    assert (conn["user"], conn["auth_mechanism"], conn["ssl"], conn["protocol"]) == \
        ("svc", "EXTERNAL", True, "MQTT 5.0" if level == 5 else "MQTT 3.1.1")
    assert conn["peer_cert_subject"] == Certs.subject_dn(certs.client)


@pytest.mark.parametrize("level", [4, 5])
def test_MQ1_mqtts_lesser_certificates_are_refused(certs: Certs, level: int) -> None:
    """A certificate for a user without rights on the vhost: CONNACK not authorized; a
    certificate from another CA, or none with fail_if_no_peer_cert: refused at the handshake;
    no certificate and no password: bad user name or password."""
    with mqtts_gateway(certs, fail_if_no_peer_cert=False) as gw:
        port = gw.mqtt.tls_port

        def refused(ctx: ssl.SSLContext) -> int:
            async def run() -> int:
                with pytest.raises(aiomqtt.MqttCodeError) as e:
                    async with aiomqtt.Client("127.0.0.1", port, protocol=VERSIONS[level], tls_context=ctx):
                        pass
                # paho 2.x gives 3.1.1's return codes (5, 4) as their MQTT 5 reason codes.
                return int(getattr(e.value.rc, "value", e.value.rc))
            return asyncio.run(run())

        assert refused(certs.client_context(certs.nobody)) == 0x87  # not authorized: LESSER has no permission
        assert refused(certs.client_context()) == 0x86  # no certificate, no credentials: bad login
        with pytest.raises((aiomqtt.MqttError, ssl.SSLError, OSError)):
            asyncio.run(_aiomqtt_round_trip("127.0.0.1", port, level, "x", certs.client_context(certs.rogue),
                                            timeout=3))
    with mqtts_gateway(certs, fail_if_no_peer_cert=True) as gw, \
            pytest.raises((aiomqtt.MqttError, ssl.SSLError, OSError)):
        asyncio.run(_aiomqtt_round_trip("127.0.0.1", gw.mqtt.tls_port, level, "x", certs.client_context(),
                                        username="guest", password="guest", timeout=3))


@pytest.mark.parametrize("level", [4, 5])
def test_MQ1_mqtt_and_mqtts_on_ipv6_loopback(certs: Certs, level: int) -> None:
    """The MQTT listeners are on the AMQP hosts (here 127.0.0.1 and ::1), one port for both."""
    with mqtts_gateway(certs) as gw:
        hosts = sorted(h for h, _ in gw.mqtt.addresses)
        assert hosts == ["127.0.0.1", "::1"] and len({p for _, p in gw.mqtt.addresses}) == 1
        assert sorted(h for h, _ in gw.mqtt.tls_addresses) == ["127.0.0.1", "::1"]
        topic = f"t{secrets.token_hex(4)}"
        assert _paho_round_trip("::1", gw.mqtt.port, level, topic, None) == b"over ::1"
        assert asyncio.run(_aiomqtt_round_trip("::1", gw.mqtt.port, level, topic, None,
                                               username="guest", password="guest")) == b"aiomqtt"
        assert _paho_round_trip("::1", gw.mqtt.tls_port, level, topic, certs.client_context()) == b"over ::1"
        listed = _management(dict(gw.operator_addresses())["management API"], certs, "overview")["listeners"]
        assert sorted((x["protocol"], x["ip_address"]) for x in listed if x["protocol"].startswith("mqtt")) == [
            ("mqtt", "127.0.0.1"), ("mqtt", "::1"), ("mqtt/ssl", "127.0.0.1"), ("mqtt/ssl", "::1")]


def _tls_config(tmp_path: Path, certs: Certs, **mqtt: Any) -> Path:
    import yaml

    raw: dict[str, Any] = {"tls": {"certfile": str(certs.server_cert), "keyfile": str(certs.server_key),
                                   "cacertfile": str(certs.ca)}}
    if mqtt:
        raw["mqtt"] = mqtt
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_MQ1_serve_mqtts_port(tmp_path: Path, certs: Certs) -> None:
    """`cmq-gateway serve --mqtts-port 0` with a tls section: MQTTS beside MQTT, said on stderr."""
    with serve(tmp_path / "data", "--config", str(_tls_config(tmp_path, certs)), "--tls-port", "off",
               "--mqtts-port", "0") as (proc, _port):
        lines = "".join(proc.lines)  # type: ignore[attr-defined]
        assert "MQTTS (TLS) on 127.0.0.1:" in lines, lines
        port = int(lines.split("MQTTS (TLS) on 127.0.0.1:")[1].split()[0].rstrip(","))
        assert port != proc.mqtt_port  # type: ignore[attr-defined]
        assert _paho_round_trip("127.0.0.1", port, 5, "serve-tls", certs.client_context()) == b"over 127.0.0.1"


def test_MQ1_mqtt_tls_port_config_key(tmp_path: Path, certs: Certs) -> None:
    tls = {"certfile": "s.pem"}
    assert parse_config({"tls": tls, "mqtt": {"tls_port": 8884}}).mqtt_tls_port == 8884
    assert parse_config({"tls": tls, "mqtt": {"tls_port": "off"}}).mqtt_tls_port == -1
    cfg = parse_config({"listeners": [{"host": "127.0.0.1", "port": 5672}, {"host": "::1", "port": 5672}]})
    assert [(x.host, x.port) for x in cfg.mqtt_listeners(1883)] == [("127.0.0.1", 1883), ("::1", 1883)]
    assert [(x.host, x.port) for x in parse_config({"mqtt": {"host": "::1"}}).mqtt_listeners(1)] == [("::1", 1)]
    with pytest.raises(ConfigError, match="mqtt.tls_port: needs a tls section"):
        parse_config({"mqtt": {"tls_port": 8883}})


def test_MQ1_serve_without_host_serves_mqtt_on_ipv4_and_ipv6(tmp_path: Path) -> None:
    """`cmq-gateway serve` without --host: MQTT on 0.0.0.0 and ::, one port, as AMQP."""
    with serve(tmp_path / "data", host=None) as (proc, _port):
        lines = "".join(proc.lines)  # type: ignore[attr-defined]
        port = proc.mqtt_port  # type: ignore[attr-defined]
        assert f"MQTT on 0.0.0.0:{port}, [::]:{port}" in lines, lines
        assert _paho_round_trip("::1", port, 5, "serve-v6", None) == b"over ::1"
        assert _paho_round_trip("127.0.0.1", port, 4, "serve-v4", None) == b"over 127.0.0.1"
