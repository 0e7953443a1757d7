"""Shared fixtures: a gateway on a free port for the session, RabbitMQ's URL, unique names.

The gateway runs on its own event loop in a daemon thread (``gateway_in_thread``), so blocking
clients (pika, kombu, Celery) and asyncio clients (aio-pika, aiormq) in the test's own loop
reach it alike, over real sockets. It never binds 5672: a real RabbitMQ runs there.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _rabbitmq_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from gateway.server import gateway_in_thread

    with gateway_in_thread(port=0, data_dir=str(tmp_path_factory.mktemp("gateway-data"))) as gw:
        yield gw


@pytest.fixture(scope="session")
def cmq_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A second gateway, in the ``cmq`` profile (PF2): every CMQ limit refuses and deliveries
    carry the receive metadata (M11). The session's ``gateway`` keeps the default profile."""
    from gateway.server import gateway_in_thread

    with gateway_in_thread(port=0, data_dir=str(tmp_path_factory.mktemp("gateway-cmq-data")),
                           profile="cmq") as gw:
        yield gw


@pytest.fixture(scope="session")
def cmq_gateway_url(cmq_gateway: object) -> str:
    return f"amqp://guest:guest@127.0.0.1:{cmq_gateway.port}/%2F"  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def gateway_url(request: pytest.FixtureRequest) -> str:
    """CMQ_GATEWAY_URL points the tests at a gateway already running (or, to check the
    differential scenarios themselves, at RabbitMQ); otherwise one starts in-process."""
    external = os.environ.get("CMQ_GATEWAY_URL")
    if external:
        return external
    gw = request.getfixturevalue("gateway")
    return f"amqp://guest:guest@127.0.0.1:{gw.port}/%2F"


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    # A missing reference broker fails the test rather than skipping it: a skip would let a
    # differential failure pass unseen (the README's test command expects RabbitMQ there).
    if not _rabbitmq_up():
        pytest.fail("the differential tests need RabbitMQ on 127.0.0.1:5672 (guest/guest)")
    return RABBITMQ_URL


@pytest.fixture(params=["rabbitmq", "gateway"])
def broker_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs once against RabbitMQ and once against the gateway."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def unique() -> str:
    """A prefix for exchange and queue names no other test (or earlier run) uses."""
    return f"t{uuid.uuid4().hex[:10]}"
