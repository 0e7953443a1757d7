"""The profile in force and the migration report, under ``/api/cmq`` (SPEC PF1, PF4).

* ``GET /api/cmq/limits[/{vhost}]``: per vhost, its profile and, per CMQ rule, the objects
  and users (publishers, declarers) that broke a CMQ limit in the compatible profile, with
  counts, first and last seen and the worst value (the migration report).
* ``DELETE /api/cmq/limits/{vhost}``: start the vhost's report over (administrator).
* ``GET /api/cmq/vhosts/{vhost}/profile``: the vhost's profile, and whether it overrides the
  gateway's. ``PUT`` with ``{"profile": "cmq" | "compatible" | null}`` changes it from now on
  (administrator; null drops the override). Not kept across a restart: the config's
  ``vhosts: [{name, profile}]`` is.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.management.app import USER, ApiError, Management, bad_request, read_json

__all__ = ["add_routes"]


def _admin(request: web.Request) -> None:
    # Changing what refuses, or dropping what was reported, is an administrator's decision.
    if "administrator" not in request[USER].tags:
        raise ApiError(401, "not_authorised", "Not administrator user")


def _vhost_report(mgmt: Management, vhost: str) -> dict[str, Any]:
    broker = mgmt.broker
    return {"vhost": vhost, "profile": broker.profile_of(vhost).name,
            "rules": broker.limit_report.by_rule(vhost)}


def _profile_view(mgmt: Management, vhost: str) -> dict[str, Any]:
    broker = mgmt.broker
    return {"vhost": vhost, "profile": broker.profile_of(vhost).name,
            "gateway_profile": broker.profile.name, "override": vhost in broker.vhost_profiles}


def add_routes(app: web.Application, mgmt: Management) -> None:
    r = app.router

    async def limits(request: web.Request) -> web.Response:
        names = mgmt.vhosts_in(request)
        if "vhost" in request.match_info:
            return web.json_response(_vhost_report(mgmt, names[0]))
        return web.json_response({"profile": mgmt.broker.profile.name,
                                  "vhosts": [_vhost_report(mgmt, v) for v in names]})

    async def limits_delete(request: web.Request) -> web.Response:
        _admin(request)
        (name,) = mgmt.vhosts_in(request)
        mgmt.broker.limit_report.clear(name)
        return web.Response(status=204)

    async def profile(request: web.Request) -> web.Response:
        (name,) = mgmt.vhosts_in(request)
        return web.json_response(_profile_view(mgmt, name))

    async def profile_put(request: web.Request) -> web.Response:
        _admin(request)
        (name,) = mgmt.vhosts_in(request)
        body = await read_json(request)
        if "profile" not in body:
            raise bad_request("[{key_missing,profile}]")
        try:
            mgmt.broker.set_vhost_profile(name, body["profile"])
        except ValueError as e:
            raise bad_request(str(e)) from None
        return web.json_response(_profile_view(mgmt, name))

    r.add_get("/api/cmq/limits", limits)
    r.add_get("/api/cmq/limits/{vhost}", limits)
    r.add_delete("/api/cmq/limits/{vhost}", limits_delete)
    r.add_get("/api/cmq/vhosts/{vhost}/profile", profile)
    r.add_put("/api/cmq/vhosts/{vhost}/profile", profile_put)
