"""RabbitMQ's management HTTP API paths, in RabbitMQ's JSON shapes (SPEC M1, D9, W5).

The fields tools read (rabbitmqadmin, Flower, KEDA, Grafana's RabbitMQ dashboards, Celery
inspection scripts) carry the same names, types and meaning as RabbitMQ 3.x:

* a queue's ``messages`` = ``messages_ready`` (CMQ Active) + ``messages_unacknowledged``
  (CMQ Inactive: received, not yet deleted); delayed and rewindable messages are not counted,
  as RabbitMQ does not count messages held by the delayed-message exchange, and are shown
  under ``cmq`` and by the CMQ API;
* ``message_stats`` counts from the audit tee (gateway.metrics), with ``*_details.rate``
  per second over the last sample window (KEDA reads ``publish_details.rate``); the
  overview's ``confirm`` (publisher confirms acked) is counted by the channels instead;
* lists are plain JSON arrays, or RabbitMQ's paged object when ``page`` is given.

Vhost names are URL-encoded in paths (``%2F`` is ``/``), as in RabbitMQ (M1).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import math
import re
import struct
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from gateway.admission import publishers_held
from gateway.auth import User
from gateway.handout import STOPPING, put_back
from gateway.jetstream.api_receive import demand_for
from gateway.management import definitions
from gateway.management.app import (
    USER,
    ApiError,
    Management,
    bad_request,
    cmq_queue_name,
    flag,
    jsonable,
    not_found,
    read_json,
)
from gateway.protocol.properties import Properties

__all__ = ["COMPAT_VERSION", "add_routes", "connection_name", "queue_json"]

COMPAT_VERSION = definitions.COMPAT_VERSION  # the RabbitMQ release whose shapes this follows
NODE = "cmq-gateway@localhost"
GET_ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
EXCHANGE_TYPES = [
    {"name": "direct", "description": "CMQ topic filtering by tag (M2)", "enabled": True},
    {"name": "fanout", "description": "CMQ topic, subscriptions without a filter (M4)", "enabled": True},
    {"name": "headers", "description": "RabbitMQ x-match rules, a gateway extension (M5)", "enabled": True},
    {"name": "topic", "description": "CMQ topic filtering by routing key (M3)", "enabled": True},
]


def _stat(mgmt: Management, stats: dict[str, Any], name: str, count: int, *key: Any) -> None:
    stats[name] = count
    stats[f"{name}_details"] = {"rate": mgmt.rate(*key)}


# -- queues ----------------------------------------------------------------------------------


def queue_json(mgmt: Management, vhost: str, q: Any) -> dict[str, Any]:
    cmq = q.cmq
    ready, unacked = cmq.active, cmq.inactive
    c = mgmt.counters
    stats: dict[str, Any] = {}
    for stat in ("publish", "deliver", "ack", "redeliver"):
        _stat(mgmt, stats, stat, c.queue_stat(vhost, q.name, stat), "q", vhost, q.name, stat)
    stats["deliver_get"] = stats["deliver"]
    stats["deliver_get_details"] = dict(stats["deliver_details"])
    exclusive = q.exclusive_owner is not None
    exclusive_tag = next((k.tag for k in q.consumers if k.exclusive), None)
    return {
        "name": q.name,
        "vhost": vhost,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": exclusive,
        "arguments": jsonable(q.arguments),
        "node": NODE,
        "state": "running",
        "type": "classic",
        "policy": q.policy.name if q.policy is not None else None,
        "operator_policy": None,
        "effective_policy_definition": dict(q.policy.definition) if q.policy is not None else {},
        "exclusive_consumer_tag": exclusive_tag,
        "single_active_consumer_tag": None,
        "consumers": len(q.consumers),
        "consumer_capacity": 1.0 if q.consumers else 0,
        "consumer_utilisation": 1.0 if q.consumers else None,
        "head_message_timestamp": None,
        "messages": ready + unacked,
        "messages_details": {"rate": 0.0},
        "messages_ready": ready,
        "messages_ready_details": {"rate": 0.0},
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": 0.0},
        "message_stats": stats,
        # The CMQ view of the same queue (L2 name, Q1/Q4/Q6 states).
        "cmq": {"queueName": cmq_queue_name(q.name), "activeMsgNum": ready, "inactiveMsgNum": unacked,
                "delayMsgNum": cmq.delayed, "rewindMsgNum": cmq.rewindable},
    }


def _paged(request: web.Request, items: list[dict[str, Any]]) -> Any:
    """RabbitMQ's list filters: ``name`` (with ``use_regex``), ``page``/``page_size``,
    ``sort``/``sort_reverse``; without ``page`` the list itself."""
    q = request.query
    total = len(items)
    keep = _name_filter(q)
    if keep is not None:
        items = [i for i in items if keep(str(i.get("name", "")))]
    sort = q.get("sort")
    if sort:
        items = sorted(items, key=lambda i: (i.get(sort) is None, str(i.get(sort)) if not isinstance(
            i.get(sort), int | float) else i.get(sort)))  # type: ignore[arg-type, return-value]
        if q.get("sort_reverse", "false") == "true":
            items.reverse()
    if "page" not in q:
        return items
    return _page(q, items, total)


def _name_filter(q: Any) -> Callable[[str], bool] | None:
    """RabbitMQ's ``name`` filter: a substring, or with ``use_regex=true`` a regex searched;
    None without one."""
    name = q.get("name", "")
    if not name:
        return None
    if q.get("use_regex", "false") != "true":
        return lambda s: name in s
    try:
        rx = re.compile(name)
    except re.error:
        raise bad_request(f"invalid regex {name!r}")
    return lambda s: rx.search(s) is not None


def _page(q: Any, items: list[Any], total: int) -> dict[str, Any]:
    """RabbitMQ's page of the filtered and sorted ``items`` (``total``: before the filter)."""
    try:
        page, size = int(q["page"]), int(q.get("page_size", "100"))
    except ValueError:
        raise bad_request("Pagination parameters are invalid")
    if page < 1 or not 1 <= size <= 500:  # RabbitMQ's error and limits
        raise ApiError(400, "invalid_pagination_parameters",
                       f"Invalid pagination parameters: page number {page}, page size {size}")
    filtered = len(items)
    if page > 1 and (page - 1) * size >= filtered:  # RabbitMQ's 400; page 1 of nothing is a page
        raise ApiError(400, "page_out_of_range", f"Page out of range, page: {page} page size: {size}, len: {filtered}")
    chunk = items[(page - 1) * size: page * size]
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
            "page_count": math.ceil(filtered / size), "page_size": size, "total_count": total}


# Queue fields a list may be sorted on that cost nothing to read (issue 29: the console pages
# 10,000 queues every 5 s): sorted by one of them, a page builds the whole JSON (stats and
# rates, ~100 us a queue) of its own queues only, not of all of them (1 s for 10,000, with
# the event loop held). The keys are plain str and int, as queue_json has them (never None),
# so the order is _paged's; no container is made per queue (10,000 dicts a request set off
# the collector's full passes, 0.5 s each with that many queues).
_CHEAP_SORTS: dict[str, Callable[[Any], Any]] = {
    "name": lambda q: q.name,
    "vhost": lambda q: q.vhost,
    "consumers": lambda q: len(q.consumers),
    "messages": lambda q: q.cmq.active + q.cmq.inactive,
    "messages_ready": lambda q: q.cmq.active,
    "messages_unacknowledged": lambda q: q.cmq.inactive,
}


def _queues_page(mgmt: Management, request: web.Request, vhosts: list[str]) -> dict[str, Any] | None:
    """A page of ``_paged`` with ``queue_json`` built for the page only; None when not paged or
    sorted on another field (the caller builds every queue's JSON then)."""
    q = request.query
    sort = q.get("sort", "")
    if "page" not in q or (sort and sort != "state" and sort not in _CHEAP_SORTS):
        return None
    queues = [x for v in vhosts for x in list(mgmt.vhost(v).queues.values())]
    total = len(queues)
    keep = _name_filter(q)
    if keep is not None:
        queues = [x for x in queues if keep(x.name)]
    if sort in _CHEAP_SORTS:  # "state" is "running" for all: the order stays
        queues.sort(key=_CHEAP_SORTS[sort])
    if sort and q.get("sort_reverse", "false") == "true":
        queues.reverse()
    page: dict[str, Any] = _page(q, queues, total)
    page["items"] = [queue_json(mgmt, x.vhost, x) for x in page["items"]]
    return page


def _queues(mgmt: Management, request: web.Request, vhosts: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in vhosts:
        vh = mgmt.vhost(v)
        out.extend(queue_json(mgmt, v, q) for q in list(vh.queues.values()))
    return out


def _consumers_of(mgmt: Management, q: Any) -> list[dict[str, Any]]:
    return [_consumer_json(mgmt, k) for k in q.consumers]


# -- exchanges and bindings --------------------------------------------------------------------


def _exchange_json(mgmt: Management, vhost: str, ex: Any | None, name: str = "") -> dict[str, Any]:
    c = mgmt.counters
    stats: dict[str, Any] = {}
    xname = ex.name if ex is not None else name
    for stat in ("publish_in", "publish_out"):
        _stat(mgmt, stats, stat, c.exchange_stat(vhost, xname, stat), "x", vhost, xname, stat)
    if ex is None:  # the default exchange, which RabbitMQ lists with the name ""
        return {"name": "", "vhost": vhost, "type": "direct", "durable": True, "auto_delete": False,
                "internal": False, "arguments": {}, "user_who_performed_action": "rmq-internal",
                "message_stats": stats}
    out = {"name": ex.name, "vhost": vhost, "type": ex.type, "durable": ex.durable,
           "auto_delete": ex.auto_delete, "internal": ex.internal, "arguments": jsonable(ex.arguments),
           "user_who_performed_action": "rmq-internal" if ex.name.startswith("amq.") else "",
           "message_stats": stats}
    if ex.policy is not None:
        out["policy"] = ex.policy.name
    if ex.topic is not None:
        topic = ex.topic
        out["cmq"] = {"topicName": topic.name, "filterType": topic.filter_type.value,
                      "maxMsgSize": topic.max_message_size, "msgCount": topic.retained_count,
                      "subscriptionCount": len(topic.subscriptions)}
    return out


def _exchanges(mgmt: Management, vhosts: list[str]) -> list[dict[str, Any]]:
    out = []
    for v in vhosts:
        vh = mgmt.vhost(v)
        out.append(_exchange_json(mgmt, v, None))
        out.extend(_exchange_json(mgmt, v, ex) for _, ex in sorted(vh.exchanges.items()))
    return out


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    """A declaration's or binding's ``arguments``: a JSON object (or nothing); anything else
    is RabbitMQ's 400, not a fault of the gateway's."""
    args = body.get("arguments")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise bad_request("arguments must be a JSON object")
    return args


def _properties_key(key: str, arguments: dict[str, Any]) -> str:
    if not arguments:
        return quote(key, safe="") if key else "~"
    digest = hashlib.sha256(json.dumps(jsonable(arguments), sort_keys=True).encode()).digest()
    return f"{quote(key, safe='')}~{digest[:6].hex()}"


def _bindings(mgmt: Management, vhosts: list[str]) -> list[dict[str, Any]]:
    out = []
    for v in vhosts:
        vh = mgmt.vhost(v)
        for qname in list(vh.queues):  # M6: every queue is reachable through "" by its name
            out.append({"source": "", "vhost": v, "destination": qname, "destination_type": "queue",
                        "routing_key": qname, "arguments": {}, "properties_key": _properties_key(qname, {})})
        for ex in list(vh.exchanges.values()):
            for binding in list(ex.bindings.values()):
                kind, dest = binding.dest
                for key in binding.keys:
                    args = jsonable(binding.arguments.get(key) or {})
                    out.append({"source": ex.name, "vhost": v, "destination": dest,
                                "destination_type": "queue" if kind == "q" else "exchange",
                                "routing_key": key, "arguments": args,
                                "properties_key": _properties_key(key, args)})
    return out


# -- connections, channels, consumers ------------------------------------------------------------


def _split_peer(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    host = host.strip("[]")
    try:
        return host, int(port)
    except ValueError:
        return peer, 0


def _local(conn: Any) -> tuple[str, int]:
    transport = getattr(conn, "transport", None)
    sock = transport.get_extra_info("sockname") if transport is not None else None
    if sock:
        return str(sock[0]), int(sock[1])
    return "", 0


# A connection held by flow control (gateway/transport.py: the store's backlog, or a publisher
# yielding to consumers it feeds) is held and let go many times a second: it shows "flow", as
# in RabbitMQ, for this long after its last hold, so that a poll of the API sees it.
FLOW_SHOWN_SECONDS = 5.0


def _conn_state(conn: Any) -> str:
    if getattr(conn, "blocked", False):
        return "blocked"
    if time.monotonic() - getattr(conn, "flow_at", -math.inf) < FLOW_SHOWN_SECONDS:
        return "flow"
    return "running"


def _conn_name(conn: Any) -> str:
    host, port = _local(conn)
    if not host:
        return str(conn.peer)
    local = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{conn.peer} -> {local}"


connection_name = _conn_name


def _conn_of_session(mgmt: Management, session: Any) -> Any:
    for conn in mgmt.target.connections:
        if getattr(conn, "session", None) is session or conn is session:
            return conn
    return session


def _connection_json(mgmt: Management, conn: Any) -> dict[str, Any]:
    peer_host, peer_port = _split_peer(str(conn.peer))
    host, port = _local(conn)
    session = getattr(conn, "session", conn)
    core = getattr(conn, "conn", None)
    opened = getattr(conn, "opened_at", None)
    connected_at = int((time.time() - (time.monotonic() - opened)) * 1000) if opened else None
    channels = len(getattr(session, "channels", {}) or {})
    return {
        "name": _conn_name(conn),
        "node": NODE,
        "type": "network",
        "protocol": getattr(conn, "protocol", "AMQP 0-9-1"),  # MQTT connections: "MQTT 3.1.1" / "MQTT 5.0"
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "vhost": getattr(conn, "vhost", None) or getattr(session, "vhost_name", "/"),
        "host": host,
        "port": port,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "state": _conn_state(conn),
        "channels": channels,
        "channel_max": getattr(core, "channel_max", 0),
        "frame_max": getattr(core, "frame_max", 0),
        "timeout": getattr(core, "heartbeat", 0),
        "auth_mechanism": getattr(core, "mechanism", None) or getattr(conn, "auth_mechanism", None) or "PLAIN",
        "client_properties": jsonable(getattr(conn, "client_properties", {}) or {}),
        "connected_at": connected_at,
        "ssl": False,
        "ssl_protocol": None, "ssl_key_exchange": None, "ssl_cipher": None, "ssl_hash": None,
        "peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None,
        **(getattr(conn, "tls_info", None) or {}),  # SE2: set on AMQPS connections
    }


def _channel_name(mgmt: Management, ch: Any) -> tuple[str, Any]:
    conn = _conn_of_session(mgmt, ch.session)
    return f"{_conn_name(conn)} ({ch.number})", conn


def _channel_json(mgmt: Management, ch: Any) -> dict[str, Any]:
    name, conn = _channel_name(mgmt, ch)
    peer_host, peer_port = _split_peer(str(conn.peer))
    return {
        "name": name,
        "node": NODE,
        "number": ch.number,
        "user": ch.session.user,
        "user_who_performed_action": ch.session.user,
        "vhost": ch.session.vhost_name,
        "connection_details": {"name": _conn_name(conn), "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": len(ch.consumers),
        "messages_unacknowledged": len(ch.unacked),
        "messages_unconfirmed": len(ch.pending_confirms),
        "messages_uncommitted": len(ch.tx_publishes),
        "acks_uncommitted": len(ch.tx_acks),
        "prefetch_count": ch.consumer_prefetch,
        "global_prefetch_count": ch.channel_prefetch,
        "confirm": ch.confirm,
        "transactional": ch.tx,
        "state": "running" if ch.flow_active else "flow",
    }


def _consumer_json(mgmt: Management, k: Any) -> dict[str, Any]:
    name, conn = _channel_name(mgmt, k.channel)
    peer_host, peer_port = _split_peer(str(conn.peer))
    return {
        "consumer_tag": k.tag,
        "queue": {"name": k.queue.name, "vhost": k.queue.vhost},
        "channel_details": {"name": name, "number": k.channel.number, "connection_name": _conn_name(conn),
                            "peer_host": peer_host, "peer_port": peer_port, "user": k.channel.session.user,
                            "node": NODE},
        "ack_required": not k.no_ack,
        "exclusive": k.exclusive,
        "prefetch_count": k.prefetch,
        "arguments": jsonable(k.arguments),
        "active": True,
        "activity_status": "up",
    }


# The HTTP endpoints under RabbitMQ's listener names ("http" its management API,
# "http/prometheus" its /metrics; "https..." over TLS), and CMQ's HTTP API.
_OPERATOR_PROTOCOLS = {"management API": "http", "metrics": "http/prometheus", "CMQ API": "cmq-api"}


def _other_listeners(gw: Any) -> list[dict[str, Any]]:
    """AMQPS and the HTTP endpoints, as /api/overview lists them beside AMQP and MQTT."""
    out = [{"node": NODE, "protocol": "amqp/ssl", "ip_address": h, "port": p}
           for h, p in getattr(gw, "tls_addresses", [])]
    for name, where in gw.operator_addresses() if hasattr(gw, "operator_addresses") else []:
        host, _, port = where.rpartition(":")
        protocol = _OPERATOR_PROTOCOLS.get(name, name)
        if gw.operator_scheme(name) == "https":
            protocol = "https" + protocol[4:] if protocol.startswith("http") else protocol + "/ssl"
        out.append({"node": NODE, "protocol": protocol, "ip_address": host.strip("[]"), "port": int(port)})
    return out


def _message_stats(mgmt: Management, names: list[str]) -> dict[str, Any]:
    """RabbitMQ's ``message_stats`` of the overview (the vhosts the user sees) and of one
    vhost: counts since the start and ``*_details.rate`` per second."""
    c = mgmt.counters
    stats: dict[str, Any] = {}
    for event, name in (("publish", "publish"), ("deliver", "deliver_get"), ("ack", "ack")):
        stats[name] = sum(c.count(event, v) for v in names)
        stats[f"{name}_details"] = {"rate": round(sum(mgmt.rate("e", v, event) for v in names), 1)}
    # Confirms and redeliveries are not audit events of their own: counted apart.
    for name, counts in (("confirm", mgmt.broker.confirmed), ("redeliver", c.redelivered)):
        stats[name] = sum(counts.get(v, 0) for v in names)
        stats[f"{name}_details"] = {"rate": round(sum(mgmt.rate(name, v) for v in names), 1)}
    return stats


def _channels(mgmt: Management, vhosts: set[str]) -> list[Any]:
    return [ch for s in mgmt.target.sessions if s.vhost_name in vhosts for ch in list(s.channels.values())]


# -- handlers -----------------------------------------------------------------------------------


# JetStream: how long a "get messages" waits for the pull made for it (hang protection; a
# pull is answered at once, with messages or with none).
GET_PULL_WAIT = 10.0


async def _receive_for_get(broker: Any, q: Any, count: int, demand: Any) -> list[Any]:
    """Up to ``count`` CMQ receives for "get messages". On JetStream (``demand`` not None) the
    local queue holds only what was pulled for consumers and gets, so the request pulls for
    itself, as a CMQ API ReceiveMessage does (gateway.jetstream.api_receive; issue 28)."""
    receipts: list[Any] = []

    def take() -> None:
        now = broker.now()
        while len(receipts) < count and (receipt := q.receive(now)) is not None:
            receipts.append(receipt)

    take()
    if demand is not None and len(receipts) < count and await demand.pulled(GET_PULL_WAIT):
        take()
    return receipts


def add_routes(app: web.Application, mgmt: Management) -> None:
    r = app.router

    async def overview(request: web.Request) -> web.Response:
        names = mgmt.visible_vhosts(request[USER])
        # Totals straight from the queues: a whole queue_json per queue (its stats and rates)
        # made an overview with 1,000 queues cost 20 ms.
        queues = [q for v in names for q in list(mgmt.vhost(v).queues.values())]
        stats = _message_stats(mgmt, names)
        gw = mgmt.target.gateway
        listeners = [{"node": NODE, "protocol": "amqp", "ip_address": h, "port": p}
                     for h, p in getattr(gw, "addresses", [])]
        mqtt = getattr(gw, "mqtt", None)
        if mqtt is not None:  # RabbitMQ lists its MQTT plugin's listeners as "mqtt" and "mqtt/ssl"
            listeners += [{"node": NODE, "protocol": protocol, "ip_address": h, "port": p}
                          for protocol, addresses in (("mqtt", mqtt.addresses), ("mqtt/ssl", mqtt.tls_addresses))
                          for h, p in addresses]
        listeners += _other_listeners(gw)
        ready = sum(q.cmq.active for q in queues)
        unacked = sum(q.cmq.inactive for q in queues)
        exchanges = sum(len(mgmt.vhost(v).exchanges) + 1 for v in names)
        channels = _channels(mgmt, set(names))
        config = getattr(gw, "config", None)
        return web.json_response({
            "management_version": COMPAT_VERSION,
            "rabbitmq_version": COMPAT_VERSION,
            "product_name": "cmq-gateway",
            "product_version": getattr(gw, "server_properties", {}).get("version", "0.0.0"),
            "cluster_name": getattr(config, "cluster_name", "cmq-gateway"),
            # PF1: the gateway's profile, and the vhosts that override it.
            "cmq_profile": mgmt.broker.profile.name,
            "cmq_vhost_profiles": {v: mgmt.broker.profile_of(v).name for v in names},
            # CL1: where messages are kept (the console's overview shows it).
            "cmq_store": "jetstream" if getattr(config, "store", None) else "embedded",
            "node": NODE,
            "rates_mode": "basic",
            "exchange_types": EXCHANGE_TYPES,
            "message_stats": stats,
            "queue_totals": {"messages": ready + unacked, "messages_details": {"rate": 0.0},
                             "messages_ready": ready, "messages_ready_details": {"rate": 0.0},
                             "messages_unacknowledged": unacked,
                             "messages_unacknowledged_details": {"rate": 0.0}},
            "object_totals": {"connections": len(mgmt.target.connections), "channels": len(channels),
                              "consumers": sum(len(q.consumers) for q in queues), "exchanges": exchanges,
                              "queues": len(queues)},
            "listeners": listeners,
            "statistics_db_event_queue": 0,
            # W5: the resource alarm, as RabbitMQ shows mem_alarm / disk_free_alarm per node.
            "alarms": [mgmt.target.alarm] if mgmt.target.alarm else [],
            **mgmt.target.resources(),
        })

    async def whoami(request: web.Request) -> web.Response:
        user: User = request[USER]
        return web.json_response({"name": user.name, "tags": list(user.tags)})

    def vhost_json(name: str) -> dict[str, Any]:
        vh = mgmt.vhost(name)
        ready = sum(q.cmq.active for q in vh.queues.values())
        unacked = sum(q.cmq.inactive for q in vh.queues.values())
        return {"name": name, "description": "", "tags": [], "metadata": {"description": "", "tags": []},
                "tracing": False, "default_queue_type": "classic", "cluster_state": {NODE: "running"},
                "messages": ready + unacked, "messages_details": {"rate": 0.0},
                "messages_ready": ready, "messages_ready_details": {"rate": 0.0},
                "messages_unacknowledged": unacked, "messages_unacknowledged_details": {"rate": 0.0},
                "message_stats": _message_stats(mgmt, [name]),
                "cmq_profile": mgmt.broker.profile_of(name).name}  # PF1

    async def vhosts(request: web.Request) -> web.Response:
        return web.json_response(_paged(request, [vhost_json(v) for v in mgmt.visible_vhosts(request[USER])]))

    async def vhost(request: web.Request) -> web.Response:
        name = request.match_info["vhost"]
        mgmt.check_vhost(request, name)
        return web.json_response(vhost_json(name))

    async def queues(request: web.Request) -> web.Response:
        names = mgmt.vhosts_in(request)
        page = _queues_page(mgmt, request, names)
        return web.json_response(page if page is not None else _paged(request, _queues(mgmt, request, names)))

    async def queue(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        q = vh.queues.get(request.match_info["name"])
        if q is None:
            raise not_found()
        out = queue_json(mgmt, vh.name, q)
        out["consumer_details"] = _consumers_of(mgmt, q)
        return web.json_response(out)

    def existing_queue(request: web.Request) -> tuple[Any, str]:
        """The vhost and name of the queue in the path; 404 as RabbitMQ when it is missing."""
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        name = request.match_info["name"]
        if name not in vh.queues:
            raise not_found()
        return vh, name

    async def queue_put(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        body = await read_json(request)
        vh.declare_queue(None, request.match_info["name"], passive=False,
                         durable=flag(body, "durable", False), exclusive=False,
                         auto_delete=flag(body, "auto_delete", False),
                         arguments=_arguments(body), user=request[USER].name)
        return web.Response(status=201)

    async def queue_delete(request: web.Request) -> web.Response:
        vh, name = existing_queue(request)
        q = request.query
        vh.delete_queue(None, name, if_unused=q.get("if-unused") == "true", if_empty=q.get("if-empty") == "true",
                        user=request[USER].name)
        return web.Response(status=204)

    async def queue_purge(request: web.Request) -> web.Response:
        vh, name = existing_queue(request)
        vh.purge_queue(None, name, request[USER].name)
        return web.Response(status=204)

    async def queue_get(request: web.Request) -> web.Response:
        """RabbitMQ's "get messages" (read permission: authz): ``count`` CMQ receives, then
        each received message acked (deleted), requeued (Active again, redelivered next
        time) or rejected (dead-lettered or dropped), as ``ackmode`` says."""
        vh, name = existing_queue(request)
        q = vh.queues[name]
        body = await read_json(request)
        for key in ("count", "ackmode", "encoding"):
            if key not in body:
                raise bad_request(f"[{{key_missing,{key}}}]")
        count, mode, encoding = body["count"], body["ackmode"], body["encoding"]
        truncate = body.get("truncate")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise bad_request("count must be a positive integer")
        if mode not in GET_ACKMODES:
            raise bad_request(f"Invalid ackmode: {mode}")
        if encoding not in ("auto", "base64"):
            raise bad_request(f"Unsupported encoding: {encoding}")
        broker = mgmt.broker
        demand = demand_for(broker, q, count, False)
        # On JetStream what was pulled for this request and requeued goes back to the stream
        # when the demand ends, for every gateway (not kept here under this gateway's lease).
        with demand if demand is not None else contextlib.nullcontext():
            receipts = await _receive_for_get(broker, q, count, demand)
            now = broker.now()
            out = []
            for i, receipt in enumerate(receipts):
                m = receipt.message
                msg = m.payload
                data = bytes(getattr(msg, "body", b""))
                shown = data[:truncate] if isinstance(truncate, int) and not isinstance(truncate, bool) else data
                text = None
                if encoding == "auto":
                    try:
                        text = shown.decode()
                    except UnicodeDecodeError:
                        text = None
                props = getattr(msg, "properties", None)
                out.append({"payload_bytes": len(data), "redelivered": m.receive_count > 1,
                            "exchange": getattr(msg, "exchange", ""), "routing_key": getattr(msg, "routing_key", ""),
                            "message_count": q.message_count + len(receipts) - i - 1,
                            "properties": jsonable(props.as_dict()) if props is not None else {},
                            "payload": text if text is not None else base64.b64encode(shown).decode(),
                            "payload_encoding": "string" if text is not None else "base64"})
            # A5: the records of what the answer shows (publishes, enqueues) out of this
            # process before anything is settled; a stop on a full disk gets them back, unseen.
            if not broker.audit_handoff():
                put_back(receipts, q.cmq.release, now)
                broker.after_queue_change(vh, q)
                raise ApiError(503, "service_unavailable", STOPPING)
            user = request[USER].name
            for receipt in receipts:
                m = receipt.message
                if mode == "ack_requeue_false":
                    broker.settle_deleted(q, receipt)
                    broker.audit.emit("ack", vh.name, queue=q.name, msg_id=m.msg_id, user=user)
                elif mode.endswith("requeue_true"):
                    q.cmq.release(receipt, now)
                    broker.audit.emit("requeue", vh.name, queue=q.name, msg_id=m.msg_id, user=user)
                else:
                    broker.drop_received(q, receipt, user)
            broker.after_queue_change(vh, q)
        # The settlements' records too. Should a stop come between the two hand-offs, the
        # messages are settled as asked and the answer says so; the writer counts what it
        # gives up (audit_dropped), as it does for an AMQP client's acks.
        broker.audit_handoff()
        return web.json_response(out)

    async def queue_bindings(request: web.Request) -> web.Response:
        vh, name = existing_queue(request)
        out = [b for b in _bindings(mgmt, [vh.name])
               if b["destination_type"] == "queue" and b["destination"] == name]
        return web.json_response(out)

    def exchange_bindings(field: str) -> Any:
        """/api/exchanges/{vhost}/{name}/bindings/source|destination: the bindings whose
        source, or whose destination exchange, it is (RabbitMQ's exchange page reads both)."""
        async def handler(request: web.Request) -> web.Response:
            vh = mgmt.check_vhost(request, request.match_info["vhost"])
            name = request.match_info["name"]
            name = "" if name == "amq.default" else name
            if name and name not in vh.exchanges:
                raise not_found()
            out = [b for b in _bindings(mgmt, [vh.name]) if b[field] == name
                   and (field == "source" or b["destination_type"] == "exchange")]
            return web.json_response(out)
        return handler

    async def exchanges(request: web.Request) -> web.Response:
        return web.json_response(_paged(request, _exchanges(mgmt, mgmt.vhosts_in(request))))

    async def exchange(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        name = request.match_info["name"]
        if name in ("", "amq.default"):
            return web.json_response(_exchange_json(mgmt, vh.name, None))
        ex = vh.exchanges.get(name)
        if ex is None:
            raise not_found()
        return web.json_response(_exchange_json(mgmt, vh.name, ex))

    async def exchange_put(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        body = await read_json(request)
        if "type" not in body:
            raise bad_request("[{key_missing,type}]")
        vh.declare_exchange(request.match_info["name"], str(body["type"]), passive=False,
                            durable=flag(body, "durable", False),
                            auto_delete=flag(body, "auto_delete", False),
                            internal=flag(body, "internal", False),
                            arguments=_arguments(body), user=request[USER].name)
        return web.Response(status=201)

    async def exchange_delete(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        name = request.match_info["name"]
        if name not in vh.exchanges:
            raise not_found()
        vh.delete_exchange(name, if_unused=request.query.get("if-unused") == "true", user=request[USER].name)
        return web.Response(status=204)

    async def exchange_publish(request: web.Request) -> web.Response:
        """RabbitMQ's publish over HTTP (write permission: authz), answering ``routed``."""
        vh = mgmt.vhost(request.match_info["vhost"])
        name = request.match_info["name"]
        if name == "amq.default":
            name = ""
        if name and name not in vh.exchanges:
            raise not_found()
        body = await read_json(request)
        for key in ("routing_key", "properties", "payload", "payload_encoding"):
            if key not in body:
                raise bad_request(f"[{{key_missing,{key}}}]")
        payload, encoding = body["payload"], body["payload_encoding"]
        if not isinstance(payload, str):
            raise bad_request("payload_not_string")
        if encoding == "string":
            data = payload.encode()
        elif encoding == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise bad_request("payload is not valid base64")
        else:
            raise bad_request(f"{{unsupported_encoding,{encoding}}}")
        props = body["properties"] or {}
        if not isinstance(props, dict):
            raise bad_request("properties must be a JSON object")
        try:
            properties = Properties.build(**props)
        except (TypeError, ValueError, OverflowError, struct.error) as e:
            raise bad_request(f"properties: {e}")
        held = publishers_held(mgmt.target.gateway)
        if held:
            # SE6: the alarm holds every publisher, this one too (RabbitMQ's HTTP publish is
            # exempt: rabbitmq-server issue 1986). 503, as the alarms health check answers.
            raise ApiError(503, "resource_alarm", f"the gateway is {held} (resource alarm, SE6): nothing was "
                           "published, publish again when the alarm clears")
        user = request[USER].name
        out = vh.publish(name, str(body["routing_key"]), properties, data, user=user, peer=request.remote)
        # M14: RabbitMQ publishes over HTTP on a channel in confirm mode and answers at the
        # basic.ack: a stored copy is durable before the answer, as an AMQP confirm is.
        broker = mgmt.broker
        if out.lsn:
            watched = broker.messages.watch_refusals([out.lsn])
            if out.lsn > broker.durable_lsn:
                await broker.flush()
            if broker.messages.refusals_seen(watched):  # RabbitMQ's answer to a basic.nack
                raise bad_request("Unable to publish message. Check queue limits.")
        # A5: the publish's records out of this process before the answer says it was taken
        # (on JetStream the durable LSN does not wait for the audit fsync: without this a
        # kill -9 right after an answer took the records of the publishes answered last).
        if not broker.audit_handoff():
            raise ApiError(503, "service_unavailable", STOPPING)
        return web.json_response({"routed": out.routed})

    async def bindings(request: web.Request) -> web.Response:
        return web.json_response(_bindings(mgmt, mgmt.vhosts_in(request)))

    async def binding_post(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        body = await read_json(request)
        kind = "q" if request.match_info["kind"] == "q" else "x"
        key = str(body.get("routing_key", ""))
        vh.bind(None, request.match_info["source"], (kind, request.match_info["dest"]), key,
                _arguments(body), user=request[USER].name)
        args = jsonable(_arguments(body))
        return web.Response(status=201, headers={"Location": _properties_key(key, args)})

    def own(request: web.Request, items: list[dict[str, Any]], user_of: Any) -> list[dict[str, Any]]:
        """SE1: a user's own connections, channels and consumers; all for monitors and
        administrators (RabbitMQ's filter_user)."""
        if mgmt.sees_all_connections(request):
            return items
        name = request[USER].name
        return [i for i in items if user_of(i) == name]

    def pair_bindings(request: web.Request) -> tuple[Any, list[dict[str, Any]]]:
        """The vhost and the bindings from the path's source to its destination."""
        m = request.match_info
        vh = mgmt.vhost(m["vhost"])
        source = "" if m["source"] == "amq.default" else m["source"]
        kind = "queue" if m["kind"] == "q" else "exchange"
        return vh, [b for b in _bindings(mgmt, [vh.name])
                    if (b["source"], b["destination_type"], b["destination"]) == (source, kind, m["dest"])]

    def one_binding(request: web.Request) -> tuple[Any, dict[str, Any]]:
        vh, pair = pair_bindings(request)
        b = next((b for b in pair if b["properties_key"] == request.match_info["props"]), None)
        if b is None:
            raise not_found()
        return vh, b

    async def binding_list(request: web.Request) -> web.Response:
        return web.json_response(pair_bindings(request)[1])

    async def binding_get(request: web.Request) -> web.Response:
        return web.json_response(one_binding(request)[1])

    async def binding_delete(request: web.Request) -> web.Response:
        """RabbitMQ's unbind by properties key (read on the source, write on the
        destination: authz)."""
        vh, b = one_binding(request)
        kind = "q" if b["destination_type"] == "queue" else "x"
        vh.unbind(None, b["source"], (kind, b["destination"]), b["routing_key"], user=request[USER].name)
        return web.Response(status=204)

    async def connections(request: web.Request) -> web.Response:
        """Also a vhost's (RabbitMQ's /api/vhosts/{vhost}/connections, paged here too: the
        console pages one vhost's list as the whole one)."""
        v = request.match_info.get("vhost")
        if v is not None:
            mgmt.vhost(v)
        items = [_connection_json(mgmt, c) for c in mgmt.target.connections]
        if v is not None:
            items = [c for c in items if c["vhost"] == v]
        return web.json_response(_paged(request, own(request, items, lambda c: c["user"])))

    def named_connection(request: web.Request) -> Any:
        conn = mgmt.connection_named(request.match_info["name"])
        if conn is None:
            raise not_found()
        return conn

    async def connection(request: web.Request) -> web.Response:
        return web.json_response(_connection_json(mgmt, named_connection(request)))

    async def connection_delete(request: web.Request) -> web.Response:
        """Close it with 320 CONNECTION_FORCED; the reason from ``X-Reason``, as RabbitMQ."""
        conn = named_connection(request)
        close = getattr(conn, "close_forced", None)
        if close is None:
            raise bad_request("this connection cannot be closed from here")
        close(request.headers.get("X-Reason", "Closed via management plugin"))
        return web.Response(status=204)

    async def channels(request: web.Request) -> web.Response:
        v = request.match_info.get("vhost")
        if v is not None:
            mgmt.vhost(v)
        items = [_channel_json(mgmt, ch) for ch in _channels(mgmt, {v} if v is not None else set(mgmt.broker.vhosts))]
        return web.json_response(_paged(request, own(request, items, lambda c: c["user"])))

    async def consumers(request: web.Request) -> web.Response:
        v = request.match_info.get("vhost")
        out = []
        for name in [v] if v is not None else sorted(mgmt.broker.vhosts):
            for q in list(mgmt.vhost(name).queues.values()):
                out.extend(_consumers_of(mgmt, q))
        return web.json_response(own(request, out, lambda k: k["channel_details"]["user"]))

    def alarms_check(where: str) -> web.Response:
        """W5: RabbitMQ's health check body and status (503 while any alarm is in effect)."""
        resources = mgmt.target.alarm_resources
        if not resources:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "failed", "reason": f"There are alarms in effect {where}",
                                  "alarms": [{"node": NODE, "resource": r} for r in resources]}, status=503)

    async def alarms(request: web.Request) -> web.Response:
        return alarms_check("in the cluster")

    def node_json() -> dict[str, Any]:
        """W5: the one node, with RabbitMQ's resource fields (mem_used: the bytes the broker
        holds, gateway/memory.py; mem_rss and store_failed are the gateway's own)."""
        return {"name": NODE, "type": "disc", "running": True, **mgmt.target.resources()}

    async def nodes(request: web.Request) -> web.Response:
        return web.json_response([node_json()])

    async def node(request: web.Request) -> web.Response:
        if request.match_info["name"] != NODE:
            raise not_found()
        return web.json_response(node_json())

    async def local_alarms(request: web.Request) -> web.Response:
        return alarms_check("on the node")  # one node: the same alarms, RabbitMQ's other wording

    async def definitions_get(request: web.Request) -> web.Response:
        return await definitions.definitions_get(mgmt, request)

    async def definitions_post(request: web.Request) -> web.Response:
        return await definitions.definitions_post(mgmt, request)

    r.add_get("/api/overview", overview)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/vhosts", vhosts)
    r.add_get("/api/vhosts/{vhost}", vhost)
    r.add_get("/api/queues", queues)
    r.add_get("/api/queues/{vhost}", queues)
    r.add_get("/api/queues/{vhost}/{name}", queue)
    r.add_put("/api/queues/{vhost}/{name}", queue_put)
    r.add_delete("/api/queues/{vhost}/{name}", queue_delete)
    r.add_delete("/api/queues/{vhost}/{name}/contents", queue_purge)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_post("/api/queues/{vhost}/{name}/get", queue_get)
    r.add_get("/api/exchanges", exchanges)
    r.add_get("/api/exchanges/{vhost}", exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", exchange_put)
    r.add_delete("/api/exchanges/{vhost}/{name}", exchange_delete)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", exchange_publish)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/source", exchange_bindings("source"))
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/destination", exchange_bindings("destination"))
    r.add_get("/api/bindings", bindings)
    r.add_get("/api/bindings/{vhost}", bindings)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", binding_post)
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", binding_list)
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}/{props}", binding_get)
    r.add_delete("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}/{props}", binding_delete)
    r.add_get("/api/connections", connections)
    r.add_get("/api/connections/{name}", connection)
    r.add_delete("/api/connections/{name}", connection_delete)
    r.add_get("/api/channels", channels)
    r.add_get("/api/vhosts/{vhost}/connections", connections)
    r.add_get("/api/vhosts/{vhost}/channels", channels)
    r.add_get("/api/consumers", consumers)
    r.add_get("/api/consumers/{vhost}", consumers)
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/health/checks/local-alarms", local_alarms)
    r.add_get("/api/nodes", nodes)
    r.add_get("/api/nodes/{name}", node)
    r.add_get("/api/definitions", definitions_get)
    r.add_get("/api/definitions/{vhost}", definitions_get)
    r.add_post("/api/definitions", definitions_post)
    r.add_post("/api/definitions/{vhost}", definitions_post)
    definitions.add_policy_routes(app, mgmt)
