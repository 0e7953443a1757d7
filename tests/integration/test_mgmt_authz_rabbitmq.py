"""SE1 differential: the same requests, by users with each tag, against RabbitMQ's own
management plugin (127.0.0.1:15672, guest/guest) and the gateway: the same status class,
and the same 401 where RabbitMQ refuses. Users and vhosts are made with unique names on
both sides (through each side's own API, as guest) and deleted afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from gateway.management.testing import operator_gateway
from tests.integration.test_management_rabbitmq import RABBIT_HTTP, _up

pytestmark = pytest.mark.rabbitmq

TAGS = ("administrator", "monitoring", "policymaker", "management", "none")
PASSWORD = "authz-pw"
GUEST = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}


class Side:
    def __init__(self, base: str, http: aiohttp.ClientSession, uid: str) -> None:
        self.base, self.http, self.uid = base, http, uid
        self.users: list[str] = []
        self.vhosts: list[str] = []

    async def request(self, method: str, path: str, user: str | None = None, body: Any = None) -> int:
        headers = GUEST if user is None else {"Authorization": aiohttp.encode_basic_auth(user, PASSWORD)}
        async with self.http.request(method, self.base + path, json=body, headers=headers) as r:
            await r.read()
            return r.status

    async def setup(self) -> None:
        """Vhosts own/other, one user per tag with full rights on own, and 'narrow' (management,
        configure ^$ on own), through the side's API as guest."""
        for v in ("own", "other"):
            name = f"{v}-{self.uid}"
            assert await self.request("PUT", f"/api/vhosts/{name}") in (201, 204)
            self.vhosts.append(name)
        for tag in (*TAGS, "narrow"):
            name = f"{tag}-{self.uid}"
            tags = "management" if tag == "narrow" else "" if tag == "none" else tag
            assert await self.request("PUT", f"/api/users/{name}", body={"password": PASSWORD, "tags": tags}) in (201, 204)
            self.users.append(name)
            perm = {"configure": "^$" if tag == "narrow" else ".*", "write": ".*", "read": ".*"}
            assert await self.request("PUT", f"/api/permissions/own-{self.uid}/{name}", body=perm) in (201, 204)
        full = {"configure": ".*", "write": ".*", "read": ".*"}  # guest too: permissions bind administrators
        assert await self.request("PUT", f"/api/permissions/own-{self.uid}/guest", body=full) in (201, 204)
        assert await self.request("PUT", f"/api/queues/own-{self.uid}/q", body={"durable": False}) in (201, 204)

    async def cleanup(self) -> None:
        for name in self.users:
            await self.request("DELETE", f"/api/users/{name}")
        for name in self.vhosts:
            await self.request("DELETE", f"/api/vhosts/{name}")


# (method, path with {own}/{other}/{user}, body): a representative subset of the table.
REQUESTS: list[tuple[str, str, Any]] = [
    ("GET", "/api/overview", None),
    ("GET", "/api/whoami", None),
    ("GET", "/api/vhosts", None),
    ("GET", "/api/vhosts/{own}", None),
    ("GET", "/api/users", None),
    ("GET", "/api/users/{user}", None),
    ("GET", "/api/permissions", None),
    ("GET", "/api/definitions", None),
    ("GET", "/api/connections", None),
    ("GET", "/api/queues", None),
    ("GET", "/api/queues/{own}", None),
    ("GET", "/api/queues/{other}", None),
    ("GET", "/api/queues/{own}/q", None),
    ("PUT", "/api/queues/{own}/q2", {"durable": False}),
    ("PUT", "/api/queues/{other}/q2", {"durable": False}),
    ("DELETE", "/api/queues/{own}/q2", None),
    ("PUT", "/api/exchanges/{own}/x2", {"type": "fanout", "durable": False}),
    ("DELETE", "/api/queues/{own}/q/contents", None),
    ("GET", "/api/exchanges/{own}", None),
    ("GET", "/api/bindings/{other}", None),
]


def _fill(path: str, uid: str, tag: str) -> str:
    return (path.replace("{own}", quote(f"own-{uid}", safe="")).replace("{other}", quote(f"other-{uid}", safe=""))
            .replace("{user}", f"management-{uid}"))


def _class(status: int) -> str:
    return "401" if status == 401 else f"{status // 100}xx"


@pytest_asyncio.fixture(loop_scope="function")
async def sides() -> AsyncIterator[tuple[Side, Side]]:
    if not _up(15672):
        raise RuntimeError("RabbitMQ with rabbitmq_management must run on 127.0.0.1:15672 for the SE1 "
                           "differential: rabbitmq-plugins enable rabbitmq_management")
    uid = uuid.uuid4().hex[:10]
    async with operator_gateway() as og, aiohttp.ClientSession() as http:
        rabbit, gateway = Side(RABBIT_HTTP, http, uid), Side(og.management_url, http, uid)
        try:
            await rabbit.setup()
            await gateway.setup()
            yield rabbit, gateway
        finally:
            await rabbit.cleanup()
            await gateway.cleanup()


async def test_SE1_tags_and_permissions_answer_as_rabbitmq(sides: tuple[Side, Side]) -> None:
    rabbit, gateway = sides
    uid = rabbit.uid
    differ = []
    for tag in (*TAGS, "narrow"):
        user = f"{tag}-{uid}"
        for method, path, body in REQUESTS:
            concrete = _fill(path, uid, tag)
            got = [await side.request(method, concrete, user, body) for side in (rabbit, gateway)]
            # Put back what an allowed request removed or made, on both, before the next one.
            for side in (rabbit, gateway):
                await side.request("DELETE", _fill("/api/queues/{own}/q2", uid, tag))
                await side.request("DELETE", _fill("/api/exchanges/{own}/x2", uid, tag))
                await side.request("PUT", _fill("/api/queues/{own}/q", uid, tag), body={"durable": False})
            if _class(got[0]) != _class(got[1]):
                differ.append((tag, method, path, "rabbitmq", got[0], "gateway", got[1]))
    assert not differ, "\n".join(map(str, differ))
