"""Shared fixtures: a gateway on a free port for the session, RabbitMQ's URL, unique names.

The gateway runs on its own event loop in a daemon thread (``gateway_in_thread``), so blocking
clients (pika, kombu, Celery) and asyncio clients (aio-pika, aiormq) in the test's own loop
reach it alike, over real sockets. It never binds 5672: a real RabbitMQ runs there.

Both stores (issue 14): a module marked ``pytestmark = pytest.mark.both_stores`` (or a list
holding it) runs each test that takes ``broker_url`` once more against a gateway on NATS
JetStream (``[jetstream]`` beside ``[rabbitmq]`` and ``[gateway]``), and each test that takes
``gateway_url`` on both stores (``[gateway]`` and ``[jetstream]``). Unmarked modules, and the
embedded runs of marked ones, are as before. The JetStream gateway is one in-process gateway on
a single nats-server of the session (tests/support/natsd.py), never the machine's 4222.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.support.natsd_fixtures import *  # noqa: F401,F403  # nats-server fixtures, every test

# No wall-clock threshold in a test: Hypothesis's per-example deadline (200 ms) failed a
# property test on a loaded machine (355 ms once, 1.3 ms when repeated).
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")

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
def jetstream_gateway(nats_single: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session's gateway on NATS JetStream (--store nats://...), for ``both_stores`` modules."""
    from gateway.server import gateway_in_thread

    with gateway_in_thread(port=0, data_dir=str(tmp_path_factory.mktemp("gateway-js-data")),
                           store=nats_single.store_url) as gw:  # type: ignore[attr-defined]
        yield gw


@pytest.fixture(scope="session")
def jetstream_url(jetstream_gateway: object) -> str:
    return f"amqp://guest:guest@127.0.0.1:{jetstream_gateway.port}/%2F"  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_stores: the module's broker_url/gateway_url tests also run "
                            "against a gateway on NATS JetStream (issue 14)")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A parametrize mark (not metafunc.parametrize) so that pytest's fixture machinery leaves
    # broker_url's own params alone for these tests: the mark takes precedence over them.
    if metafunc.definition.get_closest_marker("both_stores") is None:
        return
    taken = {name for mark in metafunc.definition.iter_markers("parametrize")
             for name in (mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0])}
    if "broker_url" in metafunc.fixturenames and "broker_url" not in taken:
        metafunc.definition.add_marker(pytest.mark.parametrize(
            "broker_url", ["rabbitmq", "gateway", "jetstream"], indirect=True))
    elif "gateway_url" in metafunc.fixturenames and "gateway_url" not in taken:
        metafunc.definition.add_marker(pytest.mark.parametrize(
            "gateway_url", ["gateway", "jetstream"], indirect=True))


@pytest.fixture(scope="session")
def gateway_url(request: pytest.FixtureRequest) -> str:
    """CMQ_GATEWAY_URL points the tests at a gateway already running (or, to check the
    differential scenarios themselves, at RabbitMQ); otherwise one starts in-process. In a
    ``both_stores`` module the JetStream run gets the JetStream gateway instead."""
    if getattr(request, "param", "gateway") == "jetstream":
        return request.getfixturevalue("jetstream_url")
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
    """Each test that takes this runs once against RabbitMQ and once against the gateway (and,
    in a ``both_stores`` module, once against the gateway on JetStream)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def unique() -> str:
    """A prefix for exchange and queue names no other test (or earlier run) uses."""
    return f"t{uuid.uuid4().hex[:10]}"
