"""Who may call which management route: one table, checked once per request (SPEC SE1).

Each route the application serves has exactly one entry in :data:`RULES`, keyed by (method,
path pattern as registered). An entry says what RabbitMQ's management plugin checks for the
same path (``rabbit_web_dispatch_access_control``):

* ``tag``: the least user tag the route needs: ``management`` (any management user),
  ``policymaker``, ``monitoring`` or ``administrator``; ``none`` needs no login at all.
  Every logged-in user needs a management tag first; a user without one gets 401 "Not
  management user", as RabbitMQ.
* ``vhost``: the path's ``{vhost}`` must be one the user may log in to over AMQP
  (``is_authorized_vhost``); administrators pass whatever their permissions.
* ``owner``: the path names a connection; its own user may read and close it, others need
  monitoring to read it and administrator to close it.
* ``access``: the user's configure / write / read pattern on the vhost must match the named
  queue or exchange, as RabbitMQ's channel checks them for the same operation made over AMQP
  (declare and delete: configure; publish: write on the exchange; get and purge: read on the
  queue; bind and unbind: read on the source, write on the destination). Administrators and
  monitors are no exception: "normal RabbitMQ permissions still apply".

RabbitMQ answers every refusal with 401 ``{"error": "not_authorised", "reason": ...}``; a
wrong or missing login with 401 ``not_authorized`` and a ``WWW-Authenticate`` header.

Adding a route is one line here, for example::

    ("GET", "/api/cmq/limits"): ANY,

A route the application serves without an entry stops :func:`check_table` (run by
``make_app``), so a new route cannot be reachable by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from gateway.auth import Access, User

__all__ = ["ADMIN", "ANY", "DENY", "MONITOR", "OPEN", "OWNER", "POLICIES", "RULES", "VHOST", "Check", "Rule", "check_table", "rule_for",
           "has_tag", "is_admin", "is_monitor", "unruled_routes"]

Tag = Literal["none", "management", "policymaker", "monitoring", "administrator"]
# RabbitMQ's tag predicates: which tags satisfy each required level.
TAG_LEVELS: dict[str, frozenset[str]] = {
    "management": frozenset({"administrator", "monitoring", "policymaker", "management"}),
    "policymaker": frozenset({"administrator", "policymaker"}),
    "monitoring": frozenset({"administrator", "monitoring"}),
    "administrator": frozenset({"administrator"}),
}
TAG_REASONS = {"policymaker": "User not authorised to access object", "monitoring": "Not monitor user",
               "administrator": "Not administrator user"}


@dataclass(frozen=True, slots=True)
class Check:
    """One permission check: ``access`` on the queue or exchange named by a path parameter.
    ``kind`` is ``queue``, ``exchange``, or ``dest`` (a binding's ``{kind}``: q or e)."""

    access: Access
    kind: str
    param: str


@dataclass(frozen=True, slots=True)
class Rule:
    tag: Tag = "management"
    vhost: bool = False
    access: tuple[Check, ...] = ()
    # The path's {name} is a connection: its own user may read and close it; otherwise
    # reading needs monitoring and closing administrator (RabbitMQ's is_authorized_user).
    owner: bool = False


OPEN = Rule("none")
ANY = Rule()
VHOST = Rule(vhost=True)
ADMIN = Rule("administrator")
MONITOR = Rule("monitoring")
OWNER = Rule(owner=True)
POLICIES = Rule("policymaker", vhost=True)  # RabbitMQ's is_authorized_policies
# Served without an entry (check_table stops that at start-up): refused to everyone.
DENY = Rule("administrator")


def _on(*checks: tuple[Access, str, str]) -> Rule:
    return Rule(vhost=True, access=tuple(Check(*c) for c in checks))


Q_CONFIGURE = _on(("configure", "queue", "name"))
X_CONFIGURE = _on(("configure", "exchange", "name"))
BIND = _on(("read", "exchange", "source"), ("write", "dest", "dest"))

# (method, path as registered) -> Rule. HEAD is checked as GET.
RULES: dict[tuple[str, str], Rule] = {
    # RabbitMQ's paths (gateway/management/rabbit_api.py, accounts_api.py)
    ("GET", "/api/overview"): ANY,
    ("GET", "/api/whoami"): ANY,
    ("GET", "/api/health/checks/alarms"): ANY,
    ("GET", "/api/health/checks/local-alarms"): ANY,
    # RabbitMQ's node list (memory, disk free, alarms) is for monitors (is_authorized_monitor).
    ("GET", "/api/nodes"): MONITOR,
    ("GET", "/api/nodes/{name}"): MONITOR,
    ("GET", "/api/vhosts"): ANY,
    ("GET", "/api/vhosts/{vhost}"): ADMIN,
    ("PUT", "/api/vhosts/{vhost}"): ADMIN,
    ("DELETE", "/api/vhosts/{vhost}"): ADMIN,
    ("GET", "/api/vhosts/{vhost}/permissions"): ADMIN,
    ("GET", "/api/users"): ADMIN,
    ("GET", "/api/users/{user}"): ADMIN,
    ("PUT", "/api/users/{user}"): ADMIN,
    ("DELETE", "/api/users/{user}"): ADMIN,
    ("GET", "/api/users/{user}/permissions"): ADMIN,
    ("GET", "/api/permissions"): ADMIN,
    ("GET", "/api/permissions/{vhost}/{user}"): ADMIN,
    ("PUT", "/api/permissions/{vhost}/{user}"): ADMIN,
    ("DELETE", "/api/permissions/{vhost}/{user}"): ADMIN,
    ("GET", "/api/queues"): ANY,
    ("GET", "/api/queues/{vhost}"): VHOST,
    ("GET", "/api/queues/{vhost}/{name}"): VHOST,
    ("PUT", "/api/queues/{vhost}/{name}"): Q_CONFIGURE,
    ("DELETE", "/api/queues/{vhost}/{name}"): Q_CONFIGURE,
    ("DELETE", "/api/queues/{vhost}/{name}/contents"): _on(("read", "queue", "name")),
    ("POST", "/api/queues/{vhost}/{name}/get"): _on(("read", "queue", "name")),
    ("GET", "/api/queues/{vhost}/{name}/bindings"): VHOST,
    ("GET", "/api/exchanges"): ANY,
    ("GET", "/api/exchanges/{vhost}"): VHOST,
    ("GET", "/api/exchanges/{vhost}/{name}"): VHOST,
    ("PUT", "/api/exchanges/{vhost}/{name}"): X_CONFIGURE,
    ("DELETE", "/api/exchanges/{vhost}/{name}"): X_CONFIGURE,
    ("POST", "/api/exchanges/{vhost}/{name}/publish"): _on(("write", "exchange", "name")),
    ("GET", "/api/exchanges/{vhost}/{name}/bindings/source"): VHOST,
    ("GET", "/api/exchanges/{vhost}/{name}/bindings/destination"): VHOST,
    ("GET", "/api/bindings"): ANY,
    ("GET", "/api/bindings/{vhost}"): VHOST,
    ("POST", "/api/bindings/{vhost}/e/{source}/{kind}/{dest}"): BIND,
    ("GET", "/api/bindings/{vhost}/e/{source}/{kind}/{dest}"): VHOST,
    ("GET", "/api/bindings/{vhost}/e/{source}/{kind}/{dest}/{props}"): VHOST,
    ("DELETE", "/api/bindings/{vhost}/e/{source}/{kind}/{dest}/{props}"): BIND,
    ("GET", "/api/connections"): ANY,  # lists filtered: own connections unless monitoring
    ("GET", "/api/connections/{name}"): OWNER,
    ("DELETE", "/api/connections/{name}"): OWNER,
    ("GET", "/api/channels"): ANY,
    ("GET", "/api/vhosts/{vhost}/connections"): VHOST,  # filtered as /api/connections
    ("GET", "/api/vhosts/{vhost}/channels"): VHOST,
    ("GET", "/api/consumers"): ANY,
    ("GET", "/api/consumers/{vhost}"): ANY,
    ("GET", "/api/policies"): ANY,
    ("GET", "/api/policies/{vhost}"): VHOST,
    ("GET", "/api/policies/{vhost}/{name}"): POLICIES,
    ("PUT", "/api/policies/{vhost}/{name}"): POLICIES,
    ("DELETE", "/api/policies/{vhost}/{name}"): POLICIES,
    ("GET", "/api/definitions"): ADMIN,
    ("GET", "/api/definitions/{vhost}"): ADMIN,
    ("POST", "/api/definitions"): ADMIN,
    ("POST", "/api/definitions/{vhost}"): ADMIN,
    # CMQ views (gateway/management/cmq_api.py), checked as their RabbitMQ counterparts
    ("GET", "/api/cmq/openapi.json"): OPEN,
    ("GET", "/api/cmq/topics"): ANY,
    ("GET", "/api/cmq/topics/{vhost}"): VHOST,
    ("GET", "/api/cmq/topics/{vhost}/{exchange}"): VHOST,
    ("PUT", "/api/cmq/topics/{vhost}/{exchange}/attributes"): _on(("configure", "exchange", "exchange")),
    ("GET", "/api/cmq/topics/{vhost}/{exchange}/subscriptions"): VHOST,
    # An HTTP subscription changes the topic and reads its messages out (SE3 limits where to).
    ("POST", "/api/cmq/topics/{vhost}/{exchange}/subscriptions"):
        _on(("configure", "exchange", "exchange"), ("read", "exchange", "exchange")),
    ("DELETE", "/api/cmq/topics/{vhost}/{exchange}/subscriptions/{name}"):
        _on(("configure", "exchange", "exchange"), ("read", "exchange", "exchange")),
    # PF4: the migration report, scoped to the vhosts the user may see; clearing it and
    # changing a vhost's profile (PF1) are the administrator's.
    ("GET", "/api/cmq/limits"): ANY,
    ("GET", "/api/cmq/limits/{vhost}"): VHOST,
    ("DELETE", "/api/cmq/limits/{vhost}"): ADMIN,
    ("GET", "/api/cmq/vhosts/{vhost}/profile"): VHOST,
    ("PUT", "/api/cmq/vhosts/{vhost}/profile"): ADMIN,
    ("GET", "/api/cmq/queues"): ANY,
    ("GET", "/api/cmq/queues/{vhost}"): VHOST,
    ("GET", "/api/cmq/queues/{vhost}/{queue}"): VHOST,
    ("POST", "/api/cmq/queues/{vhost}/{queue}/rewind"): _on(("read", "queue", "queue")),
    ("DELETE", "/api/cmq/queues/{vhost}/{queue}/messages"): _on(("read", "queue", "queue")),
    # UI3: a message's events from the audit log (gateway/management/trace.py): records carry
    # users, peers and routing keys of every client, so monitors only, within a vhost they see.
    ("GET", "/api/cmq/trace/{vhost}/{msg_id}"): Rule("monitoring", vhost=True),
    # UI1: the web console's files (gateway/management/console), public as RabbitMQ's login
    # page: they hold no data, every value is read through the routes above.
    ("GET", "/"): OPEN,
    ("GET", "/console/{file}"): OPEN,
}


def has_tag(user: User, level: str) -> bool:
    return level == "none" or bool(set(user.tags) & TAG_LEVELS[level])


def is_admin(user: User) -> bool:
    return has_tag(user, "administrator")


def is_monitor(user: User) -> bool:
    return has_tag(user, "monitoring")


def _key(method: str, path: str) -> tuple[str, str]:
    # A path with a trailing slash is the same route (gateway/management/slash.py).
    return ("GET" if method == "HEAD" else method, path[:-1] if len(path) > 1 and path.endswith("/") else path)


def rule_for(request: web.Request) -> Rule | None:
    """The request's rule. None for a path no route serves (aiohttp answers 404 or 405
    after the login); DENY for a served route without an entry (closed by default)."""
    match = request.match_info
    if match.http_exception is not None or match.route.resource is None:
        return None
    return RULES.get(_key(request.method, match.route.resource.canonical), DENY)


def unruled_routes(app: web.Application) -> list[tuple[str, str]]:
    """The (method, path) pairs the application serves without an entry in RULES."""
    out = []
    for route in app.router.routes():
        resource = route.resource
        if resource is None:
            continue
        key = _key(route.method, resource.canonical)
        if key not in RULES:
            out.append(key)
    return out


def check_table(app: web.Application) -> None:
    missing = unruled_routes(app)
    if missing:
        raise RuntimeError(f"management routes without an authorization rule (SE1): {missing}; "
                           "add them to gateway.management.authz.RULES")


def resource_of(check: Check, match: Any) -> tuple[str, str]:
    """(kind for the reply text, name) of the resource a check is about."""
    name = str(match[check.param])
    if name == "amq.default":
        name = ""
    kind = check.kind
    if kind == "dest":
        kind = "queue" if match.get("kind") == "q" else "exchange"
    return kind, name
