"""SE1 differential: the same requests, by users with each tag, against RabbitMQ's own
management plugin (127.0.0.1:15672, guest/guest) and the gateway: the same status class,
and the same 401 where RabbitMQ refuses. Users and vhosts are made with unique names on
both sides (through each side's own API, as guest) and deleted afterwards."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aio_pika
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
    def __init__(self, base: str, http: aiohttp.ClientSession, uid: str, amqp_port: int = 5672) -> None:
        self.base, self.http, self.uid, self.amqp_port = base, http, uid, amqp_port
        self.users: list[str] = []
        self.vhosts: list[str] = []

    async def request(self, method: str, path: str, user: str | None = None, body: Any = None) -> int:
        return (await self.call(method, path, user, body))[0]

    async def call(self, method: str, path: str, user: str | None = None, body: Any = None) -> tuple[int, Any]:
        headers = GUEST if user is None else {"Authorization": aiohttp.encode_basic_auth(user, PASSWORD)}
        async with self.http.request(method, self.base + path, json=body, headers=headers) as r:
            data = await r.read()
            return r.status, json.loads(data) if r.status == 200 and data else None

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
    ("GET", "/api/vhosts/{own}/connections", None),
    ("GET", "/api/vhosts/{other}/channels", None),
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
        rabbit, gateway = Side(RABBIT_HTTP, http, uid), Side(og.management_url, http, uid, og.gateway.port)
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


# RabbitMQ's paged lists (page, page_size, name, use_regex, sort): what each tag sees.
PAGED = [
    "/api/queues?page=1&page_size=50&name=paged-{uid}&sort=vhost",
    "/api/queues/{own}?page=1&page_size=50&name=paged-&use_regex=false",
    "/api/queues/{other}?page=1&page_size=50",
    "/api/exchanges?page=1&page_size=50&name=%5Epaged-{uid}$&use_regex=true&sort=vhost&sort_reverse=true",
    "/api/exchanges/{other}?page=1&page_size=50&name=paged",
    "/api/vhosts?page=1&page_size=50&name={uid}&sort=name",
    "/api/connections?page=1&page_size=500",
    "/api/channels?page=1&page_size=500",
]


def _comparable(body: dict[str, Any], path: str, tag: str) -> dict[str, Any]:
    """The counts of a page that hold only this test's objects on the shared RabbitMQ: all of
    them on a vhost's route or for a user who sees only their own; for administrators and
    monitors (who see the whole node) those after the name filter."""
    keys = ["page", "page_size"]
    if "{own}" in path or "{other}" in path or tag not in ("administrator", "monitoring"):
        keys += ["filtered_count", "item_count", "page_count", "total_count"]
    elif "name=" in path:
        keys += ["filtered_count", "item_count", "page_count"]
    if "/api/exchanges" in path:  # RabbitMQ's vhosts hold amq.rabbitmq.trace, the gateway's not
        keys = [k for k in keys if k != "total_count"]
    return {k: body[k] for k in keys}


async def _connect(side: Side, user: str, vhost: str) -> Any:
    conn = await aio_pika.connect(f"amqp://{user}:{PASSWORD}@127.0.0.1:{side.amqp_port}/{quote(vhost, safe='')}")
    await conn.channel()
    return conn


async def test_SE1_paged_lists_show_each_tag_what_rabbitmq_shows(sides: tuple[Side, Side]) -> None:
    """SE1 on the paged routes (issue 29: the console reads pages): every tag gets the same
    status, the same counts and the same objects of this test on both, so paging, sorting
    and filtering reveal nothing the unpaged list would not (a management user's own
    connections and channels, objects of its login vhosts only, monitors every vhost)."""
    rabbit, gateway = sides
    uid = rabbit.uid
    conns = []
    try:
        for side in sides:
            for v in ("own", "other"):
                vhost = quote(f"{v}-{uid}", safe="")
                full = {"configure": ".*", "write": ".*", "read": ".*"}
                assert await side.request("PUT", f"/api/permissions/{vhost}/guest", body=full) in (201, 204)
                assert await side.request("PUT", f"/api/queues/{vhost}/paged-{uid}", body={"durable": False}) in (201, 204)
                assert await side.request("PUT", f"/api/exchanges/{vhost}/paged-{uid}",
                                          body={"type": "fanout", "durable": False}) in (201, 204)
            for user in (f"management-{uid}", f"monitoring-{uid}"):
                conns.append(await _connect(side, user, f"own-{uid}"))
        # RabbitMQ lists connections and channels from its statistics, every 5 s, and the two
        # lists apart (a loaded machine showed the channels while the connections list was
        # still empty): both, on both sides, before comparing.
        deadline = time.monotonic() + 60.0
        while True:
            seen = [await side.call("GET", f"/api/{kind}?page=1&page_size=500")
                    for side in sides for kind in ("connections", "channels")]
            if all(sum(uid in str(c["user"]) for c in body["items"]) == 2 for _, body in seen):
                break
            assert time.monotonic() < deadline, f"RabbitMQ never listed this test's connections: {seen}"
            await asyncio.sleep(0.5)
        differ = []
        got: dict[tuple[str, str], Any] = {}
        for tag in (*TAGS, "narrow"):
            user = f"{tag}-{uid}"
            for path in PAGED:
                concrete = _fill(path, uid, tag).replace("{uid}", uid)
                answers: list[Any] = []
                for side in sides:
                    status, body = await side.call("GET", concrete, user)
                    if body is None:
                        answers.append((_class(status), None))
                        continue
                    ours = [i for i in body["items"] if uid in f"{i.get('vhost', '')} {i['name']} {i.get('user', '')}"]
                    shown = [(i.get("vhost"), i["user"] if "user" in i else i["name"]) for i in ours]
                    if "sort=" not in path:
                        shown.sort()
                    counts = _comparable(body, path, tag)
                    answers.append((_class(status), counts, shown))
                if answers[0] != answers[1]:
                    differ.append((tag, concrete, "rabbitmq", answers[0], "gateway", answers[1]))
                got[tag, path] = answers[1]
        assert not differ, "\n".join(map(str, differ))
        # What the comparison covered: own connections for a management user, everyone's for
        # a monitor; objects of the login vhost only; no list at all without a tag.
        own, other = f"own-{uid}", f"other-{uid}"
        assert got["management", PAGED[6]][2] == [(own, f"management-{uid}")]
        assert got["monitoring", PAGED[7]][2] == [(own, f"management-{uid}"), (own, f"monitoring-{uid}")]
        assert got["management", PAGED[0]][2] == [(own, f"paged-{uid}")]
        assert got["administrator", PAGED[0]][2] == [(other, f"paged-{uid}"), (own, f"paged-{uid}")]
        assert got["management", PAGED[2]] == ("401", None)
        assert got["none", PAGED[6]] == ("401", None)
    finally:
        for conn in conns:
            await conn.close()
