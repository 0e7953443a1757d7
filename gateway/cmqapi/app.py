"""CMQ's HTTP API over HTTP(S) (CA1): ``/v2/index.php``, parameters by GET (query) or POST
(an ``application/x-www-form-urlencoded`` body, whatever Content-Type the client sends, as
the SDKs send it), the JSON answer always with HTTP status 200, as CMQ answers."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from gateway.admission import audit_http_login, http_peer
from gateway.cmqapi.core import PATH, PROTOCOL, Caller, CmqApi
from gateway.cmqapi.errors import CmqApiError

__all__ = ["make_app", "start_cmq_api"]

API: web.AppKey[CmqApi] = web.AppKey("cmq_api", CmqApi)


def _params(pairs: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in pairs:
        if name in out:
            raise CmqApiError.param(f"parameter {name} is NOT a repeatable parameter", 10330)
        out[name] = value
    return out


async def _handle(request: web.Request) -> web.Response:
    api = request.app[API]
    try:
        if request.method not in ("GET", "POST"):
            raise CmqApiError.param(f"unexpected http {request.method} only GET or POST is supported", 10410)
        pairs = list(request.query.items())
        if request.method == "POST":
            body = (await request.read()).decode("utf-8", errors="replace")
            pairs += parse_qsl(body, keep_blank_values=True)
        params = _params(pairs)
    except CmqApiError as e:
        return web.json_response(e.answer(""))
    def logged_in(caller: Caller) -> None:
        audit_http_login(request, api.broker.audit, user=caller.user, vhost=caller.vhost, protocol=PROTOCOL)

    answer = await api.call(params, method=request.method, host=request.host, path=request.path,
                            peer=http_peer(request), on_login=logged_in)
    return web.json_response(answer)


def make_app(api: CmqApi) -> web.Application:
    app = web.Application(client_max_size=4 << 20)  # 16 bodies of 64 KB, URL-encoded
    app[API] = api
    app.router.add_route("*", PATH, _handle)

    async def stop_polls(app: web.Application) -> None:
        app[API].closing = True  # before aiohttp waits for the handlers in flight

    async def close_pusher(app: web.Application) -> None:
        await app[API].pusher.close()
    app.on_shutdown.append(stop_polls)
    app.on_cleanup.append(close_pusher)
    return app


async def start_cmq_api(gateway: Any, host: str = "127.0.0.1", port: int = 0, *,
                        ssl_context: Any = None, sockets: list[socket.socket] | None = None) -> web.AppRunner:
    """Serve CMQ's API for a Gateway in the running loop (the broker's); over HTTPS with an
    ``ssl_context`` (SE2). Port 0 picks a free port (``runner.addresses[0][1]``); ``sockets``
    (bound and listening) are served instead of (host, port). Persisted HTTP subscriptions are
    restored (as the management API does; it is idempotent). Connections are admitted as on
    every listener (SE5, gateway/admission.py): counted, silent or trickling ones closed."""
    from gateway.metrics import serve_app

    api = CmqApi(gateway.broker, gateway.config, gateway=gateway)
    api.pusher.recover()
    return await serve_app(make_app(api), host, port, ssl_context, sockets, obj=gateway, name="CMQ API")
