"""A management path ending in a slash is the same route as without it, as RabbitMQ's
management plugin (cowboy) answers ``GET /api/overview/`` and ``/api/overview`` alike
(tooling such as amqp091-go's tests builds URLs that way: issue 30).

Each route is registered once more with the slash, the same handler and the same variable
patterns, so the slash form is resolved, authorized (authz keys ignore the slash) and served
by the very code of the plain form, with no redirect and no second dispatch of the request."""

from __future__ import annotations

import re

from aiohttp import web

__all__ = ["add_slash_routes"]

_DEFAULT_VAR = "[^{}/]+"  # aiohttp's pattern of a plain {name}
_VAR = re.compile(r"\(\?P<(\w+)>((?:[^()]|\([^()]*\))*)\)")


def _path_of(resource: web.AbstractResource) -> str | None:
    """The path a resource was added with, variable patterns included; None for others."""
    info = resource.get_info()
    if "path" in info:
        return str(info["path"])
    pattern = info.get("pattern")
    formatter = info.get("formatter")
    if pattern is None or formatter is None:
        return None
    path = str(formatter)
    for name, regex in _VAR.findall(pattern.pattern):
        if regex != _DEFAULT_VAR:
            path = path.replace("{" + name + "}", "{" + name + ":" + regex + "}")
    return path


def add_slash_routes(app: web.Application) -> None:
    for route in list(app.router.routes()):
        resource = route.resource
        path = _path_of(resource) if resource is not None else None
        if path is None or path.endswith("/"):
            continue
        app.router.add_route(route.method, path + "/", route.handler)
