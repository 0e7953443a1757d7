"""A management path with a trailing slash is the route without it, as on RabbitMQ's
management plugin (issue 30: amqp091-go's tests list connections through
``/api/connections/``). The same GETs, with and without the slash, against RabbitMQ and the
gateway: the same status on each side, and on each broker the same JSON both ways (SE1: the
slash form is authorized as the plain one)."""

from __future__ import annotations

import uuid
from typing import Any

import aio_pika
import aiohttp
import pytest

from gateway.management.app import make_app
from tests.integration.test_management_rabbitmq import Side, sides  # noqa: F401 - the fixture

pytestmark = pytest.mark.rabbitmq

PATHS = [
    "/api/overview", "/api/whoami", "/api/vhosts", "/api/vhosts/%2F", "/api/vhosts/%2F/permissions",
    "/api/exchanges", "/api/exchanges/%2F", "/api/exchanges/%2F/amq.direct",
    "/api/exchanges/%2F/{x}/bindings/source", "/api/exchanges/%2F/{x}/bindings/destination",
    "/api/queues", "/api/queues/%2F", "/api/queues/%2F/{q}",
    "/api/queues/%2F/{q}/bindings", "/api/bindings", "/api/bindings/%2F", "/api/bindings/%2F/e/{x}/q/{q}",
    "/api/connections", "/api/channels", "/api/vhosts/%2F/connections", "/api/vhosts/%2F/channels",
    "/api/consumers", "/api/consumers/%2F", "/api/users",
    "/api/users/guest", "/api/users/guest/permissions", "/api/permissions", "/api/permissions/%2F/guest",
    "/api/policies", "/api/policies/%2F", "/api/nodes", "/api/definitions", "/api/health/checks/alarms",
    "/api/queues/%2F/no-such-queue", "/api/no-such-route",
]


async def _status_and_body(side: Side, path: str) -> tuple[int, Any]:
    async with side.http.get(side.base + path) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body


def _shape(body: Any) -> Any:
    """What may be compared between two reads a moment apart: keys, not changing values."""
    if isinstance(body, dict):
        return sorted(body)
    if isinstance(body, list):
        return ("list", _shape(body[0]) if body else None)
    return type(body).__name__


async def test_trailing_slash_is_the_same_route_on_both(sides: tuple[Side, Side]) -> None:  # noqa: F811
    outcome: dict[str, list[tuple[str, int, int]]] = {}
    for side in sides:
        name = f"slash-{uuid.uuid4().hex[:8]}"
        conn = await aio_pika.connect(side.amqp)
        try:
            ch = await conn.channel()
            x = await ch.declare_exchange(name, aio_pika.ExchangeType.TOPIC)
            q = await ch.declare_queue(name, exclusive=True)
            await q.bind(x, "a.#")
            rows = []
            for template in PATHS:
                path = template.format(x=name, q=name)
                plain, plain_body = await _status_and_body(side, path)
                slash, slash_body = await _status_and_body(side, path + "/")
                assert slash == plain, (side.base, path, plain, slash)
                if plain == 200:
                    assert _shape(slash_body) == _shape(plain_body), (side.base, path)
                rows.append((template, plain, slash))
            outcome[side.base] = rows
        finally:
            await conn.close()
    rabbit, gateway = outcome.values()
    assert [r for r in gateway if r not in rabbit] == [], (gateway, rabbit)


async def test_every_route_has_its_slash_twin() -> None:
    from gateway.management.testing import operator_gateway

    async with operator_gateway() as og:
        app = make_app(og.gateway)
    served = {(r.method, r.resource.canonical): r.handler for r in app.router.routes() if r.resource is not None}
    plain = {k: h for k, h in served.items() if not k[1].endswith("/")}
    assert len(plain) > 80
    for (method, path), handler in plain.items():
        assert served.get((method, path + "/")) is handler, (method, path)


async def test_slash_twin_is_refused_to_a_lesser_user_as_the_plain_route() -> None:
    """SE1: a user without the administrator tag is refused /api/users/ as /api/users."""
    from gateway.management.testing import operator_gateway

    async with operator_gateway() as og, aiohttp.ClientSession(
            headers={"Authorization": aiohttp.encode_basic_auth("guest", "guest")}) as admin:
        async with admin.put(og.management_url + "/api/users/mon", json={"password": "pw", "tags": "monitoring"}) as r:
            assert r.status in (201, 204)
        async with aiohttp.ClientSession(headers={"Authorization": aiohttp.encode_basic_auth("mon", "pw")}) as mon:
            for path in ("/api/users", "/api/users/"):
                async with mon.get(og.management_url + path) as r:
                    assert r.status == 401, path
            for path in ("/api/overview", "/api/overview/"):
                async with mon.get(og.management_url + path) as r:
                    assert r.status == 200, path
