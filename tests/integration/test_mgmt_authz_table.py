"""SE1 as a table: every management route the application serves (enumerated from its aiohttp
router, so a route added without a rule fails here) x every user tag x the user's own vhost
and another one -> the status RabbitMQ's management plugin gives.

The expectation is RabbitMQ's documented tag model ("Permissions" in the management plugin
guide): no tag -> no access to the API at all; management -> the vhosts the user may log in
to; policymaker and monitoring -> everything management can, plus theirs; administrator ->
everything, and users, vhosts, permissions and definitions are for administrators only.
Object permissions (configure/write/read) apply to administrators too. Each user here has
full permissions on vhost ``own`` and none on ``other``. Every refusal is RabbitMQ's 401
``not_authorised``; an allowed request gets any answer but a refusal or a 5xx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from gateway.accounts import Accounts
from gateway.auth import Permission, User, UserDB, hash_password
from gateway.management import authz
from gateway.management.app import make_app
from gateway.management.testing import LOOPBACK_PUSH, OperatorGateway, operator_gateway

TAGS = ("administrator", "monitoring", "policymaker", "management", "none")
OWN, OTHER = "own", "other"
PASSWORD = "secret"
HASH = hash_password(PASSWORD)
NOWHERE = "http://127.0.0.1:9/"  # never delivered to here: nothing is published

# RabbitMQ's documentation, written out independently of authz.RULES: the least tag each
# route needs ("none": no login). The table must agree with it.
DOCUMENTED_TAG = {
    ("GET", "/api/overview"): "management",
    ("GET", "/api/whoami"): "management",
    ("GET", "/api/vhosts"): "management",
    ("GET", "/api/vhosts/{vhost}"): "administrator",
    ("PUT", "/api/vhosts/{vhost}"): "administrator",
    ("DELETE", "/api/vhosts/{vhost}"): "administrator",
    ("GET", "/api/users"): "administrator",
    ("PUT", "/api/users/{user}"): "administrator",
    ("DELETE", "/api/users/{user}"): "administrator",
    ("GET", "/api/permissions"): "administrator",
    ("PUT", "/api/permissions/{vhost}/{user}"): "administrator",
    ("GET", "/api/definitions"): "administrator",
    ("POST", "/api/definitions"): "administrator",
    ("GET", "/api/connections"): "management",
    ("GET", "/api/channels"): "management",
    ("GET", "/api/consumers"): "management",
    ("GET", "/api/queues/{vhost}/{name}"): "management",
    ("PUT", "/api/queues/{vhost}/{name}"): "management",
    ("GET", "/api/policies"): "management",
    ("PUT", "/api/policies/{vhost}/{name}"): "policymaker",
    ("GET", "/api/cmq/openapi.json"): "none",
}
# RabbitMQ's tag inclusion: administrator does all policymaker and monitoring do, which do
# all management does.
SATISFIES = {
    "administrator": {"administrator", "policymaker", "monitoring", "management"},
    "policymaker": {"policymaker", "management"},
    "monitoring": {"monitoring", "management"},
    "management": {"management"},
    "none": set(),
}

BODIES: dict[tuple[str, str], Any] = {
    ("PUT", "/api/users/{user}"): {"password": "x", "tags": ""},
    ("PUT", "/api/permissions/{vhost}/{user}"): {"configure": ".*", "write": ".*", "read": ".*"},
    ("PUT", "/api/queues/{vhost}/{name}"): {"durable": False},
    ("PUT", "/api/exchanges/{vhost}/{name}"): {"type": "direct", "durable": False},
    ("POST", "/api/exchanges/{vhost}/{name}/publish"):
        {"routing_key": "k", "properties": {}, "payload": "hi", "payload_encoding": "string"},
    ("POST", "/api/bindings/{vhost}/e/{source}/{kind}/{dest}"): {"routing_key": "k"},
    ("POST", "/api/queues/{vhost}/{name}/get"): {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"},
    ("PUT", "/api/cmq/topics/{vhost}/{exchange}/attributes"): {"maxMsgSize": 65536},
    ("PUT", "/api/policies/{vhost}/{name}"): {"pattern": "^q$", "definition": {"max-length": 10}},
    ("POST", "/api/cmq/topics/{vhost}/{exchange}/subscriptions"):
        {"subscriptionName": "hook2", "endpoint": NOWHERE},
    ("POST", "/api/cmq/queues/{vhost}/{queue}/rewind"): {"rewindTo": 0},
}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


def user_name(tag: str) -> str:
    return f"u-{tag}"


def initial_users() -> UserDB:
    users = {user_name(t): User(user_name(t), HASH, () if t == "none" else (t,)) for t in TAGS}
    perms = {(user_name(t), OWN): Permission() for t in TAGS}
    return UserDB(users, perms, ["/", OWN, OTHER])


def reset(og: OperatorGateway) -> None:
    """The same starting state before every request (a request may delete or change it)."""
    gw = og.gateway
    acc = Accounts(gw.config.users, gw.broker)
    for v in (OWN, OTHER):
        acc.put_vhost(v)
    for t in TAGS:
        acc.put_user(user_name(t), HASH, () if t == "none" else (t,))
        acc.set_permission(user_name(t), OWN, Permission())
        acc.clear_permission(user_name(t), OTHER)
    acc.put_user("victim", HASH, ())
    for v in (OWN, OTHER):
        acc.set_permission("victim", v, Permission())
        vh = gw.broker.vhost(v)
        vh.declare_exchange("x", "direct", passive=False, durable=False, auto_delete=False, internal=False,
                            arguments={})
        vh.declare_queue(None, "q", passive=False, durable=False, exclusive=False, auto_delete=False,
                         arguments={})
        for name in ("hook", "hook2"):
            og.pusher.unsubscribe(v, "x", name)
        og.pusher.subscribe(v, "x", "hook", NOWHERE)
        vh.bind(None, "x", ("q", "q"), "k", {})


def concrete(path: str, vhost: str) -> str:
    """The route's path with every parameter naming an object reset() made."""
    name = "hook" if "/subscriptions/" in path else "x" if path.startswith("/api/exchanges") else "q"
    values = {"vhost": vhost, "name": name, "exchange": "x", "queue": "q", "source": "x", "kind": "q",
              "dest": "q", "user": "victim", "props": "k", "msg_id": "m", "file": "main.js"}
    for key, value in values.items():
        path = path.replace("{" + key + "}", quote(value, safe=""))
    return path


def expected_allowed(rule: authz.Rule, path: str, tag: str, vhost: str) -> bool:
    if rule.tag == "none":
        return True
    if rule.tag not in SATISFIES[tag]:
        return False
    # Not a login vhost; object permissions bind administrators too.
    return not ("{vhost}" in path and (rule.vhost or rule.access) and vhost == OTHER
                and (tag != "administrator" or bool(rule.access)))


@pytest_asyncio.fixture(loop_scope="function")
async def og() -> AsyncIterator[OperatorGateway]:
    async with operator_gateway(users=initial_users(), push=LOOPBACK_PUSH) as g:
        yield g


def served_routes(og: OperatorGateway) -> list[tuple[str, str]]:
    app = make_app(og.gateway)
    # A path's trailing-slash twin (gateway/management/slash.py) is the same route and rule.
    return sorted({(r.method, r.resource.canonical.rstrip("/") or "/") for r in app.router.routes()
                   if r.resource is not None})


def test_SE1_every_documented_route_has_rabbitmq_s_tag_in_the_table() -> None:
    for key, tag in DOCUMENTED_TAG.items():
        assert authz.RULES[key].tag == tag, key


async def test_SE1_table_covers_exactly_the_served_routes(og: OperatorGateway) -> None:
    served = {("GET" if m == "HEAD" else m, p) for m, p in served_routes(og)}
    assert not authz.unruled_routes(make_app(og.gateway))
    assert served == set(authz.RULES), (served ^ set(authz.RULES))


async def test_SE1_every_route_x_tag_x_vhost_as_rabbitmq(og: OperatorGateway) -> None:
    """SE1: ~900 requests; the mismatches are listed together."""
    wrong = []
    async with aiohttp.ClientSession() as http:
        for method, path in served_routes(og):
            rule = authz.RULES[("GET" if method == "HEAD" else method, path)]
            body = BODIES.get((method, path))
            for tag in TAGS:
                for vhost in (OWN, OTHER):
                    reset(og)
                    auth = basic(user_name(tag), PASSWORD)
                    url = og.management_url + concrete(path, vhost)
                    async with http.request(method, url, json=body, headers=auth) as r:
                        status = r.status
                        # A HEAD answer has no body to read the error from.
                        error = None if status != 401 else "not_authorised" if method == "HEAD" else (
                            (await r.json()).get("error"))
                    allowed = expected_allowed(rule, path, tag, vhost)
                    refused_right = status == 401 and error == "not_authorised"
                    if (allowed and (status in (401, 403) or status >= 500)) or (not allowed and not refused_right):
                        wrong.append((method, path, tag, vhost, status, error, "allow" if allowed else "401"))
    assert not wrong, "\n".join(map(str, wrong))


@pytest.mark.parametrize("path", ["/api/overview", "/api/queues", "/api/cmq/topics"])
async def test_SE1_a_user_without_tags_gets_401_and_a_wrong_password_the_realm(og: OperatorGateway,
                                                                               path: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(og.management_url + path, headers=basic("u-none", PASSWORD)) as r:
            assert r.status == 401
            assert await r.json() == {"error": "not_authorised", "reason": "Not management user"}
            assert "WWW-Authenticate" not in r.headers
        async with http.get(og.management_url + path, headers=basic("u-management", "wrong")) as r:
            assert r.status == 401
            assert (await r.json())["error"] == "not_authorized"
            assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
