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
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.auth import User, check_password
from gateway.metrics import Counters, RateTracker, Target, attach
from gateway.push import HttpPusher
from gateway.transport import is_loopback
from semantics.errors import CMQError

__all__ = ["MGMT", "USER", "Management", "make_app", "start_management"]

REALM = 'Basic realm="RabbitMQ Management"'
MANAGEMENT_TAGS = frozenset({"administrator", "management", "monitoring", "policymaker"})
WRITE_TAGS = frozenset({"administrator", "management", "policymaker"})
# Users that see every vhost, as RabbitMQ's administrator and monitoring tags.
ALL_VHOST_TAGS = frozenset({"administrator", "monitoring"})
RATE_SAMPLE_SECONDS = 5.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


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
        return out

    def rate(self, *key: Any) -> float:
        return self.rates.rate(key)

    def vhost(self, name: str) -> Any:
        vh = self.broker.vhosts.get(name)
        if vh is None:
            raise not_found()
        return vh

    def vhost_names(self, request: web.Request) -> list[str]:
        """The vhosts this user may see (all for administrator/monitoring, else permitted)."""
        user = request.get(USER)
        names = sorted(self.broker.vhosts)
        if user is None or set(user.tags) & ALL_VHOST_TAGS:
            return names
        users = self.target.users
        return [v for v in names if users is not None and (user.name, v) in users.permissions]

    def vhosts_in(self, request: web.Request) -> list[str]:
        """The path's ``{vhost}`` (checked), or every vhost the user may see."""
        v = request.match_info.get("vhost")
        if v is None:
            return self.vhost_names(request)
        self.check_vhost(request, v)
        return [v]

    def check_vhost(self, request: web.Request, name: str) -> Any:
        vh = self.vhost(name)
        if name not in self.vhost_names(request):
            raise ApiError(401, "not_authorised", f"User not authorised to access virtual host {name}")
        return vh


MGMT: web.AppKey[Management] = web.AppKey("mgmt", Management)
SAMPLER: web.AppKey[asyncio.Task[None]] = web.AppKey("sampler", asyncio.Task)
USER: web.RequestKey[User] = web.RequestKey("user", User)


def _auth_middleware(mgmt: Management) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if not request.path.startswith("/api/cmq/openapi"):
                request[USER] = _login(mgmt, request)
                await mgmt.counters.sync()  # message_stats exact up to this request
            return await handler(request)
        except ApiError as e:
            headers = {"WWW-Authenticate": REALM} if e.status == 401 else None
            return web.json_response({"error": e.error, "reason": e.reason}, status=e.status, headers=headers)
        except CMQError as e:
            status = 404 if e.reply_code == 404 else 400
            body = {"error": "Object Not Found" if status == 404 else "bad_request", "reason": str(e),
                    "rule": e.rule}
            return web.json_response(body, status=status)
    return middleware


def _login(mgmt: Management, request: web.Request) -> Any:
    header = request.headers.get("Authorization", "")
    users = mgmt.target.users
    if users is None or not header.startswith("Basic "):
        raise ApiError(401, "not_authorized", "Not Authorized")
    try:
        name, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise ApiError(401, "not_authorized", "Not Authorized")
    user = users.users.get(name)
    if user is None or not check_password(password, user.password_hash):
        raise ApiError(401, "not_authorized", "Not Authorized")
    if name in users.loopback_users and not is_loopback(request.remote or ""):
        raise ApiError(401, "not_authorized", "User can only log in via localhost")
    if not set(user.tags) & MANAGEMENT_TAGS:
        raise ApiError(401, "not_authorized", "Not management user")
    if request.method not in ("GET", "HEAD") and not set(user.tags) & WRITE_TAGS:
        raise ApiError(401, "not_authorized", "Not authorised")
    return user


async def read_json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("body is not JSON")
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    return body


def make_app(obj: Any, pusher: HttpPusher | None = None) -> web.Application:
    """The aiohttp application for a Gateway or Broker (see ``start_management``)."""
    from gateway.management import cmq_api, rabbit_api

    mgmt = Management(obj, pusher)
    app = web.Application(middlewares=[_auth_middleware(mgmt)])
    app[MGMT] = mgmt
    rabbit_api.add_routes(app, mgmt)
    cmq_api.add_routes(app, mgmt)
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
                           ssl_context: Any = None) -> web.AppRunner:
    """Serve the management API for a Gateway (or a bare Broker) in the running loop, which
    must be the broker's; over HTTPS with an ``ssl_context`` (an ssl.SSLContext, SE2). Port 0
    picks a free port (``runner.addresses[0][1]``); persisted HTTP subscriptions are restored.
    Stop with ``await runner.cleanup()``."""
    app = make_app(obj, pusher)
    app[MGMT].pusher.recover()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return runner
