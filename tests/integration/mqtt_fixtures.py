"""Fixtures and helpers of the MQTT tests: a gateway with MQTT on a free port, the
differential ``port`` (the gateway, then the Mosquitto on 127.0.0.1:1883), unique topics.
Fixtures are named with ``name=`` so that test modules import them without shadowing."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import AuditSettings
from gateway.mqtt import codec as P
from gateway.server import gateway_in_thread
from tests.integration.cmq_gateway import STORES, store_of
from tests.integration.mqtt_client import RawClient

__all__ = ["MOSQUITTO", "VERSIONS", "client", "gw_fixture", "gw_store_fixture", "mqtt_gateway", "next_publish",
           "port_fixture", "take", "topic_fixture"]

MOSQUITTO = 1883
VERSIONS = {4: MQTTProtocolVersion.MQTTv311, 5: MQTTProtocolVersion.MQTTv5}


def _mosquitto_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", MOSQUITTO), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def mqtt_gateway(tmp_path_factory: pytest.TempPathFactory, store: str | None = None) -> Iterator[Any]:
    """A gateway with MQTT on a free port, an audit log (``audit_dir``) and four users: guest
    (administrator), reader (read on amq.topic, no write), blind (write, no read) and nobody
    (no permission on any vhost)."""
    users = UserDB({"guest": User("guest", hash_password("guest"), ("administrator",)),
                    "reader": User("reader", hash_password("pw"), ()),
                    "blind": User("blind", hash_password("pw"), ()),
                    "nobody": User("nobody", hash_password("pw"), ())},
                   {("guest", "/"): Permission(), ("guest", "iot"): Permission(),
                    ("reader", "/"): Permission("^mqtt-subscription-.*", "^mqtt-subscription-.*", ".*"),
                    ("blind", "/"): Permission(".*", ".*", "^mqtt-subscription-.*")},
                   ["/", "iot"])
    audit = tmp_path_factory.mktemp("mqtt-audit")
    settings = AuditSettings(dir=str(audit))
    with gateway_in_thread(port=0, hosts=("127.0.0.1",), data_dir=str(tmp_path_factory.mktemp("mqtt-data")),
                           mqtt_port=0, mqtt_host="127.0.0.1", mqtt_max_packet_size=4096, users=users,
                           audit=settings, store=store) as g:
        g.audit_dir = audit
        yield g


@pytest.fixture(scope="module", name="gw")
def gw_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with mqtt_gateway(tmp_path_factory) as g:
        yield g


@pytest.fixture(scope="module", name="gw_store", params=STORES)
def gw_store_fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``gw`` on each store (SE1 and MQ1 hold on JetStream as on the embedded store)."""
    with mqtt_gateway(tmp_path_factory, store_of(request)) as g:
        yield g


@pytest.fixture(params=["gateway", "mosquitto"], name="port")
def port_fixture(request: pytest.FixtureRequest) -> int:
    """Differential: the same test against the gateway and against Mosquitto."""
    if request.param == "mosquitto":
        assert _mosquitto_up(), "Mosquitto is expected on 127.0.0.1:1883"
        return MOSQUITTO
    return int(request.getfixturevalue("gw").mqtt.port)


@pytest.fixture(name="topic")
def topic_fixture() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def client(port: int, level: int, client_id: str = "", **kw: Any) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, username="guest", password="guest", protocol=VERSIONS[level],
                          identifier=client_id or None, **kw)


async def take(client: aiomqtt.Client, n: int, timeout: float = 10) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []
    async with asyncio.timeout(timeout):
        async for m in client.messages:
            got.append(m)
            if len(got) == n:
                break
    return got


def next_publish(c: RawClient, timeout: float = 10) -> P.Publish | None:
    while True:
        p = c.recv(timeout)
        if p is None or isinstance(p, P.Publish):
            return p
