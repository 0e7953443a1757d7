"""RabbitMQ's management HTTP API paths, in RabbitMQ's JSON shapes (SPEC M1, D9, W5).

The fields tools read (rabbitmqadmin, Flower, KEDA, Grafana's RabbitMQ dashboards, Celery
inspection scripts) carry the same names, types and meaning as RabbitMQ 3.x:

* a queue's ``messages`` = ``messages_ready`` (CMQ Active) + ``messages_unacknowledged``
  (CMQ Inactive: received, not yet deleted); delayed and rewindable messages are not counted,
  as RabbitMQ does not count messages held by the delayed-message exchange, and are shown
  under ``cmq`` and by the CMQ API;
* ``message_stats`` counts from the audit tee (gateway.metrics), with ``*_details.rate``
  per second over the last sample window (KEDA reads ``publish_details.rate``);
* lists are plain JSON arrays, or RabbitMQ's paged object when ``page`` is given.

Vhost names are URL-encoded in paths (``%2F`` is ``/``), as in RabbitMQ (M1).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from typing import Any
from urllib.parse import quote

from aiohttp import web

from gateway.auth import Permission, User, hash_password
from gateway.management.app import USER, ApiError, Management, bad_request, jsonable, not_found, read_json
from semantics.names import cmq_name

__all__ = ["COMPAT_VERSION", "add_routes", "queue_json"]

# The RabbitMQ management API version whose shapes this follows.
COMPAT_VERSION = "3.12.0"
NODE = "cmq-gateway@localhost"
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
        "policy": None,
        "operator_policy": None,
        "effective_policy_definition": {},
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
        "cmq": {"queueName": cmq_name(q.name, "queue"), "activeMsgNum": ready, "inactiveMsgNum": unacked,
                "delayMsgNum": cmq.delayed, "rewindMsgNum": cmq.rewindable},
    }


def _paged(request: web.Request, items: list[dict[str, Any]]) -> Any:
    """RabbitMQ's list filters: ``name`` (with ``use_regex``), ``page``/``page_size``,
    ``sort``/``sort_reverse``; without ``page`` the list itself."""
    q = request.query
    name = q.get("name", "")
    total = len(items)
    if name:
        if q.get("use_regex", "false") == "true":
            try:
                rx = re.compile(name)
            except re.error:
                raise bad_request(f"invalid regex {name!r}")
            items = [i for i in items if rx.search(str(i.get("name", "")))]
        else:
            items = [i for i in items if name in str(i.get("name", ""))]
    sort = q.get("sort")
    if sort:
        items = sorted(items, key=lambda i: (i.get(sort) is None, str(i.get(sort)) if not isinstance(
            i.get(sort), int | float) else i.get(sort)))  # type: ignore[arg-type, return-value]
        if q.get("sort_reverse", "false") == "true":
            items.reverse()
    if "page" not in q:
        return items
    try:
        page, size = int(q["page"]), int(q.get("page_size", "100"))
    except ValueError:
        raise bad_request("page and page_size must be integers")
    if page < 1 or not 1 <= size <= 500:
        raise bad_request("page must be >= 1 and page_size 1-500")
    filtered = len(items)
    chunk = items[(page - 1) * size: page * size]
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
            "page_count": max(1, math.ceil(filtered / size)), "page_size": size, "total_count": total}


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


def _conn_name(conn: Any) -> str:
    host, port = _local(conn)
    if not host:
        return str(conn.peer)
    local = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{conn.peer} -> {local}"


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
        "protocol": "AMQP 0-9-1",
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "vhost": getattr(conn, "vhost", None) or getattr(session, "vhost_name", "/"),
        "host": host,
        "port": port,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "state": "blocked" if getattr(conn, "blocked", False) else "running",
        "channels": channels,
        "channel_max": getattr(core, "channel_max", 0),
        "frame_max": getattr(core, "frame_max", 0),
        "timeout": getattr(core, "heartbeat", 0),
        "auth_mechanism": getattr(core, "mechanism", None) or "PLAIN",
        "client_properties": jsonable(getattr(conn, "client_properties", {}) or {}),
        "connected_at": connected_at,
        "ssl": False,
        "ssl_protocol": None, "ssl_key_exchange": None, "ssl_cipher": None, "ssl_hash": None,
        "peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None,
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


def _channels(mgmt: Management, vhosts: set[str]) -> list[Any]:
    return [ch for s in mgmt.target.sessions if s.vhost_name in vhosts for ch in list(s.channels.values())]


# -- handlers -----------------------------------------------------------------------------------


def add_routes(app: web.Application, mgmt: Management) -> None:
    r = app.router

    async def overview(request: web.Request) -> web.Response:
        names = mgmt.vhost_names(request)
        queues = _queues(mgmt, request, names)
        c = mgmt.counters
        stats: dict[str, Any] = {}
        for event, name in (("publish", "publish"), ("deliver", "deliver_get"), ("ack", "ack")):
            count = sum(c.count(event, v) for v in names)
            stats[name] = count
            stats[f"{name}_details"] = {"rate": round(sum(mgmt.rate("e", v, event) for v in names), 1)}
        stats["redeliver"] = sum(c.redelivered.get(v, 0) for v in names)
        stats["redeliver_details"] = {"rate": 0.0}
        gw = mgmt.target.gateway
        listeners = [{"node": NODE, "protocol": "amqp", "ip_address": h, "port": p}
                     for h, p in getattr(gw, "addresses", [])]
        ready = sum(q["messages_ready"] for q in queues)
        unacked = sum(q["messages_unacknowledged"] for q in queues)
        exchanges = sum(len(mgmt.vhost(v).exchanges) + 1 for v in names)
        channels = _channels(mgmt, set(names))
        config = getattr(gw, "config", None)
        return web.json_response({
            "management_version": COMPAT_VERSION,
            "rabbitmq_version": COMPAT_VERSION,
            "product_name": "cmq-gateway",
            "product_version": getattr(gw, "server_properties", {}).get("version", "0.0.0"),
            "cluster_name": getattr(config, "cluster_name", "cmq-gateway"),
            "node": NODE,
            "rates_mode": "basic",
            "exchange_types": EXCHANGE_TYPES,
            "message_stats": stats,
            "queue_totals": {"messages": ready + unacked, "messages_details": {"rate": 0.0},
                             "messages_ready": ready, "messages_ready_details": {"rate": 0.0},
                             "messages_unacknowledged": unacked,
                             "messages_unacknowledged_details": {"rate": 0.0}},
            "object_totals": {"connections": len(mgmt.target.connections), "channels": len(channels),
                              "consumers": sum(q["consumers"] for q in queues), "exchanges": exchanges,
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
                "messages_unacknowledged": unacked, "messages_unacknowledged_details": {"rate": 0.0}}

    async def vhosts(request: web.Request) -> web.Response:
        return web.json_response(_paged(request, [vhost_json(v) for v in mgmt.vhost_names(request)]))

    async def vhost(request: web.Request) -> web.Response:
        name = request.match_info["vhost"]
        mgmt.check_vhost(request, name)
        return web.json_response(vhost_json(name))

    async def queues(request: web.Request) -> web.Response:
        return web.json_response(_paged(request, _queues(mgmt, request, mgmt.vhosts_in(request))))

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
                         durable=bool(body.get("durable", True)), exclusive=False,
                         auto_delete=bool(body.get("auto_delete", False)),
                         arguments=body.get("arguments") or {}, user=request[USER].name)
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

    async def queue_bindings(request: web.Request) -> web.Response:
        vh, name = existing_queue(request)
        out = [b for b in _bindings(mgmt, [vh.name])
               if b["destination_type"] == "queue" and b["destination"] == name]
        return web.json_response(out)

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
                            durable=bool(body.get("durable", True)),
                            auto_delete=bool(body.get("auto_delete", False)),
                            internal=bool(body.get("internal", False)),
                            arguments=body.get("arguments") or {}, user=request[USER].name)
        return web.Response(status=201)

    async def exchange_delete(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        name = request.match_info["name"]
        if name not in vh.exchanges:
            raise not_found()
        vh.delete_exchange(name, if_unused=request.query.get("if-unused") == "true", user=request[USER].name)
        return web.Response(status=204)

    async def bindings(request: web.Request) -> web.Response:
        return web.json_response(_bindings(mgmt, mgmt.vhosts_in(request)))

    async def binding_post(request: web.Request) -> web.Response:
        vh = mgmt.check_vhost(request, request.match_info["vhost"])
        body = await read_json(request)
        kind = "q" if request.match_info["kind"] == "q" else "x"
        key = str(body.get("routing_key", ""))
        vh.bind(None, request.match_info["source"], (kind, request.match_info["dest"]), key,
                body.get("arguments") or {}, user=request[USER].name)
        args = jsonable(body.get("arguments") or {})
        return web.Response(status=201, headers={"Location": _properties_key(key, args)})

    async def connections(request: web.Request) -> web.Response:
        names = set(mgmt.vhost_names(request))
        items = [_connection_json(mgmt, c) for c in mgmt.target.connections]
        return web.json_response(_paged(request, [c for c in items if c["vhost"] in names]))

    async def channels(request: web.Request) -> web.Response:
        items = [_channel_json(mgmt, ch) for ch in _channels(mgmt, set(mgmt.vhost_names(request)))]
        return web.json_response(_paged(request, items))

    async def consumers(request: web.Request) -> web.Response:
        out = []
        for v in mgmt.vhosts_in(request):
            for q in list(mgmt.vhost(v).queues.values()):
                out.extend(_consumers_of(mgmt, q))
        return web.json_response(out)

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
        return web.json_response(export_definitions(mgmt, mgmt.vhosts_in(request)))

    async def definitions_post(request: web.Request) -> web.Response:
        body = await read_json(request)
        v = request.match_info.get("vhost")
        if v is not None:
            mgmt.check_vhost(request, v)
        import_definitions(mgmt, body, only_vhost=v)
        return web.Response(status=204)

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
    r.add_get("/api/exchanges", exchanges)
    r.add_get("/api/exchanges/{vhost}", exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", exchange_put)
    r.add_delete("/api/exchanges/{vhost}/{name}", exchange_delete)
    r.add_get("/api/bindings", bindings)
    r.add_get("/api/bindings/{vhost}", bindings)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", binding_post)
    r.add_get("/api/connections", connections)
    r.add_get("/api/channels", channels)
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


# -- definitions (RabbitMQ's export format) ---------------------------------------------------------


def export_definitions(mgmt: Management, vhosts: list[str]) -> dict[str, Any]:
    users = mgmt.target.users
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
                         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": list(u.tags),
                         "limits": {}} for u in users.users.values()]
        out["permissions"] = [{"user": u, "vhost": v, "configure": p.configure, "write": p.write,
                               "read": p.read} for (u, v), p in users.permissions.items() if v in vhosts]
    for v in vhosts:
        vh = mgmt.vhost(v)
        for q in vh.queues.values():
            if q.exclusive_owner is None:
                out["queues"].append({"name": q.name, "vhost": v, "durable": q.durable,
                                      "auto_delete": q.auto_delete, "arguments": jsonable(q.arguments)})
        for ex in vh.exchanges.values():
            if not ex.name.startswith("amq."):
                out["exchanges"].append({"name": ex.name, "vhost": v, "type": ex.type, "durable": ex.durable,
                                         "auto_delete": ex.auto_delete, "internal": ex.internal,
                                         "arguments": jsonable(ex.arguments)})
    out["bindings"] = [{k: b[k] for k in ("source", "vhost", "destination", "destination_type",
                                          "routing_key", "arguments")}
                       for b in _bindings(mgmt, vhosts) if b["source"] != ""]
    for (v, x, name), s in sorted(mgmt.pusher.subscriptions.items()):
        if v in vhosts:
            out["cmq_http_subscriptions"].append({
                "vhost": v, "exchange": x, "name": name, "endpoint": s.url,
                "notify_strategy": s.notify_strategy, "notify_content_format": s.content_format,
                "filters": list(s.filters)})
    return out


def import_definitions(mgmt: Management, body: dict[str, Any], only_vhost: str | None = None) -> None:
    """RabbitMQ's import: vhosts, users, permissions, exchanges, queues, bindings, in that
    order; an object that already exists must be equivalent (the broker's redeclare rules)."""
    broker = mgmt.broker
    users = mgmt.target.users

    def vhost_of(item: dict[str, Any]) -> str:
        return only_vhost if only_vhost is not None else str(item.get("vhost", "/"))

    try:
        if only_vhost is None:
            for v in body.get("vhosts", []):
                name = str(v["name"])
                broker.vhost(name)
                if users is not None and name not in users.vhosts:
                    users.vhosts.append(name)
            if users is not None:
                for u in body.get("users", []):
                    tags = u.get("tags", [])
                    if isinstance(tags, str):
                        tags = [t for t in tags.split(",") if t]
                    if "password_hash" in u:
                        pw = str(u["password_hash"])
                    else:
                        pw = hash_password(str(u.get("password", "")))
                    users.users[str(u["name"])] = User(str(u["name"]), pw, tuple(str(t) for t in tags))
                for p in body.get("permissions", []):
                    users.permissions[str(p["user"]), str(p["vhost"])] = Permission(
                        str(p["configure"]), str(p["write"]), str(p["read"]))
        for x in body.get("exchanges", []):
            vh = mgmt.vhost(vhost_of(x))
            vh.declare_exchange(str(x["name"]), str(x["type"]), passive=False, durable=bool(x.get("durable", True)),
                                auto_delete=bool(x.get("auto_delete", False)),
                                internal=bool(x.get("internal", False)), arguments=x.get("arguments") or {})
        for q in body.get("queues", []):
            vh = mgmt.vhost(vhost_of(q))
            vh.declare_queue(None, str(q["name"]), passive=False, durable=bool(q.get("durable", True)),
                             exclusive=False, auto_delete=bool(q.get("auto_delete", False)),
                             arguments=q.get("arguments") or {})
        for b in body.get("bindings", []):
            vh = mgmt.vhost(vhost_of(b))
            kind = "q" if b.get("destination_type", "queue") == "queue" else "x"
            vh.bind(None, str(b["source"]), (kind, str(b["destination"])), str(b.get("routing_key", "")),
                    b.get("arguments") or {})
        for s in body.get("cmq_http_subscriptions", []):
            v = vhost_of(s)
            if (v, s["exchange"], s["name"]) not in mgmt.pusher.subscriptions:
                mgmt.pusher.subscribe(v, str(s["exchange"]), str(s["name"]), str(s["endpoint"]),
                                      notify_strategy=str(s.get("notify_strategy", "EXPONENTIAL_DECAY_RETRY")),
                                      content_format=str(s.get("notify_content_format", "JSON")),
                                      filters=[str(f) for f in s.get("filters", [])])
    except (KeyError, TypeError, ValueError) as e:
        raise bad_request(f"definitions: {e!r}")
    except ApiError:
        raise

