"""The management API's authorization defects of issue 11, each over real HTTP and AMQP
against a real gateway (SPEC SE1, SE3): privilege escalation through a definitions import,
password hashes, permission patterns ignored over HTTP, other users' connections, and HTTP
subscriptions pushing anywhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aio_pika
import aio_pika.exceptions
import aiohttp
import aiormq.exceptions
import pytest
import pytest_asyncio
from aiohttp import web

from gateway.auth import Permission, User, UserDB, hash_password
from gateway.management.app import make_app
from gateway.management.testing import LOOPBACK_PUSH, OperatorGateway, operator_gateway
from gateway.push_policy import PushPolicy

PASSWORD = "secret"
WAIT = 15.0  # hang protection only


def basic(user: str, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


def userdb() -> UserDB:
    """guest (administrator, loopback); one user per tag with full rights on /; alice
    (management) who may configure nothing, carol who may neither write nor read."""
    h = hash_password(PASSWORD)
    users = {n: User(n, h, tags) for n, tags in (
        ("admin", ("administrator",)), ("mon", ("monitoring",)), ("pol", ("policymaker",)),
        ("mgr", ("management",)), ("bob", ("management",)), ("alice", ("management",)),
        ("carol", ("management",)), ("plain", ()))}
    users["guest"] = User("guest", hash_password("guest"), ("administrator",))
    perms = {(n, "/"): Permission() for n in ("admin", "mon", "pol", "mgr", "bob", "plain", "guest")}
    perms["alice", "/"] = Permission(configure="^$")
    perms["carol", "/"] = Permission(write="^$", read="^$")
    return UserDB(users, perms, ["/"])


@pytest_asyncio.fixture(loop_scope="function")
async def og() -> AsyncIterator[OperatorGateway]:
    async with operator_gateway(users=userdb(), push=LOOPBACK_PUSH) as g:
        yield g


async def call(og: OperatorGateway, method: str, path: str, user: str, body: Any = None,
               password: str = PASSWORD) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, \
            http.request(method, og.management_url + path, json=body, headers=basic(user, password)) as r:
        text = await r.text()
        return r.status, (await r.json()) if text else None


def amqp(og: OperatorGateway, user: str, password: str = PASSWORD) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{og.gateway.port}/%2F"


# -- 6: a management user makes themself an administrator ----------------------------------


async def test_SE1_a_management_user_cannot_import_an_administrator_or_reset_a_password(
        og: OperatorGateway) -> None:
    """Issue 11 item 6: POST /api/definitions is for administrators only (RabbitMQ's
    is_authorized_admin); the refused import changes nothing."""
    evil = {"users": [{"name": "evil", "password": "pwned", "tags": "administrator"},
                      {"name": "admin", "password": "pwned", "tags": "administrator"}],
            "permissions": [{"user": "evil", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}
    for user in ("mgr", "mon", "pol"):
        status, body = await call(og, "POST", "/api/definitions", user, evil)
        assert (status, body["error"], body["reason"]) == (401, "not_authorised", "Not administrator user")
        status, _ = await call(og, "POST", "/api/definitions/%2F", user, evil)
        assert status == 401
    assert (await call(og, "GET", "/api/whoami", "evil", password="pwned"))[0] == 401
    assert (await call(og, "GET", "/api/whoami", "admin"))[0] == 200  # password unchanged
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(amqp(og, "evil", "pwned"))
    # The control: an administrator's import does create the user, who logs in both ways.
    assert (await call(og, "POST", "/api/definitions", "admin", {"users": evil["users"][:1],
                                                                 "permissions": evil["permissions"]}))[0] == 200
    assert (await call(og, "GET", "/api/whoami", "evil", password="pwned"))[1]["tags"] == ["administrator"]
    conn = await aio_pika.connect(amqp(og, "evil", "pwned"))
    await conn.close()


# -- 7: password hashes -------------------------------------------------------------------


def _get_paths(og: OperatorGateway) -> list[str]:
    app = make_app(og.gateway)
    out = []
    for r in app.router.routes():
        # The API's routes (the web console's files at / and /console hold no data).
        if r.method == "GET" and r.resource is not None and r.resource.canonical.startswith("/api"):
            path = r.resource.canonical
            for key, value in (("vhost", "/"), ("name", "q"), ("exchange", "x"), ("queue", "q"), ("user", "admin"),
                               ("source", "x"), ("kind", "q"), ("dest", "q"), ("props", "k"), ("msg_id", "m")):
                path = path.replace("{" + key + "}", quote(value, safe=""))
            out.append(path)
    return out


async def test_SE1_no_password_hash_leaves_except_to_an_administrator(og: OperatorGateway) -> None:
    """Issue 11 item 7: every GET route, as each non-administrator tag: no hash anywhere.
    Administrators see them in the definitions export and /api/users, as in RabbitMQ."""
    users = og.gateway.config.users
    hashes = [u.password_hash for u in users.users.values()]
    conn = await aio_pika.connect(amqp(og, "mgr"))
    ch = await conn.channel()
    x = await ch.declare_exchange("x", aio_pika.ExchangeType.DIRECT)
    q = await ch.declare_queue("q")
    await q.bind(x, "k")
    try:
        for user in ("mgr", "mon", "pol"):
            for path in _get_paths(og):
                status, body = await call(og, "GET", path, user)
                text = str(body)
                assert "password_hash" not in text and not any(h in text for h in hashes), (user, path, status)
        status, body = await call(og, "GET", "/api/definitions", "mon")
        assert status == 401
        _, export = await call(og, "GET", "/api/definitions", "admin")
        assert {u["name"]: u["password_hash"] for u in export["users"]}["mgr"] == users.users["mgr"].password_hash
        _, listed = await call(og, "GET", "/api/users", "admin")
        assert {u["name"] for u in listed if u["password_hash"]} == set(users.users)
        _, one_vhost = await call(og, "GET", "/api/definitions/%2F", "admin")
        assert one_vhost["users"] == [] and one_vhost["permissions"] == []  # as RabbitMQ's vhost export
    finally:
        await conn.close()


# -- 8: permission patterns over HTTP ----------------------------------------------------


async def test_SE1_permission_patterns_apply_to_http_declare_delete_bind_publish_purge(og: OperatorGateway) -> None:
    """Issue 11 item 8: alice (configure ^$) can declare and delete nothing, not even bob's
    queue; carol (write ^$, read ^$) can neither publish, bind into a queue, get, nor purge. The
    refusal is RabbitMQ's 401 not_authorised naming the access."""
    assert (await call(og, "PUT", "/api/queues/%2F/bobs", "bob", {"durable": True}))[0] == 201
    assert (await call(og, "PUT", "/api/exchanges/%2F/bx", "bob", {"type": "direct"}))[0] == 201
    refused = [
        ("PUT", "/api/queues/%2F/alices", "alice", {"durable": True}),
        ("PUT", "/api/exchanges/%2F/ax", "alice", {"type": "fanout"}),
        ("DELETE", "/api/queues/%2F/bobs", "alice", None),
        ("DELETE", "/api/exchanges/%2F/bx", "alice", None),
        ("POST", "/api/exchanges/%2F/bx/publish", "carol",
         {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"}),
        ("POST", "/api/bindings/%2F/e/bx/q/bobs", "carol", {"routing_key": "k"}),
        ("DELETE", "/api/bindings/%2F/e/bx/q/bobs/k", "carol", None),
        ("DELETE", "/api/queues/%2F/bobs/contents", "carol", None),
        ("POST", "/api/queues/%2F/bobs/get", "carol", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}),
        ("DELETE", "/api/cmq/queues/%2F/bobs/messages", "carol", None),
    ]
    for method, path, user, body in refused:
        status, answer = await call(og, method, path, user, body)
        assert (status, answer["error"]) == (401, "not_authorised"), (method, path)
        assert "ACCESS_REFUSED" in answer["reason"] and "SE1" in answer["reason"]
    vh = og.broker.vhosts["/"]
    assert "bobs" in vh.queues and "bx" in vh.exchanges and "alices" not in vh.queues
    # alice may still bind (read on bx, write on bobs) and publish; bob may do everything.
    assert (await call(og, "POST", "/api/bindings/%2F/e/bx/q/bobs", "alice", {"routing_key": "k"}))[0] == 201
    status, routed = await call(og, "POST", "/api/exchanges/%2F/bx/publish", "alice",
                                {"routing_key": "k", "properties": {}, "payload": "hi", "payload_encoding": "string"})
    assert (status, routed) == (200, {"routed": True})
    assert vh.queues["bobs"].cmq.active == 1
    # alice reads it (read .*): requeued first, then acked away.
    get = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}
    status, got = await call(og, "POST", "/api/queues/%2F/bobs/get", "alice", get)
    assert status == 200
    assert [(m["payload"], m["redelivered"], m["exchange"], m["routing_key"]) for m in got] == [("hi", False, "bx", "k")]
    status, got = await call(og, "POST", "/api/queues/%2F/bobs/get", "alice", {**get, "ackmode": "ack_requeue_false"})
    assert (status, got[0]["redelivered"], vh.queues["bobs"].cmq.active) == (200, True, 0)
    assert (await call(og, "DELETE", "/api/bindings/%2F/e/bx/q/bobs/k", "alice"))[0] == 204  # unbind
    assert (await call(og, "GET", "/api/bindings/%2F/e/bx/q/bobs", "alice"))[1] == []
    assert (await call(og, "DELETE", "/api/queues/%2F/bobs", "bob"))[0] == 204


async def test_SE1_a_configure_pattern_selects_the_names(og: OperatorGateway) -> None:
    """W2 patterns are searched in the name, as RabbitMQ: configure ^team- grants team-* only."""
    users = og.gateway.config.users
    users.permissions["alice", "/"] = Permission(configure="^team-")
    assert (await call(og, "PUT", "/api/queues/%2F/team-jobs", "alice", {"durable": True}))[0] == 201
    assert (await call(og, "PUT", "/api/queues/%2F/jobs", "alice", {"durable": True}))[0] == 401
    assert (await call(og, "DELETE", "/api/queues/%2F/team-jobs", "alice"))[0] == 204


# -- 9: other users' connections ----------------------------------------------------------


async def test_SE1_connections_channels_consumers_are_the_user_s_own_unless_monitoring(og: OperatorGateway) -> None:
    """Issue 11 item 9: a management user sees their own connections, channels and consumers
    only; monitoring and administrator users see everyone's (RabbitMQ's filter_user)."""
    conns = {}
    for user in ("bob", "mgr"):
        conn = await aio_pika.connect(amqp(og, user))
        ch = await conn.channel()
        q = await ch.declare_queue(f"{user}-q", auto_delete=True)
        await q.consume(lambda m: None)  # type: ignore[arg-type, return-value]
        conns[user] = conn
    try:
        for viewer, seen in (("bob", {"bob"}), ("mgr", {"mgr"}), ("mon", {"bob", "mgr"}),
                             ("admin", {"bob", "mgr"}), ("pol", set())):
            for path, user_of in (("/api/connections", lambda c: c["user"]),
                                  ("/api/channels", lambda c: c["user"]),
                                  ("/api/vhosts/%2F/connections", lambda c: c["user"]),
                                  ("/api/vhosts/%2F/channels", lambda c: c["user"]),
                                  ("/api/connections?page=1&sort=user", lambda c: c["user"]),
                                  ("/api/vhosts/%2F/channels?page=1&page_size=1&name=%28&use_regex=false",
                                   lambda c: c["user"]),
                                  ("/api/consumers", lambda c: c["channel_details"]["user"]),
                                  ("/api/consumers/%2F", lambda c: c["channel_details"]["user"])):
                status, items = await call(og, "GET", path, viewer)
                assert status == 200
                if "page=" in path:  # the counts of a page are of what the user sees too (issue 29)
                    assert items["total_count"] == items["filtered_count"] == len(seen), (viewer, path)
                    items = items["items"]
                assert {user_of(i) for i in items} <= seen, (viewer, path)
                if "page_size=1" not in path:
                    assert {user_of(i) for i in items} == seen, (viewer, path)
    finally:
        for conn in conns.values():
            await conn.close()


async def test_SE1_monitoring_sees_every_vhost_management_only_its_own(og: OperatorGateway) -> None:
    users = og.gateway.config.users
    users.vhosts.append("hidden")
    og.broker.vhost("hidden")
    assert "hidden" in {v["name"] for v in (await call(og, "GET", "/api/vhosts", "mon"))[1]}
    assert "hidden" not in {v["name"] for v in (await call(og, "GET", "/api/vhosts", "mgr"))[1]}
    # Objects (queues, exchanges) only in login vhosts, for monitors too, as RabbitMQ.
    assert (await call(og, "GET", "/api/queues/hidden", "mon"))[0] == 401
    assert (await call(og, "GET", "/api/queues/hidden", "admin"))[0] == 200


# -- SE3: where HTTP subscriptions may push ------------------------------------------------


class Hits:
    def __init__(self) -> None:
        self.count = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.count += 1
        return web.Response(text="ok")


@pytest_asyncio.fixture(loop_scope="function")
async def endpoint() -> AsyncIterator[tuple[Hits, int]]:
    hits = Hits()
    app = web.Application()
    app.router.add_post("/notify", hits.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield hits, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def subscribe(og: OperatorGateway, url: str, name: str = "hook") -> tuple[int, Any]:
    return await call(og, "POST", "/api/cmq/topics/%2F/orders/subscriptions", "bob",
                      {"subscriptionName": name, "endpoint": url})


async def test_SE3_endpoints_outside_push_allow_or_at_private_addresses_are_refused(
        endpoint: tuple[Hits, int]) -> None:
    """SE3: 403 naming the rule for a URL no pattern allows, for a loopback / link-local /
    private / unspecified address (literal or after resolving the name), unless the
    network is in push.allow_addresses."""
    hits, port = endpoint
    policy = PushPolicy(allow=("http://*",))
    async with operator_gateway(users=userdb(), push=policy) as og:
        og.broker.vhost("/").declare_exchange("orders", "direct", passive=False, durable=False, auto_delete=False,
                                              internal=False, arguments={})
        for url in ("https://example.com/hook",  # no pattern allows https
                    f"http://127.0.0.1:{port}/notify", f"http://localhost:{port}/notify",
                    "http://169.254.169.254/latest/meta-data", "http://10.0.0.8/x", "http://0.0.0.0:80/",
                    "http://[::1]:80/", "http://[::ffff:127.0.0.1]:80/", "http://192.168.1.1/"):
            status, body = await subscribe(og, url)
            assert (status, body["error"]) == (403, "access_refused"), url
            assert "SE3" in body["reason"]
        assert not og.broker.vhosts["/"].exchanges["orders"].topic.subscriptions
    allowed = PushPolicy(allow=("http://localhost:*",), allow_addresses=("127.0.0.0/8", "::1/128"))
    async with operator_gateway(users=userdb(), push=allowed) as og:
        og.broker.vhost("/").declare_exchange("orders", "direct", passive=False, durable=False, auto_delete=False,
                                              internal=False, arguments={})
        assert (await subscribe(og, f"http://localhost:{port}/notify"))[0] == 201
        status, _ = await call(og, "POST", "/api/exchanges/%2F/orders/publish", "bob",
                               {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"})
        assert status == 200
        await asyncio.wait_for(og.pusher.idle(), WAIT)
        assert hits.count == 1


async def test_SE3_delivery_checks_the_addresses_again(endpoint: tuple[Hits, int]) -> None:
    """SE3 at delivery (DNS rebinding): the pusher's resolver checks the addresses it is
    about to connect to. A subscription made while localhost was allowed is not delivered
    once the policy refuses its addresses: no request reaches the endpoint, the push fails
    and the topic's retry policy keeps the message (D5/D6)."""
    hits, port = endpoint
    allowed = PushPolicy(allow=("http://localhost:*",), allow_addresses=("127.0.0.0/8", "::1/128"))
    async with operator_gateway(users=userdb(), push=allowed) as og:
        og.broker.vhost("/").declare_exchange("orders", "direct", passive=False, durable=False, auto_delete=False,
                                              internal=False, arguments={})
        assert (await subscribe(og, f"http://localhost:{port}/notify"))[0] == 201
        og.pusher.policy = PushPolicy(allow=("http://localhost:*",))  # the name now "resolves" to refused addresses
        status, _ = await call(og, "POST", "/api/exchanges/%2F/orders/publish", "bob",
                               {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"})
        assert status == 200
        await asyncio.wait_for(og.pusher.idle(), WAIT)
        assert (hits.count, og.pusher.failed, og.pusher.succeeded) == (0, 1, 0)
        _, subs = await call(og, "GET", "/api/cmq/topics/%2F/orders/subscriptions", "bob")
        assert subs[0]["msgCount"] == 1  # waiting for its retry


async def test_SE3_with_no_push_allow_no_http_subscription_is_created(endpoint: tuple[Hits, int]) -> None:
    """The default config allows no endpoint at all; the refusal is 403, not a 5xx."""
    _, port = endpoint
    async with operator_gateway(users=userdb()) as og:
        og.broker.vhost("/").declare_exchange("orders", "direct", passive=False, durable=False, auto_delete=False,
                                              internal=False, arguments={})
        status, body = await subscribe(og, f"http://127.0.0.1:{port}/notify")
        assert (status, body["error"]) == (403, "access_refused")
        assert "push.allow" in body["reason"]


async def test_SE1_deleting_a_user_or_vhost_closes_their_connections(og: OperatorGateway) -> None:
    """As RabbitMQ: a deleted user's (or vhost's) AMQP connections are closed with 320
    CONNECTION_FORCED, so a removed account keeps no access."""
    closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    conn = await aio_pika.connect(amqp(og, "bob"))
    conn.close_callbacks.add(lambda _, exc: closed.done() or closed.set_result(exc))
    other = await aio_pika.connect(amqp(og, "mgr"))
    try:
        assert (await call(og, "DELETE", "/api/users/bob", "admin"))[0] == 204
        exc = await asyncio.wait_for(closed, WAIT)
        assert "320" in str(exc) or "CONNECTION_FORCED" in str(exc)
        assert not other.is_closed
        assert (await call(og, "GET", "/api/whoami", "bob"))[0] == 401
        with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(amqp(og, "bob"))
        assert (await call(og, "PUT", "/api/vhosts/v2", "admin"))[0] == 201
        assert (await call(og, "PUT", "/api/permissions/v2/mgr", "admin",
                           {"configure": ".*", "write": ".*", "read": ".*"}))[0] == 201
        in_v2 = await aio_pika.connect(f"amqp://mgr:{PASSWORD}@127.0.0.1:{og.gateway.port}/v2")
        gone: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        in_v2.close_callbacks.add(lambda _, exc: gone.done() or gone.set_result(exc))
        await (await in_v2.channel()).declare_queue("doomed", durable=True)
        assert (await call(og, "DELETE", "/api/vhosts/v2", "admin"))[0] == 204
        assert "CONNECTION_FORCED" in str(await asyncio.wait_for(gone, WAIT))
        assert "v2" not in og.broker.vhosts and not og.broker.store.get("q/v2/doomed")
        assert (await call(og, "GET", "/api/vhosts/v2", "admin"))[0] == 404
        assert not other.is_closed
    finally:
        await other.close()


async def test_SE1_a_permission_changed_over_http_binds_open_connections(og: OperatorGateway) -> None:
    """An administrator narrows mgr's configure pattern over HTTP: mgr's open connection
    declares by the new pattern from then on (403 ACCESS_REFUSED, W2)."""
    conn = await aio_pika.connect(amqp(og, "mgr"))
    try:
        ch = await conn.channel()
        await ch.declare_queue("before", auto_delete=True)
        assert (await call(og, "PUT", "/api/permissions/%2F/mgr", "admin",
                           {"configure": "^$", "write": ".*", "read": ".*"}))[0] == 204
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await ch.declare_queue("after", auto_delete=True)
    finally:
        await conn.close()


async def test_SE1_a_connection_is_read_by_its_user_or_a_monitor_and_closed_by_its_user_or_an_admin(
        og: OperatorGateway) -> None:
    """RabbitMQ's is_authorized_user: GET /api/connections/{name} for its own user and
    monitors, DELETE for its own user and administrators (320 CONNECTION_FORCED)."""
    conns = [await aio_pika.connect(amqp(og, "bob")) for _ in range(2)]
    loop = asyncio.get_running_loop()
    closed = [loop.create_future() for _ in conns]
    for conn, done in zip(conns, closed, strict=True):
        conn.close_callbacks.add(lambda _, exc, done=done: done.done() or done.set_result(exc))
    try:
        _, items = await call(og, "GET", "/api/connections", "bob")
        names = [quote(c["name"], safe="") for c in items]
        assert len(names) == 2
        for viewer, want in (("bob", 200), ("mon", 200), ("admin", 200), ("mgr", 401), ("pol", 401)):
            status, body = await call(og, "GET", f"/api/connections/{names[0]}", viewer)
            assert status == want, viewer
            if want == 200:
                assert body["user"] == "bob"
        for closer, want in (("mgr", 401), ("mon", 401), ("admin", 204)):
            assert (await call(og, "DELETE", f"/api/connections/{names[0]}", closer))[0] == want, closer
        assert (await call(og, "DELETE", f"/api/connections/{names[1]}", "bob"))[0] == 204
        for exc in await asyncio.wait_for(asyncio.gather(*closed), WAIT):
            assert "CONNECTION_FORCED" in str(exc) and "Closed via management plugin" in str(exc)
        assert (await call(og, "GET", "/api/connections/nobody", "mgr"))[0] == 404
    finally:
        for conn in conns:
            await conn.close()
