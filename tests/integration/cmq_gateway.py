"""A gateway serving CMQ's HTTP API on a free port, with key pairs for two users."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.config import CmqKey
from gateway.management.testing import LOOPBACK_PUSH
from gateway.server import gateway_in_thread
from tests.integration.cmq_client import CmqClient

ADMIN_ID, ADMIN_KEY = "AKIDadmin0000000000000000000000000000", "admin-secret-key-0123456789abcdef"
READER_ID, READER_KEY = "AKIDreader000000000000000000000000000", "reader-secret-key-0123456789abcd"
WAIT = 60.0  # hang protection only (a loaded CI machine pushes 100 HTTP messages slowly)
# CA1-CA4 on both stores (issue 26): the modules' gateway fixtures take these params, and the
# JetStream run is a gateway on the session's nats-server (tests/support/natsd_fixtures.py).
STORES = ["embedded", "jetstream"]


def store_of(request: Any) -> str | None:
    """The ``store`` of a gateway fixture parametrized with STORES."""
    if getattr(request, "param", "embedded") == "jetstream":
        return str(request.getfixturevalue("nats_single").store_url)
    return None


def users() -> UserDB:
    return UserDB({"admin": User("admin", hash_password("admin"), ("administrator",)),
                   "reader": User("reader", hash_password("reader"))},
                  {("admin", "/"): Permission(), ("reader", "/"): Permission("^$", "^$", ".*")},
                  ["/"], frozenset())


@contextlib.contextmanager
def cmq_gateway(data_dir: str | None = None, **overrides: Any) -> Iterator[tuple[Any, str]]:
    """(gateway, CMQ API endpoint URL)."""
    settings: dict[str, Any] = {
        "cmq_api_port": 0, "cmq_api_host": "127.0.0.1", "users": users(), "push": LOOPBACK_PUSH,
        "cmq_keys": {ADMIN_ID: CmqKey("admin", ADMIN_KEY), READER_ID: CmqKey("reader", READER_KEY)}}
    settings.update(overrides)
    with gateway_in_thread(port=0, data_dir=data_dir, **settings) as gw:
        address = dict(gw.operator_addresses())["CMQ API"]
        yield gw, f"{gw.operator_scheme('CMQ API')}://{address}"


def admin(endpoint: str, **kwargs: Any) -> CmqClient:
    return CmqClient(endpoint, ADMIN_ID, ADMIN_KEY, **kwargs)


def reader(endpoint: str, **kwargs: Any) -> CmqClient:
    return CmqClient(endpoint, READER_ID, READER_KEY, **kwargs)


def eventually(check: Callable[[], Any], timeout: float = WAIT) -> Any:
    """The first truthy value of ``check()``; hang protection only."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def drain(client: CmqClient, queue: str) -> list[dict[str, Any]]:
    """Receive and delete everything Active in ``queue`` now."""
    out = []
    while True:
        answer = client.call("BatchReceiveMessage", queueName=queue, numOfMsg=16, pollingWaitSeconds=0)
        if answer["code"] == 7000:
            return out
        assert answer["code"] == 0, answer
        out.extend(answer["msgInfoList"])
        client.ok("BatchDeleteMessage", queueName=queue, receiptHandle=[m["receiptHandle"] for m in answer["msgInfoList"]])
