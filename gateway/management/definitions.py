"""RabbitMQ definitions: export, import with a report, and policies (SPEC M1-M8, W2).

``GET /api/definitions`` writes the shape ``rabbitmqctl export_definitions`` writes;
``POST /api/definitions`` takes such a file (RabbitMQ's own export, or ours) and imports
ALL of it, in RabbitMQ's order: vhosts, users, permissions, topic permissions, parameters,
global parameters, policies, exchanges, queues, bindings (then the gateway's HTTP
subscriptions). Nothing is dropped in silence: the answer counts what was imported (and what
was already there, unchanged) per kind, lists every object that was NOT imported with the
reason (and the SPEC rule when a CMQ limit refused it), and lists as notes what was imported
but has no effect here (a policy key such as ``ha-mode``, a queue argument such as
``x-max-length-bytes``). Importing the same file twice is not an error: equal objects count as
unchanged, and a conflicting one (another type, other arguments) is listed per object.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.accounts import Accounts
from gateway.admission import http_peer
from gateway.auth import HASHING_ALGORITHMS, Permission, User, hash_password, hashing_algorithm
from gateway.broker.arguments import CMQ_ATTRS, check_queue_kind_args
from gateway.broker.exchange import EXCHANGE_TYPES, X_MAX_MESSAGE_SIZE
from gateway.broker.policies import NOT_APPLIED, Policy, PolicyError
from gateway.management.accounts_api import permission_pattern
from gateway.management.admin_audit import Actor, actor
from gateway.management.app import USER, ApiError, Management, bad_request, jsonable, not_found, read_json
from semantics.errors import CMQError
from semantics.names import cmq_name

__all__ = ["IMPORT_PER_TURN", "KINDS", "add_policy_routes", "export_definitions", "export_definitions_in_turns",
           "import_definitions", "import_definitions_in_turns"]

# The RabbitMQ release whose wire and management API the gateway answers as: the one its
# differential tests run against (COMPATIBILITY.md says 3.10). One constant for every place
# that reports it (/api/overview, definitions exports).
COMPAT_VERSION = "3.10.8"
# SE5: objects of a definitions import or export (/api/definitions) handled per event-loop turn.
IMPORT_PER_TURN = 256
KINDS = ("vhosts", "users", "permissions", "topic_permissions", "parameters", "global_parameters",
         "policies", "exchanges", "queues", "bindings", "cmq_http_subscriptions")
_METADATA = frozenset(("rabbit_version", "rabbitmq_version", "product_name", "product_version"))
_ONE = {"vhosts": "vhost", "users": "user", "permissions": "permission", "policies": "policy",
        "exchanges": "exchange", "queues": "queue", "bindings": "binding",
        "cmq_http_subscriptions": "cmq_http_subscription"}

# Queue arguments the gateway applies (M7); any other is imported, kept, and noted.
_QUEUE_ARGS = frozenset((*CMQ_ATTRS, "x-cmq-dead-letter-queue", "x-cmq-receive-metadata", "x-dead-letter-exchange",
                         "x-dead-letter-routing-key", "x-max-length", "x-overflow", "x-message-ttl", "x-expires",
                         "x-single-active-consumer", "x-delivery-limit", "x-queue-type", "x-max-priority"))
_EXCHANGE_ARGS = frozenset(("alternate-exchange", X_MAX_MESSAGE_SIZE))
_QUEUE_ARG_NOTES = {
    "x-quorum-initial-group-size": "the gateway is one node: no replica count to choose",
}
_QUEUE_TYPE_NOTES = {
    "quorum": "a quorum queue is served as a CMQ queue (one copy, in the gateway's store); "
              "x-delivery-limit counts receives (M7)",
    "stream": "a stream is served as a CMQ queue: an acked message is deleted; consumers rewind by time "
              "with x-cmq-rewind-seconds and x-stream-offset as a timestamp (M15), not by offset",
}
_PLUGIN_EXCHANGES = {
    "x-delayed-message": "the delayed-message plugin's exchange is not supported; delay a message with "
                         "x-delay or x-cmq-delay-seconds on the default exchange (Q4, M10)",
}
_PARAMETER_REASONS = {
    "vhost-limits": "vhost limits (max-connections, max-queues) are not enforced by the gateway",
    "federation-upstream": "federation is not supported by the gateway",
    "federation-upstream-set": "federation is not supported by the gateway",
    "shovel": "shovels are not supported by the gateway",
}
_GLOBAL_REASONS = {
    "cluster_name": "the gateway's cluster name is set by its configuration, not imported",
    "internal_cluster_id": "RabbitMQ's internal cluster identity has no meaning for the gateway",
}


@dataclass
class ImportReport:
    imported: Counter[str] = field(default_factory=Counter)
    unchanged: Counter[str] = field(default_factory=Counter)
    not_imported: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    # (kind, vhost, name) of what failed, so that what depends on it says why it fails too.
    failed: set[tuple[str, str, str]] = field(default_factory=set)

    def skip(self, kind: str, item: dict[str, Any], reason: str, rule: str | None = None) -> None:
        entry = {"kind": kind, **item, "reason": reason}
        if rule is not None:
            entry["rule"] = rule
        self.not_imported.append(entry)
        self.failed.add((kind, str(item.get("vhost", "")), str(item.get("name", ""))))

    def note(self, kind: str, item: dict[str, Any], key: str, reason: str) -> None:
        self.notes.append({"kind": kind, **item, "key": key, "reason": reason})

    def to_json(self, applied: list[dict[str, Any]]) -> dict[str, Any]:
        return {"complete": not self.not_imported,
                "imported": {k: self.imported[k] for k in KINDS},
                "unchanged": {k: self.unchanged[k] for k in KINDS},
                "not_imported": self.not_imported, "notes": self.notes, "policies_applied": applied}


def _flag(raw: dict[str, Any], key: str, default: bool) -> bool:
    """A definitions file's boolean: RabbitMQ's import refuses any other value (``"false"``
    too), where Python's truth made a queue durable that the file said was not."""
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} {jsonable(value)!r} must be true or false")
    return value


def _reason(e: Exception) -> tuple[str, str | None]:
    if isinstance(e, CMQError):
        return e.reply_text, e.rule
    if isinstance(e, ApiError):
        return e.reason if isinstance(e.reason, str) else json.dumps(jsonable(e.reason)), None
    if isinstance(e, KeyError):
        return f"missing key {e.args[0]!r}", None
    return str(e) or type(e).__name__, None


# -- export --------------------------------------------------------------------------------------


def export_definitions(mgmt: Management, vhosts: list[str], *, with_users: bool = True) -> dict[str, Any]:
    """RabbitMQ's export. Only an administrator gets here (authz: the definitions routes),
    the one place password hashes leave the gateway besides /api/users (SE1)."""
    steps = _export(mgmt, vhosts, with_users)
    while (out := _step(steps)) is None:
        pass
    return out


async def export_definitions_in_turns(mgmt: Management, vhosts: list[str], *,
                                      with_users: bool = True) -> dict[str, Any]:
    """:func:`export_definitions` IMPORT_PER_TURN objects an event-loop turn (SE5). What a
    vhost holds is listed when its turn comes: an export taken while clients change things
    is as RabbitMQ's, a moment's view per object, not one instant's."""
    steps = _export(mgmt, vhosts, with_users)
    while (out := _step(steps)) is None:
        await asyncio.sleep(0)
    return out


def _export(mgmt: Management, vhosts: list[str], with_users: bool) -> Generator[None, None, dict[str, Any]]:
    users = mgmt.target.users if with_users else None
    out: dict[str, Any] = {
        "rabbit_version": COMPAT_VERSION, "rabbitmq_version": COMPAT_VERSION,
        "product_name": "cmq-gateway", "product_version": COMPAT_VERSION,
        "users": [], "vhosts": [{"name": v} for v in vhosts], "permissions": [],
        "topic_permissions": [], "parameters": [], "global_parameters": [], "policies": [],
        "queues": [], "exchanges": [], "bindings": [],
        # Gateway extension: HTTP(S) subscriptions (D7), which AMQP bindings cannot express.
        "cmq_http_subscriptions": [],
    }
    if users is not None:
        out["users"] = [{"name": u.name, "password_hash": u.password_hash,
                         "hashing_algorithm": hashing_algorithm(u.password_hash) or HASHING_ALGORITHMS[32],
                         "tags": list(u.tags), "limits": {}} for u in users.users.values()]
        out["permissions"] = [{"user": u, "vhost": v, "configure": p.configure, "write": p.write,
                               "read": p.read} for (u, v), p in users.permissions.items() if v in vhosts]
    done = 0  # objects listed since the last pause
    for v in vhosts:
        vh = mgmt.vhost(v)
        out["policies"].extend(p.to_json() for _, p in sorted(vh.policies.items()))
        # Copies: clients may add and delete between two turns (a deleted one is listed as it was).
        for q in list(vh.queues.values()):
            if q.exclusive_owner is None:
                out["queues"].append({"name": q.name, "vhost": v, "durable": q.durable,
                                      "auto_delete": q.auto_delete, "arguments": jsonable(q.arguments)})
            done += 1
            if done >= IMPORT_PER_TURN:
                done = 0
                yield
        exchanges = list(vh.exchanges.values())
        for ex in exchanges:
            if not ex.name.startswith("amq."):
                out["exchanges"].append({"name": ex.name, "vhost": v, "type": ex.type, "durable": ex.durable,
                                         "auto_delete": ex.auto_delete, "internal": ex.internal,
                                         "arguments": jsonable(ex.arguments)})
        for ex in exchanges:
            for binding in list(ex.bindings.values()):
                kind, dest = binding.dest
                for key in binding.keys:
                    out["bindings"].append({"source": ex.name, "vhost": v, "destination": dest,
                                            "destination_type": "queue" if kind == "q" else "exchange",
                                            "routing_key": key,
                                            "arguments": jsonable(binding.arguments.get(key) or {})})
                done += binding.key_count
                if done >= IMPORT_PER_TURN:
                    done = 0
                    yield
    for (v, x, name), s in sorted(mgmt.pusher.subscriptions.items()):
        if v in vhosts:
            out["cmq_http_subscriptions"].append({
                "vhost": v, "exchange": x, "name": name, "endpoint": s.url,
                "notify_strategy": s.notify_strategy, "notify_content_format": s.content_format,
                "filters": list(s.filters)})
    return out


# -- import --------------------------------------------------------------------------------------


def import_definitions(mgmt: Management, body: dict[str, Any], only_vhost: str | None = None,
                       user: str | None = None, peer: str | None = None) -> dict[str, Any]:
    """Import ``body`` (see the module docstring); the answer is the report. ``only_vhost``:
    RabbitMQ's per-vhost import (``POST /api/definitions/{vhost}``): every object goes into
    that vhost; vhosts, users and permissions are not imported (noted when present)."""
    steps = _import(mgmt, body, only_vhost, user, peer)
    while (report := _step(steps)) is None:
        pass
    return report


async def import_definitions_in_turns(mgmt: Management, body: dict[str, Any], only_vhost: str | None = None,
                                      user: str | None = None, peer: str | None = None) -> dict[str, Any]:
    """:func:`import_definitions` IMPORT_PER_TURN objects an event-loop turn: a file of
    thousands of objects lets the clients in between (SE5)."""
    steps = _import(mgmt, body, only_vhost, user, peer)
    while (report := _step(steps)) is None:
        await asyncio.sleep(0)
    return report


def _step(steps: Generator[None, None, dict[str, Any]]) -> dict[str, Any] | None:
    """One slice of an import or an export; what it makes once it is done, else None."""
    try:
        next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return None


def _import(mgmt: Management, body: dict[str, Any], only_vhost: str | None,
            user: str | None, peer: str | None) -> Generator[None, None, dict[str, Any]]:
    for kind in KINDS:
        if not isinstance(body.get(kind, []), list):
            raise bad_request(f"definitions: {kind} must be a list")
    report = ImportReport()
    run = _Import(mgmt, body, only_vhost, report, user, peer)
    if only_vhost is None:
        yield from run.vhosts()
        yield from run.users()
        yield from run.permissions()
    else:
        for kind in ("vhosts", "users", "permissions"):
            if body.get(kind):
                report.note(kind, {"vhost": only_vhost}, kind, "a per-vhost import does not import "
                            f"{kind} (as RabbitMQ); import the file with POST /api/definitions")
    run.unsupported()
    yield from run.policies()
    yield from run.exchanges()
    yield from run.queues()
    yield from run.bindings()
    yield from run.http_subscriptions()
    return report.to_json(run.applied())


class _Import:
    def __init__(self, mgmt: Management, body: dict[str, Any], only_vhost: str | None,
                 report: ImportReport, user: str | None, peer: str | None = None) -> None:
        self.mgmt = mgmt
        self.user = user  # who imports, for the audit records of the declares
        # ... and of the administrative changes; a start-up's import of the config file is
        # no one's action and writes none of those (it would repeat them at every start).
        self.who = Actor(mgmt.broker.audit, user, peer) if user is not None else None
        self.body = body
        self.only_vhost = only_vhost
        self.report = report
        self.users_db = mgmt.target.users
        # SE4: users, vhosts and permissions through Accounts, which journals them in the store.
        self.accounts = Accounts(self.users_db, mgmt.broker) if self.users_db is not None else None
        self.policy_names: list[tuple[str, str]] = []

    def _accounts(self) -> Accounts:
        if self.accounts is None:
            raise ValueError("this gateway has no user database")
        return self.accounts

    def items(self, kind: str) -> list[Any]:
        return list(self.body.get(kind) or [])

    def vhost_of(self, item: dict[str, Any]) -> str:
        return self.only_vhost if self.only_vhost is not None else str(item.get("vhost", "/"))

    def each(self, kind: str, describe: Any, action: Any) -> Iterator[None]:
        """``action(item)`` per object: True imported, False unchanged; a refusal is listed.
        Pauses (yields) every IMPORT_PER_TURN objects (SE5, import_definitions_in_turns)."""
        one = _ONE[kind]
        for i, raw in enumerate(self.items(kind)):
            if i and not i % IMPORT_PER_TURN:
                yield
            item = describe(raw) if isinstance(raw, dict) else {"value": jsonable(raw)}
            try:
                if not isinstance(raw, dict):
                    raise ValueError(f"each of {kind} must be an object")
                changed = action(raw, item)
            except (CMQError, ApiError, PolicyError, KeyError, TypeError, ValueError) as e:
                reason, rule = _reason(e)
                self.report.skip(one, item, reason, rule)
                continue
            if changed is None:
                continue  # listed by the action itself
            (self.report.imported if changed else self.report.unchanged)[kind] += 1

    def named(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {"vhost": self.vhost_of(raw), "name": raw.get("name")}

    # -- vhosts, users, permissions --------------------------------------------------------------

    def vhosts(self) -> Iterator[None]:
        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            name = raw["name"]
            if not isinstance(name, str) or not name:
                raise ValueError(f"vhost name {name!r} must be a non-empty string")
            broker = self.mgmt.broker
            known = name in broker.vhosts and (self.users_db is None or name in self.users_db.vhosts)
            broker.vhost(name)
            if self.accounts is not None and self.accounts.put_vhost(name) and self.who is not None:  # SE4: journaled
                self.who.emit("vhost_created", name, f"vhost:{name}")
            return not known
        yield from self.each("vhosts", lambda raw: {"name": raw.get("name")}, action)

    def users(self) -> Iterator[None]:
        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            db = self.users_db
            if db is None:
                raise ValueError("this gateway has no user database")
            name = raw["name"]
            if not isinstance(name, str) or not name:
                raise ValueError(f"user name {name!r} must be a non-empty string")
            tags = raw.get("tags", [])
            if isinstance(tags, str):
                tags = [t for t in tags.split(",") if t]
            if "password_hash" in raw:
                pw = raw["password_hash"]
                algorithm = raw.get("hashing_algorithm", HASHING_ALGORITHMS[32])
                if algorithm not in HASHING_ALGORITHMS.values():
                    raise ValueError(f"hashing algorithm {algorithm!r} is not one of RabbitMQ's "
                                     f"({', '.join(sorted(HASHING_ALGORITHMS.values()))})")
                if not isinstance(pw, str):
                    raise ValueError("password_hash must be a string")
                if pw and hashing_algorithm(pw) != algorithm:
                    raise ValueError(f"password_hash is not a {algorithm} hash")
                if not pw:
                    self.report.note("user", item, "password_hash", "no password: this user cannot log in "
                                     "with one (as in RabbitMQ)")
            elif "password" in raw:
                pw = hash_password(str(raw["password"]))
            else:
                raise KeyError("password_hash")
            if raw.get("limits"):
                self.report.note("user", item, "limits", "user limits (max-connections, max-channels) "
                                 "are not enforced by the gateway")
            user = User(name, pw, tuple(str(t) for t in tags))
            old = db.users.get(name)
            if old != user:
                self._accounts().put_user(name, pw, user.tags)  # SE4: journaled
                if self.who is not None:
                    self.who.user_changed(old, user)
            return old != user
        yield from self.each("users", lambda raw: {"name": raw.get("name")}, action)

    def permissions(self) -> Iterator[None]:
        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            db = self.users_db
            if db is None:
                raise ValueError("this gateway has no user database")
            user, vhost = str(raw["user"]), str(raw["vhost"])
            if user not in db.users:
                raise ValueError(f"no user '{user}'")
            if vhost not in db.vhosts:
                raise ValueError(f"no vhost '{vhost}'")
            perm = Permission(*(permission_pattern(raw, k) for k in ("configure", "write", "read")))
            old = db.permissions.get((user, vhost))
            if old != perm:
                self._accounts().set_permission(user, vhost, perm)  # SE4: journaled
                if self.who is not None:
                    self.who.emit("permission_created", vhost, f"permission:{user}")
            return old != perm
        yield from self.each("permissions", lambda raw: {"user": raw.get("user"), "vhost": raw.get("vhost")}, action)

    # -- what the gateway does not support: listed, one by one ------------------------------------

    def unsupported(self) -> None:
        r = self.report
        for key, value in self.body.items():
            if key not in KINDS and key not in _METADATA and value:
                r.skip("section", {"name": key}, "not a definitions section the gateway knows")
        for raw in self.items("topic_permissions"):
            r.skip("topic_permission", {"user": raw.get("user"), "vhost": raw.get("vhost"),
                                        "exchange": raw.get("exchange")},
                   "topic permissions (routing-key authorization on topic exchanges) are not enforced "
                   "by the gateway; the user's vhost permissions apply")
        for raw in self.items("parameters"):
            component = str(raw.get("component"))
            r.skip("parameter", {"vhost": self.vhost_of(raw), "component": component, "name": raw.get("name")},
                   _PARAMETER_REASONS.get(component, f"runtime parameters of component '{component}' are "
                                                     "not supported by the gateway"))
        for raw in self.items("global_parameters"):
            name = str(raw.get("name"))
            r.skip("global_parameter", {"name": name},
                   _GLOBAL_REASONS.get(name, "global runtime parameters are not supported by the gateway"))

    # -- policies, exchanges, queues, bindings ----------------------------------------------------

    def policies(self) -> Iterator[None]:
        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            vh = self.mgmt.vhost(item["vhost"])
            policy = Policy.checked(raw, vhost=vh.name)
            for key, why in policy.not_applied():
                self.report.note("policy", item, key, f"not applied: {why}")
            self.policy_names.append((policy.vhost, policy.name))
            if vh.policies.get(policy.name) == policy:
                return False
            vh.set_policy(policy)
            if self.who is not None:
                self.who.emit("policy_set", policy.vhost, f"policy:{policy.name}")
            return True
        yield from self.each("policies", self.named, action)

    def exchanges(self) -> Iterator[None]:
        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            vh = self.mgmt.vhost(item["vhost"])
            name, xtype = raw["name"], raw["type"]
            if not isinstance(name, str) or not isinstance(xtype, str):
                raise ValueError("name and type must be strings")
            if xtype not in EXCHANGE_TYPES:
                raise ValueError(_PLUGIN_EXCHANGES.get(
                    xtype, f"exchange type '{xtype}' is not supported (a plugin's type; the gateway serves "
                           f"{', '.join(EXCHANGE_TYPES)}: M2-M5)"))
            args = raw.get("arguments") or {}
            for arg in args:
                if arg not in _EXCHANGE_ARGS:
                    self.report.note("exchange", item, arg, "unknown exchange argument: kept, without effect")
            existed = name in vh.exchanges
            vh.declare_exchange(name, xtype, passive=False, durable=_flag(raw, "durable", True),
                                auto_delete=_flag(raw, "auto_delete", False),
                                internal=_flag(raw, "internal", False), arguments=args, user=self.user)
            return not existed
        yield from self.each("exchanges", self.named, action)

    def queues(self) -> Iterator[None]:
        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            vh = self.mgmt.vhost(item["vhost"])
            name = raw["name"]
            if not isinstance(name, str):
                raise ValueError("name must be a string")
            args = raw.get("arguments") or {}
            for arg, value in args.items():
                if arg == "x-queue-type":
                    why = _QUEUE_TYPE_NOTES.get(str(value))
                    if why is not None:
                        self.report.note("queue", item, arg, why)
                elif arg not in _QUEUE_ARGS:
                    why = _QUEUE_ARG_NOTES.get(arg) or NOT_APPLIED.get(arg[2:], "unknown queue argument")
                    self.report.note("queue", item, arg, f"kept, without effect: {why}")
            # The amq.* names below skip the declare's check.
            check_queue_kind_args(args, name, vh.name, durable=_flag(raw, "durable", True),
                                  auto_delete=_flag(raw, "auto_delete", False))
            existed = name in vh.queues
            server_name = None
            if name.startswith("amq.") and not existed:
                # A name the server gave (amq.gen-... of a durable server-named queue, an MQTT
                # session's amq.mqtt-..., MQ8): the export holds it, and RabbitMQ's import takes
                # it, for the reserved prefix is a rule for clients' declares. Declared as the
                # server names a queue, after the L2 check that path skips.
                cmq_name(name, "queue")
                name, server_name = "", name
            vh.declare_queue(None, name, passive=False, durable=_flag(raw, "durable", True),
                             exclusive=False, auto_delete=_flag(raw, "auto_delete", False),
                             arguments=args, user=self.user, server_name=server_name)
            return not existed
        yield from self.each("queues", self.named, action)

    def bindings(self) -> Iterator[None]:
        def describe(raw: dict[str, Any]) -> dict[str, Any]:
            return {"vhost": self.vhost_of(raw), "source": raw.get("source"), "destination": raw.get("destination"),
                    "destination_type": raw.get("destination_type"), "routing_key": raw.get("routing_key", "")}

        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            v = item["vhost"]
            vh = self.mgmt.vhost(v)
            source, dest_name = str(raw["source"]), str(raw["destination"])
            dtype = raw.get("destination_type", "queue")
            if dtype not in ("queue", "exchange"):
                raise ValueError(f"destination_type {dtype!r} must be queue or exchange")
            kind = "q" if dtype == "queue" else "x"
            for what, obj in (("exchange", source), (dtype, dest_name)):
                if (what, v, obj) in self.report.failed:
                    raise ValueError(f"{what} '{obj}' was not imported (see above)")
            key = str(raw.get("routing_key", ""))
            args = raw.get("arguments") or {}
            ex = vh.exchanges.get(source)
            binding = ex.bindings.get((kind, dest_name)) if ex is not None else None
            if binding is not None and binding.has_key(key):
                if jsonable(binding.arguments.get(key) or {}) == jsonable(args):
                    return False
                # RabbitMQ keeps both bindings; the gateway keeps one per routing key (M8).
                raise ValueError("the gateway keeps one binding per (source, destination, routing key); one "
                                 f"with arguments {jsonable(binding.arguments.get(key) or {})} exists")
            vh.bind(None, source, (kind, dest_name), key, args, user=self.user)
            if key == "" and vh.exchanges[source].type == "direct":
                self.report.note("binding", item, "routing_key", "binding key '' on a direct exchange takes "
                                 "EVERY message here (a CMQ subscription without tags, M2), not only those "
                                 "published with key '' as on RabbitMQ")
            return True
        yield from self.each("bindings", describe, action)

    def http_subscriptions(self) -> Iterator[None]:
        pusher = self.mgmt.pusher

        def action(raw: dict[str, Any], item: dict[str, Any]) -> bool:
            key = (item["vhost"], str(raw["exchange"]), str(raw["name"]))
            if key in pusher.subscriptions:
                return False
            pusher.subscribe(*key, str(raw["endpoint"]),
                             notify_strategy=str(raw.get("notify_strategy", "EXPONENTIAL_DECAY_RETRY")),
                             content_format=str(raw.get("notify_content_format", "JSON")),
                             filters=[str(f) for f in raw.get("filters", [])])
            return True
        yield from self.each("cmq_http_subscriptions", lambda raw: {**self.named(raw), "exchange": raw.get("exchange")}, action)

    def applied(self) -> list[dict[str, Any]]:
        """Per imported policy, how many queues and exchanges it now applies to."""
        # Counted in one pass over each vhost's queues and exchanges, not one per policy (SE5).
        counts: dict[str, tuple[Counter[str], Counter[str]]] = {}
        out = []
        for v, name in self.policy_names:
            vh = self.mgmt.broker.vhosts.get(v)
            if vh is None:
                continue
            if v not in counts:
                counts[v] = (Counter(q.policy.name for q in vh.queues.values() if q.policy is not None),
                             Counter(x.policy.name for x in vh.exchanges.values() if x.policy is not None))
            queues, exchanges = counts[v]
            out.append({"vhost": v, "name": name, "queues": queues[name], "exchanges": exchanges[name]})
        return out


# -- HTTP -----------------------------------------------------------------------------------------


async def definitions_get(mgmt: Management, request: web.Request) -> web.Response:
    # A vhost's export holds no users or permissions, as RabbitMQ's.
    return web.json_response(await export_definitions_in_turns(mgmt, mgmt.vhosts_in(request),
                                                with_users="vhost" not in request.match_info))


async def definitions_post(mgmt: Management, request: web.Request) -> web.Response:
    """200 with the import report (RabbitMQ answers 204 with no body: tools that check for a
    2xx status work unchanged, and the report says what was not imported)."""
    body = await read_json(request)
    v = request.match_info.get("vhost")
    if v is not None:
        mgmt.check_vhost(request, v)
    user = request.get(USER)
    report = await import_definitions_in_turns(mgmt, body, only_vhost=v, user=None if user is None else user.name,
                                               peer=http_peer(request))
    await mgmt.broker.flush()  # SE4: imported users and permissions are durable when answered
    return web.json_response(report)


def add_policy_routes(app: web.Application, mgmt: Management) -> None:
    """RabbitMQ's ``/api/policies`` paths."""

    def listed(vhosts: list[str]) -> list[dict[str, Any]]:
        return [p.to_json() for v in vhosts for _, p in sorted(mgmt.vhost(v).policies.items())]

    async def policies(request: web.Request) -> web.Response:
        return web.json_response(listed(mgmt.vhosts_in(request)))

    async def policy(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        p = vh.policies.get(request.match_info["name"])
        if p is None:
            raise not_found()
        return web.json_response(p.to_json())

    async def policy_put(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        name = request.match_info["name"]
        try:
            p = Policy.checked(await read_json(request), vhost=vh.name, name=name)
        except PolicyError as e:
            # RabbitMQ's reason, escaped as its management API escapes every reason.
            raise bad_request(html.escape(str(e), quote=False))
        existed = name in vh.policies
        vh.set_policy(p)
        actor(request, mgmt.broker.audit).emit("policy_set", vh.name, f"policy:{name}")
        return web.Response(status=204 if existed else 201)

    async def policy_delete(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        if not vh.delete_policy(request.match_info["name"]):
            raise not_found()
        actor(request, mgmt.broker.audit).emit("policy_cleared", vh.name, f"policy:{request.match_info['name']}")
        return web.Response(status=204)

    r = app.router
    r.add_get("/api/policies", policies)
    r.add_get("/api/policies/{vhost}", policies)
    r.add_get("/api/policies/{vhost}/{name}", policy)
    r.add_put("/api/policies/{vhost}/{name}", policy_put)
    r.add_delete("/api/policies/{vhost}/{name}", policy_delete)
