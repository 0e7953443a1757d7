"""The management HTTP application: basic auth, errors in RabbitMQ's shape, the runner.

RabbitMQ's management plugin answers a missing or wrong login with 401 and
``WWW-Authenticate: Basic realm="RabbitMQ Management"``, a user without a management tag
with 401 as well, a missing object with 404 ``{"error": "Object Not Found", "reason": "Not
Found"}`` and a refused operation with 400 ``{"error": "bad_request", "reason": ...}``. The same
here, so tools that handle those answers work unchanged. As in RabbitMQ the loopback-only
users (``guest``) may use the API only from loopback.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.admission import BEFORE_BODY, audit_http_login, http_peer
from gateway.auth import User, check_password
from gateway.management import authz
from gateway.metrics import Counters, RateTracker, Target, attach, serve_app
from gateway.push import HttpPusher
from gateway.transport import is_loopback
from semantics.errors import CMQError, LimitError
from semantics.names import cmq_name

__all__ = ["MGMT", "USER", "Management", "flag", "make_app", "not_authorised", "start_management"]

REALM = 'Basic realm="RabbitMQ Management"'
RATE_SAMPLE_SECONDS = 5.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: Any, *, user: str | None = None, cause: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.user = user  # a refused login: the user it named (audited, never told the client)
        self.cause = cause  # ... and why, as the AMQP transport's audit record says it


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def flag(body: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean field of a PUT body as RabbitMQ's management API reads it (rabbit_mgmt_util:
    parse_bool): true, false, "true" or "false"; anything else is 400 ["not_boolean", value],
    never Python's truth (``bool("false")`` made a queue durable that RabbitMQ makes transient)."""
    value = body.get(key, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise ApiError(400, "bad_request", ["not_boolean", value])


def cmq_queue_name(name: str) -> str | None:
    """The queue's CMQ name (L2); None for a name past AMQP's 255 bytes, which a store written
    before declarations refused such names may hold: one such queue must not make a list 400."""
    try:
        return cmq_name(name, "queue")
    except LimitError:
        return None


def jsonable(value: Any) -> Any:
    """AMQP table values as JSON: bytes as text, non-finite floats as strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


class Management:
    """State shared by the handlers: the target, its counters, rates and the HTTP pusher."""

    def __init__(self, obj: Any, pusher: HttpPusher | None = None) -> None:
        self.target = Target(obj)
        self.counters: Counters = attach(obj)
        self.pusher = pusher if pusher is not None else HttpPusher.of(self.target.broker)
        self.rates = RateTracker(self._rate_counts)

    @property
    def broker(self) -> Any:
        return self.target.broker

    def _rate_counts(self) -> dict[Any, int]:
        c = self.counters
        out: dict[Any, int] = {}
        for key, n in list(c.queue.items()):
            out["q", *key] = n
        for key, n in list(c.exchange.items()):
            out["x", *key] = n
        for (event, vhost), n in list(c.events.items()):
            out["e", vhost, event] = n
        for vhost, n in list(c.redelivered.items()):
            out["redeliver", vhost] = n
        for vhost, n in list(self.broker.confirmed.items()):
            out["confirm", vhost] = n
        return out

    def rate(self, *key: Any) -> float:
        return self.rates.rate(key)

    def vhost(self, name: str) -> Any:
        vh = self.broker.vhosts.get(name)
        if vh is None:
            raise not_found()
        return vh

    def login_vhosts(self, user: User | None) -> list[str]:
        """The vhosts whose objects the user sees: all for administrators, else those they
        may log in to over AMQP (RabbitMQ's ``filter_vhost``; monitors are no exception)."""
        names = sorted(self.broker.vhosts)
        if user is None or authz.is_admin(user):
            return names
        users = self.target.users
        return [v for v in names if users is not None and users.vhost_permission(user.name, v) is not None]

    def visible_vhosts(self, user: User | None) -> list[str]:
        """The vhosts the user may know of: all for administrators and monitors (RabbitMQ's
        ``list_visible_vhosts``), else their login vhosts."""
        if user is None or authz.is_monitor(user):
            return sorted(self.broker.vhosts)
        return self.login_vhosts(user)

    def vhost_names(self, request: web.Request) -> list[str]:
        return self.login_vhosts(request.get(USER))

    def vhosts_in(self, request: web.Request) -> list[str]:
        """The path's ``{vhost}`` (404 when missing), or every vhost the user sees objects in.
        Whether the user may use the path's vhost is the route's rule (authz)."""
        v = request.match_info.get("vhost")
        if v is None:
            return self.vhost_names(request)
        self.vhost(v)
        return [v]

    def check_vhost(self, request: web.Request, name: str) -> Any:
        """The vhost (404 when missing); the user's right to it was checked by its rule."""
        return self.vhost(name)

    def connection_named(self, name: str) -> Any:
        """The AMQP connection of that management name (RabbitMQ's "peer -> local"), or None."""
        from gateway.management.rabbit_api import connection_name
        return next((c for c in self.target.connections if connection_name(c) == name), None)

    def connection_user(self, name: str) -> str | None:
        conn = self.connection_named(name)
        return None if conn is None else str(conn.user)

    def sees_all_connections(self, request: web.Request) -> bool:
        user = request.get(USER)
        return user is None or authz.is_monitor(user)


MGMT: web.AppKey[Management] = web.AppKey("mgmt", Management)
SAMPLER: web.AppKey[asyncio.Task[None]] = web.AppKey("sampler", asyncio.Task)
USER: web.RequestKey[User] = web.RequestKey("user", User)
ADMITTED: web.RequestKey[bool] = web.RequestKey("admitted", bool)


def not_authorised(reason: str) -> ApiError:
    """RabbitMQ's refusal of a logged-in user (``not_authorised``, 401, no realm header)."""
    return ApiError(401, "not_authorised", reason)


def _auth_middleware(mgmt: Management) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if not request.get(ADMITTED, False):  # else admitted on its headers (before_body)
                _admit(mgmt, request)
            if USER in request:
                await mgmt.counters.sync()  # message_stats exact up to this request
            return await handler(request)
        except ApiError as e:
            return _answer(mgmt, request, e)
        except CMQError as e:
            status = 404 if e.reply_code == 404 else 400
            body = {"error": "Object Not Found" if status == 404 else "bad_request", "reason": str(e),
                    "rule": e.rule}
            return web.json_response(body, status=status)
    return middleware


# RabbitMQ's request body limits (management.http.max_body_size, CVE-2023-46118): a
# definitions import up to 20 MiB (200,000 queues), any other request up to 10 MiB.
DEFINITIONS_BODY = 20 << 20
OTHER_BODY = 10 << 20


def _admit(mgmt: Management, request: web.Request) -> None:
    """The login and the route's rule (SE1), on the request's headers alone."""
    request[ADMITTED] = True
    rule = authz.rule_for(request)
    if rule is None or rule.tag != "none":
        user = request[USER] = _login(mgmt, request)
        audit_http_login(request, mgmt.broker.audit, user=user.name, vhost="/", protocol=PROTOCOL)
        if rule is not None:
            _authorize(mgmt, request, user, rule)
    limit = DEFINITIONS_BODY if request.path.startswith("/api/definitions") else OTHER_BODY
    if (request.content_length or 0) > limit:  # RabbitMQ's words and status for it
        raise bad_request(f"Exceeded HTTP request body size limit ({limit} bytes)")


def _answer(mgmt: Management, request: web.Request, e: ApiError) -> web.Response:
    if e.status in (401, 403):  # a refused login, an SE1 or SE3 refusal
        _audit_refusal(mgmt, request, e)
    headers = {"WWW-Authenticate": REALM} if e.error == "not_authorized" else None
    return web.json_response({"error": e.error, "reason": e.reason}, status=e.status, headers=headers)


def _before_body(mgmt: Management) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
    """SE5: a request with a body is admitted (or refused) before its body is read
    (gateway.admission.BEFORE_BODY): a client that is not logged in, or may not use the
    route, sends nothing but its headers before it is answered."""
    async def before(request: web.Request) -> web.StreamResponse | None:
        try:
            _admit(mgmt, request)
        except ApiError as e:
            return _answer(mgmt, request, e)
        return None
    return before


PROTOCOL = "http"  # the audit records of this API's logins and refusals say so (A1, CA4)


def _refused(cause: str, user: str | None = None) -> ApiError:
    # The same answer whatever the cause, as RabbitMQ: a client cannot probe user names.
    return ApiError(401, "not_authorized", "Not Authorized", user=user, cause=cause)


def _login(mgmt: Management, request: web.Request) -> Any:
    header = request.headers.get("Authorization", "")
    users = mgmt.target.users
    if users is None or not header.startswith("Basic "):
        raise _refused("no credentials" if users is not None else "no users")
    try:
        name, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise _refused("malformed credentials")
    user = users.users.get(name)
    if user is None:
        raise _refused("unknown user", name)
    if not check_password(password, user.password_hash):
        raise _refused("wrong password", name)
    if name in users.loopback_users and not is_loopback(request.remote or ""):
        raise ApiError(401, "not_authorised", "User can only log in via localhost", user=name,
                       cause="loopback-only user from a remote address")
    if not authz.has_tag(user, "management"):
        raise ApiError(401, "not_authorised", "Not management user", user=name, cause="not a management user")
    return user


def _audit_refusal(mgmt: Management, request: web.Request, e: ApiError) -> None:
    """A1/W2: every refused login and every refusal of a logged-in user (SE1) is audited, as
    AMQP's and MQTT's are: ``auth_failure`` with the user, the peer, the path and why."""
    user = request.get(USER)
    name = user.name if user is not None else e.user
    why = e.cause or f"not_authorised: {e.reason}"
    vhost = request.match_info.get("vhost") if user is not None else None
    mgmt.broker.audit.emit("auth_failure", vhost or "/", user=name, peer=http_peer(request),
                           reason=f"{why} ({request.method} {request.path})", protocol=PROTOCOL)


def _authorize(mgmt: Management, request: web.Request, user: User, rule: authz.Rule) -> None:
    """SE1: the route's rule (gateway.management.authz), in RabbitMQ's order: the tag, the
    path's vhost, then the permission on each named resource."""
    if rule is authz.DENY:
        raise not_authorised("This route has no authorization rule (SE1)")
    if not authz.has_tag(user, rule.tag):
        raise not_authorised(authz.TAG_REASONS.get(rule.tag, "Not management user"))
    if rule.owner:
        owner = mgmt.connection_user(request.match_info["name"])
        needed = "monitoring" if request.method in ("GET", "HEAD") else "administrator"
        if owner is not None and owner != user.name and not authz.has_tag(user, needed):
            raise not_authorised("User not authorised to access object")
    vhost = request.match_info.get("vhost")
    if not rule.vhost or vhost is None or vhost not in mgmt.broker.vhosts:
        return  # no vhost to check, or a missing one: the handler answers 404
    if not authz.is_admin(user) and vhost not in mgmt.login_vhosts(user):
        raise not_authorised("User not authorised to access virtual host")
    users = mgmt.target.users
    perm = users.vhost_permission(user.name, vhost) if users is not None else None
    vh = mgmt.broker.vhosts[vhost]
    for check in rule.access:
        kind, name = authz.resource_of(check, request.match_info)
        if request.method != "PUT" and not _exists(vh, kind, name):
            # RabbitMQ asks resource_exists before the operation checks the permission: a
            # missing queue or exchange is 404 for everyone (only PUT creates).
            continue
        if perm is None or not perm.allows(check.access, name):
            raise not_authorised(f"ACCESS_REFUSED - {check.access} access to {kind} '{name or 'amq.default'}' "
                                 f"in vhost '{vhost}' refused for user '{user.name}' (SE1)")


def _exists(vh: Any, kind: str, name: str) -> bool:
    if kind == "queue":
        return name in vh.queues
    return name == "" or name in vh.exchanges


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


async def read_json(request: web.Request) -> dict[str, Any]:
    # Read (and kept) by the admission middleware already, within its deadline (SE5): the
    # stream is at its end then, so can_read_body says no more whether there was a body.
    raw = await request.read() if request.body_exists else b""
    if not raw:
        return {}
    try:
        # NaN and Infinity are not JSON, and RabbitMQ refuses them; Python's reader takes them.
        body = json.loads(raw, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        # RecursionError: nesting past Python's recursion limit (20 KB of "[" does it), a
        # body this reader cannot take: the client's fault, as any other unreadable body.
        raise bad_request("body is not JSON")
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    return body


def make_app(obj: Any, pusher: HttpPusher | None = None) -> web.Application:
    """The aiohttp application for a Gateway or Broker (see ``start_management``)."""
    from gateway.management import accounts_api, cmq_api, console, rabbit_api
    from gateway.management.slash import add_slash_routes

    mgmt = Management(obj, pusher)
    app = web.Application(middlewares=[_auth_middleware(mgmt)], client_max_size=DEFINITIONS_BODY)
    app[MGMT] = mgmt
    app[BEFORE_BODY] = _before_body(mgmt)
    rabbit_api.add_routes(app, mgmt)
    accounts_api.add_routes(app, mgmt)
    cmq_api.add_routes(app, mgmt)
    console.add_routes(app, mgmt)  # the web console at / and its message trace (UI1, UI3)
    add_slash_routes(app)  # RabbitMQ serves every path with a trailing slash too
    authz.check_table(app)
    app.on_startup.append(_start_sampler)
    app.on_cleanup.append(_stop_sampler)
    return app


async def _start_sampler(app: web.Application) -> None:
    mgmt: Management = app[MGMT]
    mgmt.rates.sample()

    async def loop() -> None:
        while True:
            await asyncio.sleep(RATE_SAMPLE_SECONDS)
            await mgmt.counters.sync()
            mgmt.rates.sample()

    app[SAMPLER] = asyncio.get_running_loop().create_task(loop())


async def _stop_sampler(app: web.Application) -> None:
    task = app.get(SAMPLER)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await app[MGMT].pusher.close()


async def start_management(obj: Any, host: str = "127.0.0.1", port: int = 15672, *,
                           pusher: HttpPusher | None = None,
                           ssl_context: Any = None, sockets: list[socket.socket] | None = None) -> web.AppRunner:
    """Serve the management API for a Gateway (or a bare Broker) in the running loop, which
    must be the broker's; over HTTPS with an ``ssl_context`` (an ssl.SSLContext, SE2). Port 0
    picks a free port (``runner.addresses[0][1]``); persisted HTTP subscriptions are restored.
    ``sockets`` (bound and listening) are served instead of (host, port).
    Stop with ``await runner.cleanup()``."""
    app = make_app(obj, pusher)
    app[MGMT].pusher.recover()
    return await serve_app(app, host, port, ssl_context, sockets, obj=obj, name="management API")
