"""RabbitMQ's user, vhost and permission paths (administrators only: authz.RULES; SE1, SE4).

* ``GET /api/users``, ``GET|PUT|DELETE /api/users/{user}``, ``GET /api/users/{user}/permissions``
* ``PUT|DELETE /api/vhosts/{vhost}``, ``GET /api/vhosts/{vhost}/permissions``
* ``GET /api/permissions``, ``GET|PUT|DELETE /api/permissions/{vhost}/{user}``

Shapes as RabbitMQ's: a user is ``{name, password_hash, hashing_algorithm, tags, limits}``
(RabbitMQ shows administrators the hash here too), a permission ``{user, vhost, configure,
write, read}``; PUT answers 201 when it created, 204 when it changed. Every change goes
through gateway.accounts into the store and is answered once it is durable (SE4). Deleting a user or a vhost closes
the AMQP connections that use it (320 CONNECTION_FORCED), as RabbitMQ does. Every change is
audited with who made it (gateway.management.admin_audit).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from aiohttp import web

from gateway.accounts import Accounts
from gateway.auth import HASHING_ALGORITHMS, Permission, User, hash_password, hashing_algorithm
from gateway.management.admin_audit import actor
from gateway.management.app import ApiError, Management, bad_request, flag, not_found, read_json

__all__ = ["add_routes", "permission_pattern", "user_json"]

HASHING = "rabbit_password_hashing_sha256"


def user_json(u: User) -> dict[str, Any]:
    return {"name": u.name, "password_hash": u.password_hash,
            "hashing_algorithm": hashing_algorithm(u.password_hash) or HASHING,
            "tags": list(u.tags), "limits": {}}


def _perm_json(user: str, vhost: str, p: Permission) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # "administrator,management", as rabbitmqadmin sends
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a comma-separated string or a list of strings")


def _password_hash(body: dict[str, Any], current: User | None) -> str:
    """The stored hash a PUT of a user gives: from ``password``, or ``password_hash`` made by
    one of RabbitMQ's three hashing modules (``hashing_algorithm``, sha256 when absent, as an
    export from any RabbitMQ 3.6+ names it). ``""``, or neither on a new user, is a user with
    no password, who can log in only by EXTERNAL (RabbitMQ's passwordless user). RabbitMQ
    also stores a hash whose length its algorithm cannot have, or an algorithm it does not
    know; such a user can never log in there, and here it is refused (400)."""
    if "password" in body:
        if not isinstance(body["password"], str):
            raise bad_request("password must be a string")
        return hash_password(body["password"])
    if "password_hash" in body:
        value = body["password_hash"]
        if not isinstance(value, str):
            raise ApiError(400, "bad_request", ["not_base64", value])
        if value == "":
            return ""
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "bad_request", ["not_base64", value]) from None
        algorithm = body.get("hashing_algorithm", HASHING)
        if algorithm not in HASHING_ALGORITHMS.values():
            raise bad_request(f"hashing algorithm {algorithm!r} is not one of RabbitMQ's "
                              f"({', '.join(sorted(HASHING_ALGORITHMS.values()))})")
        if hashing_algorithm(value) != algorithm:
            raise bad_request(f"password_hash is not a {algorithm} hash (a 4-byte salt and its digest, base64)")
        return value
    if current is not None:
        return current.password_hash
    return ""


def permission_pattern(body: dict[str, Any], key: str) -> str:
    """A permission's ``configure``, ``write`` or ``read``: a regular expression, as RabbitMQ
    refuses any other (a PUT and a definitions import alike)."""
    if key not in body:
        raise bad_request(f"[{{key_missing,{key}}}]")
    value = body[key]
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a regular expression string")
    try:
        re.compile(value)
    except re.error as e:
        raise bad_request(f"{key}: invalid regular expression {value!r}: {e}")
    return value


def add_routes(app: web.Application, mgmt: Management) -> None:
    r = app.router

    def accounts() -> Accounts:
        users = mgmt.target.users
        if users is None:
            raise not_found()
        return Accounts(users, mgmt.broker)

    def close_connections(which: Any, reason: str) -> None:
        for conn in mgmt.target.connections:
            if which(conn) and hasattr(conn, "close_forced"):
                conn.close_forced(reason)

    # -- users -------------------------------------------------------------------------------

    async def users(request: web.Request) -> web.Response:
        return web.json_response([user_json(u) for _, u in sorted(accounts().users.users.items())])

    def existing_user(request: web.Request) -> User:
        u = accounts().users.users.get(request.match_info["user"])
        if u is None:
            raise not_found()
        return u

    async def user(request: web.Request) -> web.Response:
        return web.json_response(user_json(existing_user(request)))

    async def user_put(request: web.Request) -> web.Response:
        acc = accounts()
        name = request.match_info["user"]
        body = await read_json(request)
        current = acc.users.users.get(name)
        tags = _tags(body.get("tags")) if "tags" in body or current is None else list(current.tags)
        after = acc.put_user(name, _password_hash(body, current), tags)
        actor(request, mgmt.broker.audit).user_changed(current, after)
        await mgmt.broker.flush()
        return web.Response(status=204 if current is not None else 201)

    async def user_delete(request: web.Request) -> web.Response:
        name = request.match_info["user"]
        if not accounts().delete_user(name):
            raise not_found()
        actor(request, mgmt.broker.audit).emit("user_deleted", "", f"user:{name}")
        await mgmt.broker.flush()
        close_connections(lambda c: c.user == name, "user deleted")
        return web.Response(status=204)

    async def user_permissions(request: web.Request) -> web.Response:
        u = existing_user(request)
        perms = accounts().users.permissions
        return web.json_response([_perm_json(u.name, v, p) for (n, v), p in sorted(perms.items()) if n == u.name])

    # -- vhosts ------------------------------------------------------------------------------

    async def vhost_put(request: web.Request) -> web.Response:
        name = request.match_info["vhost"]
        flag(await read_json(request), "tracing", False)  # refused as RabbitMQ does; tracing is not kept
        created = accounts().put_vhost(name)
        if created:
            actor(request, mgmt.broker.audit).emit("vhost_created", name, f"vhost:{name}")
        await mgmt.broker.flush()
        return web.Response(status=201 if created else 204)

    async def vhost_delete(request: web.Request) -> web.Response:
        name = request.match_info["vhost"]
        vh = mgmt.vhost(name)
        close_connections(lambda c: c.vhost == name, f"vhost '{name}' is deleted")
        for key in [k for k in mgmt.pusher.subscriptions if k[0] == name]:
            mgmt.pusher.unsubscribe(*key)
        for qname in list(vh.queues):
            vh.delete_queue(None, qname, if_unused=False, if_empty=False, reason="vhost_deleted")
        for xname in [x for x in vh.exchanges if x and not x.startswith("amq.")]:
            vh.delete_exchange(xname, if_unused=False)
        # Its policies' records too: a start that recovered one made the vhost again.
        for pname in list(vh.policies):
            vh.delete_policy(pname)
        del mgmt.broker.vhosts[name]
        accounts().forget_vhost(name)
        actor(request, mgmt.broker.audit).emit("vhost_deleted", name, f"vhost:{name}")
        await mgmt.broker.flush()
        return web.Response(status=204)

    async def vhost_permissions(request: web.Request) -> web.Response:
        v = mgmt.vhost(request.match_info["vhost"]).name
        perms = accounts().users.permissions
        return web.json_response([_perm_json(u, v, p) for (u, pv), p in sorted(perms.items()) if pv == v])

    # -- permissions -------------------------------------------------------------------------

    async def permissions(request: web.Request) -> web.Response:
        perms = accounts().users.permissions
        return web.json_response([_perm_json(u, v, p) for (u, v), p in sorted(perms.items())])

    def user_and_vhost(request: web.Request) -> tuple[Accounts, str, str]:
        acc = accounts()
        name, v = request.match_info["user"], request.match_info["vhost"]
        if name not in acc.users.users or v not in acc.users.vhosts:
            raise not_found()
        return acc, name, v

    async def permission(request: web.Request) -> web.Response:
        acc, name, v = user_and_vhost(request)
        p = acc.users.permissions.get((name, v))
        if p is None:
            raise not_found()
        return web.json_response(_perm_json(name, v, p))

    async def permission_put(request: web.Request) -> web.Response:
        acc, name, v = user_and_vhost(request)
        body = await read_json(request)
        perm = Permission(*(permission_pattern(body, k) for k in ("configure", "write", "read")))
        existed = (name, v) in acc.users.permissions
        acc.set_permission(name, v, perm)
        actor(request, mgmt.broker.audit).emit("permission_created", v, f"permission:{name}")
        await mgmt.broker.flush()
        return web.Response(status=204 if existed else 201)

    async def permission_delete(request: web.Request) -> web.Response:
        acc, name, v = user_and_vhost(request)
        if not acc.clear_permission(name, v):
            raise not_found()
        actor(request, mgmt.broker.audit).emit("permission_deleted", v, f"permission:{name}")
        await mgmt.broker.flush()
        return web.Response(status=204)

    r.add_get("/api/users", users)
    r.add_get("/api/users/{user}", user)
    r.add_put("/api/users/{user}", user_put)
    r.add_delete("/api/users/{user}", user_delete)
    r.add_get("/api/users/{user}/permissions", user_permissions)
    r.add_put("/api/vhosts/{vhost}", vhost_put)
    r.add_delete("/api/vhosts/{vhost}", vhost_delete)
    r.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    r.add_get("/api/permissions", permissions)
    r.add_get("/api/permissions/{vhost}/{user}", permission)
    r.add_put("/api/permissions/{vhost}/{user}", permission_put)
    r.add_delete("/api/permissions/{vhost}/{user}", permission_delete)
